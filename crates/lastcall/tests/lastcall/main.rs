//! The integration tests of `lastcall`, one test binary.
//!
//! - `machine`: the sans-IO state machine, every trigger in every phase under every policy.
//! - `lifecycle`: the tokio driver under a paused clock.
//! - `daemon`: the serve entry: Starting, accept loops, the time after the exit decision.
//! - `echo_process`: the echo example as a real process, with real signals.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

mod daemon;
mod echo_process;
mod lifecycle;
mod machine;
