//! Termination of `lastcall-turn` under a call load, measured: calls relaying
//! at a fixed rate across SIGTERM lose nothing and the process exits 0 within 1 s of the last
//! allocation being deleted; in Refusing a new client gets 403 at once or is sent (300,
//! round-robin) to an alternate server that relays it; during `--shutdown-delay` Allocates
//! still succeed while `/readyz` is 503; `--drain-min-allocations`; the deadline and a
//! second SIGTERM; and, for the docs, what coturn 4.6.1 loses on SIGTERM under the same load.
//!
//! Clients: coturn's real `turnutils_uclient` (over TCP, where the server ends the
//! allocation when the connection closes: uclient never deletes its UDP allocations) and a
//! small UDP client of our own (`lastcall_testkit::turn`) that streams sequence-numbered
//! ChannelData at a fixed rate and deletes its allocation with Refresh(0), so every lost
//! datagram and the moment of the last deletion are known. The peer is coturn's
//! `turnutils_peer`. Every figure is printed (`cargo nextest run -p lastcall-turn --test
//! termination --no-capture`, lines starting with `FIGURES`).

use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::{Peer, Report, Turn, Uclient, SECRET, WAIT};
use lastcall_testkit::turn::{Split, TurnClient, TurnError};
use lastcall_testkit::{self as testkit, ExitReport, Pod, Signal};

/// One datagram every 20 ms per call: 50/s, a voice call's packet rate.
const PACE: Duration = Duration::from_millis(20);
/// How soon after the last allocation ends the process must be gone (termination.md:
/// "a daemon with nothing left to do leaves within a second").
const EXIT_BOUND: Duration = Duration::from_secs(1);

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `n` calls of our own client through `server` to `peer`, streaming at [`PACE`], each with
/// at least a few echoes back.
fn start_calls(server: SocketAddr, peer: SocketAddr, n: u16, user: &str) -> Vec<TurnClient> {
    let mut calls: Vec<TurnClient> = (0..n)
        .map(|i| {
            let mut c = TurnClient::new(server, SECRET, &format!("{user}{i}"));
            c.call(peer, 0x4000 + i)
                .unwrap_or_else(|e| panic!("call {i} through {server}: {e:?}"));
            c.stream(PACE);
            c
        })
        .collect();
    for c in &mut calls {
        c.wait_received(10, WAIT);
    }
    calls
}

/// coturn's uclient over TCP: `clients` calls of `msgs` messages, `gap_ms` apart, in a thread.
fn tcp_uclient(
    port: u16,
    peer_port: u16,
    user: &'static str,
    clients: u64,
    msgs: u64,
    gap_ms: u64,
) -> JoinHandle<Report> {
    Uclient::call(port, peer_port, user)
        .flags(&["-t", "-c"])
        .messages(msgs)
        .clients(clients)
        .gap_ms(gap_ms)
        .spawn(Duration::from_secs(120))
}

/// Polls until the process is gone; returns the instant it was first seen gone and the
/// exit report (SIGKILL at `grace` after the last signal, like the kubelet).
fn exit_instant(pod: &mut Pod, grace: Duration) -> (Instant, ExitReport) {
    let until = Instant::now() + grace;
    while pod.is_running() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let gone = Instant::now();
    (gone, pod.wait_exit(grace))
}

/// Waits until `series` equals `value` (bounded).
fn wait_metric(turn: &Turn, series: &str, value: f64) {
    let until = Instant::now() + WAIT;
    loop {
        let v = turn.metric(series);
        if v == Some(value) {
            return;
        }
        assert!(Instant::now() < until, "{series} is {v:?}, never {value}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `/readyz` answers `status`; returns how long that took.
fn wait_readyz(turn: &Turn, status: u16) -> Duration {
    let started = Instant::now();
    loop {
        if testkit::http_get(&turn.admin, "/readyz").0 == status {
            return started.elapsed();
        }
        assert!(started.elapsed() < WAIT, "/readyz never answered {status}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// ESTABLISHED IPv4 TCP connections whose local port is `port` (server side), from
/// /proc/net/tcp.
fn established_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1).is_some_and(|a| a.ends_with(&local)) && f.get(3) == Some(&"01")
        })
        .count()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn print_split(what: &str, i: usize, s: Split) {
    println!(
        "FIGURES {what} call {i}: before SIGTERM sent {} lost {}; after SIGTERM sent {} lost {}",
        s.sent_before, s.lost_before, s.sent_after, s.lost_after
    );
}

/// Calls relaying at a fixed rate across SIGTERM (and through Refusing) lose
/// nothing; everything on an existing allocation keeps working; the process exits 0 within
/// 1 s of the last allocation's deletion.
#[test]
fn fixed_rate_calls_cross_sigterm_without_loss_and_exit_0_within_1s_of_the_last_delete() {
    let mut turn = Turn::start(&["--shutdown-delay=1s", "--drain-timeout=60s"]);
    let peer = Peer::start();
    let (server, peer_addr) = (loopback(turn.port), loopback(peer.port));
    // Real clients: two uclient calls over TCP, 300 messages 20 ms apart (6 s each).
    let tcp = tcp_uclient(turn.port, peer.port, "tcpcall", 2, 300, 20);
    // Our own: three UDP calls at 50 datagrams/s.
    let mut calls = start_calls(server, peer_addr, 3, "udpcall");
    turn.wait_metric_at_least("turn_total_allocations{type=\"TCP\"}", 2.0);

    let mark = turn.pod.log_len();
    let term_at = Instant::now();
    turn.pod.signal(Signal::Term);
    let unready = wait_readyz(&turn, 503);
    turn.pod
        .wait_for_log_after(mark, "refusing new allocations (403)", WAIT);
    let refusing_at = Instant::now();

    // Refusing: a newcomer is refused, every call keeps refreshing, permitting, binding.
    let newcomer = TurnClient::new(server, SECRET, "newcomer").allocate(600);
    assert!(
        matches!(newcomer, Err(TurnError::Code { code: 403, .. })),
        "{newcomer:?}"
    );
    for c in &mut calls {
        let ch = c.channel.expect("bound");
        c.refresh(600).expect("Refresh while refusing");
        c.create_permission(peer_addr)
            .expect("CreatePermission while refusing");
        c.channel_bind(ch, peer_addr)
            .expect("ChannelBind while refusing");
        c.binding().expect("Binding while refusing");
        let n = c.received();
        c.wait_received(n + 25, WAIT); // half a second more of relaying in Refusing
    }

    let tcp = tcp.join().expect("uclient thread");
    println!(
        "FIGURES run1 uclient -t -m 2 -n 300 -z 20: sent {} received {} lost {:?} status {:?}",
        tcp.send_msgs, tcp.recv_msgs, tcp.lost, tcp.status
    );
    tcp.assert_all_echoed(600);
    assert!(turn.pod.is_running(), "the drain waits for the UDP calls");

    // Hang up one call at a time (Refresh with lifetime 0).
    let total = calls.len();
    let mut last_delete = Instant::now();
    for (i, c) in calls.iter_mut().enumerate() {
        c.stop_stream(Duration::from_millis(500));
        let split = c.split(term_at);
        print_split("run1 lastcall-turn", i, split);
        assert_eq!(split.lost(), 0, "call {i} lost datagrams: {split:?}");
        assert!(
            split.sent_after >= 50,
            "call {i} crossed the SIGTERM: {split:?}"
        );
        c.refresh(0).expect("delete the allocation");
        last_delete = Instant::now();
        let left = total - i - 1;
        if left > 0 {
            wait_metric(&turn, "lastcall_sessions", left as f64);
            assert!(turn.pod.is_running(), "{left} calls are still live");
        }
    }
    let (gone, exit) = exit_instant(&mut turn.pod, WAIT);
    let after_delete = gone.saturating_duration_since(last_delete);
    println!(
        "FIGURES run1 lastcall-turn: exit status {:?}, {} after the last allocation was deleted; \
         SIGTERM -> /readyz 503 {}, -> Refusing {}; drain lasted {}",
        exit.code,
        ms(after_delete),
        ms(unready),
        ms(refusing_at - term_at),
        ms(gone - term_at)
    );
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(
        after_delete < EXIT_BOUND,
        "exit {after_delete:?} after the last deletion"
    );
    assert!(turn.pod.has_log("drain ended: idle"));
}

/// In Refusing, a new client fails at once with 403 — our
/// client and uclient over UDP and TCP — while the live call goes on.
#[test]
fn refusing_without_alternate_fails_new_clients_at_once_with_403() {
    let mut turn = Turn::start(&["--shutdown-delay=0s", "--drain-timeout=60s"]);
    let peer = Peer::start();
    let (server, peer_addr) = (loopback(turn.port), loopback(peer.port));
    let mut calls = start_calls(server, peer_addr, 1, "live");
    let term_at = Instant::now();
    turn.pod.signal(Signal::Term);
    turn.pod
        .wait_for_log("refusing new allocations (403)", WAIT);

    let mut late = TurnClient::new(server, SECRET, "late");
    let started = Instant::now();
    let refused = late.allocate(600);
    let own = started.elapsed();
    assert_eq!(
        refused,
        Err(TurnError::Code {
            code: 403,
            alternate: None
        })
    );
    let late = Uclient::call(turn.port, peer.port, "late").messages(5);
    let udp = late.clone().flags(&["-c"]).run(Duration::from_secs(60));
    let tcp = late.flags(&["-t", "-c"]).run(Duration::from_secs(60));
    println!(
        "FIGURES run2 403: our client refused after {} (401 round trip + Allocate); \
         uclient UDP exit {:?} after {}; uclient TCP exit {:?} after {} (process start to exit)",
        ms(own),
        udp.status,
        ms(udp.elapsed),
        tcp.status,
        ms(tcp.elapsed)
    );
    for (what, r) in [("UDP", &udp), ("TCP", &tcp)] {
        assert!(
            r.output.contains("error 403"),
            "uclient {what}: 403 expected:\n{}",
            r.output
        );
        assert_ne!(r.status, Some(0), "uclient {what} must fail:\n{}", r.output);
        assert!(
            r.elapsed < EXIT_BOUND,
            "uclient {what} took {:?}",
            r.elapsed
        );
    }
    assert!(own < EXIT_BOUND, "refused after {own:?}");
    assert!(
        turn.metric("lastcall_turn_allocate_refused_draining_total")
            .unwrap_or(0.0)
            >= 3.0
    );

    let call = &mut calls[0];
    call.stop_stream(Duration::from_millis(500));
    let split = call.split(term_at);
    print_split("run2 403 live", 0, split);
    assert_eq!(split.lost(), 0, "{split:?}");
    call.refresh(0).expect("delete");
    let deleted = Instant::now();
    let (gone, exit) = exit_instant(&mut turn.pod, WAIT);
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(gone - deleted < EXIT_BOUND, "{:?}", gone - deleted);
}

/// In Refusing, new Allocates get 300 with ALTERNATE-SERVER, in
/// turn over the `--alternate-server` list; a client that follows it relays through the
/// second `lastcall-turn` (ours and uclient, every message echoed); the live call on the
/// draining server loses nothing.
#[test]
fn refusing_redirects_new_clients_round_robin_to_alternates_that_relay() {
    let b = Turn::start(&[]);
    let c = Turn::start(&[]);
    let mut a = Turn::start(&[
        "--shutdown-delay=0s",
        "--drain-timeout=60s",
        &format!("--alternate-server=127.0.0.1:{}", b.port),
        &format!("--alternate-server=127.0.0.1:{}", c.port),
    ]);
    let peer = Peer::start();
    let (server, peer_addr) = (loopback(a.port), loopback(peer.port));
    let mut calls = start_calls(server, peer_addr, 1, "live");
    let term_at = Instant::now();
    a.pod.signal(Signal::Term);
    a.pod
        .wait_for_log("refusing new allocations (300 Try Alternate)", WAIT);

    // Three newcomers: 300 each, alternating between B and C.
    let mut alternates = Vec::new();
    for i in 0..3 {
        let mut newcomer = TurnClient::new(server, SECRET, &format!("new{i}"));
        let started = Instant::now();
        let r = newcomer.allocate(600);
        let took = started.elapsed();
        match r {
            Err(TurnError::Code {
                code: 300,
                alternate: Some(alt),
            }) => alternates.push(alt),
            other => panic!("300 with ALTERNATE-SERVER expected, got {other:?}"),
        }
        println!(
            "FIGURES run2 300: newcomer {i} redirected to {} after {}",
            alternates[i],
            ms(took)
        );
        assert!(took < EXIT_BOUND, "{took:?}");
    }
    let (bb, cc) = (loopback(b.port), loopback(c.port));
    assert!(
        (alternates[0] == bb && alternates[1] == cc)
            || (alternates[0] == cc && alternates[1] == bb),
        "round-robin over B and C: {alternates:?}"
    );
    assert_eq!(alternates[2], alternates[0], "round-robin: {alternates:?}");

    // Our client follows the redirect and relays through the alternate.
    let mut moved = start_calls(alternates[0], peer_addr, 1, "moved");
    // uclient follows it by itself.
    let uc = Uclient::call(a.port, peer.port, "newcomer")
        .flags(&["-c"])
        .messages(20)
        .clients(2)
        .gap_ms(5)
        .run(Duration::from_secs(60));
    println!(
        "FIGURES run2 300: uclient via A -> alternate: sent {} received {} lost {:?} status {:?} in {}",
        uc.send_msgs,
        uc.recv_msgs,
        uc.lost,
        uc.status,
        ms(uc.elapsed)
    );
    uc.assert_all_echoed(40);
    let on_b = b
        .metric("lastcall_turn_allocations_created_total")
        .unwrap_or(0.0);
    let on_c = c
        .metric("lastcall_turn_allocations_created_total")
        .unwrap_or(0.0);
    let on_a = a
        .metric("lastcall_turn_allocations_created_total")
        .unwrap_or(0.0);
    println!("FIGURES run2 300: allocations created on A {on_a}, B {on_b}, C {on_c}");
    assert!(on_b + on_c >= 3.0, "B {on_b}, C {on_c}");
    assert_eq!(on_a, 1.0, "A created only the live call");

    let m = &mut moved[0];
    m.stop_stream(Duration::from_millis(500));
    assert_eq!(m.split(term_at).lost(), 0, "{:?}", m.split(term_at));
    assert!(m.sent() >= 10);
    let call = &mut calls[0];
    call.stop_stream(Duration::from_millis(500));
    let split = call.split(term_at);
    print_split("run2 300 live on A", 0, split);
    assert_eq!(
        split.lost(),
        0,
        "{split:?}: lost (seq, ms from SIGTERM, send error) {:?}; server send drops {:?}",
        call.lost_detail(term_at),
        a.metric("lastcall_turn_send_dropped_total")
    );
    call.refresh(0).expect("delete");
    let exit = a.pod.wait_exit(WAIT);
    assert_eq!(exit.code, Some(0), "{exit:?}");
}

/// During `--shutdown-delay` (Announcing) a new allocation succeeds — ours and
/// uclient's — and relays, while `/readyz` is 503 and `/livez` 200; with nothing left the
/// process leaves at the end of the delay, not before.
#[test]
fn during_the_shutdown_delay_allocations_succeed_while_readyz_is_503() {
    const DELAY: Duration = Duration::from_secs(10);
    let mut turn = Turn::start(&["--shutdown-delay=10s", "--drain-timeout=60s"]);
    let peer = Peer::start();
    let (server, peer_addr) = (loopback(turn.port), loopback(peer.port));
    assert_eq!(testkit::http_get(&turn.admin, "/readyz").0, 200);
    turn.pod.signal(Signal::Term);
    let term_at = Instant::now();
    wait_readyz(&turn, 503);
    assert_eq!(testkit::http_get(&turn.admin, "/livez").0, 200);
    assert_eq!(turn.metric("lastcall_drain_phase"), Some(1.0));

    let mut calls = start_calls(server, peer_addr, 1, "announcing");
    let tcp = tcp_uclient(turn.port, peer.port, "announcing", 1, 10, 20);
    turn.wait_metric_at_least("turn_total_allocations{type=\"TCP\"}", 1.0);
    let allocated = term_at.elapsed();
    assert_eq!(
        turn.metric("lastcall_drain_phase"),
        Some(1.0),
        "both allocations were made while announcing ({allocated:?} after SIGTERM)"
    );
    assert_eq!(testkit::http_get(&turn.admin, "/readyz").0, 503);
    let r = tcp.join().expect("uclient thread");
    r.assert_all_echoed(10);
    let call = &mut calls[0];
    call.wait_received(50, WAIT);
    call.stop_stream(Duration::from_millis(500));
    assert_eq!(call.split(term_at).lost(), 0);
    call.refresh(0).expect("delete");
    assert_eq!(
        turn.metric("lastcall_turn_allocate_refused_draining_total"),
        Some(0.0)
    );
    println!(
        "FIGURES run3: allocations made {} after SIGTERM, while announcing; readyz 503",
        ms(allocated)
    );
    // Nothing is left, but new work may still be on its way until the delay ends.
    let exit = turn.pod.wait_exit(WAIT);
    println!(
        "FIGURES run3: exit {:?} {} after SIGTERM (shutdown delay 10 s)",
        exit.code,
        ms(exit.elapsed_since_signal)
    );
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(exit.elapsed_since_signal >= DELAY, "{exit:?}");
    assert!(
        exit.elapsed_since_signal < DELAY + Duration::from_secs(5),
        "{exit:?}"
    );
}

/// SIGUSR1 keeps coturn's meaning (4.6.3 and later): refuse new allocations at once, with
/// no `--shutdown-delay` announce (10 s here, which SIGTERM would spend announcing). New
/// Allocates are tried from the signal on; the first 403 and how soon it came are printed.
/// The live call loses nothing and the process exits 0 at its last allocation.
#[test]
fn sigusr1_refuses_at_once_without_the_announce_and_exits_at_the_last_allocation() {
    let mut turn = Turn::start(&["--shutdown-delay=10s", "--drain-timeout=60s"]);
    let peer = Peer::start();
    let (server, peer_addr) = (loopback(turn.port), loopback(peer.port));
    let mut calls = start_calls(server, peer_addr, 1, "live");
    let mut late = TurnClient::new(server, SECRET, "late");
    late.binding().expect("binding");
    let signalled = Instant::now();
    turn.pod.signal(Signal::Usr1);
    // Until the signal is handled a new Allocate may still succeed: delete it and retry.
    let mut before = 0;
    let refused = loop {
        match late.allocate(600) {
            Ok(_) => {
                before += 1;
                late.refresh(0).expect("delete");
                assert!(signalled.elapsed() < WAIT, "never refused");
            }
            Err(e) => break e,
        }
    };
    let first_403 = signalled.elapsed();
    assert_eq!(
        refused,
        TurnError::Code {
            code: 403,
            alternate: None
        }
    );
    println!(
        "FIGURES sigusr1: first Allocate refused (403) {} after SIGUSR1 ({before} allocated before the signal was handled)",
        ms(first_403)
    );
    turn.pod.wait_for_log(
        "SIGUSR1 received (--on-sigterm drain): draining: refusing new work now",
        WAIT,
    );
    assert!(!turn.pod.has_log("announcing (readiness 503)"));
    assert_eq!(testkit::http_get(&turn.admin, "/readyz").0, 503);
    assert!(first_403 < WAIT, "{first_403:?}");

    let call = &mut calls[0];
    call.wait_received(call.received() + 25, WAIT);
    call.stop_stream(Duration::from_millis(500));
    let split = call.split(signalled);
    print_split("sigusr1 live", 0, split);
    assert_eq!(split.lost(), 0, "{split:?}");
    call.refresh(0).expect("delete");
    let deleted = Instant::now();
    let (gone, exit) = exit_instant(&mut turn.pod, WAIT);
    println!(
        "FIGURES sigusr1: exit {:?} {} after the last allocation was deleted",
        exit.code,
        ms(gone - deleted)
    );
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(gone - deleted < EXIT_BOUND, "{:?}", gone - deleted);
}

/// `--drain-min-allocations 2` (coturn's name) with three live allocations:
/// the drain holds while three are live and ends, status 0, when one of them ends.
#[test]
fn drain_min_allocations_2_exits_when_the_third_allocation_ends() {
    let mut turn = Turn::start(&[
        "--shutdown-delay=0s",
        "--drain-timeout=60s",
        "--drain-min-allocations=2",
    ]);
    let peer = Peer::start();
    let (server, peer_addr) = (loopback(turn.port), loopback(peer.port));
    let mut calls = start_calls(server, peer_addr, 3, "min");
    turn.pod.signal(Signal::Term);
    turn.pod.wait_for_log("refusing new allocations", WAIT);
    assert_eq!(turn.metric("lastcall_drain_phase"), Some(2.0));
    assert_eq!(turn.metric("lastcall_sessions"), Some(3.0));
    // Half a second more of relaying on every call: the drain holds above the threshold.
    for c in &calls {
        let n = c.received();
        c.wait_received(n + 25, WAIT);
    }
    assert!(
        turn.pod.is_running(),
        "3 allocations > --drain-min-allocations 2"
    );

    let first = &mut calls[0];
    first.stop_stream(Duration::from_millis(500));
    first.refresh(0).expect("delete one of three");
    let deleted = Instant::now();
    let (gone, exit) = exit_instant(&mut turn.pod, WAIT);
    println!(
        "FIGURES run4: --drain-min-allocations 2: exit {:?} {} after the third allocation ended",
        exit.code,
        ms(gone - deleted)
    );
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(gone - deleted < EXIT_BOUND, "{:?}", gone - deleted);
    assert!(
        turn.pod.has_log("drain ended: threshold, 2 sessions left"),
        "{:?}",
        turn.pod.logs()
    );
}

/// At `--drain-timeout` (from the trigger) the process exits 75 and logs how
/// many allocations it cut; until then the calls relay without loss.
#[test]
fn deadline_exits_75_at_the_drain_timeout_logging_the_count_cut() {
    const TIMEOUT: Duration = Duration::from_secs(4);
    let mut turn = Turn::start(&["--shutdown-delay=1s", "--drain-timeout=4s"]);
    let peer = Peer::start();
    let (server, peer_addr) = (loopback(turn.port), loopback(peer.port));
    let mut calls = start_calls(server, peer_addr, 2, "long");
    let term_at = Instant::now();
    turn.pod.signal(Signal::Term);
    let (gone, exit) = exit_instant(&mut turn.pod, WAIT);
    let took = gone - term_at;
    println!(
        "FIGURES run5 deadline: exit {:?} {} after SIGTERM (--drain-timeout 4s)",
        exit.code,
        ms(took)
    );
    assert_eq!(exit.code, Some(lastcall::exit::DEADLINE), "{exit:?}");
    assert!(took >= TIMEOUT, "{took:?}");
    assert!(took < TIMEOUT + Duration::from_secs(2), "{took:?}");
    let line = turn
        .pod
        .logs()
        .into_iter()
        .find(|l| l.contains("drain ended: deadline"))
        .expect("a log line for the deadline");
    assert!(line.contains("2 sessions cut"), "{line}");
    assert!(line.contains("cut=2"), "{line}");
    assert!(
        turn.pod
            .logs()
            .iter()
            .any(|l| l.contains("ending the remaining allocations") && l.contains("allocations=2")),
        "{:?}",
        turn.pod.logs()
    );
    // Every datagram sent up to 100 ms before the deadline was relayed (at the deadline the
    // allocations end; the process may take a moment longer to be gone).
    for (i, c) in calls.iter_mut().enumerate() {
        c.stop_stream(Duration::from_millis(300));
        let s = c.split(term_at + TIMEOUT - Duration::from_millis(100));
        println!(
            "FIGURES run5 deadline call {i}: sent {} lost {} until 100 ms before the deadline",
            s.sent_before, s.lost_before
        );
        assert_eq!(s.lost_before, 0, "{s:?}");
        assert!(s.sent_before >= 150, "{s:?}");
    }
}

/// A second SIGTERM exits within 1 s, status 76, logging the calls cut.
#[test]
fn second_sigterm_exits_within_1s_with_status_76() {
    let mut turn = Turn::start(&["--shutdown-delay=1s", "--drain-timeout=60s"]);
    let peer = Peer::start();
    let (server, peer_addr) = (loopback(turn.port), loopback(peer.port));
    let _calls = start_calls(server, peer_addr, 1, "cut");
    turn.pod.signal(Signal::Term);
    turn.pod.wait_for_log("refusing new allocations", WAIT);
    let second = Instant::now();
    turn.pod.signal(Signal::Term);
    let (gone, exit) = exit_instant(&mut turn.pod, WAIT);
    println!(
        "FIGURES run5 second SIGTERM: exit {:?} {} after it",
        exit.code,
        ms(gone - second)
    );
    assert_eq!(exit.code, Some(lastcall::exit::FORCED), "{exit:?}");
    assert!(gone - second < EXIT_BOUND, "{:?}", gone - second);
    assert!(
        turn.pod
            .logs()
            .iter()
            .any(|l| l.contains("drain ended: forced by SIGTERM") && l.contains("1 session cut")),
        "{:?}",
        turn.pod.logs()
    );
}

/// For the docs: the same load against coturn on SIGTERM (Debian 12's 4.6.1, or the
/// release `LASTCALL_TURNSERVER` runs: scripts/test_peers.sh gives 4.18's). Asserts only
/// that coturn exited and that the measurement ran; prints what it lost.
#[test]
fn coturn_on_sigterm_under_the_same_load_for_comparison() {
    let port = crate::common::free_udp_tcp_port();
    let (release, has_no_dtls) = lastcall_testkit::coturn::turnserver_release_and("--no-dtls");
    println!("FIGURES run6 coturn release {release}");
    let mut cmd = lastcall_testkit::peers::coturn("turnserver");
    if has_no_dtls {
        cmd.arg("--no-dtls");
    }
    cmd.args([
        "-n",
        "--no-cli",
        "--listening-ip=127.0.0.1",
        "--relay-ip=127.0.0.1",
        "--no-tls",
        "--realm=example.org",
        "--use-auth-secret",
        &format!("--static-auth-secret={SECRET}"),
        "--allow-loopback-peers",
        &format!("--listening-port={port}"),
        // Logs to the test, not to /var/log.
        "--log-file=stdout",
        "--simple-log",
    ]);
    let mut coturn = Pod::spawn(cmd);
    let server = loopback(port);
    let until = Instant::now() + WAIT;
    let mut probe = TurnClient::new(server, SECRET, "probe");
    while probe.binding().is_err() {
        assert!(Instant::now() < until, "coturn never answered a Binding");
    }
    testkit::wait_for_tcp(server, WAIT);
    let peer = Peer::start();
    let peer_addr = loopback(peer.port);
    let tcp = tcp_uclient(port, peer.port, "tcpcall", 2, 300, 20);
    let mut calls = start_calls(server, peer_addr, 3, "udpcall");
    // coturn logs no sessions without -v: uclient's two calls are up once two TCP
    // connections to coturn are established; then let uclient's data flow for two seconds
    // (its messages start once every client has allocated).
    let until = Instant::now() + WAIT;
    while established_to(port) < 2 {
        assert!(Instant::now() < until, "uclient never connected to coturn");
        std::thread::sleep(Duration::from_millis(20));
    }
    for c in &calls {
        let n = c.received();
        c.wait_received(n + 100, WAIT);
    }

    let term_at = Instant::now();
    coturn.signal(Signal::Term);
    let (gone, exit) = exit_instant(&mut coturn, WAIT);
    // Keep the calls going one more second after the exit, as clients would.
    for c in &calls {
        let n = c.sent();
        while c.sent() < n + 50 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let mut cut = 0;
    let (mut sent_after, mut lost_after) = (0, 0);
    for (i, c) in calls.iter_mut().enumerate() {
        c.stop_stream(Duration::from_millis(300));
        let s = c.split(term_at);
        print_split("run6 coturn", i, s);
        if let Some(last) = c.last_echo() {
            let (sign, d) = if last < term_at {
                ("-", term_at - last)
            } else {
                ("+", last - term_at)
            };
            println!(
                "FIGURES run6 coturn call {i}: last echo at SIGTERM {sign}{}",
                ms(d)
            );
        }
        sent_after += s.sent_after;
        lost_after += s.lost_after;
        cut += u64::from(s.lost_after > 0);
    }
    let r = tcp.join().expect("uclient thread");
    println!(
        "FIGURES run6 coturn {release}: exit {:?} (signal {:?}) {} after SIGTERM; our 3 UDP calls: {cut} cut, \
         {lost_after} of {sent_after} datagrams sent after SIGTERM lost; uclient -t -m 2 -n 300 -z 20: \
         sent {} of 600 messages (the rest never went: the connections were reset), received {}, \
         lost {:?}, status {:?}",
        exit.code,
        exit.signal,
        ms(gone - term_at),
        r.send_msgs,
        r.recv_msgs,
        r.lost,
        r.status
    );
    assert!(!exit.killed, "coturn exited on SIGTERM by itself: {exit:?}");
    assert!(sent_after > 0, "the load ran across the SIGTERM");
}

/// The last Refresh(0) of a drain is answered before the process exits: the session guard
/// that ends the drain, and the process, is dropped only once the response is sent. Twenty
/// drains, each ended by a client deleting its allocation.
#[test]
fn the_refresh_that_ends_a_drain_is_answered_before_the_exit() {
    let peer = Peer::start();
    let peer_addr = loopback(peer.port);
    let mut unanswered = Vec::new();
    for i in 0..20 {
        let mut turn = Turn::start(&["--shutdown-delay=0s", "--drain-timeout=60s"]);
        let mut c = TurnClient::new(loopback(turn.port), SECRET, "last");
        c.call(peer_addr, 0x4000).expect("call");
        turn.pod.signal(Signal::Term);
        turn.pod.wait_for_log("refusing new allocations", WAIT);
        if let Err(e) = c.refresh(0) {
            unanswered.push((i, e));
        }
        let exit = turn.pod.wait_exit(WAIT);
        assert_eq!(exit.code, Some(0), "{exit:?}");
    }
    assert!(
        unanswered.is_empty(),
        "Refresh(0) unanswered: {unanswered:?}"
    );
}

/// Every new allocation's first datagram is relayed: a new relay socket used to drop it
/// when tokio had not yet seen the socket writable (about 1 in 20 on the development
/// machine, so this catches it most of the time, not always). Forty fresh allocations, one
/// datagram each, the moment the channel is bound.
#[test]
fn the_first_datagram_of_every_new_allocation_is_relayed() {
    let turn = Turn::start(&[]);
    let peer = Peer::start();
    let peer_addr = loopback(peer.port);
    let mut missing = Vec::new();
    for i in 0..40u16 {
        let mut c = TurnClient::new(loopback(turn.port), SECRET, &format!("first{i}"));
        c.call(peer_addr, 0x4000 + i).expect("call");
        c.stream(Duration::from_secs(3600)); // one datagram now, the next in an hour
        let until = Instant::now() + WAIT;
        while c.sent() == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        c.stop_stream(Duration::from_secs(2));
        if c.received() != 1 {
            missing.push(i);
        }
        c.refresh(0).expect("delete");
    }
    assert_eq!(
        turn.metric("lastcall_turn_send_dropped_total"),
        Some(0.0),
        "datagrams dropped by the server"
    );
    assert!(
        missing.is_empty(),
        "first datagram lost on allocations {missing:?}"
    );
}

/// One `--alternate-server` list for every pod (as a chart renders it) names the draining
/// server itself too: it skips its own address and sends every newcomer to the others.
#[test]
fn a_draining_server_never_redirects_to_itself() {
    let b = Turn::start(&[]);
    let port = crate::common::free_udp_tcp_port();
    let admin = format!("127.0.0.1:{}", testkit::free_port());
    let mut args = crate::common::turn_args(port, &admin);
    args.extend([
        "--shutdown-delay=0s".to_string(),
        "--drain-timeout=60s".to_string(),
        format!("--alternate-server=127.0.0.1:{port}"),
        format!("--alternate-server=127.0.0.1:{}", b.port),
    ]);
    let mut a = Turn::spawn(args, port, 0, admin);
    let peer = Peer::start();
    let _live = start_calls(loopback(a.port), loopback(peer.port), 1, "live");
    a.pod.signal(Signal::Term);
    a.pod
        .wait_for_log("refusing new allocations (300 Try Alternate)", WAIT);
    for i in 0..4 {
        let r = TurnClient::new(loopback(a.port), SECRET, &format!("new{i}")).allocate(600);
        assert_eq!(
            r,
            Err(TurnError::Code {
                code: 300,
                alternate: Some(loopback(b.port))
            }),
            "newcomer {i}"
        );
    }
}
