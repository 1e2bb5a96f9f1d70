//! `lastcall-turn`: a TURN/STUN relay for Kubernetes that reads coturn's configuration and
//! drains without cutting a call.
//!
//! The protocol lives in `lastcall-turn-proto` (sans-IO); this crate owns the sockets (UDP,
//! TCP and TLS client listeners, UDP relay ports), the coturn-compatible configuration,
//! the metrics, and the wiring to the `lastcall` termination lifecycle.
#![forbid(unsafe_code)]

pub mod config;
pub mod metrics;
pub mod options;
pub mod server;
pub mod tls;
pub mod udp;
