//! The `lastcall_*` Prometheus metrics, and the process's own (`process_*`).
//!
//! The `process_*` metrics are those of Prometheus' client libraries, under client_golang's
//! names (what coraza-spoa serves, from its default registry): `process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds`, `process_threads`, `process_start_time_seconds`,
//! `process_network_receive_bytes_total` and `process_network_transmit_bytes_total` (the
//! network namespace's, as client_golang reads them), plus `process_uptime_seconds_total` and
//! `process_clock_time_seconds`. They come from the `kubert-prometheus-process` collector
//! (read from `/proc` at each scrape); `process_start_time_seconds` is the time they were
//! registered, at the daemon's start.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

/// The lifecycle's metrics (cheap clones sharing the same values).
#[derive(Debug, Clone, Default)]
pub(crate) struct Metrics {
    /// `lastcall_drain_phase`: 0 serving, 1 announcing, 2 refusing, 3 lingering.
    pub drain_phase: Gauge,
    /// `lastcall_sessions`.
    pub sessions: Gauge,
    /// `lastcall_peers`.
    pub peers: Gauge,
    /// `lastcall_sessions_refused_total`.
    pub refused: Counter,
    /// `lastcall_reloads_total`.
    pub reloads: Counter,
    /// `lastcall_drain_duration_seconds`, set at exit.
    pub drain_duration: Gauge<f64, AtomicU64>,
    /// `lastcall_drain_timeout_seconds`: `--drain-timeout`, the length of a drain's deadline.
    pub drain_timeout: Gauge<f64, AtomicU64>,
    /// `lastcall_drain_deadline_timestamp_seconds`: when the drain must be over (Unix time),
    /// set when it starts; 0 before.
    pub drain_deadline: Gauge<f64, AtomicU64>,
}

impl Metrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        register_process(registry);
        registry.register(
            "lastcall_drain_phase",
            "Lifecycle phase: 0 serving, 1 announcing, 2 refusing, 3 lingering",
            self.drain_phase.clone(),
        );
        registry.register("lastcall_sessions", "Live sessions", self.sessions.clone());
        registry.register(
            "lastcall_peers",
            "Distinct peers with live sessions",
            self.peers.clone(),
        );
        registry.register(
            "lastcall_sessions_refused",
            "New work refused while draining",
            self.refused.clone(),
        );
        registry.register(
            "lastcall_reloads",
            "Reloads (SIGHUP, SIGUSR2)",
            self.reloads.clone(),
        );
        registry.register_with_unit(
            "lastcall_drain_duration",
            "Time from the drain trigger to the exit, set at exit",
            Unit::Seconds,
            self.drain_duration.clone(),
        );
        registry.register_with_unit(
            "lastcall_drain_timeout",
            "The drain's deadline, counted from its trigger (--drain-timeout)",
            Unit::Seconds,
            self.drain_timeout.clone(),
        );
        registry.register(
            "lastcall_drain_deadline_timestamp_seconds",
            "When the drain must be over (Unix time), set when it starts; 0 before",
            self.drain_deadline.clone(),
        );
    }
}

/// Registers the `process_*` collector in `registry` (see the module docs). A process whose
/// `/proc` cannot be read at start (page size, clock ticks) goes without them, with a warning.
fn register_process(registry: &mut Registry) {
    if let Err(e) =
        kubert_prometheus_process::register(registry.sub_registry_with_prefix("process"))
    {
        tracing::warn!("process_* metrics unavailable: {e}");
    }
}
