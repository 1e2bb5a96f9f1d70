//! Request dispatch: what a client sends goes through [`Server::handle_client`], ChannelData
//! to the data path, STUN requests through authentication (RFC 8489 §9.2) to their method,
//! and each answer through the amplification guard (see the [`server`](super) docs).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::userdb::Resolved;
use super::{canonical_origin, Reply, Server};
use crate::auth::{check_nonce_with, make_nonce, NonceCheck};
use crate::config::Service;
use crate::hash::Seeded;
use crate::stun::{attr, decode_address, method, reason_phrase, Attr, Builder, Class, Message};
use crate::types::{AuthFailure, ClientAddr, DeleteReason, Event, Output, Transmit, Transport};

/// Slots of [`SourceBudget`]: sources hashed together share one budget (rarely, with a random
/// seed), and the memory is fixed whatever the number of sources.
const SOURCE_SLOTS: usize = 4096;

/// A per-source-IP count of responses in the current second, in a fixed table.
pub(super) struct SourceBudget {
    pub(super) hasher: Seeded,
    /// Second 1 starts here (0: a slot never used).
    pub(super) anchor: Instant,
    /// (second, responses sent in it) per slot.
    pub(super) slots: Box<[(u64, u32)]>,
}

impl SourceBudget {
    pub(super) fn new(now: Instant) -> SourceBudget {
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

/// Attributes of a request/indication, gathered in one pass.
#[derive(Default)]
pub(super) struct Attrs<'a> {
    pub(super) username: Option<&'a [u8]>,
    pub(super) realm: Option<&'a [u8]>,
    pub(super) nonce: Option<&'a [u8]>,
    pub(super) integrity: Option<Attr<'a>>,
    pub(super) integrity256: Option<Attr<'a>>,
    pub(super) fingerprint: Option<Attr<'a>>,
    pub(super) origin: Option<&'a [u8]>,
    pub(super) lifetime: Option<u32>,
    pub(super) transport: Option<u8>,
    pub(super) family: Option<u8>,
    pub(super) additional_family: Option<u8>,
    pub(super) channel: Option<u16>,
    pub(super) data: Option<&'a [u8]>,
    pub(super) peer: Option<SocketAddr>,
    pub(super) peer_count: usize,
    pub(super) even_port: Option<bool>,
    pub(super) reservation_token: Option<[u8; 8]>,
    /// A known attribute with a malformed value.
    pub(super) malformed: bool,
    pub(super) unknown: [u16; 8],
    pub(super) unknown_count: usize,
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
pub(super) struct Authed {
    pub(super) username: String,
    pub(super) key: [u8; 16],
    pub(super) sha256: bool,
    /// REST credential expiry.
    pub(super) expiry: Option<Instant>,
}

/// How to finish a response.
#[derive(Clone, Copy)]
pub(super) struct Ctx {
    pub(super) method: u16,
    pub(super) txid: [u8; 12],
    pub(super) fingerprint: bool,
    pub(super) auth: Option<([u8; 16], bool)>,
    /// The request's length (a reason phrase must not make an unauthenticated answer larger).
    pub(super) request_len: usize,
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

impl Server {
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
        self.client_message(now, from, data, out)
    }

    /// [`handle_client`](Self::handle_client) once the datagram is counted (and
    /// [`replay`](Self::replay)).
    pub(super) fn client_message<'a>(
        &mut self,
        now: Instant,
        from: ClientAddr,
        data: &'a [u8],
        out: &'a mut Vec<u8>,
    ) -> Option<Output<'a>> {
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
                .send_indication(now, &from, &attrs, data.len())
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
    pub(super) fn respond<'a>(
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
            (method::ALLOCATE, None) => self.allocate(now, from, attrs, authed, &ctx, out),
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
        // The allocation's own key first: its requests never wait for a user database.
        if let Some((key, expiry)) = self.allocation_key(from, username) {
            if check(&key) {
                if expiry.is_some_and(|e| e <= now) {
                    self.auth_failed(from, Some(username.to_string()), AuthFailure::Expired);
                    return Err(self.challenge(now, from, ctx, 401, out));
                }
                return Ok(Some(Authed {
                    username: username.to_string(),
                    key,
                    sha256: mi.1,
                    expiry,
                }));
            }
        }
        let (key, expiry) = match self.resolve_key(now, from, msg, username, &check) {
            Resolved::Key(key, expiry) => (key, expiry),
            Resolved::Waiting => return Err(Reply::Silent),
            Resolved::Unavailable(reason) => {
                return Err(self.unavailable(from, username, reason, ctx, out));
            }
            Resolved::Unknown => {
                self.auth_failed(from, Some(username.to_string()), AuthFailure::UnknownUser);
                return Err(self.challenge(now, from, ctx, 401, out));
            }
            Resolved::Bad => {
                self.auth_failed(from, Some(username.to_string()), AuthFailure::BadIntegrity);
                return Err(self.challenge(now, from, ctx, 401, out));
            }
            Resolved::Expired => {
                self.auth_failed(from, Some(username.to_string()), AuthFailure::Expired);
                return Err(self.challenge(now, from, ctx, 401, out));
            }
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

    pub(super) fn auth_failed(
        &mut self,
        client: &ClientAddr,
        username: Option<String>,
        reason: AuthFailure,
    ) {
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

    pub(super) fn error(&self, ctx: &Ctx, code: u16, out: &mut Vec<u8>) -> Reply {
        self.error_with(ctx, code, out, |_| {})
    }

    pub(super) fn error_with(
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

    pub(super) fn success(
        &self,
        ctx: &Ctx,
        out: &mut Vec<u8>,
        f: impl FnOnce(&mut Builder<'_>),
    ) -> Reply {
        let mut b = Builder::new(out, ctx.method, Class::Success, ctx.txid);
        f(&mut b);
        self.finish(ctx, &mut b);
        ctx.reply_kind()
    }

    pub(super) fn lifetime(
        &self,
        requested: Option<u32>,
        cred: Option<Instant>,
        now: Instant,
    ) -> Duration {
        let l = &self.config.lifetimes;
        let want = requested.map_or(l.allocation_default, |s| Duration::from_secs(u64::from(s)));
        let mut life = want.max(l.allocation_default).min(l.allocation_max);
        if let Some(exp) = cred {
            life = life.min(exp.saturating_duration_since(now));
        }
        life
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
