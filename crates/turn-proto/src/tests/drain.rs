//! The drain: 300 Try Alternate or 403 for new Allocates only, same-family alternates, the
//! idle reclaim.

use super::*;

#[test]
fn drain_refuses_new_allocations_only() {
    let mut h = H::new(base_config());
    let old = udp("192.0.2.7:40000");
    let relay = h.allocate(old, &alice());
    h.authed(
        old,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    let alts: Vec<SocketAddr> = vec![
        "198.51.100.2:3478".parse().unwrap(),
        "[2001:db8::2]:3478".parse().unwrap(),
        "198.51.100.3:3478".parse().unwrap(),
    ];
    h.server.set_drain(DrainMode::Refuse {
        alternates: alts.clone(),
    });
    // A new client's first, unauthenticated Allocate gets 300 at once (coturn's answer),
    // with ALTERNATE-SERVER only: no REALM or NONCE (libwebrtc would take them and then
    // treat the alternate's 401 as fatal), no MESSAGE-INTEGRITY; within the challenge's size.
    let new = udp("192.0.2.8:40000");
    let first = Req::new(method::ALLOCATE).transport_udp().bytes();
    let r = decode(&h.client(new, &first).unwrap());
    assert_eq!(r.code, Some(300));
    assert!(r.get(attr::ALTERNATE_SERVER).is_some());
    for a in [attr::REALM, attr::NONCE, attr::MESSAGE_INTEGRITY] {
        assert!(r.get(a).is_none(), "{a:#x} in the first 300");
    }
    assert!(r.raw.len() <= 60, "{} bytes", r.raw.len());
    // Authenticated (a client that already had a nonce): 300 with an IPv4
    // ALTERNATE-SERVER, round-robin, integrity-protected, with REALM and a fresh NONCE.
    let mut seen = Vec::new();
    let nonce = h.nonce(new);
    for _ in 0..4 {
        let req = Req::new(method::ALLOCATE)
            .transport_udp()
            .auth(&alice(), &nonce)
            .bytes();
        let r = decode(&h.client(new, &req).unwrap());
        assert_eq!(r.code, Some(300));
        assert!(r.get(attr::MESSAGE_INTEGRITY).is_some());
        assert_eq!(r.get(attr::REALM), Some(REALM.as_bytes()));
        assert_eq!(r.get(attr::NONCE).map(<[u8]>::len), Some(NONCE_LEN));
        let a = decode_address(r.get(attr::ALTERNATE_SERVER).unwrap(), &r.txid, false).unwrap();
        assert!(a.is_ipv4());
        seen.push(a);
    }
    assert!(seen.contains(&alts[0]) && seen.contains(&alts[2]));
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::AllocateRefusedDraining {
            alternate: Some(_),
            ..
        }
    )));
    // Existing allocation: Binding, Refresh, CreatePermission, ChannelBind, data all work.
    assert_eq!(
        decode(&h.client(old, &Req::new(method::BINDING).bytes()).unwrap()).class,
        Class::Success
    );
    assert_eq!(
        h.authed(old, &alice(), Req::new(method::REFRESH)).class,
        Class::Success
    );
    assert_eq!(
        h.authed(
            old,
            &alice(),
            Req::new(method::CREATE_PERMISSION).peer("9.9.9.9:1")
        )
        .class,
        Class::Success
    );
    assert_eq!(
        h.authed(
            old,
            &alice(),
            Req::new(method::CHANNEL_BIND)
                .channel(0x4002)
                .peer("9.9.9.9:1")
        )
        .class,
        Class::Success
    );
    assert!(h.client(old, &[0x40, 0x01, 0, 1, b'a']).is_some());
    assert!(h
        .peer(relay, "8.8.8.8:5000".parse().unwrap(), b"a")
        .is_some());
    // Without alternates: 403.
    h.server.set_drain(DrainMode::Refuse { alternates: vec![] });
    let r = h.authed(new, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(403));
    // Refresh 0 still deletes.
    let r = h.authed(old, &alice(), Req::new(method::REFRESH).lifetime(0));
    assert_eq!(r.class, Class::Success);
    assert_eq!(h.server.allocation_count(), 0);
    // Two first Allocates (300 unauthenticated), four authenticated (300), one 403.
    assert_eq!(h.server.counters().refused_draining, 7);
    h.server.set_drain(DrainMode::Off);
    h.allocate(new, &alice());
}

#[test]
fn drain_prefers_same_family_alternate() {
    let mut h = H::new(base_config());
    h.server.set_drain(DrainMode::Refuse {
        alternates: vec![
            "[2001:db8::2]:3478".parse().unwrap(),
            "198.51.100.2:3478".parse().unwrap(),
        ],
    });
    let from = ClientAddr {
        transport: Transport::Udp,
        client: "[2001:db8:1::7]:40000".parse().unwrap(),
        local: "[2001:db8::1]:3478".parse().unwrap(),
    };
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    let a = decode_address(r.get(attr::ALTERNATE_SERVER).unwrap(), &r.txid, false).unwrap();
    assert_eq!(a, "[2001:db8::2]:3478".parse().unwrap());
}

/// The idle reclaim of a drain, on a paused clock: while refusing, an allocation that heard
/// nothing from its client for `drain_idle_timeout` ends (reason Reclaimed, counted); a
/// quiet live call sending one datagram every 5 s never does, and ends 30 s after its last
/// one; nothing is reclaimed before the drain; activity reported from elsewhere
/// (`note_client_activity`) counts like a datagram.
#[test]
fn drain_reclaims_allocations_whose_client_went_quiet() {
    let mut config = base_config();
    config.drain_idle_timeout = Some(Duration::from_secs(30));
    let mut h = H::new(config);
    let vanished = udp("192.0.2.7:40000");
    let live = udp("192.0.2.8:40000");
    let fed = udp("192.0.2.9:40000");
    for c in [vanished, live, fed] {
        h.allocate(c, &alice());
    }
    let r = h.authed(
        live,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4000)
            .peer("8.8.8.8:9"),
    );
    assert_eq!(r.class, Class::Success);
    let mut frame = Vec::new();
    crate::frame::write_channel_data(&mut frame, 0x4000, b"consent", false);
    let reclaimed = |h: &mut H| -> Vec<ClientAddr> {
        h.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::AllocationDeleted {
                    client,
                    reason: DeleteReason::Reclaimed,
                    ..
                } => Some(client),
                _ => None,
            })
            .collect()
    };
    // Not draining: 100 quiet seconds (but for the live call) reclaim nothing.
    for s in 1..=100u64 {
        h.advance(1);
        if s % 5 == 0 {
            assert!(matches!(h.client(live, &frame), Some(Sent::Peer(..))));
        }
    }
    assert_eq!(h.server.allocation_count(), 3);
    assert!(reclaimed(&mut h).is_empty());
    h.server.set_drain(DrainMode::Refuse { alternates: vec![] });
    h.server.note_client_activity(&fed, h.now);
    h.advance(0);
    assert_eq!(reclaimed(&mut h), [vanished], "quiet for 100 s: at once");
    // Ten minutes of a quiet live call (one datagram every 5 s), and activity reported for
    // `fed` every 20 s: neither is reclaimed. (Refreshes keep both allocations, and the
    // channel, alive.)
    for s in 1..=600u64 {
        h.advance(1);
        if s % 150 == 0 {
            for c in [live, fed] {
                let r = h.authed(c, &alice(), Req::new(method::REFRESH).lifetime(600));
                assert_eq!(r.class, Class::Success);
            }
            let r = h.authed(
                live,
                &alice(),
                Req::new(method::CHANNEL_BIND)
                    .channel(0x4000)
                    .peer("8.8.8.8:9"),
            );
            assert_eq!(r.class, Class::Success);
        }
        if s % 5 == 0 {
            assert!(matches!(h.client(live, &frame), Some(Sent::Peer(..))));
        }
        if s % 20 == 0 {
            h.server.note_client_activity(&fed, h.now);
        }
        assert!(reclaimed(&mut h).is_empty(), "reclaimed at {s} s");
    }
    assert_eq!(h.server.allocation_count(), 2);
    // The live call stops (its last datagram at 600 s): reclaimed 30 s later, not sooner.
    let last = h.now;
    for _ in 0..29 {
        h.advance(1);
        h.server.note_client_activity(&fed, h.now);
        assert!(reclaimed(&mut h).is_empty());
    }
    h.advance(1);
    assert_eq!(reclaimed(&mut h), [live]);
    assert_eq!(h.now - last, Duration::from_secs(30));
    assert_eq!(
        h.server.last_client_activity(&fed),
        Some(h.now - Duration::from_secs(1))
    );
    assert_eq!(h.server.counters().allocations_reclaimed, 2);
    assert_eq!(h.server.counters().allocations_deleted, 2);
}

/// Without `drain_idle_timeout` (`--drain-idle-timeout=0`) a drain reclaims nothing: a
/// quiet allocation lasts its lifetime.
#[test]
fn drain_without_idle_timeout_keeps_quiet_allocations_until_they_expire() {
    let mut h = H::new(base_config());
    let c = udp("192.0.2.7:40000");
    h.allocate(c, &alice());
    h.server.set_drain(DrainMode::Refuse { alternates: vec![] });
    for _ in 0..599 {
        h.advance(1);
    }
    assert_eq!(h.server.allocation_count(), 1);
    h.advance(1);
    assert_eq!(h.server.allocation_count(), 0);
    assert!(matches!(
        &h.events()[..],
        [
            ..,
            Event::AllocationDeleted {
                reason: DeleteReason::Expired,
                ..
            }
        ]
    ));
    assert_eq!(h.server.counters().allocations_reclaimed, 0);
}
