//! The integration tests of `lastcall-modsec`, one test binary: real libmodsecurity with
//! Debian's OWASP CRS.
//!
//! - `engine`: rules, phases, interventions, the CRS options.
//! - `resources`: threads, memory and the one engine per process.
//! - `accounting`: the bytes malloc holds after N transactions of each kind of traffic.
//! - `forged`: request bytes imitating libmodsecurity's log fields are not read as rule fields.
//! - `recommended`: `@coraza.conf-recommended` against Coraza's file, rule for rule.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

mod accounting;
mod common;
mod engine;
mod forged;
mod recommended;
mod resources;
