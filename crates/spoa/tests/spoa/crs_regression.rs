//! The CRS project's own regression corpus through nginx + ModSecurity and through HAProxy +
//! lastcall-spoa, both on the same CRS tree and the same rule text (the agent's built-in
//! application at `LASTCALL_SPOA_CRS_PL`, 2 by default, as `show-rules` prints it), when
//! `LASTCALL_SPOA_CRS_DIR` names a CRS release's source tree (its `tests/regression/tests`;
//! no CRS 4 release comes from a package registry, so CI runs without one and this test
//! says so). Every stage is one request (`tests/corpus/crs_regression.py` builds them as
//! go-ftw does); a request is allowed when it reached the origin.
//!
//! What must hold: the WAF is on at both (most stages that expect a rule are denied by
//! both), and the agent never lets through a stage nginx + ModSecurity denies after
//! ModSecurity saw it. Every difference is printed, with the statuses.

use std::process::Command;

use crate::support::nginx::{self, Entry, Nginx, Outcome, RawReply};
use crate::support::{agent_bin, crate_dir, Origin, Stack, StackOptions};

fn corpus(crs: &std::path::Path) -> Vec<Entry> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .arg(crate_dir().join("tests/corpus/crs_regression.py"))
        .arg(crs)
        .output()
        .expect("run tests/corpus/crs_regression.py");
    assert!(
        out.status.success(),
        "crs_regression.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            let hex = v["raw"].as_str().expect("raw");
            let raw = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            Entry {
                name: v["name"].as_str().expect("name").to_owned(),
                kind: v["kind"].as_str().expect("kind").to_owned(),
                request_line: v["request_line"].as_str().expect("line").to_owned(),
                raw,
            }
        })
        .collect()
}

/// [`nginx::run_corpus`], except that a request the proxy does not answer in [`ANSWER`]
/// (stages that send less body than their `Content-Length`, or a body the proxy refuses
/// to read) is an outcome too: no status, and whether it reached the origin.
fn run(
    proxy: std::net::SocketAddr,
    origin: &Origin,
    corpus: &[Entry],
    rules_of: impl FnMut(&RawReply) -> Vec<u32>,
) -> Vec<Outcome> {
    let send = |e: &Entry| {
        send(proxy, &e.raw).unwrap_or_else(|err| {
            println!("  {}: no answer: {err}", e.name);
            RawReply::default()
        })
    };
    nginx::run_corpus_with(origin, corpus, send, rules_of)
}

/// How long a stage waits for its answer: the corpus has requests whose body never comes
/// (its `Content-Length` is larger), which both proxies wait for until they time out.
const ANSWER: std::time::Duration = std::time::Duration::from_secs(5);

/// Sends raw bytes and reads the answer's status line, [`ANSWER`] at most.
fn send(proxy: std::net::SocketAddr, raw: &[u8]) -> std::io::Result<RawReply> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&proxy, ANSWER)?;
    s.set_read_timeout(Some(ANSWER))?;
    s.set_write_timeout(Some(ANSWER))?;
    s.write_all(raw)?;
    let mut resp = Vec::new();
    match s.read_to_end(&mut resp) {
        Ok(_) => {}
        Err(_) if !resp.is_empty() => {}
        Err(e) => return Err(e),
    }
    let head = String::from_utf8_lossy(&resp);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(RawReply { status, headers })
}

#[test]
fn nginx_modsecurity_and_lastcall_spoa_agree_on_the_crs_regression_corpus() {
    let Some(crs) = std::env::var_os("LASTCALL_SPOA_CRS_DIR")
        .map(std::path::PathBuf::from)
        .filter(|d| d.join("tests/regression/tests").is_dir())
    else {
        eprintln!(
            "no CRS source tree named (LASTCALL_SPOA_CRS_DIR with tests/regression): not run"
        );
        return;
    };
    let pl: u8 = std::env::var("LASTCALL_SPOA_CRS_PL")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(2);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "crs_dir: {}\ndefault_application: crs\napplications:\n  - name: crs\n    paranoia_level: {pl}\n",
        crs.display()
    );
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, &config).expect("write");
    let shown = Command::new(agent_bin())
        .arg(format!("--config={}", file.display()))
        .arg("show-rules")
        .output()
        .expect("show-rules");
    assert!(shown.status.success(), "{shown:?}");
    let rules = String::from_utf8(shown.stdout).expect("UTF-8");
    let corpus = corpus(&crs);
    assert!(corpus.len() > 1000, "{} stages", corpus.len());

    let origin = Origin::start();
    let ngx = Nginx::start(&rules, origin.addr);
    let mut offset = ngx.error_log().len();
    let mut inspected = Vec::new();
    let reference = run(ngx.addr, &origin, &corpus, |_| {
        let (rules, logged) = ngx.request_rules_since(&mut offset);
        inspected.push(logged);
        rules
    });
    drop(ngx);
    let stack = Stack::start(StackOptions {
        agent_config: Some(config),
        agents: 1,
        ..StackOptions::default()
    });
    let agent = run(
        stack.http(),
        &stack.origin,
        &corpus,
        nginx::rules_from_header,
    );

    let mut weaker = Vec::new();
    let mut stricter = 0;
    let mut nginx_itself = 0;
    for (((e, n), h), seen) in corpus.iter().zip(&reference).zip(&agent).zip(&inspected) {
        if n.reached_origin == h.reached_origin {
            continue;
        }
        let line = format!(
            "{:<16} {:<6} nginx {} ({}, ModSecurity {}) vs haproxy+lastcall-spoa {} ({}): {}",
            e.name,
            e.kind,
            n.verdict(),
            n.status,
            if *seen { "saw it" } else { "did not see it" },
            h.verdict(),
            h.status,
            e.request_line.chars().take(120).collect::<String>()
        );
        println!("  DIFF {line}");
        if !h.reached_origin {
            stricter += 1;
        } else if *seen {
            weaker.push(line);
        } else {
            nginx_itself += 1;
        }
    }
    let share = |outcomes: &[nginx::Outcome], kind: &str| {
        let of: Vec<_> = corpus
            .iter()
            .zip(outcomes)
            .filter(|(e, _)| e.kind == kind)
            .collect();
        let denied = of.iter().filter(|(_, o)| !o.reached_origin).count();
        (denied, of.len())
    };
    let (na, attacks) = share(&reference, "attack");
    let (ha, _) = share(&agent, "attack");
    let (nb, benign) = share(&reference, "benign");
    let (hb, _) = share(&agent, "benign");
    println!(
        "CRS regression corpus at {} (PL{pl}): {} stages, {} differences: {stricter} denied by the agent's side only, {nginx_itself} refused by nginx itself before ModSecurity saw them, {} allowed by the agent's side where ModSecurity behind nginx denied; stages expecting a rule: {attacks}, denied by nginx {na}, by haproxy+lastcall-spoa {ha}; the others: {benign}, denied by nginx {nb}, by haproxy+lastcall-spoa {hb}",
        crs.display(),
        corpus.len(),
        stricter + nginx_itself + weaker.len(),
        weaker.len()
    );
    assert!(na * 2 >= attacks && ha * 2 >= attacks, "is the WAF on?");
    assert!(
        weaker.is_empty(),
        "allowed by haproxy+lastcall-spoa, denied by nginx + ModSecurity:\n{}",
        weaker.join("\n")
    );
}
