//! Server tests with a synthetic clock and an in-memory binder of relay sockets: the harness
//! here, the tests in one file per method (and one each for authentication, amplification and
//! the drain, which cut across methods).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::stun::{attr, decode_address, long_term_key, method, Builder, Class, Message};
use crate::*;

mod allocate;
mod amplification;
mod auth;
mod binding;
mod capacity;
mod channel_bind;
mod create_permission;
mod data;
mod drain;
mod refresh;
mod relay_binding;
mod sessions;
mod userdb;
mod zrest;

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
