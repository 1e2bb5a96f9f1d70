//! The UDP data plane: `relay-threads` I/O threads (plain OS threads, not tokio tasks), each
//! with its own epoll set.
//!
//! A worker owns one client listener socket per listening address (SO_REUSEPORT when there is
//! more than one worker: the kernel spreads clients over the workers by their 4-tuple hash, so
//! a client always reaches the same worker) and the relay sockets of the allocations created
//! through it; relay sockets of TCP/TLS clients are spread round-robin. On each wake-up it
//!
//! 1. reads every ready socket with `recvmmsg` (up to [`BATCH`] datagrams a call; a call
//!    that returns fewer than asked found the queue empty, and epoll is level-triggered, so no
//!    read ever returns EAGAIN in the common case and no datagram is stranded);
//! 2. runs the whole batch (up to [`SLOTS`] datagrams) through the sans-IO core under **one**
//!    lock of the core's mutex, queueing what the core wants sent ([`TxQueue`]);
//! 3. if the batch held new Allocates, binds their relay sockets with the lock released and
//!    answers them under a second lock (their responses join the queue);
//! 4. applies the batch's effects (session guards, relay sockets released, logs), then flushes
//!    the queue with one `sendmmsg` per socket (peer → client datagrams of every allocation
//!    leave through the listener socket, so they batch across allocations), never blocking:
//!    a full socket buffer drops the datagram and counts it (`send_dropped`);
//! 5. only then drops the session guards of allocations the batch ended (their last response
//!    is on its way), and applies relay-socket registrations posted by other threads.
//!
//! Other threads (tokio tasks serving TCP/TLS clients, the timer, the shutdown) reach a worker
//! through its [`Mailbox`].

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

use lastcall_turn_proto::{ClientAddr, Output, RelayRequest, Transport};
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use prometheus_client::metrics::counter::Counter;

use crate::mailbox::{enter_worker, Cmd, Mailbox};
use crate::metrics::WorkerLabel;
use crate::mmsg::{recv_batch, RecvHeaders, SendHeaders, BATCH};
use crate::route::{LocalSockets, TxQueue};
use crate::shared::{Effects, ServerState};
use crate::sockets::MAX_DATAGRAM;

/// Datagrams held (and run through the core under one lock) before they are processed.
pub(crate) const SLOTS: usize = 64;
/// Events taken from one `epoll_wait`.
const EVENTS: usize = 256;

/// The eventfd's epoll token; listeners are `0..listeners`, relay sockets `RELAY_BASE + slot`.
const WAKE_TOKEN: u64 = u64::MAX;
const RELAY_BASE: u64 = 1 << 32;

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

/// Counters of one worker, for the metrics and the tests.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WorkerStats {
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
pub(crate) struct Worker {
    id: usize,
    shared: Arc<ServerState>,
    mailbox: Arc<Mailbox>,
    epoll: Epoll,
    sockets: LocalSockets,
    events: Vec<EpollEvent>,
    ready: Vec<Source>,
    rx_buf: Vec<u8>,
    rx: Vec<RxItem>,
    recv_hdrs: RecvHeaders,
    send_hdrs: SendHeaders,
    out: Vec<u8>,
    tx: TxQueue,
    requests: Vec<RelayRequest>,
    effects: Effects,
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
    pub(crate) fn new(
        shared: Arc<ServerState>,
        mailbox: Arc<Mailbox>,
        listeners: Vec<(SocketAddr, UdpSocket)>,
    ) -> io::Result<Worker> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(nix_err)?;
        epoll
            .add(
                mailbox.wake_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TOKEN),
            )
            .map_err(nix_err)?;
        for (i, (_, sock)) in listeners.iter().enumerate() {
            epoll
                .add(sock, EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
                .map_err(nix_err)?;
        }
        let id = mailbox.id();
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
            sockets: LocalSockets::new(listeners),
            events: vec![EpollEvent::empty(); EVENTS],
            ready: Vec::with_capacity(EVENTS),
            // Pages are only touched by what the kernel writes: small datagrams keep this
            // mostly unmapped.
            rx_buf: vec![0u8; SLOTS * MAX_DATAGRAM],
            rx: Vec::with_capacity(SLOTS),
            recv_hdrs: RecvHeaders::new(),
            send_hdrs: SendHeaders::new(),
            out: Vec::with_capacity(MAX_DATAGRAM),
            tx: TxQueue::default(),
            requests: Vec::new(),
            effects: Effects::default(),
            cmds: Vec::new(),
            stopping: false,
            stats: WorkerStats::default(),
            datagrams_metric,
            wakeups_metric,
        })
    }

    /// Runs until told to stop.
    pub(crate) fn run(mut self) {
        enter_worker(self.id);
        while !self.stopping {
            self.poll(EpollTimeout::NONE);
        }
    }

    /// Waits up to `timeout` for sockets to be ready, then handles everything ready.
    pub(crate) fn poll(&mut self, timeout: EpollTimeout) {
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
                WAKE_TOKEN => self.mailbox.clear_wake(),
                t if t >= RELAY_BASE => {
                    let slot = (t - RELAY_BASE) as usize;
                    if self.sockets.relay(slot).is_some() {
                        self.ready.push(Source::Relay(slot));
                    }
                }
                t => {
                    if let Some(i) = usize::try_from(t)
                        .ok()
                        .filter(|i| self.sockets.listener(*i).is_some())
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

    /// Reads up to [`BATCH`] datagrams (as many as free slots allow) from one socket.
    fn receive(&mut self, source: Source) {
        let start = self.rx.len();
        let want = BATCH.min(SLOTS - start);
        let Worker {
            sockets,
            rx_buf,
            rx,
            recv_hdrs,
            stats,
            ..
        } = self;
        let sock = match source {
            Source::Listener(i) => sockets.listener(i).map(|(a, s)| (s, a.is_ipv6())),
            Source::Relay(r) => sockets.relay(r).map(|(a, s)| (&**s, a.is_ipv6())),
        };
        let Some((sock, v6)) = sock else {
            return;
        };
        // Errors other than EAGAIN (none is expected on an unconnected UDP socket) are
        // retried a few times; a socket still readable is reported again by epoll.
        for _ in 0..3 {
            stats.recv_calls += 1;
            let r = recv_batch(sock, v6, rx_buf, start, want, recv_hdrs, |from, len| {
                rx.push(RxItem { source, from, len });
            });
            match r {
                Ok(n) => {
                    stats.datagrams += n as u64;
                    return;
                }
                Err(Errno::EAGAIN) => {
                    stats.recv_empty += 1;
                    return;
                }
                Err(_) => continue,
            }
        }
    }

    /// Runs the datagrams read through the core under one lock, answers the new Allocates
    /// among them, then sends what the core returned.
    fn process(&mut self) {
        if self.rx.is_empty() {
            return;
        }
        self.stats.batches += 1;
        let Worker {
            id,
            shared,
            sockets,
            rx,
            rx_buf,
            out,
            tx,
            requests,
            effects,
            send_hdrs,
            stats,
            ..
        } = self;
        let now = Instant::now();
        shared.with_core(effects, |server| {
            for (slot, item) in rx.iter().enumerate() {
                let at = slot * MAX_DATAGRAM;
                let Some(data) = rx_buf.get(at..at + item.len) else {
                    continue;
                };
                let output = match item.source {
                    Source::Listener(i) => {
                        let Some((local, _)) = sockets.listener(i) else {
                            continue;
                        };
                        let from = ClientAddr {
                            transport: Transport::Udp,
                            client: item.from,
                            local: *local,
                        };
                        server.handle_client(now, from, data, out)
                    }
                    Source::Relay(r) => {
                        let Some((relay, _)) = sockets.relay(r) else {
                            continue;
                        };
                        server
                            .handle_peer(now, *relay, item.from, data, out)
                            .map(Output::Transmit)
                    }
                };
                match output {
                    Some(Output::Transmit(t)) => tx.queue(t, sockets),
                    Some(Output::BindRelay(r)) => requests.push(r),
                    None => {}
                }
            }
        });
        rx.clear();
        shared.bind_relays(requests, Some(*id), effects, (tx, sockets), out);
        shared.apply(effects);
        let flushed = tx.flush(
            sockets,
            send_hdrs,
            &shared.relays,
            &shared.streams,
            &shared.metrics,
        );
        stats.send_calls += flushed.sendmmsg_calls;
        // The allocations' ends count once their responses are on their way.
        effects.ended.clear();
    }

    /// Applies the commands other threads (or this one) posted.
    fn apply_commands(&mut self) {
        // Replayed requests post commands to this very mailbox (their relay sockets), which
        // wakes nobody: take again until nothing is left.
        loop {
            self.mailbox.take(&mut self.cmds);
            if self.cmds.is_empty() {
                return;
            }
            self.apply_taken();
        }
    }

    /// Applies the commands taken into `self.cmds`.
    fn apply_taken(&mut self) {
        let mut cmds = std::mem::take(&mut self.cmds);
        let mut replays = Vec::new();
        for cmd in cmds.drain(..) {
            match cmd {
                Cmd::Add(addr, sock) => {
                    let slot = self.sockets.next_slot();
                    let ev = EpollEvent::new(EpollFlags::EPOLLIN, RELAY_BASE + slot as u64);
                    if let Err(e) = self.epoll.add(sock.as_fd(), ev) {
                        tracing::error!(relay = %addr, "cannot watch a relay socket: {e}");
                        continue;
                    }
                    self.sockets.add_relay(addr, sock);
                }
                Cmd::Remove(addr) => {
                    if let Some(sock) = self.sockets.remove_relay(addr) {
                        // Explicitly: another thread may still hold the socket a moment.
                        let _ = self.epoll.delete(sock.as_fd());
                    }
                }
                Cmd::Replay(r) => replays.push(r),
                Cmd::Stop => self.stopping = true,
            }
        }
        self.cmds = cmds;
        if !replays.is_empty() {
            self.replay(&replays);
        }
    }

    /// Runs requests that waited for a user-database lookup through the core again, as
    /// [`process`](Self::process) runs what was read.
    fn replay(&mut self, replays: &[lastcall_turn_proto::Replay]) {
        let Worker {
            id,
            shared,
            sockets,
            out,
            tx,
            requests,
            effects,
            send_hdrs,
            stats,
            ..
        } = self;
        let now = Instant::now();
        shared.with_core(effects, |server| {
            for r in replays {
                match server.replay(now, r.client, &r.data, out) {
                    Some(Output::Transmit(t)) => tx.queue(t, sockets),
                    Some(Output::BindRelay(b)) => requests.push(b),
                    None => {}
                }
            }
        });
        shared.bind_relays(requests, Some(*id), effects, (tx, sockets), out);
        shared.apply(effects);
        let flushed = tx.flush(
            sockets,
            send_hdrs,
            &shared.relays,
            &shared.streams,
            &shared.metrics,
        );
        stats.send_calls += flushed.sendmmsg_calls;
        effects.ended.clear();
    }

    /// Relay sockets this worker reads.
    #[cfg(test)]
    pub(crate) fn relay_count(&self) -> usize {
        self.sockets.relay_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{self, Parsed};
    use crate::metrics::CoreCounters;
    use std::time::Duration;

    fn shared() -> Arc<ServerState> {
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
        ServerState::for_tests(&s.turn, lifecycle.handle(), 1)
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
            (1, 1, BATCH as u64),
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
        let (counters, _) = shared.snapshot();
        assert_eq!(counters.client_packets_in, 100);
        assert_eq!(counters.client_packets_out, 100);
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
        assert_eq!(shared.snapshot().0.peer_packets_in, 50);
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
