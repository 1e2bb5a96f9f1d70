//! Sans-IO STUN/TURN server core: bytes and `now` in, responses and relay actions out.
//!
//! No sockets, no tokio, no clock: the I/O layer (`lastcall-turn`) owns sockets and time and
//! drives a [`Server`]:
//!
//! - a datagram (UDP) or a frame (TCP/TLS, cut with [`stream_frame_len`]) from a client goes to
//!   [`Server::handle_client`], which returns at most one [`Transmit`]: a response to the
//!   client, or a payload to send from a relay socket to a peer;
//! - a datagram received on a relay socket goes to [`Server::handle_peer`], which returns at
//!   most one ChannelData or Data indication for the client;
//! - relay sockets are bound and closed through the [`RelayProvider`] the caller passes in;
//! - timers: call [`Server::handle_timeout`] at [`Server::poll_timeout`];
//! - [`Server::poll_event`] reports allocations created/deleted, auth failures and drain
//!   refusals (for metrics and session guards); [`Server::counters`] are cumulative counters;
//! - [`Server::set_drain`] makes new Allocates get 300 Try Alternate or 403 while existing
//!   allocations keep working.
//!
//! The data paths (ChannelData and Send from clients, datagrams from peers) are parsed by hand
//! and write into caller-provided buffers: no heap allocation per packet.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod config;
pub mod frame;
mod hash;
pub mod policy;
pub mod server;
pub mod stun;
pub mod types;

pub use auth::{rest_expiry, rest_password, NONCE_LEN};
pub use config::{
    parse_coturn_user, AuthConfig, ConfigError, ExternalIp, Lifetimes, NonceConfig, Quotas,
    RelayConfig, ServerConfig, UserKey,
};
pub use frame::{stream_frame_len, FrameError, CHANNEL_MAX, CHANNEL_MIN};
pub use policy::{DenyReason, IpRange, IpRangeError, PeerPolicy};
pub use server::Server;
pub use types::{
    AuthFailure, ClientAddr, Counters, DeleteReason, DrainMode, Event, RelayAddrs, RelayError,
    RelayProvider, Transmit, Transport, MAX_QUEUED_EVENTS,
};

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
