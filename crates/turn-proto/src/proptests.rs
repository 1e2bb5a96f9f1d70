//! Property tests on every decoder that reads peer bytes (bounded: run in CI with the unit
//! tests). Properties: no panic, and no response larger than its request except the two
//! documented exemptions (Binding success, 401/438 challenge), each within its fixed bound.

use std::net::SocketAddr;

use proptest::prelude::*;

use crate::frame::{parse_channel_data, stream_frame_len};
use crate::stun::{attr, decode_address, method, pad4, Builder, Class, Message};
use crate::tests::{alice, base_config, udp, Creds, Req, H, REALM};
use crate::*;

const CASES: u32 = 2000;

fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Largest exempt answers.
fn binding_bound() -> usize {
    20 + 24 + 8
}
fn challenge_bound() -> usize {
    20 + 8 + 4 + pad4(REALM.len()) + 4 + NONCE_LEN + 8
}

/// The no-amplification property for one client input and what the server produced.
fn check_size(req: &[u8], t: Option<Transmit<'_>>) -> Result<(), TestCaseError> {
    match t {
        None => Ok(()),
        Some(Transmit::Peer { data, .. }) => {
            prop_assert!(data.len() <= req.len());
            Ok(())
        }
        Some(Transmit::Client { data, .. }) => {
            let m = Message::parse(data)
                .map_err(|e| TestCaseError::fail(format!("bad response {e}")))?;
            let code = m
                .attributes()
                .find(|a| a.typ == attr::ERROR_CODE)
                .and_then(|a| {
                    Some(u16::from(*a.value.get(2)?) * 100 + u16::from(*a.value.get(3)?))
                });
            let bound = match (m.class(), m.method(), code) {
                (Class::Success, method::BINDING, _) => binding_bound().max(req.len()),
                (Class::Error, _, Some(401 | 438)) => challenge_bound().max(req.len()),
                _ => req.len(),
            };
            prop_assert!(
                data.len() <= bound,
                "response {} bytes > bound {} for request {:?}",
                data.len(),
                bound,
                req
            );
            Ok(())
        }
    }
}

/// A server with one allocation, a permission and a channel for 8.8.8.8:5000.
fn primed() -> (H, ClientAddr, SocketAddr) {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let relay = h.allocate(from, &alice());
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    assert_eq!(r.class, Class::Success);
    (h, from, relay)
}

fn attr_type() -> impl Strategy<Value = u16> {
    prop_oneof![
        Just(attr::USERNAME),
        Just(attr::MESSAGE_INTEGRITY),
        Just(attr::MESSAGE_INTEGRITY_SHA256),
        Just(attr::FINGERPRINT),
        Just(attr::REALM),
        Just(attr::NONCE),
        Just(attr::LIFETIME),
        Just(attr::REQUESTED_TRANSPORT),
        Just(attr::REQUESTED_ADDRESS_FAMILY),
        Just(attr::ADDITIONAL_ADDRESS_FAMILY),
        Just(attr::CHANNEL_NUMBER),
        Just(attr::XOR_PEER_ADDRESS),
        Just(attr::DATA),
        Just(attr::EVEN_PORT),
        Just(attr::DONT_FRAGMENT),
        Just(attr::SOFTWARE),
        any::<u16>(),
    ]
}

fn method_strategy() -> impl Strategy<Value = u16> {
    prop_oneof![
        Just(method::BINDING),
        Just(method::ALLOCATE),
        Just(method::REFRESH),
        Just(method::SEND),
        Just(method::DATA),
        Just(method::CREATE_PERMISSION),
        Just(method::CHANNEL_BIND),
        0u16..0x1000,
    ]
}

fn class_strategy() -> impl Strategy<Value = Class> {
    prop_oneof![
        3 => Just(Class::Request),
        1 => Just(Class::Indication),
        1 => Just(Class::Success),
        1 => Just(Class::Error),
    ]
}

/// A well-formed STUN message with arbitrary attributes, then optionally one corruption
/// (a byte flipped, or cut short / extended).
fn stun_like() -> impl Strategy<Value = Vec<u8>> {
    (
        method_strategy(),
        class_strategy(),
        any::<[u8; 12]>(),
        prop::collection::vec(
            (attr_type(), prop::collection::vec(any::<u8>(), 0..40)),
            0..8,
        ),
        any::<bool>(),
        prop::option::of((any::<prop::sample::Index>(), any::<u8>())),
        prop::option::of(0usize..300),
    )
        .prop_map(|(m, c, txid, attrs, fp, flip, cut)| {
            let mut buf = Vec::new();
            let mut b = Builder::new(&mut buf, m, c, txid);
            for (t, v) in &attrs {
                b.attr(*t, v);
            }
            if fp {
                b.fingerprint();
            }
            if let Some((i, x)) = flip {
                let i = i.index(buf.len());
                buf[i] ^= x;
            }
            if let Some(n) = cut {
                buf.resize(n, 0);
            }
            buf
        })
}

proptest! {
    #![proptest_config(cfg())]

    /// A USERNAME is peer bytes: zrest's reading of it never panics, and reads back exactly
    /// the names brig makes (any d and k up to 2^32-1, leading zeros, any `r` of its set).
    #[test]
    fn zrest_names_parse_or_refuse_without_panic(
        any_name in ".{0,80}",
        d in any::<u32>(),
        k in any::<u32>(),
        zeros in 0usize..4,
        sft in any::<bool>(),
        r in "[-_a-zA-Z0-9]{0,40}",
    ) {
        let _ = ZrestName::parse(&any_name);
        let prefix = if sft { "sft-" } else { "" };
        let pad = "0".repeat(zeros);
        let name = format!("{prefix}d={pad}{d}.v=1.k={k}.t=s.r={r}");
        prop_assert_eq!(
            ZrestName::parse(&name),
            Some(ZrestName { expiry: d, key_index: k, sft })
        );
        let too_big = format!("d={}.v=1.k={k}.t=s.r={r}", u64::from(d) + (1 << 32));
        prop_assert_eq!(ZrestName::parse(&too_big), None);
    }

    #[test]
    fn stun_parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(m) = Message::parse(&bytes) {
            let txid = m.transaction_id();
            let mut total = 20;
            for a in m.attributes() {
                total += 4 + pad4(a.value.len());
                let _ = decode_address(a.value, &txid, true);
                let _ = decode_address(a.value, &txid, false);
                let _ = m.check_fingerprint(a.offset, a.value);
                let _ = m.check_integrity_sha1(a.offset, a.value, b"k");
                let _ = m.check_integrity_sha256(a.offset, a.value, b"k");
            }
            prop_assert_eq!(total, bytes.len());
        }
    }

    #[test]
    fn stun_like_parse_never_panics(bytes in stun_like()) {
        if let Ok(m) = Message::parse(&bytes) {
            prop_assert!(m.attributes().count() <= bytes.len() / 4);
        }
    }

    #[test]
    fn stream_framing_is_consistent(bytes in prop::collection::vec(any::<u8>(), 0..120)) {
        match stream_frame_len(&bytes) {
            Ok(Some(n)) => {
                prop_assert!(n >= 4 && n <= bytes.len());
                prop_assert_eq!(stream_frame_len(&bytes[..n]), Ok(Some(n)));
                // Every strict prefix needs more bytes (never "invalid").
                for k in 0..n {
                    prop_assert_eq!(stream_frame_len(&bytes[..k]), Ok(None));
                }
            }
            Ok(None) => {}
            Err(_) => {
                // An error is final: more bytes do not repair it.
                let mut more = bytes.clone();
                more.extend_from_slice(&[0u8; 64]);
                prop_assert!(stream_frame_len(&more).is_err());
            }
        }
    }

    #[test]
    fn stream_framing_of_stun_like(bytes in stun_like()) {
        if let Ok(Some(n)) = stream_frame_len(&bytes) {
            prop_assert!(n <= bytes.len());
        }
    }

    #[test]
    fn channel_data_parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..80)) {
        if let Some((ch, data)) = parse_channel_data(&bytes) {
            // 0x4000..=0x7FFF, as coturn and its uclient use them (RFC 8656 keeps 0x5000-0x7FFF
            // reserved; `frame::channel_in_range`).
            prop_assert!((0x4000..=0x7FFF).contains(&ch));
            prop_assert!(data.len() + 4 <= bytes.len());
        }
    }

    #[test]
    fn handle_client_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200), first in 0u8..4) {
        let (mut h, from, _) = primed();
        let mut bytes = bytes;
        if let Some(b) = bytes.first_mut() {
            *b = (*b & 0x3f) | (first << 6);
        }
        h.with_client(from, &bytes, |t| check_size(&bytes, t))?;
    }

    #[test]
    fn handle_client_stun_like(bytes in stun_like(), tcp in any::<bool>()) {
        let (mut h, mut from, _) = primed();
        if tcp {
            from.transport = Transport::Tcp;
        }
        h.with_client(from, &bytes, |t| check_size(&bytes, t))?;
        let _ = h.server.poll_timeout();
    }

    #[test]
    fn handle_client_authenticated_random_attributes(
        m in method_strategy(),
        attrs in prop::collection::vec((attr_type(), prop::collection::vec(any::<u8>(), 0..24)), 0..6),
        fresh in any::<bool>(),
    ) {
        // Authenticated requests with arbitrary attributes reach every handler: no panic,
        // and the response (if any) is a valid STUN message.
        let (mut h, from0, _) = primed();
        let from = if fresh { udp("192.0.2.7:40009") } else { from0 };
        let nonce = h.nonce(from);
        let mut req = Req::new(m);
        for (t, v) in attrs {
            if t != attr::MESSAGE_INTEGRITY && t != attr::MESSAGE_INTEGRITY_SHA256 && t != attr::FINGERPRINT {
                req = req.attr(t, v);
            }
        }
        let bytes = req.auth(&alice(), &nonce).bytes();
        let valid = h.with_client(from, &bytes, |t| match t {
            Some(Transmit::Client { data, .. }) => Message::parse(data).is_ok(),
            _ => true,
        });
        prop_assert!(valid);
        h.advance(700);
        prop_assert!(h.server.allocation_count() <= 2);
    }

    #[test]
    fn handle_peer_any_payload(data in prop::collection::vec(any::<u8>(), 0..1500), bound in any::<bool>()) {
        let (mut h, from, relay) = primed();
        let peer: SocketAddr = if bound { "8.8.8.8:5000" } else { "8.8.8.8:5001" }.parse().unwrap();
        match h.server.handle_peer(h.now, relay, peer, &data, &mut h.out) {
            Some(Transmit::Client { to, data: out }) => {
                prop_assert_eq!(to, from);
                if bound {
                    prop_assert_eq!(parse_channel_data(out), Some((0x4001, &data[..])));
                } else {
                    let m = Message::parse(out).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let d = m.attributes().find(|a| a.typ == attr::DATA).map(|a| a.value);
                    prop_assert_eq!(d, Some(&data[..]));
                }
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn rest_usernames_never_panic(name in "\\PC{0,40}", sep in prop::sample::select(vec![':', '-', '@'])) {
        let _ = rest_expiry(&name, sep);
        let c = Creds::password(&name, "x");
        let mut h = H::new(base_config());
        let r = h.authed(udp("192.0.2.7:1"), &c, Req::new(method::ALLOCATE).transport_udp());
        prop_assert!(r.code.is_some());
    }
}
