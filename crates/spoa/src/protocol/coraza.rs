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

use std::net::IpAddr;

use spop::frame::Message;
use spop::TypedData;

use super::hdrs::{parse_hdrs_bin, parse_hdrs_text};

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
}

fn text(v: &TypedData) -> Option<String> {
    match v {
        TypedData::String(s) => Some(s.clone()),
        TypedData::Binary(b) => Some(String::from_utf8_lossy(b).into_owned()),
        TypedData::Null => None,
        TypedData::Int32(n) => Some(n.to_string()),
        TypedData::UInt32(n) => Some(n.to_string()),
        TypedData::Int64(n) => Some(n.to_string()),
        TypedData::UInt64(n) => Some(n.to_string()),
        TypedData::IPv4(a) => Some(a.to_string()),
        TypedData::IPv6(a) => Some(a.to_string()),
        TypedData::Bool(b) => Some(b.to_string()),
    }
}

fn bytes(v: &TypedData) -> Vec<u8> {
    match v {
        TypedData::Binary(b) => b.clone(),
        TypedData::String(s) => s.as_bytes().to_vec(),
        _ => Vec::new(),
    }
}

fn int(v: &TypedData) -> Option<i64> {
    match v {
        TypedData::Int32(n) => Some(i64::from(*n)),
        TypedData::UInt32(n) => Some(i64::from(*n)),
        TypedData::Int64(n) => Some(*n),
        TypedData::UInt64(n) => i64::try_from(*n).ok(),
        TypedData::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A switch: `bool(true)`, a non-zero integer, or `true`/`1` as text.
fn switch(v: &TypedData) -> bool {
    match v {
        TypedData::Bool(b) => *b,
        TypedData::String(s) => matches!(s.trim(), "true" | "1"),
        other => int(other).is_some_and(|n| n != 0),
    }
}

fn ip(v: &TypedData) -> Option<IpAddr> {
    match v {
        TypedData::IPv4(a) => Some(IpAddr::V4(*a)),
        TypedData::IPv6(a) => Some(IpAddr::V6(*a)),
        TypedData::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn port(v: &TypedData) -> u16 {
    int(v).and_then(|n| u16::try_from(n).ok()).unwrap_or(0)
}

fn headers(v: &TypedData) -> Vec<(String, String)> {
    match v {
        TypedData::Binary(b) => parse_hdrs_bin(b).unwrap_or_else(|| parse_hdrs_text(b)),
        TypedData::String(s) => parse_hdrs_text(s.as_bytes()),
        _ => Vec::new(),
    }
}

impl Request {
    /// Decodes a `coraza-req` message.
    pub fn from_message(msg: &Message) -> Self {
        let mut r = Request::default();
        for (name, v) in &msg.args {
            match name.as_str() {
                "app" => r.app = text(v).unwrap_or_default(),
                "id" => r.id = text(v).filter(|s| !s.is_empty()),
                "src-ip" => r.src_ip = ip(v),
                "src-port" => r.src_port = port(v),
                "dst-ip" => r.dst_ip = ip(v),
                "dst-port" => r.dst_port = port(v),
                "method" => r.method = text(v).unwrap_or_default(),
                "path" => r.path = text(v).unwrap_or_default(),
                "query" => r.query = text(v).filter(|q| !q.is_empty()),
                "version" => r.version = text(v).unwrap_or_default(),
                "headers" => r.headers = headers(v),
                "body" => r.body = bytes(v),
                "body_size" | "body-size" | "req.body_size" => {
                    r.body_size = int(v).and_then(|n| u64::try_from(n).ok());
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
    pub fn declared_body_size(&self) -> Option<u64> {
        self.body_size.or_else(|| content_length(&self.headers))
    }

    /// Whether HAProxy handed us less body than the request carries.
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
        .and_then(|(_, v)| text(v))
        .unwrap_or_default()
}

impl Response {
    /// Decodes a `coraza-res` message.
    pub fn from_message(msg: &Message) -> Self {
        let mut r = Response::default();
        for (name, v) in &msg.args {
            match name.as_str() {
                "app" => r.app = text(v).unwrap_or_default(),
                "id" => r.id = text(v).unwrap_or_default(),
                "version" => r.version = text(v).unwrap_or_default(),
                "status" => r.status = int(v).and_then(|n| i32::try_from(n).ok()).unwrap_or(0),
                "headers" => r.headers = headers(v),
                "body" => r.body = bytes(v),
                "body_size" | "body-size" | "res.body_size" => {
                    r.body_size = int(v).and_then(|n| u64::try_from(n).ok());
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
}
