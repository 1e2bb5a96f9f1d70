//! The SPOP connection engine: listeners (TCP, `unix://`), one task per connection,
//! pipelined NOTIFYs evaluated concurrently (bounded per connection, and globally by the
//! evaluation threads of [`crate::pool`]; NOTIFYs that need no engine work are answered on
//! the connection task itself), every NOTIFY ACKed, every frame written whole, and the drain
//! recipe of `docs/spoa.md`:
//!
//! - from the trigger (Announcing), health-check HELLOs get AGENT-DISCONNECT, so HAProxy marks
//!   this server DOWN and stops choosing it, while existing connections are served normally;
//! - in Refusing, new HELLOs are refused, and each connection is closed as soon as it is idle
//!   (nothing in flight, nothing unread) with its last ACK and an AGENT-DISCONNECT (status 0)
//!   in one write;
//! - at the deadline (exiting) whatever is left is closed with AGENT-DISCONNECT.
//!
//! Under `--on-sigterm linger` the phase is Lingering and nothing is refused.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use lastcall::{Handle, PeerId, Phase};
use prometheus_client::metrics::gauge::Gauge;
use spop::frame::Message;
use spop::TypedData;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::task::JoinSet;

use crate::config::{Bind, Evaluation};
use crate::conn::{CloseReason, Conn, Event, HelloPolicy};
use crate::frame;
use crate::metrics::Metrics;
use crate::out;
use crate::pool::{Pool, SlotFuture, Work};
use crate::waf::{Handler, Vars, AGENT_ERROR};

/// Engine limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest frame we accept (min'd with HAProxy's in the HELLO).
    pub max_frame_size: u32,
    /// Concurrent evaluations per connection; reading pauses at the bound.
    pub max_inflight_per_connection: usize,
    /// A frame started but not finished within this time closes the connection (status 2).
    pub partial_frame_timeout: Duration,
    /// Announce `pipelining` when HAProxy offers it (default true). Measured on HAProxy 2.6
    /// (docs/termination.md): without it the drain is race-free (ACK + DISCONNECT on the
    /// connection's only NOTIFY) and fast, but one request in a plain 8,000-request run
    /// then waited 30 s (cause not established), so it stays on.
    pub pipelining: bool,
    /// While refusing, an idle connection is closed only once nothing has come or gone on
    /// it for this long (default zero: at once). Measured only together with
    /// `pipelining: false` (1 s); with pipelining it would only make drains longer.
    pub drain_quiet: Duration,
    /// Evaluate on the connection's task while serving ([`Evaluation::Inline`]) or on the
    /// pool (the default).
    pub evaluation: Evaluation,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_size: spop::MAX_FRAME_SIZE_LIMIT,
            max_inflight_per_connection: 64,
            partial_frame_timeout: Duration::from_secs(30),
            pipelining: true,
            drain_quiet: Duration::ZERO,
            evaluation: Evaluation::Pool,
        }
    }
}

/// What every connection task shares.
pub struct Shared {
    handler: Arc<dyn Handler>,
    metrics: Arc<Metrics>,
    handle: Handle,
    pool: Pool,
    limits: Limits,
}

impl Shared {
    /// `workers` evaluation threads (started here) bound concurrent evaluations across all
    /// connections.
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
            pool: Pool::new(workers, "spoa-eval"),
            limits,
        })
    }

    /// Stops the evaluation threads: what is queued is dropped, and what is running is
    /// waited for, up to `within` (blocking). True when every thread has exited.
    pub fn stop_workers(&self, within: Duration) -> bool {
        self.pool.shutdown(within)
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
                            let (rd, wr) = s.into_split();
                            let out = out::Shared::new(wr);
                            conns.spawn(serve_split(rd, out.writer(), peer, shared, Some(out)));
                        }
                        Accepted::Unix(s) => {
                            let (rd, wr) = s.into_split();
                            let out = out::Shared::new(wr);
                            conns.spawn(serve_split(rd, out.writer(), peer, shared, Some(out)));
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

/// Serves one connection to its end (any stream; without a socket to peek at, "nothing
/// unread" relies on the reactor's readiness alone).
pub async fn serve_conn<S>(io: S, peer: Option<IpAddr>, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    serve_split(rd, wr, peer, shared, None).await;
}

/// Serves one connection, given its read and write halves. With `direct` (a socket's write
/// half shared as [`out::Shared`], `wr` being its [`out::Writer`]), evaluation threads write
/// their ACKs to the socket themselves while serving.
pub async fn serve_split<R, W>(
    rd: R,
    wr: W,
    peer: Option<IpAddr>,
    shared: Arc<Shared>,
    direct: Option<Arc<out::Shared>>,
) where
    R: AsyncRead + Unread + Unpin,
    W: AsyncWrite + Unpin,
{
    let (acks_tx, acks) = unbounded_channel();
    let mut task = ConnTask {
        conn: Conn::new(shared.limits.max_frame_size).with_pipelining(shared.limits.pipelining),
        buf: BytesMut::with_capacity(16 * 1024),
        inflight: 0,
        acks_tx,
        acks,
        waiting: VecDeque::new(),
        slot: None,
        session: None,
        partial_since: None,
        last_activity: Instant::now(),
        quiet_until: None,
        eof: false,
        rd,
        wr,
        direct,
        peer,
        shared,
    };
    task.run().await;
    if let Some((session, gauge)) = task.session.take() {
        drop(gauge);
        let handle = &task.shared.handle;
        if handle.phase() == Phase::Lingering && !handle.is_exiting() {
            // While lingering, a closed connection still counts as a session for a moment:
            // HAProxy 2.6 soft-stopping closes every idle SPOE connection and opens a new
            // one for the next message, and a lingering agent that saw no session in
            // between would leave and fail that message (measured in tests/rollout.rs's
            // sidecar test).
            tokio::spawn(async move {
                tokio::time::sleep(LINGER_RECONNECT_HOLD).await;
                drop(session);
            });
        }
    }
}

/// How long a connection closed while lingering still counts as a session.
const LINGER_RECONNECT_HOLD: Duration = Duration::from_millis(250);

/// Whether bytes are waiting in the kernel's receive buffer, asked of the socket itself
/// (`recv(MSG_PEEK | MSG_DONTWAIT)`). tokio's readiness can lag behind the socket on a busy
/// runtime (the reactor has not yet processed the event), and closing a connection on that
/// stale "nothing to read" fails the NOTIFYs already sitting in the buffer.
pub trait Unread {
    /// `Some(true)`: bytes are waiting; `Some(false)`: none; `None`: cannot tell.
    fn unread(&self) -> Option<bool>;
}

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

impl<T> Unread for tokio::io::ReadHalf<T> {
    fn unread(&self) -> Option<bool> {
        None
    }
}

/// What one connection task owns.
struct ConnTask<R, W> {
    conn: Conn,
    buf: BytesMut,
    /// NOTIFYs handed to the pool (queued, waiting for room, or running) and not yet ACKed.
    inflight: usize,
    /// Where the evaluation threads send this connection's ACKs (one per NOTIFY handed over).
    acks_tx: UnboundedSender<Vec<u8>>,
    acks: UnboundedReceiver<Vec<u8>>,
    /// Evaluations waiting for room in the pool's queue (it was full), in order.
    waiting: VecDeque<Work>,
    /// While `waiting` is not empty: this connection's place in line for the queue.
    slot: Option<SlotFuture>,
    /// Held from the HELLO on: the lifecycle session and the `spoa_connections` gauge.
    session: Option<(lastcall::SessionGuard, GaugeGuard)>,
    partial_since: Option<Instant>,
    /// Last NOTIFY received or ACK written.
    last_activity: Instant,
    /// While refusing and idle: when the connection will have been quiet for `drain_quiet`.
    quiet_until: Option<Instant>,
    eof: bool,
    rd: R,
    wr: W,
    /// The socket's write half as the evaluation threads see it (socket connections only).
    direct: Option<Arc<out::Shared>>,
    peer: Option<IpAddr>,
    shared: Arc<Shared>,
}

/// Whether the connection task goes on.
enum Flow {
    Continue,
    Done,
}

/// What a look at the socket found.
enum Probe {
    /// Nothing waiting: the connection is idle.
    Idle,
    /// Bytes were read into the buffer.
    Read,
    /// Bytes are waiting but the reactor has not said so yet: wait for the read.
    Waiting,
}

impl<R, W> ConnTask<R, W>
where
    R: AsyncRead + Unread + Unpin,
    W: AsyncWrite + Unpin,
{
    async fn run(&mut self) {
        let mut phase = PhaseWatch::new(&self.shared.handle);
        loop {
            if let Flow::Done = self.pump().await {
                return;
            }
            if self.eof && self.inflight == 0 {
                if let Some(Event::Close { reply, reason }) = self.conn.on_eof(&self.buf) {
                    self.close(reply, &reason).await;
                }
                return;
            }
            self.quiet_until = None;
            if self.idle_while_refusing() {
                let quiet_at = self.last_activity + self.shared.limits.drain_quiet;
                if Instant::now() >= quiet_at {
                    match self.probe().await {
                        Probe::Idle => {
                            self.goodbye(Vec::new(), "draining").await;
                            return;
                        }
                        Probe::Read => continue,
                        Probe::Waiting => {}
                    }
                } else {
                    self.quiet_until = Some(quiet_at);
                }
            }
            if let Flow::Done = self.wait(&mut phase).await {
                return;
            }
        }
    }

    /// Turns buffered bytes into events while there is room for more evaluations.
    async fn pump(&mut self) -> Flow {
        self.sync_direct();
        while self.inflight < self.per_conn() {
            let Some(ev) = self.conn.poll(&mut self.buf, self.shared.policy()) else {
                break;
            };
            match ev {
                Event::Ready { reply, negotiated } => {
                    tracing::debug!(peer = ?self.peer, max_frame_size = negotiated.max_frame_size, engine = ?negotiated.engine_id, "SPOP connection ready");
                    if send_all(&mut self.wr, &reply).await.is_err() {
                        return Flow::Done;
                    }
                    let id = self
                        .peer
                        .map_or_else(|| PeerId::named("unix"), PeerId::from);
                    let guard = self.shared.handle.session(id);
                    self.session = Some((guard, GaugeGuard::new(&self.shared.metrics.connections)));
                }
                Event::Notify {
                    stream_id,
                    frame_id,
                    messages,
                } => {
                    self.last_activity = Instant::now();
                    let max = self.conn.max_frame_size();
                    let inline = match self.shared.handle.phase() {
                        Phase::Serving => self.shared.handler.answer_inline(&messages),
                        // Once a drain has started, through the pool as before: with
                        // `--on-sigterm linger` and HAProxy 2.6 soft-stopping under load
                        // (tests/rollout.rs), immediate answers there left a request waiting
                        // for `timeout processing` in 3 of 4 runs (measured before
                        // `LINGER_RECONNECT_HOLD`, which addresses the likely cause).
                        _ => None,
                    };
                    if let Some(vars) = inline {
                        // No engine work (e.g. `coraza-res` without response checks): answer
                        // here, without any hand-off.
                        self.shared.metrics.observe(0.0);
                        let mut ack = Vec::new();
                        frame::encode_ack(stream_id, frame_id, &vars, max, &mut ack);
                        if let Flow::Done = self.on_ack(ack).await {
                            return Flow::Done;
                        }
                        continue;
                    }
                    if let Some(claim) = self.run_here() {
                        // The engine on this thread, as nginx runs it: no queue, no wake of
                        // another thread, the ACK written by the thread that evaluated.
                        let vars = self.evaluate_here(&messages);
                        let mut ack = Vec::new();
                        frame::encode_ack(stream_id, frame_id, &vars, max, &mut ack);
                        let flow = self.on_ack(ack).await;
                        // Phase 5 and cleanup, now that HAProxy has the verdict.
                        self.shared.handler.after_reply();
                        drop(claim);
                        if let Flow::Done = flow {
                            return Flow::Done;
                        }
                        // Let this thread's other connections (and the I/O driver) have a
                        // turn between two evaluations of a pipelining connection.
                        tokio::task::yield_now().await;
                        continue;
                    }
                    let direct = match self.shared.handle.phase() {
                        Phase::Serving => self.direct.clone(),
                        _ => None,
                    };
                    let reply = Reply {
                        tx: Some(self.acks_tx.clone()),
                        direct,
                        stream_id,
                        frame_id,
                        max_frame_size: max,
                        inflight: Some(GaugeGuard::new(&self.shared.metrics.inflight)),
                    };
                    let work = evaluation(&self.shared, messages, reply);
                    self.inflight += 1;
                    self.hand_over(work);
                }
                Event::Close { reply, reason } => {
                    self.close(reply, &reason).await;
                    return Flow::Done;
                }
            }
        }
        self.partial_since = match (self.buf.is_empty(), self.partial_since) {
            (true, _) => None,
            (false, None) => Some(Instant::now()),
            (false, since) => since,
        };
        Flow::Continue
    }

    /// Waits for the next thing to do: the deadline, a finished evaluation, bytes, a stalled
    /// frame, or a phase change.
    async fn wait(&mut self, phase: &mut PhaseWatch) -> Flow {
        if let Some(d) = &self.direct {
            let serving = self.shared.handle.phase() == Phase::Serving;
            if !serving {
                d.stop_direct();
            }
            // Before counting what was done, so that no ACK written after the count goes
            // unnoticed (an extra wake is harmless).
            d.set_interest(!serving || self.eof || self.inflight >= self.per_conn());
        }
        self.sync_direct();
        let can_read = !self.eof && self.inflight < self.per_conn();
        let timeout_at = self
            .partial_since
            .map(|s| s + self.shared.limits.partial_frame_timeout);
        tokio::select! {
            biased;
            () = self.shared.handle.exiting() => {
                self.goodbye(Vec::new(), "shutting down").await;
                Flow::Done
            }
            Some(ack) = self.acks.recv(), if self.inflight > 0 => {
                self.inflight -= 1;
                self.on_ack(ack).await
            }
            slot = wait_slot(&mut self.slot), if self.slot.is_some() => {
                self.slot = None;
                match slot {
                    Some(slot) => {
                        if let Some(work) = self.waiting.pop_front() {
                            self.shared.pool.submit(slot, work);
                        }
                        while let Some(work) = self.waiting.pop_front() {
                            if let Err(work) = self.shared.pool.try_submit(work) {
                                self.waiting.push_front(work);
                                self.slot = Some(self.shared.pool.slot());
                                break;
                            }
                        }
                    }
                    // The pool is gone: dropping the work answers with errors.
                    None => self.waiting.clear(),
                }
                Flow::Continue
            }
            read = self.rd.read_buf(&mut self.buf), if can_read => {
                if !matches!(read, Ok(n) if n > 0) {
                    self.eof = true;
                }
                Flow::Continue
            }
            () = sleep_until(self.quiet_until), if self.quiet_until.is_some() => Flow::Continue,
            () = sleep_until(timeout_at), if timeout_at.is_some() => {
                if let Event::Close { reply, reason } = self.conn.on_read_timeout() {
                    self.close(reply, &reason).await;
                }
                Flow::Done
            }
            () = phase.changed() => Flow::Continue,
            () = woken(&self.direct), if self.direct.is_some() => {
                // ACKs written (counted at the next pump), or bytes left for us to flush.
                self.sync_direct();
                if self.wr.flush().await.is_err() {
                    return Flow::Done;
                }
                Flow::Continue
            }
        }
    }

    /// Counts the ACKs the evaluation threads wrote themselves.
    fn sync_direct(&mut self) {
        if let Some(d) = &self.direct {
            let n = d.take_done();
            if n > 0 {
                debug_assert!(n <= self.inflight);
                self.inflight = self.inflight.saturating_sub(n);
                self.last_activity = Instant::now();
            }
        }
    }

    /// Writes an ACK. The last ACK of a connection that is idle while refusing carries the
    /// goodbye in the same write.
    ///
    /// Without pipelining this is race-free: HAProxy sends nothing on the connection while it
    /// waits for the ACK, and it reads the ACK and the DISCONNECT together, before it could
    /// send again. With pipelining HAProxy may already have sent the next NOTIFY, so the
    /// goodbye waits for `drain_quiet` like any idle connection (unless that is zero).
    async fn on_ack(&mut self, ack: Vec<u8>) -> Flow {
        let piggyback = !self.conn.pipelined() || self.shared.limits.drain_quiet.is_zero();
        if piggyback && self.idle_while_refusing() && matches!(self.probe().await, Probe::Idle) {
            self.goodbye(ack, "draining").await;
            return Flow::Done;
        }
        if !ack.is_empty() && send_all(&mut self.wr, &ack).await.is_err() {
            return Flow::Done;
        }
        self.last_activity = Instant::now();
        Flow::Continue
    }

    /// Looks for bytes not yet read: first through tokio (moving them into the buffer), then,
    /// if tokio says nothing, at the socket itself.
    async fn probe(&mut self) -> Probe {
        if !nothing_unread(&mut self.rd, &mut self.buf).await {
            return Probe::Read;
        }
        match self.rd.unread() {
            Some(true) => Probe::Waiting,
            _ => Probe::Idle,
        }
    }

    fn idle_while_refusing(&self) -> bool {
        self.shared.refusing() && self.conn.is_ready() && self.inflight == 0 && self.buf.is_empty()
    }

    /// Queues an evaluation on the pool at once if there is room and nothing of this
    /// connection waits before it; otherwise it waits, in order, for room.
    fn hand_over(&mut self, work: Work) {
        let work = if self.waiting.is_empty() {
            match self.shared.pool.try_submit(work) {
                Ok(()) => return,
                Err(work) => work,
            }
        } else {
            work
        };
        self.waiting.push_back(work);
        if self.slot.is_none() {
            self.slot = Some(self.shared.pool.slot());
        }
    }

    /// Whether to evaluate the NOTIFY just decoded on this thread, and with what claim on the
    /// pool's room: always with `evaluation: inline`; with `pool`, when the pool would start
    /// it at once anyway (nothing queued, a thread's room free) and another I/O thread is
    /// left to serve timers, the other connections and the admin listener (so never on a
    /// single-threaded runtime). Only while serving, and not for a pipelined burst.
    fn run_here(&self) -> Option<Option<crate::pool::Claim>> {
        if self.shared.handle.phase() != Phase::Serving || self.frame_waiting() {
            return None;
        }
        match self.shared.limits.evaluation {
            Evaluation::Inline => Some(None),
            Evaluation::Pool => {
                let io_threads = tokio::runtime::Handle::current().metrics().num_workers();
                self.shared
                    .pool
                    .try_run_here(io_threads.saturating_sub(1))
                    .map(Some)
            }
        }
    }

    /// Whether another whole frame is already buffered behind the one just decoded (HAProxy
    /// pipelined a burst on this connection). Such NOTIFYs go to the pool, so that they are
    /// evaluated in parallel instead of one after another on this thread.
    fn frame_waiting(&self) -> bool {
        match self.buf.get(..4) {
            Some(&[a, b, c, d]) => {
                let len = u32::from_be_bytes([a, b, c, d]) as usize;
                self.buf.len() >= len.saturating_add(4)
            }
            _ => false,
        }
    }

    /// Runs one NOTIFY's messages through the engine on this thread. A panic in the handler
    /// answers with the error variable, as on the pool.
    fn evaluate_here(&self, messages: &[Message]) -> Vars {
        let started = Instant::now();
        let _inflight = GaugeGuard::new(&self.shared.metrics.inflight);
        let handler = &self.shared.handler;
        let vars =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.handle(messages)))
                .unwrap_or_else(|_| {
                    tracing::error!("evaluation panicked; answering with the error variable");
                    vec![("error", TypedData::Int64(AGENT_ERROR))]
                });
        self.shared.metrics.observe(started.elapsed().as_secs_f64());
        vars
    }

    fn per_conn(&self) -> usize {
        self.shared.limits.max_inflight_per_connection.max(1)
    }

    /// Writes `before` (an ACK, or nothing) and AGENT-DISCONNECT status 0 in one write, then
    /// closes.
    async fn goodbye(&mut self, mut before: Vec<u8>, message: &str) {
        before.extend_from_slice(&self.conn.goodbye(message));
        let _ = send_all(&mut self.wr, &before).await;
        let _ = self.wr.shutdown().await;
    }

    async fn close(&mut self, reply: Vec<u8>, reason: &CloseReason) {
        match reason {
            CloseReason::HealthCheck => {}
            CloseReason::Refused => self.shared.handle.record_refused(),
            CloseReason::PeerDisconnect(status) => {
                tracing::debug!(peer = ?self.peer, status, "HAPROXY-DISCONNECT answered");
            }
            CloseReason::Protocol(e) => {
                self.shared.metrics.rejected(e.metric_reason());
                tracing::warn!(peer = ?self.peer, status = e.status.to_u32(), "closing connection: {}", e.reason);
            }
        }
        let _ = send_all(&mut self.wr, &reply).await;
        let _ = self.wr.shutdown().await;
    }
}

/// Writes `bytes` whole and waits until the socket has taken them (an [`out::Writer`]
/// accepts a write at once and queues what the socket does not take).
async fn send_all<W: AsyncWrite + Unpin>(wr: &mut W, bytes: &[u8]) -> io::Result<()> {
    wr.write_all(bytes).await?;
    wr.flush().await
}

async fn woken(direct: &Option<Arc<out::Shared>>) {
    match direct {
        Some(d) => d.woken().await,
        None => std::future::pending().await,
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

async fn wait_slot(slot: &mut Option<SlotFuture>) -> Option<crate::pool::Slot> {
    match slot {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// Where one NOTIFY's ACK goes. Exactly one ACK is sent for it: the verdict, or, if the
/// evaluation panicked or was dropped unrun, an error (`txn.<prefix>.error`).
struct Reply {
    tx: Option<UnboundedSender<Vec<u8>>>,
    /// While serving: the socket, for the evaluation thread to write the ACK itself.
    direct: Option<Arc<out::Shared>>,
    stream_id: u64,
    frame_id: u64,
    max_frame_size: u32,
    inflight: Option<GaugeGuard>,
}

impl Reply {
    fn closed(&self) -> bool {
        self.tx.as_ref().is_none_or(UnboundedSender::is_closed)
    }

    fn send(&mut self, vars: &Vars) {
        if let Some(tx) = self.tx.take() {
            let mut out = Vec::new();
            frame::encode_ack(
                self.stream_id,
                self.frame_id,
                vars,
                self.max_frame_size,
                &mut out,
            );
            // Not counted as in flight any more once the connection can see the ACK.
            self.inflight = None;
            if let Some(direct) = self.direct.take() {
                if direct.write_ack(&out) {
                    return;
                }
            }
            let _ = tx.send(out);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if self.tx.is_some() {
            self.send(&vec![("error", TypedData::Int64(AGENT_ERROR))]);
        }
    }
}

/// One NOTIFY's evaluation, to run on an evaluation thread.
fn evaluation(shared: &Shared, messages: Vec<Message>, mut reply: Reply) -> Work {
    let started = Instant::now();
    let handler = Arc::clone(&shared.handler);
    let metrics = Arc::clone(&shared.metrics);
    Box::new(move || {
        if reply.closed() {
            // The connection is gone (closed at the deadline): nobody waits for this.
            return;
        }
        let vars = handler.handle(&messages);
        metrics.observe(started.elapsed().as_secs_f64());
        reply.send(&vars);
        handler.after_reply();
    })
}

/// Holds a gauge one higher while alive: a NOTIFY in `spoa_inflight` from its arrival until its
/// evaluation ends (or is dropped unrun), an open (handshaken) connection in `spoa_connections`.
struct GaugeGuard(Gauge);

impl GaugeGuard {
    fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
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
    use std::pin::Pin;
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

    /// Records the name of the thread each evaluation ran on; panics on request.
    struct Where {
        threads: Mutex<Vec<String>>,
        panic: bool,
    }

    impl Handler for Where {
        fn handle(&self, _: &[Message]) -> crate::waf::Vars {
            let name = std::thread::current().name().unwrap_or("").to_string();
            if let Ok(mut t) = self.threads.lock() {
                t.push(name);
            }
            assert!(!self.panic, "handler asked to panic");
            vec![("verdict", TypedData::String("ok".into()))]
        }
    }

    /// A lifecycle without signals (drain: no delay, 30 s timeout), running on the test's
    /// runtime; its handle.
    fn serving_lifecycle() -> Handle {
        let lc = Lifecycle::without_signals(TerminationConfig::new(
            OnSigterm::Drain,
            Duration::ZERO,
            Duration::from_secs(30),
        ));
        let handle = lc.handle();
        tokio::spawn(lc.run_with(futures_never()));
        handle
    }

    async fn evaluate_three(
        evaluation: Evaluation,
        panic: bool,
        burst: bool,
    ) -> (Vec<AgentFrame>, Vec<String>) {
        let handle = serving_lifecycle();
        let handler = Arc::new(Where {
            threads: Mutex::new(Vec::new()),
            panic,
        });
        let limits = Limits {
            evaluation,
            ..Limits::default()
        };
        let s = Shared::new(
            handler.clone(),
            Arc::new(Metrics::default()),
            handle,
            2,
            limits,
        );
        let mut c = connect(&s);
        assert!(matches!(
            hello(&mut c, false).await[..],
            [AgentFrame::Hello(_)]
        ));
        let mut frames = Vec::new();
        if burst {
            // Three pipelined NOTIFYs in one write.
            let mut three = notify(1);
            three.extend(notify(2));
            three.extend(notify(3));
            c.write_all(&three).await.unwrap();
            frames = read_frames(&mut c, 3).await.0;
        } else {
            // One at a time, each after the previous ACK.
            for sid in 1..=3 {
                c.write_all(&notify(sid)).await.unwrap();
                frames.extend(read_frames(&mut c, 1).await.0);
            }
        }
        let threads = handler.threads.lock().unwrap().clone();
        (frames, threads)
    }

    /// With a single I/O thread the pool never evaluates on it: that thread must stay free
    /// for timers, the other connections and the drain.
    #[tokio::test]
    async fn a_single_io_thread_leaves_every_evaluation_to_the_pool() {
        let (frames, threads) = evaluate_three(Evaluation::Pool, false, false).await;
        assert_eq!(frames.len(), 3, "{frames:?}");
        assert!(
            threads.iter().all(|t| t.starts_with("spoa-eval")),
            "{threads:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inline_evaluation_answers_in_order_on_the_io_threads() {
        let (frames, threads) = evaluate_three(Evaluation::Inline, false, false).await;
        let sids: Vec<u64> = frames
            .iter()
            .map(|f| match f {
                AgentFrame::Ack(sid, 1, vars) if vars[0].0 == "verdict" => *sid,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(sids, [1, 2, 3]);
        assert_eq!(threads.len(), 3);
        assert!(
            threads.iter().all(|t| !t.starts_with("spoa-eval")),
            "{threads:?}"
        );
        // The pool, one NOTIFY at a time: each would start at once on an idle pool, so each
        // runs where it was read, under a claim on the pool's room (pool::try_run_here).
        let (frames, threads) = evaluate_three(Evaluation::Pool, false, false).await;
        assert_eq!(frames.len(), 3, "{frames:?}");
        assert_eq!(threads.len(), 3);
        assert!(
            threads.iter().all(|t| !t.starts_with("spoa-eval")),
            "{threads:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pipelined_burst_goes_to_the_pool_but_its_last_frame() {
        let (frames, threads) = evaluate_three(Evaluation::Inline, false, true).await;
        let mut sids: Vec<u64> = frames
            .iter()
            .map(|f| match f {
                AgentFrame::Ack(sid, 1, vars) if vars[0].0 == "verdict" => *sid,
                other => panic!("{other:?}"),
            })
            .collect();
        sids.sort_unstable();
        assert_eq!(sids, [1, 2, 3]);
        let pooled = threads
            .iter()
            .filter(|t| t.starts_with("spoa-eval"))
            .count();
        // The first two had a whole frame behind them when decoded (one write); the third
        // did not, unless the write was split.
        assert!((2..=3).contains(&pooled), "{threads:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inline_evaluation_that_panics_answers_the_error_variable() {
        let (frames, threads) = evaluate_three(Evaluation::Inline, true, false).await;
        assert_eq!(threads.len(), 3);
        for f in &frames {
            match f {
                AgentFrame::Ack(_, 1, vars) => assert_eq!(vars[0].0, "error", "{vars:?}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(frames.len(), 3);
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
        let handle = serving_lifecycle();
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

    #[tokio::test]
    async fn deadline_closes_what_is_left() {
        let lc = Lifecycle::without_signals(TerminationConfig::new(
            OnSigterm::Drain,
            Duration::ZERO,
            Duration::from_millis(300),
        ));
        let handle = lc.handle();
        let run = tokio::spawn(lc.run_with(futures_never()));
        let (tx, rx) = std::sync::mpsc::channel();
        let s = shared(Arc::new(Gated(Mutex::new(rx))), &handle);
        let mut c = connect(&s);
        assert!(matches!(
            hello(&mut c, false).await[..],
            [AgentFrame::Hello(_)]
        ));
        c.write_all(&notify(3)).await.unwrap();
        while s.metrics.inflight.get() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        handle.start_drain(Trigger::Sigterm);
        // The evaluation never finishes: at the deadline the connection gets its goodbye.
        let (frames, _, eof) = read_frames(&mut c, 2).await;
        assert!(
            matches!(frames[..], [AgentFrame::Disconnect(0, _)]),
            "{frames:?}"
        );
        assert!(eof);
        let outcome = run.await.unwrap();
        assert_eq!(outcome.exit_code(), lastcall::exit::DEADLINE);
        tx.send(()).unwrap();
    }

    /// The socket itself is asked: bytes written by the peer are seen as unread before any
    /// read, and not once they were read.
    #[tokio::test]
    async fn unread_asks_the_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (mut rd, _wr) = server.into_split();
        assert_eq!(rd.unread(), Some(false));
        client.write_all(b"notify").await.unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        while rd.unread() != Some(true) {
            assert!(Instant::now() < end, "bytes never seen");
            tokio::task::yield_now().await;
        }
        let mut buf = [0u8; 6];
        rd.read_exact(&mut buf).await.unwrap();
        assert_eq!(rd.unread(), Some(false));
        let (duplex_rd, _) = tokio::io::split(tokio::io::duplex(8).0);
        assert_eq!(duplex_rd.unread(), None);
    }

    /// Without pipelining (an engine limit, off by default) the AGENT-HELLO does not announce
    /// it, and a refusing connection closes with the ACK of its only NOTIFY.
    #[tokio::test]
    async fn without_pipelining_the_goodbye_rides_on_the_ack() {
        let handle = serving_lifecycle();
        let (tx, rx) = std::sync::mpsc::channel();
        let s = Shared::new(
            Arc::new(Gated(Mutex::new(rx))),
            Arc::new(Metrics::default()),
            handle.clone(),
            2,
            Limits {
                pipelining: false,
                ..Limits::default()
            },
        );
        let mut c = connect(&s);
        match &hello(&mut c, false).await[..] {
            [AgentFrame::Hello(kv)] => assert!(
                !kv.iter()
                    .any(|(_, v)| matches!(v, TypedData::String(t) if t.contains("pipelining"))),
                "{kv:?}"
            ),
            other => panic!("{other:?}"),
        }
        c.write_all(&notify(5)).await.unwrap();
        while s.metrics.inflight.get() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        handle.start_drain(Trigger::Sigterm);
        handle.refusing().await;
        tx.send(()).unwrap();
        let (frames, _, _) = read_frames(&mut c, 2).await;
        assert!(
            matches!(
                frames[..],
                [AgentFrame::Ack(5, 1, _), AgentFrame::Disconnect(0, _)]
            ),
            "{frames:?}"
        );
    }

    /// Answers inline when told to; panics when asked to evaluate a `coraza-req` with
    /// `boom` in its name, counts the other evaluations.
    struct Split(std::sync::atomic::AtomicUsize);

    impl Handler for Split {
        fn handle(&self, m: &[Message]) -> crate::waf::Vars {
            assert!(!m.iter().any(|m| m.name.contains("boom")), "boom");
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            vec![("verdict", TypedData::String("pool".into()))]
        }
        fn answer_inline(&self, m: &[Message]) -> Option<crate::waf::Vars> {
            m.iter()
                .all(|m| m.name == "inline")
                .then(|| vec![("verdict", TypedData::String("inline".into()))])
        }
    }

    fn notify_named(sid: u64, name: &str) -> Vec<u8> {
        let mut v = Vec::new();
        let msg = Message {
            name: name.into(),
            args: vec![],
        };
        frame::encode_notify(sid, 1, &msg, &mut v);
        v
    }

    /// Messages that need no engine work are answered on the connection task; a panicking
    /// evaluation is answered with an error and the pool goes on.
    #[tokio::test]
    async fn inline_answers_and_a_panicking_evaluation() {
        let lc = Lifecycle::without_signals(TerminationConfig::new(
            OnSigterm::Drain,
            Duration::ZERO,
            Duration::from_secs(30),
        ));
        let split = Arc::new(Split(std::sync::atomic::AtomicUsize::new(0)));
        let s = shared(split.clone(), &lc.handle());
        let mut c = connect(&s);
        assert!(matches!(
            hello(&mut c, false).await[..],
            [AgentFrame::Hello(_)]
        ));
        let mut all = notify_named(1, "inline");
        all.extend(notify_named(2, "coraza-req"));
        all.extend(notify_named(3, "boom"));
        all.extend(notify_named(4, "coraza-req"));
        c.write_all(&all).await.unwrap();
        let (frames, _, _) = read_frames(&mut c, 4).await;
        let mut got: Vec<(u64, String)> = frames
            .iter()
            .map(|f| match f {
                AgentFrame::Ack(sid, 1, vars) => (*sid, format!("{:?}", vars[0])),
                other => panic!("{other:?}"),
            })
            .collect();
        got.sort();
        assert!(got[0].1.contains("inline"), "{got:?}");
        assert!(got[1].1.contains("pool"), "{got:?}");
        assert!(
            got[2].1.contains("error") && got[2].1.contains("99"),
            "{got:?}"
        );
        assert!(got[3].1.contains("pool"), "{got:?}");
        assert_eq!(split.0.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(s.metrics.inflight.get(), 0);
        assert!(s.stop_workers(Duration::from_secs(20)));
    }

    fn futures_never() -> impl futures::Stream<Item = Trigger> + Send + 'static {
        futures::stream::pending()
    }
}
