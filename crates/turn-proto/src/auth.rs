//! Long-term credentials, TURN REST API passwords and stateless nonces.

use std::net::IpAddr;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use hmac::{Hmac, Mac};

use crate::config::{AuthConfig, RestScheme, UserKey};
use crate::stun::long_term_key;

/// Length of a nonce in bytes (16 base64url characters).
pub const NONCE_LEN: usize = 16;

/// The TURN REST API password for `username`: base64(HMAC-SHA1(secret, username)), as
/// coturn's `use-auth-secret` expects (and as clients' credential services compute it).
pub fn rest_password(secret: &[u8], username: &str) -> String {
    let tag = match Hmac::<sha1::Sha1>::new_from_slice(secret) {
        Ok(mut m) => {
            m.update(username.as_bytes());
            m.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    };
    STANDARD.encode(tag)
}

/// The expiry (UNIX seconds) of a REST username `expiry` or `expiry<sep>user`.
pub fn rest_expiry(username: &str, separator: char) -> Option<u64> {
    let ts = match username.split_once(separator) {
        Some((ts, _)) => ts,
        None => username,
    };
    if ts.is_empty() || ts.len() > 20 || !ts.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    ts.parse().ok()
}

/// Wire's `zrest` password for `username` (the whole name, `sft-` included): standard base64,
/// padded, of HMAC-SHA512(secret, username), as Wire's backend (brig) issues it.
pub fn zrest_password(secret: &[u8], username: &str) -> String {
    let tag = match Hmac::<sha2::Sha512>::new_from_slice(secret) {
        Ok(mut m) => {
            m.update(username.as_bytes());
            m.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    };
    STANDARD.encode(tag)
}

/// What a `zrest` username says: `[sft-]d=EXPIRY.v=1.k=INDEX.t=s.r=RANDOM`, where EXPIRY and
/// INDEX are decimal numbers of at most 2^32-1 and RANDOM is made of `-_a-zA-Z0-9` (the
/// fork's `^(sft-)?d=([0-9]+)\.v=1\.k=([0-9]+)\.t=s\.r=[-_a-zA-Z0-9]*$`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZrestName {
    /// UNIX seconds from which the credential is refused (unless [`sft`](Self::sft)).
    pub expiry: u32,
    /// The key index `k` (it selects nothing: every secret is tried).
    pub key_index: u32,
    /// `sft-`: Wire's conference servers; the credential never expires.
    pub sft: bool,
}

impl ZrestName {
    /// Parses a username; `None` if it is not of the zrest shape.
    pub fn parse(username: &str) -> Option<ZrestName> {
        let (sft, rest) = match username.strip_prefix("sft-") {
            Some(rest) => (true, rest),
            None => (false, username),
        };
        let (expiry, rest) = decimal_u32(rest.strip_prefix("d=")?)?;
        let (key_index, rest) = decimal_u32(rest.strip_prefix(".v=1.k=")?)?;
        let random = rest.strip_prefix(".t=s.r=")?;
        random
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            .then_some(ZrestName {
                expiry,
                key_index,
                sft,
            })
    }

    /// Whether the credential is refused at UNIX second `now` (now ≥ expiry, never for
    /// `sft-`).
    pub fn expired(&self, now: u64) -> bool {
        !self.sft && now >= u64::from(self.expiry)
    }
}

/// A run of at least one decimal digit at the start of `s`, at most 2^32-1 (leading zeros
/// allowed, as `strtoul` reads it), and what follows it.
fn decimal_u32(s: &str) -> Option<(u32, &str)> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    let mut value: u32 = 0;
    for b in s[..end].bytes() {
        value = value.checked_mul(10)?.checked_add(u32::from(b - b'0'))?;
    }
    Some((value, &s[end..]))
}

/// The password `secret` makes for `username` under `scheme`.
pub(crate) fn scheme_password(scheme: RestScheme, secret: &[u8], username: &str) -> String {
    match scheme {
        RestScheme::Timestamp => rest_password(secret, username),
        RestScheme::Zrest => zrest_password(secret, username),
    }
}

/// Candidate keys for a username.
pub(crate) enum Keys {
    /// A static user: one key.
    Static([u8; 16]),
    /// A REST credential: one key per configured secret (maybe none: a user database may
    /// hold them), plus the expiry to cap the allocation at.
    Rest {
        keys: Vec<[u8; 16]>,
        expiry: Option<u64>,
    },
    /// A `zrest` credential past its expiry (refused before any secret is tried, as in the
    /// fork).
    Expired,
    /// Nobody by that name (with `zrest`: not of its shape).
    Unknown,
}

/// The keys for `username` at UNIX second `now`.
pub(crate) fn keys_for(auth: &AuthConfig, realm: &str, username: &str, now: u64) -> Keys {
    if auth.rest_scheme == RestScheme::Zrest {
        return match ZrestName::parse(username) {
            None => Keys::Unknown,
            Some(name) if name.expired(now) => Keys::Expired,
            Some(_) => Keys::Rest {
                keys: auth
                    .rest_secrets
                    .iter()
                    .map(|s| long_term_key(username, realm, &zrest_password(s, username)))
                    .collect(),
                expiry: None,
            },
        };
    }
    if let Some(k) = auth.users.get(username) {
        return Keys::Static(match k {
            UserKey::Key(k) => *k,
            UserKey::Password(p) => long_term_key(username, realm, p),
        });
    }
    if auth.rest_secrets.is_empty() {
        return Keys::Unknown;
    }
    match rest_expiry(username, auth.rest_separator) {
        Some(expiry) => Keys::Rest {
            keys: auth
                .rest_secrets
                .iter()
                .map(|s| long_term_key(username, realm, &rest_password(s, username)))
                .collect(),
            expiry: Some(expiry),
        },
        None => Keys::Unknown,
    }
}

fn nonce_mac(secret: &[u8; 32], ts: u32, ip: IpAddr) -> Option<Hmac<sha1::Sha1>> {
    let mut m = Hmac::<sha1::Sha1>::new_from_slice(secret).ok()?;
    m.update(&ts.to_be_bytes());
    match ip.to_canonical() {
        IpAddr::V4(a) => m.update(&a.octets()),
        IpAddr::V6(a) => m.update(&a.octets()),
    }
    Some(m)
}

/// A nonce for `ip` at UNIX second `now`: base64url(ts32 || HMAC-SHA1(secret, ts || ip)[..8]).
pub(crate) fn make_nonce(secret: &[u8; 32], now: u64, ip: IpAddr) -> [u8; NONCE_LEN] {
    let ts = u32::try_from(now).unwrap_or(u32::MAX);
    let mut raw = [0u8; 12];
    raw[..4].copy_from_slice(&ts.to_be_bytes());
    if let Some(m) = nonce_mac(secret, ts, ip) {
        let tag = m.finalize().into_bytes();
        raw[4..].copy_from_slice(&tag[..8]);
    }
    let mut out = [0u8; NONCE_LEN];
    let _ = URL_SAFE_NO_PAD.encode_slice(raw, &mut out);
    out
}

/// The nonce key derived from a shared secret (`nonce-secret`, or a TURN REST API
/// `static-auth-secret`): HMAC-SHA256(secret, "lastcall-turn nonce key v1"). Every server
/// given the same secret issues and accepts the same nonces; the secret itself never keys a
/// nonce, so a nonce reveals nothing about the credentials.
pub fn nonce_key(secret: &[u8]) -> [u8; 32] {
    let mut key = [0u8; 32];
    if let Ok(mut m) = Hmac::<sha2::Sha256>::new_from_slice(secret) {
        m.update(b"lastcall-turn nonce key v1");
        key.copy_from_slice(&m.finalize().into_bytes());
    }
    key
}

/// Checks `nonce` against every key of `config` (the issuing one first).
pub(crate) fn check_nonce_with(
    config: &crate::config::NonceConfig,
    nonce: &[u8],
    now: u64,
    ip: IpAddr,
) -> NonceCheck {
    let life = config.lifetime.as_secs();
    let mut verdict = check_nonce(&config.secret, nonce, now, ip, life);
    for key in &config.accepted {
        if verdict != NonceCheck::Unknown {
            break;
        }
        verdict = check_nonce(key, nonce, now, ip, life);
    }
    verdict
}

/// What a nonce is worth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NonceCheck {
    /// Made by [`make_nonce`] for this IP no more than `lifetime` seconds ago.
    Valid,
    /// Made for this IP, but too long ago (or too far in the future).
    Stale,
    /// Never issued for this IP with this secret (another secret, another IP, garbage).
    Unknown,
}

/// Checks `nonce` for `ip` at UNIX second `now`.
pub(crate) fn check_nonce(
    secret: &[u8; 32],
    nonce: &[u8],
    now: u64,
    ip: IpAddr,
    lifetime: u64,
) -> NonceCheck {
    if nonce.len() != NONCE_LEN {
        return NonceCheck::Unknown;
    }
    let mut raw = [0u8; 12];
    match URL_SAFE_NO_PAD.decode_slice(nonce, &mut raw) {
        Ok(12) => {}
        _ => return NonceCheck::Unknown,
    }
    let ts = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
    let Some(m) = nonce_mac(secret, ts, ip) else {
        return NonceCheck::Unknown;
    };
    if m.verify_truncated_left(&raw[4..]).is_err() {
        return NonceCheck::Unknown;
    }
    let ts = u64::from(ts);
    if ts <= now.saturating_add(5) && now.saturating_sub(ts) <= lifetime {
        NonceCheck::Valid
    } else {
        NonceCheck::Stale
    }
}

/// `true` if `nonce` was made by [`make_nonce`] for `ip` no more than `lifetime` seconds ago.
#[cfg(test)]
pub(crate) fn nonce_valid(
    secret: &[u8; 32],
    nonce: &[u8],
    now: u64,
    ip: IpAddr,
    lifetime: u64,
) -> bool {
    check_nonce(secret, nonce, now, ip, lifetime) == NonceCheck::Valid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces() {
        let s = [9u8; 32];
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let n = make_nonce(&s, 1000, ip);
        assert!(nonce_valid(&s, &n, 1000, ip, 600));
        assert!(nonce_valid(&s, &n, 1600, ip, 600));
        assert!(!nonce_valid(&s, &n, 1601, ip, 600));
        assert!(!nonce_valid(
            &s,
            &n,
            1000,
            "192.0.2.2".parse().unwrap(),
            600
        ));
        assert!(!nonce_valid(&[8u8; 32], &n, 1000, ip, 600));
        let mut bad = n;
        bad[15] = if bad[15] == b'A' { b'B' } else { b'A' };
        assert!(!nonce_valid(&s, &bad, 1000, ip, 600));
        assert!(!nonce_valid(&s, b"short", 1000, ip, 600));
        assert!(std::str::from_utf8(&n).is_ok());
        assert_eq!(check_nonce(&s, &n, 1601, ip, 600), NonceCheck::Stale);
        assert_eq!(check_nonce(&s, &n, 994, ip, 600), NonceCheck::Stale);
        assert_eq!(check_nonce(&s, &n, 995, ip, 600), NonceCheck::Valid);
        assert_eq!(
            check_nonce(&[8u8; 32], &n, 1000, ip, 600),
            NonceCheck::Unknown
        );
        assert_eq!(check_nonce(&s, &bad, 1000, ip, 600), NonceCheck::Unknown);
    }

    #[test]
    fn rest() {
        assert_eq!(rest_expiry("1700000000:alice", ':'), Some(1_700_000_000));
        assert_eq!(rest_expiry("1700000000", ':'), Some(1_700_000_000));
        assert_eq!(rest_expiry("alice", ':'), None);
        assert_eq!(rest_expiry("alice:1700000000", ':'), None);
        // coturn's documented example shape: base64 of a 20-byte HMAC-SHA1 is 28 characters.
        assert_eq!(rest_password(b"secret", "1700000000:alice").len(), 28);
    }
}
