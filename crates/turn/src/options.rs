//! The option tables: what `lastcall-turn` supports of coturn's option set, and every other
//! coturn option name (so "unsupported coturn option" and "unknown option" are told apart).

/// How an option takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A boolean: `--name`, `--name=false`; in a file `name`, `name=0`, `name off`.
    Flag,
    /// A flag whose value is optional (coturn's `stale-nonce[=SECONDS]`).
    OptionalValue,
    /// One value; the last one given wins (the command line after the file).
    Value,
    /// Repeatable; every value counts (the file's first, then the command line's).
    Multi,
}

/// One supported option.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Long name, as in coturn (`listening-port`).
    pub name: &'static str,
    /// coturn's short form, when it has one we support.
    pub short: Option<char>,
    pub kind: Kind,
    /// Value name shown in `--help`.
    pub value_name: &'static str,
    pub help: &'static str,
}

const fn spec(
    name: &'static str,
    short: Option<char>,
    kind: Kind,
    value_name: &'static str,
    help: &'static str,
) -> Spec {
    Spec {
        name,
        short,
        kind,
        value_name,
        help,
    }
}

use Kind::{Flag, Multi, OptionalValue, Value};

/// Every coturn option `lastcall-turn` accepts, plus `alternate-server` (whose meaning differs:
/// used only while draining) and `verbose`.
pub const SUPPORTED: &[Spec] = &[
    spec("listening-port", Some('p'), Value, "PORT", "UDP and TCP listening port [default: 3478]"),
    spec("tls-listening-port", None, Value, "PORT", "TLS listening port [default: 5349]"),
    spec("listening-ip", Some('L'), Multi, "IP", "Listening address (repeatable); 0.0.0.0 or :: mean every host address of that family [default: every host address]"),
    spec("relay-ip", Some('E'), Multi, "IP", "Relay address (repeatable; round-robin per address family) [default: the listening address the client used]"),
    spec("external-ip", Some('X'), Multi, "PUBLIC[/PRIVATE]", "Public address advertised for a relay address behind NAT (repeatable)"),
    spec("relay-threads", Some('m'), Value, "N", "UDP I/O threads, each with its own listening socket per address (SO_REUSEPORT) and the relay sockets of its clients; 0 = one per CPU this process may run on [default: 0]"),
    spec("min-port", None, Value, "PORT", "Lowest relay port [default: 49152]"),
    spec("max-port", None, Value, "PORT", "Highest relay port [default: 65535]"),
    spec("realm", Some('r'), Value, "REALM", "Realm for long-term credentials"),
    spec("use-auth-secret", None, Flag, "", "TURN REST API credentials (username `expiry:user`, password HMAC-SHA1 of it)"),
    spec("static-auth-secret", None, Multi, "SECRET", "Shared secret of the TURN REST API (repeatable: all are accepted, for rotation)"),
    spec("lt-cred-mech", Some('a'), Flag, "", "Long-term credential mechanism (always on; accepted for coturn compatibility)"),
    spec("user", Some('u'), Multi, "NAME:PASSWORD", "Static long-term user (repeatable); the password may be a 0x-prefixed MD5 key"),
    spec("no-tcp-relay", None, Flag, "", "No TCP relays (RFC 6062 is not implemented: always true)"),
    spec("denied-peer-ip", None, Multi, "IP[-IP]|CIDR", "Peer addresses refused (repeatable); an allowed-peer-ip range wins over it (coturn's rule)"),
    spec("allowed-peer-ip", None, Multi, "IP[-IP]|CIDR", "Peer addresses allowed although the default policy refuses them, e.g. private ranges (repeatable)"),
    spec("no-multicast-peers", None, Flag, "", "Refuse multicast peers (always on; accepted for coturn compatibility)"),
    spec("allow-loopback-peers", None, Flag, "", "Allow loopback peers. FOR TESTS ONLY: opens the host's own services to every client"),
    spec("user-quota", Some('q'), Value, "N", "Most allocations per user (0 = no limit) [default: 0]"),
    spec("total-quota", Some('Q'), Value, "N", "Most allocations in total (0 = no limit) [default: 0]"),
    spec("max-allocate-lifetime", None, Value, "SECONDS", "Longest allocation lifetime a client may ask for [default: 3600]"),
    spec("stale-nonce", None, OptionalValue, "SECONDS", "Nonce lifetime; the flag alone means 600 [default: 600]"),
    spec("cert", None, Value, "PEM", "TLS certificate chain (PEM); reloaded on SIGHUP"),
    spec("pkey", None, Value, "PEM", "TLS private key (PEM); reloaded on SIGHUP"),
    spec("no-tls", None, Flag, "", "No TLS listener"),
    spec("no-udp", None, Flag, "", "No UDP client listener"),
    spec("no-tcp", None, Flag, "", "No TCP client listener"),
    spec("no-cli", None, Flag, "", "Accepted; there is no telnet CLI"),
    spec("no-dtls", None, Flag, "", "Accepted; DTLS is not implemented"),
    spec("no-tlsv1", None, Flag, "", "Accepted; TLS 1.0 is never offered"),
    spec("no-tlsv1_1", None, Flag, "", "Accepted; TLS 1.1 is never offered"),
    spec("no-tlsv1_2", None, Flag, "", "TLS 1.3 only"),
    spec("fingerprint", Some('f'), Flag, "", "Accepted; FINGERPRINT is answered when the request carries one"),
    spec("no-software-attribute", None, Flag, "", "Accepted; SOFTWARE is never sent"),
    spec("no-rfc5780", None, Flag, "", "Accepted; RFC 5780 is not implemented"),
    spec("no-stun-backward-compatibility", None, Flag, "", "Accepted; RFC 3489 is not implemented"),
    spec("response-origin-only-with-rfc5780", None, Flag, "", "Accepted; RESPONSE-ORIGIN is never sent"),
    spec("rfc5766-channel-numbers", None, Flag, "", "Accepted; channel numbers 0x4000-0x7FFF (RFC 5766's range) are always accepted"),
    spec("prometheus", None, Flag, "", "Accepted; metrics are always on the admin listener (--admin-addr), at /metrics"),
    spec("drain-min-allocations", None, Value, "N", "Exit a drain when at most N allocations are left (= --drain-min-sessions) [default: 0]"),
    spec("log-file", Some('l'), Value, "PATH", "Accepted; logs always go to stderr (a warning is logged when this names a file)"),
    spec("simple-log", None, Flag, "", "Accepted; the log is one stream"),
    spec("no-stdout-log", None, Flag, "", "Accepted; logs go to stderr"),
    spec("pidfile", None, Value, "PATH", "Write the process id to this file"),
    spec("verbose", Some('v'), Flag, "", "Log at debug level (unless --log-level is given)"),
    spec("Verbose", Some('V'), Flag, "", "Log at trace level (unless --log-level is given)"),
    spec("alternate-server", None, Multi, "IP:PORT", "While draining, answer new Allocates with 300 Try Alternate to these (round-robin; repeatable). Unlike coturn, not used before a drain"),
];

/// Every option name of coturn (4.6.1 and the current upstream), with whether it takes a
/// value (`required_argument`), for the ones we do not support.
pub const COTURN_OTHER: &[(&str, bool)] = &[
    ("listening-device", true),
    ("alt-listening-port", true),
    ("alt-tls-listening-port", true),
    ("tcp-proxy-port", true),
    ("relay-device", true),
    ("sock-buf-size", true),
    ("no-auth", false),
    ("userdb", true),
    ("db", true),
    ("psql-userdb", true),
    ("sql-userdb", true),
    ("mysql-userdb", true),
    ("mongo-userdb", true),
    ("redis-userdb", true),
    ("redis-statsdb", true),
    ("prometheus-port", true),
    ("prometheus-address", true),
    ("prometheus-path", true),
    ("prometheus-username-labels", false),
    ("prometheus-tls", false),
    ("prometheus-cert", true),
    ("prometheus-key", true),
    ("no-auth-pings", false),
    ("no-dynamic-ip-list", false),
    ("no-dynamic-realms", false),
    ("server-name", true),
    ("oauth", false),
    ("max-bps", true),
    ("bps-capacity", true),
    ("daemon", false),
    ("software-attribute", false),
    ("check-origin-consistency", false),
    ("dtls", false),
    ("no_dtls", false),
    ("no-udp-relay", false),
    ("channel-lifetime", false),
    ("permission-lifetime", false),
    ("stun-only", false),
    ("no-stun", false),
    ("raw-public-keys", false),
    ("pkey-pwd", true),
    ("syslog", false),
    ("log-min-level", true),
    ("new-log-timestamp", false),
    ("new-log-timestamp-format", true),
    ("aux-server", true),
    ("udp-self-balance", false),
    ("tls-alternate-server", true),
    ("tcp-alternate-server", true),
    ("udp-alternate-server", true),
    ("rest-api-separator", true),
    ("max-allocate-timeout", true),
    ("cipher-list", true),
    ("secure-stun", false),
    ("CA-file", true),
    ("dh-file", true),
    ("proc-user", true),
    ("proc-group", true),
    ("mobility", false),
    ("cli", false),
    ("cli-ip", true),
    ("cli-port", true),
    ("cli-password", true),
    ("web-admin", false),
    ("web-admin-ip", true),
    ("web-admin-port", true),
    ("web-admin-listen-on-workers", false),
    ("server-relay", false),
    ("cli-max-output-sessions", true),
    ("ec-curve-name", true),
    ("dh566", false),
    ("dh1066", false),
    ("tlsv1", false),
    ("tlsv1_1", false),
    ("secret-key-file", true),
    ("keep-address-family", false),
    ("allocation-default-address-family", true),
    ("acme-redirect", true),
    ("log-binding", false),
    ("rfc5780", false),
    ("stun-backward-compatibility", false),
    ("rfc3489-compatibility", false),
    ("respond-http-unsupported", false),
    ("drop-invalid-packets", false),
    ("drop-invalid-packets-log", false),
    ("udp-recvmmsg", false),
    ("udp-recvmmsg-log", false),
    ("udp-sendmmsg-log", false),
    ("udp-gso", false),
    ("include-reason-string", false),
    ("multiplex-peer", false),
    ("multiplex-peer-port", true),
    ("multiplex-peer-max-peers", true),
    ("syslog-facility", true),
    ("cpus", true),
    ("unauthorized-ratelimit", false),
    ("unauthorized-ratelimit-rps", false),
    ("stateless-nonce", false),
    ("stateless-nonce-secret", true),
];

/// coturn's short options that map to options we do not support: (short, long name).
pub const COTURN_OTHER_SHORT: &[(char, &str)] = &[
    ('d', "listening-device"),
    ('i', "relay-device"),
    ('b', "userdb"),
    ('e', "psql-userdb"),
    ('M', "mysql-userdb"),
    ('J', "mongo-userdb"),
    ('N', "redis-userdb"),
    ('O', "redis-statsdb"),
    ('s', "max-bps"),
    ('C', "rest-api-separator"),
    ('o', "daemon"),
    ('z', "no-auth"),
    ('S', "stun-only"),
    ('K', "userdb"),
    ('A', "no-auth"),
    ('B', "bps-capacity"),
];

/// A hint printed after "unsupported coturn option X", when there is a better way.
pub fn hint(name: &str) -> Option<&'static str> {
    Some(match name {
        "prometheus-port" | "prometheus-address" | "prometheus-path" => {
            "metrics are served at /metrics on --admin-addr"
        }
        "no-auth" => "lastcall-turn always authenticates (use-auth-secret or user)",
        "tls-alternate-server" | "udp-alternate-server" | "tcp-alternate-server" => {
            "use --alternate-server (used while draining)"
        }
        "daemon" => "run it in the foreground under a supervisor",
        "syslog" => "logs go to stderr; let the platform collect them",
        "channel-lifetime" | "permission-lifetime" => "RFC 8656 lifetimes are fixed (600 s, 300 s)",
        _ => return None,
    })
}

/// The supported option with this long name.
pub fn supported(name: &str) -> Option<&'static Spec> {
    SUPPORTED.iter().find(|s| s.name == name)
}

/// Whether `name` is one of coturn's options we do not support; `Some(takes_value)` if so.
pub fn coturn_other(name: &str) -> Option<bool> {
    COTURN_OTHER
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, takes)| *takes)
}
