//! The WAF: `coraza-req` / `coraza-res` messages through libmodsecurity, and the variables
//! set back in HAProxy (coraza-spoa's names).
//!
//! Everything here is blocking and CPU-bound: the engine calls [`Waf`]'s
//! [`Handler::handle`] on an evaluation thread, never on an async worker, and asks
//! [`Handler::answer_inline`] first, on the connection task, whether the engine is needed at
//! all. The logging phase (phase 5) and a transaction's cleanup come back with the answer as
//! a [`Later`], which the engine runs once the ACK is written, as nginx runs ModSecurity's log
//! phase after the response.
//!
//! - [`apps`]: the applications' compiled rules, swapped all at once by a reload
//!   ([`Waf::swap`]; evaluations already running keep the rules they started with);
//! - [`cache`]: request transactions kept for their response check.

pub mod apps;
mod cache;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use lastcall_modsec::{Intervention, ModSecurity, Transaction};
use spop::frame::Message;
use spop::TypedData;

pub use apps::{directives_for, App, Apps};
use cache::{Kept, TxCache};

use crate::config::BodyLimitAction;
use crate::engine::{Answer, Handler, Later, Vars, AGENT_ERROR};
use crate::metrics::{Metrics, Verdict};
use crate::protocol::coraza::{self, Request, Response, REQUEST_MESSAGE, RESPONSE_MESSAGE};

/// Runs the logging phase of finished request transactions, then frees them.
fn finish(txs: impl IntoIterator<Item = Transaction>) {
    for mut tx in txs {
        let _ = tx.process_logging();
    }
}

/// The WAF: the engine, the current applications, kept transactions and metrics.
pub struct Waf {
    engine: Arc<ModSecurity>,
    apps: RwLock<Arc<Apps>>,
    cache: Mutex<TxCache>,
    metrics: Arc<Metrics>,
    ids: AtomicU64,
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
        }
    }

    /// The engine (to compile rules for a reload).
    pub fn engine(&self) -> &Arc<ModSecurity> {
        &self.engine
    }

    /// Replaces all applications at once. Evaluations in progress finish with the rules
    /// they started with; kept transactions keep theirs.
    pub fn swap(&self, apps: Apps) {
        let new = Arc::new(apps);
        match self.apps.write() {
            Ok(mut g) => *g = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }

    fn current(&self) -> Arc<Apps> {
        match self.apps.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, TxCache> {
        match self.cache.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Frees kept transactions whose TTL ran out (call periodically).
    pub fn expire(&self) {
        let expired = self.cache().expire(Instant::now());
        self.finish_kept(expired);
    }

    fn finish_kept(&self, kept: Vec<Kept>) {
        for mut k in kept {
            self.metrics.transactions_expired.inc();
            let _ = k.tx.process_logging();
        }
        let n = self.cache().map.len();
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
    pub fn evaluate_request(&self, req: &Request) -> (Verdict, Vars) {
        let mut done = Vec::new();
        let result = self.request(req, &mut done);
        finish(done);
        result
    }

    /// Evaluates a request; a transaction whose verdict is final (not kept for a response
    /// check) is pushed to `done`, its logging phase still to run.
    fn request(&self, req: &Request, done: &mut Vec<Transaction>) -> (Verdict, Vars) {
        let apps = self.current();
        let Some(app) = apps.find(&req.app) else {
            tracing::warn!(app = %req.app, "unknown application and no default_application");
            return (
                Verdict::Error,
                vec![("error", TypedData::Int64(AGENT_ERROR))],
            );
        };
        let id = req.id.clone().unwrap_or_else(|| self.new_id());
        let mut vars: Vars = vec![("id", TypedData::String(id.clone()))];
        if let Some(problem) = &req.problem {
            tracing::warn!(tx = %id, "coraza-req not evaluated: {problem}");
            vars.push(("error", TypedData::Int64(AGENT_ERROR)));
            return (Verdict::Error, vars);
        }
        if req.body_truncated() {
            let declared = req.declared_body_size().unwrap_or(0);
            match app.config.body_limit_action {
                BodyLimitAction::Reject => {
                    self.metrics.truncated("reject");
                    tracing::warn!(
                        tx = %id, received = req.body.len(), declared,
                        "request body truncated by HAProxy: denied with 413 (body_limit_action: reject)"
                    );
                    vars.push(("action", TypedData::String("deny".into())));
                    vars.push(("status", TypedData::Int64(413)));
                    vars.push(("data", TypedData::String(String::new())));
                    vars.push(("ruleid", TypedData::Int64(0)));
                    return (Verdict::Deny, vars);
                }
                BodyLimitAction::ProcessPartial => {
                    self.metrics.truncated("process_partial");
                    tracing::info!(
                        tx = %id, received = req.body.len(), declared,
                        "request body truncated by HAProxy: inspecting the part received"
                    );
                }
            }
        }
        match self.run_request(&app, req, &id) {
            Ok((tx, it)) => self.conclude_request(app, tx, it, id, vars, done),
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
        if let Some(it) = tx.process_uri(&req.uri(), &req.method, version)? {
            return Ok((tx, Some(it)));
        }
        for (k, v) in &req.headers {
            tx.add_request_header(k.as_bytes(), v.as_bytes())?;
        }
        if let Some(it) = tx.process_request_headers()? {
            return Ok((tx, Some(it)));
        }
        if !req.body.is_empty() {
            tx.append_request_body(&req.body)?;
            if let Some(it) = tx.intervention() {
                return Ok((tx, Some(it)));
            }
        }
        // Phase 2 runs even without a body: CRS decides most blocks there.
        let it = tx.process_request_body()?;
        Ok((tx, it))
    }

    fn conclude_request(
        &self,
        app: Arc<App>,
        tx: Transaction,
        it: Option<Intervention>,
        id: String,
        mut vars: Vars,
        done: &mut Vec<Transaction>,
    ) -> (Verdict, Vars) {
        let report = tx.report();
        let rules_hit = join_ids(report.rule_ids());
        let score = i64::from(report.estimated_inbound_score());
        let would_block = report
            .matches()
            .iter()
            .any(|m| m.disruptive || m.id == 949_110);
        let verdict = match &it {
            Some(it) => {
                let (action, data) = match &it.url {
                    Some(url) => ("redirect", url.clone()),
                    None => ("deny", String::new()),
                };
                vars.push(("action", TypedData::String(action.into())));
                vars.push(("status", TypedData::Int64(i64::from(it.status))));
                vars.push(("data", TypedData::String(data)));
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
                vars.push(("ruleid", TypedData::Int64(i64::from(rule))));
                tracing::info!(tx = %id, app = %app.config.name, status = it.status, rule, rules_hit = %rules_hit, score, "request denied");
                Verdict::Deny
            }
            None if app.config.detect_only && would_block => {
                tracing::info!(tx = %id, app = %app.config.name, rules_hit = %rules_hit, score, "request would be denied (detect only)");
                Verdict::Detect
            }
            None => Verdict::Allow,
        };
        vars.push(("rules_hit", TypedData::String(rules_hit)));
        vars.push(("anomaly_score", TypedData::Int64(score)));
        if it.is_none() && app.config.response_check {
            let ttl = Duration::from_millis(app.config.transaction_ttl_ms);
            let limit = app.config.transaction_active_limit;
            let evicted = self.cache().insert(id, Kept { tx, app }, ttl, limit);
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
    pub fn evaluate_response(&self, res: &Response) -> Option<(Verdict, Vars)> {
        let apps = self.current();
        if let Some(app) = apps.find(&res.app) {
            if !app.config.response_check {
                return None;
            }
        }
        Some(self.evaluate_kept_response(res))
    }

    fn evaluate_kept_response(&self, res: &Response) -> (Verdict, Vars) {
        if let Some(problem) = &res.problem {
            tracing::warn!(tx = %res.id, "coraza-res not evaluated: {problem}");
            return (
                Verdict::Error,
                vec![("error", TypedData::Int64(AGENT_ERROR))],
            );
        }
        let kept = self.cache().map.remove(&res.id).map(|(_, k)| k);
        self.metrics
            .transactions_cached
            .set(i64::try_from(self.cache().map.len()).unwrap_or(i64::MAX));
        let Some(Kept { mut tx, app }) = kept else {
            tracing::warn!(tx = %res.id, "response for an unknown or expired transaction (response_check off, or transaction_ttl_ms too short)");
            return (
                Verdict::Error,
                vec![("error", TypedData::Int64(AGENT_ERROR))],
            );
        };
        if res.body_truncated() {
            self.metrics.truncated("process_partial");
        }
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
            if let Some(it) = tx.process_response_headers(status, &format!("HTTP/{version}"))? {
                return Ok(Some(it));
            }
            if !res.body.is_empty() {
                tx.append_response_body(&res.body)?;
            }
            tx.process_response_body()
        })();
        let mut vars: Vars = Vec::new();
        let verdict = match result {
            Err(e) => {
                tracing::error!(tx = %res.id, "response evaluation failed: {e}");
                vars.push(("error", TypedData::Int64(AGENT_ERROR)));
                Verdict::Error
            }
            Ok(Some(it)) => {
                let rule = it.rule_id().unwrap_or(0);
                let (action, data) = match &it.url {
                    Some(url) => ("redirect", url.clone()),
                    None => ("deny", String::new()),
                };
                vars.push(("action", TypedData::String(action.into())));
                vars.push(("status", TypedData::Int64(i64::from(it.status))));
                vars.push(("data", TypedData::String(data)));
                vars.push(("ruleid", TypedData::Int64(i64::from(rule))));
                tracing::info!(tx = %res.id, app = %app.config.name, rule, "response denied");
                Verdict::Deny
            }
            Ok(None) => {
                let detect = app.config.detect_only
                    && tx
                        .report()
                        .matches()
                        .iter()
                        .any(|m| m.disruptive || m.id == 959_100);
                if detect {
                    Verdict::Detect
                } else {
                    Verdict::Allow
                }
            }
        };
        let report = tx.report();
        vars.push(("rules_hit", TypedData::String(join_ids(report.rule_ids()))));
        vars.push((
            "anomaly_score",
            TypedData::Int64(i64::from(report.estimated_outbound_score())),
        ));
        let _ = tx.process_logging();
        (verdict, vars)
    }
}

fn join_ids(ids: &[u32]) -> String {
    let mut seen = Vec::new();
    for id in ids {
        if !seen.contains(id) {
            seen.push(*id);
        }
    }
    seen.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl Handler for Waf {
    fn handle(&self, messages: &[Message]) -> Answer {
        let mut vars = Vars::new();
        let mut done = Vec::new();
        for m in messages {
            match m.name.as_str() {
                REQUEST_MESSAGE => {
                    let (v, more) = self.request(&Request::from_message(m), &mut done);
                    self.metrics.request(v);
                    vars.extend(more);
                }
                RESPONSE_MESSAGE => {
                    if let Some((v, more)) = self.evaluate_response(&Response::from_message(m)) {
                        self.metrics.response(v);
                        vars.extend(more);
                    }
                }
                other => {
                    tracing::debug!(message = other, "ignoring unknown SPOE message");
                }
            }
        }
        let later = if done.is_empty() {
            Later::none()
        } else {
            Later::new(move || finish(done))
        };
        Answer { vars, later }
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
SecRule ARGS \"@contains evil\" \"id:1001,phase:2,deny,status:403,log,msg:'evil arg'\"
SecRule RESPONSE_HEADERS:X-Leak \"@streq yes\" \"id:1002,phase:3,deny,status:403,log\"
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
        assert_eq!(var(&vars, "ruleid"), Some(&TypedData::Int64(1001)));
        assert_eq!(
            var(&vars, "rules_hit"),
            Some(&TypedData::String("1001".into()))
        );
        let (v, vars) = w.evaluate_request(&req("q=good"));
        assert_eq!(v, Verdict::Allow);
        assert!(var(&vars, "action").is_none());
        assert!(matches!(var(&vars, "id"), Some(TypedData::String(s)) if s.len() == 16));
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
        assert_eq!(var(&vars, "ruleid"), Some(&TypedData::Int64(1002)));
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
        assert_eq!(var(&denied.vars, "ruleid"), Some(&TypedData::Int64(1001)));
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
