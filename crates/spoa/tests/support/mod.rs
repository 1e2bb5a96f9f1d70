//! Test support shared by the integration tests: a real origin server, a tiny HTTP client,
//! the `lastcall-spoa` agent process, and (in `haproxy`) a real HAProxy 2.6 in front of them.
//!
//! [`Stack::start`] brings all of it up on loopback with free ports and returns the
//! addresses; everything is killed when the values are dropped (also on panic).
#![allow(dead_code)]

pub mod haproxy;
pub mod nginx;
pub mod spop;
pub mod traffic;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use lastcall::harness::{self, Pod, Signal};

pub use haproxy::Haproxy;

/// Generous bound for anything a test waits for on this busy machine.
pub const WAIT: Duration = Duration::from_secs(30);

/// Marker the origin puts in `/leak` responses; the test rules block responses carrying it.
pub const LEAK_HEADER: &str = "x-secret-leak";

/// A real HTTP/1.1 origin on 127.0.0.1 (one thread per connection, keep-alive). Answers
/// every request with 200 and `origin ok <method> <path> <body-length>`; `/leak` adds the
/// [`LEAK_HEADER`] header and a body with an SQL error message.
pub struct Origin {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Requests answered.
    pub served: Arc<AtomicU64>,
}

impl Origin {
    /// Starts the origin.
    pub fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind origin");
        let addr = listener.local_addr().expect("origin addr");
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), served.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(conn) = conn {
                    let n = n.clone();
                    thread::spawn(move || origin_conn(conn, &n));
                }
            }
        });
        Origin { addr, stop, served }
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

fn origin_conn(conn: TcpStream, served: &AtomicU64) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let mut writer = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_owned();
        let path = parts.next().unwrap_or("").to_owned();
        let Ok((len, close)) = read_headers_and_body(&mut reader) else {
            return;
        };
        served.fetch_add(1, Ordering::SeqCst);
        let (extra, text) = if path.starts_with("/leak") {
            (
                format!("{LEAK_HEADER}: yes\r\n"),
                "<html>You have an error in your SQL syntax; check the manual that corresponds to your MySQL server version</html>\n".to_owned(),
            )
        } else {
            (String::new(), format!("origin ok {method} {path} {len}\n"))
        };
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n{extra}\r\n{text}",
            text.len()
        );
        if writer.write_all(resp.as_bytes()).is_err() || close {
            return;
        }
    }
}

/// Reads the rest of an HTTP/1.1 message whose start line has been read: the header lines
/// up to the blank line, then a `Content-Length` body (read and discarded). Returns the
/// body length and whether the message carries `Connection: close`. Used by the origin for
/// requests and by the keep-alive clients ([`read_response`]) for answers.
pub fn read_headers_and_body(reader: &mut impl BufRead) -> std::io::Result<(usize, bool)> {
    let mut len = 0usize;
    let mut close = false;
    let mut chunked = false;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            return Err(std::io::Error::other("eof in headers"));
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
            if k.eq_ignore_ascii_case("connection") && v.trim().eq_ignore_ascii_case("close") {
                close = true;
            }
            if k.eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
            {
                chunked = true;
            }
        }
    }
    if chunked {
        // Read the whole chunked body: left in the buffer, its lines would be read as the
        // next request on this connection (a phantom request, counted late).
        return Ok((read_chunked(reader)?, close));
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    Ok((len, close))
}

/// Reads a chunked body through its last chunk and trailers; returns its decoded length.
fn read_chunked(reader: &mut impl BufRead) -> std::io::Result<usize> {
    let mut total = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("eof in a chunked body"));
        }
        let size = line.trim_end().split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk size line {line:?}")))?;
        if size == 0 {
            loop {
                let mut trailer = String::new();
                if reader.read_line(&mut trailer)? == 0 || trailer.trim_end().is_empty() {
                    return Ok(total);
                }
            }
        }
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk)?;
        total += size;
    }
}

/// Reads one HTTP/1.1 response from a keep-alive connection (status line, headers,
/// `Content-Length` body); returns the status and whether the server closes the connection.
pub fn read_response(reader: &mut impl BufRead) -> std::io::Result<(u16, bool)> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::other("connection closed before the answer"));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let (_, close) = read_headers_and_body(reader)?;
    Ok((status, close))
}

/// An HTTP response as the client saw it.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Headers (names lower-cased).
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Reply {
    /// First header named `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 request (`Connection: close`).
pub fn http(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(WAIT))?;
    s.set_write_timeout(Some(WAIT))?;
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: test.example\r\nUser-Agent: lastcall-test/1.0\r\nAccept: */*\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    match s.read_to_end(&mut raw) {
        Ok(_) => {}
        // HAProxy may reset after answering early (e.g. 413 before the body was read).
        Err(e) if !raw.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => return Err(e),
    }
    parse_reply(&raw)
}

fn parse_reply(raw: &[u8]) -> std::io::Result<Reply> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no HTTP head in {} bytes", raw.len())))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(Reply {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    })
}

/// `GET target`.
pub fn get(addr: SocketAddr, target: &str) -> Reply {
    http(addr, "GET", target, &[], b"").unwrap_or_else(|e| panic!("GET {target}: {e}"))
}

/// `POST target` with a form body.
pub fn post_form(addr: SocketAddr, target: &str, body: &str) -> Reply {
    http(
        addr,
        "POST",
        target,
        &[("Content-Type", "application/x-www-form-urlencoded")],
        body.as_bytes(),
    )
    .unwrap_or_else(|e| panic!("POST {target}: {e}"))
}

/// Path of the agent binary under test.
pub fn agent_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lastcall-spoa"))
}

/// A running `lastcall-spoa` process.
pub struct Agent {
    /// The process (stderr lines captured).
    pub pod: Pod,
    /// SPOP listener.
    pub addr: SocketAddr,
    /// Admin listener (`/metrics`, `/readyz`, `/drain`).
    pub admin: SocketAddr,
    _dir: Option<tempfile::TempDir>,
}

impl Agent {
    /// Sends `signal` and waits (up to [`WAIT`]) for a log line containing `needle` written
    /// after the signal; returns that line.
    pub fn signal_and_wait_for_log(&mut self, signal: Signal, needle: &str) -> String {
        let mark = self.pod.log_len();
        self.pod.signal(signal);
        self.pod.wait_for_log_after(mark, needle, WAIT)
    }

    /// Starts an agent on free loopback ports with `config` (YAML; `None` = built-in CRS
    /// application) and extra arguments; waits until it listens.
    pub fn start(config: Option<&str>, extra: &[&str]) -> Agent {
        let port = harness::free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        Self::start_at(addr, config, extra)
    }

    /// Like [`Agent::start`], on a given SPOP address (a restarted agent takes its
    /// predecessor's address, as a new pod takes the Service's).
    pub fn start_at(addr: SocketAddr, config: Option<&str>, extra: &[&str]) -> Agent {
        let admin: SocketAddr = format!("127.0.0.1:{}", harness::free_port())
            .parse()
            .expect("addr");
        let mut cmd = Command::new(agent_bin());
        cmd.args([
            "--bind",
            &addr.to_string(),
            "--admin-addr",
            &admin.to_string(),
        ]);
        let dir = config.map(|text| {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("lastcall-spoa.yaml");
            std::fs::write(&path, text).expect("write config");
            cmd.arg("--config").arg(&path);
            dir
        });
        cmd.args(extra);
        let pod = Pod::spawn(cmd);
        pod.wait_for_log("listening on", WAIT);
        harness::wait_for_tcp(addr, WAIT);
        Agent {
            pod,
            addr,
            admin,
            _dir: dir,
        }
    }

    /// The config file path, if one was given.
    pub fn config_path(&self) -> Option<PathBuf> {
        self._dir
            .as_ref()
            .map(|d| d.path().join("lastcall-spoa.yaml"))
    }

    /// `/metrics` text.
    pub fn metrics(&self) -> String {
        harness::http_get(self.admin, "/metrics").1
    }

    /// Value of one metric line (exact name with labels), 0 if absent.
    pub fn metric(&self, name_and_labels: &str) -> f64 {
        metric_value(&self.metrics(), name_and_labels)
    }
}

/// Value of the metric line starting with `name_and_labels` followed by a space.
pub fn metric_value(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name_and_labels)
                .and_then(|r| r.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// Options for [`Stack::start`].
#[derive(Debug, Clone, Default)]
pub struct StackOptions {
    /// Agent configuration (YAML); `None` = the built-in CRS application.
    pub agent_config: Option<String>,
    /// How many agent processes (1 or 2; with 1, both HAProxy servers point at it).
    pub agents: usize,
    /// Extra agent arguments.
    pub agent_args: Vec<String>,
    /// Run HAProxy without per-request logs (load measurements).
    pub quiet_haproxy: bool,
    /// Run HAProxy without the retry safety net (measurements; see [`haproxy::Variant`]).
    pub no_retry: bool,
}

/// Origin + agent(s) + HAProxy, all on loopback.
pub struct Stack {
    /// HAProxy (drop order: HAProxy first, then agents, then origin).
    pub haproxy: Haproxy,
    /// The agents.
    pub agents: Vec<Agent>,
    /// The origin.
    pub origin: Origin,
}

impl Stack {
    /// Starts everything and waits until HAProxy answers through the agent.
    pub fn start(opts: StackOptions) -> Stack {
        let origin = Origin::start();
        let args: Vec<&str> = opts.agent_args.iter().map(String::as_str).collect();
        let agents: Vec<Agent> = (0..opts.agents.max(1))
            .map(|_| Agent::start(opts.agent_config.as_deref(), &args))
            .collect();
        let a1 = agents[0].addr;
        let a2 = agents.get(1).map_or(a1, |a| a.addr);
        let haproxy = Haproxy::start_variant(
            origin.addr,
            a1,
            a2,
            &haproxy::Variant {
                quiet: opts.quiet_haproxy,
                no_retry: opts.no_retry,
            },
        );
        Stack {
            haproxy,
            agents,
            origin,
        }
    }

    /// HAProxy's HTTP address.
    pub fn http(&self) -> SocketAddr {
        self.haproxy.addr
    }
}

/// A peer's command: the words of environment variable `var` (the program, then any
/// arguments before the test's own), else `default`.
pub fn peer_command(var: &str, default: &str) -> Command {
    let text = std::env::var(var).unwrap_or_default();
    let mut words = text.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words);
            cmd
        }
        None => Command::new(default),
    }
}

/// The directory of this crate (for example files).
pub fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Held by the tests that saturate the CPU (20,000-request runs), so that two of them never
/// run at once under `cargo nextest` (2 tests in parallel on a 2-core machine would double
/// every latency and turn HAProxy's `timeout processing` into failures that are about the
/// machine, not the agent). A listening socket on a fixed loopback port is the lock: the
/// kernel releases it when the process ends, even on a crash. Nothing connects to it.
pub struct HeavyLock(TcpListener);

impl HeavyLock {
    /// Waits (up to 20 minutes) until no other heavy test runs.
    pub fn acquire() -> HeavyLock {
        let end = std::time::Instant::now() + Duration::from_secs(1200);
        loop {
            if let Ok(l) = TcpListener::bind("127.0.0.1:47931") {
                return HeavyLock(l);
            }
            assert!(
                std::time::Instant::now() < end,
                "another heavy test held the lock for 20 minutes"
            );
            thread::sleep(Duration::from_millis(200));
        }
    }
}
