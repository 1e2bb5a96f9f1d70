//! The agent's Prometheus metrics (the lifecycle's own `lastcall_*` metrics are registered
//! by `lastcall`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, &'static str)>;

/// How a request (or response) was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Passed.
    Allow,
    /// Denied (or redirected/dropped).
    Deny,
    /// Rules would have denied, but the application is in detect-only mode.
    Detect,
    /// The agent could not evaluate (unknown app, unknown transaction, engine error).
    Error,
}

impl Verdict {
    /// Label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Detect => "detect",
            Verdict::Error => "error",
        }
    }
}

/// All of the agent's metrics.
#[derive(Debug)]
pub struct Metrics {
    requests: Family<Labels, Counter>,
    responses: Family<Labels, Counter>,
    evaluation: Histogram,
    /// Open SPOP connections (after HELLO; health checks excluded).
    pub(crate) connections: Gauge,
    /// SPOP connections accepted, health checks included.
    pub(crate) connections_total: Counter,
    /// Connections that said a rebalancing goodbye (so that HAProxy places a new one).
    pub(crate) rebalanced: Counter,
    /// The drain's goodbyes on connections HAProxy pipelined on (each risked the NOTIFYs
    /// HAProxy sent as it crossed).
    pub(crate) pipelined_goodbyes: Counter,
    /// NOTIFY frames being evaluated.
    pub(crate) inflight: Gauge,
    rejected: Family<Labels, Counter>,
    reloads: Family<Labels, Counter>,
    truncated: Family<Labels, Counter>,
    not_waited: Family<Labels, Counter>,
    /// Transactions kept for a response check.
    pub(crate) transactions_cached: Gauge,
    /// Transactions dropped because their TTL ran out or the bound was reached.
    pub(crate) transactions_expired: Counter,
    /// coraza-spoa's `coraza_handle_spoe_duration_seconds`: one observation per message.
    handle_spoe: Histogram,
    budget: Family<Labels, Counter>,
    /// Evaluations still running past their budget (answered already).
    pub(crate) overrunning: Gauge,
    /// Bytes held for frames: read buffers and NOTIFYs waiting for or in evaluation.
    pub(crate) buffered_bytes: Gauge,
    /// Connections closed for idleness (no HELLO in time, or idle after it), by when.
    timeouts: Family<Labels, Counter>,
    /// `spoa_engine_info`: the WAF library this process loaded, and its release.
    engine: Family<Vec<(&'static str, String)>, Gauge>,
}

/// The label values each labelled counter can take, created at 0 so that every series
/// exists from the start (an alert on `rate(...)` needs no `or vector(0)`).
const KNOWN: &[(&str, &[&str])] = &[
    ("verdict", &["allow", "deny", "detect", "error"]),
    (
        "reason",
        &[
            "too_big",
            "invalid",
            "bad_hello",
            "fragmented",
            "timeout",
            "resource",
            "other",
        ],
    ),
    ("result", &["ok", "error"]),
    ("policy", &["reject", "process_partial"]),
    ("budget", &["deadline", "overloaded"]),
    ("when", &["hello", "idle"]),
];

/// Creates `family`'s series for every value of `label` in [`KNOWN`] (named `values` there).
fn at_zero(family: &Family<Labels, Counter>, label: &'static str, values: &str) {
    let Some((_, known)) = KNOWN.iter().find(|(k, _)| *k == values) else {
        return;
    };
    for v in *known {
        let _ = family.get_or_create(&vec![(label, *v)]);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Self::empty();
        at_zero(&m.requests, "verdict", "verdict");
        at_zero(&m.responses, "verdict", "verdict");
        at_zero(&m.rejected, "reason", "reason");
        at_zero(&m.reloads, "result", "result");
        at_zero(&m.truncated, "policy", "policy");
        at_zero(&m.not_waited, "policy", "policy");
        at_zero(&m.budget, "reason", "budget");
        at_zero(&m.timeouts, "when", "when");
        m
    }
}

impl Metrics {
    fn empty() -> Self {
        let buckets = [
            0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        ];
        Metrics {
            requests: Family::default(),
            responses: Family::default(),
            evaluation: Histogram::new(buckets),
            connections: Gauge::default(),
            connections_total: Counter::default(),
            rebalanced: Counter::default(),
            pipelined_goodbyes: Counter::default(),
            inflight: Gauge::default(),
            rejected: Family::default(),
            reloads: Family::default(),
            truncated: Family::default(),
            not_waited: Family::default(),
            transactions_cached: Gauge::default(),
            transactions_expired: Counter::default(),
            // Prometheus' Go client's default buckets, as coraza-spoa's histogram has.
            handle_spoe: Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            budget: Family::default(),
            overrunning: Gauge::default(),
            buffered_bytes: Gauge::default(),
            timeouts: Family::default(),
            engine: Family::default(),
        }
    }

    /// Registers everything under `spoa_`, and coraza-spoa's histogram under its own name.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "coraza_handle_spoe_duration_seconds",
            "Duration of Coraza SPOE handling (coraza-spoa's metric: one observation per message)",
            self.handle_spoe.clone(),
        );
        let r = r.sub_registry_with_prefix("spoa");
        r.register(
            "requests",
            "Requests evaluated (coraza-req), by verdict",
            self.requests.clone(),
        );
        r.register(
            "responses",
            "Responses evaluated (coraza-res), by verdict",
            self.responses.clone(),
        );
        r.register(
            "evaluation_duration_seconds",
            "Time from NOTIFY received to ACK ready (queueing for the WAF pool included)",
            self.evaluation.clone(),
        );
        r.register(
            "connections",
            "Open SPOP connections from HAProxy (health checks excluded)",
            self.connections.clone(),
        );
        r.register(
            "connections_accepted",
            "SPOP connections accepted, health checks included",
            self.connections_total.clone(),
        );
        r.register(
            "connections_rebalanced",
            "SPOP connections closed with a rebalancing goodbye on the ACK of their only NOTIFY, so that HAProxy's balance places a new one",
            self.rebalanced.clone(),
        );
        r.register(
            "drain_goodbyes_pipelined",
            "The drain's goodbyes on SPOP connections HAProxy pipelined on (no max-waiting-frames 1), said once no HAProxy had the agent UP: a NOTIFY sent as one crossed it failed",
            self.pipelined_goodbyes.clone(),
        );
        r.register(
            "inflight",
            "NOTIFY frames being evaluated",
            self.inflight.clone(),
        );
        r.register(
            "frames_rejected",
            "Connections closed with AGENT-DISCONNECT because of a bad frame, by reason",
            self.rejected.clone(),
        );
        r.register(
            "reloads",
            "Rule reloads (SIGHUP), by result",
            self.reloads.clone(),
        );
        r.register(
            "truncated_bodies",
            "Bodies larger than HAProxy's buffer (the rest never reached the agent), by policy applied",
            self.truncated.clone(),
        );
        r.register(
            "bodies_not_waited",
            "Requests HAProxy sent before their body arrived (no option http-buffer-request), by policy applied",
            self.not_waited.clone(),
        );
        r.register(
            "transactions_cached",
            "Transactions kept for a response check",
            self.transactions_cached.clone(),
        );
        r.register(
            "transactions_expired",
            "Kept transactions dropped by TTL or bound before their response came",
            self.transactions_expired.clone(),
        );
        r.register(
            "evaluations_failed_closed",
            "NOTIFYs answered with the error variable for lack of time: at evaluation_timeout \
             (deadline), or at once while max_overruns runaways run (overloaded)",
            self.budget.clone(),
        );
        r.register(
            "evaluations_overrunning",
            "Evaluations still running past evaluation_timeout (their NOTIFY answered already)",
            self.overrunning.clone(),
        );
        r.register(
            "buffered_bytes",
            "Bytes held for SPOP frames: read buffers and NOTIFYs waiting for or in evaluation",
            self.buffered_bytes.clone(),
        );
        r.register(
            "engine_info",
            "The WAF engine this process loaded (1): its name and release as the library \
             itself reports them",
            self.engine.clone(),
        );
        r.register(
            "connections_timed_out",
            "Connections closed with nothing to do: no HELLO within hello_timeout (hello), or \
             idle for idle_timeout (idle)",
            self.timeouts.clone(),
        );
    }

    /// Records the engine's name and release (`spoa_engine_info{engine,version} 1`).
    pub fn set_engine(&self, engine: &'static str, version: &str) {
        self.engine
            .get_or_create(&vec![
                ("engine", engine.to_owned()),
                ("version", version.to_owned()),
            ])
            .set(1);
    }

    /// Counts a NOTIFY answered with the error variable for lack of time (`deadline` or
    /// `overloaded`).
    pub(crate) fn failed_closed(&self, reason: &'static str) {
        self.budget.get_or_create(&vec![("reason", reason)]).inc();
    }

    /// Current count of [`failed_closed`](Self::failed_closed) (tests).
    #[cfg(test)]
    pub(crate) fn failed_closed_with(&self, reason: &'static str) -> u64 {
        self.budget.get_or_create(&vec![("reason", reason)]).get()
    }

    /// Counts a connection closed for idleness (`hello` or `idle`).
    pub(crate) fn timed_out(&self, when: &'static str) {
        self.timeouts.get_or_create(&vec![("when", when)]).inc();
    }

    /// Counts a request verdict.
    pub(crate) fn request(&self, v: Verdict) {
        self.requests
            .get_or_create(&vec![("verdict", v.as_str())])
            .inc();
    }

    /// Counts a response verdict.
    pub(crate) fn response(&self, v: Verdict) {
        self.responses
            .get_or_create(&vec![("verdict", v.as_str())])
            .inc();
    }

    /// Current count of a response verdict (tests, logs).
    #[cfg(test)]
    pub(crate) fn responses_with(&self, v: Verdict) -> u64 {
        self.responses
            .get_or_create(&vec![("verdict", v.as_str())])
            .get()
    }

    /// Observes one evaluation's latency.
    pub(crate) fn observe(&self, seconds: f64) {
        self.evaluation.observe(seconds);
    }

    /// Observes how long one message took to handle (coraza-spoa's histogram).
    pub(crate) fn observe_message(&self, seconds: f64) {
        self.handle_spoe.observe(seconds);
    }

    /// Counts a rejected frame.
    pub(crate) fn rejected(&self, reason: &'static str) {
        self.rejected.get_or_create(&vec![("reason", reason)]).inc();
    }

    /// Counts a reload.
    pub(crate) fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reloads.get_or_create(&vec![("result", result)]).inc();
    }

    /// Counts a request sent before its body arrived.
    pub(crate) fn not_waited(&self, policy: &'static str) {
        self.not_waited
            .get_or_create(&vec![("policy", policy)])
            .inc();
    }

    /// Counts a truncated body.
    pub(crate) fn truncated(&self, policy: &'static str) {
        self.truncated
            .get_or_create(&vec![("policy", policy)])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every labelled counter has its known series at 0 before anything happened.
    #[test]
    fn known_series_start_at_zero() {
        let m = Metrics::default();
        let mut r = Registry::default();
        m.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        for line in [
            "spoa_requests_total{verdict=\"deny\"} 0",
            "spoa_responses_total{verdict=\"allow\"} 0",
            "spoa_frames_rejected_total{reason=\"too_big\"} 0",
            "spoa_reloads_total{result=\"ok\"} 0",
            "spoa_reloads_total{result=\"error\"} 0",
            "spoa_truncated_bodies_total{policy=\"reject\"} 0",
            "spoa_bodies_not_waited_total{policy=\"process_partial\"} 0",
            "spoa_evaluations_failed_closed_total{reason=\"deadline\"} 0",
            "spoa_connections_timed_out_total{when=\"idle\"} 0",
        ] {
            assert!(text.contains(line), "no {line} in\n{text}");
        }
    }
}
