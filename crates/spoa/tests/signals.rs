//! Issue 4's acceptance 4 and 5, through a real HAProxy 2.6 (the documented configuration)
//! and the real CRS:
//!
//! - the deadline: connections that never go idle (one agent with one evaluation worker,
//!   saturated by 32 clients) are cut at `--drain-timeout`, the agent exits 75 and logs how
//!   many sessions it cut;
//! - a second SIGTERM exits within 1 s;
//! - `--on-sigterm ignore` survives SIGTERM (still serving, still ready) and drains on
//!   SIGUSR1 or `POST /drain`.

mod support;

use std::time::{Duration, Instant};

use lastcall::harness::{self, Signal};
use support::traffic::Load;
use support::{Stack, StackOptions, WAIT};

/// Built-in CRS, a single evaluation worker: 32 clients keep every connection busy.
const ONE_WORKER: &str = "\
workers: 1
default_application: default
applications:
  - name: default
";

fn one_agent(config: Option<&str>, args: &[&str]) -> Stack {
    Stack::start(StackOptions {
        agents: 1,
        agent_config: config.map(str::to_owned),
        agent_args: args.iter().map(|s| s.to_string()).collect(),
        quiet_haproxy: true,
        ..StackOptions::default()
    })
}

#[test]
fn deadline_cuts_busy_connections_with_status_75() {
    let _heavy = support::HeavyLock::acquire();
    let mut stack = one_agent(
        Some(ONE_WORKER),
        &[
            "--shutdown-delay",
            "1s",
            "--drain-timeout",
            "4s",
            "--log-level",
            "info,lastcall_spoa::waf=warn",
        ],
    );
    let load = Load::start(stack.http(), 32);
    load.wait_until(500, Duration::from_secs(120));
    let agent = &mut stack.agents[0];
    assert!(agent.metric("spoa_connections") >= 1.0);
    let mark = agent.pod.log_len();
    agent.pod.signal(Signal::Term);
    let report = agent.pod.wait_exit(Duration::from_secs(30));
    let totals = load.stop();
    eprintln!("DEADLINE: {report:?}; load: {totals}");
    assert_eq!(report.code, Some(lastcall::exit::DEADLINE), "{report:?}");
    assert!(
        report.elapsed_since_signal >= Duration::from_millis(3900)
            && report.elapsed_since_signal < Duration::from_secs(8),
        "left {:?} after SIGTERM, deadline 4s",
        report.elapsed_since_signal
    );
    let logs = stack.agents[0].pod.logs();
    let line = logs
        .iter()
        .skip(mark)
        .find(|l| l.contains("drain ended: deadline"))
        .unwrap_or_else(|| panic!("no deadline line in {logs:#?}"));
    let cut: u64 = line
        .split("after ")
        .nth(1)
        .and_then(|r| r.split(", ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no session count in {line:?}"));
    assert!(cut >= 1, "{line}");
    assert!(line.contains("exit status 75"), "{line}");
}

#[test]
fn second_sigterm_exits_within_a_second() {
    let mut stack = one_agent(None, &["--shutdown-delay", "20s", "--drain-timeout", "60s"]);
    // HAProxy keeps its SPOE connections open (timeout idle 2m): live sessions.
    for i in 0..20 {
        assert_eq!(
            support::get(stack.http(), &format!("/warm/{i}")).status,
            200
        );
    }
    let agent = &mut stack.agents[0];
    assert!(agent.metric("spoa_connections") >= 1.0);
    agent.signal_and_wait_for_log(Signal::Term, "announcing");
    agent.pod.signal(Signal::Term);
    let report = agent.pod.wait_exit(Duration::from_secs(30));
    eprintln!("SECOND SIGTERM: {report:?}");
    assert!(
        report.elapsed_since_signal < Duration::from_secs(1),
        "{report:?}"
    );
    // Forced exit with HAProxy's connections still open: 76, and the count is logged.
    assert_eq!(report.code, Some(lastcall::exit::FORCED), "{report:?}");
    assert!(stack.agents[0].pod.has_log("cut"));
}

fn ignore_then(trigger: &str) {
    let mut stack = one_agent(
        None,
        &[
            "--on-sigterm",
            "ignore",
            "--shutdown-delay",
            "1s",
            "--drain-timeout",
            "20s",
        ],
    );
    let http = stack.http();
    let agent = &mut stack.agents[0];
    let mark = agent.pod.log_len();
    agent.pod.signal(Signal::Term);
    agent.pod.wait_for_log_after(mark, "ignored", WAIT);
    // Still serving and still ready, well after the signal (past any delay).
    let until = Instant::now() + Duration::from_secs(2);
    let mut served = 0;
    while Instant::now() < until {
        assert_eq!(
            support::get(http, &format!("/after-sigterm/{served}")).status,
            200
        );
        served += 1;
    }
    assert!(served >= 5);
    let agent = &mut stack.agents[0];
    assert!(agent.pod.is_running());
    assert_eq!(harness::http_get(agent.admin, "/readyz").0, 200);

    match trigger {
        "SIGUSR1" => agent.pod.signal(Signal::Usr1),
        _ => {
            let (status, body) = harness::http_post(agent.admin, "/drain", None);
            assert_eq!(status, 202, "{body}");
        }
    }
    let started = Instant::now();
    agent
        .pod
        .wait_for_log_after(mark, "phase serving -> announcing", WAIT);
    let report = agent.pod.wait_exit(Duration::from_secs(30));
    eprintln!(
        "IGNORE then {trigger}: {report:?} {:?} after the trigger",
        started.elapsed()
    );
    assert_eq!(report.code, Some(0), "{report:?}");
    // The 1 s delay, then HAProxy's idle connections are closed: well before the deadline.
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn on_sigterm_ignore_survives_sigterm_and_drains_on_sigusr1() {
    ignore_then("SIGUSR1");
}

#[test]
fn on_sigterm_ignore_survives_sigterm_and_drains_on_post_drain() {
    ignore_then("POST /drain");
}
