//! The UDP I/O threads (`relay-threads`, see docs/turn.md): many allocations relaying through
//! one thread, and clients spread by the kernel (SO_REUSEPORT) over two threads, each of
//! which reads the relay sockets of its own clients. Real process, our UDP client
//! (`lastcall_testkit::turn`), coturn's `turnutils_peer` as the echo peer; the per-thread
//! counters are read from `/metrics`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::{Peer, Turn, SECRET, WAIT};
use lastcall_testkit::turn::TurnClient;

/// One datagram every 10 ms per call.
const PACE: Duration = Duration::from_millis(10);

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn worker_series(metric: &str, worker: usize) -> String {
    format!("lastcall_turn_udp_worker_{metric}_total{{worker=\"{worker}\"}}")
}

/// `n` calls through `server` to `peer`, each streaming at [`PACE`] until `echoes` came back.
fn calls(server: SocketAddr, peer: SocketAddr, n: u16, user: &str, echoes: u64) -> Vec<TurnClient> {
    let mut calls: Vec<TurnClient> = (0..n)
        .map(|i| {
            let mut c = TurnClient::new(server, SECRET, &format!("{user}{i}"));
            c.call(peer, 0x4000 + i)
                .unwrap_or_else(|e| panic!("call {i}: {e:?}"));
            c.stream(PACE);
            c
        })
        .collect();
    for c in &calls {
        c.wait_received(echoes, WAIT);
    }
    for c in &mut calls {
        c.stop_stream(Duration::from_secs(2));
    }
    calls
}

/// Sixty allocations on one I/O thread (`--relay-threads=1`): every one relays both ways
/// (client → listener → relay socket → peer and back through the listener), all read by
/// worker 0, and the allocations end cleanly.
#[test]
fn many_allocations_on_one_worker_all_relay() {
    let turn = Turn::start(&["--relay-threads=1"]);
    turn.pod.wait_for_log("udp_threads=1", WAIT);
    let peer = Peer::start();
    let mut calls = calls(loopback(turn.port), loopback(peer.port), 60, "one", 20);
    assert_eq!(
        turn.metric("turn_total_allocations{type=\"UDP\"}"),
        Some(60.0)
    );
    let relayed: u64 = calls.iter().map(TurnClient::received).sum();
    let read = turn
        .metric(&worker_series("datagrams", 0))
        .expect("worker 0's counter");
    // Every echo was read twice by the worker: from the client, then from the peer.
    assert!(
        read >= 2.0 * relayed as f64,
        "worker 0 read {read} datagrams for {relayed} echoes"
    );
    assert_eq!(turn.metric(&worker_series("datagrams", 1)), None);
    assert_eq!(turn.metric("lastcall_turn_send_dropped_total"), Some(0.0));
    for c in &mut calls {
        c.refresh(0).expect("delete");
    }
    assert_eq!(
        turn.metric("turn_total_allocations{type=\"UDP\"}"),
        Some(0.0)
    );
}

/// Two I/O threads: thirty-two clients (32 source ports) are spread by the kernel over both
/// listeners of the port, and every client's traffic, peer side included, is relayed.
#[test]
fn clients_spread_over_two_workers() {
    let turn = Turn::start(&["--relay-threads=2"]);
    turn.pod.wait_for_log("udp_threads=2", WAIT);
    let peer = Peer::start();
    let calls = calls(loopback(turn.port), loopback(peer.port), 32, "two", 5);
    let per_worker: Vec<f64> = (0..2)
        .map(|w| turn.metric(&worker_series("datagrams", w)).unwrap_or(0.0))
        .collect();
    // Each of 32 clients lands on either thread by its 4-tuple hash: all on one would
    // happen once in 2^31 runs.
    assert!(
        per_worker.iter().all(|n| *n > 0.0),
        "datagrams per worker: {per_worker:?}"
    );
    for w in 0..2 {
        let wakeups = turn.metric(&worker_series("wakeups", w)).unwrap_or(0.0);
        assert!(wakeups > 0.0, "worker {w} never woke");
    }
    assert!(calls.iter().all(|c| c.received() >= 5));
    assert_eq!(turn.metric("lastcall_turn_send_dropped_total"), Some(0.0));
}

/// A port another process holds with SO_REUSEPORT (same user) is not joined: with two I/O
/// threads the start still fails with "cannot bind" (exit 71), as with one.
#[test]
fn a_port_held_by_another_reuseport_socket_is_not_shared() {
    let port = crate::common::free_udp_tcp_port();
    let addr = loopback(port);
    let holder = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )
    .expect("socket");
    holder.set_reuse_port(true).expect("SO_REUSEPORT");
    holder.bind(&addr.into()).expect("bind the holder");
    let admin = format!("127.0.0.1:{}", lastcall_testkit::free_port());
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_lastcall-turn"));
    cmd.args(crate::common::turn_args(port, &admin))
        .arg("--relay-threads=2");
    let mut pod = lastcall_testkit::Pod::spawn(cmd);
    let report = pod.wait_exit(WAIT);
    assert!(!report.killed, "it started on a port in use");
    assert_eq!(report.code, Some(71));
    assert!(
        pod.has_log("cannot bind UDP 127.0.0.1:"),
        "{:?}",
        pod.logs()
    );
}

/// A bad `relay-threads` is a configuration error (exit 64) naming the option and value.
#[test]
fn bad_relay_threads_exit_64_naming_the_option() {
    let port = crate::common::free_udp_tcp_port();
    let admin = format!("127.0.0.1:{}", lastcall_testkit::free_port());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lastcall-turn"))
        .args(crate::common::turn_args(port, &admin))
        .arg("--relay-threads=lots")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("relay-threads=lots: not a number of threads"),
        "{err}"
    );
}
