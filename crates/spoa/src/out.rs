//! The write side of a socket connection, shared by its connection task and the evaluation
//! threads, so that the thread that finished an evaluation writes the ACK itself.
//!
//! Without this, every ACK went back to the connection task through a channel: one wake of
//! the task's I/O thread (an `eventfd` write and an `epoll_wait` return when that thread was
//! parked) per NOTIFY, plus a poll of the task, before the same `write` the evaluation thread
//! can do at once. The profile of the agent at 32 connections put that hand-back among the
//! largest costs outside libmodsecurity (docs/benchmarks.md).
//!
//! Every frame is still written whole and frames never interleave: all writes, the task's and
//! the threads', go through one mutex, and bytes a full socket buffer would not take wait in
//! `pending`, in order, ahead of anything written later. The task flushes them when the
//! socket is writable again (it is woken for that).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use tokio::sync::Notify;

/// A socket's write half that can also be written without a task: a non-blocking write, and
/// the readiness to wait on when that would block.
pub trait WriteHalf: AsyncWrite + Unpin + Send + 'static {
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
    wr: Box<dyn WriteHalf>,
    /// Bytes accepted but not yet taken by the socket; always written before anything else.
    pending: Vec<u8>,
    /// Whether evaluation threads may write (only while serving: during a drain every ACK
    /// goes through the connection task, which decides when a connection says goodbye).
    direct: bool,
    /// A write failed: the connection is going away; later direct writes are dropped.
    broken: bool,
}

/// What the connection task and the evaluation threads share.
pub struct Shared {
    state: Mutex<State>,
    /// Wakes the connection task: bytes are pending, or an ACK it waits for was written.
    wake: Notify,
    /// ACKs written by evaluation threads and not yet counted by the task.
    done: AtomicUsize,
    /// Whether the task wants a wake for every ACK written (it is waiting for in-flight
    /// NOTIFYs to finish: reading paused at the bound, end of input, or a drain).
    interest: AtomicBool,
}

impl Shared {
    /// Shares `wr`; direct writes are allowed until [`Self::stop_direct`].
    pub fn new(wr: impl WriteHalf) -> Arc<Self> {
        Arc::new(Shared {
            state: Mutex::new(State {
                wr: Box::new(wr),
                pending: Vec::new(),
                direct: true,
                broken: false,
            }),
            wake: Notify::new(),
            done: AtomicUsize::new(0),
            interest: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The connection task's handle for writing.
    pub fn writer(self: &Arc<Self>) -> Writer {
        Writer(Arc::clone(self))
    }

    /// From now on every ACK goes through the task. Returns at once; a direct write in
    /// progress has finished (it held the lock).
    pub fn stop_direct(&self) {
        self.lock().direct = false;
    }

    /// Whether bytes wait for the socket.
    pub fn has_pending(&self) -> bool {
        !self.lock().pending.is_empty()
    }

    /// Sets whether the task wants a wake for every ACK written.
    pub fn set_interest(&self, on: bool) {
        self.interest.store(on, Ordering::SeqCst);
    }

    /// ACKs written directly since the last call.
    pub fn take_done(&self) -> usize {
        self.done.swap(0, Ordering::SeqCst)
    }

    /// Resolves when the task has something to do (see [`Self::wake`]'s uses).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }
}

impl Shared {
    /// Writes (or queues, in order) one whole `frame` from an evaluation thread, then counts
    /// one ACK done. False when direct writes are off: the caller sends the frame through the
    /// task instead.
    pub fn write_ack(&self, frame: &[u8]) -> bool {
        let mut st = self.lock();
        if !st.direct {
            return false;
        }
        let mut wake = false;
        if st.broken {
            // The connection is failing: the task will see it on its side and close.
        } else if st.pending.is_empty() {
            match write_some(&*st.wr, frame) {
                Ok(n) if n == frame.len() => {}
                Ok(n) => {
                    st.pending.extend_from_slice(&frame[n..]);
                    wake = true;
                }
                Err(_) => st.broken = true,
            }
        } else {
            // Behind bytes the task was already woken to flush.
            st.pending.extend_from_slice(frame);
        }
        drop(st);
        self.done.fetch_add(1, Ordering::SeqCst);
        if wake || self.interest.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
        true
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

/// The connection task's writer: an [`AsyncWrite`] over the shared state. A write is
/// accepted whole (what the socket does not take now is queued), so frames never interleave
/// with the evaluation threads' ACKs; `flush` waits until the socket has taken everything.
pub struct Writer(Arc<Shared>);

impl Writer {
    fn poll_pending(st: &mut State, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !st.pending.is_empty() {
            match write_some(&*st.wr, &st.pending) {
                Ok(n) if n > 0 => {
                    st.pending.drain(..n);
                }
                // The socket took nothing: wait until it may take more.
                Ok(_) => std::task::ready!(st.wr.poll_write_ready(cx))?,
                Err(e) => {
                    st.broken = true;
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
        let mut st = self.0.lock();
        if st.broken {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if st.pending.is_empty() {
            match write_some(&*st.wr, buf) {
                Ok(n) => st.pending.extend_from_slice(&buf[n..]),
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
        let mut st = self.0.lock();
        Self::poll_pending(&mut st, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.0.lock();
        std::task::ready!(Self::poll_pending(&mut st, cx))?;
        st.direct = false;
        Pin::new(&mut *st.wr).poll_shutdown(cx)
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
        let shared = Shared::new(wr);
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
                        assert!(shared.write_ack(&f));
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
        assert_eq!(shared.take_done(), 1600);
    }

    #[tokio::test]
    async fn after_stop_direct_acks_go_through_the_task() {
        let (_client, server) = pair().await;
        let (_rd, wr) = server.into_split();
        let shared = Shared::new(wr);
        assert!(shared.write_ack(b"\0\0\0\x01x"));
        shared.stop_direct();
        assert!(!shared.write_ack(b"\0\0\0\x01y"));
        assert_eq!(shared.take_done(), 1);
    }
}
