//! Allocate (RFC 8656 §7): its error answers, address families and dual allocations,
//! lifetimes, quotas and `bps-capacity`, relay addresses (`external-ip`, the local address),
//! EVEN-PORT and RESERVATION-TOKEN, retransmissions. The relay-binding pair is in
//! `relay_binding`.

use super::*;

#[test]
fn error_400_cases() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    // Missing REQUESTED-TRANSPORT.
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE));
    assert_eq!(r.code, Some(400));
    // MESSAGE-INTEGRITY without USERNAME/NONCE.
    let mut buf = Vec::new();
    let mut b = Builder::new(&mut buf, method::ALLOCATE, Class::Request, txid());
    b.attr(attr::REQUESTED_TRANSPORT, &[17, 0, 0, 0])
        .attr(attr::SOFTWARE, &[b'x'; 40])
        .integrity_sha1(&alice().key);
    let r = decode(&h.client(from, &buf).unwrap());
    assert_eq!(r.code, Some(400));
    // Malformed LIFETIME.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::LIFETIME, vec![1, 2]),
    );
    assert_eq!(r.code, Some(400));
    // Both REQUESTED-ADDRESS-FAMILY and ADDITIONAL-ADDRESS-FAMILY.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![1, 0, 0, 0])
            .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(400));
    // ADDITIONAL-ADDRESS-FAMILY IPv4.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![1, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(400));
    assert_eq!(h.server.allocation_count(), 0);
}

#[test]
fn unknown_comprehension_required_attributes_420() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(0x0031, vec![1, 2, 3, 4])
            .attr(0x7001, vec![]),
    );
    assert_eq!(r.code, Some(420));
    assert_eq!(
        r.get(attr::UNKNOWN_ATTRIBUTES),
        Some(&[0x00, 0x31, 0x70, 0x01][..])
    );
    // Unknown comprehension-optional attributes are ignored; DONT-FRAGMENT is accepted.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(0x8077, vec![1])
            .attr(attr::DONT_FRAGMENT, vec![]),
    );
    assert_eq!(r.class, Class::Success);
    // Binding with an unknown comprehension-required attribute: 420 (unauthenticated, so
    // only when the answer is not larger than the request).
    let bytes = Req::new(method::BINDING).attr(0x0031, vec![0; 8]).bytes();
    assert_eq!(h.client(from, &bytes), None);
    let bytes = Req::new(method::BINDING)
        .attr(0x0031, vec![0; 8])
        .attr(attr::SOFTWARE, vec![b'x'; 8])
        .bytes();
    let r = decode(&h.client(from, &bytes).unwrap());
    assert_eq!(r.code, Some(420));
}

#[test]
fn allocation_mismatch_437() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    for m in [
        method::REFRESH,
        method::CREATE_PERMISSION,
        method::CHANNEL_BIND,
    ] {
        let r = h.authed(
            from,
            &alice(),
            Req::new(m).peer("8.8.8.8:1").channel(0x4000),
        );
        assert_eq!(r.code, Some(437), "method {m}");
    }
    h.allocate(from, &alice());
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(437));
}

#[test]
fn allocate_retransmission_gets_the_same_answer() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let nonce = h.nonce(from);
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let a = decode(&h.client(from, &bytes).unwrap());
    let b = decode(&h.client(from, &bytes).unwrap());
    assert_eq!(b.class, Class::Success);
    assert_eq!(
        a.addr(attr::XOR_RELAYED_ADDRESS),
        b.addr(attr::XOR_RELAYED_ADDRESS)
    );
    assert_eq!(h.relays.bound.len(), 1);
}

#[test]
fn address_family_440() {
    let mut c = base_config();
    c.relay.relay_ips = vec!["203.0.113.10".parse().unwrap()];
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(440));
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![3, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(440));
    // Dual allocation without IPv6: IPv4 relay plus ADDRESS-ERROR-CODE 440 for IPv6.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.class, Class::Success);
    assert_eq!(r.all(attr::XOR_RELAYED_ADDRESS).len(), 1);
    assert_eq!(r.get(attr::ADDRESS_ERROR_CODE), Some(&[2, 0, 4, 40][..]));
}

#[test]
fn dual_allocation_and_ipv6() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.class, Class::Success);
    let relays = r.all(attr::XOR_RELAYED_ADDRESS);
    assert_eq!(relays.len(), 2);
    let v6 = decode_address(relays[1], &r.txid, true).unwrap();
    assert!(v6.is_ipv6());
    // Permissions for both families; data flows on both.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION)
            .peer("8.8.8.8:53")
            .peer("[2606:4700::1111]:53"),
    );
    assert_eq!(r.class, Class::Success);
    let v4: SocketAddr = h.relays.bound[0];
    assert!(h.peer(v4, "8.8.8.8:53".parse().unwrap(), b"x").is_some());
    assert!(h
        .peer(v6, "[2606:4700::1111]:53".parse().unwrap(), b"y")
        .is_some());
    // REQUESTED-ADDRESS-FAMILY IPv6 alone.
    let from6 = udp("192.0.2.8:40000");
    let r = h.authed(
        from6,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert!(r.addr(attr::XOR_RELAYED_ADDRESS).unwrap().is_ipv6());
    // Refresh asking for IPv4 on an IPv6-only allocation: 443.
    let r = h.authed(
        from6,
        &alice(),
        Req::new(method::REFRESH).attr(attr::REQUESTED_ADDRESS_FAMILY, vec![1, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(443));
}

#[test]
fn unsupported_transport_442() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE).attr(attr::REQUESTED_TRANSPORT, vec![6, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(442));
    let mut c = base_config();
    c.udp_relay = false;
    let mut h = H::new(c);
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(442));
}

#[test]
fn quotas_486() {
    let mut c = base_config();
    c.quotas.per_user = 1;
    c.quotas.total = 2;
    let mut h = H::new(c);
    h.allocate(udp("192.0.2.7:40000"), &alice());
    let r = h.authed(
        udp("192.0.2.7:40001"),
        &alice(),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(486));
    h.allocate(udp("192.0.2.7:40002"), &Creds::password("bob", "bobpass"));
    let r = h.authed(
        udp("192.0.2.7:40003"),
        &Creds::rest(SECRET, h.unix_now() + 99, "c"),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(486));
    assert_eq!(h.server.counters().refused_quota, 2);
    // Freeing one allocation frees the user's quota.
    let r = h.authed(
        udp("192.0.2.7:40000"),
        &alice(),
        Req::new(method::REFRESH).lifetime(0),
    );
    assert_eq!(r.class, Class::Success);
    h.allocate(udp("192.0.2.7:40001"), &alice());
}

#[test]
fn no_relay_port_508() {
    let mut h = H::new(base_config());
    h.relays.fail = Some(RelayError::NoPort);
    let r = h.authed(
        udp("192.0.2.7:40000"),
        &alice(),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(508));
    assert!(h
        .events()
        .iter()
        .any(|e| matches!(e, Event::AllocateRefused { code: 508, .. })));
}

#[test]
fn lifetimes_default_and_max() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE).transport_udp().lifetime(30),
    );
    assert_eq!(r.lifetime(), Some(600), "below default: default");
    let r = h.authed(from, &alice(), Req::new(method::REFRESH).lifetime(100_000));
    assert_eq!(r.lifetime(), Some(3600), "capped at max-allocate-lifetime");
    let r = h.authed(from, &alice(), Req::new(method::REFRESH));
    assert_eq!(r.lifetime(), Some(600));
    let r = h.authed(from, &alice(), Req::new(method::REFRESH).lifetime(0));
    assert_eq!((r.class, r.lifetime()), (Class::Success, Some(0)));
    assert_eq!(h.server.allocation_count(), 0);
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::AllocationDeleted {
            reason: DeleteReason::Refreshed,
            ..
        }
    )));
}

#[test]
fn external_ip_mapping() {
    let mut c = base_config();
    c.relay.external_ips = vec!["192.0.2.200/203.0.113.10".parse().unwrap()];
    let mut h = H::new(c);
    let r = h.authed(
        udp("192.0.2.7:40000"),
        &alice(),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    let adv = r.addr(attr::XOR_RELAYED_ADDRESS).unwrap();
    assert_eq!(adv.ip(), "192.0.2.200".parse::<IpAddr>().unwrap());
    assert_eq!(adv.port(), h.relays.bound[0].port());
    let e: ExternalIp = "1.2.3.4".parse().unwrap();
    assert_eq!(e.private, None);
    assert!("1.2.3.4/::1".parse::<ExternalIp>().is_err());
    let rc = RelayConfig {
        relay_ips: vec![],
        external_ips: vec![e],
    };
    assert_eq!(
        rc.advertised("10.0.0.1".parse().unwrap()),
        "1.2.3.4".parse::<IpAddr>().unwrap()
    );
    assert_eq!(
        rc.advertised("::1".parse().unwrap()),
        "::1".parse::<IpAddr>().unwrap()
    );
}

#[test]
fn relay_on_local_address_when_no_relay_ip() {
    let mut c = base_config();
    c.relay.relay_ips.clear();
    let mut h = H::new(c);
    let relay = h.allocate(udp("192.0.2.7:40000"), &alice());
    assert_eq!(relay.ip(), "198.51.100.1".parse::<IpAddr>().unwrap());
}

/// EVEN-PORT and RESERVATION-TOKEN, the way `turnutils_uclient` uses them (RTP allocation
/// with R=1, then the RTCP allocation from another socket with the token).
#[test]
fn even_port_and_reservation_token() {
    let mut h = H::new(base_config());
    let rtp = udp("192.0.2.7:40000");
    let rtcp = udp("192.0.2.7:40001");
    let r = h.authed(
        rtp,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::EVEN_PORT, vec![0x80])
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![1, 0, 0, 0])
            .fp(),
    );
    assert_eq!(r.class, Class::Success, "{:?}", r.code);
    let relay = r.addr(attr::XOR_RELAYED_ADDRESS).unwrap();
    assert_eq!(relay.port() % 2, 0);
    let token = r.get(attr::RESERVATION_TOKEN).unwrap().to_vec();
    assert_eq!(token.len(), 8);
    // The reserved socket drops peer data until it is allocated.
    let reserved = SocketAddr::new(relay.ip(), relay.port() + 1);
    assert_eq!(h.peer(reserved, "8.8.8.8:1".parse().unwrap(), b"x"), None);
    // RESERVATION-TOKEN with REQUESTED-ADDRESS-FAMILY: 400.
    let r = h.authed(
        rtcp,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::RESERVATION_TOKEN, token.clone())
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![1, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(400));
    // The token gives port + 1.
    let r = h.authed(
        rtcp,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::RESERVATION_TOKEN, token.clone()),
    );
    assert_eq!(r.class, Class::Success);
    assert_eq!(r.addr(attr::XOR_RELAYED_ADDRESS), Some(reserved));
    // A token works once; an unknown token: 508.
    let r = h.authed(
        udp("192.0.2.7:40002"),
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::RESERVATION_TOKEN, token),
    );
    assert_eq!(r.code, Some(508));
    // EVEN-PORT R=0: even port, no token.
    let r = h.authed(
        udp("192.0.2.7:40003"),
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::EVEN_PORT, vec![0x00]),
    );
    assert_eq!(r.addr(attr::XOR_RELAYED_ADDRESS).unwrap().port() % 2, 0);
    assert!(r.get(attr::RESERVATION_TOKEN).is_none());
    // An unused reservation is released after 30 s.
    let r = h.authed(
        udp("192.0.2.7:40004"),
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::EVEN_PORT, vec![0x80]),
    );
    let relay = r.addr(attr::XOR_RELAYED_ADDRESS).unwrap();
    let reserved = SocketAddr::new(relay.ip(), relay.port() + 1);
    assert!(h.server.poll_timeout().unwrap() <= h.now + Duration::from_secs(30));
    h.advance(29);
    assert!(!h.relays.released.contains(&reserved));
    h.advance(1);
    assert!(h.relays.released.contains(&reserved));
    // EVEN-PORT with a dual allocation: 400.
    let r = h.authed(
        udp("192.0.2.7:40005"),
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::EVEN_PORT, vec![0])
            .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(400));
}

#[test]
fn allocation_default_address_family_chooses_the_relay_of_an_allocate_naming_none() {
    let v6 = udp("[2001:db8::7]:40000");
    let v4 = udp("192.0.2.7:40000");
    for (family, from, want_v4) in [
        (DefaultFamily::Ipv4, v6, true),
        (DefaultFamily::Ipv6, v4, false),
        (DefaultFamily::Keep, v6, false),
        (DefaultFamily::Keep, v4, true),
    ] {
        let mut c = base_config();
        c.default_family = family;
        let mut h = H::new(c);
        let relay = h.allocate(from, &alice());
        assert_eq!(relay.is_ipv4(), want_v4, "{family:?} from {from:?}");
    }
}

#[test]
fn bps_capacity_is_reserved_per_allocation_and_freed_at_its_end() {
    let mut c = base_config();
    c.bandwidth.max_bps = 1000;
    c.bandwidth.capacity = 1500;
    let mut h = H::new(c);
    let a = udp("192.0.2.7:40000");
    let b = udp("192.0.2.8:40000");
    let d = udp("192.0.2.9:40000");
    h.allocate(a, &alice());
    assert_eq!(h.server.bandwidth_reserved(), 1000);
    // The second gets what is left.
    h.allocate(b, &alice());
    assert_eq!(h.server.bandwidth_reserved(), 1500);
    let r = h.authed(d, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(486));
    assert_eq!(h.server.counters().refused_bandwidth, 1);
    // Deleting one frees its share.
    let r = h.authed(a, &alice(), Req::new(method::REFRESH).lifetime(0));
    assert_eq!(r.class, Class::Success);
    h.advance(1);
    assert_eq!(h.server.bandwidth_reserved(), 500);
    // The next gets its full max-bps again (500 + 1000).
    h.allocate(d, &alice());
    assert_eq!(h.server.bandwidth_reserved(), 1500);
}
