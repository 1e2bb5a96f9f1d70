//! Where what the core returns goes: the one routing function for every transport, from a UDP
//! I/O thread or a tokio task, and the flush that sends it.
//!
//! A [`Transmit`] goes, in order of preference, through a socket of the sender's own
//! [`LocalSockets`] (a UDP I/O thread's listeners and relay sockets: batched into one
//! `sendmmsg` per socket), to a TCP/TLS connection's writer queue, or through a relay socket
//! another thread reads (sent one by one). Nothing ever waits: a full socket buffer or
//! connection queue drops the datagram and counts it (`lastcall_turn_send_dropped_total`).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use lastcall_turn_proto::{ClientAddr, Transmit, Transport};
use tokio::sync::{mpsc, Notify};

use crate::metrics::Metrics;
use crate::mmsg::{send_run, Queued, SendHeaders};
use crate::relay::RelaySockets;
use crate::sync::lock;

/// The sockets one sender may batch on: a UDP I/O thread's client listeners (one per
/// listening address) and the relay sockets it reads. A tokio task has none.
#[derive(Default)]
pub(crate) struct LocalSockets {
    listeners: Vec<(SocketAddr, UdpSocket)>,
    /// Relay sockets by slot (a slot is reused once its socket is gone).
    relays: Vec<Option<(SocketAddr, Arc<UdpSocket>)>>,
    free: Vec<usize>,
    by_addr: HashMap<SocketAddr, usize>,
}

impl LocalSockets {
    /// A thread's sockets: these listeners, no relay socket yet.
    pub(crate) fn new(listeners: Vec<(SocketAddr, UdpSocket)>) -> LocalSockets {
        LocalSockets {
            listeners,
            ..LocalSockets::default()
        }
    }

    /// Listener `i`: its local address and socket.
    pub(crate) fn listener(&self, i: usize) -> Option<&(SocketAddr, UdpSocket)> {
        self.listeners.get(i)
    }

    /// The relay socket in `slot`.
    pub(crate) fn relay(&self, slot: usize) -> Option<&(SocketAddr, Arc<UdpSocket>)> {
        self.relays.get(slot).and_then(Option::as_ref)
    }

    /// The slot the next [`add_relay`](Self::add_relay) takes.
    pub(crate) fn next_slot(&self) -> usize {
        self.free.last().copied().unwrap_or(self.relays.len())
    }

    /// Adds a relay socket in [`next_slot`](Self::next_slot); returns that slot.
    pub(crate) fn add_relay(&mut self, addr: SocketAddr, sock: Arc<UdpSocket>) -> usize {
        let slot = self.free.pop().unwrap_or(self.relays.len());
        if slot == self.relays.len() {
            self.relays.push(Some((addr, sock)));
        } else if let Some(s) = self.relays.get_mut(slot) {
            *s = Some((addr, sock));
        }
        self.by_addr.insert(addr, slot);
        slot
    }

    /// Removes the relay socket bound on `addr`; returns it.
    pub(crate) fn remove_relay(&mut self, addr: SocketAddr) -> Option<Arc<UdpSocket>> {
        let slot = self.by_addr.remove(&addr)?;
        let sock = self.relays.get_mut(slot).and_then(Option::take);
        self.free.push(slot);
        sock.map(|(_, s)| s)
    }

    /// Relay sockets held.
    #[cfg(test)]
    pub(crate) fn relay_count(&self) -> usize {
        self.by_addr.len()
    }

    fn socket(&self, via: Via) -> Option<(&UdpSocket, bool)> {
        match via {
            Via::Listener(i) => self.listener(i).map(|(a, s)| (s, a.is_ipv6())),
            Via::Relay(r) => self.relay(r).map(|(a, s)| (&**s, a.is_ipv6())),
        }
    }
}

/// How other tasks reach one TCP/TLS client connection.
pub(crate) struct StreamHandle {
    /// Frames to write to the client.
    pub(crate) tx: mpsc::Sender<Vec<u8>>,
    /// Asks the connection to close (its allocation expired).
    pub(crate) close: Arc<Notify>,
}

/// The open TCP/TLS client connections.
#[derive(Default)]
pub(crate) struct Streams {
    map: Mutex<HashMap<ClientAddr, StreamHandle>>,
}

impl Streams {
    pub(crate) fn insert(&self, client: ClientAddr, handle: StreamHandle) {
        lock(&self.map).insert(client, handle);
    }

    pub(crate) fn remove(&self, client: &ClientAddr) {
        lock(&self.map).remove(client);
    }

    /// Asks `client`'s connection to close.
    pub(crate) fn close(&self, client: &ClientAddr) {
        if let Some(h) = lock(&self.map).get(client) {
            h.close.notify_one();
        }
    }
}

/// Which of the sender's own sockets a datagram leaves from; `Ord` groups a flush by socket.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Via {
    Listener(usize),
    Relay(usize),
}

/// One datagram to send through a local socket, its bytes in the queue's arena.
struct TxItem {
    via: Via,
    seq: u32,
    to: SocketAddr,
    start: usize,
    len: usize,
}

impl Queued for TxItem {
    fn to(&self) -> SocketAddr {
        self.to
    }

    fn bytes(&self) -> Range<usize> {
        self.start..self.start + self.len
    }
}

/// What a sender has to send, queued in order and sent by [`flush`](Self::flush).
#[derive(Default)]
pub(crate) struct TxQueue {
    arena: Vec<u8>,
    items: Vec<TxItem>,
    /// Frames for TCP/TLS clients (their writer tasks' queues).
    streams: Vec<(ClientAddr, Vec<u8>)>,
    /// Datagrams through relay sockets another thread reads (a TCP/TLS client's, a relay
    /// registered a moment ago, a reserved EVEN-PORT socket): relay, peer, payload. The
    /// socket is looked up at the flush, with the core's lock released.
    foreign: Vec<(SocketAddr, SocketAddr, Vec<u8>)>,
    /// Transmits with no way out (counted as dropped at the flush).
    unroutable: u64,
}

/// What one flush did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flushed {
    pub(crate) sendmmsg_calls: u64,
    pub(crate) dropped: u64,
}

impl Flushed {
    fn count(&self, metrics: &Metrics) {
        if self.dropped > 0 {
            metrics.send_dropped.inc_by(self.dropped);
        }
    }
}

impl TxQueue {
    /// Routes `t` and copies it into the queue: the one routing decision for every
    /// transport. Takes no lock (it runs under the core's).
    pub(crate) fn queue(&mut self, t: Transmit<'_>, local: &LocalSockets) {
        let (via, to, data) = match t {
            Transmit::Client { to, data } if to.transport == Transport::Udp => {
                // Replies leave from the address the client talks to. Every UDP I/O thread
                // has a listener on each listening address (SO_REUSEPORT), so the thread
                // that produced a UDP client's datagram always has that socket.
                let found = local.listeners.iter().position(|(a, _)| *a == to.local);
                match found {
                    Some(i) if to.local.is_ipv6() == to.client.is_ipv6() => {
                        (Via::Listener(i), to.client, data)
                    }
                    _ => {
                        self.unroutable += 1;
                        return;
                    }
                }
            }
            Transmit::Client { to, data } => {
                self.streams.push((to, data.to_vec()));
                return;
            }
            Transmit::Peer { relay, peer, .. } if relay.is_ipv6() != peer.is_ipv6() => {
                self.unroutable += 1;
                return;
            }
            Transmit::Peer { relay, peer, data } => match local.by_addr.get(&relay) {
                Some(r) => (Via::Relay(*r), peer, data),
                None => {
                    self.foreign.push((relay, peer, data.to_vec()));
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

    /// Sends everything queued: one `sendmmsg` per local socket (in the order queued within
    /// a socket), the foreign datagrams one by one, the frames into their connections'
    /// queues.
    pub(crate) fn flush(
        &mut self,
        local: &LocalSockets,
        hdrs: &mut SendHeaders,
        relays: &RelaySockets,
        streams: &Streams,
        metrics: &Metrics,
    ) -> Flushed {
        let mut flushed = self.send_local(local, hdrs);
        flushed.dropped += self.send_elsewhere(relays, streams);
        flushed.count(metrics);
        flushed
    }

    /// [`flush`](Self::flush) for a sender without local sockets (a tokio task: what it
    /// queued all goes elsewhere).
    pub(crate) fn flush_elsewhere(
        &mut self,
        relays: &RelaySockets,
        streams: &Streams,
        metrics: &Metrics,
    ) {
        let mut flushed = Flushed {
            dropped: self.items.len() as u64,
            ..Flushed::default()
        };
        self.items.clear();
        self.arena.clear();
        flushed.dropped += self.send_elsewhere(relays, streams);
        flushed.count(metrics);
    }

    /// The datagrams through local sockets: one `sendmmsg` per socket.
    fn send_local(&mut self, local: &LocalSockets, hdrs: &mut SendHeaders) -> Flushed {
        let mut flushed = Flushed {
            dropped: std::mem::take(&mut self.unroutable),
            ..Flushed::default()
        };
        if self.items.is_empty() {
            return flushed;
        }
        self.items.sort_unstable_by_key(|i| (i.via, i.seq));
        let mut at = 0;
        while let Some(first) = self.items.get(at) {
            let via = first.via;
            let end = self
                .items
                .get(at..)
                .unwrap_or_default()
                .iter()
                .position(|i| i.via != via)
                .map_or(self.items.len(), |p| at + p);
            let run = self.items.get(at..end).unwrap_or_default();
            match local.socket(via) {
                Some((sock, v6)) => {
                    let r = send_run(sock, v6, run, &self.arena, hdrs);
                    flushed.sendmmsg_calls += r.calls;
                    flushed.dropped += r.dropped;
                }
                None => flushed.dropped += run.len() as u64,
            }
            at = end;
        }
        self.items.clear();
        self.arena.clear();
        flushed
    }

    /// The foreign datagrams one by one and the frames into their connections' queues;
    /// returns how many were dropped.
    fn send_elsewhere(&mut self, relays: &RelaySockets, streams: &Streams) -> u64 {
        let mut dropped = std::mem::take(&mut self.unroutable);
        for (relay, to, data) in self.foreign.drain(..) {
            let sent = relays.get(relay).map(|sock| sock.send_to(&data, to));
            if !matches!(sent, Some(Ok(_))) {
                dropped += 1;
            }
        }
        if !self.streams.is_empty() {
            let map = lock(&streams.map);
            for (to, frame) in self.streams.drain(..) {
                // A connection that is gone takes its frames with it: not a drop.
                if let Some(Err(_)) = map.get(&to).map(|h| h.tx.try_send(frame)) {
                    dropped += 1;
                }
            }
        }
        dropped
    }
}
