//! A hung agent: SIGSTOP one of two agents for 10 s under load (what a stuck process or a
//! frozen node looks like to HAProxy: its connections stay open, its health checks time
//! out). With the documented files no request fails, and the slowest request is bounded.
//!
//! What bounds it: with `max-waiting-frames 1` (2.6, 3.0) or without pipelining (3.1+, the
//! agent declines it) each of the hung agent's connections holds one message and HAProxy
//! sends it nothing more; `on-marked-down shutdown-sessions` closes them when HAProxy marks
//! the agent DOWN (fall x inter after its health checks stop answering), and the retry lines
//! ask another agent. Measured (docs/spoa.md, *Drain*): with both, 0 failed and the slowest
//! request 3.5 s on HAProxy 2.6 and 3.2; without `shutdown-sessions`, 0 failed on 2.6 but 2
//! failed on 3.2, slowest 5.1 s (`timeout processing`); without `max-waiting-frames 1`
//! either, 6 failed on 2.6 after 10 s (a retry queued on another connection of the hung
//! agent).
//!
//! ```sh
//! cargo test -p lastcall-spoa --test spoa hung:: -- --nocapture
//! # words added to the agent server lines (HUNG_SERVER_OPTIONS="..."), the SPOE file
//! # without max-waiting-frames 1 (HUNG_PIPELINED=1)
//! ```

use std::time::{Duration, Instant};

use crate::support::traffic::Load;
use crate::support::{Stack, StackOptions, WAIT};
use lastcall_testkit::Signal;

/// How long the agent stays stopped.
const STOPPED: Duration = Duration::from_secs(10);

/// HAProxy's `timeout processing` in the documented SPOE file.
const PROCESSING: Duration = Duration::from_secs(5);

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

#[test]
fn a_stopped_agent_fails_no_request_and_the_slowest_waits_one_timeout_processing() {
    let server_options: &'static str = Box::leak(env("HUNG_SERVER_OPTIONS").into_boxed_str());
    let mut stack = Stack::start(StackOptions {
        agents: 2,
        quiet_haproxy: true,
        pipelined: env("HUNG_PIPELINED") == "1",
        server_options,
        ..StackOptions::default()
    });
    let end = Instant::now() + WAIT;
    while !(stack.haproxy.agent_server_status("spoa1").starts_with("UP")
        && stack.haproxy.agent_server_status("spoa2").starts_with("UP"))
    {
        assert!(Instant::now() < end, "agents not UP");
        std::thread::sleep(Duration::from_millis(50));
    }
    let load = Load::start(stack.http(), 16);
    load.wait_more(300, Duration::from_secs(120));
    // Both agents take part (rebalancing spreads HAProxy's connections).
    let busy = stack.agents[0].metric("spoa_connections");
    assert!(busy >= 1.0, "agent 1 holds {busy} connections");
    let before = load.totals();
    load.reset_slowest();

    stack.agents[0].pod.signal(Signal::Stop);
    let stopped = Instant::now();
    let mut slowest_while_stopped = Duration::ZERO;
    while stopped.elapsed() < STOPPED {
        std::thread::sleep(Duration::from_millis(200));
        slowest_while_stopped = load.slowest();
    }
    stack.agents[0].pod.signal(Signal::Cont);
    // The requests of the last moments of the stop finish too: each client ends the request
    // it has before it stops, and those count in the slowest.
    let (totals, slowest) = load.stop_with_slowest();
    let during = totals.requests - before.requests;
    eprintln!(
        "HUNG agent stopped {STOPPED:?} behind {}{}{}: {during} requests meanwhile; {totals}; slowest request {:.2} s ({:.2} s while it was stopped)",
        crate::support::haproxy::version(),
        if server_options.is_empty() { String::new() } else { format!(", server lines + `{server_options}`") },
        if env("HUNG_PIPELINED") == "1" { ", without max-waiting-frames 1" } else { "" },
        slowest.as_secs_f64(),
        slowest_while_stopped.as_secs_f64(),
    );
    assert!(
        during > 100,
        "traffic stalled while the agent was stopped: {during}"
    );
    assert_eq!(totals.failed(), 0, "{totals}");
    // At worst one `timeout processing` on the hung agent, then the retry's evaluation
    // elsewhere (with `shutdown-sessions`, measured 3.5 s: DOWN after fall x inter).
    assert!(
        slowest <= PROCESSING + Duration::from_secs(1),
        "slowest request {slowest:?}"
    );
    // The agent comes back and serves again.
    assert!(stack.agents[0].pod.is_running());
}
