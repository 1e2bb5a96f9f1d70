//! Authentication refusals in the log of the real process (`-v`, coturn's `verbose`): each
//! one at debug with its reason (unknown nonce, stale nonce, bad integrity, unknown user),
//! at most ten lines a second whatever a client sends, the lines left out counted in the
//! next one.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use lastcall_turn_proto::stun::{attr, long_term_key, method, Builder};

use crate::common::{Turn, WAIT};
use crate::drain_ends::{answer, request, rest_creds, txid, Auth};

/// One request from `sock`, its answer (retransmitted a few times).
fn ask(sock: &UdpSocket, req: &[u8]) -> crate::drain_ends::Answer {
    let mut buf = [0u8; 1500];
    for _ in 0..10 {
        sock.send(req).expect("send");
        if let Ok(n) = sock.recv(&mut buf) {
            if let Some(a) = answer(&buf[..n]) {
                return a;
            }
        }
    }
    panic!("no answer");
}

fn allocate_udp(b: &mut Builder<'_>) {
    b.u32(attr::REQUESTED_TRANSPORT, 17 << 24);
}

#[test]
fn refusals_are_logged_at_debug_with_their_reason_a_few_a_second() {
    let turn = Turn::start(&["--verbose", "--stale-nonce=1"]);
    let server = SocketAddr::from(([127, 0, 0, 1], turn.port));
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    sock.connect(server).expect("connect");
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let challenge = ask(
        &sock,
        &request(method::ALLOCATE, txid(1), None, allocate_udp),
    );
    assert_eq!(challenge.code, 401);
    let nonce = challenge.nonce.expect("nonce");
    let (username, key) = rest_creds("logged");

    // A nonce this server never issued (forged): 438, logged as unknown_nonce.
    let forged = Auth {
        username: username.clone(),
        key,
        nonce: b"AAAAAAAAAAAAAAAA".to_vec(),
    };
    let a = ask(
        &sock,
        &request(method::ALLOCATE, txid(2), Some(&forged), allocate_udp),
    );
    assert_eq!(a.code, 438);
    let line = turn.pod.wait_for_log("unknown_nonce", WAIT);
    assert!(
        line.contains("DEBUG") && line.contains("authentication refused"),
        "{line}"
    );

    // Bad integrity: the right nonce, the wrong key.
    let bad = Auth {
        username: username.clone(),
        key: long_term_key(&username, "example.org", "not the password"),
        nonce: nonce.clone(),
    };
    let a = ask(
        &sock,
        &request(method::ALLOCATE, txid(3), Some(&bad), allocate_udp),
    );
    assert_eq!(a.code, 401);
    turn.pod.wait_for_log("bad_integrity", WAIT);

    // Unknown user (not a REST username, no such static user).
    let nobody = Auth {
        username: "nobody".into(),
        key: long_term_key("nobody", "example.org", "x"),
        nonce: nonce.clone(),
    };
    let a = ask(
        &sock,
        &request(method::ALLOCATE, txid(4), Some(&nobody), allocate_udp),
    );
    assert_eq!(a.code, 401);
    turn.pod.wait_for_log("unknown_user", WAIT);

    // Stale: a nonce of this server, older than stale-nonce (1 s; timestamps have 1 s
    // resolution, so 3 s make sure).
    std::thread::sleep(Duration::from_secs(3));
    let good = Auth {
        username,
        key,
        nonce,
    };
    let a = ask(
        &sock,
        &request(method::ALLOCATE, txid(5), Some(&good), allocate_udp),
    );
    assert_eq!(a.code, 438);
    turn.pod.wait_for_log("stale_nonce", WAIT);

    // A flood of forged nonces: at most ten lines a second; then, past the second, the next
    // line counts what was left out.
    let mark = turn.pod.log_len();
    let started = Instant::now();
    for i in 0..300 {
        let _ = ask(
            &sock,
            &request(method::ALLOCATE, txid(100 + i), Some(&forged), allocate_udp),
        );
    }
    let flood = started.elapsed();
    std::thread::sleep(Duration::from_millis(1100));
    let _ = ask(
        &sock,
        &request(method::ALLOCATE, txid(1000), Some(&forged), allocate_udp),
    );
    // Every line carries `unlogged=N`: wait for the one that counts what was left out.
    let end = Instant::now() + WAIT;
    let last = loop {
        let counted = turn.pod.logs()[mark..]
            .iter()
            .find(|l| l.contains("authentication refused") && !l.contains("unlogged=0"))
            .cloned();
        if let Some(line) = counted {
            break line;
        }
        assert!(
            Instant::now() < end,
            "no line counted the refusals left out"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let lines: Vec<String> = turn.pod.logs()[mark..]
        .iter()
        .filter(|l| l.contains("authentication refused"))
        .cloned()
        .collect();
    let seconds = flood.as_secs() + 2;
    println!(
        "FIGURES 301 refusals in {:.2} s: {} lines logged",
        flood.as_secs_f64() + 1.1,
        lines.len()
    );
    assert!(
        lines.len() as u64 <= 10 * seconds,
        "{} lines for {seconds} s: {lines:?}",
        lines.len()
    );
    let unlogged: u64 = lines
        .iter()
        .filter_map(|l| l.split("unlogged=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    // (A retransmission on a busy machine is one more refusal.)
    assert!(
        unlogged + lines.len() as u64 >= 301,
        "every refusal logged or counted: {} + {unlogged}, last {last}",
        lines.len()
    );
}
