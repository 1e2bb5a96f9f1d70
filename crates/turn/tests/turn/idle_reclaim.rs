//! Vanished clients do not hold a drain (`--drain-idle-timeout`, 30 s by default), on the real
//! process. coturn's `turnutils_uclient` over UDP never deletes its first, probing allocation
//! (4.6.1 deletes its data allocation with Refresh(0); 4.18 leaves that one too; lifetime
//! 777 s): across a SIGTERM what it left ends about 30 s after its last packet, not at its
//! lifetime. A quiet
//! live call sending one datagram every 5 s meanwhile is never reclaimed, and when it vanishes
//! too the process exits 0 about 30 s after its last datagram.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use lastcall_testkit::turn::TurnClient;
use lastcall_testkit::Signal;

use crate::common::{Peer, Turn, Uclient, SECRET, WAIT};

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The live UDP allocations.
fn udp_allocations(turn: &Turn) -> f64 {
    turn.metric("turn_total_allocations{type=\"UDP\"}")
        .unwrap_or(-1.0)
}

/// Polls until `done`; returns when it first held (bounded by `limit`).
fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Instant {
    let end = Instant::now() + limit;
    loop {
        if done() {
            return Instant::now();
        }
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of `name` (`client=`) in a log line.
fn field(line: &str, name: &str) -> String {
    line.split(name)
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or("")
        .to_string()
}

/// The time of day now (UTC, as the log's timestamps), in seconds.
fn now_of_day() -> f64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (now.as_secs() % 86_400) as f64 + f64::from(now.subsec_micros()) / 1e6
}

/// The time of day of a log line (`2026-12-01T15:48:47.184405Z`), in seconds.
fn seconds_of_day(line: &str) -> f64 {
    let at = line.find('T').expect("a timestamp");
    let hms = &line[at + 1..];
    let end = hms.find('Z').expect("a timestamp");
    let parts: Vec<f64> = hms[..end]
        .split(':')
        .map(|p| p.parse().expect("a number"))
        .collect();
    parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
}

#[test]
fn vanished_clients_are_reclaimed_30s_after_their_last_packet_and_quiet_live_calls_are_not() {
    let mut turn = Turn::start(&["--shutdown-delay=0s", "--drain-timeout=600s", "--verbose"]);
    let peer = Peer::start();
    // The quiet live call: one datagram every 5 s (a WebRTC call on hold sends consent
    // checks this often).
    let mut live = TurnClient::new(loopback(turn.port), SECRET, "quiet");
    live.call(loopback(peer.port), 0x4000).expect("call");
    live.stream(Duration::from_secs(5));
    live.wait_received(1, WAIT);
    // uclient over UDP: 400 messages 20 ms apart (about 8 s), across the SIGTERM.
    let run = Uclient::call(turn.port, peer.port, "vanish")
        .flags(&["-c"])
        .messages(400)
        .gap_ms(20)
        .spawn(Duration::from_secs(120));
    // Its allocations are made once its data reaches the peer.
    let relayed = "turn_traffic_peer_sentp{realm=\"example.org\"}";
    let before = turn.metric(relayed).unwrap_or(0.0);
    until("uclient's data relayed", WAIT, || {
        turn.metric(relayed).unwrap_or(0.0) > before + 20.0
    });
    assert!(udp_allocations(&turn) >= 2.0, "uclient allocated nothing");
    turn.pod.signal(Signal::Term);
    turn.pod.wait_for_log("refusing new allocations", WAIT);
    let report = run.join().expect("uclient thread");
    let uclient_done = Instant::now();
    report.assert_all_echoed(400);
    // What uclient left behind ends when it has been quiet for 30 s.
    until(
        "uclient's allocations reclaimed",
        Duration::from_secs(120),
        || udp_allocations(&turn) == 1.0,
    );
    // Their log lines (the harness reads the log a moment after /metrics shows it).
    let counted = turn
        .metric("lastcall_turn_allocations_reclaimed_total")
        .unwrap_or(0.0);
    assert!(counted >= 1.0, "nothing reclaimed");
    let mut reclaimed: Vec<String> = Vec::new();
    until("the reclaims logged", WAIT, || {
        reclaimed = turn
            .pod
            .logs()
            .into_iter()
            .filter(|l| l.contains("allocation reclaimed"))
            .collect();
        reclaimed.len() as f64 >= counted
    });
    let exited_at = now_of_day() - uclient_done.elapsed().as_secs_f64();
    for line in &reclaimed {
        // Never sooner than 30 s after its Allocate (its first packet), never later than
        // about 30 s after uclient exited (its last packet came before), on the server's
        // own clock. (4.6.1 leaves its probing allocation, whose Allocate is its last
        // packet: 30.0 s; 4.18 leaves its data allocation too.)
        let client = field(line, "client=");
        let created = turn
            .pod
            .logs()
            .into_iter()
            .find(|l| l.contains("allocation created") && field(l, "client=") == client)
            .unwrap_or_else(|| panic!("no creation of {client}"));
        let at = seconds_of_day(line);
        let since_created = at - seconds_of_day(&created);
        let since_exit = at - exited_at;
        println!(
            "FIGURES uclient allocation {client} reclaimed {since_created:.3} s after its Allocate, {since_exit:.1} s after uclient exited"
        );
        assert!(
            since_created >= 29.9,
            "reclaimed {since_created} s after its Allocate"
        );
        assert!(
            since_exit <= 40.0,
            "reclaimed {since_exit} s after uclient's last packet (want about 30 s)"
        );
    }
    println!(
        "FIGURES uclient exited; {:.1} s later its leftover allocations were gone",
        uclient_done.elapsed().as_secs_f64()
    );
    let uclient_allocations = reclaimed.len() as f64;
    assert_eq!(
        turn.metric("lastcall_turn_allocations_reclaimed_total"),
        Some(uclient_allocations)
    );
    // The quiet live call, now 30+ s into the drain, is still there and relaying.
    let echoed = live.received();
    live.wait_received(echoed + 2, WAIT);
    assert_eq!(
        udp_allocations(&turn),
        1.0,
        "the quiet live call was reclaimed"
    );
    assert_eq!(
        live.split(uclient_done).lost(),
        0,
        "the live call lost datagrams"
    );
    // Now it vanishes too (stops sending, never deletes): the drain ends 30 s later, exit 0.
    live.stop_stream(Duration::from_secs(2));
    let last_sent = Instant::now();
    let exit = turn.pod.wait_exit(Duration::from_secs(120));
    let gone = last_sent.elapsed();
    println!(
        "FIGURES the live call's last datagram to exit: {:.1} s (exit {:?})",
        gone.as_secs_f64(),
        exit.code
    );
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(
        gone >= Duration::from_secs(25) && gone <= Duration::from_secs(60),
        "exit {gone:?} after the last datagram"
    );
    assert!(turn.pod.has_log("allocation reclaimed"));
}
