//! The data-path load ([`crate::engine`]) through a TURN server, or straight to an echo (the
//! machine's own reference), at fixed offered rates: a ladder, then a bisection for the
//! highest rate relayed with less than the loss threshold.
//!
//! Through the server, each client allocates, permits the echo peer and binds a channel to
//! it; every phase then reports sent/received/lost, the round-trip quantiles, and the CPU time
//! of every process on the path over the phase (the generator itself, the server, the echo
//! peer, the kernel's softirq threads: nanoseconds each thread ran, `/proc/PID/task/*/schedstat`).
//! The echo is a process of its own (`lastcall-turnload echo`), started here unless `--peer`
//! names one.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::client::{Credentials, Session};
use crate::engine::{Engine, Lane, Phase};
use crate::procfs::{cpu_ns, softirq_threads};

/// What to run.
#[derive(Clone, Debug)]
pub(crate) struct RelayOpts {
    /// The TURN server, or `None`: straight to the echo.
    pub server: Option<SocketAddr>,
    pub secret: String,
    /// The echo peer, or `None`: start one.
    pub peer: Option<SocketAddr>,
    pub clients: usize,
    pub size: usize,
    pub duration: Duration,
    pub rates: Vec<f64>,
    pub search_steps: u32,
    pub loss_threshold_pct: f64,
    /// Processes whose CPU time each phase reports: (name, pid).
    pub cpu: Vec<(String, u32)>,
}

/// The processes measured and their CPU time at the start of a phase.
pub(crate) struct Meter {
    procs: Vec<(String, Vec<u32>)>,
}

impl Meter {
    pub(crate) fn new(cpu: &[(String, u32)], echo: Option<u32>) -> Meter {
        let mut procs: Vec<(String, Vec<u32>)> =
            vec![("generator".into(), vec![std::process::id()])];
        for (name, pid) in cpu {
            match procs.iter_mut().find(|(n, _)| n == name) {
                Some((_, pids)) => pids.push(*pid),
                None => procs.push((name.clone(), vec![*pid])),
            }
        }
        if let Some(pid) = echo {
            procs.push(("echo".into(), vec![pid]));
        }
        procs.push(("softirq".into(), softirq_threads()));
        Meter { procs }
    }

    pub(crate) fn read(&self) -> Vec<u64> {
        self.procs
            .iter()
            .map(|(_, pids)| pids.iter().filter_map(|p| cpu_ns(*p)).sum())
            .collect()
    }

    /// CPU seconds per process between two readings.
    pub(crate) fn delta(
        &self,
        before: &[u64],
        after: &[u64],
    ) -> serde_json::Map<String, serde_json::Value> {
        self.procs
            .iter()
            .zip(before.iter().zip(after))
            .map(|((name, _), (b, a))| (name.clone(), json!(a.saturating_sub(*b) as f64 / 1e9)))
            .collect()
    }
}

/// An echo process of our own (this binary's `echo`), killed when dropped.
struct OwnEcho {
    child: Child,
    addr: SocketAddr,
}

impl OwnEcho {
    fn start(near: SocketAddr) -> anyhow::Result<OwnEcho> {
        let bind: SocketAddr = if near.is_ipv4() {
            ([127, 0, 0, 1], 0).into()
        } else {
            (std::net::Ipv6Addr::LOCALHOST, 0).into()
        };
        let mut child = Command::new(std::env::current_exe()?)
            .args(["echo", "--bind", &bind.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no echo stdout"))?;
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        let addr = line
            .trim()
            .strip_prefix("echo ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("echo said {line:?}"))?;
        Ok(OwnEcho { child, addr })
    }
}

impl Drop for OwnEcho {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn phase_json(
    kind: &str,
    p: &Phase,
    cpu: serde_json::Map<String, serde_json::Value>,
) -> serde_json::Value {
    let q = |x| p.hist.quantile(x);
    // Every echoed datagram crossed the path twice (client to peer, peer to client).
    let datagrams = 2 * p.received;
    let whole: f64 = cpu.values().filter_map(serde_json::Value::as_f64).sum();
    let per = |s: f64| (datagrams > 0).then(|| s * 1e6 / datagrams as f64);
    let server = cpu.get("server").and_then(serde_json::Value::as_f64);
    json!({
        "kind": kind,
        "rate": p.rate,
        "offered": (p.offered * 10.0).round() / 10.0,
        "duration_s": (p.secs * 1000.0).round() / 1000.0,
        "sent": p.sent,
        "send_errors": p.send_errors,
        "received": p.received,
        "lost": p.lost(),
        "loss_pct": p.loss_pct(),
        "datagrams": datagrams,
        "rtt_samples": p.hist.count(),
        "p50_us": q(0.5),
        "p99_us": q(0.99),
        "max_us": q(1.0),
        "cpu_s": cpu,
        "whole_cpu_s": whole,
        "whole_us_per_datagram": per(whole),
        "server_us_per_datagram": server.and_then(per),
    })
}

/// A phase passes when the generator offered the rate (97 %) and loss stayed under the
/// threshold.
fn passes(p: &Phase, threshold_pct: f64) -> bool {
    p.offered >= 0.97 * p.rate && p.loss_pct() < threshold_pct
}

/// Every rate of `rates`, then up to `steps` bisection steps between the best passing and the
/// lowest failing one; `phase(rate, is_search)` runs one and says whether it passed. Returns
/// (the highest passing rate, the lowest failing rate of the ladder).
pub(crate) fn ladder(
    rates: &[f64],
    steps: u32,
    mut phase: impl FnMut(f64, bool) -> bool,
) -> (Option<f64>, Option<f64>) {
    let mut best: Option<f64> = None;
    let mut worst: Option<f64> = None;
    for &rate in rates {
        if phase(rate, false) {
            best = Some(best.map_or(rate, |b: f64| b.max(rate)));
        } else if !worst.is_some_and(|w| rate >= w) {
            worst = Some(rate);
        }
    }
    if let (Some(mut lo), Some(mut hi)) = (best, worst) {
        for _ in 0..steps {
            if hi / lo < 1.05 || lo >= hi {
                break;
            }
            let mid = ((lo + hi) / 2.0).round();
            if phase(mid, true) {
                lo = mid;
                best = Some(mid);
            } else {
                hi = mid;
            }
        }
    }
    (best, worst)
}

/// The lanes through the server: one allocation each, a channel to `peer`.
fn relay_lanes(
    o: &RelayOpts,
    server: SocketAddr,
    peer: SocketAddr,
) -> anyhow::Result<(Vec<Lane>, Vec<Session>)> {
    let mut lanes = Vec::new();
    let mut sessions = Vec::new();
    for i in 0..o.clients {
        let creds = Credentials::rest(
            o.secret.as_bytes(),
            &format!("load{i}"),
            Duration::from_secs(3600),
        );
        let mut s = Session::new(server, creds)?;
        s.allocate(600)?;
        s.create_permission(peer)?;
        let channel = 0x4000 + u16::try_from(i % 0x3fff).unwrap_or(0);
        s.channel_bind(channel, peer)?;
        lanes.push(Lane::new(s.socket().try_clone()?, Some(channel))?);
        sessions.push(s);
    }
    Ok((lanes, sessions))
}

/// Lanes straight to the echo.
pub(crate) fn direct_lanes(n: usize, peer: SocketAddr) -> anyhow::Result<Vec<Lane>> {
    (0..n)
        .map(|_| {
            let local: SocketAddr = if peer.is_ipv4() {
                ([127, 0, 0, 1], 0).into()
            } else {
                (std::net::Ipv6Addr::LOCALHOST, 0).into()
            };
            let s = UdpSocket::bind(local)?;
            s.connect(peer)?;
            Ok(Lane::new(s, None)?)
        })
        .collect()
}

/// Sets up the lanes, runs every rate, then the search; one JSON object per phase.
pub(crate) fn run(o: &RelayOpts) -> anyhow::Result<()> {
    let near = o
        .server
        .or(o.peer)
        .unwrap_or_else(|| ([127, 0, 0, 1], 0).into());
    let own = match o.peer {
        Some(_) => None,
        None => Some(OwnEcho::start(near)?),
    };
    let peer = o
        .peer
        .or(own.as_ref().map(|e| e.addr))
        .ok_or_else(|| anyhow::anyhow!("no echo"))?;
    let (lanes, mut sessions) = match o.server {
        Some(server) => relay_lanes(o, server, peer)?,
        None => (direct_lanes(o.clients, peer)?, Vec::new()),
    };
    let kind = if o.server.is_some() {
        "relay"
    } else {
        "direct"
    };
    eprintln!(
        "turnload: {} lanes {} to echo {peer}",
        lanes.len(),
        o.server
            .map_or("straight".to_string(), |s| format!("through {s}"))
    );
    let meter = Meter::new(&o.cpu, own.as_ref().map(|e| e.child.id()));
    let mut engine = Engine::new(lanes, o.size)?;
    let mut measure = |rate: f64| {
        let before = meter.read();
        let p = engine.phase(rate, o.duration);
        let after = meter.read();
        (meter.delta(&before, &after), p)
    };
    let report = |label: &str, cpu: serde_json::Map<String, serde_json::Value>, p: &Phase| {
        println!("{}", phase_json(label, p, cpu));
        eprintln!(
            "turnload: {label} rate {:.0}/s offered {:.0}/s sent {} received {} loss {:.3}% p50 {:?} us p99 {:?} us",
            p.rate, p.offered, p.sent, p.received, p.loss_pct(), p.hist.quantile(0.5), p.hist.quantile(0.99)
        );
    };
    let (best, worst) = ladder(&o.rates, o.search_steps, |rate, search| {
        let (cpu, p) = measure(rate);
        report(if search { "search" } else { kind }, cpu, &p);
        passes(&p, o.loss_threshold_pct)
    });
    println!(
        "{}",
        json!({
            "kind": "summary",
            "mode": kind,
            "max_rate_under_threshold": best,
            "lowest_failing_rate": worst,
            "loss_threshold_pct": o.loss_threshold_pct,
            "lanes": engine.lanes().len(),
            "size": o.size,
        })
    );
    for s in &mut sessions {
        let _ = s.refresh(0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::Histogram;

    #[test]
    fn pass_rule() {
        let mut r = Phase {
            rate: 1000.0,
            offered: 1000.0,
            sent: 10_000,
            send_errors: 0,
            received: 9_995,
            hist: Histogram::default(),
            secs: 10.0,
        };
        assert!(passes(&r, 0.1));
        r.received = 9_980;
        assert!(!passes(&r, 0.1));
        r.received = 10_000;
        r.offered = 900.0;
        assert!(!passes(&r, 0.1));
    }

    /// The ladder runs every rate, then bisects between the best passing and the lowest
    /// failing one until within 5 %.
    #[test]
    fn the_ladder_bisects_between_pass_and_fail() {
        let mut ran = Vec::new();
        let (best, worst) = ladder(&[100.0, 200.0, 400.0], 5, |rate, search| {
            ran.push((rate, search));
            rate <= 250.0
        });
        assert_eq!((best, worst), (Some(250.0), Some(400.0)));
        assert_eq!(
            ran,
            [
                (100.0, false),
                (200.0, false),
                (400.0, false),
                (300.0, true),
                (250.0, true),
                (275.0, true),
                (263.0, true),
                (257.0, true)
            ]
        );
    }

    /// Straight to an echo process of its own: the phases and the summary come out, every
    /// process's CPU is counted.
    #[test]
    fn a_direct_run_reports_every_figure() {
        let m = Meter::new(&[("server".into(), std::process::id())], None);
        let a = m.read();
        let b = m.read();
        let d = m.delta(&a, &b);
        assert!(
            d.contains_key("generator") && d.contains_key("server") && d.contains_key("softirq")
        );
    }
}
