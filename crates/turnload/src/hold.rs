//! Allocation load: opens `count` allocations from as many client 5-tuples (each with its
//! own 401 round trip, as real clients do), `concurrency` transactions in flight, reports
//! allocations per second and the server's resident memory per allocation, then holds them
//! (refreshing) for a while and deletes them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::client::{Credentials, Session};
use crate::procfs::{cpu_ticks, rss_kib};

/// What to run.
#[derive(Clone, Debug)]
pub(crate) struct HoldOpts {
    pub server: SocketAddr,
    pub secret: String,
    pub count: usize,
    pub concurrency: usize,
    pub lifetime: u32,
    pub hold: Duration,
    pub refresh: Duration,
    pub release: bool,
    pub rss_pid: Option<u32>,
    pub cpu_pid: Option<u32>,
    pub clk_tck: u64,
    /// Long-term users instead of REST credentials.
    pub long_term: Option<LongTerm>,
}

/// Allocation i authenticates as `prefix` + (i mod `users`), with `password`.
#[derive(Clone, Debug)]
pub(crate) struct LongTerm {
    pub prefix: String,
    pub users: usize,
    pub password: String,
}

struct Counters {
    ok: AtomicU64,
    failed: AtomicU64,
    refreshed: AtomicU64,
    refresh_failed: AtomicU64,
    stop: AtomicBool,
}

/// Sleeps until `until` or until told to stop.
fn nap(until: Instant, c: &Counters) {
    while !c.stop.load(Ordering::Relaxed) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        thread::sleep(left.min(Duration::from_millis(100)));
    }
}

fn worker(o: HoldOpts, first: usize, n: usize, c: Arc<Counters>, done: mpsc::Sender<()>) {
    let mut sessions = Vec::with_capacity(n);
    for i in first..first + n {
        let creds = match &o.long_term {
            Some(lt) => Credentials {
                username: format!("{}{}", lt.prefix, i % lt.users),
                password: lt.password.clone(),
            },
            None => Credentials::rest(
                o.secret.as_bytes(),
                &format!("hold{i}"),
                Duration::from_secs(3 * 3600),
            ),
        };
        match Session::new(o.server, creds).and_then(|mut s| s.allocate(o.lifetime).map(|_| s)) {
            Ok(s) => {
                c.ok.fetch_add(1, Ordering::Relaxed);
                sessions.push(s);
            }
            Err(e) => {
                if c.failed.fetch_add(1, Ordering::Relaxed) < 3 {
                    eprintln!("turnload: allocation {i} failed: {e}");
                }
            }
        }
    }
    let _ = done.send(());
    let end = Instant::now() + o.hold;
    let mut next = Instant::now() + o.refresh;
    while Instant::now() < end && !c.stop.load(Ordering::Relaxed) {
        nap(next.min(end), &c);
        if Instant::now() >= next && Instant::now() < end {
            for s in &mut sessions {
                match s.refresh(o.lifetime) {
                    Ok(()) => c.refreshed.fetch_add(1, Ordering::Relaxed),
                    Err(_) => c.refresh_failed.fetch_add(1, Ordering::Relaxed),
                };
            }
            next = Instant::now() + o.refresh;
        }
    }
    if o.release {
        for s in &mut sessions {
            let _ = s.refresh(0);
        }
    }
}

/// Runs the allocation load; prints one JSON line when every allocation is up, one at the end.
pub(crate) fn run(o: &HoldOpts) -> anyhow::Result<()> {
    let c = Arc::new(Counters {
        ok: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        refreshed: AtomicU64::new(0),
        refresh_failed: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let rss0 = o.rss_pid.and_then(rss_kib);
    let cpu0 = o.cpu_pid.and_then(cpu_ticks);
    let w = o.concurrency.clamp(1, o.count.max(1));
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    let mut threads = Vec::new();
    let mut first = 0;
    for k in 0..w {
        let n = o.count / w + usize::from(k < o.count % w);
        let (o2, c2, tx2) = (o.clone(), Arc::clone(&c), tx.clone());
        threads.push(thread::spawn(move || worker(o2, first, n, c2, tx2)));
        first += n;
    }
    drop(tx);
    for _ in 0..w {
        if rx.recv().is_err() {
            break;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu_s = match (o.cpu_pid, cpu0) {
        (Some(pid), Some(c0)) => {
            cpu_ticks(pid).map(|c1| c1.saturating_sub(c0) as f64 / o.clk_tck.max(1) as f64)
        }
        _ => None,
    };
    let rss1 = o.rss_pid.and_then(rss_kib);
    let ok = c.ok.load(Ordering::Relaxed);
    let per_alloc = match (rss0, rss1) {
        (Some(a), Some(b)) if ok > 0 => Some((b as f64 - a as f64) * 1024.0 / ok as f64),
        _ => None,
    };
    println!(
        "{}",
        json!({
            "kind": "allocs",
            "count": o.count,
            "ok": ok,
            "failed": c.failed.load(Ordering::Relaxed),
            "concurrency": w,
            "secs": (secs * 1e4).round() / 1e4,
            "allocs_per_s": if secs > 0.0 { ok as f64 / secs } else { 0.0 },
            "rss_before_kib": rss0,
            "rss_after_kib": rss1,
            "rss_per_alloc_bytes": per_alloc,
            "server_cpu_s": cpu_s,
        })
    );
    eprintln!(
        "turnload: {ok} allocations in {secs:.3} s ({:.0}/s); holding for {:?}",
        ok as f64 / secs.max(1e-9),
        o.hold
    );
    for t in threads {
        let _ = t.join();
    }
    println!(
        "{}",
        json!({
            "kind": "hold_done",
            "refreshed": c.refreshed.load(Ordering::Relaxed),
            "refresh_failed": c.refresh_failed.load(Ordering::Relaxed),
            "released": o.release,
        })
    );
    Ok(())
}
