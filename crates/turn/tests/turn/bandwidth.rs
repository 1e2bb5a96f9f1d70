//! coturn's `max-bps` on the data plane, measured: a client streaming ChannelData at twice
//! the limit through `lastcall-turn` to coturn's `turnutils_peer` (which echoes) gets back
//! what the limit lets through, within 10%, once the one-second burst is spent. Printed:
//! `cargo nextest run -p lastcall-turn --test bandwidth --no-capture`, lines `FIGURES`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::{Peer, Turn, SECRET, WAIT};
use lastcall_testkit::turn::{TurnClient, PAYLOAD};

/// Datagrams a second the limit allows.
const ALLOWED: u64 = 50;
/// The client sends at twice that: one datagram every 10 ms.
const INTERVAL: Duration = Duration::from_millis(10);

#[test]
fn max_bps_holds_a_client_sending_at_twice_the_limit_to_it() {
    let max_bps = ALLOWED * PAYLOAD as u64;
    let turn = Turn::start(&[&format!("--max-bps={max_bps}")]);
    let peer = Peer::start();
    let server = SocketAddr::from(([127, 0, 0, 1], turn.port));
    let peer_addr = SocketAddr::from(([127, 0, 0, 1], peer.port));
    let mut c = TurnClient::new(server, SECRET, "fast");
    c.call(peer_addr, 0x4000).expect("call");
    let started = Instant::now();
    c.stream(INTERVAL);
    // The bucket starts full (one second's worth): measure from 2 s to 7 s.
    let (from, to) = (
        started + Duration::from_secs(2),
        started + Duration::from_secs(7),
    );
    while Instant::now() < to + Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(50));
        assert!(started.elapsed() < WAIT, "stream stalled");
    }
    c.stop_stream(Duration::from_millis(200));
    let (sent, echoed) = c.counted_between(from, to);
    let secs = (to - from).as_secs_f64();
    let (sent_bps, echoed_bps) = (
        sent as f64 * PAYLOAD as f64 / secs,
        echoed as f64 * PAYLOAD as f64 / secs,
    );
    let dropped = turn
        .metric("lastcall_turn_bandwidth_dropped_total")
        .unwrap_or(0.0);
    println!(
        "FIGURES max-bps={max_bps} B/s: client sent {sent_bps:.0} B/s ({sent} datagrams of {PAYLOAD} B in {secs} s), got back {echoed_bps:.0} B/s ({:.1}% of the limit); {dropped} datagrams dropped by max-bps in all",
        100.0 * echoed_bps / max_bps as f64
    );
    // The client really sent at about twice the limit...
    assert!(sent_bps > 1.8 * max_bps as f64, "sent {sent_bps:.0} B/s");
    // ...and was held to the limit, within 10%.
    let ratio = echoed_bps / max_bps as f64;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "got back {ratio:.3} of the limit"
    );
    assert!(dropped > 0.0);
}
