//! The wrapper against real libmodsecurity 3.0.9 and Debian's OWASP CRS 3.3.4.

use crate::common::{crs_engine, drive_request, drive_response, engine_with, run_request, Req};
use lastcall_modsec::crs::{BodyLimitAction, CrsOptions};
use lastcall_modsec::{Error, RuleSet, Transaction};

#[test]
fn benign_get_passes_with_no_matches() {
    let (ms, rules) = crs_engine(&CrsOptions::default());
    assert!(rules.rule_count() > 500, "CRS loaded: {rules:?}");
    let req = Req::get("/products/42?color=blue&size=m");
    let (verdict, mut tx) = run_request(&ms, &rules, &req);
    assert_eq!(verdict, None);
    tx.process_logging().expect("logging");
    assert!(tx.report().is_empty(), "{:#?}", tx.report());
    assert_eq!(tx.report().estimated_inbound_score(), 0);
}

#[test]
fn sqli_in_query_is_denied_with_rule_ids_and_score() {
    let (ms, rules) = crs_engine(&CrsOptions::default());
    let req = Req::get("/?id=1'%20OR%20'1'='1");
    let (verdict, tx) = run_request(&ms, &rules, &req);
    let it = verdict.expect("intervention");
    assert_eq!(it.status, 403);
    assert!(it.disruptive);
    assert_eq!(it.rule_id(), Some(949110));
    let report = tx.report();
    let ids = report.rule_ids();
    assert!(ids.contains(&942100), "libinjection SQLi rule in {ids:?}");
    assert!(ids.contains(&949110), "blocking evaluation in {ids:?}");
    // Matches are in order: the detection before the blocking evaluation.
    let pos = |id| ids.iter().position(|x| *x == id);
    assert!(pos(942100) < pos(949110));
    let score = report.inbound_anomaly_score().expect("score reported");
    assert!(score >= 5, "score {score}");
    assert!(report
        .messages()
        .any(|m| m.starts_with("Inbound Anomaly Score Exceeded (Total Score: ")));
}

#[test]
fn xss_in_urlencoded_post_body_is_denied() {
    let (ms, rules) = crs_engine(&CrsOptions::default());
    let body = b"name=alice&comment=%3Cscript%3Ealert(document.cookie)%3C%2Fscript%3E";
    let req = Req::post_form("/guestbook", body);
    let (verdict, tx) = run_request(&ms, &rules, &req);
    let it = verdict.expect("intervention");
    assert_eq!(it.status, 403);
    let ids = tx.report().rule_ids();
    assert!(
        ids.iter().any(|id| (941_000..942_000).contains(id)),
        "XSS rule in {ids:?}"
    );
    // Decided in phase 2, from the body.
    assert!(it.log.as_deref().unwrap_or("").contains("(phase 2)"));
    assert!(tx
        .report()
        .matches()
        .iter()
        .any(|m| m.data.contains("ARGS:comment")));
}

#[test]
fn benign_form_post_and_json_pass() {
    let (ms, rules) = crs_engine(&CrsOptions::default());
    let req = Req::post_form(
        "/login",
        b"username=alice&password=correct%20horse&remember=1",
    );
    assert_eq!(run_request(&ms, &rules, &req).0, None);
    let mut json = Req::get("/api/orders");
    json.method = "POST";
    json.headers.push(("Content-Type", "application/json"));
    json.body = br#"{"items":[{"sku":"A-1","qty":2}],"note":"leave at the door"}"#;
    assert_eq!(run_request(&ms, &rules, &json).0, None);
}

#[test]
fn malformed_json_body_is_a_400_from_the_body_processor_rules() {
    let (ms, rules) = crs_engine(&CrsOptions::default());
    let mut json = Req::get("/api/orders");
    json.method = "POST";
    json.headers.push(("Content-Type", "application/json"));
    json.body = br#"{"items": [1, 2"#;
    let (verdict, tx) = run_request(&ms, &rules, &json);
    assert_eq!(verdict.map(|i| i.status), Some(400));
    assert!(tx.report().rule_ids().contains(&200002));
}

#[test]
fn own_response_rules_intercept_phase_3_and_4() {
    let (ms, rules) = engine_with(concat!(
        "SecRuleEngine On\n",
        "SecResponseBodyAccess On\n",
        "SecResponseBodyMimeType text/plain text/html\n",
        "SecRule RESPONSE_STATUS \"@streq 418\" \"id:10001,phase:3,deny,status:502,log,msg:'teapot'\"\n",
        "SecRule RESPONSE_BODY \"@contains BEGIN RSA PRIVATE KEY\" \"id:10002,phase:4,deny,status:502,log,msg:'key leak'\"\n",
    ));
    // Phase 3: the status.
    let (v, mut tx) = run_request(&ms, &rules, &Req::get("/"));
    assert_eq!(v, None);
    let it = drive_response(
        &mut tx,
        418,
        &[("Content-Type", "text/plain")],
        b"short and stout",
    );
    assert_eq!(it.as_ref().map(|i| i.status), Some(502));
    assert_eq!(it.and_then(|i| i.rule_id()), Some(10001));
    // Phase 4: the body.
    let (_, mut tx) = run_request(&ms, &rules, &Req::get("/"));
    let body = b"<html>-----BEGIN RSA PRIVATE KEY-----\nMIIE</html>";
    let it = drive_response(&mut tx, 200, &[("Content-Type", "text/html")], body);
    assert_eq!(it.as_ref().map(|i| i.status), Some(502));
    assert_eq!(tx.report().rule_ids(), &[10002]);
    // A clean response passes.
    let (_, mut tx) = run_request(&ms, &rules, &Req::get("/"));
    let it = drive_response(&mut tx, 200, &[("Content-Type", "text/html")], b"<p>hi</p>");
    assert_eq!(it, None);
}

#[test]
fn crs_response_check_blocks_sql_error_leak() {
    let (ms, rules) = crs_engine(&CrsOptions {
        response_check: true,
        ..CrsOptions::default()
    });
    let (v, mut tx) = run_request(&ms, &rules, &Req::get("/search?q=shoes"));
    assert_eq!(v, None);
    let body = b"<html><body>Warning: You have an error in your SQL syntax; check the manual \
        that corresponds to your MySQL server version for the right syntax to use near ''' \
        at line 1</body></html>";
    let it = drive_response(&mut tx, 200, &[("Content-Type", "text/html")], body);
    let it = it.expect("outbound intervention");
    assert_eq!(it.status, 403);
    let report = tx.report();
    assert!(
        report
            .rule_ids()
            .iter()
            .any(|id| (951_000..952_000).contains(id)),
        "{:?}",
        report.rule_ids()
    );
    assert!(report.outbound_anomaly_score().unwrap_or(0) >= 4);
}

#[test]
fn detection_only_passes_attacks_but_reports_them() {
    let (ms, rules) = crs_engine(&CrsOptions {
        detect_only: true,
        ..CrsOptions::default()
    });
    let (verdict, mut tx) = run_request(&ms, &rules, &Req::get("/?id=1'%20OR%20'1'='1"));
    assert_eq!(verdict, None);
    let report = tx.report();
    assert!(
        report.rule_ids().contains(&942100),
        "{:?}",
        report.rule_ids()
    );
    assert!(report.rule_ids().contains(&949110));
    assert!(report.inbound_anomaly_score().unwrap_or(0) >= 5);
    assert!(report.matches().iter().all(|m| !m.disruptive));
    tx.process_logging().expect("logging");
}

#[test]
fn rule_syntax_error_names_the_line() {
    let err = RuleSet::from_directives(
        "SecRuleEngine On\n\nSecRule ARGS \"@rx a\" \"id:1,phase:2,deny,nosuchaction\"\n",
        "inline",
    )
    .expect_err("must not compile");
    let Error::Rules { origin, message } = &err else {
        panic!("unexpected error {err:?}");
    };
    assert_eq!(origin, "inline");
    assert!(message.contains("Line: 3"), "{message}");
    assert!(err.to_string().contains("inline"));

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.conf");
    std::fs::write(&path, "SecRuleEngine On\nSecRuleEngine Sometimes\n").expect("write");
    let err = RuleSet::from_file(&path).expect_err("must not compile");
    let msg = err.to_string();
    assert!(msg.contains("bad.conf"), "{msg}");
    assert!(msg.contains("Line: 2"), "{msg}");

    // An Include of a file with an error names that file.
    let inc = RuleSet::from_directives(&format!("Include {}\n", path.display()), "with-include")
        .expect_err("must not compile");
    assert!(inc.to_string().contains("bad.conf"), "{inc}");

    // Duplicate ids are errors too.
    let dup = RuleSet::from_directives(
        "SecRule ARGS \"@rx a\" \"id:5,phase:1,pass,nolog\"\nSecRule ARGS \"@rx b\" \"id:5,phase:2,pass,nolog\"\n",
        "dup",
    )
    .expect_err("duplicate id");
    assert!(
        dup.to_string().contains("Rule id: 5 is duplicated"),
        "{dup}"
    );
}

#[test]
fn nul_bytes_are_errors_not_truncations() {
    let (ms, rules) = engine_with("SecRuleEngine On\n");
    let mut tx = Transaction::new(&ms, &rules, None).expect("tx");
    assert!(matches!(
        tx.process_uri("/a\0b", "GET", "1.1"),
        Err(Error::Nul { .. })
    ));
    assert!(Transaction::new(&ms, &rules, Some("a\0b")).is_err());
    // Header bytes may contain anything.
    tx.add_request_header(b"X-Bin", b"a\0b\xff")
        .expect("binary header");
}

fn limit_rules(action: BodyLimitAction) -> CrsOptions {
    CrsOptions {
        request_body_limit: 1000,
        request_body_no_files_limit: 1000,
        request_body_limit_action: action,
        ..CrsOptions::default()
    }
}

fn padded_form(prefix: &str, filler: usize, suffix: &str) -> Vec<u8> {
    let mut body = String::from(prefix);
    body.push_str("&pad=");
    body.push_str(&"a".repeat(filler));
    body.push_str(suffix);
    body.into_bytes()
}

#[test]
fn body_over_limit_with_reject_is_denied() {
    let (ms, rules) = crs_engine(&limit_rules(BodyLimitAction::Reject));
    let small = padded_form("q=hello", 500, "");
    assert_eq!(
        run_request(&ms, &rules, &Req::post_form("/f", &small)).0,
        None
    );
    let big = padded_form("q=hello", 1500, "");
    let (v, tx) = run_request(&ms, &rules, &Req::post_form("/f", &big));
    assert_eq!(v.map(|i| i.status), Some(403));
    assert!(!tx.report().request_body_truncated());
}

#[test]
fn body_over_limit_with_process_partial_inspects_the_first_part_only() {
    let (ms, rules) = crs_engine(&CrsOptions {
        // Without this, the body processor's "bigger than expected" REQBODY_ERROR would
        // deny every oversized form (rule 200002), hiding what ProcessPartial does.
        request_body_no_files_limit: 1_000_000,
        ..limit_rules(BodyLimitAction::ProcessPartial)
    });
    // Benign and oversized: passes, marked truncated.
    let big = padded_form("q=hello", 1500, "");
    let mut tx = Transaction::new(&ms, &rules, None).expect("tx");
    assert_eq!(drive_request(&mut tx, &Req::post_form("/f", &big)), None);
    assert!(tx.report().request_body_truncated());
    assert_eq!(tx.request_body_length(), 1000);
    // An attack inside the first 1000 bytes is still seen.
    let early = padded_form("q=1'%20OR%20'1'='1", 1500, "");
    let (v, _) = run_request(&ms, &rules, &Req::post_form("/f", &early));
    assert_eq!(v.map(|i| i.status), Some(403));
    // An attack after the limit is not: that is what ProcessPartial means.
    let late = padded_form("q=hello", 1500, "&x=1'%20OR%20'1'='1");
    let (v, tx) = run_request(&ms, &rules, &Req::post_form("/f", &late));
    assert_eq!(v, None);
    assert!(tx.report().request_body_truncated());
}

#[test]
fn body_over_no_files_limit_is_a_400() {
    // Debian-default style: 13 MB total, 128 KiB without files; a 200 KB form is a
    // REQBODY_ERROR, denied by rule 200002 with 400.
    let (ms, rules) = crs_engine(&CrsOptions::default());
    let big = padded_form("q=hello", 200_000, "");
    let (v, tx) = run_request(&ms, &rules, &Req::post_form("/f", &big));
    assert_eq!(v.map(|i| i.status), Some(400));
    assert!(tx.report().rule_ids().contains(&200002));
}

#[test]
fn paranoia_level_reaches_crs() {
    // 920300 (missing Accept header) is a PL2 rule: silent at PL1, logged at PL2.
    let req = Req {
        method: "GET",
        uri: "/",
        headers: vec![("Host", "a.example"), ("User-Agent", "curl/8.0")],
        body: b"",
    };
    let (ms, rules) = crs_engine(&CrsOptions::default());
    let (_, tx) = run_request(&ms, &rules, &req);
    assert!(
        !tx.report().rule_ids().contains(&920300),
        "{:?}",
        tx.report().rule_ids()
    );
    let (ms, rules) = crs_engine(&CrsOptions {
        paranoia_level: 2,
        ..CrsOptions::default()
    });
    let (_, tx) = run_request(&ms, &rules, &req);
    assert!(
        tx.report().rule_ids().contains(&920300),
        "{:?}",
        tx.report().rule_ids()
    );
}

#[test]
fn transaction_outlives_the_callers_handles() {
    let (ms, rules) = engine_with(concat!(
        "SecRuleEngine On\n",
        "SecRule RESPONSE_STATUS \"@streq 500\" \"id:10003,phase:3,deny,status:503,log\"\n",
    ));
    let mut tx = Transaction::new(&ms, &rules, Some("keep-me")).expect("tx");
    assert_eq!(drive_request(&mut tx, &Req::get("/")), None);
    drop(ms);
    drop(rules); // e.g. a reload swapped the rules; the transaction keeps its own.
    assert_eq!(tx.id(), Some("keep-me"));
    let it = drive_response(&mut tx, 500, &[], b"");
    assert_eq!(it.map(|i| i.status), Some(503));
}

#[test]
fn redirect_intervention_carries_the_url() {
    let (ms, rules) = engine_with(concat!(
        "SecRuleEngine On\n",
        "SecRule ARGS:go \"@streq away\" \"id:10010,phase:1,redirect:https://example.org/blocked,log,msg:'go away'\"\n",
    ));
    let (v, tx) = run_request(&ms, &rules, &Req::get("/?go=away"));
    let it = v.expect("intervention");
    assert_eq!(it.url.as_deref(), Some("https://example.org/blocked"));
    assert_eq!(it.status, 302);
    assert_eq!(tx.report().rule_ids(), &[10010]);
    // Each intervention is reported once.
    let (v, mut tx) = run_request(&ms, &rules, &Req::get("/?go=away"));
    assert!(v.is_some());
    assert_eq!(tx.intervention(), None);
}

#[test]
fn response_body_over_limit_with_process_partial_is_marked() {
    let (ms, rules) = engine_with(concat!(
        "SecRuleEngine On\n",
        "SecResponseBodyAccess On\n",
        "SecResponseBodyMimeType text/html\n",
        "SecResponseBodyLimit 100\n",
        "SecResponseBodyLimitAction ProcessPartial\n",
        "SecRule RESPONSE_BODY \"@contains needle\" \"id:10020,phase:4,deny,status:502,log\"\n",
    ));
    let html = [("Content-Type", "text/html; charset=utf-8")];
    // The needle within the first 100 bytes is seen...
    let (_, mut tx) = run_request(&ms, &rules, &Req::get("/"));
    let body = format!("needle{}", "x".repeat(300));
    let it = drive_response(&mut tx, 200, &html, body.as_bytes());
    assert_eq!(it.map(|i| i.status), Some(502));
    assert!(tx.report().response_body_truncated());
    // ... after them it is not.
    let (_, mut tx) = run_request(&ms, &rules, &Req::get("/"));
    let body = format!("{}needle", "x".repeat(300));
    assert_eq!(drive_response(&mut tx, 200, &html, body.as_bytes()), None);
    assert!(tx.report().response_body_truncated());
}

/// The severity-point estimate (used for requests below the threshold, where CRS reports
/// no score) against the score CRS computes, checked with a threshold of 1 so that CRS
/// reports its total for every request that matched anything: never above it, usually
/// equal (below when a rule matched several variables: points per match, one log line).
#[test]
fn severity_estimate_matches_crs_score() {
    let (ms, rules) = crs_engine(&CrsOptions {
        detect_only: true,
        inbound_anomaly_threshold: Some(1),
        ..CrsOptions::default()
    });
    let requests = [
        Req::get("/?id=1'%20OR%20'1'='1"),
        Req::get("/search?q=%3Cscript%3Ealert(1)%3C%2Fscript%3E"),
        Req::get("/download?file=..%2F..%2F..%2Fetc%2Fpasswd"),
        Req::get("/ping?host=%3B%20cat%20%2Fetc%2Fpasswd"),
        Req::get("/backup/db.sql"),
        Req::get("/search?q=%G1%ZZ"),
        Req::post_form(
            "/c",
            b"a=%3Csvg%20onload%3Dalert(1)%3E&b=1%20UNION%20SELECT%201",
        ),
    ];
    let (mut checked, mut exact) = (0, 0);
    for req in &requests {
        let (v, tx) = run_request(&ms, &rules, req);
        assert_eq!(v, None, "detect-only");
        let r = tx.report();
        let Some(score) = r.inbound_anomaly_score() else {
            assert_eq!(
                r.severity_inbound_score(),
                0,
                "{}: {:?}",
                req.uri,
                r.rule_ids()
            );
            continue;
        };
        let estimate = r.severity_inbound_score();
        assert!(
            estimate > 0 && estimate <= score,
            "{}: estimate {estimate}, CRS {score}, {:?}",
            req.uri,
            r.rule_ids()
        );
        checked += 1;
        exact += usize::from(estimate == score);
    }
    assert!(checked >= 5, "only {checked} requests scored");
    assert!(
        exact * 2 >= checked,
        "estimate exact for {exact} of {checked}"
    );
}

#[test]
fn scores_of_allowed_requests_are_reported_exactly() {
    // 920440-ish policy hits alone and a lone 942 notice stay below the threshold of 5.
    let (ms, rules) = crs_engine(&CrsOptions::default());
    let (v, tx) = run_request(&ms, &rules, &Req::get("/search?q=%G1%ZZ"));
    assert_eq!(v, None);
    let r = tx.report();
    let score = r
        .inbound_anomaly_score()
        .unwrap_or_else(|| panic!("score of an allowed request: {r:#?}"));
    assert!(score > 0 && score < 5, "{score}");
    assert!(
        !r.rule_ids()
            .contains(&lastcall_modsec::crs::SCORE_RULE_INBOUND),
        "the score rule is not a match: {:?}",
        r.rule_ids()
    );
    assert!(!r.is_empty());
    // Benign: nothing at all.
    let (_, tx) = run_request(&ms, &rules, &Req::get("/"));
    assert_eq!(tx.report().inbound_anomaly_score(), None);
    assert!(tx.report().is_empty());
}

/// `exit_now` ends the process with its status while an evaluation still runs on another
/// thread (a rule that backtracks for seconds), without waiting for it or tearing
/// libmodsecurity down under it. The child is this test binary, run again with
/// `EXIT_NOW_CHILD` set.
#[test]
fn exit_now_leaves_while_an_evaluation_runs() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    if std::env::var_os("EXIT_NOW_CHILD").is_some() {
        let ms = lastcall_modsec::ModSecurity::new().expect("engine");
        let rules = RuleSet::from_directives(
            "SecRuleEngine On\nSecRule ARGS \"@rx ^(a|aa)+$\" \"id:1,phase:2,pass,t:none,log\"\n",
            "slow",
        )
        .expect("rules");
        let query: Vec<String> = (0..200)
            .map(|i| format!("a{i}={}!", "a".repeat(40)))
            .collect();
        let uri = format!("/?{}", query.join("&"));
        let started = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&started);
        std::thread::spawn(move || {
            let mut tx = Transaction::new(&ms, &rules, None).expect("tx");
            tx.process_uri(&uri, "GET", "1.1").expect("uri");
            tx.process_request_headers().expect("headers");
            flag.store(true, Ordering::SeqCst);
            let _ = tx.process_request_body();
            eprintln!("EVALUATION FINISHED");
        });
        while !started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(200));
        lastcall_modsec::exit_now(75);
    }
    let t0 = Instant::now();
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "engine::exit_now_leaves_while_an_evaluation_runs",
            "--nocapture",
        ])
        .env("EXIT_NOW_CHILD", "1")
        .output()
        .expect("child");
    let took = t0.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(!stderr.contains("EVALUATION FINISHED"), "{stderr}");
    // The evaluation alone takes several seconds (8 s with a release build on a loaded
    // 2-core machine); the child left right after its start.
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// The recommended engine settings (Coraza's `@coraza.conf-recommended`, ours) compile on
/// libmodsecurity, start in DetectionOnly (matches reported, nothing denied), and, turned
/// On after them as coraza-spoa's example does, deny with CRS and refuse bodies that do not
/// parse with 400.
#[test]
fn recommended_engine_settings_detect_first_then_block_when_turned_on() {
    let loc = lastcall_modsec::crs::Location::debian();
    let with_crs = |on: bool| {
        format!(
            "{}Include {}\nInclude {}\n{}",
            lastcall_modsec::crs::RECOMMENDED_ENGINE_SETTINGS,
            loc.setup.display(),
            loc.rules_glob(),
            if on { "SecRuleEngine On\n" } else { "" }
        )
    };
    let (ms, detect) = engine_with(&with_crs(false));
    let (v, tx) = run_request(&ms, &detect, &Req::get("/?id=1'%20OR%20'1'='1"));
    assert_eq!(v, None, "DetectionOnly never intervenes");
    assert!(
        tx.report().rule_ids().contains(&942100),
        "{:?}",
        tx.report()
    );
    let (ms, on) = engine_with(&with_crs(true));
    let (v, _) = run_request(&ms, &on, &Req::get("/?id=1'%20OR%20'1'='1"));
    assert_eq!(v.map(|i| i.status), Some(403));
    let mut req = Req::post_form("/api", b"{\"a\": [1, 2");
    req.headers.retain(|(k, _)| *k != "Content-Type");
    req.headers.push(("Content-Type", "application/json"));
    let (v, tx) = run_request(&ms, &on, &req);
    assert_eq!(v.map(|i| i.status), Some(400), "{:?}", tx.report());
    let (v, _) = run_request(&ms, &on, &Req::post_form("/f", b"name=alice&city=Paris"));
    assert_eq!(v, None);
}

/// A CRS laid out as a release (`crs-setup.conf.example` beside `rules/`) is found by
/// `Location::from_dir` and runs the same as Debian's packages (the files are Debian's,
/// copied into that layout); a directory without rules or setup is refused with what is
/// missing.
#[test]
fn a_crs_release_directory_is_used_like_debians() {
    use lastcall_modsec::crs::Location;
    let dir = tempfile::tempdir().expect("tempdir");
    let debian = Location::debian();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("mkdir");
    for entry in std::fs::read_dir(&debian.rules_dir).expect("Debian's CRS rules") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, rules.join(path.file_name().expect("name"))).expect("copy");
    }
    let err = Location::from_dir(dir.path()).unwrap_err();
    assert!(err.contains("crs-setup.conf.example"), "{err}");
    std::fs::copy(&debian.setup, dir.path().join("crs-setup.conf.example")).expect("copy");
    let loc = Location::from_dir(dir.path()).expect("a release layout");
    assert_eq!(loc.setup, dir.path().join("crs-setup.conf.example"));
    assert_eq!(loc.rules_dir, rules);
    let (ms, rs) = crs_engine(&loc.options());
    let (v, tx) = run_request(&ms, &rs, &Req::get("/?id=1'%20OR%20'1'='1"));
    assert_eq!(v.map(|i| i.status), Some(403));
    assert!(tx.report().inbound_anomaly_score() >= Some(5));
    let empty = tempfile::tempdir().expect("tempdir");
    let err = Location::from_dir(empty.path()).unwrap_err();
    assert!(err.contains("no REQUEST-*.conf"), "{err}");
}

/// The score rules appended after a hand-written rule set report CRS's own total for
/// requests that scored, blocked or not.
#[test]
fn score_rules_after_any_rule_set_report_crs_totals() {
    let loc = lastcall_modsec::crs::Location::debian();
    let text = format!(
        "{}SecRuleEngine On\nInclude {}\nInclude {}\n{}",
        lastcall_modsec::crs::RECOMMENDED_ENGINE_SETTINGS,
        loc.setup.display(),
        loc.rules_glob(),
        lastcall_modsec::crs::score_rules_text()
    );
    let (ms, rules) = engine_with(&text);
    let (v, tx) = run_request(&ms, &rules, &Req::get("/search?q=%G1%ZZ"));
    assert_eq!(v, None);
    let score = tx.report().inbound_anomaly_score().expect("reported");
    assert!(score > 0 && score < 5, "{score}");
    let (_, tx) = run_request(&ms, &rules, &Req::get("/"));
    assert_eq!(tx.report().inbound_anomaly_score(), None);
}

/// `version()` names the library this process mapped (`libmodsecurity.so.3.0.N`), which is
/// what a newer shared library under the same binary must show as (scripts/test_peers.sh
/// runs the spoa tests that check it on 3.0.14 and 3.0.16).
#[test]
fn version_is_the_loaded_librarys() {
    let (ms, _) = crs_engine(&CrsOptions::default());
    let mapped = lastcall_testkit::peers::mapped_release(std::process::id(), "libmodsecurity")
        .expect("libmodsecurity.so.X.Y.Z mapped");
    assert_eq!(ms.version(), mapped, "{}", ms.who_am_i());
    assert!(
        ms.who_am_i().starts_with("ModSecurity v"),
        "{}",
        ms.who_am_i()
    );
}
