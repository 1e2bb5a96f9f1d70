//! The option table: every coturn option name (4.6.1 and the current upstream) and what
//! `lastcall-turn` does with it, so that "unsupported coturn option" and "unknown option" are
//! told apart and the command line, the file parser and `--help` agree.

/// How an option takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A boolean: `--name`, `--name=false`; in a file `name`, `name=0`, `name off`.
    Flag,
    /// A flag whose value is optional (coturn's `stale-nonce[=SECONDS]`).
    OptionalValue,
    /// One value; the last one given wins (the command line after the file).
    Value,
    /// Repeatable; every value counts (the file's first, then the command line's).
    Multi,
}

impl Kind {
    /// Whether the option is followed by a value on the command line (`--name VALUE`).
    pub(crate) fn takes_value(self) -> bool {
        matches!(self, Kind::Value | Kind::Multi)
    }
}

/// What `lastcall-turn` does with an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    /// Read into the configuration and acted on.
    Honoured,
    /// Accepted (its value is still checked) and changes nothing: what it asks for is always
    /// `lastcall-turn`'s behaviour; the help says which.
    Accepted,
    /// A start-up error naming the option, with a hint when there is a better way.
    Refused {
        /// What to use instead.
        hint: Option<&'static str>,
    },
}

/// One option.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec {
    /// Long name, as in coturn (`listening-port`).
    pub name: &'static str,
    /// coturn's short forms.
    pub shorts: &'static [char],
    pub kind: Kind,
    pub policy: Policy,
    /// Value name shown in `--help`.
    pub value_name: &'static str,
    /// `--help` text (of the options that may be given).
    pub help: &'static str,
}

impl Spec {
    /// Whether the option may be given (honoured or accepted).
    pub(crate) fn accepted(&self) -> bool {
        !matches!(self.policy, Policy::Refused { .. })
    }
}

const fn spec(
    name: &'static str,
    shorts: &'static [char],
    kind: Kind,
    policy: Policy,
    value_name: &'static str,
    help: &'static str,
) -> Spec {
    Spec {
        name,
        shorts,
        kind,
        policy,
        value_name,
        help,
    }
}

const fn refused(
    name: &'static str,
    shorts: &'static [char],
    kind: Kind,
    hint: Option<&'static str>,
) -> Spec {
    Spec {
        name,
        shorts,
        kind,
        policy: Policy::Refused { hint },
        value_name: "",
        help: "",
    }
}

use Kind::{Flag, Multi, OptionalValue, Value};

/// Why the fork's `federation-*` options are refused.
const FEDERATION: Option<&str> = Some("Wire's federation (links between Wire backends' TURN servers for conference calls, the wireapp/coturn fork's federation-* options) is not implemented: leave federate.enabled off");
use Policy::{Accepted, Honoured};

/// Every coturn option of 4.6 to 4.18 (their `--help` and shipped turnserver.conf), those
/// Wire's fork and chart add (`zrest`, `prometheus-ip`, `federation-*`, `401-*`), plus
/// `alternate-server` (whose meaning differs: used only while draining) and our
/// `no-auth-acknowledge-open-relay`, `drain-idle-timeout`, `nonce-secret`,
/// `nonce-secret-file`, `kernel-relay`, `external-ip-file`, `userdb-cache-ttl`, `no-cert-watch` and `prometheus-username-labels-max`. Kept in the order of docs/turn.md's table; a test checks
/// both agree, and that every option of `tests/data/coturn-options.txt` and
/// `tests/data/wireapp-coturn-options.txt` is here.
///
/// For an [`Accepted`] option the help is the start-up warning: what `lastcall-turn` does
/// instead. A refused [`Flag`] given as false (`dtls=0`) asks for nothing and is accepted.
#[rustfmt::skip]
pub(crate) const OPTIONS: &[Spec] = &[
    // Listeners and relay addresses.
    spec("listening-port", &['p'], Value, Honoured, "PORT", "UDP and TCP listening port [default: 3478]"),
    spec("tls-listening-port", &[], Value, Honoured, "PORT", "TLS listening port [default: 5349]"),
    spec("listening-ip", &['L'], Multi, Honoured, "IP", "Listening address (repeatable); 0.0.0.0 or :: mean every host address of that family [default: every host address]"),
    spec("relay-ip", &['E'], Multi, Honoured, "IP", "Relay address (repeatable; round-robin per address family) [default: the listening address the client used]"),
    spec("external-ip", &['X'], Multi, Honoured, "PUBLIC[/PRIVATE]", "Public address advertised for a relay address behind NAT (repeatable)"),
    spec("external-ip-file", &[], Multi, Honoured, "PATH", "lastcall-turn's own: external-ip values read from this file at start (space- or line-separated; empty: none); the chart writes one per node (its map, or the node's ExternalIP from the Kubernetes API)"),
    spec("relay-threads", &['m'], Value, Honoured, "N", "UDP I/O threads, each with its own listening socket per address (SO_REUSEPORT) and the relay sockets of its clients; 0 = one per CPU this process may run on [default: 0]"),
    spec("kernel-relay", &[], Flag, Honoured, "", "lastcall-turn's own: relay the ChannelData of channel-bound UDP IPv4 allocations in the kernel (eBPF on tc ingress; needs root or CAP_BPF + CAP_NET_ADMIN and a build with the kernel-relay feature); if the kernel refuses, one log line and user space"),
    spec("min-port", &[], Value, Honoured, "PORT", "Lowest relay port [default: 49152]"),
    spec("max-port", &[], Value, Honoured, "PORT", "Highest relay port [default: 65535]"),
    spec("no-udp", &[], Flag, Honoured, "", "No UDP client listener"),
    spec("no-tcp", &[], Flag, Honoured, "", "No TCP client listener"),
    spec("no-tls", &[], Flag, Honoured, "", "No TLS listener"),
    spec("no-dtls", &[], Flag, Honoured, "", "No DTLS listener (there never is one)"),
    spec("dtls", &[], Flag, Accepted, "", "there is no DTLS listener (DTLS is not implemented); clients use UDP, TCP or TLS"),
    spec("alt-listening-port", &[], Value, Accepted, "PORT", "there is no RFC 5780 alternate listener (RFC 5780 is not implemented)"),
    spec("alt-tls-listening-port", &[], Value, Accepted, "PORT", "there is no RFC 5780 alternate listener (RFC 5780 is not implemented)"),
    spec("udp-self-balance", &[], Flag, Accepted, "", "UDP clients are spread over the UDP I/O threads by the kernel (SO_REUSEPORT, relay-threads), not redirected to aux servers"),
    spec("cpus", &[], Value, Accepted, "N", "the CPU count comes from the process's affinity and cgroup quota; use relay-threads to choose the UDP I/O threads"),
    spec("sock-buf-size", &[], Value, Accepted, "BYTES", "UDP sockets keep the kernel's buffer sizes (net.core.rmem_default / wmem_default)"),
    spec("ne", &[], Value, Accepted, "1|2|3", "there is one network engine: UDP I/O threads with recvmmsg/sendmmsg"),
    spec("udp-recvmmsg", &[], Flag, Honoured, "", "recvmmsg is always used"),
    spec("udp-recvmmsg-log", &[], Flag, Accepted, "", "no recvmmsg log; lastcall_turn_udp_worker_datagrams_total / _wakeups_total give the mean batch"),
    spec("udp-sendmmsg-log", &[], Flag, Accepted, "", "no sendmmsg log; lastcall_turn_udp_worker_datagrams_total / _wakeups_total give the mean batch"),
    spec("udp-gso", &[], Flag, Accepted, "", "UDP GSO is not used; datagrams are batched with sendmmsg"),
    spec("multiplex-peer", &[], Flag, Accepted, "", "every allocation keeps its own relay port in min-port..max-port: open that range to peers"),
    spec("multiplex-peer-port", &[], Value, Accepted, "PORT", "every allocation keeps its own relay port in min-port..max-port: open that range to peers"),
    spec("multiplex-peer-max-peers", &[], Value, Accepted, "N", "every allocation keeps its own relay port in min-port..max-port: open that range to peers"),
    refused("listening-device", &['d'], Value, Some("give the device's address with listening-ip")),
    refused("relay-device", &['i'], Value, Some("give the device's address with relay-ip")),
    refused("tcp-proxy-port", &[], Value, Some("the PROXY protocol is not implemented")),
    refused("aux-server", &[], Value, Some("give the address with listening-ip")),
    // Credentials.
    spec("realm", &['r'], Value, Honoured, "REALM", "Realm for long-term credentials"),
    spec("lt-cred-mech", &['a'], Flag, Honoured, "", "Long-term credential mechanism (always on)"),
    spec("use-auth-secret", &[], Flag, Honoured, "", "TURN REST API credentials (username `expiry:user`, password HMAC-SHA1 of it)"),
    spec("static-auth-secret", &[], Multi, Honoured, "SECRET", "Shared secret of the TURN REST API (repeatable: all are accepted, for rotation); given alone it turns the TURN REST API on, as in coturn; with zrest, the secrets of zrest"),
    spec("zrest", &[], Flag, Honoured, "", "Wire's coturn fork: zrest credentials as Wire's backend (brig) issues them, username `[sft-]d=EXPIRY.v=1.k=N.t=s.r=...` (refused from EXPIRY on; `sft-` never expires), password base64 of HMAC-SHA512 of it with a static-auth-secret (or a user database's turn_secret); no other credential is accepted"),
    spec("rest-api-separator", &['C'], Value, Honoured, "CHAR", "Separator between the expiry and the user in TURN REST API usernames [default: :]"),
    spec("user", &['u'], Multi, Honoured, "NAME:PASSWORD", "Static long-term user (repeatable); the password may be a 0x-prefixed MD5 key"),
    spec("userdb", &['b'], Value, Honoured, "PATH", "coturn's SQLite user database (Debian: /var/lib/turn/turndb; written by turnadmin -b PATH), read only; users, REST secrets, realm options and peer lists changed in it count without a restart"),
    spec("db", &[], Value, Honoured, "PATH", "coturn's name of userdb"),
    spec("no-auth", &['z'], Flag, Honoured, "", "Relay without authentication: an OPEN RELAY (the peer policy still applies); an error unless no-auth-acknowledge-open-relay is given too"),
    spec("no-auth-acknowledge-open-relay", &[], Flag, Honoured, "", "lastcall-turn's own: acknowledges that no-auth makes an open relay"),
    spec("no-auth-pings", &[], Flag, Accepted, "", "the user database is not pinged: its connection is used every 5 s by the reread of realm options and peer lists, and opened again when a query finds it broken"),
    spec("no-dynamic-ip-list", &[], Flag, Honoured, "", "Do not read allowed_peer_ip / denied_peer_ip from the user database (only allowed-peer-ip and denied-peer-ip count)"),
    spec("no-dynamic-realms", &[], Flag, Honoured, "", "Do not read turn_realm_option (max-bps, user-quota, total-quota) from the user database"),
    spec("secret-ts-exp-time", &[], OptionalValue, Accepted, "SECONDS", "coturn 4.6 ignored it too: a REST credential expires at the time in its username"),
    spec("server-name", &[], Value, Accepted, "NAME", "used only by oAuth, which is not implemented"),
    spec("secret-key-file", &[], Value, Accepted, "PATH", "used only for encrypted MySQL passwords; MySQL is not supported"),
    spec("psql-userdb", &['e'], Value, Honoured, "CONNINFO", "coturn's PostgreSQL user database: a libpq connection string (host=... dbname=... user=... password=..., or a postgresql:// URI); no TLS (sslmode=require is refused)"),
    spec("sql-userdb", &[], Value, Honoured, "CONNINFO", "coturn's name of psql-userdb"),
    refused("mysql-userdb", &['M'], Value, Some("MySQL is not supported: use userdb (SQLite), psql-userdb (PostgreSQL) or redis-userdb (Redis) with coturn's schema, static-auth-secret (TURN REST API) or user")),
    refused("mongo-userdb", &['J'], Value, Some("MongoDB is not supported: use userdb (SQLite), psql-userdb (PostgreSQL) or redis-userdb (Redis) with coturn's schema, static-auth-secret (TURN REST API) or user")),
    spec("redis-userdb", &['N'], Value, Honoured, "CONNINFO", "coturn's Redis user database: coturn's connection string (ip=... port=... dbname=... password=...) and key layout; no TLS"),
    spec("userdb-cache-ttl", &[], Value, Honoured, "DURATION", "lastcall-turn's own: how long a key or the REST secrets read from the user database are used without asking it again, 1s to 1h (a user removed or a secret rotated out works this long for new allocations; a user or secret added, a password changed, is seen within 1 s) [default: 10s]"),
    spec("redis-statsdb", &['O'], Value, Accepted, "URL", "no statistics go to Redis; they are at /metrics on the admin listener (--admin-addr)"),
    refused("oauth", &[], Flag, Some("third-party authorization (oAuth) is not implemented")),
    // Peers and allocations.
    spec("allowed-peer-ip", &[], Multi, Honoured, "IP[-IP]|CIDR", "Peer addresses allowed although the default policy refuses them, e.g. private ranges (repeatable)"),
    spec("denied-peer-ip", &[], Multi, Honoured, "IP[-IP]|CIDR", "Peer addresses refused (repeatable); an allowed-peer-ip range wins over it (coturn's rule)"),
    spec("allow-loopback-peers", &[], Flag, Honoured, "", "Allow loopback peers. FOR TESTS ONLY: opens the host's own services to every client"),
    spec("no-multicast-peers", &[], Flag, Honoured, "", "Refuse multicast peers (always on)"),
    refused("server-relay", &[], Flag, Some("it would relay without the permission check: leave it out")),
    spec("user-quota", &['q'], Value, Honoured, "N", "Most allocations per user (0 = no limit) [default: 0]"),
    spec("total-quota", &['Q'], Value, Honoured, "N", "Most allocations in total (0 = no limit) [default: 0]"),
    spec("max-bps", &['s'], Value, Honoured, "BYTES/S", "Most bytes per second an allocation relays in each direction (client to peer, peer to client); more is dropped (0 = no limit) [default: 0]"),
    spec("bps-capacity", &['B'], Value, Honoured, "BYTES/S", "Bandwidth all allocations together may reserve: each reserves max-bps (or what is left); an Allocate that finds none left gets 486 (0 = no limit) [default: 0]"),
    spec("max-allocate-lifetime", &[], Value, Honoured, "SECONDS", "Longest allocation lifetime a client may ask for [default: 3600]"),
    spec("channel-lifetime", &[], Value, Honoured, "SECONDS", "Channel binding lifetime (RFC 8656: 600; keep it) [default: 600]"),
    spec("permission-lifetime", &[], Value, Honoured, "SECONDS", "Permission lifetime (RFC 8656: 300; keep it) [default: 300]"),
    spec("max-allocate-timeout", &[], Value, Accepted, "SECONDS", "a TCP or TLS connection without an allocation is closed after 60 s"),
    spec("stale-nonce", &[], OptionalValue, Honoured, "SECONDS", "Nonce lifetime; the flag alone means 600 [default: 600]"),
    spec("unauthorized-ratelimit", &[], Flag, Honoured, "", "Limit the challenges (401/438) and Binding answers larger than their request sent to one source IP per second over UDP: on by default at 100/s, unlike coturn; given alone, coturn's 10/s; =false turns it off"),
    spec("unauthorized-ratelimit-rps", &[], Value, Honoured, "N", "The per-source rate of unauthorized-ratelimit (0 = no limit) [default: 100]"),
    spec("401-req-limit", &[], Value, Accepted, "N", "no 401 count per window: unauthorized-ratelimit-rps limits the challenges (401/438) sent to each source IP a second over UDP (100 by default), the one transport whose source can be spoofed; set that instead"),
    spec("401-window", &[], Value, Accepted, "SECONDS", "no 401 count per window: unauthorized-ratelimit-rps limits the challenges (401/438) sent to each source IP a second over UDP (100 by default), the one transport whose source can be spoofed; set that instead"),
    spec("401-allowlist", &[], Value, Accepted, "PATH", "no source is exempt from unauthorized-ratelimit-rps (a per-second limit that no client with credentials reaches: each needs one challenge per allocation)"),
    spec("stateless-nonce", &[], Flag, Honoured, "", "Nonces are always stateless (a timestamp and an HMAC)"),
    spec("stateless-nonce-secret", &[], Value, Honoured, "SECRET", "coturn's name of nonce-secret"),
    spec("nonce-secret", &[], Value, Honoured, "SECRET", "lastcall-turn's own: the key of the nonces (fleet nonces: every server given it accepts the others' nonces, so a client sent on with 300 keeps its nonce) [default: derived from the first static-auth-secret, else random per process]"),
    spec("nonce-secret-file", &[], Value, Honoured, "PATH", "lastcall-turn's own: nonce-secret read from this file (trailing whitespace removed)"),
    spec("allocation-default-address-family", &['A'], Value, Honoured, "ipv4|ipv6|keep", "Relay address family of an Allocate that names none: ipv4 (RFC 8656), ipv6, or keep (the family the client talks to the server with) [default: ipv4]"),
    spec("keep-address-family", &['K'], Flag, Honoured, "", "Same as allocation-default-address-family=keep"),
    refused("no-udp-relay", &[], Flag, Some("TCP relays (RFC 6062) are not implemented, so without UDP relays nothing would relay: leave it out")),
    spec("no-tcp-relay", &[], Flag, Honoured, "", "No TCP relays (RFC 6062 is not implemented: always so)"),
    refused("mobility", &[], Flag, Some("RFC 8016 mobility is not implemented")),
    spec("alternate-server", &[], Multi, Honoured, "IP:PORT", "While draining, answer new Allocates with 300 Try Alternate to these (round-robin; repeatable). Unlike coturn, not used before a drain"),
    spec("udp-alternate-server", &[], Multi, Honoured, "IP:PORT", "Like alternate-server, for UDP clients (instead of alternate-server)"),
    spec("tcp-alternate-server", &[], Multi, Honoured, "IP:PORT", "Like alternate-server, for TCP clients (instead of alternate-server)"),
    spec("tls-alternate-server", &[], Multi, Honoured, "IP:PORT", "Like alternate-server, for TLS clients (instead of alternate-server)"),
    spec("drain-idle-timeout", &[], Value, Honoured, "DURATION", "lastcall-turn's own: while draining, end an allocation whose client sent nothing (no data, no request) for this long, as if expired; 0 = never [default: 30s]"),
    // What requests get.
    spec("stun-only", &['S'], Flag, Honoured, "", "STUN only: TURN requests get no answer"),
    spec("no-stun", &[], Flag, Honoured, "", "TURN only: STUN Binding requests get no answer"),
    spec("secure-stun", &[], Flag, Honoured, "", "Binding requests need long-term credentials too"),
    spec("check-origin-consistency", &[], Flag, Honoured, "", "Every request on an allocation must carry the ORIGIN of the Allocate that made it (441 otherwise)"),
    spec("include-reason-string", &[], Flag, Honoured, "", "Reason phrases in error responses (not in an unauthenticated one that would grow larger than its request)"),
    spec("fingerprint", &['f'], Flag, Honoured, "", "FINGERPRINT on every response and Data indication (without it: on responses to requests that carry one)"),
    spec("software-attribute", &[], Flag, Honoured, "", "SOFTWARE (lastcall-turn's version) on responses to authenticated requests"),
    spec("no-software-attribute", &[], Flag, Honoured, "", "No SOFTWARE attribute (the default)"),
    spec("prod", &[], Flag, Honoured, "", "coturn 4.6's name of no-software-attribute"),
    spec("no-rfc5780", &[], Flag, Honoured, "", "No RFC 5780 (the default: it is not implemented)"),
    spec("no-stun-backward-compatibility", &[], Flag, Honoured, "", "No RFC 3489 STUN (the default: it is not implemented)"),
    spec("response-origin-only-with-rfc5780", &[], Flag, Honoured, "", "RESPONSE-ORIGIN is never sent"),
    spec("rfc5766-channel-numbers", &[], Flag, Honoured, "", "Channel numbers 0x4000-0x7FFF (RFC 5766's range) are always accepted"),
    spec("drop-invalid-packets", &[], Flag, Honoured, "", "Invalid packets are always dropped (and counted in lastcall_turn_malformed_total)"),
    spec("drop-invalid-packets-log", &[], Flag, Accepted, "", "invalid packets are not logged; they are counted in lastcall_turn_malformed_total"),
    spec("respond-http-unsupported", &[], Flag, Accepted, "", "an HTTP request on a TURN port gets no answer: the connection is closed"),
    refused("rfc5780", &[], Flag, Some("RFC 5780 NAT behaviour discovery is not implemented")),
    refused("stun-backward-compatibility", &[], Flag, Some("RFC 3489 STUN is not implemented")),
    refused("rfc3489-compatibility", &[], Flag, Some("RFC 3489 STUN is not implemented")),
    // TLS.
    spec("cert", &[], Value, Honoured, "PEM", "TLS certificate chain (PEM); reloaded when it changes (no-cert-watch) and on SIGUSR2 (coturn's) and SIGHUP"),
    spec("pkey", &[], Value, Honoured, "PEM", "TLS private key (PEM); reloaded when it changes (no-cert-watch) and on SIGUSR2 (coturn's) and SIGHUP"),
    spec("no-cert-watch", &[], Flag, Honoured, "", "lastcall-turn's own: do not watch cert, pkey and CA-file (inotify on their directories, which sees a Kubernetes Secret volume's update; a 10 s poll where inotify is unavailable); reload on SIGUSR2 and SIGHUP only"),
    spec("no-tlsv1_2", &[], Flag, Honoured, "", "TLS 1.3 only"),
    spec("no-tlsv1", &[], Flag, Honoured, "", "TLS 1.0 is never offered"),
    spec("no-tlsv1_1", &[], Flag, Honoured, "", "TLS 1.1 is never offered"),
    spec("no-sslv2", &[], Flag, Honoured, "", "SSL 2 is never offered"),
    spec("no-sslv3", &[], Flag, Honoured, "", "SSL 3 is never offered"),
    spec("tlsv1", &[], Flag, Accepted, "", "TLS 1.0 is never offered: clients need TLS 1.2 or 1.3"),
    spec("tlsv1_1", &[], Flag, Accepted, "", "TLS 1.1 is never offered: clients need TLS 1.2 or 1.3"),
    spec("cipher-list", &[], Value, Accepted, "CIPHERS", "rustls's cipher suites are used (TLS 1.3 AES-GCM and ChaCha20-Poly1305; TLS 1.2 ECDHE with the same)"),
    spec("ec-curve-name", &[], Value, Accepted, "CURVE", "rustls's key exchange groups are used (X25519, P-256, P-384)"),
    spec("dh566", &[], Flag, Accepted, "", "no finite-field Diffie-Hellman: rustls offers ECDHE only"),
    spec("dh1066", &[], Flag, Accepted, "", "no finite-field Diffie-Hellman: rustls offers ECDHE only"),
    spec("dh-file", &[], Value, Accepted, "PATH", "no finite-field Diffie-Hellman: rustls offers ECDHE only"),
    refused("pkey-pwd", &[], Value, Some("encrypted private keys are not supported: decrypt it (openssl pkey -in KEY -out PLAIN)")),
    spec("CA-file", &[], Value, Honoured, "PEM", "TLS clients must present a certificate signed by a CA of this PEM file (coturn's meaning: a client without one is refused); reloaded with cert and pkey; no effect without a TLS listener"),
    refused("raw-public-keys", &[], Flag, Some("RFC 7250 raw public keys are not implemented")),
    // Logs, metrics, the process.
    spec("verbose", &['v'], Flag, Honoured, "", "Log at debug level (unless --log-level is given)"),
    spec("Verbose", &['V'], Flag, Honoured, "", "Log at trace level (unless --log-level is given)"),
    spec("log-min-level", &[], Value, Honoured, "LEVEL", "Log level: debug, info, warning or error (unless --log-level is given)"),
    spec("log-file", &['l'], Value, Accepted, "PATH", "logs go to stderr; let the platform (journald, the kubelet) collect them"),
    spec("syslog", &[], Flag, Accepted, "", "logs go to stderr (text, or JSON with --log-format json); let the platform (journald, the kubelet) collect them"),
    spec("syslog-facility", &[], Value, Accepted, "FACILITY", "logs go to stderr, not to syslog"),
    spec("simple-log", &[], Flag, Honoured, "", "There is no log file to roll over"),
    spec("no-stdout-log", &[], Flag, Accepted, "", "logs go to stderr"),
    spec("new-log-timestamp", &[], Flag, Accepted, "", "log lines carry tracing's RFC 3339 timestamps"),
    spec("new-log-timestamp-format", &[], Value, Accepted, "FORMAT", "log lines carry tracing's RFC 3339 timestamps"),
    spec("log-binding", &[], Flag, Accepted, "", "Binding requests are counted (stun_binding_request), not logged"),
    spec("prometheus", &[], Flag, Honoured, "", "Metrics are always on the admin listener (--admin-addr), at /metrics"),
    spec("prometheus-port", &[], Value, Honoured, "PORT", "The port of the admin listener, which serves /metrics (--admin-addr wins) [default: 9641]"),
    spec("prometheus-address", &[], Value, Honoured, "IP", "The address of the admin listener, which serves /metrics (--admin-addr wins) [default: 0.0.0.0]"),
    spec("prometheus-ip", &[], Value, Honoured, "IP", "Wire's coturn fork's name of prometheus-address"),
    spec("prometheus-path", &[], Value, Accepted, "PATH", "metrics are served at /metrics on the admin listener"),
    spec("prometheus-username-labels", &[], Flag, Honoured, "", "The turn_traffic_* counters get a user label (the allocation's USERNAME) besides realm, as coturn's; bounded by prometheus-username-labels-max, a user without allocations is dropped after an hour"),
    spec("prometheus-username-labels-max", &[], Value, Honoured, "N", "lastcall-turn's own: with prometheus-username-labels, at most N users labelled at once; allocations of further users are counted under user=\"_overflow\" and in lastcall_turn_user_labels_overflow_total [default: 1000]"),
    refused("prometheus-tls", &[], Flag, Some("the admin listener speaks plain HTTP: put TLS in front of it")),
    refused("prometheus-cert", &[], Value, Some("the admin listener speaks plain HTTP: put TLS in front of it")),
    refused("prometheus-key", &[], Value, Some("the admin listener speaks plain HTTP: put TLS in front of it")),
    spec("cli", &[], Flag, Accepted, "", "there is no telnet CLI: the admin listener (--admin-addr) serves /metrics, /drain, /readyz"),
    spec("no-cli", &[], Flag, Honoured, "", "There is no telnet CLI"),
    spec("cli-ip", &[], Value, Accepted, "IP", "there is no telnet CLI: the admin listener (--admin-addr) serves /metrics, /drain, /readyz"),
    spec("cli-port", &[], Value, Accepted, "PORT", "there is no telnet CLI: the admin listener (--admin-addr) serves /metrics, /drain, /readyz"),
    spec("cli-password", &[], Value, Accepted, "PASSWORD", "there is no telnet CLI: the admin listener (--admin-addr) serves /metrics, /drain, /readyz"),
    spec("cli-max-output-sessions", &[], Value, Accepted, "N", "there is no telnet CLI: the admin listener (--admin-addr) serves /metrics, /drain, /readyz"),
    spec("web-admin", &[], Flag, Accepted, "", "there is no web admin: the admin listener (--admin-addr) serves /metrics, /drain, /readyz"),
    spec("web-admin-ip", &[], Value, Accepted, "IP", "there is no web admin: the admin listener (--admin-addr) serves /metrics, /drain, /readyz"),
    spec("web-admin-port", &[], Value, Accepted, "PORT", "there is no web admin: the admin listener (--admin-addr) serves /metrics, /drain, /readyz"),
    spec("web-admin-listen-on-workers", &[], Flag, Accepted, "", "there is no web admin: the admin listener (--admin-addr) serves /metrics, /drain, /readyz"),
    refused("federation-listening-ip", &[], Value, FEDERATION),
    refused("federation-listening-port", &[], Value, FEDERATION),
    refused("federation-no-dtls", &[], Flag, FEDERATION),
    refused("federation-cert", &[], Value, FEDERATION),
    refused("federation-pkey", &[], Value, FEDERATION),
    refused("federation-pkey-pwd", &[], Value, FEDERATION),
    refused("federation-remote-whitelist", &[], Multi, FEDERATION),
    refused("acme-redirect", &[], Value, Some("HTTP is not answered on the TURN ports: serve /.well-known/acme-challenge/ elsewhere (cert-manager, a web server)")),
    spec("drain-min-allocations", &[], Value, Honoured, "N", "Exit a drain when at most N allocations are left (= --drain-min-sessions) [default: 0]"),
    spec("pidfile", &[], Value, Honoured, "PATH", "Write the process id to this file; empty (`--pidfile=`, as Debian's coturn.service gives it) = no pidfile [default: none]"),
    refused("daemon", &['o'], Flag, Some("run it in the foreground under a supervisor")),
    refused("proc-user", &[], Value, Some("start it as that user (systemd User=, Kubernetes runAsUser)")),
    refused("proc-group", &[], Value, Some("start it as that group (systemd Group=, Kubernetes runAsGroup)")),
];

/// coturn's boolean values: empty = true; 0/no/false/off = false; 1-9/yes/true/on = true.
pub(crate) fn parse_bool(v: &str) -> Option<bool> {
    let first = v.chars().next();
    match first {
        None => Some(true),
        Some('0' | 'n' | 'N' | 'f' | 'F') => Some(false),
        Some('y' | 'Y' | 't' | 'T' | '1'..='9') => Some(true),
        _ => match v.to_ascii_lowercase().as_str() {
            "on" => Some(true),
            "off" => Some(false),
            _ => None,
        },
    }
}

/// The option with this long name.
pub(crate) fn find(name: &str) -> Option<&'static Spec> {
    OPTIONS.iter().find(|s| s.name == name)
}

/// The option with this short form.
pub(crate) fn find_short(c: char) -> Option<&'static Spec> {
    OPTIONS.iter().find(|s| s.shorts.contains(&c))
}

/// The options that may be given (honoured or accepted).
pub(crate) fn accepted() -> impl Iterator<Item = &'static Spec> {
    OPTIONS.iter().filter(|s| s.accepted())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_short_forms_are_unique() {
        let mut names = std::collections::BTreeSet::new();
        let mut shorts = std::collections::BTreeSet::new();
        for s in OPTIONS {
            assert!(names.insert(s.name), "{} twice", s.name);
            for c in s.shorts {
                assert!(shorts.insert(*c), "-{c} twice");
            }
            assert_eq!(
                s.accepted(),
                !s.help.is_empty(),
                "{}: help iff accepted",
                s.name
            );
        }
    }
    fn kind_word(s: &Spec) -> &'static str {
        match s.policy {
            Policy::Honoured => "honoured",
            Policy::Accepted => "accepted",
            Policy::Refused { .. } => "refused",
        }
    }

    /// docs/turn.md's option table: every row's option and kind are the code's, in order.
    #[test]
    fn the_docs_table_gives_each_options_kind() {
        let doc = include_str!("../../../docs/turn.md");
        let begin = doc
            .find("<!-- options-table: begin")
            .expect("table begin marker");
        let end = doc
            .find("<!-- options-table: end -->")
            .expect("table end marker");
        let rows: Vec<(String, String)> = doc[begin..end]
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.split(" | ").collect();
                let name = cells[0].trim_start_matches("| ").trim_matches('`');
                (name.to_string(), cells[2].trim().to_string())
            })
            .collect();
        let code: Vec<(String, String)> = OPTIONS
            .iter()
            .map(|s| (s.name.to_string(), kind_word(s).to_string()))
            .collect();
        assert_eq!(rows, code, "docs/turn.md's option table and OPTIONS differ");
    }

    /// Every option of coturn 4.6 to 4.18, and of Wire's fork and chart, has a policy
    /// (`version` is clap's own flag).
    #[test]
    fn every_coturn_option_has_a_policy() {
        let names_of = |list: &'static str| -> Vec<&'static str> {
            list.lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .filter_map(|l| l.split_whitespace().next())
                .collect()
        };
        let upstream = names_of(include_str!("../tests/data/coturn-options.txt"));
        let fork = names_of(include_str!("../tests/data/wireapp-coturn-options.txt"));
        assert!(upstream.len() > 140, "{}", upstream.len());
        assert!(fork.len() >= 12, "{}", fork.len());
        let names: Vec<&str> = upstream.into_iter().chain(fork).collect();
        let missing: Vec<&&str> = names
            .iter()
            .filter(|n| **n != "version" && find(n).is_none())
            .collect();
        assert!(missing.is_empty(), "no policy for {missing:?}");
        // And nothing here that coturn does not have, but our own.
        let ours = [
            "no-auth-acknowledge-open-relay",
            "drain-idle-timeout",
            "nonce-secret",
            "nonce-secret-file",
            "kernel-relay",
            "external-ip-file",
            "userdb-cache-ttl",
            "no-cert-watch",
            "prometheus-username-labels-max",
        ];
        let extra: Vec<&str> = OPTIONS
            .iter()
            .map(|s| s.name)
            .filter(|n| !names.contains(n) && !ours.contains(n))
            .collect();
        assert!(extra.is_empty(), "not coturn options: {extra:?}");
    }

    /// docs/coming-from-coturn.md's table of coturn's options, as this table makes it (never
    /// a hand copy): `LASTCALL_UPDATE_DOCS=1 cargo test -p lastcall-turn --lib options` writes
    /// it when the table changed.
    #[test]
    fn coming_from_coturn_lists_every_option_from_this_table() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/coming-from-coturn.md"
        );
        let doc = std::fs::read_to_string(path).expect("docs/coming-from-coturn.md");
        let (begin, end) = ("<!-- coturn-options: begin", "<!-- coturn-options: end -->");
        let start = doc.find(begin).expect("begin marker");
        let start = start + doc[start..].find('\n').expect("marker line") + 1;
        let stop = doc.find(end).expect("end marker");
        let want = coturn_options_table();
        if doc[start..stop] != want && std::env::var_os("LASTCALL_UPDATE_DOCS").is_some() {
            let updated = format!("{}{want}{}", &doc[..start], &doc[stop..]);
            std::fs::write(path, updated).expect("write the doc");
            return;
        }
        assert!(
            doc[start..stop] == want,
            "docs/coming-from-coturn.md's option table is not the code's: run LASTCALL_UPDATE_DOCS=1 cargo test -p lastcall-turn --lib options"
        );
    }

    /// Every coturn option (ours left out), what it does here.
    fn coturn_options_table() -> String {
        let ours = [
            "no-auth-acknowledge-open-relay",
            "drain-idle-timeout",
            "nonce-secret",
            "nonce-secret-file",
            "kernel-relay",
            "external-ip-file",
        ];
        let mut out = String::from("| coturn option | in lastcall-turn |\n|---|---|\n");
        for s in OPTIONS.iter().filter(|s| !ours.contains(&s.name)) {
            let what = match s.policy {
                Policy::Honoured => format!("works: {}", s.help),
                Policy::Accepted => format!("accepted with a start-up warning: {}", s.help),
                Policy::Refused { hint } => {
                    format!("refused (exit 64): {}", hint.unwrap_or_default())
                }
            };
            out.push_str(&format!(
                "| `{}` | {} |\n",
                s.name,
                what.replace('|', "\\|")
            ));
        }
        out
    }

    /// A refused option says what to do; an accepted one what we do instead.
    #[test]
    fn refused_options_say_what_to_do_and_accepted_what_we_do_instead() {
        for s in OPTIONS {
            match s.policy {
                Policy::Refused { hint } => {
                    assert!(hint.is_some_and(|h| h.len() > 10), "{}: no hint", s.name);
                }
                Policy::Accepted => assert!(s.help.len() > 10, "{}", s.name),
                Policy::Honoured => {}
            }
        }
    }
}
