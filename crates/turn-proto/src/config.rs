//! Server configuration (typed; the I/O crate maps coturn's option names onto it).

use std::collections::HashMap;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use crate::policy::PeerPolicy;

/// Everything the protocol core needs to know. Build it with [`ServerConfig::new`] and
/// adjust the public fields.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// coturn `realm`: sent in REALM, part of every long-term key.
    pub realm: String,
    /// Credentials. With no static user and no REST secret, and `allow_anonymous`, the server
    /// runs without authentication (coturn's `no-auth`): every request is accepted
    /// anonymously. Without `allow_anonymous` a server with no credentials refuses everyone.
    pub auth: AuthConfig,
    /// Allocation, permission and channel lifetimes.
    pub lifetimes: Lifetimes,
    /// coturn `user-quota` / `total-quota`.
    pub quotas: Quotas,
    /// Stateless nonces.
    pub nonce: NonceConfig,
    /// Which peers a client may reach (coturn `allowed-peer-ip`, `denied-peer-ip`,
    /// `allow-loopback-peers`).
    pub peer_policy: PeerPolicy,
    /// Relay addresses (coturn `relay-ip`, `external-ip`).
    pub relay: RelayConfig,
    /// Accept REQUESTED-TRANSPORT UDP (coturn `no-udp-relay` sets this to `false`; then
    /// every Allocate gets 442). TCP relays (RFC 6062) are not implemented: REQUESTED-TRANSPORT
    /// TCP always gets 442, so coturn's `no-tcp-relay` changes nothing.
    pub udp_relay: bool,
    /// SOFTWARE attribute value. Off by default; when set it is added only to responses to
    /// authenticated requests (never to unauthenticated answers: no amplification).
    pub software: Option<String>,
    /// Most permissions one allocation may hold (further new peers get 508). Default 1024.
    pub max_permissions_per_allocation: usize,
    /// Most channels one allocation may hold (further new channels get 508). Default 1024.
    pub max_channels_per_allocation: usize,
    /// coturn `unauthorized-ratelimit-rps`: the most responses larger than their request (the
    /// 401/438 challenge, the Binding success) sent to one source IP per second over UDP, the
    /// one transport whose source can be spoofed; 0 = no limit. Default
    /// [`UNAUTHORIZED_RPS`] (on, unlike coturn).
    pub unauthorized_rps: u32,
    /// What is answered: STUN and TURN (default), STUN only (coturn `stun-only`: TURN
    /// requests get no answer) or TURN only (`no-stun`: Binding requests get no answer).
    pub service: Service,
    /// coturn `secure-stun`: Binding requests need long-term credentials too.
    pub secure_stun: bool,
    /// coturn `check-origin-consistency`: every request on an allocation must carry the
    /// ORIGIN of the Allocate that made it (or none if that had none); 441 otherwise.
    pub check_origin: bool,
    /// coturn `include-reason-string`: error responses carry their RFC reason phrase, except
    /// an unauthenticated one that the phrase would make larger than its request.
    pub reason_phrases: bool,
    /// coturn `fingerprint`: FINGERPRINT on every response and Data indication (otherwise on
    /// responses to requests that carry one).
    pub fingerprint: bool,
    /// coturn `allocation-default-address-family`: the relay family of an Allocate that
    /// names none.
    pub default_family: DefaultFamily,
    /// coturn `max-bps` / `bps-capacity`.
    pub bandwidth: Bandwidth,
    /// `--drain-idle-timeout`: while refusing, an allocation that heard nothing from its
    /// client (no data, no request) for this long is ended as if expired
    /// ([`DeleteReason::Reclaimed`](crate::DeleteReason::Reclaimed)); `None`: never.
    pub drain_idle_timeout: Option<Duration>,
}

/// Which requests are answered (coturn `stun-only`, `no-stun`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Service {
    /// STUN Binding and TURN.
    #[default]
    StunAndTurn,
    /// Binding only; every other request is dropped without an answer.
    StunOnly,
    /// TURN only; Binding requests are dropped without an answer.
    TurnOnly,
}

/// The relay family of an Allocate without REQUESTED-ADDRESS-FAMILY.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DefaultFamily {
    /// IPv4 (RFC 8656).
    #[default]
    Ipv4,
    /// IPv6.
    Ipv6,
    /// The family of the client's own address (coturn `keep-address-family`).
    Keep,
}

/// Bandwidth limits, in bytes per second (0 = none).
///
/// Each allocation relays at most `max_bps` of payload in each direction (client to peer:
/// the data of ChannelData and Send; peer to client: the datagrams received from peers);
/// what is over is dropped (a token bucket holding one second's worth,
/// so short bursts pass). With `capacity`, every new allocation reserves `max_bps` of it (or
/// what is left) until it ends, and an Allocate that finds none left gets 486 (coturn's
/// `bps-capacity`, which needs `max-bps`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bandwidth {
    /// coturn `max-bps`: per allocation and direction.
    pub max_bps: u64,
    /// coturn `bps-capacity`: what all allocations together may reserve.
    pub capacity: u64,
}

/// Default [`ServerConfig::unauthorized_rps`]: generous for clients behind one NAT (each needs
/// one challenge per allocation), while a spoofed flood reflects at most this many
/// challenges a second to its victim.
pub const UNAUTHORIZED_RPS: u32 = 100;

impl ServerConfig {
    /// Defaults: no credentials (anonymous), coturn's lifetimes (600 s default allocation,
    /// 3600 s maximum, 300 s permissions, 600 s channels), no quotas, a random nonce secret
    /// with a 600 s nonce lifetime, the secure peer policy, no relay addresses (the listening
    /// address the request arrived on is used), UDP relays on, no SOFTWARE.
    pub fn new(realm: impl Into<String>) -> ServerConfig {
        ServerConfig {
            realm: realm.into(),
            auth: AuthConfig::default(),
            lifetimes: Lifetimes::default(),
            quotas: Quotas::default(),
            nonce: NonceConfig::default(),
            peer_policy: PeerPolicy::default(),
            relay: RelayConfig::default(),
            udp_relay: true,
            software: None,
            max_permissions_per_allocation: 1024,
            max_channels_per_allocation: 1024,
            unauthorized_rps: UNAUTHORIZED_RPS,
            service: Service::default(),
            secure_stun: false,
            check_origin: false,
            reason_phrases: false,
            fingerprint: false,
            default_family: DefaultFamily::default(),
            bandwidth: Bandwidth::default(),
            drain_idle_timeout: None,
        }
    }
}

/// Long-term credentials: static users and/or TURN REST API secrets.
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// Static users (coturn `user=name:password` or `user=name:0xKEY`).
    pub users: HashMap<String, UserKey>,
    /// TURN REST API shared secrets (coturn `use-auth-secret` + `static-auth-secret`, which
    /// may be given several times for rotation): every secret is accepted. The username is
    /// `expiry` or `expiry:user` (expiry in UNIX seconds); the password is
    /// base64(HMAC-SHA1(secret, username)).
    pub rest_secrets: Vec<Vec<u8>>,
    /// Separator between the expiry and the user in REST usernames (coturn
    /// `rest-api-separator`, default `:`).
    pub rest_separator: char,
    /// How [`rest_secrets`](Self::rest_secrets) (and a user database's secrets) make
    /// credentials: coturn's TURN REST API (the default) or Wire's `zrest`.
    pub rest_scheme: RestScheme,
    /// Whether a server without any credential runs anonymously (`true`, the default of
    /// [`ServerConfig::new`]) or refuses everyone (`false`: credentials that come and go, e.g.
    /// from a user database, never make an open relay).
    pub allow_anonymous: bool,
    /// Credentials the I/O layer looks up in a user database, after the static ones (see
    /// [`credentials`](crate::credentials)).
    pub database: Option<UserDatabase>,
}

/// How shared secrets make credentials.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RestScheme {
    /// coturn's TURN REST API (`use-auth-secret`): username `expiry` or `expiry:user`,
    /// password base64(HMAC-SHA1(secret, username)); the allocation's lifetime is capped at
    /// the expiry. Static users are accepted too.
    #[default]
    Timestamp,
    /// Wire's `zrest` (wireapp/coturn, credentials issued by Wire's backend, brig): username
    /// `[sft-]d=EXPIRY.v=1.k=INDEX.t=s.r=RANDOM`, password standard base64 (padded) of
    /// HMAC-SHA512(secret, username). A username without `sft-` is refused once now ≥
    /// EXPIRY; an `sft-` one never expires. As in the fork, nothing else is accepted (no
    /// static user, no TURN REST API username), and an allocation made before EXPIRY keeps
    /// its key to its end (its lifetime is not capped).
    Zrest,
}

/// A user database the I/O layer reads for the core (coturn's `userdb`, `psql-userdb`,
/// `redis-userdb`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserDatabase {
    /// What is looked up there.
    pub keys: DatabaseKeys,
    /// What is kept of its answers, and how long lookups may take.
    pub cache: crate::credentials::CacheLimits,
}

/// What a user database holds for the core, as coturn reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatabaseKeys {
    /// Long-term users (`lt-cred-mech`, coturn's `turnusers_lt`): a username that is not a
    /// static `user=` is looked up.
    Users,
    /// TURN REST API secrets (`use-auth-secret`, coturn's `turn_secret`): a REST username
    /// whose password no `static-auth-secret` makes is checked against the realm's secrets
    /// in the database. As in coturn, the database's users are not read then.
    RestSecrets,
}

impl AuthConfig {
    /// `true` if requests must authenticate: a credential or a user database is configured,
    /// or anonymous access is not allowed.
    pub fn required(&self) -> bool {
        !self.allow_anonymous
            || !self.users.is_empty()
            || !self.rest_secrets.is_empty()
            || self.database.is_some()
    }

    /// Add a static user from coturn's `user=` value (`name:password` or `name:0xHEXKEY`,
    /// where the key is the 16-byte MD5(name:realm:password) in hex).
    pub fn add_coturn_user(&mut self, value: &str) -> Result<(), ConfigError> {
        let (name, key) = parse_coturn_user(value)?;
        self.users.insert(name, key);
        Ok(())
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            users: HashMap::new(),
            rest_secrets: Vec::new(),
            rest_separator: ':',
            rest_scheme: RestScheme::default(),
            allow_anonymous: true,
            database: None,
        }
    }
}

/// How a static user's long-term key is given.
#[derive(Clone, PartialEq, Eq)]
pub enum UserKey {
    /// Plain password: the key is MD5(name:realm:password), computed per realm.
    Password(String),
    /// The precomputed 16-byte key (coturn `name:0xHEX`, e.g. from `turnadmin -k`).
    Key([u8; 16]),
}

impl std::fmt::Debug for UserKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UserKey::Password(_) => f.write_str("Password(..)"),
            UserKey::Key(_) => f.write_str("Key(..)"),
        }
    }
}

/// Parse coturn's `user=` value: `name:password` or `name:0xHEXKEY` (32 hex digits).
pub fn parse_coturn_user(value: &str) -> Result<(String, UserKey), ConfigError> {
    let (name, secret) = value
        .split_once(':')
        .ok_or_else(|| ConfigError::User(value.to_string()))?;
    if name.is_empty() {
        return Err(ConfigError::User(value.to_string()));
    }
    if let Some(hex) = secret
        .strip_prefix("0x")
        .or_else(|| secret.strip_prefix("0X"))
    {
        let mut key = [0u8; 16];
        if hex.len() != 32 || !hex.is_ascii() {
            return Err(ConfigError::UserKey(name.to_string()));
        }
        for (i, k) in key.iter_mut().enumerate() {
            let pair = hex.get(2 * i..2 * i + 2).unwrap_or("");
            *k =
                u8::from_str_radix(pair, 16).map_err(|_| ConfigError::UserKey(name.to_string()))?;
        }
        return Ok((name.to_string(), UserKey::Key(key)));
    }
    Ok((name.to_string(), UserKey::Password(secret.to_string())))
}

/// Lifetimes (RFC 8656 defaults, coturn's option names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetimes {
    /// Allocation lifetime when the client asks for none or for less (600 s).
    pub allocation_default: Duration,
    /// coturn `max-allocate-lifetime` (3600 s): requested lifetimes are capped here.
    pub allocation_max: Duration,
    /// Permission lifetime (300 s, RFC 8656).
    pub permission: Duration,
    /// Channel binding lifetime (600 s, RFC 8656).
    pub channel: Duration,
}

impl Default for Lifetimes {
    fn default() -> Self {
        Lifetimes {
            allocation_default: Duration::from_secs(600),
            allocation_max: Duration::from_secs(3600),
            permission: Duration::from_secs(300),
            channel: Duration::from_secs(600),
        }
    }
}

/// Allocation quotas; 0 = unlimited. Exceeding one answers 486.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quotas {
    /// coturn `user-quota`: concurrent allocations per username.
    pub per_user: u32,
    /// coturn `total-quota`: concurrent allocations on this server.
    pub total: u32,
}

/// Stateless nonce parameters. A nonce is 16 characters: a timestamp and an HMAC (keyed with
/// `secret`) over the timestamp and the client's IP address, so it costs no per-source state
/// and cannot be used from another IP address.
#[derive(Clone)]
pub struct NonceConfig {
    /// HMAC key for the nonces this server issues (random by default). Servers that share it
    /// accept each other's nonces (fleet nonces: a client sent to another server with 300
    /// Try Alternate keeps its nonce); see [`nonce_key`](crate::auth::nonce_key).
    pub secret: [u8; 32],
    /// Further keys whose nonces are accepted (not issued): the keys of the other TURN REST
    /// API secrets during a rotation, whatever order other servers list them in.
    pub accepted: Vec<[u8; 32]>,
    /// coturn `stale-nonce` (600 s): a nonce older than this gets 438 Stale Nonce.
    pub lifetime: Duration,
}

impl Default for NonceConfig {
    fn default() -> Self {
        NonceConfig {
            secret: rand::random(),
            accepted: Vec::new(),
            lifetime: Duration::from_secs(600),
        }
    }
}

impl std::fmt::Debug for NonceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NonceConfig")
            .field("secret", &"..")
            .field("lifetime", &self.lifetime)
            .finish()
    }
}

/// Relay addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelayConfig {
    /// coturn `relay-ip`: the addresses relay sockets are bound on (round-robin within a
    /// family). The family of an allocation is available iff an address of that family is
    /// listed. If the list is empty, the local address the request arrived on is used (it must
    /// then not be a wildcard address).
    pub relay_ips: Vec<IpAddr>,
    /// coturn `external-ip`: how relay addresses are advertised in XOR-RELAYED-ADDRESS.
    pub external_ips: Vec<ExternalIp>,
}

impl RelayConfig {
    /// The address advertised for a relay bound on `local`: the `public` of the
    /// `external-ip` whose `private` equals `local`, else the `public` of a same-family
    /// `external-ip` without `private`, else `local` itself.
    pub fn advertised(&self, local: IpAddr) -> IpAddr {
        if let Some(e) = self.external_ips.iter().find(|e| e.private == Some(local)) {
            return e.public;
        }
        if let Some(e) = self
            .external_ips
            .iter()
            .find(|e| e.private.is_none() && e.public.is_ipv4() == local.is_ipv4())
        {
            return e.public;
        }
        local
    }
}

/// coturn `external-ip=public[/private]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExternalIp {
    /// The address clients see.
    pub public: IpAddr,
    /// The local relay address it stands for (`None`: every relay address of that family).
    pub private: Option<IpAddr>,
}

impl FromStr for ExternalIp {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<ExternalIp, ConfigError> {
        let err = || ConfigError::ExternalIp(s.to_string());
        let (public, private) = match s.trim().split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s.trim(), None),
        };
        let public: IpAddr = public.trim().parse().map_err(|_| err())?;
        let private = match private {
            Some(p) => Some(p.trim().parse::<IpAddr>().map_err(|_| err())?),
            None => None,
        };
        if private.is_some_and(|p| p.is_ipv4() != public.is_ipv4()) {
            return Err(err());
        }
        Ok(ExternalIp { public, private })
    }
}

/// A configuration value that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `user=` without `name:secret`.
    #[error("invalid user {0:?}: expected name:password or name:0xHEXKEY")]
    User(String),
    /// `user=name:0x...` with a key that is not 32 hex digits.
    #[error("invalid key for user {0:?}: expected 0x followed by 32 hex digits")]
    UserKey(String),
    /// `external-ip=` that is not `public[/private]`.
    #[error("invalid external-ip {0:?}: expected PUBLIC-IP or PUBLIC-IP/PRIVATE-IP of one family")]
    ExternalIp(String),
}
