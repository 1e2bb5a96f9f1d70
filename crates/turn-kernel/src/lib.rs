//! lastcall-turn's kernel fast path: an eBPF program on tc ingress (TCX) that relays the data
//! of UDP allocations in the kernel, both ways, IPv4 and IPv6, and the daemon's side of it:
//! loading and attaching the program, the maps of routes (installed, refreshed and removed
//! from the core's [`RouteChange`]s), and the per-route counters read back for the metrics
//! and idle detection.
//!
//! The program (`src/bpf/relay.bpf.c`, compiled by clang at build time with the `bpf`
//! feature) turns a client's ChannelData on a bound channel (padded or not) or its Send
//! indication to a permitted peer into the datagram from the relay address to the peer, and
//! a peer's datagram to the relay address into ChannelData (a channel bound to it) or a Data
//! indication (a permission for its IP) to the client, as long as the route's expiry (the
//! earliest of the allocation's, the channel's and the permission's) has not passed; two
//! clients of this server calling each other go from one to the other in one pass. Everything
//! else (STUN requests, unknown or expired routes, IP options, fragments, GSO packets) goes on
//! to the stack and the daemon unchanged. Without the feature [`KernelRelay::start`] returns
//! [`KernelError::NotBuilt`] and the daemon relays in user space.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use lastcall_turn_proto::{ClientAddr, RouteChange};

#[cfg(feature = "bpf")]
mod bpf;
mod ifaces;
#[cfg(feature = "bpf")]
mod reflect;

#[cfg(feature = "bpf")]
pub use reflect::Reflector;

/// Why the fast path is not running.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The binary was built without the `kernel-relay` feature.
    #[error("this build has no kernel fast path (built without the `kernel-relay` feature)")]
    NotBuilt,
    /// No address was given.
    #[error("no listening or relay address to relay in the kernel")]
    NoAddress,
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
    /// Client ChannelData and Send indications relayed to peers.
    pub to_peer_packets: u64,
    /// Their application data bytes.
    pub to_peer_bytes: u64,
    /// The clients' UDP payload bytes of those (data and framing).
    pub to_peer_wire_bytes: u64,
    /// Peer datagrams relayed to clients as ChannelData or Data indications.
    pub to_client_packets: u64,
    /// Their bytes (the peers' payloads).
    pub to_client_bytes: u64,
    /// The UDP payload bytes the clients got (data and framing).
    pub to_client_wire_bytes: u64,
    /// Datagrams of a route past its expiry, handed to the daemon.
    pub expired: u64,
    /// Datagrams of a live route the program left to the daemon (too big, not routable
    /// directly, a helper refused).
    pub unhandled: u64,
    /// GSO packets of a live route left to the daemon: a same-host sender's UDP_SEGMENT
    /// batch (several datagrams in one packet, which no helper can split).
    pub gso: u64,
    /// Padded ChannelData relayed (its padding dropped).
    pub padded: u64,
    /// Send indications relayed (their data sent to the peer).
    pub send_indications: u64,
    /// Data indications written (to clients without a channel to the peer).
    pub data_indications: u64,
    /// Datagrams relayed from one client of this server to another in one pass.
    pub hairpin: u64,
}

/// One route's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteStats {
    /// Client -> peer datagrams.
    pub to_peer_packets: u64,
    /// Peer -> client datagrams.
    pub to_client_packets: u64,
    /// The application data bytes of the client -> peer datagrams.
    pub to_peer_bytes: u64,
    /// The clients' UDP payload bytes of those (data and framing).
    pub to_peer_wire_bytes: u64,
    /// The peers' payload bytes relayed to the client.
    pub to_client_bytes: u64,
    /// The UDP payload bytes the client got (data and framing).
    pub to_client_wire_bytes: u64,
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
    /// `ips` (an unspecified address: every interface that is up).
    pub fn start(ips: &[IpAddr]) -> Result<KernelRelay, KernelError> {
        if ips.is_empty() {
            return Err(KernelError::NoAddress);
        }
        let interfaces = ifaces::carrying(ips)?;
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

    /// The counters of `client`'s permission route for `peer` (Send indications to the peer,
    /// Data indications from it), if installed.
    pub fn permission_stats(&self, client: &ClientAddr, peer: IpAddr) -> Option<RouteStats> {
        #[cfg(feature = "bpf")]
        return self.inner.permission_stats(client, peer);
        #[cfg(not(feature = "bpf"))]
        {
            let _ = (client, peer);
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

    /// Routes installed (channels and permissions).
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

/// An address as the program keys it: 16 bytes (IPv6, or IPv4-mapped), and the port in
/// network order. `None` for a wildcard address, which cannot be written into a datagram:
/// such a route stays the daemon's.
#[cfg_attr(not(feature = "bpf"), allow(dead_code))]
fn wire(a: SocketAddr) -> Option<([u8; 16], [u8; 2])> {
    if a.ip().is_unspecified() {
        return None;
    }
    Some((ip16(a.ip()), a.port().to_be_bytes()))
}

/// 16 bytes of `ip` (IPv4: IPv4-mapped).
#[cfg_attr(not(feature = "bpf"), allow(dead_code))]
fn ip16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}
