//! Signals and deadlines, through a real HAProxy 2.6 (the documented configuration) and the
//! real CRS, and with a raw SPOP client where HAProxy's own timeouts would get in the way:
//!
//! - the deadline: connections that never go quiet (peers that pipeline as HAProxy does
//!   without `max-waiting-frames 1`, so that no goodbye can ride on an ACK) are cut at
//!   `--drain-timeout`, the agent exits 75 and logs how many sessions it cut;
//! - the deadline is the deadline: an evaluation still running then does not hold the exit;
//! - a second SIGTERM exits within 1 s;
//! - `--on-sigterm ignore` survives SIGTERM (still serving, still ready) and drains on
//!   SIGUSR1 or `POST /drain`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::{Agent, Stack, StackOptions, WAIT};
use bytes::BytesMut;
use lastcall_spop_proto::frame::{self, AgentFrame};
use lastcall_testkit::{self as testkit, Signal};
use spop::frame::Message;
use spop::TypedData;

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

/// Four raw peers pipelining as HAProxy does without `max-waiting-frames 1`: two NOTIFYs
/// in flight each, a new one for every ACK, until the end. With `checker`, a HAProxy that
/// has begun to mark the agent DOWN and has not finished (one health check, refused once
/// the drain refuses, then none): it holds the drain. Returns the agent (exited), its exit,
/// each peer's (ACKs, last frame) and the log mark of the SIGTERM.
fn busy_pipelined_drain(
    timeout: &str,
    checker: bool,
) -> (
    Agent,
    lastcall_testkit::ExitReport,
    Vec<(u64, Option<AgentFrame>)>,
    usize,
) {
    let mut agent = Agent::start(
        Some(ONE_WORKER),
        &[
            "--shutdown-delay",
            "1s",
            "--drain-timeout",
            timeout,
            "--log-level",
            "info,lastcall_spoa::waf=warn",
        ],
    );
    let addr = agent.addr;
    let peers: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut raw = crate::support::spop::Raw::connect(addr, Duration::from_secs(30));
                raw.hello(16380);
                let mut sid = 0u64;
                let mut send = |raw: &mut crate::support::spop::Raw| {
                    sid += 1;
                    raw.send(&crate::support::spop::request(
                        sid,
                        "/busy",
                        Some("q=1"),
                        None,
                    ))
                };
                for _ in 0..2 {
                    send(&mut raw).expect("notify");
                }
                let mut acks = 0u64;
                loop {
                    match raw.next() {
                        Some(AgentFrame::Ack(..)) => {
                            acks += 1;
                            if send(&mut raw).is_err() {
                                return (acks, None);
                            }
                        }
                        other => return (acks, other),
                    }
                }
            })
        })
        .collect();
    let end = Instant::now() + WAIT;
    while agent.metric("spoa_connections") < 4.0 {
        assert!(Instant::now() < end, "the peers never connected");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mark = agent.pod.log_len();
    agent.pod.signal(Signal::Term);
    if checker {
        agent.pod.wait_for_log_after(mark, "-> refusing", WAIT);
        let mut s = TcpStream::connect(addr).expect("connect for a health check");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        let mut hello = Vec::new();
        frame::encode_haproxy_hello(16380, true, &mut hello);
        s.write_all(&hello).expect("health check");
        assert!(
            matches!(&read_until_eof(&mut s)[..], [AgentFrame::Disconnect(0, _)]),
            "the health check is refused"
        );
    }
    let report = agent.pod.wait_exit(Duration::from_secs(60));
    let ends: Vec<_> = peers.into_iter().map(|p| p.join().expect("peer")).collect();
    (agent, report, ends, mark)
}

/// A drain held by a HAProxy that has not marked the agent DOWN yet cannot end while
/// HAProxy keeps pipelined connections busy: the deadline cuts them (75).
#[test]
fn deadline_cuts_busy_connections_with_status_75() {
    let (agent, report, ends, mark) = busy_pipelined_drain("4s", true);
    eprintln!("DEADLINE: {report:?}; peers (ACKs, last frame): {ends:?}");
    assert_eq!(report.code, Some(lastcall::exit::DEADLINE), "{report:?}");
    assert!(
        report.elapsed_since_signal >= Duration::from_millis(3900)
            && report.elapsed_since_signal < Duration::from_secs(8),
        "left {:?} after SIGTERM, deadline 4s",
        report.elapsed_since_signal
    );
    for (acks, last) in &ends {
        assert!(*acks > 0, "a peer got no ACK");
        // Cut at the deadline: AGENT-DISCONNECT status 0, or the close itself.
        assert!(
            matches!(last, Some(AgentFrame::Disconnect(0, _)) | None),
            "{last:?}"
        );
    }
    let logs = agent.pod.logs();
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

/// With no HAProxy left to mark the agent DOWN (no hold: these peers never health-check it,
/// and the 2.5 s for HAProxies not heard from yet pass), busy pipelined connections say a
/// risked goodbye on the ACKs that leave nothing owed, each counted and logged, and the drain
/// ends well before its deadline (it ran to the deadline before: coraza-spoa's SPOE file).
#[test]
fn busy_pipelined_connections_say_a_risked_goodbye_once_no_hold_is_left() {
    let (agent, report, ends, mark) = busy_pipelined_drain("30s", false);
    eprintln!("PIPELINED GOODBYES: {report:?}; peers (ACKs, last frame): {ends:?}");
    assert_eq!(report.code, Some(0), "{report:?}");
    assert!(
        report.elapsed_since_signal < Duration::from_secs(20),
        "{report:?}"
    );
    let logs = agent.pod.logs();
    let risked = logs
        .iter()
        .skip(mark)
        .filter(|l| l.contains("the drain's goodbye on a connection HAProxy pipelines on"))
        .count();
    assert!(risked >= 1, "{logs:#?}");
    for (acks, last) in &ends {
        assert!(*acks > 0, "a peer got no ACK");
        // The goodbye, or the close after it (a NOTIFY sent as it crossed).
        assert!(
            matches!(last, Some(AgentFrame::Disconnect(0, _)) | None),
            "{last:?}"
        );
    }
}

/// A rule that is slow on purpose: `^(a|aa)+$` backtracks exponentially on a run of `a`s
/// that ends in `!`, until PCRE2's match limit stops the attempt. [`SLOW_ARGS`] arguments of
/// forty `a`s and a `!` took 6.6-7.9 s with the release build (libmodsecurity 3.0.9, the
/// 2-core development machine under load 4-5), about 50 s with the debug build these tests
/// run: still evaluating at any deadline below.
const SLOW_RULE: &str = "\
evaluation_timeout: 60s
default_application: slow
applications:
  - name: slow
    directives: |
      SecRuleEngine On
      SecRule ARGS \"@rx ^(a|aa)+$\" \"id:9001,phase:2,pass,t:none,log,msg:'slow on purpose'\"
";

/// Arguments in the slow request.
const SLOW_ARGS: usize = 200;

/// A NOTIFY carrying a `coraza-req` whose query string keeps [`SLOW_RULE`] busy for seconds.
fn slow_notify() -> Vec<u8> {
    let query: Vec<String> = (0..SLOW_ARGS)
        .map(|i| format!("a{i}={}!", "a".repeat(40)))
        .collect();
    let msg = Message {
        name: "coraza-req".into(),
        args: vec![
            ("app".into(), TypedData::String("slow".into())),
            ("method".into(), TypedData::String("GET".into())),
            ("path".into(), TypedData::String("/slow".into())),
            ("query".into(), TypedData::String(query.join("&"))),
            ("version".into(), TypedData::String("1.1".into())),
            (
                "headers".into(),
                TypedData::String("host: slow.example\r\n\r\n".into()),
            ),
        ],
    };
    let mut v = Vec::new();
    frame::encode_notify(1, 1, &msg, &mut v);
    v
}

/// The agent's frames until EOF (or a read error after its close).
fn read_until_eof(s: &mut TcpStream) -> Vec<AgentFrame> {
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    loop {
        while let Some(f) = frame::decode_agent_frame(&mut buf).expect("agent frame") {
            frames.push(f);
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return frames,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The deadline is the deadline: with an evaluation still running when `--drain-timeout`
/// runs out, the agent says goodbye on its connection and exits 75 within the deadline plus
/// lastcall's exit grace (1 s) and a margin for a busy machine, instead of waiting for the
/// evaluation.
#[test]
fn an_evaluation_running_at_the_deadline_does_not_hold_the_exit() {
    let deadline = Duration::from_secs(3);
    let mut agent = Agent::start(
        Some(SLOW_RULE),
        &["--shutdown-delay", "0s", "--drain-timeout", "3s"],
    );
    let mut s = TcpStream::connect(agent.addr).expect("connect agent");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut hello = Vec::new();
    frame::encode_haproxy_hello(16380, false, &mut hello);
    s.write_all(&hello).expect("hello");
    s.write_all(&slow_notify()).expect("notify");
    let sent = Instant::now();
    let end = sent + WAIT;
    while agent.metric("spoa_inflight") < 1.0 {
        assert!(Instant::now() < end, "the evaluation never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    agent.pod.signal(Signal::Term);
    let report = agent.pod.wait_exit(Duration::from_secs(60));
    eprintln!(
        "SLOW EVALUATION AT THE DEADLINE: {report:?}, {:?} after the NOTIFY",
        sent.elapsed()
    );
    assert_eq!(report.code, Some(lastcall::exit::DEADLINE), "{report:?}");
    assert!(
        report.elapsed_since_signal >= deadline - Duration::from_millis(100),
        "left before the deadline: {report:?}"
    );
    assert!(
        report.elapsed_since_signal < deadline + Duration::from_millis(2500),
        "left {:?} after SIGTERM, deadline {deadline:?}",
        report.elapsed_since_signal
    );
    // The evaluation had not finished: the connection got the goodbye, never the ACK.
    let frames = read_until_eof(&mut s);
    assert!(
        matches!(
            &frames[..],
            [AgentFrame::Hello(_), AgentFrame::Disconnect(0, _)]
        ),
        "{frames:?}"
    );
}

/// The same evaluation with a budget of 500 ms: the NOTIFY is answered with the error
/// variable at the budget, the evaluation runs on, and a SIGTERM then leaves at once with
/// status 0 (the connection is idle: nothing is owed), without waiting for it.
#[test]
fn a_runaway_past_its_budget_is_answered_and_does_not_hold_the_drain() {
    let config = SLOW_RULE.replace("evaluation_timeout: 60s", "evaluation_timeout: 500ms");
    let mut agent = Agent::start(
        Some(&config),
        &["--shutdown-delay", "0s", "--drain-timeout", "20s"],
    );
    let mut s = TcpStream::connect(agent.addr).expect("connect agent");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut hello = Vec::new();
    frame::encode_haproxy_hello(16380, false, &mut hello);
    s.write_all(&hello).expect("hello");
    let sent = Instant::now();
    s.write_all(&slow_notify()).expect("notify");
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    while frames.len() < 2 {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).expect("read");
        assert!(n > 0, "closed early: {frames:?}");
        buf.extend_from_slice(&chunk[..n]);
        while let Some(f) = frame::decode_agent_frame(&mut buf).expect("frame") {
            frames.push(f);
        }
    }
    let answered = sent.elapsed();
    eprintln!("RUNAWAY ANSWERED after {answered:?}: {frames:?}");
    // The connection may say its rebalancing goodbye with that ACK: it is then older than
    // its rebalancing age, which lies in 0.5-1 s (engine::REBALANCE_AFTER x [1/2, 1), by the
    // connection's number), and the ACK comes at the budget, 500 ms after the NOTIFY.
    match &frames[..] {
        [AgentFrame::Hello(_), AgentFrame::Ack(1, 1, vars), rest @ ..] => {
            assert_eq!(
                vars.last(),
                Some(&("error".to_string(), TypedData::Int64(99))),
                "{vars:?}"
            );
            let rebalanced = match rest {
                [] => false,
                [AgentFrame::Disconnect(0, m)] if m == "rebalancing" => true,
                _ => panic!("{frames:?}"),
            };
            eprintln!("RUNAWAY rebalancing goodbye with the ACK: {rebalanced}");
        }
        other => panic!("{other:?}"),
    }
    assert!(answered >= Duration::from_millis(500), "{answered:?}");
    assert!(answered < Duration::from_secs(3), "{answered:?}");
    // The watchdog counts the runaway after its ACK is on its way, then logs it.
    agent.pod.wait_for_log("over evaluation_timeout", WAIT);
    assert!(agent.metric("spoa_evaluations_overrunning") >= 1.0);
    assert_eq!(
        agent.metric("spoa_evaluations_failed_closed_total{reason=\"deadline\"}"),
        1.0
    );
    agent.pod.signal(Signal::Term);
    let report = agent.pod.wait_exit(Duration::from_secs(60));
    eprintln!("RUNAWAY AT SIGTERM: {report:?}");
    assert_eq!(report.code, Some(0), "{report:?}");
    assert!(
        report.elapsed_since_signal < Duration::from_secs(3),
        "{report:?}"
    );
}

#[test]
fn second_sigterm_exits_within_a_second() {
    let mut stack = one_agent(None, &["--shutdown-delay", "20s", "--drain-timeout", "60s"]);
    // HAProxy keeps its SPOE connections open (timeout idle 2m): live sessions.
    for i in 0..20 {
        assert_eq!(
            crate::support::get(stack.http(), &format!("/warm/{i}")).status,
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
            crate::support::get(http, &format!("/after-sigterm/{served}")).status,
            200
        );
        served += 1;
    }
    assert!(served >= 5);
    let agent = &mut stack.agents[0];
    assert!(agent.pod.is_running());
    assert_eq!(testkit::http_get(agent.admin, "/readyz").0, 200);

    match trigger {
        "SIGUSR1" => agent.pod.signal(Signal::Usr1),
        _ => {
            let (status, body) = testkit::http_post(agent.admin, "/drain", None);
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
