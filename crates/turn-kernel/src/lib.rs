//! lastcall-turn's kernel fast path: an eBPF program on tc ingress (TCX) that relays the
//! ChannelData of UDP allocations with a channel binding in the kernel, both ways, and the
//! daemon's side of it: loading and attaching the program, the two maps of routes
//! (installed, refreshed and removed from the core's [`RouteChange`]s), and the per-route
//! counters read back for the metrics and idle detection.
//!
//! The program (`src/bpf/relay.bpf.c`, compiled by clang at build time with the `bpf`
//! feature) turns a client's ChannelData on a bound channel into the datagram from the relay
//! address to the peer, and a peer's datagram to the relay address into ChannelData to the
//! client, as long as the route's expiry (the earliest of the allocation's, the channel's
//! and the permission's) has not passed. Everything else (STUN, unknown or expired channels,
//! peers without a route, IP options, fragments, padded ChannelData) goes on to the stack and
//! the daemon unchanged. Without the feature [`KernelRelay::start`] returns
//! [`KernelError::NotBuilt`] and the daemon relays in user space.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use lastcall_turn_proto::{ChannelRoute, ClientAddr, RouteChange};

#[cfg(feature = "bpf")]
mod bpf;
mod ifaces;

/// Why the fast path is not running.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The binary was built without the `kernel-relay` feature.
    #[error("this build has no kernel fast path (built without the `kernel-relay` feature)")]
    NotBuilt,
    /// Only IPv4 addresses are relayed in the kernel.
    #[error("no IPv4 listening or relay address to relay in the kernel")]
    NoIpv4,
    /// No network interface carries the address.
    #[error("no network interface carries {0}")]
    NoInterface(IpAddr),
    /// Listing the interfaces failed.
    #[error("listing network interfaces: {0}")]
    Interfaces(String),
    /// The kernel refused to load the program or create its maps (privileges, BPF off).
    #[error("the kernel refused the BPF program: {0}")]
    Load(String),
    /// The kernel refused to attach the program to an interface.
    #[error("attaching the BPF program to {iface}: {msg}")]
    Attach {
        /// The interface.
        iface: String,
        /// The kernel's answer.
        msg: String,
    },
}

/// What the fast path relayed: live routes plus the ones removed since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Client ChannelData relayed to peers.
    pub to_peer_packets: u64,
    /// Their application data bytes.
    pub to_peer_bytes: u64,
    /// Peer datagrams relayed to clients as ChannelData.
    pub to_client_packets: u64,
    /// Their bytes (the peers' payloads).
    pub to_client_bytes: u64,
    /// Datagrams of a route past its expiry, handed to the daemon.
    pub expired: u64,
    /// Datagrams of a live route the program left to the daemon (padding, GSO, routing).
    pub unhandled: u64,
}

/// One route's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteStats {
    /// Client -> peer datagrams.
    pub to_peer_packets: u64,
    /// Peer -> client datagrams.
    pub to_client_packets: u64,
    /// The last datagram relayed either way, if any.
    pub last: Option<Instant>,
}

/// The loaded, attached program and its maps. Dropping it detaches the program (TCX links
/// belong to the process: they go with it even when it is killed).
pub struct KernelRelay {
    #[cfg(feature = "bpf")]
    inner: bpf::Loaded,
    interfaces: Vec<String>,
}

impl KernelRelay {
    /// Loads the program and attaches it to tc ingress of every interface carrying one of
    /// `ips` (an unspecified address: every interface that is up). IPv6 addresses are
    /// skipped: only IPv4 is relayed in the kernel.
    pub fn start(ips: &[IpAddr]) -> Result<KernelRelay, KernelError> {
        let v4: Vec<IpAddr> = ips.iter().copied().filter(IpAddr::is_ipv4).collect();
        if v4.is_empty() {
            return Err(KernelError::NoIpv4);
        }
        let interfaces = ifaces::carrying(&v4)?;
        Self::attach(interfaces)
    }

    #[cfg(feature = "bpf")]
    fn attach(interfaces: Vec<String>) -> Result<KernelRelay, KernelError> {
        let inner = bpf::Loaded::attach(&interfaces)?;
        Ok(KernelRelay { inner, interfaces })
    }

    #[cfg(not(feature = "bpf"))]
    fn attach(_interfaces: Vec<String>) -> Result<KernelRelay, KernelError> {
        Err(KernelError::NotBuilt)
    }

    /// The interfaces the program is attached to.
    pub fn interfaces(&self) -> &[String] {
        &self.interfaces
    }

    /// Applies one of the core's route changes (in the order the core made them). A route
    /// the kernel cannot take (map full) is logged and left to the daemon.
    pub fn apply(&self, change: &RouteChange) {
        #[cfg(feature = "bpf")]
        self.inner.apply(change);
        #[cfg(not(feature = "bpf"))]
        let _ = change;
    }

    /// What the program relayed and handed on, since the start.
    pub fn totals(&self) -> Totals {
        #[cfg(feature = "bpf")]
        return self.inner.totals();
        #[cfg(not(feature = "bpf"))]
        Totals::default()
    }

    /// The counters of `client`'s route on `channel`, if installed.
    pub fn route_stats(&self, client: &ClientAddr, channel: u16) -> Option<RouteStats> {
        #[cfg(feature = "bpf")]
        return self.inner.route_stats(client, channel);
        #[cfg(not(feature = "bpf"))]
        {
            let _ = (client, channel);
            None
        }
    }

    /// When each client with a route last sent ChannelData through the kernel (datagrams the
    /// core never sees: feed them to its idle detection), one entry per route that relayed.
    pub fn client_activity(&self) -> Vec<(ClientAddr, Instant)> {
        #[cfg(feature = "bpf")]
        return self.inner.client_activity();
        #[cfg(not(feature = "bpf"))]
        Vec::new()
    }

    /// Routes installed.
    pub fn routes(&self) -> usize {
        #[cfg(feature = "bpf")]
        return self.inner.routes();
        #[cfg(not(feature = "bpf"))]
        0
    }
}

impl std::fmt::Debug for KernelRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelRelay")
            .field("interfaces", &self.interfaces)
            .finish_non_exhaustive()
    }
}

/// The IPv4 address and port of `a` (the fast path relays IPv4 only; a wildcard address
/// cannot be written into a datagram: such a route stays the daemon's).
#[cfg_attr(not(feature = "bpf"), allow(dead_code))]
fn v4(a: SocketAddr) -> Option<([u8; 4], u16)> {
    match a {
        SocketAddr::V4(a) if !a.ip().is_unspecified() => Some((a.ip().octets(), a.port())),
        _ => None,
    }
}

/// A route's two keys' addresses, all IPv4: (client, listener, relay, peer).
#[cfg_attr(not(feature = "bpf"), allow(dead_code))]
type Addrs = [([u8; 4], u16); 4];

#[cfg_attr(not(feature = "bpf"), allow(dead_code))]
fn addrs(client: &ClientAddr, relay: SocketAddr, peer: SocketAddr) -> Option<Addrs> {
    Some([v4(client.client)?, v4(client.local)?, v4(relay)?, v4(peer)?])
}

#[cfg_attr(not(feature = "bpf"), allow(dead_code))]
fn route_addrs(r: &ChannelRoute) -> Option<Addrs> {
    addrs(&r.client, r.relay, r.peer)
}
