//! Types shared between the protocol core and the I/O layer.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// Transport between client and server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Transport {
    /// UDP on the listening port.
    Udp,
    /// TCP on the listening port.
    Tcp,
    /// TLS over TCP on the TLS listening port.
    Tls,
}

impl Transport {
    /// `"udp"`, `"tcp"` or `"tls"` (metric label values).
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
        }
    }

    /// `true` for TCP and TLS (ChannelData is padded to 4 bytes on streams).
    pub fn is_stream(self) -> bool {
        !matches!(self, Transport::Udp)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The client side of an allocation's 5-tuple: transport, client address and the server's
/// local (listening) address the client talks to. Over TCP/TLS one connection is one
/// `ClientAddr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientAddr {
    /// Transport.
    pub transport: Transport,
    /// The client's address as seen by the server.
    pub client: SocketAddr,
    /// The server's local address the message arrived on (must be a concrete address, not a
    /// wildcard, when [`RelayConfig::relay_ips`](crate::RelayConfig::relay_ips) is empty).
    pub local: SocketAddr,
}

/// Something to send, borrowing either the input datagram or the caller's output buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transmit<'a> {
    /// Send `data` to the client (over UDP from `to.local` to `to.client`; over TCP/TLS on
    /// that connection).
    Client {
        /// The client 5-tuple.
        to: ClientAddr,
        /// Bytes to send (a STUN message or ChannelData).
        data: &'a [u8],
    },
    /// Send `data` from the relay socket bound on `relay` to `peer`.
    Peer {
        /// The relay socket's local address (as given in a [`RelayBound`]).
        relay: SocketAddr,
        /// The peer.
        peer: SocketAddr,
        /// Payload.
        data: &'a [u8],
    },
}

/// What [`Server::handle_client`](crate::Server::handle_client) asks of the I/O layer.
#[derive(Debug, PartialEq, Eq)]
pub enum Output<'a> {
    /// Send this now.
    Transmit(Transmit<'a>),
    /// An Allocate needs relay sockets before it can be answered: bind them (outside any lock
    /// around the core: binding is a system call) and hand the result to
    /// [`Server::relay_bound`](crate::Server::relay_bound), which returns the response. Every
    /// request must be answered once; an answer that comes after the Allocate stopped waiting
    /// (its TCP/TLS connection closed, the drain began, [`Server::clear`](crate::Server::clear))
    /// gets its sockets back through [`Server::poll_release`](crate::Server::poll_release).
    BindRelay(RelayRequest),
}

/// Which relay port a [`RelayRequest`] needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RelayPorts {
    /// Any free port of the range.
    Any,
    /// An even port (EVEN-PORT without R).
    Even,
    /// An even port, and port + 1 bound too and kept for a later Allocate with the
    /// RESERVATION-TOKEN the response carries (EVEN-PORT with R, RFC 8656 §7.2;
    /// `turnutils_uclient` asks for it on its RTP allocation).
    EvenPair,
}

/// Relay sockets an Allocate is waiting for ([`Output::BindRelay`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayRequest {
    /// Identifies the waiting Allocate; copy it into the [`RelayBound`] answer.
    pub id: u64,
    /// The client the allocation is for.
    pub client: ClientAddr,
    /// The address to bind the relay socket on (the core's round-robin over `relay-ip`, or
    /// the listening address the request arrived on).
    pub ip: IpAddr,
    /// The port rule for that socket.
    pub ports: RelayPorts,
    /// A second socket of the other family on this address, for a dual allocation
    /// (ADDITIONAL-ADDRESS-FAMILY); always [`RelayPorts::Any`].
    pub additional: Option<IpAddr>,
}

/// The I/O layer's answer to a [`RelayRequest`], for
/// [`Server::relay_bound`](crate::Server::relay_bound).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayBound {
    /// [`RelayRequest::id`].
    pub id: u64,
    /// The socket bound for [`RelayRequest::ip`], and for [`RelayPorts::EvenPair`] the one on
    /// port + 1 (`None` for the other rules).
    pub primary: Result<(SocketAddr, Option<SocketAddr>), RelayError>,
    /// The socket for [`RelayRequest::additional`], when it asked for one.
    pub additional: Option<Result<SocketAddr, RelayError>>,
}

/// Why a relay socket could not be bound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// Every port in the range is in use: the client gets 508 Insufficient Capacity.
    #[error("no relay port left")]
    NoPort,
    /// This address family cannot be relayed: the client gets 440.
    #[error("address family not supported")]
    FamilyNotSupported,
    /// Any other failure: the client gets 508 Insufficient Capacity.
    #[error("relay socket failed: {0}")]
    Failed(String),
}

/// Which limit an Allocate refused for capacity ran into (each refusal says it: the log line
/// of [`Event::AllocateRefused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapacityLimit {
    /// `user-quota`: the user's allocations, waiting ones included, reached it (486).
    UserQuota {
        /// The user.
        user: String,
        /// `user-quota`.
        quota: u32,
    },
    /// `total-quota`: the allocations, waiting ones included, reached it (486).
    TotalQuota {
        /// `total-quota`.
        quota: u32,
    },
    /// `bps-capacity`: no bandwidth left to reserve (486).
    Bandwidth {
        /// `bps-capacity`, bytes per second.
        capacity: u64,
    },
    /// No free port in `min-port..max-port` at the relay address (508).
    RelayPorts,
    /// The operating system refused a relay socket: its error (the open-file limit, memory)
    /// (508).
    RelaySocket(String),
    /// RESERVATION-TOKEN names no reservation: unknown, used, or expired after 30 s (508).
    Reservation,
    /// EVEN-PORT: no even port (with port + 1 for R=1) could be bound (508).
    EvenPort,
    /// The I/O layer bound a port the core still holds (a defect: never expected) (508).
    PortHeld,
}

impl CapacityLimit {
    /// A short name for log fields and alerts: `user-quota`, `total-quota`, `bps-capacity`,
    /// `relay-ports`, `relay-socket`, `reservation`, `even-port`, `port-held`.
    pub fn kind(&self) -> &'static str {
        match self {
            CapacityLimit::UserQuota { .. } => "user-quota",
            CapacityLimit::TotalQuota { .. } => "total-quota",
            CapacityLimit::Bandwidth { .. } => "bps-capacity",
            CapacityLimit::RelayPorts => "relay-ports",
            CapacityLimit::RelaySocket(_) => "relay-socket",
            CapacityLimit::Reservation => "reservation",
            CapacityLimit::EvenPort => "even-port",
            CapacityLimit::PortHeld => "port-held",
        }
    }
}

impl std::fmt::Display for CapacityLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CapacityLimit::UserQuota { user, quota } => {
                write!(f, "user-quota: {user:?} has {quota} allocations")
            }
            CapacityLimit::TotalQuota { quota } => {
                write!(f, "total-quota: {quota} allocations in all")
            }
            CapacityLimit::Bandwidth { capacity } => {
                write!(f, "bps-capacity: all {capacity} bytes/s reserved")
            }
            CapacityLimit::RelayPorts => write!(f, "relay ports: none free in min-port..max-port"),
            CapacityLimit::RelaySocket(e) => write!(f, "relay socket: {e}"),
            CapacityLimit::Reservation => write!(
                f,
                "reservation: RESERVATION-TOKEN unknown, used or expired (30 s)"
            ),
            CapacityLimit::EvenPort => write!(f, "relay ports: no even port (pair) free"),
            CapacityLimit::PortHeld => write!(
                f,
                "relay ports: the port bound is held by another allocation"
            ),
        }
    }
}

/// The relay addresses of one allocation (one or both families).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RelayAddrs {
    /// IPv4 relay socket (local address).
    pub v4: Option<SocketAddr>,
    /// IPv6 relay socket (local address).
    pub v6: Option<SocketAddr>,
}

impl RelayAddrs {
    /// One relay socket, in the slot of its family.
    pub fn for_one(relay: SocketAddr) -> RelayAddrs {
        match relay {
            SocketAddr::V4(_) => RelayAddrs {
                v4: Some(relay),
                v6: None,
            },
            SocketAddr::V6(_) => RelayAddrs {
                v4: None,
                v6: Some(relay),
            },
        }
    }

    /// The addresses present.
    pub fn iter(&self) -> impl Iterator<Item = SocketAddr> {
        self.v4.into_iter().chain(self.v6)
    }

    /// The relay for `family` (`true` = IPv4).
    pub fn for_family(&self, v4: bool) -> Option<SocketAddr> {
        if v4 {
            self.v4
        } else {
            self.v6
        }
    }
}

/// Why an allocation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    /// Refresh with LIFETIME 0.
    Refreshed,
    /// Its lifetime ran out.
    Expired,
    /// The TCP/TLS connection closed ([`Server::close_client`](crate::Server::close_client)).
    ConnectionClosed,
    /// [`Server::clear`](crate::Server::clear) (shutdown deadline).
    Shutdown,
    /// While refusing, nothing came from its client for
    /// [`ServerConfig::drain_idle_timeout`](crate::ServerConfig::drain_idle_timeout): a
    /// client that vanished without deleting it.
    Reclaimed,
    /// Ended by the operator ([`Server::end_allocation`](crate::Server::end_allocation),
    /// `DELETE /sessions`): the way the deadline ends every allocation, for one.
    Ended,
}

impl DeleteReason {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteReason::Refreshed => "refresh",
            DeleteReason::Expired => "expired",
            DeleteReason::ConnectionClosed => "connection_closed",
            DeleteReason::Shutdown => "shutdown",
            DeleteReason::Reclaimed => "reclaimed",
            DeleteReason::Ended => "ended",
        }
    }
}

/// Why authentication failed. Each is an [`Event::AuthFailed`] and counts in
/// [`Counters::auth_failures`]; the normal 401 challenge of a request without credentials and
/// the 438 for a stale nonce are not failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthFailure {
    /// Unknown username (401).
    UnknownUser,
    /// MESSAGE-INTEGRITY did not verify (401).
    BadIntegrity,
    /// REST credential past its expiry (401).
    Expired,
    /// The username differs from the allocation's (441).
    WrongCredentials,
    /// A NONCE this server issued, past `stale-nonce` (438 with a fresh one: the usual
    /// rotation, not counted in [`Counters::auth_failures`]).
    StaleNonce,
    /// A NONCE this server never issued: made with another nonce secret (another server, a
    /// restart without a shared secret), for another client IP, or forged (438).
    UnknownNonce,
    /// The user database could not say (down, slow, an error): 500, try again.
    DatabaseUnavailable,
    /// Too many lookups in flight or requests waiting for them: 500, try again.
    DatabaseBusy,
}

impl AuthFailure {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::UnknownUser => "unknown_user",
            AuthFailure::BadIntegrity => "bad_integrity",
            AuthFailure::Expired => "expired",
            AuthFailure::WrongCredentials => "wrong_credentials",
            AuthFailure::StaleNonce => "stale_nonce",
            AuthFailure::UnknownNonce => "unknown_nonce",
            AuthFailure::DatabaseUnavailable => "database_unavailable",
            AuthFailure::DatabaseBusy => "database_busy",
        }
    }
}

/// Something the I/O layer may want to know (metrics, session guards, logs). Poll with
/// [`Server::poll_event`](crate::Server::poll_event) after each call. Allocations' creations
/// and deletions are never dropped; of the other events at most [`MAX_QUEUED_EVENTS`] are
/// kept (newer ones are dropped and counted in [`Counters::events_dropped`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A new allocation (take a session guard here).
    AllocationCreated {
        /// Client 5-tuple (its transport labels `turn_total_allocations`).
        client: ClientAddr,
        /// Relay socket addresses.
        relays: RelayAddrs,
        /// Authenticated username (empty when anonymous).
        username: String,
        /// Granted lifetime in seconds.
        lifetime: u32,
    },
    /// An allocation ended (drop the session guard here). Its relay sockets were released.
    AllocationDeleted {
        /// Client 5-tuple.
        client: ClientAddr,
        /// Relay socket addresses.
        relays: RelayAddrs,
        /// Username.
        username: String,
        /// Why.
        reason: DeleteReason,
    },
    /// A request failed authentication.
    AuthFailed {
        /// Client.
        client: ClientAddr,
        /// Username given (if any).
        username: Option<String>,
        /// Why.
        reason: AuthFailure,
    },
    /// A new Allocate was refused because the server is draining.
    AllocateRefusedDraining {
        /// Client.
        client: ClientAddr,
        /// The ALTERNATE-SERVER sent with 300, or `None` for 403.
        alternate: Option<SocketAddr>,
    },
    /// A new Allocate was refused for capacity: `code` 486 (quota, bandwidth) or 508 (relay
    /// sockets), and which limit it ran into.
    AllocateRefused {
        /// Client.
        client: ClientAddr,
        /// 486 or 508.
        code: u16,
        /// The limit.
        limit: CapacityLimit,
    },
    /// A CreatePermission/ChannelBind peer was refused by the peer policy (403).
    PeerDenied {
        /// Client.
        client: ClientAddr,
        /// The refused peer.
        peer: SocketAddr,
        /// Why.
        reason: crate::DenyReason,
    },
}

/// Most events other than allocations' creations and deletions queued before new ones are
/// dropped.
pub const MAX_QUEUED_EVENTS: usize = 4096;

impl Event {
    /// Whether this is an allocation's creation or deletion (what session guards follow:
    /// never dropped from the queue).
    pub fn is_lifecycle(&self) -> bool {
        matches!(
            self,
            Event::AllocationCreated { .. } | Event::AllocationDeleted { .. }
        )
    }
}

/// Drain behaviour for NEW allocations (existing ones always keep working).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DrainMode {
    /// Serve normally.
    #[default]
    Off,
    /// A new Allocate (none on that 5-tuple yet) is refused, after authentication succeeds:
    /// with 300 Try Alternate + ALTERNATE-SERVER (round-robin over `alternates`, an address
    /// of the client's family preferred) or with 403 Forbidden when `alternates` is empty.
    Refuse {
        /// `--alternate-server` addresses.
        alternates: Vec<SocketAddr>,
    },
}

/// Cumulative counters, cheap to read ([`Server::counters`](crate::Server::counters)); the I/O
/// layer exports them as metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Datagrams/frames passed to `handle_client`.
    pub client_packets_in: u64,
    /// Their bytes.
    pub client_bytes_in: u64,
    /// Transmits to clients produced (responses, Data indications, ChannelData).
    pub client_packets_out: u64,
    /// Their bytes.
    pub client_bytes_out: u64,
    /// Datagrams passed to `handle_peer`.
    pub peer_packets_in: u64,
    /// Their bytes.
    pub peer_bytes_in: u64,
    /// Payloads relayed to peers (from ChannelData or Send).
    pub peer_packets_out: u64,
    /// Their bytes (payload).
    pub peer_bytes_out: u64,
    /// Peer datagrams dropped: no allocation on that relay or no permission for the peer.
    pub peer_dropped: u64,
    /// Client data (ChannelData/Send) dropped: no allocation, channel or permission.
    pub client_data_dropped: u64,
    /// Client datagrams dropped as malformed (not STUN, not ChannelData, bad FINGERPRINT).
    pub malformed: u64,
    /// Unauthenticated responses dropped because they would be larger than the request.
    pub suppressed_responses: u64,
    /// Responses larger than their unauthenticated UDP request not sent because their source
    /// IP had its [`unauthorized_rps`](crate::ServerConfig::unauthorized_rps) this second.
    pub ratelimited_responses: u64,
    /// STUN Binding requests.
    pub binding_requests: u64,
    /// STUN Binding success responses.
    pub binding_responses: u64,
    /// STUN Binding error responses (420: unknown comprehension-required attributes).
    pub binding_errors: u64,
    /// Authentication failures (not counting the first 401 challenge).
    pub auth_failures: u64,
    /// Allocations created.
    pub allocations_created: u64,
    /// Allocations deleted.
    pub allocations_deleted: u64,
    /// New Allocates refused while draining.
    pub refused_draining: u64,
    /// Allocates refused with 486 (quota).
    pub refused_quota: u64,
    /// Allocates refused with 508 (no relay port).
    pub refused_capacity: u64,
    /// Peers refused by the peer policy (403).
    pub peers_denied: u64,
    /// Events dropped because the queue was full.
    pub events_dropped: u64,
    /// Allocations ended while refusing because their client had gone quiet
    /// ([`DeleteReason::Reclaimed`]).
    pub allocations_reclaimed: u64,
    /// ChannelData, Send and peer datagrams dropped because their allocation was over its
    /// `max-bps`.
    pub bandwidth_dropped: u64,
    /// Allocates refused with 486 because `bps-capacity` was all reserved.
    pub refused_bandwidth: u64,
    /// Lookups asked of the user database ([`Server::poll_lookup`](crate::Server::poll_lookup)).
    pub userdb_lookups: u64,
    /// Of those, answered [`Answer::Unavailable`](crate::Answer::Unavailable) or not in time.
    pub userdb_unavailable: u64,
    /// Requests answered from what the core kept of the user database, without a lookup.
    pub userdb_cached: u64,
}
