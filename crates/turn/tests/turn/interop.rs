//! coturn's own clients against `lastcall-turn`: `turnutils_uclient` over UDP, TCP and TLS,
//! with channels and with Send indications, with TURN REST credentials and a static user,
//! against `turnutils_peer` and client-to-client. Every message must come back, none lost.
//!
//! Most runs use uclient's `-c` ("no RTCP": one allocation per client, with EVEN-PORT R=0 at
//! random); the `rtp_rtcp_*` tests run its default mode, where each client allocates an RTP
//! relay with EVEN-PORT R=1 and its RTCP relay with the RESERVATION-TOKEN it got.

use std::time::Duration;

use crate::common::{Peer, Turn, Uclient, SECRET};

const MSGS: u64 = 20;
const CLIENTS: u64 = 2;
const LIMIT: Duration = Duration::from_secs(60);

fn run(turn: &Turn, peer: Option<&Peer>, mode: &[&str], auth: &[&str]) -> crate::common::Report {
    let mut with_c = vec!["-c"];
    with_c.extend(mode);
    run_mode(turn, peer, &with_c, auth)
}

fn run_mode(
    turn: &Turn,
    peer: Option<&Peer>,
    mode: &[&str],
    auth: &[&str],
) -> crate::common::Report {
    let mut call = Uclient::new(turn.port)
        .flags(&["-g"])
        .flags(mode)
        .messages(MSGS)
        .clients(CLIENTS)
        .gap_ms(5)
        .credentials(auth);
    if let Some(peer) = peer {
        call = call.peer(peer.port);
    }
    call.run(LIMIT)
}

fn rest() -> [&'static str; 4] {
    ["-u", "alice", "-W", SECRET]
}

#[test]
fn udp_channels_rest_credentials_peer() {
    let turn = Turn::start(&[]);
    let peer = Peer::start();
    run(&turn, Some(&peer), &[], &rest()).assert_all_echoed(MSGS * CLIENTS);
    assert!(
        turn.metric("turn_traffic_peer_sentp{realm=\"example.org\"}")
            .unwrap_or(0.0)
            >= (MSGS * CLIENTS) as f64
    );
}

#[test]
fn udp_send_indications_static_user_peer() {
    let turn = Turn::start(&["--lt-cred-mech", "--user=bob:builder"]);
    let peer = Peer::start();
    run(&turn, Some(&peer), &["-s"], &["-u", "bob", "-w", "builder"])
        .assert_all_echoed(MSGS * CLIENTS);
}

#[test]
fn tcp_channels_peer() {
    let turn = Turn::start(&[]);
    let peer = Peer::start();
    run(&turn, Some(&peer), &["-t"], &rest()).assert_all_echoed(MSGS * CLIENTS);
}

#[test]
fn tcp_send_indications_static_user_peer() {
    let turn = Turn::start(&["--user=bob:builder"]);
    let peer = Peer::start();
    run(
        &turn,
        Some(&peer),
        &["-t", "-s"],
        &["-u", "bob", "-w", "builder"],
    )
    .assert_all_echoed(MSGS * CLIENTS);
}

#[test]
fn udp_client_to_client_channels_and_send() {
    let turn = Turn::start(&[]);
    run(&turn, None, &["-y"], &rest()).assert_all_echoed(MSGS * CLIENTS);
    run(&turn, None, &["-y", "-s"], &rest()).assert_all_echoed(MSGS * CLIENTS);
}

#[test]
fn tcp_client_to_client() {
    let turn = Turn::start(&[]);
    run(&turn, None, &["-t", "-y"], &rest()).assert_all_echoed(MSGS * CLIENTS);
}

#[test]
fn tls_channels_and_send_indications() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = crate::common::self_signed(dir.path(), "turn", "turn.test");
    let tls_port = crate::common::free_udp_tcp_port();
    let turn = Turn::start(&[
        &format!("--tls-listening-port={tls_port}"),
        &format!("--cert={}", cert.display()),
        &format!("--pkey={}", key.display()),
    ]);
    let peer = Peer::start();
    let tls = Turn {
        pod: turn.pod,
        port: tls_port,
        tls_port,
        admin: turn.admin,
    };
    run(&tls, Some(&peer), &["-t", "-S"], &rest()).assert_all_echoed(MSGS * CLIENTS);
    run(&tls, Some(&peer), &["-t", "-S", "-s"], &rest()).assert_all_echoed(MSGS * CLIENTS);
    run(&tls, None, &["-t", "-S", "-y"], &rest()).assert_all_echoed(MSGS * CLIENTS);
}

#[test]
fn wrong_secret_is_refused_and_counted() {
    let turn = Turn::start(&[]);
    let peer = Peer::start();
    let r = run(
        &turn,
        Some(&peer),
        &[],
        &["-u", "alice", "-W", "not-the-secret"],
    );
    assert_ne!(r.status, Some(0), "a wrong secret must fail:\n{}", r.output);
    assert_eq!(r.recv_msgs, 0);
    turn.wait_metric_at_least("lastcall_turn_auth_failures_total", 1.0);
    assert_eq!(
        turn.metric("turn_total_allocations{type=\"UDP\"}"),
        Some(0.0)
    );
}

#[test]
fn rtp_rtcp_pairs_udp_peer_and_client_to_client() {
    let turn = Turn::start(&[]);
    let peer = Peer::start();
    run_mode(&turn, Some(&peer), &[], &rest()).assert_all_echoed(MSGS * CLIENTS);
    // Client-to-client with RTCP: every client sends on both its RTP and RTCP relays.
    run_mode(&turn, None, &["-y"], &rest()).assert_all_echoed(2 * MSGS * CLIENTS);
}

#[test]
fn rtp_rtcp_pairs_tcp_send_indications() {
    let turn = Turn::start(&[]);
    let peer = Peer::start();
    run_mode(&turn, Some(&peer), &["-t", "-s"], &rest()).assert_all_echoed(MSGS * CLIENTS);
}

#[test]
fn ipv6_clients_and_ipv6_relays() {
    let turn = Turn::start(&["--listening-ip=::1", "--relay-ip=::1"]);
    let peer = Peer::start_on("::1");
    let v6 = Uclient::new(turn.port)
        .ipv6_relay()
        .flags(&["-c"])
        .peer_at("::1", peer.port)
        .messages(MSGS)
        .clients(2)
        .gap_ms(5)
        .rest("alice");
    // A client over IPv6, with an IPv6 relay.
    v6.clone()
        .server("::1")
        .run(LIMIT)
        .assert_all_echoed(MSGS * 2);
    // A client over IPv4 asking for an IPv6 relay (REQUESTED-ADDRESS-FAMILY).
    v6.flags(&["-t"]).run(LIMIT).assert_all_echoed(MSGS * 2);
}

#[test]
fn relay_port_exhaustion_is_508_and_counted() {
    let port = crate::common::free_udp_tcp_port();
    let range = [format!("--min-port={port}"), format!("--max-port={port}")];
    let turn = Turn::start(&[&range[0], &range[1]]);
    let peer = Peer::start();
    // uclient's probe allocation takes the only relay port; its client then gets 508.
    let r = run(&turn, Some(&peer), &[], &rest());
    assert_ne!(
        r.status,
        Some(0),
        "must fail without a relay port:\n{}",
        r.output
    );
    assert!(
        r.output.contains("error 508"),
        "508 expected:\n{}",
        r.output
    );
    turn.wait_metric_at_least("lastcall_turn_relay_port_exhausted_total", 1.0);
}
