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
//! 4. **Denied by default** (opened by `allowed-peer-ip`): private and special-purpose ranges —
//!    `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16` (RFC 1918), `100.64.0.0/10` (CGNAT),
//!    `192.0.0.0/24` (IETF protocol assignments), `192.0.2.0/24`, `198.51.100.0/24`,
//!    `203.0.113.0/24` (documentation), `198.18.0.0/15` (benchmarking), `240.0.0.0/4`
//!    (reserved), `fc00::/7` (unique local), `fec0::/10` (old site-local), `2001:db8::/32`
//!    (documentation), `100::/64` (discard) and `64:ff9b:1::/48` (local-use NAT64, whose
//!    IPv4 position depends on the operator's prefix length).
//! 5. Everything else is allowed.
//!
//! **IPv6 spellings of IPv4 addresses are judged by the embedded IPv4 address**, in every
//! step: IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d` (except `::` and `::1`,
//! which are the IPv6 unspecified and loopback addresses), 6to4 `2002:AABB:CCDD::/16` and
//! NAT64 `64:ff9b::/96`. For local-use NAT64 `64:ff9b:1::/48` the last 32 bits (the `/96`
//! position) are also judged, so `64:ff9b:1::127.0.0.1` is always denied. An allowed or denied
//! range matches either the literal address or its embedded IPv4 address.

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
        let embedded = embedded_ipv4(ip);
        let mut candidates = [Some(ip), embedded.map(IpAddr::V4)];
        if let Some(e) = local_use_nat64(ip) {
            candidates[1] = Some(IpAddr::V4(e));
        }
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

/// The IPv4 address embedded in an IPv6 spelling: IPv4-mapped, IPv4-compatible (not `::`,
/// `::1`), 6to4 (`2002::/16`) and well-known NAT64 (`64:ff9b::/96`).
pub fn embedded_ipv4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    let s = v6.segments();
    let o = v6.octets();
    let last32 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if s[..5] == [0; 5] && s[5] == 0xffff {
        return Some(last32); // ::ffff:a.b.c.d
    }
    if s[..6] == [0; 6] && u128::from(v6) > 1 {
        return Some(last32); // ::a.b.c.d (deprecated IPv4-compatible)
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])); // 6to4
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(last32); // NAT64 well-known prefix
    }
    None
}

/// Local-use NAT64 `64:ff9b:1::/48`: the last 32 bits (a `/96` translator's position).
fn local_use_nat64(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    let s = v6.segments();
    let o = v6.octets();
    (s[..3] == [0x64, 0xff9b, 1]).then(|| Ipv4Addr::new(o[12], o[13], o[14], o[15]))
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

fn default_denied(ip: IpAddr) -> bool {
    const V4: &[([u8; 4], u8)] = &[
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
    const V6: &[(u128, u8)] = &[
        (0xfc00 << 112, 7),
        (0xfec0 << 112, 10),
        (0x2001_0db8 << 96, 32),
        (0x0100 << 112, 64),
        (0x0064_ff9b_0001 << 80, 48),
    ];
    match ip {
        IpAddr::V4(a) => V4.iter().any(|(net, len)| {
            let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
            u32::from(a) & mask == u32::from_be_bytes(*net)
        }),
        IpAddr::V6(a) => V6.iter().any(|(net, len)| {
            let mask = u128::MAX.checked_shl(128 - u32::from(*len)).unwrap_or(0);
            u128::from(a) & mask == *net
        }),
    }
}
