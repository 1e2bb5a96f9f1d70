//! The option table: every coturn option name (4.6.1 and the current upstream) and what
//! `lastcall-turn` does with it, so that "unsupported coturn option" and "unknown option" are
//! told apart and the command line, the file parser and `--help` agree.

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

impl Kind {
    /// Whether the option is followed by a value on the command line (`--name VALUE`).
    pub fn takes_value(self) -> bool {
        matches!(self, Kind::Value | Kind::Multi)
    }
}

/// What `lastcall-turn` does with an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
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
pub struct Spec {
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
    pub fn accepted(&self) -> bool {
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
use Policy::{Accepted, Honoured};

/// Every coturn option, plus `alternate-server` (whose meaning differs: used only while
/// draining) and `verbose`.
#[rustfmt::skip]
pub const OPTIONS: &[Spec] = &[
    spec("listening-port", &['p'], Value, Honoured, "PORT", "UDP and TCP listening port [default: 3478]"),
    spec("tls-listening-port", &[], Value, Honoured, "PORT", "TLS listening port [default: 5349]"),
    spec("listening-ip", &['L'], Multi, Honoured, "IP", "Listening address (repeatable); 0.0.0.0 or :: mean every host address of that family [default: every host address]"),
    spec("relay-ip", &['E'], Multi, Honoured, "IP", "Relay address (repeatable; round-robin per address family) [default: the listening address the client used]"),
    spec("external-ip", &['X'], Multi, Honoured, "PUBLIC[/PRIVATE]", "Public address advertised for a relay address behind NAT (repeatable)"),
    spec("relay-threads", &['m'], Value, Honoured, "N", "UDP I/O threads, each with its own listening socket per address (SO_REUSEPORT) and the relay sockets of its clients; 0 = one per CPU this process may run on [default: 0]"),
    spec("min-port", &[], Value, Honoured, "PORT", "Lowest relay port [default: 49152]"),
    spec("max-port", &[], Value, Honoured, "PORT", "Highest relay port [default: 65535]"),
    spec("realm", &['r'], Value, Honoured, "REALM", "Realm for long-term credentials"),
    spec("use-auth-secret", &[], Flag, Honoured, "", "TURN REST API credentials (username `expiry:user`, password HMAC-SHA1 of it)"),
    spec("static-auth-secret", &[], Multi, Honoured, "SECRET", "Shared secret of the TURN REST API (repeatable: all are accepted, for rotation)"),
    spec("lt-cred-mech", &['a'], Flag, Accepted, "", "Long-term credential mechanism (always on; accepted for coturn compatibility)"),
    spec("user", &['u'], Multi, Honoured, "NAME:PASSWORD", "Static long-term user (repeatable); the password may be a 0x-prefixed MD5 key"),
    spec("no-tcp-relay", &[], Flag, Accepted, "", "No TCP relays (RFC 6062 is not implemented: always true)"),
    spec("denied-peer-ip", &[], Multi, Honoured, "IP[-IP]|CIDR", "Peer addresses refused (repeatable); an allowed-peer-ip range wins over it (coturn's rule)"),
    spec("allowed-peer-ip", &[], Multi, Honoured, "IP[-IP]|CIDR", "Peer addresses allowed although the default policy refuses them, e.g. private ranges (repeatable)"),
    spec("no-multicast-peers", &[], Flag, Accepted, "", "Refuse multicast peers (always on; accepted for coturn compatibility)"),
    spec("allow-loopback-peers", &[], Flag, Honoured, "", "Allow loopback peers. FOR TESTS ONLY: opens the host's own services to every client"),
    spec("user-quota", &['q'], Value, Honoured, "N", "Most allocations per user (0 = no limit) [default: 0]"),
    spec("total-quota", &['Q'], Value, Honoured, "N", "Most allocations in total (0 = no limit) [default: 0]"),
    spec("max-allocate-lifetime", &[], Value, Honoured, "SECONDS", "Longest allocation lifetime a client may ask for [default: 3600]"),
    spec("stale-nonce", &[], OptionalValue, Honoured, "SECONDS", "Nonce lifetime; the flag alone means 600 [default: 600]"),
    spec("unauthorized-ratelimit", &[], Flag, Honoured, "", "Limit the challenges (401/438) and Binding answers larger than their request sent to one source IP per second over UDP: on by default at 100/s, unlike coturn; given alone, coturn's 10/s; =false turns it off"),
    spec("unauthorized-ratelimit-rps", &[], Value, Honoured, "N", "The per-source rate of unauthorized-ratelimit (0 = no limit) [default: 100]"),
    spec("cert", &[], Value, Honoured, "PEM", "TLS certificate chain (PEM); reloaded on SIGHUP"),
    spec("pkey", &[], Value, Honoured, "PEM", "TLS private key (PEM); reloaded on SIGHUP"),
    spec("no-tls", &[], Flag, Honoured, "", "No TLS listener"),
    spec("no-udp", &[], Flag, Honoured, "", "No UDP client listener"),
    spec("no-tcp", &[], Flag, Honoured, "", "No TCP client listener"),
    spec("no-cli", &[], Flag, Accepted, "", "Accepted; there is no telnet CLI"),
    spec("no-dtls", &[], Flag, Accepted, "", "Accepted; DTLS is not implemented"),
    spec("no-tlsv1", &[], Flag, Accepted, "", "Accepted; TLS 1.0 is never offered"),
    spec("no-tlsv1_1", &[], Flag, Accepted, "", "Accepted; TLS 1.1 is never offered"),
    spec("no-tlsv1_2", &[], Flag, Honoured, "", "TLS 1.3 only"),
    spec("fingerprint", &['f'], Flag, Accepted, "", "Accepted; FINGERPRINT is answered when the request carries one"),
    spec("no-software-attribute", &[], Flag, Accepted, "", "Accepted; SOFTWARE is never sent"),
    spec("no-rfc5780", &[], Flag, Accepted, "", "Accepted; RFC 5780 is not implemented"),
    spec("no-stun-backward-compatibility", &[], Flag, Accepted, "", "Accepted; RFC 3489 is not implemented"),
    spec("response-origin-only-with-rfc5780", &[], Flag, Accepted, "", "Accepted; RESPONSE-ORIGIN is never sent"),
    spec("rfc5766-channel-numbers", &[], Flag, Accepted, "", "Accepted; channel numbers 0x4000-0x7FFF (RFC 5766's range) are always accepted"),
    spec("prometheus", &[], Flag, Accepted, "", "Accepted; metrics are always on the admin listener (--admin-addr), at /metrics"),
    spec("drain-min-allocations", &[], Value, Honoured, "N", "Exit a drain when at most N allocations are left (= --drain-min-sessions) [default: 0]"),
    spec("log-file", &['l'], Value, Honoured, "PATH", "Accepted; logs always go to stderr (a warning is logged when this names a file)"),
    spec("simple-log", &[], Flag, Accepted, "", "Accepted; the log is one stream"),
    spec("no-stdout-log", &[], Flag, Accepted, "", "Accepted; logs go to stderr"),
    spec("pidfile", &[], Value, Honoured, "PATH", "Write the process id to this file"),
    spec("verbose", &['v'], Flag, Honoured, "", "Log at debug level (unless --log-level is given)"),
    spec("Verbose", &['V'], Flag, Honoured, "", "Log at trace level (unless --log-level is given)"),
    spec("alternate-server", &[], Multi, Honoured, "IP:PORT", "While draining, answer new Allocates with 300 Try Alternate to these (round-robin; repeatable). Unlike coturn, not used before a drain"),
    refused("listening-device", &['d'], Value, None),
    refused("alt-listening-port", &[], Value, None),
    refused("alt-tls-listening-port", &[], Value, None),
    refused("tcp-proxy-port", &[], Value, None),
    refused("relay-device", &['i'], Value, None),
    refused("sock-buf-size", &[], Value, None),
    refused("no-auth", &['z', 'A'], Flag, Some("lastcall-turn always authenticates (use-auth-secret or user)")),
    refused("userdb", &['b', 'K'], Value, None),
    refused("db", &[], Value, None),
    refused("psql-userdb", &['e'], Value, None),
    refused("sql-userdb", &[], Value, None),
    refused("mysql-userdb", &['M'], Value, None),
    refused("mongo-userdb", &['J'], Value, None),
    refused("redis-userdb", &['N'], Value, None),
    refused("redis-statsdb", &['O'], Value, None),
    refused("prometheus-port", &[], Value, Some("metrics are served at /metrics on --admin-addr")),
    refused("prometheus-address", &[], Value, Some("metrics are served at /metrics on --admin-addr")),
    refused("prometheus-path", &[], Value, Some("metrics are served at /metrics on --admin-addr")),
    refused("prometheus-username-labels", &[], Flag, None),
    refused("prometheus-tls", &[], Flag, None),
    refused("prometheus-cert", &[], Value, None),
    refused("prometheus-key", &[], Value, None),
    refused("no-auth-pings", &[], Flag, None),
    refused("no-dynamic-ip-list", &[], Flag, None),
    refused("no-dynamic-realms", &[], Flag, None),
    refused("server-name", &[], Value, None),
    refused("oauth", &[], Flag, None),
    refused("max-bps", &['s'], Value, None),
    refused("bps-capacity", &['B'], Value, None),
    refused("daemon", &['o'], Flag, Some("run it in the foreground under a supervisor")),
    refused("software-attribute", &[], Flag, None),
    refused("check-origin-consistency", &[], Flag, None),
    refused("dtls", &[], Flag, None),
    refused("no_dtls", &[], Flag, None),
    refused("no-udp-relay", &[], Flag, None),
    refused("channel-lifetime", &[], Flag, Some("RFC 8656 lifetimes are fixed (600 s, 300 s)")),
    refused("permission-lifetime", &[], Flag, Some("RFC 8656 lifetimes are fixed (600 s, 300 s)")),
    refused("stun-only", &['S'], Flag, None),
    refused("no-stun", &[], Flag, None),
    refused("raw-public-keys", &[], Flag, None),
    refused("pkey-pwd", &[], Value, None),
    refused("syslog", &[], Flag, Some("logs go to stderr; let the platform collect them")),
    refused("log-min-level", &[], Value, None),
    refused("new-log-timestamp", &[], Flag, None),
    refused("new-log-timestamp-format", &[], Value, None),
    refused("aux-server", &[], Value, None),
    refused("udp-self-balance", &[], Flag, None),
    refused("tls-alternate-server", &[], Value, Some("use --alternate-server (used while draining)")),
    refused("tcp-alternate-server", &[], Value, Some("use --alternate-server (used while draining)")),
    refused("udp-alternate-server", &[], Value, Some("use --alternate-server (used while draining)")),
    refused("rest-api-separator", &['C'], Value, None),
    refused("max-allocate-timeout", &[], Value, None),
    refused("cipher-list", &[], Value, None),
    refused("secure-stun", &[], Flag, None),
    refused("CA-file", &[], Value, None),
    refused("dh-file", &[], Value, None),
    refused("proc-user", &[], Value, None),
    refused("proc-group", &[], Value, None),
    refused("mobility", &[], Flag, None),
    refused("cli", &[], Flag, None),
    refused("cli-ip", &[], Value, None),
    refused("cli-port", &[], Value, None),
    refused("cli-password", &[], Value, None),
    refused("web-admin", &[], Flag, None),
    refused("web-admin-ip", &[], Value, None),
    refused("web-admin-port", &[], Value, None),
    refused("web-admin-listen-on-workers", &[], Flag, None),
    refused("server-relay", &[], Flag, None),
    refused("cli-max-output-sessions", &[], Value, None),
    refused("ec-curve-name", &[], Value, None),
    refused("dh566", &[], Flag, None),
    refused("dh1066", &[], Flag, None),
    refused("tlsv1", &[], Flag, None),
    refused("tlsv1_1", &[], Flag, None),
    refused("secret-key-file", &[], Value, None),
    refused("keep-address-family", &[], Flag, None),
    refused("allocation-default-address-family", &[], Value, None),
    refused("acme-redirect", &[], Value, None),
    refused("log-binding", &[], Flag, None),
    refused("rfc5780", &[], Flag, None),
    refused("stun-backward-compatibility", &[], Flag, None),
    refused("rfc3489-compatibility", &[], Flag, None),
    refused("respond-http-unsupported", &[], Flag, None),
    refused("drop-invalid-packets", &[], Flag, None),
    refused("drop-invalid-packets-log", &[], Flag, None),
    refused("udp-recvmmsg", &[], Flag, None),
    refused("udp-recvmmsg-log", &[], Flag, None),
    refused("udp-sendmmsg-log", &[], Flag, None),
    refused("udp-gso", &[], Flag, None),
    refused("include-reason-string", &[], Flag, None),
    refused("multiplex-peer", &[], Flag, None),
    refused("multiplex-peer-port", &[], Value, None),
    refused("multiplex-peer-max-peers", &[], Value, None),
    refused("syslog-facility", &[], Value, None),
    refused("cpus", &[], Value, None),
    refused("stateless-nonce", &[], Flag, None),
    refused("stateless-nonce-secret", &[], Value, None),
];

/// The option with this long name.
pub fn find(name: &str) -> Option<&'static Spec> {
    OPTIONS.iter().find(|s| s.name == name)
}

/// The option with this short form.
pub fn find_short(c: char) -> Option<&'static Spec> {
    OPTIONS.iter().find(|s| s.shorts.contains(&c))
}

/// The options that may be given (honoured or accepted).
pub fn accepted() -> impl Iterator<Item = &'static Spec> {
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
}
