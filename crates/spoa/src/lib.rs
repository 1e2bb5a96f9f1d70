//! `lastcall-spoa`: an HAProxy SPOE agent (SPOP 2.0) running ModSecurity with the OWASP Core
//! Rule Set, a drop-in replacement for coraza-spoa that drains gracefully on SIGTERM.
//!
//! Three layers, each unaware of the one above it:
//!
//! - [`lastcall_spop_proto`], a crate of its own: what HAProxy and the agent say (SPOP
//!   frames, their typed data, coraza-spoa's messages, HAProxy's header blocks) and each
//!   connection's decisions (handshake, what is owed, the goodbye), sans-IO, with no runtime
//!   and no engine;
//! - [`engine`]: the connections (listeners, one task per connection carrying out its
//!   decisions, bounded evaluation, one ACK per NOTIFY, the drain recipe);
//! - [`waf`]: the evaluation itself, with libmodsecurity.
//!
//! Beside them: [`config`] reads the command line, the environment and coraza-spoa's YAML
//! in one pass ([`config::parse`]) and compiles the applications, `cli` declares the
//! options and reads Go-style flags, [`autoreload`] reloads on SIGHUP and when the file
//! changes, [`haproxy_check`] reads a user's HAProxy files (`lastcall-spoa check-haproxy`),
//! [`log`] writes the logs (matched rules in coraza-spoa's JSON shape), [`metrics`] holds
//! the Prometheus metrics; the binary (`main.rs`) only wires them to the `lastcall`
//! lifecycle.
#![forbid(unsafe_code)]

pub mod autoreload;
mod cli;
pub mod config;
pub mod engine;
pub mod haproxy_check;
pub mod log;
pub mod metrics;
pub mod waf;
