//! `--kernel-relay`: the kernel fast path on real processes. coturn's uclient and our own
//! client relay through it (the kernel's counters move, the daemon's UDP threads read only
//! the control messages); a peer without a permission is still dropped (by the daemon); a
//! binding that expires stops relaying; a drain with calls on the fast path loses nothing
//! and ends at the last allocation.
//!
//! In a build without the `kernel-relay` feature (or where the kernel refuses the program
//! and this is not CI) the option must say so in one log line and relay in user space:
//! that is checked instead.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use lastcall_testkit::turn::TurnClient;
use lastcall_testkit::Signal;

use crate::common::{Peer, Turn, Uclient, SECRET, WAIT};

const ON: &str = "kernel fast path on";
const OFF: &str = "the kernel fast path is off";

/// A `lastcall-turn --kernel-relay`, and whether its fast path runs.
enum Started {
    /// The fast path runs.
    Kernel(Turn),
    /// It said why not and relays in user space.
    UserSpace(Turn),
}

/// `lastcall-turn --kernel-relay EXTRA`; where the fast path does not run, checks that it
/// said why in one line (and, in a build with the feature, that this is neither root nor
/// CI).
fn kernel_turn(extra: &[&str]) -> Started {
    let mut args = vec!["--kernel-relay"];
    args.extend(extra);
    let turn = Turn::start(&args);
    if turn.pod.has_log(ON) {
        return Started::Kernel(turn);
    }
    let why: Vec<String> = turn
        .pod
        .logs()
        .into_iter()
        .filter(|l| l.contains(OFF))
        .collect();
    assert_eq!(why.len(), 1, "one line says why: {:?}", turn.pod.logs());
    if cfg!(feature = "kernel-relay") {
        assert!(
            std::env::var_os("CI").is_none() && !is_root(),
            "the fast path must run as root and in CI: {why:?}"
        );
        eprintln!("SKIP: {}", why[0]);
    } else {
        assert!(why[0].contains("kernel-relay` feature"), "{why:?}");
    }
    Started::UserSpace(turn)
}

fn datagrams_read(turn: &Turn) -> f64 {
    lastcall_testkit::metrics::scrape(&turn.admin)
        .lines()
        .filter(|l| l.starts_with("lastcall_turn_udp_worker_datagrams_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn kernel(turn: &Turn, direction: &str) -> f64 {
    turn.metric(&format!(
        "lastcall_turn_kernel_relayed_packets_total{{direction=\"{direction}\"}}"
    ))
    .unwrap_or(0.0)
}

/// Where the fast path cannot run, `--kernel-relay` relays in user space (after its one
/// log line); where it can, the same without the option.
#[test]
fn without_the_fast_path_uclient_relays_in_user_space() {
    let turn = match kernel_turn(&[]) {
        Started::Kernel(_) => Turn::start(&[]),
        Started::UserSpace(turn) => turn,
    };
    let peer = Peer::start();
    let r = Uclient::call(turn.port, peer.port, "alice")
        .flags(&["-g", "-c"])
        .messages(20)
        .clients(2)
        .gap_ms(5)
        .run(Duration::from_secs(60));
    r.assert_all_echoed(40);
    assert_eq!(
        turn.metric("lastcall_turn_kernel_routes"),
        None,
        "no fast path here"
    );
}

/// uclient's ChannelData both ways goes through the kernel: every message echoed, the
/// kernel counted them, the daemon read only the control messages.
#[test]
fn uclient_relays_through_the_kernel() {
    let Started::Kernel(turn) = kernel_turn(&[]) else {
        return;
    };
    let peer = Peer::start();
    let (n, m) = (200u64, 2u64);
    let r = Uclient::call(turn.port, peer.port, "alice")
        .flags(&["-g", "-c"])
        .messages(n)
        .clients(m)
        .gap_ms(2)
        .run(Duration::from_secs(90));
    r.assert_all_echoed(n * m);
    let (to_peer, to_client) = (kernel(&turn, "to_peer"), kernel(&turn, "to_client"));
    assert!(to_peer >= (n * m) as f64, "kernel to_peer {to_peer}");
    assert!(to_client >= (n * m) as f64, "kernel to_client {to_client}");
    // The daemon read the Allocates, permissions, bindings and refreshes only.
    let read = datagrams_read(&turn);
    assert!(
        read < (n * m / 4) as f64,
        "the daemon read {read} datagrams"
    );
    // The live traffic counters include the kernel's.
    let sent = turn
        .metric("turn_traffic_peer_sentp{realm=\"example.org\"}")
        .unwrap_or(0.0);
    assert!(sent >= (n * m) as f64, "turn_traffic_peer_sentp {sent}");
}

/// Our client: a call relayed by the kernel; a peer without a permission (another IP) is
/// dropped by the daemon and reaches nobody; a permitted IP on another port (no channel)
/// is the daemon's to relay; when the binding expires the kernel stops relaying.
#[test]
fn permissions_and_expiry_hold_on_the_fast_path() {
    let Started::Kernel(turn) = kernel_turn(&["--channel-lifetime=3", "--permission-lifetime=3"])
    else {
        return;
    };
    let peer = Peer::start();
    let server: SocketAddr = format!("127.0.0.1:{}", turn.port).parse().unwrap();
    let mut c = TurnClient::new(server, SECRET, "alice");
    let peer_addr: SocketAddr = format!("127.0.0.1:{}", peer.port).parse().unwrap();
    let relayed = c.call(peer_addr, 0x4001).expect("call");
    let read0 = datagrams_read(&turn);
    c.stream(Duration::from_millis(2));
    c.wait_received(200, WAIT);
    assert!(kernel(&turn, "to_client") >= 200.0);
    // A peer on 127.0.0.2 has no permission: dropped by the daemon, not relayed.
    let stranger = UdpSocket::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    let dropped0 = turn
        .metric("lastcall_turn_peer_dropped_total")
        .unwrap_or(0.0);
    stranger
        .send_to(b"LCTT\0\0\0\0\0\0\0\x01no permission", relayed)
        .expect("send");
    turn.wait_metric_at_least("lastcall_turn_peer_dropped_total", dropped0 + 1.0);
    // While streaming the daemon read almost nothing (the stranger's datagram, a refresh).
    let read = datagrams_read(&turn) - read0;
    assert!(
        read < 20.0,
        "the daemon read {read} datagrams while the kernel relayed"
    );
    // Stop refreshing: within 3 s the route expires and the kernel hands the datagrams to
    // the daemon, which drops them (the channel and permission expired).
    turn.wait_metric_at_least(
        "lastcall_turn_kernel_handed_on_total{reason=\"expired\"}",
        1.0,
    );
    let dropped = turn
        .metric("lastcall_turn_client_data_dropped_total")
        .unwrap_or(0.0);
    turn.wait_metric_at_least("lastcall_turn_client_data_dropped_total", dropped + 10.0);
    let received = c.received();
    let relayed_before = kernel(&turn, "to_peer");
    turn.wait_metric_at_least("lastcall_turn_client_data_dropped_total", dropped + 50.0);
    assert_eq!(
        kernel(&turn, "to_peer"),
        relayed_before,
        "an expired route relayed"
    );
    assert!(
        c.received() <= received + 2,
        "echoes after the binding expired"
    );
    c.stop_stream(Duration::from_millis(200));
}

/// SIGTERM while calls stream through the kernel: nothing lost, none reclaimed as idle (the
/// kernel's counters tell the core they are not), the process waits for the last allocation
/// and exits when it is deleted.
#[test]
fn a_drain_with_calls_on_the_fast_path_loses_nothing_and_ends_at_the_last_allocation() {
    // A short idle reclaim: calls whose datagrams only the kernel sees must not look idle.
    let Started::Kernel(mut turn) = kernel_turn(&[
        "--shutdown-delay=0s",
        "--drain-timeout=60s",
        "--drain-idle-timeout=2s",
    ]) else {
        return;
    };
    let peer = Peer::start();
    let server: SocketAddr = format!("127.0.0.1:{}", turn.port).parse().unwrap();
    let peer_addr: SocketAddr = format!("127.0.0.1:{}", peer.port).parse().unwrap();
    let mut calls: Vec<TurnClient> = (0..3)
        .map(|i| {
            let mut c = TurnClient::new(server, SECRET, "alice");
            c.call(peer_addr, 0x4001 + i).expect("call");
            c.stream(Duration::from_millis(5));
            c
        })
        .collect();
    for c in &calls {
        c.wait_received(50, WAIT);
    }
    let kernel_before = kernel(&turn, "to_client");
    turn.pod.signal(Signal::Term);
    let mark = turn.pod.log_len();
    // 4 s of streaming (800 datagrams at 5 ms), twice the idle timeout: none reclaimed.
    for c in &calls {
        let n = c.received();
        c.wait_received(n + 800, WAIT);
    }
    assert!(
        kernel(&turn, "to_client") >= kernel_before + 300.0,
        "calls left the kernel"
    );
    assert!(turn.pod.is_running(), "exited with calls up");
    let last = calls.len() - 1;
    for (i, c) in calls.iter_mut().enumerate() {
        c.stop_stream(Duration::from_millis(500));
        let at = Instant::now();
        assert_eq!(c.split(at).lost(), 0, "call {i} lost datagrams");
        if i < last {
            c.refresh(0).expect("delete");
            assert!(turn.pod.is_running(), "exited before the last allocation");
        }
    }
    calls[last].refresh(0).expect("delete the last");
    let exit = turn.pod.wait_exit(WAIT);
    assert_eq!(exit.code, Some(0), "{:?}", turn.pod.logs().get(mark..));
}

/// Whether this process runs as root (`Uid:` of /proc/self/status).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        .unwrap_or(false)
}
