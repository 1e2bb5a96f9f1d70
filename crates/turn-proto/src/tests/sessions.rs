//! The operator's view: pages in id order, traffic each way, ending one allocation or a
//! user's as the deadline would.

use super::*;

fn bob() -> Creds {
    Creds::password("bob", "bobpass")
}

#[test]
fn pages_follow_ids_and_say_whether_more_follow() {
    let mut h = H::new(base_config());
    for i in 0..5 {
        h.allocate(udp(&format!("192.0.2.{}:4000", i + 1)), &alice());
    }
    let (all, more) = h.server.allocations_page(h.now, 0, 100);
    assert!(!more);
    let ids: Vec<u64> = all.iter().map(|a| a.id).collect();
    assert_eq!(ids.len(), 5);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let (first, more) = h.server.allocations_page(h.now, 0, 2);
    assert_eq!(first.iter().map(|a| a.id).collect::<Vec<_>>(), ids[..2]);
    assert!(more);
    let (second, more) = h.server.allocations_page(h.now, ids[1], 2);
    assert_eq!(second.iter().map(|a| a.id).collect::<Vec<_>>(), ids[2..4]);
    assert!(more);
    // Exactly the last ones: nothing more follows.
    let (last, more) = h.server.allocations_page(h.now, ids[3], 1);
    assert_eq!(last.iter().map(|a| a.id).collect::<Vec<_>>(), ids[4..]);
    assert!(!more);
    let (none, more) = h.server.allocations_page(h.now, ids[4], 10);
    assert!(none.is_empty() && !more);
    let (none, more) = h.server.allocations_page(h.now, u64::MAX, 10);
    assert!(none.is_empty() && !more);
    let (none, more) = h.server.allocations_page(h.now, 0, 0);
    assert!(none.is_empty() && more);
    // An ended allocation's id is not reused by the next one.
    let ended = h.server.end_allocation(h.now, ids[0]).unwrap();
    assert_eq!(ended.id, ids[0]);
    h.allocate(udp("192.0.2.99:4000"), &alice());
    let (all, _) = h.server.allocations_page(h.now, 0, 100);
    assert_eq!(all.len(), 5);
    assert!(all.iter().all(|a| a.id != ids[0]));
    assert!(all.last().unwrap().id > ids[4]);
}

#[test]
fn an_allocation_shows_its_user_addresses_ages_and_traffic() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let relay = h.allocate(from, &alice());
    let peer: SocketAddr = "8.8.8.8:5000".parse().unwrap();
    h.advance(3);
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    assert_eq!(r.class, Class::Success);
    let cd = [0x40, 0x01, 0x00, 0x03, b'a', b'b', b'c'];
    assert!(h.client(from, &cd).is_some());
    assert!(h.client(from, &cd).is_some());
    assert!(h.peer(relay, peer, b"hello").is_some());
    // Dropped data is not counted: a peer without permission.
    assert!(h
        .peer(relay, "9.9.9.9:1".parse().unwrap(), b"nope")
        .is_none());
    h.advance(2);
    let (page, _) = h.server.allocations_page(h.now, 0, 10);
    let a = &page[0];
    assert_eq!(a.username, "alice");
    assert_eq!(a.client, from);
    assert_eq!(a.relays.v4, Some(relay));
    assert_eq!(a.age, Duration::from_secs(5));
    assert_eq!(a.idle, Duration::from_secs(2));
    assert_eq!((a.channels, a.permissions), (1, 1));
    assert_eq!(
        a.traffic,
        AllocationTraffic {
            to_peer_datagrams: 2,
            to_peer_bytes: 6,
            from_peer_datagrams: 1,
            from_peer_bytes: 5,
        }
    );
    assert!(!a.fast_path);
    // With the fast path's routes on, a UDP allocation with a channel is carried by it.
    h.server.set_route_output(true);
    let a = h.server.allocation(h.now, a.id).unwrap();
    assert!(a.fast_path);
}

#[test]
fn ending_one_deletes_it_as_the_deadline_does() {
    let mut h = H::new(base_config());
    let a1 = h.allocate(udp("192.0.2.1:1"), &alice());
    let _a2 = h.allocate(udp("192.0.2.2:1"), &alice());
    let b1 = h.allocate(udp("192.0.2.3:1"), &bob());
    h.events();
    let (page, _) = h.server.allocations_page(h.now, 0, 10);
    let id = page[0].id;
    assert_eq!(
        h.server.end_allocation(h.now, id).map(|a| a.relays.v4),
        Some(Some(a1))
    );
    assert_eq!(h.server.end_allocation(h.now, id), None);
    assert_eq!(h.server.end_allocation(h.now, 999_999), None);
    h.collect_releases();
    assert_eq!(h.relays.released, vec![a1]);
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::AllocationDeleted { reason: DeleteReason::Ended, username, .. }] if username == "alice"),
        "{ev:?}"
    );
    assert_eq!(h.server.allocation_count(), 2);
    assert_eq!(h.server.counters().allocations_deleted, 1);
    // By user: every one of bob's, nobody else's; then none left.
    let ended = h.server.end_user(h.now, "bob");
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].relays.v4, Some(b1));
    assert!(h.server.end_user(h.now, "bob").is_empty());
    assert!(h.server.end_user(h.now, "nobody").is_empty());
    assert_eq!(h.server.allocation_count(), 1);
    // The quota counts it gone: alice may allocate again from the first address.
    h.allocate(udp("192.0.2.1:1"), &alice());
}

/// The cost of a page with 100,000 allocations: the time the core's lock is held for a page
/// (the data path waits that long at most), at the start, middle and end of the ids, and
/// for ending one user's allocations (a walk of them all). A measurement, run on its own:
/// `cargo test --release -p lastcall-turn-proto -- --ignored --nocapture page_cost`.
#[test]
#[ignore = "measurement (100,000 allocations); run explicitly with --ignored"]
fn page_cost_with_100_000_allocations() {
    const N: u32 = 100_000;
    let mut h = H::new(base_config());
    let made = Instant::now();
    for i in 0..N {
        let from = ClientAddr {
            transport: Transport::Udp,
            client: SocketAddr::new(IpAddr::from((0x0b00_0000u32 + i).to_be_bytes()), 4000),
            local: "198.51.100.1:3478".parse().unwrap(),
        };
        let creds = if i % 1000 == 0 { bob() } else { alice() };
        let nonce = h.nonce(from);
        let bytes = Req::new(method::ALLOCATE)
            .transport_udp()
            .auth(&creds, &nonce)
            .bytes();
        let Raw::Bind(r) = h.client_raw(from, &bytes) else {
            panic!("allocate {i}: no relay request");
        };
        let relay = SocketAddr::new(IpAddr::from((0x0a00_0000u32 + i).to_be_bytes()), 50000);
        let answer = RelayBound {
            id: r.id,
            primary: Ok((relay, None)),
            additional: None,
        };
        let sent = h.answer(answer).expect("an Allocate response");
        assert_eq!(decode(&sent).class, Class::Success, "allocate {i}");
    }
    assert_eq!(h.server.allocation_count(), N as usize);
    println!(
        "FIGURES {N} allocations made in {:.1} s",
        made.elapsed().as_secs_f64()
    );
    let ids: Vec<u64> = {
        let mut ids = Vec::new();
        let mut after = 0;
        loop {
            let (page, more) = h.server.allocations_page(h.now, after, 1000);
            ids.extend(page.iter().map(|a| a.id));
            after = *ids.last().unwrap();
            if !more {
                break;
            }
        }
        ids
    };
    assert_eq!(ids.len(), N as usize);
    for (limit, at) in [
        (100, 0),
        (1000, 0),
        (1000, N as usize / 2),
        (1000, N as usize - 1000),
    ] {
        let after = if at == 0 { 0 } else { ids[at - 1] };
        let runs = 200;
        let t = Instant::now();
        for _ in 0..runs {
            let (page, _) = h.server.allocations_page(h.now, after, limit);
            assert_eq!(page.len(), limit);
        }
        println!(
            "FIGURES page of {limit} after {at} of {N}: {:.1} µs under the lock",
            t.elapsed().as_secs_f64() * 1e6 / f64::from(runs)
        );
    }
    let t = Instant::now();
    let ended = h.server.end_user(h.now, "bob");
    println!(
        "FIGURES ending one user's {} of {N} allocations: {:.2} ms under the lock",
        ended.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(ended.len(), N as usize / 1000);
}
