//! The SPOP connection engine: listeners (TCP, `unix://`), one task per connection,
//! pipelined NOTIFYs evaluated concurrently (bounded per connection and globally, on the
//! blocking pool), every NOTIFY ACKed, every frame written whole, and the drain recipe of
//! `docs/spoa.md`:
//!
//! - from the trigger (Announcing), health-check HELLOs get AGENT-DISCONNECT, so HAProxy marks
//!   this server DOWN and stops choosing it, while existing connections are served normally;
//! - in Refusing, new HELLOs are refused, and each connection is closed as soon as it is idle
//!   (nothing in flight, nothing unread) with its last ACK and an AGENT-DISCONNECT (status 0)
//!   in one write;
//! - at the deadline (exiting) whatever is left is closed with AGENT-DISCONNECT.
//!
//! Under `--on-sigterm linger` the phase is Lingering and nothing is refused.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use lastcall::{Handle, PeerId, Phase};
use spop::frame::Message;
use spop::TypedData;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::config::Bind;
use crate::conn::{CloseReason, Conn, Event, HelloPolicy};
use crate::frame;
use crate::metrics::Metrics;
use crate::waf::{Handler, AGENT_ERROR};

/// Engine limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest frame we accept (min'd with HAProxy's in the HELLO).
    pub max_frame_size: u32,
    /// Concurrent evaluations per connection; reading pauses at the bound.
    pub max_inflight_per_connection: usize,
    /// A frame started but not finished within this time closes the connection (status 2).
    pub partial_frame_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_size: spop::MAX_FRAME_SIZE_LIMIT,
            max_inflight_per_connection: 64,
            partial_frame_timeout: Duration::from_secs(30),
        }
    }
}

/// What every connection task shares.
pub struct Shared {
    handler: Arc<dyn Handler>,
    metrics: Arc<Metrics>,
    handle: Handle,
    pool: Arc<Semaphore>,
    limits: Limits,
}

impl Shared {
    /// `workers` bounds concurrent evaluations across all connections.
    pub fn new(
        handler: Arc<dyn Handler>,
        metrics: Arc<Metrics>,
        handle: Handle,
        workers: usize,
        limits: Limits,
    ) -> Arc<Self> {
        Arc::new(Shared {
            handler,
            metrics,
            handle,
            pool: Arc::new(Semaphore::new(workers.max(1))),
            limits,
        })
    }

    fn policy(&self) -> HelloPolicy {
        let phase = self.handle.phase();
        let exiting = self.handle.is_exiting();
        HelloPolicy {
            refuse_healthchecks: matches!(phase, Phase::Announcing | Phase::Refusing),
            refuse_all: phase == Phase::Refusing || exiting,
        }
    }

    fn refusing(&self) -> bool {
        self.handle.phase() == Phase::Refusing
    }
}

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
            accepted = accept(&listener) => match accepted {
                Ok((io, peer)) => {
                    shared.metrics.connections_total.inc();
                    let shared = Arc::clone(&shared);
                    match io {
                        Accepted::Tcp(s) => {
                            let _ = s.set_nodelay(true);
                            conns.spawn(serve_conn(s, peer, shared));
                        }
                        Accepted::Unix(s) => {
                            conns.spawn(serve_conn(s, peer, shared));
                        }
                    }
                }
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

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn accept(l: &Listener) -> io::Result<(Accepted, Option<IpAddr>)> {
    match l {
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

type AckFuture = Pin<Box<dyn Future<Output = Vec<u8>> + Send>>;

/// Serves one connection to its end.
pub async fn serve_conn<S>(io: S, peer: Option<IpAddr>, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let mut conn = Conn::new(shared.limits.max_frame_size);
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut inflight: JoinSet<Vec<u8>> = JoinSet::new();
    let mut _session: Option<(lastcall::SessionGuard, ConnGauge)> = None;
    let mut partial_since: Option<Instant> = None;
    let mut state_rx = PhaseWatch::new(&shared.handle);
    let per_conn = shared.limits.max_inflight_per_connection.max(1);
    let mut eof = false;

    loop {
        // Turn buffered bytes into events while there is room for more evaluations.
        while inflight.len() < per_conn {
            let Some(ev) = conn.poll(&mut buf, shared.policy()) else {
                break;
            };
            match ev {
                Event::Ready { reply, negotiated } => {
                    tracing::debug!(?peer, max_frame_size = negotiated.max_frame_size, engine = ?negotiated.engine_id, "SPOP connection ready");
                    if wr.write_all(&reply).await.is_err() {
                        return;
                    }
                    let id = peer.map_or_else(|| PeerId::named("unix"), PeerId::from);
                    _session = Some((shared.handle.session(id), ConnGauge::new(&shared.metrics)));
                }
                Event::Notify {
                    stream_id,
                    frame_id,
                    messages,
                } => {
                    inflight.spawn(evaluate(
                        Arc::clone(&shared),
                        stream_id,
                        frame_id,
                        messages,
                        conn.max_frame_size(),
                    ));
                }
                Event::Close { reply, reason } => {
                    close(&shared, &mut wr, reply, &reason, peer).await;
                    return;
                }
            }
        }
        partial_since = match (buf.is_empty(), partial_since) {
            (true, _) => None,
            (false, None) => Some(Instant::now()),
            (false, since) => since,
        };
        if eof && inflight.is_empty() {
            if let Some(Event::Close { reply, reason }) = conn.on_eof(&buf) {
                close(&shared, &mut wr, reply, &reason, peer).await;
            }
            return;
        }
        // Refusing: an idle connection says goodbye now.
        if shared.refusing() && conn.is_ready() && inflight.is_empty() && buf.is_empty() {
            if nothing_unread(&mut rd, &mut buf).await {
                let bye = conn.goodbye("draining");
                let _ = wr.write_all(&bye).await;
                let _ = wr.shutdown().await;
                return;
            }
            continue;
        }
        let can_read = !eof && inflight.len() < per_conn;
        let timeout_at = partial_since.map(|s| s + shared.limits.partial_frame_timeout);
        tokio::select! {
            biased;
            () = shared.handle.exiting() => {
                let bye = conn.goodbye("shutting down");
                let _ = wr.write_all(&bye).await;
                let _ = wr.shutdown().await;
                return;
            }
            Some(done) = inflight.join_next(), if !inflight.is_empty() => {
                let mut out = done.unwrap_or_default();
                // The last ACK of an idle connection while refusing carries the goodbye in
                // the same write.
                if shared.refusing() && conn.is_ready() && inflight.is_empty() && buf.is_empty()
                    && nothing_unread(&mut rd, &mut buf).await
                {
                    out.extend_from_slice(&conn.goodbye("draining"));
                    let _ = wr.write_all(&out).await;
                    let _ = wr.shutdown().await;
                    return;
                }
                if !out.is_empty() && wr.write_all(&out).await.is_err() {
                    return;
                }
            }
            read = rd.read_buf(&mut buf), if can_read => match read {
                Ok(0) | Err(_) => eof = true,
                Ok(_) => {}
            },
            () = sleep_until(timeout_at), if timeout_at.is_some() => {
                if let Event::Close { reply, reason } = conn.on_read_timeout() {
                    close(&shared, &mut wr, reply, &reason, peer).await;
                }
                return;
            }
            () = state_rx.changed() => {}
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// True when no bytes are waiting on the socket; bytes that are waiting are moved into `buf`.
async fn nothing_unread<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut BytesMut) -> bool {
    use std::task::Poll;
    let mut fut = std::pin::pin!(rd.read_buf(buf));
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Pending => Poll::Ready(true),
        // EOF or error: nothing more will come; the caller's next read sees it too.
        Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => Poll::Ready(true),
        Poll::Ready(Ok(_)) => Poll::Ready(false),
    })
    .await
}

async fn close<W: AsyncWrite + Unpin>(
    shared: &Shared,
    wr: &mut W,
    reply: Vec<u8>,
    reason: &CloseReason,
    peer: Option<IpAddr>,
) {
    match reason {
        CloseReason::HealthCheck => {}
        CloseReason::Refused => shared.handle.record_refused(),
        CloseReason::PeerDisconnect(status) => {
            tracing::debug!(?peer, status, "HAPROXY-DISCONNECT answered");
        }
        CloseReason::Protocol(e) => {
            shared.metrics.rejected(e.metric_reason());
            tracing::warn!(
                ?peer,
                status = e.status.to_u32(),
                "closing connection: {}",
                e.reason
            );
        }
    }
    let _ = wr.write_all(&reply).await;
    let _ = wr.shutdown().await;
}

fn evaluate(
    shared: Arc<Shared>,
    stream_id: u64,
    frame_id: u64,
    messages: Vec<Message>,
    max_frame_size: u32,
) -> AckFuture {
    Box::pin(async move {
        let started = Instant::now();
        shared.metrics.inflight.inc();
        let vars = match Arc::clone(&shared.pool).acquire_owned().await {
            Ok(permit) => {
                let handler = Arc::clone(&shared.handler);
                tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    handler.handle(&messages)
                })
                .await
                .unwrap_or_else(|e| {
                    tracing::error!("evaluation panicked: {e}");
                    vec![("error", TypedData::Int64(AGENT_ERROR))]
                })
            }
            Err(_) => vec![("error", TypedData::Int64(AGENT_ERROR))],
        };
        shared.metrics.inflight.dec();
        shared.metrics.observe(started.elapsed().as_secs_f64());
        let mut out = Vec::new();
        frame::encode_ack(stream_id, frame_id, &vars, max_frame_size, &mut out);
        out
    })
}

/// Counts an open (handshaken) connection in `spoa_connections` while alive.
struct ConnGauge(Arc<Metrics>);

impl ConnGauge {
    fn new(m: &Arc<Metrics>) -> Self {
        m.connections.inc();
        ConnGauge(Arc::clone(m))
    }
}

impl Drop for ConnGauge {
    fn drop(&mut self) {
        self.0.connections.dec();
    }
}

/// Wakes a connection when the lifecycle phase changes or the process is exiting.
struct PhaseWatch {
    handle: Handle,
    last: (Phase, bool),
}

impl PhaseWatch {
    fn new(handle: &Handle) -> Self {
        PhaseWatch {
            handle: handle.clone(),
            last: (handle.phase(), handle.is_exiting()),
        }
    }

    /// Resolves when the phase differs from the last one seen.
    async fn changed(&mut self) {
        loop {
            let now = (self.handle.phase(), self.handle.is_exiting());
            if now != self.last {
                self.last = now;
                return;
            }
            if now.0 == Phase::Serving {
                self.handle.drain_started().await;
            } else if now.0 != Phase::Refusing {
                tokio::select! {
                    () = self.handle.refusing() => {}
                    () = self.handle.exiting() => {}
                }
            } else {
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! In-process tests of the connection engine over `tokio::io::duplex`, with a trivial
    //! handler (the WAF itself is tested in `waf` and end to end through HAProxy).
    use super::*;
    use crate::frame::{decode_agent_frame, AgentFrame};
    use lastcall::{Lifecycle, OnSigterm, TerminationConfig, Trigger};
    use std::sync::Mutex;
    use tokio::io::DuplexStream;

    /// Answers `verdict=ok`; blocks while the gate is closed.
    struct Gated(Mutex<std::sync::mpsc::Receiver<()>>);

    impl Handler for Gated {
        fn handle(&self, _: &[Message]) -> crate::waf::Vars {
            if let Ok(rx) = self.0.lock() {
                let _ = rx.recv_timeout(Duration::from_secs(20));
            }
            vec![("verdict", TypedData::String("ok".into()))]
        }
    }

    struct Open;
    impl Handler for Open {
        fn handle(&self, _: &[Message]) -> crate::waf::Vars {
            Vec::new()
        }
    }

    fn shared(handler: Arc<dyn Handler>, handle: &Handle) -> Arc<Shared> {
        Shared::new(
            handler,
            Arc::new(Metrics::default()),
            handle.clone(),
            2,
            Limits::default(),
        )
    }

    fn connect(shared: &Arc<Shared>) -> DuplexStream {
        connect_counting(shared).0
    }

    /// Also returns the size of every `poll_write` the agent made on this connection.
    fn connect_counting(shared: &Arc<Shared>) -> (DuplexStream, Arc<Mutex<Vec<usize>>>) {
        let (client, server) = tokio::io::duplex(1 << 16);
        let writes = Arc::new(Mutex::new(Vec::new()));
        let io = Counting {
            inner: server,
            writes: Arc::clone(&writes),
        };
        tokio::spawn(serve_conn(
            io,
            Some([127, 0, 0, 1].into()),
            Arc::clone(shared),
        ));
        (client, writes)
    }

    struct Counting {
        inner: DuplexStream,
        writes: Arc<Mutex<Vec<usize>>>,
    }

    impl AsyncRead for Counting {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Counting {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<io::Result<usize>> {
            let r = Pin::new(&mut self.inner).poll_write(cx, buf);
            if let std::task::Poll::Ready(Ok(n)) = &r {
                self.writes.lock().unwrap().push(*n);
            }
            r
        }
        fn poll_flush(
            mut self: Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// Reads frames until `n` are decoded or EOF; also returns how many reads it took.
    async fn read_frames(c: &mut DuplexStream, n: usize) -> (Vec<AgentFrame>, usize, bool) {
        let mut buf = BytesMut::with_capacity(1 << 16);
        let mut out = Vec::new();
        let mut reads = 0;
        loop {
            while let Some(f) = decode_agent_frame(&mut buf).unwrap() {
                out.push(f);
            }
            if out.len() >= n {
                return (out, reads, false);
            }
            // Longer than the agent's 30 s partial-frame timeout (the clock may be paused).
            let got = tokio::time::timeout(Duration::from_secs(60), c.read_buf(&mut buf))
                .await
                .expect("agent answered in time")
                .unwrap();
            reads += 1;
            if got == 0 {
                return (out, reads, true);
            }
        }
    }

    async fn hello(c: &mut DuplexStream, healthcheck: bool) -> Vec<AgentFrame> {
        let mut v = Vec::new();
        frame::encode_haproxy_hello(16380, healthcheck, &mut v);
        c.write_all(&v).await.unwrap();
        read_frames(c, 1).await.0
    }

    fn notify(sid: u64) -> Vec<u8> {
        let mut v = Vec::new();
        let msg = Message {
            name: "coraza-req".into(),
            args: vec![],
        };
        frame::encode_notify(sid, 1, &msg, &mut v);
        v
    }

    #[tokio::test]
    async fn refusing_closes_with_last_ack_and_disconnect_in_one_write() {
        let lc = Lifecycle::without_signals(TerminationConfig::new(
            OnSigterm::Drain,
            Duration::ZERO,
            Duration::from_secs(30),
        ));
        let handle = lc.handle();
        tokio::spawn(lc.run_with(futures_never()));
        let (tx, rx) = std::sync::mpsc::channel();
        let s = shared(Arc::new(Gated(Mutex::new(rx))), &handle);

        let (mut busy, busy_writes) = connect_counting(&s);
        assert!(matches!(
            hello(&mut busy, false).await[..],
            [AgentFrame::Hello(_)]
        ));
        let mut idle = connect(&s);
        assert!(matches!(
            hello(&mut idle, false).await[..],
            [AgentFrame::Hello(_)]
        ));
        busy.write_all(&notify(7)).await.unwrap();
        // Wait until the evaluation is in flight.
        while s.metrics.inflight.get() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        handle.start_drain(Trigger::Sigterm);
        handle.refusing().await;

        // The idle connection says goodbye at once.
        let (frames, _, eof) = read_frames(&mut idle, 2).await;
        assert!(
            matches!(frames[..], [AgentFrame::Disconnect(0, _)]),
            "{frames:?}"
        );
        assert!(eof);

        // New connections and health checks are refused politely.
        let mut late = connect(&s);
        assert!(matches!(
            hello(&mut late, false).await[..],
            [AgentFrame::Disconnect(0, _)]
        ));

        // The busy one finishes its evaluation: ACK + DISCONNECT arrive in one read.
        tx.send(()).unwrap();
        let (frames, _, _) = read_frames(&mut busy, 2).await;
        match &frames[..] {
            [AgentFrame::Ack(7, 1, vars), AgentFrame::Disconnect(0, _)] => {
                assert_eq!(vars[0].0, "verdict");
            }
            other => panic!("{other:?}"),
        }
        // Writes on this connection: AGENT-HELLO, then ACK + DISCONNECT together.
        let writes = busy_writes.lock().unwrap().clone();
        assert_eq!(writes.len(), 2, "one write per frame group: {writes:?}");
        let (rest, _, eof) = read_frames(&mut busy, 1).await;
        assert!(
            rest.is_empty() && eof,
            "closed after the DISCONNECT: {rest:?}"
        );
    }

    #[tokio::test]
    async fn announcing_refuses_only_health_checks() {
        let lc = Lifecycle::without_signals(TerminationConfig::new(
            OnSigterm::Drain,
            Duration::from_secs(60),
            Duration::from_secs(120),
        ));
        let handle = lc.handle();
        tokio::spawn(lc.run_with(futures_never()));
        let s = shared(Arc::new(Open), &handle);
        let mut hc = connect(&s);
        assert!(matches!(
            hello(&mut hc, true).await[..],
            [AgentFrame::Hello(_)]
        ));

        handle.start_drain(Trigger::Sigterm);
        handle.drain_started().await;
        let mut hc = connect(&s);
        assert!(matches!(
            hello(&mut hc, true).await[..],
            [AgentFrame::Disconnect(0, _)]
        ));
        let mut normal = connect(&s);
        assert!(matches!(
            hello(&mut normal, false).await[..],
            [AgentFrame::Hello(_)]
        ));
        normal.write_all(&notify(1)).await.unwrap();
        let (frames, _, _) = read_frames(&mut normal, 1).await;
        assert!(matches!(frames[..], [AgentFrame::Ack(1, 1, _)]));
    }

    #[tokio::test(start_paused = true)]
    async fn unfinished_frame_times_out_with_status_2() {
        let lc = Lifecycle::without_signals(TerminationConfig::new(
            OnSigterm::Drain,
            Duration::ZERO,
            Duration::from_secs(30),
        ));
        let s = shared(Arc::new(Open), &lc.handle());
        let mut c = connect(&s);
        c.write_all(&[0, 0, 0, 50, 1]).await.unwrap();
        let (frames, _, eof) = read_frames(&mut c, 1).await;
        assert!(
            matches!(frames[..], [AgentFrame::Disconnect(2, _)]),
            "{frames:?}"
        );
        let _ = eof;
    }

    fn futures_never() -> impl futures::Stream<Item = Trigger> + Send + 'static {
        futures::stream::pending()
    }
}
