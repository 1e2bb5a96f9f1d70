//! The SPOP connection engine: listeners (TCP, `unix://`), one task per connection,
//! pipelined NOTIFYs evaluated concurrently (bounded per connection, and globally by the
//! evaluation threads of `pool`), every NOTIFY ACKed exactly once, every frame written
//! whole, the drain recipe of `docs/spoa.md`, and the goodbye that rebalances HAProxy's
//! connections.
//!
//! - [`conn`] (in `lastcall-spop-proto`): one connection's decisions, sans-IO (handshake,
//!   what is owed, what to read and when, who writes the ACKs, when to say goodbye and with
//!   what);
//! - `task`: the tokio task that carries them out (reads, writes, evaluations, timers);
//! - `notify`: one NOTIFY's life, from decoded to released, and the guards that hold it;
//! - `ack`: the one way an ACK leaves (written by whoever has it while serving, handed to
//!   the connection while draining);
//! - `pool`: the evaluation threads and their queue;
//! - `budget`: `evaluation_timeout`, and the watchdog that answers for a runaway;
//! - `memory`: the cap on bytes held for frames, all connections together;
//! - `handler`: what the engine asks of the WAF;
//! - `listener`: binding, and what lastcall's accept loop runs for each connection;
//! - `sessions`: the handshaken connections on the admin listener's `/sessions`;
//! - `down`: the holds on the drain of every HAProxy that may still send work, until it has marked the agent DOWN.

mod ack;
mod bind;
mod budget;
mod down;
pub(crate) use down::DOWN_AFTER_CHECKS;
mod handler;
mod listener;
mod memory;
mod notify;
mod pool;
mod sessions;
mod task;

use std::sync::Arc;
use std::time::Duration;

use lastcall::Handle;
use lastcall_spop_proto::conn;
use prometheus_client::metrics::gauge::Gauge;

pub(crate) use bind::Bind;
pub use handler::Handler;
pub(crate) use handler::{Answer, Later, Vars, AGENT_ERROR};
pub use listener::{serve_accepted, Listener};
pub use sessions::COLUMNS as SESSION_COLUMNS;
pub(crate) use task::MAX_UNSENT;

use crate::metrics::Metrics;
use budget::Budget;
use memory::Memory;
use pool::Pool;

/// Engine limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest frame we accept (min'd with HAProxy's in the HELLO).
    pub(crate) max_frame_size: u32,
    /// Concurrent evaluations per connection; reading pauses at the bound.
    pub(crate) max_inflight_per_connection: usize,
    /// A frame started but not finished within this time closes the connection (status 2).
    pub(crate) partial_frame_timeout: Duration,
    /// Agree to `pipelining` when HAProxy's SPOE applet (2.6, 3.0) offers it (default true);
    /// never with the multiplexer of 3.1+ ([`conn::Settings::pipelining`]). Without it,
    /// HAProxy 2.6.12 leaves NOTIFYs queued after an ACK (its sync mode looks at the queue
    /// only when a new message comes: HAProxy bc9fb6462, fixed in 2.8; measured: 17 of
    /// 5,213 requests failed `timeout processing` with 0/-1/-1/-1/5000 queue timers).
    pub(crate) pipelining: bool,
    /// While refusing, a connection with nothing owed says goodbye after nothing came or went
    /// on it for this long ([`DRAIN_QUIET`]); a busy one says it on the ACK of its next
    /// NOTIFY.
    pub(crate) drain_quiet: Duration,
    /// A rebalancing goodbye after this many NOTIFYs on a connection (0: never).
    pub(crate) rebalance_after_messages: u64,
    /// A rebalancing goodbye on a connection at most this long after its handshake (each
    /// connection's age is between half of it and all of it; zero: never).
    pub(crate) rebalance_after: Duration,
    /// Every NOTIFY is answered within this time of its arrival; at the deadline with the
    /// failure verdict ([`budget`]).
    pub(crate) evaluation_timeout: Duration,
    /// Runaways (evaluations past their budget) that get a thread in their place; with that
    /// many running, new NOTIFYs are answered at once with the failure verdict.
    pub(crate) max_overruns: usize,
    /// A connection without HELLO after this long is closed.
    pub(crate) hello_timeout: Duration,
    /// A connection with nothing to do for this long is closed.
    pub(crate) idle_timeout: Duration,
    /// Bytes held for frames, all connections together ([`memory`]).
    pub(crate) max_buffered_bytes: usize,
}

/// Default `max_frame_size`: 4 MiB, above what HAProxy offers for any `tune.bufsize` up to
/// 4 MiB (it offers `tune.bufsize - 4`), so that the documented `tune.bufsize 1114112` (a
/// 1 MiB body whole) is HAProxy's to choose. The agent announces `min(HAProxy's, this)`.
pub(crate) const DEFAULT_MAX_FRAME_SIZE: u32 = 4 * 1024 * 1024;
/// Default `evaluation_timeout`: above the slowest ordinary evaluation measured (0.93 s of CPU
/// for a benign 1 MiB form body on libmodsecurity 3.0.9, the documented `tune.bufsize` full)
/// by four times, below the documented HAProxy `timeout processing` (5 s). Figures in
/// docs/spoa.md, *Limits* and *Request bodies*.
pub(crate) const EVALUATION_TIMEOUT: Duration = Duration::from_secs(4);
/// Default `hello_timeout`: HAProxy sends its HELLO as soon as it connects.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `idle_timeout`: longer than HAProxy's own (`timeout idle` 2m in the documented
/// SPOE file and coraza-spoa's; SPOE.txt's example has `timeout server 3m`), so that HAProxy
/// closes an idle connection first.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Default `max_buffered_bytes`: 64 frames of the largest size.
pub(crate) const MAX_BUFFERED_BYTES: usize = 64 << 20;
/// Default `drain_quiet`.
pub(crate) const DRAIN_QUIET: Duration = Duration::from_millis(500);
/// Default `rebalance_after_messages`.
pub(crate) const REBALANCE_AFTER_MESSAGES: u64 = 0;
/// Default `rebalance_after`.
pub const REBALANCE_AFTER: Duration = Duration::from_secs(1);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            max_inflight_per_connection: 64,
            partial_frame_timeout: Duration::from_secs(30),
            pipelining: true,
            drain_quiet: DRAIN_QUIET,
            rebalance_after_messages: REBALANCE_AFTER_MESSAGES,
            rebalance_after: REBALANCE_AFTER,
            evaluation_timeout: EVALUATION_TIMEOUT,
            max_overruns: 0,
            hello_timeout: HELLO_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_buffered_bytes: MAX_BUFFERED_BYTES,
        }
    }
}

impl Limits {
    /// The settings of the `n`th connection. Its rebalancing age is spread over
    /// [`rebalance_after`](Self::rebalance_after) x [1/2, 1) along a low-discrepancy sequence,
    /// so that connections HAProxy opened together do not say goodbye together (measured
    /// behind HAProxy 3.0 with one age for all: the three agents' shares were 14/49/36 % in
    /// the first rounds, while connections came and went in bursts).
    fn conn_settings(&self, n: u64) -> conn::Settings {
        // The fractional part of n times the golden ratio's conjugate: evenly spread.
        let spread = (n as f64 * 0.618_033_988_749_894_9).fract();
        conn::Settings {
            max_frame_size: self.max_frame_size,
            pipelining: self.pipelining,
            max_inflight: self.max_inflight_per_connection,
            max_unsent: MAX_UNSENT,
            drain_quiet: self.drain_quiet,
            rebalance: conn::Rebalance {
                after_messages: self.rebalance_after_messages,
                after: self.rebalance_after.mul_f64(0.5 + spread / 2.0),
            },
            partial_frame_timeout: self.partial_frame_timeout,
            hello_timeout: self.hello_timeout,
            idle_timeout: self.idle_timeout,
        }
    }
}

/// The engine: what every connection task shares (the handler, the evaluation threads and
/// their budget, the memory cap, the limits, the lifecycle and the metrics).
pub struct Engine {
    /// Connections served so far (each gets its settings from [`Limits::conn_settings`]).
    connections: std::sync::atomic::AtomicU64,
    handler: Arc<dyn Handler>,
    metrics: Arc<Metrics>,
    handle: Handle,
    pool: Arc<Pool>,
    budget: Budget,
    memory: Arc<Memory>,
    limits: Limits,
    down: Arc<down::Down>,
    /// The handshaken connections, for `/sessions`.
    conns: Arc<sessions::Connections>,
}

impl Engine {
    /// `workers` evaluation threads (started here) bound concurrent evaluations across all
    /// connections; `limits.max_overruns` zero means as many as `workers`.
    pub fn new(
        handler: Arc<dyn Handler>,
        metrics: Arc<Metrics>,
        handle: Handle,
        workers: usize,
        limits: Limits,
    ) -> Arc<Self> {
        let max_overruns = match limits.max_overruns {
            0 => workers.max(1),
            n => n,
        };
        let pool = Arc::new(Pool::new(
            workers,
            max_overruns,
            "spoa-eval",
            metrics.overrunning.clone(),
        ));
        let budget = Budget::new(
            limits.evaluation_timeout,
            Arc::clone(&pool),
            Arc::clone(&metrics),
        );
        let memory = Memory::new(limits.max_buffered_bytes, metrics.buffered_bytes.clone());
        Arc::new(Engine {
            connections: std::sync::atomic::AtomicU64::new(0),
            handler,
            metrics,
            handle,
            pool,
            budget,
            memory,
            limits,
            down: Arc::default(),
            conns: Arc::default(),
        })
    }

    /// The agent listens from now: until every HAProxy that may send it work has marked it
    /// DOWN, the drain holds (`engine::down`). Call once, on the runtime, when the listener is
    /// bound and before the lifecycle can start refusing.
    pub fn listening(&self) {
        self.down.listening(&self.handle);
    }

    /// HAProxy's connections as the admin listener's `/sessions` shows and ends them
    /// ([`lastcall::Handle::provide_sessions`]).
    pub fn sessions(&self) -> Arc<dyn lastcall::sessions::SessionTable> {
        Arc::new(sessions::Table {
            conns: Arc::clone(&self.conns),
            down: Arc::clone(&self.down),
        })
    }

    /// The settings of a new connection.
    fn conn_settings(&self) -> conn::Settings {
        let n = self
            .connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.limits.conn_settings(n)
    }

    /// Stops the evaluation threads: what is queued is dropped, and what is running is
    /// waited for, up to `within` (blocking). True when every thread has exited.
    pub fn stop_workers(&self, within: Duration) -> bool {
        self.pool.shutdown(within)
    }
}

/// Holds a gauge one higher while alive: an open (handshaken) connection in
/// `spoa_connections`, a NOTIFY whose ACK is owed in `spoa_inflight` (held by its ticket).
struct GaugeGuard(Gauge);

impl GaugeGuard {
    fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each connection's rebalancing age lies in [rebalance_after / 2, rebalance_after), and
    /// connections opened together get ages spread over that range (no two of the first ten
    /// within a fortieth of it).
    #[test]
    fn rebalancing_ages_are_spread_over_half_to_all_of_rebalance_after() {
        let limits = Limits::default();
        let ages: Vec<Duration> = (0..10)
            .map(|n| limits.conn_settings(n).rebalance.after)
            .collect();
        for a in &ages {
            assert!(*a >= REBALANCE_AFTER / 2 && *a < REBALANCE_AFTER, "{a:?}");
        }
        let mut sorted = ages.clone();
        sorted.sort();
        for w in sorted.windows(2) {
            assert!(w[1] - w[0] >= REBALANCE_AFTER / 40, "{sorted:?}");
        }
        let off = Limits {
            rebalance_after: Duration::ZERO,
            ..Limits::default()
        };
        assert!(off.conn_settings(7).rebalance.after.is_zero());
    }
}
