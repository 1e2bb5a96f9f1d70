//! Sans-IO STUN/TURN server core: bytes and `now` in, responses and relay actions out.
//!
//! No sockets, no tokio, no clock: the I/O layer (`lastcall-turn`) owns sockets and time and
//! drives a [`Server`]:
//!
//! - a datagram (UDP) or a frame (TCP/TLS, cut with [`stream_frame_len`]) from a client goes to
//!   [`Server::handle_client`], which returns at most one [`Output`]: a [`Transmit`] (a
//!   response to the client, or a payload to send from a relay socket to a peer), or, for a new
//!   allocation, an [`Output::BindRelay`] request for relay sockets;
//! - the I/O layer binds those sockets (outside any lock it keeps around the core: binding is
//!   a system call) and answers with [`Server::relay_bound`], which returns the Allocate's
//!   response; sockets to close come out of [`Server::poll_release`] (an allocation ended, a
//!   reservation expired, an answer came after its Allocate stopped waiting);
//! - a datagram received on a relay socket goes to [`Server::handle_peer`], which returns at
//!   most one ChannelData or Data indication for the client;
//! - timers: call [`Server::handle_timeout`] at [`Server::poll_timeout`]; a TCP/TLS
//!   connection that closes goes to [`Server::close_client`]; at the shutdown deadline
//!   [`Server::clear`] ends every allocation;
//! - [`Server::poll_event`] reports allocations created/deleted, auth failures, refused
//!   peers and refused Allocates (for metrics and session guards); [`Server::counters`] are
//!   cumulative counters (the I/O layer exports them as metrics); with
//!   [`Server::set_user_traffic`] each new allocation also gets its user's [`UserTraffic`]
//!   handle, which its relayed data is counted in ([`traffic`]);
//! - [`Server::set_drain`] makes new Allocates get 300 Try Alternate or 403 while existing
//!   allocations keep working;
//! - with a user database ([`AuthConfig::database`]), a request whose key the configuration
//!   does not have waits: [`Server::poll_lookup`] says what to look up, [`Server::lookup_done`]
//!   takes the answer, and the requests that waited come out of [`Server::poll_replay`] to be
//!   run again with [`Server::replay`] (see [`credentials`]). The core never does I/O.
//!
//! The data paths (ChannelData and Send from clients, datagrams from peers) are parsed by hand
//! (the [`stun`] codec borrows, validates lengths once and never allocates) and write into
//! caller-provided buffers: no heap allocation per packet. The full request handling (with
//! its `Vec`s and HMACs) runs only for control messages.
//!
//! ```
//! use std::net::SocketAddr;
//! use std::time::{Instant, SystemTime};
//! use lastcall_turn_proto::*;
//!
//! let mut config = ServerConfig::new("example.org");
//! config.auth.rest_secrets.push(b"secret".to_vec());
//! config.relay.relay_ips = vec!["192.0.2.1".parse().unwrap()];
//! let mut server = Server::new(config, Instant::now(), SystemTime::now());
//! let from = ClientAddr {
//!     transport: Transport::Udp,
//!     client: "198.51.100.7:40000".parse().unwrap(),
//!     local: "192.0.2.1:3478".parse().unwrap(),
//! };
//! // A STUN Binding request (20 bytes) from the client:
//! let binding = [0, 1, 0, 0, 0x21, 0x12, 0xa4, 0x42, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
//! let mut out = Vec::new();
//! match server.handle_client(Instant::now(), from, &binding, &mut out) {
//!     Some(Output::Transmit(Transmit::Client { to, data })) => {
//!         assert_eq!((to, data.len()), (from, 32))
//!     }
//!     other => panic!("{other:?}"),
//! }
//! // An authenticated Allocate would return Output::BindRelay(request): bind a UDP socket
//! // on request.ip (a port in min-port..=max-port), then
//! //     server.relay_bound(now, RelayBound { id: request.id, primary: Ok((addr, None)),
//! //                                          additional: None }, &mut out)
//! // returns the success response to send.
//! while let Some(event) = server.poll_event() { /* metrics, session guards */ }
//! while let Some(relay) = server.poll_release() { /* close that socket */ }
//! # let _: Option<SocketAddr> = None;
//! ```
//!
//! # Decisions (where the RFCs leave room or real clients disagree with them)
//!
//! - **No amplification.** A response to an *unauthenticated* request that would be larger
//!   than the request is dropped (counted in [`Counters::suppressed_responses`]), except two
//!   answers no client can do without: the Binding success (at most 52 bytes) and the 401/438
//!   challenge carrying REALM and NONCE (exactly `20 + 8 + 4 + pad4(realm) + 20` bytes, plus
//!   8 if the request had FINGERPRINT; 72 bytes for realm `example.org`, against 60 bytes for
//!   `turnutils_uclient`'s first Allocate). Error responses carry no reason phrase and no
//!   SOFTWARE. Those two exceptions are limited per source IP over UDP to
//!   [`ServerConfig::unauthorized_rps`] a second (coturn's `unauthorized-ratelimit`, on here
//!   by default; counted in [`Counters::ratelimited_responses`]). Responses to authenticated
//!   requests are not limited: nonces are bound to the
//!   client's IP address, so a spoofed source can never produce an authenticated request.
//! - **Stateless nonces**: 16 characters, base64url(32-bit time || first 8 bytes of
//!   HMAC-SHA1(key, time || client IP)). Older than `stale-nonce`, from another IP, or made
//!   by another key: 438 with a fresh nonce. Servers given the same key ([`nonce_key`] of a
//!   shared secret; [`NonceConfig::accepted`] for more keys) accept each other's nonces
//!   (fleet nonces).
//! - **Drain**: a new client's first, unauthenticated Allocate gets 300 Try Alternate with
//!   ALTERNATE-SERVER only (coturn's answer; exempt from the size guard like the challenge,
//!   at most 60 bytes) when there is an alternate; an authenticated Allocate gets the 300
//!   with MESSAGE-INTEGRITY (RFC 8489 §10), REALM and a fresh NONCE — libwebrtc takes those
//!   to the alternate, where a 438 or a second 401 would be fatal to its Allocate — or 403
//!   without alternates. `turnutils_uclient` follows both 300s; on 403 it exits 255 at once.
//!   ALTERNATE-DOMAIN is not sent.
//! - **Channel numbers 0x4000..=0x7FFF** (RFC 5766's range) are accepted, not only RFC 8656's
//!   0x4000..=0x4FFF: `turnutils_uclient` and coturn use the whole range.
//! - **EVEN-PORT** (with or without R) and **RESERVATION-TOKEN** are supported (uclient sends
//!   them by default); reservations last 30 s.
//! - **Relay sockets are bound between two calls** ([`Output::BindRelay`], then
//!   [`Server::relay_bound`]). Meanwhile the Allocate counts against the quotas; a
//!   retransmission of it is not answered (the answer to the first one answers it), any other
//!   request on that 5-tuple gets 437; a drain that begins meanwhile wins (the answer gets 300
//!   or 403 and its sockets are released: no allocation is created while refusing, so a drain
//!   that sees none left can end); a TCP/TLS connection that closes meanwhile takes the
//!   Allocate with it. An answer that never comes is given up after 10 s.
//! - **DONT-FRAGMENT** is accepted (the relay does not set DF on its own).
//! - **Keys from a user database** are kept in a bounded cache ([`CacheLimits`]: 10,000
//!   answers, trusted 10 s, asked again after 1 s when they did not authenticate); a database
//!   that cannot answer (or answers later than 3 s) costs the waiting request a 500 (RFC 8489:
//!   try again), never a 401. An allocation's later requests are checked with the key its
//!   Allocate used (coturn's session key): they never wait for the database, so a database
//!   that is down stops new allocations only, and a user removed from it keeps the
//!   allocations it has until they end, as in coturn.
//! - **Lifetimes**: requested lifetimes below the default get the default, above
//!   `max-allocate-lifetime` the maximum, and never beyond a REST credential's expiry.
//! - **Peer policy**: see [`policy`]; 403 on CreatePermission (all-or-nothing) and ChannelBind.
//! - **Channel rebinding**: a channel is bound to one peer and a peer to one channel for the
//!   channel's lifetime plus 5 minutes after it expires (400 otherwise); rebinding the same
//!   pair refreshes it and its permission.
//! - Not implemented: TCP relays (RFC 6062; REQUESTED-TRANSPORT TCP gets 442), mobility
//!   (RFC 8016), third-party authorization, USERHASH / PASSWORD-ALGORITHMS negotiation
//!   (MD5 long-term keys only; a request with MESSAGE-INTEGRITY-SHA256 is verified with the
//!   same key), SASLprep of passwords.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod config;
pub mod credentials;
pub mod fastpath;
pub mod frame;
mod hash;
pub mod policy;
pub mod server;
pub mod stun;
pub mod traffic;
pub mod types;

pub use auth::{nonce_key, rest_expiry, rest_password, zrest_password, ZrestName, NONCE_LEN};
pub use config::{
    parse_coturn_user, AuthConfig, Bandwidth, ConfigError, DatabaseKeys, DefaultFamily, ExternalIp,
    Lifetimes, NonceConfig, Quotas, RelayConfig, RestScheme, ServerConfig, Service, UserDatabase,
    UserKey,
};
pub use credentials::{Answer, CacheLimits, Lookup, Query, Replay};
pub use fastpath::{ChannelRoute, PermissionRoute, RouteChange};
pub use frame::{stream_frame_len, FrameError, CHANNEL_MAX, CHANNEL_MIN};
pub use policy::{embedded_ipv4s, DenyReason, IpRange, IpRangeError, PeerPolicy};
pub use server::{AllocationInfo, AllocationTraffic, Server};
pub use traffic::{TrafficCounts, UserTraffic, UserTrafficFn};
pub use types::{
    AuthFailure, CapacityLimit, ClientAddr, Counters, DeleteReason, DrainMode, Event, Output,
    RelayAddrs, RelayBound, RelayError, RelayPorts, RelayRequest, Transmit, Transport,
    MAX_QUEUED_EVENTS,
};

#[cfg(test)]
mod oracle;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
