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
//!
//! The state lives here; the work is split along its seams: `dispatch` takes what a client
//! sends (the STUN requests, their authentication and answers), `data` relays ChannelData,
//! Send and what peers send, `timers` expires what is due, `permissions` holds Refresh,
//! CreatePermission and ChannelBind, `allocate` the Allocate transaction, `routes` the fast
//! path's routes and `reclaim` a drain's idle reclaim.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::{Bandwidth, ServerConfig};
use crate::hash::Seeded;
use crate::types::{
    ClientAddr, Counters, DeleteReason, DrainMode, Event, RelayAddrs, Transport, MAX_QUEUED_EVENTS,
};

mod allocate;
mod data;
mod dispatch;
mod permissions;
mod reclaim;
mod routes;
mod sessions;
mod timers;
mod userdb;

use allocate::{Pending, Reservation};
use data::{Bucket, Buckets};
use dispatch::{Attrs, Authed, Ctx, SourceBudget};
pub use sessions::{AllocationInfo, AllocationTraffic};

/// After a channel binding expires, its number and peer stay reserved this long
/// (RFC 8656 §12: no rebinding to another peer/channel for 5 minutes).
const CHANNEL_QUARANTINE: Duration = Duration::from_secs(300);

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
    /// Live allocations by id ([`AllocationInfo::id`]), for the operator's pages.
    by_id: std::collections::BTreeMap<u64, usize>,
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
    /// What the user database answered, and the requests waiting for it
    /// ([`crate::credentials`]).
    store: crate::credentials::Store,
    /// A [`replay`](Server::replay) runs: a request never waits for a lookup twice.
    replaying: bool,
    /// Gives each new allocation its user's traffic handle ([`Server::set_user_traffic`]).
    user_traffic: Option<crate::UserTrafficFn>,
}

struct Allocation {
    /// Unique for the server's life (never reused): the operator's id of it too.
    gen: u64,
    /// When it was created.
    created: Instant,
    /// What it relayed through the core (not what a kernel fast path relayed).
    traffic: AllocationTraffic,
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
    /// The key its Allocate was authenticated with, and the REST credential's expiry: its
    /// later requests are checked with it first (coturn's session key), so they never wait
    /// for a user database.
    key: Option<([u8; 16], Option<Instant>)>,
    /// Its user's traffic counters, when they are asked for ([`Server::set_user_traffic`]).
    user_traffic: Option<std::sync::Arc<crate::UserTraffic>>,
}

/// What an allocation is given besides its relays: its ORIGIN, its bandwidth and its key.
#[derive(Clone, Debug, Default)]
pub(crate) struct Grant {
    origin: Option<String>,
    /// Bytes per second in each direction (0: no limit), reserved of `bps-capacity`.
    bps: u64,
    /// The Allocate's long-term key and REST expiry.
    key: Option<([u8; 16], Option<Instant>)>,
}

#[derive(Clone, Copy)]
struct Channel {
    number: u16,
    peer: SocketAddr,
    expires: Instant,
}

impl Server {
    /// Create a server. `now` and `wall` anchor the clock: REST credential expiry and nonce
    /// timestamps use `wall + (later_now - now)`.
    pub fn new(config: ServerConfig, now: Instant, wall: SystemTime) -> Server {
        let config_for_store = config.auth.database;
        let mut server = Server {
            config,
            counters: Counters::default(),
            drain: DrainMode::Off,
            epoch: (now, 0),
            allocs: Vec::new(),
            free: Vec::new(),
            by_client: HashMap::with_hasher(Seeded::random()),
            by_relay: HashMap::with_hasher(Seeded::random()),
            by_id: std::collections::BTreeMap::new(),
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
            store: crate::credentials::Store::new(config_cache_limits(&config_for_store)),
            replaying: false,
            user_traffic: None,
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

    /// Allocates waiting for their relay sockets ([`Output::BindRelay`](crate::Output::BindRelay) not yet answered).
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

    /// Counts each allocation's relayed data in its user's handle too, given by `f` with the
    /// allocation's USERNAME when it is created (coturn's `prometheus-username-labels`).
    /// Allocations created before are not counted.
    pub fn set_user_traffic(&mut self, f: crate::UserTrafficFn) {
        self.user_traffic = Some(f);
    }

    /// The traffic handle of `client`'s allocation, if it has one.
    pub fn user_traffic_of(
        &self,
        client: &ClientAddr,
    ) -> Option<std::sync::Arc<crate::UserTraffic>> {
        let i = *self.by_client.get(client)?;
        self.allocs.get(i)?.as_ref()?.user_traffic.clone()
    }

    /// The traffic handle of the allocation at `idx`, if it has one.
    pub(crate) fn traffic_of(&self, idx: Option<usize>) -> Option<&crate::UserTraffic> {
        self.allocs.get(idx?)?.as_ref()?.user_traffic.as_deref()
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

    /// A TCP/TLS client connection closed: delete its allocation (RFC 8656 §3.1), or forget
    /// its Allocate if that was still waiting for relay sockets.
    pub fn close_client(&mut self, _now: Instant, client: &ClientAddr) {
        if let Some(&idx) = self.by_client.get(client) {
            self.delete(idx, DeleteReason::ConnectionClosed);
        }
        self.forget_allocates(|p| p.client == *client);
        self.store.forget_client(client);
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
        self.store.clear_waiting();
    }

    fn delete(&mut self, idx: usize, reason: DeleteReason) {
        let Some(a) = self.allocs.get_mut(idx).and_then(Option::take) else {
            return;
        };
        Server::unpublish_routes(
            &mut self.routes,
            &a,
            &a.channels,
            a.perms.iter().map(|p| p.0),
        );
        self.free.push(idx);
        self.live = self.live.saturating_sub(1);
        let by_transport = &mut self.live_by_transport[transport_index(a.client.transport)];
        *by_transport = by_transport.saturating_sub(1);
        self.by_client.remove(&a.client);
        self.by_id.remove(&a.gen);
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
    // Quotas
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

/// The cache bounds of a user database (defaults when there is none: nothing is kept then).
fn config_cache_limits(
    db: &Option<crate::config::UserDatabase>,
) -> crate::credentials::CacheLimits {
    db.map(|d| d.cache).unwrap_or_default()
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
