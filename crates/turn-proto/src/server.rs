//! The TURN server state machine.
//!
//! Request processing follows RFC 8656 §7-§12 with authentication first (RFC 8489 §9.2):
//! FINGERPRINT (discard if wrong) → credentials (401/438/400) → unknown
//! comprehension-required attributes (420) → method-specific checks.
//!
//! **No amplification.** Every response to an unauthenticated request (no or failed
//! MESSAGE-INTEGRITY, or an anonymous server) that would be larger than the request is
//! dropped (and counted in [`Counters::suppressed_responses`]), with two exceptions without
//! which clients could not work: the Binding success response (header + XOR-MAPPED-ADDRESS,
//! plus FINGERPRINT if the request had one: at most 52 bytes) and the 401/438 challenge
//! (header + ERROR-CODE without reason phrase + REALM + a 16-byte NONCE, plus FINGERPRINT if
//! the request had one: at most `64 + realm` bytes), which a client needs before it can
//! authenticate. Over UDP those two are limited per source IP to
//! [`ServerConfig::unauthorized_rps`] a second (a fixed table: no memory per source). Responses to authenticated requests are not limited: nonces are bound to
//! the client's IP address, so an off-path attacker spoofing a victim's address can never
//! produce an authenticated request.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::auth::{check_nonce_with, keys_for, make_nonce, Keys, NonceCheck};
use crate::config::{Bandwidth, ServerConfig, Service};
use crate::frame::{channel_in_range, parse_channel_data, write_channel_data};
use crate::hash::Seeded;
use crate::stun::{attr, decode_address, method, reason_phrase, Attr, Builder, Class, Message};
use crate::types::{
    AuthFailure, ClientAddr, Counters, DeleteReason, DrainMode, Event, Output, RelayAddrs,
    Transmit, Transport, MAX_QUEUED_EVENTS,
};

mod allocate;
mod reclaim;
mod routes;

use allocate::{Pending, Reservation};

/// After a channel binding expires, its number and peer stay reserved this long
/// (RFC 8656 §12: no rebinding to another peer/channel for 5 minutes).
const CHANNEL_QUARANTINE: Duration = Duration::from_secs(300);

/// Address family codes of REQUESTED-ADDRESS-FAMILY and friends.
const FAMILY_V4: u8 = 0x01;
const FAMILY_V6: u8 = 0x02;

/// The sans-IO TURN server: feed it datagrams/frames and time, send what it returns.
pub struct Server {
    config: ServerConfig,
    counters: Counters,
    drain: DrainMode,
    epoch: (Instant, u64),
    allocs: Vec<Option<Allocation>>,
    free: Vec<usize>,
    by_client: HashMap<ClientAddr, usize, Seeded>,
    by_relay: HashMap<SocketAddr, usize, Seeded>,
    per_user: HashMap<String, u32>,
    live: usize,
    /// Live allocations by client transport (UDP, TCP, TLS).
    live_by_transport: [usize; 3],
    timers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    events: VecDeque<Event>,
    /// Queued events that are not an allocation's creation or deletion (only these are
    /// dropped past [`MAX_QUEUED_EVENTS`]).
    notices: usize,
    next_gen: u64,
    relay_rr: usize,
    alternate_rr: usize,
    txid_seed: [u8; 8],
    txid_counter: u32,
    reservations: Vec<Reservation>,
    /// Allocates waiting for their relay sockets (few: the I/O layer answers at once).
    pending: Vec<Pending>,
    next_request: u64,
    /// Relay sockets to close, for [`Server::poll_release`].
    releases: VecDeque<SocketAddr>,
    /// Alternates by client transport (UDP, TCP, TLS) that replace the drain's list.
    transport_alternates: [Vec<SocketAddr>; 3],
    /// Bandwidth reserved by live and waiting allocations (`bps-capacity`).
    bps_reserved: u64,
    /// Amplifying responses sent to UDP sources this second (`unauthorized_rps`).
    unauthorized: SourceBudget,
    /// Changes to the fast path's routes, when that output is on ([`crate::fastpath`]).
    routes: Option<VecDeque<crate::fastpath::RouteChange>>,
}

/// Slots of [`SourceBudget`]: sources hashed together share one budget (rarely, with a random
/// seed), and the memory is fixed whatever the number of sources.
const SOURCE_SLOTS: usize = 4096;

/// A per-source-IP count of responses in the current second, in a fixed table.
struct SourceBudget {
    hasher: Seeded,
    /// Second 1 starts here (0: a slot never used).
    anchor: Instant,
    /// (second, responses sent in it) per slot.
    slots: Box<[(u64, u32)]>,
}

impl SourceBudget {
    fn new(now: Instant) -> SourceBudget {
        SourceBudget {
            hasher: Seeded::random(),
            anchor: now,
            slots: vec![(0, 0); SOURCE_SLOTS].into_boxed_slice(),
        }
    }

    /// Whether `ip` may get one more response in the second of `now`, counting it if so.
    fn take(&mut self, ip: IpAddr, now: Instant, limit: u32) -> bool {
        use std::hash::BuildHasher;
        let second = now.saturating_duration_since(self.anchor).as_secs() + 1;
        let slot = &mut self.slots[(self.hasher.hash_one(ip) as usize) % SOURCE_SLOTS];
        if slot.0 != second {
            *slot = (second, 0);
        }
        if slot.1 >= limit {
            return false;
        }
        slot.1 += 1;
        true
    }
}

struct Allocation {
    gen: u64,
    client: ClientAddr,
    relays: RelayAddrs,
    username: String,
    expires: Instant,
    lifetime: u32,
    allocate_txid: [u8; 12],
    perms: Vec<(IpAddr, Instant)>,
    channels: Vec<Channel>,
    scheduled: Instant,
    /// When its client was last heard from (any datagram or frame on its 5-tuple, or
    /// [`Server::note_client_activity`]): the idle reclaim of a drain reads it.
    last_heard: Instant,
    /// The canonical ORIGIN of the Allocate (`check-origin-consistency`).
    origin: Option<String>,
    /// `max-bps`: the allocation's buckets, and what it reserved of `bps-capacity`.
    bandwidth: Option<Buckets>,
}

/// What an allocation is given besides its relays: its ORIGIN and its bandwidth.
#[derive(Clone, Debug, Default)]
pub(crate) struct Grant {
    origin: Option<String>,
    /// Bytes per second in each direction (0: no limit), reserved of `bps-capacity`.
    bps: u64,
}

/// One direction's token bucket: at most one second's worth of bytes.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: u64,
    last: Instant,
}

impl Bucket {
    fn full(rate: u64, now: Instant) -> Bucket {
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
struct Buckets {
    rate: u64,
    /// Client to peer.
    up: Bucket,
    /// Peer to client.
    down: Bucket,
}

#[derive(Clone, Copy)]
struct Channel {
    number: u16,
    peer: SocketAddr,
    expires: Instant,
}

/// Attributes of a request/indication, gathered in one pass.
#[derive(Default)]
struct Attrs<'a> {
    username: Option<&'a [u8]>,
    realm: Option<&'a [u8]>,
    nonce: Option<&'a [u8]>,
    integrity: Option<Attr<'a>>,
    integrity256: Option<Attr<'a>>,
    fingerprint: Option<Attr<'a>>,
    origin: Option<&'a [u8]>,
    lifetime: Option<u32>,
    transport: Option<u8>,
    family: Option<u8>,
    additional_family: Option<u8>,
    channel: Option<u16>,
    data: Option<&'a [u8]>,
    peer: Option<SocketAddr>,
    peer_count: usize,
    even_port: Option<bool>,
    reservation_token: Option<[u8; 8]>,
    /// A known attribute with a malformed value.
    malformed: bool,
    unknown: [u16; 8],
    unknown_count: usize,
}

impl<'a> Attrs<'a> {
    fn gather(msg: &Message<'a>) -> Attrs<'a> {
        let txid = msg.transaction_id();
        let mut a = Attrs::default();
        let mut after_integrity = false;
        for at in msg.attributes() {
            match at.typ {
                attr::FINGERPRINT => a.fingerprint = Some(at),
                attr::MESSAGE_INTEGRITY_SHA256 if a.integrity256.is_none() => {
                    a.integrity256 = Some(at);
                    after_integrity = true;
                }
                _ if after_integrity => {}
                attr::MESSAGE_INTEGRITY => {
                    a.integrity = Some(at);
                    after_integrity = true;
                }
                attr::USERNAME => a.username = Some(at.value),
                attr::REALM => a.realm = Some(at.value),
                attr::NONCE => a.nonce = Some(at.value),
                attr::ORIGIN if a.origin.is_none() && !at.value.is_empty() => {
                    a.origin = Some(at.value);
                }
                attr::LIFETIME => match <[u8; 4]>::try_from(at.value) {
                    Ok(v) => a.lifetime = Some(u32::from_be_bytes(v)),
                    Err(_) => a.malformed = true,
                },
                attr::REQUESTED_TRANSPORT => match at.value {
                    [p, _, _, _] => a.transport = Some(*p),
                    _ => a.malformed = true,
                },
                attr::REQUESTED_ADDRESS_FAMILY => match at.value {
                    [f, _, _, _] => a.family = Some(*f),
                    _ => a.malformed = true,
                },
                attr::ADDITIONAL_ADDRESS_FAMILY => match at.value {
                    [f, _, _, _] => a.additional_family = Some(*f),
                    _ => a.malformed = true,
                },
                attr::CHANNEL_NUMBER => match at.value {
                    [h, l, _, _] => a.channel = Some(u16::from_be_bytes([*h, *l])),
                    _ => a.malformed = true,
                },
                attr::DATA => a.data = Some(at.value),
                attr::EVEN_PORT => match at.value {
                    [flags, ..] => a.even_port = Some(flags & 0x80 != 0),
                    [] => a.malformed = true,
                },
                attr::RESERVATION_TOKEN => match <[u8; 8]>::try_from(at.value) {
                    Ok(t) => a.reservation_token = Some(t),
                    Err(_) => a.malformed = true,
                },
                attr::XOR_PEER_ADDRESS => {
                    match decode_address(at.value, &txid, true) {
                        Some(p) if a.peer.is_none() => a.peer = Some(p),
                        Some(_) => {}
                        None => a.malformed = true,
                    }
                    a.peer_count += 1;
                }
                // Known and accepted without effect: DONT-FRAGMENT (accepted; the relay does
                // not set DF), PASSWORD-ALGORITHM (only MD5 is used), SOFTWARE, ICE attributes.
                attr::DONT_FRAGMENT
                | attr::PASSWORD_ALGORITHM
                | attr::PRIORITY
                | attr::USE_CANDIDATE
                | attr::XOR_MAPPED_ADDRESS
                | attr::MAPPED_ADDRESS
                | attr::ERROR_CODE
                | attr::UNKNOWN_ATTRIBUTES
                | attr::XOR_RELAYED_ADDRESS => {}
                // Comprehension-required and not understood (this includes USERHASH,
                // CONNECTION-ID, BANDWIDTH): 420.
                t if t < 0x8000
                    && a.unknown_count < a.unknown.len()
                    && !a.unknown[..a.unknown_count].contains(&t) =>
                {
                    a.unknown[a.unknown_count] = t;
                    a.unknown_count += 1;
                }
                _ => {}
            }
        }
        a
    }
}

/// Successful authentication.
struct Authed {
    username: String,
    key: [u8; 16],
    sha256: bool,
    /// REST credential expiry.
    expiry: Option<Instant>,
}

/// How to finish a response.
#[derive(Clone, Copy)]
struct Ctx {
    method: u16,
    txid: [u8; 12],
    fingerprint: bool,
    auth: Option<([u8; 16], bool)>,
    /// The request's length (a reason phrase must not make an unauthenticated answer larger).
    request_len: usize,
}

impl Ctx {
    /// Responses to authenticated requests are not size-limited (see the module docs).
    fn reply_kind(&self) -> Reply {
        if self.auth.is_some() {
            Reply::Authenticated
        } else {
            Reply::Normal
        }
    }
}

/// What a request handler produced.
enum Reply {
    /// A response in `out`, subject to the amplification guard.
    Normal,
    /// A response in `out` exempt from the guard (Binding success, 401/438 challenge).
    Exempt,
    /// A response in `out` to an authenticated request (not limited: a spoofed source cannot
    /// produce one, nonces being bound to the client's IP address).
    Authenticated,
    /// No response yet: the Allocate waits for these relay sockets.
    Bind(crate::RelayRequest),
    /// No response: a retransmitted Allocate whose relay sockets are being bound (the answer
    /// to the first one answers both).
    Silent,
}

impl Server {
    /// Create a server. `now` and `wall` anchor the clock: REST credential expiry and nonce
    /// timestamps use `wall + (later_now - now)`.
    pub fn new(config: ServerConfig, now: Instant, wall: SystemTime) -> Server {
        let mut server = Server {
            config,
            counters: Counters::default(),
            drain: DrainMode::Off,
            epoch: (now, 0),
            allocs: Vec::new(),
            free: Vec::new(),
            by_client: HashMap::with_hasher(Seeded::random()),
            by_relay: HashMap::with_hasher(Seeded::random()),
            per_user: HashMap::new(),
            live: 0,
            live_by_transport: [0; 3],
            timers: BinaryHeap::new(),
            events: VecDeque::new(),
            notices: 0,
            next_gen: 1,
            relay_rr: 0,
            alternate_rr: 0,
            txid_seed: rand::random(),
            txid_counter: 0,
            reservations: Vec::new(),
            pending: Vec::new(),
            next_request: 1,
            releases: VecDeque::new(),
            transport_alternates: Default::default(),
            bps_reserved: 0,
            unauthorized: SourceBudget::new(now),
            routes: None,
        };
        server.sync_wall_clock(now, wall);
        server
    }

    /// The configuration in use.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Re-anchor the wall clock (call now and then if the system clock may have been
    /// stepped; not required).
    pub fn sync_wall_clock(&mut self, now: Instant, wall: SystemTime) {
        let secs = wall
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.epoch = (now, secs);
    }

    fn unix(&self, now: Instant) -> u64 {
        let (i, s) = self.epoch;
        if now >= i {
            s.saturating_add(now.duration_since(i).as_secs())
        } else {
            s.saturating_sub(i.duration_since(now).as_secs())
        }
    }

    fn instant_of_unix(&self, now: Instant, unix: u64) -> Instant {
        let cur = self.unix(now);
        if unix >= cur {
            now.checked_add(Duration::from_secs(unix - cur))
                .unwrap_or(now)
        } else {
            now
        }
    }

    /// Set the drain mode for new allocations. From Refusing on, with
    /// [`ServerConfig::drain_idle_timeout`], allocations whose client went quiet are
    /// reclaimed (see [`note_client_activity`](Self::note_client_activity)).
    pub fn set_drain(&mut self, mode: DrainMode) {
        self.drain = mode;
        self.schedule_idle_checks();
    }

    /// Current drain mode.
    pub fn drain(&self) -> &DrainMode {
        &self.drain
    }

    /// Alternates for clients of one transport (coturn's `udp-alternate-server`,
    /// `tcp-alternate-server`, `tls-alternate-server`): while refusing, a new Allocate over
    /// `transport` is sent to these instead of the drain's list (empty: the drain's list).
    pub fn set_transport_alternates(&mut self, transport: Transport, alternates: Vec<SocketAddr>) {
        if let Some(slot) = self
            .transport_alternates
            .get_mut(transport_index(transport))
        {
            *slot = alternates;
        }
    }

    /// Replaces the credentials (a user database was read again): static users and TURN REST
    /// API secrets. Allocations keep going; their next request is checked with these.
    pub fn set_credentials(
        &mut self,
        users: HashMap<String, crate::UserKey>,
        rest_secrets: Vec<Vec<u8>>,
    ) {
        self.config.auth.users = users;
        self.config.auth.rest_secrets = rest_secrets;
    }

    /// Replaces the `allowed-peer-ip` and `denied-peer-ip` ranges; new permissions and
    /// channels are checked with these.
    pub fn set_peer_ranges(&mut self, allowed: Vec<crate::IpRange>, denied: Vec<crate::IpRange>) {
        self.config.peer_policy.allowed = allowed;
        self.config.peer_policy.denied = denied;
    }

    /// Replaces the quotas and bandwidth limits (realm options of a user database); they
    /// apply to new allocations.
    pub fn set_limits(&mut self, quotas: crate::Quotas, bandwidth: Bandwidth) {
        self.config.quotas = quotas;
        self.config.bandwidth = bandwidth;
    }

    /// Bandwidth reserved of `bps-capacity` by live and waiting allocations.
    pub fn bandwidth_reserved(&self) -> u64 {
        self.bps_reserved
    }

    /// Live allocations.
    pub fn allocation_count(&self) -> usize {
        self.live
    }

    /// Live allocations per client transport: `(udp, tcp, tls)`.
    pub fn allocation_count_by_transport(&self) -> (usize, usize, usize) {
        let [udp, tcp, tls] = self.live_by_transport;
        (udp, tcp, tls)
    }

    /// Whether `client` holds a live allocation.
    pub fn has_allocation(&self, client: &ClientAddr) -> bool {
        self.by_client.contains_key(client)
    }

    /// Allocates waiting for their relay sockets ([`Output::BindRelay`] not yet answered).
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// The next relay socket to close: its allocation ended, its reservation expired, or it
    /// was bound for an Allocate that had stopped waiting. Call until `None` after every call
    /// into the server (the queue is not bounded: dropping an entry would leak a socket).
    pub fn poll_release(&mut self) -> Option<SocketAddr> {
        self.releases.pop_front()
    }

    /// Cumulative counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Next queued event.
    pub fn poll_event(&mut self) -> Option<Event> {
        let e = self.events.pop_front()?;
        if !e.is_lifecycle() {
            self.notices = self.notices.saturating_sub(1);
        }
        Some(e)
    }

    /// Queues `e`. An allocation's creation and deletion are always queued (a lost one would
    /// leave a session guard held, and a drain could only end at its deadline; there are at
    /// most two per allocation); past [`MAX_QUEUED_EVENTS`] other events, a new one is
    /// dropped and counted.
    fn push_event(&mut self, e: Event) {
        if !e.is_lifecycle() {
            if self.notices >= MAX_QUEUED_EVENTS {
                self.counters.events_dropped += 1;
                return;
            }
            self.notices += 1;
        }
        self.events.push_back(e);
    }

    // ----------------------------------------------------------------------------------
    // Client side
    // ----------------------------------------------------------------------------------

    /// Handle one datagram (UDP) or one frame (TCP/TLS, see
    /// [`stream_frame_len`](crate::stream_frame_len)) from a client: a STUN message or
    /// ChannelData. `out` is scratch space for a response; a returned [`Transmit`] borrows
    /// `data` (payload for a peer) or `out` (response to the client). A new allocation returns
    /// [`Output::BindRelay`] instead of its response. Allocation-free for ChannelData and
    /// Send indications.
    pub fn handle_client<'a>(
        &mut self,
        now: Instant,
        from: ClientAddr,
        data: &'a [u8],
        out: &'a mut Vec<u8>,
    ) -> Option<Output<'a>> {
        self.counters.client_packets_in += 1;
        self.counters.client_bytes_in += data.len() as u64;
        let first = *data.first()?;
        if first >> 6 == 1 {
            return self
                .channel_data_from_client(now, &from, data)
                .map(Output::Transmit);
        }
        let Ok(msg) = Message::parse(data) else {
            self.counters.malformed += 1;
            return None;
        };
        let attrs = Attrs::gather(&msg);
        if let Some(fp) = attrs.fingerprint {
            if !msg.check_fingerprint(fp.offset, fp.value) {
                self.counters.malformed += 1;
                return None;
            }
        }
        match msg.class() {
            Class::Indication if msg.method() == method::SEND => self
                .send_indication(now, &from, &attrs)
                .map(Output::Transmit),
            Class::Request => match self.request(now, &from, &msg, &attrs, out) {
                Reply::Bind(request) => Some(Output::BindRelay(request)),
                reply => self
                    .respond(now, reply, data.len(), from, out)
                    .map(Output::Transmit),
            },
            _ => None,
        }
    }

    /// The response in `out` to a request of `request_len` bytes, unless the amplification
    /// guard drops it.
    fn respond<'a>(
        &mut self,
        now: Instant,
        reply: Reply,
        request_len: usize,
        to: ClientAddr,
        out: &'a [u8],
    ) -> Option<Transmit<'a>> {
        match reply {
            Reply::Normal if out.len() > request_len => {
                self.counters.suppressed_responses += 1;
                None
            }
            Reply::Exempt
                if out.len() > request_len
                    && to.transport == Transport::Udp
                    && self.config.unauthorized_rps > 0
                    && !self.unauthorized.take(
                        to.client.ip(),
                        now,
                        self.config.unauthorized_rps,
                    ) =>
            {
                self.counters.ratelimited_responses += 1;
                None
            }
            Reply::Normal | Reply::Exempt | Reply::Authenticated => {
                self.counters.client_packets_out += 1;
                self.counters.client_bytes_out += out.len() as u64;
                Some(Transmit::Client { to, data: out })
            }
            Reply::Bind(_) | Reply::Silent => None,
        }
    }

    fn channel_data_from_client<'a>(
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
        self.relay_to_peer(found, payload)
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

    fn send_indication<'a>(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        attrs: &Attrs<'a>,
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
        self.relay_to_peer(found, payload)
    }

    fn relay_to_peer<'a>(
        &mut self,
        found: Option<(SocketAddr, SocketAddr)>,
        payload: &'a [u8],
    ) -> Option<Transmit<'a>> {
        match found {
            Some((relay, peer)) => {
                self.counters.peer_packets_out += 1;
                self.counters.peer_bytes_out += payload.len() as u64;
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

    // ----------------------------------------------------------------------------------
    // Peer side
    // ----------------------------------------------------------------------------------

    /// Handle one datagram received from `peer` on the relay socket bound on `relay`: if the
    /// allocation has a permission for the peer, returns ChannelData (if a channel is bound to
    /// the peer; padded to 4 bytes for TCP/TLS clients) or a Data indication for the client,
    /// written into `out`. Otherwise `None` (counted in [`Counters::peer_dropped`]).
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
        self.counters.client_packets_out += 1;
        self.counters.client_bytes_out += out.len() as u64;
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

    // ----------------------------------------------------------------------------------
    // Timers
    // ----------------------------------------------------------------------------------

    /// When [`handle_timeout`](Self::handle_timeout) should next be called (may be early;
    /// calling early is harmless).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let alloc = self.timers.peek().map(|Reverse((t, _, _))| *t);
        [alloc, self.allocate_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Expire allocations (releasing their relays), permissions, channels, reservations and
    /// Allocates that waited too long for their relay sockets, all due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.expire_allocates(now);
        while let Some(Reverse((t, idx, gen))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            let idle = self.idle_limit();
            let end = match self.allocs.get(idx) {
                Some(Some(a)) if a.gen == gen && a.scheduled == t => {
                    if a.expires <= now {
                        Some(DeleteReason::Expired)
                    } else if reclaim::is_idle(a, idle, now) {
                        Some(DeleteReason::Reclaimed)
                    } else {
                        None
                    }
                }
                _ => continue, // stale entry
            };
            if let Some(reason) = end {
                if reason == DeleteReason::Reclaimed {
                    self.counters.allocations_reclaimed += 1;
                }
                self.delete(idx, reason);
                continue;
            }
            let Some(Some(a)) = self.allocs.get_mut(idx) else {
                continue;
            };
            a.perms.retain(|(_, exp)| *exp > now);
            Server::unpublish_routes(
                &mut self.routes,
                a,
                a.channels
                    .iter()
                    .filter(|c| c.expires + CHANNEL_QUARANTINE <= now),
            );
            a.channels.retain(|c| c.expires + CHANNEL_QUARANTINE > now);
            let next = reclaim::with_idle_deadline(next_deadline(a, now), a, idle);
            a.scheduled = next;
            self.timers.push(Reverse((next, idx, gen)));
        }
    }

    fn reschedule(&mut self, idx: usize, now: Instant) {
        let idle = self.idle_limit();
        if let Some(Some(a)) = self.allocs.get_mut(idx) {
            let next = reclaim::with_idle_deadline(next_deadline(a, now), a, idle);
            if next < a.scheduled {
                a.scheduled = next;
                self.timers.push(Reverse((next, idx, a.gen)));
            }
        }
    }

    /// A TCP/TLS client connection closed: delete its allocation (RFC 8656 §3.1), or forget
    /// its Allocate if that was still waiting for relay sockets.
    pub fn close_client(&mut self, _now: Instant, client: &ClientAddr) {
        if let Some(&idx) = self.by_client.get(client) {
            self.delete(idx, DeleteReason::ConnectionClosed);
        }
        self.forget_allocates(|p| p.client == *client);
    }

    /// Delete every allocation (shutdown deadline) and forget every waiting Allocate; their
    /// relay sockets go to [`poll_release`](Self::poll_release).
    pub fn clear(&mut self) {
        for idx in 0..self.allocs.len() {
            if self.allocs[idx].is_some() {
                self.delete(idx, DeleteReason::Shutdown);
            }
        }
        self.timers.clear();
        self.releases
            .extend(self.reservations.drain(..).map(|r| r.relay));
        self.forget_allocates(|_| true);
    }

    fn delete(&mut self, idx: usize, reason: DeleteReason) {
        let Some(a) = self.allocs.get_mut(idx).and_then(Option::take) else {
            return;
        };
        Server::unpublish_routes(&mut self.routes, &a, &a.channels);
        self.free.push(idx);
        self.live = self.live.saturating_sub(1);
        let by_transport = &mut self.live_by_transport[transport_index(a.client.transport)];
        *by_transport = by_transport.saturating_sub(1);
        self.by_client.remove(&a.client);
        for r in a.relays.iter() {
            self.by_relay.remove(&r);
            self.releases.push_back(r);
        }
        self.unreserve_user(&a.username);
        if let Some(b) = a.bandwidth {
            self.bps_reserved = self.bps_reserved.saturating_sub(b.rate);
        }
        self.counters.allocations_deleted += 1;
        self.push_event(Event::AllocationDeleted {
            client: a.client,
            relays: a.relays,
            username: a.username,
            reason,
        });
    }

    // ----------------------------------------------------------------------------------
    // Requests
    // ----------------------------------------------------------------------------------

    /// One more allocation (live or waiting for its relays) counts against `username`'s quota.
    fn reserve_user(&mut self, username: &str) {
        if !username.is_empty() {
            *self.per_user.entry(username.to_string()).or_insert(0) += 1;
        }
    }

    /// One allocation of `username` fewer.
    fn unreserve_user(&mut self, username: &str) {
        if let Some(n) = self.per_user.get_mut(username) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_user.remove(username);
            }
        }
    }

    fn request(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        msg: &Message<'_>,
        attrs: &Attrs<'_>,
        out: &mut Vec<u8>,
    ) -> Reply {
        let mut ctx = Ctx {
            method: msg.method(),
            txid: msg.transaction_id(),
            fingerprint: attrs.fingerprint.is_some() || self.config.fingerprint,
            auth: None,
            request_len: msg.len(),
        };
        match (self.config.service, ctx.method == method::BINDING) {
            (Service::StunOnly, false) | (Service::TurnOnly, true) => return Reply::Silent,
            _ => {}
        }
        // Any request on the 5-tuple shows its client is there (even one refused).
        let heard = self.by_client.get(from).copied();
        self.heard(heard, now);
        if ctx.method == method::BINDING {
            return self.binding(now, from, msg, attrs, ctx, out);
        }
        if !matches!(
            ctx.method,
            method::ALLOCATE | method::REFRESH | method::CREATE_PERMISSION | method::CHANNEL_BIND
        ) {
            return self.error(&ctx, 400, out);
        }
        if ctx.method == method::ALLOCATE
            && attrs.integrity.is_none()
            && attrs.integrity256.is_none()
            && self.config.auth.required()
        {
            if let Some(reply) = self.try_alternate_first(from, &ctx, out) {
                return reply;
            }
        }
        let authed = match self.authenticate(now, from, msg, attrs, &ctx, out) {
            Ok(a) => a,
            Err(reply) => return reply,
        };
        if let Some(a) = &authed {
            ctx.auth = Some((a.key, a.sha256));
        }
        if attrs.unknown_count > 0 {
            return self.unknown_attributes(&ctx, attrs, out);
        }
        if attrs.malformed {
            return self.error(&ctx, 400, out);
        }
        let mut existing = self.by_client.get(from).copied();
        if let Some(idx) = existing {
            // Expired but not yet swept by handle_timeout: it is gone.
            if self
                .allocs
                .get(idx)
                .and_then(Option::as_ref)
                .is_some_and(|a| a.expires <= now)
            {
                self.delete(idx, DeleteReason::Expired);
                existing = None;
            }
        }
        if let (Some(idx), true) = (existing, self.config.check_origin) {
            if !self.same_origin(idx, attrs.origin) {
                return self.error(&ctx, 441, out);
            }
        }
        if let (Some(idx), Some(a)) = (existing, &authed) {
            let same_user = self
                .allocs
                .get(idx)
                .and_then(Option::as_ref)
                .is_some_and(|al| al.username == a.username);
            if !same_user {
                self.auth_failed(
                    from,
                    Some(a.username.clone()),
                    AuthFailure::WrongCredentials,
                );
                return self.error(&ctx, 441, out);
            }
        }
        if let Some(p) = self.pending.iter().find(|p| p.client == *from) {
            // The allocation is not there yet: the first Allocate is answered once its relay
            // sockets are bound, anything else on this 5-tuple meanwhile is a mismatch.
            if ctx.method == method::ALLOCATE && p.ctx.txid == ctx.txid {
                return Reply::Silent;
            }
            return self.error(&ctx, 437, out);
        }
        match (ctx.method, existing) {
            (method::ALLOCATE, Some(idx)) => self.allocate_again(now, idx, from, &ctx, out),
            (method::ALLOCATE, None) => self.allocate(now, from, attrs, authed, &ctx, msg, out),
            (_, None) => self.error(&ctx, 437, out),
            (method::REFRESH, Some(idx)) => self.refresh(now, idx, attrs, authed, &ctx, out),
            (method::CREATE_PERMISSION, Some(idx)) => {
                self.create_permission(now, idx, from, msg, &ctx, out)
            }
            (_, Some(idx)) => self.channel_bind(now, idx, from, attrs, &ctx, out),
        }
    }

    /// A Binding request: its XOR-MAPPED-ADDRESS, after authentication with `secure-stun`.
    fn binding(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        msg: &Message<'_>,
        attrs: &Attrs<'_>,
        mut ctx: Ctx,
        out: &mut Vec<u8>,
    ) -> Reply {
        self.counters.binding_requests += 1;
        if self.config.secure_stun {
            match self.authenticate(now, from, msg, attrs, &ctx, out) {
                Ok(Some(a)) => ctx.auth = Some((a.key, a.sha256)),
                Ok(None) => {}
                Err(reply) => {
                    self.counters.binding_errors += 1;
                    return reply;
                }
            }
        }
        if attrs.unknown_count > 0 {
            self.counters.binding_errors += 1;
            return self.unknown_attributes(&ctx, attrs, out);
        }
        self.counters.binding_responses += 1;
        if ctx.auth.is_some() {
            return self.success(&ctx, out, |b| {
                b.xor_address(attr::XOR_MAPPED_ADDRESS, from.client);
            });
        }
        let mut b = Builder::new(out, method::BINDING, Class::Success, ctx.txid);
        b.xor_address(attr::XOR_MAPPED_ADDRESS, from.client);
        if ctx.fingerprint {
            b.fingerprint();
        }
        Reply::Exempt
    }

    /// `check-origin-consistency`: whether a request's ORIGIN is the allocation's.
    fn same_origin(&self, idx: usize, origin: Option<&[u8]>) -> bool {
        let Some(Some(a)) = self.allocs.get(idx) else {
            return true;
        };
        a.origin.as_deref() == origin.map(canonical_origin).as_deref()
    }

    /// Long-term credential check. `Ok(None)`: anonymous server.
    fn authenticate(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        msg: &Message<'_>,
        attrs: &Attrs<'_>,
        ctx: &Ctx,
        out: &mut Vec<u8>,
    ) -> Result<Option<Authed>, Reply> {
        if !self.config.auth.required() {
            return Ok(None);
        }
        let mi = match (attrs.integrity, attrs.integrity256) {
            (None, None) => return Err(self.challenge(now, from, ctx, 401, out)),
            (Some(mi), _) => (mi, false),
            (None, Some(mi)) => (mi, true),
        };
        let (Some(user), Some(_realm), Some(nonce)) = (attrs.username, attrs.realm, attrs.nonce)
        else {
            return Err(self.error(ctx, 400, out));
        };
        let unix = self.unix(now);
        let verdict = check_nonce_with(&self.config.nonce, nonce, unix, from.client.ip());
        if verdict != NonceCheck::Valid {
            let reason = if verdict == NonceCheck::Stale {
                AuthFailure::StaleNonce
            } else {
                AuthFailure::UnknownNonce
            };
            let username = std::str::from_utf8(user).ok().map(str::to_string);
            // A 438 is the protocol's nonce rotation: an event (for the log), not a failure.
            self.push_event(Event::AuthFailed {
                client: *from,
                username,
                reason,
            });
            return Err(self.challenge(now, from, ctx, 438, out));
        }
        let Ok(username) = std::str::from_utf8(user) else {
            self.auth_failed(from, None, AuthFailure::UnknownUser);
            return Err(self.challenge(now, from, ctx, 401, out));
        };
        let check = |key: &[u8; 16]| {
            if mi.1 {
                msg.check_integrity_sha256(mi.0.offset, mi.0.value, key)
            } else {
                msg.check_integrity_sha1(mi.0.offset, mi.0.value, key)
            }
        };
        let (key, expiry) = match keys_for(&self.config.auth, &self.config.realm, username) {
            Keys::Unknown => {
                self.auth_failed(from, Some(username.to_string()), AuthFailure::UnknownUser);
                return Err(self.challenge(now, from, ctx, 401, out));
            }
            Keys::Static(k) => (check(&k).then_some(k), None),
            Keys::Rest { keys, expiry } => (keys.into_iter().find(|k| check(k)), Some(expiry)),
        };
        let Some(key) = key else {
            self.auth_failed(from, Some(username.to_string()), AuthFailure::BadIntegrity);
            return Err(self.challenge(now, from, ctx, 401, out));
        };
        if let Some(exp) = expiry {
            if exp <= unix {
                self.auth_failed(from, Some(username.to_string()), AuthFailure::Expired);
                return Err(self.challenge(now, from, ctx, 401, out));
            }
        }
        Ok(Some(Authed {
            username: username.to_string(),
            key,
            sha256: mi.1,
            expiry: expiry.map(|e| self.instant_of_unix(now, e)),
        }))
    }

    fn auth_failed(&mut self, client: &ClientAddr, username: Option<String>, reason: AuthFailure) {
        self.counters.auth_failures += 1;
        self.push_event(Event::AuthFailed {
            client: *client,
            username,
            reason,
        });
    }

    /// 401/438 with REALM and a fresh NONCE (exempt from the size guard).
    fn challenge(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        ctx: &Ctx,
        code: u16,
        out: &mut Vec<u8>,
    ) -> Reply {
        let nonce = make_nonce(&self.config.nonce.secret, self.unix(now), from.client.ip());
        let mut b = Builder::new(out, ctx.method, Class::Error, ctx.txid);
        b.error_code(code)
            .attr(attr::REALM, self.config.realm.as_bytes())
            .attr(attr::NONCE, &nonce);
        if ctx.fingerprint {
            b.fingerprint();
        }
        Reply::Exempt
    }

    fn finish(&self, ctx: &Ctx, b: &mut Builder<'_>) {
        if let Some((key, sha256)) = &ctx.auth {
            if let Some(s) = &self.config.software {
                b.attr(attr::SOFTWARE, s.as_bytes());
            }
            if *sha256 {
                b.integrity_sha256(key);
            } else {
                b.integrity_sha1(key);
            }
        }
        if ctx.fingerprint {
            b.fingerprint();
        }
    }

    fn error(&self, ctx: &Ctx, code: u16, out: &mut Vec<u8>) -> Reply {
        self.error_with(ctx, code, out, |_| {})
    }

    fn error_with(
        &self,
        ctx: &Ctx,
        code: u16,
        out: &mut Vec<u8>,
        f: impl FnOnce(&mut Builder<'_>),
    ) -> Reply {
        let phrase = reason_phrase(code);
        let mut b = Builder::new(out, ctx.method, Class::Error, ctx.txid);
        let with_phrase = self.config.reason_phrases
            && (ctx.auth.is_some() || {
                // Without credentials the answer must stay within the request's size.
                let mut probe = Vec::new();
                let mut p = Builder::new(&mut probe, ctx.method, Class::Error, ctx.txid);
                p.error_code_with_reason(code, phrase);
                probe.len() + (out_len_extra(ctx)) <= ctx.request_len
            });
        if with_phrase {
            b.error_code_with_reason(code, phrase);
        } else {
            b.error_code(code);
        }
        f(&mut b);
        self.finish(ctx, &mut b);
        ctx.reply_kind()
    }

    fn unknown_attributes(&self, ctx: &Ctx, attrs: &Attrs<'_>, out: &mut Vec<u8>) -> Reply {
        let mut list = [0u8; 16];
        let n = attrs.unknown_count.min(8);
        for (i, t) in attrs.unknown[..n].iter().enumerate() {
            list[2 * i..2 * i + 2].copy_from_slice(&t.to_be_bytes());
        }
        self.error_with(ctx, 420, out, |b| {
            b.attr(attr::UNKNOWN_ATTRIBUTES, &list[..2 * n]);
        })
    }

    fn success(&self, ctx: &Ctx, out: &mut Vec<u8>, f: impl FnOnce(&mut Builder<'_>)) -> Reply {
        let mut b = Builder::new(out, ctx.method, Class::Success, ctx.txid);
        f(&mut b);
        self.finish(ctx, &mut b);
        ctx.reply_kind()
    }

    fn lifetime(&self, requested: Option<u32>, cred: Option<Instant>, now: Instant) -> Duration {
        let l = &self.config.lifetimes;
        let want = requested.map_or(l.allocation_default, |s| Duration::from_secs(u64::from(s)));
        let mut life = want.max(l.allocation_default).min(l.allocation_max);
        if let Some(exp) = cred {
            life = life.min(exp.saturating_duration_since(now));
        }
        life
    }

    fn refresh(
        &mut self,
        now: Instant,
        idx: usize,
        attrs: &Attrs<'_>,
        authed: Option<Authed>,
        ctx: &Ctx,
        out: &mut Vec<u8>,
    ) -> Reply {
        let Some(Some(a)) = self.allocs.get(idx) else {
            return self.error(ctx, 437, out);
        };
        if let Some(f) = attrs.family {
            let has = match f {
                FAMILY_V4 => a.relays.v4.is_some(),
                FAMILY_V6 => a.relays.v6.is_some(),
                _ => false,
            };
            if !has {
                return self.error(ctx, 443, out);
            }
        }
        if attrs.lifetime == Some(0) {
            self.delete(idx, DeleteReason::Refreshed);
            return self.success(ctx, out, |b| {
                b.u32(attr::LIFETIME, 0);
            });
        }
        let life = self.lifetime(attrs.lifetime, authed.as_ref().and_then(|a| a.expiry), now);
        if life.is_zero() {
            return self.error(ctx, 401, out);
        }
        let lifetime = u32::try_from(life.as_secs()).unwrap_or(u32::MAX);
        if let Some(Some(a)) = self.allocs.get_mut(idx) {
            a.expires = now + life;
            a.lifetime = lifetime;
        }
        self.reschedule(idx, now);
        self.publish_routes(idx, now);
        self.success(ctx, out, |b| {
            b.u32(attr::LIFETIME, lifetime);
        })
    }

    fn create_permission(
        &mut self,
        now: Instant,
        idx: usize,
        from: &ClientAddr,
        msg: &Message<'_>,
        ctx: &Ctx,
        out: &mut Vec<u8>,
    ) -> Reply {
        let txid = msg.transaction_id();
        let mut peers: Vec<SocketAddr> = Vec::new();
        let mut after_integrity = false;
        for at in msg.attributes() {
            match at.typ {
                attr::MESSAGE_INTEGRITY | attr::MESSAGE_INTEGRITY_SHA256 => after_integrity = true,
                attr::XOR_PEER_ADDRESS if !after_integrity => {
                    if let Some(p) = decode_address(at.value, &txid, true) {
                        peers.push(p);
                    }
                }
                _ => {}
            }
        }
        if peers.is_empty() {
            return self.error(ctx, 400, out);
        }
        let Some(Some(a)) = self.allocs.get(idx) else {
            return self.error(ctx, 437, out);
        };
        if peers
            .iter()
            .any(|p| a.relays.for_family(p.is_ipv4()).is_none())
        {
            return self.error(ctx, 443, out);
        }
        for p in &peers {
            if let Err(reason) = self.config.peer_policy.check(p.ip()) {
                self.peer_denied(from, *p, reason);
                return self.error(ctx, 403, out);
            }
        }
        let new = peers
            .iter()
            .filter(|p| !a.perms.iter().any(|(ip, _)| *ip == p.ip()))
            .count();
        if a.perms.len() + new > self.config.max_permissions_per_allocation {
            return self.error(ctx, 508, out);
        }
        let exp = now + self.config.lifetimes.permission;
        if let Some(Some(a)) = self.allocs.get_mut(idx) {
            for p in &peers {
                install_permission(a, p.ip(), exp);
            }
        }
        self.reschedule(idx, now);
        self.publish_routes(idx, now);
        self.success(ctx, out, |_| {})
    }

    fn peer_denied(&mut self, client: &ClientAddr, peer: SocketAddr, reason: crate::DenyReason) {
        self.counters.peers_denied += 1;
        self.push_event(Event::PeerDenied {
            client: *client,
            peer,
            reason,
        });
    }

    fn channel_bind(
        &mut self,
        now: Instant,
        idx: usize,
        from: &ClientAddr,
        attrs: &Attrs<'_>,
        ctx: &Ctx,
        out: &mut Vec<u8>,
    ) -> Reply {
        let (Some(number), Some(peer)) = (attrs.channel, attrs.peer) else {
            return self.error(ctx, 400, out);
        };
        if !channel_in_range(number) || attrs.peer_count != 1 {
            return self.error(ctx, 400, out);
        }
        let Some(Some(a)) = self.allocs.get(idx) else {
            return self.error(ctx, 437, out);
        };
        if a.relays.for_family(peer.is_ipv4()).is_none() {
            return self.error(ctx, 443, out);
        }
        if let Err(reason) = self.config.peer_policy.check(peer.ip()) {
            self.peer_denied(from, peer, reason);
            return self.error(ctx, 403, out);
        }
        // A channel (even expired, within its quarantine) is bound to one peer, and a peer to
        // one channel.
        let by_number = a.channels.iter().position(|c| c.number == number);
        let by_peer = a.channels.iter().position(|c| c.peer == peer);
        if by_number != by_peer {
            return self.error(ctx, 400, out);
        }
        if by_number.is_none() && a.channels.len() >= self.config.max_channels_per_allocation {
            return self.error(ctx, 508, out);
        }
        let chan_exp = now + self.config.lifetimes.channel;
        let perm_exp = now + self.config.lifetimes.permission;
        if let Some(Some(a)) = self.allocs.get_mut(idx) {
            match by_number.and_then(|i| a.channels.get_mut(i)) {
                Some(c) => c.expires = chan_exp,
                None => a.channels.push(Channel {
                    number,
                    peer,
                    expires: chan_exp,
                }),
            }
            install_permission(a, peer.ip(), perm_exp);
        }
        self.reschedule(idx, now);
        self.publish_routes(idx, now);
        self.success(ctx, out, |_| {})
    }
}

/// Bytes `finish` adds to an unauthenticated error: FINGERPRINT, when asked for.
fn out_len_extra(ctx: &Ctx) -> usize {
    if ctx.fingerprint {
        8
    } else {
        0
    }
}

/// coturn's canonical ORIGIN: `scheme://host:port` in lower case, the scheme's default port
/// filled in (http, ws 80; https, wss 443); anything else as it is.
pub(crate) fn canonical_origin(origin: &[u8]) -> String {
    let text = String::from_utf8_lossy(origin);
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.into_owned();
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !p.is_empty() => {
            (h, p.parse::<u16>().ok())
        }
        _ => (authority, None),
    };
    if scheme.is_empty() || host.is_empty() {
        return text.into_owned();
    }
    let scheme = scheme.to_ascii_lowercase();
    let port = port.or(match scheme.as_str() {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    });
    let host = host.to_ascii_lowercase();
    match port {
        Some(p) => format!("{scheme}://{host}:{p}"),
        None => format!("{scheme}://{host}"),
    }
}

fn install_permission(a: &mut Allocation, ip: IpAddr, exp: Instant) {
    match a.perms.iter_mut().find(|(p, _)| *p == ip) {
        Some(p) => p.1 = p.1.max(exp),
        None => a.perms.push((ip, exp)),
    }
}

fn next_deadline(a: &Allocation, now: Instant) -> Instant {
    let mut next = a.expires;
    for (_, exp) in &a.perms {
        next = next.min(*exp);
    }
    for c in &a.channels {
        let t = if c.expires > now {
            c.expires
        } else {
            c.expires + CHANNEL_QUARANTINE
        };
        next = next.min(t);
    }
    next
}

/// The index of `t` in `live_by_transport`.
fn transport_index(t: Transport) -> usize {
    match t {
        Transport::Udp => 0,
        Transport::Tcp => 1,
        Transport::Tls => 2,
    }
}

fn pick_alternate(alternates: &[SocketAddr], v4: bool, rr: &mut usize) -> Option<SocketAddr> {
    if alternates.is_empty() {
        return None;
    }
    *rr = rr.wrapping_add(1);
    let same: Vec<SocketAddr> = alternates
        .iter()
        .copied()
        .filter(|a| a.is_ipv4() == v4)
        .collect();
    let pool = if same.is_empty() {
        alternates.to_vec()
    } else {
        same
    };
    pool.get(*rr % pool.len()).copied()
}
