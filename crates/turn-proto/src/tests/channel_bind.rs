//! ChannelBind (RFC 8656 §11): numbers, one peer per channel and one channel per peer,
//! rebinding.

use super::*;

#[test]
fn channel_rules_400() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    h.allocate(from, &alice());
    for bad in [0x0000, 0x3FFF, 0x8000, 0xFFFF] {
        let r = h.authed(
            from,
            &alice(),
            Req::new(method::CHANNEL_BIND)
                .channel(bad)
                .peer("8.8.8.8:1"),
        );
        assert_eq!(r.code, Some(400), "channel {bad:#x}");
    }
    for (i, ok) in [0x4000, 0x4FFF, 0x5000, 0x7FFF].into_iter().enumerate() {
        let peer = format!("8.8.8.{i}:1");
        let r = h.authed(
            from,
            &alice(),
            Req::new(method::CHANNEL_BIND).channel(ok).peer(&peer),
        );
        assert_eq!(r.class, Class::Success, "channel {ok:#x}");
    }
    // The same peer on a second channel: 400.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.0:1"),
    );
    assert_eq!(r.code, Some(400));
    // A bound channel to another peer: 400.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4000)
            .peer("8.8.4.4:1"),
    );
    assert_eq!(r.code, Some(400));
    // Rebinding the same pair refreshes it.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4000)
            .peer("8.8.8.0:1"),
    );
    assert_eq!(r.class, Class::Success);
    // Missing attributes, two peers: 400.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND).channel(0x4002),
    );
    assert_eq!(r.code, Some(400));
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4002)
            .peer("8.8.4.4:1")
            .peer("8.8.4.5:1"),
    );
    assert_eq!(r.code, Some(400));
    // CreatePermission without a peer: 400.
    let r = h.authed(from, &alice(), Req::new(method::CREATE_PERMISSION));
    assert_eq!(r.code, Some(400));
}
