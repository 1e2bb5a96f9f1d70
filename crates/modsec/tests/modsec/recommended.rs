//! `@coraza.conf-recommended` against Coraza's own file, rule for rule.
//!
//! [`CORAZA_RULES`] and [`CORAZA_DIRECTIVES`] are this project's listing of what Coraza's
//! `coraza.conf-recommended` (corazawaf/coraza, the file coraza-spoa's `@coraza.conf-recommended`
//! names) sets, written from reading it: every rule it leaves active with its phase, target,
//! operator and actions, and every directive it sets. Ours
//! ([`lastcall_modsec::crs::RECOMMENDED_ENGINE_SETTINGS`]) must carry each rule unchanged and
//! each directive with Coraza's value, except the differences named in [`LEFT_OUT`], which
//! must be exactly the ones there are: a new rule or setting in Coraza's file is added here
//! and then fails the test until ours has it.

use std::collections::BTreeSet;

use lastcall_modsec::crs::{self, CrsOptions, RECOMMENDED_ENGINE_SETTINGS};

use crate::common::{crs_engine, engine_with, run_request, Req};

/// A rule of Coraza's file: id, phase, target, operator, and its other actions.
struct CorazaRule {
    id: u32,
    phase: u8,
    target: &'static str,
    operator: &'static str,
    actions: &'static [&'static str],
}

/// The rules Coraza's file leaves active (its 200004 and 200005 are commented out there as
/// unsupported by Coraza).
const CORAZA_RULES: &[CorazaRule] = &[
    CorazaRule {
        id: 200000,
        phase: 1,
        target: "REQUEST_HEADERS:Content-Type",
        operator: r"^(?:application(?:/soap\+|/)|text/)xml",
        actions: &[
            "t:none",
            "t:lowercase",
            "pass",
            "nolog",
            "ctl:requestBodyProcessor=XML",
        ],
    },
    CorazaRule {
        id: 200001,
        phase: 1,
        target: "REQUEST_HEADERS:Content-Type",
        operator: "^application/json",
        actions: &[
            "t:none",
            "t:lowercase",
            "pass",
            "nolog",
            "ctl:requestBodyProcessor=JSON",
        ],
    },
    CorazaRule {
        id: 200006,
        phase: 1,
        target: "REQUEST_HEADERS:Content-Type",
        operator: "^application/[a-z0-9.-]+[+]json",
        actions: &[
            "t:none",
            "t:lowercase",
            "pass",
            "nolog",
            "ctl:requestBodyProcessor=JSON",
        ],
    },
    CorazaRule {
        id: 200002,
        phase: 2,
        target: "REQBODY_ERROR",
        operator: "!@eq 0",
        actions: &[
            "t:none",
            "log",
            "deny",
            "status:400",
            "msg:'Failed to parse request body.'",
            "logdata:'%{reqbody_error_msg}'",
            "severity:2",
        ],
    },
    CorazaRule {
        id: 200003,
        phase: 2,
        target: "MULTIPART_STRICT_ERROR",
        operator: "!@eq 0",
        actions: &[
            "t:none",
            "log",
            "deny",
            "status:400",
            "msg:'Multipart request body failed strict validation.'",
        ],
    },
];

/// The directives Coraza's file sets, with its values.
const CORAZA_DIRECTIVES: &[(&str, &str)] = &[
    ("SecRuleEngine", "DetectionOnly"),
    ("SecRequestBodyAccess", "On"),
    ("SecRequestBodyLimit", "13107200"),
    ("SecRequestBodyInMemoryLimit", "131072"),
    ("SecRequestBodyLimitAction", "Reject"),
    ("SecResponseBodyAccess", "On"),
    ("SecResponseBodyMimeType", "text/plain text/html text/xml"),
    ("SecResponseBodyLimit", "524288"),
    ("SecResponseBodyLimitAction", "ProcessPartial"),
    ("SecDataDir", "/tmp/"),
    ("SecAuditEngine", "RelevantOnly"),
    ("SecAuditLogRelevantStatus", "\"^(?:(5|4)(0|1)[0-9])$\""),
    ("SecAuditLogParts", "ABIJDEFHZ"),
    ("SecAuditLogType", "Serial"),
    ("SecAuditLogFormat", "Native"),
];

/// Coraza's directives ours sets otherwise or not at all, each with ours (`None`: not set)
/// and why.
const LEFT_OUT: &[(&str, Option<&str>, &str)] = &[
    (
        "SecRequestBodyInMemoryLimit",
        None,
        "libmodsecurity 3 keeps request bodies in memory; the limit is SecRequestBodyLimit",
    ),
    (
        "SecAuditEngine",
        Some("Off"),
        "each matched rule is a log line of the agent's (coraza-spoa's shape); a user sets \
         SecAuditEngine and SecAuditLog for an audit log",
    ),
    ("SecAuditLogRelevantStatus", None, "no audit log"),
    ("SecAuditLogParts", None, "no audit log"),
    ("SecAuditLogType", None, "no audit log"),
    ("SecAuditLogFormat", None, "no audit log"),
];

/// A `SecRule` line of ours, split: target, operator, actions.
fn split_rule(line: &str) -> Option<(String, String, Vec<String>)> {
    let rest = line.strip_prefix("SecRule ")?;
    let (target, rest) = rest.split_once(' ')?;
    let rest = rest.strip_prefix('"')?;
    let (operator, rest) = rest.split_once("\" \"")?;
    let actions = rest.strip_suffix('"')?;
    let mut out = Vec::new();
    let mut quoted = false;
    let mut current = String::new();
    for c in actions.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                current.push(c);
            }
            ',' if !quoted => out.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    out.push(current);
    Some((target.to_owned(), operator.to_owned(), out))
}

#[test]
fn every_rule_and_setting_of_corazas_recommended_file_is_ours() {
    let lines: Vec<&str> = RECOMMENDED_ENGINE_SETTINGS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let rules: Vec<(String, String, Vec<String>)> =
        lines.iter().filter_map(|l| split_rule(l)).collect();
    for want in CORAZA_RULES {
        let id = format!("id:{}", want.id);
        let Some((target, operator, actions)) =
            rules.iter().find(|(_, _, a)| a.first() == Some(&id))
        else {
            panic!("rule {} of Coraza's file is missing", want.id);
        };
        assert_eq!(target, want.target, "rule {}", want.id);
        assert_eq!(operator, want.operator, "rule {}", want.id);
        assert_eq!(
            actions.get(1).map(String::as_str),
            Some(format!("phase:{}", want.phase).as_str()),
            "rule {}",
            want.id
        );
        let ours: BTreeSet<&str> = actions[2..].iter().map(String::as_str).collect();
        let theirs: BTreeSet<&str> = want.actions.iter().copied().collect();
        assert_eq!(ours, theirs, "rule {}", want.id);
    }
    let directive = |name: &str| {
        lines.iter().find_map(|l| {
            let (n, v) = l.split_once(' ')?;
            (n == name).then(|| v.trim().to_owned())
        })
    };
    let mut differing = Vec::new();
    for (name, value) in CORAZA_DIRECTIVES {
        let ours = directive(name);
        if ours.as_deref() != Some(*value) {
            differing.push((*name, ours));
        }
    }
    let expected: Vec<(&str, Option<String>)> = LEFT_OUT
        .iter()
        .map(|(name, ours, _)| (*name, ours.map(str::to_owned)))
        .collect();
    assert_eq!(differing, expected, "Coraza's settings ours differs from");
}

/// The settings compile on libmodsecurity, and rule 200006 hands JSON subtypes to the JSON
/// parser, behind `@coraza.conf-recommended` with the CRS turned On and behind the built-in
/// application (which has the same body-processor rules): an SQL injection in an
/// `application/vnd.api+json` body is found by the CRS's SQL injection rules (942xxx) in the
/// parsed JSON and denied, a benign one has none of them, and a broken one is refused with
/// 400 by the JSON parser's error. (CRS 3.3's content-type policy, rule 920420, also scores
/// these types; CRS 4 allows more of them.)
#[test]
fn json_subtypes_are_parsed_as_json() {
    let loc = crs::Location::debian();
    let recommended = format!(
        "{RECOMMENDED_ENGINE_SETTINGS}Include {}\nInclude {}\nSecRuleEngine On\n",
        loc.setup.display(),
        loc.rules_glob()
    );
    let engines = [
        ("@coraza.conf-recommended", engine_with(&recommended)),
        ("built-in", crs_engine(&CrsOptions::default())),
    ];
    let json = |body: &'static [u8], ctype: &'static str| {
        let mut req = Req::post_form("/api/items", body);
        req.headers.retain(|(k, _)| *k != "Content-Type");
        req.headers.push(("Content-Type", ctype));
        req
    };
    let sqli_rules = |ids: &[u32]| {
        ids.iter()
            .filter(|id| (942_000..943_000).contains(*id))
            .count()
    };
    for (name, (ms, rules)) in &engines {
        for ctype in [
            "application/vnd.api+json",
            "application/problem+json; charset=utf-8",
            "Application/Merge-Patch+JSON",
        ] {
            let (v, tx) = run_request(
                ms,
                rules,
                &json(br#"{"data":{"id":"1' OR '1'='1"}}"#, ctype),
            );
            assert_eq!(v.map(|i| i.status), Some(403), "{name} {ctype}");
            assert!(
                sqli_rules(tx.report().rule_ids()) > 0,
                "{name} {ctype}: {:?}",
                tx.report()
            );
            let (_, tx) = run_request(
                ms,
                rules,
                &json(br#"{"data":{"id":"42","note":"hello"}}"#, ctype),
            );
            assert_eq!(
                sqli_rules(tx.report().rule_ids()),
                0,
                "{name} {ctype}: {:?}",
                tx.report()
            );
            let (v, tx) = run_request(ms, rules, &json(br#"{"data": [1, 2"#, ctype));
            assert_eq!(
                v.map(|i| i.status),
                Some(400),
                "{name} {ctype}: {:?}",
                tx.report()
            );
        }
    }
}
