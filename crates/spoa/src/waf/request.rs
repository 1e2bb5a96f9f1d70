//! A `coraza-req` message: the request through the application's rules, its body checked
//! first, its transaction kept for the response check or finished.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lastcall_modsec::{Intervention, MatchReport, Transaction};
use spop::TypedData;

use super::body::BodyState;
use super::cache::Kept;
use super::matches::{action_name, intervention_vars, log_matches, match_vars, Context, Phases};
use super::{body, App, Waf};
use crate::config::BodyLimitAction;
use crate::engine::{Vars, AGENT_ERROR};
use crate::metrics::Verdict;
use lastcall_spop_proto::coraza::{self, Request};

/// A request transaction after its rules ran: the intervention it stopped at, if any, and
/// which phase logged which lines.
struct Ran {
    tx: Transaction,
    it: Option<Intervention>,
    phases: Phases,
}

impl Waf {
    /// Evaluates a request and runs its logging phase at once; returns the verdict and the
    /// variables.
    #[cfg(test)]
    pub(crate) fn evaluate_request(&self, req: &Request) -> (Verdict, Vars) {
        let mut done = Vec::new();
        let result = self.request(req, None, &mut done);
        super::finish(done);
        result
    }

    /// Evaluates a request; a transaction whose verdict is final (not kept for a response
    /// check) is pushed to `done`, its logging phase still to run.
    pub(super) fn request(
        &self,
        req: &Request,
        frame_size: Option<u32>,
        done: &mut Vec<Transaction>,
    ) -> (Verdict, Vars) {
        let apps = self.current();
        let Some(app) = apps.find(&req.app) else {
            tracing::warn!(app = %req.app, "unknown application and no default_application");
            return (
                Verdict::Error,
                vec![("error", TypedData::Int64(AGENT_ERROR))],
            );
        };
        let id = req.id.clone().unwrap_or_else(|| self.new_id());
        let uri = req.uri();
        tracing::debug!(
            tx = %id, app = %app.config.name, method = %req.method, uri = %uri,
            version = %req.version, headers = req.headers.len(), body = req.body.len(),
            body_size = ?req.body_size, content_length = ?coraza::content_length(&req.headers),
            chunked = coraza::is_chunked(&req.headers),
            "coraza-req received"
        );
        let mut vars: Vars = vec![("id", TypedData::String(id.clone()))];
        if let Some(problem) = &req.problem {
            tracing::warn!(tx = %id, "coraza-req not evaluated: {problem}");
            vars.push(("error", TypedData::Int64(AGENT_ERROR)));
            return (Verdict::Error, vars);
        }
        match body::body_state(req, frame_size) {
            BodyState::Whole => {}
            BodyState::OverBuffer { received, declared } => match app.config.body_limit_action {
                BodyLimitAction::Reject => {
                    self.metrics.truncated("reject");
                    tracing::warn!(
                        tx = %id, received, declared,
                        "request body larger than HAProxy's buffer: denied with 413 (body_limit_action: reject; raise tune.bufsize to inspect larger bodies, docs/spoa.md)"
                    );
                    self.metrics.action(&app.config.name, "deny");
                    vars.push(("action", TypedData::String("deny".into())));
                    vars.push(("status", TypedData::Int64(413)));
                    vars.push(("data", TypedData::String(String::new())));
                    vars.push(("ruleid", TypedData::Int64(0)));
                    match_vars(&MatchReport::default(), req.export_rule_ids, &mut vars);
                    return (Verdict::Deny, vars);
                }
                BodyLimitAction::ProcessPartial => {
                    self.metrics.truncated("process_partial");
                    tracing::info!(
                        tx = %id, received, declared,
                        "request body larger than HAProxy's buffer: inspecting the part received (body_limit_action: process_partial)"
                    );
                }
            },
            BodyState::Conflicting { received, declared } => {
                tracing::warn!(
                    tx = %id, received, declared,
                    "chunked request body counted as {declared} bytes by HAProxy where {received} arrived: the request had both Content-Length and Transfer-Encoding: chunked (HAProxy 2.6 drops the Content-Length but counts it; the shape of request smuggling, which nginx refuses with 400), or HAProxy did not wait for the end of a chunk"
                );
                if app.config.body_limit_action == BodyLimitAction::Reject {
                    self.metrics.action(&app.config.name, "deny");
                    vars.push(("action", TypedData::String("deny".into())));
                    vars.push(("status", TypedData::Int64(400)));
                    vars.push(("data", TypedData::String(String::new())));
                    vars.push(("ruleid", TypedData::Int64(0)));
                    match_vars(&MatchReport::default(), req.export_rule_ids, &mut vars);
                    return (Verdict::Deny, vars);
                }
            }
            BodyState::NotWaited { received, declared } => {
                let policy = app.config.body_limit_action;
                self.metrics.not_waited(policy.as_str());
                if self.warn_not_waited.due(Instant::now()) {
                    tracing::warn!(
                        tx = %id, received, declared, policy = policy.as_str(),
                        "HAProxy sent coraza-req before the request body arrived, so the body cannot be inspected: add `option http-buffer-request` to the frontend (or `http-request wait-for-body time 10s` before `send-spoe-group`); `lastcall-spoa check-haproxy` shows where. Until then such requests are answered with the error variable (body_limit_action: reject), or inspected on the part received (process_partial). Counted in spoa_bodies_not_waited_total; this warning repeats at most once a minute"
                    );
                }
                if policy == BodyLimitAction::Reject {
                    vars.push(("error", TypedData::Int64(AGENT_ERROR)));
                    return (Verdict::Error, vars);
                }
            }
        }
        match self.run_request(&app, req, &id, &uri) {
            Ok(ran) => self.conclude_request(app, ran, req, id, vars, done),
            Err(e) => {
                tracing::error!(tx = %id, "evaluation failed: {e}");
                vars.push(("error", TypedData::Int64(AGENT_ERROR)));
                (Verdict::Error, vars)
            }
        }
    }

    /// The request through the rules, phase by phase, up to an intervention or the end of
    /// phase 2.
    fn run_request(
        &self,
        app: &Arc<App>,
        req: &Request,
        id: &str,
        uri: &str,
    ) -> Result<Ran, lastcall_modsec::Error> {
        let mut tx = Transaction::new(&self.engine, &app.rules, Some(id))?;
        let mut phases = Phases::default();
        let src = req.src_ip.map(|i| i.to_string()).unwrap_or_default();
        let dst = req.dst_ip.map(|i| i.to_string()).unwrap_or_default();
        if let Some(it) = tx.process_connection(&src, req.src_port, &dst, req.dst_port)? {
            return Ok(Ran {
                tx,
                it: Some(it),
                phases,
            });
        }
        let version = if req.version.is_empty() {
            "1.1"
        } else {
            &req.version
        };
        if let Some(it) = tx.process_uri(uri, &req.method, version)? {
            return Ok(Ran {
                tx,
                it: Some(it),
                phases,
            });
        }
        for (k, v) in &req.headers {
            tx.add_request_header(k.as_bytes(), v.as_bytes())?;
        }
        let it = tx.process_request_headers()?;
        phases.ended(&tx, 1);
        if let Some(it) = it {
            return Ok(Ran {
                tx,
                it: Some(it),
                phases,
            });
        }
        if !req.body.is_empty() {
            tx.append_request_body(&req.body)?;
            if let Some(it) = tx.intervention() {
                phases.ended(&tx, 2);
                return Ok(Ran {
                    tx,
                    it: Some(it),
                    phases,
                });
            }
        }
        // Phase 2 runs even without a body: CRS decides most blocks there.
        let it = tx.process_request_body()?;
        phases.ended(&tx, 2);
        Ok(Ran { tx, it, phases })
    }

    /// The verdict on a request whose rules ran, its variables, log lines and counts; its
    /// transaction kept for the response check, or pushed to `done`.
    fn conclude_request(
        &self,
        app: Arc<App>,
        ran: Ran,
        req: &Request,
        id: String,
        mut vars: Vars,
        done: &mut Vec<Transaction>,
    ) -> (Verdict, Vars) {
        let Ran { tx, it, phases } = ran;
        let report = tx.report();
        let client = req.src_ip.map(|i| i.to_string()).unwrap_or_default();
        let uri = req.uri();
        let cx = Context {
            tx: &id,
            app: &app,
            client: &client,
            uri: &uri,
        };
        log_matches(&cx, report, 0, &phases);
        let score = report.estimated_inbound_score();
        // 949110's line, when it reads one way (request bytes imitating it do not).
        let would_block = report
            .matches()
            .iter()
            .any(|m| m.disruptive || (m.id == 949_110 && !m.ambiguous));
        let verdict = match &it {
            Some(it) => {
                let rule = intervention_vars(it, report, &mut vars);
                tracing::info!(tx = %id, app = %app.config.name, status = it.status, rule, score, "request denied");
                Verdict::Deny
            }
            None if app.config.detect_only && would_block => {
                tracing::info!(tx = %id, app = %app.config.name, score, "request would be denied (detect only)");
                Verdict::Detect
            }
            None => Verdict::Allow,
        };
        match_vars(report, req.export_rule_ids, &mut vars);
        let logged = report.matches().len();
        if it.is_some() || !app.config.response_check {
            self.metrics.matched(report);
            self.metrics
                .action(&app.config.name, action_name(it.as_ref()));
        }
        if it.is_none() && app.config.response_check {
            let ttl = Duration::from_millis(app.config.transaction_ttl_ms);
            let limit = app.config.transaction_active_limit;
            let kept = Kept {
                tx,
                app,
                logged,
                client,
                uri,
            };
            let evicted = self.cache.lock().insert(id, kept, ttl, limit);
            self.finish_kept(evicted);
        } else {
            done.push(tx);
        }
        (verdict, vars)
    }
}
