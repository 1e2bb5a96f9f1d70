//! The processes the demo starts: each in its own process group (so a Ctrl-C at the terminal
//! reaches only the demo, which then stops them itself), its output in a log file, killed
//! with its whole group when dropped. A registry of live groups lets the signal thread kill
//! everything at once on a second Ctrl-C.

use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;

/// Set by the signal thread on the first Ctrl-C (or SIGTERM): every wait gives up.
pub(crate) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Fails if the demo was interrupted.
pub(crate) fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted (Ctrl-C)");
    }
    Ok(())
}

/// Polls `f` every `every` until it returns `Some`, for at most `timeout`; the error names
/// `what` was awaited.
pub(crate) fn wait_until<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let end = Instant::now() + timeout;
    loop {
        check_interrupted()?;
        if let Some(v) = f()? {
            return Ok(v);
        }
        if Instant::now() >= end {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(every);
    }
}

/// Process groups of the children still running.
#[derive(Clone, Default)]
pub(crate) struct Registry(Arc<Mutex<Vec<i32>>>);

impl Registry {
    fn add(&self, pgid: i32) {
        self.0.lock().push(pgid);
    }

    fn remove(&self, pgid: i32) {
        self.0.lock().retain(|p| *p != pgid);
    }

    /// SIGKILL to every registered group (the second Ctrl-C).
    pub(crate) fn kill_all(&self) {
        for pgid in self.0.lock().iter() {
            let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
        }
    }
}

/// How a process ended, and when the demo saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exit {
    pub status: ExitStatus,
    pub at: Instant,
}

impl Exit {
    /// `exit 0`, `exit 75`, `killed by signal 9`.
    pub(crate) fn describe(&self) -> String {
        match (self.status.code(), self.status.signal()) {
            (Some(c), _) => format!("exit {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "ended".to_string(),
        }
    }
}

/// A child process of the demo.
pub(crate) struct Proc {
    pub name: String,
    child: Child,
    pgid: i32,
    log: PathBuf,
    registry: Registry,
    exit: Option<Exit>,
}

impl Proc {
    /// Starts `cmd` in a new process group, stdin closed, stdout and stderr appended to `log`.
    pub(crate) fn spawn(
        name: &str,
        mut cmd: Command,
        log: &Path,
        registry: &Registry,
    ) -> Result<Proc> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", cmd.get_program()))?;
        let pgid = i32::try_from(child.id()).context("pid out of range")?;
        registry.add(pgid);
        Ok(Proc {
            name: name.to_string(),
            child,
            pgid,
            log: log.to_path_buf(),
            registry: registry.clone(),
            exit: None,
        })
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` to the process (not its group: the daemons are alone in theirs anyway).
    pub(crate) fn signal(&mut self, sig: Signal) -> Result<()> {
        if self.exit.is_some() {
            bail!("{} already exited", self.name);
        }
        nix::sys::signal::kill(Pid::from_raw(self.pgid), sig)
            .with_context(|| format!("cannot send {sig} to {}", self.name))?;
        Ok(())
    }

    /// The exit, if it happened (collects it without blocking).
    pub(crate) fn try_exit(&mut self) -> Result<Option<Exit>> {
        if self.exit.is_none() {
            if let Some(status) = self
                .child
                .try_wait()
                .with_context(|| format!("cannot wait for {}", self.name))?
            {
                self.exit = Some(Exit {
                    status,
                    at: Instant::now(),
                });
                self.registry.remove(self.pgid);
                // Anything it left in its group goes with it.
                let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
            }
        }
        Ok(self.exit)
    }

    /// Fails, naming the process and showing its last log lines, if it has exited.
    pub(crate) fn ensure_running(&mut self) -> Result<()> {
        if let Some(exit) = self.try_exit()? {
            bail!(
                "{} ended unexpectedly ({}); its last log lines:\n{}",
                self.name,
                exit.describe(),
                self.tail(15)
            );
        }
        Ok(())
    }

    /// Waits for the exit for at most `timeout`.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Result<Exit> {
        let name = self.name.clone();
        wait_until(
            &format!("{name} to exit"),
            timeout,
            Duration::from_millis(5),
            || self.try_exit(),
        )
    }

    /// The whole log so far.
    pub(crate) fn log_text(&self) -> String {
        std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last `n` lines of the log, indented.
    pub(crate) fn tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(n);
        lines
            .get(from..)
            .unwrap_or_default()
            .iter()
            .map(|l| format!("    | {l}\n"))
            .collect()
    }

    /// The last log line containing `needle`.
    pub(crate) fn last_line_with(&self, needle: &str) -> Option<String> {
        self.log_text()
            .lines()
            .rev()
            .find(|l| l.contains(needle))
            .map(str::to_string)
    }

    /// Waits until the log has a line containing `needle` (fails at once if the process ends).
    pub(crate) fn wait_for_log(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let what = format!("{} to log {needle:?}", self.name);
        wait_until(&what, timeout, Duration::from_millis(20), || {
            if self.log_text().contains(needle) {
                return Ok(Some(()));
            }
            self.ensure_running()?;
            Ok(None)
        })
        .with_context(|| format!("its last log lines:\n{}", self.tail(10)))
    }

    /// Stops it: `sig`, then SIGKILL to the group after `grace`. Returns the exit.
    pub(crate) fn stop(&mut self, sig: Signal, grace: Duration) -> Result<Exit> {
        if let Some(exit) = self.try_exit()? {
            return Ok(exit);
        }
        let _ = self.signal(sig);
        let end = Instant::now() + grace;
        loop {
            if let Some(exit) = self.try_exit()? {
                return Ok(exit);
            }
            if Instant::now() >= end {
                let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
                let status = self.child.wait()?;
                let exit = Exit {
                    status,
                    at: Instant::now(),
                };
                self.exit = Some(exit);
                self.registry.remove(self.pgid);
                return Ok(exit);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether any process of its group is still alive (after the exit: what it left behind).
    pub(crate) fn group_alive(&self) -> bool {
        killpg(Pid::from_raw(self.pgid), None::<Signal>).is_ok()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
            let _ = self.child.wait();
            self.registry.remove(self.pgid);
        }
    }
}
