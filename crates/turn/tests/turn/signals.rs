//! Every signal coturn 4.6 to 4.18 handles, sent to `lastcall-turn` during a live call,
//! means here what it means there, and loses nothing (coturn's relay app: `mainrelay.c`
//! installs SIGUSR2 (reload the TLS certificates), SIGTERM and SIGINT (stop; ours drain),
//! SIGUSR1 (drain, 4.6.3 and later); `ns_turn_utils.c` SIGHUP (reopen the log file; ours
//! reload the certificates too, there is no log file); `apputils.c` ignores SIGPIPE).
//!
//! The call is our UDP client streaming sequence-numbered ChannelData every 20 ms through
//! the server to coturn's `turnutils_peer` and back: a lost datagram is seen.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::{self_signed, served_subject, Peer, Turn, SECRET, WAIT};
use lastcall_testkit::turn::{TurnClient, TurnError};
use lastcall_testkit::Signal;

const PACE: Duration = Duration::from_millis(20);

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A call streaming through `turn` to `peer`, with its first echoes back.
fn live_call(turn: &Turn, peer: &Peer, user: &str) -> TurnClient {
    let mut c = TurnClient::new(loopback(turn.port), SECRET, user);
    c.call(loopback(peer.port), 0x4000).expect("call");
    c.stream(PACE);
    c.wait_received(10, WAIT);
    c
}

/// The call goes on: `n` more echoes arrive.
fn still_relaying(call: &TurnClient, n: u64) {
    call.wait_received(call.received() + n, WAIT);
}

/// Ends the call (its stream drained, its allocation deleted) and checks nothing was lost.
fn end_call(call: &mut TurnClient, origin: Instant, what: &str) {
    call.stop_stream(Duration::from_millis(500));
    let split = call.split(origin);
    println!(
        "FIGURES signals {what}: {} sent, {} lost",
        split.sent(),
        split.lost()
    );
    assert_eq!(split.lost(), 0, "{what}: {split:?}");
    call.refresh(0).expect("delete");
}

/// SIGUSR2 and SIGHUP reload the certificate (new TLS connections get the new one), SIGPIPE
/// is ignored, and the call relays through all three; then SIGTERM drains it to its end.
#[test]
fn sigusr2_sighup_and_sigpipe_change_nothing_for_a_live_call_and_reload_the_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = self_signed(dir.path(), "one", "first.test");
    let tls_port = crate::common::free_udp_tcp_port();
    let mut turn = Turn::start(&[
        &format!("--tls-listening-port={tls_port}"),
        &format!("--cert={}", cert.display()),
        &format!("--pkey={}", key.display()),
        // The signal alone reloads (the files are written in place, one then the other).
        "--no-cert-watch",
        "--shutdown-delay=0",
    ]);
    let peer = Peer::start();
    assert!(served_subject(tls_port).contains("first.test"));
    let origin = Instant::now();
    let mut call = live_call(&turn, &peer, "live");

    for (signal, name, cn) in [
        (Signal::Usr2, "SIGUSR2", "second.test"),
        (Signal::Hup, "SIGHUP", "third.test"),
    ] {
        let (new_cert, new_key) = self_signed(dir.path(), cn, cn);
        std::fs::copy(&new_cert, &cert).expect("copy cert");
        std::fs::copy(&new_key, &key).expect("copy key");
        let mark = turn.pod.log_len();
        turn.pod.signal(signal);
        turn.pod
            .wait_for_log_after(mark, &format!("{name} received: reloading"), WAIT);
        turn.pod
            .wait_for_log_after(mark, "TLS certificate reloaded", WAIT);
        assert!(turn.pod.is_running(), "{name} ended the process");
        assert!(
            served_subject(tls_port).contains(cn),
            "{name}: old certificate"
        );
        assert_eq!(testkit_readyz(&turn), 200, "{name} changed readiness");
        still_relaying(&call, 10);
    }
    assert_eq!(turn.metric("lastcall_reloads_total"), Some(2.0));

    // coturn ignores SIGPIPE (a TCP peer gone); so does the Rust runtime.
    turn.pod.signal(Signal::Pipe);
    still_relaying(&call, 10);
    assert!(turn.pod.is_running(), "SIGPIPE ended the process");
    assert_eq!(testkit_readyz(&turn), 200);

    // SIGTERM drains: the call goes on, a new one is refused, the exit follows its end.
    turn.pod.signal(Signal::Term);
    turn.pod
        .wait_for_log("refusing new allocations (403)", WAIT);
    let mut late = TurnClient::new(loopback(turn.port), SECRET, "late");
    assert_eq!(
        late.allocate(600),
        Err(TurnError::Code {
            code: 403,
            alternate: None
        })
    );
    still_relaying(&call, 10);
    end_call(&mut call, origin, "SIGUSR2, SIGHUP, SIGPIPE, SIGTERM");
    let exit = turn.pod.wait_exit(WAIT);
    assert_eq!(exit.code, Some(0), "{exit:?}");
}

/// SIGINT and SIGUSR1 (coturn's stop and drain signals) drain a live call to its end: the
/// call loses nothing and the process exits 0 when it ends.
#[test]
fn sigint_and_sigusr1_drain_a_live_call_to_its_end() {
    let peer = Peer::start();
    for (signal, line) in [
        (
            Signal::Int,
            "SIGINT received (--on-sigterm drain): draining: refusing new work now",
        ),
        (
            Signal::Usr1,
            "SIGUSR1 received (--on-sigterm drain): draining: refusing new work now",
        ),
    ] {
        let mut turn = Turn::start(&["--shutdown-delay=0"]);
        let origin = Instant::now();
        let mut call = live_call(&turn, &peer, "live");
        turn.pod.signal(signal);
        turn.pod.wait_for_log(line, WAIT);
        assert_eq!(testkit_readyz(&turn), 503);
        still_relaying(&call, 25);
        assert!(turn.pod.is_running());
        end_call(&mut call, origin, line.split(' ').next().unwrap_or("?"));
        let exit = turn.pod.wait_exit(WAIT);
        assert_eq!(exit.code, Some(0), "{line}: {exit:?}");
    }
}

fn testkit_readyz(turn: &Turn) -> u16 {
    lastcall_testkit::http_get(&turn.admin, "/readyz").0
}
