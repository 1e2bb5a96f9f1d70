//! How a drain ends, on the real process: every allocation's end counts (10,000 quiet ones
//! reclaimed in the drain's first timer pass still end it with exit 0), and the response that ends a drain over
//! TCP or TLS (a Refresh with lifetime 0) reaches the client before the process exits.
//!
//! Clients: a bulk UDP allocator (one socket per allocation, one nonce for all: nonces are
//! bound to the client's IP) and a blocking TCP/TLS client, both built on the core's STUN
//! codec.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lastcall_testkit::procfs::cpu_time;
use lastcall_testkit::Signal;
use lastcall_turn_proto::stun::{attr, decode_address, method, Builder, Class, Message};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

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
pub(crate) fn raise_nofile() -> u64 {
    let (_, hard) = lastcall_testkit::procfs::open_files_limit();
    let status = Command::new("prlimit")
        .arg(format!("--pid={}", std::process::id()))
        .arg(format!("--nofile={hard}:"))
        .status()
        .expect("run prlimit");
    assert!(status.success(), "prlimit --nofile={hard}: failed");
    hard
}

/// `n` UDP allocations on `server` from as many sockets; returns the sockets, once every
/// allocation was answered. At most [`WINDOW`] Allocates are in flight, answers are awaited
/// with epoll (the client costs a fraction of the server's CPU, so a loaded machine slows
/// the two alike), and an Allocate unanswered for [`RESEND`] is sent again (a full socket
/// buffer drops datagrams; a retransmission is answered like the first).
pub(crate) fn bulk_allocate(server: SocketAddr, n: usize) -> Vec<UdpSocket> {
    const WINDOW: usize = 256;
    const RESEND: Duration = Duration::from_secs(1);
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
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).expect("epoll");
    let socks: Vec<UdpSocket> = (0..n)
        .map(|i| {
            let s = UdpSocket::bind("127.0.0.1:0").expect("bind a client socket");
            s.connect(server).expect("connect");
            s.set_nonblocking(true).expect("nonblocking");
            epoll
                .add(&s, EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
                .expect("epoll add");
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
    // Sent and unanswered (or answered since: skipped), oldest first.
    let mut sent: VecDeque<(usize, Instant)> = VecDeque::new();
    let (mut next, mut in_flight, mut left, mut resent) = (0, 0, n, 0);
    let until = Instant::now() + Duration::from_secs(120);
    let mut events = vec![EpollEvent::empty(); 512];
    let mut buf = [0u8; 1500];
    while left > 0 {
        assert!(
            Instant::now() < until,
            "{left} of {n} Allocates unanswered after 120 s ({resent} sent again)"
        );
        while in_flight < WINDOW && next < n {
            let _ = socks[next].send(&requests[next]);
            sent.push_back((next, Instant::now()));
            (next, in_flight) = (next + 1, in_flight + 1);
        }
        let ready = epoll.wait(&mut events, 100u16).expect("epoll_wait");
        for ev in &events[..ready] {
            let i = usize::try_from(ev.data()).expect("a socket index");
            // Level-triggered: read until empty (a retransmission's second answer included).
            while let Ok(len) = socks[i].recv(&mut buf) {
                if done[i] {
                    continue;
                }
                let a = answer(&buf[..len]).expect("a STUN response");
                assert!(a.success, "Allocate {i}: error {}", a.code);
                done[i] = true;
                (left, in_flight) = (left - 1, in_flight - 1);
            }
        }
        let now = Instant::now();
        while let Some(&(i, at)) = sent.front() {
            if !done[i] && now.duration_since(at) < RESEND {
                break;
            }
            sent.pop_front();
            if !done[i] {
                let _ = socks[i].send(&requests[i]);
                sent.push_back((i, now));
                resent += 1;
            }
        }
    }
    if resent > 0 {
        println!("FIGURES {resent} Allocates sent again (unanswered for {RESEND:?})");
    }
    socks
}

/// 10,000 allocations whose clients went quiet, all ending in the drain's first timer pass:
/// every one releases its session, so the process exits 0 as the last ends, not 75 at the
/// deadline (past 4,096 deletions in one pass the core's event queue used to drop them).
///
/// They end by the drain's idle reclaim, not by their lifetimes: each lives 600 s (the
/// default lifetime), so however long a loaded machine takes to make them, every one is
/// live when the drain begins, and once `--drain-idle-timeout` has passed since the last
/// was answered, the drain's start finds them all idle at once. (A lifetime shorter than
/// the time to make them, as this test had, let the first ones expire before the last
/// was made: 10,000 Allocates took 81 s at load 35 against a 20 s lifetime.)
#[test]
fn ten_thousand_allocations_ending_in_one_timer_pass_end_the_drain_with_exit_0() {
    const N: usize = 10_000;
    const IDLE: Duration = Duration::from_secs(1);
    let hard = raise_nofile();
    // This process and the server each hold N sockets.
    assert!(
        hard >= N as u64 + 1000,
        "this test needs {} open files per process (hard limit {hard})",
        N + 1000
    );
    let mut turn = Turn::start(&[
        "--shutdown-delay=0s",
        "--drain-timeout=300s",
        &format!("--drain-idle-timeout={}s", IDLE.as_secs()),
        "--min-port=40000",
        "--max-port=65000",
    ]);
    let server = SocketAddr::from(([127, 0, 0, 1], turn.port));
    let cpu = (cpu_time(turn.pod.pid()), cpu_time(std::process::id()));
    let started = Instant::now();
    let socks = bulk_allocate(server, N);
    let allocated = Instant::now();
    println!(
        "FIGURES {N} allocations in {:.1} s (CPU: server {:.2} s, this client {:.2} s)",
        (allocated - started).as_secs_f64(),
        (cpu_time(turn.pod.pid()) - cpu.0).as_secs_f64(),
        (cpu_time(std::process::id()) - cpu.1).as_secs_f64()
    );
    assert_eq!(
        turn.metric("turn_total_allocations{type=\"UDP\"}"),
        Some(N as f64),
        "live allocations"
    );
    // The server heard each client before its answer came back: once IDLE has passed
    // since the last answer, every client has been quiet for IDLE.
    std::thread::sleep((allocated + IDLE).saturating_duration_since(Instant::now()));
    let term = Instant::now();
    turn.pod.signal(Signal::Term);
    let exit = turn.pod.wait_exit(Duration::from_secs(120));
    println!(
        "FIGURES exit {:?} {:.3} s after SIGTERM",
        exit.code,
        term.elapsed().as_secs_f64()
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
