//! The lastcall-turn chart's dashboard and alert rules (`charts/lastcall-turn/files/`) against
//! a real server: coturn's `turnutils_uclient` relays a call longer than `--drain-timeout`
//! through `lastcall-turn --kernel-relay` (the kernel fast path where it can run: root and the
//! `kernel-relay` feature, as in CI), the server is drained under it and cut at its deadline
//! (exit 75), and `/metrics` is recorded throughout as Prometheus would scrape it. Every
//! metric name the dashboard and rules use must be served (the fast path's included, where it
//! ran), and `promtool test rules` on the recorded series must see LastcallTurnDrainNearDeadline
//! fire in the drain's last quarter, and only there.

use std::time::{Duration, Instant};

use lastcall_testkit::monitoring::{self, Recorder};
use lastcall_testkit::Signal;

use crate::common::{uclient, Peer, Turn, SECRET, WAIT};

/// How often the recorder scrapes.
const EVERY: Duration = Duration::from_millis(250);
/// The drain's deadline.
const DRAIN_TIMEOUT: f64 = 6.0;

#[test]
fn dashboard_and_rules_on_a_drain_cut_at_its_deadline() {
    let timeout = format!("--drain-timeout={DRAIN_TIMEOUT}s");
    let mut turn = Turn::start(&["--kernel-relay", "--shutdown-delay=1s", &timeout]);
    let kernel = turn.pod.has_log("kernel fast path on");
    if !kernel {
        let why: Vec<String> = turn
            .pod
            .logs()
            .into_iter()
            .filter(|l| l.contains("the kernel fast path is off"))
            .collect();
        assert!(
            !cfg!(feature = "kernel-relay") || (std::env::var_os("CI").is_none() && !is_root()),
            "the fast path must run as root and in CI: {why:?}"
        );
        eprintln!("SKIP the kernel fast path's names: {why:?}");
    }
    let admin: std::net::SocketAddr = turn.admin.parse().expect("admin address");
    let recorder = Recorder::start(EVERY);
    recorder.add("lastcall-turn", admin);
    let peer = Peer::start();
    let (port, pp) = (turn.port.to_string(), peer.port.to_string());
    // 500 messages, one every 20 ms: 10 s of call, longer than the drain's 6 s.
    let call = std::thread::spawn(move || {
        uclient(
            &[
                "-X",
                "-g",
                "-c",
                "-n",
                "500",
                "-m",
                "1",
                "-z",
                "20",
                "-p",
                &port,
                "-e",
                "127.0.0.1",
                "-r",
                &pp,
                "-u",
                "alice",
                "-W",
                SECRET,
            ],
            Duration::from_secs(60),
        )
    });
    turn.wait_metric_at_least("turn_total_traffic_peer_sentp", 20.0);
    let signalled = Instant::now();
    turn.pod.signal(Signal::Term);
    let exit = turn.pod.wait_exit(WAIT);
    assert_eq!(exit.code, Some(lastcall::exit::DEADLINE), "{exit:?}");
    assert!(
        signalled.elapsed() >= Duration::from_secs_f64(DRAIN_TIMEOUT),
        "{:?}",
        signalled.elapsed()
    );
    // What Prometheus sees next: the target gone.
    assert!(recorder.wait_rounds(3, WAIT), "the recorder stopped");
    let started_unix = recorder.started_unix;
    let scrapes = recorder.finish();
    let _ = call.join();

    // Every name of the dashboard and the rules is served (the kernel's where it ran).
    let served = monitoring::served_by(&scrapes, "lastcall-turn");
    if kernel {
        assert!(
            scrapes.iter().any(|s| {
                lastcall_testkit::metrics::value(
                    &s.text,
                    "lastcall_turn_kernel_relayed_packets_total{direction=\"to_peer\"}",
                )
                .is_some_and(|v| v > 0.0)
            }),
            "the call did not go through the kernel"
        );
    }
    let n = monitoring::assert_chart_served("lastcall-turn", &served, |name| {
        !kernel && name.starts_with("lastcall_turn_kernel_")
    });
    assert!(n >= 30, "only {n} names checked");

    // The alert fires exactly in the slots where less than a quarter of the deadline is left
    // with an allocation live (promtool's clock: seconds since the recording started).
    let step = EVERY.as_secs_f64();
    let mut firing = 0;
    let mut cases = String::from("    promql_expr_test:\n");
    for s in &scrapes {
        let slot = (s.at / step).round();
        let value = |series: &str| lastcall_testkit::metrics::value(&s.text, series);
        let deadline = value("lastcall_drain_deadline_timestamp_seconds").unwrap_or(0.0);
        let sessions = value("lastcall_sessions").unwrap_or(0.0);
        let left = deadline - started_unix - slot * step;
        if deadline > 0.0 && (left - 0.25 * DRAIN_TIMEOUT).abs() < 0.05 {
            continue; // on the boundary: either answer is right
        }
        let fires = deadline > 0.0 && left < 0.25 * DRAIN_TIMEOUT && sessions > 0.0;
        firing += usize::from(fires);
        let ms = (slot * step * 1000.0).round() as u64;
        cases.push_str(&format!(
            "      - expr: 'ALERTS{{alertname=\"LastcallTurnDrainNearDeadline\", alertstate=\"firing\"}}'\n        eval_time: {ms}ms\n"
        ));
        if fires {
            cases.push_str(&format!(
                "        exp_samples:\n          - labels: 'ALERTS{{alertname=\"LastcallTurnDrainNearDeadline\", alertstate=\"firing\", instance=\"{admin}\", job=\"lastcall-turn\", severity=\"warning\"}}'\n            value: 1\n"
            ));
        } else {
            cases.push_str("        exp_samples: []\n");
        }
    }
    assert!(
        firing >= 2,
        "only {firing} scrapes in the drain's last quarter with the call live"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let input = monitoring::promtool_input_series(&scrapes, EVERY, started_unix);
    let out = monitoring::promtool_test(
        &monitoring::rules_path("lastcall-turn"),
        "a drain cut at its deadline",
        EVERY,
        &input,
        &cases,
        dir.path(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{out} ({firing} slots firing)");
}

/// Whether this process runs as root.
fn is_root() -> bool {
    lastcall_testkit::procfs::euid() == 0
}
