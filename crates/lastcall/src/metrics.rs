//! The `lastcall_*` Prometheus metrics, and the process's own (`process_*`, client_golang's:
//! [`crate::process`]).

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
    /// `lastcall_sessions_ended_total`: sessions ended by the operator (`DELETE /sessions`).
    pub ended: Counter,
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
        crate::process::register(registry);
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
            "lastcall_sessions_ended",
            "Sessions ended by the operator (DELETE /sessions), as the drain's deadline ends them",
            self.ended.clone(),
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
