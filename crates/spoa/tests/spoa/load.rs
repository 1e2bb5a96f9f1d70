//! Load measurement (ignored by default; run it explicitly):
//!
//! ```sh
//! LOAD_REQUESTS=100000 LOAD_CONCURRENCY=16 \
//!   cargo test --release -p lastcall-spoa --test spoa load:: -- --ignored --nocapture
//! ```
//!
//! Starts the documented HAProxy, a real origin and one agent (built-in CRS, PL1), sends
//! `LOAD_REQUESTS` requests from `LOAD_CONCURRENCY` keep-alive clients (1 in 10 an SQL
//! injection that must get 403), and prints latency percentiles through HAProxy and the
//! agent's RSS (`VmRSS` of `/proc/<pid>/status`) before and after.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{Stack, StackOptions};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_kib(pid: u32) -> u64 {
    lastcall_testkit::procfs::rss(pid) / 1024
}

/// One keep-alive connection; returns the status of each request.
struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    fn connect(addr: SocketAddr) -> std::io::Result<Client> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Client {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    fn get(&mut self, target: &str) -> std::io::Result<(u16, bool)> {
        write!(
            self.writer,
            "GET {target} HTTP/1.1\r\nHost: load.example\r\nUser-Agent: lastcall-load/1.0\r\nAccept: */*\r\n\r\n"
        )?;
        crate::support::read_response(&mut self.reader)
    }
}

#[test]
#[ignore = "load measurement; run explicitly with --ignored"]
fn load_latency_and_rss() {
    let total = env_usize("LOAD_REQUESTS", 100_000);
    let concurrency = env_usize("LOAD_CONCURRENCY", 16);
    let stack = Stack::start(StackOptions {
        agents: 1,
        agent_args: vec!["--log-level".into(), "info,lastcall_spoa::waf=warn".into()],
        quiet_haproxy: true,
        ..StackOptions::default()
    });
    let pid = stack.agents[0].pod.pid();
    let addr = stack.http();
    let rss_before = rss_kib(pid);
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..concurrency)
        .map(|_| {
            let (next, errors) = (next.clone(), errors.clone());
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                let mut client = Client::connect(addr).expect("connect");
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= total as u64 {
                        break;
                    }
                    let attack = i % 10 == 0;
                    let target = if attack {
                        format!("/item?id={i}'%20OR%20'1'='1")
                    } else {
                        format!("/item/{i}?q=plain+text")
                    };
                    let t = Instant::now();
                    match client.get(&target) {
                        Ok((status, close)) => {
                            lat.push(t.elapsed());
                            if status != if attack { 403 } else { 200 } {
                                errors.fetch_add(1, Ordering::SeqCst);
                            }
                            if close {
                                client = Client::connect(addr).expect("reconnect");
                            }
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::SeqCst);
                            client = Client::connect(addr).expect("reconnect");
                        }
                    }
                }
                lat
            })
        })
        .collect();
    // RSS at every fifth of the run, to see a trend rather than one number.
    let mut marks = Vec::new();
    for fifth in 1..=4u64 {
        let at = total as u64 * fifth / 5;
        while next.load(Ordering::SeqCst) < at && !threads.iter().all(|t| t.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
        }
        marks.push(format!("{}k={} KiB", at / 1000, rss_kib(pid)));
    }
    let mut lat: Vec<Duration> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("client thread"))
        .collect();
    let elapsed = started.elapsed();
    lat.sort_unstable();
    let pct = |p: f64| {
        let idx = ((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1));
        lat.get(idx).copied().unwrap_or_default()
    };
    // Let the agent free what it can, then read RSS.
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = rss_kib(pid);
    println!(
        "requests={} concurrency={concurrency} elapsed={:.1}s rate={:.0}/s errors={}",
        lat.len(),
        elapsed.as_secs_f64(),
        lat.len() as f64 / elapsed.as_secs_f64(),
        errors.load(Ordering::SeqCst)
    );
    println!(
        "latency through HAProxy: p50={:.2}ms p90={:.2}ms p99={:.2}ms max={:.2}ms",
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.90).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    println!(
        "agent RSS: before={rss_before} KiB, {}, after={rss_after} KiB",
        marks.join(", ")
    );
    let m = stack.agents[0].metrics();
    for l in m.lines().filter(|l| l.starts_with("spoa_requests_total")) {
        println!("{l}");
    }
    assert_eq!(errors.load(Ordering::SeqCst), 0);
}
