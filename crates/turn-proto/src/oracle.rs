//! Differential tests against an independent STUN implementation (`stun-rs`): requests it
//! encodes are accepted and verified by our codec and server, and what our server answers is
//! decoded and verified (MESSAGE-INTEGRITY with the long-term key, FINGERPRINT) by it.

use std::net::SocketAddr;

use proptest::prelude::*;
use stun_rs::attributes::stun::{
    ErrorCode, Fingerprint, MessageIntegrity, Nonce, Realm, UserName, XorMappedAddress,
};
use stun_rs::attributes::turn::{
    ChannelNumber, Data, LifeTime, RequestedTrasport, XorPeerAddress, XorRelayedAddress,
};
use stun_rs::{
    Algorithm, AlgorithmId, DecoderContextBuilder, HMACKey, MessageClass, MessageDecoderBuilder,
    MessageEncoderBuilder, StunMessage, StunMessageBuilder, TransactionId,
};

use crate::stun::{attr, long_term_key, Class, Message};
use crate::tests::{base_config, udp, Sent, H, REALM};
use crate::*;

fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn key(user: &str, pass: &str) -> HMACKey {
    HMACKey::new_long_term(user, REALM, pass, Algorithm::from(AlgorithmId::MD5)).unwrap()
}

fn encode(msg: &StunMessage) -> Vec<u8> {
    let mut buf = vec![0u8; 2048];
    let n = MessageEncoderBuilder::default()
        .build()
        .encode(&mut buf, msg)
        .unwrap();
    buf.truncate(n);
    buf
}

/// Decode with `stun-rs`, verifying MESSAGE-INTEGRITY (if `k`) and FINGERPRINT.
fn oracle_decode(bytes: &[u8], k: Option<HMACKey>) -> StunMessage {
    let mut ctx = DecoderContextBuilder::default().with_validation();
    if let Some(k) = k {
        ctx = ctx.with_key(k);
    }
    let decoder = MessageDecoderBuilder::default()
        .with_context(ctx.build())
        .build();
    let (msg, n) = decoder
        .decode(bytes)
        .expect("stun-rs decodes and validates it");
    assert_eq!(n, bytes.len());
    msg
}

/// An authenticated request encoded by stun-rs.
fn request(
    m: stun_rs::MessageMethod,
    user: &str,
    pass: &str,
    nonce: &str,
    extra: impl FnOnce(StunMessageBuilder) -> StunMessageBuilder,
    fingerprint: bool,
) -> Vec<u8> {
    let b = StunMessageBuilder::new(m, MessageClass::Request)
        .with_transaction_id(TransactionId::default());
    let mut b = extra(b)
        .with_attribute(UserName::new(user).unwrap())
        .with_attribute(Realm::new(REALM).unwrap())
        .with_attribute(Nonce::new(nonce).unwrap())
        .with_attribute(MessageIntegrity::new(key(user, pass)));
    if fingerprint {
        b = b.with_attribute(Fingerprint::default());
    }
    encode(&b.build())
}

fn nonce_of(h: &mut H, from: ClientAddr) -> String {
    String::from_utf8(h.nonce(from)).unwrap()
}

#[test]
fn stun_rs_requests_are_verified_by_our_codec() {
    let bytes = request(
        stun_rs::methods::ALLOCATE,
        "alice",
        "alicepass",
        "abcdefgh",
        |b| {
            b.with_attribute(RequestedTrasport::new(stun_rs::protocols::UDP))
                .with_attribute(LifeTime::new(1234))
        },
        true,
    );
    let m = Message::parse(&bytes).unwrap();
    let k = long_term_key("alice", REALM, "alicepass");
    let mi = m
        .attributes()
        .find(|a| a.typ == attr::MESSAGE_INTEGRITY)
        .unwrap();
    assert!(m.check_integrity_sha1(mi.offset, mi.value, &k));
    let fp = m.attributes().find(|a| a.typ == attr::FINGERPRINT).unwrap();
    assert!(m.check_fingerprint(fp.offset, fp.value));
    let lt = m.attributes().find(|a| a.typ == attr::LIFETIME).unwrap();
    assert_eq!(lt.value, 1234u32.to_be_bytes());
}

#[test]
fn full_session_encoded_by_stun_rs_decoded_by_stun_rs() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let k = key("alice", "alicepass");
    // Unauthenticated Allocate (stun-rs encoded): 401 that stun-rs decodes.
    let req = encode(
        &StunMessageBuilder::new(stun_rs::methods::ALLOCATE, MessageClass::Request)
            .with_attribute(RequestedTrasport::new(stun_rs::protocols::UDP))
            .with_attribute(Fingerprint::default())
            .build(),
    );
    let Some(Sent::Client(_, resp)) = h.client(from, &req) else {
        panic!("no challenge")
    };
    let msg = oracle_decode(&resp, None);
    let code = msg.get::<ErrorCode>().unwrap().as_error_code().unwrap();
    assert_eq!(code.error_code().error_code(), 401);
    let nonce = msg
        .get::<Nonce>()
        .unwrap()
        .as_nonce()
        .unwrap()
        .as_str()
        .to_string();
    // Authenticated Allocate: success verified by stun-rs with the long-term key.
    let req = request(
        stun_rs::methods::ALLOCATE,
        "alice",
        "alicepass",
        &nonce,
        |b| b.with_attribute(RequestedTrasport::new(stun_rs::protocols::UDP)),
        true,
    );
    let Some(Sent::Client(_, resp)) = h.client(from, &req) else {
        panic!("no allocate response")
    };
    let msg = oracle_decode(&resp, Some(k.clone()));
    assert_eq!(msg.class(), MessageClass::SuccessResponse);
    let relayed = *msg
        .get::<XorRelayedAddress>()
        .unwrap()
        .as_xor_relayed_address()
        .unwrap()
        .socket_address();
    let mapped = *msg
        .get::<XorMappedAddress>()
        .unwrap()
        .as_xor_mapped_address()
        .unwrap()
        .socket_address();
    assert_eq!(mapped, from.client);
    assert_eq!(relayed, h.relays.bound[0]);
    assert_eq!(
        msg.get::<LifeTime>()
            .unwrap()
            .as_life_time()
            .unwrap()
            .as_u32(),
        600
    );
    // ChannelBind encoded by stun-rs, verified success.
    let peer: SocketAddr = "8.8.8.8:5000".parse().unwrap();
    let req = request(
        stun_rs::methods::CHANNEL_BIND,
        "alice",
        "alicepass",
        &nonce,
        |b| {
            b.with_attribute(ChannelNumber::new(0x4001))
                .with_attribute(XorPeerAddress::from(peer))
        },
        false,
    );
    let Some(Sent::Client(_, resp)) = h.client(from, &req) else {
        panic!("no channel bind response")
    };
    assert_eq!(
        oracle_decode(&resp, Some(k.clone())).class(),
        MessageClass::SuccessResponse
    );
    // A Send indication encoded by stun-rs goes to the peer; a Data indication from us
    // decodes in stun-rs.
    let send = encode(
        &StunMessageBuilder::new(stun_rs::methods::SEND, MessageClass::Indication)
            .with_attribute(XorPeerAddress::from(peer))
            .with_attribute(Data::new(b"hello"))
            .build(),
    );
    assert_eq!(
        h.client(from, &send),
        Some(Sent::Peer(relayed, peer, b"hello".to_vec()))
    );
    let other_port: SocketAddr = "8.8.8.8:6000".parse().unwrap();
    let Some(Sent::Client(_, ind)) = h.peer(relayed, other_port, b"world") else {
        panic!("no data indication")
    };
    let msg = oracle_decode(&ind, None);
    assert_eq!(msg.class(), MessageClass::Indication);
    assert_eq!(msg.method(), stun_rs::methods::DATA);
    let d = msg.get::<Data>().unwrap().as_data().unwrap();
    assert_eq!(d.as_bytes(), b"world");
    let p = *msg
        .get::<XorPeerAddress>()
        .unwrap()
        .as_xor_peer_address()
        .unwrap()
        .socket_address();
    assert_eq!(p, other_port);
    // An error (403) after authentication is integrity-protected too.
    let req = request(
        stun_rs::methods::CREATE_PERMMISSION,
        "alice",
        "alicepass",
        &nonce,
        |b| {
            b.with_attribute(XorPeerAddress::from(
                "10.0.0.1:1".parse::<SocketAddr>().unwrap(),
            ))
        },
        true,
    );
    let Some(Sent::Client(_, resp)) = h.client(from, &req) else {
        panic!("no create permission response")
    };
    let msg = oracle_decode(&resp, Some(k));
    let code = msg.get::<ErrorCode>().unwrap().as_error_code().unwrap();
    assert_eq!(code.error_code().error_code(), 403);
}

proptest! {
    #![proptest_config(cfg())]

    /// Random peers, lifetimes and channel numbers in stun-rs-encoded requests: our server
    /// verifies them, and stun-rs verifies every answer.
    #[test]
    fn random_requests_round_trip(
        peer_v4 in any::<[u8; 4]>(),
        port in 1u16..,
        lifetime in any::<u32>(),
        channel in 0x4000u16..0x8000,
        fingerprint in any::<bool>(),
        m in 0usize..4,
    ) {
        let mut h = H::new(base_config());
        let from = udp("192.0.2.7:40000");
        let nonce = nonce_of(&mut h, from);
        h.allocate(from, &crate::tests::alice());
        let peer = SocketAddr::new(std::net::IpAddr::from(peer_v4), port);
        let allowed = h.server.config().peer_policy.is_allowed(peer.ip());
        let (method, expect_ok) = match m {
            0 => (stun_rs::methods::REFRESH, true),
            1 => (stun_rs::methods::CREATE_PERMMISSION, allowed),
            2 => (stun_rs::methods::CHANNEL_BIND, allowed),
            _ => (stun_rs::methods::ALLOCATE, false), // 437: allocation exists
        };
        let bytes = request(method, "alice", "alicepass", &nonce, |b| match m {
            0 => b.with_attribute(LifeTime::new(lifetime)),
            1 => b.with_attribute(XorPeerAddress::from(peer)),
            2 => b.with_attribute(ChannelNumber::new(channel)).with_attribute(XorPeerAddress::from(peer)),
            _ => b.with_attribute(RequestedTrasport::new(stun_rs::protocols::UDP)),
        }, fingerprint);
        let Some(Sent::Client(_, resp)) = h.client(from, &bytes) else {
            return Err(TestCaseError::fail("no response"));
        };
        let msg = oracle_decode(&resp, Some(key("alice", "alicepass")));
        prop_assert_eq!(msg.class() == MessageClass::SuccessResponse, expect_ok);
        let ours = Message::parse(&resp).unwrap();
        prop_assert_eq!(ours.class() == Class::Success, expect_ok);
        if m == 0 && lifetime != 0 {
            let lt = ours.attributes().find(|a| a.typ == attr::LIFETIME).unwrap();
            let lt = u32::from_be_bytes(lt.value.try_into().unwrap());
            prop_assert!((600..=3600).contains(&lt));
        }
    }
}
