//! The TURN server state machine.

use std::net::SocketAddr;
use std::time::{Instant, SystemTime};

use crate::config::ServerConfig;
use crate::types::{ClientAddr, Counters, DrainMode, Event, RelayProvider, Transmit};

/// The sans-IO TURN server: feed it datagrams/frames and time, send what it returns.
pub struct Server {
    config: ServerConfig,
    counters: Counters,
    drain: DrainMode,
    _epoch: (Instant, SystemTime),
}

impl Server {
    /// Create a server. `now` and `wall` anchor the clock: REST credential expiry and nonce
    /// timestamps are computed as `wall + (later_now - now)`.
    pub fn new(config: ServerConfig, now: Instant, wall: SystemTime) -> Server {
        Server {
            config,
            counters: Counters::default(),
            drain: DrainMode::Off,
            _epoch: (now, wall),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Handle one datagram (UDP) or one frame (TCP/TLS, see
    /// [`stream_frame_len`](crate::stream_frame_len)) from a client: a STUN message or
    /// ChannelData. `out` is scratch space for a response; the returned [`Transmit`] borrows
    /// `data` or `out`. Allocation-free for ChannelData and Send indications.
    pub fn handle_client<'a>(
        &mut self,
        now: Instant,
        from: ClientAddr,
        data: &'a [u8],
        relays: &mut dyn RelayProvider,
        out: &'a mut Vec<u8>,
    ) -> Option<Transmit<'a>> {
        let _ = (now, from, data, relays, out);
        None
    }

    /// Handle one datagram received from `peer` on the relay socket bound on `relay`: if the
    /// allocation has a permission for the peer, returns ChannelData (if a channel is bound to
    /// the peer) or a Data indication for the client, written into `out`. Otherwise `None`
    /// (counted in [`Counters::peer_dropped`]).
    pub fn handle_peer<'a>(
        &mut self,
        now: Instant,
        relay: SocketAddr,
        peer: SocketAddr,
        data: &[u8],
        out: &'a mut Vec<u8>,
    ) -> Option<Transmit<'a>> {
        let _ = (now, relay, peer, data, out);
        None
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    /// Expire allocations (releasing their relays), permissions and channels due at `now`.
    pub fn handle_timeout(&mut self, now: Instant, relays: &mut dyn RelayProvider) {
        let _ = (now, relays);
    }

    /// A TCP/TLS client connection closed: delete its allocation (RFC 8656 §3.1).
    pub fn close_client(
        &mut self,
        now: Instant,
        client: &ClientAddr,
        relays: &mut dyn RelayProvider,
    ) {
        let _ = (now, client, relays);
    }

    /// Delete every allocation (shutdown deadline), releasing their relays.
    pub fn clear(&mut self, relays: &mut dyn RelayProvider) {
        let _ = relays;
    }

    /// Next queued event.
    pub fn poll_event(&mut self) -> Option<Event> {
        None
    }

    /// Set the drain mode for new allocations.
    pub fn set_drain(&mut self, mode: DrainMode) {
        self.drain = mode;
    }

    /// Current drain mode.
    pub fn drain(&self) -> &DrainMode {
        &self.drain
    }

    /// Live allocations.
    pub fn allocation_count(&self) -> usize {
        0
    }

    /// Cumulative counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Re-anchor the wall clock (call now and then if the system clock may have been
    /// stepped; not required).
    pub fn sync_wall_clock(&mut self, now: Instant, wall: SystemTime) {
        self._epoch = (now, wall);
    }
}
