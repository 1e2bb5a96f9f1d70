//! A raw SPOP client against the agent process: malformed frames get AGENT-DISCONNECT with
//! the status SPOE.txt assigns, then the connection is closed, while HAProxy traffic through
//! the same agent carries on unaffected. Also: health checks, HAPROXY-DISCONNECT, pipelining.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{get, Stack, StackOptions, WAIT};
use bytes::BytesMut;
use lastcall_spop_proto::frame::{self, AgentFrame};
use spop::frame::Message;
use spop::TypedData;

struct Raw {
    s: TcpStream,
    buf: BytesMut,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).expect("connect agent");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        Raw {
            s,
            buf: BytesMut::new(),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("write");
    }

    fn hello(&mut self) {
        let mut v = Vec::new();
        frame::encode_haproxy_hello(16380, false, &mut v);
        self.send(&v);
        match self.next() {
            Some(AgentFrame::Hello(kv)) => {
                assert!(kv.contains(&("version".into(), TypedData::String("2.0".into()))));
                assert!(kv.contains(&("max-frame-size".into(), TypedData::UInt32(16380))));
            }
            other => panic!("expected AGENT-HELLO, got {other:?}"),
        }
    }

    /// Next agent frame, or `None` at EOF.
    fn next(&mut self) -> Option<AgentFrame> {
        loop {
            if let Some(f) = frame::decode_agent_frame(&mut self.buf).expect("agent frame") {
                return Some(f);
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// Expects AGENT-DISCONNECT with `status`, then EOF.
    fn expect_disconnect(&mut self, status: u32) -> String {
        let msg = match self.next() {
            Some(AgentFrame::Disconnect(s, msg)) => {
                assert_eq!(s, status, "status code (message: {msg})");
                msg
            }
            other => panic!("expected AGENT-DISCONNECT {status}, got {other:?}"),
        };
        assert!(
            self.next().is_none(),
            "connection must be closed after DISCONNECT"
        );
        msg
    }
}

fn notify(stream: u64, frame_id: u64) -> Vec<u8> {
    let msg = Message {
        name: "coraza-req".into(),
        args: vec![
            ("app".into(), TypedData::String("default".into())),
            ("method".into(), TypedData::String("GET".into())),
            ("path".into(), TypedData::String("/".into())),
            ("version".into(), TypedData::String("1.1".into())),
            (
                "headers".into(),
                TypedData::String(
                    "host: raw.example\r\nuser-agent: raw/1\r\naccept: */*\r\n\r\n".into(),
                ),
            ),
        ],
    };
    let mut v = Vec::new();
    frame::encode_notify(stream, frame_id, &msg, &mut v);
    v
}

/// Background HAProxy traffic: counts successes and failures until stopped.
struct Traffic {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(addr: SocketAddr) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let (s, o, f) = (stop.clone(), ok.clone(), failed.clone());
        let thread = std::thread::spawn(move || {
            let mut i = 0u64;
            while !s.load(Ordering::SeqCst) {
                i += 1;
                let target = if i % 3 == 0 {
                    "/?id=1'%20OR%20'1'='1"
                } else {
                    "/ok"
                };
                let want = if i % 3 == 0 { 403 } else { 200 };
                match crate::support::http(addr, "GET", target, &[], b"") {
                    Ok(r) if r.status == want => o.fetch_add(1, Ordering::SeqCst),
                    other => {
                        eprintln!("traffic failure: {target} -> {other:?}");
                        f.fetch_add(1, Ordering::SeqCst)
                    }
                };
            }
        });
        Traffic {
            stop,
            ok,
            failed,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (
            self.ok.load(Ordering::SeqCst),
            self.failed.load(Ordering::SeqCst),
        )
    }
}

#[test]
fn malformed_frames_get_the_right_status_and_haproxy_is_unaffected() {
    let mut stack = Stack::start(StackOptions {
        agents: 1,
        ..StackOptions::default()
    });
    let agent_addr = stack.agents[0].addr;
    let traffic = Traffic::start(stack.http());

    // Bad varint: the stream-id of a NOTIFY never terminates inside the frame.
    let mut c = Raw::connect(agent_addr);
    c.hello();
    let body = [3u8, 0, 0, 0, 1, 0xF5, 0xFF, 0xFF];
    let mut raw = (body.len() as u32).to_be_bytes().to_vec();
    raw.extend_from_slice(&body);
    c.send(&raw);
    c.expect_disconnect(4);

    // Length above the negotiated max-frame-size (16380): refused from its length prefix.
    let mut c = Raw::connect(agent_addr);
    c.hello();
    c.send(&20_000u32.to_be_bytes());
    c.expect_disconnect(3);

    // Length above our own limit before any HELLO (1 MiB).
    let mut c = Raw::connect(agent_addr);
    c.send(&(2u32 << 20).to_be_bytes());
    c.expect_disconnect(3);

    // Unknown frame type.
    let mut c = Raw::connect(agent_addr);
    c.hello();
    let mut v = Vec::new();
    frame::put_frame(42, 1, 1, &[], &mut v);
    c.send(&v);
    c.expect_disconnect(4);

    // NOTIFY before HELLO.
    let mut c = Raw::connect(agent_addr);
    c.send(&notify(1, 1));
    c.expect_disconnect(4);

    // Truncated frame: half a NOTIFY, then the client closes its side.
    let mut c = Raw::connect(agent_addr);
    c.hello();
    let n = notify(1, 1);
    c.send(&n[..n.len() / 2]);
    c.s.shutdown(Shutdown::Write).expect("shutdown");
    let msg = c.expect_disconnect(4);
    assert!(msg.contains("truncated"), "{msg}");

    // Unsupported version, missing max-frame-size, fragmented frame.
    let mut c = Raw::connect(agent_addr);
    let mut p = Vec::new();
    for (k, v) in [
        ("supported-versions", TypedData::String("1.0".into())),
        ("max-frame-size", TypedData::UInt32(16380)),
        ("capabilities", TypedData::String("pipelining".into())),
    ] {
        spop::encode_varint_into(k.len() as u64, &mut p);
        p.extend_from_slice(k.as_bytes());
        v.to_bytes(&mut p);
    }
    let mut v = Vec::new();
    frame::put_frame(frame::kind::HAPROXY_HELLO, 0, 0, &p, &mut v);
    c.send(&v);
    c.expect_disconnect(8);

    let mut c = Raw::connect(agent_addr);
    c.hello();
    let body = [3u8, 0, 0, 0, 0, 1, 1];
    let mut raw = (body.len() as u32).to_be_bytes().to_vec();
    raw.extend_from_slice(&body);
    c.send(&raw);
    c.expect_disconnect(10);

    // Let the traffic run a little past the last bad frame, then check nothing failed.
    let before = traffic.ok.load(Ordering::SeqCst);
    let end = std::time::Instant::now() + WAIT;
    while traffic.ok.load(Ordering::SeqCst) < before + 20 {
        assert!(std::time::Instant::now() < end, "HAProxy traffic stalled");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (ok, failed) = traffic.finish();
    assert_eq!(
        failed, 0,
        "HAProxy requests failed during the malformed-frame storm ({ok} ok)"
    );
    assert!(ok >= 20);

    let agent = &mut stack.agents[0];
    assert!(agent.pod.is_running(), "the agent must survive");
    let m = agent.metrics();
    assert!(
        crate::support::metric_value(&m, "spoa_frames_rejected_total{reason=\"invalid\"}") >= 4.0,
        "{m}"
    );
    assert!(
        crate::support::metric_value(&m, "spoa_frames_rejected_total{reason=\"too_big\"}") >= 2.0
    );
    assert_eq!(get(stack.http(), "/after").status, 200);
}

/// HAProxy's side shuts its write half with 24 pipelined NOTIFYs in flight (more than the
/// two evaluation threads, so most are queued when the end of input is read): every ACK still
/// arrives, written by the threads that evaluated, and only then does the agent close.
#[test]
fn half_close_with_notifies_in_flight_gets_every_ack_then_close() {
    let agent = crate::support::Agent::start(None, &[]);
    let mut c = Raw::connect(agent.addr);
    c.hello();
    let mut batch = Vec::new();
    for i in 1..=24u64 {
        batch.extend_from_slice(&notify(i, 7));
    }
    c.send(&batch);
    c.s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let mut seen = Vec::new();
    loop {
        match c.next() {
            Some(AgentFrame::Ack(sid, 7, _)) => seen.push(sid),
            Some(AgentFrame::Disconnect(..)) | None => break,
            other => panic!("expected ACK, DISCONNECT or EOF, got {other:?}"),
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (1..=24).collect::<Vec<_>>());
    assert!(c.next().is_none(), "closed after the last ACK");
}

#[test]
fn healthcheck_disconnect_and_pipelining() {
    let agent = crate::support::Agent::start(None, &[]);

    // Health check: AGENT-HELLO, then the agent closes.
    let mut c = Raw::connect(agent.addr);
    let mut v = Vec::new();
    frame::encode_haproxy_hello(16380, true, &mut v);
    c.send(&v);
    assert!(matches!(c.next(), Some(AgentFrame::Hello(_))));
    assert!(c.next().is_none());

    // Pipelining: 16 NOTIFYs in one write, 16 ACKs (any order), each with its ids.
    let mut c = Raw::connect(agent.addr);
    c.hello();
    let mut batch = Vec::new();
    for i in 1..=16u64 {
        batch.extend_from_slice(&notify(i, 100 + i));
    }
    c.send(&batch);
    let mut seen = Vec::new();
    for _ in 0..16 {
        match c.next() {
            Some(AgentFrame::Ack(sid, fid, vars)) => {
                assert_eq!(fid, 100 + sid);
                assert!(vars.iter().any(|(k, _)| k == "id"), "{vars:?}");
                seen.push(sid);
            }
            other => panic!("expected ACK, got {other:?}"),
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (1..=16).collect::<Vec<_>>());

    // HAPROXY-DISCONNECT: answered with AGENT-DISCONNECT status 0, then closed.
    let mut v = Vec::new();
    frame::encode_haproxy_disconnect(0, "normal", &mut v);
    c.send(&v);
    c.expect_disconnect(0);
}

#[test]
fn unix_socket_listener() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("spoa.sock");
    let admin = format!("127.0.0.1:{}", lastcall_testkit::free_port());
    let mut cmd = std::process::Command::new(crate::support::agent_bin());
    cmd.args([
        "--bind",
        &format!("unix://{}", sock.display()),
        "--admin-addr",
        &admin,
    ]);
    cmd.args(["--shutdown-delay", "0s"]);
    let mut pod = lastcall_testkit::Pod::spawn(cmd);
    pod.wait_for_log("listening on unix://", WAIT);

    let mut s = std::os::unix::net::UnixStream::connect(&sock).expect("connect unix socket");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut v = Vec::new();
    frame::encode_haproxy_hello(16380, false, &mut v);
    v.extend_from_slice(&notify(1, 1));
    s.write_all(&v).expect("write");
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    while frames.len() < 2 {
        if let Some(f) = frame::decode_agent_frame(&mut buf).expect("frame") {
            frames.push(f);
            continue;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).expect("read");
        assert!(n > 0, "closed early: {frames:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
    assert!(matches!(frames[0], AgentFrame::Hello(_)));
    assert!(matches!(frames[1], AgentFrame::Ack(1, 1, _)));
    drop(s);
    pod.signal(lastcall_testkit::Signal::Term);
    let report = pod.wait_exit(Duration::from_secs(30));
    assert_eq!(report.code, Some(0), "{report:?}");
    assert!(!sock.exists(), "the socket file is removed at exit");
}
