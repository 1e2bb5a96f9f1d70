//! The Allocate transaction, in two steps: the request is checked and, when it needs relay
//! sockets, handed to the I/O layer as an [`Output::BindRelay`](crate::Output::BindRelay);
//! the I/O layer binds them outside any lock and answers with [`Server::relay_bound`], which
//! creates the allocation and returns the response. Also the EVEN-PORT reservations (port + 1
//! kept for a later Allocate with RESERVATION-TOKEN) and retransmitted Allocates.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::{
    canonical_origin, Attrs, Authed, Bucket, Buckets, Ctx, Grant, Reply, Server, FAMILY_V4,
    FAMILY_V6,
};
use crate::auth::make_nonce;
use crate::config::DefaultFamily;
use crate::stun::attr;
use crate::types::{
    CapacityLimit, ClientAddr, DrainMode, Event, RelayAddrs, RelayBound, RelayError, RelayPorts,
    RelayRequest, Transmit,
};

/// How long an EVEN-PORT reservation (port + 1) is kept (RFC 8656 §7.2: 30 s).
const RESERVATION_LIFETIME: Duration = Duration::from_secs(30);

/// How long an Allocate waits for its relay sockets before it is forgotten. The I/O layer
/// answers within the same wake-up; this only bounds what a lost answer costs (the client's
/// retransmission then starts over, and the late answer's sockets are released).
pub(crate) const ALLOCATE_WAIT: Duration = Duration::from_secs(10);

/// REQUESTED-TRANSPORT UDP.
const PROTO_UDP: u8 = 17;

/// A relay socket on port + 1 kept for a later Allocate with RESERVATION-TOKEN.
pub(super) struct Reservation {
    token: [u8; 8],
    pub(super) relay: SocketAddr,
    expires: Instant,
}

/// An Allocate that passed every check and waits for its relay sockets.
pub(super) struct Pending {
    id: u64,
    pub(super) client: ClientAddr,
    /// How to finish the response (its transaction id identifies retransmissions, its
    /// request length bounds an unauthenticated response).
    pub(super) ctx: Ctx,
    claim: Claim,
    /// The REST credential's expiry, which caps the lifetime when the sockets come.
    cred_expiry: Option<Instant>,
    ports: RelayPorts,
    /// A dual allocation whose second family has no relay address: ADDRESS-ERROR-CODE 440.
    additional_error: Option<u16>,
    since: Instant,
}

/// What a new allocation is given: its user, its ORIGIN, bandwidth (reserved of
/// `bps-capacity` and of the user's quota from the Allocate on) and key, and its lifetime.
#[derive(Clone)]
struct Claim {
    username: String,
    grant: Grant,
    life: Duration,
}

impl Claim {
    /// The LIFETIME attribute's seconds.
    fn lifetime(&self) -> u32 {
        u32::try_from(self.life.as_secs()).unwrap_or(u32::MAX)
    }
}

/// An allocation's relay addresses as its success response gives them: with the
/// ADDRESS-ERROR-CODE of a family it has none of, and the RESERVATION-TOKEN of port + 1.
struct Relays {
    addrs: RelayAddrs,
    address_error: Option<u16>,
    token: Option<[u8; 8]>,
}

impl Relays {
    fn only(addrs: RelayAddrs) -> Relays {
        Relays {
            addrs,
            address_error: None,
            token: None,
        }
    }
}

/// The relay families an Allocate asks for: IPv4 or IPv6 first, and whether IPv6 too.
#[derive(Clone, Copy)]
struct Families {
    primary_v4: bool,
    dual: bool,
}

impl Server {
    /// A new Allocate on a 5-tuple without an allocation (RFC 8656 §7.2): every check, then
    /// either an answer now (an error, 300/403 while draining, a RESERVATION-TOKEN's socket)
    /// or a request for relay sockets.
    pub(super) fn allocate(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        attrs: &Attrs<'_>,
        authed: Option<Authed>,
        ctx: &Ctx,
        out: &mut Vec<u8>,
    ) -> Reply {
        if matches!(self.drain, DrainMode::Refuse { .. }) {
            return self.refuse_draining(now, from, ctx, out);
        }
        let families = match self.families(from, attrs) {
            Ok(f) => f,
            Err(code) => return self.error(ctx, code, out),
        };
        let username = authed
            .as_ref()
            .map(|a| a.username.clone())
            .unwrap_or_default();
        if let Some(limit) = self.over_quota(&username) {
            self.counters.refused_quota += 1;
            self.push_event(Event::AllocateRefused {
                client: *from,
                code: 486,
                limit,
            });
            return self.error(ctx, 486, out);
        }
        let cred_expiry = authed.as_ref().and_then(|a| a.expiry);
        let life = self.lifetime(attrs.lifetime, cred_expiry, now);
        if life.is_zero() {
            return self.error(ctx, 401, out);
        }
        let Some(bps) = self.reserve_bandwidth() else {
            self.counters.refused_bandwidth += 1;
            self.push_event(Event::AllocateRefused {
                client: *from,
                code: 486,
                limit: CapacityLimit::Bandwidth {
                    capacity: self.config.bandwidth.capacity,
                },
            });
            return self.error(ctx, 486, out);
        };
        let grant = Grant {
            origin: attrs.origin.map(canonical_origin),
            bps,
            key: authed.as_ref().map(|a| (a.key, a.expiry)),
        };
        let claim = Claim {
            username,
            grant,
            life,
        };
        // An all-zero token is coturn's "no token" (coturn never issues one, nor do we):
        // coturn's uclient sends it after an Allocate error reset its token, and coturn
        // allocates as without the attribute.
        if let Some(token) = attrs.reservation_token.filter(|t| *t != [0; 8]) {
            return self.allocate_reserved(now, from, ctx, &token, claim, out);
        }
        let pending = Pending {
            id: 0,
            client: *from,
            ctx: *ctx,
            claim,
            cred_expiry,
            ports: match attrs.even_port {
                None => RelayPorts::Any,
                Some(false) => RelayPorts::Even,
                Some(true) => RelayPorts::EvenPair,
            },
            additional_error: None,
            since: now,
        };
        self.ask_for_relays(families, pending, out)
    }

    /// The families an Allocate asks for (REQUESTED-ADDRESS-FAMILY, else the default;
    /// ADDITIONAL-ADDRESS-FAMILY IPv6 for a dual allocation), or the error code of a
    /// combination RFC 8656 §7.2 excludes.
    fn families(&self, from: &ClientAddr, attrs: &Attrs<'_>) -> Result<Families, u16> {
        match attrs.transport {
            None => return Err(400),
            Some(PROTO_UDP) if self.config.udp_relay => {}
            Some(_) => return Err(442),
        }
        let (primary_v4, dual) = match (attrs.family, attrs.additional_family) {
            (Some(_), Some(_)) => return Err(400),
            (None, Some(FAMILY_V6)) => (true, true),
            (None, Some(_)) => return Err(400),
            (None, None) => match self.config.default_family {
                DefaultFamily::Ipv4 => (true, false),
                DefaultFamily::Ipv6 => (false, false),
                DefaultFamily::Keep => (from.client.is_ipv4(), false),
            },
            (Some(FAMILY_V4), None) => (true, false),
            (Some(FAMILY_V6), None) => (false, false),
            (Some(_), None) => return Err(440),
        };
        // RESERVATION-TOKEN excludes EVEN-PORT and the family attributes; EVEN-PORT excludes
        // a dual allocation.
        if attrs.reservation_token.is_some()
            && (attrs.even_port.is_some() || attrs.family.is_some() || dual)
        {
            return Err(400);
        }
        if attrs.even_port.is_some() && dual {
            return Err(400);
        }
        Ok(Families { primary_v4, dual })
    }

    /// The quota a new allocation of `username` would exceed (Allocates waiting for their
    /// sockets count: they become allocations).
    fn over_quota(&self, username: &str) -> Option<CapacityLimit> {
        let q = self.config.quotas;
        let user_count = self.per_user.get(username).copied().unwrap_or(0);
        let total = self.live + self.pending.len();
        if q.total > 0 && total >= q.total as usize {
            Some(CapacityLimit::TotalQuota { quota: q.total })
        } else if q.per_user > 0 && !username.is_empty() && user_count >= q.per_user {
            Some(CapacityLimit::UserQuota {
                user: username.to_owned(),
                quota: q.per_user,
            })
        } else {
            None
        }
    }

    /// RESERVATION-TOKEN: the allocation on the socket reserved by an earlier EVEN-PORT
    /// Allocate, or 508 when the token is unknown or expired.
    fn allocate_reserved(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        ctx: &Ctx,
        token: &[u8; 8],
        claim: Claim,
        out: &mut Vec<u8>,
    ) -> Reply {
        let Some(relay) = self.take_reservation(now, token) else {
            self.unreserve_bandwidth(claim.grant.bps);
            return self.refuse_capacity(from, ctx, CapacityLimit::Reservation, out);
        };
        self.reserve_user(&claim.username);
        let relays = Relays::only(RelayAddrs::for_one(relay));
        self.create(now, from, ctx, claim, relays, out)
    }

    /// The relay sockets for `pending`, asked of the I/O layer; it waits for them.
    fn ask_for_relays(
        &mut self,
        families: Families,
        mut pending: Pending,
        out: &mut Vec<u8>,
    ) -> Reply {
        let from = pending.client;
        let ip = match self.relay_ip(families.primary_v4, &from) {
            Ok(ip) => ip,
            Err(_) => {
                self.unreserve_bandwidth(pending.claim.grant.bps);
                return self.error(&pending.ctx, 440, out);
            }
        };
        let additional = match families.dual {
            false => None,
            true => match self.relay_ip(false, &from) {
                Ok(ip) => Some(ip),
                Err(_) => {
                    pending.additional_error = Some(440);
                    None
                }
            },
        };
        pending.id = self.next_request;
        self.next_request += 1;
        self.reserve_user(&pending.claim.username);
        let request = RelayRequest {
            id: pending.id,
            client: from,
            ip,
            ports: pending.ports,
            additional,
        };
        self.pending.push(pending);
        Reply::Bind(request)
    }

    /// The I/O layer's answer to a [`RelayRequest`]: creates the allocation and returns the
    /// Allocate's response (success, or 508 / 440 when the sockets could not be bound, or
    /// 300 / 403 when the drain began meanwhile), written into `out`. `None` when no Allocate
    /// waits for this answer any more (its connection closed, [`clear`](Self::clear), or
    /// it waited longer than 10 s); then, as after a refusal, the sockets it carries go to
    /// [`poll_release`](Self::poll_release).
    pub fn relay_bound<'a>(
        &mut self,
        now: Instant,
        answer: RelayBound,
        out: &'a mut Vec<u8>,
    ) -> Option<Transmit<'a>> {
        let Some(at) = self.pending.iter().position(|p| p.id == answer.id) else {
            self.release_answer(&answer);
            return None;
        };
        let p = self.pending.swap_remove(at);
        let reply = self.complete(now, &p, answer, out);
        self.respond(now, reply, p.ctx.request_len, p.client, out)
    }

    /// [`relay_bound`](Self::relay_bound) for a waiting Allocate.
    fn complete(
        &mut self,
        now: Instant,
        p: &Pending,
        answer: RelayBound,
        out: &mut Vec<u8>,
    ) -> Reply {
        let ctx = &p.ctx;
        let from = &p.client;
        // The drain's refusal holds from the moment it began: no allocation is created in
        // Refusing, so a drain that found no allocation left can end.
        if matches!(self.drain, DrainMode::Refuse { .. }) {
            self.release_answer(&answer);
            self.unreserve_pending(p);
            return self.refuse_draining(now, from, ctx, out);
        }
        let (primary, pair) = match self.bound_primary(p, &answer) {
            Ok(bound) => bound,
            Err(refusal) => {
                self.release_answer(&answer);
                self.unreserve_pending(p);
                return match refusal {
                    None => self.error(ctx, 440, out),
                    Some(limit) => self.refuse_capacity(from, ctx, limit, out),
                };
            }
        };
        let mut addrs = RelayAddrs::for_one(primary);
        let mut address_error = p.additional_error;
        match answer.additional {
            Some(Ok(a)) if a.is_ipv6() && addrs.v6.is_none() && !self.in_use(a) => {
                addrs.v6 = Some(a);
            }
            Some(Ok(a)) => {
                if !self.in_use(a) {
                    self.releases.push_back(a);
                }
                address_error = Some(508);
            }
            Some(Err(RelayError::FamilyNotSupported)) => address_error = Some(440),
            Some(Err(_)) => address_error = Some(508),
            None => {}
        }
        let mut claim = p.claim.clone();
        if let Some(exp) = p.cred_expiry {
            claim.life = claim.life.min(exp.saturating_duration_since(now));
        }
        if claim.life.is_zero() {
            self.release_answer(&answer);
            self.unreserve_pending(p);
            return self.error(ctx, 401, out);
        }
        let token = pair.map(|relay| self.reserve(now, relay));
        let relays = Relays {
            addrs,
            address_error,
            token,
        };
        self.create(now, from, ctx, claim, relays, out)
    }

    /// The primary relay socket of an answer and the port + 1 socket of an EVEN-PORT
    /// reservation, when they keep what the Allocate asked; else why not: `None` for 440
    /// (no relay address of that family), the capacity limit for 508.
    fn bound_primary(
        &self,
        p: &Pending,
        answer: &RelayBound,
    ) -> Result<(SocketAddr, Option<SocketAddr>), Option<CapacityLimit>> {
        let (primary, pair) = match &answer.primary {
            // Another allocation's socket (release_answer never closes one).
            Ok((addr, _)) if self.in_use(*addr) => return Err(Some(CapacityLimit::PortHeld)),
            Ok(bound) => *bound,
            Err(e) => {
                return Err(match e {
                    RelayError::FamilyNotSupported => None,
                    RelayError::NoPort if p.ports != RelayPorts::Any => {
                        Some(CapacityLimit::EvenPort)
                    }
                    RelayError::NoPort => Some(CapacityLimit::RelayPorts),
                    RelayError::Failed(why) => Some(CapacityLimit::RelaySocket(why.clone())),
                })
            }
        };
        let keeps_rule = match p.ports {
            RelayPorts::Any => pair.is_none(),
            RelayPorts::Even => primary.port() % 2 == 0 && pair.is_none(),
            RelayPorts::EvenPair => {
                primary.port() % 2 == 0
                    && pair.is_some_and(|n| Some(n.port()) == primary.port().checked_add(1))
                    && pair.is_some_and(|n| !self.in_use(n))
            }
        };
        match keeps_rule {
            true => Ok((primary, pair)),
            false => Err(Some(CapacityLimit::EvenPort)),
        }
    }

    /// Keeps `relay` (port + 1) for a later Allocate: its RESERVATION-TOKEN.
    fn reserve(&mut self, now: Instant, relay: SocketAddr) -> [u8; 8] {
        // Never all zeros: that is coturn's "no token".
        let token = rand::random::<std::num::NonZeroU64>().get().to_be_bytes();
        self.reservations.push(Reservation {
            token,
            relay,
            expires: now + RESERVATION_LIFETIME,
        });
        token
    }

    /// Creates the allocation on sockets that are bound, and its success response.
    fn create(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        ctx: &Ctx,
        claim: Claim,
        relays: Relays,
        out: &mut Vec<u8>,
    ) -> Reply {
        let lifetime = claim.lifetime();
        let username = claim.username.clone();
        self.insert(now, from, relays.addrs, claim, ctx.txid);
        self.counters.allocations_created += 1;
        self.push_event(Event::AllocationCreated {
            client: *from,
            relays: relays.addrs,
            username,
            lifetime,
        });
        self.allocate_success(ctx, from, &relays, lifetime, out)
    }

    /// `max-bps` of `bps-capacity` for a new allocation: `Some(0)` without a limit, `None`
    /// when the capacity is all reserved.
    fn reserve_bandwidth(&mut self) -> Option<u64> {
        let bw = self.config.bandwidth;
        if bw.max_bps == 0 {
            return Some(0);
        }
        let bps = match bw.capacity {
            0 => bw.max_bps,
            cap => bw.max_bps.min(cap.saturating_sub(self.bps_reserved)),
        };
        if bps == 0 {
            return None;
        }
        self.bps_reserved += bps;
        Some(bps)
    }

    fn unreserve_bandwidth(&mut self, bps: u64) {
        self.bps_reserved = self.bps_reserved.saturating_sub(bps);
    }

    /// What a waiting Allocate held: its place in the user's quota and its bandwidth.
    fn unreserve_pending(&mut self, p: &Pending) {
        self.unreserve_user(&p.claim.username);
        self.unreserve_bandwidth(p.claim.grant.bps);
    }

    /// The alternate for a new client of `from`'s transport (round-robin, the client's family
    /// first), counted and reported as a refusal; `None` (403) without alternates.
    fn pick_drain_alternate(&mut self, from: &ClientAddr) -> Option<SocketAddr> {
        let DrainMode::Refuse { alternates } = &self.drain else {
            return None;
        };
        let own = &self.transport_alternates[super::transport_index(from.transport)];
        let alternates = if own.is_empty() { alternates } else { own };
        let alt = super::pick_alternate(alternates, from.client.is_ipv4(), &mut self.alternate_rr);
        self.counters.refused_draining += 1;
        self.push_event(Event::AllocateRefusedDraining {
            client: *from,
            alternate: alt,
        });
        alt
    }

    /// An authenticated new Allocate while refusing: 300 Try Alternate with ALTERNATE-SERVER,
    /// REALM and a fresh NONCE (integrity-protected: RFC 8489 §10), or 403. libwebrtc applies
    /// the 300's REALM and NONCE and sends its next Allocate, authenticated with them, to the
    /// alternate; that Allocate succeeds there when the alternate shares the nonce key (fleet
    /// nonces), where any other answer (438, 401) would be fatal to it.
    fn refuse_draining(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        ctx: &Ctx,
        out: &mut Vec<u8>,
    ) -> Reply {
        match self.pick_drain_alternate(from) {
            Some(a) => {
                let nonce = make_nonce(&self.config.nonce.secret, self.unix(now), from.client.ip());
                let realm = self.config.realm.clone();
                self.error_with(ctx, 300, out, |b| {
                    b.address(attr::ALTERNATE_SERVER, a)
                        .attr(attr::REALM, realm.as_bytes())
                        .attr(attr::NONCE, &nonce);
                })
            }
            None => self.error(ctx, 403, out),
        }
    }

    /// The first, unauthenticated Allocate of a new client while refusing, with alternates:
    /// 300 Try Alternate with ALTERNATE-SERVER only (coturn's answer, and the one every
    /// client follows: libwebrtc then meets the alternate as a new server, 401 challenge
    /// first, whatever nonce key the alternate has). Exempt from the size guard like the
    /// 401 challenge (at most 60 bytes), within the same per-source budget. `None`: not that
    /// case (no drain, no alternate: the usual 401, then 403 after authentication).
    pub(super) fn try_alternate_first(
        &mut self,
        from: &ClientAddr,
        ctx: &Ctx,
        out: &mut Vec<u8>,
    ) -> Option<Reply> {
        if !matches!(self.drain, DrainMode::Refuse { .. })
            || self.by_client.contains_key(from)
            || self.pending.iter().any(|p| p.client == *from)
        {
            return None;
        }
        let own = &self.transport_alternates[super::transport_index(from.transport)];
        let has_alternate = match &self.drain {
            DrainMode::Refuse { alternates } => !alternates.is_empty() || !own.is_empty(),
            DrainMode::Off => false,
        };
        if !has_alternate {
            return None;
        }
        let a = self.pick_drain_alternate(from)?;
        self.error_with(ctx, 300, out, |b| {
            b.address(attr::ALTERNATE_SERVER, a);
        });
        Some(Reply::Exempt)
    }

    /// 508 Insufficient Capacity: relay sockets, for the reason `limit` says.
    fn refuse_capacity(
        &mut self,
        from: &ClientAddr,
        ctx: &Ctx,
        limit: CapacityLimit,
        out: &mut Vec<u8>,
    ) -> Reply {
        self.counters.refused_capacity += 1;
        self.push_event(Event::AllocateRefused {
            client: *from,
            code: 508,
            limit,
        });
        self.error(ctx, 508, out)
    }

    /// Every socket an answer carries goes back to the I/O layer, except one that belongs to
    /// an allocation or a reservation already.
    fn release_answer(&mut self, answer: &RelayBound) {
        let primary = answer.primary.as_ref().ok();
        let bound = primary
            .map(|(a, _)| *a)
            .into_iter()
            .chain(primary.and_then(|(_, pair)| *pair))
            .chain(
                answer
                    .additional
                    .as_ref()
                    .and_then(|r| r.as_ref().ok())
                    .copied(),
            );
        for addr in bound {
            if !self.in_use(addr) {
                self.releases.push_back(addr);
            }
        }
    }

    /// The success response: the relay addresses (advertised), the client's mapped address,
    /// the lifetime.
    fn allocate_success(
        &self,
        ctx: &Ctx,
        from: &ClientAddr,
        relays: &Relays,
        lifetime: u32,
        out: &mut Vec<u8>,
    ) -> Reply {
        let relay_cfg = &self.config.relay;
        self.success(ctx, out, |b| {
            for r in relays.addrs.iter() {
                let adv = SocketAddr::new(relay_cfg.advertised(r.ip()), r.port());
                b.xor_address(attr::XOR_RELAYED_ADDRESS, adv);
            }
            b.xor_address(attr::XOR_MAPPED_ADDRESS, from.client)
                .u32(attr::LIFETIME, lifetime);
            if let Some(t) = relays.token {
                b.attr(attr::RESERVATION_TOKEN, &t);
            }
            if let Some(code) = relays.address_error {
                let v = [FAMILY_V6, 0, (code / 100) as u8, (code % 100) as u8];
                b.attr(attr::ADDRESS_ERROR_CODE, &v);
            }
        })
    }

    /// Allocate on a 5-tuple that has an allocation: a retransmission gets the success
    /// response again, anything else 437.
    pub(super) fn allocate_again(
        &mut self,
        now: Instant,
        idx: usize,
        from: &ClientAddr,
        ctx: &Ctx,
        out: &mut Vec<u8>,
    ) -> Reply {
        let Some(Some(a)) = self.allocs.get(idx) else {
            return self.error(ctx, 437, out);
        };
        if a.allocate_txid != ctx.txid {
            return self.error(ctx, 437, out);
        }
        let remaining = a.expires.saturating_duration_since(now).as_secs();
        let lifetime = u32::try_from(remaining)
            .unwrap_or(a.lifetime)
            .min(a.lifetime);
        let relays = Relays::only(a.relays);
        self.allocate_success(ctx, from, &relays, lifetime, out)
    }

    /// The relay IP for a family (round-robin over `relay-ip`, else the local address).
    fn relay_ip(&mut self, v4: bool, from: &ClientAddr) -> Result<IpAddr, RelayError> {
        let ips = &self.config.relay.relay_ips;
        let local = [from.local.ip()];
        let pool: &[IpAddr] = if ips.is_empty() { &local } else { ips };
        let usable = |i: &&IpAddr| i.is_ipv4() == v4 && !i.is_unspecified();
        let n = pool.iter().filter(usable).count();
        if n == 0 {
            return Err(RelayError::FamilyNotSupported);
        }
        self.relay_rr = self.relay_rr.wrapping_add(1);
        pool.iter()
            .filter(usable)
            .nth(self.relay_rr % n)
            .copied()
            .ok_or(RelayError::FamilyNotSupported)
    }

    /// Whether `addr` is an allocation's relay or a reserved socket.
    fn in_use(&self, addr: SocketAddr) -> bool {
        self.by_relay.contains_key(&addr) || self.reservations.iter().any(|r| r.relay == addr)
    }

    /// RESERVATION-TOKEN: the reserved socket, unless the token is unknown or expired.
    fn take_reservation(&mut self, now: Instant, token: &[u8; 8]) -> Option<SocketAddr> {
        let pos = self
            .reservations
            .iter()
            .position(|r| &r.token == token && r.expires > now)?;
        Some(self.reservations.swap_remove(pos).relay)
    }

    /// The earliest reservation expiry or waiting Allocate's give-up time.
    pub(super) fn allocate_deadline(&self) -> Option<Instant> {
        let reservations = self.reservations.iter().map(|r| r.expires);
        let waiting = self.pending.iter().map(|p| p.since + ALLOCATE_WAIT);
        reservations.chain(waiting).min()
    }

    /// Releases expired reservations and forgets Allocates that waited too long.
    pub(super) fn expire_allocates(&mut self, now: Instant) {
        let releases = &mut self.releases;
        self.reservations.retain(|r| {
            let keep = r.expires > now;
            if !keep {
                releases.push_back(r.relay);
            }
            keep
        });
        self.forget_allocates(|p| p.since + ALLOCATE_WAIT <= now);
    }

    /// Forgets the waiting Allocates `which` selects: their answers will find nothing.
    pub(super) fn forget_allocates(&mut self, which: impl Fn(&Pending) -> bool) {
        let mut forgotten = Vec::new();
        self.pending.retain(|p| {
            let forget = which(p);
            if forget {
                forgotten.push((p.claim.username.clone(), p.claim.grant.bps));
            }
            !forget
        });
        for (username, bps) in forgotten {
            self.unreserve_user(&username);
            self.unreserve_bandwidth(bps);
        }
    }

    /// The allocation, in every index and on the timer wheel.
    fn insert(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        relays: RelayAddrs,
        claim: Claim,
        txid: [u8; 12],
    ) {
        let lifetime = claim.lifetime();
        let Claim {
            username,
            grant,
            life,
        } = claim;
        let bandwidth = (grant.bps > 0).then(|| Buckets {
            rate: grant.bps,
            up: Bucket::full(grant.bps, now),
            down: Bucket::full(grant.bps, now),
        });
        let gen = self.next_gen;
        self.next_gen += 1;
        let expires = now + life;
        let user_traffic = self.user_traffic.as_mut().map(|f| f(&username));
        let a = super::Allocation {
            gen,
            created: now,
            traffic: super::AllocationTraffic::default(),
            client: *from,
            relays,
            username,
            expires,
            lifetime,
            allocate_txid: txid,
            perms: Vec::new(),
            channels: Vec::new(),
            scheduled: expires,
            last_heard: now,
            origin: grant.origin,
            bandwidth,
            key: grant.key,
            user_traffic,
        };
        let idx = match self.free.pop() {
            Some(i) => {
                if let Some(slot) = self.allocs.get_mut(i) {
                    *slot = Some(a);
                }
                i
            }
            None => {
                self.allocs.push(Some(a));
                self.allocs.len() - 1
            }
        };
        self.live += 1;
        self.live_by_transport[super::transport_index(from.transport)] += 1;
        self.by_client.insert(*from, idx);
        self.by_id.insert(gen, idx);
        for r in relays.iter() {
            self.by_relay.insert(r, idx);
        }
        self.timers.push(std::cmp::Reverse((expires, idx, gen)));
    }
}
