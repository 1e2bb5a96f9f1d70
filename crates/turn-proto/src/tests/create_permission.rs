//! CreatePermission (RFC 8656 §9) and the peer policy it applies: forbidden peers in every
//! spelling, `allowed-peer-ip` and `denied-peer-ip`, family mismatches.

use super::*;

#[test]
fn peer_family_mismatch_443() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    h.allocate(from, &alice());
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("[2606:4700::1111]:53"),
    );
    assert_eq!(r.code, Some(443));
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4000)
            .peer("[2606:4700::1111]:53"),
    );
    assert_eq!(r.code, Some(443));
}

/// Every peer-address class of turn.md, IPv4 and IPv6 allocations, CreatePermission and
/// ChannelBind: 403.
#[test]
fn forbidden_peers_403() {
    let v4_peers = [
        "127.0.0.1:9",
        "127.255.255.254:9",
        "0.0.0.0:9",
        "0.1.2.3:9",
        "169.254.169.254:80",
        "169.254.0.1:9",
        "224.0.0.1:9",
        "239.255.255.250:1900",
        "255.255.255.255:9",
        "10.0.0.1:9",
        "172.16.5.4:9",
        "172.31.255.255:9",
        "192.168.1.1:9",
        "100.64.0.1:9",
        "198.18.0.1:9",
        "240.0.0.1:9",
        "192.0.2.1:9",
        "192.0.0.8:9",
    ];
    let v6_peers = [
        "[::1]:9",
        "[::]:9",
        "[fe80::1]:9",
        "[febf::1]:9",
        "[ff02::1]:9",
        "[ff0e::1]:9",
        "[fc00::1]:9",
        "[fd12:3456::1]:9",
        "[fec0::1]:9",
        "[2001:db8::1]:9",
        // IPv4-mapped
        "[::ffff:127.0.0.1]:9",
        "[::ffff:169.254.169.254]:80",
        "[::ffff:10.0.0.1]:9",
        "[::ffff:0.0.0.0]:9",
        "[::ffff:224.0.0.1]:9",
        "[::ffff:255.255.255.255]:9",
        // IPv4-compatible
        "[::127.0.0.1]:9",
        "[::169.254.169.254]:80",
        "[::10.1.2.3]:9",
        "[::192.168.0.1]:9",
        // 6to4
        "[2002:7f00:1::1]:9",
        "[2002:a9fe:a9fe::]:80",
        "[2002:0a00:0001::1]:9",
        "[2002:c0a8:0101::]:9",
        "[2002:e000:0001::]:9",
        // NAT64 well-known and local-use
        "[64:ff9b::127.0.0.1]:9",
        "[64:ff9b::169.254.169.254]:80",
        "[64:ff9b::10.0.0.1]:9",
        "[64:ff9b::192.168.1.1]:9",
        "[64:ff9b:1::127.0.0.1]:9",
        "[64:ff9b:1::8.8.8.8]:9",
        // IPv4-translated, ISATAP, Teredo (client 127.0.0.1 inverted), the rest of ::/8
        "[::ffff:0:127.0.0.1]:9",
        "[::ffff:0:169.254.169.254]:80",
        "[::5efe:169.254.169.254]:80",
        "[2606:4700:1:2:200:5efe:127.0.0.1]:9",
        "[2001:0:808:808::80ff:fffe]:9",
        "[2001:0:a9fe:a9fe::f7f7:f7f7]:80",
        "[::1:0:0:1]:9",
    ];
    let mut h = H::new(base_config());
    let v4_client = udp("192.0.2.7:40000");
    let v6_client = udp("192.0.2.7:40001");
    h.allocate(v4_client, &alice());
    let r = h.authed(
        v6_client,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.class, Class::Success);
    let mut channel = 0x4000;
    for (client, peers) in [(v4_client, &v4_peers[..]), (v6_client, &v6_peers[..])] {
        for p in peers {
            let r = h.authed(
                client,
                &alice(),
                Req::new(method::CREATE_PERMISSION).peer(p),
            );
            assert_eq!(r.code, Some(403), "CreatePermission {p}");
            let r = h.authed(
                client,
                &alice(),
                Req::new(method::CHANNEL_BIND).channel(channel).peer(p),
            );
            assert_eq!(r.code, Some(403), "ChannelBind {p}");
            channel += 1;
        }
    }
    // All or nothing: one forbidden peer among allowed ones refuses the whole request.
    let r = h.authed(
        v4_client,
        &alice(),
        Req::new(method::CREATE_PERMISSION)
            .peer("8.8.8.8:1")
            .peer("10.0.0.1:1"),
    );
    assert_eq!(r.code, Some(403));
    assert!(h
        .peer(h.relays.bound[0], "8.8.8.8:1".parse().unwrap(), b"x")
        .is_none());
    // Public peers are fine, on both families, including IPv6 spellings of public IPv4.
    for p in ["8.8.8.8:53", "1.1.1.1:53"] {
        let r = h.authed(
            v4_client,
            &alice(),
            Req::new(method::CREATE_PERMISSION).peer(p),
        );
        assert_eq!(r.class, Class::Success, "{p}");
    }
    for p in [
        "[2606:4700::1111]:53",
        "[64:ff9b::8.8.8.8]:53",
        "[2002:0808:0808::1]:53",
        "[::ffff:8.8.8.8]:53",
    ] {
        let r = h.authed(
            v6_client,
            &alice(),
            Req::new(method::CREATE_PERMISSION).peer(p),
        );
        assert_eq!(r.class, Class::Success, "{p}");
    }
}

#[test]
fn peer_policy_options() {
    let mut p = PeerPolicy::default();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(p.check(ip("10.1.2.3")), Err(DenyReason::Private));
    assert_eq!(p.check(ip("127.0.0.1")), Err(DenyReason::Loopback));
    assert_eq!(p.check(ip("::ffff:127.0.0.1")), Err(DenyReason::Loopback));
    assert_eq!(p.check(ip("169.254.169.254")), Err(DenyReason::LinkLocal));
    assert!(p.check(ip("8.8.8.8")).is_ok());
    p.allowed.push("10.0.0.0/8".parse().unwrap());
    assert!(p.check(ip("10.1.2.3")).is_ok());
    assert!(
        p.check(ip("::ffff:10.1.2.3")).is_ok(),
        "an allowed IPv4 range covers its IPv6 spellings"
    );
    p.denied.push("10.1.0.0-10.1.255.255".parse().unwrap());
    assert!(
        p.check(ip("10.1.2.3")).is_ok(),
        "allowed-peer-ip wins over denied-peer-ip (coturn)"
    );
    p.denied.push("8.8.8.8".parse().unwrap());
    assert_eq!(p.check(ip("8.8.8.8")), Err(DenyReason::Configured));
    assert_eq!(p.check(ip("::ffff:8.8.8.8")), Err(DenyReason::Configured));
    // allowed-peer-ip never opens the always-denied classes.
    p.allowed.push("127.0.0.0/8".parse().unwrap());
    p.allowed.push("169.254.0.0/16".parse().unwrap());
    assert_eq!(p.check(ip("127.0.0.1")), Err(DenyReason::Loopback));
    assert_eq!(p.check(ip("169.254.169.254")), Err(DenyReason::LinkLocal));
    p.allow_loopback = true;
    assert!(p.check(ip("127.0.0.1")).is_ok());
    assert!(p.check(ip("::1")).is_ok());
    assert_eq!(p.check(ip("169.254.169.254")), Err(DenyReason::LinkLocal));
    // Range syntax.
    assert!("1.2.3.4-1.2.3.1".parse::<IpRange>().is_err());
    assert!("1.2.3.4-::1".parse::<IpRange>().is_err());
    assert!("1.2.3.4/33".parse::<IpRange>().is_err());
    assert!("fc00::/7"
        .parse::<IpRange>()
        .unwrap()
        .contains(ip("fdff::1")));
    assert!("0.0.0.0/0"
        .parse::<IpRange>()
        .unwrap()
        .contains(ip("1.2.3.4")));
}

#[test]
fn allowed_peer_ip_opens_private_peer_in_server() {
    let mut c = base_config();
    c.peer_policy.allowed.push("10.0.0.0/8".parse().unwrap());
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    h.allocate(from, &alice());
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("10.2.3.4:5"),
    );
    assert_eq!(r.class, Class::Success);
}
