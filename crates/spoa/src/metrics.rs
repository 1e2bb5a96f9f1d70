//! The agent's Prometheus metrics (the lifecycle's own `lastcall_*` metrics are registered
//! by `lastcall`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use lastcall_modsec::MatchReport;

type Labels = Vec<(&'static str, &'static str)>;
type Named = Vec<(&'static str, String)>;

/// `coraza_anomaly_score`'s buckets (coraza-spoa's, tuned for CRS: one critical rule is 5,
/// the default threshold).
const ANOMALY_SCORE_BUCKETS: [f64; 9] = [0.0, 3.0, 5.0, 7.0, 10.0, 15.0, 25.0, 50.0, 100.0];

/// Whether a rule id is in an attack range coraza-spoa counts in `coraza_rule_triggers_total`:
/// CRS's detection rules (910000-959999) and the local attack rules its README reserves
/// (190000-199999). Initialisation, exclusion and tuning rules stay out of the series.
pub(crate) fn is_attack_rule(id: u32) -> bool {
    (910_000..960_000).contains(&id) || (190_000..200_000).contains(&id)
}

/// A rule's severity as coraza-spoa names it (`[severity "2"]` is `critical`).
fn severity_name(severity: Option<u8>) -> &'static str {
    match severity {
        Some(0) => "emergency",
        Some(1) => "alert",
        Some(2) => "critical",
        Some(3) => "error",
        Some(4) => "warning",
        Some(5) => "notice",
        Some(6) => "info",
        Some(7) => "debug",
        _ => "unknown",
    }
}

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
    engine: Family<Named, Gauge>,
    /// coraza-spoa's `coraza_actions_total{action,application}`: each transaction's final
    /// verdict, once.
    actions: Family<Named, Counter>,
    /// coraza-spoa's `coraza_rule_triggers_total{rule_id,severity}`: each attack-rule match
    /// of a finished transaction.
    rule_triggers: Family<Named, Counter>,
    /// coraza-spoa's `coraza_anomaly_score`: each finished transaction's inbound score.
    anomaly_score: Histogram,
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
            actions: Family::default(),
            rule_triggers: Family::default(),
            anomaly_score: Histogram::new(ANOMALY_SCORE_BUCKETS),
        }
    }

    /// Registers everything under `spoa_`, and coraza-spoa's histogram under its own name.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "coraza_handle_spoe_duration_seconds",
            "Duration of Coraza SPOE handling (coraza-spoa's metric: one observation per message)",
            self.handle_spoe.clone(),
        );
        r.register(
            "coraza_actions",
            "WAF verdicts by action (allow, deny, redirect) and application (a configured name): \
             one per transaction, at the response when the application checks responses \
             (coraza-spoa's metric)",
            self.actions.clone(),
        );
        r.register(
            "coraza_rule_triggers",
            "Matches of attack rules (CRS 910000-959999, local 190000-199999) by rule id and \
             severity, one per match of a finished transaction (coraza-spoa's metric)",
            self.rule_triggers.clone(),
        );
        r.register(
            "coraza_anomaly_score",
            "CRS inbound anomaly score of each finished transaction (coraza-spoa's metric)",
            self.anomaly_score.clone(),
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

    /// Counts a transaction's final verdict (`allow`, `deny` or `redirect`) for the
    /// configured application that decided it.
    pub(crate) fn action(&self, application: &str, action: &'static str) {
        self.actions
            .get_or_create(&vec![
                ("action", action.to_owned()),
                ("application", application.to_owned()),
            ])
            .inc();
    }

    /// Counts what a finished transaction matched: each match of an attack rule
    /// ([`is_attack_rule`]) by rule id and severity, and its inbound anomaly score. Lines
    /// that read more than one way (request bytes imitating rule fields) are left out, so
    /// the rule ids are those of loaded rules, never a client's.
    pub(crate) fn matched(&self, report: &MatchReport) {
        for m in report.matches() {
            if m.ambiguous || !is_attack_rule(m.id) {
                continue;
            }
            self.rule_triggers
                .get_or_create(&vec![
                    ("rule_id", m.id.to_string()),
                    ("severity", severity_name(m.severity).to_owned()),
                ])
                .inc();
        }
        self.anomaly_score
            .observe(f64::from(report.estimated_inbound_score()));
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

    /// coraza-spoa's per-application and per-rule series as its README's table (after
    /// coraza-spoa PR #366) gives them, written for this test: name, type, labels, and the
    /// histogram's buckets. A rename or a changed label here fails.
    #[test]
    fn coraza_spoa_series_have_its_names_labels_and_buckets() {
        const THEIRS: &[(&str, &str, &[&str])] = &[
            (
                "coraza_actions_total",
                "counter",
                &["action", "application"],
            ),
            (
                "coraza_rule_triggers_total",
                "counter",
                &["rule_id", "severity"],
            ),
            ("coraza_anomaly_score", "histogram", &[]),
        ];
        const BUCKETS: &[&str] = &[
            "0.0", "3.0", "5.0", "7.0", "10.0", "15.0", "25.0", "50.0", "100.0", "+Inf",
        ];
        let m = Metrics::default();
        m.action("shop", "allow");
        m.action("shop", "deny");
        m.matched(&MatchReport::default());
        let mut r = Registry::default();
        m.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        for (name, kind, labels) in THEIRS {
            let family = name.strip_suffix("_total").unwrap_or(name);
            assert!(
                text.contains(&format!("# TYPE {family} {kind}\n")),
                "{name}: {text}"
            );
            // coraza_rule_triggers_total has no series without a real match: its labels are
            // checked by coraza_spoa::coraza_spoa_metrics_per_application_and_rule.
            if !labels.is_empty() && *name != "coraza_rule_triggers_total" {
                let series = text
                    .lines()
                    .find(|l| l.starts_with(&format!("{name}{{")))
                    .unwrap_or_else(|| panic!("no {name} series in {text}"));
                let names: Vec<&str> = series[name.len() + 1..]
                    .split('}')
                    .next()
                    .unwrap()
                    .split(',')
                    .map(|kv| kv.split('=').next().unwrap())
                    .collect();
                assert_eq!(names, *labels, "{series}");
            }
        }
        for le in BUCKETS {
            assert!(
                text.contains(&format!("coraza_anomaly_score_bucket{{le=\"{le}\"}} 1")),
                "{le}: {text}"
            );
        }
        assert!(text.contains("coraza_actions_total{action=\"deny\",application=\"shop\"} 1"));
    }

    #[test]
    fn attack_ranges_and_severity_names() {
        for (id, attack) in [
            (901_100, false),
            (909_999, false),
            (910_000, true),
            (942_100, true),
            (959_999, true),
            (960_000, false),
            (980_130, false),
            (189_999, false),
            (190_000, true),
            (199_999, true),
            (200_000, false),
        ] {
            assert_eq!(is_attack_rule(id), attack, "{id}");
        }
        let names: Vec<&str> = (0..=8).map(|s| severity_name(Some(s))).collect();
        assert_eq!(
            names,
            [
                "emergency",
                "alert",
                "critical",
                "error",
                "warning",
                "notice",
                "info",
                "debug",
                "unknown"
            ]
        );
        assert_eq!(severity_name(None), "unknown");
    }
}
