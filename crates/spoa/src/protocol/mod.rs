//! What HAProxy and the agent say to each other, sans-IO: bytes in, values out, and back.
//! Nothing here knows about sockets, threads, time or the WAF.
//!
//! - `error`: what a peer did wrong, with the status code to answer it with;
//! - [`frame`]: splitting the stream into SPOP frames and encoding the agent's frames;
//! - `payload`: the typed data inside them (KV-LIST, LIST-OF-MESSAGES) and the HELLO
//!   negotiation;
//! - `coraza`: coraza-spoa's `coraza-req`/`coraza-res` messages as plain structs;
//! - `hdrs`: HAProxy's header blocks (`req.hdrs` text and `req.hdrs_bin` binary).
//!
//! Each decoder returns an error (or `None`) for any input; none panics on peer bytes (the
//! property tests here and the targets in `fuzz/` check it).

pub(crate) mod coraza;
pub(crate) mod error;
pub mod frame;
pub(crate) mod hdrs;
pub(crate) mod payload;
