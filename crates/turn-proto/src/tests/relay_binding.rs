//! The relay-binding pair: an Allocate that needs relay sockets comes out of `handle_client`
//! as a request ([`Output::BindRelay`]) and is answered by a later input
//! ([`Server::relay_bound`]), with the synthetic clock of the other tests: success, the
//! errors an answer can carry, family errors, a client that retransmits or vanishes
//! meanwhile, a drain that begins meanwhile, quotas, and an answer that never comes.

use std::net::SocketAddr;

use super::*;

const V4_RELAY: &str = "203.0.113.10";
const V6_RELAY: &str = "2001:db8::10";

/// An authenticated Allocate from `from` (a nonce fetched first), with `extra` attributes.
fn allocate_bytes(h: &mut H, from: ClientAddr, extra: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let nonce = h.nonce(from);
    let mut req = Req::new(method::ALLOCATE).transport_udp();
    for (t, v) in extra {
        req = req.attr(*t, v.clone());
    }
    req.auth(&alice(), &nonce).bytes()
}

/// The request for relay sockets an Allocate produced (panics on anything else).
fn request(h: &mut H, from: ClientAddr, bytes: &[u8]) -> RelayRequest {
    match h.client_raw(from, bytes) {
        Raw::Bind(r) => r,
        other => panic!("expected a request for relay sockets, got {other:?}"),
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn ok(id: u64, relay: &str) -> RelayBound {
    RelayBound {
        id,
        primary: Ok((addr(relay), None)),
        additional: None,
    }
}

fn created(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::AllocationCreated { .. }))
        .count()
}

#[test]
fn an_allocate_is_answered_when_its_relay_socket_is_bound() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let bytes = allocate_bytes(&mut h, from, &[]);
    let r = request(&mut h, from, &bytes);
    assert_eq!(r.client, from);
    assert_eq!(r.ip, V4_RELAY.parse::<IpAddr>().unwrap());
    assert_eq!((r.ports, r.additional), (RelayPorts::Any, None));
    // Nothing exists yet: no allocation, no session event, one waiting Allocate.
    assert_eq!(h.server.allocation_count(), 0);
    assert_eq!(h.server.pending_count(), 1);
    assert_eq!(created(&h.events()), 0);

    let relay = "203.0.113.10:50123";
    let resp = decode(&h.answer(ok(r.id, relay)).expect("the Allocate's response"));
    assert_eq!(
        (resp.class, resp.method),
        (Class::Success, method::ALLOCATE)
    );
    assert_eq!(resp.addr(attr::XOR_RELAYED_ADDRESS), Some(addr(relay)));
    assert!(resp.get(attr::MESSAGE_INTEGRITY).is_some());
    assert_eq!(h.server.allocation_count(), 1);
    assert_eq!(h.server.pending_count(), 0);
    assert_eq!(created(&h.events()), 1);
    // The new relay carries data at once.
    let permit = Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:53");
    assert_eq!(h.authed(from, &alice(), permit).class, Class::Success);
    assert!(h.peer(addr(relay), addr("8.8.8.8:53"), b"x").is_some());
}

/// What an answer carries, and what the client gets for it.
#[test]
fn failed_or_unusable_answers_get_508_or_440_and_give_their_sockets_back() {
    struct Case {
        name: &'static str,
        even_port: Option<u8>,
        answer: fn(u64) -> RelayBound,
        code: u16,
        released: &'static [&'static str],
    }
    fn primary(id: u64, r: Result<(SocketAddr, Option<SocketAddr>), RelayError>) -> RelayBound {
        RelayBound {
            id,
            primary: r,
            additional: None,
        }
    }
    let cases = [
        Case {
            name: "no port left",
            even_port: None,
            answer: |id| primary(id, Err(RelayError::NoPort)),
            code: 508,
            released: &[],
        },
        Case {
            name: "another failure (EMFILE)",
            even_port: None,
            answer: |id| primary(id, Err(RelayError::Failed("Too many open files".into()))),
            code: 508,
            released: &[],
        },
        Case {
            name: "the address cannot be bound (EADDRNOTAVAIL)",
            even_port: None,
            answer: |id| primary(id, Err(RelayError::FamilyNotSupported)),
            code: 440,
            released: &[],
        },
        Case {
            name: "EVEN-PORT answered with an odd port",
            even_port: Some(0x00),
            answer: |id| primary(id, Ok((addr("203.0.113.10:50001"), None))),
            code: 508,
            released: &["203.0.113.10:50001"],
        },
        Case {
            name: "EVEN-PORT R answered without port + 1",
            even_port: Some(0x80),
            answer: |id| primary(id, Ok((addr("203.0.113.10:50002"), None))),
            code: 508,
            released: &["203.0.113.10:50002"],
        },
        Case {
            name: "EVEN-PORT R answered with a port that is not port + 1",
            even_port: Some(0x80),
            answer: |id| {
                let pair = Some(addr("203.0.113.10:50009"));
                primary(id, Ok((addr("203.0.113.10:50002"), pair)))
            },
            code: 508,
            released: &["203.0.113.10:50002", "203.0.113.10:50009"],
        },
        Case {
            name: "a plain Allocate answered with a pair",
            even_port: None,
            answer: |id| {
                let pair = Some(addr("203.0.113.10:50003"));
                primary(id, Ok((addr("203.0.113.10:50002"), pair)))
            },
            code: 508,
            released: &["203.0.113.10:50002", "203.0.113.10:50003"],
        },
    ];
    for case in cases {
        let mut h = H::new(base_config());
        let from = udp("192.0.2.7:40000");
        let extra: Vec<(u16, Vec<u8>)> = case
            .even_port
            .map(|flags| (attr::EVEN_PORT, vec![flags]))
            .into_iter()
            .collect();
        let bytes = allocate_bytes(&mut h, from, &extra);
        let r = request(&mut h, from, &bytes);
        let resp = h.answer((case.answer)(r.id)).expect(case.name);
        let resp = decode(&resp);
        assert_eq!(resp.code, Some(case.code), "{}", case.name);
        let released: Vec<SocketAddr> = case.released.iter().map(|a| addr(a)).collect();
        assert_eq!(h.relays.released, released, "{}", case.name);
        assert_eq!(h.server.allocation_count(), 0, "{}", case.name);
        assert_eq!(h.server.pending_count(), 0, "{}", case.name);
        let refused_508 = h
            .events()
            .iter()
            .any(|e| matches!(e, Event::AllocateRefused { code: 508, .. }));
        assert_eq!(refused_508, case.code == 508, "{}", case.name);
        assert_eq!(
            h.server.counters().refused_capacity,
            u64::from(case.code == 508),
            "{}",
            case.name
        );
    }
}

#[test]
fn an_answer_with_another_allocations_socket_gets_508_and_leaves_that_socket_alone() {
    let mut h = H::new(base_config());
    let first = h.allocate(udp("192.0.2.7:40000"), &alice());
    let from = udp("192.0.2.7:40001");
    let bytes = allocate_bytes(&mut h, from, &[]);
    let r = request(&mut h, from, &bytes);
    let resp = decode(&h.answer(ok(r.id, &first.to_string())).expect("a response"));
    assert_eq!(resp.code, Some(508));
    assert!(h.relays.released.is_empty(), "{:?}", h.relays.released);
    assert_eq!(h.server.allocation_count(), 1);
}

/// Families: decided before anything is bound when the configuration cannot serve them;
/// otherwise the answer tells.
#[test]
fn family_errors() {
    let v4_only = || {
        let mut c = base_config();
        c.relay.relay_ips = vec![V4_RELAY.parse().unwrap()];
        c
    };
    let family = |f: u8| (attr::REQUESTED_ADDRESS_FAMILY, vec![f, 0, 0, 0]);
    let additional = (attr::ADDITIONAL_ADDRESS_FAMILY, vec![2, 0, 0, 0]);

    // IPv6 without an IPv6 relay address, and an unknown family: 440 at once.
    for (what, f) in [("IPv6 without a relay address", 2u8), ("unknown family", 3)] {
        let mut h = H::new(v4_only());
        let from = udp("192.0.2.7:40000");
        let bytes = allocate_bytes(&mut h, from, &[family(f)]);
        match h.client_raw(from, &bytes) {
            Raw::Sent(s) => assert_eq!(decode(&s).code, Some(440), "{what}"),
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(h.server.pending_count(), 0, "{what}");
    }

    // IPv6 asked and configured: the request is for the IPv6 relay address.
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let bytes = allocate_bytes(&mut h, from, &[family(2)]);
    let r = request(&mut h, from, &bytes);
    assert_eq!(r.ip, V6_RELAY.parse::<IpAddr>().unwrap());
    let resp = h.answer(RelayBound {
        id: r.id,
        primary: Err(RelayError::FamilyNotSupported),
        additional: None,
    });
    assert_eq!(decode(&resp.expect("a response")).code, Some(440));

    // A dual allocation whose second family has no relay address: the first is served,
    // ADDRESS-ERROR-CODE 440 for the second.
    let mut h = H::new(v4_only());
    let bytes = allocate_bytes(&mut h, from, std::slice::from_ref(&additional));
    let r = request(&mut h, from, &bytes);
    assert_eq!(r.additional, None);
    let resp = decode(
        &h.answer(ok(r.id, "203.0.113.10:50001"))
            .expect("a response"),
    );
    assert_eq!(resp.class, Class::Success);
    assert_eq!(resp.all(attr::XOR_RELAYED_ADDRESS).len(), 1);
    assert_eq!(resp.get(attr::ADDRESS_ERROR_CODE), Some(&[2, 0, 4, 40][..]));

    // A dual allocation whose second socket failed: the first is served, with 508 or 440.
    for (err, code) in [
        (RelayError::NoPort, [5, 8]),
        (RelayError::FamilyNotSupported, [4, 40]),
    ] {
        let mut h = H::new(base_config());
        let bytes = allocate_bytes(&mut h, from, std::slice::from_ref(&additional));
        let r = request(&mut h, from, &bytes);
        assert_eq!(r.additional, Some(V6_RELAY.parse::<IpAddr>().unwrap()));
        let resp = h.answer(RelayBound {
            id: r.id,
            primary: Ok((addr("203.0.113.10:50001"), None)),
            additional: Some(Err(err.clone())),
        });
        let resp = decode(&resp.expect("a response"));
        assert_eq!(resp.class, Class::Success, "{err:?}");
        assert_eq!(resp.all(attr::XOR_RELAYED_ADDRESS).len(), 1, "{err:?}");
        let want = [2, 0, code[0], code[1]];
        assert_eq!(
            resp.get(attr::ADDRESS_ERROR_CODE),
            Some(&want[..]),
            "{err:?}"
        );
        assert_eq!(h.server.allocation_count(), 1);
    }
}

#[test]
fn a_retransmission_while_the_socket_is_bound_waits_for_the_same_answer() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let bytes = allocate_bytes(&mut h, from, &[]);
    let r = request(&mut h, from, &bytes);
    // The same Allocate again (a STUN retransmission): no second request, no answer yet.
    assert!(matches!(h.client_raw(from, &bytes), Raw::Nothing));
    assert_eq!(h.server.pending_count(), 1);
    assert_eq!(
        h.relays.bound.len(),
        0,
        "nothing bound by the test's binder"
    );
    // Anything else on that 5-tuple meanwhile: 437 (there is no allocation yet).
    let nonce = h.nonce(from);
    for req in [
        Req::new(method::ALLOCATE).transport_udp(),
        Req::new(method::REFRESH),
        Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:53"),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:53"),
    ] {
        let method = req.method;
        match h.client_raw(from, &req.auth(&alice(), &nonce).bytes()) {
            Raw::Sent(s) => assert_eq!(decode(&s).code, Some(437), "method {method:#x}"),
            other => panic!("method {method:#x}: {other:?}"),
        }
    }
    // The answer answers the first Allocate; a later retransmission gets the same success.
    let relay = "203.0.113.10:50010";
    let first = decode(&h.answer(ok(r.id, relay)).expect("a response"));
    assert_eq!(first.class, Class::Success);
    let again = decode(&h.client(from, &bytes).expect("a response"));
    assert_eq!(again.class, Class::Success);
    assert_eq!(again.txid, first.txid);
    assert_eq!(again.addr(attr::XOR_RELAYED_ADDRESS), Some(addr(relay)));
    assert_eq!(h.server.allocation_count(), 1);
}

#[test]
fn a_client_that_vanishes_meanwhile_takes_its_allocate_and_its_quota_along() {
    let mut c = base_config();
    c.quotas.per_user = 1;
    let mut h = H::new(c);
    let from = ClientAddr {
        transport: Transport::Tcp,
        ..udp("192.0.2.7:40000")
    };
    let bytes = allocate_bytes(&mut h, from, &[(attr::EVEN_PORT, vec![0x80])]);
    let r = request(&mut h, from, &bytes);
    assert_eq!(r.ports, RelayPorts::EvenPair);
    h.server.close_client(h.now, &from);
    assert_eq!(h.server.pending_count(), 0);
    // The late answer finds nothing: no response, both sockets come back.
    let pair = (addr("203.0.113.10:50002"), Some(addr("203.0.113.10:50003")));
    let late = RelayBound {
        id: r.id,
        primary: Ok(pair),
        additional: None,
    };
    assert_eq!(h.answer(late), None);
    assert_eq!(h.relays.released, vec![pair.0, addr("203.0.113.10:50003")]);
    assert_eq!(h.server.allocation_count(), 0);
    assert_eq!(created(&h.events()), 0);
    // alice's quota (1) was freed with it.
    h.allocate(udp("192.0.2.7:40001"), &alice());
}

#[test]
fn a_drain_that_begins_meanwhile_refuses_the_allocate_and_releases_its_socket() {
    for (alternates, code) in [(vec![], 403), (vec![addr("198.51.100.99:3478")], 300)] {
        let mut h = H::new(base_config());
        let from = udp("192.0.2.7:40000");
        let bytes = allocate_bytes(&mut h, from, &[]);
        let r = request(&mut h, from, &bytes);
        h.server.set_drain(DrainMode::Refuse {
            alternates: alternates.clone(),
        });
        let relay = "203.0.113.10:50020";
        let resp = decode(&h.answer(ok(r.id, relay)).expect("a response"));
        assert_eq!(resp.code, Some(code));
        if code == 300 {
            let alt = decode_address(resp.get(attr::ALTERNATE_SERVER).unwrap(), &resp.txid, false);
            assert_eq!(alt, alternates.first().copied());
        }
        assert!(resp.get(attr::MESSAGE_INTEGRITY).is_some());
        assert_eq!(h.relays.released, vec![addr(relay)]);
        assert_eq!(h.server.allocation_count(), 0);
        let events = h.events();
        assert_eq!(created(&events), 0);
        assert!(events
            .iter()
            .any(|e| matches!(e, Event::AllocateRefusedDraining { .. })));
        assert_eq!(h.server.counters().refused_draining, 1);
    }
}

#[test]
fn a_waiting_allocate_counts_against_the_total_quota() {
    let mut c = base_config();
    c.quotas.total = 1;
    let mut h = H::new(c);
    let a = udp("192.0.2.7:40000");
    let bytes = allocate_bytes(&mut h, a, &[]);
    let r = request(&mut h, a, &bytes);
    let b = udp("192.0.2.8:40000");
    let refused = h.authed(b, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(refused.code, Some(486));
    // The waiting one fails: its place is free again.
    let failed = RelayBound {
        id: r.id,
        primary: Err(RelayError::NoPort),
        additional: None,
    };
    assert_eq!(
        decode(&h.answer(failed).expect("a response")).code,
        Some(508)
    );
    h.allocate(b, &alice());
}

#[test]
fn an_answer_that_never_comes_is_given_up_after_ten_seconds() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let bytes = allocate_bytes(&mut h, from, &[]);
    let r = request(&mut h, from, &bytes);
    let deadline = h
        .server
        .poll_timeout()
        .expect("a timer while an Allocate waits");
    assert!(deadline <= h.now + Duration::from_secs(10));
    h.advance(9);
    assert_eq!(h.server.pending_count(), 1);
    h.advance(1);
    assert_eq!(h.server.pending_count(), 0);
    // The answer after that, or one nobody asked for: its socket is released.
    assert_eq!(h.answer(ok(r.id, "203.0.113.10:50030")), None);
    assert_eq!(h.answer(ok(9999, "203.0.113.10:50031")), None);
    assert_eq!(
        h.relays.released,
        vec![addr("203.0.113.10:50030"), addr("203.0.113.10:50031")]
    );
    // The client's retransmission starts over.
    let fresh = allocate_bytes(&mut h, from, &[]);
    let again = request(&mut h, from, &fresh);
    assert_ne!(again.id, r.id);
}

#[test]
fn clear_forgets_waiting_allocates() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let bytes = allocate_bytes(&mut h, from, &[]);
    let r = request(&mut h, from, &bytes);
    h.server.clear();
    assert_eq!(h.server.pending_count(), 0);
    assert_eq!(h.answer(ok(r.id, "203.0.113.10:50040")), None);
    assert_eq!(h.relays.released, vec![addr("203.0.113.10:50040")]);
}

#[test]
fn a_reservation_token_needs_no_binding() {
    let mut h = H::new(base_config());
    let rtp = udp("192.0.2.7:40000");
    let bytes = allocate_bytes(&mut h, rtp, &[(attr::EVEN_PORT, vec![0x80])]);
    let r = request(&mut h, rtp, &bytes);
    let pair = (addr("203.0.113.10:50050"), Some(addr("203.0.113.10:50051")));
    let resp = h.answer(RelayBound {
        id: r.id,
        primary: Ok(pair),
        additional: None,
    });
    let resp = decode(&resp.expect("a response"));
    let token = resp.get(attr::RESERVATION_TOKEN).expect("a token").to_vec();
    let rtcp = udp("192.0.2.7:40001");
    let bytes = allocate_bytes(&mut h, rtcp, &[(attr::RESERVATION_TOKEN, token)]);
    match h.client_raw(rtcp, &bytes) {
        Raw::Sent(s) => {
            let resp = decode(&s);
            assert_eq!(resp.class, Class::Success);
            assert_eq!(
                resp.addr(attr::XOR_RELAYED_ADDRESS),
                Some(addr("203.0.113.10:50051"))
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.server.allocation_count(), 2);
}
