//! The connection task: the I/O side of one SPOP connection, a plain executor. It reads
//! into the [`Conn`]'s buffer, starts an evaluation for each NOTIFY, tells the `Conn` what
//! happened ([`Input`]) and carries out what it decides ([`Action`]); it decides nothing
//! about the protocol, the drain, or when and how much to read.
//!
//! Each NOTIFY becomes a [`Notify`], which holds everything of its life (its ACK, its bytes,
//! its budget, its place among the connection's evaluations; [`super::notify`]): answered
//! there, or its evaluation handed to the pool here, in order, waiting for room in the
//! pool's queue when it is full.
//!
//! The counts the `Conn` follows are kept by their owners alone (the [`AckSink`], the
//! [`Evaluations`], the [`Account`]); the `Conn` reads them through [`Owners`] and says which
//! to take in, and when ([`Conn::before_decode`], [`Conn::before_wait`]).
//!
//! What the task holds for the peer is bounded by the `Conn`'s decisions: its read buffer
//! grows only within `max_buffered_bytes` ([`super::memory`]: the task asks for the room the
//! `Conn` wants, and reports a refusal as [`Input::NoRoom`]), and reading pauses while more
//! than [`MAX_UNSENT`] bytes of ACKs wait for a peer that does not read them.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use lastcall::{PeerId, Watch};
use lastcall_spop_proto::conn::{
    Action, CloseReason, Conn, Counts, Event, Input, Pressure, Probe, Wait,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::ack::AckSink;
use super::memory::Account;
use super::notify::{Notify, Received, Route};
use super::pool::{Evaluations, Slot, SlotFuture, Work};
use super::{Engine, GaugeGuard};

/// ACK bytes waiting for a peer that does not read them, above which reading pauses.
pub(crate) const MAX_UNSENT: usize = 64 * 1024;

/// Serves one connection to its end, over any stream (tests): its ACKs are all written by
/// the task, and without a socket to peek at, "nothing unread" relies on the reactor's
/// readiness alone.
#[cfg(test)]
pub(crate) async fn serve_conn<S>(io: S, peer: Option<IpAddr>, engine: Arc<Engine>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    let watch = engine.handle.watch();
    let addr = peer.map_or_else(|| "unix".to_string(), |ip| ip.to_string());
    serve_split(rd, wr, AckSink::held_only(), (peer, addr), engine, watch).await;
}

/// Serves one connection, given its read and write halves, its ACK sink (for a socket, `wr`
/// is the sink's own [`super::ack::Writer`]), its peer (address, and as `/sessions` shows
/// it) and its watch on the lifecycle.
pub(super) async fn serve_split<R, W>(
    rd: R,
    wr: W,
    sink: Arc<AckSink>,
    (peer, addr): (Option<IpAddr>, String),
    engine: Arc<Engine>,
    watch: Watch,
) where
    R: AsyncRead + Unread + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut task = ConnTask {
        conn: Conn::new(engine.conn_settings(), watch.now(), now()),
        account: engine.memory.account(),
        evaluations: Arc::new(Evaluations::default()),
        waiting: VecDeque::new(),
        slot: None,
        session: None,
        registered: None,
        addr,
        rd,
        wr,
        sink,
        watch,
        peer,
        engine,
    };
    task.run().await;
    // Evaluations still queued or running find nobody waiting for their ACK.
    task.sink.close();
    if task.conn.health_check() {
        let refused = task.watch.now().is_refusing();
        task.engine
            .down
            .checked(&task.engine.handle, task.peer, refused);
    }
    let hold = task.conn.hold(task.watch.now());
    let session = match task.session.take() {
        Some((session, gauge)) => {
            drop(gauge);
            Some(session)
        }
        // A refused HELLO: the session it did not get is held instead.
        None => hold.map(|_| task.engine.handle.session(task.peer_id())),
    };
    if let (Some(session), Some(hold)) = (session, hold) {
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            drop(session);
        });
    }
}

/// The time the `Conn` is given: tokio's clock (paused in tests), as a `std` instant.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Whether bytes are waiting in the kernel's receive buffer, asked of the socket itself
/// (`recv(MSG_PEEK | MSG_DONTWAIT)`). tokio's readiness can lag behind the socket on a busy
/// runtime (the reactor has not yet processed the event).
pub(crate) trait Unread {
    /// `Some(true)`: bytes are waiting; `Some(false)`: none; `None`: cannot tell.
    fn unread(&self) -> Option<bool>;
}

/// A stream that is not a socket (tests): the reactor's readiness alone tells.
#[cfg(test)]
impl<T> Unread for tokio::io::ReadHalf<T> {
    fn unread(&self) -> Option<bool> {
        None
    }
}

/// What one connection task owns.
struct ConnTask<R, W> {
    conn: Conn,
    /// Its read buffer, as `max_buffered_bytes` counts it.
    account: Account,
    /// Its evaluations queued or running (an answer given at the deadline does not end one).
    evaluations: Arc<Evaluations>,
    /// Evaluations waiting for room in the pool's queue (it was full), in order.
    waiting: VecDeque<Work>,
    /// While `waiting` is not empty: this connection's place in line for the queue.
    slot: Option<SlotFuture>,
    /// Held from the HELLO on: the lifecycle session and the `spoa_connections` gauge.
    session: Option<(lastcall::SessionGuard, GaugeGuard)>,
    /// From the HELLO on: its line in `/sessions`, and what the operator's end tells.
    registered: Option<super::sessions::Registered>,
    /// The peer as `/sessions` shows it.
    addr: String,
    rd: R,
    wr: W,
    sink: Arc<AckSink>,
    /// The lifecycle, as this connection follows it (fed to the `Conn` as [`Input::Drain`]).
    watch: Watch,
    peer: Option<IpAddr>,
    engine: Arc<Engine>,
}

/// The owners of the counts the `Conn` follows, as it reads them ([`Counts`]).
struct Owners<'a> {
    sink: &'a AckSink,
    account: &'a Account,
    evaluations: &'a Evaluations,
}

impl Counts for Owners<'_> {
    fn take_written(&mut self) -> usize {
        self.sink.take_written()
    }

    fn take_held(&mut self) -> Option<(Vec<u8>, usize)> {
        self.sink.take_held()
    }

    fn evicted(&self) -> bool {
        self.account.evict().is_set()
    }

    fn unsent(&self) -> usize {
        self.sink.pending_len()
    }

    fn evaluations(&self) -> usize {
        self.evaluations.count()
    }
}

/// Whether the connection task goes on.
enum Flow {
    Continue,
    Done,
}

impl<R, W> ConnTask<R, W>
where
    R: AsyncRead + Unread + Unpin,
    W: AsyncWrite + Unpin,
{
    /// Who is on the other end, for the lifecycle's session count.
    fn peer_id(&self) -> PeerId {
        self.peer
            .map_or_else(|| PeerId::named("unix"), PeerId::from)
    }

    /// One input to the `Conn`, then the action it answers with. A wait is carried out only
    /// when no protocol event and no input is pending.
    async fn run(&mut self) {
        let mut input = Input::Nothing;
        loop {
            input = match self.conn.handle(now(), input) {
                Action::Wait(wait) => {
                    if let Some(input) = self.conn.before_decode(&mut self.owners()) {
                        input
                    } else if let Some(event) = self.conn.poll(now()) {
                        if let Flow::Done = self.on_event(event).await {
                            return;
                        }
                        Input::Nothing
                    } else {
                        match self.wait(wait).await {
                            Some(input) => input,
                            None => return,
                        }
                    }
                }
                Action::Probe => Input::Probed(self.probe().await),
                Action::Write(bytes) => {
                    if send_all(&mut self.wr, &bytes).await.is_err() {
                        return;
                    }
                    Input::Nothing
                }
                Action::Close { bytes, reason } => {
                    self.close(&bytes, &reason).await;
                    return;
                }
            };
        }
    }

    async fn on_event(&mut self, event: Event) -> Flow {
        match event {
            Event::Ready { reply, negotiated } => {
                tracing::debug!(peer = ?self.peer, max_frame_size = negotiated.max_frame_size, pipelining = negotiated.pipelining, engine = ?negotiated.engine_id, "SPOP connection ready");
                if negotiated.offered > negotiated.max_frame_size
                    && !negotiated.healthcheck
                    && !FRAME_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::warn!(
                        offered = negotiated.offered,
                        max_frame_size = negotiated.max_frame_size,
                        "HAProxy offers max-frame-size {} (its tune.bufsize - 4), more than this agent's max_frame_size {}: a message larger than that (a request body HAProxy buffered) fails, and HAProxy refuses the request; set max_frame_size: {} or more",
                        negotiated.offered, negotiated.max_frame_size, negotiated.offered
                    );
                }
                // Listed before HAProxy hears the AGENT-HELLO: whoever it tells sees it.
                let evaluations = Arc::clone(&self.evaluations);
                self.registered = Some(self.engine.conns.add(
                    self.addr.clone(),
                    self.peer,
                    Arc::new(move || evaluations.count()),
                ));
                if send_all(&mut self.wr, &reply).await.is_err() {
                    return Flow::Done;
                }
                let guard = self.engine.handle.session(self.peer_id());
                self.session = Some((guard, GaugeGuard::new(&self.engine.metrics.connections)));
            }
            Event::Notify {
                stream_id,
                frame_id,
                messages,
                size,
                inline,
            } => {
                if let Some(r) = &self.registered {
                    r.notifies.fetch_add(1, Ordering::Relaxed);
                }
                if !self.conn.one_at_a_time() && !PIPELINE_WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        peer = ?self.peer,
                        "HAProxy sent a NOTIFY on a connection that still owes an ACK: with more than one NOTIFY in flight per connection a goodbye (drain, rebalancing) can cross a NOTIFY, which HAProxy then fails; add `max-waiting-frames 1` to the spoe-agent section (HAProxy 2.6 and 3.0; docs/spoa.md, *Drain*)"
                    );
                }
                let notify = Notify::received(
                    &self.engine,
                    Received {
                        stream_id,
                        frame_id,
                        messages,
                        size,
                        max_frame_size: self.conn.max_frame_size(),
                        sink: &self.sink,
                    },
                );
                match notify.route(&self.engine, inline, &self.evaluations) {
                    Route::Answered => {}
                    // Its place among the evaluations is taken in before the next wait.
                    Route::Queued(work) => self.hand_over(work),
                }
            }
            Event::Close { reply, reason } => {
                self.close(&reply, &reason).await;
                return Flow::Done;
            }
        }
        Flow::Continue
    }

    /// What the `Conn` reads of the counts it follows, from their owners.
    fn owners(&self) -> Owners<'_> {
        Owners {
            sink: &self.sink,
            account: &self.account,
            evaluations: &self.evaluations,
        }
    }

    /// Carries out a [`Wait`]: puts its settings in force (the sink's, the account's), feeds
    /// what the `Conn` takes in first ([`Conn::before_wait`]) or refused room, then waits for
    /// whatever comes (the lifecycle, a wake from the sink, room in the pool, bytes, an
    /// evaluation ending, released bytes, the timer). `None` when the socket failed.
    async fn wait(&mut self, wait: Wait) -> Option<Input> {
        self.sink.set_direct(wait.direct_acks);
        // Before the `Conn` counts what was written, so that no ACK written after the count
        // goes unnoticed (an extra wake is harmless).
        self.sink.set_interest(wait.ack_wakes);
        self.account.set(wait.holding.capacity);
        self.account.set_partial(
            wait.holding
                .unfinished_since
                .map(tokio::time::Instant::from_std),
        );
        if let Some(input) = self.conn.before_wait(&mut self.owners()) {
            return Some(input);
        }
        let read = match wait.read {
            Some(room) => match self.account.room(self.conn.buffer(), room) {
                Ok(()) => true,
                Err(pressure) => {
                    if pressure == Pressure::Evicted {
                        tracing::warn!(
                            peer = ?self.peer,
                            buffered = self.engine.memory.used(),
                            cap = self.engine.memory.cap(),
                            "max_buffered_bytes reached: the oldest unfinished frame (older than 1s) is dropped"
                        );
                    }
                    return Some(Input::NoRoom(pressure));
                }
            },
            None => false,
        };
        let evict = Arc::clone(self.account.evict());
        let memory = Arc::clone(&self.engine.memory);
        let evaluations = Arc::clone(&self.evaluations);
        let until = wait.until.map(tokio::time::Instant::from_std);
        let end = self.registered.as_ref().map(|r| Arc::clone(&r.end));
        let input = tokio::select! {
            biased;
            seen = self.watch.changed() => Input::Drain(seen),
            () = notified(end.as_deref()), if end.is_some() => Input::End,
            () = evict.wait() => Input::Evicted,
            () = self.sink.woken() => {
                // ACKs written or held (taken at the next wait), or bytes left to flush.
                if self.wr.flush().await.is_err() {
                    return None;
                }
                Input::Nothing
            }
            slot = wait_slot(&mut self.slot), if self.slot.is_some() => {
                self.slot = None;
                self.on_slot(slot);
                Input::Nothing
            }
            got = self.rd.read_buf(self.conn.buffer()), if read => match got {
                Ok(n) if n > 0 => Input::Read,
                _ => Input::Eof,
            },
            () = evaluations.ended(), if wait.evaluation_wakes => {
                Input::Evaluations(evaluations.count())
            }
            () = memory.released(), if wait.memory_wakes => Input::Released,
            () = sleep_until(until), if until.is_some() => Input::Timeout,
        };
        if matches!(input, Input::Read) {
            self.account.set(self.conn.buffer().capacity());
        }
        Some(input)
    }

    /// Room in the pool's queue: the first waiting evaluation takes it, the others follow
    /// while there is room.
    fn on_slot(&mut self, slot: Option<Slot>) {
        let Some(slot) = slot else {
            // The pool is gone: dropping the work answers with errors.
            self.waiting.clear();
            return;
        };
        if let Some(work) = self.waiting.pop_front() {
            self.engine.pool.submit(slot, work);
        }
        while let Some(work) = self.waiting.pop_front() {
            if let Err(work) = self.engine.pool.try_submit(work) {
                self.waiting.push_front(work);
                self.slot = Some(self.engine.pool.slot());
                break;
            }
        }
    }

    /// Looks for bytes not yet read: first through tokio (moving them into the buffer), then,
    /// if tokio says nothing, at the socket itself.
    async fn probe(&mut self) -> Probe {
        if !nothing_unread(&mut self.rd, self.conn.buffer()).await {
            return Probe::Read;
        }
        match self.rd.unread() {
            Some(true) => Probe::Waiting,
            _ => Probe::Idle,
        }
    }

    /// Queues an evaluation on the pool at once if there is room and nothing of this
    /// connection waits before it; otherwise it waits, in order, for room.
    fn hand_over(&mut self, work: Work) {
        let work = if self.waiting.is_empty() {
            match self.engine.pool.try_submit(work) {
                Ok(()) => return,
                Err(work) => work,
            }
        } else {
            work
        };
        self.waiting.push_back(work);
        if self.slot.is_none() {
            self.slot = Some(self.engine.pool.slot());
        }
    }

    async fn close(&mut self, bytes: &[u8], reason: &CloseReason) {
        match reason {
            CloseReason::HealthCheck
            | CloseReason::PeerClosed
            | CloseReason::Drained
            | CloseReason::Exiting
            | CloseReason::Ended => {}
            CloseReason::DrainedPipelined => {
                self.engine.metrics.pipelined_goodbyes.inc();
                tracing::info!(
                    peer = ?self.peer,
                    "the drain's goodbye on a connection HAProxy pipelines on, said once no HAProxy had the agent UP: a NOTIFY it sent as the goodbye crossed fails (spoa_drain_goodbyes_pipelined_total); `max-waiting-frames 1` in the spoe-agent section makes every goodbye lossless"
                );
            }
            CloseReason::Rebalanced => {
                self.engine.metrics.rebalanced.inc();
                tracing::debug!(peer = ?self.peer, "goodbye to be placed again (rebalancing)");
            }
            CloseReason::Idle => {
                self.engine.metrics.timed_out("idle");
                tracing::debug!(peer = ?self.peer, "closing an idle connection (idle_timeout)");
            }
            CloseReason::HelloTimeout => {
                self.engine.metrics.timed_out("hello");
                tracing::debug!(peer = ?self.peer, "closing a connection without HELLO (hello_timeout)");
            }
            CloseReason::Refused => self.engine.handle.record_refused(),
            CloseReason::PeerDisconnect(status) => {
                tracing::debug!(peer = ?self.peer, status, "HAPROXY-DISCONNECT answered");
            }
            CloseReason::Protocol(e) => {
                self.engine.metrics.rejected(e.metric_reason());
                tracing::warn!(peer = ?self.peer, status = e.status.to_u32(), "closing connection: {}", e.reason);
            }
        }
        if !bytes.is_empty() {
            let _ = send_all(&mut self.wr, bytes).await;
        }
        let _ = self.wr.shutdown().await;
    }
}

/// Waits for `end`'s notification (never without one).
async fn notified(end: Option<&tokio::sync::Notify>) {
    match end {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

/// Writes `bytes` whole and waits until the socket has taken them (the sink's writer
/// accepts a write at once and queues what the socket does not take).
async fn send_all<W: AsyncWrite + Unpin>(wr: &mut W, bytes: &[u8]) -> io::Result<()> {
    wr.write_all(bytes).await?;
    wr.flush().await
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// True when no bytes are waiting on the socket; bytes that are waiting are moved into `buf`.
async fn nothing_unread<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut bytes::BytesMut) -> bool {
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

async fn wait_slot(slot: &mut Option<SlotFuture>) -> Option<Slot> {
    match slot {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// Whether the frame-size mismatch was logged (once per process: every connection of one
/// HAProxy offers the same).
static FRAME_WARNED: AtomicBool = AtomicBool::new(false);

/// Whether a NOTIFY on a connection that still owed an ACK was logged (once per process).
static PIPELINE_WARNED: AtomicBool = AtomicBool::new(false);

#[cfg(test)]
mod tests;
