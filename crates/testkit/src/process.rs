//! A kubelet-like, synchronous process harness: spawn a daemon (or a peer), read its output
//! lines, signal it, SIGKILL it at a grace period, and report how and when it exited.
//!
//! Everything is blocking (std) so tests need no runtime; every wait has a timeout.
//!
//! ```no_run
//! use std::time::Duration;
//! use lastcall_testkit::{self as harness, Pod, Signal};
//! let admin = format!("127.0.0.1:{}", harness::free_port());
//! let mut cmd = std::process::Command::new(harness::example_path("lastcall", "echo"));
//! cmd.args(["--listen", "127.0.0.1:0", "--admin-addr", &admin]);
//! let mut pod = Pod::spawn(cmd);
//! pod.wait_for_log("listening", Duration::from_secs(20));
//! pod.signal(Signal::Term);
//! let report = pod.wait_exit(Duration::from_secs(30)); // SIGKILL at 30 s, like the kubelet
//! assert_eq!(report.code, Some(0));
//! ```

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

/// Signals the harness can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM (what the kubelet sends first).
    Term,
    /// SIGINT (Ctrl-C).
    Int,
    /// SIGQUIT.
    Quit,
    /// SIGUSR1.
    Usr1,
    /// SIGHUP.
    Hup,
    /// SIGUSR2.
    Usr2,
    /// SIGPIPE.
    Pipe,
    /// SIGKILL (what the kubelet sends at the end of the grace period).
    Kill,
    /// SIGSTOP (freeze the process: its timers come due all at once on SIGCONT).
    Stop,
    /// SIGCONT.
    Cont,
}

impl Signal {
    fn to_nix(self) -> nix::sys::signal::Signal {
        use nix::sys::signal::Signal as S;
        match self {
            Signal::Term => S::SIGTERM,
            Signal::Int => S::SIGINT,
            Signal::Quit => S::SIGQUIT,
            Signal::Usr1 => S::SIGUSR1,
            Signal::Hup => S::SIGHUP,
            Signal::Usr2 => S::SIGUSR2,
            Signal::Pipe => S::SIGPIPE,
            Signal::Kill => S::SIGKILL,
            Signal::Stop => S::SIGSTOP,
            Signal::Cont => S::SIGCONT,
        }
    }
}

/// How a pod ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitReport {
    /// Exit status, if it exited normally.
    pub code: Option<i32>,
    /// Terminating signal number, if a signal killed it.
    pub signal: Option<i32>,
    /// Time from the last signal sent by the harness (or from the start of the wait, if none
    /// was sent) to the exit.
    pub elapsed_since_signal: Duration,
    /// Whether the harness had to SIGKILL it at the grace period.
    pub killed: bool,
}

/// What [`Pod::terminate_under_load`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RolloutReport {
    /// How the pod ended.
    pub exit: ExitReport,
    /// Pieces of new work that succeeded after SIGTERM.
    pub succeeded: u64,
    /// Pieces of new work that failed after SIGTERM (the goal is zero).
    pub failed: u64,
}

/// Captured output: the lines so far and how many of the two streams reached EOF.
#[derive(Debug, Default)]
struct Captured {
    lines: Vec<String>,
    closed: usize,
}

/// The captured lines and their condition variable (`parking_lot`: no lock poisoning, so a
/// panicking test thread never turns every later wait into a second panic).
type Lines = Arc<(Mutex<Captured>, Condvar)>;

/// How long [`Pod::wait_exit`] waits for the last output after the exit.
const OUTPUT_DRAIN: Duration = Duration::from_secs(5);

/// A running daemon process with its stdout and stderr lines captured (and copied to the
/// test's stderr, prefixed with the pod's name, for debugging). Killed when dropped.
#[derive(Debug)]
pub struct Pod {
    name: String,
    child: Child,
    lines: Lines,
    signalled_at: Option<Instant>,
    exit: Option<ExitReport>,
}

impl Pod {
    /// Starts `cmd` with stdin closed and stdout/stderr captured. Panics if it cannot start.
    pub fn spawn(mut cmd: Command) -> Pod {
        let name = Path::new(cmd.get_program())
            .file_name()
            .map_or_else(|| "pod".to_string(), |n| n.to_string_lossy().into_owned());
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {:?}: {err}", cmd));
        let lines: Lines = Arc::new((Mutex::new(Captured::default()), Condvar::new()));
        let tag = format!("{name}[{}]", child.id());
        if let Some(out) = child.stdout.take() {
            capture(out, format!("{tag} out"), lines.clone());
        }
        if let Some(err) = child.stderr.take() {
            capture(err, tag, lines.clone());
        }
        Pod {
            name,
            child,
            lines,
            signalled_at: None,
            exit: None,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The program's file name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends a signal (no-op once the exit was collected). Panics if it cannot be sent.
    pub fn signal(&mut self, signal: Signal) {
        if self.exit.is_some() {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX));
        nix::sys::signal::kill(pid, signal.to_nix())
            .unwrap_or_else(|err| panic!("cannot send {signal:?} to {}: {err}", self.name));
        self.signalled_at = Some(Instant::now());
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.exit.is_none() && matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the exit; at `grace` after the last signal (or after now, if none was sent)
    /// sends SIGKILL, like the kubelet at `terminationGracePeriodSeconds`.
    pub fn wait_exit(&mut self, grace: Duration) -> ExitReport {
        if let Some(report) = self.exit {
            return report;
        }
        let since = self.signalled_at.unwrap_or_else(Instant::now);
        let kill_at = since + grace;
        let mut killed = false;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= kill_at && !killed => {
                    eprintln!(
                        "harness: {} still running after {grace:?}: SIGKILL",
                        self.name
                    );
                    let _ = self.child.kill();
                    killed = true;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                Err(err) => panic!("cannot wait for {}: {err}", self.name),
            }
        };
        let elapsed = since.elapsed();
        use std::os::unix::process::ExitStatusExt;
        let report = ExitReport {
            code: status.code(),
            signal: status.signal(),
            elapsed_since_signal: elapsed,
            killed,
        };
        self.wait_output_closed();
        eprintln!("harness: {} exited: {report:?}", self.name);
        self.exit = Some(report);
        report
    }

    /// A kubelet-like termination under load: sends SIGTERM, keeps calling `work` (one
    /// piece of new work per call, `true` if it succeeded) for `propagation` — the time
    /// endpoint removal takes to reach every client — then stops sending ("the load moved
    /// elsewhere") and waits for the exit, with SIGKILL at `grace` after the signal.
    pub fn terminate_under_load(
        &mut self,
        propagation: Duration,
        grace: Duration,
        mut work: impl FnMut() -> bool,
    ) -> RolloutReport {
        self.signal(Signal::Term);
        let since = Instant::now();
        let (mut succeeded, mut failed) = (0, 0);
        while since.elapsed() < propagation {
            if work() {
                succeeded += 1;
            } else {
                failed += 1;
            }
        }
        let exit = self.wait_exit(grace);
        RolloutReport {
            exit,
            succeeded,
            failed,
        }
    }

    /// After the exit: waits (bounded) until stdout and stderr reached EOF, so that
    /// [`logs`](Self::logs) holds every line the process wrote.
    fn wait_output_closed(&self) {
        let end = Instant::now() + OUTPUT_DRAIN;
        let (_, cond) = &*self.lines;
        let mut captured = self.lock();
        while captured.closed < 2 {
            let Some(left) = end.checked_duration_since(Instant::now()) else {
                return;
            };
            cond.wait_for(&mut captured, left);
        }
    }

    /// SIGTERM, then [`wait_exit`](Self::wait_exit) with `grace`.
    pub fn terminate(&mut self, grace: Duration) -> ExitReport {
        self.signal(Signal::Term);
        self.wait_exit(grace)
    }

    /// Every captured line so far (stdout and stderr, in arrival order).
    pub fn logs(&self) -> Vec<String> {
        self.lock().lines.clone()
    }

    /// How many lines were captured so far (a mark for [`wait_for_log_after`](Self::wait_for_log_after)).
    pub fn log_len(&self) -> usize {
        self.lock().lines.len()
    }

    /// Waits for a line containing `needle`; returns it. Panics (showing the log) on timeout.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> String {
        self.wait_for_log_after(0, needle, timeout)
    }

    /// Like [`wait_for_log`](Self::wait_for_log), only looking at lines after the first `mark`.
    pub fn wait_for_log_after(&self, mark: usize, needle: &str, timeout: Duration) -> String {
        self.try_wait_for_log_after(mark, needle, timeout)
            .unwrap_or_else(|| {
                panic!(
                    "no log line containing {needle:?} within {timeout:?}; log:\n{}",
                    self.logs().join("\n")
                )
            })
    }

    /// Waits for a line containing `needle` after the first `mark` lines; `None` on timeout.
    pub fn try_wait_for_log_after(
        &self,
        mark: usize,
        needle: &str,
        timeout: Duration,
    ) -> Option<String> {
        let end = Instant::now() + timeout;
        let (_, cond) = &*self.lines;
        let mut captured = self.lock();
        loop {
            if let Some(line) = captured
                .lines
                .iter()
                .skip(mark)
                .find(|l| l.contains(needle))
            {
                return Some(line.clone());
            }
            let left = end.checked_duration_since(Instant::now())?;
            cond.wait_for(&mut captured, left.min(Duration::from_millis(100)));
        }
    }

    /// Whether a line containing `needle` was captured so far.
    pub fn has_log(&self, needle: &str) -> bool {
        self.lock().lines.iter().any(|l| l.contains(needle))
    }

    fn lock(&self) -> MutexGuard<'_, Captured> {
        self.lines.0.lock()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn capture<R: Read + Send + 'static>(stream: R, tag: String, lines: Lines) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => {
                    let (lock, cond) = &*lines;
                    lock.lock().closed += 1;
                    cond.notify_all();
                    break;
                }
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                    eprintln!("[{tag}] {line}");
                    let (lock, cond) = &*lines;
                    lock.lock().lines.push(line);
                    cond.notify_all();
                }
            }
        }
    });
}
