//! The short form of `bench/turn/churn.sh` (issue 29, item 7: a 508 in a 15-minute churn of
//! coturn's uclient while about 650 of 16,384 relay ports were in use).
//!
//! The cause: uclient keeps one RESERVATION-TOKEN for all its allocations and sets it to
//! zero when an Allocate fails (a 441 when a new client's 5-tuple is one an earlier run's
//! allocation still holds); its next Allocate then carries RESERVATION-TOKEN 0, which coturn
//! reads as "no token" and lastcall-turn answered with 508 (no such reservation). Here: that
//! Allocate from our client (it would have failed before the fix), and a few rounds of
//! uclient's default mode (probe, RTP with EVEN-PORT R=1, RTCP with its token) over UDP and
//! TCP, with no 508 and every capacity refusal logged with its limit.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::{Peer, Turn, Uclient, SECRET, WAIT};
use lastcall_testkit::turn::{TurnClient, TurnError};

#[test]
fn an_allocate_with_coturns_zero_reservation_token_is_allocated() {
    let turn = Turn::start(&[]);
    let mut c = TurnClient::new(
        SocketAddr::from(([127, 0, 0, 1], turn.port)),
        SECRET,
        "zero",
    );
    let relayed = c
        .allocate_with_token(600, [0; 8])
        .expect("token 0 is no token");
    assert_eq!(relayed.ip(), std::net::IpAddr::from([127, 0, 0, 1]));
    // A real token that names no reservation is still 508, logged with its limit.
    let mut d = TurnClient::new(SocketAddr::from(([127, 0, 0, 1], turn.port)), SECRET, "bad");
    assert_eq!(
        d.allocate_with_token(600, [9; 8]),
        Err(TurnError::Code {
            code: 508,
            alternate: None
        })
    );
    let line = turn.pod.wait_for_log("allocate refused (508)", WAIT);
    assert!(line.contains("limit=\"reservation\""), "{line}");
    assert!(
        line.contains("RESERVATION-TOKEN unknown, used or expired"),
        "{line}"
    );
    assert!(line.contains("relay_ports="), "{line}");
    c.refresh(0).expect("delete");
}

#[test]
fn uclient_churn_over_udp_and_tcp_gets_no_508() {
    let turn = Turn::start(&[]);
    let peer = Peer::start();
    let (port, peer_port) = (turn.port, peer.port);
    // One UDP and one TCP run at once, as the churn interleaves them (the minutes-long form
    // is bench/turn/churn.sh).
    let runs: Vec<_> = [false, true]
        .into_iter()
        .map(|tcp| {
            std::thread::spawn(move || {
                let flags: &[&str] = if tcp { &["-t", "-g"] } else { &["-g"] };
                let call = Uclient::call(port, peer_port, "churn")
                    .flags(flags)
                    .messages(5)
                    .clients(4)
                    .gap_ms(5);
                let report = call.run(Duration::from_secs(60));
                report
                    .output
                    .lines()
                    .filter(|l| l.contains("error "))
                    .map(|l| format!("tcp={tcp}: {l}"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let errors: Vec<String> = runs
        .into_iter()
        .flat_map(|r| r.join().expect("uclient thread"))
        .collect();
    let allocations: f64 = ["UDP", "TCP"]
        .iter()
        .filter_map(|t| turn.metric(&format!("turn_total_allocations{{type=\"{t}\"}}")))
        .sum();
    println!(
        "FIGURES churn: 2 uclient runs at once, {allocations} allocations left live, errors {errors:?}"
    );
    assert!(
        !errors.iter().any(|e| e.contains("error 508")),
        "{errors:?}"
    );
    assert_eq!(
        turn.metric("lastcall_turn_relay_port_exhausted_total"),
        Some(0.0)
    );
    // A 441 (a 5-tuple another run's allocation holds) is right; anything else is not.
    assert!(errors.iter().all(|e| e.contains("error 441")), "{errors:?}");
    for line in turn.pod.logs() {
        if line.contains("allocate refused (") {
            assert!(line.contains("limit="), "{line}");
        }
    }
}
