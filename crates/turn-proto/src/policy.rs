//! Peer policy: which peer addresses a client may reach through a relay.
//!
//! Secure by default (design note `turn.md`, "Peer policy"). The decision for a peer address,
//! in this order:
//!
//! 1. **Always denied**, whatever the configuration says: unspecified (`0.0.0.0/8`, `::`),
//!    link-local (`169.254.0.0/16` — this includes the cloud metadata address
//!    `169.254.169.254` — and `fe80::/10`), multicast (`224.0.0.0/4`, `ff00::/8`) and the
//!    limited broadcast address `255.255.255.255`. Loopback (`127.0.0.0/8`, `::1`) is also
//!    always denied unless [`PeerPolicy::allow_loopback`] is set (coturn's
//!    `allow-loopback-peers`, meant for tests only).
//! 2. **`allowed-peer-ip`** ranges open an address (coturn semantics: an allowed range wins
//!    over a denied one).
//! 3. **`denied-peer-ip`** ranges deny.
//! 4. **Denied by default** (opened by `allowed-peer-ip`): private and special-purpose ranges,
//!    [`DEFAULT_DENIED_V4`] and [`DEFAULT_DENIED_V6`] — `10.0.0.0/8`, `172.16.0.0/12`,
//!    `192.168.0.0/16` (RFC 1918), `100.64.0.0/10` (CGNAT), `192.0.0.0/24` (IETF protocol
//!    assignments), `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24` (documentation),
//!    `198.18.0.0/15` (benchmarking), `240.0.0.0/4` (reserved), `fc00::/7` (unique local),
//!    `fec0::/10` (old site-local), `2001:db8::/32` (documentation), `100::/64` (discard),
//!    `64:ff9b:1::/48` (local-use NAT64, whose IPv4 position depends on the operator's prefix
//!    length) — and the rest of `::/8` (reserved by the IETF: every address there that is not
//!    one of the IPv4 spellings below, e.g. `::5efe:a.b.c.d` or `::1:2:3:4`).
//! 5. Everything else is allowed.
//!
//! **IPv6 spellings of IPv4 addresses are judged by the embedded IPv4 address**, in every
//! step ([`embedded_ipv4s`]): IPv4-mapped `::ffff:a.b.c.d`, IPv4-translated
//! `::ffff:0:a.b.c.d`, IPv4-compatible `::a.b.c.d` (except `::` and `::1`, which are the
//! IPv6 unspecified and loopback addresses), 6to4 `2002:AABB:CCDD::/16`, NAT64
//! `64:ff9b::/96`, Teredo `2001::/32` (both the server's IPv4 address in bits 32-63 and the
//! client's, stored inverted in the last 32 bits) and ISATAP interface identifiers
//! (`…:0:5efe:a.b.c.d` and `…:200:5efe:a.b.c.d`, with the universal/local and group bits in
//! any state, under any prefix). For local-use NAT64 `64:ff9b:1::/48` the last 32 bits (the
//! `/96` position) are also judged, so `64:ff9b:1::127.0.0.1` is always denied. An allowed or
//! denied range matches either the literal address or an embedded IPv4 address.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Why a peer address was refused (the server answers 403 Forbidden).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyReason {
    /// Loopback, and loopback peers are not allowed.
    Loopback,
    /// Unspecified address (`0.0.0.0/8`, `::`).
    Unspecified,
    /// Link-local (`169.254.0.0/16`, `fe80::/10`).
    LinkLocal,
    /// Multicast (`224.0.0.0/4`, `ff00::/8`).
    Multicast,
    /// The limited broadcast address `255.255.255.255`.
    Broadcast,
    /// Listed in `denied-peer-ip`.
    Configured,
    /// A private or special-purpose range, denied by default (open it with `allowed-peer-ip`).
    Private,
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DenyReason::Loopback => "loopback",
            DenyReason::Unspecified => "unspecified",
            DenyReason::LinkLocal => "link-local",
            DenyReason::Multicast => "multicast",
            DenyReason::Broadcast => "broadcast",
            DenyReason::Configured => "denied-peer-ip",
            DenyReason::Private => "private or special-purpose range",
        })
    }
}

/// An inclusive range of IP addresses of one family: coturn's `allowed-peer-ip` /
/// `denied-peer-ip` value syntax (`a`, `a-b`), plus CIDR (`a/len`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpRange {
    start: IpAddr,
    end: IpAddr,
}

/// An `IpRange` that did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid IP range {0:?}: expected an address, `first-last` or `address/prefix-length`")]
pub struct IpRangeError(pub String);

impl IpRange {
    /// The range `start..=end`; `None` if the families differ or `start > end`.
    pub fn new(start: IpAddr, end: IpAddr) -> Option<IpRange> {
        let ok = match (start, end) {
            (IpAddr::V4(a), IpAddr::V4(b)) => a <= b,
            (IpAddr::V6(a), IpAddr::V6(b)) => a <= b,
            _ => false,
        };
        ok.then_some(IpRange { start, end })
    }

    /// A single address.
    pub fn single(ip: IpAddr) -> IpRange {
        IpRange { start: ip, end: ip }
    }

    /// A CIDR block; `None` if `len` is longer than the address.
    pub fn cidr(ip: IpAddr, len: u8) -> Option<IpRange> {
        match ip {
            IpAddr::V4(a) if len <= 32 => {
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                let s = u32::from(a) & mask;
                Some(IpRange {
                    start: IpAddr::V4(s.into()),
                    end: IpAddr::V4((s | !mask).into()),
                })
            }
            IpAddr::V6(a) if len <= 128 => {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                let s = u128::from(a) & mask;
                Some(IpRange {
                    start: IpAddr::V6(s.into()),
                    end: IpAddr::V6((s | !mask).into()),
                })
            }
            _ => None,
        }
    }

    /// First address.
    pub fn start(&self) -> IpAddr {
        self.start
    }

    /// Last address (inclusive).
    pub fn end(&self) -> IpAddr {
        self.end
    }

    /// Whether `ip` is inside the range (same family only).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.start, self.end, ip) {
            (IpAddr::V4(s), IpAddr::V4(e), IpAddr::V4(x)) => s <= x && x <= e,
            (IpAddr::V6(s), IpAddr::V6(e), IpAddr::V6(x)) => s <= x && x <= e,
            _ => false,
        }
    }
}

impl FromStr for IpRange {
    type Err = IpRangeError;

    fn from_str(s: &str) -> Result<IpRange, IpRangeError> {
        let err = || IpRangeError(s.to_string());
        let t = s.trim();
        if let Some((a, b)) = t.split_once('-') {
            let a: IpAddr = a.trim().parse().map_err(|_| err())?;
            let b: IpAddr = b.trim().parse().map_err(|_| err())?;
            return IpRange::new(a, b).ok_or_else(err);
        }
        if let Some((a, len)) = t.split_once('/') {
            let a: IpAddr = a.trim().parse().map_err(|_| err())?;
            let len: u8 = len.trim().parse().map_err(|_| err())?;
            return IpRange::cidr(a, len).ok_or_else(err);
        }
        let a: IpAddr = t.parse().map_err(|_| err())?;
        Ok(IpRange::single(a))
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}-{}", self.start, self.end)
        }
    }
}

/// The peer address policy (see the module documentation for the exact rules).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerPolicy {
    /// coturn `allow-loopback-peers`: open loopback peers. For tests only.
    pub allow_loopback: bool,
    /// coturn `allowed-peer-ip`: opens these ranges (wins over `denied`, and over the
    /// default-denied private ranges; never over the always-denied classes).
    pub allowed: Vec<IpRange>,
    /// coturn `denied-peer-ip`: denies these ranges (unless `allowed` covers the address).
    pub denied: Vec<IpRange>,
}

impl PeerPolicy {
    /// Decide for one peer IP address: `Ok(())` to allow, `Err(reason)` to answer 403.
    pub fn check(&self, ip: IpAddr) -> Result<(), DenyReason> {
        let [a, b] = embedded_ipv4s(ip);
        let candidates = [Some(ip), a.map(IpAddr::V4), b.map(IpAddr::V4)];
        for c in candidates.iter().flatten() {
            if let Some(r) = always_denied(*c) {
                if !(r == DenyReason::Loopback && self.allow_loopback) {
                    return Err(r);
                }
            }
        }
        let in_list = |list: &[IpRange]| {
            candidates
                .iter()
                .flatten()
                .any(|c| list.iter().any(|r| r.contains(*c)))
        };
        if in_list(&self.allowed) {
            return Ok(());
        }
        if in_list(&self.denied) {
            return Err(DenyReason::Configured);
        }
        if candidates.iter().flatten().any(|c| default_denied(*c)) {
            return Err(DenyReason::Private);
        }
        Ok(())
    }

    /// `true` if [`check`](Self::check) allows `ip`.
    pub fn is_allowed(&self, ip: IpAddr) -> bool {
        self.check(ip).is_ok()
    }
}

/// The IPv4 address embedded in an IPv6 spelling: IPv4-mapped, IPv4-translated,
/// IPv4-compatible (not `::`, `::1`), 6to4 (`2002::/16`), well-known NAT64 (`64:ff9b::/96`),
/// ISATAP, and Teredo's client address; see [`embedded_ipv4s`] for every one.
pub fn embedded_ipv4(ip: IpAddr) -> Option<Ipv4Addr> {
    let [a, b] = embedded_ipv4s(ip);
    a.or(b)
}

/// Every IPv4 address an IPv6 address carries (see the module docs): at most two, for
/// Teredo (its client's address first, then its server's).
pub fn embedded_ipv4s(ip: IpAddr) -> [Option<Ipv4Addr>; 2] {
    let IpAddr::V6(v6) = ip else {
        return [None, None];
    };
    let s = v6.segments();
    let o = v6.octets();
    let last32 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if s[..5] == [0; 5] && s[5] == 0xffff {
        return [Some(last32), None]; // ::ffff:a.b.c.d (mapped)
    }
    if s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
        return [Some(last32), None]; // ::ffff:0:a.b.c.d (translated, RFC 2765)
    }
    if s[..3] == [0x64, 0xff9b, 1] {
        return [Some(last32), None]; // local-use NAT64, the /96 position
    }
    if s[..6] == [0; 6] && u128::from(v6) > 1 {
        return [Some(last32), None]; // ::a.b.c.d (deprecated IPv4-compatible)
    }
    if s[0] == 0x2002 {
        return [Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])), None]; // 6to4
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return [Some(last32), None]; // NAT64 well-known prefix
    }
    if s[..2] == [0x2001, 0] {
        // Teredo (RFC 4380): server IPv4 in bits 32-63, client IPv4 inverted in the last 32.
        let client = Ipv4Addr::from(!u32::from(last32));
        return [Some(client), Some(Ipv4Addr::new(o[4], o[5], o[6], o[7]))];
    }
    if s[4] & 0xfcff == 0 && s[5] == 0x5efe {
        return [Some(last32), None]; // ISATAP interface identifier (RFC 5214)
    }
    [None, None]
}

/// Whether `a` is in `::/8` without being one of its IPv4 spellings (mapped, translated,
/// compatible, well-known NAT64 `64:ff9b::/96`, which lies in `::/8` too) or `::`/`::1`
/// (always denied on their own).
fn reserved_zero_prefix(a: Ipv6Addr) -> bool {
    let s = a.segments();
    let ipv4_spelling = (s[..5] == [0; 5] && s[5] == 0xffff)
        || (s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0)
        || s[..6] == [0; 6]
        || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    s[0] & 0xff00 == 0 && !ipv4_spelling
}

fn always_denied(ip: IpAddr) -> Option<DenyReason> {
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            if o[0] == 127 {
                Some(DenyReason::Loopback)
            } else if o[0] == 0 {
                Some(DenyReason::Unspecified)
            } else if o[0] == 169 && o[1] == 254 {
                Some(DenyReason::LinkLocal)
            } else if (224..=239).contains(&o[0]) {
                Some(DenyReason::Multicast)
            } else if a == Ipv4Addr::BROADCAST {
                Some(DenyReason::Broadcast)
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            if a == Ipv6Addr::LOCALHOST {
                Some(DenyReason::Loopback)
            } else if a == Ipv6Addr::UNSPECIFIED {
                Some(DenyReason::Unspecified)
            } else if s[0] & 0xffc0 == 0xfe80 {
                Some(DenyReason::LinkLocal)
            } else if s[0] & 0xff00 == 0xff00 {
                Some(DenyReason::Multicast)
            } else {
                None
            }
        }
    }
}

/// IPv4 ranges denied by default (network, prefix length): opened by `allowed-peer-ip`.
pub const DEFAULT_DENIED_V4: &[([u8; 4], u8)] = &[
    ([10, 0, 0, 0], 8),
    ([172, 16, 0, 0], 12),
    ([192, 168, 0, 0], 16),
    ([100, 64, 0, 0], 10),
    ([192, 0, 0, 0], 24),
    ([192, 0, 2, 0], 24),
    ([198, 51, 100, 0], 24),
    ([203, 0, 113, 0], 24),
    ([198, 18, 0, 0], 15),
    ([240, 0, 0, 0], 4),
];

/// IPv6 ranges denied by default (network, prefix length), besides the rest of `::/8`:
/// opened by `allowed-peer-ip`.
pub const DEFAULT_DENIED_V6: &[(u128, u8)] = &[
    (0xfc00 << 112, 7),
    (0xfec0 << 112, 10),
    (0x2001_0db8 << 96, 32),
    (0x0100 << 112, 64),
    (0x0064_ff9b_0001 << 80, 48),
];

fn default_denied(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => DEFAULT_DENIED_V4.iter().any(|(net, len)| {
            let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
            u32::from(a) & mask == u32::from_be_bytes(*net)
        }),
        IpAddr::V6(a) => {
            reserved_zero_prefix(a)
                || DEFAULT_DENIED_V6.iter().any(|(net, len)| {
                    let mask = u128::MAX.checked_shl(128 - u32::from(*len)).unwrap_or(0);
                    u128::from(a) & mask == *net
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(p: &PeerPolicy, s: &str) -> Result<(), DenyReason> {
        p.check(s.parse().unwrap())
    }

    /// IPv6 forms that carry an IPv4 address, with a forbidden one and with a public one;
    /// and the rest of `::/8`.
    #[test]
    fn ipv6_spellings_of_forbidden_ipv4_addresses() {
        use DenyReason::*;
        let p = PeerPolicy::default();
        let table: &[(&str, Result<(), DenyReason>)] = &[
            // IPv4-translated ::ffff:0:a.b.c.d
            ("::ffff:0:127.0.0.1", Err(Loopback)),
            ("::ffff:0:169.254.169.254", Err(LinkLocal)),
            ("::ffff:0:10.0.0.1", Err(Private)),
            ("::ffff:0:8.8.8.8", Ok(())),
            // ISATAP, in ::/8 (refused as reserved even with a public address) and under a
            // global prefix, with every u/g bit combination
            ("::5efe:127.0.0.1", Err(Loopback)),
            ("::5efe:169.254.169.254", Err(LinkLocal)),
            ("::5efe:8.8.8.8", Err(Private)),
            ("2606:4700:1:2:0:5efe:127.0.0.1", Err(Loopback)),
            ("2606:4700:1:2:200:5efe:169.254.169.254", Err(LinkLocal)),
            ("2606:4700:1:2:100:5efe:10.1.1.1", Err(Private)),
            ("2606:4700:1:2:300:5efe:127.0.0.1", Err(Loopback)),
            ("2606:4700:1:2:200:5efe:8.8.8.8", Ok(())),
            // Teredo 2001::/32: server IPv4 in bits 32-63, client IPv4 inverted at the end
            // (127.0.0.1 inverted is 80ff:fffe; 169.254.169.254 is 5601:5601)
            ("2001:0:808:808:0:0:80ff:fffe", Err(Loopback)),
            ("2001:0:808:808:8000:1234:5601:5601", Err(LinkLocal)),
            ("2001:0:7f00:1:0:0:f7f7:f7f7", Err(Loopback)),
            ("2001:0:a9fe:a9fe::f7f7:f7f7", Err(LinkLocal)),
            ("2001:0:808:808:0:0:f5ff:fffe", Err(Private)),
            ("2001:0:808:808:0:0:f7f7:f7f7", Ok(())),
            // the rest of ::/8
            ("::1:0:0:1", Err(Private)),
            ("0:1::1", Err(Private)),
            ("ff::1", Err(Private)),
            ("::ffff:1:0:1", Err(Private)),
            // still judged by their IPv4 address
            ("::ffff:8.8.8.8", Ok(())),
            ("::ffff:127.0.0.1", Err(Loopback)),
            ("::8.8.8.8", Ok(())),
            ("::127.0.0.1", Err(Loopback)),
            ("::", Err(Unspecified)),
            ("::1", Err(Loopback)),
            ("64:ff9b:1::127.0.0.1", Err(Loopback)),
            ("64:ff9b::8.8.8.8", Ok(())),
            ("64:ff9b::127.0.0.1", Err(Loopback)),
            ("64:ff9b:2::1", Err(Private)),
            // beside ::/8
            ("100::1", Err(Private)),
            ("200::1", Ok(())),
            ("2606:4700::1111", Ok(())),
        ];
        for (addr, want) in table {
            assert_eq!(check(&p, addr), *want, "{addr}");
        }
        // allow-loopback-peers opens the loopback ones, not the link-local ones.
        let p = PeerPolicy {
            allow_loopback: true,
            ..PeerPolicy::default()
        };
        assert_eq!(check(&p, "::ffff:0:127.0.0.1"), Ok(()));
        assert_eq!(check(&p, "2001:0:808:808:0:0:80ff:fffe"), Ok(()));
        assert_eq!(
            check(&p, "2001:0:808:808:8000:1234:5601:5601"),
            Err(LinkLocal)
        );
        // allowed-peer-ip opens an embedded private address.
        let p = PeerPolicy {
            allowed: vec!["10.0.0.0/8".parse().unwrap()],
            ..PeerPolicy::default()
        };
        assert_eq!(check(&p, "2001:0:808:808:0:0:f5ff:fffe"), Ok(()));
        assert_eq!(check(&p, "::ffff:0:10.0.0.1"), Ok(()));
    }

    /// docs/turn.md's peer policy section names every range the code denies by default,
    /// and every always-denied range and IPv4-carrying form.
    #[test]
    fn docs_list_the_ranges_of_the_code() {
        let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/turn.md");
        let text = std::fs::read_to_string(docs).unwrap();
        let start = text.find("## Peer policy").unwrap();
        let section = &text[start..];
        let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
        let mut names: Vec<String> = DEFAULT_DENIED_V4
            .iter()
            .map(|(n, l)| format!("{}/{l}", Ipv4Addr::from(*n)))
            .chain(
                DEFAULT_DENIED_V6
                    .iter()
                    .map(|(n, l)| format!("{}/{l}", Ipv6Addr::from(*n))),
            )
            .collect();
        names.extend(
            [
                "0.0.0.0/8",
                "169.254.0.0/16",
                "fe80::/10",
                "224.0.0.0/4",
                "ff00::/8",
                "255.255.255.255",
                "127.0.0.0/8",
                "::1",
                "::/8",
                "::ffff:a.b.c.d",
                "::ffff:0:a.b.c.d",
                "::a.b.c.d",
                "2002::/16",
                "64:ff9b::/96",
                "2001::/32",
                "5efe",
            ]
            .map(String::from),
        );
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !section.contains(&format!("`{n}`")) && !section.contains(n.as_str()))
            .collect();
        assert!(missing.is_empty(), "docs/turn.md does not name {missing:?}");
        // Every default-denied range is denied at both ends.
        let p = PeerPolicy::default();
        for (n, l) in DEFAULT_DENIED_V4 {
            let r = IpRange::cidr(IpAddr::V4(Ipv4Addr::from(*n)), *l).unwrap();
            assert_eq!(p.check(r.start()), Err(DenyReason::Private), "{r}");
            assert!(p.check(r.end()).is_err(), "{r}");
        }
        for (n, l) in DEFAULT_DENIED_V6 {
            let r = IpRange::cidr(IpAddr::V6(Ipv6Addr::from(*n)), *l).unwrap();
            assert!(p.check(r.start()).is_err(), "{r}");
            assert!(p.check(r.end()).is_err(), "{r}");
        }
    }
}
