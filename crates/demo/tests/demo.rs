//! The demo, run the way a newcomer runs it (its fast variant, with the debug builds of the
//! daemons), so it cannot rot: it must pass with no failed request and no lost packet, and
//! leave nothing running; interrupted with SIGINT (Ctrl-C) in the middle of the rollout, it
//! must stop everything it started and exit 130.
//!
//! The fast run also records what a Prometheus server would have scraped (`--record`) and
//! draws the timeline (`--timeline`): every metric name the charts' dashboards and alert rules
//! use must be served by the daemons it ran, and the rules, run by `promtool test rules` on the
//! recorded series, must stay quiet through the rolling restart and see the last TURN server
//! leave.
//!
//! Needs the `lastcall-spoa` and `lastcall-turn` binaries next to the demo's (CI builds every
//! binary first; when one is missing the test builds it with cargo), and promtool and
//! matplotlib (Debian's prometheus and python3-matplotlib, scripts/setup.sh).

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

use lastcall_testkit::procfs::alive;

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
        Run::start_with(&spoa, &turn, &[])
    }

    fn start_with(spoa: &Path, turn: &Path, extra: &[&std::ffi::OsStr]) -> Run {
        let mut child = Command::new(DEMO)
            .arg("--fast")
            .args(extra)
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
    let (spoa, turn) = daemons();
    let rec = tempfile::tempdir().expect("tempdir");
    let png = rec.path().join("timeline.png");
    let mut run = Run::start_with(
        &spoa,
        &turn,
        &[
            "--record".as_ref(),
            rec.path().as_os_str(),
            "--timeline".as_ref(),
            png.as_os_str(),
        ],
    );
    let code = run.finish(LIMIT);
    let out = run.output();
    assert_eq!(code, Some(0), "the demo failed:\n{out}");
    assert!(out.contains("-> 403 blocked by CRS rule 949110"), "{out}");
    // Agent A's connections say goodbye when it begins refusing; HAProxy marks it DOWN after
    // `fall x inter` of refused checks, or it has left before (docs/spoa.md, *Drain*).
    assert!(
        out.contains("HAProxy marked spoa1 (agent A) DOWN")
            || out.contains("agent A left before HAProxy marked spoa1 DOWN"),
        "{out}"
    );
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
    recorded::timeline_shows_the_rollout(rec.path(), &png);
    let scrapes = recorded::scrapes(rec.path());
    recorded::dashboards_and_rules_use_served_names(&scrapes);
    recorded::rules_on_the_recorded_series(rec.path(), &scrapes);
}

/// What `--record` and `--timeline` wrote.
mod recorded {
    use std::path::Path;
    use std::time::Duration;

    use lastcall_testkit::monitoring::{self, Scrape};

    /// The demo's scrape interval.
    const EVERY: Duration = Duration::from_millis(500);

    pub(crate) fn scrapes(dir: &Path) -> Vec<Scrape> {
        let text = std::fs::read_to_string(dir.join("metrics.jsonl")).expect("metrics.jsonl");
        text.lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
                Scrape {
                    at: v["at"].as_f64().expect("at"),
                    job: v["job"].as_str().expect("job").to_string(),
                    instance: v["instance"].as_str().expect("instance").to_string(),
                    text: v["text"].as_str().expect("text").to_string(),
                }
            })
            .collect()
    }

    /// The PNG is a PNG; its data has every process with its phases and exit.
    pub(crate) fn timeline_shows_the_rollout(dir: &Path, png: &Path) {
        let bytes = std::fs::read(png).expect("the timeline PNG");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        assert!(
            bytes.len() > 20_000,
            "a {}-byte PNG draws nothing",
            bytes.len()
        );
        let data: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("timeline.json")).unwrap())
                .unwrap();
        let procs = data["processes"].as_array().expect("processes");
        let names: Vec<&str> = procs.iter().filter_map(|p| p["name"].as_str()).collect();
        assert_eq!(
            names,
            [
                "agent A",
                "agent B",
                "lastcall-turn",
                "agent A'",
                "agent B'"
            ],
            "{data}"
        );
        for p in procs.iter().take(3) {
            assert_eq!(p["exit"][1], "exit 0", "{p}");
            assert_eq!(p["signal"][1], "SIGTERM", "{p}");
            let phases: Vec<i64> = p["phases"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|x| x[1].as_f64())
                .map(|f| f as i64)
                .collect();
            assert!(phases.contains(&0) && phases.contains(&1), "{p}");
        }
        let load = data["load"].as_array().expect("load");
        assert!(load.len() > 10, "{data}");
        assert_eq!(load.last().unwrap()[4], 0.0, "failed requests: {data}");
    }

    /// Every metric name of both charts' dashboards and rules is served by the daemon the
    /// demo ran (the kernel fast path's: crates/turn/tests/turn/dashboards.rs).
    pub(crate) fn dashboards_and_rules_use_served_names(scrapes: &[Scrape]) {
        let spoa = monitoring::served_by(scrapes, "lastcall-spoa");
        let turn = monitoring::served_by(scrapes, "lastcall-turn");
        assert!(spoa.contains("spoa_requests_total"), "{spoa:?}");
        assert!(turn.contains("turn_total_allocations"), "{turn:?}");
        let n = monitoring::assert_chart_served("lastcall-spoa", &spoa, |_| false);
        assert!(n >= 20, "only {n} names checked");
        let n = monitoring::assert_chart_served("lastcall-turn", &turn, |n| {
            n.starts_with("lastcall_turn_kernel_")
        });
        assert!(n >= 30, "only {n} names checked");
    }

    /// The rules on what Prometheus would have recorded, each chart's rules also seeing the
    /// other daemon's series: no alert fires, and from the first agent (server) serving on,
    /// through the rolling restart (one agent at a time gone) and the TURN drain, the
    /// rollout's alerts (no agent or server serving, a drain near its deadline) are not even
    /// pending, except LastcallTurnNoServerServing from the moment the only TURN server
    /// leaves the serving phase (its drain) on. (Alerts on performance, such as slow
    /// evaluations, may be pending on a busy machine: their `for` is what keeps them quiet.)
    pub(crate) fn rules_on_the_recorded_series(dir: &Path, scrapes: &[Scrape]) {
        let data: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("timeline.json")).unwrap())
                .unwrap();
        let started_unix = data["started_unix"].as_f64().expect("started_unix");
        let input = monitoring::promtool_input_series(scrapes, EVERY, started_unix);
        let step = EVERY.as_secs_f64();
        let last_slot = scrapes
            .iter()
            .map(|s| (s.at / step).round() as u64)
            .max()
            .unwrap();
        let turn_gone = scrapes
            .iter()
            .filter(|s| s.job == "lastcall-turn")
            .map(|s| (s.at / step).round() as u64)
            .max()
            .expect("lastcall-turn scrapes")
            + 1;
        assert!(turn_gone <= last_slot, "no scrape after lastcall-turn left");
        // lastcall-turn's phase at a slot, as an instant query sees it (the latest sample).
        let turn_phase = |slot: u64| {
            scrapes
                .iter()
                .filter(|s| s.job == "lastcall-turn" && (s.at / step).round() as u64 <= slot)
                .filter_map(|s| lastcall_testkit::metrics::value(&s.text, "lastcall_drain_phase"))
                .next_back()
                .unwrap_or(f64::NAN)
        };
        // Before the first process of a kind serves, "none serving" is true (and pending).
        let first_serving = |job: &str| {
            scrapes
                .iter()
                .filter(|s| {
                    s.job == job
                        && lastcall_testkit::metrics::value(&s.text, "lastcall_drain_phase")
                            == Some(0.0)
                })
                .map(|s| (s.at / step).round() as u64)
                .min()
                .unwrap_or_else(|| panic!("no {job} scrape in the serving phase"))
        };
        for (chart, rollout) in [
            (
                "lastcall-spoa",
                "LastcallSpoaNoAgentServing|LastcallSpoaDrainNearDeadline",
            ),
            (
                "lastcall-turn",
                "LastcallTurnNoServerServing|LastcallTurnDrainNearDeadline",
            ),
        ] {
            let serving = first_serving(chart);
            let mut cases = String::from("    promql_expr_test:\n");
            for slot in 0..=last_slot {
                let ms = slot * EVERY.as_millis() as u64;
                cases.push_str(&format!(
                    "      - expr: 'ALERTS{{alertstate=\"firing\"}}'\n        eval_time: {ms}ms\n        exp_samples: []\n"
                ));
                if slot < serving {
                    continue;
                }
                cases.push_str(&format!(
                    "      - expr: 'ALERTS{{alertname=~\"{rollout}\"}}'\n        eval_time: {ms}ms\n"
                ));
                if chart == "lastcall-turn" && (slot >= turn_gone || turn_phase(slot) != 0.0) {
                    cases.push_str(
                        "        exp_samples:\n          - labels: 'ALERTS{alertname=\"LastcallTurnNoServerServing\", alertstate=\"pending\", severity=\"critical\"}'\n            value: 1\n",
                    );
                } else {
                    cases.push_str("        exp_samples: []\n");
                }
            }
            let out = monitoring::promtool_test(
                &monitoring::rules_path(chart),
                &format!("{chart} through the demo"),
                EVERY,
                &input,
                &cases,
                dir,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            eprintln!("{chart}: {out}");
        }
    }
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
    let mut run = Run::start_with(&wrapper, &turn, &[]);
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
