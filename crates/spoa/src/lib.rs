//! `lastcall-spoa`: an HAProxy SPOE agent (SPOP 2.0) running ModSecurity with the OWASP Core
//! Rule Set, a drop-in replacement for coraza-spoa that drains gracefully on SIGTERM.
//!
//! Layout: [`frame`] and [`conn`] are the sans-IO protocol core (bytes in, events out);
//! [`server`] is the tokio connection engine (listeners, pipelining, bounded evaluation,
//! drain); [`config`] reads coraza-spoa's YAML; [`message`] decodes the `coraza-req` and
//! `coraza-res` messages; [`waf`] evaluates them with libmodsecurity on the evaluation
//! threads of [`pool`]; [`metrics`] holds the Prometheus metrics; [`out`] lets the evaluation threads write
//! their ACKs to the socket themselves.
#![forbid(unsafe_code)]

pub mod config;
pub mod conn;
pub mod frame;
pub mod message;
pub mod metrics;
pub mod out;
pub mod pool;
pub mod server;
pub mod waf;
