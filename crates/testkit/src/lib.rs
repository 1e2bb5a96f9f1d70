//! `lastcall-testkit`: the support every integration test of the workspace (and the demo)
//! shares, so that each thing exists once:
//!
//! - [`process`]: a kubelet-like process harness ([`Pod`]: spawn, read output lines,
//!   signal, SIGKILL at a grace period, report how and when the process exited).
//! - [`net`]: free loopback ports, waiting until one accepts connections.
//! - [`http`]: the HTTP/1.1 client (whole answers, keep-alive readers, admin endpoints).
//! - [`metrics`]: the Prometheus scraper (`/metrics` text, one series' value).
//! - [`monitoring`]: the charts' dashboards and alert rules checked against real daemons:
//!   their PromQL parsed, the names served, recorded `/metrics` as `promtool test rules` input.
//! - [`origin`]: a real HTTP/1.1 origin for the proxies under test.
//! - [`wait`]: [`wait_until`], waiting for a condition with a bound.
//! - [`turn`]: a blocking TURN client over UDP with a sequence-numbered ChannelData stream,
//!   TURN REST API credentials, and Wire's zrest credentials as its backend issues them.
//! - [`tls`]: self-signed certificates for the TLS listeners under test.
//! - [`coturn`]: coturn's `turnutils_peer` and `turnutils_uclient` as peers.
//! - [`procfs`]: a process's resident memory (and its peak while something runs), open
//!   descriptors, CPU time and whether it runs, from `/proc` (the `procfs` crate).
//! - [`peers`]: where the peer programs (HAProxy, nginx, coturn's tools) come from.
//! - [`cargo`]: workspace programs a test runs but cargo does not build for it.
//! - [`layering`]: import cycles between a crate's modules (`tests/layering.rs`).
//!
//! Everything is blocking (std threads), bounded by a timeout, on loopback, and panics on
//! failure: a panic is how a test reports it.
#![forbid(unsafe_code)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a failed step panics, failing the test that called it"
)]

pub mod cargo;
pub mod coturn;
pub mod http;
pub mod layering;
pub mod metrics;
pub mod monitoring;
pub mod net;
pub mod origin;
pub mod peers;
pub mod process;
pub mod procfs;
pub mod tls;
pub mod turn;
pub mod wait;

pub use cargo::{bin_path, example_path};
pub use http::{http_get, http_post, try_http};
pub use net::{free_addr, free_port, free_udp_tcp_port, wait_for_tcp};
pub use origin::{Origin, Seen, LEAK_HEADER};
pub use process::{ExitReport, Pod, RolloutReport, Signal};
pub use wait::{wait_for, wait_until, WAIT};
