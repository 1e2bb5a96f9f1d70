//! The data-path load: clients relay ChannelData through the server to our own UDP echo
//! peer and back, at a fixed offered rate, with a microsecond send timestamp in each payload.
//!
//! Each phase offers one rate for a fixed time, then waits for stragglers, and reports
//! sent/received/lost, the round-trip quantiles, and (with `cpu_pid`) the server's CPU time
//! over the phase. A baseline phase sends the same payloads straight to the echo peer, so
//! the relay's *added* latency is the difference of the quantiles.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use lastcall_turn_proto::frame::parse_channel_data;
use serde_json::json;

use crate::client::{Credentials, Session};
use crate::histogram::Histogram;
use crate::procfs::cpu_ticks;

/// Payload marker.
const MAGIC: [u8; 4] = *b"LCTL";
/// Bytes of the stamp at the start of each payload: magic, phase, sequence, send time (µs).
pub(crate) const STAMP_LEN: usize = 24;
/// How long the sender sleeps between bursts.
const TICK: Duration = Duration::from_micros(200);
/// Socket buffer asked for on the generator's sockets (the kernel caps it at rmem_max).
const SOCK_BUF: usize = 4 << 20;

/// What to run.
#[derive(Clone, Debug)]
pub(crate) struct RelayOpts {
    pub server: SocketAddr,
    pub secret: String,
    pub clients: usize,
    pub size: usize,
    pub duration: Duration,
    pub rates: Vec<f64>,
    pub search_steps: u32,
    pub loss_threshold_pct: f64,
    pub baseline: bool,
    pub cpu_pid: Option<u32>,
    pub clk_tck: u64,
}

/// Per-lane counters a receiver thread updates.
#[derive(Default)]
struct LaneStats {
    received: u64,
    hist: Histogram,
}

struct Lane {
    sock: UdpSocket,
    /// `Some(channel)` through the relay, `None` straight to the echo peer.
    channel: Option<u16>,
    stats: Arc<Mutex<LaneStats>>,
}

struct Shared {
    t0: Instant,
    phase: AtomicU32,
    stop: AtomicBool,
    peer_rx: AtomicU64,
}

impl Shared {
    fn now_us(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn tune(sock: &UdpSocket) {
    let s = socket2::SockRef::from(sock);
    let _ = s.set_recv_buffer_size(SOCK_BUF);
    let _ = s.set_send_buffer_size(SOCK_BUF);
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::ConnectionRefused
    )
}

/// The echo peer: every datagram goes back to where it came from.
fn echo_peer(sock: UdpSocket, shared: Arc<Shared>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !shared.stop.load(Ordering::Relaxed) {
            match sock.recv_from(&mut buf) {
                Ok((n, from)) => {
                    shared.peer_rx.fetch_add(1, Ordering::Relaxed);
                    if let Some(data) = buf.get(..n) {
                        let _ = sock.send_to(data, from);
                    }
                }
                Err(e) if is_timeout(&e) => {}
                Err(_) => {}
            }
        }
    })
}

/// Reads one lane's echoes and records their round-trip times.
fn receiver(
    sock: UdpSocket,
    channel: Option<u16>,
    stats: Arc<Mutex<LaneStats>>,
    shared: Arc<Shared>,
) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !shared.stop.load(Ordering::Relaxed) {
            let n = match sock.recv(&mut buf) {
                Ok(n) => n,
                Err(_) => continue,
            };
            let now = shared.now_us();
            let Some(dgram) = buf.get(..n) else { continue };
            let payload = match channel {
                Some(ch) => match parse_channel_data(dgram) {
                    Some((c, p)) if c == ch => p,
                    _ => continue,
                },
                None => dgram,
            };
            let Some((phase, _seq, sent)) = read_stamp(payload) else {
                continue;
            };
            if phase != shared.phase.load(Ordering::Relaxed) {
                continue; // a straggler from an earlier phase
            }
            let mut s = lock(&stats);
            s.received += 1;
            s.hist.record(now.saturating_sub(sent));
        }
    })
}

/// Writes the stamp at the start of `payload` (at least [`STAMP_LEN`] bytes).
pub(crate) fn write_stamp(payload: &mut [u8], phase: u32, seq: u64, sent_us: u64) {
    if let Some(p) = payload.get_mut(..STAMP_LEN) {
        p[..4].copy_from_slice(&MAGIC);
        p[4..8].copy_from_slice(&phase.to_be_bytes());
        p[8..16].copy_from_slice(&seq.to_be_bytes());
        p[16..24].copy_from_slice(&sent_us.to_be_bytes());
    }
}

/// Reads a stamp: `(phase, sequence, send time in µs)`.
pub(crate) fn read_stamp(payload: &[u8]) -> Option<(u32, u64, u64)> {
    let p = payload.get(..STAMP_LEN)?;
    if p[..4] != MAGIC {
        return None;
    }
    let phase = u32::from_be_bytes(p[4..8].try_into().ok()?);
    let seq = u64::from_be_bytes(p[8..16].try_into().ok()?);
    let sent = u64::from_be_bytes(p[16..24].try_into().ok()?);
    Some((phase, seq, sent))
}

/// Result of one phase.
#[derive(Clone, Debug)]
pub(crate) struct PhaseResult {
    pub rate: f64,
    pub offered: f64,
    pub sent: u64,
    pub send_errors: u64,
    pub received: u64,
    pub peer_rx: u64,
    pub hist: Histogram,
    pub cpu_s: Option<f64>,
    /// This process's CPU time over the same window (the clients and the echo peer: the
    /// rest of the path).
    pub gen_cpu_s: Option<f64>,
    pub secs: f64,
}

impl PhaseResult {
    pub(crate) fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }

    pub(crate) fn loss_pct(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        self.lost() as f64 * 100.0 / self.sent as f64
    }

    /// Datagrams the server forwarded: client -> peer plus peer -> client.
    pub(crate) fn relayed(&self) -> u64 {
        self.peer_rx + self.received
    }
}

struct Load {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    next_phase: u32,
}

impl Load {
    /// Offers `rate` datagrams/s spread over `lanes` for `duration`.
    fn phase(
        &mut self,
        lanes: &[Lane],
        rate: f64,
        duration: Duration,
        size: usize,
        cpu: Option<(u32, u64)>,
    ) -> PhaseResult {
        self.next_phase += 1;
        let phase = self.next_phase;
        for l in lanes {
            let mut s = lock(&l.stats);
            s.received = 0;
            s.hist.reset();
        }
        self.shared.phase.store(phase, Ordering::Relaxed);
        let mut bufs: Vec<Vec<u8>> = lanes
            .iter()
            .map(|l| {
                let mut b = vec![0u8; size.max(STAMP_LEN)];
                if let Some(ch) = l.channel {
                    let mut out = Vec::new();
                    lastcall_turn_proto::frame::write_channel_data(&mut out, ch, &b, false);
                    b = out;
                }
                b
            })
            .collect();
        let cpu0 = cpu.and_then(|(pid, _)| cpu_ticks(pid));
        let gen0 = cpu_ticks(std::process::id());
        let peer0 = self.shared.peer_rx.load(Ordering::Relaxed);
        let start = Instant::now();
        let (mut sent, mut errors) = (0u64, 0u64);
        let n = lanes.len().max(1);
        'send: loop {
            let elapsed = start.elapsed();
            if elapsed >= duration {
                break;
            }
            let due = (elapsed.as_secs_f64() * rate) as u64;
            while sent < due {
                let i = (sent % n as u64) as usize;
                if let (Some(l), Some(b)) = (lanes.get(i), bufs.get_mut(i)) {
                    let off = if l.channel.is_some() { 4 } else { 0 };
                    if let Some(p) = b.get_mut(off..) {
                        write_stamp(p, phase, sent, self.shared.now_us());
                    }
                    if l.sock.send(b).is_err() {
                        errors += 1;
                    }
                }
                sent += 1;
                if sent % 256 == 0 && start.elapsed() >= duration {
                    break 'send;
                }
            }
            thread::sleep(TICK);
        }
        let send_secs = start.elapsed().as_secs_f64();
        // Wait for stragglers: until everything came back, or 300 ms without progress.
        let received = |lanes: &[Lane]| lanes.iter().map(|l| lock(&l.stats).received).sum::<u64>();
        let mut last = received(lanes);
        let mut last_change = Instant::now();
        let wait_start = Instant::now();
        while last < sent && wait_start.elapsed() < Duration::from_secs(3) {
            thread::sleep(Duration::from_millis(10));
            let r = received(lanes);
            if r != last {
                last = r;
                last_change = Instant::now();
            } else if last_change.elapsed() > Duration::from_millis(300) {
                break;
            }
        }
        let cpu_s = match (cpu, cpu0) {
            (Some((pid, tck)), Some(c0)) => {
                cpu_ticks(pid).map(|c1| c1.saturating_sub(c0) as f64 / tck.max(1) as f64)
            }
            _ => None,
        };
        let gen_cpu_s = match (cpu, gen0, cpu_ticks(std::process::id())) {
            (Some((_, tck)), Some(g0), Some(g1)) => {
                Some(g1.saturating_sub(g0) as f64 / tck.max(1) as f64)
            }
            _ => None,
        };
        // Later echoes of this phase no longer count.
        self.shared.phase.store(0, Ordering::Relaxed);
        let mut hist = Histogram::default();
        let mut rx = 0;
        for l in lanes {
            let s = lock(&l.stats);
            rx += s.received;
            hist.merge(&s.hist);
        }
        PhaseResult {
            rate,
            offered: sent as f64 / send_secs.max(1e-9),
            sent,
            send_errors: errors,
            received: rx,
            peer_rx: self.shared.peer_rx.load(Ordering::Relaxed) - peer0,
            hist,
            cpu_s,
            gen_cpu_s,
            secs: send_secs,
        }
    }

    fn stop(self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn phase_json(kind: &str, r: &PhaseResult, base: Option<&PhaseResult>) -> serde_json::Value {
    let q = |h: &Histogram, x| h.quantile(x);
    let added = |x: f64| match (q(&r.hist, x), base.and_then(|b| q(&b.hist, x))) {
        (Some(a), Some(b)) => Some(a as i64 - b as i64),
        _ => None,
    };
    let relayed = r.relayed();
    json!({
        "kind": kind,
        "rate": r.rate,
        "offered": (r.offered * 10.0).round() / 10.0,
        "duration_s": (r.secs * 1000.0).round() / 1000.0,
        "sent": r.sent,
        "send_errors": r.send_errors,
        "received": r.received,
        "peer_rx": r.peer_rx,
        "lost": r.lost(),
        "loss_pct": r.loss_pct(),
        "relayed": relayed,
        "rtt_samples": r.hist.count(),
        "p50_us": q(&r.hist, 0.5),
        "p99_us": q(&r.hist, 0.99),
        "max_us": q(&r.hist, 1.0),
        "added_p50_us": if base.is_some() { added(0.5) } else { None },
        "added_p99_us": if base.is_some() { added(0.99) } else { None },
        "server_cpu_s": r.cpu_s,
        "cpu_s_per_m_relayed": r.cpu_s.filter(|_| relayed > 0).map(|c| c * 1e6 / relayed as f64),
        "generator_cpu_s": r.gen_cpu_s,
        // The whole path: server + clients + peer (this process), per relayed datagram.
        "whole_cpu_us_per_relayed": r.cpu_s.zip(r.gen_cpu_s).filter(|_| relayed > 0)
            .map(|(s, g)| (s + g) * 1e6 / relayed as f64),
    })
}

/// A phase passes when the generator offered the rate (97 %) and loss stayed under the
/// threshold.
fn passes(r: &PhaseResult, threshold_pct: f64) -> bool {
    r.offered >= 0.97 * r.rate && r.loss_pct() < threshold_pct
}

/// Sets up the clients and the peer, runs the baseline and every rate, then the search.
pub(crate) fn run(o: &RelayOpts) -> anyhow::Result<()> {
    let shared = Arc::new(Shared {
        t0: Instant::now(),
        phase: AtomicU32::new(0),
        stop: AtomicBool::new(false),
        peer_rx: AtomicU64::new(0),
    });
    let peer_sock = UdpSocket::bind(("127.0.0.1", 0))?;
    tune(&peer_sock);
    peer_sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    let peer = peer_sock.local_addr()?;
    let mut load = Load {
        shared: Arc::clone(&shared),
        threads: vec![echo_peer(peer_sock, Arc::clone(&shared))],
        next_phase: 0,
    };
    let mut relay_lanes = Vec::new();
    let mut sessions = Vec::new();
    for i in 0..o.clients {
        let creds = Credentials::rest(
            o.secret.as_bytes(),
            &format!("load{i}"),
            Duration::from_secs(3600),
        );
        let mut s = Session::new(o.server, creds)?;
        s.allocate(600)?;
        s.create_permission(peer)?;
        let channel = 0x4000 + u16::try_from(i).unwrap_or(0) % 0x3fff;
        s.channel_bind(channel, peer)?;
        let sock = s.socket().try_clone()?;
        tune(&sock);
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        relay_lanes.push(Lane {
            sock: sock.try_clone()?,
            channel: Some(channel),
            stats: Arc::default(),
        });
        sessions.push(s);
        let _ = sock;
    }
    let mut base_lanes = Vec::new();
    if o.baseline {
        for _ in 0..o.clients {
            let sock = UdpSocket::bind(("127.0.0.1", 0))?;
            sock.connect(peer)?;
            tune(&sock);
            sock.set_read_timeout(Some(Duration::from_millis(50)))?;
            base_lanes.push(Lane {
                sock,
                channel: None,
                stats: Arc::default(),
            });
        }
    }
    for l in relay_lanes.iter().chain(&base_lanes) {
        load.threads.push(receiver(
            l.sock.try_clone()?,
            l.channel,
            Arc::clone(&l.stats),
            Arc::clone(&shared),
        ));
    }
    eprintln!(
        "turnload: {} allocations through {} to echo peer {peer}",
        o.clients, o.server
    );
    let cpu = o.cpu_pid.map(|p| (p, o.clk_tck));
    let first = o.rates.first().copied().unwrap_or(1000.0);
    let base = if o.baseline {
        let b = load.phase(&base_lanes, first, o.duration, o.size, None);
        println!("{}", phase_json("baseline", &b, None));
        Some(b)
    } else {
        None
    };
    let mut best: Option<f64> = None;
    let mut worst: Option<f64> = None;
    let report = |r: &PhaseResult, load_kind: &str| {
        println!("{}", phase_json(load_kind, r, base.as_ref()));
        eprintln!(
            "turnload: {load_kind} rate {:.0}/s offered {:.0}/s sent {} received {} loss {:.3}% p50 {:?} us p99 {:?} us cpu {:?} s",
            r.rate, r.offered, r.sent, r.received, r.loss_pct(),
            r.hist.quantile(0.5), r.hist.quantile(0.99), r.cpu_s
        );
    };
    for &rate in &o.rates {
        let r = load.phase(&relay_lanes, rate, o.duration, o.size, cpu);
        report(&r, "relay");
        if passes(&r, o.loss_threshold_pct) {
            best = Some(best.map_or(rate, |b: f64| b.max(rate)));
        } else if !worst.is_some_and(|w| rate >= w) {
            worst = Some(rate);
        }
    }
    // Bisect between the best passing and the lowest failing rate.
    if let (Some(mut lo), Some(mut hi)) = (best, worst) {
        for _ in 0..o.search_steps {
            if hi / lo < 1.05 || lo >= hi {
                break;
            }
            let mid = ((lo + hi) / 2.0).round();
            let r = load.phase(&relay_lanes, mid, o.duration, o.size, cpu);
            report(&r, "search");
            if passes(&r, o.loss_threshold_pct) {
                lo = mid;
                best = Some(mid);
            } else {
                hi = mid;
            }
        }
    }
    println!(
        "{}",
        json!({
            "kind": "summary",
            "max_rate_under_threshold": best,
            "lowest_failing_rate": worst,
            "loss_threshold_pct": o.loss_threshold_pct,
            "clients": o.clients,
            "size": o.size,
        })
    );
    load.stop();
    for s in &mut sessions {
        let _ = s.refresh(0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip() {
        let mut p = [0u8; 40];
        write_stamp(&mut p, 3, 42, 123_456);
        assert_eq!(read_stamp(&p), Some((3, 42, 123_456)));
        assert_eq!(read_stamp(&p[..20]), None);
        p[0] = b'X';
        assert_eq!(read_stamp(&p), None);
    }

    #[test]
    fn pass_rule() {
        let mut r = PhaseResult {
            rate: 1000.0,
            offered: 1000.0,
            sent: 10_000,
            send_errors: 0,
            received: 9_995,
            peer_rx: 9_995,
            hist: Histogram::default(),
            cpu_s: None,
            gen_cpu_s: None,
            secs: 10.0,
        };
        assert!(passes(&r, 0.1));
        r.received = 9_980;
        assert!(!passes(&r, 0.1));
        r.received = 10_000;
        r.offered = 900.0;
        assert!(!passes(&r, 0.1));
    }
}
