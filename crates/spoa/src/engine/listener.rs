//! Where HAProxy connects: a TCP or `unix://` listener, and the accept loop that starts one
//! connection task per accepted socket.

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinSet;

use super::ack::AckSink;
use super::task::serve_split;
use super::Shared;
use crate::config::Bind;

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

    /// Waits for the next connection.
    async fn accept(&self) -> io::Result<(Accepted, Option<IpAddr>)> {
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

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl Accepted {
    /// Starts the connection's task in `conns`: the evaluation threads share its write half.
    fn spawn(self, peer: Option<IpAddr>, shared: Arc<Shared>, conns: &mut JoinSet<()>) {
        shared.metrics.connections_total.inc();
        match self {
            Accepted::Tcp(s) => {
                let _ = s.set_nodelay(true);
                let (rd, wr) = s.into_split();
                let sink = AckSink::for_socket(wr);
                conns.spawn(serve_split(rd, sink.writer(), sink, peer, shared));
            }
            Accepted::Unix(s) => {
                let (rd, wr) = s.into_split();
                let sink = AckSink::for_socket(wr);
                conns.spawn(serve_split(rd, sink.writer(), sink, peer, shared));
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Accepts connections until the process is exiting, then waits (bounded) for every
/// connection task to send its goodbye.
pub async fn serve(listener: Listener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    let exiting = shared.handle.exiting();
    tokio::pin!(exiting);
    loop {
        tokio::select! {
            _ = &mut exiting => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((io, peer)) => io.spawn(peer, Arc::clone(&shared), &mut conns),
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
}
