//! A raw SPOP peer for the tests that talk to the agent without HAProxy (hostile peers,
//! malformed frames), and how fast `/livez` answers (the agent's RSS and descriptors:
//! `lastcall_testkit::procfs`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use lastcall_spop_proto::frame::{self, AgentFrame};
use spop::frame::Message;
use spop::TypedData;

/// A raw SPOP connection.
pub(crate) struct Raw {
    /// The socket.
    pub s: TcpStream,
    buf: BytesMut,
}

impl Raw {
    /// Connects (reads time out after `timeout`).
    pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> Raw {
        let s = TcpStream::connect(addr).expect("connect agent");
        s.set_read_timeout(Some(timeout)).expect("timeout");
        let _ = s.set_nodelay(true);
        Raw {
            s,
            buf: BytesMut::new(),
        }
    }

    /// Writes all of `bytes` (errors are the agent closing: returned, not a panic).
    pub(crate) fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.s.write_all(bytes)
    }

    /// HAPROXY-HELLO announcing `max_frame_size`, and the AGENT-HELLO.
    pub(crate) fn hello(&mut self, max_frame_size: u32) {
        let mut v = Vec::new();
        frame::encode_haproxy_hello(max_frame_size, false, &mut v);
        self.send(&v).expect("hello");
        match self.next() {
            Some(AgentFrame::Hello(_)) => {}
            other => panic!("expected AGENT-HELLO, got {other:?}"),
        }
    }

    /// The next frame from the agent; `None` at EOF, a reset or a read timeout.
    pub(crate) fn next(&mut self) -> Option<AgentFrame> {
        loop {
            if let Some(f) = frame::decode_agent_frame(&mut self.buf).expect("agent frame") {
                return Some(f);
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// The next frame must be AGENT-DISCONNECT with `status`, then EOF; returns its message.
    pub(crate) fn expect_disconnect(&mut self, status: u32) -> String {
        let msg = match self.next() {
            Some(AgentFrame::Disconnect(s, msg)) if s == status => msg,
            other => panic!("expected AGENT-DISCONNECT {status}, got {other:?}"),
        };
        assert!(self.next().is_none(), "closed after the DISCONNECT");
        msg
    }

    /// Sends an ordinary `coraza-req` for the built-in application and waits for its ACK;
    /// returns the ACK's variables and how long it took.
    pub(crate) fn ordinary(&mut self, stream: u64) -> (Vec<(String, TypedData)>, Duration) {
        let started = Instant::now();
        self.send(&request(stream, "/index.html", Some("q=hello"), None))
            .expect("notify");
        match self.next() {
            Some(AgentFrame::Ack(sid, 1, vars)) if sid == stream => (vars, started.elapsed()),
            other => panic!("expected the ACK of {stream}, got {other:?}"),
        }
    }
}

/// The text header block HAProxy's `req.hdrs` sends for an ordinary request.
pub(crate) const HEADERS: &str =
    "host: hostile.example\r\nuser-agent: raw/1\r\naccept: */*\r\n\r\n";

/// A NOTIFY with one `coraza-req` for the built-in application `default`; `headers` is the
/// `headers` argument (default: [`HEADERS`] as text).
pub(crate) fn request(
    stream: u64,
    path: &str,
    query: Option<&str>,
    headers: Option<TypedData>,
) -> Vec<u8> {
    let mut args = vec![
        ("app".into(), TypedData::String("default".into())),
        ("src-ip".into(), TypedData::IPv4([127, 0, 0, 1].into())),
        ("src-port".into(), TypedData::Int32(40000)),
        ("method".into(), TypedData::String("GET".into())),
        ("path".into(), TypedData::String(path.into())),
        ("version".into(), TypedData::String("1.1".into())),
        (
            "headers".into(),
            headers.unwrap_or_else(|| TypedData::String(HEADERS.into())),
        ),
    ];
    if let Some(q) = query {
        args.push(("query".into(), TypedData::String(q.into())));
    }
    let msg = Message {
        name: "coraza-req".into(),
        args,
    };
    let mut v = Vec::new();
    frame::encode_notify(stream, 1, &msg, &mut v);
    v
}

/// The value of the ACK variable `name`.
pub(crate) fn var<'a>(vars: &'a [(String, TypedData)], name: &str) -> Option<&'a TypedData> {
    vars.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// Whether the ACK carries the failure verdict (`error` = 99).
pub(crate) fn failed_closed(vars: &[(String, TypedData)]) -> bool {
    var(vars, "error") == Some(&TypedData::Int64(99))
}

/// How long `GET /livez` takes (a 200 is required).
pub(crate) fn livez(admin: SocketAddr) -> Duration {
    let started = Instant::now();
    let (status, _) = lastcall_testkit::http_get(admin, "/livez");
    assert_eq!(status, 200, "/livez");
    started.elapsed()
}

/// Raises this process's soft limit on open files to its hard limit (children inherit it),
/// with util-linux's `prlimit`; returns the soft limit now in force.
pub(crate) fn raise_nofile() -> u64 {
    let me = std::process::id().to_string();
    let hard = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &me,
            "--nofile",
            "--raw",
            "--noheadings",
            "--output",
            "HARD",
        ])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<u64>()
                .ok()
        });
    if let Some(hard) = hard {
        let _ = std::process::Command::new("prlimit")
            .args(["--pid", &me, &format!("--nofile={hard}:{hard}")])
            .status();
    }
    lastcall_testkit::procfs::open_files_limit().0
}
