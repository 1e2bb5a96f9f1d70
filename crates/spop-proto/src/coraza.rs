//! The coraza-spoa message contract: the `coraza-req` and `coraza-res` messages' arguments,
//! decoded from SPOP typed data into plain structs (header blocks by [`super::hdrs`]).
//!
//! Arguments are looked up by name, so their order does not matter (coraza-spoa requires
//! `app` first; we accept that order and any other). Unknown arguments are ignored.
//!
//! coraza-spoa's switches: `exportRuleIDs` (both messages) asks for `rule_ids`;
//! `detect-only` (`coraza-res`) asks for an answer at once, the response evaluated
//! afterwards for the log only. Both are read as HAProxy sends them (`bool(true)`), and
//! also from an integer or `true`/`false` text.
//!
//! A known argument of the wrong type (an integer where an address is expected, a boolean
//! for a path) or a header block that cannot be read is a `problem`: the message is not
//! evaluated (the agent answers with the error variable), never evaluated without it.

use std::net::IpAddr;

use spop::frame::Message;
use spop::TypedData;

use super::hdrs::parse_hdrs;

/// Name of the request message.
pub const REQUEST_MESSAGE: &str = "coraza-req";
/// Name of the response message.
pub const RESPONSE_MESSAGE: &str = "coraza-res";

/// A `coraza-req` message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// `app`: which application's rules to use.
    pub app: String,
    /// `id`: a transaction id, if HAProxy sends one (`unique-id`); generated otherwise.
    pub id: Option<String>,
    /// `src-ip`.
    pub src_ip: Option<IpAddr>,
    /// `src-port`.
    pub src_port: u16,
    /// `dst-ip`.
    pub dst_ip: Option<IpAddr>,
    /// `dst-port`.
    pub dst_port: u16,
    /// `method`.
    pub method: String,
    /// `path`.
    pub path: String,
    /// `query` (without `?`), if any.
    pub query: Option<String>,
    /// `version`, e.g. `1.1`.
    pub version: String,
    /// Headers, decoded from `req.hdrs` (text) or `req.hdrs_bin` (binary).
    pub headers: Vec<(String, String)>,
    /// `body` as received (possibly truncated by HAProxy to its buffer).
    pub body: Vec<u8>,
    /// `body_size` / `body-size` / `req.body_size`: the full body size HAProxy knows of.
    pub body_size: Option<u64>,
    /// `exportRuleIDs`: set `rule_ids`.
    pub export_rule_ids: bool,
    /// The first argument that could not be read, and why.
    pub problem: Option<String>,
}

/// A `coraza-res` message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Response {
    /// `app`.
    pub app: String,
    /// `id`: the request's transaction id (`var(txn.coraza.id)`).
    pub id: String,
    /// `version`.
    pub version: String,
    /// `status`.
    pub status: i32,
    /// Response headers.
    pub headers: Vec<(String, String)>,
    /// Response body.
    pub body: Vec<u8>,
    /// The full body size HAProxy knows of, if sent.
    pub body_size: Option<u64>,
    /// `exportRuleIDs`: set `rule_ids`.
    pub export_rule_ids: bool,
    /// `detect-only`: answer at once, evaluate afterwards for the log only.
    pub detect_only: bool,
    /// The first argument that could not be read, and why.
    pub problem: Option<String>,
}

/// The type of a value, in errors.
fn kind(v: &TypedData) -> &'static str {
    match v {
        TypedData::Null => "null",
        TypedData::Bool(_) => "a boolean",
        TypedData::Int32(_) | TypedData::UInt32(_) | TypedData::Int64(_) | TypedData::UInt64(_) => {
            "an integer"
        }
        TypedData::IPv4(_) | TypedData::IPv6(_) => "an address",
        TypedData::String(_) => "a string",
        TypedData::Binary(_) => "binary data",
    }
}

type Read<T> = Result<T, String>;

fn wrong<T>(expected: &str, v: &TypedData) -> Read<T> {
    Err(format!("expected {expected}, got {}", kind(v)))
}

/// Text: a string, binary data (read as UTF-8, lossily), or null (none).
fn text(v: &TypedData) -> Read<Option<String>> {
    match v {
        TypedData::String(s) => Ok(Some(s.clone())),
        TypedData::Binary(b) => Ok(Some(String::from_utf8_lossy(b).into_owned())),
        TypedData::Null => Ok(None),
        other => wrong("a string", other),
    }
}

fn bytes(v: &TypedData) -> Read<Vec<u8>> {
    match v {
        TypedData::Binary(b) => Ok(b.clone()),
        TypedData::String(s) => Ok(s.as_bytes().to_vec()),
        TypedData::Null => Ok(Vec::new()),
        other => wrong("binary data or a string", other),
    }
}

/// A switch: `bool(true)`, a non-zero integer, or `true`/`1` as text.
fn switch(v: &TypedData) -> bool {
    match v {
        TypedData::Bool(b) => *b,
        TypedData::String(s) => matches!(s.trim(), "true" | "1"),
        other => matches!(int(other), Ok(Some(n)) if n != 0),
    }
}

fn int(v: &TypedData) -> Read<Option<i64>> {
    match v {
        TypedData::Int32(n) => Ok(Some(i64::from(*n))),
        TypedData::UInt32(n) => Ok(Some(i64::from(*n))),
        TypedData::Int64(n) => Ok(Some(*n)),
        TypedData::UInt64(n) => i64::try_from(*n)
            .map(Some)
            .map_err(|_| format!("integer {n} out of range")),
        TypedData::String(s) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("expected an integer, got the string {s:?}")),
        TypedData::Null => Ok(None),
        other => wrong("an integer", other),
    }
}

fn size(v: &TypedData) -> Read<Option<u64>> {
    int(v)?
        .map(|n| u64::try_from(n).map_err(|_| format!("size {n} is negative")))
        .transpose()
}

fn ip(v: &TypedData) -> Read<Option<IpAddr>> {
    match v {
        TypedData::IPv4(a) => Ok(Some(IpAddr::V4(*a))),
        TypedData::IPv6(a) => Ok(Some(IpAddr::V6(*a))),
        TypedData::String(s) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("expected an address, got the string {s:?}")),
        TypedData::Null => Ok(None),
        other => wrong("an address", other),
    }
}

fn port(v: &TypedData) -> Read<u16> {
    match int(v)? {
        None => Ok(0),
        Some(n) => u16::try_from(n).map_err(|_| format!("port {n} out of range")),
    }
}

fn headers(v: &TypedData) -> Read<Vec<(String, String)>> {
    match v {
        TypedData::Binary(b) => parse_hdrs(b, true),
        TypedData::String(s) => parse_hdrs(s.as_bytes(), false),
        TypedData::Null => Ok(Vec::new()),
        other => wrong("a header block (req.hdrs or req.hdrs_bin)", other),
    }
}

/// Keeps what `got` read; otherwise notes the first problem, naming the argument.
fn keep<T: Default>(problem: &mut Option<String>, arg: &str, got: Read<T>) -> T {
    got.unwrap_or_else(|e| {
        problem.get_or_insert_with(|| format!("argument `{arg}`: {e}"));
        T::default()
    })
}

impl Request {
    /// Decodes a `coraza-req` message.
    pub fn from_message(msg: &Message) -> Self {
        let mut r = Request::default();
        let p = &mut r.problem;
        for (name, v) in &msg.args {
            let name = name.as_str();
            match name {
                "app" => r.app = keep(p, name, text(v)).unwrap_or_default(),
                "id" => r.id = keep(p, name, text(v)).filter(|s| !s.is_empty()),
                "src-ip" => r.src_ip = keep(p, name, ip(v)),
                "src-port" => r.src_port = keep(p, name, port(v)),
                "dst-ip" => r.dst_ip = keep(p, name, ip(v)),
                "dst-port" => r.dst_port = keep(p, name, port(v)),
                "method" => r.method = keep(p, name, text(v)).unwrap_or_default(),
                "path" => r.path = keep(p, name, text(v)).unwrap_or_default(),
                "query" => r.query = keep(p, name, text(v)).filter(|q| !q.is_empty()),
                "version" => r.version = keep(p, name, text(v)).unwrap_or_default(),
                "headers" => r.headers = keep(p, name, headers(v)),
                "body" => r.body = keep(p, name, bytes(v)),
                "body_size" | "body-size" | "req.body_size" => {
                    r.body_size = keep(p, name, size(v));
                }
                "exportRuleIDs" => r.export_rule_ids = switch(v),
                _ => {}
            }
        }
        r
    }

    /// The request target as ModSecurity sees it: path plus `?query`, as nginx hands it
    /// over. HAProxy's `path` is empty for two targets: `*` (`OPTIONS * HTTP/1.1`, the only
    /// method that takes it) and an absolute-form target without a path
    /// (`GET http://example.com HTTP/1.1`, which HAProxy 3.x already turns into `/`); nginx
    /// gives ModSecurity `/` for the latter, and the path alone for every absolute-form
    /// target, as HAProxy's `path` does.
    pub fn uri(&self) -> String {
        let path = match self.path.as_str() {
            "" if self.method.eq_ignore_ascii_case("OPTIONS") && self.query.is_none() => "*",
            "" => "/",
            p => p,
        };
        match &self.query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_owned(),
        }
    }

    /// The size the body should have: `body_size` if HAProxy sent it, else `Content-Length`.
    #[cfg(test)]
    pub fn declared_body_size(&self) -> Option<u64> {
        self.body_size.or_else(|| content_length(&self.headers))
    }

    /// Whether HAProxy handed us less body than the request carries.
    #[cfg(test)]
    pub fn body_truncated(&self) -> bool {
        self.declared_body_size()
            .is_some_and(|n| n > self.body.len() as u64)
    }
}

/// The `app` argument of a message (the last one, as the decoders read it), without
/// decoding the rest.
pub fn app_of(msg: &Message) -> String {
    msg.args
        .iter()
        .rev()
        .find(|(name, _)| name == "app")
        .and_then(|(_, v)| text(v).ok().flatten())
        .unwrap_or_default()
}

impl Response {
    /// Decodes a `coraza-res` message.
    pub fn from_message(msg: &Message) -> Self {
        let mut r = Response::default();
        let p = &mut r.problem;
        for (name, v) in &msg.args {
            let name = name.as_str();
            match name {
                "app" => r.app = keep(p, name, text(v)).unwrap_or_default(),
                "id" => r.id = keep(p, name, text(v)).unwrap_or_default(),
                "version" => r.version = keep(p, name, text(v)).unwrap_or_default(),
                "status" => {
                    let status = keep(p, name, int(v)).unwrap_or(0);
                    r.status = keep(
                        p,
                        name,
                        i32::try_from(status).map_err(|_| format!("status {status} out of range")),
                    );
                }
                "headers" => r.headers = keep(p, name, headers(v)),
                "body" => r.body = keep(p, name, bytes(v)),
                "body_size" | "body-size" | "res.body_size" => {
                    r.body_size = keep(p, name, size(v));
                }
                "exportRuleIDs" => r.export_rule_ids = switch(v),
                "detect-only" => r.detect_only = switch(v),
                _ => {}
            }
        }
        r
    }

    /// Whether HAProxy handed us less body than the response carries.
    pub fn body_truncated(&self) -> bool {
        self.body_size
            .or_else(|| content_length(&self.headers))
            .is_some_and(|n| n > self.body.len() as u64)
    }
}

/// Whether the headers say `Transfer-Encoding: chunked`.
pub fn is_chunked(headers: &[(String, String)]) -> bool {
    headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked")
    })
}

/// The `Content-Length` the headers declare, if any.
pub fn content_length(headers: &[(String, String)]) -> Option<u64> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_from_message() {
        let msg = Message {
            name: REQUEST_MESSAGE.into(),
            args: vec![
                ("app".into(), TypedData::String("a".into())),
                ("src-ip".into(), TypedData::IPv4([127, 0, 0, 1].into())),
                ("src-port".into(), TypedData::Int32(5555)),
                ("method".into(), TypedData::String("POST".into())),
                ("path".into(), TypedData::String("/x".into())),
                ("query".into(), TypedData::String("a=1".into())),
                (
                    "headers".into(),
                    TypedData::String("content-length: 10\r\n\r\n".into()),
                ),
                ("body".into(), TypedData::Binary(b"abc".to_vec())),
            ],
        };
        let r = Request::from_message(&msg);
        assert_eq!(r.uri(), "/x?a=1");
        assert_eq!(r.src_port, 5555);
        assert!(r.body_truncated());
        assert!(!r.export_rule_ids);
        assert_eq!(r.problem, None);
    }

    #[test]
    fn targets_haproxy_leaves_without_a_path() {
        let r = |method: &str, path: &str, query: Option<&str>| Request {
            method: method.into(),
            path: path.into(),
            query: query.map(Into::into),
            ..Request::default()
        };
        assert_eq!(r("OPTIONS", "", None).uri(), "*");
        assert_eq!(r("options", "", None).uri(), "*");
        assert_eq!(r("GET", "", None).uri(), "/");
        assert_eq!(r("OPTIONS", "", Some("a=1")).uri(), "/?a=1");
        assert_eq!(r("OPTIONS", "/p", None).uri(), "/p");
    }

    #[test]
    fn coraza_spoa_switches() {
        let msg = |args: Vec<(&str, TypedData)>| Message {
            name: RESPONSE_MESSAGE.into(),
            args: args.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        };
        let r = Response::from_message(&msg(vec![
            ("exportRuleIDs", TypedData::Bool(true)),
            ("detect-only", TypedData::Bool(true)),
        ]));
        assert!(r.export_rule_ids && r.detect_only);
        let r = Response::from_message(&msg(vec![
            ("exportRuleIDs", TypedData::Bool(false)),
            ("detect-only", TypedData::String("true".into())),
        ]));
        assert!(!r.export_rule_ids && r.detect_only);
        let r = Response::from_message(&msg(vec![("detect-only", TypedData::Int32(0))]));
        assert!(!r.detect_only);
    }

    /// A known argument of the wrong type, or headers that cannot be read, is a problem
    /// (the first one is kept), never an empty value.
    #[test]
    fn wrong_types_and_bad_headers_are_problems() {
        let req = |args: Vec<(&str, TypedData)>| {
            Request::from_message(&Message {
                name: REQUEST_MESSAGE.into(),
                args: args.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            })
        };
        for (arg, v, says) in [
            (
                "src-ip",
                TypedData::Int32(7),
                "expected an address, got an integer",
            ),
            (
                "src-ip",
                TypedData::String("nowhere".into()),
                "got the string",
            ),
            ("src-port", TypedData::Int32(70_000), "out of range"),
            ("dst-port", TypedData::Bool(true), "expected an integer"),
            (
                "path",
                TypedData::IPv4([1, 2, 3, 4].into()),
                "expected a string",
            ),
            ("body", TypedData::Int64(1), "expected binary data"),
            ("body_size", TypedData::Int64(-1), "negative"),
            ("headers", TypedData::Int32(1), "expected a header block"),
            (
                "headers",
                TypedData::Binary(vec![0xff, 0x01, 0x02]),
                "req.hdrs_bin",
            ),
            (
                "headers",
                TypedData::String("no colon here\r\n".into()),
                "without a name",
            ),
        ] {
            let r = req(vec![
                ("app", TypedData::String("a".into())),
                (arg, v.clone()),
                ("src-port", TypedData::Bool(false)),
            ]);
            let p = r.problem.unwrap_or_default();
            assert!(
                p.starts_with(&format!("argument `{arg}`")) && p.contains(says),
                "{arg} {v:?}: {p}"
            );
        }
        assert_eq!(
            req(vec![("src-ip", TypedData::String("::1".into()))]).problem,
            None
        );
        assert_eq!(req(vec![("query", TypedData::Null)]).problem, None);
        let res = Response::from_message(&Message {
            name: RESPONSE_MESSAGE.into(),
            args: vec![("status".into(), TypedData::String("two hundred".into()))],
        });
        assert!(res.problem.is_some_and(|p| p.contains("status")));
    }
}
