//! Acceptance through a real HAProxy 2.6 and a real origin: benign traffic passes, attacks
//! are denied with the rule id visible to HAProxy, responses can be blocked, detect-only lets
//! attacks through and records them. Timeouts: SPOE `timeout processing 5s` (the documented
//! file), client waits up to 30 s.

use crate::support::{get, post_form, Stack, StackOptions};

fn crs_stack(config: Option<&str>) -> Stack {
    Stack::start(StackOptions {
        agent_config: config.map(str::to_owned),
        agents: 1,
        ..StackOptions::default()
    })
}

#[test]
fn benign_get_passes_and_sqli_is_denied_with_rule_id() {
    let stack = crs_stack(None);
    let ok = get(stack.http(), "/index.html?q=hello");
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert!(
        ok.text().starts_with("origin ok GET /index.html"),
        "{}",
        ok.text()
    );
    assert_eq!(ok.header("x-waf-anomaly-score"), Some("0"));

    let attack = get(stack.http(), "/?id=1'%20OR%20'1'='1");
    assert_eq!(attack.status, 403, "{}", attack.text());
    assert_eq!(attack.header("waf-block"), Some("request"));
    // CRS blocks on the anomaly score (rule 949110), after SQLi rules matched.
    assert_eq!(attack.header("x-waf-ruleid"), Some("949110"));
    let hit = attack.header("x-waf-rule-ids").unwrap_or_default();
    assert!(
        hit.split(',').any(|id| id.starts_with("942")),
        "rules hit: {hit}"
    );
    // coraza-spoa's `rules_hit` counts the rules `rule_ids` names.
    assert_eq!(
        attack.header("x-waf-rules-hit"),
        Some(hit.split(',').count().to_string().as_str())
    );
    let score: u32 = attack
        .header("x-waf-anomaly-score")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(score >= 5, "anomaly score {score}");

    // HAProxy's own log line carries the rule id too.
    stack
        .haproxy
        .pod
        .wait_for_log("waf-rule=949110", crate::support::WAIT);

    let agent = &stack.agents[0];
    assert!(agent.metric("spoa_requests_total{verdict=\"deny\"}") >= 1.0);
    assert!(agent.metric("spoa_requests_total{verdict=\"allow\"}") >= 2.0);
    assert!(agent
        .metrics()
        .contains("spoa_evaluation_duration_seconds_bucket"));
}

#[test]
fn xss_in_post_body_is_denied() {
    let stack = crs_stack(None);
    let benign = post_form(stack.http(), "/comment", "name=alice&text=nice+post");
    assert_eq!(benign.status, 200, "{}", benign.text());
    assert!(
        benign.text().contains("origin ok POST /comment 25"),
        "{}",
        benign.text()
    );

    let xss = post_form(
        stack.http(),
        "/comment",
        "name=mallory&text=%3Cscript%3Ealert(document.cookie)%3C%2Fscript%3E",
    );
    assert_eq!(xss.status, 403, "{}", xss.text());
    let hit = xss.header("x-waf-rule-ids").unwrap_or_default();
    assert!(
        hit.split(',').any(|id| id.starts_with("941")),
        "rules hit: {hit}"
    );
}

#[test]
fn response_rule_blocks_a_response() {
    let config = "\
default_application: default
applications:
  - name: default
    response_check: true
    transaction_ttl_ms: 10000
";
    let stack = crs_stack(Some(config));
    let ok = get(stack.http(), "/page");
    assert_eq!(ok.status, 200, "{}", ok.text());

    // The origin answers /leak with an SQL error message; CRS's data-leakage rules (951xxx)
    // push the outbound score over its threshold and 959100 denies the response.
    let leak = get(stack.http(), "/leak");
    assert_eq!(leak.status, 403, "{}", leak.text());
    assert_eq!(leak.header("waf-block"), Some("response"));
    assert!(
        !leak.text().contains("SQL syntax"),
        "the leaked body must not reach the client"
    );
    let hit = leak.header("x-waf-rule-ids").unwrap_or_default();
    assert!(
        hit.split(',').any(|id| id.starts_with("951")),
        "rules hit: {hit}"
    );
    let agent = &stack.agents[0];
    assert!(agent.metric("spoa_responses_total{verdict=\"deny\"}") >= 1.0);
    assert!(agent.metric("spoa_responses_total{verdict=\"allow\"}") >= 1.0);
}

#[test]
fn detect_only_lets_attacks_through_and_records_them() {
    let config = "\
default_application: default
applications:
  - name: default
    detect_only: true
";
    let stack = crs_stack(Some(config));
    let attack = get(stack.http(), "/?id=1'%20OR%20'1'='1");
    assert_eq!(attack.status, 200, "{}", attack.text());
    assert!(attack.header("waf-block").is_none());
    let hit = attack.header("x-waf-rule-ids").unwrap_or_default();
    assert!(
        hit.split(',').any(|id| id.starts_with("942")),
        "rules hit: {hit}"
    );
    let agent = &stack.agents[0];
    assert!(agent.metric("spoa_requests_total{verdict=\"detect\"}") >= 1.0);
    assert_eq!(agent.metric("spoa_requests_total{verdict=\"deny\"}"), 0.0);
    agent
        .pod
        .wait_for_log("would be denied (detect only)", crate::support::WAIT);
}

/// A file from before with `evaluation: inline` still loads; the setting is ignored with a
/// warning (every evaluation runs on the evaluation threads), and the agent serves.
#[test]
fn inline_evaluation_is_ignored_and_the_agent_serves_under_load() {
    let config = "\
evaluation: inline
default_application: default
applications:
  - name: default
";
    let stack = crs_stack(Some(config));
    let agent = &stack.agents[0];
    agent
        .pod
        .wait_for_log("evaluation: inline is no longer done", crate::support::WAIT);
    let ok = get(stack.http(), "/index.html?q=hello");
    assert_eq!(ok.status, 200, "{}", ok.text());
    let attack = get(stack.http(), "/?id=1'%20OR%20'1'='1");
    assert_eq!(attack.status, 403, "{}", attack.text());
    assert_eq!(attack.header("x-waf-ruleid"), Some("949110"));

    // 16 keep-alive clients, benign requests and attacks mixed: HAProxy pipelines NOTIFYs;
    // every one is answered.
    let load = crate::support::traffic::Load::start(stack.http(), 16);
    load.wait_until(600, std::time::Duration::from_secs(120));
    let totals = load.stop();
    assert_eq!(totals.failed(), 0, "{totals}");
    assert!(totals.blocked > 0, "{totals}");
    assert!(agent.metric("spoa_requests_total{verdict=\"deny\"}") >= 1.0);
    assert!(agent.metric("spoa_requests_total{verdict=\"allow\"}") >= 1.0);
}

/// HAProxy's version as (major, minor), from `haproxy -v`.
fn haproxy_version() -> (u32, u32) {
    let line = crate::support::haproxy::version();
    let v = line
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .unwrap_or_else(|| panic!("no version in {line:?}"));
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// The agents' backend docs/spoa.md gives for HAProxy 3.1 and later (`mode spop`, the
/// handshake and idle timeouts in the backend), in place of the documented file's: on 3.1+
/// it serves through both agents (benign 200, SQL injection 403); older HAProxy refuses it
/// at start with "unknown proxy mode", as the page says. Runs on whichever HAProxy
/// `LASTCALL_HAPROXY` gives.
#[test]
fn the_documented_31_backend_in_mode_spop() {
    let docs = std::fs::read_to_string(crate::support::crate_dir().join("../../docs/spoa.md"))
        .expect("docs/spoa.md");
    let open = "```haproxy\nbackend coraza-spoa\n    mode spop\n";
    let start = docs.find(open).expect("the 3.1+ backend in docs/spoa.md") + "```haproxy\n".len();
    let snippet = &docs[start..start + docs[start..].find("```").expect("end of the block")];
    let example =
        std::fs::read_to_string(crate::support::haproxy::config_path()).expect("haproxy.cfg");
    let at = example
        .find("\nbackend coraza-spoa\n")
        .expect("the agents' backend");
    assert!(
        example[at + 1..]
            .lines()
            .skip(1)
            .all(|l| l.is_empty() || l.starts_with(' ')),
        "the agents' backend is the file's last section"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("haproxy.cfg");
    std::fs::write(&path, format!("{}\n{snippet}", &example[..at])).expect("write");

    let version = haproxy_version();
    println!("{} -> {version:?}", crate::support::haproxy::version());
    if version < (3, 1) {
        let out = crate::support::haproxy::command()
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .env("FRONTEND_ADDR", "127.0.0.1:1")
            .env("ORIGIN_ADDR", "127.0.0.1:2")
            .env("SPOA1_ADDR", "127.0.0.1:3")
            .env("SPOA2_ADDR", "127.0.0.1:4")
            .env("CORAZA_SPOE_CFG", crate::support::haproxy::spoe_path())
            .env("STATS_SOCKET", dir.path().join("admin.sock"))
            .output()
            .expect("haproxy -c");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{text}");
        assert!(text.contains("unknown proxy mode"), "{text}");
        return;
    }
    let origin = crate::support::Origin::start();
    let a1 = crate::support::Agent::start(None, &[]);
    let a2 = crate::support::Agent::start(None, &[]);
    let h = crate::support::Haproxy::start_files(
        tempfile::tempdir().expect("tempdir"),
        &path,
        &crate::support::haproxy::spoe_path(),
        origin.addr,
        a1.addr,
        a2.addr,
    );
    for i in 0..4 {
        let ok = get(h.addr, &format!("/index.html?q=hello&i={i}"));
        assert_eq!(ok.status, 200, "{}", ok.text());
        let attack = get(h.addr, &format!("/?id=1'%20OR%20'1'='1&i={i}"));
        assert_eq!(attack.status, 403, "{}", attack.text());
        assert_eq!(attack.header("x-waf-ruleid"), Some("949110"));
    }
    // The agents gave the verdicts (HAProxy may keep to one connection, so not both).
    let denied: f64 = [&a1, &a2]
        .iter()
        .map(|a| a.metric("spoa_requests_total{verdict=\"deny\"}"))
        .sum();
    assert_eq!(denied, 4.0);
}
