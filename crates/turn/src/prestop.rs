//! `pre-stop-hook HOST PORT` (the image's `/usr/local/bin/pre-stop-hook`, or `lastcall-turn
//! pre-stop-hook`): what wire's coturn chart runs as its preStop hook with
//! `coturnGracefulTermination: true`, written for this daemon. It starts the drain of the
//! `turnserver` process of its container (this same binary, started as `/usr/bin/turnserver`)
//! and returns when no allocation is left or the process is gone: both are its exit, since a
//! drain started this way ends the process at its last allocation (coturn's
//! `drain-min-allocations`) or at `--drain-timeout`.
//!
//! The drain is started with SIGUSR1, this daemon's (and coturn 4.6.3's) drain signal: the
//! admin listener's `POST /drain` answers loopback peers only, and wire's chart binds that
//! listener to the pod's address (`prometheus-ip`), which is where HOST PORT point. The wait
//! is a pidfd (no polling): the hook wakes up when the process exits. HOST PORT are accepted
//! for wire's command line and name the admin listener in the hook's log lines.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::event::{poll, PollFd, PollFlags};
use rustix::process::{kill_process, pidfd_open, Pid, PidfdFlags, Signal};

/// The process name the daemon carries in wire's pod (its binary is `/usr/bin/turnserver`).
pub const PROCESS_NAME: &str = "turnserver";

/// Why the hook could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// `/proc` could not be read.
    #[error("cannot list processes in /proc: {0}")]
    Proc(std::io::Error),
    /// The signal could not be sent.
    #[error("cannot signal {PROCESS_NAME} (pid {pid}): {source}")]
    Signal {
        /// The daemon's pid.
        pid: i32,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// The process could not be waited for.
    #[error("cannot wait for {PROCESS_NAME} (pid {pid}): {source}")]
    Wait {
        /// The daemon's pid.
        pid: i32,
        /// What the kernel said.
        source: std::io::Error,
    },
}

/// The hook's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No `turnserver` of this binary runs: nothing to drain.
    NotRunning,
    /// It was told to drain and has exited.
    Drained {
        /// Its pid.
        pid: i32,
    },
}

/// Runs the hook: finds the daemon in `proc` (`/proc`), starts its drain, waits for its exit.
/// `admin` (wire's `"$POD_IP" 9641`) is named in the lines written to the daemon's log.
pub fn run(proc: &Path, admin: &str) -> Result<Outcome, HookError> {
    let Some(pid) = find_daemon(proc)? else {
        return Ok(Outcome::NotRunning);
    };
    let Some(target) = Pid::from_raw(pid) else {
        return Ok(Outcome::NotRunning);
    };
    // Opened before the signal: the pid cannot be reused under us.
    let pidfd = match pidfd_open(target, PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return Ok(Outcome::NotRunning),
        Err(e) => {
            return Err(HookError::Wait {
                pid,
                source: e.into(),
            })
        }
    };
    tell(proc, pid, &format!("pre-stop-hook: SIGUSR1 to {PROCESS_NAME} (pid {pid}, admin listener {admin}): draining; waiting for its last allocation"));
    match kill_process(target, Signal::USR1) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => {}
        Err(e) => {
            return Err(HookError::Signal {
                pid,
                source: e.into(),
            })
        }
    }
    let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
    loop {
        match poll(&mut fds, None) {
            Ok(_) if fds[0].revents().intersects(PollFlags::IN | PollFlags::HUP) => break,
            Ok(_) | Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                return Err(HookError::Wait {
                    pid,
                    source: e.into(),
                })
            }
        }
    }
    Ok(Outcome::Drained { pid })
}

/// The pid of a process named [`PROCESS_NAME`] running this same binary (so coturn's own
/// `turnserver`, were one visible, is never signalled), other than this one.
///
/// Its `/proc/PID/exe` tells, when it can be read. In the image it cannot: the binary carries a
/// file capability, so the kernel makes the daemon non-dumpable at exec, and a non-dumpable
/// process's `exe` (like its `fd/`) is closed to processes of its own uid. Then the path it
/// was started from (its `cmdline`'s first word, `/usr/bin/turnserver`, readable by all) is
/// resolved here, in the hook's own container, and compared with this binary.
fn find_daemon(proc: &Path) -> Result<Option<i32>, HookError> {
    let me = std::process::id();
    let own = std::fs::metadata(proc.join("self/exe")).ok();
    let same_file =
        |a: &std::fs::Metadata, b: &std::fs::Metadata| a.dev() == b.dev() && a.ino() == b.ino();
    let same_binary = |pid: &str| {
        let Some(own) = &own else { return false };
        if let Ok(exe) = std::fs::metadata(proc.join(pid).join("exe")) {
            return same_file(own, &exe);
        }
        let cmdline = std::fs::read(proc.join(pid).join("cmdline")).unwrap_or_default();
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let argv0 = Path::new(std::ffi::OsStr::from_bytes(argv0));
        argv0.is_absolute() && std::fs::metadata(argv0).is_ok_and(|m| same_file(own, &m))
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(proc).map_err(HookError::Proc)? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == PROCESS_NAME && same_binary(&pid.to_string()) {
            found.push(pid);
        }
    }
    found.sort_unstable();
    Ok(found.first().and_then(|p| i32::try_from(*p).ok()))
}

/// A line in the daemon's own log (its stderr), so that the pod's log shows the hook, as
/// the kubelet keeps a hook's output only when it fails. A non-dumpable daemon's `fd/` is
/// closed (see [`find_daemon`]): then its parent's stderr, which in wire's pod is dumb-init's,
/// the same log. Best effort.
fn tell(proc: &Path, pid: i32, line: &str) {
    let open = |pid: &str| {
        std::fs::OpenOptions::new()
            .append(true)
            .open(proc.join(pid).join("fd/2"))
    };
    let parent = || {
        // stat: "PID (COMM) STATE PPID ...", COMM may hold spaces and parentheses.
        let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
        let after = &stat[stat.rfind(')')? + 1..];
        after.split_whitespace().nth(1).map(str::to_owned)
    };
    let file = open(&pid.to_string())
        .ok()
        .or_else(|| open(&parent()?).ok());
    if let Some(mut f) = file {
        let _ = writeln!(f, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc` of one `turnserver` whose `exe` cannot be read (a non-dumpable process):
    /// the path it was started from decides.
    #[test]
    fn a_daemon_without_a_readable_exe_is_known_by_the_path_it_was_started_from() {
        let dir = tempfile::tempdir().unwrap();
        let own = std::fs::read_link("/proc/self/exe").unwrap();
        std::os::unix::fs::symlink(&own, dir.path().join("turnserver")).unwrap();
        std::fs::create_dir(dir.path().join("self")).unwrap();
        std::os::unix::fs::symlink(&own, dir.path().join("self/exe")).unwrap();
        let started = |pid: u32, argv0: &Path| {
            let d = dir.path().join(pid.to_string());
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("comm"), "turnserver\n").unwrap();
            let mut cmdline = argv0.as_os_str().as_bytes().to_vec();
            cmdline.extend_from_slice(b"\0-c\0/coturn-config/turnserver.conf\0");
            std::fs::write(d.join("cmdline"), cmdline).unwrap();
        };
        // Another program under the same name (coturn's), and one with a relative argv[0].
        started(7, Path::new("/bin/sh"));
        started(8, Path::new("turnserver"));
        assert_eq!(find_daemon(dir.path()).unwrap(), None);
        started(9, &dir.path().join("turnserver"));
        assert_eq!(find_daemon(dir.path()).unwrap(), Some(9));
    }

    #[test]
    fn nothing_to_drain_in_an_empty_proc() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(run(dir.path(), "x").unwrap(), Outcome::NotRunning);
        let missing = dir.path().join("missing");
        assert!(matches!(run(&missing, "x"), Err(HookError::Proc(_))));
    }
}
