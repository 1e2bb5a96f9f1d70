//! How other threads reach a UDP I/O thread: a command list and an eventfd in the thread's
//! epoll set. A thread posting to its own mailbox does not wake itself (it reads its mailbox
//! after every batch).

use std::cell::Cell;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::sys::eventfd::{EfdFlags, EventFd};
use parking_lot::Mutex;

thread_local! {
    /// The UDP I/O thread running on this thread, if any.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The UDP I/O thread whose thread this is.
pub(crate) fn current_worker() -> Option<usize> {
    CURRENT.with(Cell::get)
}

/// Marks this thread as UDP I/O thread `id`.
pub(crate) fn enter_worker(id: usize) {
    CURRENT.with(|c| c.set(Some(id)));
}

/// A change to a worker's set of sockets, posted by any thread.
pub(crate) enum Cmd {
    /// Read this relay socket.
    Add(SocketAddr, Arc<UdpSocket>),
    /// Stop reading (and drop) the relay socket bound on this address.
    Remove(SocketAddr),
    /// Run this request again: it waited for a user-database lookup, whose answer came.
    Replay(lastcall_turn_proto::Replay),
    /// Leave the loop.
    Stop,
}

/// One UDP I/O thread's mailbox.
pub(crate) struct Mailbox {
    id: usize,
    cmds: Mutex<Vec<Cmd>>,
    pending: AtomicBool,
    wake: EventFd,
}

impl Mailbox {
    /// The mailbox of worker `id`.
    pub(crate) fn new(id: usize) -> io::Result<Mailbox> {
        let wake = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(io::Error::from)?;
        Ok(Mailbox {
            id,
            cmds: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            wake,
        })
    }

    /// The worker this mailbox belongs to.
    pub(crate) fn id(&self) -> usize {
        self.id
    }

    /// Queues `cmd`; wakes the worker unless it is the caller or a wake-up is pending already.
    pub(crate) fn post(&self, cmd: Cmd) {
        self.cmds.lock().push(cmd);
        let was_pending = self.pending.swap(true, Ordering::AcqRel);
        if !was_pending && current_worker() != Some(self.id) {
            // A full eventfd counter (never, at 2^64 - 2) is the only error: it is awake.
            let _ = self.wake.write(1);
        }
    }

    /// The eventfd the worker's epoll set watches.
    pub(crate) fn wake_fd(&self) -> &EventFd {
        &self.wake
    }

    /// Clears the eventfd after a wake-up (the commands are taken by [`take`](Self::take)).
    pub(crate) fn clear_wake(&self) {
        let _ = self.wake.read();
    }

    /// Moves every posted command into `into` (empty when nothing was posted).
    pub(crate) fn take(&self, into: &mut Vec<Cmd>) {
        if !self.pending.load(Ordering::Acquire) {
            return;
        }
        // Cleared before taking, so a command posted meanwhile wakes the worker again.
        self.pending.store(false, Ordering::Release);
        std::mem::swap(&mut *self.cmds.lock(), into);
    }
}
