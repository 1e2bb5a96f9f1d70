//! The WAF: `coraza-req` / `coraza-res` messages through libmodsecurity, and the variables
//! set back in HAProxy (coraza-spoa's names, types and meanings).
//!
//! Everything here is blocking and CPU-bound: the engine calls [`Waf`]'s
//! [`Handler::handle`] on an evaluation thread, never on an async worker, and asks
//! [`Handler::answer_inline`] first, on the connection task, whether the engine is needed at
//! all. The logging phase (phase 5) and a transaction's cleanup come back with the answer as
//! a `Later`, which the engine runs once the ACK is written, as nginx runs ModSecurity's log
//! phase after the response; so does the whole evaluation of a `detect-only` response.
//!
//! Each matched rule is one log line (the application's log, else the process log): its id,
//! message, matched data, severity, file, line and phase, with the transaction id; in a
//! JSON log in coraza-spoa's shape ([`crate::log`]).
//!
//! - the applications' compiled rules ([`Apps`], from `crate::config::apps`) are swapped
//!   all at once by a reload (`Waf::swap`; evaluations already running keep the rules they
//!   started with);
//! - `body`: whether HAProxy handed over the whole request body;
//! - `cache`: request transactions kept for their response check.

mod body;
mod cache;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lastcall_modsec::{Intervention, MatchReport, ModSecurity, Transaction};
use parking_lot::{Mutex, RwLock};
use spop::frame::Message;
use spop::TypedData;

pub use crate::config::apps::directives_for;
pub(crate) use crate::config::apps::{App, Apps};
use cache::{Kept, TxCache};

use crate::config::BodyLimitAction;
use crate::engine::{Answer, Handler, Later, Vars, AGENT_ERROR};
use crate::log::{RuleLines, RULE_TARGET};
use crate::metrics::{Metrics, Verdict};
use crate::protocol::coraza::{self, Request, Response, REQUEST_MESSAGE, RESPONSE_MESSAGE};
use body::BodyState;

/// Runs the logging phase of finished request transactions, then frees them.
fn finish(txs: impl IntoIterator<Item = Transaction>) {
    for mut tx in txs {
        let _ = tx.process_logging();
    }
}

/// Whether coraza-spoa counts rule `id` in `rules_hit` and `rule_ids`: CRS's attack ranges
/// (910000-959999) and the range its README gives local attack rules (190000-199999).
/// Exclusions, set-up and correlation rules are not attacks.
pub fn is_attack_rule(id: u32) -> bool {
    (910_000..960_000).contains(&id) || (190_000..200_000).contains(&id)
}

/// The attack rules a transaction matched so far, once each, in order (rules without a
/// message are control flow, not matches).
fn attack_rules(report: &MatchReport) -> Vec<u32> {
    let mut ids = Vec::new();
    for m in report.matches() {
        if is_attack_rule(m.id) && !m.msg.is_empty() && !ids.contains(&m.id) {
            ids.push(m.id);
        }
    }
    ids
}

/// coraza-spoa's variables for what a transaction matched: `rules_hit` (how many attack
/// rules), `anomaly_score` (CRS's inbound score), and with `exportRuleIDs` `rule_ids` (their
/// ids, comma-separated).
fn match_vars(report: &MatchReport, export_rule_ids: bool, vars: &mut Vars) {
    let ids = attack_rules(report);
    vars.push(("rules_hit", TypedData::Int64(ids.len() as i64)));
    vars.push((
        "anomaly_score",
        TypedData::Int64(i64::from(report.estimated_inbound_score())),
    ));
    if export_rule_ids {
        let joined = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        vars.push(("rule_ids", TypedData::String(joined)));
    }
}

/// The variables of a disruptive intervention: `action`, `status`, `data`, `ruleid`.
/// The action a transaction ended with, as `coraza_actions_total` and the `action`
/// variable name it: `redirect` for an intervention with a URL, `deny` for another,
/// `allow` without one.
fn action_name(it: Option<&Intervention>) -> &'static str {
    match it {
        Some(it) if it.url.is_some() => "redirect",
        Some(_) => "deny",
        None => "allow",
    }
}

fn intervention_vars(it: &Intervention, report: &MatchReport, vars: &mut Vars) -> u32 {
    let action = action_name(Some(it));
    let data = it.url.clone().unwrap_or_default();
    let rule = it
        .rule_id()
        .or_else(|| {
            report
                .matches()
                .iter()
                .rev()
                .find(|m| m.disruptive)
                .map(|m| m.id)
        })
        .unwrap_or(0);
    vars.push(("action", TypedData::String(action.into())));
    vars.push(("status", TypedData::Int64(i64::from(it.status))));
    vars.push(("data", TypedData::String(data)));
    vars.push(("ruleid", TypedData::Int64(i64::from(rule))));
    rule
}

/// What a log line says about the request a rule matched in.
struct Context<'a> {
    tx: &'a str,
    app: &'a App,
    client: &'a str,
    uri: &'a str,
}

/// Where each phase's log lines end in a transaction's report: libmodsecurity's lines,
/// but for a disruptive one, do not say their phase; the call that produced them does.
#[derive(Debug, Default, Clone)]
struct Phases(Vec<(usize, u8)>);

impl Phases {
    /// SecLang phase `phase` has run on `tx`: the lines logged so far and not yet placed
    /// are its.
    fn ended(&mut self, tx: &Transaction, phase: u8) {
        self.0.push((tx.report().matches().len(), phase));
    }

    /// The phase of the report's `index`th line.
    fn of(&self, index: usize) -> Option<u8> {
        self.0
            .iter()
            .find(|(end, _)| index < *end)
            .map(|&(_, phase)| phase)
    }
}

/// One log line per matched rule (the report's lines from `from` on), at the level
/// coraza-spoa gives its severity (WARNING warn, NOTICE and INFO info, DEBUG debug,
/// anything graver error): coraza-spoa's JSON object under `match`, or fields.
fn log_matches(cx: &Context<'_>, report: &MatchReport, from: usize, phases: &Phases) {
    let matches = report.matches().get(from..).unwrap_or_default();
    if matches.is_empty() {
        return;
    }
    cx.app.in_log(|| {
        let coraza = cx.app.rule_lines() == RuleLines::Coraza;
        let req = crate::log::Request {
            tx: cx.tx,
            client: cx.client,
            uri: cx.uri,
        };
        for (i, m) in matches.iter().enumerate() {
            let phase = m.phase.or_else(|| phases.of(from + i));
            if coraza {
                macro_rules! line {
                    ($level:ident) => {
                        tracing::$level!(
                            target: RULE_TARGET,
                            coraza_match = crate::log::coraza_match(m, phase, &req).as_str(),
                            "rule matched"
                        )
                    };
                }
                match m.severity {
                    Some(4) => line!(warn),
                    Some(5 | 6) => line!(info),
                    Some(7) => line!(debug),
                    _ => line!(error),
                }
                continue;
            }
            let severity = m.severity.map_or("", severity_name);
            let tags = m.tags.join(",");
            macro_rules! line {
                ($level:ident) => {
                    tracing::$level!(
                        target: RULE_TARGET,
                        tx = cx.tx,
                        app = %cx.app.config.name,
                        rule_id = m.id,
                        severity,
                        msg = m.msg.as_str(),
                        data = m.data.as_str(),
                        tags = tags.as_str(),
                        disruptive = m.disruptive,
                        ambiguous = m.ambiguous.then_some(true),
                        file = m.file.as_str(),
                        line = m.file_line,
                        phase = phase.unwrap_or(0),
                        client = cx.client,
                        uri = cx.uri,
                        "rule matched"
                    )
                };
            }
            match m.severity {
                Some(4) => line!(warn),
                Some(5 | 6) => line!(info),
                Some(7) => line!(debug),
                _ => line!(error),
            }
        }
    });
}

fn severity_name(s: u8) -> &'static str {
    match s {
        0 => "EMERGENCY",
        1 => "ALERT",
        2 => "CRITICAL",
        3 => "ERROR",
        4 => "WARNING",
        5 => "NOTICE",
        6 => "INFO",
        _ => "DEBUG",
    }
}

/// The WAF: the engine, the current applications, kept transactions and metrics.
pub struct Waf {
    engine: Arc<ModSecurity>,
    apps: RwLock<Arc<Apps>>,
    cache: Mutex<TxCache>,
    metrics: Arc<Metrics>,
    ids: AtomicU64,
    warn_not_waited: RateLimit,
}

/// At most one event per minute (the warnings a misconfigured HAProxy would repeat for every
/// request).
#[derive(Debug, Default)]
struct RateLimit(Mutex<Option<Instant>>);

impl RateLimit {
    /// Whether an event at `now` may be reported (and if so, the minute starts now).
    fn due(&self, now: Instant) -> bool {
        let mut last = self.0.lock();
        match *last {
            Some(t) if now.duration_since(t) < Duration::from_secs(60) => false,
            _ => {
                *last = Some(now);
                true
            }
        }
    }
}

impl std::fmt::Debug for Waf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waf").finish_non_exhaustive()
    }
}

impl Waf {
    /// A WAF running `apps`.
    pub fn new(engine: Arc<ModSecurity>, apps: Apps, metrics: Arc<Metrics>) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
        Waf {
            engine,
            apps: RwLock::new(Arc::new(apps)),
            cache: Mutex::new(TxCache::default()),
            metrics,
            ids: AtomicU64::new(seed | 1),
            warn_not_waited: RateLimit::default(),
        }
    }

    /// Replaces all applications at once. Evaluations in progress finish with the rules
    /// they started with; kept transactions keep theirs.
    pub(crate) fn swap(&self, apps: Apps) {
        let new = Arc::new(apps);
        *self.apps.write() = new;
    }

    fn current(&self) -> Arc<Apps> {
        Arc::clone(&self.apps.read())
    }

    /// Frees kept transactions whose TTL ran out (call periodically).
    pub fn expire(&self) {
        let expired = self.cache.lock().expire(Instant::now());
        self.finish_kept(expired);
    }

    fn finish_kept(&self, kept: Vec<Kept>) {
        for mut k in kept {
            self.metrics.transactions_expired.inc();
            // No verdict came: what the request matched is counted, no action.
            self.metrics.matched(k.tx.report());
            let _ = k.tx.process_logging();
        }
        self.count_cached();
    }

    fn count_cached(&self) {
        let n = self.cache.lock().map.len();
        self.metrics
            .transactions_cached
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    fn new_id(&self) -> String {
        // xorshift64*: unique enough for transaction ids (16 upper-case letters, like
        // coraza-spoa's generated ids).
        let mut x = self.ids.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let mut v = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (0..16)
            .map(|_| {
                let c = char::from(b'A' + (v % 26) as u8);
                v /= 26;
                if v == 0 {
                    v = x.rotate_left(17) | 1;
                }
                c
            })
            .collect()
    }

    /// Evaluates a request and runs its logging phase at once; returns the verdict and the
    /// variables.
    #[cfg(test)]
    pub(crate) fn evaluate_request(&self, req: &Request) -> (Verdict, Vars) {
        let mut done = Vec::new();
        let result = self.request(req, None, &mut done);
        finish(done);
        result
    }

    /// Evaluates a request; a transaction whose verdict is final (not kept for a response
    /// check) is pushed to `done`, its logging phase still to run.
    fn request(
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
        let mut phases = Phases::default();
        match self.run_request(&app, req, &id, &uri, &mut phases) {
            Ok((tx, it)) => self.conclude_request(app, tx, it, &phases, req, id, vars, done),
            Err(e) => {
                tracing::error!(tx = %id, "evaluation failed: {e}");
                vars.push(("error", TypedData::Int64(AGENT_ERROR)));
                (Verdict::Error, vars)
            }
        }
    }

    fn run_request(
        &self,
        app: &Arc<App>,
        req: &Request,
        id: &str,
        uri: &str,
        phases: &mut Phases,
    ) -> Result<(Transaction, Option<Intervention>), lastcall_modsec::Error> {
        let mut tx = Transaction::new(&self.engine, &app.rules, Some(id))?;
        let src = req.src_ip.map(|i| i.to_string()).unwrap_or_default();
        let dst = req.dst_ip.map(|i| i.to_string()).unwrap_or_default();
        if let Some(it) = tx.process_connection(&src, req.src_port, &dst, req.dst_port)? {
            return Ok((tx, Some(it)));
        }
        let version = if req.version.is_empty() {
            "1.1"
        } else {
            &req.version
        };
        if let Some(it) = tx.process_uri(uri, &req.method, version)? {
            return Ok((tx, Some(it)));
        }
        for (k, v) in &req.headers {
            tx.add_request_header(k.as_bytes(), v.as_bytes())?;
        }
        let it = tx.process_request_headers()?;
        phases.ended(&tx, 1);
        if let Some(it) = it {
            return Ok((tx, Some(it)));
        }
        if !req.body.is_empty() {
            tx.append_request_body(&req.body)?;
            if let Some(it) = tx.intervention() {
                phases.ended(&tx, 2);
                return Ok((tx, Some(it)));
            }
        }
        // Phase 2 runs even without a body: CRS decides most blocks there.
        let it = tx.process_request_body()?;
        phases.ended(&tx, 2);
        Ok((tx, it))
    }

    #[allow(clippy::too_many_arguments)]
    fn conclude_request(
        &self,
        app: Arc<App>,
        tx: Transaction,
        it: Option<Intervention>,
        phases: &Phases,
        req: &Request,
        id: String,
        mut vars: Vars,
        done: &mut Vec<Transaction>,
    ) -> (Verdict, Vars) {
        let report = tx.report();
        let client = req.src_ip.map(|i| i.to_string()).unwrap_or_default();
        let uri = req.uri();
        let cx = Context {
            tx: &id,
            app: &app,
            client: &client,
            uri: &uri,
        };
        log_matches(&cx, report, 0, phases);
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
    fn detect_only_response(&self, res: Response) -> Option<Result<Later, Vars>> {
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

impl Waf {
    /// The answer to a NOTIFY's messages, received on a connection whose frame size is
    /// `frame_size` (if known).
    fn answer(&self, messages: &[Message], frame_size: Option<u32>) -> Answer {
        let mut vars = Vars::new();
        let mut done = Vec::new();
        let mut later = Vec::new();
        for m in messages {
            let started = Instant::now();
            match m.name.as_str() {
                REQUEST_MESSAGE => {
                    let (v, more) = self.request(&Request::from_message(m), frame_size, &mut done);
                    self.metrics.request(v);
                    vars.extend(more);
                }
                RESPONSE_MESSAGE => {
                    let res = Response::from_message(m);
                    if res.detect_only {
                        match self.detect_only_response(res) {
                            Some(Ok(l)) => later.push(l),
                            Some(Err(more)) => {
                                self.metrics.response(Verdict::Error);
                                vars.extend(more);
                            }
                            None => {}
                        }
                    } else if let Some((v, more)) = self.evaluate_response(&res) {
                        self.metrics.response(v);
                        vars.extend(more);
                    }
                }
                other => {
                    tracing::debug!(message = other, "ignoring unknown SPOE message");
                }
            }
            self.metrics
                .observe_message(started.elapsed().as_secs_f64());
        }
        let later = if done.is_empty() && later.is_empty() {
            Later::none()
        } else {
            Later::new(move || {
                finish(done);
                for l in later {
                    l.run();
                }
            })
        };
        Answer { vars, later }
    }
}

impl Handler for Waf {
    fn handle(&self, messages: &[Message]) -> Answer {
        self.answer(messages, None)
    }

    fn handle_framed(&self, messages: &[Message], frame_size: u32) -> Answer {
        self.answer(messages, Some(frame_size))
    }

    /// The transaction id of the first `coraza-req` (its `id` argument, else one generated
    /// now and added to the message, so that the evaluation uses the same one), else the
    /// `id` of the first `coraza-res`.
    fn identify(&self, messages: &mut [Message]) -> Option<String> {
        let given = |m: &Message| {
            m.args
                .iter()
                .rev()
                .find_map(|(name, v)| match (name.as_str(), v) {
                    ("id", TypedData::String(s)) if !s.is_empty() => Some(s.clone()),
                    _ => None,
                })
        };
        if let Some(req) = messages.iter_mut().find(|m| m.name == REQUEST_MESSAGE) {
            if let Some(id) = given(req) {
                return Some(id);
            }
            let id = self.new_id();
            req.args.push(("id".into(), TypedData::String(id.clone())));
            return Some(id);
        }
        messages
            .iter()
            .find(|m| m.name == RESPONSE_MESSAGE)
            .and_then(given)
    }

    /// Inline when every message is a `coraza-res` of an application without response
    /// checks, or unknown: exactly the messages [`handle`](Self::handle) answers with no
    /// variables and no metric.
    fn answer_inline(&self, messages: &[Message]) -> Option<Vars> {
        let started = Instant::now();
        let mut apps = None;
        for m in messages {
            match m.name.as_str() {
                REQUEST_MESSAGE => return None,
                RESPONSE_MESSAGE => {
                    let apps = apps.get_or_insert_with(|| self.current());
                    let app = apps.find(&coraza::app_of(m))?;
                    if app.config.response_check {
                        return None;
                    }
                }
                other => {
                    tracing::debug!(message = other, "ignoring unknown SPOE message");
                }
            }
        }
        for _ in messages {
            self.metrics
                .observe_message(started.elapsed().as_secs_f64());
        }
        Some(Vars::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const RULES: &str = "\
SecRuleEngine On
SecRequestBodyAccess On
SecResponseBodyAccess On
SecResponseBodyMimeType text/html
SecRule ARGS \"@contains evil\" \"id:190001,phase:2,deny,status:403,log,msg:'evil arg'\"
SecRule ARGS \"@contains odd\" \"id:190003,phase:2,pass,log,msg:'odd arg',severity:4\"
SecRule ARGS \"@contains odd\" \"id:100001,phase:2,pass,log,msg:'tuning rule, not an attack'\"
SecRule RESPONSE_HEADERS:X-Leak \"@streq yes\" \"id:190002,phase:3,deny,status:403,log,msg:'leak'\"
SecRule RESPONSE_HEADERS:X-Odd \"@streq yes\" \"id:190004,phase:3,pass,log,msg:'odd header'\"
";

    fn waf(yaml_extra: &str) -> (Waf, Arc<Metrics>) {
        let yaml = format!(
            "default_application: a\napplications:\n  - name: a\n    directives: |\n{}{yaml_extra}",
            RULES
                .lines()
                .map(|l| format!("      {l}\n"))
                .collect::<String>()
        );
        let cfg = Config::parse(&yaml).unwrap();
        let apps = Apps::compile(&cfg).unwrap();
        let metrics = Arc::new(Metrics::default());
        let engine = ModSecurity::new().unwrap();
        (Waf::new(engine, apps, Arc::clone(&metrics)), metrics)
    }

    fn req(query: &str) -> Request {
        Request {
            app: "a".into(),
            method: "GET".into(),
            path: "/p".into(),
            query: Some(query.into()),
            version: "1.1".into(),
            headers: vec![("Host".into(), "x".into())],
            ..Request::default()
        }
    }

    fn var<'a>(vars: &'a Vars, name: &str) -> Option<&'a TypedData> {
        vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    #[test]
    fn deny_sets_coraza_variables() {
        let (w, _) = waf("");
        let (v, vars) = w.evaluate_request(&req("q=evil"));
        assert_eq!(v, Verdict::Deny);
        assert_eq!(
            var(&vars, "action"),
            Some(&TypedData::String("deny".into()))
        );
        assert_eq!(var(&vars, "status"), Some(&TypedData::Int64(403)));
        assert_eq!(var(&vars, "ruleid"), Some(&TypedData::Int64(190001)));
        // coraza-spoa's types: a count, and the ids only when asked for.
        assert_eq!(var(&vars, "rules_hit"), Some(&TypedData::Int64(1)));
        assert!(var(&vars, "rule_ids").is_none());
        assert_eq!(var(&vars, "anomaly_score"), Some(&TypedData::Int64(0)));
        let (v, vars) = w.evaluate_request(&req("q=good"));
        assert_eq!(v, Verdict::Allow);
        assert!(var(&vars, "action").is_none());
        assert!(matches!(var(&vars, "id"), Some(TypedData::String(s)) if s.len() == 16));
    }

    /// `exportRuleIDs` adds `rule_ids`: the attack rules matched (coraza-spoa's ranges:
    /// 910000-959999, 190000-199999), as `rules_hit` counts them; a tuning rule (100001)
    /// is in neither.
    #[test]
    fn rule_ids_when_exported() {
        let (w, _) = waf("");
        let mut r = req("q=odd&p=odd");
        r.export_rule_ids = true;
        let (v, vars) = w.evaluate_request(&r);
        assert_eq!(v, Verdict::Allow);
        assert_eq!(var(&vars, "rules_hit"), Some(&TypedData::Int64(1)));
        assert_eq!(
            var(&vars, "rule_ids"),
            Some(&TypedData::String("190003".into()))
        );
        r.query = Some("q=good".into());
        let (_, vars) = w.evaluate_request(&r);
        assert_eq!(
            var(&vars, "rule_ids"),
            Some(&TypedData::String(String::new()))
        );
        assert_eq!(var(&vars, "rules_hit"), Some(&TypedData::Int64(0)));
    }

    /// A `detect-only` response is answered with no variables at all; its evaluation comes
    /// with the answer's deferred work, and is counted (as `detect` when the rules would
    /// have denied) once that has run. The transaction is consumed either way.
    #[test]
    fn detect_only_responses_answer_at_once_and_never_deny() {
        let (w, m) = waf("    response_check: true\n");
        let mut r = req("q=good");
        r.id = Some("TX9".into());
        assert_eq!(w.evaluate_request(&r).0, Verdict::Allow);
        let res = Message {
            name: RESPONSE_MESSAGE.into(),
            args: vec![
                ("app".into(), TypedData::String("a".into())),
                ("id".into(), TypedData::String("TX9".into())),
                ("version".into(), TypedData::String("1.1".into())),
                ("status".into(), TypedData::Int32(200)),
                (
                    "headers".into(),
                    TypedData::String("x-leak: yes\r\n\r\n".into()),
                ),
                ("exportRuleIDs".into(), TypedData::Bool(true)),
                ("detect-only".into(), TypedData::Bool(true)),
            ],
        };
        let answer = w.handle(std::slice::from_ref(&res));
        assert!(answer.vars.is_empty(), "{:?}", answer.vars);
        assert!(answer.later.is_pending());
        assert_eq!(
            m.responses_with(Verdict::Detect),
            0,
            "evaluated after the ACK"
        );
        answer.later.run();
        assert_eq!(m.responses_with(Verdict::Detect), 1);
        assert_eq!(m.transactions_cached.get(), 0);
        // Again: the transaction is gone, the answer says so.
        let again = w.handle(&[res]);
        assert_eq!(
            var(&again.vars, "error"),
            Some(&TypedData::Int64(AGENT_ERROR))
        );
    }

    /// A response's `rules_hit`, `rule_ids` and `anomaly_score` cover the whole
    /// transaction: coraza-spoa reads them from the transaction after the response phases,
    /// so the request's matches and its inbound score stay in them.
    #[test]
    fn response_variables_cover_the_whole_transaction() {
        let (w, _) = waf("    response_check: true\n");
        let mut r = req("q=odd");
        r.id = Some("TX7".into());
        w.evaluate_request(&r);
        let res = Response {
            app: "a".into(),
            id: "TX7".into(),
            version: "1.1".into(),
            status: 200,
            headers: vec![("X-Odd".into(), "yes".into())],
            export_rule_ids: true,
            ..Response::default()
        };
        let (v, vars) = w.evaluate_response(&res).unwrap();
        assert_eq!(v, Verdict::Allow);
        assert_eq!(var(&vars, "rules_hit"), Some(&TypedData::Int64(2)));
        assert_eq!(
            var(&vars, "rule_ids"),
            Some(&TypedData::String("190003,190004".into()))
        );
        assert!(var(&vars, "action").is_none());
        assert_eq!(
            var(&vars, "outbound_anomaly_score"),
            Some(&TypedData::Int64(0))
        );
    }

    #[test]
    fn answered_inline_only_without_engine_work() {
        let msg = |name: &str| Message {
            name: name.into(),
            args: vec![
                ("app".into(), TypedData::String("a".into())),
                ("id".into(), TypedData::String("TX".into())),
            ],
        };
        let (off, m) = waf("");
        assert_eq!(
            off.answer_inline(&[msg(RESPONSE_MESSAGE)]),
            Some(Vars::new())
        );
        assert_eq!(off.answer_inline(&[msg("other")]), Some(Vars::new()));
        assert_eq!(off.answer_inline(&[msg(REQUEST_MESSAGE)]), None);
        assert_eq!(
            off.answer_inline(&[msg(RESPONSE_MESSAGE), msg(REQUEST_MESSAGE)]),
            None
        );
        // What `handle` would have answered: nothing, and nothing counted.
        assert!(off.handle(&[msg(RESPONSE_MESSAGE)]).vars.is_empty());
        assert_eq!(m.transactions_cached.get(), 0);
        let (on, _) = waf("    response_check: true\n");
        assert_eq!(on.answer_inline(&[msg(RESPONSE_MESSAGE)]), None);
        assert_eq!(on.answer_inline(&[msg("other")]), Some(Vars::new()));
    }

    #[test]
    fn response_check_uses_the_kept_transaction_once() {
        let (w, m) = waf("    response_check: true\n    transaction_ttl_ms: 60000\n");
        let mut r = req("q=good");
        r.id = Some("TX1".into());
        assert_eq!(w.evaluate_request(&r).0, Verdict::Allow);
        assert_eq!(m.transactions_cached.get(), 1);
        let res = Response {
            app: "a".into(),
            id: "TX1".into(),
            version: "1.1".into(),
            status: 200,
            headers: vec![("X-Leak".into(), "yes".into())],
            ..Response::default()
        };
        let (v, vars) = w.evaluate_response(&res).unwrap();
        assert_eq!(v, Verdict::Deny);
        assert_eq!(var(&vars, "ruleid"), Some(&TypedData::Int64(190002)));
        // The transaction was consumed: a second response for it is an error.
        let (v, vars) = w.evaluate_response(&res).unwrap();
        assert_eq!(v, Verdict::Error);
        assert_eq!(var(&vars, "error"), Some(&TypedData::Int64(AGENT_ERROR)));
    }

    #[test]
    fn kept_transactions_expire_and_are_bounded() {
        let (w, m) = waf(
            "    response_check: true\n    transaction_ttl_ms: 0\n    transaction_active_limit: 2\n",
        );
        for i in 0..3 {
            let mut r = req("q=good");
            r.id = Some(format!("T{i}"));
            w.evaluate_request(&r);
        }
        assert_eq!(m.transactions_cached.get(), 2, "bounded at 2");
        assert_eq!(m.transactions_expired.get(), 1);
        w.expire();
        assert_eq!(m.transactions_cached.get(), 0, "TTL 0: all freed");
        assert_eq!(m.transactions_expired.get(), 3);
    }

    #[test]
    fn truncated_body_rejected_with_413() {
        let (w, _) = waf("");
        let mut r = req("q=good");
        r.method = "POST".into();
        r.body = b"a=1".to_vec();
        r.body_size = Some(100_000);
        let (v, vars) = w.evaluate_request(&r);
        assert_eq!(v, Verdict::Deny);
        assert_eq!(var(&vars, "status"), Some(&TypedData::Int64(413)));
    }

    /// A request's logging phase comes back with the answer, to run after the ACK; a
    /// transaction kept for its response check has none yet.
    #[test]
    fn logging_phase_comes_back_with_the_answer() {
        let msg = |query: &str| Message {
            name: REQUEST_MESSAGE.into(),
            args: vec![
                ("app".into(), TypedData::String("a".into())),
                ("method".into(), TypedData::String("GET".into())),
                ("path".into(), TypedData::String("/p".into())),
                ("query".into(), TypedData::String(query.into())),
            ],
        };
        let (w, _) = waf("");
        let allowed = w.handle(&[msg("q=good")]);
        assert!(allowed.later.is_pending());
        assert!(var(&allowed.vars, "action").is_none());
        allowed.later.run();
        let denied = w.handle(&[msg("q=evil")]);
        assert!(denied.later.is_pending());
        assert_eq!(var(&denied.vars, "ruleid"), Some(&TypedData::Int64(190001)));
        let (kept, m) = waf("    response_check: true\n");
        let answer = kept.handle(&[msg("q=good")]);
        assert!(!answer.later.is_pending(), "kept for the response");
        assert_eq!(m.transactions_cached.get(), 1);
    }

    #[test]
    fn unknown_app_without_default_is_an_error() {
        let cfg = Config::parse("applications:\n  - name: a\n    directives: SecRuleEngine On\n")
            .unwrap();
        let w = Waf::new(
            ModSecurity::new().unwrap(),
            Apps::compile(&cfg).unwrap(),
            Arc::new(Metrics::default()),
        );
        let mut r = req("q=1");
        r.app = "other".into();
        let (v, vars) = w.evaluate_request(&r);
        assert_eq!(v, Verdict::Error);
        assert_eq!(var(&vars, "error"), Some(&TypedData::Int64(AGENT_ERROR)));
    }
}
