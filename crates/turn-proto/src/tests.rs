//! Server tests with a synthetic clock and an in-memory binder of relay sockets.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::stun::{attr, decode_address, long_term_key, method, Builder, Class, Message};
use crate::*;

mod capacity;
mod relay_binding;

pub(crate) const REALM: &str = "example.org";
pub(crate) const SECRET: &[u8] = b"s3cret";

/// The I/O layer's side of relay binding, in memory: answers every [`RelayRequest`] with ports
/// counted up from 50001 on the requested IP (or with `fail`), and keeps what the server
/// released.
#[derive(Default)]
pub(crate) struct TestRelays {
    pub next_port: u16,
    pub bound: Vec<SocketAddr>,
    pub released: Vec<SocketAddr>,
    pub fail: Option<RelayError>,
}

impl TestRelays {
    fn port(&mut self, ip: IpAddr) -> SocketAddr {
        self.next_port += 1;
        let a = SocketAddr::new(ip, 50000 + self.next_port);
        self.bound.push(a);
        a
    }

    /// The answer the I/O layer would give to `r`.
    pub(crate) fn bind(&mut self, r: &RelayRequest) -> RelayBound {
        let primary = match (&self.fail, r.ports) {
            (Some(e), _) => Err(e.clone()),
            (None, RelayPorts::Any) => Ok((self.port(r.ip), None)),
            (None, RelayPorts::Even | RelayPorts::EvenPair) => {
                self.next_port += 1 - self.next_port % 2;
                let a = self.port(r.ip);
                let pair = (r.ports == RelayPorts::EvenPair).then(|| self.port(r.ip));
                Ok((a, pair))
            }
        };
        let additional = r.additional.map(|ip| match &self.fail {
            Some(e) => Err(e.clone()),
            None => Ok(self.port(ip)),
        });
        RelayBound {
            id: r.id,
            primary,
            additional,
        }
    }
}

/// An owned copy of a [`Transmit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sent {
    Client(ClientAddr, Vec<u8>),
    Peer(SocketAddr, SocketAddr, Vec<u8>),
}

impl Sent {
    pub(crate) fn of(t: Transmit<'_>) -> Sent {
        match t {
            Transmit::Client { to, data } => Sent::Client(to, data.to_vec()),
            Transmit::Peer { relay, peer, data } => Sent::Peer(relay, peer, data.to_vec()),
        }
    }
}

/// What one client datagram produced, with a request for relay sockets left unanswered.
#[derive(Debug)]
pub(crate) enum Raw {
    Sent(Sent),
    Bind(RelayRequest),
    Nothing,
}

pub(crate) struct H {
    pub server: Server,
    pub relays: TestRelays,
    pub now: Instant,
    pub out: Vec<u8>,
    pub wall0: u64,
}

pub(crate) fn base_config() -> ServerConfig {
    let mut c = ServerConfig::new(REALM);
    c.auth.add_coturn_user("alice:alicepass").unwrap();
    c.auth.add_coturn_user("bob:bobpass").unwrap();
    c.auth.rest_secrets.push(SECRET.to_vec());
    c.relay.relay_ips = vec![
        "203.0.113.10".parse().unwrap(),
        "2001:db8::10".parse().unwrap(),
    ];
    c.nonce.secret = [7; 32];
    // The tests fetch a nonce for every request, on a clock that stands still: the per-source
    // limit on challenges has a test of its own.
    c.unauthorized_rps = 0;
    c
}

pub(crate) fn udp(client: &str) -> ClientAddr {
    ClientAddr {
        transport: Transport::Udp,
        client: client.parse().unwrap(),
        local: "198.51.100.1:3478".parse().unwrap(),
    }
}

impl H {
    pub(crate) fn new(config: ServerConfig) -> H {
        let now = Instant::now();
        let wall0 = 1_800_000_000;
        let wall = UNIX_EPOCH + Duration::from_secs(wall0);
        H {
            server: Server::new(config, now, wall),
            relays: TestRelays::default(),
            now,
            out: Vec::new(),
            wall0,
        }
    }

    pub(crate) fn unix_now(&self) -> u64 {
        let _ = SystemTime::now();
        self.wall0
    }

    pub(crate) fn advance(&mut self, secs: u64) {
        self.now += Duration::from_secs(secs);
        self.wall0 += secs;
        self.server.handle_timeout(self.now);
        self.collect_releases();
    }

    /// Moves the relay sockets the server let go into `relays.released`.
    pub(crate) fn collect_releases(&mut self) {
        while let Some(r) = self.server.poll_release() {
            self.relays.released.push(r);
        }
    }

    /// One datagram from a client; a request for relay sockets is answered at once by
    /// `relays`, as the I/O layer does. `f` gets what the server returned to send.
    pub(crate) fn with_client<R>(
        &mut self,
        from: ClientAddr,
        data: &[u8],
        f: impl FnOnce(Option<Transmit<'_>>) -> R,
    ) -> R {
        let request = match self
            .server
            .handle_client(self.now, from, data, &mut self.out)
        {
            Some(Output::BindRelay(r)) => r,
            Some(Output::Transmit(t)) => {
                let r = f(Some(t));
                self.collect_releases();
                return r;
            }
            None => {
                let r = f(None);
                self.collect_releases();
                return r;
            }
        };
        let answer = self.relays.bind(&request);
        let t = self.server.relay_bound(self.now, answer, &mut self.out);
        let r = f(t);
        self.collect_releases();
        r
    }

    pub(crate) fn client(&mut self, from: ClientAddr, data: &[u8]) -> Option<Sent> {
        self.with_client(from, data, |t| t.map(Sent::of))
    }

    /// One datagram from a client, without answering a request for relay sockets.
    pub(crate) fn client_raw(&mut self, from: ClientAddr, data: &[u8]) -> Raw {
        let r = match self
            .server
            .handle_client(self.now, from, data, &mut self.out)
        {
            Some(Output::BindRelay(r)) => Raw::Bind(r),
            Some(Output::Transmit(t)) => Raw::Sent(Sent::of(t)),
            None => Raw::Nothing,
        };
        self.collect_releases();
        r
    }

    /// The I/O layer's answer to a request for relay sockets.
    pub(crate) fn answer(&mut self, answer: RelayBound) -> Option<Sent> {
        let t = self.server.relay_bound(self.now, answer, &mut self.out);
        let sent = t.map(Sent::of);
        self.collect_releases();
        sent
    }

    pub(crate) fn peer(
        &mut self,
        relay: SocketAddr,
        peer: SocketAddr,
        data: &[u8],
    ) -> Option<Sent> {
        let t = self
            .server
            .handle_peer(self.now, relay, peer, data, &mut self.out);
        t.map(Sent::of)
    }

    pub(crate) fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.server.poll_event()).collect()
    }
}

/// A decoded response.
#[derive(Debug)]
pub(crate) struct Resp {
    pub class: Class,
    pub method: u16,
    pub code: Option<u16>,
    pub attrs: Vec<(u16, Vec<u8>)>,
    pub txid: [u8; 12],
    pub raw: Vec<u8>,
}

impl Resp {
    pub(crate) fn get(&self, t: u16) -> Option<&[u8]> {
        self.attrs
            .iter()
            .find(|(a, _)| *a == t)
            .map(|(_, v)| v.as_slice())
    }
    pub(crate) fn all(&self, t: u16) -> Vec<&[u8]> {
        self.attrs
            .iter()
            .filter(|(a, _)| *a == t)
            .map(|(_, v)| v.as_slice())
            .collect()
    }
    pub(crate) fn addr(&self, t: u16) -> Option<SocketAddr> {
        decode_address(self.get(t)?, &self.txid, true)
    }
    pub(crate) fn lifetime(&self) -> Option<u32> {
        self.get(attr::LIFETIME)
            .map(|v| u32::from_be_bytes(v.try_into().unwrap()))
    }
}

pub(crate) fn decode(s: &Sent) -> Resp {
    let Sent::Client(_, raw) = s else {
        panic!("not for the client: {s:?}")
    };
    let m = Message::parse(raw).expect("valid STUN");
    let attrs: Vec<_> = m.attributes().map(|a| (a.typ, a.value.to_vec())).collect();
    let code = attrs
        .iter()
        .find(|(t, _)| *t == attr::ERROR_CODE)
        .map(|(_, v)| u16::from(v[2]) * 100 + u16::from(v[3]));
    // Reason phrases are only sent with `include-reason-string`; the phrase must be the
    // code's (the tests of that option read it).
    if let Some((_, v)) = attrs.iter().find(|(t, _)| *t == attr::ERROR_CODE) {
        let phrase = std::str::from_utf8(&v[4..]).expect("UTF-8 phrase");
        let code = u16::from(v[2]) * 100 + u16::from(v[3]);
        assert!(
            phrase.is_empty() || phrase == crate::stun::reason_phrase(code),
            "{code} {phrase}"
        );
    }
    Resp {
        class: m.class(),
        method: m.method(),
        code,
        attrs,
        txid: m.transaction_id(),
        raw: raw.clone(),
    }
}

/// Credentials a test client uses.
#[derive(Clone)]
pub(crate) struct Creds {
    pub user: String,
    pub key: [u8; 16],
}

impl Creds {
    pub(crate) fn password(user: &str, pass: &str) -> Creds {
        Creds {
            user: user.into(),
            key: long_term_key(user, REALM, pass),
        }
    }
    pub(crate) fn rest(secret: &[u8], expiry: u64, user: &str) -> Creds {
        let name = format!("{expiry}:{user}");
        let pass = rest_password(secret, &name);
        Creds::password(&name, &pass)
    }
}

static TXID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

pub(crate) fn txid() -> [u8; 12] {
    let n = TXID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut t = [0xA5u8; 12];
    t[8..].copy_from_slice(&n.to_be_bytes());
    t
}

pub(crate) struct Req {
    pub method: u16,
    pub class: Class,
    pub txid: [u8; 12],
    pub attrs: Vec<(u16, Vec<u8>)>,
    pub auth: Option<(Creds, Vec<u8>)>,
    pub fingerprint: bool,
    pub sha256: bool,
}

impl Req {
    pub(crate) fn new(method: u16) -> Req {
        Req {
            method,
            class: Class::Request,
            txid: txid(),
            attrs: Vec::new(),
            auth: None,
            fingerprint: false,
            sha256: false,
        }
    }
    pub(crate) fn indication(method: u16) -> Req {
        Req {
            class: Class::Indication,
            ..Req::new(method)
        }
    }
    pub(crate) fn attr(mut self, t: u16, v: impl Into<Vec<u8>>) -> Req {
        self.attrs.push((t, v.into()));
        self
    }
    pub(crate) fn transport_udp(self) -> Req {
        self.attr(attr::REQUESTED_TRANSPORT, vec![17, 0, 0, 0])
    }
    pub(crate) fn peer(self, p: &str) -> Req {
        let p: SocketAddr = p.parse().unwrap();
        let mut v = [0u8; 20];
        let n = stun::encode_xor_address(&mut v, p, &self.txid);
        self.attr(attr::XOR_PEER_ADDRESS, v[..n].to_vec())
    }
    pub(crate) fn channel(self, n: u16) -> Req {
        let b = n.to_be_bytes();
        self.attr(attr::CHANNEL_NUMBER, vec![b[0], b[1], 0, 0])
    }
    pub(crate) fn lifetime(self, s: u32) -> Req {
        self.attr(attr::LIFETIME, s.to_be_bytes().to_vec())
    }
    pub(crate) fn auth(mut self, c: &Creds, nonce: &[u8]) -> Req {
        self.auth = Some((c.clone(), nonce.to_vec()));
        self
    }
    pub(crate) fn fp(mut self) -> Req {
        self.fingerprint = true;
        self
    }
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut b = Builder::new(&mut buf, self.method, self.class, self.txid);
        for (t, v) in &self.attrs {
            b.attr(*t, v);
        }
        if let Some((c, nonce)) = &self.auth {
            b.attr(attr::USERNAME, c.user.as_bytes())
                .attr(attr::REALM, REALM.as_bytes())
                .attr(attr::NONCE, nonce);
            if self.sha256 {
                b.integrity_sha256(&c.key);
            } else {
                b.integrity_sha1(&c.key);
            }
        }
        if self.fingerprint {
            b.fingerprint();
        }
        buf
    }
}

impl H {
    /// Get a nonce the way a client does: an unauthenticated Allocate answered 401.
    /// (While refusing with alternates a new client's first Allocate gets 300: then an
    /// unauthenticated Refresh, which any server answers 401.)
    pub(crate) fn nonce(&mut self, from: ClientAddr) -> Vec<u8> {
        let r = self
            .client(from, &Req::new(method::ALLOCATE).transport_udp().bytes())
            .unwrap();
        let mut r = decode(&r);
        if r.code == Some(300) {
            r = decode(
                &self
                    .client(from, &Req::new(method::REFRESH).bytes())
                    .unwrap(),
            );
        }
        assert_eq!(r.code, Some(401));
        r.get(attr::NONCE).unwrap().to_vec()
    }

    /// Send `req` authenticated with `c` (fetching a nonce first).
    pub(crate) fn authed(&mut self, from: ClientAddr, c: &Creds, req: Req) -> Resp {
        let nonce = self.nonce(from);
        let bytes = req.auth(c, &nonce).bytes();
        let sent = self.client(from, &bytes).expect("a response");
        decode(&sent)
    }

    /// Allocate for `from` with `c`; returns the relay address (local).
    pub(crate) fn allocate(&mut self, from: ClientAddr, c: &Creds) -> SocketAddr {
        let r = self.authed(from, c, Req::new(method::ALLOCATE).transport_udp());
        assert_eq!(r.class, Class::Success, "allocate failed: {:?}", r.code);
        r.addr(attr::XOR_RELAYED_ADDRESS).unwrap()
    }
}

pub(crate) fn alice() -> Creds {
    Creds::password("alice", "alicepass")
}

// ------------------------------------------------------------------------------------------

#[test]
fn binding_returns_xor_mapped_address() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let req = Req::new(method::BINDING).fp();
    let r = decode(&h.client(from, &req.bytes()).unwrap());
    assert_eq!((r.class, r.method), (Class::Success, method::BINDING));
    assert_eq!(r.addr(attr::XOR_MAPPED_ADDRESS), Some(from.client));
    assert!(r.get(attr::FINGERPRINT).is_some());
    assert!(r.get(attr::SOFTWARE).is_none());
    // No FINGERPRINT in the response when the request had none.
    let r = decode(&h.client(from, &Req::new(method::BINDING).bytes()).unwrap());
    assert!(r.get(attr::FINGERPRINT).is_none());
    assert!(r.raw.len() <= 32);
}

#[test]
fn unauthenticated_allocate_gets_401_with_realm_and_nonce() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let req = Req::new(method::ALLOCATE).transport_udp().bytes();
    let r = decode(&h.client(from, &req).unwrap());
    assert_eq!(r.code, Some(401));
    assert_eq!(r.get(attr::REALM), Some(REALM.as_bytes()));
    assert_eq!(r.get(attr::NONCE).unwrap().len(), NONCE_LEN);
    assert!(r.get(attr::MESSAGE_INTEGRITY).is_none());
    // Exact size: header + ERROR-CODE + REALM (11 -> 12) + NONCE (16).
    assert_eq!(r.raw.len(), 20 + 8 + 16 + 20);
    assert!(
        h.events().is_empty(),
        "the first challenge is not an auth failure"
    );
}

/// coturn's `unauthorized-ratelimit`, on by default: at most `unauthorized_rps` challenges
/// (and Binding successes) larger than their request to one source IP per second over UDP;
/// other sources, TCP, and authenticated requests are not limited, and the next second
/// gets a fresh budget.
#[test]
fn amplifying_unauthenticated_answers_are_rate_limited_per_source_ip() {
    let mut cfg = base_config();
    cfg.unauthorized_rps = 5;
    let mut h = H::new(cfg);
    let victim = udp("192.0.2.7:40000");
    let req = Req::new(method::ALLOCATE).transport_udp().bytes();
    let binding = Req::new(method::BINDING).bytes();
    let answered = |h: &mut H, from, bytes: &[u8], n| {
        (0..n).filter(|_| h.client(from, bytes).is_some()).count()
    };
    let nonce = h.nonce(victim);
    assert_eq!(answered(&mut h, victim, &req, 3), 3);
    // Another port of the same IP shares its budget; Binding counts too.
    assert_eq!(answered(&mut h, udp("192.0.2.7:40001"), &binding, 3), 1);
    assert_eq!(answered(&mut h, victim, &req, 10), 0);
    assert_eq!(h.server.counters().ratelimited_responses, 12);
    // Another source, a TCP client, an authenticated request: answered.
    assert_eq!(answered(&mut h, udp("192.0.2.8:40000"), &req, 5), 5);
    let tcp = ClientAddr {
        transport: Transport::Tcp,
        ..victim
    };
    assert_eq!(answered(&mut h, tcp, &req, 20), 20);
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let r = decode(&h.client(victim, &bytes).expect("an authenticated answer"));
    assert_eq!(r.class, Class::Success);
    h.advance(1);
    assert_eq!(answered(&mut h, victim, &req, 10), 5);
    // 0: no limit.
    let mut cfg = base_config();
    cfg.unauthorized_rps = 0;
    let mut h = H::new(cfg);
    assert_eq!(answered(&mut h, victim, &req, 500), 500);
}

#[test]
fn static_user_allocates_and_response_is_authenticated() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE).transport_udp().fp(),
    );
    assert_eq!(r.class, Class::Success);
    assert_eq!(r.lifetime(), Some(600));
    assert_eq!(r.addr(attr::XOR_MAPPED_ADDRESS), Some(from.client));
    let relay = r.addr(attr::XOR_RELAYED_ADDRESS).unwrap();
    assert_eq!(relay.ip(), "203.0.113.10".parse::<IpAddr>().unwrap());
    let m = Message::parse(&r.raw).unwrap();
    let mi = m
        .attributes()
        .find(|a| a.typ == attr::MESSAGE_INTEGRITY)
        .unwrap();
    assert!(m.check_integrity_sha1(mi.offset, mi.value, &alice().key));
    let fp = m.attributes().find(|a| a.typ == attr::FINGERPRINT).unwrap();
    assert!(m.check_fingerprint(fp.offset, fp.value));
    assert_eq!(h.server.allocation_count(), 1);
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::AllocationCreated { username, lifetime: 600, .. }] if username == "alice")
    );
}

#[test]
fn precomputed_key_user() {
    let mut c = base_config();
    let key = long_term_key("carol", REALM, "carolpass");
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    c.auth.add_coturn_user(&format!("carol:0x{hex}")).unwrap();
    let mut h = H::new(c);
    h.allocate(
        udp("192.0.2.7:40000"),
        &Creds::password("carol", "carolpass"),
    );
    assert!(parse_coturn_user("carol:0x12").is_err());
    assert!(parse_coturn_user("nocolon").is_err());
}

#[test]
fn bad_message_integrity_401() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &Creds::password("alice", "wrong"),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
    assert!(r.get(attr::NONCE).is_some());
    assert!(r.get(attr::MESSAGE_INTEGRITY).is_none());
    let ev = h.events();
    assert!(matches!(
        &ev[..],
        [Event::AuthFailed {
            reason: AuthFailure::BadIntegrity,
            ..
        }]
    ));
    assert_eq!(h.server.counters().auth_failures, 1);
    assert_eq!(h.server.allocation_count(), 0);
}

#[test]
fn tampered_message_401() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let nonce = h.nonce(from);
    let mut bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .lifetime(700)
        .auth(&alice(), &nonce)
        .bytes();
    bytes[20 + 8 + 7] ^= 1; // change LIFETIME after signing
    let r = decode(&h.client(from, &bytes).unwrap());
    assert_eq!(r.code, Some(401));
}

#[test]
fn unknown_user_401() {
    let mut h = H::new(base_config());
    let r = h.authed(
        udp("192.0.2.7:40000"),
        &Creds::password("mallory", "x"),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
    assert!(matches!(
        &h.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::UnknownUser,
            ..
        }]
    ));
}

#[test]
fn stale_nonce_438() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let nonce = h.nonce(from);
    h.advance(601);
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let r = decode(&h.client(from, &bytes).unwrap());
    assert_eq!(r.code, Some(438));
    assert!(matches!(
        &h.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::StaleNonce,
            username: Some(u),
            ..
        }] if u == "alice"
    ));
    // Nonce rotation is not an authentication failure.
    assert_eq!(h.server.counters().auth_failures, 0);
    let fresh = r.get(attr::NONCE).unwrap().to_vec();
    assert_ne!(fresh, nonce);
    assert_eq!(r.get(attr::REALM), Some(REALM.as_bytes()));
    // The fresh nonce works.
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &fresh)
        .bytes();
    assert_eq!(
        decode(&h.client(from, &bytes).unwrap()).class,
        Class::Success
    );
}

#[test]
fn nonce_from_another_ip_438() {
    let mut h = H::new(base_config());
    let nonce = h.nonce(udp("192.0.2.7:40000"));
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let r = decode(&h.client(udp("192.0.2.8:40000"), &bytes).unwrap());
    assert_eq!(r.code, Some(438));
    assert!(matches!(
        &h.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::UnknownNonce,
            ..
        }]
    ));
    // Another server's nonce (another secret) is unknown too.
    let mut config = base_config();
    config.nonce.secret = [8; 32];
    let mut other = H::new(config);
    let foreign = other.nonce(udp("192.0.2.7:40000"));
    let forged = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &foreign)
        .bytes();
    let r = decode(&h.client(udp("192.0.2.7:40000"), &forged).unwrap());
    assert_eq!(r.code, Some(438));
    assert!(matches!(
        &h.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::UnknownNonce,
            ..
        }]
    ));
    // Same IP, other port (NAT rebinding, a new TCP connection): still valid.
    let r = decode(&h.client(udp("192.0.2.7:40001"), &bytes).unwrap());
    assert_eq!(r.class, Class::Success);
}

#[test]
fn rest_credentials_valid_expired_rotated_and_capped() {
    let mut c = base_config();
    c.auth.rest_secrets = vec![b"old".to_vec(), b"new".to_vec()];
    let mut h = H::new(c);
    let now = h.unix_now();
    // Valid with the first secret.
    h.allocate(
        udp("192.0.2.7:40000"),
        &Creds::rest(b"old", now + 3600, "u1"),
    );
    // Rotation: the second secret is accepted too.
    h.allocate(
        udp("192.0.2.7:40001"),
        &Creds::rest(b"new", now + 3600, "u2"),
    );
    // Username without a user part.
    let name = format!("{}", now + 3600);
    h.allocate(
        udp("192.0.2.7:40005"),
        &Creds::password(&name, &rest_password(b"new", &name)),
    );
    // A secret we do not know: 401.
    let r = h.authed(
        udp("192.0.2.7:40002"),
        &Creds::rest(b"other", now + 3600, "u3"),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
    // Expired: 401.
    h.events();
    let r = h.authed(
        udp("192.0.2.7:40003"),
        &Creds::rest(b"new", now - 1, "u4"),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
    assert!(matches!(
        &h.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::Expired,
            ..
        }]
    ));
    // Lifetime capped at the credential's expiry.
    let r = h.authed(
        udp("192.0.2.7:40004"),
        &Creds::rest(b"new", now + 120, "u5"),
        Req::new(method::ALLOCATE).transport_udp().lifetime(3600),
    );
    assert_eq!(r.class, Class::Success);
    assert_eq!(r.lifetime(), Some(120));
}

#[test]
fn rest_lifetime_cap_applies_on_refresh_and_allocation_expires() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let c = Creds::rest(SECRET, h.unix_now() + 100, "u");
    let relay = h.allocate(from, &c);
    let r = h.authed(from, &c, Req::new(method::REFRESH).lifetime(3000));
    assert_eq!(r.lifetime(), Some(100));
    h.advance(99);
    assert_eq!(h.server.allocation_count(), 1);
    h.advance(1);
    assert_eq!(h.server.allocation_count(), 0);
    assert_eq!(h.relays.released, vec![relay]);
}

#[test]
fn error_400_cases() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    // Missing REQUESTED-TRANSPORT.
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE));
    assert_eq!(r.code, Some(400));
    // MESSAGE-INTEGRITY without USERNAME/NONCE.
    let mut buf = Vec::new();
    let mut b = Builder::new(&mut buf, method::ALLOCATE, Class::Request, txid());
    b.attr(attr::REQUESTED_TRANSPORT, &[17, 0, 0, 0])
        .attr(attr::SOFTWARE, &[b'x'; 40])
        .integrity_sha1(&alice().key);
    let r = decode(&h.client(from, &buf).unwrap());
    assert_eq!(r.code, Some(400));
    // Malformed LIFETIME.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::LIFETIME, vec![1, 2]),
    );
    assert_eq!(r.code, Some(400));
    // Both REQUESTED-ADDRESS-FAMILY and ADDITIONAL-ADDRESS-FAMILY.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![1, 0, 0, 0])
            .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(400));
    // ADDITIONAL-ADDRESS-FAMILY IPv4.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![1, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(400));
    assert_eq!(h.server.allocation_count(), 0);
}

#[test]
fn unknown_comprehension_required_attributes_420() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(0x0031, vec![1, 2, 3, 4])
            .attr(0x7001, vec![]),
    );
    assert_eq!(r.code, Some(420));
    assert_eq!(
        r.get(attr::UNKNOWN_ATTRIBUTES),
        Some(&[0x00, 0x31, 0x70, 0x01][..])
    );
    // Unknown comprehension-optional attributes are ignored; DONT-FRAGMENT is accepted.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(0x8077, vec![1])
            .attr(attr::DONT_FRAGMENT, vec![]),
    );
    assert_eq!(r.class, Class::Success);
    // Binding with an unknown comprehension-required attribute: 420 (unauthenticated, so
    // only when the answer is not larger than the request).
    let bytes = Req::new(method::BINDING).attr(0x0031, vec![0; 8]).bytes();
    assert_eq!(h.client(from, &bytes), None);
    let bytes = Req::new(method::BINDING)
        .attr(0x0031, vec![0; 8])
        .attr(attr::SOFTWARE, vec![b'x'; 8])
        .bytes();
    let r = decode(&h.client(from, &bytes).unwrap());
    assert_eq!(r.code, Some(420));
}

#[test]
fn allocation_mismatch_437() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    for m in [
        method::REFRESH,
        method::CREATE_PERMISSION,
        method::CHANNEL_BIND,
    ] {
        let r = h.authed(
            from,
            &alice(),
            Req::new(m).peer("8.8.8.8:1").channel(0x4000),
        );
        assert_eq!(r.code, Some(437), "method {m}");
    }
    h.allocate(from, &alice());
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(437));
}

#[test]
fn allocate_retransmission_gets_the_same_answer() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let nonce = h.nonce(from);
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let a = decode(&h.client(from, &bytes).unwrap());
    let b = decode(&h.client(from, &bytes).unwrap());
    assert_eq!(b.class, Class::Success);
    assert_eq!(
        a.addr(attr::XOR_RELAYED_ADDRESS),
        b.addr(attr::XOR_RELAYED_ADDRESS)
    );
    assert_eq!(h.relays.bound.len(), 1);
}

#[test]
fn address_family_440() {
    let mut c = base_config();
    c.relay.relay_ips = vec!["203.0.113.10".parse().unwrap()];
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(440));
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![3, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(440));
    // Dual allocation without IPv6: IPv4 relay plus ADDRESS-ERROR-CODE 440 for IPv6.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.class, Class::Success);
    assert_eq!(r.all(attr::XOR_RELAYED_ADDRESS).len(), 1);
    assert_eq!(r.get(attr::ADDRESS_ERROR_CODE), Some(&[2, 0, 4, 40][..]));
}

#[test]
fn dual_allocation_and_ipv6() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.class, Class::Success);
    let relays = r.all(attr::XOR_RELAYED_ADDRESS);
    assert_eq!(relays.len(), 2);
    let v6 = decode_address(relays[1], &r.txid, true).unwrap();
    assert!(v6.is_ipv6());
    // Permissions for both families; data flows on both.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION)
            .peer("8.8.8.8:53")
            .peer("[2606:4700::1111]:53"),
    );
    assert_eq!(r.class, Class::Success);
    let v4: SocketAddr = h.relays.bound[0];
    assert!(h.peer(v4, "8.8.8.8:53".parse().unwrap(), b"x").is_some());
    assert!(h
        .peer(v6, "[2606:4700::1111]:53".parse().unwrap(), b"y")
        .is_some());
    // REQUESTED-ADDRESS-FAMILY IPv6 alone.
    let from6 = udp("192.0.2.8:40000");
    let r = h.authed(
        from6,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert!(r.addr(attr::XOR_RELAYED_ADDRESS).unwrap().is_ipv6());
    // Refresh asking for IPv4 on an IPv6-only allocation: 443.
    let r = h.authed(
        from6,
        &alice(),
        Req::new(method::REFRESH).attr(attr::REQUESTED_ADDRESS_FAMILY, vec![1, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(443));
}

#[test]
fn wrong_credentials_441() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    h.allocate(from, &alice());
    let r = h.authed(
        from,
        &Creds::password("bob", "bobpass"),
        Req::new(method::REFRESH),
    );
    assert_eq!(r.code, Some(441));
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::AuthFailed {
            reason: AuthFailure::WrongCredentials,
            ..
        }
    )));
}

#[test]
fn unsupported_transport_442() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE).attr(attr::REQUESTED_TRANSPORT, vec![6, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(442));
    let mut c = base_config();
    c.udp_relay = false;
    let mut h = H::new(c);
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(442));
}

#[test]
fn peer_family_mismatch_443() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    h.allocate(from, &alice());
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("[2606:4700::1111]:53"),
    );
    assert_eq!(r.code, Some(443));
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4000)
            .peer("[2606:4700::1111]:53"),
    );
    assert_eq!(r.code, Some(443));
}

#[test]
fn quotas_486() {
    let mut c = base_config();
    c.quotas.per_user = 1;
    c.quotas.total = 2;
    let mut h = H::new(c);
    h.allocate(udp("192.0.2.7:40000"), &alice());
    let r = h.authed(
        udp("192.0.2.7:40001"),
        &alice(),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(486));
    h.allocate(udp("192.0.2.7:40002"), &Creds::password("bob", "bobpass"));
    let r = h.authed(
        udp("192.0.2.7:40003"),
        &Creds::rest(SECRET, h.unix_now() + 99, "c"),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(486));
    assert_eq!(h.server.counters().refused_quota, 2);
    // Freeing one allocation frees the user's quota.
    let r = h.authed(
        udp("192.0.2.7:40000"),
        &alice(),
        Req::new(method::REFRESH).lifetime(0),
    );
    assert_eq!(r.class, Class::Success);
    h.allocate(udp("192.0.2.7:40001"), &alice());
}

#[test]
fn no_relay_port_508() {
    let mut h = H::new(base_config());
    h.relays.fail = Some(RelayError::NoPort);
    let r = h.authed(
        udp("192.0.2.7:40000"),
        &alice(),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(508));
    assert!(h
        .events()
        .iter()
        .any(|e| matches!(e, Event::AllocateRefused { code: 508, .. })));
}

/// Every peer-address class of turn.md, IPv4 and IPv6 allocations, CreatePermission and
/// ChannelBind: 403.
#[test]
fn forbidden_peers_403() {
    let v4_peers = [
        "127.0.0.1:9",
        "127.255.255.254:9",
        "0.0.0.0:9",
        "0.1.2.3:9",
        "169.254.169.254:80",
        "169.254.0.1:9",
        "224.0.0.1:9",
        "239.255.255.250:1900",
        "255.255.255.255:9",
        "10.0.0.1:9",
        "172.16.5.4:9",
        "172.31.255.255:9",
        "192.168.1.1:9",
        "100.64.0.1:9",
        "198.18.0.1:9",
        "240.0.0.1:9",
        "192.0.2.1:9",
        "192.0.0.8:9",
    ];
    let v6_peers = [
        "[::1]:9",
        "[::]:9",
        "[fe80::1]:9",
        "[febf::1]:9",
        "[ff02::1]:9",
        "[ff0e::1]:9",
        "[fc00::1]:9",
        "[fd12:3456::1]:9",
        "[fec0::1]:9",
        "[2001:db8::1]:9",
        // IPv4-mapped
        "[::ffff:127.0.0.1]:9",
        "[::ffff:169.254.169.254]:80",
        "[::ffff:10.0.0.1]:9",
        "[::ffff:0.0.0.0]:9",
        "[::ffff:224.0.0.1]:9",
        "[::ffff:255.255.255.255]:9",
        // IPv4-compatible
        "[::127.0.0.1]:9",
        "[::169.254.169.254]:80",
        "[::10.1.2.3]:9",
        "[::192.168.0.1]:9",
        // 6to4
        "[2002:7f00:1::1]:9",
        "[2002:a9fe:a9fe::]:80",
        "[2002:0a00:0001::1]:9",
        "[2002:c0a8:0101::]:9",
        "[2002:e000:0001::]:9",
        // NAT64 well-known and local-use
        "[64:ff9b::127.0.0.1]:9",
        "[64:ff9b::169.254.169.254]:80",
        "[64:ff9b::10.0.0.1]:9",
        "[64:ff9b::192.168.1.1]:9",
        "[64:ff9b:1::127.0.0.1]:9",
        "[64:ff9b:1::8.8.8.8]:9",
        // IPv4-translated, ISATAP, Teredo (client 127.0.0.1 inverted), the rest of ::/8
        "[::ffff:0:127.0.0.1]:9",
        "[::ffff:0:169.254.169.254]:80",
        "[::5efe:169.254.169.254]:80",
        "[2606:4700:1:2:200:5efe:127.0.0.1]:9",
        "[2001:0:808:808::80ff:fffe]:9",
        "[2001:0:a9fe:a9fe::f7f7:f7f7]:80",
        "[::1:0:0:1]:9",
    ];
    let mut h = H::new(base_config());
    let v4_client = udp("192.0.2.7:40000");
    let v6_client = udp("192.0.2.7:40001");
    h.allocate(v4_client, &alice());
    let r = h.authed(
        v6_client,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.class, Class::Success);
    let mut channel = 0x4000;
    for (client, peers) in [(v4_client, &v4_peers[..]), (v6_client, &v6_peers[..])] {
        for p in peers {
            let r = h.authed(
                client,
                &alice(),
                Req::new(method::CREATE_PERMISSION).peer(p),
            );
            assert_eq!(r.code, Some(403), "CreatePermission {p}");
            let r = h.authed(
                client,
                &alice(),
                Req::new(method::CHANNEL_BIND).channel(channel).peer(p),
            );
            assert_eq!(r.code, Some(403), "ChannelBind {p}");
            channel += 1;
        }
    }
    // All or nothing: one forbidden peer among allowed ones refuses the whole request.
    let r = h.authed(
        v4_client,
        &alice(),
        Req::new(method::CREATE_PERMISSION)
            .peer("8.8.8.8:1")
            .peer("10.0.0.1:1"),
    );
    assert_eq!(r.code, Some(403));
    assert!(h
        .peer(h.relays.bound[0], "8.8.8.8:1".parse().unwrap(), b"x")
        .is_none());
    // Public peers are fine, on both families, including IPv6 spellings of public IPv4.
    for p in ["8.8.8.8:53", "1.1.1.1:53"] {
        let r = h.authed(
            v4_client,
            &alice(),
            Req::new(method::CREATE_PERMISSION).peer(p),
        );
        assert_eq!(r.class, Class::Success, "{p}");
    }
    for p in [
        "[2606:4700::1111]:53",
        "[64:ff9b::8.8.8.8]:53",
        "[2002:0808:0808::1]:53",
        "[::ffff:8.8.8.8]:53",
    ] {
        let r = h.authed(
            v6_client,
            &alice(),
            Req::new(method::CREATE_PERMISSION).peer(p),
        );
        assert_eq!(r.class, Class::Success, "{p}");
    }
}

#[test]
fn peer_policy_options() {
    let mut p = PeerPolicy::default();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(p.check(ip("10.1.2.3")), Err(DenyReason::Private));
    assert_eq!(p.check(ip("127.0.0.1")), Err(DenyReason::Loopback));
    assert_eq!(p.check(ip("::ffff:127.0.0.1")), Err(DenyReason::Loopback));
    assert_eq!(p.check(ip("169.254.169.254")), Err(DenyReason::LinkLocal));
    assert!(p.check(ip("8.8.8.8")).is_ok());
    p.allowed.push("10.0.0.0/8".parse().unwrap());
    assert!(p.check(ip("10.1.2.3")).is_ok());
    assert!(
        p.check(ip("::ffff:10.1.2.3")).is_ok(),
        "an allowed IPv4 range covers its IPv6 spellings"
    );
    p.denied.push("10.1.0.0-10.1.255.255".parse().unwrap());
    assert!(
        p.check(ip("10.1.2.3")).is_ok(),
        "allowed-peer-ip wins over denied-peer-ip (coturn)"
    );
    p.denied.push("8.8.8.8".parse().unwrap());
    assert_eq!(p.check(ip("8.8.8.8")), Err(DenyReason::Configured));
    assert_eq!(p.check(ip("::ffff:8.8.8.8")), Err(DenyReason::Configured));
    // allowed-peer-ip never opens the always-denied classes.
    p.allowed.push("127.0.0.0/8".parse().unwrap());
    p.allowed.push("169.254.0.0/16".parse().unwrap());
    assert_eq!(p.check(ip("127.0.0.1")), Err(DenyReason::Loopback));
    assert_eq!(p.check(ip("169.254.169.254")), Err(DenyReason::LinkLocal));
    p.allow_loopback = true;
    assert!(p.check(ip("127.0.0.1")).is_ok());
    assert!(p.check(ip("::1")).is_ok());
    assert_eq!(p.check(ip("169.254.169.254")), Err(DenyReason::LinkLocal));
    // Range syntax.
    assert!("1.2.3.4-1.2.3.1".parse::<IpRange>().is_err());
    assert!("1.2.3.4-::1".parse::<IpRange>().is_err());
    assert!("1.2.3.4/33".parse::<IpRange>().is_err());
    assert!("fc00::/7"
        .parse::<IpRange>()
        .unwrap()
        .contains(ip("fdff::1")));
    assert!("0.0.0.0/0"
        .parse::<IpRange>()
        .unwrap()
        .contains(ip("1.2.3.4")));
}

#[test]
fn allowed_peer_ip_opens_private_peer_in_server() {
    let mut c = base_config();
    c.peer_policy.allowed.push("10.0.0.0/8".parse().unwrap());
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    h.allocate(from, &alice());
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("10.2.3.4:5"),
    );
    assert_eq!(r.class, Class::Success);
}

#[test]
fn channel_rules_400() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    h.allocate(from, &alice());
    for bad in [0x0000, 0x3FFF, 0x8000, 0xFFFF] {
        let r = h.authed(
            from,
            &alice(),
            Req::new(method::CHANNEL_BIND)
                .channel(bad)
                .peer("8.8.8.8:1"),
        );
        assert_eq!(r.code, Some(400), "channel {bad:#x}");
    }
    for (i, ok) in [0x4000, 0x4FFF, 0x5000, 0x7FFF].into_iter().enumerate() {
        let peer = format!("8.8.8.{i}:1");
        let r = h.authed(
            from,
            &alice(),
            Req::new(method::CHANNEL_BIND).channel(ok).peer(&peer),
        );
        assert_eq!(r.class, Class::Success, "channel {ok:#x}");
    }
    // The same peer on a second channel: 400.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.0:1"),
    );
    assert_eq!(r.code, Some(400));
    // A bound channel to another peer: 400.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4000)
            .peer("8.8.4.4:1"),
    );
    assert_eq!(r.code, Some(400));
    // Rebinding the same pair refreshes it.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4000)
            .peer("8.8.8.0:1"),
    );
    assert_eq!(r.class, Class::Success);
    // Missing attributes, two peers: 400.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND).channel(0x4002),
    );
    assert_eq!(r.code, Some(400));
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4002)
            .peer("8.8.4.4:1")
            .peer("8.8.4.5:1"),
    );
    assert_eq!(r.code, Some(400));
    // CreatePermission without a peer: 400.
    let r = h.authed(from, &alice(), Req::new(method::CREATE_PERMISSION));
    assert_eq!(r.code, Some(400));
}

#[test]
fn full_round_trip_udp() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let relay = h.allocate(from, &alice());
    let peer: SocketAddr = "8.8.8.8:5000".parse().unwrap();
    // No permission yet: peer data dropped, Send dropped.
    assert_eq!(h.peer(relay, peer, b"early"), None);
    let send = Req::indication(method::SEND)
        .peer("8.8.8.8:5000")
        .attr(attr::DATA, b"via send".to_vec())
        .bytes();
    assert_eq!(h.client(from, &send), None);
    assert_eq!(h.server.counters().peer_dropped, 1);
    // CreatePermission, then Send goes out and peer data comes back as a Data indication.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:5000"),
    );
    assert_eq!(r.class, Class::Success);
    assert_eq!(
        h.client(from, &send),
        Some(Sent::Peer(relay, peer, b"via send".to_vec()))
    );
    let d = decode(&h.peer(relay, peer, b"hello").unwrap());
    assert_eq!((d.class, d.method), (Class::Indication, method::DATA));
    assert_eq!(d.addr(attr::XOR_PEER_ADDRESS), Some(peer));
    assert_eq!(d.get(attr::DATA), Some(&b"hello"[..]));
    // Permissions are per IP: another port of the same peer IP passes.
    assert!(h
        .peer(relay, "8.8.8.8:6000".parse().unwrap(), b"x")
        .is_some());
    // ChannelBind, then ChannelData both ways.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    assert_eq!(r.class, Class::Success);
    let cd = [0x40, 0x01, 0x00, 0x03, b'a', b'b', b'c'];
    assert_eq!(
        h.client(from, &cd),
        Some(Sent::Peer(relay, peer, b"abc".to_vec()))
    );
    // Over UDP, padding after the payload is accepted.
    let cd_padded = [0x40, 0x01, 0x00, 0x03, b'a', b'b', b'c', 0];
    assert_eq!(
        h.client(from, &cd_padded),
        Some(Sent::Peer(relay, peer, b"abc".to_vec()))
    );
    assert_eq!(
        h.peer(relay, peer, b"xyz"),
        Some(Sent::Client(
            from,
            vec![0x40, 0x01, 0x00, 0x03, b'x', b'y', b'z']
        ))
    );
    // Unbound channel or truncated ChannelData: dropped.
    assert_eq!(h.client(from, &[0x40, 0x02, 0x00, 0x01, b'a']), None);
    assert_eq!(h.client(from, &[0x40, 0x01, 0x00, 0x09, b'a']), None);
    // Another client cannot use this allocation's channel.
    assert_eq!(h.client(udp("192.0.2.9:1"), &cd), None);
    let c = *h.server.counters();
    assert_eq!(c.peer_packets_out, 3);
    assert!(c.client_data_dropped >= 3);
}

#[test]
fn tcp_channel_data_is_padded_and_close_deletes() {
    let mut h = H::new(base_config());
    let from = ClientAddr {
        transport: Transport::Tcp,
        client: "192.0.2.7:40000".parse().unwrap(),
        local: "198.51.100.1:3478".parse().unwrap(),
    };
    let relay = h.allocate(from, &alice());
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    assert_eq!(r.class, Class::Success);
    let got = h
        .peer(relay, "8.8.8.8:5000".parse().unwrap(), b"hello")
        .unwrap();
    assert_eq!(
        got,
        Sent::Client(
            from,
            vec![0x40, 0x01, 0x00, 0x05, b'h', b'e', b'l', b'l', b'o', 0, 0, 0]
        )
    );
    h.events();
    h.server.close_client(h.now, &from);
    h.collect_releases();
    assert_eq!(h.server.allocation_count(), 0);
    assert_eq!(h.relays.released, vec![relay]);
    assert!(matches!(
        &h.events()[..],
        [Event::AllocationDeleted {
            reason: DeleteReason::ConnectionClosed,
            ..
        }]
    ));
}

#[test]
fn expiry_of_permissions_channels_and_allocations() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let relay = h.allocate(from, &alice());
    let peer: SocketAddr = "8.8.8.8:5000".parse().unwrap();
    let peer2: SocketAddr = "9.9.9.9:5000".parse().unwrap();
    h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("9.9.9.9:5000"),
    );
    assert!(h.server.poll_timeout().unwrap() <= h.now + Duration::from_secs(300));
    h.advance(299);
    assert!(h.peer(relay, peer2, b"x").is_some());
    h.advance(1);
    // Permissions (300 s) expired; ChannelData and Send do not refresh them.
    assert!(h.peer(relay, peer2, b"x").is_none());
    assert!(
        h.peer(relay, peer, b"x").is_none(),
        "the channel's permission expired too"
    );
    assert_eq!(h.client(from, &[0x40, 0x01, 0, 1, b'a']), None);
    // Refresh the channel binding (which refreshes the permission), keep the allocation alive.
    h.authed(from, &alice(), Req::new(method::REFRESH).lifetime(3600));
    h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    assert!(matches!(h.peer(relay, peer, b"x"), Some(Sent::Client(_, d)) if d[0] == 0x40));
    // Channel (600 s) outlives a permission that is refreshed by CreatePermission.
    h.advance(290);
    h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:1"),
    );
    h.advance(280);
    h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:1"),
    );
    assert!(matches!(h.peer(relay, peer, b"x"), Some(Sent::Client(_, d)) if d[0] == 0x40));
    h.advance(30);
    // 600 s after the ChannelBind: the channel expired; data falls back to a Data indication.
    let d = decode(&h.peer(relay, peer, b"x").unwrap());
    assert_eq!(d.method, method::DATA);
    // The expired channel is quarantined: not rebindable to another peer, nor the peer to
    // another channel, but rebinding the same pair works.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.4.4:1"),
    );
    assert_eq!(r.code, Some(400));
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4002)
            .peer("8.8.8.8:5000"),
    );
    assert_eq!(r.code, Some(400));
    h.advance(300);
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.4.4:1"),
    );
    assert_eq!(
        r.class,
        Class::Success,
        "after the quarantine the number is free"
    );
    // The allocation expires at its lifetime (3600 s from the refresh).
    h.events();
    h.advance(3600 - 290 - 280 - 30 - 300 - 1);
    assert_eq!(h.server.allocation_count(), 1);
    h.advance(1);
    assert_eq!(h.server.allocation_count(), 0);
    assert_eq!(h.relays.released, vec![relay]);
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::AllocationDeleted {
            reason: DeleteReason::Expired,
            ..
        }
    )));
    assert!(h.peer(relay, peer, b"x").is_none());
}

#[test]
fn lifetimes_default_and_max() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE).transport_udp().lifetime(30),
    );
    assert_eq!(r.lifetime(), Some(600), "below default: default");
    let r = h.authed(from, &alice(), Req::new(method::REFRESH).lifetime(100_000));
    assert_eq!(r.lifetime(), Some(3600), "capped at max-allocate-lifetime");
    let r = h.authed(from, &alice(), Req::new(method::REFRESH));
    assert_eq!(r.lifetime(), Some(600));
    let r = h.authed(from, &alice(), Req::new(method::REFRESH).lifetime(0));
    assert_eq!((r.class, r.lifetime()), (Class::Success, Some(0)));
    assert_eq!(h.server.allocation_count(), 0);
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::AllocationDeleted {
            reason: DeleteReason::Refreshed,
            ..
        }
    )));
}

#[test]
fn drain_refuses_new_allocations_only() {
    let mut h = H::new(base_config());
    let old = udp("192.0.2.7:40000");
    let relay = h.allocate(old, &alice());
    h.authed(
        old,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    let alts: Vec<SocketAddr> = vec![
        "198.51.100.2:3478".parse().unwrap(),
        "[2001:db8::2]:3478".parse().unwrap(),
        "198.51.100.3:3478".parse().unwrap(),
    ];
    h.server.set_drain(DrainMode::Refuse {
        alternates: alts.clone(),
    });
    // A new client's first, unauthenticated Allocate gets 300 at once (coturn's answer),
    // with ALTERNATE-SERVER only: no REALM or NONCE (libwebrtc would take them and then
    // treat the alternate's 401 as fatal), no MESSAGE-INTEGRITY; within the challenge's size.
    let new = udp("192.0.2.8:40000");
    let first = Req::new(method::ALLOCATE).transport_udp().bytes();
    let r = decode(&h.client(new, &first).unwrap());
    assert_eq!(r.code, Some(300));
    assert!(r.get(attr::ALTERNATE_SERVER).is_some());
    for a in [attr::REALM, attr::NONCE, attr::MESSAGE_INTEGRITY] {
        assert!(r.get(a).is_none(), "{a:#x} in the first 300");
    }
    assert!(r.raw.len() <= 60, "{} bytes", r.raw.len());
    // Authenticated (a client that already had a nonce): 300 with an IPv4
    // ALTERNATE-SERVER, round-robin, integrity-protected, with REALM and a fresh NONCE.
    let mut seen = Vec::new();
    let nonce = h.nonce(new);
    for _ in 0..4 {
        let req = Req::new(method::ALLOCATE)
            .transport_udp()
            .auth(&alice(), &nonce)
            .bytes();
        let r = decode(&h.client(new, &req).unwrap());
        assert_eq!(r.code, Some(300));
        assert!(r.get(attr::MESSAGE_INTEGRITY).is_some());
        assert_eq!(r.get(attr::REALM), Some(REALM.as_bytes()));
        assert_eq!(r.get(attr::NONCE).map(<[u8]>::len), Some(NONCE_LEN));
        let a = decode_address(r.get(attr::ALTERNATE_SERVER).unwrap(), &r.txid, false).unwrap();
        assert!(a.is_ipv4());
        seen.push(a);
    }
    assert!(seen.contains(&alts[0]) && seen.contains(&alts[2]));
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::AllocateRefusedDraining {
            alternate: Some(_),
            ..
        }
    )));
    // Existing allocation: Binding, Refresh, CreatePermission, ChannelBind, data all work.
    assert_eq!(
        decode(&h.client(old, &Req::new(method::BINDING).bytes()).unwrap()).class,
        Class::Success
    );
    assert_eq!(
        h.authed(old, &alice(), Req::new(method::REFRESH)).class,
        Class::Success
    );
    assert_eq!(
        h.authed(
            old,
            &alice(),
            Req::new(method::CREATE_PERMISSION).peer("9.9.9.9:1")
        )
        .class,
        Class::Success
    );
    assert_eq!(
        h.authed(
            old,
            &alice(),
            Req::new(method::CHANNEL_BIND)
                .channel(0x4002)
                .peer("9.9.9.9:1")
        )
        .class,
        Class::Success
    );
    assert!(h.client(old, &[0x40, 0x01, 0, 1, b'a']).is_some());
    assert!(h
        .peer(relay, "8.8.8.8:5000".parse().unwrap(), b"a")
        .is_some());
    // Without alternates: 403.
    h.server.set_drain(DrainMode::Refuse { alternates: vec![] });
    let r = h.authed(new, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(403));
    // Refresh 0 still deletes.
    let r = h.authed(old, &alice(), Req::new(method::REFRESH).lifetime(0));
    assert_eq!(r.class, Class::Success);
    assert_eq!(h.server.allocation_count(), 0);
    // Two first Allocates (300 unauthenticated), four authenticated (300), one 403.
    assert_eq!(h.server.counters().refused_draining, 7);
    h.server.set_drain(DrainMode::Off);
    h.allocate(new, &alice());
}

#[test]
fn drain_prefers_same_family_alternate() {
    let mut h = H::new(base_config());
    h.server.set_drain(DrainMode::Refuse {
        alternates: vec![
            "[2001:db8::2]:3478".parse().unwrap(),
            "198.51.100.2:3478".parse().unwrap(),
        ],
    });
    let from = ClientAddr {
        transport: Transport::Udp,
        client: "[2001:db8:1::7]:40000".parse().unwrap(),
        local: "[2001:db8::1]:3478".parse().unwrap(),
    };
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    let a = decode_address(r.get(attr::ALTERNATE_SERVER).unwrap(), &r.txid, false).unwrap();
    assert_eq!(a, "[2001:db8::2]:3478".parse().unwrap());
}

#[test]
fn external_ip_mapping() {
    let mut c = base_config();
    c.relay.external_ips = vec!["192.0.2.200/203.0.113.10".parse().unwrap()];
    let mut h = H::new(c);
    let r = h.authed(
        udp("192.0.2.7:40000"),
        &alice(),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    let adv = r.addr(attr::XOR_RELAYED_ADDRESS).unwrap();
    assert_eq!(adv.ip(), "192.0.2.200".parse::<IpAddr>().unwrap());
    assert_eq!(adv.port(), h.relays.bound[0].port());
    let e: ExternalIp = "1.2.3.4".parse().unwrap();
    assert_eq!(e.private, None);
    assert!("1.2.3.4/::1".parse::<ExternalIp>().is_err());
    let rc = RelayConfig {
        relay_ips: vec![],
        external_ips: vec![e],
    };
    assert_eq!(
        rc.advertised("10.0.0.1".parse().unwrap()),
        "1.2.3.4".parse::<IpAddr>().unwrap()
    );
    assert_eq!(
        rc.advertised("::1".parse().unwrap()),
        "::1".parse::<IpAddr>().unwrap()
    );
}

#[test]
fn relay_on_local_address_when_no_relay_ip() {
    let mut c = base_config();
    c.relay.relay_ips.clear();
    let mut h = H::new(c);
    let relay = h.allocate(udp("192.0.2.7:40000"), &alice());
    assert_eq!(relay.ip(), "198.51.100.1".parse::<IpAddr>().unwrap());
}

#[test]
fn message_integrity_sha256_accepted() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let nonce = h.nonce(from);
    let mut req = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce);
    req.sha256 = true;
    let r = decode(&h.client(from, &req.bytes()).unwrap());
    assert_eq!(r.class, Class::Success);
    let m = Message::parse(&r.raw).unwrap();
    let mi = m
        .attributes()
        .find(|a| a.typ == attr::MESSAGE_INTEGRITY_SHA256)
        .unwrap();
    assert!(m.check_integrity_sha256(mi.offset, mi.value, &alice().key));
}

#[test]
fn software_only_on_authenticated_responses() {
    let mut c = base_config();
    c.software = Some("lastcall-turn".into());
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    let r = decode(
        &h.client(from, &Req::new(method::ALLOCATE).transport_udp().bytes())
            .unwrap(),
    );
    assert!(r.get(attr::SOFTWARE).is_none());
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.get(attr::SOFTWARE), Some(&b"lastcall-turn"[..]));
}

#[test]
fn garbage_and_small_requests_never_amplify() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0xff; 100],
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        // Unknown method request, 20 bytes: a 400 would be 28 bytes, so it is dropped.
        Req::new(0x0fff).bytes(),
        // A Refresh without credentials: the 401 challenge applies only to TURN methods and
        // is exempt, but an indication never gets an answer.
        Req::indication(method::ALLOCATE).bytes(),
        // Response classes are ignored.
        {
            let mut b = Vec::new();
            Builder::new(&mut b, method::BINDING, Class::Success, [1; 12]);
            b
        },
    ];
    for c in &cases {
        if let Some(Sent::Client(_, resp)) = h.client(from, c) {
            assert!(resp.len() <= c.len(), "{c:?} -> {resp:?}");
        }
    }
    // Truncated attribute / length past the end / odd alignment / bad FINGERPRINT: dropped.
    let good = Req::new(method::ALLOCATE)
        .transport_udp()
        .attr(attr::SOFTWARE, b"abc".to_vec())
        .fp()
        .bytes();
    let mut past_end = good.clone();
    past_end[23] = 200;
    let mut odd = good.clone();
    odd[3] = odd[3].wrapping_sub(1);
    odd.pop();
    let mut bad_fp = good.clone();
    let l = bad_fp.len();
    bad_fp[l - 1] ^= 1;
    for c in [
        &good[..good.len() - 4],
        &past_end[..],
        &odd[..],
        &bad_fp[..],
    ] {
        assert_eq!(h.client(from, c), None);
    }
    assert!(h.server.counters().malformed >= 4);
    assert!(h.server.counters().suppressed_responses >= 1);
}

#[test]
fn peer_data_for_unknown_relay_is_dropped() {
    let mut h = H::new(base_config());
    assert_eq!(
        h.peer(
            "203.0.113.10:1".parse().unwrap(),
            "8.8.8.8:1".parse().unwrap(),
            b"x"
        ),
        None
    );
    assert_eq!(h.server.counters().peer_dropped, 1);
}

#[test]
fn clear_releases_everything() {
    let mut h = H::new(base_config());
    let a = h.allocate(udp("192.0.2.7:1"), &alice());
    let b = h.allocate(udp("192.0.2.7:2"), &alice());
    h.events();
    h.server.clear();
    h.collect_releases();
    assert_eq!(h.server.allocation_count(), 0);
    assert_eq!(h.relays.released, vec![a, b]);
    assert_eq!(h.events().len(), 2);
    assert_eq!(h.server.poll_timeout(), None);
}

#[test]
fn anonymous_server_without_credentials() {
    let mut c = ServerConfig::new(REALM);
    c.relay.relay_ips = vec!["203.0.113.10".parse().unwrap()];
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    // Padded so the unauthenticated success fits the no-amplification rule.
    let req = Req::new(method::ALLOCATE)
        .transport_udp()
        .attr(attr::SOFTWARE, vec![b' '; 40])
        .bytes();
    let r = decode(&h.client(from, &req).unwrap());
    assert_eq!(r.class, Class::Success);
    assert!(r.get(attr::MESSAGE_INTEGRITY).is_none());
}

#[test]
fn event_queue_is_bounded() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let nonce = h.nonce(from);
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&Creds::password("alice", "bad"), &nonce)
        .bytes();
    for _ in 0..MAX_QUEUED_EVENTS + 10 {
        h.client(from, &bytes);
    }
    assert_eq!(h.events().len(), MAX_QUEUED_EVENTS);
    assert_eq!(h.server.counters().events_dropped, 10);
    // Once polled, there is room again.
    h.client(from, &bytes);
    assert_eq!(h.events().len(), 1);
}

/// Session ends are never lost: 10,000 allocations ending in one timer pass during a drain,
/// behind a queue already full of other events, each come out as `AllocationDeleted` (the
/// I/O layer drops a session guard for each; the drain ends with the last).
#[test]
fn ten_thousand_allocations_ending_in_one_timer_pass_are_all_reported() {
    const N: u16 = 10_000;
    let mut config = base_config();
    config.lifetimes.allocation_max = Duration::from_secs(60);
    config.lifetimes.allocation_default = Duration::from_secs(60);
    config.quotas.total = 0;
    let mut h = H::new(config);
    let creds = Creds::rest(SECRET, h.unix_now() + 3600, "many");
    let nonce = h.nonce(udp("192.0.2.7:1"));
    for i in 0..N {
        let from = udp(&format!("192.0.2.7:{}", 10_000 + i));
        let bytes = Req::new(method::ALLOCATE)
            .transport_udp()
            .auth(&creds, &nonce)
            .bytes();
        let r = decode(&h.client(from, &bytes).expect("a response"));
        assert_eq!(r.class, Class::Success, "allocation {i}: {:?}", r.code);
    }
    let created = h
        .events()
        .iter()
        .filter(|e| matches!(e, Event::AllocationCreated { .. }))
        .count();
    assert_eq!(created, usize::from(N));
    h.server.set_drain(DrainMode::Refuse { alternates: vec![] });
    // Other events fill the queue first (failed authentications nobody polled).
    let bad = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&Creds::password("alice", "bad"), &nonce)
        .bytes();
    for _ in 0..MAX_QUEUED_EVENTS + 1 {
        h.client(udp("192.0.2.7:2"), &bad);
    }
    // One timer pass: every allocation expires in it.
    h.advance(61);
    assert_eq!(h.server.allocation_count(), 0);
    let events = h.events();
    let deleted = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::AllocationDeleted {
                    reason: DeleteReason::Expired,
                    ..
                }
            )
        })
        .count();
    assert_eq!(deleted, usize::from(N));
    assert_eq!(events.len(), usize::from(N) + MAX_QUEUED_EVENTS);
    assert_eq!(h.server.counters().events_dropped, 1);
    assert_eq!(h.relays.released.len(), usize::from(N));
}

/// EVEN-PORT and RESERVATION-TOKEN, the way `turnutils_uclient` uses them (RTP allocation
/// with R=1, then the RTCP allocation from another socket with the token).
#[test]
fn even_port_and_reservation_token() {
    let mut h = H::new(base_config());
    let rtp = udp("192.0.2.7:40000");
    let rtcp = udp("192.0.2.7:40001");
    let r = h.authed(
        rtp,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::EVEN_PORT, vec![0x80])
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![1, 0, 0, 0])
            .fp(),
    );
    assert_eq!(r.class, Class::Success, "{:?}", r.code);
    let relay = r.addr(attr::XOR_RELAYED_ADDRESS).unwrap();
    assert_eq!(relay.port() % 2, 0);
    let token = r.get(attr::RESERVATION_TOKEN).unwrap().to_vec();
    assert_eq!(token.len(), 8);
    // The reserved socket drops peer data until it is allocated.
    let reserved = SocketAddr::new(relay.ip(), relay.port() + 1);
    assert_eq!(h.peer(reserved, "8.8.8.8:1".parse().unwrap(), b"x"), None);
    // RESERVATION-TOKEN with REQUESTED-ADDRESS-FAMILY: 400.
    let r = h.authed(
        rtcp,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::RESERVATION_TOKEN, token.clone())
            .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![1, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(400));
    // The token gives port + 1.
    let r = h.authed(
        rtcp,
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::RESERVATION_TOKEN, token.clone()),
    );
    assert_eq!(r.class, Class::Success);
    assert_eq!(r.addr(attr::XOR_RELAYED_ADDRESS), Some(reserved));
    // A token works once; an unknown token: 508.
    let r = h.authed(
        udp("192.0.2.7:40002"),
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::RESERVATION_TOKEN, token),
    );
    assert_eq!(r.code, Some(508));
    // EVEN-PORT R=0: even port, no token.
    let r = h.authed(
        udp("192.0.2.7:40003"),
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::EVEN_PORT, vec![0x00]),
    );
    assert_eq!(r.addr(attr::XOR_RELAYED_ADDRESS).unwrap().port() % 2, 0);
    assert!(r.get(attr::RESERVATION_TOKEN).is_none());
    // An unused reservation is released after 30 s.
    let r = h.authed(
        udp("192.0.2.7:40004"),
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::EVEN_PORT, vec![0x80]),
    );
    let relay = r.addr(attr::XOR_RELAYED_ADDRESS).unwrap();
    let reserved = SocketAddr::new(relay.ip(), relay.port() + 1);
    assert!(h.server.poll_timeout().unwrap() <= h.now + Duration::from_secs(30));
    h.advance(29);
    assert!(!h.relays.released.contains(&reserved));
    h.advance(1);
    assert!(h.relays.released.contains(&reserved));
    // EVEN-PORT with a dual allocation: 400.
    let r = h.authed(
        udp("192.0.2.7:40005"),
        &alice(),
        Req::new(method::ALLOCATE)
            .transport_udp()
            .attr(attr::EVEN_PORT, vec![0])
            .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
    );
    assert_eq!(r.code, Some(400));
}

/// The exact first Allocate `turnutils_uclient` 4.6.1 sends (captured on loopback): 60 bytes
/// with LIFETIME, EVEN-PORT (R), REQUESTED-ADDRESS-FAMILY and FINGERPRINT.
#[test]
fn uclient_first_allocate_gets_a_bounded_challenge() {
    let hex = "000300282112a44215f4acef6ab70e6eff93b4f90019000411000000000d0004000003090018000180000000001700040100000080280004f5b91eca";
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let mut h = H::new(base_config());
    let r = decode(&h.client(udp("127.0.0.1:5555"), &bytes).unwrap());
    assert_eq!(r.code, Some(401));
    assert!(r.get(attr::FINGERPRINT).is_some());
    // The challenge is the documented exception to "never larger than the request": it
    // carries REALM and NONCE, which no client can do without. Exactly 20 + 8 (ERROR-CODE)
    // + 16 (REALM "example.org") + 20 (NONCE) + 8 (FINGERPRINT) = 72 bytes for this 60-byte
    // request: 1.2x, bounded by 64 + realm length whatever the request.
    assert_eq!(r.raw.len(), 72);
    assert!(r.raw.len() <= 64 + REALM.len() + 8);
}

/// An allocation past its lifetime is gone even if `handle_timeout` has not run yet.
#[test]
fn expired_allocation_is_gone_before_the_sweep() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let relay = h.allocate(from, &alice());
    h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    h.now += Duration::from_secs(600); // no handle_timeout
    assert_eq!(h.client(from, &[0x40, 0x01, 0, 1, b'a']), None);
    assert_eq!(h.peer(relay, "8.8.8.8:5000".parse().unwrap(), b"a"), None);
    let r = h.authed(from, &alice(), Req::new(method::REFRESH));
    assert_eq!(r.code, Some(437));
    assert_eq!(h.relays.released, vec![relay]);
    assert_eq!(h.server.allocation_count(), 0);
}

/// A TCP byte stream cut at every possible point: frames come out whole, in order, and the
/// server answers each (Binding, then ChannelData to the peer).
#[test]
fn tcp_stream_framing_end_to_end() {
    let mut h = H::new(base_config());
    let from = ClientAddr {
        transport: Transport::Tcp,
        client: "192.0.2.7:40000".parse().unwrap(),
        local: "198.51.100.1:3478".parse().unwrap(),
    };
    let relay = h.allocate(from, &alice());
    h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    let mut stream = Req::new(method::BINDING).bytes();
    stream.extend_from_slice(&[
        0x40, 0x01, 0x00, 0x05, b'h', b'e', b'l', b'l', b'o', 0, 0, 0,
    ]);
    stream.extend_from_slice(&Req::new(method::BINDING).fp().bytes());
    for cut in 1..stream.len() {
        let mut buf: Vec<u8> = Vec::new();
        let mut got = Vec::new();
        for chunk in [&stream[..cut], &stream[cut..]] {
            buf.extend_from_slice(chunk);
            while let Ok(Some(n)) = stream_frame_len(&buf) {
                let frame: Vec<u8> = buf.drain(..n).collect();
                got.push(h.client(from, &frame).expect("an answer per frame"));
            }
            assert!(stream_frame_len(&buf).is_ok());
        }
        assert!(buf.is_empty());
        assert_eq!(got.len(), 3, "cut at {cut}");
        assert_eq!(
            got[1],
            Sent::Peer(relay, "8.8.8.8:5000".parse().unwrap(), b"hello".to_vec())
        );
        assert_eq!(
            decode(&got[2]).addr(attr::XOR_MAPPED_ADDRESS),
            Some(from.client)
        );
    }
}

#[test]
fn binding_for_ipv6_client_is_within_the_bound() {
    let mut h = H::new(base_config());
    let from = ClientAddr {
        transport: Transport::Udp,
        client: "[2001:db8:1::7]:40000".parse().unwrap(),
        local: "[2001:db8::1]:3478".parse().unwrap(),
    };
    let r = decode(
        &h.client(from, &Req::new(method::BINDING).fp().bytes())
            .unwrap(),
    );
    assert_eq!(r.addr(attr::XOR_MAPPED_ADDRESS), Some(from.client));
    assert_eq!(r.raw.len(), 52);
}

/// A response to an authenticated request may be larger than the request (here a dual
/// allocation for an IPv6 client with a one-letter user): it is sent, not suppressed.
#[test]
fn authenticated_responses_are_not_size_limited() {
    let mut c = base_config();
    c.auth.add_coturn_user("u:p").unwrap();
    let mut h = H::new(c);
    let from = ClientAddr {
        transport: Transport::Udp,
        client: "[2001:db8:1::7]:40000".parse().unwrap(),
        local: "[2001:db8::1]:3478".parse().unwrap(),
    };
    let nonce = h.nonce(from);
    let req = Req::new(method::ALLOCATE)
        .transport_udp()
        .attr(attr::ADDITIONAL_ADDRESS_FAMILY, vec![2, 0, 0, 0])
        .auth(&Creds::password("u", "p"), &nonce)
        .bytes();
    let r = decode(&h.client(from, &req).expect("the success is sent"));
    assert_eq!(r.class, Class::Success);
    assert!(r.raw.len() > req.len(), "{} <= {}", r.raw.len(), req.len());
    assert_eq!(h.server.counters().suppressed_responses, 0);
}

// ---- coturn options: max-bps, bps-capacity, include-reason-string, stun-only, no-stun,
// secure-stun, check-origin-consistency, allocation-default-address-family ------------------

/// An allocation with a channel 0x4000 to 8.8.8.8:5000; returns its relay.
fn with_channel(h: &mut H, from: ClientAddr) -> SocketAddr {
    let relay = h.allocate(from, &alice());
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4000)
            .peer("8.8.8.8:5000"),
    );
    assert_eq!(r.class, Class::Success);
    relay
}

fn channel_data(payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0x40, 0x00];
    v.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

#[test]
fn max_bps_holds_each_direction_to_its_rate_over_a_paused_clock() {
    let mut c = base_config();
    c.bandwidth.max_bps = 10_000;
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    let relay = with_channel(&mut h, from);
    let peer: SocketAddr = "8.8.8.8:5000".parse().unwrap();
    let payload = [7u8; 100];
    // 10 s at twice the rate: 200 datagrams of 100 bytes a second, each way.
    let (mut up, mut down) = (0u64, 0u64);
    for _ in 0..2000 {
        h.now += Duration::from_millis(5);
        if h.client(from, &channel_data(&payload)).is_some() {
            up += 100;
        }
        if h.peer(relay, peer, &payload).is_some() {
            down += 100;
        }
    }
    // One second's burst, then the rate: 10 kB + 10 s x 10 kB/s.
    for (what, got) in [("up", up), ("down", down)] {
        assert!((105_000..=111_000).contains(&got), "{what}: {got}");
    }
    assert!(h.server.counters().bandwidth_dropped >= 1800);
}

#[test]
fn bps_capacity_is_reserved_per_allocation_and_freed_at_its_end() {
    let mut c = base_config();
    c.bandwidth.max_bps = 1000;
    c.bandwidth.capacity = 1500;
    let mut h = H::new(c);
    let a = udp("192.0.2.7:40000");
    let b = udp("192.0.2.8:40000");
    let d = udp("192.0.2.9:40000");
    h.allocate(a, &alice());
    assert_eq!(h.server.bandwidth_reserved(), 1000);
    // The second gets what is left.
    h.allocate(b, &alice());
    assert_eq!(h.server.bandwidth_reserved(), 1500);
    let r = h.authed(d, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(486));
    assert_eq!(h.server.counters().refused_bandwidth, 1);
    // Deleting one frees its share.
    let r = h.authed(a, &alice(), Req::new(method::REFRESH).lifetime(0));
    assert_eq!(r.class, Class::Success);
    h.advance(1);
    assert_eq!(h.server.bandwidth_reserved(), 500);
    // The next gets its full max-bps again (500 + 1000).
    h.allocate(d, &alice());
    assert_eq!(h.server.bandwidth_reserved(), 1500);
}

#[test]
fn include_reason_string_adds_the_phrase_but_never_grows_an_unauthenticated_answer() {
    let mut c = base_config();
    c.reason_phrases = true;
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    // Authenticated error: the phrase is there.
    h.allocate(from, &alice());
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(437));
    let ec = r.get(attr::ERROR_CODE).unwrap();
    assert_eq!(&ec[4..], b"Allocation Mismatch");
    // A small unauthenticated request: no phrase (the answer stays within its size).
    let small = Req::new(method::ALLOCATE).transport_udp().bytes();
    let s = h.client(udp("192.0.2.9:1"), &small).unwrap();
    let r = decode(&s);
    assert_eq!(r.code, Some(401));
    assert_eq!(r.get(attr::ERROR_CODE).unwrap().len(), 4);
    // Without the option: never a phrase.
    let mut h = H::new(base_config());
    assert!(!h.server.config().reason_phrases);
    h.allocate(from, &alice());
    let r = h.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.get(attr::ERROR_CODE).unwrap().len(), 4);
}

#[test]
fn stun_only_and_no_stun_leave_the_other_unanswered() {
    let binding = Req::new(method::BINDING).bytes();
    let allocate = Req::new(method::ALLOCATE).transport_udp().bytes();
    let from = udp("192.0.2.7:40000");
    for (service, binding_answered, allocate_answered) in [
        (Service::StunAndTurn, true, true),
        (Service::StunOnly, true, false),
        (Service::TurnOnly, false, true),
    ] {
        let mut c = base_config();
        c.service = service;
        let mut h = H::new(c);
        assert_eq!(
            h.client(from, &binding).is_some(),
            binding_answered,
            "{service:?}"
        );
        assert_eq!(
            h.client(from, &allocate).is_some(),
            allocate_answered,
            "{service:?}"
        );
    }
}

#[test]
fn secure_stun_asks_binding_for_credentials() {
    let mut c = base_config();
    c.secure_stun = true;
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    let r = decode(&h.client(from, &Req::new(method::BINDING).bytes()).unwrap());
    assert_eq!(r.code, Some(401));
    let r = h.authed(from, &alice(), Req::new(method::BINDING));
    assert_eq!(r.class, Class::Success);
    assert_eq!(r.addr(attr::XOR_MAPPED_ADDRESS), Some(from.client));
    assert!(r.get(attr::MESSAGE_INTEGRITY).is_some());
}

#[test]
fn check_origin_consistency_refuses_another_origin_with_441() {
    let mut c = base_config();
    c.check_origin = true;
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    let origin = |o: &str| (attr::ORIGIN, o.as_bytes().to_vec());
    let (t, v) = origin("https://Meet.Example.org");
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::ALLOCATE).transport_udp().attr(t, v),
    );
    assert_eq!(r.class, Class::Success);
    // The same origin, spelt with its default port: fine.
    let (t, v) = origin("https://meet.example.org:443");
    let r = h.authed(from, &alice(), Req::new(method::REFRESH).attr(t, v));
    assert_eq!(r.class, Class::Success);
    let (t, v) = origin("https://evil.example.com");
    let r = h.authed(from, &alice(), Req::new(method::REFRESH).attr(t, v));
    assert_eq!(r.code, Some(441));
    let r = h.authed(from, &alice(), Req::new(method::REFRESH));
    assert_eq!(r.code, Some(441), "no ORIGIN where the Allocate had one");
}

#[test]
fn allocation_default_address_family_chooses_the_relay_of_an_allocate_naming_none() {
    let v6 = udp("[2001:db8::7]:40000");
    let v4 = udp("192.0.2.7:40000");
    for (family, from, want_v4) in [
        (DefaultFamily::Ipv4, v6, true),
        (DefaultFamily::Ipv6, v4, false),
        (DefaultFamily::Keep, v6, false),
        (DefaultFamily::Keep, v4, true),
    ] {
        let mut c = base_config();
        c.default_family = family;
        let mut h = H::new(c);
        let relay = h.allocate(from, &alice());
        assert_eq!(relay.is_ipv4(), want_v4, "{family:?} from {from:?}");
    }
}

/// The idle reclaim of a drain, on a paused clock: while refusing, an allocation that heard
/// nothing from its client for `drain_idle_timeout` ends (reason Reclaimed, counted); a
/// quiet live call sending one datagram every 5 s never does, and ends 30 s after its last
/// one; nothing is reclaimed before the drain; activity reported from elsewhere
/// (`note_client_activity`) counts like a datagram.
#[test]
fn drain_reclaims_allocations_whose_client_went_quiet() {
    let mut config = base_config();
    config.drain_idle_timeout = Some(Duration::from_secs(30));
    let mut h = H::new(config);
    let vanished = udp("192.0.2.7:40000");
    let live = udp("192.0.2.8:40000");
    let fed = udp("192.0.2.9:40000");
    for c in [vanished, live, fed] {
        h.allocate(c, &alice());
    }
    let r = h.authed(
        live,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4000)
            .peer("8.8.8.8:9"),
    );
    assert_eq!(r.class, Class::Success);
    let mut frame = Vec::new();
    crate::frame::write_channel_data(&mut frame, 0x4000, b"consent", false);
    let reclaimed = |h: &mut H| -> Vec<ClientAddr> {
        h.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::AllocationDeleted {
                    client,
                    reason: DeleteReason::Reclaimed,
                    ..
                } => Some(client),
                _ => None,
            })
            .collect()
    };
    // Not draining: 100 quiet seconds (but for the live call) reclaim nothing.
    for s in 1..=100u64 {
        h.advance(1);
        if s % 5 == 0 {
            assert!(matches!(h.client(live, &frame), Some(Sent::Peer(..))));
        }
    }
    assert_eq!(h.server.allocation_count(), 3);
    assert!(reclaimed(&mut h).is_empty());
    h.server.set_drain(DrainMode::Refuse { alternates: vec![] });
    h.server.note_client_activity(&fed, h.now);
    h.advance(0);
    assert_eq!(reclaimed(&mut h), [vanished], "quiet for 100 s: at once");
    // Ten minutes of a quiet live call (one datagram every 5 s), and activity reported for
    // `fed` every 20 s: neither is reclaimed. (Refreshes keep both allocations, and the
    // channel, alive.)
    for s in 1..=600u64 {
        h.advance(1);
        if s % 150 == 0 {
            for c in [live, fed] {
                let r = h.authed(c, &alice(), Req::new(method::REFRESH).lifetime(600));
                assert_eq!(r.class, Class::Success);
            }
            let r = h.authed(
                live,
                &alice(),
                Req::new(method::CHANNEL_BIND)
                    .channel(0x4000)
                    .peer("8.8.8.8:9"),
            );
            assert_eq!(r.class, Class::Success);
        }
        if s % 5 == 0 {
            assert!(matches!(h.client(live, &frame), Some(Sent::Peer(..))));
        }
        if s % 20 == 0 {
            h.server.note_client_activity(&fed, h.now);
        }
        assert!(reclaimed(&mut h).is_empty(), "reclaimed at {s} s");
    }
    assert_eq!(h.server.allocation_count(), 2);
    // The live call stops (its last datagram at 600 s): reclaimed 30 s later, not sooner.
    let last = h.now;
    for _ in 0..29 {
        h.advance(1);
        h.server.note_client_activity(&fed, h.now);
        assert!(reclaimed(&mut h).is_empty());
    }
    h.advance(1);
    assert_eq!(reclaimed(&mut h), [live]);
    assert_eq!(h.now - last, Duration::from_secs(30));
    assert_eq!(
        h.server.last_client_activity(&fed),
        Some(h.now - Duration::from_secs(1))
    );
    assert_eq!(h.server.counters().allocations_reclaimed, 2);
    assert_eq!(h.server.counters().allocations_deleted, 2);
}

/// Without `drain_idle_timeout` (`--drain-idle-timeout=0`) a drain reclaims nothing: a
/// quiet allocation lasts its lifetime.
#[test]
fn drain_without_idle_timeout_keeps_quiet_allocations_until_they_expire() {
    let mut h = H::new(base_config());
    let c = udp("192.0.2.7:40000");
    h.allocate(c, &alice());
    h.server.set_drain(DrainMode::Refuse { alternates: vec![] });
    for _ in 0..599 {
        h.advance(1);
    }
    assert_eq!(h.server.allocation_count(), 1);
    h.advance(1);
    assert_eq!(h.server.allocation_count(), 0);
    assert!(matches!(
        &h.events()[..],
        [
            ..,
            Event::AllocationDeleted {
                reason: DeleteReason::Expired,
                ..
            }
        ]
    ));
    assert_eq!(h.server.counters().allocations_reclaimed, 0);
}

/// Fleet nonces: servers with the same nonce key accept each other's nonces (a client sent
/// on with 300 keeps the nonce of the 300, as libwebrtc does), servers with another key
/// answer 438 (unknown nonce); a key in `accepted` (the other REST secrets of a rotation)
/// is accepted but never issued.
#[test]
fn fleet_nonces_are_valid_on_every_server_sharing_the_key() {
    let key = nonce_key(b"the fleet's secret");
    assert_ne!(key, nonce_key(b"another secret"));
    let mut config = base_config();
    config.nonce.secret = key;
    let mut draining = H::new(config.clone());
    let mut alternate = H::new(config);
    let alt: SocketAddr = "198.51.100.2:3478".parse().unwrap();
    draining.server.set_drain(DrainMode::Refuse {
        alternates: vec![alt],
    });
    // The client had a nonce from the draining server; its authenticated Allocate gets 300
    // with a NONCE, which it takes to the alternate.
    let from = udp("192.0.2.7:40000");
    let r = draining.authed(from, &alice(), Req::new(method::ALLOCATE).transport_udp());
    assert_eq!(r.code, Some(300));
    let nonce = r.get(attr::NONCE).unwrap().to_vec();
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let r = decode(&alternate.client(from, &bytes).unwrap());
    assert_eq!(r.class, Class::Success, "{:?}", r.code);
    // A server with another key: 438, logged as an unknown nonce.
    let mut config = base_config();
    config.nonce.secret = nonce_key(b"another secret");
    let mut stranger = H::new(config.clone());
    let r = decode(&stranger.client(from, &bytes).unwrap());
    assert_eq!(r.code, Some(438));
    assert!(matches!(
        &stranger.events()[..],
        [Event::AuthFailed {
            reason: AuthFailure::UnknownNonce,
            ..
        }]
    ));
    // The same server, accepting the fleet key during a rotation: valid.
    config.nonce.accepted = vec![key];
    let mut rotating = H::new(config);
    let bytes = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&alice(), &nonce)
        .bytes();
    let r = decode(&rotating.client(udp("192.0.2.7:40001"), &bytes).unwrap());
    assert_eq!(r.class, Class::Success, "{:?}", r.code);
}
