//! The integration tests of `lastcall-spoa`, one test binary: the agent process on loopback
//! behind a real HAProxy, with a real origin, libmodsecurity and the CRS.
//!
//! - `bodies`: bodies larger than HAProxy's buffer.
//! - `cli`: `--validate`, configuration errors, process behaviour.
//! - `coraza_spoa`: a coraza-spoa user's files and flags, unchanged.
//! - `crs_regression`: the CRS release's own regression corpus through both, when one is named.
//! - `differential`: the request corpus through nginx + ModSecurity and through the agent.
//! - `docs`: docs/spoa.md shows the configuration the tests run.
//! - `drain`: the drain recipe with two agents under load.
//! - `haproxy`: acceptance: benign traffic passes, attacks are denied.
//! - `hostile`: hostile peers: costly evaluations, strangers' memory, idle connections.
//! - `hung`: a hung (SIGSTOPped) agent fails no request.
//! - `load`: the load measurement (ignored by default).
//! - `protocol`: a raw SPOP client: malformed frames, health checks, pipelining.
//! - `request_bodies`: bodies however HAProxy hands them over: late, chunked, large, HTTP/2.
//! - `rollout`: rolling restarts without a failed request.
//! - `sessions`: `/sessions` and `lastcall-spoa sessions` behind HAProxy and during a drain.
//! - `signals`: signals and deadlines.
//! - `spread`: N agents share the load; a drain moves one share and its successor gets it back.
//!
//! The tests that saturate the CPU run one at a time: the `spoa-heavy` group of
//! `.config/nextest.toml`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

mod bodies;
mod cli;
mod coraza_spoa;
mod crs_regression;
mod differential;
mod docs;
mod drain;
mod haproxy;
mod hostile;
mod hung;
mod load;
mod protocol;
mod request_bodies;
mod rollout;
mod sessions;
mod signals;
mod spread;
mod support;
