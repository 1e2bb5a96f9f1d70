//! The reference side of the differential check: a real nginx with Debian's
//! `libnginx-mod-http-modsecurity` (libmodsecurity 3.0.9, the same library the agent
//! links) running the same rule text, in front of a real origin; plus the request corpus
//! (`tests/corpus/requests.txt`) and a raw HTTP/1.1 sender that records, per request,
//! whether the origin saw it.
//!
//! nginx runs in the foreground (`daemon off; master_process off;`) with a temporary
//! prefix holding its config, rules, pid, logs and temp paths, on a free 127.0.0.1 port;
//! it is killed on drop (also on panic). The origin is a real server
//! ([`super::Origin`]): nginx-ModSecurity does not inspect responses generated with
//! `return`, and it answers many phases only on proxied requests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lastcall_testkit::{self as testkit, Pod};

use super::{Origin, WAIT};

/// The nginx the tests run, from one place ([`testkit::peers::nginx`]: `LASTCALL_NGINX`, a
/// command, as for HAProxy; else Debian's).
pub(crate) fn command() -> Command {
    testkit::peers::nginx()
}

/// Debian's ModSecurity connector module for nginx.
pub(crate) const MODSECURITY_MODULE: &str = "/usr/lib/nginx/modules/ngx_http_modsecurity_module.so";

/// A running nginx with ModSecurity.
pub(crate) struct Nginx {
    /// The process (stderr captured), stopped when this is dropped.
    _pod: Pod,
    /// Where it listens for HTTP.
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Nginx {
    /// Starts nginx in front of `origin`, running `rules` (SecLang text, written to
    /// `rules.conf` and loaded with `modsecurity_rules_file`), and waits until it listens.
    pub(crate) fn start(rules: &str, origin: SocketAddr) -> Nginx {
        let dir = tempfile::tempdir().expect("tempdir");
        let prefix = dir.path();
        std::fs::write(prefix.join("rules.conf"), rules).expect("write rules");
        let addr: SocketAddr = format!("127.0.0.1:{}", testkit::free_port())
            .parse()
            .expect("addr");
        let conf = config(prefix, addr, origin);
        std::fs::write(prefix.join("nginx.conf"), conf).expect("write nginx.conf");
        let command = || {
            let mut cmd = command();
            cmd.arg("-p")
                .arg(prefix)
                .arg("-c")
                .arg(prefix.join("nginx.conf"))
                .arg("-e")
                .arg(prefix.join("error.log"));
            cmd
        };
        // Check the configuration (and the rules) first, for a clear failure.
        let check = command().arg("-t").output().expect("run nginx -t");
        assert!(
            check.status.success(),
            "nginx -t failed: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let pod = Pod::spawn(command());
        // CRS compiles in well under a second; the bound is for a busy machine.
        testkit::wait_for_tcp(addr, WAIT);
        Nginx {
            _pod: pod,
            addr,
            dir,
        }
    }

    /// nginx's error log (ModSecurity's messages land here).
    pub(crate) fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// What nginx appended to its error log since `*offset` (moved to the end).
    pub(crate) fn error_log_since(&self, offset: &mut usize) -> String {
        let log = self.error_log();
        let new = log.get(*offset..).unwrap_or_default().to_owned();
        *offset = log.len();
        new
    }

    /// The request attack rule ids (coraza-spoa's ranges, below 950000) in the ModSecurity
    /// lines nginx logged since `*offset`, in order, without duplicates; and whether
    /// ModSecurity logged anything at all.
    pub(crate) fn request_rules_since(&self, offset: &mut usize) -> (Vec<u32>, bool) {
        let mut ids = Vec::new();
        let log = self.error_log_since(offset);
        for part in log.split("[id \"").skip(1) {
            let id = part
                .split('"')
                .next()
                .and_then(|s| s.parse::<u32>().ok())
                .unwrap_or(0);
            if lastcall_spoa::waf::is_attack_rule(id) && id < 950_000 && !ids.contains(&id) {
                ids.push(id);
            }
        }
        (ids, log.contains("ModSecurity: "))
    }
}

/// nginx.conf for the test. Header handling is made as permissive as HAProxy's
/// (`underscores_in_headers on`, `ignore_invalid_headers off`), so that both proxies hand
/// the same headers to libmodsecurity; bodies are kept in memory up to 20 MB.
fn config(prefix: &Path, addr: SocketAddr, origin: SocketAddr) -> String {
    let p = prefix.display();
    format!(
        "load_module {MODSECURITY_MODULE};
daemon off;
master_process off;
worker_processes 1;
pid {p}/nginx.pid;
error_log {p}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {p}/access.log;
    client_body_temp_path {p}/client_body;
    proxy_temp_path {p}/proxy;
    fastcgi_temp_path {p}/fastcgi;
    uwsgi_temp_path {p}/uwsgi;
    scgi_temp_path {p}/scgi;
    underscores_in_headers on;
    ignore_invalid_headers off;
    client_max_body_size 20m;
    client_body_buffer_size 20m;
    modsecurity on;
    modsecurity_rules_file {p}/rules.conf;
    server {{
        listen {addr};
        server_name _;
        location / {{
            proxy_pass http://{origin};
            proxy_set_header Host $http_host;
        }}
    }}
}}
"
    )
}

/// One corpus entry.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Unique name.
    pub name: String,
    /// `benign`, `attack` or `policy` (what the author meant; the differential compares
    /// the two proxies, not this label).
    pub kind: String,
    /// The request line as written.
    pub request_line: String,
    /// The exact bytes sent.
    pub raw: Vec<u8>,
}

/// Path of the corpus file.
pub(crate) fn corpus_path() -> PathBuf {
    super::crate_dir().join("tests/corpus/requests.txt")
}

/// Parses the corpus (format described in `tests/corpus/gen_requests.py`).
pub(crate) fn load_corpus(path: &Path) -> Vec<Entry> {
    let text = std::fs::read_to_string(path).expect("read corpus");
    parse_corpus(&text)
}

/// See [`load_corpus`].
pub(crate) fn parse_corpus(text: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut current: Option<(String, String, Vec<&str>)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("=== ") {
            if let Some((name, kind, lines)) = current.take() {
                entries.push(build_entry(name, kind, &lines));
            }
            let mut it = rest.split_whitespace();
            let name = it.next().expect("entry name").to_owned();
            let kind = it.next().unwrap_or("benign").to_owned();
            current = Some((name, kind, Vec::new()));
        } else if let Some((_, _, lines)) = current.as_mut() {
            lines.push(line);
        }
    }
    if let Some((name, kind, lines)) = current.take() {
        entries.push(build_entry(name, kind, &lines));
    }
    let mut names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), entries.len(), "corpus names must be unique");
    entries
}

fn build_entry(name: String, kind: String, lines: &[&str]) -> Entry {
    let split = lines
        .iter()
        .position(|l| l.is_empty())
        .unwrap_or(lines.len());
    let (head, rest) = lines.split_at(split);
    let request_line = head.first().expect("request line").to_string();
    let headers = head.get(1..).unwrap_or_default();
    let mut body_lines: Vec<&str> = rest.get(1..).unwrap_or_default().to_vec();
    while body_lines.last().is_some_and(|l| l.is_empty()) {
        body_lines.pop();
    }
    let has = |n: &str| {
        headers.iter().any(|h| {
            h.split_once(':')
                .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case(n))
        })
    };
    let multipart = headers.iter().any(|h| {
        h.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("content-type")
                && v.trim().to_ascii_lowercase().starts_with("multipart/")
        })
    });
    let chunked = headers.iter().any(|h| {
        h.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        // Size and data lines, CRLF-separated, ended by the empty trailer line.
        format!("{}\r\n\r\n", body_lines.join("\r\n"))
    } else {
        body_lines.join(if multipart { "\r\n" } else { "\n" })
    };
    let mut raw = String::new();
    raw.push_str(&request_line);
    raw.push_str("\r\n");
    for h in headers {
        raw.push_str(h);
        raw.push_str("\r\n");
    }
    if !body.is_empty() && !has("content-length") && !has("transfer-encoding") {
        raw.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    if !has("connection") {
        raw.push_str("Connection: close\r\n");
    }
    raw.push_str("\r\n");
    raw.push_str(&body);
    Entry {
        name,
        kind,
        request_line,
        raw: raw.into_bytes(),
    }
}

/// What happened to one request at one proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Did the origin receive it? (The verdict: allowed iff it reached the origin.)
    pub reached_origin: bool,
    /// Status the client got; 0 when the connection closed without a response.
    pub status: u16,
    /// Request rule ids that matched (sorted), as the proxy's side reports them.
    pub rules: Vec<u32>,
}

impl Outcome {
    /// `allow` or `deny`.
    pub(crate) fn verdict(&self) -> &'static str {
        if self.reached_origin {
            "allow"
        } else {
            "deny"
        }
    }
}

/// A response as the raw client saw it.
#[derive(Debug, Clone, Default)]
pub(crate) struct RawReply {
    /// Status; 0 when the connection closed without a response.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
}

impl RawReply {
    /// First header named `name` (lower-case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends raw request bytes and reads the whole response (the request says
/// `Connection: close`).
pub(crate) fn send_raw(addr: SocketAddr, raw: &[u8]) -> std::io::Result<RawReply> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(WAIT))?;
    s.set_write_timeout(Some(WAIT))?;
    s.write_all(raw)?;
    let mut resp = Vec::new();
    match s.read_to_end(&mut resp) {
        Ok(_) => {}
        Err(e) if !resp.is_empty() || e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => return Err(e),
    }
    let head_end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(resp.len());
    let head = String::from_utf8_lossy(resp.get(..head_end).unwrap_or_default());
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(RawReply { status, headers })
}

/// Sends every entry, one at a time, to `proxy`, and reports whether `origin` saw each;
/// `rules_of` tells which request rules matched (from the reply or the proxy's log).
/// Requests are sequential, so the origin's counter tells which request reached it.
pub(crate) fn run_corpus(
    proxy: SocketAddr,
    origin: &Origin,
    corpus: &[Entry],
    rules_of: impl FnMut(&RawReply) -> Vec<u32>,
) -> Vec<Outcome> {
    run_corpus_with(
        origin,
        corpus,
        |e| {
            send_raw(proxy, &e.raw)
                .unwrap_or_else(|err| panic!("{}: sending to {proxy}: {err}", e.name))
        },
        rules_of,
    )
}

/// [`run_corpus`], each request sent by `send`.
pub(crate) fn run_corpus_with(
    origin: &Origin,
    corpus: &[Entry],
    mut send: impl FnMut(&Entry) -> RawReply,
    mut rules_of: impl FnMut(&RawReply) -> Vec<u32>,
) -> Vec<Outcome> {
    corpus
        .iter()
        .map(|e| {
            let before = origin.served.load(Ordering::SeqCst);
            let reply = send(e);
            // The origin counts a request before it answers, and the proxy answers the
            // client after the origin did: the count is final here.
            let after = origin.served.load(Ordering::SeqCst);
            let mut rules = rules_of(&reply);
            rules.sort_unstable();
            rules.dedup();
            Outcome {
                reached_origin: after > before,
                status: reply.status,
                rules,
            }
        })
        .collect()
}

/// Whether libmodsecurity, run directly on `rules`, lets the raw request through: the
/// reference for requests nginx refuses itself before ModSecurity sees them (`OPTIONS *`,
/// a path above the root, TRACE). The target is handed over as nginx hands targets to
/// ModSecurity: `*` as is, the path and query of an absolute-form target (`/` without a
/// path). Also returns the request attack rules that matched.
pub(crate) fn libmodsecurity_allows(rules: &str, raw: &[u8]) -> (bool, Vec<u32>) {
    use lastcall_modsec::{ModSecurity, RuleSet, Transaction};
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(raw.len());
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let body = raw.get(head_end + 4..).unwrap_or_default();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or("GET"),
        parts.next().unwrap_or("/"),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    let target = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    let ms = ModSecurity::new().expect("libmodsecurity");
    let set = RuleSet::from_directives(rules, "reference").expect("rules compile");
    let mut tx = Transaction::new(&ms, &set, None).expect("transaction");
    let verdict = (|| -> Result<bool, lastcall_modsec::Error> {
        if tx
            .process_connection("127.0.0.1", 40000, "127.0.0.1", 80)?
            .is_some()
        {
            return Ok(false);
        }
        let v = version.strip_prefix("HTTP/").unwrap_or("1.1");
        if tx.process_uri(target, method, v)?.is_some() {
            return Ok(false);
        }
        for l in lines {
            if let Some((k, val)) = l.split_once(':') {
                tx.add_request_header(k.trim().as_bytes(), val.trim().as_bytes())?;
            }
        }
        if tx.process_request_headers()?.is_some() {
            return Ok(false);
        }
        if !body.is_empty() {
            tx.append_request_body(body)?;
        }
        Ok(tx.process_request_body()?.is_none())
    })()
    .expect("libmodsecurity evaluates");
    let mut ids: Vec<u32> = tx
        .report()
        .rule_ids()
        .iter()
        .copied()
        .filter(|id| lastcall_spoa::waf::is_attack_rule(*id) && *id < 950_000)
        .collect();
    ids.sort_unstable();
    (verdict, ids)
}

/// The request rule ids HAProxy's documented configuration shows in `x-waf-rule-ids`
/// (coraza-spoa's `rule_ids` variable, set with `exportRuleIDs=bool(true)`).
pub(crate) fn rules_from_header(reply: &RawReply) -> Vec<u32> {
    reply
        .header("x-waf-rule-ids")
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse::<u32>().ok())
        .filter(|id| *id < 950_000)
        .collect()
}
