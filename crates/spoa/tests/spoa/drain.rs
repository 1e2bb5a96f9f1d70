//! The drain recipe through a real HAProxy with two agents: SIGTERM one agent while requests
//! flow; once it refuses work its connections say goodbye and its health checks are refused,
//! it exits 0 well before its deadline, HAProxy marks it DOWN, and no request fails.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{Stack, StackOptions, WAIT};
use lastcall_testkit::Signal;

#[test]
fn sigterm_drains_one_agent_without_failing_requests() {
    let mut stack = Stack::start(StackOptions {
        agents: 2,
        agent_args: vec![
            "--shutdown-delay".into(),
            "3s".into(),
            "--drain-timeout".into(),
            "20s".into(),
        ],
        ..StackOptions::default()
    });
    let http = stack.http();
    // Both agents must be UP and in use before the drain.
    let end = Instant::now() + WAIT;
    while stack.haproxy.agent_server_status("spoa1") != "UP"
        || stack.haproxy.agent_server_status("spoa2") != "UP"
    {
        assert!(Instant::now() < end, "agents not UP");
        std::thread::sleep(Duration::from_millis(100));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let attack = i % 4 == 0;
                    let target = if attack {
                        format!("/w{w}?id=1'%20OR%20'1'='1")
                    } else {
                        format!("/w{w}/{i}")
                    };
                    let want = if attack { 403 } else { 200 };
                    match crate::support::http(http, "GET", &target, &[], b"") {
                        Ok(r) if r.status == want => ok.fetch_add(1, Ordering::SeqCst),
                        other => {
                            eprintln!("failed: {target} -> {other:?}");
                            failed.fetch_add(1, Ordering::SeqCst)
                        }
                    };
                }
            })
        })
        .collect();
    let wait_some = |n: u64| {
        let target = ok.load(Ordering::SeqCst) + n;
        let end = Instant::now() + WAIT;
        while ok.load(Ordering::SeqCst) < target {
            assert!(Instant::now() < end, "traffic stalled");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_some(100);
    assert!(stack.agents[0].metric("spoa_connections") >= 1.0);

    let draining = &mut stack.agents[0];
    draining.pod.signal(Signal::Term);
    let report = draining.pod.wait_exit(Duration::from_secs(40));
    assert_eq!(report.code, Some(0), "{report:?}");
    assert!(!report.killed);
    assert!(
        report.elapsed_since_signal < Duration::from_secs(15),
        "left {:?} after SIGTERM",
        report.elapsed_since_signal
    );
    // Its health checks were refused from the refusing phase on, and fail now that it is
    // gone: HAProxy marks it DOWN within fall x inter (2 s) and a check.
    let end = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let status = stack.haproxy.agent_server_status("spoa1");
        if status.starts_with("DOWN") || Instant::now() > end {
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.starts_with("DOWN"), "spoa1 is {status}");

    wait_some(100);
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        let _ = w.join();
    }
    let (ok, failed) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    assert_eq!(
        failed, 0,
        "{failed} requests failed during the drain ({ok} ok)"
    );
}

#[test]
fn linger_refuses_nothing_and_leaves_when_haproxy_is_gone() {
    let mut stack = Stack::start(StackOptions {
        agents: 1,
        agent_args: vec![
            "--on-sigterm".into(),
            "linger".into(),
            "--shutdown-delay".into(),
            "1s".into(),
            "--drain-timeout".into(),
            "60s".into(),
        ],
        ..StackOptions::default()
    });
    let http = stack.http();
    let agent = &mut stack.agents[0];
    agent.signal_and_wait_for_log(Signal::Term, "linger");
    // Well past the delay and several health checks: still served, never DOWN.
    let end = Instant::now() + Duration::from_secs(4);
    let mut served = 0;
    while Instant::now() < end {
        let r = crate::support::get(http, "/still-here");
        assert_eq!(r.status, 200, "{}", r.text());
        served += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(served > 10);
    assert!(stack.haproxy.agent_server_status("spoa1").starts_with("UP"));
    assert!(stack.agents[0].pod.is_running());

    // HAProxy leaves (it closes its connections): the agent follows, exit 0.
    stack.haproxy.pod.signal(Signal::Kill);
    let report = stack.agents[0].pod.wait_exit(Duration::from_secs(40));
    assert_eq!(report.code, Some(0), "{report:?}");
}
