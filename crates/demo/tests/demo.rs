//! The demo, run the way a newcomer runs it (its fast variant, with the debug builds of the
//! daemons), so it cannot rot: it must pass with no failed request and no lost packet, and
//! leave nothing running; interrupted with SIGINT (Ctrl-C) in the middle of the rollout, it
//! must stop everything it started and exit 130.
//!
//! Needs the `lastcall-spoa` and `lastcall-turn` binaries next to the demo's (CI builds every
//! binary first; when one is missing the test builds it with cargo).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const DEMO: &str = env!("CARGO_BIN_EXE_lastcall-demo");
/// Generous bound for the whole fast demo on a busy machine.
const LIMIT: Duration = Duration::from_secs(180);

/// The daemons' binaries next to the demo's, built if missing.
fn daemons() -> (PathBuf, PathBuf) {
    let spoa = lastcall_testkit::bin_path("lastcall-spoa", "lastcall-spoa");
    let turn = lastcall_testkit::bin_path("lastcall-turn", "lastcall-turn");
    assert!(spoa.is_file(), "{} missing", spoa.display());
    assert!(turn.is_file(), "{} missing", turn.display());
    (spoa, turn)
}

/// A running demo whose stdout lines arrive on a channel (and are echoed for debugging).
struct Run {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Run {
    fn start() -> Run {
        let (spoa, turn) = daemons();
        Run::start_with(&spoa, &turn)
    }

    fn start_with(spoa: &Path, turn: &Path) -> Run {
        let mut child = Command::new(DEMO)
            .arg("--fast")
            .arg("--spoa-bin")
            .arg(spoa)
            .arg("--turn-bin")
            .arg(turn)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start lastcall-demo");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("demo| {line}");
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Run {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing `needle`.
    fn wait_for(&mut self, needle: &str, timeout: Duration) {
        let end = Instant::now() + timeout;
        while !self.seen.iter().any(|l| l.contains(needle)) {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!(
                    "no line with {needle:?} within {timeout:?}; output:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Waits for the exit (killing the demo at `timeout`) and the rest of its output.
    fn finish(&mut self, timeout: Duration) -> Option<i32> {
        let end = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() >= end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "the demo did not finish within {timeout:?}; output:\n{}",
                    self.seen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        status.code()
    }

    fn output(&self) -> String {
        self.seen.join("\n")
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Process ids the demo printed ("pid N").
fn pids(output: &str) -> Vec<u32> {
    output
        .split("pid ")
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // "pid (comm) S ...": the state follows the last ')'.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("");
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// The number in the summary line that starts with `label`.
fn summary_number(output: &str, label: &str) -> u64 {
    let line = output
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no summary line {label:?} in:\n{output}"));
    line.trim_start()
        .trim_start_matches(label)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number in {line:?}"))
}

#[test]
fn fast_demo_rolls_and_drains_with_nothing_lost() {
    let started = Instant::now();
    let mut run = Run::start();
    let code = run.finish(LIMIT);
    let out = run.output();
    assert_eq!(code, Some(0), "the demo failed:\n{out}");
    assert!(out.contains("-> 403 blocked by CRS rule 949110"), "{out}");
    assert!(out.contains("HAProxy marked spoa1 (agent A) DOWN"), "{out}");
    assert!(out.contains("HAProxy marked spoa2 (agent B') UP"), "{out}");
    assert!(out.contains("is refused with 403"), "{out}");
    assert!(out.contains("lastcall-turn exited 0"), "{out}");
    let sent = summary_number(&out, "HTTP requests sent during the rollout");
    assert!(sent >= 50, "only {sent} requests:\n{out}");
    assert_eq!(summary_number(&out, "failed"), 0, "{out}");
    assert!(summary_number(&out, "TURN packets relayed and echoed back") >= 250);
    assert_eq!(summary_number(&out, "lost"), 0, "{out}");
    for what in ["agent A (", "agent B (", "lastcall-turn  "] {
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with(what) && l.contains("exit 0")),
            "no 'exit 0' row for {what:?}:\n{out}"
        );
    }
    assert!(out.contains("nothing left running"), "{out}");
    let pids = pids(&out);
    assert!(pids.len() >= 7, "pids {pids:?}");
    let left: Vec<u32> = pids.into_iter().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "still running after the demo: {left:?}");
    eprintln!("fast demo took {:?}", started.elapsed());
}

#[test]
fn ctrl_c_during_the_rollout_stops_everything() {
    let mut run = Run::start();
    run.wait_for("SIGTERM -> agent A", LIMIT);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(run.child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let interrupted = Instant::now();
    let code = run.finish(Duration::from_secs(60));
    let out = run.output();
    assert_eq!(code, Some(130), "{out}");
    assert!(
        interrupted.elapsed() < Duration::from_secs(20),
        "took {:?} to stop",
        interrupted.elapsed()
    );
    assert!(out.contains("interrupted"), "{out}");
    assert!(out.contains("nothing left running"), "{out}");
    let pids = pids(&out);
    assert!(pids.len() >= 6, "pids {pids:?}");
    let left: Vec<u32> = pids.into_iter().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "still running after Ctrl-C: {left:?}");
}

#[test]
fn an_agent_that_quits_at_once_fails_the_demo_loudly() {
    // The old behaviour (leave at once on SIGTERM, as coraza-spoa does): the demo must fail,
    // naming the step and the daemon, and still stop everything.
    let (spoa, turn) = daemons();
    let dir = tempfile::tempdir().expect("tempdir");
    let wrapper = dir.path().join("lastcall-spoa-exit-at-once");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec '{}' \"$@\" --on-sigterm exit\n",
            spoa.display()
        ),
    )
    .expect("write wrapper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut run = Run::start_with(&wrapper, &turn);
    let code = run.finish(LIMIT);
    let out = run.output();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("lastcall-demo FAILED: step 3a (roll the agents under load)"),
        "{out}"
    );
    assert!(out.contains("agent A exited with exit 76"), "{out}");
    assert!(out.contains("nothing left running"), "{out}");
    let left: Vec<u32> = pids(&out).into_iter().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "still running after the failure: {left:?}");
    // The work directory is kept for a look at the logs; remove it.
    if let Some(kept) = out
        .lines()
        .find_map(|l| l.strip_prefix("configurations and logs kept in "))
        .and_then(|l| l.split(" (").next())
    {
        let _ = std::fs::remove_dir_all(kept);
    }
}
