//! The connection task: the I/O side of one SPOP connection. It reads into the
//! [`Conn`]'s buffer, starts an evaluation for each NOTIFY, and carries out what the `Conn`
//! decides ([`Action`]); it decides nothing about the protocol or the drain itself.
//!
//! Where a NOTIFY is evaluated: answered on the task when it needs no engine work
//! ([`Handler::answer_inline`], while serving); otherwise queued on the pool, in order, its
//! answer owed within the budget ([`super::budget`]), or answered at once with the failure
//! verdict while the pool is saturated with runaways. No evaluation runs on an I/O thread: an
//! evaluation there held that thread, and when the runtime's other threads were parked
//! nobody polled the I/O driver for as long (measured: a 6 s evaluation delayed `/livez` by
//! 6 s and the SIGTERM by 12 s).
//!
//! What the task holds for the peer is bounded: its read buffer grows only within
//! `max_buffered_bytes` ([`super::memory`]), and reading pauses while more than
//! [`MAX_UNSENT`] bytes of ACKs wait for a peer that does not read them.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;

use lastcall::{PeerId, Watch};
use spop::frame::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::ack::{AckSink, Ticket};
use super::budget::{failure_vars, Owed};
use super::conn::{Action, CloseReason, Conn, Drain, Event, Input, Probe};
use super::handler::Handler;
use super::memory::{Account, Charge, Pressure};
use super::pool::{Slot, SlotFuture, Work};
use super::{GaugeGuard, Shared};

/// ACK bytes waiting for a peer that does not read them, above which reading pauses.
pub const MAX_UNSENT: usize = 64 * 1024;

/// Serves one connection to its end, over any stream (tests): its ACKs are all written by
/// the task, and without a socket to peek at, "nothing unread" relies on the reactor's
/// readiness alone.
pub async fn serve_conn<S>(io: S, peer: Option<IpAddr>, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    let watch = shared.handle.watch();
    serve_split(rd, wr, AckSink::held_only(), peer, shared, watch).await;
}

/// Serves one connection, given its read and write halves, its ACK sink (for a socket, `wr`
/// is the sink's own [`super::ack::Writer`]) and its watch on the lifecycle.
pub(super) async fn serve_split<R, W>(
    rd: R,
    wr: W,
    sink: Arc<AckSink>,
    peer: Option<IpAddr>,
    shared: Arc<Shared>,
    watch: Watch,
) where
    R: AsyncRead + Unread + Unpin,
    W: AsyncWrite + Unpin,
{
    let drain = Drain::from(watch.now());
    sink.set_direct(drain.serving());
    let mut task = ConnTask {
        conn: Conn::new(shared.limits.conn_settings(), drain, Instant::now()),
        account: shared.memory.account(),
        jobs: Arc::new(Jobs::default()),
        direct: drain.serving(),
        waiting: VecDeque::new(),
        slot: None,
        session: None,
        rd,
        wr,
        sink,
        watch,
        peer,
        shared,
    };
    task.run().await;
    // Evaluations still queued or running find nobody waiting for their ACK.
    task.sink.close();
    let hold = task.conn.linger_hold(Drain::from(task.watch.now()));
    if let Some((session, gauge)) = task.session.take() {
        drop(gauge);
        if let Some(hold) = hold {
            tokio::spawn(async move {
                tokio::time::sleep(hold).await;
                drop(session);
            });
        }
    }
}

/// Whether bytes are waiting in the kernel's receive buffer, asked of the socket itself
/// (`recv(MSG_PEEK | MSG_DONTWAIT)`). tokio's readiness can lag behind the socket on a busy
/// runtime (the reactor has not yet processed the event).
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
    /// Its read buffer, as `max_buffered_bytes` counts it.
    account: Account,
    /// Its evaluations queued or running (an answer given at the deadline does not end one).
    jobs: Arc<Jobs>,
    /// Whether the sink was last told to write ACKs directly.
    direct: bool,
    /// Evaluations waiting for room in the pool's queue (it was full), in order.
    waiting: VecDeque<Work>,
    /// While `waiting` is not empty: this connection's place in line for the queue.
    slot: Option<SlotFuture>,
    /// Held from the HELLO on: the lifecycle session and the `spoa_connections` gauge.
    session: Option<(lastcall::SessionGuard, GaugeGuard)>,
    rd: R,
    wr: W,
    sink: Arc<AckSink>,
    /// The lifecycle, as this connection follows it (fed to the `Conn` as [`Input::Drain`]).
    watch: Watch,
    peer: Option<IpAddr>,
    shared: Arc<Shared>,
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
    /// Protocol events first, then one input to the `Conn` and the action it answers with.
    async fn run(&mut self) {
        let mut input = Input::Nothing;
        loop {
            while let Some(event) = self.conn.poll(Instant::now()) {
                if let Flow::Done = self.on_event(event).await {
                    return;
                }
            }
            let action = self.conn.handle(Instant::now(), input);
            if self.direct != self.conn.direct_acks() {
                self.direct = self.conn.direct_acks();
                self.sink.set_direct(self.direct);
            }
            input = match action {
                // ACKs taken just now made room under the bound: decode what is buffered.
                Action::Wait { .. } if self.conn.decodable() => Input::Nothing,
                Action::Wait { read, until } => match self.next_input(read, until).await {
                    Some(input) => input,
                    None => return,
                },
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
                tracing::debug!(peer = ?self.peer, max_frame_size = negotiated.max_frame_size, engine = ?negotiated.engine_id, "SPOP connection ready");
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
                size,
            } => {
                let ticket = self.sink.ticket(
                    stream_id,
                    frame_id,
                    self.conn.max_frame_size(),
                    &self.shared.metrics.inflight,
                );
                let charge = self.shared.memory.charge(size);
                self.evaluate(messages, ticket, charge);
            }
            Event::Close { reply, reason } => {
                self.close(&reply, &reason).await;
                return Flow::Done;
            }
        }
        Flow::Continue
    }

    /// Answers one NOTIFY: here if it needs no engine work, at once with the failure verdict
    /// while the pool is saturated with runaways, else on the pool within the budget.
    fn evaluate(&mut self, mut messages: Vec<Message>, ticket: Ticket, charge: Charge) {
        // Only while serving: answered at once during a drain, a request waited for HAProxy's
        // `timeout processing` in 3 of 4 sidecar rollouts (`--on-sigterm linger`, HAProxy 2.6
        // soft-stopping under load, tests/spoa/rollout.rs; measured without `LINGER_HOLD`).
        if self.conn.drain().serving() {
            if let Some(vars) = self.shared.handler.answer_inline(&messages) {
                self.shared.metrics.observe(0.0);
                ticket.send(&vars);
                return;
            }
        }
        let id = self.shared.handler.identify(&mut messages);
        if self.shared.pool.saturated() {
            self.shared.metrics.failed_closed("overloaded");
            tracing::warn!(
                tx = id.as_deref().unwrap_or("-"),
                overrunning = self.shared.pool.overrunning(),
                "max_overruns evaluations are running past evaluation_timeout: answered at once with the error variable"
            );
            ticket.send(&failure_vars(id.as_deref()));
            return;
        }
        let owed = self
            .shared
            .budget
            .owe(ticket, id, std::time::Instant::now());
        let job = Jobs::start(&self.jobs);
        let frame_size = self.conn.max_frame_size();
        let work = evaluation(&self.shared, messages, frame_size, owed, (charge, job));
        self.hand_over(work);
    }

    /// The next input when the `Conn` waits: ACKs the sink has for it first, then whatever
    /// comes (the lifecycle, a wake from the sink, room in the pool, bytes, the timer).
    /// `None` when the socket failed.
    async fn next_input(&mut self, read: bool, until: Option<Instant>) -> Option<Input> {
        // Before counting what was written, so that no ACK written after the count goes
        // unnoticed (an extra wake is harmless).
        self.sink.set_interest(self.conn.wants_ack_wakes());
        let written = self.sink.take_written();
        if written > 0 {
            return Some(Input::AcksWritten(written));
        }
        if let Some((bytes, count)) = self.sink.take_held() {
            return Some(Input::HeldAcks { bytes, count });
        }
        self.conn.shrink_buffer();
        self.account.set(self.conn.buffer().capacity());
        self.account.set_partial(self.conn.unfinished_since());
        if self.account.evict().is_set() {
            return Some(Input::Evicted);
        }
        // Evaluations answered at their deadline may still wait in the queue: no more bytes
        // until this connection's are fewer than it may have in flight.
        let jobs_full = self.jobs.count() >= self.shared.limits.max_inflight_per_connection.max(1);
        let (read, retry) = if read && !jobs_full && self.sink.pending_len() <= MAX_UNSENT {
            match self.room() {
                Ok(()) => (true, None),
                Err(Pressure::Evicted) => return Some(Input::Nothing),
                Err(Pressure::Wait(at)) => (false, Some(at)),
            }
        } else {
            (false, None)
        };
        let evict = Arc::clone(self.account.evict());
        let memory = Arc::clone(&self.shared.memory);
        let jobs = Arc::clone(&self.jobs);
        let input = tokio::select! {
            biased;
            seen = self.watch.changed() => Input::Drain(Drain::from(seen)),
            () = evict.wait() => Input::Evicted,
            () = self.sink.woken() => {
                // ACKs written or held (taken at the next call), or bytes left to flush.
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
            // Room was short: try again when bytes are released, or when the oldest
            // unfinished frame may be dropped.
            () = memory.released(), if retry.is_some() => Input::Nothing,
            () = jobs.done.notified(), if jobs_full => Input::Nothing,
            () = sleep_until(retry.flatten()), if retry.is_some_and(|r| r.is_some()) => Input::Nothing,
            () = sleep_until(until), if until.is_some() => Input::Timeout,
        };
        if matches!(input, Input::Read) {
            self.account.set(self.conn.buffer().capacity());
        }
        Some(input)
    }

    /// Makes room in the buffer for the next read, within `max_buffered_bytes`; under
    /// pressure, what the connection may do instead.
    fn room(&mut self) -> Result<(), Pressure> {
        let want = self.conn.read_room();
        let buf = self.conn.buffer();
        if buf.capacity() - buf.len() >= want {
            return Ok(());
        }
        let needed = buf.len() + want;
        if self.account.try_grow(needed) {
            let buf = self.conn.buffer();
            buf.reserve(want);
            // `reserve` may double the allocation: beyond what the cap grants, the buffer is
            // built anew at the size asked for.
            if !self.account.try_grow(buf.capacity()) {
                let mut exact = bytes::BytesMut::with_capacity(needed);
                exact.extend_from_slice(buf);
                *buf = exact;
            }
            self.account.set(buf.capacity());
            return Ok(());
        }
        let pressure =
            self.shared
                .memory
                .relieve(self.account.id(), self.account.partial(), Instant::now());
        if pressure == Pressure::Evicted {
            tracing::warn!(
                peer = ?self.peer,
                buffered = self.shared.memory.used(),
                cap = self.shared.memory.cap(),
                "max_buffered_bytes reached: the oldest unfinished frame (older than 1s) is dropped"
            );
        }
        Err(pressure)
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

    async fn close(&mut self, bytes: &[u8], reason: &CloseReason) {
        match reason {
            CloseReason::HealthCheck
            | CloseReason::PeerClosed
            | CloseReason::Drained
            | CloseReason::Exiting => {}
            CloseReason::Idle => {
                self.shared.metrics.timed_out("idle");
                tracing::debug!(peer = ?self.peer, "closing an idle connection (idle_timeout)");
            }
            CloseReason::HelloTimeout => {
                self.shared.metrics.timed_out("hello");
                tracing::debug!(peer = ?self.peer, "closing a connection without HELLO (hello_timeout)");
            }
            CloseReason::Refused => self.shared.handle.record_refused(),
            CloseReason::PeerDisconnect(status) => {
                tracing::debug!(peer = ?self.peer, status, "HAPROXY-DISCONNECT answered");
            }
            CloseReason::Protocol(e) => {
                self.shared.metrics.rejected(e.metric_reason());
                tracing::warn!(peer = ?self.peer, status = e.status.to_u32(), "closing connection: {}", e.reason);
            }
        }
        if !bytes.is_empty() {
            let _ = send_all(&mut self.wr, bytes).await;
        }
        let _ = self.wr.shutdown().await;
    }
}

/// Writes `bytes` whole and waits until the socket has taken them (the sink's writer
/// accepts a write at once and queues what the socket does not take).
async fn send_all<W: AsyncWrite + Unpin>(wr: &mut W, bytes: &[u8]) -> io::Result<()> {
    wr.write_all(bytes).await?;
    wr.flush().await
}

async fn sleep_until(at: Option<Instant>) {
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

/// A connection's evaluations queued or running.
#[derive(Debug, Default)]
struct Jobs {
    n: std::sync::atomic::AtomicUsize,
    done: tokio::sync::Notify,
}

/// One of a connection's evaluations, counted until dropped.
struct Job(Arc<Jobs>);

impl Jobs {
    fn start(jobs: &Arc<Jobs>) -> Job {
        jobs.n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Job(Arc::clone(jobs))
    }

    fn count(&self) -> usize {
        self.n.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.0.n.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.done.notify_one();
    }
}

/// One NOTIFY's evaluation, to run on an evaluation thread; skipped if its answer went out
/// already (at its deadline, while it was queued). Its bytes, and its place among the
/// connection's evaluations, are held until it ends.
/// Whether the frame-size mismatch was logged (once per process: every connection of one
/// HAProxy offers the same).
static FRAME_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn evaluation(
    shared: &Shared,
    messages: Vec<Message>,
    frame_size: u32,
    owed: Arc<Owed>,
    held: (Charge, Job),
) -> Work {
    let handler: Arc<dyn Handler> = Arc::clone(&shared.handler);
    let metrics = Arc::clone(&shared.metrics);
    let tracked = owed.tracked();
    Work::tracked(
        move || {
            let _held = held;
            if owed.answered() {
                return;
            }
            let answer = handler.handle_framed(&messages, frame_size);
            metrics.observe(owed.received().elapsed().as_secs_f64());
            owed.send(&answer.vars);
            // Phase 5 and cleanup, now that the ACK is on its way.
            answer.later.run();
        },
        tracked,
    )
}

#[cfg(test)]
mod tests {
    //! In-process tests of the connection engine over `tokio::io::duplex`, with a trivial
    //! handler (the WAF itself is tested in `waf` and end to end through HAProxy).
    use super::*;
    use crate::engine::{Answer, Limits, Vars};
    use crate::metrics::Metrics;
    use crate::protocol::frame::{self, decode_agent_frame, AgentFrame};
    use bytes::BytesMut;
    use lastcall::{Handle, Lifecycle, OnSigterm, TerminationConfig, Trigger};
    use spop::TypedData;
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::time::Duration;
    use tokio::io::DuplexStream;
    use tokio::net::TcpListener;

    /// Answers `verdict=ok`; blocks while the gate is closed.
    struct Gated(Mutex<std::sync::mpsc::Receiver<()>>);

    impl Handler for Gated {
        fn handle(&self, _: &[Message]) -> Answer {
            if let Ok(rx) = self.0.lock() {
                let _ = rx.recv_timeout(Duration::from_secs(20));
            }
            Answer::from(vec![("verdict", TypedData::String("ok".into()))])
        }
    }

    /// A [`Gated`] handler that also says when an evaluation has started (and so is
    /// blocked at the gate).
    struct GatedTelling {
        gate: Gated,
        started: Mutex<std::sync::mpsc::Sender<()>>,
    }

    impl Handler for GatedTelling {
        fn handle(&self, messages: &[Message]) -> Answer {
            if let Ok(started) = self.started.lock() {
                let _ = started.send(());
            }
            self.gate.handle(messages)
        }
    }

    struct Open;
    impl Handler for Open {
        fn handle(&self, _: &[Message]) -> Answer {
            Answer::from(Vec::new())
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
        fn handle(&self, _: &[Message]) -> Answer {
            let name = std::thread::current().name().unwrap_or("").to_string();
            if let Ok(mut t) = self.threads.lock() {
                t.push(name);
            }
            assert!(!self.panic, "handler asked to panic");
            Answer::from(vec![("verdict", TypedData::String("ok".into()))])
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

    async fn evaluate_three(panic: bool, burst: bool) -> (Vec<AgentFrame>, Vec<String>) {
        let handle = serving_lifecycle();
        let handler = Arc::new(Where {
            threads: Mutex::new(Vec::new()),
            panic,
        });
        let limits = Limits::default();
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
        let (frames, threads) = evaluate_three(false, false).await;
        assert_eq!(frames.len(), 3, "{frames:?}");
        assert!(
            threads.iter().all(|t| t.starts_with("spoa-eval")),
            "{threads:?}"
        );
    }

    /// One at a time or pipelined, on a runtime with two I/O threads: every evaluation runs
    /// on the pool, and each NOTIFY gets its ACK.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_evaluation_runs_on_an_io_thread() {
        for burst in [false, true] {
            let (frames, threads) = evaluate_three(false, burst).await;
            let mut sids: Vec<u64> = frames
                .iter()
                .map(|f| match f {
                    AgentFrame::Ack(sid, 1, vars) if vars[0].0 == "verdict" => *sid,
                    other => panic!("{other:?}"),
                })
                .collect();
            if !burst {
                assert_eq!(sids, [1, 2, 3], "in order");
            }
            sids.sort_unstable();
            assert_eq!(sids, [1, 2, 3]);
            assert_eq!(threads.len(), 3);
            assert!(
                threads.iter().all(|t| t.starts_with("spoa-eval")),
                "{threads:?}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_evaluation_that_panics_answers_the_error_variable() {
        let (frames, threads) = evaluate_three(true, false).await;
        assert_eq!(threads.len(), 3);
        for f in &frames {
            match f {
                AgentFrame::Ack(_, 1, vars) => assert_eq!(vars[0].0, "error", "{vars:?}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(frames.len(), 3);
    }

    /// At `evaluation_timeout` the NOTIFY is answered with the error variable while its
    /// evaluation goes on; with `max_overruns` runaways running, the next NOTIFY is answered
    /// at once; once the runaway ends, evaluations run again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_budget_answers_for_a_runaway_and_bounds_them() {
        let handle = serving_lifecycle();
        let (tx, rx) = std::sync::mpsc::channel();
        let metrics = Arc::new(Metrics::default());
        let s = Shared::new(
            Arc::new(Gated(Mutex::new(rx))),
            Arc::clone(&metrics),
            handle,
            1,
            Limits {
                evaluation_timeout: Duration::from_millis(200),
                max_overruns: 1,
                ..Limits::default()
            },
        );
        let mut c = connect(&s);
        assert!(matches!(
            hello(&mut c, false).await[..],
            [AgentFrame::Hello(_)]
        ));
        let started = Instant::now();
        c.write_all(&notify(1)).await.unwrap();
        let (frames, _, _) = read_frames(&mut c, 1).await;
        assert!(
            matches!(&frames[..], [AgentFrame::Ack(1, 1, vars)] if vars.last().is_some_and(|v| v.0 == "error")),
            "{frames:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(metrics.failed_closed_with("deadline"), 1);
        assert_eq!(metrics.overrunning.get(), 1);
        // Saturated: answered at once, without an evaluation.
        c.write_all(&notify(2)).await.unwrap();
        let (frames, _, _) = read_frames(&mut c, 1).await;
        assert!(
            matches!(&frames[..], [AgentFrame::Ack(2, 1, vars)] if vars.last().is_some_and(|v| v.0 == "error")),
            "{frames:?}"
        );
        assert_eq!(metrics.failed_closed_with("overloaded"), 1);
        // The runaway ends (its answer is dropped); the next NOTIFY is evaluated.
        tx.send(()).unwrap();
        let end = Instant::now() + Duration::from_secs(20);
        while metrics.overrunning.get() > 0 {
            assert!(Instant::now() < end);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        c.write_all(&notify(3)).await.unwrap();
        tx.send(()).unwrap();
        let (frames, _, _) = read_frames(&mut c, 1).await;
        assert!(
            matches!(&frames[..], [AgentFrame::Ack(3, 1, vars)] if vars[0].0 == "verdict"),
            "{frames:?}"
        );
    }

    /// An evaluation that does not end (held at a gate) on an otherwise idle two-thread
    /// runtime: the listener still accepts, and another connection's health check is still
    /// answered, over real sockets (an evaluation on an I/O thread would leave the I/O driver
    /// unpolled while the other thread sleeps).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_blocked_evaluation_never_holds_up_the_runtime() {
        let daemon = lastcall::Daemon::start_with(
            TerminationConfig::new(OnSigterm::Drain, Duration::ZERO, Duration::from_secs(30)),
            futures_never(),
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let (started_tx, started) = std::sync::mpsc::channel();
        let handler = GatedTelling {
            gate: Gated(Mutex::new(rx)),
            started: Mutex::new(started_tx),
        };
        let s = shared(Arc::new(handler), daemon.handle());
        let listener = super::super::Listener::bind(&super::super::Bind::Tcp("127.0.0.1:0".into()))
            .await
            .unwrap();
        let addr: std::net::SocketAddr = listener.local_addr().parse().unwrap();
        let conns = Arc::clone(&s);
        daemon.accept(
            listener,
            lastcall::AcceptUntil::Exiting,
            move |conn, watch| super::super::serve_accepted(conn, Arc::clone(&conns), watch),
        );
        daemon.ready();
        let clients = tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let exchange = |bytes: &[u8], busy: &mut Vec<std::net::TcpStream>| {
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                c.write_all(bytes).unwrap();
                let mut got = [0u8; 4];
                let answered = c.read_exact(&mut got).is_ok();
                busy.push(c);
                answered
            };
            let mut conns = Vec::new();
            let mut first = Vec::new();
            frame::encode_haproxy_hello(16380, false, &mut first);
            assert!(exchange(&first, &mut conns), "the first HELLO");
            conns[0].write_all(&notify(1)).unwrap();
            // The evaluation has started and blocks at the gate.
            started
                .recv_timeout(Duration::from_secs(10))
                .expect("the evaluation started");
            let mut check = Vec::new();
            frame::encode_haproxy_hello(16380, true, &mut check);
            let started = std::time::Instant::now();
            let answered = exchange(&check, &mut conns);
            (answered, started.elapsed())
        });
        let (answered, took) = clients.await.unwrap();
        tx.send(()).unwrap();
        assert!(answered, "the health check was not answered within 10 s");
        assert!(took < Duration::from_secs(5), "answered after {took:?}");
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
        fn handle(&self, m: &[Message]) -> Answer {
            assert!(!m.iter().any(|m| m.name.contains("boom")), "boom");
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Answer::from(vec![("verdict", TypedData::String("pool".into()))])
        }
        fn answer_inline(&self, m: &[Message]) -> Option<Vars> {
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
