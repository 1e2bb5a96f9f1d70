//! The UDP data plane: `relay-threads` I/O threads (plain OS threads, not tokio tasks), each
//! with its own epoll set.
//!
//! A worker owns one client listener socket per listening address (SO_REUSEPORT when there is
//! more than one worker: the kernel spreads clients over the workers by their 4-tuple hash, so
//! a client always reaches the same worker) and the relay sockets of the allocations created
//! through it; relay sockets of TCP/TLS clients are spread round-robin. On each wake-up it
//!
//! 1. reads every ready socket with `recvmmsg` (up to [`RECV_BATCH`] datagrams a call; a call
//!    that returns fewer than asked found the queue empty, and epoll is level-triggered, so no
//!    read ever returns EAGAIN in the common case and no datagram is stranded);
//! 2. runs the whole batch (up to [`SLOTS`] datagrams) through the sans-IO core under **one**
//!    lock of the core's mutex, copying what the core wants sent into a per-wake-up queue;
//! 3. flushes that queue with one `sendmmsg` per socket (peer → client datagrams of every
//!    allocation leave through the listener socket, so they batch across allocations), never
//!    blocking: a full socket buffer drops the datagram and counts it (`send_dropped`);
//! 4. only then drops the session guards of allocations the batch ended (their last response
//!    is on its way), and applies relay-socket registrations posted by other threads.
//!
//! Other threads (tokio tasks serving TCP/TLS clients, the timer, the shutdown) reach a worker
//! through its [`Mailbox`]: a command list and an eventfd in the worker's epoll set.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use lastcall::SessionGuard;
use lastcall_turn_proto::{ClientAddr, Transmit, Transport};
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{
    recvmmsg, sendmmsg, ControlMessage, MsgFlags, MultiHeaders, SockaddrIn, SockaddrIn6,
};
use prometheus_client::metrics::counter::Counter;

use crate::metrics::WorkerLabel;
use crate::server::{lock, Core, Relays, Shared, MAX_DATAGRAM};

/// Datagrams asked of one `recvmmsg`.
pub const RECV_BATCH: usize = 32;
/// Datagrams held (and run through the core under one lock) before they are processed.
pub const SLOTS: usize = 64;
/// Events taken from one `epoll_wait`.
const EVENTS: usize = 256;

/// The eventfd's epoll token; listeners are `0..listeners`, relay sockets `RELAY_BASE + slot`.
const WAKE_TOKEN: u64 = u64::MAX;
const RELAY_BASE: u64 = 1 << 32;

thread_local! {
    /// The worker running on this thread, if any: a worker posting to its own mailbox need
    /// not wake itself.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The worker whose thread this is.
pub fn current_worker() -> Option<usize> {
    CURRENT.with(Cell::get)
}

/// A change to a worker's set of sockets, posted by any thread.
pub enum Cmd {
    /// Read this relay socket.
    Add(SocketAddr, Arc<UdpSocket>),
    /// Stop reading (and drop) the relay socket bound on this address.
    Remove(SocketAddr),
    /// Leave the loop.
    Stop,
}

/// How other threads reach one worker.
pub struct Mailbox {
    id: usize,
    cmds: Mutex<Vec<Cmd>>,
    pending: AtomicBool,
    wake: EventFd,
}

impl Mailbox {
    pub fn new(id: usize) -> io::Result<Mailbox> {
        let wake = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(io::Error::from)?;
        Ok(Mailbox {
            id,
            cmds: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            wake,
        })
    }

    /// Queues `cmd`; wakes the worker unless it is the caller (it looks at its mailbox after
    /// every batch) or a wake-up is pending already.
    pub fn post(&self, cmd: Cmd) {
        lock(&self.cmds).push(cmd);
        let was_pending = self.pending.swap(true, Ordering::AcqRel);
        if !was_pending && current_worker() != Some(self.id) {
            // A full eventfd counter (never, at 2^64 - 2) is the only error: it is awake.
            let _ = self.wake.write(1);
        }
    }
}

/// Where a datagram was read.
#[derive(Clone, Copy)]
enum Source {
    Listener(usize),
    Relay(usize),
}

/// One datagram read.
struct RxItem {
    source: Source,
    from: SocketAddr,
    len: usize,
}

/// Which socket a datagram leaves from; `Ord` groups a flush by socket.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Via {
    Listener(usize),
    Relay(usize),
}

/// One datagram to send, its bytes in the queue's arena.
struct TxItem {
    via: Via,
    seq: u32,
    to: SocketAddr,
    start: usize,
    len: usize,
}

/// What one wake-up sends.
#[derive(Default)]
struct TxQueue {
    arena: Vec<u8>,
    items: Vec<TxItem>,
    /// Frames for TCP/TLS clients (their writer tasks' queues).
    streams: Vec<(ClientAddr, Vec<u8>)>,
    /// Datagrams through relay sockets another worker reads (a reserved EVEN-PORT socket
    /// handed to a client of this worker): sent one by one.
    foreign: Vec<(Arc<UdpSocket>, SocketAddr, Vec<u8>)>,
}

/// Counters of one worker, for the metrics and the tests.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerStats {
    /// Returns of `epoll_wait` with at least one event.
    pub wakeups: u64,
    /// `recvmmsg` calls.
    pub recv_calls: u64,
    /// `recvmmsg` calls that returned EAGAIN (nothing read).
    pub recv_empty: u64,
    /// Datagrams read.
    pub datagrams: u64,
    /// Times the core's lock was taken for a batch.
    pub batches: u64,
    /// `sendmmsg` calls.
    pub send_calls: u64,
}

/// One UDP I/O thread's state.
pub struct Worker {
    id: usize,
    shared: Arc<Shared>,
    mailbox: Arc<Mailbox>,
    epoll: Epoll,
    listeners: Vec<(SocketAddr, UdpSocket)>,
    /// Relay sockets read by this worker, by slot (epoll token `RELAY_BASE + slot`).
    relays: Vec<Option<(SocketAddr, Arc<UdpSocket>)>>,
    free: Vec<usize>,
    by_addr: HashMap<SocketAddr, usize>,
    events: Vec<EpollEvent>,
    ready: Vec<Source>,
    rx_buf: Vec<u8>,
    rx: Vec<RxItem>,
    hdr4: MultiHeaders<SockaddrIn>,
    hdr6: MultiHeaders<SockaddrIn6>,
    send_hdrs: SendHeaders,
    out: Vec<u8>,
    tx: TxQueue,
    cmds: Vec<Cmd>,
    stopping: bool,
    pub stats: WorkerStats,
    datagrams_metric: Counter,
    wakeups_metric: Counter,
}

fn nix_err(e: Errno) -> io::Error {
    io::Error::from(e)
}

impl Worker {
    /// A worker reading `listeners` (their local addresses given), reached through `mailbox`.
    pub fn new(
        shared: Arc<Shared>,
        mailbox: Arc<Mailbox>,
        listeners: Vec<(SocketAddr, UdpSocket)>,
    ) -> io::Result<Worker> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(nix_err)?;
        epoll
            .add(
                &mailbox.wake,
                EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TOKEN),
            )
            .map_err(nix_err)?;
        for (i, (_, sock)) in listeners.iter().enumerate() {
            epoll
                .add(sock, EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
                .map_err(nix_err)?;
        }
        let id = mailbox.id;
        let label = WorkerLabel {
            worker: id.to_string(),
        };
        let datagrams_metric = shared
            .metrics
            .worker_datagrams
            .get_or_create(&label)
            .clone();
        let wakeups_metric = shared.metrics.worker_wakeups.get_or_create(&label).clone();
        Ok(Worker {
            id,
            shared,
            mailbox,
            epoll,
            listeners,
            relays: Vec::new(),
            free: Vec::new(),
            by_addr: HashMap::new(),
            events: vec![EpollEvent::empty(); EVENTS],
            ready: Vec::with_capacity(EVENTS),
            // Pages are only touched by what the kernel writes: small datagrams keep this
            // mostly unmapped.
            rx_buf: vec![0u8; SLOTS * MAX_DATAGRAM],
            rx: Vec::with_capacity(SLOTS),
            hdr4: MultiHeaders::preallocate(RECV_BATCH, None),
            hdr6: MultiHeaders::preallocate(RECV_BATCH, None),
            send_hdrs: SendHeaders {
                v4: MultiHeaders::preallocate(RECV_BATCH, None),
                v6: MultiHeaders::preallocate(RECV_BATCH, None),
            },
            out: Vec::with_capacity(MAX_DATAGRAM),
            tx: TxQueue::default(),
            cmds: Vec::new(),
            stopping: false,
            stats: WorkerStats::default(),
            datagrams_metric,
            wakeups_metric,
        })
    }

    /// Runs until told to stop.
    pub fn run(mut self) {
        CURRENT.with(|c| c.set(Some(self.id)));
        while !self.stopping {
            self.poll(EpollTimeout::NONE);
        }
    }

    /// Waits up to `timeout` for sockets to be ready, then handles everything ready.
    pub fn poll(&mut self, timeout: EpollTimeout) {
        let n = match self.epoll.wait(&mut self.events, timeout) {
            Ok(n) => n,
            Err(Errno::EINTR) => 0,
            Err(e) => {
                tracing::error!(worker = self.id, "epoll_wait failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
                0
            }
        };
        if n > 0 {
            self.stats.wakeups += 1;
            self.wakeups_metric.inc();
        }
        self.ready.clear();
        for ev in self.events.iter().take(n) {
            match ev.data() {
                WAKE_TOKEN => {
                    // Clears the counter; the commands are read below.
                    let _ = self.mailbox.wake.read();
                }
                t if t >= RELAY_BASE => {
                    let slot = (t - RELAY_BASE) as usize;
                    if self.relays.get(slot).is_some_and(Option::is_some) {
                        self.ready.push(Source::Relay(slot));
                    }
                }
                t => {
                    if let Some(i) = usize::try_from(t)
                        .ok()
                        .filter(|i| *i < self.listeners.len())
                    {
                        self.ready.push(Source::Listener(i));
                    }
                }
            }
        }
        let ready = std::mem::take(&mut self.ready);
        let before = self.stats.datagrams;
        for source in &ready {
            if self.rx.len() + 1 > SLOTS {
                self.process();
            }
            self.receive(*source);
        }
        self.process();
        self.ready = ready;
        let read = self.stats.datagrams - before;
        if read > 0 {
            self.datagrams_metric.inc_by(read);
        }
        self.apply_commands();
    }

    /// The socket of a source and whether it is IPv6.
    fn socket(&self, source: Source) -> Option<(&UdpSocket, bool)> {
        match source {
            Source::Listener(i) => self.listeners.get(i).map(|(a, s)| (s, a.is_ipv6())),
            Source::Relay(r) => self
                .relays
                .get(r)
                .and_then(Option::as_ref)
                .map(|(a, s)| (&**s, a.is_ipv6())),
        }
    }

    /// Reads up to [`RECV_BATCH`] datagrams (as many as free slots allow) from one socket.
    fn receive(&mut self, source: Source) {
        let start = self.rx.len();
        let want = RECV_BATCH.min(SLOTS - start);
        let Some((sock, v6)) = self.socket(source) else {
            return;
        };
        let fd = sock.as_raw_fd();
        // Errors other than EAGAIN (none is expected on an unconnected UDP socket) are
        // retried a few times; a socket still readable is reported again by epoll.
        for _ in 0..3 {
            self.stats.recv_calls += 1;
            let r = recv_batch(
                fd,
                v6,
                &mut self.rx_buf,
                start,
                want,
                &mut self.hdr4,
                &mut self.hdr6,
                |from, len| {
                    self.rx.push(RxItem { source, from, len });
                },
            );
            match r {
                Ok(n) => {
                    self.stats.datagrams += n as u64;
                    return;
                }
                Err(Errno::EAGAIN) => {
                    self.stats.recv_empty += 1;
                    return;
                }
                Err(_) => continue,
            }
        }
    }

    /// Runs the datagrams read through the core under one lock, then sends what it returned.
    fn process(&mut self) {
        if self.rx.is_empty() {
            return;
        }
        self.stats.batches += 1;
        let shared = Arc::clone(&self.shared);
        let now = Instant::now();
        let mut ended: Vec<SessionGuard> = Vec::new();
        let (mut client_rx, mut client_rx_bytes) = (0u64, 0u64);
        let (mut peer_rx, mut peer_rx_bytes) = (0u64, 0u64);
        {
            let mut core = shared.lock();
            let Core {
                server,
                ports,
                guards,
            } = &mut *core;
            let mut relays = Relays {
                shared: &shared,
                ports,
                worker: Some(self.id),
            };
            let Worker {
                listeners,
                relays: own,
                by_addr,
                rx,
                rx_buf,
                out,
                tx,
                ..
            } = self;
            for (slot, item) in rx.iter().enumerate() {
                let at = slot * MAX_DATAGRAM;
                let Some(data) = rx_buf.get(at..at + item.len) else {
                    continue;
                };
                let t = match item.source {
                    Source::Listener(i) => {
                        let Some((local, _)) = listeners.get(i) else {
                            continue;
                        };
                        client_rx += 1;
                        client_rx_bytes += item.len as u64;
                        let from = ClientAddr {
                            transport: Transport::Udp,
                            client: item.from,
                            local: *local,
                        };
                        let t = server.handle_client(now, from, data, &mut relays, out);
                        // Events now: the core keeps a bounded queue of them.
                        shared.events(server, guards, &mut ended);
                        t
                    }
                    Source::Relay(r) => {
                        let Some((relay, _)) = own.get(r).and_then(Option::as_ref) else {
                            continue;
                        };
                        peer_rx += 1;
                        peer_rx_bytes += item.len as u64;
                        server.handle_peer(now, *relay, item.from, data, out)
                    }
                };
                if let Some(t) = t {
                    tx.queue(t, listeners, by_addr, &shared);
                }
            }
        }
        self.rx.clear();
        let m = &self.shared.metrics;
        m.client_rx.add_many(client_rx, client_rx_bytes);
        m.peer_rx.add_many(peer_rx, peer_rx_bytes);
        self.flush();
        // The allocations' ends count once their responses are on their way.
        drop(ended);
    }

    /// Sends everything queued: one `sendmmsg` per socket and address family.
    fn flush(&mut self) {
        let Worker {
            listeners,
            relays,
            tx,
            shared,
            stats,
            send_hdrs,
            ..
        } = self;
        let m = &shared.metrics;
        if !tx.items.is_empty() {
            tx.items.sort_unstable_by_key(|i| (i.via, i.seq));
            let mut at = 0;
            while let Some(first) = tx.items.get(at) {
                let via = first.via;
                let end = tx
                    .items
                    .get(at..)
                    .unwrap_or_default()
                    .iter()
                    .position(|i| i.via != via)
                    .map_or(tx.items.len(), |p| at + p);
                let sock = match via {
                    Via::Listener(i) => listeners.get(i).map(|(a, s)| (s, a.is_ipv6())),
                    Via::Relay(r) => relays
                        .get(r)
                        .and_then(Option::as_ref)
                        .map(|(a, s)| (&**s, a.is_ipv6())),
                };
                let run = tx.items.get(at..end).unwrap_or_default();
                let (sent, sent_bytes, dropped) = match sock {
                    Some((sock, v6)) => send_run(sock, v6, run, &tx.arena, send_hdrs, stats),
                    None => (0, 0, run.len() as u64),
                };
                let flow = match via {
                    Via::Listener(_) => &m.client_tx,
                    Via::Relay(_) => &m.peer_tx,
                };
                flow.add_many(sent, sent_bytes);
                if dropped > 0 {
                    m.send_dropped.inc_by(dropped);
                }
                at = end;
            }
            tx.items.clear();
            tx.arena.clear();
        }
        for (sock, to, data) in tx.foreign.drain(..) {
            match sock.send_to(&data, to) {
                Ok(_) => m.peer_tx.add(data.len()),
                Err(_) => {
                    m.send_dropped.inc();
                }
            }
        }
        if !tx.streams.is_empty() {
            let streams = lock(&shared.streams);
            for (to, frame) in tx.streams.drain(..) {
                let len = frame.len();
                match streams.get(&to).map(|h| h.tx.try_send(frame)) {
                    Some(Ok(())) => m.client_tx.add(len),
                    Some(Err(_)) => {
                        m.send_dropped.inc();
                    }
                    None => {}
                }
            }
        }
    }

    /// Applies the commands other threads (or this one) posted.
    fn apply_commands(&mut self) {
        if !self.mailbox.pending.load(Ordering::Acquire) {
            return;
        }
        // Cleared before reading, so a command posted meanwhile wakes us again.
        self.mailbox.pending.store(false, Ordering::Release);
        std::mem::swap(&mut *lock(&self.mailbox.cmds), &mut self.cmds);
        let mut cmds = std::mem::take(&mut self.cmds);
        for cmd in cmds.drain(..) {
            match cmd {
                Cmd::Add(addr, sock) => {
                    let slot = self.free.pop().unwrap_or(self.relays.len());
                    let ev = EpollEvent::new(EpollFlags::EPOLLIN, RELAY_BASE + slot as u64);
                    if let Err(e) = self.epoll.add(sock.as_fd(), ev) {
                        tracing::error!(relay = %addr, "cannot watch a relay socket: {e}");
                        self.free.push(slot);
                        continue;
                    }
                    if slot == self.relays.len() {
                        self.relays.push(Some((addr, sock)));
                    } else if let Some(s) = self.relays.get_mut(slot) {
                        *s = Some((addr, sock));
                    }
                    self.by_addr.insert(addr, slot);
                }
                Cmd::Remove(addr) => {
                    if let Some(slot) = self.by_addr.remove(&addr) {
                        if let Some((_, sock)) = self.relays.get_mut(slot).and_then(Option::take) {
                            // Explicitly: another thread may still hold the socket a moment.
                            let _ = self.epoll.delete(sock.as_fd());
                        }
                        self.free.push(slot);
                    }
                }
                Cmd::Stop => self.stopping = true,
            }
        }
        self.cmds = cmds;
    }

    /// Relay sockets this worker reads.
    pub fn relay_count(&self) -> usize {
        self.by_addr.len()
    }
}

impl TxQueue {
    /// Copies what the core returned into the queue.
    fn queue(
        &mut self,
        t: Transmit<'_>,
        listeners: &[(SocketAddr, UdpSocket)],
        by_addr: &HashMap<SocketAddr, usize>,
        shared: &Shared,
    ) {
        let (via, to, data) = match t {
            Transmit::Client { to, data } if to.transport == Transport::Udp => {
                match listeners.iter().position(|(a, _)| *a == to.local) {
                    Some(i) if to.local.is_ipv6() == to.client.is_ipv6() => {
                        (Via::Listener(i), to.client, data)
                    }
                    _ => return,
                }
            }
            Transmit::Client { to, data } => {
                self.streams.push((to, data.to_vec()));
                return;
            }
            Transmit::Peer { relay, peer, data } => match by_addr.get(&relay) {
                Some(r) if relay.is_ipv6() == peer.is_ipv6() => (Via::Relay(*r), peer, data),
                Some(_) => return,
                None => {
                    // Not (yet) read by this worker: registered a moment ago (its Add is
                    // still in the mailbox) or read by another worker.
                    if let Some(s) = shared.relay_socket(relay) {
                        self.foreign.push((s, peer, data.to_vec()));
                    }
                    return;
                }
            },
        };
        let start = self.arena.len();
        self.arena.extend_from_slice(data);
        let seq = u32::try_from(self.items.len()).unwrap_or(u32::MAX);
        self.items.push(TxItem {
            via,
            seq,
            to,
            start,
            len: data.len(),
        });
    }
}

/// One `recvmmsg` of up to `want` datagrams into slots `start..start + want` of `buf`
/// (each [`MAX_DATAGRAM`] bytes); `push` gets each datagram's source and length. Returns how
/// many were read.
#[allow(clippy::too_many_arguments)]
fn recv_batch(
    fd: RawFd,
    v6: bool,
    buf: &mut [u8],
    start: usize,
    want: usize,
    hdr4: &mut MultiHeaders<SockaddrIn>,
    hdr6: &mut MultiHeaders<SockaddrIn6>,
    mut push: impl FnMut(SocketAddr, usize),
) -> Result<usize, Errno> {
    let region = buf
        .get_mut(start * MAX_DATAGRAM..(start + want) * MAX_DATAGRAM)
        .unwrap_or_default();
    let mut chunks = region.chunks_mut(MAX_DATAGRAM);
    let mut iovs: [[IoSliceMut<'_>; 1]; RECV_BATCH] =
        std::array::from_fn(|_| [IoSliceMut::new(chunks.next().unwrap_or_default())]);
    let iovs = iovs.get_mut(..want).unwrap_or_default();
    let flags = MsgFlags::MSG_DONTWAIT;
    let mut n = 0;
    // Each family has its own headers: the kernel shortens a header's address length to
    // what it wrote, and nix does not reset it between calls.
    if v6 {
        for msg in recvmmsg(fd, hdr6, iovs.iter_mut(), flags, None)? {
            n += 1;
            let from = msg
                .address
                .map(|a| SocketAddr::V6(SocketAddrV6::from(a)))
                .unwrap_or_else(|| SocketAddr::from(([0u16; 8], 0)));
            // A truncated datagram (longer than a slot: never for UDP) is dropped.
            if !msg.flags.contains(MsgFlags::MSG_TRUNC) {
                push(from, msg.bytes);
            }
        }
    } else {
        for msg in recvmmsg(fd, hdr4, iovs.iter_mut(), flags, None)? {
            n += 1;
            let from = msg
                .address
                .map(|a| SocketAddr::V4(SocketAddrV4::from(a)))
                .unwrap_or_else(|| SocketAddr::from(([0u8; 4], 0)));
            // A truncated datagram (longer than a slot: never for UDP) is dropped.
            if !msg.flags.contains(MsgFlags::MSG_TRUNC) {
                push(from, msg.bytes);
            }
        }
    }
    Ok(n)
}

/// No control messages.
const NO_CMSG: [ControlMessage<'static>; 0] = [];

/// `sendmmsg` headers, apart from the receive ones: nix's `sendmmsg` points a header's
/// address at the caller's array, which `recvmmsg` would then write through.
pub struct SendHeaders {
    v4: MultiHeaders<SockaddrIn>,
    v6: MultiHeaders<SockaddrIn6>,
}

/// Sends `run` (datagrams through one socket) with `sendmmsg`, [`RECV_BATCH`] at a time.
/// Returns (datagrams sent, bytes sent, datagrams dropped).
fn send_run(
    sock: &UdpSocket,
    v6: bool,
    run: &[TxItem],
    arena: &[u8],
    hdrs: &mut SendHeaders,
    stats: &mut WorkerStats,
) -> (u64, u64, u64) {
    let fd = sock.as_raw_fd();
    let (mut sent, mut bytes, mut dropped) = (0u64, 0u64, 0u64);
    let mut rest = run;
    while !rest.is_empty() {
        let chunk = rest.get(..RECV_BATCH.min(rest.len())).unwrap_or_default();
        stats.send_calls += 1;
        match send_chunk(fd, v6, chunk, arena, hdrs) {
            Ok(0) | Err(Errno::EAGAIN) => {
                // The buffer is full: whatever is left of this socket's queue is dropped.
                dropped += rest.len() as u64;
                break;
            }
            Ok(n) => {
                let n = n.min(chunk.len());
                sent += n as u64;
                bytes += chunk.iter().take(n).map(|i| i.len as u64).sum::<u64>();
                rest = rest.get(n..).unwrap_or_default();
            }
            Err(Errno::EINTR) => {}
            Err(_) => {
                // This datagram cannot go (a bad address, a message too long): drop it alone.
                dropped += 1;
                rest = rest.get(1..).unwrap_or_default();
            }
        }
    }
    (sent, bytes, dropped)
}

/// One `sendmmsg` of `chunk` (at most [`RECV_BATCH`] datagrams, all of the socket's address
/// family: [`TxQueue::queue`] drops the others).
fn send_chunk(
    fd: RawFd,
    v6: bool,
    chunk: &[TxItem],
    arena: &[u8],
    hdrs: &mut SendHeaders,
) -> Result<usize, Errno> {
    let iovs: [[IoSlice<'_>; 1]; RECV_BATCH] = std::array::from_fn(|k| {
        let data = chunk
            .get(k)
            .and_then(|i| arena.get(i.start..i.start + i.len))
            .unwrap_or_default();
        [IoSlice::new(data)]
    });
    let iovs = iovs.get(..chunk.len()).unwrap_or_default();
    let flags = MsgFlags::MSG_DONTWAIT;
    if v6 {
        let addrs: [Option<SockaddrIn6>; RECV_BATCH] =
            std::array::from_fn(|k| match chunk.get(k) {
                Some(TxItem {
                    to: SocketAddr::V6(a),
                    ..
                }) => Some(SockaddrIn6::from(*a)),
                _ => None,
            });
        let addrs = addrs.get(..chunk.len()).unwrap_or_default();
        let r = sendmmsg(fd, &mut hdrs.v6, iovs, addrs, NO_CMSG, flags)?;
        Ok(r.count())
    } else {
        let addrs: [Option<SockaddrIn>; RECV_BATCH] = std::array::from_fn(|k| match chunk.get(k) {
            Some(TxItem {
                to: SocketAddr::V4(a),
                ..
            }) => Some(SockaddrIn::from(*a)),
            _ => None,
        });
        let addrs = addrs.get(..chunk.len()).unwrap_or_default();
        let r = sendmmsg(fd, &mut hdrs.v4, iovs, addrs, NO_CMSG, flags)?;
        Ok(r.count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{self, Parsed};
    use std::time::Duration;

    fn shared() -> Arc<Shared> {
        let args = [
            "lastcall-turn",
            "-n",
            "--realm=example.org",
            "--use-auth-secret",
            "--static-auth-secret=s3cret",
        ];
        let Ok(Parsed::Run(s)) = config::parse(args) else {
            panic!("test configuration")
        };
        let lifecycle = lastcall::Lifecycle::without_signals(s.term);
        crate::server::for_tests(&s.turn, lifecycle.handle(), 1)
    }

    /// A STUN Binding request with transaction id `i`.
    fn binding(i: u32) -> [u8; 20] {
        let mut m = [0u8; 20];
        m[..2].copy_from_slice(&0x0001u16.to_be_bytes());
        m[4..8].copy_from_slice(&0x2112_A442u32.to_be_bytes());
        m[16..].copy_from_slice(&i.to_be_bytes());
        m
    }

    /// The kernel's receive queue of the UDP socket bound on `port` (bytes, /proc/net/udp).
    fn rx_queue(port: u16) -> u64 {
        let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
        let local = format!(":{port:04X}");
        table
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = f.nth(1)?;
                let queues = f.nth(2)?;
                addr.ends_with(&local).then_some(queues)
            })
            .find_map(|q| u64::from_str_radix(q.split(':').nth(1)?, 16).ok())
            .unwrap_or(0)
    }

    /// 100 datagrams queued on a listener before the worker looks: read 32 per `recvmmsg`
    /// (one wake-up, one lock and one `sendmmsg` per 32), the short last batch tells the
    /// queue is empty, no read ever returns EAGAIN, and every request is answered.
    #[test]
    fn a_backlog_larger_than_one_recvmmsg_is_read_in_full_batches_without_an_empty_read() {
        let shared = shared();
        let listener = UdpSocket::bind("127.0.0.1:0").expect("bind listener");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("local address");
        let mut worker = Worker::new(
            Arc::clone(&shared),
            shared.mailbox(0),
            vec![(addr, listener)],
        )
        .expect("worker");
        let client = UdpSocket::bind("127.0.0.1:0").expect("bind client");
        client.connect(addr).expect("connect");
        client.send(&binding(0)).expect("send");
        let deadline = Instant::now() + Duration::from_secs(20);
        let one = loop {
            let q = rx_queue(addr.port());
            if q > 0 {
                break q;
            }
            assert!(
                Instant::now() < deadline,
                "the first datagram never arrived"
            );
            std::thread::yield_now();
        };
        for i in 1..100 {
            client.send(&binding(i)).expect("send");
        }
        while rx_queue(addr.port()) < 100 * one {
            assert!(Instant::now() < deadline, "the datagrams never arrived");
            std::thread::yield_now();
        }

        worker.poll(EpollTimeout::ZERO);
        let first = worker.stats;
        assert_eq!(
            (first.wakeups, first.recv_calls, first.datagrams),
            (1, 1, RECV_BATCH as u64),
            "{first:?}"
        );
        assert_eq!((first.batches, first.send_calls), (1, 1), "{first:?}");
        for _ in 0..3 {
            worker.poll(EpollTimeout::ZERO);
        }
        let all = worker.stats;
        assert_eq!(
            all,
            WorkerStats {
                wakeups: 4,
                recv_calls: 4,
                recv_empty: 0,
                datagrams: 100,
                batches: 4,
                send_calls: 4,
            }
        );
        // Nothing left: level-triggered epoll reports nothing, nothing is read.
        worker.poll(EpollTimeout::ZERO);
        assert_eq!(worker.stats, all);

        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut answered = std::collections::BTreeSet::new();
        let mut buf = [0u8; 256];
        while answered.len() < 100 {
            let n = client.recv(&mut buf).expect("a Binding response");
            let r = buf.get(..n).expect("datagram");
            assert_eq!(r.get(..2), Some(&[0x01, 0x01][..]), "Binding success");
            let id = u32::from_be_bytes(r[16..20].try_into().expect("txid"));
            answered.insert(id);
        }
        assert_eq!(answered.len(), 100);
        assert_eq!(shared.metrics.client_rx.packets.get(), 100);
        assert_eq!(shared.metrics.client_tx.packets.get(), 100);
    }

    /// Relay sockets posted to a worker are read in the same wake-ups as its listener, one
    /// batch for all; removed ones are no longer watched.
    #[test]
    fn relay_sockets_come_and_go_through_the_mailbox() {
        let shared = shared();
        let listener = UdpSocket::bind("127.0.0.1:0").expect("bind listener");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("local address");
        let mailbox = shared.mailbox(0);
        let mut worker = Worker::new(
            Arc::clone(&shared),
            Arc::clone(&mailbox),
            vec![(addr, listener)],
        )
        .expect("worker");
        let mut relays = Vec::new();
        for _ in 0..50 {
            let s = UdpSocket::bind("127.0.0.1:0").expect("bind relay");
            s.set_nonblocking(true).expect("non-blocking");
            let a = s.local_addr().expect("relay address");
            mailbox.post(Cmd::Add(a, Arc::new(s)));
            relays.push(a);
        }
        worker.poll(EpollTimeout::ZERO);
        assert_eq!(worker.relay_count(), 50);
        let peer = UdpSocket::bind("127.0.0.1:0").expect("bind peer");
        for r in &relays {
            peer.send_to(b"no allocation here", r).expect("send");
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while worker.stats.datagrams < 50 {
            assert!(Instant::now() < deadline, "{:?}", worker.stats);
            worker.poll(EpollTimeout::from(100u16));
        }
        assert_eq!(worker.stats.datagrams, 50);
        assert_eq!(worker.stats.recv_empty, 0);
        assert!(worker.stats.batches <= worker.stats.wakeups);
        // Without an allocation the core drops them: counted, nothing sent.
        assert_eq!(shared.metrics.peer_rx.packets.get(), 50);
        assert_eq!(worker.stats.send_calls, 0);
        for r in &relays {
            mailbox.post(Cmd::Remove(*r));
        }
        worker.poll(EpollTimeout::ZERO);
        assert_eq!(worker.relay_count(), 0);
        for r in &relays {
            let _ = peer.send_to(b"closed", r);
        }
        worker.poll(EpollTimeout::from(100u16));
        assert_eq!(worker.stats.datagrams, 50, "a removed socket was read");
    }
}
