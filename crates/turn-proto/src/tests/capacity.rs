//! Capacity refusals (486, 508): each says which limit it ran into ([`CapacityLimit`] on
//! [`Event::AllocateRefused`]), and the all-zero RESERVATION-TOKEN that coturn's uclient sends
//! after an Allocate error is read as coturn reads it: no token.

use super::*;

/// The limit of the one capacity refusal among the events.
fn refused(h: &mut H) -> (u16, CapacityLimit) {
    let mut found: Vec<(u16, CapacityLimit)> = h
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::AllocateRefused { code, limit, .. } => Some((code, limit)),
            _ => None,
        })
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.remove(0)
}

fn allocate_req() -> Req {
    Req::new(method::ALLOCATE).transport_udp()
}

#[test]
fn every_capacity_refusal_names_its_limit() {
    // user-quota.
    let mut c = base_config();
    c.quotas.per_user = 1;
    let mut h = H::new(c);
    h.allocate(udp("192.0.2.7:40000"), &alice());
    let r = h.authed(udp("192.0.2.7:40001"), &alice(), allocate_req());
    assert_eq!(r.code, Some(486));
    let (code, limit) = refused(&mut h);
    assert_eq!(
        (code, limit.clone()),
        (
            486,
            CapacityLimit::UserQuota {
                user: "alice".into(),
                quota: 1
            }
        )
    );
    assert_eq!(limit.to_string(), "user-quota: \"alice\" has 1 allocations");

    // total-quota.
    let mut c = base_config();
    c.quotas.total = 1;
    let mut h = H::new(c);
    h.allocate(udp("192.0.2.7:40000"), &alice());
    let bob = Creds::password("bob", "bobpass");
    assert_eq!(
        h.authed(udp("192.0.2.8:40000"), &bob, allocate_req()).code,
        Some(486)
    );
    assert_eq!(
        refused(&mut h),
        (486, CapacityLimit::TotalQuota { quota: 1 })
    );

    // bps-capacity.
    let mut c = base_config();
    c.bandwidth.max_bps = 1000;
    c.bandwidth.capacity = 1000;
    let mut h = H::new(c);
    h.allocate(udp("192.0.2.7:40000"), &alice());
    assert_eq!(
        h.authed(udp("192.0.2.7:40001"), &alice(), allocate_req())
            .code,
        Some(486)
    );
    assert_eq!(
        refused(&mut h),
        (486, CapacityLimit::Bandwidth { capacity: 1000 })
    );

    // The relay sockets: no port, an OS error, no even port.
    for (fail, even, want) in [
        (RelayError::NoPort, None, CapacityLimit::RelayPorts),
        (
            RelayError::Failed("Too many open files (os error 24)".into()),
            None,
            CapacityLimit::RelaySocket("Too many open files (os error 24)".into()),
        ),
        (RelayError::NoPort, Some(0x80), CapacityLimit::EvenPort),
    ] {
        let mut h = H::new(base_config());
        h.relays.fail = Some(fail);
        let mut req = allocate_req();
        if let Some(flags) = even {
            req = req.attr(attr::EVEN_PORT, vec![flags]);
        }
        assert_eq!(
            h.authed(udp("192.0.2.7:40000"), &alice(), req).code,
            Some(508)
        );
        assert_eq!(refused(&mut h), (508, want));
    }

    // An unknown RESERVATION-TOKEN (RFC 8656 §7.2: 508).
    let mut h = H::new(base_config());
    let req = allocate_req().attr(attr::RESERVATION_TOKEN, vec![1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(
        h.authed(udp("192.0.2.7:40000"), &alice(), req).code,
        Some(508)
    );
    assert_eq!(refused(&mut h), (508, CapacityLimit::Reservation));
}

/// coturn's uclient keeps one reservation token for all its clients and sets it to zero when
/// an Allocate fails (a 441 on a 5-tuple whose allocation another run left behind); the
/// next Allocate then carries RESERVATION-TOKEN 0. coturn reads 0 as no token and allocates;
/// so does lastcall-turn (before: 508, the one of the churn).
#[test]
fn an_all_zero_reservation_token_is_no_token_as_in_coturn() {
    let mut h = H::new(base_config());
    let req = allocate_req().attr(attr::RESERVATION_TOKEN, vec![0; 8]);
    let r = h.authed(udp("192.0.2.7:40000"), &alice(), req);
    assert_eq!(r.class, Class::Success, "{:?}", r.code);
    assert!(r.addr(attr::XOR_RELAYED_ADDRESS).is_some());
    assert!(r.get(attr::RESERVATION_TOKEN).is_none());
    // Its exclusions still hold: with EVEN-PORT it is a 400, as in coturn.
    let req = allocate_req()
        .attr(attr::RESERVATION_TOKEN, vec![0; 8])
        .attr(attr::EVEN_PORT, vec![0x80]);
    assert_eq!(
        h.authed(udp("192.0.2.7:40001"), &alice(), req).code,
        Some(400)
    );
    // And no token issued is all zeros.
    for i in 0..64u16 {
        let req = allocate_req().attr(attr::EVEN_PORT, vec![0x80]);
        let r = h.authed(udp(&format!("192.0.2.8:{}", 41000 + i)), &alice(), req);
        assert_eq!(r.class, Class::Success);
        assert_ne!(r.get(attr::RESERVATION_TOKEN), Some(&[0u8; 8][..]));
    }
}
