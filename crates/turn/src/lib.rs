//! `lastcall-turn`: a TURN/STUN relay for Kubernetes that reads coturn's configuration and
//! drains without cutting a call.
//!
//! The protocol lives in `lastcall-turn-proto` (sans-IO); this crate owns the sockets (UDP,
//! TCP and TLS client listeners, UDP relay ports), the coturn-compatible configuration,
//! the metrics, and the wiring to the `lastcall` termination lifecycle.
//!
//! Layers, each module using only those above it: the configuration (`options`, `sources`,
//! `config`)
//! and the leaves (`sockets`, `mmsg`, `mailbox`, `metrics`, `ratelog`, `tls`, `certwatch`,
//! which reloads the TLS files when they change, and `usertraffic`, the traffic counters by
//! user); the relay
//! sockets (`relay`); routing what the core returns (`route`); the core behind its lock
//! (`shared`); its drivers (`udp`, `stream`, `timers`, `drain`); the listeners (`listen`);
//! and `server`, which starts them all, and `sessions`, the allocations on the admin listener's
//! `/sessions`. Apart: `nodeip`, the chart's init container's lookup of
//! the node's ExternalIP (`lastcall-turn node-external-ip`), `prestop`, the preStop hook of
//! wire's chart (`pre-stop-hook`), and `privileged`, which raises CAP_NET_BIND_SERVICE for a
//! port below 1024 (or drops it) before any thread starts.
#![forbid(unsafe_code)]

pub mod certwatch;
pub mod config;
mod drain;
mod kernel;
pub mod listen;
mod mailbox;
pub mod metrics;
mod mmsg;
pub mod nodeip;
mod options;
pub mod prestop;
pub mod privileged;
mod ratelog;
mod relay;
mod route;
pub mod server;
pub mod sessions;
mod shared;
mod sockets;
mod sources;
mod stream;
mod timers;
pub mod tls;
mod udp;
pub mod userdb;
pub mod usertraffic;
