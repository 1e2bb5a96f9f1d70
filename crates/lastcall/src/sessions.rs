//! The sessions a drain waits for, on the admin listener, and the `sessions` command that
//! shows and ends them.
//!
//! A daemon hands its table to the lifecycle ([`Handle::provide_sessions`](crate::Handle::provide_sessions));
//! the admin listener then answers, under exactly the rule of `POST /drain` (without
//! `--admin-token` loopback peers only, 403 for others; with one, `Authorization: Bearer`
//! from every peer, 401 without):
//!
//! | request | answer |
//! |---|---|
//! | `GET /sessions?limit=N&after=ID` | 200 JSON page: `total`, `after`, `limit`, `next`, `sessions` |
//! | `DELETE /sessions/ID` | 200 JSON `{"ended": [session]}`; 404 when there is no such session |
//! | `DELETE /sessions?user=NAME` | 200 JSON `{"ended": [...]}`: every session of NAME (TURN); 404 when none |
//!
//! **Pages.** Sessions come in id order (ids are unique for the process's life, never
//! reused, and grow with creation time: oldest first). `limit` is 1 to [`MAX_LIMIT`]
//! (default [`DEFAULT_LIMIT`]); `after` is the last id of the previous page (default 0);
//! `next` is the `after` of the next page, `null` on the last one; `total` counts every live
//! session. A page costs the daemon O(log n + limit) whatever n, so a server with 100,000
//! sessions answers as fast as one with 100. Bad values get 400 naming the parameter and
//! what is valid. Durations are seconds as floats (`age_seconds`, ...), as in `GET /drain`.
//!
//! **Ending one** goes the way the drain's deadline ends them all, for that session only, is
//! counted in `lastcall_sessions_ended_total` and logged (who asked, which session).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

/// Sessions a page holds unless `limit` says otherwise.
pub const DEFAULT_LIMIT: usize = 100;
/// The most sessions one page may hold.
pub const MAX_LIMIT: usize = 1000;

/// A page of a daemon's sessions.
#[derive(Debug, Clone, Default)]
pub struct SessionPage {
    /// Live sessions, all of them.
    pub total: u64,
    /// The page, in id order; each an object with a numeric `id`.
    pub sessions: Vec<Value>,
    /// Whether sessions follow the last one of the page.
    pub more: bool,
}

/// What a daemon shows and ends on `/sessions`. Called on the admin listener's thread: a
/// call must not wait for the daemon's runtime, and should hold a data-path lock only for
/// the page's own work.
pub trait SessionTable: Send + Sync + 'static {
    /// Up to `limit` sessions with an id greater than `after`, in id order.
    fn page(&self, after: u64, limit: usize) -> SessionPage;
    /// Ends session `id` the way the deadline would; what it was, `None` if there is none.
    fn end(&self, id: u64) -> Option<Value>;
    /// Ends every session of `user`; what they were. `None`: this daemon's sessions have no
    /// user.
    fn end_user(&self, user: &str) -> Option<Vec<Value>> {
        let _ = user;
        None
    }
}

/// What `GET /sessions` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListQuery {
    pub after: u64,
    pub limit: usize,
}

/// The body of `GET /sessions`.
#[derive(Debug, serde::Serialize)]
pub(crate) struct ListAnswer {
    pub total: u64,
    pub after: u64,
    pub limit: usize,
    pub next: Option<u64>,
    pub sessions: Vec<Value>,
}

/// The body of a `DELETE`.
#[derive(Debug, serde::Serialize)]
pub(crate) struct EndAnswer {
    pub ended: Vec<Value>,
}

/// The query of `GET /sessions`, or the 400 message.
pub(crate) fn parse_list(query: Option<&str>) -> Result<ListQuery, String> {
    let mut q = ListQuery {
        after: 0,
        limit: DEFAULT_LIMIT,
    };
    for (key, value) in pairs(query)? {
        match key.as_str() {
            "limit" => {
                q.limit = match value.parse::<usize>() {
                    Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
                    _ => {
                        return Err(format!(
                            "limit: `{value}` is not valid; give 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT})"
                        ))
                    }
                }
            }
            "after" => {
                q.after = value.parse::<u64>().map_err(|_| {
                    format!("after: `{value}` is not a session id; give the `next` of the previous page (a whole number)")
                })?;
            }
            other => {
                return Err(format!(
                    "unknown parameter `{other}`; GET /sessions takes limit and after"
                ))
            }
        }
    }
    Ok(q)
}

/// What a `DELETE` on `/sessions…` asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EndQuery {
    Id(u64),
    User(String),
}

/// `path` is `/sessions` or `/sessions/ID`.
pub(crate) fn parse_end(path: &str, query: Option<&str>) -> Result<EndQuery, String> {
    if let Some(id) = path.strip_prefix("/sessions/") {
        if query.is_some_and(|q| !q.is_empty()) {
            return Err("DELETE /sessions/ID takes no parameter".into());
        }
        return id.parse::<u64>().map(EndQuery::Id).map_err(|_| {
            format!("`{id}` is not a session id (a whole number, as GET /sessions lists them)")
        });
    }
    let mut user = None;
    for (key, value) in pairs(query)? {
        match key.as_str() {
            "user" if !value.is_empty() => user = Some(value),
            "user" => return Err("user: give a user name".into()),
            other => {
                return Err(format!(
                    "unknown parameter `{other}`; DELETE /sessions takes user (or use DELETE /sessions/ID)"
                ))
            }
        }
    }
    user.map(EndQuery::User)
        .ok_or_else(|| "DELETE /sessions needs ?user=NAME (or use DELETE /sessions/ID)".to_string())
}

/// The `key=value` pairs of a query, percent-decoded.
fn pairs(query: Option<&str>) -> Result<Vec<(String, String)>, String> {
    let Some(query) = query else {
        return Ok(Vec::new());
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

/// Percent-decoding (and `+` as a space), to UTF-8.
fn decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent-encoding in `{s}`"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{s}` is not UTF-8 once decoded"))
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

// ------------------------------------------------------------------------------------------
// The command
// ------------------------------------------------------------------------------------------

/// A column of the command's table: its header and how a session's JSON shows in it.
pub type Column = (&'static str, fn(&Value) -> String);

/// `<daemon> sessions`: the options.
#[derive(Debug, clap::Parser)]
#[command(
    about = "List the sessions a drain waits for, or end some, through the admin listener",
    long_about = "List the sessions a drain waits for (oldest first), or end some the way the \
                  drain's deadline would, through the daemon's admin listener (GET and DELETE \
                  /sessions). The admin listener answers loopback peers, or every peer with \
                  --admin-token; run this in the daemon's pod or host."
)]
pub struct SessionsArgs {
    /// The daemon's admin listener (its --admin-addr; 0.0.0.0 and :: mean loopback).
    #[arg(long, env = "LASTCALL_ADMIN_ADDR", value_name = "ADDR")]
    pub admin_addr: Option<String>,
    /// The daemon's --admin-token, if it has one.
    #[arg(
        long,
        env = "LASTCALL_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// A file holding the daemon's --admin-token.
    #[arg(long, env = "LASTCALL_ADMIN_TOKEN_FILE", value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>,
    /// Print the daemon's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Sessions per request (1 to 1000).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIMIT)]
    pub limit: usize,
    /// Start after this session id (the `next` of a previous page).
    #[arg(long, value_name = "ID", default_value_t = 0)]
    pub after: u64,
    /// Every page, not only the first.
    #[arg(long)]
    pub all: bool,
    /// End session ID as the drain's deadline would (repeatable).
    #[arg(long, value_name = "ID", conflicts_with_all = ["all", "end_user"])]
    pub end: Vec<u64>,
    /// End every session of user NAME (TURN).
    #[arg(long, value_name = "NAME")]
    pub end_user: Option<String>,
}

/// A failed command: what to print, and the exit status.
#[derive(Debug)]
pub struct CommandError {
    /// The message.
    pub message: String,
    /// The exit status: [`exit::CONFIG`](crate::exit::CONFIG) for bad arguments, 1 for the
    /// rest.
    pub status: i32,
}

impl CommandError {
    fn usage(message: impl Into<String>) -> Self {
        CommandError {
            message: message.into(),
            status: crate::exit::CONFIG,
        }
    }
    fn failed(message: impl Into<String>) -> Self {
        CommandError {
            message: message.into(),
            status: 1,
        }
    }
}

/// Runs `<daemon> sessions ARGS` (`args` without the command's own name) and exits:
/// `default_addr` is the daemon's default `--admin-addr`, `columns` its table.
pub fn command(
    daemon: &str,
    args: &[String],
    default_addr: Option<SocketAddr>,
    columns: &[Column],
) -> ! {
    use clap::{CommandFactory, FromArgMatches};
    let cmd = SessionsArgs::command().name(format!("{daemon} sessions"));
    let matches = match cmd.try_get_matches_from(
        std::iter::once(format!("{daemon} sessions")).chain(args.iter().cloned()),
    ) {
        Ok(m) => m,
        Err(e) => {
            let code = if e.use_stderr() {
                crate::exit::CONFIG
            } else {
                0
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let parsed = match SessionsArgs::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            std::process::exit(crate::exit::CONFIG);
        }
    };
    let mut stdout = std::io::stdout().lock();
    match run(&parsed, default_addr, columns, &mut stdout) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            let _ = stdout.flush();
            eprintln!("{daemon} sessions: {}", e.message);
            std::process::exit(e.status);
        }
    }
}

/// The command's work, writing to `out`.
pub fn run(
    args: &SessionsArgs,
    default_addr: Option<SocketAddr>,
    columns: &[Column],
    out: &mut dyn Write,
) -> Result<(), CommandError> {
    if !(1..=MAX_LIMIT).contains(&args.limit) {
        return Err(CommandError::usage(format!(
            "--limit: {} is not valid; give 1 to {MAX_LIMIT}",
            args.limit
        )));
    }
    let client = Client::new(args, default_addr)?;
    let io = |e: std::io::Error| CommandError::failed(format!("cannot write: {e}"));
    if !args.end.is_empty() || args.end_user.is_some() {
        let mut ended = Vec::new();
        let mut missing = Vec::new();
        for id in &args.end {
            match client.call("DELETE", &format!("/sessions/{id}"))? {
                (200, body) => ended.extend(ended_of(&body)?),
                (404, _) => missing.push(format!("no session {id}")),
                (code, body) => return Err(refused(code, &body)),
            }
        }
        if let Some(user) = &args.end_user {
            match client.call("DELETE", &format!("/sessions?user={}", encode(user)))? {
                (200, body) => ended.extend(ended_of(&body)?),
                (404, _) => missing.push(format!("no session of user {user}")),
                (code, body) => return Err(refused(code, &body)),
            }
        }
        if args.json {
            let body = serde_json::json!({ "ended": ended });
            writeln!(out, "{}", pretty(&body)).map_err(io)?;
        } else {
            writeln!(out, "ended {} session(s)", ended.len()).map_err(io)?;
            if !ended.is_empty() {
                write_table(out, columns, &ended).map_err(io)?;
            }
        }
        if !missing.is_empty() {
            return Err(CommandError::failed(missing.join("; ")));
        }
        return Ok(());
    }
    let mut after = args.after;
    let mut sessions = Vec::new();
    let (total, next) = loop {
        let (code, body) = client.call(
            "GET",
            &format!("/sessions?limit={}&after={after}", args.limit),
        )?;
        if code != 200 {
            return Err(refused(code, &body));
        }
        let page: Value = serde_json::from_str(&body)
            .map_err(|e| CommandError::failed(format!("the daemon's answer is not JSON: {e}")))?;
        let total = page.get("total").and_then(Value::as_u64).unwrap_or(0);
        let next = page.get("next").and_then(Value::as_u64);
        if let Some(list) = page.get("sessions").and_then(Value::as_array) {
            sessions.extend(list.iter().cloned());
        }
        match next {
            Some(n) if args.all && n > after => after = n,
            _ => break (total, next),
        }
    };
    if args.json {
        let body = serde_json::json!({
            "total": total,
            "after": args.after,
            "next": next,
            "sessions": sessions,
        });
        writeln!(out, "{}", pretty(&body)).map_err(io)?;
        return Ok(());
    }
    write_table(out, columns, &sessions).map_err(io)?;
    match next {
        Some(n) => writeln!(
            out,
            "{} of {total} session(s) shown; more with --after {n} (or --all)",
            sessions.len()
        ),
        None => writeln!(out, "{} of {total} session(s) shown", sessions.len()),
    }
    .map_err(io)
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

fn ended_of(body: &str) -> Result<Vec<Value>, CommandError> {
    let v: Value = serde_json::from_str(body)
        .map_err(|e| CommandError::failed(format!("the daemon's answer is not JSON: {e}")))?;
    Ok(v.get("ended")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default())
}

fn refused(code: u16, body: &str) -> CommandError {
    let hint = match code {
        401 => " (give the daemon's token: --admin-token or --admin-token-file)",
        403 => " (run it on the daemon's host or pod, or give the daemon an --admin-token)",
        _ => "",
    };
    CommandError::failed(format!("the daemon answered {code}: {}{hint}", body.trim()))
}

/// Writes `rows` under `columns`' headers, each column as wide as its widest cell.
pub fn write_table(out: &mut dyn Write, columns: &[Column], rows: &[Value]) -> std::io::Result<()> {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|(_, f)| f(r)).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, (h, _))| {
            cells
                .iter()
                .map(|row| row.get(i).map_or(0, |c| c.chars().count()))
                .chain(std::iter::once(h.len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |out: &mut dyn Write, row: Vec<&str>| -> std::io::Result<()> {
        let mut text = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$}  "));
            }
        }
        writeln!(out, "{}", text.trim_end())
    };
    line(out, columns.iter().map(|(h, _)| *h).collect())?;
    for row in &cells {
        line(out, row.iter().map(String::as_str).collect())?;
    }
    Ok(())
}

/// Column helpers: a field as text (`-` when absent or null).
pub fn field(v: &Value, name: &str) -> String {
    match v.get(name) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) if s.is_empty() => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join(","),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.1}"),
            _ => n.to_string(),
        },
        Some(other) => other.to_string(),
    }
}

/// A blocking HTTP/1.1 client of the admin listener.
struct Client {
    addr: SocketAddr,
    token: Option<String>,
}

/// How long the command waits for the daemon.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (a page of 1,000 sessions is well under it).
const MAX_ANSWER: u64 = 64 * 1024 * 1024;

impl Client {
    fn new(args: &SessionsArgs, default_addr: Option<SocketAddr>) -> Result<Client, CommandError> {
        let addr = match &args.admin_addr {
            None => default_addr.ok_or_else(|| {
                CommandError::usage("--admin-addr: give the daemon's admin listener (HOST:PORT)")
            })?,
            Some(text) => text
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| {
                    CommandError::usage(format!(
                        "--admin-addr: `{text}` is not an address (HOST:PORT, e.g. 127.0.0.1:{})",
                        default_addr.map_or(9641, |a| a.port())
                    ))
                })?,
        };
        let addr = match addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => {
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
            }
            IpAddr::V6(ip) if ip.is_unspecified() => {
                SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
            }
            _ => addr,
        };
        let token = match (&args.admin_token, &args.admin_token_file) {
            (Some(t), _) => Some(t.trim().to_string()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| {
                        CommandError::usage(format!(
                            "--admin-token-file: cannot read {}: {e}",
                            path.display()
                        ))
                    })?
                    .trim()
                    .to_string(),
            ),
            (None, None) => None,
        };
        Ok(Client { addr, token })
    }

    /// One request; the status and body.
    fn call(&self, method: &str, target: &str) -> Result<(u16, String), CommandError> {
        let failed = |e: std::io::Error| {
            CommandError::failed(format!(
                "admin listener {}: {e} (is the daemon running, with --admin-addr there?)",
                self.addr
            ))
        };
        let mut stream = TcpStream::connect_timeout(&self.addr, CALL_TIMEOUT).map_err(failed)?;
        stream
            .set_read_timeout(Some(CALL_TIMEOUT))
            .map_err(failed)?;
        stream
            .set_write_timeout(Some(CALL_TIMEOUT))
            .map_err(failed)?;
        let mut request = format!(
            "{method} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: application/json\r\n",
            self.addr
        );
        if let Some(token) = &self.token {
            request.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        request.push_str("Content-Length: 0\r\n\r\n");
        stream.write_all(request.as_bytes()).map_err(failed)?;
        let mut raw = Vec::new();
        stream
            .take(MAX_ANSWER)
            .read_to_end(&mut raw)
            .map_err(failed)?;
        parse_response(&raw).ok_or_else(|| {
            CommandError::failed(format!("admin listener {}: not an HTTP answer", self.addr))
        })
    }
}

/// The status and body of an HTTP/1.1 answer with a `Content-Length` (the admin
/// listener's).
fn parse_response(raw: &[u8]) -> Option<(u16, String)> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(raw.get(..split)?).ok()?;
    let body = raw.get(split + 4..)?;
    let status = head.split_whitespace().nth(1)?.parse::<u16>().ok()?;
    let length = head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    let body = match length {
        Some(n) => body.get(..n)?,
        None => body,
    };
    Some((status, String::from_utf8_lossy(body).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_queries() {
        assert_eq!(
            parse_list(None),
            Ok(ListQuery {
                after: 0,
                limit: DEFAULT_LIMIT
            })
        );
        assert_eq!(
            parse_list(Some("limit=1000&after=18446744073709551615")),
            Ok(ListQuery {
                after: u64::MAX,
                limit: 1000
            })
        );
        assert_eq!(parse_list(Some("")).map(|q| q.limit), Ok(DEFAULT_LIMIT));
        for (query, says) in [
            (
                "limit=0",
                "limit: `0` is not valid; give 1 to 1000 (default 100)",
            ),
            ("limit=1001", "limit: `1001` is not valid; give 1 to 1000"),
            ("limit=-1", "limit: `-1` is not valid"),
            ("limit=ten", "limit: `ten` is not valid"),
            ("limit=", "limit: `` is not valid"),
            ("after=x", "after: `x` is not a session id"),
            ("after=-1", "after: `-1` is not a session id"),
            (
                "after=18446744073709551616",
                "after: `18446744073709551616` is not a session id",
            ),
            (
                "user=alice",
                "unknown parameter `user`; GET /sessions takes limit and after",
            ),
            ("limit=%zz", "bad percent-encoding in `%zz`"),
        ] {
            let err = parse_list(Some(query)).unwrap_err();
            assert!(err.starts_with(says), "{query}: {err}");
        }
    }

    #[test]
    fn end_queries() {
        assert_eq!(parse_end("/sessions/42", None), Ok(EndQuery::Id(42)));
        assert_eq!(
            parse_end("/sessions", Some("user=1700000000%3Aalice+b")),
            Ok(EndQuery::User("1700000000:alice b".into()))
        );
        for (path, query, says) in [
            ("/sessions/x", None, "`x` is not a session id"),
            ("/sessions/", None, "`` is not a session id"),
            ("/sessions/1/2", None, "`1/2` is not a session id"),
            (
                "/sessions/1",
                Some("user=a"),
                "DELETE /sessions/ID takes no parameter",
            ),
            ("/sessions", None, "DELETE /sessions needs ?user=NAME"),
            ("/sessions", Some("user="), "user: give a user name"),
            ("/sessions", Some("id=3"), "unknown parameter `id`"),
            ("/sessions", Some("user=%ff"), "`%ff` is not UTF-8"),
        ] {
            let err = parse_end(path, query).unwrap_err();
            assert!(err.starts_with(says), "{path}?{query:?}: {err}");
        }
    }

    #[test]
    fn encoding_round_trips() {
        for s in ["alice", "1700000000:alice", "a b/c?d&e=f%", "ünï"] {
            assert_eq!(decode(&encode(s)).as_deref(), Ok(s));
        }
    }

    #[test]
    fn answers_are_read_to_their_length() {
        let raw = b"HTTP/1.1 404 Not Found\r\ncontent-length: 3\r\n\r\nno\nxx";
        assert_eq!(parse_response(raw), Some((404, "no\n".into())));
        assert_eq!(parse_response(b"garbage"), None);
    }

    #[test]
    fn tables_align_and_show_absent_fields_as_dashes() {
        let cols: &[Column] = &[("ID", |v| field(v, "id")), ("USER", |v| field(v, "user"))];
        let rows = vec![
            serde_json::json!({"id": 7, "user": "alice"}),
            serde_json::json!({"id": 12345, "user": ""}),
        ];
        let mut out = Vec::new();
        write_table(&mut out, cols, &rows).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ID     USER\n7      alice\n12345  -\n"
        );
    }
}
