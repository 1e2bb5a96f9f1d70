//! Routes for a kernel fast path: what an I/O layer that relays client data outside the core
//! (an eBPF program, say) must know, and when it changes.
//!
//! A [`ChannelRoute`] is one channel binding of a UDP allocation, both directions: the
//! client's ChannelData on `channel` becomes a datagram from `relay` to `peer`, and a
//! datagram from `peer` to `relay` becomes ChannelData to the client. A [`PermissionRoute`]
//! is one permission: the client's Send indications to any port of `peer` become datagrams
//! from `relay`, and (with `data_indications`) a datagram from any port of `peer` to `relay`
//! that no channel carries becomes a Data indication to the client (clients that never bind
//! a channel, Firefox among them, send and receive only these). Each is valid until
//! `expires`, the earliest of the allocation's, the channel's and the permission's expiry:
//! the fast path checks that time itself, so a route that lapses stops at once, whenever the
//! core next runs its timers.
//!
//! [`Server::set_route_output`](crate::Server::set_route_output) turns the output on; then
//! every ChannelBind, CreatePermission and Refresh that changes a route's expiry queues an
//! install ([`RouteChange::Install`], [`RouteChange::InstallPermission`]: a new route, or
//! the same one with its new expiry), and an allocation deleted, a channel forgotten (its
//! quarantine over) or a permission expired queues a removal, in the order they happened.
//! Poll them with [`Server::poll_route`](crate::Server::poll_route) and apply them in that
//! order.
//!
//! Only what the fast path can relay exactly as the core would gets a route: UDP clients,
//! client, listener, relay and peer of one address family (IPv4 or IPv6), allocations
//! without a bandwidth limit (`max-bps` is enforced by the core); Data indications only when
//! the server adds no FINGERPRINT to them (`fingerprint`). Everything else keeps going
//! through the core.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use crate::types::ClientAddr;

/// One channel binding of a UDP allocation, as the fast path relays it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelRoute {
    /// The client's 5-tuple (its `local` address is the listener the client talks to).
    pub client: ClientAddr,
    /// The channel number.
    pub channel: u16,
    /// The allocation's relay address (of the peer's family).
    pub relay: SocketAddr,
    /// The peer bound to the channel.
    pub peer: SocketAddr,
    /// Until when it may be relayed (allocation, channel and permission all live).
    pub expires: Instant,
}

/// One permission of a UDP allocation, as the fast path relays it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PermissionRoute {
    /// The client's 5-tuple.
    pub client: ClientAddr,
    /// The allocation's relay address (of the peer's family).
    pub relay: SocketAddr,
    /// The permitted peer IP (any port).
    pub peer: IpAddr,
    /// Whether datagrams from the peer may become Data indications in the fast path (not
    /// when the server adds FINGERPRINT to them); Send indications to it may in any case.
    pub data_indications: bool,
    /// Until when it may be relayed (allocation and permission live).
    pub expires: Instant,
}

/// A change to the fast path's routes, in the order the core made them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteChange {
    /// Install `route`, or replace the one with the same client and channel (and the same
    /// relay and peer: a channel is bound to one peer for its lifetime).
    Install(ChannelRoute),
    /// The route of `client`'s `channel` (bound to `peer` on `relay`) is gone.
    Remove {
        /// The client's 5-tuple.
        client: ClientAddr,
        /// The channel number.
        channel: u16,
        /// The allocation's relay address.
        relay: SocketAddr,
        /// The peer.
        peer: SocketAddr,
    },
    /// Install `route`, or replace the one with the same client and peer IP.
    InstallPermission(PermissionRoute),
    /// The permission route of `client` for `peer` (on `relay`) is gone.
    RemovePermission {
        /// The client's 5-tuple.
        client: ClientAddr,
        /// The allocation's relay address.
        relay: SocketAddr,
        /// The peer IP.
        peer: IpAddr,
    },
}
