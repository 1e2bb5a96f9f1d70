//! Routes for a kernel fast path: what an I/O layer that relays ChannelData outside the core
//! (an eBPF program, say) must know, and when it changes.
//!
//! A [`ChannelRoute`] is one channel binding of a UDP allocation, both directions: the
//! client's ChannelData on `channel` becomes a datagram from `relay` to `peer`, and a
//! datagram from `peer` to `relay` becomes ChannelData to the client. It is valid until
//! `expires`, the earliest of the allocation's, the channel's and the peer's permission's
//! expiry: the fast path checks that time itself, so a route that lapses stops at once,
//! whenever the core next runs its timers.
//!
//! [`Server::set_route_output`](crate::Server::set_route_output) turns the output on; then
//! every ChannelBind, CreatePermission and Refresh that changes a route's expiry queues a
//! [`RouteChange::Install`] (a new route, or the same one with its new expiry), and an
//! allocation deleted or a channel forgotten (its quarantine over) queues a
//! [`RouteChange::Remove`], in the order they happened. Poll them with
//! [`Server::poll_route`](crate::Server::poll_route) and apply them in that order.
//!
//! Only what the fast path can relay exactly as the core would gets a route: UDP clients,
//! IPv4 clients and peers, allocations without a bandwidth limit (`max-bps` is enforced by
//! the core). Everything else keeps going through the core.

use std::net::SocketAddr;
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
}
