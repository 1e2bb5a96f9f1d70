//! Authentication (RFC 8489 §9.2), for every method: static users and precomputed keys, REST
//! secrets and their expiry, nonces (stale, another IP, fleet keys), 441 for another user or
//! origin on a 5-tuple, the anonymous server.

use super::*;

#[test]
fn unauthenticated_allocate_gets_401_with_realm_and_nonce() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let req = Req::new(method::ALLOCATE).transport_udp().bytes();
    let r = decode(&h.client(from, &req).unwrap());
    assert_eq!(r.code, Some(401));
    assert_eq!(r.get(attr::REALM), Some(REALM.as_bytes()));
    assert_eq!(r.get(attr::NONCE).unwrap().len(), NONCE_LEN);
    assert!(r.get(attr::MESSAGE_INTEGRITY).is_none());
    // Exact size: header + ERROR-CODE + REALM (11 -> 12) + NONCE (16).
    assert_eq!(r.raw.len(), 20 + 8 + 16 + 20);
    assert!(
        h.events().is_empty(),
        "the first challenge is not an auth failure"
    );
}

#[test]
fn static_user_allocates_and_response_is_authenticated() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE).transport_udp().fp(),
    );
    assert_eq!(r.class, Class::Success);
    assert_eq!(r.lifetime(), Some(600));
    assert_eq!(r.addr(attr::XOR_MAPPED_ADDRESS), Some(from.client));
    let relay = r.addr(attr::XOR_RELAYED_ADDRESS).unwrap();
    assert_eq!(relay.ip(), "203.0.113.10".parse::<IpAddr>().unwrap());
    let m = Message::parse(&r.raw).unwrap();
    let mi = m
        .attributes()
        .find(|a| a.typ == attr::MESSAGE_INTEGRITY)
        .unwrap();
    assert!(m.check_integrity_sha1(mi.offset, mi.value, &alice().key));
    let fp = m.attributes().find(|a| a.typ == attr::FINGERPRINT).unwrap();
    assert!(m.check_fingerprint(fp.offset, fp.value));
    assert_eq!(h.server.allocation_count(), 1);
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::AllocationCreated { username, lifetime: 600, .. }] if username == "alice")
    );
}

#[test]
fn precomputed_key_user() {
    let mut c = base_config();
    let key = long_term_key("carol", REALM, "carolpass");
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    c.auth.add_coturn_user(&format!("carol:0x{hex}")).unwrap();
    let mut h = H::new(c);
    h.allocate(
        udp("192.0.2.7:40000"),
        &Creds::password("carol", "carolpass"),
    );
    assert!(parse_coturn_user("carol:0x12").is_err());
    assert!(parse_coturn_user("nocolon").is_err());
}

#[test]
fn bad_message_integrity_401() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &Creds::password("alice", "wrong"),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
    assert!(r.get(attr::NONCE).is_some());
    assert!(r.get(attr::MESSAGE_INTEGRITY).is_none());
    let ev = h.events();
    assert!(matches!(
        &ev[..],
        [Event::AuthFailed {
            reason: AuthFailure::BadIntegrity,
            ..
        }]
    ));
    assert_eq!(h.server.counters().auth_failures, 1);
    assert_eq!(h.server.allocation_count(), 0);
}

#[test]
fn tampered_message_401() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let nonce = h.nonce(from);
    let mut bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .lifetime(700)
        .auth(&alice(), &nonce)
        .bytes();
    bytes[20 + 8 + 7] ^= 1; // change LIFETIME after signing
    let r = decode(&h.client(from, &bytes).unwrap());
    assert_eq!(r.code, Some(401));
}

#[test]
fn unknown_user_401() {
    let mut h = H::new(base_config());
    let r = h.authed(
        udp("192.0.2.7:40000"),
        &Creds::password("mallory", "x"),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
    assert!(matches!(
        &h.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::UnknownUser,
            ..
        }]
    ));
}

#[test]
fn stale_nonce_438() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let nonce = h.nonce(from);
    h.advance(601);
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let r = decode(&h.client(from, &bytes).unwrap());
    assert_eq!(r.code, Some(438));
    assert!(matches!(
        &h.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::StaleNonce,
            username: Some(u),
            ..
        }] if u == "alice"
    ));
    // Nonce rotation is not an authentication failure.
    assert_eq!(h.server.counters().auth_failures, 0);
    let fresh = r.get(attr::NONCE).unwrap().to_vec();
    assert_ne!(fresh, nonce);
    assert_eq!(r.get(attr::REALM), Some(REALM.as_bytes()));
    // The fresh nonce works.
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &fresh)
        .bytes();
    assert_eq!(
        decode(&h.client(from, &bytes).unwrap()).class,
        Class::Success
    );
}

#[test]
fn nonce_from_another_ip_438() {
    let mut h = H::new(base_config());
    let nonce = h.nonce(udp("192.0.2.7:40000"));
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let r = decode(&h.client(udp("192.0.2.8:40000"), &bytes).unwrap());
    assert_eq!(r.code, Some(438));
    assert!(matches!(
        &h.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::UnknownNonce,
            ..
        }]
    ));
    // Another server's nonce (another secret) is unknown too.
    let mut config = base_config();
    config.nonce.secret = [8; 32];
    let mut other = H::new(config);
    let foreign = other.nonce(udp("192.0.2.7:40000"));
    let forged = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &foreign)
        .bytes();
    let r = decode(&h.client(udp("192.0.2.7:40000"), &forged).unwrap());
    assert_eq!(r.code, Some(438));
    assert!(matches!(
        &h.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::UnknownNonce,
            ..
        }]
    ));
    // Same IP, other port (NAT rebinding, a new TCP connection): still valid.
    let r = decode(&h.client(udp("192.0.2.7:40001"), &bytes).unwrap());
    assert_eq!(r.class, Class::Success);
}

#[test]
fn rest_credentials_valid_expired_rotated_and_capped() {
    let mut c = base_config();
    c.auth.rest_secrets = vec![b"old".to_vec(), b"new".to_vec()];
    let mut h = H::new(c);
    let now = h.unix_now();
    // Valid with the first secret.
    h.allocate(
        udp("192.0.2.7:40000"),
        &Creds::rest(b"old", now + 3600, "u1"),
    );
    // Rotation: the second secret is accepted too.
    h.allocate(
        udp("192.0.2.7:40001"),
        &Creds::rest(b"new", now + 3600, "u2"),
    );
    // Username without a user part.
    let name = format!("{}", now + 3600);
    h.allocate(
        udp("192.0.2.7:40005"),
        &Creds::password(&name, &rest_password(b"new", &name)),
    );
    // A secret we do not know: 401.
    let r = h.authed(
        udp("192.0.2.7:40002"),
        &Creds::rest(b"other", now + 3600, "u3"),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
    // Expired: 401.
    h.events();
    let r = h.authed(
        udp("192.0.2.7:40003"),
        &Creds::rest(b"new", now - 1, "u4"),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
    assert!(matches!(
        &h.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::Expired,
            ..
        }]
    ));
    // Lifetime capped at the credential's expiry.
    let r = h.authed(
        udp("192.0.2.7:40004"),
        &Creds::rest(b"new", now + 120, "u5"),
        Req::new(method::ALLOCATE).transport_udp().lifetime(3600),
    );
    assert_eq!(r.class, Class::Success);
    assert_eq!(r.lifetime(), Some(120));
}

#[test]
fn rest_lifetime_cap_applies_on_refresh_and_allocation_expires() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let c = Creds::rest(SECRET, h.unix_now() + 100, "u");
    let relay = h.allocate(from, &c);
    let r = h.authed(from, &c, Req::new(method::REFRESH).lifetime(3000));
    assert_eq!(r.lifetime(), Some(100));
    h.advance(99);
    assert_eq!(h.server.allocation_count(), 1);
    h.advance(1);
    assert_eq!(h.server.allocation_count(), 0);
    assert_eq!(h.relays.released, vec![relay]);
}

#[test]
fn wrong_credentials_441() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    h.allocate(from, &alice());
    let r = h.authed(
        from,
        &Creds::password("bob", "bobpass"),
        Req::new(method::REFRESH),
    );
    assert_eq!(r.code, Some(441));
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::AuthFailed {
            reason: AuthFailure::WrongCredentials,
            ..
        }
    )));
}

#[test]
fn message_integrity_sha256_accepted() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let nonce = h.nonce(from);
    let mut req = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce);
    req.sha256 = true;
    let r = decode(&h.client(from, &req.bytes()).unwrap());
    assert_eq!(r.class, Class::Success);
    let m = Message::parse(&r.raw).unwrap();
    let mi = m
        .attributes()
        .find(|a| a.typ == attr::MESSAGE_INTEGRITY_SHA256)
        .unwrap();
    assert!(m.check_integrity_sha256(mi.offset, mi.value, &alice().key));
}

#[test]
fn anonymous_server_without_credentials() {
    let mut c = ServerConfig::new(REALM);
    c.relay.relay_ips = vec!["203.0.113.10".parse().unwrap()];
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    // Padded so the unauthenticated success fits the no-amplification rule.
    let req = Req::new(method::ALLOCATE)
        .transport_udp()
        .attr(attr::SOFTWARE, vec![b' '; 40])
        .bytes();
    let r = decode(&h.client(from, &req).unwrap());
    assert_eq!(r.class, Class::Success);
    assert!(r.get(attr::MESSAGE_INTEGRITY).is_none());
}

/// Fleet nonces: servers with the same nonce key accept each other's nonces (a client sent
/// on with 300 keeps the nonce of the 300, as libwebrtc does), servers with another key
/// answer 438 (unknown nonce); a key in `accepted` (the other REST secrets of a rotation)
/// is accepted but never issued.
#[test]
fn fleet_nonces_are_valid_on_every_server_sharing_the_key() {
    let key = nonce_key(b"the fleet's secret");
    assert_ne!(key, nonce_key(b"another secret"));
    let mut config = base_config();
    config.nonce.secret = key;
    let mut draining = H::new(config.clone());
    let mut alternate = H::new(config);
    let alt: SocketAddr = "198.51.100.2:3478".parse().unwrap();
    draining.server.set_drain(DrainMode::Refuse {
        alternates: vec![alt],
    });
    // The client had a nonce from the draining server; its authenticated Allocate gets 300
    // with a NONCE, which it takes to the alternate.
    let from = udp("192.0.2.7:40000");
    let r = draining.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(300));
    let nonce = r.get(attr::NONCE).unwrap().to_vec();
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let r = decode(&alternate.client(from, &bytes).unwrap());
    assert_eq!(r.class, Class::Success, "{:?}", r.code);
    // A server with another key: 438, logged as an unknown nonce.
    let mut config = base_config();
    config.nonce.secret = nonce_key(b"another secret");
    let mut stranger = H::new(config.clone());
    let r = decode(&stranger.client(from, &bytes).unwrap());
    assert_eq!(r.code, Some(438));
    assert!(matches!(
        &stranger.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::UnknownNonce,
            ..
        }]
    ));
    // The same server, accepting the fleet key during a rotation: valid.
    config.nonce.accepted = vec![key];
    let mut rotating = H::new(config);
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let r = decode(&rotating.client(udp("192.0.2.7:40001"), &bytes).unwrap());
    assert_eq!(r.class, Class::Success, "{:?}", r.code);
}

#[test]
fn check_origin_consistency_refuses_another_origin_with_441() {
    let mut c = base_config();
    c.check_origin = true;
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    let origin = |o: &str| (attr::ORIGIN, o.as_bytes().to_vec());
    let (t, v) = origin("https://Meet.Example.org");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE).transport_udp().attr(t, v),
    );
    assert_eq!(r.class, Class::Success);
    // The same origin, spelt with its default port: fine.
    let (t, v) = origin("https://meet.example.org:443");
    let r = h.authed(from, &alice(), Req::new(method::REFRESH).attr(t, v));
    assert_eq!(r.class, Class::Success);
    let (t, v) = origin("https://evil.example.com");
    let r = h.authed(from, &alice(), Req::new(method::REFRESH).attr(t, v));
    assert_eq!(r.code, Some(441));
    let r = h.authed(from, &alice(), Req::new(method::REFRESH));
    assert_eq!(r.code, Some(441), "no ORIGIN where the Allocate had one");
}
