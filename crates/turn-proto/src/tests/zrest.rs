//! Wire's `zrest` credentials (wireapp/coturn's `--zrest`, issued by Wire's backend, brig):
//! the username's shape, the HMAC-SHA512 password, expiry (never for `sft-`), every secret
//! tried in order, no fallback to other schemes, and the 401 with which the fork refuses.

use super::*;
use crate::auth::zrest_password;
use crate::config::RestScheme;
use crate::ZrestName;

/// The issue's vectors (computed independently): secret, realm, username, password, key.
const VECTORS: [(&str, &str, &str); 2] = [
    (
        "d=1700000000.v=1.k=0.t=s.r=abc123",
        "xZlaQ02YJWQ/fknllVaxZCFbhvGdM3tbaVnuar4T67z4SFPabX5ABj7dba/PzAYtuW9jmoxcspJBv/tccHTiVA==",
        "33fdddf3f655205b6f8e579027e64732",
    ),
    (
        "sft-d=1700000000.v=1.k=0.t=s.r=abc123",
        "JYrnjMi1+TdOftExDYKs5EiIohYdgWwfHTT8PRFDbKAChO3X8DHlsRV1SOUJECyTL3msxlKf5Igfja2ARkNcWg==",
        "2cd4bc3e05fd48fd127c510f37d62952",
    ),
];
const VECTOR_SECRET: &[u8] = b"Wire-TURN-secret-example";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn zrest_config(secrets: &[&[u8]]) -> ServerConfig {
    let mut c = base_config();
    c.auth.rest_scheme = RestScheme::Zrest;
    c.auth.rest_secrets = secrets.iter().map(|s| s.to_vec()).collect();
    c
}

/// brig's credentials for `name` with `secret`.
fn brig(secret: &[u8], name: &str) -> Creds {
    Creds::password(name, &zrest_password(secret, name))
}

fn name(expiry: u64, sft: bool) -> String {
    let prefix = if sft { "sft-" } else { "" };
    format!("{prefix}d={expiry}.v=1.k=0.t=s.r=bwnyqvzygtvuprnypsbylimxakrk")
}

#[test]
fn the_issues_vectors() {
    for (user, password, key) in VECTORS {
        assert_eq!(zrest_password(VECTOR_SECRET, user), password, "{user}");
        assert_eq!(
            hex(&long_term_key(user, "dummy.io", password)),
            key,
            "{user}"
        );
    }
}

#[test]
fn usernames_of_the_forks_shape_and_no_other() {
    let ok = |s: &str| ZrestName::parse(s);
    assert_eq!(
        ok("d=1700000000.v=1.k=7.t=s.r=abc123"),
        Some(ZrestName {
            expiry: 1_700_000_000,
            key_index: 7,
            sft: false
        })
    );
    assert_eq!(ok("sft-d=1.v=1.k=0.t=s.r=").map(|n| n.sft), Some(true));
    // The fork reads numbers with strtoul: leading zeros are fine, more than 2^32-1 is not.
    assert_eq!(
        ok("d=0004294967295.v=1.k=4294967295.t=s.r=a-_Z9").map(|n| n.expiry),
        Some(u32::MAX)
    );
    for bad in [
        "",
        "alice",
        "1700000000:alice",
        "d=4294967296.v=1.k=0.t=s.r=abc",
        "d=1.v=1.k=4294967296.t=s.r=abc",
        "d=.v=1.k=0.t=s.r=abc",
        "d=1.v=1.k=.t=s.r=abc",
        "d=-1.v=1.k=0.t=s.r=abc",
        "d=1.v=2.k=0.t=s.r=abc",
        "d=1.v=1.k=0.t=x.r=abc",
        "d=1.v=1.k=0.t=s.r=abc.def",
        "d=1.v=1.k=0.t=s.r=abc def",
        "d=1.v=1.k=0.t=s.r=abc\0",
        "d=1.v=1.k=0.t=s",
        "SFT-d=1.v=1.k=0.t=s.r=abc",
        "sft-sft-d=1.v=1.k=0.t=s.r=abc",
        " d=1.v=1.k=0.t=s.r=abc",
        "d=1.v=1.k=0.t=s.r=abc\n",
        "d=１.v=1.k=0.t=s.r=abc",
    ] {
        assert_eq!(ok(bad), None, "{bad:?}");
    }
    let n = ok("d=100.v=1.k=0.t=s.r=").unwrap();
    assert!(!n.expired(99));
    assert!(n.expired(100), "now >= d is refused");
    let sft = ok("sft-d=100.v=1.k=0.t=s.r=").unwrap();
    assert!(!sft.expired(u64::MAX));
}

/// One row: what the server answers an Allocate with these credentials, and the failure it
/// records.
struct Row {
    what: &'static str,
    creds: Creds,
    code: Option<u16>,
    reason: Option<AuthFailure>,
}

#[test]
fn allocations_with_zrest_credentials() {
    let mut h = H::new(zrest_config(&[b"first", b"second"]));
    let now = h.unix_now();
    let later = now + 3600;
    let rows = [
        Row {
            what: "valid, first secret",
            creds: brig(b"first", &name(later, false)),
            code: None,
            reason: None,
        },
        Row {
            what: "valid, second secret (every secret is tried in order)",
            creds: brig(b"second", &name(later, false)),
            code: None,
            reason: None,
        },
        Row {
            what: "sft- past its d: never expires",
            creds: brig(b"first", &name(now - 86_400, true)),
            code: None,
            reason: None,
        },
        Row {
            what: "the issue's sft- vector (d in 2023)",
            creds: brig(b"first", VECTORS[1].0),
            code: None,
            reason: None,
        },
        Row {
            what: "expired: now == d",
            creds: brig(b"first", &name(now, false)),
            code: Some(401),
            reason: Some(AuthFailure::Expired),
        },
        Row {
            what: "the issue's expired vector",
            creds: brig(b"first", VECTORS[0].0),
            code: Some(401),
            reason: Some(AuthFailure::Expired),
        },
        Row {
            what: "a secret not configured",
            creds: brig(b"other", &name(later, false)),
            code: Some(401),
            reason: Some(AuthFailure::BadIntegrity),
        },
        Row {
            what: "coturn's REST password (HMAC-SHA1) for a zrest name",
            creds: {
                let n = name(later, false);
                Creds::password(&n, &rest_password(b"first", &n))
            },
            code: Some(401),
            reason: Some(AuthFailure::BadIntegrity),
        },
        Row {
            what: "a TURN REST API username: no fallback",
            creds: Creds::rest(b"first", later, "u"),
            code: Some(401),
            reason: Some(AuthFailure::UnknownUser),
        },
        Row {
            what: "a static user: no fallback",
            creds: alice(),
            code: Some(401),
            reason: Some(AuthFailure::UnknownUser),
        },
        Row {
            what: "bad shape (v=2)",
            creds: brig(b"first", &format!("d={later}.v=2.k=0.t=s.r=abc")),
            code: Some(401),
            reason: Some(AuthFailure::UnknownUser),
        },
    ];
    for (i, row) in rows.iter().enumerate() {
        h.events();
        let failures = h.server.counters().auth_failures;
        let from = udp(&format!("192.0.2.7:{}", 40_000 + i));
        let r = h.authed(from, &row.creds, Req::new(method::ALLOCATE).transport_udp());
        assert_eq!(r.code, row.code, "{}", row.what);
        let reasons: Vec<AuthFailure> = h
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::AuthFailed { reason, .. } => Some(reason),
                _ => None,
            })
            .collect();
        assert_eq!(
            reasons,
            row.reason.into_iter().collect::<Vec<_>>(),
            "{}",
            row.what
        );
        let counted = h.server.counters().auth_failures - failures;
        assert_eq!(counted, u64::from(row.reason.is_some()), "{}", row.what);
        if row.code.is_none() {
            assert_eq!(r.class, Class::Success, "{}", row.what);
            assert!(r.get(attr::XOR_RELAYED_ADDRESS).is_some(), "{}", row.what);
        }
    }
}

#[test]
fn an_allocation_outlives_its_credential_as_in_the_fork() {
    let mut h = H::new(zrest_config(&[b"first"]));
    let from = udp("192.0.2.7:40000");
    let c = brig(b"first", &name(h.unix_now() + 60, false));
    let r = h.authed(
        from,
        &c,
        Req::new(method::ALLOCATE).transport_udp().lifetime(3600),
    );
    assert_eq!(r.class, Class::Success);
    assert_eq!(r.lifetime(), Some(3600), "not capped at d");
    h.advance(120);
    // Past d: the allocation's own requests still verify with its key.
    let r = h.authed(from, &c, Req::new(method::REFRESH).lifetime(600));
    assert_eq!(r.class, Class::Success, "{:?}", r.code);
    // A new allocation with it is refused.
    let r = h.authed(
        udp("192.0.2.7:40001"),
        &c,
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
}

#[test]
fn without_a_secret_nobody_gets_in() {
    let mut h = H::new(zrest_config(&[]));
    let r = h.authed(
        udp("192.0.2.7:40000"),
        &brig(b"", &name(h.unix_now() + 60, false)),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
}
