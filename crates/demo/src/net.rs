//! The network pieces the demo needs in-process: free ports, a paced load generator, and
//! readers for the daemons' admin endpoints and HAProxy's stats socket. The origin, the
//! HTTP/1.1 client and the metrics parser are `lastcall-testkit`'s, the tests' own.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use lastcall_testkit::{http, metrics};
use parking_lot::Mutex;

pub(crate) use lastcall_testkit::http::Reply;
pub(crate) use lastcall_testkit::Origin;

const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A port that was free a moment ago on 127.0.0.1, for both TCP and UDP.
pub(crate) fn free_port() -> Result<u16> {
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port on 127.0.0.1")
}

/// A loopback address with a free port.
pub(crate) fn free_addr() -> Result<SocketAddr> {
    Ok(SocketAddr::from(([127, 0, 0, 1], free_port()?)))
}

/// Whether `addr` accepts TCP connections.
pub(crate) fn tcp_open(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
}

/// One `GET target` with `Connection: close`.
pub(crate) fn get(addr: SocketAddr, target: &str) -> Result<Reply> {
    http::http(addr, "GET", target, &[], b"").with_context(|| format!("GET {target} from {addr}"))
}

/// `GET /drain` of a daemon's admin listener, as JSON.
pub(crate) fn drain_state(admin: SocketAddr) -> Result<serde_json::Value> {
    let r = get(admin, "/drain")?;
    if r.status != 200 {
        bail!("GET /drain on {admin}: status {}", r.status);
    }
    serde_json::from_str(&r.text()).with_context(|| format!("GET /drain on {admin}: not JSON"))
}

/// The value of metric series `series` (`name{labels}` exactly as exported), if present.
pub(crate) fn metric(admin: SocketAddr, series: &str) -> Result<Option<f64>> {
    let r = get(admin, "/metrics")?;
    Ok(metrics::value(&r.text(), series))
}

/// HAProxy's admin socket.
pub(crate) struct Stats(pub PathBuf);

impl Stats {
    fn command(&self, command: &str) -> Result<String> {
        let mut s = UnixStream::connect(&self.0)
            .with_context(|| format!("HAProxy stats socket {}", self.0.display()))?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.write_all(format!("{command}\n").as_bytes())?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    /// Status ("UP", "DOWN", ...) of server `name` of backend `backend`, from `show stat`.
    pub(crate) fn server_status(&self, backend: &str, name: &str) -> Result<String> {
        let stat = self.command("show stat")?;
        Ok(stat
            .lines()
            .map(|l| l.split(',').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&backend) && f.get(1) == Some(&name))
            .and_then(|f| f.get(17).map(|s| s.to_string()))
            .unwrap_or_default())
    }
}

/// Counters of the load generator.
#[derive(Default)]
pub(crate) struct LoadCounters {
    pub sent: AtomicU64,
    pub passed: AtomicU64,
    pub blocked: AtomicU64,
    pub failed: AtomicU64,
    pub failures: Mutex<Vec<String>>,
}

/// Steady HTTP load through HAProxy: `workers` threads, each sending about `rate` requests
/// per second; every fifth request is an attack that must be blocked (403), the others must
/// pass (200). Anything else is a failure.
pub(crate) struct Load {
    pub counters: Arc<LoadCounters>,
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

/// The attack the demo sends (SQL injection in a query parameter).
pub(crate) const ATTACK: &str = "/products?id=1%27%20OR%20%271%27=%271";

impl Load {
    pub(crate) fn start(addr: SocketAddr, workers: usize, rate: u32) -> Load {
        let counters = Arc::new(LoadCounters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let period = Duration::from_secs(1) / rate.max(1);
        let threads = (0..workers)
            .map(|w| {
                let (c, stop) = (counters.clone(), stop.clone());
                thread::spawn(move || {
                    let mut i = 0u64;
                    let mut next = Instant::now();
                    while !stop.load(Ordering::SeqCst) {
                        i += 1;
                        let attack = i % 5 == 0;
                        let target = if attack {
                            format!("{ATTACK}&w={w}&n={i}")
                        } else {
                            format!("/products/{i}?worker={w}")
                        };
                        let want = if attack { 403 } else { 200 };
                        c.sent.fetch_add(1, Ordering::SeqCst);
                        match get(addr, &target) {
                            Ok(r) if r.status == want => {
                                let n = if attack { &c.blocked } else { &c.passed };
                                n.fetch_add(1, Ordering::SeqCst);
                            }
                            other => {
                                c.failed.fetch_add(1, Ordering::SeqCst);
                                let what = match other {
                                    Ok(r) => format!("status {} (wanted {want})", r.status),
                                    Err(e) => format!("{e:#}"),
                                };
                                let mut f = c.failures.lock();
                                if f.len() < 10 {
                                    f.push(format!("GET {target}: {what}"));
                                }
                            }
                        }
                        next += period;
                        let now = Instant::now();
                        if next > now {
                            thread::sleep(next - now);
                        } else {
                            next = now;
                        }
                    }
                })
            })
            .collect();
        Load {
            counters,
            stop,
            threads,
        }
    }

    /// Requests answered so far (as wanted or not).
    pub(crate) fn answered(&self) -> u64 {
        let c = &self.counters;
        c.passed.load(Ordering::SeqCst)
            + c.blocked.load(Ordering::SeqCst)
            + c.failed.load(Ordering::SeqCst)
    }

    /// Stops the workers and waits for their last requests.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Waits until the UDP echo server at `addr` echoes.
pub(crate) fn udp_echoes(addr: SocketAddr) -> Result<bool> {
    let probe = UdpSocket::bind("127.0.0.1:0")?;
    probe.set_read_timeout(Some(Duration::from_millis(100)))?;
    probe.send_to(b"ping", addr)?;
    let mut buf = [0u8; 16];
    Ok(matches!(probe.recv_from(&mut buf), Ok((4, _))))
}
