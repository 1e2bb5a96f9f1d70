//! Sans-IO SPOP agent core: what HAProxy and an SPOE agent say to each other (SPOP 2.0),
//! and one connection's decisions, with bytes and `now` in and events and bytes out.
//!
//! No sockets, no runtime, no clock, no WAF: the agent (`lastcall-spoa`) owns the sockets,
//! the time and the evaluations, and drives a [`conn::Conn`] per connection:
//!
//! - bytes read go into [`conn::Conn::buffer`]; [`conn::Conn::poll`] takes the protocol
//!   events off it (a handshake, a NOTIFY to evaluate, a frame that ends the connection);
//! - everything else that happens (an ACK written or handed over, the lifecycle's phase as a
//!   [`lastcall_phase::Seen`], an evaluation ended, room refused, a timer) goes to
//!   [`conn::Conn::handle`] as an [`conn::Input`], which returns the one [`conn::Action`] to
//!   carry out (write, wait, probe the socket, close with a goodbye).
//!
//! Below it, the codecs:
//!
//! - [`error`]: what a peer did wrong, with the status code to answer it with;
//! - [`frame`]: splitting the stream into SPOP frames and encoding the agent's frames;
//! - [`payload`]: the typed data inside them (KV-LIST, LIST-OF-MESSAGES) and the HELLO
//!   negotiation;
//! - [`coraza`]: coraza-spoa's `coraza-req`/`coraza-res` messages as plain structs;
//! - [`hdrs`]: HAProxy's header blocks (`req.hdrs` text and `req.hdrs_bin` binary).
//!
//! Each decoder returns an error (or `None`) for any input; none panics on peer bytes: the
//! property tests here and the targets in `fuzz/` check it, with the checks of
//! [`invariants`].
#![forbid(unsafe_code)]

pub mod conn;
pub mod coraza;
pub mod error;
pub mod frame;
pub mod hdrs;
pub mod invariants;
pub mod payload;
