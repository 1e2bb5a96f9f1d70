//! The data path: ChannelData and Send indications from clients to peers, datagrams from
//! peers back as ChannelData or Data indications, and `max-bps`'s token buckets. Parsed by
//! hand, written into the caller's buffer: no heap allocation per packet.

use std::net::SocketAddr;
use std::time::Instant;

use super::dispatch::Attrs;
use super::Server;
use crate::frame::{parse_channel_data, write_channel_data};
use crate::stun::{attr, method, Builder, Class};
use crate::types::{ClientAddr, Transmit};

/// One direction's token bucket: at most one second's worth of bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bucket {
    pub(super) tokens: u64,
    pub(super) last: Instant,
}

impl Bucket {
    pub(super) fn full(rate: u64, now: Instant) -> Bucket {
        Bucket {
            tokens: rate,
            last: now,
        }
    }

    /// Takes `len` bytes if the bucket holds them (refilled at `rate` bytes/s first).
    fn take(&mut self, rate: u64, now: Instant, len: usize) -> bool {
        let elapsed = now.saturating_duration_since(self.last);
        if !elapsed.is_zero() {
            let add = u128::from(rate) * elapsed.as_nanos() / 1_000_000_000;
            let add = u64::try_from(add).unwrap_or(u64::MAX);
            if add > 0 {
                self.tokens = self.tokens.saturating_add(add).min(rate);
                self.last = now;
            }
        }
        let len = len as u64;
        if self.tokens >= len {
            self.tokens -= len;
            true
        } else {
            false
        }
    }
}

/// `max-bps` buckets of one allocation.
#[derive(Clone, Copy, Debug)]
pub(super) struct Buckets {
    pub(super) rate: u64,
    /// Client to peer.
    pub(super) up: Bucket,
    /// Peer to client.
    pub(super) down: Bucket,
}

impl Server {
    pub(super) fn channel_data_from_client<'a>(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        data: &'a [u8],
    ) -> Option<Transmit<'a>> {
        let Some((number, payload)) = parse_channel_data(data) else {
            self.counters.malformed += 1;
            return None;
        };
        let idx = self.by_client.get(from).copied();
        self.heard(idx, now);
        let found = idx.and_then(|i| {
            let a = self.allocs.get(i)?.as_ref().filter(|a| a.expires > now)?;
            let ch = a
                .channels
                .iter()
                .find(|c| c.number == number && c.expires > now)?;
            let permitted = a
                .perms
                .iter()
                .any(|(ip, exp)| *ip == ch.peer.ip() && *exp > now);
            let relay = a.relays.for_family(ch.peer.is_ipv4())?;
            permitted.then_some((relay, ch.peer))
        });
        if found.is_some() && !self.bandwidth_up(idx, now, payload.len()) {
            return None;
        }
        self.relay_to_peer(idx, found, payload, data.len())
    }

    /// Whether allocation `idx` may relay `len` more bytes from its client (`max-bps`);
    /// counts what it may not.
    fn bandwidth_up(&mut self, idx: Option<usize>, now: Instant, len: usize) -> bool {
        let bw = idx.and_then(|i| self.allocs.get_mut(i)?.as_mut()?.bandwidth.as_mut());
        let Some(b) = bw else {
            return true;
        };
        let rate = b.rate;
        if b.up.take(rate, now, len) {
            return true;
        }
        self.counters.bandwidth_dropped += 1;
        false
    }

    pub(super) fn send_indication<'a>(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        attrs: &Attrs<'a>,
        wire: usize,
    ) -> Option<Transmit<'a>> {
        let (Some(peer), Some(payload)) = (attrs.peer, attrs.data) else {
            self.counters.client_data_dropped += 1;
            return None;
        };
        if attrs.malformed || attrs.unknown_count > 0 {
            self.counters.client_data_dropped += 1;
            return None;
        }
        let idx = self.by_client.get(from).copied();
        self.heard(idx, now);
        let found = idx.and_then(|i| {
            let a = self.allocs.get(i)?.as_ref().filter(|a| a.expires > now)?;
            let permitted = a
                .perms
                .iter()
                .any(|(ip, exp)| *ip == peer.ip() && *exp > now);
            let relay = a.relays.for_family(peer.is_ipv4())?;
            permitted.then_some((relay, peer))
        });
        if found.is_some() && !self.bandwidth_up(idx, now, payload.len()) {
            return None;
        }
        self.relay_to_peer(idx, found, payload, wire)
    }

    /// Relays `payload` of the client's datagram of `wire` bytes, if `found` (the
    /// allocation `idx`'s relay and peer).
    fn relay_to_peer<'a>(
        &mut self,
        idx: Option<usize>,
        found: Option<(SocketAddr, SocketAddr)>,
        payload: &'a [u8],
        wire: usize,
    ) -> Option<Transmit<'a>> {
        match found {
            Some((relay, peer)) => {
                self.counters.peer_packets_out += 1;
                self.counters.peer_bytes_out += payload.len() as u64;
                if let Some(a) = idx.and_then(|i| self.allocs.get_mut(i)?.as_mut()) {
                    a.traffic.to_peer_datagrams += 1;
                    a.traffic.to_peer_bytes += payload.len() as u64;
                }
                if let Some(t) = self.traffic_of(idx) {
                    t.to_peer(wire, payload.len());
                }
                Some(Transmit::Peer {
                    relay,
                    peer,
                    data: payload,
                })
            }
            None => {
                self.counters.client_data_dropped += 1;
                None
            }
        }
    }

    /// Handle one datagram received from `peer` on the relay socket bound on `relay`: if the
    /// allocation has a permission for the peer, returns ChannelData (if a channel is bound to
    /// the peer; padded to 4 bytes for TCP/TLS clients) or a Data indication for the client,
    /// written into `out`. Otherwise `None` (counted in [`Counters::peer_dropped`](crate::Counters::peer_dropped)).
    pub fn handle_peer<'a>(
        &mut self,
        now: Instant,
        relay: SocketAddr,
        peer: SocketAddr,
        data: &[u8],
        out: &'a mut Vec<u8>,
    ) -> Option<Transmit<'a>> {
        self.counters.peer_packets_in += 1;
        self.counters.peer_bytes_in += data.len() as u64;
        let idx = self.by_relay.get(&relay).copied();
        let target = idx.and_then(|i| {
            let a = self.allocs.get(i)?.as_ref()?;
            if a.expires <= now
                || !a
                    .perms
                    .iter()
                    .any(|(ip, exp)| *ip == peer.ip() && *exp > now)
            {
                return None;
            }
            let ch = a
                .channels
                .iter()
                .find(|c| c.peer == peer && c.expires > now)
                .map(|c| c.number);
            Some((a.client, ch))
        });
        let Some((client, channel)) = target else {
            self.counters.peer_dropped += 1;
            return None;
        };
        let bw = idx.and_then(|i| self.allocs.get_mut(i)?.as_mut()?.bandwidth.as_mut());
        if let Some(b) = bw {
            if !b.down.take(b.rate, now, data.len()) {
                self.counters.bandwidth_dropped += 1;
                return None;
            }
        }
        let ok = match channel {
            Some(n) => write_channel_data(out, n, data, client.transport.is_stream()),
            None => self.write_data_indication(out, peer, data),
        };
        if !ok {
            self.counters.peer_dropped += 1;
            return None;
        }
        if let Some(a) = idx.and_then(|i| self.allocs.get_mut(i)?.as_mut()) {
            a.traffic.from_peer_datagrams += 1;
            a.traffic.from_peer_bytes += data.len() as u64;
        }
        self.counters.client_packets_out += 1;
        self.counters.client_bytes_out += out.len() as u64;
        if let Some(t) = self.traffic_of(idx) {
            t.to_client(data.len(), out.len());
        }
        let out: &'a Vec<u8> = out;
        Some(Transmit::Client {
            to: client,
            data: out,
        })
    }

    fn write_data_indication(&mut self, out: &mut Vec<u8>, peer: SocketAddr, data: &[u8]) -> bool {
        if data.len() > usize::from(u16::MAX) - 64 {
            return false;
        }
        self.txid_counter = self.txid_counter.wrapping_add(1);
        let mut txid = [0u8; 12];
        txid[..8].copy_from_slice(&self.txid_seed);
        txid[8..].copy_from_slice(&self.txid_counter.to_be_bytes());
        let mut b = Builder::new(out, method::DATA, Class::Indication, txid);
        b.xor_address(attr::XOR_PEER_ADDRESS, peer)
            .attr(attr::DATA, data);
        if self.config.fingerprint {
            b.fingerprint();
        }
        true
    }
}
