//! `lastcall`: the termination lifecycle shared by lastcall's daemons (see
//! `docs/termination.md` for operators).
//!
//! A daemon flattens [`TerminationArgs`] and [`LogArgs`] into its CLI, resolves them with its
//! own [`Defaults`] (every problem reported at once, exit status [`exit::CONFIG`]), creates a
//! [`Lifecycle`], hands [`Handle`]s to its tasks, holds a [`SessionGuard`] per session, serves
//! the [`admin`] listener, and finally awaits [`Lifecycle::run`], which returns the
//! [`Outcome`] (and its exit status) when it is time to leave:
//!
//! ```text
//!  Serving ──trigger──▶ Announcing ──shutdown-delay──▶ Refusing ──idle/threshold/deadline──▶ exit
//! ```
//!
//! The decisions live in a sans-IO state machine ([`machine::Machine`]: `now` and an input
//! in, actions out); [`Lifecycle`] is the thin tokio driver around it. The kubelet-like
//! process harness used by the daemons' tests is [`harness`] (cargo feature `harness`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod config;
pub mod duration;
pub mod exit;
#[cfg(feature = "harness")]
pub mod harness;
pub mod lifecycle;
pub mod logging;
pub mod machine;
mod metrics;

pub use config::{
    parse_cli, parse_cli_from, parse_cli_with, render_help, try_parse_cli_from, try_parse_cli_with,
    ConfigError, Defaults, OnSigterm, TerminationArgs, TerminationConfig,
};
pub use lifecycle::{DrainStatus, Handle, Lifecycle, PeerId, SessionGuard};
pub use logging::{LogArgs, LogFormat};
pub use machine::{EndReason, Outcome, Phase, Trigger};
