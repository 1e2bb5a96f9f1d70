//! No amplification, whatever the method: the size guard on unauthenticated answers, the
//! per-source budget of the two exempt answers, reason phrases and SOFTWARE only where they
//! cannot grow an unauthenticated answer.

use super::*;

/// coturn's `unauthorized-ratelimit`, on by default: at most `unauthorized_rps` challenges
/// (and Binding successes) larger than their request to one source IP per second over UDP;
/// other sources, TCP, and authenticated requests are not limited, and the next second
/// gets a fresh budget.
#[test]
fn amplifying_unauthenticated_answers_are_rate_limited_per_source_ip() {
    let mut cfg = base_config();
    cfg.unauthorized_rps = 5;
    let mut h = H::new(cfg);
    let victim = udp("192.0.2.7:40000");
    let req = Req::new(method::ALLOCATE).transport_udp().bytes();
    let binding = Req::new(method::BINDING).bytes();
    let answered = |h: &mut H, from, bytes: &[u8], n| {
        (0..n).filter(|_| h.client(from, bytes).is_some()).count()
    };
    let nonce = h.nonce(victim);
    assert_eq!(answered(&mut h, victim, &req, 3), 3);
    // Another port of the same IP shares its budget; Binding counts too.
    assert_eq!(answered(&mut h, udp("192.0.2.7:40001"), &binding, 3), 1);
    assert_eq!(answered(&mut h, victim, &req, 10), 0);
    assert_eq!(h.server.counters().ratelimited_responses, 12);
    // Another source, a TCP client, an authenticated request: answered.
    assert_eq!(answered(&mut h, udp("192.0.2.8:40000"), &req, 5), 5);
    let tcp = ClientAddr {
        transport: Transport::Tcp,
        ..victim
    };
    assert_eq!(answered(&mut h, tcp, &req, 20), 20);
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let r = decode(&h.client(victim, &bytes).expect("an authenticated answer"));
    assert_eq!(r.class, Class::Success);
    h.advance(1);
    assert_eq!(answered(&mut h, victim, &req, 10), 5);
    // 0: no limit.
    let mut cfg = base_config();
    cfg.unauthorized_rps = 0;
    let mut h = H::new(cfg);
    assert_eq!(answered(&mut h, victim, &req, 500), 500);
}

#[test]
fn software_only_on_authenticated_responses() {
    let mut c = base_config();
    c.software = Some("lastcall-turn".into());
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    let r = decode(
        &h.client(from, &Req::new(method::ALLOCATE).transport_udp().bytes())
            .unwrap(),
    );
    assert!(r.get(attr::SOFTWARE).is_none());
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.get(attr::SOFTWARE), Some(&b"lastcall-turn"[..]));
}

#[test]
fn garbage_and_small_requests_never_amplify() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0xff; 100],
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        // Unknown method request, 20 bytes: a 400 would be 28 bytes, so it is dropped.
        Req::new(0x0fff).bytes(),
        // A Refresh without credentials: the 401 challenge applies only to TURN methods and
        // is exempt, but an indication never gets an answer.
        Req::indication(method::ALLOCATE).bytes(),
        // Response classes are ignored.
        {
            let mut b = Vec::new();
            Builder::new(&mut b, method::BINDING, Class::Success, [1; 12]);
            b
        },
    ];
    for c in &cases {
        if let Some(Sent::Client(_, resp)) = h.client(from, c) {
            assert!(resp.len() <= c.len(), "{c:?} -> {resp:?}");
        }
    }
    // Truncated attribute / length past the end / odd alignment / bad FINGERPRINT: dropped.
    let good = Req::new(method::ALLOCATE)
        .transport_udp()
        .attr(attr::SOFTWARE, b"abc".to_vec())
        .fp()
        .bytes();
    let mut past_end = good.clone();
    past_end[23] = 200;
    let mut odd = good.clone();
    odd[3] = odd[3].wrapping_sub(1);
    odd.pop();
    let mut bad_fp = good.clone();
    let l = bad_fp.len();
    bad_fp[l - 1] ^= 1;
    for c in [
        &good[..good.len() - 4],
        &past_end[..],
        &odd[..],
        &bad_fp[..],
    ] {
        assert_eq!(h.client(from, c), None);
    }
    assert!(h.server.counters().malformed >= 4);
    assert!(h.server.counters().suppressed_responses >= 1);
}

/// The exact first Allocate `turnutils_uclient` 4.6.1 sends (captured on loopback): 60 bytes
/// with LIFETIME, EVEN-PORT (R), REQUESTED-ADDRESS-FAMILY and FINGERPRINT.
#[test]
fn uclient_first_allocate_gets_a_bounded_challenge() {
    let hex = "000300282112a44215f4acef6ab70e6eff93b4f90019000411000000000d0004000003090018000180000000001700040100000080280004f5b91eca";
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let mut h = H::new(base_config());
    let r = decode(&h.client(udp("127.0.0.1:5555"), &bytes).unwrap());
    assert_eq!(r.code, Some(401));
    assert!(r.get(attr::FINGERPRINT).is_some());
    // The challenge is the documented exception to "never larger than the request": it
    // carries REALM and NONCE, which no client can do without. Exactly 20 + 8 (ERROR-CODE)
    // + 16 (REALM "example.org") + 20 (NONCE) + 8 (FINGERPRINT) = 72 bytes for this 60-byte
    // request: 1.2x, bounded by 64 + realm length whatever the request.
    assert_eq!(r.raw.len(), 72);
    assert!(r.raw.len() <= 64 + REALM.len() + 8);
}

/// A response to an authenticated request may be larger than the request (here a dual
/// allocation for an IPv6 client with a one-letter user): it is sent, not suppressed.
#[test]
fn authenticated_responses_are_not_size_limited() {
    let mut c = base_config();
    c.auth.add_coturn_user("u:p").unwrap();
    let mut h = H::new(c);
    let from = ClientAddr {
        transport: Transport::Udp,
        client: "[2001:db8:1::7]:40000".parse().unwrap(),
        local: "[2001:db8::1]:3478".parse().unwrap(),
    };
    let nonce = h.nonce(from);
    let req = Req::new(method::ALLOCATE)
        .transport_udp()
        .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![2, 0, 0, 0])
        .auth(&Creds::password("u", "p"), &nonce)
        .bytes();
    let r = decode(&h.client(from, &req).expect("the success is sent"));
    assert_eq!(r.class, Class::Success);
    assert!(r.raw.len() > req.len(), "{} <= {}", r.raw.len(), req.len());
    assert_eq!(h.server.counters().suppressed_responses, 0);
}

#[test]
fn include_reason_string_adds_the_phrase_but_never_grows_an_unauthenticated_answer() {
    let mut c = base_config();
    c.reason_phrases = true;
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    // Authenticated error: the phrase is there.
    h.allocate(from, &alice());
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(437));
    let ec = r.get(attr::ERROR_CODE).unwrap();
    assert_eq!(&ec[4..], b"Allocation Mismatch");
    // A small unauthenticated request: no phrase (the answer stays within its size).
    let small = Req::new(method::ALLOCATE).transport_udp().bytes();
    let s = h.client(udp("192.0.2.9:1"), &small).unwrap();
    let r = decode(&s);
    assert_eq!(r.code, Some(401));
    assert_eq!(r.get(attr::ERROR_CODE).unwrap().len(), 4);
    // Without the option: never a phrase.
    let mut h = H::new(base_config());
    assert!(!h.server.config().reason_phrases);
    h.allocate(from, &alice());
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.get(attr::ERROR_CODE).unwrap().len(), 4);
}
