//! Fleet nonces and the 300 of a drain, followed the way libwebrtc's TURN client follows it
//! (read in webrtc's `p2p/base/turn_port.cc`; this client applies the same rules, it is not
//! their code): on 300 it takes REALM and NONCE from the response if present and sends its
//! next Allocate to the ALTERNATE-SERVER from the same socket; there, a 401 once it holds
//! credentials, or a 438, or any other error ends the Allocate for good.
//!
//! Servers given the same TURN REST secret share a nonce key, so a client redirected with its
//! nonce is accepted by the alternate; a new client's first, unauthenticated Allocate gets a
//! bare 300 and meets the alternate as a new server. A server with another key shows what
//! the shared key prevents: the 438 that libwebrtc cannot get past.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use lastcall_testkit::turn::TurnClient;
use lastcall_testkit::Signal;
use lastcall_turn_proto::stun::{attr, long_term_key, method, Builder};

use crate::common::{Peer, RestCredentials, Turn, SECRET, WAIT};
use crate::drain_ends::{answer, request, rest_creds, txid, Answer, Auth};

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// One request to `to` from `sock`, its answer (retransmitted).
fn ask(sock: &UdpSocket, to: SocketAddr, req: &[u8]) -> Answer {
    let mut buf = [0u8; 1500];
    for _ in 0..10 {
        sock.send_to(req, to).expect("send");
        if let Ok((n, from)) = sock.recv_from(&mut buf) {
            if from == to {
                if let Some(a) = answer(&buf[..n]) {
                    return a;
                }
            }
        }
    }
    panic!("no answer from {to}");
}

fn allocate_udp(b: &mut Builder<'_>) {
    b.u32(attr::REQUESTED_TRANSPORT, 17 << 24);
}

/// libwebrtc's Allocate, from `sock` to `server`, starting with `auth` (credentials and a
/// nonce it already holds) or none: the server that relays it, or why it gave up.
fn allocate_like_libwebrtc(
    sock: &UdpSocket,
    mut server: SocketAddr,
    mut auth: Option<Auth>,
    user: &str,
) -> Result<SocketAddr, String> {
    let RestCredentials { username, password } = RestCredentials::for_user(user);
    let mut tried = vec![server];
    for n in 0..6u64 {
        let a = ask(
            sock,
            server,
            &request(
                method::ALLOCATE,
                txid(1000 + n),
                auth.as_ref(),
                allocate_udp,
            ),
        );
        match a.code {
            0 if a.success => return Ok(server),
            401 if auth.is_some() => return Err(format!("401 from {server} after the challenge")),
            401 | 300 => {
                if a.code == 300 {
                    let alt = a.alternate.ok_or("300 without ALTERNATE-SERVER")?;
                    if tried.contains(&alt) {
                        return Err(format!("300 to {alt}, already tried"));
                    }
                    tried.push(alt);
                    server = alt;
                }
                if let (Some(realm), Some(nonce)) = (a.realm, a.nonce) {
                    let realm = String::from_utf8_lossy(&realm).into_owned();
                    auth = Some(Auth {
                        username: username.clone(),
                        key: long_term_key(&username, &realm, &password),
                        nonce,
                    });
                } else if a.code == 401 {
                    return Err("401 without REALM and NONCE".into());
                }
            }
            code => return Err(format!("{code} from {server}: fatal for an Allocate")),
        }
    }
    Err("too many rounds".into())
}

/// A nonce from `server` for `sock` (the 401 of an unauthenticated Refresh).
fn nonce_from(sock: &UdpSocket, server: SocketAddr, user: &str) -> Auth {
    let a = ask(
        sock,
        server,
        &request(method::REFRESH, txid(1), None, |_| {}),
    );
    assert_eq!(a.code, 401);
    let (username, key) = rest_creds(user);
    Auth {
        username,
        key,
        nonce: a.nonce.expect("a nonce"),
    }
}

#[test]
fn a_draining_server_sends_clients_to_its_alternate_the_way_libwebrtc_follows() {
    // B and C are A's candidates; B shares A's secret (and so its nonce key), C has a nonce
    // key of its own.
    let b = Turn::start(&[]);
    let c = Turn::start(&["--nonce-secret=not-the-fleet", "--verbose"]);
    let mut a = Turn::start(&[
        "--shutdown-delay=0s",
        "--drain-timeout=60s",
        &format!("--alternate-server=127.0.0.1:{}", b.port),
    ]);
    let peer = Peer::start();
    // A live call keeps A draining.
    let mut live = TurnClient::new(loopback(a.port), SECRET, "live");
    live.call(loopback(peer.port), 0x4000).expect("call");
    live.stream(Duration::from_secs(1));
    // Clients that got a nonce from A before the drain (a page that loaded earlier).
    let holder = UdpSocket::bind("127.0.0.1:0").expect("bind");
    holder
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let held = nonce_from(&holder, loopback(a.port), "holder");
    let stranger_sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    stranger_sock
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let held_too = nonce_from(&stranger_sock, loopback(a.port), "holder2");
    a.pod.signal(Signal::Term);
    a.pod
        .wait_for_log("refusing new allocations (300 Try Alternate)", WAIT);

    // A new client: a bare 300 to its first Allocate, then B's own challenge, then relayed.
    let newcomer = UdpSocket::bind("127.0.0.1:0").expect("bind");
    newcomer
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let first = ask(
        &newcomer,
        loopback(a.port),
        &request(method::ALLOCATE, txid(2), None, allocate_udp),
    );
    assert_eq!((first.code, first.alternate), (300, Some(loopback(b.port))));
    assert!(first.nonce.is_none() && first.realm.is_none(), "{first:?}");
    assert_eq!(
        allocate_like_libwebrtc(&newcomer, loopback(a.port), None, "newcomer"),
        Ok(loopback(b.port))
    );

    // A client holding A's nonce: an authenticated 300 with REALM and NONCE; B accepts that
    // nonce (same key), so the redirected Allocate succeeds with no further round trip.
    assert_eq!(
        allocate_like_libwebrtc(&holder, loopback(a.port), Some(held), "holder"),
        Ok(loopback(b.port))
    );

    // The same client sent to a server with another nonce key gets 438, which libwebrtc
    // treats as fatal for an Allocate: what fleet nonces prevent.
    let to_c = ask(
        &stranger_sock,
        loopback(a.port),
        &request(method::ALLOCATE, txid(3), Some(&held_too), allocate_udp),
    );
    assert_eq!(to_c.code, 300);
    let (username, key) = rest_creds("holder2");
    let redirected = Auth {
        username,
        key,
        nonce: to_c.nonce.expect("the 300's nonce"),
    };
    let at_c = ask(
        &stranger_sock,
        loopback(c.port),
        &request(method::ALLOCATE, txid(4), Some(&redirected), allocate_udp),
    );
    assert_eq!(at_c.code, 438, "{at_c:?}");
    c.pod.wait_for_log("unknown_nonce", WAIT);
    assert_eq!(
        b.metric("lastcall_turn_allocations_created_total"),
        Some(2.0),
        "both redirected clients relay on B"
    );
    live.refresh(0).expect("delete");
    assert_eq!(a.pod.wait_exit(WAIT).code, Some(0));
}
