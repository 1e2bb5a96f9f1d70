//! How a drain ends, on the real process: every allocation's end counts (10,000 ending in
//! one timer pass still end the drain with exit 0), and the response that ends a drain over
//! TCP or TLS (a Refresh with lifetime 0) reaches the client before the process exits.
//!
//! Clients: a bulk UDP allocator (one socket per allocation, one nonce for all: nonces are
//! bound to the client's IP) and a blocking TCP/TLS client, both built on the core's STUN
//! codec.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lastcall_testkit::Signal;
use lastcall_turn_proto::stun::{attr, decode_address, method, Builder, Class, Message};

use crate::common::{RestCredentials, Turn, REALM, WAIT};

/// TURN REST API credentials valid for an hour: username and long-term key.
pub(crate) fn rest_creds(user: &str) -> (String, [u8; 16]) {
    let creds = RestCredentials::for_user(user);
    let key = creds.key(REALM);
    (creds.username, key)
}

/// A transaction id unique in this process.
pub(crate) fn txid(n: u64) -> [u8; 12] {
    let mut id = [0x5au8; 12];
    id[..4].copy_from_slice(&std::process::id().to_be_bytes());
    id[4..].copy_from_slice(&n.to_be_bytes());
    id
}

/// Credentials of one client once it learnt the nonce.
#[derive(Clone)]
pub(crate) struct Auth {
    pub username: String,
    pub key: [u8; 16],
    pub nonce: Vec<u8>,
}

/// A TURN request: `m` with `build`'s attributes, authenticated with `auth` if given.
pub(crate) fn request(
    m: u16,
    id: [u8; 12],
    auth: Option<&Auth>,
    build: impl FnOnce(&mut Builder<'_>),
) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut b = Builder::new(&mut buf, m, Class::Request, id);
    build(&mut b);
    if let Some(a) = auth {
        b.attr(attr::USERNAME, a.username.as_bytes())
            .attr(attr::REALM, REALM.as_bytes())
            .attr(attr::NONCE, &a.nonce)
            .integrity_sha1(&a.key);
    }
    buf
}

/// What a response said: success, the error code, the nonce of a challenge, the relayed
/// address.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub id: [u8; 12],
    pub success: bool,
    pub code: u16,
    pub nonce: Option<Vec<u8>>,
    pub realm: Option<Vec<u8>>,
    pub relayed: Option<SocketAddr>,
    pub alternate: Option<SocketAddr>,
}

pub(crate) fn answer(bytes: &[u8]) -> Option<Answer> {
    let m = Message::parse(bytes).ok()?;
    let id = m.transaction_id();
    let mut a = Answer {
        id,
        success: m.class() == Class::Success,
        ..Answer::default()
    };
    for at in m.attributes() {
        match at.typ {
            attr::ERROR_CODE => {
                if let [_, _, c, n, ..] = at.value {
                    a.code = u16::from(*c) * 100 + u16::from(*n);
                }
            }
            attr::NONCE => a.nonce = Some(at.value.to_vec()),
            attr::REALM => a.realm = Some(at.value.to_vec()),
            attr::ALTERNATE_SERVER => a.alternate = decode_address(at.value, &id, false),
            attr::XOR_RELAYED_ADDRESS => a.relayed = decode_address(at.value, &id, true),
            _ => {}
        }
    }
    Some(a)
}

/// Lets this test process open as many files as its hard limit allows (the server it starts
/// inherits the limit); returns that limit.
fn raise_nofile() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let hard: u64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|h| h.parse().ok())
        .unwrap_or(1024);
    let status = Command::new("prlimit")
        .arg(format!("--pid={}", std::process::id()))
        .arg(format!("--nofile={hard}:"))
        .status()
        .expect("run prlimit");
    assert!(status.success(), "prlimit --nofile={hard}: failed");
    hard
}

/// `n` UDP allocations on `server` from as many sockets, with `lifetime` (the server caps it
/// with `max-allocate-lifetime`); returns the sockets, once every allocation was answered.
fn bulk_allocate(server: SocketAddr, n: usize) -> Vec<UdpSocket> {
    let (username, key) = rest_creds("bulk");
    // One nonce serves every socket: it is bound to the client's IP address.
    let probe = UdpSocket::bind("127.0.0.1:0").expect("bind");
    probe.connect(server).expect("connect");
    probe
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let nonce = (0..10u64)
        .find_map(|i| {
            let req = request(method::ALLOCATE, txid(u64::MAX - i), None, |b| {
                b.u32(attr::REQUESTED_TRANSPORT, 17 << 24);
            });
            probe.send(&req).ok()?;
            let mut buf = [0u8; 1500];
            let len = probe.recv(&mut buf).ok()?;
            answer(buf.get(..len)?)?.nonce
        })
        .expect("a 401 with a nonce");
    let auth = Auth {
        username,
        key,
        nonce,
    };
    let socks: Vec<UdpSocket> = (0..n)
        .map(|_| {
            let s = UdpSocket::bind("127.0.0.1:0").expect("bind a client socket");
            s.connect(server).expect("connect");
            s.set_nonblocking(true).expect("nonblocking");
            s
        })
        .collect();
    let requests: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            request(method::ALLOCATE, txid(i as u64), Some(&auth), |b| {
                b.u32(attr::REQUESTED_TRANSPORT, 17 << 24);
            })
        })
        .collect();
    let mut done = vec![false; n];
    let mut left = n;
    let until = Instant::now() + Duration::from_secs(120);
    let mut buf = [0u8; 1500];
    while left > 0 {
        assert!(Instant::now() < until, "{left} of {n} Allocates unanswered");
        // Send what is unanswered (a retransmission is answered like the first), at most
        // 500 at a time so the server's socket buffer keeps up.
        let mut sent = 0;
        for (i, s) in socks.iter().enumerate() {
            if !done[i] && sent < 500 {
                let _ = s.send(&requests[i]);
                sent += 1;
            }
        }
        let wait = Instant::now() + Duration::from_millis(300);
        while Instant::now() < wait && left > 0 {
            let mut got = false;
            for (i, s) in socks.iter().enumerate() {
                if done[i] {
                    continue;
                }
                if let Ok(len) = s.recv(&mut buf) {
                    let a = answer(&buf[..len]).expect("a STUN response");
                    assert!(a.success, "Allocate {i}: error {}", a.code);
                    done[i] = true;
                    left -= 1;
                    got = true;
                }
            }
            if !got {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    socks
}

/// 10,000 allocations that all end in one timer pass during a drain: every one of them
/// releases its session, so the process exits 0 as the last ends, not 75 at the deadline.
/// The server is frozen (SIGSTOP) across their common expiry, so that its timer finds
/// them all due at once when it runs again (SIGCONT).
#[test]
fn ten_thousand_allocations_ending_in_one_timer_pass_end_the_drain_with_exit_0() {
    const N: usize = 10_000;
    let hard = raise_nofile();
    // This process and the server each hold N sockets.
    assert!(
        hard >= N as u64 + 1000,
        "this test needs {} open files per process (hard limit {hard})",
        N + 1000
    );
    let lifetime = 20;
    let mut turn = Turn::start(&[
        "--shutdown-delay=0s",
        "--drain-timeout=300s",
        &format!("--max-allocate-lifetime={lifetime}"),
        "--min-port=40000",
        "--max-port=65000",
    ]);
    let server = SocketAddr::from(([127, 0, 0, 1], turn.port));
    let started = Instant::now();
    let socks = bulk_allocate(server, N);
    let allocated = Instant::now();
    println!(
        "FIGURES {N} allocations in {:.1} s",
        (allocated - started).as_secs_f64()
    );
    assert_eq!(
        turn.metric("turn_total_allocations{type=\"UDP\"}"),
        Some(N as f64),
        "live allocations"
    );
    turn.pod.signal(Signal::Term);
    turn.pod.wait_for_log("refusing new allocations", WAIT);
    // Frozen until every lifetime has run out (the first one began at `started`).
    turn.pod.signal(Signal::Stop);
    let all_due = allocated + Duration::from_secs(lifetime + 2);
    std::thread::sleep(all_due.saturating_duration_since(Instant::now()));
    turn.pod.signal(Signal::Cont);
    let resumed = Instant::now();
    let exit = turn.pod.wait_exit(Duration::from_secs(120));
    println!(
        "FIGURES exit {:?} {:.3} s after SIGCONT",
        exit.code,
        resumed.elapsed().as_secs_f64()
    );
    assert_eq!(exit.code, Some(0), "{exit:?}");
    drop(socks);
}

/// A blocking TURN client over TCP or TLS: STUN messages framed by their own length.
struct StreamClient {
    io: Box<dyn ReadWrite>,
    auth: Option<Auth>,
    next: u64,
}

trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

impl StreamClient {
    fn tcp(server: SocketAddr) -> StreamClient {
        let s = TcpStream::connect(server).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        s.set_nodelay(true).expect("nodelay");
        StreamClient {
            io: Box::new(s),
            auth: None,
            next: 1,
        }
    }

    fn tls(server: SocketAddr, config: Arc<rustls::ClientConfig>) -> StreamClient {
        let s = TcpStream::connect(server).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        s.set_nodelay(true).expect("nodelay");
        let name = rustls::pki_types::ServerName::IpAddress(server.ip().into());
        let conn = rustls::ClientConnection::new(config, name).expect("TLS client");
        StreamClient {
            io: Box::new(rustls::StreamOwned::new(conn, s)),
            auth: None,
            next: 1,
        }
    }

    /// One request and its response (`Err`: the connection ended first).
    fn transact(&mut self, m: u16, build: impl FnOnce(&mut Builder<'_>)) -> Result<Answer, String> {
        self.next += 1;
        let id = txid(self.next);
        let req = request(m, id, self.auth.as_ref(), build);
        self.io.write_all(&req).map_err(|e| format!("write: {e}"))?;
        self.io.flush().map_err(|e| format!("flush: {e}"))?;
        let mut head = [0u8; 20];
        self.io
            .read_exact(&mut head)
            .map_err(|e| format!("read header: {e}"))?;
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let mut msg = head.to_vec();
        msg.resize(20 + len, 0);
        self.io
            .read_exact(&mut msg[20..])
            .map_err(|e| format!("read body: {e}"))?;
        let a = answer(&msg).ok_or("not STUN")?;
        if a.id != id {
            return Err("another transaction's response".into());
        }
        Ok(a)
    }

    /// Allocate (with the 401 round trip).
    fn allocate(&mut self, user: &str) {
        let transport = |b: &mut Builder<'_>| {
            b.u32(attr::REQUESTED_TRANSPORT, 17 << 24);
        };
        let challenge = self.transact(method::ALLOCATE, transport).expect("401");
        assert_eq!(challenge.code, 401);
        let (username, key) = rest_creds(user);
        self.auth = Some(Auth {
            username,
            key,
            nonce: challenge.nonce.expect("a nonce"),
        });
        let a = self
            .transact(method::ALLOCATE, transport)
            .expect("Allocate");
        assert!(a.success && a.relayed.is_some(), "Allocate: {a:?}");
    }
}

/// A certificate for 127.0.0.1 (subjectAltName) and its key, and a client configuration
/// trusting it.
fn tls_setup(
    dir: &std::path::Path,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    Arc<rustls::ClientConfig>,
) {
    let (cert, key) = lastcall_testkit::tls::self_signed_for_ip(dir, "turn", "127.0.0.1");
    let pem = std::fs::read(&cert).expect("read cert");
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(c.expect("a certificate")).expect("a root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    (cert, key, Arc::new(config))
}

/// 50 drains (25 over TCP, 25 over TLS), each ended by its one client's Refresh(0): every
/// response arrives before the process exits (it used to go to the connection's writer task,
/// which the exit could cut first), and every exit is 0.
#[test]
fn fifty_drains_ended_by_a_tcp_or_tls_refresh_0_answer_every_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key, client_config) = tls_setup(dir.path());
    let mut unanswered = Vec::new();
    let mut slowest = Duration::ZERO;
    for i in 0..50 {
        let tls = i % 2 == 1;
        let port = crate::common::free_udp_tcp_port();
        let tls_port = crate::common::free_udp_tcp_port();
        let admin = format!("127.0.0.1:{}", lastcall_testkit::free_port());
        let mut args = crate::common::turn_args(port, &admin);
        args.extend([
            "--shutdown-delay=0s".to_string(),
            "--drain-timeout=60s".to_string(),
            format!("--tls-listening-port={tls_port}"),
            format!("--cert={}", cert.display()),
            format!("--pkey={}", key.display()),
        ]);
        let mut turn = Turn::spawn(args, port, tls_port, admin);
        let mut c = if tls {
            StreamClient::tls(
                SocketAddr::from(([127, 0, 0, 1], tls_port)),
                Arc::clone(&client_config),
            )
        } else {
            StreamClient::tcp(SocketAddr::from(([127, 0, 0, 1], port)))
        };
        c.allocate(&format!("last{i}"));
        turn.pod.signal(Signal::Term);
        turn.pod.wait_for_log("refusing new allocations", WAIT);
        let asked = Instant::now();
        match c.transact(method::REFRESH, |b| {
            b.u32(attr::LIFETIME, 0);
        }) {
            Ok(a) if a.success => {}
            other => unanswered.push((i, if tls { "TLS" } else { "TCP" }, format!("{other:?}"))),
        }
        let exit = turn.pod.wait_exit(WAIT);
        slowest = slowest.max(asked.elapsed());
        assert_eq!(exit.code, Some(0), "drain {i}: {exit:?}");
    }
    println!(
        "FIGURES 50 drains: slowest Refresh(0)-to-exit {:.1} ms",
        slowest.as_secs_f64() * 1000.0
    );
    assert!(
        unanswered.is_empty(),
        "Refresh(0) unanswered: {unanswered:?}"
    );
}
