//! Refresh (RFC 8656 §8) and what expires without it: permissions, channels and their
//! quarantine, allocations; `clear`; the bounded event queue of one timer pass.

use super::*;

#[test]
fn expiry_of_permissions_channels_and_allocations() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let relay = h.allocate(from, &alice());
    let peer: SocketAddr = "8.8.8.8:5000".parse().unwrap();
    let peer2: SocketAddr = "9.9.9.9:5000".parse().unwrap();
    h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("9.9.9.9:5000"),
    );
    assert!(h.server.poll_timeout().unwrap() <= h.now + Duration::from_secs(300));
    h.advance(299);
    assert!(h.peer(relay, peer2, b"x").is_some());
    h.advance(1);
    // Permissions (300 s) expired; ChannelData and Send do not refresh them.
    assert!(h.peer(relay, peer2, b"x").is_none());
    assert!(
        h.peer(relay, peer, b"x").is_none(),
        "the channel's permission expired too"
    );
    assert_eq!(h.client(from, &[0x40, 0x01, 0, 1, b'a']), None);
    // Refresh the channel binding (which refreshes the permission), keep the allocation alive.
    h.authed(from, &alice(), Req::new(method::REFRESH).lifetime(3600));
    h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    assert!(matches!(h.peer(relay, peer, b"x"), Some(Sent::Client(_, d)) if d[0] == 0x40));
    // Channel (600 s) outlives a permission that is refreshed by CreatePermission.
    h.advance(290);
    h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:1"),
    );
    h.advance(280);
    h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:1"),
    );
    assert!(matches!(h.peer(relay, peer, b"x"), Some(Sent::Client(_, d)) if d[0] == 0x40));
    h.advance(30);
    // 600 s after the ChannelBind: the channel expired; data falls back to a Data indication.
    let d = decode(&h.peer(relay, peer, b"x").unwrap());
    assert_eq!(d.method, method::DATA);
    // The expired channel is quarantined: not rebindable to another peer, nor the peer to
    // another channel, but rebinding the same pair works.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.4.4:1"),
    );
    assert_eq!(r.code, Some(400));
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4002)
            .peer("8.8.8.8:5000"),
    );
    assert_eq!(r.code, Some(400));
    h.advance(300);
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.4.4:1"),
    );
    assert_eq!(
        r.class,
        Class::Success,
        "after the quarantine the number is free"
    );
    // The allocation expires at its lifetime (3600 s from the refresh).
    h.events();
    h.advance(3600 - 290 - 280 - 30 - 300 - 1);
    assert_eq!(h.server.allocation_count(), 1);
    h.advance(1);
    assert_eq!(h.server.allocation_count(), 0);
    assert_eq!(h.relays.released, vec![relay]);
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::AllocationDeleted {
            reason: DeleteReason::Expired,
            ..
        }
    )));
    assert!(h.peer(relay, peer, b"x").is_none());
}

/// An allocation past its lifetime is gone even if `handle_timeout` has not run yet.
#[test]
fn expired_allocation_is_gone_before_the_sweep() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let relay = h.allocate(from, &alice());
    h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    h.now += Duration::from_secs(600); // no handle_timeout
    assert_eq!(h.client(from, &[0x40, 0x01, 0, 1, b'a']), None);
    assert_eq!(h.peer(relay, "8.8.8.8:5000".parse().unwrap(), b"a"), None);
    let r = h.authed(from, &alice(), Req::new(method::REFRESH));
    assert_eq!(r.code, Some(437));
    assert_eq!(h.relays.released, vec![relay]);
    assert_eq!(h.server.allocation_count(), 0);
}

#[test]
fn clear_releases_everything() {
    let mut h = H::new(base_config());
    let a = h.allocate(udp("192.0.2.7:1"), &alice());
    let b = h.allocate(udp("192.0.2.7:2"), &alice());
    h.events();
    h.server.clear();
    h.collect_releases();
    assert_eq!(h.server.allocation_count(), 0);
    assert_eq!(h.relays.released, vec![a, b]);
    assert_eq!(h.events().len(), 2);
    assert_eq!(h.server.poll_timeout(), None);
}

#[test]
fn event_queue_is_bounded() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let nonce = h.nonce(from);
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&Creds::password("alice", "bad"), &nonce)
        .bytes();
    for _ in 0..MAX_QUEUED_EVENTS + 10 {
        h.client(from, &bytes);
    }
    assert_eq!(h.events().len(), MAX_QUEUED_EVENTS);
    assert_eq!(h.server.counters().events_dropped, 10);
    // Once polled, there is room again.
    h.client(from, &bytes);
    assert_eq!(h.events().len(), 1);
}

/// Session ends are never lost: 10,000 allocations ending in one timer pass during a drain,
/// behind a queue already full of other events, each come out as `AllocationDeleted` (the
/// I/O layer drops a session guard for each; the drain ends with the last).
#[test]
fn ten_thousand_allocations_ending_in_one_timer_pass_are_all_reported() {
    const N: u16 = 10_000;
    let mut config = base_config();
    config.lifetimes.allocation_max = Duration::from_secs(60);
    config.lifetimes.allocation_default = Duration::from_secs(60);
    config.quotas.total = 0;
    let mut h = H::new(config);
    let creds = Creds::rest(SECRET, h.unix_now() + 3600, "many");
    let nonce = h.nonce(udp("192.0.2.7:1"));
    for i in 0..N {
        let from = udp(&format!("192.0.2.7:{}", 10_000 + i));
        let bytes = Req::new(method::ALLOCATE)
            .transport_udp()
            .auth(&creds, &nonce)
            .bytes();
        let r = decode(&h.client(from, &bytes).expect("a response"));
        assert_eq!(r.class, Class::Success, "allocation {i}: {:?}", r.code);
    }
    let created = h
        .events()
        .iter()
        .filter(|e| matches!(e, Event::AllocationCreated { .. }))
        .count();
    assert_eq!(created, usize::from(N));
    h.server.set_drain(DrainMode::Refuse { alternates: vec![] });
    // Other events fill the queue first (failed authentications nobody polled).
    let bad = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&Creds::password("alice", "bad"), &nonce)
        .bytes();
    for _ in 0..MAX_QUEUED_EVENTS + 1 {
        h.client(udp("192.0.2.7:2"), &bad);
    }
    // One timer pass: every allocation expires in it.
    h.advance(61);
    assert_eq!(h.server.allocation_count(), 0);
    let events = h.events();
    let deleted = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::AllocationDeleted {
                    reason: DeleteReason::Expired,
                    ..
                }
            )
        })
        .count();
    assert_eq!(deleted, usize::from(N));
    assert_eq!(events.len(), usize::from(N) + MAX_QUEUED_EVENTS);
    assert_eq!(h.server.counters().events_dropped, 1);
    assert_eq!(h.relays.released.len(), usize::from(N));
}
