//! Where HAProxy connects: a TCP or `unix://` listener, accepted from by lastcall's
//! [`Daemon`](lastcall::Daemon) (which owns the accept loop and waits for every connection
//! task after the exit decision), and the start of one connection's task.

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use lastcall::Watch;
use tokio::net::{TcpListener, UnixListener};

use super::ack::AckSink;
use super::task::{serve_split, Unread};
use super::Bind;
use super::Engine;

/// A bound listener.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// Unix socket (the path is removed on drop).
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds `bind`. A stale Unix socket file is replaced.
    pub async fn bind(bind: &Bind) -> io::Result<Self> {
        match bind {
            Bind::Tcp(addr) => Ok(Listener::Tcp(TcpListener::bind(addr.as_str()).await?)),
            Bind::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    use std::os::unix::fs::FileTypeExt;
                    if meta.file_type().is_socket() {
                        std::fs::remove_file(path)?;
                    }
                }
                Ok(Listener::Unix(UnixListener::bind(path)?, path.clone()))
            }
        }
    }

    /// Where it listens, for logs and tests.
    pub fn local_addr(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|e| e.to_string()),
            Listener::Unix(_, p) => format!("unix://{}", p.display()),
        }
    }

    /// Waits for the next connection (cancel-safe, as tokio's `accept`).
    async fn next(&self) -> io::Result<(Accepted, Option<IpAddr>)> {
        match self {
            Listener::Tcp(l) => {
                let (s, a) = l.accept().await?;
                Ok((Accepted::Tcp(s), Some(a.ip())))
            }
            Listener::Unix(l, _) => {
                let (s, _) = l.accept().await?;
                Ok((Accepted::Unix(s), None))
            }
        }
    }
}

impl lastcall::Accept for Listener {
    type Conn = (Accepted, Option<IpAddr>);

    fn accept(&mut self) -> impl std::future::Future<Output = io::Result<Self::Conn>> + Send {
        self.next()
    }

    fn describe(&self) -> String {
        self.local_addr()
    }
}

/// An accepted connection.
#[derive(Debug)]
pub enum Accepted {
    /// Over TCP.
    Tcp(tokio::net::TcpStream),
    /// Over a Unix socket.
    Unix(tokio::net::UnixStream),
}

/// Serves one accepted connection to its end (what the accept loop runs for each): the
/// evaluation threads share its write half, to write their ACKs themselves.
pub async fn serve_accepted(
    (io, peer): (Accepted, Option<IpAddr>),
    engine: Arc<Engine>,
    watch: Watch,
) {
    engine.metrics.connections_total.inc();
    match io {
        Accepted::Tcp(s) => {
            let _ = s.set_nodelay(true);
            let addr = s.peer_addr().map_or_else(
                |_| peer.map_or_else(String::new, |ip| ip.to_string()),
                |a| a.to_string(),
            );
            let (rd, wr) = s.into_split();
            let sink = AckSink::for_socket(wr);
            serve_split(rd, sink.writer(), sink, (peer, addr), engine, watch).await;
        }
        Accepted::Unix(s) => {
            let (rd, wr) = s.into_split();
            let sink = AckSink::for_socket(wr);
            serve_split(
                rd,
                sink.writer(),
                sink,
                (peer, "unix".into()),
                engine,
                watch,
            )
            .await;
        }
    }
}

/// A socket's read half asked directly whether bytes wait ([`Unread`]).
fn peek_socket<S: std::os::fd::AsFd>(s: &S) -> Option<bool> {
    let sock = socket2::SockRef::from(s);
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    match sock.peek(&mut byte) {
        Ok(n) => Some(n > 0),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(false),
        Err(_) => Some(false),
    }
}

impl Unread for tokio::net::tcp::OwnedReadHalf {
    fn unread(&self) -> Option<bool> {
        peek_socket(self.as_ref())
    }
}

impl Unread for tokio::net::unix::OwnedReadHalf {
    fn unread(&self) -> Option<bool> {
        peek_socket(self.as_ref())
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}
