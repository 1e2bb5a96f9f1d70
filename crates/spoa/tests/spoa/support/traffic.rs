//! Concurrent HTTP load through HAProxy for the termination tests: `clients` keep-alive
//! clients send a mix of benign requests and attacks, and every answer is classified:
//!
//! - **ok**: the WAF verdict came back (200 for benign requests, 403 for attacks);
//! - **spoe_errors**: HAProxy answered 500, which the documented fail-closed configuration
//!   does only when `txn.coraza.error` is set, i.e. the answer came from an SPOE error and
//!   not from the WAF (the origin never answers 500);
//! - **other**: anything else (a wrong verdict, a connection HAProxy closed, a timeout).
//!
//! The mix, by request number: 1 in 10 an SQL injection in the query (GET, 403), 1 in 10 an
//! XSS in a form body (POST, 403), 1 in 10 a benign form POST (200), the rest benign GETs with
//! a few headers (200).

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Counters of a [`Load`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Requests answered with the WAF's verdict.
    pub ok: AtomicU64,
    /// Requests answered 500 (an SPOE error, fail-closed).
    pub spoe_errors: AtomicU64,
    /// Other failures.
    pub other: AtomicU64,
    /// Attacks answered 403 (part of `ok`).
    pub blocked: AtomicU64,
    /// The longest a request took (sent to answered, or to its failure), in microseconds.
    pub slowest_us: AtomicU64,
}

/// What a load run saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Requests sent and answered (or failed).
    pub requests: u64,
    /// With the WAF's verdict.
    pub ok: u64,
    /// Answered from an SPOE error (500).
    pub spoe_errors: u64,
    /// Other failures.
    pub other: u64,
    /// Attacks blocked (403).
    pub blocked: u64,
}

impl Totals {
    /// Every request that did not get the WAF's verdict.
    pub(crate) fn failed(&self) -> u64 {
        self.spoe_errors + self.other
    }
}

impl std::ops::AddAssign for Totals {
    /// Two runs' totals (a test that stops and starts its load).
    fn add_assign(&mut self, o: Totals) {
        self.requests += o.requests;
        self.ok += o.ok;
        self.spoe_errors += o.spoe_errors;
        self.other += o.other;
        self.blocked += o.blocked;
    }
}

impl std::fmt::Display for Totals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests: {} with the WAF verdict ({} attacks blocked), {} SPOE errors (500), {} other failures",
            self.requests, self.ok, self.blocked, self.spoe_errors, self.other
        )
    }
}

/// Running clients; [`Load::stop`] joins them.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<JoinHandle<()>>,
    started: Instant,
}

impl Load {
    /// Starts `clients` clients against HAProxy at `addr`.
    pub(crate) fn start(addr: SocketAddr, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let failures = Arc::new(Mutex::new(Vec::new()));
        let next = Arc::new(AtomicU64::new(0));
        let threads = (0..clients)
            .map(|_| {
                let (stop, counters, failures, next) = (
                    stop.clone(),
                    counters.clone(),
                    failures.clone(),
                    next.clone(),
                );
                std::thread::spawn(move || client(addr, &stop, &counters, &failures, &next))
            })
            .collect();
        Load {
            stop,
            counters,
            failures,
            threads,
            started: Instant::now(),
        }
    }

    /// Requests finished so far (whatever their outcome).
    pub(crate) fn done(&self) -> u64 {
        let c = &self.counters;
        c.ok.load(Ordering::SeqCst)
            + c.spoe_errors.load(Ordering::SeqCst)
            + c.other.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests in all have finished. Panics after `timeout`, or if the
    /// traffic stalls for 30 s.
    pub(crate) fn wait_until(&self, n: u64, timeout: Duration) {
        let end = Instant::now() + timeout;
        let mut last = (self.done(), Instant::now());
        while self.done() < n {
            let now = Instant::now();
            assert!(now < end, "only {} of {n} requests done", self.done());
            if self.done() != last.0 {
                last = (self.done(), now);
            }
            assert!(
                now - last.1 < Duration::from_secs(30),
                "traffic stalled at {} requests",
                last.0
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for `n` more requests.
    pub(crate) fn wait_more(&self, n: u64, timeout: Duration) {
        self.wait_until(self.done() + n, timeout);
    }

    /// The longest a request has taken so far (sent to answered, or to its failure).
    pub(crate) fn slowest(&self) -> Duration {
        Duration::from_micros(self.counters.slowest_us.load(Ordering::SeqCst))
    }

    /// Forgets the longest request so far (to measure a window of the run).
    pub(crate) fn reset_slowest(&self) {
        self.counters.slowest_us.store(0, Ordering::SeqCst);
    }

    /// The totals so far (the clients keep running).
    pub(crate) fn totals(&self) -> Totals {
        let c = &self.counters;
        let (ok, spoe_errors, other) = (
            c.ok.load(Ordering::SeqCst),
            c.spoe_errors.load(Ordering::SeqCst),
            c.other.load(Ordering::SeqCst),
        );
        Totals {
            requests: ok + spoe_errors + other,
            ok,
            spoe_errors,
            other,
            blocked: c.blocked.load(Ordering::SeqCst),
        }
    }

    /// [`Load::stop`], and the longest a request took (since the last reset), the requests
    /// that were in flight when it was called included.
    pub(crate) fn stop_with_slowest(self) -> (Totals, Duration) {
        let counters = self.counters.clone();
        let totals = self.stop();
        let slowest = Duration::from_micros(counters.slowest_us.load(Ordering::SeqCst));
        (totals, slowest)
    }

    /// Stops the clients (each finishes its request) and returns the totals.
    pub(crate) fn stop(mut self) -> Totals {
        self.stop.store(true, Ordering::SeqCst);
        for t in std::mem::take(&mut self.threads) {
            let _ = t.join();
        }
        let c = &self.counters;
        let totals = Totals {
            requests: 0,
            ok: c.ok.load(Ordering::SeqCst),
            spoe_errors: c.spoe_errors.load(Ordering::SeqCst),
            other: c.other.load(Ordering::SeqCst),
            blocked: c.blocked.load(Ordering::SeqCst),
        };
        let totals = Totals {
            requests: totals.ok + totals.spoe_errors + totals.other,
            ..totals
        };
        let elapsed = self.started.elapsed();
        eprintln!(
            "load: {totals} in {:.1}s ({:.0}/s)",
            elapsed.as_secs_f64(),
            totals.requests as f64 / elapsed.as_secs_f64().max(0.001)
        );
        for f in self.failures.lock().iter() {
            eprintln!("load: failed: {f}");
        }
        totals
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One request of the mix: (method, target, body, expected status).
fn request(i: u64, client: usize) -> (&'static str, String, String, u16) {
    match i % 10 {
        0 => (
            "GET",
            format!("/search?c={client}&q=1'%20OR%20'1'='1'%20--%20&n={i}"),
            String::new(),
            403,
        ),
        5 => (
            "POST",
            format!("/comment?n={i}"),
            "text=%3Cscript%3Ealert(document.cookie)%3C%2Fscript%3E&who=eve".into(),
            403,
        ),
        3 => (
            "POST",
            format!("/form?n={i}"),
            format!("name=alice&city=Paris&note=hello+world+{i}"),
            200,
        ),
        _ => (
            "GET",
            format!("/shop/items/{i}?c={client}&page=2&sort=price"),
            String::new(),
            200,
        ),
    }
}

fn client(
    addr: SocketAddr,
    stop: &AtomicBool,
    counters: &Counters,
    failures: &Mutex<Vec<String>>,
    next: &AtomicU64,
) {
    let id = next.fetch_add(1, Ordering::SeqCst) as usize;
    let mut conn: Option<Conn> = None;
    while !stop.load(Ordering::SeqCst) {
        let i = next.fetch_add(1, Ordering::SeqCst);
        let (method, target, body, want) = request(i, id);
        // A keep-alive connection HAProxy closed between two requests fails on first use:
        // like a browser, retry that once on a fresh connection.
        let mut result = Err(std::io::Error::other("not sent"));
        let sent = Instant::now();
        for attempt in 0..2 {
            let fresh = conn.is_none();
            if conn.is_none() {
                conn = Conn::connect(addr).ok();
            }
            let Some(c) = conn.as_mut() else {
                result = Err(std::io::Error::other("connect failed"));
                break;
            };
            result = c.send(method, &target, &body);
            match &result {
                Ok((_, close)) => {
                    if *close {
                        conn = None;
                    }
                    break;
                }
                Err(_) => {
                    conn = None;
                    if fresh || attempt == 1 {
                        break;
                    }
                }
            }
        }
        let took = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        counters.slowest_us.fetch_max(took, Ordering::SeqCst);
        match result {
            Ok((status, _)) if status == want => {
                counters.ok.fetch_add(1, Ordering::SeqCst);
                if want == 403 {
                    counters.blocked.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok((500, _)) => {
                counters.spoe_errors.fetch_add(1, Ordering::SeqCst);
                note(failures, format!("{method} {target}: 500 (SPOE error)"));
            }
            Ok((status, _)) => {
                counters.other.fetch_add(1, Ordering::SeqCst);
                note(
                    failures,
                    format!("{method} {target}: {status}, expected {want}"),
                );
            }
            Err(e) => {
                counters.other.fetch_add(1, Ordering::SeqCst);
                note(failures, format!("{method} {target}: {e}"));
            }
        }
    }
}

fn note(failures: &Mutex<Vec<String>>, what: String) {
    let mut f = failures.lock();
    if f.len() < 50 {
        f.push(what);
    }
}

/// A keep-alive HTTP/1.1 connection.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn connect(addr: SocketAddr) -> std::io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        // HAProxy answers within `timeout processing` (2 s) plus the origin's time: a request
        // without an answer after 15 s is a failure (and a stop does not wait longer).
        s.set_read_timeout(Some(Duration::from_secs(15)))?;
        Ok(Conn {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    /// Sends one request; returns the status and whether the server closes the connection.
    fn send(&mut self, method: &str, target: &str, body: &str) -> std::io::Result<(u16, bool)> {
        let mut req = format!(
            "{method} {target} HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) lastcall-test\r\nAccept: text/html,application/xhtml+xml\r\nAccept-Language: en-US,en;q=0.5\r\n"
        );
        if method == "POST" {
            req.push_str(&format!(
                "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        req.push_str("\r\n");
        req.push_str(body);
        self.writer.write_all(req.as_bytes())?;
        super::read_response(&mut self.reader)
    }
}
