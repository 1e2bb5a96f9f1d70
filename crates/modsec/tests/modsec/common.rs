//! Helpers shared by the integration tests: real libmodsecurity, real Debian CRS.

use std::sync::Arc;

use lastcall_modsec::{crs, Intervention, ModSecurity, RuleSet, Transaction};

/// A request as the tests describe it.
pub(crate) struct Req<'a> {
    pub method: &'a str,
    pub uri: &'a str,
    pub headers: Vec<(&'a str, &'a str)>,
    pub body: &'a [u8],
}

impl<'a> Req<'a> {
    pub(crate) fn get(uri: &'a str) -> Self {
        Req {
            method: "GET",
            uri,
            headers: browser_headers(),
            body: b"",
        }
    }

    pub(crate) fn post_form(uri: &'a str, body: &'a [u8]) -> Self {
        let mut headers = browser_headers();
        headers.push(("Content-Type", "application/x-www-form-urlencoded"));
        Req {
            method: "POST",
            uri,
            headers,
            body,
        }
    }
}

pub(crate) fn browser_headers() -> Vec<(&'static str, &'static str)> {
    vec![
        ("Host", "shop.example.com"),
        (
            "User-Agent",
            "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0",
        ),
        ("Accept", "text/html,application/xhtml+xml,*/*;q=0.8"),
        ("Accept-Language", "en-US,en;q=0.5"),
        ("Accept-Encoding", "gzip, deflate"),
    ]
}

pub(crate) fn engine_with(directives: &str) -> (Arc<ModSecurity>, Arc<RuleSet>) {
    let ms = ModSecurity::new().expect("msc_init");
    let rules = RuleSet::from_directives(directives, "test").expect("rules compile");
    (ms, rules)
}

pub(crate) fn crs_engine(opts: &crs::CrsOptions) -> (Arc<ModSecurity>, Arc<RuleSet>) {
    engine_with(&crs::debian_default_directives(opts))
}

/// Runs phases 0-2 (always including the request body phase) and returns the first
/// intervention with the transaction (for its report or a response check).
pub(crate) fn run_request(
    ms: &Arc<ModSecurity>,
    rules: &Arc<RuleSet>,
    req: &Req<'_>,
) -> (Option<Intervention>, Transaction) {
    let mut tx = Transaction::new(ms, rules, None).expect("transaction");
    let verdict = drive_request(&mut tx, req);
    (verdict, tx)
}

pub(crate) fn drive_request(tx: &mut Transaction, req: &Req<'_>) -> Option<Intervention> {
    if let Some(i) = tx
        .process_connection("192.0.2.10", 51334, "127.0.0.1", 8080)
        .expect("connection")
    {
        return Some(i);
    }
    if let Some(i) = tx.process_uri(req.uri, req.method, "1.1").expect("uri") {
        return Some(i);
    }
    for (k, v) in &req.headers {
        tx.add_request_header(k.as_bytes(), v.as_bytes())
            .expect("header");
    }
    let len = req.body.len().to_string();
    if !req.body.is_empty() {
        tx.add_request_header(b"Content-Length", len.as_bytes())
            .expect("header");
    }
    if let Some(i) = tx.process_request_headers().expect("headers") {
        return Some(i);
    }
    if !req.body.is_empty() {
        tx.append_request_body(req.body).expect("body");
    }
    tx.process_request_body().expect("body phase")
}

/// Runs phases 3-4 for a response.
pub(crate) fn drive_response(
    tx: &mut Transaction,
    status: u16,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<Intervention> {
    for (k, v) in headers {
        tx.add_response_header(k.as_bytes(), v.as_bytes())
            .expect("response header");
    }
    if let Some(i) = tx
        .process_response_headers(status, "HTTP/1.1")
        .expect("response headers")
    {
        return Some(i);
    }
    tx.append_response_body(body).expect("response body");
    tx.process_response_body().expect("response body phase")
}
