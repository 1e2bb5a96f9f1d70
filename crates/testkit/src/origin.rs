//! A real HTTP/1.1 origin on 127.0.0.1 for the proxies under test to forward to.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use parking_lot::Mutex;

use crate::http::read_headers_and_body;

/// Marker the origin puts in `/leak` responses; the test rules block responses carrying it.
pub const LEAK_HEADER: &str = "x-secret-leak";

/// A real HTTP/1.1 origin on 127.0.0.1 (one thread per connection, keep-alive). Answers
/// every request with 200 and `origin ok <method> <path> <body-length>`; `/leak` adds the
/// [`LEAK_HEADER`] header and a body with an SQL error message. Stopped when dropped.
pub struct Origin {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Requests answered.
    pub served: Arc<AtomicU64>,
    /// Every request it began to read, in order: `(method, target, body bytes)`, the body
    /// `None` until it was read whole (a request cut short stays `None`).
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

/// One request the [`Origin`] began to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The method.
    pub method: String,
    /// The request target.
    pub target: String,
    /// The body's length once read whole.
    pub body: Option<usize>,
}

impl Origin {
    /// The requests it began to read whose target starts with `prefix`.
    pub fn seen(&self, prefix: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .iter()
            .filter(|s| s.target.starts_with(prefix))
            .cloned()
            .collect()
    }
}

impl Origin {
    /// Starts the origin. Panics if it cannot listen.
    pub fn start() -> Origin {
        Origin::try_start().unwrap_or_else(|e| panic!("origin: {e}"))
    }

    /// Starts the origin, or says why it cannot listen.
    pub fn try_start() -> std::io::Result<Origin> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, n, log) = (stop.clone(), served.clone(), seen.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(conn) = conn {
                    let (n, log) = (n.clone(), log.clone());
                    thread::spawn(move || origin_conn(conn, &n, &log));
                }
            }
        });
        Ok(Origin {
            addr,
            stop,
            served,
            seen,
        })
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// Serves one keep-alive connection until the client closes it or asks to.
fn origin_conn(conn: TcpStream, served: &AtomicU64, seen: &Mutex<Vec<Seen>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let mut writer = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_owned();
        let path = parts.next().unwrap_or("").to_owned();
        let at = {
            let mut seen = seen.lock();
            seen.push(Seen {
                method: method.clone(),
                target: path.clone(),
                body: None,
            });
            seen.len() - 1
        };
        let Ok((len, close)) = read_headers_and_body(&mut reader) else {
            return;
        };
        seen.lock()[at].body = Some(len);
        served.fetch_add(1, Ordering::SeqCst);
        let (extra, text) = if path.starts_with("/leak") {
            (
                format!("{LEAK_HEADER}: yes\r\n"),
                "<html>You have an error in your SQL syntax; check the manual that corresponds to your MySQL server version</html>\n".to_owned(),
            )
        } else {
            (String::new(), format!("origin ok {method} {path} {len}\n"))
        };
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n{extra}\r\n{text}",
            text.len()
        );
        if writer.write_all(resp.as_bytes()).is_err() || close {
            return;
        }
    }
}
