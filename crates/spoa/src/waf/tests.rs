//! The WAF's unit tests: rules of their own through `Waf::evaluate_request` and
//! `Waf::evaluate_response`.

use spop::frame::Message;
use spop::TypedData;

use super::*;
use crate::config::Config;
use crate::engine::{Handler, Vars, AGENT_ERROR};
use crate::metrics::Verdict;
use lastcall_spop_proto::coraza::{Request, Response, REQUEST_MESSAGE, RESPONSE_MESSAGE};

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
    let cfg =
        Config::parse("applications:\n  - name: a\n    directives: SecRuleEngine On\n").unwrap();
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
