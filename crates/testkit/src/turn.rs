//! A small blocking TURN client over UDP for the termination tests (built on the core's own
//! STUN codec, `lastcall_turn_proto::stun`): Allocate with the 401 round trip of the TURN
//! REST API credentials, Refresh (lifetime 0 deletes), CreatePermission, ChannelBind,
//! Binding, and a fixed-rate ChannelData stream whose every datagram carries a sequence
//! number, so a test can say which datagrams were lost and when they were sent.
//!
//! One reader thread per client owns the receive side: ChannelData echoes are recorded,
//! STUN responses are handed to the transaction in progress. So control requests work
//! while the stream is running, as a real client refreshes during a call.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use lastcall_turn_proto::frame::{parse_channel_data, write_channel_data};
use lastcall_turn_proto::rest_password;
use lastcall_turn_proto::stun::{
    attr, decode_address, long_term_key, method, Builder, Class, Message,
};

/// The TURN REST API shared secret (`--static-auth-secret`) of the servers the tests start.
pub const SECRET: &str = "s3cret-for-tests";

/// The realm of the servers the tests start (`--realm`).
pub const REALM: &str = "example.org";

/// TURN REST API credentials (coturn's `use-auth-secret`): username `EXPIRY:USER`, password
/// base64(HMAC-SHA1(secret, username)).
#[derive(Clone, Debug)]
pub struct RestCredentials {
    /// `EXPIRY:USER`.
    pub username: String,
    /// The password derived from the secret.
    pub password: String,
}

impl RestCredentials {
    /// Credentials for `user` made with `secret`, valid for an hour.
    pub fn new(secret: &str, user: &str) -> RestCredentials {
        let expiry = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
            + 3600;
        let username = format!("{expiry}:{user}");
        let password = rest_password(secret.as_bytes(), &username);
        RestCredentials { username, password }
    }

    /// Credentials for `user` with the tests' [`SECRET`].
    pub fn for_user(user: &str) -> RestCredentials {
        RestCredentials::new(SECRET, user)
    }

    /// The long-term key (MD5 of `username:realm:password`) in `realm`.
    pub fn key(&self, realm: &str) -> [u8; 16] {
        long_term_key(&self.username, realm, &self.password)
    }
}

/// Wire's `zrest` credentials, made the way Wire's backend (brig) issues them to a client:
/// username `[sft-]d=EXPIRY.v=1.k=0.t=s.r=RANDOM` (RANDOM derived from the user's id, see
/// [`brig_random`]), password standard base64 of HMAC-SHA512(secret, username).
#[derive(Clone, Debug)]
pub struct ZrestCredentials {
    /// `[sft-]d=EXPIRY.v=1.k=0.t=s.r=RANDOM`.
    pub username: String,
    /// The password derived from the secret.
    pub password: String,
}

impl ZrestCredentials {
    /// Credentials for the user `user_id` (a UUID's 16 bytes) made with `secret`, expiring
    /// at UNIX second `expiry`; `sft` makes them a conference server's (they never expire).
    pub fn brig(secret: &str, user_id: &[u8; 16], expiry: u64, sft: bool) -> ZrestCredentials {
        let prefix = if sft { "sft-" } else { "" };
        let random = brig_random(user_id);
        let username = format!("{prefix}d={expiry}.v=1.k=0.t=s.r={random}");
        let password = lastcall_turn_proto::zrest_password(secret.as_bytes(), &username);
        ZrestCredentials { username, password }
    }

    /// Credentials valid for `ttl` from now.
    pub fn valid_for(secret: &str, user_id: &[u8; 16], ttl: Duration) -> ZrestCredentials {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        ZrestCredentials::brig(secret, user_id, (now + ttl).as_secs(), false)
    }
}

/// brig's `r`: the first 16 bytes of SHA-256 over the user id's 16 bytes, read as a
/// little-endian integer, written in base 26 with the digits a-z, most significant first.
pub fn brig_random(user_id: &[u8; 16]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(user_id);
    let mut le = [0u8; 16];
    le.copy_from_slice(&digest[..16]);
    let mut n = u128::from_le_bytes(le);
    let mut digits = Vec::new();
    while n > 0 {
        digits.push(b'a' + (n % 26) as u8);
        n /= 26;
    }
    digits.reverse();
    String::from_utf8(digits).unwrap_or_default()
}

/// First retransmission timeout (doubled per retry).
const RTO: Duration = Duration::from_millis(250);
/// Transmissions of one request before giving up (250 ms .. 4 s: about 8 s in all).
const TRIES: u32 = 6;
/// Marker at the start of every stream payload.
const MAGIC: [u8; 4] = *b"LCTT";
/// Stream payload: marker + sequence number + padding to a voice-frame size.
/// Bytes of each streamed datagram's payload.
pub const PAYLOAD: usize = 160;

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnError {
    /// An error response: the code and, for 300, the ALTERNATE-SERVER.
    Code {
        /// The ERROR-CODE.
        code: u16,
        /// The ALTERNATE-SERVER, if any.
        alternate: Option<SocketAddr>,
    },
    /// No answer after every retransmission.
    Timeout,
    /// A socket error.
    Io(String),
    /// A success response without the attribute it must carry.
    Malformed,
}

impl From<io::Error> for TurnError {
    fn from(e: io::Error) -> Self {
        TurnError::Io(e.to_string())
    }
}

/// A parsed response.
#[derive(Debug, Default)]
struct Response {
    success: bool,
    code: u16,
    realm: Option<String>,
    nonce: Option<Vec<u8>>,
    relayed: Option<SocketAddr>,
    mapped: Option<SocketAddr>,
    alternate: Option<SocketAddr>,
}

/// Datagrams of the stream: when each was sent and when its echo came back.
#[derive(Debug, Default)]
struct Log {
    sent: Vec<Instant>,
    received: HashMap<u64, Instant>,
    send_errors: Vec<(u64, String)>,
}

/// What a stream saw, split at one instant (e.g. the SIGTERM).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Split {
    /// Datagrams sent before the instant.
    pub sent_before: u64,
    /// Of those, the ones whose echo never came.
    pub lost_before: u64,
    /// Datagrams sent at or after the instant.
    pub sent_after: u64,
    /// Of those, the ones whose echo never came.
    pub lost_after: u64,
}

impl Split {
    /// Datagrams sent in all.
    pub fn sent(&self) -> u64 {
        self.sent_before + self.sent_after
    }
    /// Datagrams lost in all.
    pub fn lost(&self) -> u64 {
        self.lost_before + self.lost_after
    }
}

struct Shared {
    log: Mutex<Log>,
    stop_reader: AtomicBool,
    stop_stream: AtomicBool,
}

/// One client 5-tuple (a UDP socket connected to the server) with at most one allocation.
pub struct TurnClient {
    sock: UdpSocket,
    username: String,
    password: String,
    realm: String,
    nonce: Vec<u8>,
    key: [u8; 16],
    stun: Receiver<Vec<u8>>,
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
    stream: Option<JoinHandle<()>>,
    /// The relayed address once allocated.
    pub relayed: Option<SocketAddr>,
    /// The channel bound by [`TurnClient::call`].
    pub channel: Option<u16>,
}

/// A transaction id nobody else uses: a process-wide counter, the pid and the clock.
fn txid() -> [u8; 12] {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let mut id = [0u8; 12];
    id[..4].copy_from_slice(&std::process::id().to_be_bytes());
    id[4..8].copy_from_slice(&nanos.to_be_bytes());
    id[8..].copy_from_slice(&u32::try_from(n & 0xffff_ffff).unwrap_or(0).to_be_bytes());
    id
}

impl TurnClient {
    /// A client of `server` with TURN REST API credentials for `user` (valid one hour).
    pub fn new(server: SocketAddr, secret: &str, user: &str) -> TurnClient {
        let RestCredentials { username, password } = RestCredentials::new(secret, user);
        TurnClient::long_term(server, &username, &password)
    }

    /// A client of `server` with the long-term credentials `username` and `password` (a
    /// `user=` line, a user database's user).
    pub fn long_term(server: SocketAddr, username: &str, password: &str) -> TurnClient {
        let (username, password) = (username.to_string(), password.to_string());
        let sock = UdpSocket::bind(("127.0.0.1", 0)).expect("bind client socket");
        sock.connect(server).expect("connect client socket");
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .expect("read timeout");
        let shared = Arc::new(Shared {
            log: Mutex::default(),
            stop_reader: AtomicBool::new(false),
            stop_stream: AtomicBool::new(false),
        });
        let (tx, stun) = mpsc::channel();
        let reader = {
            let sock = sock.try_clone().expect("clone socket");
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while !shared.stop_reader.load(Ordering::Relaxed) {
                    let Ok(n) = sock.recv(&mut buf) else { continue };
                    let now = Instant::now();
                    let Some(dgram) = buf.get(..n) else { continue };
                    if let Some((_, payload)) = parse_channel_data(dgram) {
                        if let Some(seq) = read_seq(payload) {
                            shared.log.lock().received.entry(seq).or_insert(now);
                        }
                    } else if tx.send(dgram.to_vec()).is_err() {
                        return;
                    }
                }
            })
        };
        TurnClient {
            sock,
            username,
            password,
            realm: String::new(),
            nonce: Vec::new(),
            key: [0; 16],
            stun,
            shared,
            reader: Some(reader),
            stream: None,
            relayed: None,
            channel: None,
        }
    }

    /// Sends one request (authenticated once a nonce is known), retransmitting, and returns
    /// its response.
    fn transact(
        &mut self,
        m: u16,
        build: &dyn Fn(&mut Builder<'_>),
    ) -> Result<Response, TurnError> {
        let id = txid();
        let mut req = Vec::with_capacity(256);
        {
            let mut b = Builder::new(&mut req, m, Class::Request, id);
            build(&mut b);
            if !self.nonce.is_empty() {
                b.attr(attr::USERNAME, self.username.as_bytes())
                    .attr(attr::REALM, self.realm.as_bytes())
                    .attr(attr::NONCE, &self.nonce)
                    .integrity_sha1(&self.key);
            }
        }
        let mut rto = RTO;
        for _ in 0..TRIES {
            self.sock.send(&req)?;
            let until = Instant::now() + rto;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match self.stun.recv_timeout(left) {
                    Ok(msg) => {
                        if let Some(r) = parse_response(&msg, &id) {
                            return Ok(r);
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return Err(TurnError::Timeout),
                }
            }
            rto *= 2;
        }
        Err(TurnError::Timeout)
    }

    /// An authenticated request: on 401 or 438, learn REALM and NONCE and send it again.
    fn request(&mut self, m: u16, build: &dyn Fn(&mut Builder<'_>)) -> Result<Response, TurnError> {
        for _ in 0..3 {
            let r = self.transact(m, build)?;
            if r.success {
                return Ok(r);
            }
            match (r.code, r.realm, r.nonce) {
                (401 | 438, Some(realm), Some(nonce)) => {
                    if realm != self.realm {
                        self.key = long_term_key(&self.username, &realm, &self.password);
                        self.realm = realm;
                    }
                    self.nonce = nonce;
                }
                (code, _, _) => {
                    return Err(TurnError::Code {
                        code,
                        alternate: r.alternate,
                    })
                }
            }
        }
        Err(TurnError::Code {
            code: 401,
            alternate: None,
        })
    }

    /// STUN Binding: the reflexive address.
    pub fn binding(&mut self) -> Result<SocketAddr, TurnError> {
        let r = self.transact(method::BINDING, &|_| {})?;
        if !r.success {
            return Err(TurnError::Code {
                code: r.code,
                alternate: None,
            });
        }
        r.mapped.ok_or(TurnError::Malformed)
    }

    /// Allocate a UDP relay for `lifetime` seconds.
    pub fn allocate(&mut self, lifetime: u32) -> Result<SocketAddr, TurnError> {
        let r = self.request(method::ALLOCATE, &|b| {
            b.u32(attr::REQUESTED_TRANSPORT, 17 << 24)
                .u32(attr::LIFETIME, lifetime);
        })?;
        let relayed = r.relayed.ok_or(TurnError::Malformed)?;
        self.relayed = Some(relayed);
        Ok(relayed)
    }

    /// Allocate a UDP relay with a RESERVATION-TOKEN (RFC 8656 §7.2: the socket an earlier
    /// EVEN-PORT R=1 reserved).
    pub fn allocate_with_token(
        &mut self,
        lifetime: u32,
        token: [u8; 8],
    ) -> Result<SocketAddr, TurnError> {
        let r = self.request(method::ALLOCATE, &|b| {
            b.u32(attr::REQUESTED_TRANSPORT, 17 << 24)
                .u32(attr::LIFETIME, lifetime)
                .attr(attr::RESERVATION_TOKEN, &token);
        })?;
        let relayed = r.relayed.ok_or(TurnError::Malformed)?;
        self.relayed = Some(relayed);
        Ok(relayed)
    }

    /// Refresh; lifetime 0 deletes the allocation.
    pub fn refresh(&mut self, lifetime: u32) -> Result<(), TurnError> {
        self.request(method::REFRESH, &|b| {
            b.u32(attr::LIFETIME, lifetime);
        })
        .map(drop)
    }

    /// CreatePermission for `peer`'s address.
    pub fn create_permission(&mut self, peer: SocketAddr) -> Result<(), TurnError> {
        self.request(method::CREATE_PERMISSION, &|b| {
            b.xor_address(attr::XOR_PEER_ADDRESS, peer);
        })
        .map(drop)
    }

    /// ChannelBind `channel` to `peer` (again: a refresh of the binding).
    pub fn channel_bind(&mut self, channel: u16, peer: SocketAddr) -> Result<(), TurnError> {
        self.request(method::CHANNEL_BIND, &|b| {
            b.u32(attr::CHANNEL_NUMBER, u32::from(channel) << 16)
                .xor_address(attr::XOR_PEER_ADDRESS, peer);
        })
        .map(drop)
    }

    /// Allocate, permit `peer` and bind `channel` to it: ready for [`TurnClient::stream`].
    pub fn call(&mut self, peer: SocketAddr, channel: u16) -> Result<SocketAddr, TurnError> {
        let relayed = self.allocate(600)?;
        self.create_permission(peer)?;
        self.channel_bind(channel, peer)?;
        self.channel = Some(channel);
        Ok(relayed)
    }

    /// Starts sending ChannelData on the bound channel, one datagram every `interval`
    /// (on a fixed schedule: a late tick does not shift the following ones).
    pub fn stream(&mut self, interval: Duration) {
        let channel = self.channel.expect("stream needs a bound channel");
        let sock = self.sock.try_clone().expect("clone socket");
        let shared = Arc::clone(&self.shared);
        shared.stop_stream.store(false, Ordering::Relaxed);
        self.stream = Some(thread::spawn(move || {
            let start = Instant::now();
            let mut payload = [0u8; PAYLOAD];
            let mut frame = Vec::with_capacity(PAYLOAD + 4);
            let mut seq: u64 = 0;
            while !shared.stop_stream.load(Ordering::Relaxed) {
                let due = start + interval.saturating_mul(u32::try_from(seq).unwrap_or(u32::MAX));
                let now = Instant::now();
                if due > now {
                    // In short slices, so that a stop is seen at once.
                    thread::sleep((due - now).min(Duration::from_millis(5)));
                    continue;
                }
                payload[..4].copy_from_slice(&MAGIC);
                payload[4..12].copy_from_slice(&seq.to_be_bytes());
                write_channel_data(&mut frame, channel, &payload, false);
                let at = Instant::now();
                // A send error (e.g. ECONNREFUSED once the server is gone) is a loss.
                let result = sock.send(&frame);
                let mut log = shared.log.lock();
                log.sent.push(at);
                if let Err(e) = result {
                    log.send_errors.push((seq, e.to_string()));
                }
                seq += 1;
            }
        }));
    }

    /// Stops the stream and waits until every datagram sent came back, or nothing came back
    /// for `quiet` (bounded by 10 s in all).
    pub fn stop_stream(&mut self, quiet: Duration) {
        self.shared.stop_stream.store(true, Ordering::Relaxed);
        if let Some(t) = self.stream.take() {
            let _ = t.join();
        }
        let started = Instant::now();
        let mut last = self.received();
        let mut last_change = Instant::now();
        while last < self.sent() && started.elapsed() < Duration::from_secs(10) {
            thread::sleep(Duration::from_millis(10));
            let r = self.received();
            if r != last {
                last = r;
                last_change = Instant::now();
            } else if last_change.elapsed() > quiet {
                break;
            }
        }
    }

    /// Datagrams sent so far.
    pub fn sent(&self) -> u64 {
        self.shared.log.lock().sent.len() as u64
    }

    /// Echoes received so far.
    pub fn received(&self) -> u64 {
        self.shared.log.lock().received.len() as u64
    }

    /// Waits (bounded) until at least `n` echoes came back.
    pub fn wait_received(&self, n: u64, timeout: Duration) {
        let until = Instant::now() + timeout;
        while self.received() < n {
            assert!(
                Instant::now() < until,
                "only {} of {n} echoes within {timeout:?}",
                self.received()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sent and lost datagrams, split at `at` by their send time.
    pub fn split(&self, at: Instant) -> Split {
        let log = self.shared.log.lock();
        let mut s = Split::default();
        for (seq, sent) in log.sent.iter().enumerate() {
            let lost = !log.received.contains_key(&(seq as u64));
            if *sent < at {
                s.sent_before += 1;
                s.lost_before += u64::from(lost);
            } else {
                s.sent_after += 1;
                s.lost_after += u64::from(lost);
            }
        }
        s
    }

    /// The lost datagrams: sequence number, send time relative to `origin` (ms, negative
    /// before it), and the send error if the send itself failed.
    pub fn lost_detail(&self, origin: Instant) -> Vec<(u64, f64, Option<String>)> {
        let log = self.shared.log.lock();
        log.sent
            .iter()
            .enumerate()
            .filter(|(seq, _)| !log.received.contains_key(&(*seq as u64)))
            .map(|(seq, at)| {
                let ms = if *at >= origin {
                    (*at - origin).as_secs_f64() * 1000.0
                } else {
                    -(origin - *at).as_secs_f64() * 1000.0
                };
                let err = log
                    .send_errors
                    .iter()
                    .find(|(s, _)| *s == seq as u64)
                    .map(|(_, e)| e.clone());
                (seq as u64, ms, err)
            })
            .collect()
    }

    /// Datagrams sent, and echoes received, with their instant in `[from, to)`.
    pub fn counted_between(&self, from: Instant, to: Instant) -> (u64, u64) {
        let log = self.shared.log.lock();
        let within = |t: &&Instant| **t >= from && **t < to;
        let sent = log.sent.iter().filter(within).count() as u64;
        let received = log.received.values().filter(within).count() as u64;
        (sent, received)
    }

    /// When the last echo arrived.
    pub fn last_echo(&self) -> Option<Instant> {
        self.shared.log.lock().received.values().max().copied()
    }

    /// Send time of the first datagram that was lost, if any.
    pub fn first_lost_sent_at(&self) -> Option<Instant> {
        let log = self.shared.log.lock();
        log.sent
            .iter()
            .enumerate()
            .find(|(seq, _)| !log.received.contains_key(&(*seq as u64)))
            .map(|(_, at)| *at)
    }
}

impl Drop for TurnClient {
    fn drop(&mut self) {
        self.shared.stop_stream.store(true, Ordering::Relaxed);
        self.shared.stop_reader.store(true, Ordering::Relaxed);
        if let Some(t) = self.stream.take() {
            let _ = t.join();
        }
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

fn read_seq(payload: &[u8]) -> Option<u64> {
    if payload.get(..4)? != MAGIC {
        return None;
    }
    Some(u64::from_be_bytes(payload.get(4..12)?.try_into().ok()?))
}

fn parse_response(buf: &[u8], id: &[u8; 12]) -> Option<Response> {
    let msg = Message::parse(buf).ok()?;
    if msg.transaction_id() != *id {
        return None;
    }
    let success = match msg.class() {
        Class::Success => true,
        Class::Error => false,
        _ => return None,
    };
    let mut r = Response {
        success,
        ..Response::default()
    };
    for a in msg.attributes() {
        match a.typ {
            attr::ERROR_CODE => {
                let (class, number) = (a.value.get(2)?, a.value.get(3)?);
                r.code = u16::from(class & 7) * 100 + u16::from(*number);
            }
            attr::REALM => r.realm = Some(String::from_utf8_lossy(a.value).into_owned()),
            attr::NONCE => r.nonce = Some(a.value.to_vec()),
            attr::XOR_RELAYED_ADDRESS => r.relayed = decode_address(a.value, id, true),
            attr::XOR_MAPPED_ADDRESS => r.mapped = decode_address(a.value, id, true),
            attr::ALTERNATE_SERVER => r.alternate = decode_address(a.value, id, false),
            _ => {}
        }
    }
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector: UUID 6e0c8f3c-7a1b-4c2d-9e8f-0123456789ab.
    #[test]
    fn brigs_random_part_of_a_user_id() {
        let id = [
            0x6e, 0x0c, 0x8f, 0x3c, 0x7a, 0x1b, 0x4c, 0x2d, 0x9e, 0x8f, 0x01, 0x23, 0x45, 0x67,
            0x89, 0xab,
        ];
        assert_eq!(brig_random(&id), "bwnyqvzygtvuprnypsbylimxakrk");
        let c = ZrestCredentials::brig("Wire-TURN-secret-example", &id, 1_700_000_000, true);
        assert_eq!(
            c.username,
            "sft-d=1700000000.v=1.k=0.t=s.r=bwnyqvzygtvuprnypsbylimxakrk"
        );
        assert_eq!(
            lastcall_turn_proto::ZrestName::parse(&c.username).map(|n| n.sft),
            Some(true)
        );
    }
}
