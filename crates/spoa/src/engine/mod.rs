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
//! - [`handler`]: what the engine asks of the WAF;
//! - [`listener`]: binding, and what lastcall's accept loop runs for each connection.

pub mod ack;
pub mod conn;
pub mod handler;
pub mod listener;
pub mod pool;
pub mod task;

use std::sync::Arc;
use std::time::Duration;

use lastcall::Handle;
use prometheus_client::metrics::gauge::Gauge;

pub use handler::{error_vars, Answer, Handler, Later, Vars, AGENT_ERROR};
pub use listener::{serve_accepted, Accepted, Listener};
pub use task::{serve_conn, Unread};

use crate::config::Evaluation;
use crate::metrics::Metrics;
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
    /// Evaluate on the connection's task while serving ([`Evaluation::Inline`]) or on the
    /// pool (the default).
    pub evaluation: Evaluation,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_size: spop::MAX_FRAME_SIZE_LIMIT,
            max_inflight_per_connection: 64,
            partial_frame_timeout: Duration::from_secs(30),
            pipelining: true,
            drain_quiet: Duration::ZERO,
            evaluation: Evaluation::Pool,
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
        }
    }
}

/// What every connection task shares.
pub struct Shared {
    handler: Arc<dyn Handler>,
    metrics: Arc<Metrics>,
    handle: Handle,
    pool: Pool,
    limits: Limits,
}

impl Shared {
    /// `workers` evaluation threads (started here) bound concurrent evaluations across all
    /// connections.
    pub fn new(
        handler: Arc<dyn Handler>,
        metrics: Arc<Metrics>,
        handle: Handle,
        workers: usize,
        limits: Limits,
    ) -> Arc<Self> {
        Arc::new(Shared {
            handler,
            metrics,
            handle,
            pool: Pool::new(workers, "spoa-eval"),
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
