//! Binding (RFC 8489): XOR-MAPPED-ADDRESS and its size bound, `stun-only` and `no-stun`,
//! `secure-stun`.

use super::*;

#[test]
fn binding_returns_xor_mapped_address() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let req = Req::new(method::BINDING).fp();
    let r = decode(&h.client(from, &req.bytes()).unwrap());
    assert_eq!((r.class, r.method), (Class::Success, method::BINDING));
    assert_eq!(r.addr(attr::XOR_MAPPED_ADDRESS), Some(from.client));
    assert!(r.get(attr::FINGERPRINT).is_some());
    assert!(r.get(attr::SOFTWARE).is_none());
    // No FINGERPRINT in the response when the request had none.
    let r = decode(&h.client(from, &Req::new(method::BINDING).bytes()).unwrap());
    assert!(r.get(attr::FINGERPRINT).is_none());
    assert!(r.raw.len() <= 32);
}

#[test]
fn binding_for_ipv6_client_is_within_the_bound() {
    let mut h = H::new(base_config());
    let from = ClientAddr {
        transport: Transport::Udp,
        client: "[2001:db8:1::7]:40000".parse().unwrap(),
        local: "[2001:db8::1]:3478".parse().unwrap(),
    };
    let r = decode(
        &h.client(from, &Req::new(method::BINDING).fp().bytes())
            .unwrap(),
    );
    assert_eq!(r.addr(attr::XOR_MAPPED_ADDRESS), Some(from.client));
    assert_eq!(r.raw.len(), 52);
}

#[test]
fn stun_only_and_no_stun_leave_the_other_unanswered() {
    let binding = Req::new(method::BINDING).bytes();
    let allocate = Req::new(method::ALLOCATE).transport_udp().bytes();
    let from = udp("192.0.2.7:40000");
    for (service, binding_answered, allocate_answered) in [
        (Service::StunAndTurn, true, true),
        (Service::StunOnly, true, false),
        (Service::TurnOnly, false, true),
    ] {
        let mut c = base_config();
        c.service = service;
        let mut h = H::new(c);
        assert_eq!(
            h.client(from, &binding).is_some(),
            binding_answered,
            "{service:?}"
        );
        assert_eq!(
            h.client(from, &allocate).is_some(),
            allocate_answered,
            "{service:?}"
        );
    }
}

#[test]
fn secure_stun_asks_binding_for_credentials() {
    let mut c = base_config();
    c.secure_stun = true;
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    let r = decode(&h.client(from, &Req::new(method::BINDING).bytes()).unwrap());
    assert_eq!(r.code, Some(401));
    let r = h.authed(from, &alice(), Req::new(method::BINDING));
    assert_eq!(r.class, Class::Success);
    assert_eq!(r.addr(attr::XOR_MAPPED_ADDRESS), Some(from.client));
    assert!(r.get(attr::MESSAGE_INTEGRITY).is_some());
}
