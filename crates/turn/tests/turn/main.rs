//! The integration tests of `lastcall-turn`, one test binary: the real process on loopback
//! with coturn's own clients and peers, and our TURN client (`lastcall_testkit::turn`).
//!
//! - `aioice`: aioice's TURN client (Python) through the kernel fast path.
//! - `auth_log`: authentication refusals in the log, with their reason, rate-limited.
//! - `bandwidth`: max-bps and bps-capacity.
//! - `cert_watch`: a Secret-style volume's certificate swapped during a TLS call, no signal.
//! - `churn`: coturn's uclient run after run (UDP, TCP): no 508; RESERVATION-TOKEN 0.
//! - `chromium`: headless Chromium's WebRTC over UDP, TCP and TLS across a drain.
//! - `coturn_configs`: coturn users' turnserver.conf files, unchanged.
//! - `dashboards`: the chart's dashboard and alert rules on a real drain's recorded metrics.
//! - `drain_ends`: every allocation's end ends the drain; the last response is sent first.
//! - `firefox`: headless Firefox's WebRTC (Send and Data indications) through the fast path.
//! - `fleet_nonce`: nonces shared by servers with one secret; the 300 as libwebrtc follows it.
//! - `hostile`: unauthenticated floods: bounded answers, the per-source rate limit.
//! - `idle_reclaim`: a drain ends the allocations of clients that vanished (`--drain-idle-timeout`).
//! - `interop`: coturn's `turnutils_uclient` over UDP, TCP and TLS against `turnutils_peer`.
//! - `kernel`: the kernel fast path (`--kernel-relay`) with uclient's flag sets, IPv4 and IPv6.
//! - `node_ip`: the chart's node ExternalIP lookup against recorded Kubernetes API answers.
//! - `operations`: `GET /`, coturn's metric types (promtool), the Prometheus port, `--validate`.
//! - `privileged`: a port below 1024 as uid 65534 with the file capability; refused without it.
//! - `process`: turnserver.conf, flags, `--help`, TLS reload, the drain's answers.
//! - `sessions`: `/sessions` and `lastcall-turn sessions` with our client and uclient, in a drain.
//! - `signals`: every signal coturn handles, sent during a live call.
//! - `systemd`: Debian's coturn.service (Type=notify, `--pidfile=`) with a real notify socket.
//! - `termination`: calls across SIGTERM, the deadline, alternates, coturn's own behaviour.
//! - `userdb`: coturn's user databases (SQLite, PostgreSQL, Redis) changing and failing under
//!   live calls; `userdb_servers` starts the databases.
//! - `wire`: wire's coturn chart's configuration and command line (dumb-init), brig's zrest
//!   credentials, `CA-file`, the `pre-stop-hook`.
//! - `user_labels`: coturn's `prometheus-username-labels` after real exchanges, bounded.
//! - `workers`: the UDP I/O threads.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

mod aioice;
mod auth_log;
mod bandwidth;
mod cert_watch;
mod chromium;
mod churn;
mod common;
mod coturn_configs;
mod dashboards;
mod drain_ends;
mod firefox;
mod fleet_nonce;
mod hostile;
mod idle_reclaim;
mod interop;
mod kernel;
mod node_ip;
mod operations;
mod privileged;
mod process;
mod sessions;
mod signals;
mod systemd;
mod termination;
mod user_labels;
mod userdb;
mod userdb_servers;
mod wire;
mod workers;
