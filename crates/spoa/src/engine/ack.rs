//! The one way an ACK leaves: a connection's [`AckSink`], shared by its task and the
//! evaluation threads, and the [`Ticket`] each NOTIFY gets, which delivers exactly one ACK
//! through it (the verdict, or the error variable if the evaluation panicked or was dropped
//! unrun).
//!
//! What the sink does with an ACK depends on the connection
//! ([`Wait::direct_acks`](lastcall_spop_proto::conn::Wait::direct_acks)):
//!
//! - **direct** (serving, on a socket): whoever has the ACK writes it to the socket at once,
//!   the evaluation thread that finished it included, and the sink counts it for the
//!   connection ([`AckSink::take_written`]). Handing each ACK back to the connection's task
//!   instead costs a wake of its I/O thread per NOTIFY (an `eventfd` write and an
//!   `epoll_wait` return when that thread was parked), which the agent's profile put among
//!   its largest costs outside libmodsecurity (docs/benchmarks.md).
//! - **held** (draining, a goodbye due, or a stream that is not a socket): the sink keeps
//!   the ACKs, in order, and wakes the task, which places them
//!   ([`Input::HeldAcks`](lastcall_spop_proto::conn::Input::HeldAcks)): the last one of a
//!   connection whose goodbye is due carries it in the same write.
//!
//! Every frame is written whole and frames never interleave: all writes, the task's and the
//! threads', go through one mutex, and bytes a full socket buffer would not take wait in
//! `pending`, in order, ahead of anything written later. The task flushes them when the
//! socket is writable again (it is woken for that).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use lastcall_spop_proto::frame;
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::AsyncWrite;
use tokio::sync::Notify;

use super::handler::{error_vars, Vars};
use super::GaugeGuard;

/// A socket's write half that can also be written without a task: a non-blocking write, and
/// the readiness to wait on when that would block.
pub(crate) trait WriteHalf: AsyncWrite + Unpin + Send + 'static {
    /// Writes what the socket takes now (`WouldBlock` when it takes nothing).
    fn try_write(&self, buf: &[u8]) -> io::Result<usize>;
    /// Ready when the socket may take more.
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

impl WriteHalf for tokio::net::tcp::OwnedWriteHalf {
    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.as_ref().try_write(buf)
    }
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.as_ref().poll_write_ready(cx)
    }
}

impl WriteHalf for tokio::net::unix::OwnedWriteHalf {
    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.as_ref().try_write(buf)
    }
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.as_ref().poll_write_ready(cx)
    }
}

struct State {
    /// The socket, if the connection is one (ACKs can then be written directly).
    wr: Option<Box<dyn WriteHalf>>,
    /// Bytes accepted but not yet taken by the socket; always written before anything else.
    pending: Vec<u8>,
    /// Whether ACKs are written at once (see the module's doc).
    direct: bool,
    /// ACKs kept for the task, back to back, and how many.
    held: Vec<u8>,
    held_count: usize,
    /// A write failed: the connection is going away; later direct writes are dropped.
    broken: bool,
    /// The connection is gone: ACKs are dropped, evaluations not started are skipped.
    closed: bool,
}

/// Where a connection's ACKs go (see the module's doc).
pub(crate) struct AckSink {
    state: Mutex<State>,
    /// Wakes the connection task: ACKs are held for it, bytes are pending, or an ACK it
    /// waits for was written.
    wake: Notify,
    /// ACKs written directly and not yet counted by the task.
    written: AtomicUsize,
    /// Whether the task wants a wake for every ACK written.
    interest: AtomicBool,
}

impl AckSink {
    /// A sink over a socket's write half: ACKs are written directly until
    /// [`set_direct`](Self::set_direct) says otherwise.
    pub(crate) fn for_socket(wr: impl WriteHalf) -> Arc<Self> {
        Self::build(Some(Box::new(wr)))
    }

    /// A sink for a stream that is not a socket: every ACK is held for the task.
    #[cfg(test)]
    pub(crate) fn held_only() -> Arc<Self> {
        Self::build(None)
    }

    fn build(wr: Option<Box<dyn WriteHalf>>) -> Arc<Self> {
        let direct = wr.is_some();
        Arc::new(AckSink {
            state: Mutex::new(State {
                wr,
                pending: Vec::new(),
                direct,
                held: Vec::new(),
                held_count: 0,
                broken: false,
                closed: false,
            }),
            wake: Notify::new(),
            written: AtomicUsize::new(0),
            interest: AtomicBool::new(false),
        })
    }

    /// A ticket for one NOTIFY's ACK; `inflight` is held one higher until the ACK is
    /// delivered (the `spoa_inflight` gauge). Called by [`super::notify`] only, when the
    /// NOTIFY is received.
    pub(super) fn ticket(
        self: &Arc<Self>,
        stream_id: u64,
        frame_id: u64,
        max_frame_size: u32,
        inflight: &Gauge,
    ) -> Ticket {
        Ticket {
            sink: Arc::clone(self),
            stream_id,
            frame_id,
            max_frame_size,
            inflight: Some(GaugeGuard::new(inflight)),
        }
    }

    /// Delivers one whole ACK frame: written at once (direct) or held for the task. Every
    /// ACK goes through here, once.
    fn deliver(&self, ack: &[u8]) {
        let mut st = self.state.lock();
        if st.closed {
            return;
        }
        if !st.direct || st.wr.is_none() {
            st.held.extend_from_slice(ack);
            st.held_count += 1;
            drop(st);
            self.wake.notify_one();
            return;
        }
        // Counted before the write: HAProxy may answer an ACK with the next NOTIFY at once,
        // and the connection must not read that NOTIFY while this ACK still looks owed
        // (it would take the connection for one HAProxy pipelines).
        self.written.fetch_add(1, Ordering::SeqCst);
        let mut wake = false;
        if st.broken {
            // The connection is failing: the task sees it on its side and closes.
        } else if st.pending.is_empty() {
            let State { wr, pending, .. } = &mut *st;
            match wr.as_deref().map(|wr| write_some(wr, ack)) {
                Some(Ok(n)) if n == ack.len() => {}
                Some(Ok(n)) => {
                    pending.extend_from_slice(&ack[n..]);
                    wake = true;
                }
                Some(Err(_)) | None => st.broken = true,
            }
        } else {
            // Behind bytes the task was already woken to flush.
            st.pending.extend_from_slice(ack);
        }
        drop(st);
        if wake || self.interest.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// Whether ACKs are written at once (only on a socket). Returns at once; a direct write
    /// in progress has finished (it held the lock).
    pub(crate) fn set_direct(&self, on: bool) {
        let mut st = self.state.lock();
        st.direct = on && st.wr.is_some();
    }

    /// Sets whether the task wants a wake for every ACK written directly.
    pub(crate) fn set_interest(&self, on: bool) {
        self.interest.store(on, Ordering::SeqCst);
    }

    /// ACKs written directly since the last call (counted before each is written).
    pub(crate) fn take_written(&self) -> usize {
        self.written.swap(0, Ordering::SeqCst)
    }

    /// The ACKs held for the task, back to back, and how many.
    pub(crate) fn take_held(&self) -> Option<(Vec<u8>, usize)> {
        let mut st = self.state.lock();
        if st.held_count == 0 {
            return None;
        }
        let count = std::mem::take(&mut st.held_count);
        Some((std::mem::take(&mut st.held), count))
    }

    /// Whether bytes wait for the socket.
    #[cfg(test)]
    pub(crate) fn has_pending(&self) -> bool {
        !self.state.lock().pending.is_empty()
    }

    /// How many bytes wait for the socket (a peer that does not read its ACKs).
    pub(crate) fn pending_len(&self) -> usize {
        self.state.lock().pending.len()
    }

    /// The connection is gone: ACKs delivered from now on are dropped.
    pub(crate) fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        st.held.clear();
        st.held_count = 0;
    }

    /// Whether [`close`](Self::close) was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// Resolves when the task has something to do (see [`AckSink::wake`]'s uses).
    pub(crate) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// The connection task's writer (sockets only): an [`AsyncWrite`] through the same lock
    /// and the same pending bytes as the direct ACKs.
    pub(crate) fn writer(self: &Arc<Self>) -> Writer {
        Writer(Arc::clone(self))
    }
}

/// Writes as much of `buf` as the socket takes now (0 when it takes nothing).
fn write_some(wr: &dyn WriteHalf, buf: &[u8]) -> io::Result<usize> {
    let mut at = 0;
    while at < buf.len() {
        match wr.try_write(&buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(at)
}

/// One NOTIFY's claim on an ACK: [`send`](Self::send) delivers the verdict; dropping it
/// unsent delivers the error variable, so HAProxy never waits for `timeout processing`. A
/// guard of the NOTIFY's record ([`super::notify`]), made by [`AckSink::ticket`] only.
pub(super) struct Ticket {
    sink: Arc<AckSink>,
    stream_id: u64,
    frame_id: u64,
    max_frame_size: u32,
    /// `spoa_inflight` one higher until the ACK is delivered (taken then: none, delivered).
    inflight: Option<GaugeGuard>,
}

impl Ticket {
    /// Whether the connection is gone (closed at the deadline): nobody waits for this ACK.
    pub(super) fn abandoned(&self) -> bool {
        self.sink.is_closed()
    }

    /// Encodes and delivers the ACK.
    pub(super) fn send(mut self, vars: &Vars) {
        self.deliver(vars);
    }

    fn deliver(&mut self, vars: &Vars) {
        let Some(gauge) = self.inflight.take() else {
            return;
        };
        let mut ack = Vec::new();
        frame::encode_ack(
            self.stream_id,
            self.frame_id,
            vars,
            self.max_frame_size,
            &mut ack,
        );
        // Not counted as in flight any more once the connection can see the ACK.
        drop(gauge);
        self.sink.deliver(&ack);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.inflight.is_some() {
            self.deliver(&error_vars());
        }
    }
}

/// The connection task's writer: an [`AsyncWrite`] over the sink's socket. A write is
/// accepted whole (what the socket does not take now is queued), so frames never interleave
/// with the evaluation threads' ACKs; `flush` waits until the socket has taken everything.
pub(crate) struct Writer(Arc<AckSink>);

impl Writer {
    fn poll_pending(st: &mut State, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let State {
            wr,
            pending,
            broken,
            ..
        } = st;
        let Some(wr) = wr.as_deref() else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        while !pending.is_empty() {
            match write_some(wr, pending) {
                Ok(n) if n > 0 => {
                    pending.drain(..n);
                }
                // The socket took nothing: wait until it may take more.
                Ok(_) => std::task::ready!(wr.poll_write_ready(cx))?,
                Err(e) => {
                    *broken = true;
                    return Poll::Ready(Err(e));
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Writer {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut st = self.0.state.lock();
        if st.broken {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if st.pending.is_empty() {
            let State { wr, pending, .. } = &mut *st;
            let Some(wr) = wr.as_deref() else {
                return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
            };
            match write_some(wr, buf) {
                Ok(n) => pending.extend_from_slice(&buf[n..]),
                Err(e) => {
                    st.broken = true;
                    return Poll::Ready(Err(e));
                }
            }
        } else {
            st.pending.extend_from_slice(buf);
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.0.state.lock();
        Self::poll_pending(&mut st, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.0.state.lock();
        std::task::ready!(Self::poll_pending(&mut st, cx))?;
        st.direct = false;
        match st.wr.as_deref_mut() {
            Some(wr) => Pin::new(wr).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap());
        let (c, a) = tokio::join!(c, l.accept());
        (c.unwrap(), a.unwrap().0)
    }

    /// Frames written from other threads while the socket buffer is full are queued, flushed
    /// by the task, and arrive whole and in order with the task's own writes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_from_threads_never_interleave_with_a_full_socket() {
        let (client, server) = pair().await;
        let (_rd, wr) = server.into_split();
        let shared = AckSink::for_socket(wr);
        let mut writer = shared.writer();
        // 8 threads x 200 frames of 1-4 KiB, while the peer does not read at first.
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || {
                    for i in 0..200u32 {
                        let len = 1024 + (i as usize * 97 + t as usize * 31) % 3072;
                        let mut f = (len as u32).to_be_bytes().to_vec();
                        f.extend(std::iter::repeat_n(t, len));
                        shared.deliver(&f);
                    }
                })
            })
            .collect();
        let reader = tokio::spawn(async move {
            let mut client = client;
            let mut got = vec![0usize; 9];
            let mut len = [0u8; 4];
            for _ in 0..(8 * 200 + 50) {
                client.read_exact(&mut len).await.unwrap();
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                client.read_exact(&mut body).await.unwrap();
                let who = body[0];
                assert!(body.iter().all(|&b| b == who), "a frame was interleaved");
                got[who as usize] += 1;
            }
            got
        });
        for _ in 0..50 {
            let mut f = 16u32.to_be_bytes().to_vec();
            f.extend([8u8; 16]);
            writer.write_all(&f).await.unwrap();
            writer.flush().await.unwrap();
        }
        for t in threads {
            t.join().unwrap();
        }
        // What the threads left pending is flushed by the task when it is woken.
        while shared.has_pending() {
            tokio::time::timeout(std::time::Duration::from_secs(10), shared.woken())
                .await
                .ok();
            writer.flush().await.unwrap();
        }
        let got = tokio::time::timeout(std::time::Duration::from_secs(30), reader)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, [200, 200, 200, 200, 200, 200, 200, 200, 50]);
        assert_eq!(shared.take_written(), 1600);
    }

    #[tokio::test]
    async fn when_not_direct_acks_are_held_for_the_task() {
        let (_client, server) = pair().await;
        let (_rd, wr) = server.into_split();
        let shared = AckSink::for_socket(wr);
        shared.deliver(b"\0\0\0\x01x");
        shared.set_direct(false);
        shared.deliver(b"\0\0\0\x01y");
        shared.deliver(b"\0\0\0\x01z");
        assert_eq!(shared.take_written(), 1);
        assert_eq!(
            shared.take_held(),
            Some((b"\0\0\0\x01y\0\0\0\x01z".to_vec(), 2))
        );
        assert_eq!(shared.take_held(), None);
    }

    /// A ticket delivers exactly one ACK: its verdict, or the error variable when dropped;
    /// once the connection is gone, nothing.
    #[test]
    fn a_ticket_delivers_one_ack_and_an_error_when_dropped() {
        let sink = AckSink::held_only();
        let gauge = Gauge::default();
        let t = sink.ticket(1, 2, 16380, &gauge);
        assert_eq!(gauge.get(), 1);
        t.send(&vec![("verdict", spop::TypedData::String("ok".into()))]);
        drop(sink.ticket(3, 4, 16380, &gauge));
        assert_eq!(gauge.get(), 0);
        let (bytes, count) = sink.take_held().unwrap();
        assert_eq!(count, 2);
        let mut buf = bytes::BytesMut::from(&bytes[..]);
        let first = frame::decode_agent_frame(&mut buf).unwrap().unwrap();
        let second = frame::decode_agent_frame(&mut buf).unwrap().unwrap();
        assert!(matches!(first, frame::AgentFrame::Ack(1, 2, ref v) if v[0].0 == "verdict"));
        assert!(matches!(second, frame::AgentFrame::Ack(3, 4, ref v) if v[0].0 == "error"));
        let late = sink.ticket(5, 6, 16380, &gauge);
        sink.close();
        assert!(late.abandoned());
        drop(late);
        assert_eq!(sink.take_held(), None);
        assert_eq!(gauge.get(), 0);
    }
}
