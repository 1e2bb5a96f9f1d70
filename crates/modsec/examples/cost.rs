//! What one hostile request costs libmodsecurity + Debian's CRS, by input size, and which
//! rule files and rules the cost comes from.
//!
//! ```text
//! cargo run --release -p lastcall-modsec --example cost -- sizes [KB,...] [--in query|body|raw|json|header|names|headers] [--pattern TEXT] [--extra DIRECTIVE]... [--after DIRECTIVE]... [--without-limits]
//! cargo run --release -p lastcall-modsec --example cost -- files KB [--in ...] [--pattern ...]
//! cargo run --release -p lastcall-modsec --example cost -- rules KB FILE [--in ...] [--pattern ...]
//! ```
//!
//! `sizes` times one request (phases 0-2 and logging, thread CPU time) whose input is
//! `--pattern` (default `1' OR 1=1-- `) repeated to each size, placed in the query string
//! (`q=...`, as HAProxy passes it: raw), a form body (`body`), a `text/plain` body (`raw`), a
//! JSON body (`json`) or one header; with `names` and
//! `headers` each KB is 1,000 query arguments or request headers instead;
//! `--extra` adds directives after the engine settings (e.g. `SecPcreMatchLimit 1000`),
//! `--after` after CRS (e.g. a rule that denies on `TX:MSC_PCRE_LIMITS_EXCEEDED`);
//! `--without-limits` leaves out the engine's limits (`crs::ENGINE_LIMITS`).
//! `files` times each CRS rule file alone (with the initialisation rules); `rules` times
//! each rule of one file alone. Each line says whether the request was denied.
#![allow(
    unsafe_code,
    reason = "clock_gettime(CLOCK_THREAD_CPUTIME_ID): the thread CPU time this example measures"
)]
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a measuring tool: a step that fails ends the run with its message"
)]

use std::sync::Arc;
use std::time::Instant;

use lastcall_modsec::crs::{debian_default_directives, CrsOptions, ENGINE_LIMITS};
use lastcall_modsec::{ModSecurity, RuleSet, Transaction};

const RULES_DIR: &str = "/usr/share/modsecurity-crs/rules";
const INIT: &str = "REQUEST-901-INITIALIZATION.conf";

#[derive(Clone, Copy, PartialEq)]
enum Place {
    Query,
    Body,
    Raw,
    Json,
    Header,
    Names,
    Headers,
}

struct Opts {
    place: Place,
    pattern: String,
    extra: Vec<String>,
    after: Vec<String>,
    paranoia: u8,
    /// Without `crs::ENGINE_LIMITS` (to see what they change).
    without_limits: bool,
}

fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn input(o: &Opts, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + o.pattern.len());
    while s.len() < bytes {
        s.push_str(&o.pattern);
    }
    s.truncate(bytes);
    s
}

/// One request; returns (CPU seconds, wall seconds, denied).
fn one(ms: &Arc<ModSecurity>, rules: &Arc<RuleSet>, o: &Opts, bytes: usize) -> (f64, f64, bool) {
    let data = input(o, bytes);
    let (uri, body, header, method) = match o.place {
        Place::Query => (format!("/search?q={data}"), String::new(), None, "GET"),
        Place::Body => ("/form".into(), format!("q={data}"), None, "POST"),
        Place::Raw => ("/upload".into(), data, None, "POST"),
        Place::Json => (
            "/api".into(),
            format!("{{\"q\":{}}}", json_string(&data)),
            None,
            "POST",
        ),
        Place::Header => ("/".into(), String::new(), Some(data), "GET"),
        // For these two, the size is a count: 1 "KB" is 1,000 arguments or headers.
        Place::Names | Place::Headers if o.place == Place::Names => {
            let names: Vec<String> = (0..bytes / 1024 * 1000)
                .map(|i| format!("a{i}=1"))
                .collect();
            (format!("/?{}", names.join("&")), String::new(), None, "GET")
        }
        Place::Names | Place::Headers => ("/".into(), String::new(), None, "GET"),
    };
    let many = if o.place == Place::Headers {
        bytes / 1024 * 1000
    } else {
        0
    };
    let (cpu0, wall0) = (thread_cpu(), Instant::now());
    let mut tx = Transaction::new(ms, rules, None).expect("tx");
    // As the agent (and nginx) do: the first intervention ends the request.
    let denied = (|| {
        if tx
            .process_connection("192.0.2.7", 50123, "127.0.0.1", 8080)
            .expect("conn")
            .is_some()
            || tx.process_uri(&uri, method, "1.1").expect("uri").is_some()
        {
            return true;
        }
        let len = body.len().to_string();
        let mut headers = vec![
            ("Host".to_owned(), "shop.example.com".to_owned()),
            (
                "User-Agent".to_owned(),
                "Mozilla/5.0 (X11; Linux x86_64)".to_owned(),
            ),
            ("Accept".to_owned(), "*/*".to_owned()),
        ];
        if let Some(h) = header {
            headers.push(("X-Data".into(), h));
        }
        headers.extend((0..many).map(|i| (format!("X-H{i}"), "v".to_owned())));
        if !body.is_empty() {
            let ctype = match o.place {
                Place::Raw => "text/plain",
                Place::Json => "application/json",
                _ => "application/x-www-form-urlencoded",
            };
            headers.push(("Content-Type".into(), ctype.into()));
            headers.push(("Content-Length".into(), len));
        }
        for (k, v) in &headers {
            tx.add_request_header(k.as_bytes(), v.as_bytes())
                .expect("header");
        }
        if tx.process_request_headers().expect("headers").is_some() {
            return true;
        }
        if !body.is_empty() {
            tx.append_request_body(body.as_bytes()).expect("body");
            if tx.intervention().is_some() {
                return true;
            }
        }
        tx.process_request_body().expect("body phase").is_some()
    })();
    tx.process_logging().expect("logging");
    (thread_cpu() - cpu0, wall0.elapsed().as_secs_f64(), denied)
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn base(o: &Opts, rules: &str) -> String {
    let d = debian_default_directives(&CrsOptions {
        paranoia_level: o.paranoia,
        crs_rules: rules.to_owned(),
        ..CrsOptions::default()
    });
    let d = if o.without_limits {
        d.replace(ENGINE_LIMITS, "")
    } else {
        d
    };
    // `--extra` after the engine settings, before CRS; `--after` at the end.
    let at = d.find("Include ").unwrap_or(d.len());
    let mut text = format!("{}{}\n{}", &d[..at], o.extra.join("\n"), &d[at..]);
    for line in &o.after {
        text.push_str(line);
        text.push('\n');
    }
    text
}

fn compile(text: &str) -> Arc<RuleSet> {
    RuleSet::from_directives(text, "cost").unwrap_or_else(|e| panic!("rules: {e}\n{text}"))
}

fn rule_ids(file: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut ids = Vec::new();
    for part in text.split("id:").skip(1) {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(id) = digits.parse() {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

fn report(label: &str, (cpu, wall, denied): (f64, f64, bool)) {
    println!(
        "{label:<58} {cpu:9.3} s CPU {wall:9.3} s wall  {}",
        if denied { "denied" } else { "passed" }
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = Opts {
        place: Place::Query,
        pattern: "1' OR 1=1-- ".into(),
        extra: Vec::new(),
        after: Vec::new(),
        paranoia: 1,
        without_limits: false,
    };
    let mut positional = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--in" => {
                o.place = match it.next().map(String::as_str) {
                    Some("query") => Place::Query,
                    Some("body") => Place::Body,
                    Some("raw") => Place::Raw,
                    Some("json") => Place::Json,
                    Some("header") => Place::Header,
                    Some("names") => Place::Names,
                    Some("headers") => Place::Headers,
                    other => {
                        panic!("--in {other:?}: query, body, raw, json, header, names or headers")
                    }
                }
            }
            "--pattern" => o.pattern = it.next().expect("--pattern TEXT").clone(),
            "--extra" => o.extra.push(it.next().expect("--extra DIRECTIVE").clone()),
            "--after" => o.after.push(it.next().expect("--after DIRECTIVE").clone()),
            "--without-limits" => o.without_limits = true,
            "--paranoia" => o.paranoia = it.next().and_then(|p| p.parse().ok()).expect("1-4"),
            _ => positional.push(a.clone()),
        }
    }
    let ms = ModSecurity::new().expect("engine");
    println!("{}; pattern {:?}", ms.who_am_i(), o.pattern);
    let kb = |s: Option<&String>| -> usize { s.and_then(|s| s.parse().ok()).unwrap_or(64) * 1024 };
    match positional.first().map(String::as_str) {
        Some("sizes") | None => {
            let sizes: Vec<usize> = positional
                .get(1)
                .map_or("1,16,64,128,256", String::as_str)
                .split(',')
                .filter_map(|s| s.parse().ok())
                .collect();
            let rules = compile(&base(&o, &format!("{RULES_DIR}/*.conf")));
            for s in sizes {
                report(&format!("{s} KB"), one(&ms, &rules, &o, s * 1024));
            }
        }
        Some("files") => {
            let bytes = kb(positional.get(1));
            let mut files: Vec<String> = std::fs::read_dir(RULES_DIR)
                .expect("rules dir")
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|f| f.ends_with(".conf") && f.starts_with("REQUEST-") && f != INIT)
                .collect();
            files.sort();
            let init = format!("{RULES_DIR}/{INIT}");
            let rules = compile(&base(&o, &init));
            report("(initialisation only)", one(&ms, &rules, &o, bytes));
            for f in files {
                let text = format!("{}Include {RULES_DIR}/{f}\n", base(&o, &init));
                report(&f, one(&ms, &compile(&text), &o, bytes));
            }
        }
        Some("rules") => {
            let bytes = kb(positional.get(1));
            let file = positional.get(2).expect("rules KB FILE");
            let path = if file.contains('/') {
                file.clone()
            } else {
                format!("{RULES_DIR}/{file}")
            };
            let ids = rule_ids(&path);
            let init = format!("{RULES_DIR}/{INIT}");
            for id in &ids {
                let others: Vec<String> = ids
                    .iter()
                    .filter(|i| *i != id)
                    .map(u32::to_string)
                    .collect();
                let text = format!(
                    "{}Include {path}\nSecRuleRemoveById {}\n",
                    base(&o, &init),
                    others.join(" ")
                );
                report(&format!("rule {id}"), one(&ms, &compile(&text), &o, bytes));
            }
        }
        Some(other) => panic!("unknown mode {other}: sizes, files or rules"),
    }
}
