//! `lastcall`: the termination lifecycle shared by lastcall's daemons (see
//! `docs/termination.md` for operators).
//!
//! A daemon flattens [`TerminationArgs`] and [`LogArgs`] into its CLI and validates them
//! with its own [`Defaults`]; every [`Problem`] (its own too) is reported at once, before any
//! port is bound, with exit status [`exit::CONFIG`]. It then starts a [`Daemon`] (the
//! lifecycle in Starting, signals handled), binds its listeners and hands them to
//! [`Daemon::accept`], serves the [`admin`] listener, says [`Daemon::ready`], and awaits
//! [`Daemon::serve`], which returns when it is time to leave, never later than the
//! deadline plus [`EXIT_GRACE`]. Each connection follows the phase through its [`Watch`] and
//! holds a [`SessionGuard`] per session (and may show them on the admin listener's
//! `/sessions` with [`Handle::provide_sessions`], see [`sessions`]):
//!
//! ```text
//!  Starting ──ready──▶ Serving ──trigger──▶ Announcing ──shutdown-delay──▶ Refusing ──idle/threshold/deadline──▶ exit
//! ```
//!
//! The decisions live in a sans-IO state machine ([`machine::Machine`]: `now` and an input
//! in, actions out); [`Lifecycle`] is the thin tokio driver around it (usable on its own,
//! with triggers from the caller: [`Lifecycle::run_with`]). The daemons' tests drive them with the process harness of
//! `lastcall-testkit`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod config;
pub mod daemon;
pub mod duration;
pub mod exit;
mod exposition;
pub mod lifecycle;
pub mod logging;
pub mod machine;
mod metrics;
mod notify;
pub mod problem;
mod process;
pub mod rfc3339;
pub mod sessions;
pub mod watch;

pub use config::{
    parse_cli, parse_cli_matches_from, try_parse_cli_matches, Defaults, OnSigterm, TerminationArgs,
    TerminationConfig,
};
pub use daemon::{Accept, AcceptUntil, Daemon, Served, Spawner};
pub use lifecycle::{DrainStatus, Handle, HoldGuard, Lifecycle, PeerId, SessionGuard};
pub use logging::{LogArgs, LogFormat};
pub use machine::{EndReason, Outcome, Phase, Trigger, EXIT_GRACE};
pub use problem::{Problem, Problems, Source};
pub use watch::{Seen, Watch};
