//! The typed configuration: what [`super::parse`] makes of coturn's options, and the protocol
//! core's configuration derived from it.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::{DefaultFamily, ExternalIp, IpRange, Service, TlsFiles, UserKey};

/// The TURN daemon's own configuration, typed and checked.
#[derive(Debug, Clone)]
pub struct TurnConfig {
    /// The turnserver.conf read, if any (`-c`).
    pub config_file: Option<PathBuf>,
    /// The long-term credential realm (coturn's `realm`).
    pub realm: String,
    /// Empty means every address of the host (see `listen::listening_addresses`).
    pub listening_ips: Vec<IpAddr>,
    /// UDP and TCP.
    pub listening_port: u16,
    /// TLS, when [`tls`](Self::tls) is set.
    pub tls_listening_port: u16,
    /// A UDP client listener (coturn's `no-udp` turns it off).
    pub udp: bool,
    /// A TCP client listener (coturn's `no-tcp` turns it off).
    pub tcp: bool,
    /// The TLS listener's certificate and key: both `cert` and `pkey` given, and not
    /// `no-tls`.
    pub tls: Option<TlsFiles>,
    /// Addresses relay sockets bind to (coturn's `relay-ip`); empty means the listening address the client used.
    pub relay_ips: Vec<IpAddr>,
    /// Public addresses advertised for relay addresses (coturn's `external-ip`).
    pub external_ips: Vec<ExternalIp>,
    /// Lowest relay port (coturn's `min-port`).
    pub min_port: u16,
    /// Highest relay port (coturn's `max-port`).
    pub max_port: u16,
    /// coturn's `relay-threads`: UDP I/O threads; 0 = one per CPU this process may run on
    /// (see [`TurnConfig::udp_workers`]).
    pub relay_threads: usize,
    /// Our `kernel-relay`: relay channel-bound UDP allocations in the kernel (eBPF).
    pub kernel_relay: bool,
    /// coturn's `prometheus-username-labels`: the traffic counters by user too, for at most
    /// this many users at once (our `prometheus-username-labels-max`).
    pub user_labels: Option<usize>,
    /// How clients authenticate.
    pub auth: AuthMode,
    /// Peer ranges refused (coturn's `denied-peer-ip`).
    pub denied_peer_ips: Vec<IpRange>,
    /// Peer ranges allowed even inside a denied one (coturn's `allowed-peer-ip`).
    pub allowed_peer_ips: Vec<IpRange>,
    /// Whether loopback peers are allowed (coturn's `allow-loopback-peers`).
    pub allow_loopback_peers: bool,
    /// Allocations per user; 0 = unlimited (coturn's `user-quota`).
    pub user_quota: u32,
    /// Allocations in all; 0 = unlimited (coturn's `total-quota`).
    pub total_quota: u32,
    /// Seconds.
    pub max_allocate_lifetime: u32,
    /// Seconds.
    pub stale_nonce: u32,
    /// `--drain-idle-timeout`: while draining, allocations whose client has been quiet this
    /// long end; zero = never.
    pub drain_idle_timeout: Duration,
    /// `nonce-secret` (`stateless-nonce-secret`, `nonce-secret-file`): the nonce key's
    /// secret; `None`: derived from the first `static-auth-secret`, else random.
    pub nonce_secret: Option<Vec<u8>>,
    /// Challenges larger than their request per source IP and second over UDP (coturn
    /// `unauthorized-ratelimit[-rps]`); 0 = no limit.
    pub unauthorized_rps: u32,
    /// Where to write the process id (coturn's `pidfile`).
    pub pidfile: Option<PathBuf>,
    /// Where new allocations are sent (300 Try Alternate) while refusing (coturn's `alternate-server`).
    pub alternate_servers: Vec<SocketAddr>,
    /// coturn's `udp-alternate-server`, `tcp-alternate-server`, `tls-alternate-server`: by
    /// client transport, instead of `alternate_servers`.
    pub transport_alternates: TransportAlternates,
    /// coturn's `rest-api-separator`.
    pub rest_separator: char,
    /// coturn's `max-bps`: bytes per second per allocation and direction (0 = none).
    pub max_bps: u64,
    /// coturn's `bps-capacity`: bytes per second all allocations may reserve (0 = none).
    pub bps_capacity: u64,
    /// coturn's `channel-lifetime`, in seconds.
    pub channel_lifetime: u32,
    /// coturn's `permission-lifetime`, in seconds.
    pub permission_lifetime: u32,
    /// coturn's `allocation-default-address-family` / `keep-address-family`.
    pub default_family: DefaultFamily,
    /// coturn's `stun-only` / `no-stun`.
    pub service: Service,
    /// coturn's `secure-stun`: Binding requests need credentials too.
    pub secure_stun: bool,
    /// coturn's `check-origin-consistency`.
    pub check_origin: bool,
    /// coturn's `include-reason-string`.
    pub reason_phrases: bool,
    /// coturn's `fingerprint`.
    pub fingerprint: bool,
    /// coturn's `software-attribute` (off: `no-software-attribute`).
    pub software_attribute: bool,
    /// coturn's user database (`userdb`, `psql-userdb`, `redis-userdb`), if any.
    pub userdb: Option<super::userdb::UserDbConfig>,
}

/// Alternates by client transport (empty: `alternate-server`'s).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransportAlternates {
    /// `udp-alternate-server`.
    pub udp: Vec<SocketAddr>,
    /// `tcp-alternate-server`.
    pub tcp: Vec<SocketAddr>,
    /// `tls-alternate-server`.
    pub tls: Vec<SocketAddr>,
}

/// How clients authenticate: long-term credentials, unless `no-auth` with its
/// acknowledgement.
#[derive(Clone, PartialEq, Eq)]
pub enum AuthMode {
    /// coturn's `no-auth` (with `no-auth-acknowledge-open-relay`): every request is accepted
    /// anonymously; the peer policy still applies.
    Open,
    /// coturn's `use-auth-secret`: TURN REST API credentials made with any of `secrets` (all
    /// are accepted, for rotation); static `users` are accepted too.
    RestApi {
        /// The shared secrets (coturn's `static-auth-secret`).
        secrets: Vec<String>,
        /// Static users, accepted alongside.
        users: Vec<(String, UserKey)>,
    },
    /// Static users only (`user=name:password`, `user=name:0xKEY`).
    StaticUsers(Vec<(String, UserKey)>),
    /// Wire's fork's `zrest`: zrest credentials made with any of `secrets` (then a user
    /// database's), and nothing else.
    Zrest {
        /// The shared secrets (coturn's `static-auth-secret`).
        secrets: Vec<String>,
    },
}

impl AuthMode {
    /// Whether credentials made with shared secrets are accepted (TURN REST API or zrest):
    /// a user database is then read for its secrets, not its users.
    pub fn uses_rest_api(&self) -> bool {
        matches!(self, AuthMode::RestApi { .. } | AuthMode::Zrest { .. })
    }

    /// The shared secrets (none for static users only).
    pub fn rest_secrets(&self) -> &[String] {
        match self {
            AuthMode::RestApi { secrets, .. } | AuthMode::Zrest { secrets } => secrets,
            AuthMode::StaticUsers(_) | AuthMode::Open => &[],
        }
    }

    /// The static users.
    pub fn users(&self) -> &[(String, UserKey)] {
        match self {
            AuthMode::RestApi { users, .. } | AuthMode::StaticUsers(users) => users,
            AuthMode::Open | AuthMode::Zrest { .. } => &[],
        }
    }

    /// How the shared secrets make credentials.
    pub fn rest_scheme(&self) -> lastcall_turn_proto::RestScheme {
        match self {
            AuthMode::Zrest { .. } => lastcall_turn_proto::RestScheme::Zrest,
            AuthMode::RestApi { .. } | AuthMode::StaticUsers(_) | AuthMode::Open => {
                lastcall_turn_proto::RestScheme::Timestamp
            }
        }
    }
}

/// Never prints a secret or a key.
impl std::fmt::Debug for AuthMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let users: Vec<&str> = self.users().iter().map(|(n, _)| n.as_str()).collect();
        match self {
            AuthMode::RestApi { secrets, .. } => f
                .debug_struct("RestApi")
                .field("secrets", &secrets.len())
                .field("users", &users)
                .finish(),
            AuthMode::StaticUsers(_) => f.debug_tuple("StaticUsers").field(&users).finish(),
            AuthMode::Zrest { secrets } => f
                .debug_struct("Zrest")
                .field("secrets", &secrets.len())
                .finish(),
            AuthMode::Open => f.write_str("Open"),
        }
    }
}

/// The most `relay-threads` accepted.
pub const MAX_RELAY_THREADS: usize = 1024;

impl TurnConfig {
    /// The protocol core's configuration.
    pub fn core_config(&self) -> lastcall_turn_proto::ServerConfig {
        let mut s = lastcall_turn_proto::ServerConfig::new(self.realm.clone());
        s.auth.rest_secrets = self
            .auth
            .rest_secrets()
            .iter()
            .map(|x| x.as_bytes().to_vec())
            .collect();
        for (name, key) in self.auth.users() {
            s.auth.users.insert(name.clone(), key.clone());
        }
        s.lifetimes.allocation_max = Duration::from_secs(u64::from(self.max_allocate_lifetime));
        if s.lifetimes.allocation_default > s.lifetimes.allocation_max {
            s.lifetimes.allocation_default = s.lifetimes.allocation_max;
        }
        s.quotas.per_user = self.user_quota;
        s.quotas.total = self.total_quota;
        s.nonce.lifetime = Duration::from_secs(u64::from(self.stale_nonce));
        s.drain_idle_timeout =
            (!self.drain_idle_timeout.is_zero()).then_some(self.drain_idle_timeout);
        // Fleet nonces: one key for every server given the same secret.
        let rest = self.auth.rest_secrets();
        if let Some(secret) = &self.nonce_secret {
            s.nonce.secret = lastcall_turn_proto::nonce_key(secret);
        } else if let Some((first, others)) = rest.split_first() {
            s.nonce.secret = lastcall_turn_proto::nonce_key(first.as_bytes());
            s.nonce.accepted = others
                .iter()
                .map(|o| lastcall_turn_proto::nonce_key(o.as_bytes()))
                .collect();
        }
        s.unauthorized_rps = self.unauthorized_rps;
        s.peer_policy.allow_loopback = self.allow_loopback_peers;
        s.peer_policy.allowed = self.allowed_peer_ips.clone();
        s.peer_policy.denied = self.denied_peer_ips.clone();
        s.relay.relay_ips = self.relay_ips.clone();
        s.relay.external_ips = self.external_ips.clone();
        s.auth.rest_separator = self.rest_separator;
        s.auth.rest_scheme = self.auth.rest_scheme();
        s.auth.allow_anonymous = self.auth == AuthMode::Open;
        // coturn reads the database's REST secrets with use-auth-secret, its users without.
        s.auth.database = self
            .userdb
            .as_ref()
            .map(|db| lastcall_turn_proto::UserDatabase {
                keys: if self.auth.uses_rest_api() {
                    lastcall_turn_proto::DatabaseKeys::RestSecrets
                } else {
                    lastcall_turn_proto::DatabaseKeys::Users
                },
                cache: db.cache_limits(),
            });
        s.lifetimes.channel = Duration::from_secs(u64::from(self.channel_lifetime));
        s.lifetimes.permission = Duration::from_secs(u64::from(self.permission_lifetime));
        s.bandwidth.max_bps = self.max_bps;
        s.bandwidth.capacity = self.bps_capacity;
        s.default_family = self.default_family;
        s.service = self.service;
        s.secure_stun = self.secure_stun;
        s.check_origin = self.check_origin;
        s.reason_phrases = self.reason_phrases;
        s.fingerprint = self.fingerprint;
        if self.software_attribute {
            s.software = Some(concat!("lastcall-turn ", env!("CARGO_PKG_VERSION")).to_string());
        }
        s
    }

    /// Whether a TLS listener runs.
    pub fn tls_enabled(&self) -> bool {
        self.tls.is_some()
    }

    /// The number of UDP I/O threads: `relay-threads`, or when it is 0 the number of CPUs
    /// this process may run on (its affinity mask and cgroup quota).
    pub fn udp_workers(&self) -> usize {
        match self.relay_threads {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            n => n,
        }
    }
}
