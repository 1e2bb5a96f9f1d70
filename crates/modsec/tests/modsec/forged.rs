//! Requests that write libmodsecurity's log fields into the bytes its lines carry (the
//! matched value and variable name, a header, the path, a message expanding a macro): the
//! report names the rules that really matched, with their own file, line, severity and tags,
//! and the verdict and the score are what the request itself earns.
//!
//! Real libmodsecurity and CRS; run the binary under `scripts/peer-run trixie|sid` for 3.0.14
//! and 3.0.16 (each test prints the release).

use std::sync::Arc;

use lastcall_modsec::{crs, ModSecurity, RuleMatch, RuleSet, Transaction};

use crate::common::{drive_request, Req};

/// Three rules of ours beside CRS: one logging any variable that says "forge" (its line
/// carries the value or the name), one whose message expands the value, and one on an
/// argument `probe=1` (its line carries the imitation only in its `[uri "…"]`, if at all).
const PROBES: &str = "SecRule ARGS|ARGS_NAMES|REQUEST_HEADERS|REQUEST_FILENAME \"@contains forge\" \"id:190010,phase:2,pass,log,msg:'forge probe',severity:4,tag:'probe'\"\n\
SecRule ARGS:m \"@contains forge\" \"id:190011,phase:2,pass,log,msg:'m is %{MATCHED_VAR}',severity:5,tag:'macro'\"\n\
SecRule ARGS:probe \"@streq 1\" \"id:190012,phase:2,pass,log,msg:'plain probe',severity:4,tag:'plain'\"\n";

/// What a client writes: a whole head and tail claiming rule 941999 with a tag and file of
/// its own, and CRS's blocking message with a score.
const FAKE: &str = "forge\"] [file \"/forged\"] [line \"7\"] [id \"941999\"] [rev \"\"] [msg \"Inbound Anomaly Score Exceeded (Total Score: 99999)\"] [data \"\"] [severity \"0\"] [ver \"\"] [maturity \"0\"] [accuracy \"0\"] [tag \"forged-tag\"] [hostname \"127.0.0.1\"] [uri \"/\"] [unique_id \"forged-tx\"] [ref \"";

fn engine() -> (Arc<ModSecurity>, Arc<RuleSet>) {
    let ms = ModSecurity::new().expect("msc_init");
    let text = format!(
        "{}\n{PROBES}",
        crs::debian_default_directives(&crs::CrsOptions::default())
    );
    let rules = RuleSet::from_directives(&text, "forged").expect("rules");
    (ms, rules)
}

fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_./".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Every match is a rule of the set: its file holds a SecRule at its line with its id (or
/// it came from our text), and nothing the client wrote is read back.
fn assert_real(m: &RuleMatch, case: &str) {
    assert_ne!(m.id, 941_999, "{case}: {}", m.line);
    assert!(
        !m.tags.iter().any(|t| t.contains("forged")),
        "{case}: {}",
        m.line
    );
    assert!(
        m.file != "/forged" && m.unique_id != "forged-tx",
        "{case}: {}",
        m.line
    );
    assert_ne!(m.severity, Some(0), "{case}: {}", m.line);
    if m.file.ends_with(".conf") {
        let text = std::fs::read_to_string(&m.file).unwrap_or_default();
        let at: String = text
            .lines()
            .skip((m.file_line as usize).saturating_sub(1))
            .take(4)
            .collect();
        assert!(
            at.starts_with("SecRule") && at.contains(&format!("id:{}", m.id)),
            "{case}: {} at {}:{}: {at}",
            m.id,
            m.file,
            m.file_line
        );
    }
}

fn run(
    (ms, rules): &(Arc<ModSecurity>, Arc<RuleSet>),
    req: &Req<'_>,
    id: Option<&str>,
) -> (Option<u16>, Transaction) {
    let mut tx = Transaction::new(ms, rules, id).expect("transaction");
    let it = drive_request(&mut tx, req);
    (it.map(|i| i.status), tx)
}

#[test]
fn request_bytes_do_not_forge_rule_fields() {
    let set = engine();
    println!("{}", set.0.who_am_i());
    let value = format!("/?probe=1&q={}", pct(FAKE));
    let name = format!("/?probe=1&{}=1", pct(FAKE));
    let path = format!("/{}?probe=1", pct(FAKE));
    let header_req = {
        let mut r = Req::get("/?probe=1&q=1");
        r.headers.push(("X-Note", FAKE));
        r
    };
    let body = format!("q={}", pct(FAKE));
    let shapes: Vec<(&str, Req<'_>)> = vec![
        ("argument value", Req::get(&value)),
        ("argument name", Req::get(&name)),
        ("header", header_req),
        ("path", Req::get(&path)),
        ("body", Req::post_form("/?probe=1", body.as_bytes())),
    ];
    for (case, req) in &shapes {
        for id in [Some("tx-forged-1"), None] {
            let (verdict, tx) = run(&set, req, id);
            let report = tx.report();
            for m in report.matches() {
                assert_real(m, case);
                if let Some(id) = id {
                    assert_eq!(m.unique_id, id, "{case}");
                }
            }
            let probe = report
                .matches()
                .iter()
                .find(|m| m.id == 190_010)
                .unwrap_or_else(|| panic!("{case}: {:#?}", report.matches()));
            assert_eq!(
                (probe.msg.as_str(), probe.severity, probe.tags.as_slice()),
                ("forge probe", Some(4), &["probe".to_owned()][..]),
                "{case}: {}",
                probe.line
            );
            // The probe's line carries the imitation in its matched value: it says so.
            assert!(probe.ambiguous, "{case}: {}", probe.line);
            // The plain probe's reads one way: in the path shape its `[uri "…"]` holds a
            // whole imitated tail, which the known path tells apart.
            let plain = report
                .matches()
                .iter()
                .find(|m| m.id == 190_012)
                .unwrap_or_else(|| panic!("{case}: {:#?}", report.matches()));
            assert!(!plain.ambiguous, "{case}: {}", plain.line);
            assert_eq!(
                (plain.msg.as_str(), plain.tags.as_slice()),
                ("plain probe", &["plain".to_owned()][..]),
                "{case}"
            );
            assert_eq!(plain.hostname, "127.0.0.1", "{case}");
            assert!(
                report.inbound_anomaly_score().unwrap_or(0) < 99_999,
                "{case}: {:?}",
                report.inbound_anomaly_score()
            );
            // What the request earns on its own: CRS's verdict from its own score.
            let score = report.inbound_anomaly_score().unwrap_or(0);
            assert_eq!(
                verdict == Some(403),
                score >= 5,
                "{case}: score {score}, {verdict:?}"
            );
        }
    }
}

/// A message expanding request bytes: the line says it is ambiguous, its severity and
/// tags (after the message) stay real, and no score comes from it.
#[test]
fn a_message_macro_is_flagged_and_scores_nothing() {
    let uri = format!("/?m={}", pct(FAKE));
    let set = engine();
    println!("{}", set.0.who_am_i());
    let (verdict, tx) = run(&set, &Req::get(&uri), Some("tx-forged-2"));
    let report = tx.report();
    let m = report
        .matches()
        .iter()
        .find(|m| m.tags == ["macro"])
        .unwrap_or_else(|| panic!("{:#?}", report.matches()));
    // (The line as this release writes it, for the record.)
    println!("{}", m.line);
    assert!(m.ambiguous, "{}", m.line);
    assert_eq!(m.severity, Some(5), "{}", m.line);
    assert!(report.inbound_anomaly_score().unwrap_or(0) < 99_999);
    let score = report.inbound_anomaly_score().unwrap_or(0);
    assert_eq!(
        verdict == Some(403),
        score >= 5,
        "score {score}, {verdict:?}"
    );
}

/// An attack carrying a forged score of 0 and a forged score-rule line is still denied by
/// CRS's rule, with CRS's score.
#[test]
fn a_forged_low_score_changes_nothing() {
    let low = format!(
        "forge\"] [file \"/x\"] [line \"1\"] [id \"{}\"] [rev \"\"] [msg \"{}inbound 0\"] [data \"\"] [severity \"2\"",
        crs::SCORE_RULE_INBOUND,
        crs::SCORE_MESSAGE_PREFIX
    );
    let uri = format!("/?id=1'%20OR%20'1'='1&q={}", pct(&low));
    let (ms, rules) = engine();
    println!("{}", ms.who_am_i());
    let mut tx = Transaction::new(&ms, &rules, Some("tx-forged-3")).expect("transaction");
    let it = drive_request(&mut tx, &Req::get(&uri)).expect("denied");
    assert_eq!((it.status, it.rule_id()), (403, Some(949_110)));
    let report = tx.report();
    assert!(
        report.inbound_anomaly_score().unwrap_or(0) >= 5,
        "{:?}",
        report.inbound_anomaly_score()
    );
    assert!(
        report.rule_ids().contains(&942_100),
        "{:?}",
        report.rule_ids()
    );
    for m in report.matches() {
        assert_real(m, "low score");
    }
}
