//! A blocking TURN client for the control messages: Allocate (with the 401 round trip of
//! long-term authentication), Refresh, CreatePermission and ChannelBind.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lastcall_turn_proto::rest_password;
use lastcall_turn_proto::stun::{
    attr, decode_address, long_term_key, method, Builder, Class, Message,
};

/// First retransmission timeout; doubled on each retry (RFC 8489's RTO, shortened).
const RTO: Duration = Duration::from_millis(250);
/// Transmissions of one request before giving up.
const TRIES: u32 = 6;

/// Why a transaction failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    #[error("no response after {TRIES} transmissions")]
    Timeout,
    #[error("error response {0}")]
    Refused(u16),
    #[error("malformed response")]
    Malformed,
}

/// TURN REST API credentials (coturn's `use-auth-secret`).
#[derive(Clone, Debug)]
pub(crate) struct Credentials {
    pub username: String,
    pub password: String,
}

impl Credentials {
    /// Username `expiry:user` valid for `valid` from now, password
    /// base64(HMAC-SHA1(secret, username)).
    pub(crate) fn rest(secret: &[u8], user: &str, valid: Duration) -> Credentials {
        let expiry = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
            + valid.as_secs();
        let username = format!("{expiry}:{user}");
        let password = rest_password(secret, &username);
        Credentials { username, password }
    }
}

/// A parsed response.
struct Response {
    class: Class,
    code: u16,
    realm: Option<String>,
    nonce: Option<Vec<u8>>,
    relayed: Option<SocketAddr>,
}

/// One client 5-tuple talking to the server.
pub(crate) struct Session {
    sock: UdpSocket,
    creds: Credentials,
    realm: String,
    nonce: Vec<u8>,
    key: [u8; 16],
    buf: Vec<u8>,
    /// The relayed transport address once allocated.
    pub relayed: Option<SocketAddr>,
}

impl Session {
    /// A new UDP socket on `local_ip`, connected to `server`.
    pub(crate) fn new(server: SocketAddr, creds: Credentials) -> Result<Session, ClientError> {
        let local: SocketAddr = if server.is_ipv4() {
            ([127, 0, 0, 1], 0).into()
        } else {
            (std::net::Ipv6Addr::LOCALHOST, 0).into()
        };
        let sock = UdpSocket::bind(local)?;
        sock.connect(server)?;
        Ok(Session {
            sock,
            creds,
            realm: String::new(),
            nonce: Vec::new(),
            key: [0; 16],
            buf: Vec::with_capacity(512),
            relayed: None,
        })
    }

    /// The socket (for the data path once the control messages are done).
    pub(crate) fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// Sends one request built by `build` (then USERNAME/REALM/NONCE/MESSAGE-INTEGRITY when
    /// a nonce is known), retransmitting, and returns the matching response.
    fn transact(
        &mut self,
        m: u16,
        build: &dyn Fn(&mut Builder<'_>),
    ) -> Result<Response, ClientError> {
        let txid: [u8; 12] = rand::random();
        {
            let mut b = Builder::new(&mut self.buf, m, Class::Request, txid);
            build(&mut b);
            if !self.nonce.is_empty() {
                b.attr(attr::USERNAME, self.creds.username.as_bytes())
                    .attr(attr::REALM, self.realm.as_bytes())
                    .attr(attr::NONCE, &self.nonce)
                    .integrity_sha1(&self.key);
            }
        }
        let mut rto = RTO;
        let mut rx = [0u8; 1500];
        for _ in 0..TRIES {
            self.sock.send(&self.buf)?;
            let deadline = std::time::Instant::now() + rto;
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                self.sock.set_read_timeout(Some(left))?;
                let n = match self.sock.recv(&mut rx) {
                    Ok(n) => n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock
                                | io::ErrorKind::TimedOut
                                | io::ErrorKind::ConnectionRefused
                        ) =>
                    {
                        continue
                    }
                    Err(e) => return Err(e.into()),
                };
                let Some(resp) = rx.get(..n).and_then(|b| parse_response(b, &txid)) else {
                    continue; // not ours (a late retransmission's answer, ChannelData)
                };
                return Ok(resp);
            }
            rto *= 2;
        }
        Err(ClientError::Timeout)
    }

    /// An authenticated request: on 401/438 learn REALM and NONCE and send it again.
    fn request(
        &mut self,
        m: u16,
        build: &dyn Fn(&mut Builder<'_>),
    ) -> Result<Response, ClientError> {
        for _ in 0..3 {
            let r = self.transact(m, build)?;
            match (r.class, r.code) {
                (Class::Success, _) => return Ok(r),
                (Class::Error, 401 | 438) => {
                    let (Some(realm), Some(nonce)) = (r.realm, r.nonce) else {
                        return Err(ClientError::Refused(r.code));
                    };
                    if realm != self.realm {
                        self.key =
                            long_term_key(&self.creds.username, &realm, &self.creds.password);
                        self.realm = realm;
                    }
                    self.nonce = nonce;
                }
                (_, code) => return Err(ClientError::Refused(code)),
            }
        }
        Err(ClientError::Refused(401))
    }

    /// Allocate a UDP relay (lifetime in seconds).
    pub(crate) fn allocate(&mut self, lifetime: u32) -> Result<SocketAddr, ClientError> {
        let r = self.request(method::ALLOCATE, &|b| {
            b.u32(attr::REQUESTED_TRANSPORT, 17 << 24)
                .u32(attr::LIFETIME, lifetime);
        })?;
        let relayed = r.relayed.ok_or(ClientError::Malformed)?;
        self.relayed = Some(relayed);
        Ok(relayed)
    }

    /// Refresh (lifetime 0 deletes the allocation).
    pub(crate) fn refresh(&mut self, lifetime: u32) -> Result<(), ClientError> {
        self.request(method::REFRESH, &|b| {
            b.u32(attr::LIFETIME, lifetime);
        })
        .map(|_| ())
    }

    /// CreatePermission for `peer`'s IP address.
    pub(crate) fn create_permission(&mut self, peer: SocketAddr) -> Result<(), ClientError> {
        self.request(method::CREATE_PERMISSION, &|b| {
            b.xor_address(attr::XOR_PEER_ADDRESS, peer);
        })
        .map(|_| ())
    }

    /// ChannelBind `channel` to `peer`.
    pub(crate) fn channel_bind(
        &mut self,
        channel: u16,
        peer: SocketAddr,
    ) -> Result<(), ClientError> {
        self.request(method::CHANNEL_BIND, &|b| {
            b.u32(attr::CHANNEL_NUMBER, u32::from(channel) << 16)
                .xor_address(attr::XOR_PEER_ADDRESS, peer);
        })
        .map(|_| ())
    }
}

fn parse_response(buf: &[u8], txid: &[u8; 12]) -> Option<Response> {
    let msg = Message::parse(buf).ok()?;
    if msg.transaction_id() != *txid {
        return None;
    }
    let class = msg.class();
    if matches!(class, Class::Request | Class::Indication) {
        return None;
    }
    let mut r = Response {
        class,
        code: 0,
        realm: None,
        nonce: None,
        relayed: None,
    };
    for a in msg.attributes() {
        match a.typ {
            attr::ERROR_CODE => {
                let (c, n) = (a.value.get(2)?, a.value.get(3)?);
                r.code = u16::from(c & 7) * 100 + u16::from(*n);
            }
            attr::REALM => r.realm = Some(String::from_utf8_lossy(a.value).into_owned()),
            attr::NONCE => r.nonce = Some(a.value.to_vec()),
            attr::XOR_RELAYED_ADDRESS => r.relayed = decode_address(a.value, txid, true),
            _ => {}
        }
    }
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rest_credentials() {
        let c = Credentials::rest(b"secret", "bench", Duration::from_secs(3600));
        let (exp, user) = c.username.split_once(':').unwrap();
        assert_eq!(user, "bench");
        assert!(exp.parse::<u64>().unwrap() > 1_700_000_000);
        assert_eq!(c.password, rest_password(b"secret", &c.username));
    }

    #[test]
    fn parses_error_responses() {
        let txid = [7u8; 12];
        let mut buf = Vec::new();
        Builder::new(&mut buf, method::ALLOCATE, Class::Error, txid)
            .error_code(401)
            .attr(attr::REALM, b"example.org")
            .attr(attr::NONCE, b"abc");
        let r = parse_response(&buf, &txid).unwrap();
        assert_eq!((r.class, r.code), (Class::Error, 401));
        assert_eq!(r.realm.as_deref(), Some("example.org"));
        assert_eq!(r.nonce.as_deref(), Some(&b"abc"[..]));
        assert!(parse_response(&buf, &[8u8; 12]).is_none());
        assert!(parse_response(&buf[..10], &txid).is_none());
    }
}
