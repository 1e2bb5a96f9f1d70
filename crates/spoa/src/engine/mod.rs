//! The SPOP connection engine: listeners (TCP, `unix://`), one task per connection,
//! pipelined NOTIFYs evaluated concurrently (bounded per connection, and globally by the
//! evaluation threads of [`pool`]), every NOTIFY ACKed exactly once, every frame written
//! whole, and the drain recipe of `docs/spoa.md`.
//!
//! - [`conn`]: one connection's decisions, sans-IO (handshake, what is owed, when to say
//!   goodbye and with what);
//! - [`task`]: the tokio task that carries them out (reads, writes, evaluations, timers);
//! - [`ack`]: the one way an ACK leaves (written by whoever has it while serving, handed to
//!   the connection while draining);
//! - [`pool`]: the evaluation threads and their queue;
//! - [`budget`]: `evaluation_timeout`, and the watchdog that answers for a runaway;
//! - [`memory`]: the cap on bytes held for frames, all connections together;
//! - [`handler`]: what the engine asks of the WAF;
//! - [`listener`]: binding, and what lastcall's accept loop runs for each connection.

pub mod ack;
mod bind;
pub mod budget;
pub mod conn;
pub mod handler;
pub mod listener;
pub mod memory;
pub mod pool;
pub mod task;

use std::sync::Arc;
use std::time::Duration;

use lastcall::Handle;
use prometheus_client::metrics::gauge::Gauge;

pub use bind::Bind;
pub use handler::{error_vars, Answer, Handler, Later, Vars, AGENT_ERROR};
pub use listener::{serve_accepted, Accepted, Listener};
pub use task::{serve_conn, Unread};

use crate::metrics::Metrics;
use budget::Budget;
use memory::Memory;
use pool::Pool;

/// Engine limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest frame we accept (min'd with HAProxy's in the HELLO).
    pub max_frame_size: u32,
    /// Concurrent evaluations per connection; reading pauses at the bound.
    pub max_inflight_per_connection: usize,
    /// A frame started but not finished within this time closes the connection (status 2).
    pub partial_frame_timeout: Duration,
    /// Announce `pipelining` when HAProxy offers it (default true). Measured on HAProxy 2.6
    /// (docs/termination.md): without it the drain is race-free (ACK + DISCONNECT on the
    /// connection's only NOTIFY) and fast, but one request in a plain 8,000-request run
    /// then waited 30 s (cause not established), so it stays on.
    pub pipelining: bool,
    /// While refusing, an idle connection is closed only once nothing has come or gone on
    /// it for this long (default zero: at once). Measured only together with
    /// `pipelining: false` (1 s); with pipelining it would only make drains longer.
    pub drain_quiet: Duration,
    /// Every NOTIFY is answered within this time of its arrival; at the deadline with the
    /// failure verdict ([`budget`]).
    pub evaluation_timeout: Duration,
    /// Runaways (evaluations past their budget) that get a thread in their place; with that
    /// many running, new NOTIFYs are answered at once with the failure verdict.
    pub max_overruns: usize,
    /// A connection without HELLO after this long is closed.
    pub hello_timeout: Duration,
    /// A connection with nothing to do for this long is closed.
    pub idle_timeout: Duration,
    /// Bytes held for frames, all connections together ([`memory`]).
    pub max_buffered_bytes: usize,
}

/// Default `max_frame_size`: 4 MiB, above what HAProxy offers for any `tune.bufsize` up to
/// 4 MiB (it offers `tune.bufsize - 4`), so that the documented `tune.bufsize 1114112` (a
/// 1 MiB body whole) is HAProxy's to choose. The agent announces `min(HAProxy's, this)`.
pub const DEFAULT_MAX_FRAME_SIZE: u32 = 4 * 1024 * 1024;
/// Default `evaluation_timeout`: above the slowest ordinary evaluation measured (0.93 s of CPU
/// for a benign 1 MiB form body on libmodsecurity 3.0.9, the documented `tune.bufsize` full)
/// by four times, below the documented HAProxy `timeout processing` (5 s). Figures in
/// docs/spoa.md, *Limits* and *Request bodies*.
pub const EVALUATION_TIMEOUT: Duration = Duration::from_secs(4);
/// Default `hello_timeout`: HAProxy sends its HELLO as soon as it connects.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `idle_timeout`: longer than HAProxy's own (`timeout idle` 2m in the documented
/// SPOE file and coraza-spoa's; SPOE.txt's example has `timeout server 3m`), so that HAProxy
/// closes an idle connection first.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Default `max_buffered_bytes`: 64 frames of the largest size.
pub const MAX_BUFFERED_BYTES: usize = 64 << 20;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            max_inflight_per_connection: 64,
            partial_frame_timeout: Duration::from_secs(30),
            pipelining: true,
            drain_quiet: Duration::ZERO,
            evaluation_timeout: EVALUATION_TIMEOUT,
            max_overruns: 0,
            hello_timeout: HELLO_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_buffered_bytes: MAX_BUFFERED_BYTES,
        }
    }
}

impl Limits {
    fn conn_settings(&self) -> conn::Settings {
        conn::Settings {
            max_frame_size: self.max_frame_size,
            pipelining: self.pipelining,
            max_inflight: self.max_inflight_per_connection,
            drain_quiet: self.drain_quiet,
            partial_frame_timeout: self.partial_frame_timeout,
            hello_timeout: self.hello_timeout,
            idle_timeout: self.idle_timeout,
        }
    }
}

/// What every connection task shares.
pub struct Shared {
    handler: Arc<dyn Handler>,
    metrics: Arc<Metrics>,
    handle: Handle,
    pool: Arc<Pool>,
    budget: Budget,
    memory: Arc<Memory>,
    limits: Limits,
}

impl Shared {
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
        Arc::new(Shared {
            handler,
            metrics,
            handle,
            pool,
            budget,
            memory,
            limits,
        })
    }

    /// Stops the evaluation threads: what is queued is dropped, and what is running is
    /// waited for, up to `within` (blocking). True when every thread has exited.
    pub fn stop_workers(&self, within: Duration) -> bool {
        self.pool.shutdown(within)
    }
}

/// Holds a gauge one higher while alive: an open (handshaken) connection in
/// `spoa_connections`, an evaluation on an I/O thread in `spoa_inflight`.
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
