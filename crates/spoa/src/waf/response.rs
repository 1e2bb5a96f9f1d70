//! A `coraza-res` message: the response through the transaction its request left
//! behind, now or (`detect-only`) after the ACK.

use std::sync::Arc;

use lastcall_modsec::Intervention;
use spop::TypedData;

use super::cache::Kept;
use super::matches::{action_name, intervention_vars, log_matches, match_vars, Context, Phases};
use super::Waf;
use crate::engine::{Later, Vars, AGENT_ERROR};
use crate::metrics::{Metrics, Verdict};
use lastcall_spop_proto::coraza::Response;

impl Waf {
    /// Evaluates a response against the transaction its request left behind.
    ///
    /// `None` when the response's application does not inspect responses (`response_check:
    /// false`): nothing to decide, nothing counted.
    pub(crate) fn evaluate_response(&self, res: &Response) -> Option<(Verdict, Vars)> {
        let apps = self.current();
        if let Some(app) = apps.find(&res.app) {
            if !app.config.response_check {
                return None;
            }
        }
        let kept = match self.take_kept(res) {
            Ok(kept) => kept,
            Err(vars) => return Some((Verdict::Error, vars)),
        };
        Some(evaluate_kept_response(&self.metrics, kept, res))
    }

    /// The transaction `res` belongs to, taken out of the cache; the error answer when
    /// there is none.
    fn take_kept(&self, res: &Response) -> Result<Kept, Vars> {
        if let Some(problem) = &res.problem {
            tracing::warn!(tx = %res.id, "coraza-res not evaluated: {problem}");
            return Err(vec![("error", TypedData::Int64(AGENT_ERROR))]);
        }
        let kept = self.cache.lock().map.remove(&res.id).map(|(_, k)| k);
        self.count_cached();
        kept.ok_or_else(|| {
            tracing::warn!(tx = %res.id, "response for an unknown or expired transaction (response_check off, or transaction_ttl_ms too short)");
            vec![("error", TypedData::Int64(AGENT_ERROR))]
        })
    }

    /// A `detect-only` response: no variables now; the evaluation, its log lines and its
    /// count come after the ACK, and a verdict is never given (coraza-spoa's meaning).
    /// `None` when the application does not inspect responses; the error answer when the
    /// transaction is unknown.
    pub(super) fn detect_only_response(&self, res: Response) -> Option<Result<Later, Vars>> {
        if !self.current().find(&res.app)?.config.response_check {
            return None;
        }
        let kept = match self.take_kept(&res) {
            Ok(kept) => kept,
            Err(vars) => return Some(Err(vars)),
        };
        let metrics = Arc::clone(&self.metrics);
        Some(Ok(Later::new(move || {
            let (verdict, _) = evaluate_kept_response(&metrics, kept, &res);
            let verdict = match verdict {
                Verdict::Deny => Verdict::Detect,
                other => other,
            };
            metrics.response(verdict);
        })))
    }
}

/// Evaluates a response against its kept transaction, logs what it matched, and runs the
/// logging phase.
fn evaluate_kept_response(metrics: &Metrics, kept: Kept, res: &Response) -> (Verdict, Vars) {
    let Kept {
        mut tx,
        app,
        logged,
        client,
        uri,
    } = kept;
    if res.body_truncated() {
        metrics.truncated("process_partial");
    }
    let mut phases = Phases(vec![(logged, 2)]);
    let result = (|| -> Result<Option<Intervention>, lastcall_modsec::Error> {
        for (k, v) in &res.headers {
            tx.add_response_header(k.as_bytes(), v.as_bytes())?;
        }
        let status = u16::try_from(res.status).unwrap_or(200);
        let version = if res.version.is_empty() {
            "1.1"
        } else {
            &res.version
        };
        let it = tx.process_response_headers(status, &format!("HTTP/{version}"))?;
        phases.ended(&tx, 3);
        if let Some(it) = it {
            return Ok(Some(it));
        }
        if !res.body.is_empty() {
            tx.append_response_body(&res.body)?;
        }
        let it = tx.process_response_body();
        phases.ended(&tx, 4);
        it
    })();
    let report = tx.report();
    let cx = Context {
        tx: &res.id,
        app: &app,
        client: &client,
        uri: &uri,
    };
    log_matches(&cx, report, logged, &phases);
    let mut vars: Vars = Vec::new();
    // A detect-only response gives no verdict (coraza-spoa's meaning): allowed. A failed
    // evaluation gives none at all.
    let action = result
        .as_ref()
        .ok()
        .map(|it| action_name(it.as_ref().filter(|_| !res.detect_only)));
    let verdict = match result {
        Err(e) => {
            tracing::error!(tx = %res.id, "response evaluation failed: {e}");
            vars.push(("error", TypedData::Int64(AGENT_ERROR)));
            Verdict::Error
        }
        Ok(Some(it)) => {
            let rule = intervention_vars(&it, report, &mut vars);
            tracing::info!(tx = %res.id, app = %app.config.name, rule, "response denied");
            Verdict::Deny
        }
        Ok(None) => {
            let detect = (app.config.detect_only || res.detect_only)
                && report
                    .matches()
                    .iter()
                    .any(|m| m.disruptive || (m.id == 959_100 && !m.ambiguous));
            if detect {
                Verdict::Detect
            } else {
                Verdict::Allow
            }
        }
    };
    // The action last: a scrape that sees it sees the rest of the transaction.
    metrics.matched(report);
    if let Some(action) = action {
        metrics.action(&app.config.name, action);
    }
    if !matches!(verdict, Verdict::Error) {
        match_vars(report, res.export_rule_ids, &mut vars);
        vars.push((
            "outbound_anomaly_score",
            TypedData::Int64(i64::from(report.estimated_outbound_score())),
        ));
    }
    let _ = tx.process_logging();
    (verdict, vars)
}
