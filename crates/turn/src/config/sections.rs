//! coturn's options read section by section into the typed configuration: each function
//! reads the options of one part of turnserver.conf (listeners, relay, credentials, nonces,
//! peers, limits, the drain, what requests get, the process), checks their combinations
//! and reports every problem through the [`Checker`]; [`typed`] puts the sections together.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use lastcall::{Problem, Problems, Source};

use super::check::{parse_alternate, parse_ip, parse_range, Checker};
use super::types::{AuthMode, TransportAlternates, TurnConfig, MAX_RELAY_THREADS};
use super::userdb::UserDbConfig;
use super::TlsFiles;
use super::{DefaultFamily, ExternalIp, IpRange, Service, UserKey};
use crate::options::{self, parse_bool, Kind};
use crate::sources::RawOptions;

/// `--drain-idle-timeout` when not given: RFC 7675 consent freshness declares a WebRTC path
/// dead after 30 s, and a live one sends consent checks every few seconds.
const DEFAULT_DRAIN_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// coturn's `unauthorized-ratelimit-rps` default, when its `unauthorized-ratelimit` is given.
const COTURN_UNAUTHORIZED_RPS: u32 = 10;

/// The typed configuration, and what is read from coturn's options but used elsewhere.
pub(super) struct Typed {
    pub(super) turn: TurnConfig,
    /// coturn's `drain-min-allocations` (the default of `--drain-min-sessions`).
    pub(super) drain_min_allocations: Option<u64>,
    /// From `verbose`, `Verbose`, `log-min-level`: the default of `--log-level`.
    pub(super) log_level: Option<&'static str>,
    /// coturn's `prometheus-address` / `prometheus-port`: the default of `--admin-addr`.
    pub(super) prometheus_ip: Option<IpAddr>,
    pub(super) prometheus_port: Option<u16>,
}

/// Every section of the raw options, typed; problems into `problems`, the start-up warnings
/// of options accepted with a caveat into `warnings`.
pub(super) fn typed(
    raw: &RawOptions,
    config_file: Option<PathBuf>,
    problems: &mut Problems,
    warnings: &mut Vec<Problem>,
) -> Typed {
    let mut c = Checker::new(raw, problems);
    let listeners = listeners(&mut c, warnings);
    let relay = relay(&mut c);
    let credentials = credentials(&mut c, warnings);
    let nonces = nonces(&mut c);
    let peers = peers(&mut c);
    let limits = limits(&mut c);
    let drain = drain(&mut c);
    let answers = answers(&mut c);
    let process = process(&mut c);
    every_flag_checked(&mut c);
    accepted_warnings(&mut c, warnings);
    if peers.allow_loopback {
        let source = c
            .raw
            .last("allow-loopback-peers")
            .map_or(Source::Flag, |(_, s)| s.clone());
        warnings.push(
            Problem::new(
                "allow-loopback-peers",
                "is on: clients can reach this host's own services (tests only)",
            )
            .at(source),
        );
    }
    Typed {
        turn: TurnConfig {
            config_file,
            realm: credentials.realm,
            listening_ips: listeners.ips,
            listening_port: listeners.port,
            tls_listening_port: listeners.tls_port,
            udp: listeners.udp,
            tcp: listeners.tcp,
            tls: listeners.tls,
            relay_ips: relay.ips,
            external_ips: relay.external_ips,
            min_port: relay.min_port,
            max_port: relay.max_port,
            relay_threads: relay.threads,
            kernel_relay: relay.kernel,
            user_labels: process.user_labels,
            auth: credentials.auth,
            denied_peer_ips: peers.denied,
            allowed_peer_ips: peers.allowed,
            allow_loopback_peers: peers.allow_loopback,
            user_quota: limits.user_quota,
            total_quota: limits.total_quota,
            max_allocate_lifetime: limits.max_allocate_lifetime,
            stale_nonce: nonces.stale_nonce,
            drain_idle_timeout: drain.idle_timeout,
            nonce_secret: nonces.secret,
            unauthorized_rps: nonces.unauthorized_rps,
            pidfile: process.pidfile,
            alternate_servers: drain.alternate_servers,
            transport_alternates: drain.transport_alternates,
            rest_separator: credentials.rest_separator,
            max_bps: limits.max_bps,
            bps_capacity: limits.bps_capacity,
            channel_lifetime: limits.channel_lifetime,
            permission_lifetime: limits.permission_lifetime,
            default_family: answers.default_family,
            service: answers.service,
            secure_stun: answers.secure_stun,
            check_origin: answers.check_origin,
            reason_phrases: answers.reason_phrases,
            fingerprint: answers.fingerprint,
            software_attribute: answers.software_attribute,
            userdb: credentials.userdb,
        },
        drain_min_allocations: drain.min_allocations,
        log_level: process.log_level,
        prometheus_ip: process.prometheus_ip,
        prometheus_port: process.prometheus_port,
    }
}

/// The client listeners: ports, addresses, which transports, the TLS files.
struct Listeners {
    port: u16,
    tls_port: u16,
    ips: Vec<IpAddr>,
    udp: bool,
    tcp: bool,
    tls: Option<TlsFiles>,
}

fn listeners(c: &mut Checker<'_>, warnings: &mut Vec<Problem>) -> Listeners {
    let port = c.value("listening-port", "a port number").unwrap_or(3478);
    let tls_port = c
        .value("tls-listening-port", "a port number")
        .unwrap_or(5349);
    let ips = c.each("listening-ip", parse_ip);
    let cert = c.raw.last("cert").map(|(v, _)| PathBuf::from(v));
    let pkey = c.raw.last("pkey").map(|(v, _)| PathBuf::from(v));
    let no_tls = c.flag("no-tls");
    let no_udp = c.flag("no-udp");
    let no_tcp = c.flag("no-tcp");
    let tls13_only = c.flag("no-tlsv1_2");
    let watch = !c.flag("no-cert-watch");
    if !no_tls && cert.is_some() != pkey.is_some() {
        c.require("cert", "cert and pkey go together: give both or neither");
    }
    let cert_given = cert.is_some();
    let client_ca = c.raw.last("CA-file").filter(|(v, _)| !v.is_empty());
    let tls = match (cert, pkey) {
        (Some(cert), Some(pkey)) if !no_tls => Some(TlsFiles {
            cert,
            pkey,
            tls13_only,
            client_ca: client_ca.map(|(v, _)| PathBuf::from(v)),
            watch,
        }),
        _ => None,
    };
    if let (None, Some((_, source))) = (&tls, client_ca) {
        // coturn reads it for its TLS and DTLS listeners only (and Wire's fork for its
        // federation, which is not implemented): wire's chart writes it with no-tls.
        warnings.push(
            Problem::new(
                "CA-file",
                "has no effect: there is no TLS listener (no-tls, or no cert and pkey) whose clients it would verify",
            )
            .at(source.clone()),
        );
    }
    if no_udp && no_tcp && (no_tls || !cert_given) {
        c.require("no-udp", "no-udp, no-tcp and no TLS: nothing to listen on");
    }
    Listeners {
        port,
        tls_port,
        ips,
        udp: !no_udp,
        tcp: !no_tcp,
        tls,
    }
}

/// The relay sockets: their addresses, the advertised ones, the port range, the threads.
struct Relay {
    ips: Vec<IpAddr>,
    external_ips: Vec<ExternalIp>,
    min_port: u16,
    max_port: u16,
    threads: usize,
    kernel: bool,
}

fn relay(c: &mut Checker<'_>) -> Relay {
    let ips = c.each("relay-ip", parse_ip);
    let mut external_ips = c.each("external-ip", |v| {
        v.parse::<ExternalIp>()
            .map_err(|_| "expected PUBLIC-IP[/PRIVATE-IP] of one family".to_string())
    });
    for ips in c.each("external-ip-file", external_ip_file) {
        external_ips.extend(ips);
    }
    let min_port = c.value("min-port", "a port number").unwrap_or(49152u16);
    let max_port = c.value("max-port", "a port number").unwrap_or(65535u16);
    let kernel = c.flag("kernel-relay");
    let threads = c
        .value::<usize>("relay-threads", "a number of threads")
        .unwrap_or(0);
    if threads > MAX_RELAY_THREADS {
        c.require(
            "relay-threads",
            &format!("relay-threads={threads}: at most {MAX_RELAY_THREADS}"),
        );
    }
    if min_port > max_port {
        c.require(
            "max-port",
            &format!("min-port {min_port} is above max-port {max_port}"),
        );
    }
    if min_port == 0 {
        c.require("min-port", "min-port must be at least 1");
    }
    for e in &external_ips {
        if let Some(p) = e.private {
            if !ips.is_empty() && !ips.contains(&p) {
                c.require(
                    "external-ip",
                    &format!("external-ip private address {p} is not a relay-ip"),
                );
            }
        }
    }
    for ip in &ips {
        if ip.is_unspecified() {
            c.require(
                "relay-ip",
                &format!("relay-ip {ip} is a wildcard: give the host's address"),
            );
        }
    }
    Relay {
        ips,
        external_ips,
        min_port,
        max_port,
        threads,
        kernel,
    }
}

/// `external-ip-file`: the external-ip values in the file (space- or line-separated, `#`
/// comments), as the chart writes it for the pod's node.
fn external_ip_file(path: &str) -> Result<Vec<ExternalIp>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!("cannot read it: {e} (the chart's turn.externalIPs has no entry for this node?)")
    })?;
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(str::split_whitespace)
        .map(|v| {
            v.parse::<ExternalIp>()
                .map_err(|_| format!("{v:?} in it: expected PUBLIC-IP[/PRIVATE-IP] of one family"))
        })
        .collect()
}

/// How clients authenticate, in which realm.
struct Credentials {
    realm: String,
    auth: AuthMode,
    rest_separator: char,
    userdb: Option<UserDbConfig>,
}

fn credentials(c: &mut Checker<'_>, warnings: &mut Vec<Problem>) -> Credentials {
    let realm = c.raw.last("realm").map(|(v, _)| v.clone());
    let use_auth_secret = c.flag("use-auth-secret");
    let zrest = c.flag("zrest");
    let static_auth_secrets = c.each("static-auth-secret", |v| {
        if v.is_empty() {
            Err("empty secret".into())
        } else {
            Ok(v.to_string())
        }
    });
    // coturn (upstream and Wire's fork): a static-auth-secret alone turns the TURN REST API
    // on (mainrelay.c sets use_auth_secret_with_timestamp for it).
    let secrets_given = c.raw.last("static-auth-secret").is_some();
    let rest_api = use_auth_secret || secrets_given;
    let users: Vec<(String, UserKey)> = c.each("user", |v| {
        lastcall_turn_proto::parse_coturn_user(v).map_err(|e| e.to_string())
    });
    let rest_separator = rest_separator(c);
    let userdb = super::userdb::read(c);
    let no_auth = c.flag("no-auth");
    let open_relay_acknowledged = c.flag("no-auth-acknowledge-open-relay");
    if no_auth && !open_relay_acknowledged {
        c.require(
            "no-auth",
            "no-auth makes an open relay (anyone may relay through this server to any peer the peer policy allows): give no-auth-acknowledge-open-relay too if that is meant, or use use-auth-secret / user",
        );
    }
    if no_auth && (rest_api || zrest || !users.is_empty() || userdb.is_some()) {
        c.require(
            "no-auth",
            "no-auth and credentials (static-auth-secret, use-auth-secret, zrest, user, a user database) together: give one or the other",
        );
    }
    if !no_auth && !rest_api && !zrest && users.is_empty() && userdb.is_none() {
        c.require(
            "use-auth-secret",
            "no credentials: give static-auth-secret (TURN REST API; zrest too for Wire's), user=NAME:PASSWORD or a user database (userdb, psql-userdb, redis-userdb) (or, for an open relay, no-auth with no-auth-acknowledge-open-relay)",
        );
    }
    if (use_auth_secret || zrest) && !secrets_given && userdb.is_none() {
        let name = if zrest { "zrest" } else { "use-auth-secret" };
        c.require(
            name,
            &format!("{name} needs at least one static-auth-secret, or a user database whose turn_secret holds them"),
        );
    }
    if zrest {
        zrest_warnings(c, use_auth_secret, !users.is_empty(), warnings);
    }
    let realm = match realm {
        Some(r) if !r.is_empty() => r,
        _ => {
            c.require("realm", "realm is required (e.g. --realm=example.org)");
            String::new()
        }
    };
    let auth = if no_auth {
        AuthMode::Open
    } else if zrest {
        AuthMode::Zrest {
            secrets: static_auth_secrets,
        }
    } else if rest_api {
        AuthMode::RestApi {
            secrets: static_auth_secrets,
            users,
        }
    } else {
        AuthMode::StaticUsers(users)
    };
    Credentials {
        realm,
        auth,
        rest_separator,
        userdb,
    }
}

/// With `zrest`, Wire's fork accepts nothing else: `use-auth-secret` and `user` are given
/// for nothing (the fork ignores them too); each gets a start-up warning.
fn zrest_warnings(
    c: &mut Checker<'_>,
    use_auth_secret: bool,
    users: bool,
    warnings: &mut Vec<Problem>,
) {
    let ignored = [
        (use_auth_secret, "use-auth-secret", "TURN REST API credentials are not accepted with zrest (Wire's fork turns them off too)"),
        (users, "user", "static users are not accepted with zrest (Wire's fork ignores them too)"),
    ];
    for (given, name, why) in ignored {
        if let (true, Some((_, source))) = (given, c.raw.last(name)) {
            warnings.push(Problem::new(name, why).at(source.clone()));
        }
    }
}

/// coturn's `rest-api-separator`: one character, `:` by default.
fn rest_separator(c: &mut Checker<'_>) -> char {
    let Some((v, source)) = c.raw.last("rest-api-separator") else {
        return ':';
    };
    let mut chars = v.chars();
    match (chars.next(), chars.next()) {
        (Some(ch), None) => ch,
        _ => {
            let (v, source) = (v.clone(), source.clone());
            c.bad(&source, "rest-api-separator", &v, "expected one character");
            ':'
        }
    }
}

/// The nonces: their key, their lifetime, and the rate of challenges per source.
struct Nonces {
    secret: Option<Vec<u8>>,
    stale_nonce: u32,
    unauthorized_rps: u32,
}

fn nonces(c: &mut Checker<'_>) -> Nonces {
    let secret = nonce_secret(c);
    let stale_nonce = match c.raw.last("stale-nonce") {
        Some((v, _)) if v.is_empty() => 600,
        Some(_) => c.value("stale-nonce", "a number of seconds").unwrap_or(600),
        None => 600,
    };
    // On by default at a generous rate; coturn's `unauthorized-ratelimit` (off by default
    // there) brings coturn's rate of 10 unless `unauthorized-ratelimit-rps` says otherwise,
    // and `unauthorized-ratelimit=false` turns it off.
    let ratelimit = c
        .raw
        .last("unauthorized-ratelimit")
        .is_some()
        .then(|| c.flag("unauthorized-ratelimit"));
    let rps = c.value::<u32>(
        "unauthorized-ratelimit-rps",
        "a number of responses per second",
    );
    let unauthorized_rps = match (ratelimit, rps) {
        (Some(false), _) => 0,
        (_, Some(rps)) => rps,
        (Some(true), None) => COTURN_UNAUTHORIZED_RPS,
        (None, None) => lastcall_turn_proto::config::UNAUTHORIZED_RPS,
    };
    Nonces {
        secret,
        stale_nonce,
        unauthorized_rps,
    }
}

/// `nonce-secret` (or coturn's `stateless-nonce-secret`), or the contents of
/// `nonce-secret-file`; one of them at most.
fn nonce_secret(c: &mut Checker<'_>) -> Option<Vec<u8>> {
    let given = c
        .raw
        .last("nonce-secret")
        .or_else(|| c.raw.last("stateless-nonce-secret"));
    let file = c.raw.last("nonce-secret-file");
    match (given, file) {
        (Some(_), Some((path, source))) => {
            let why =
                "give nonce-secret (or stateless-nonce-secret) or nonce-secret-file, not both";
            c.bad(source, "nonce-secret-file", path, why);
            None
        }
        (Some((v, source)), None) => {
            if v.is_empty() {
                c.bad(
                    source,
                    "nonce-secret",
                    v,
                    "empty: give the fleet's shared secret",
                );
                return None;
            }
            Some(v.as_bytes().to_vec())
        }
        (None, Some((path, source))) => match std::fs::read(path) {
            Ok(bytes) => {
                let text = bytes.trim_ascii_end().to_vec();
                if text.is_empty() {
                    c.bad(source, "nonce-secret-file", path, "the file is empty");
                    return None;
                }
                Some(text)
            }
            Err(e) => {
                c.bad(
                    source,
                    "nonce-secret-file",
                    path,
                    &format!("cannot read it: {e}"),
                );
                None
            }
        },
        (None, None) => None,
    }
}

/// The peer policy's configured part.
struct Peers {
    denied: Vec<IpRange>,
    allowed: Vec<IpRange>,
    allow_loopback: bool,
}

fn peers(c: &mut Checker<'_>) -> Peers {
    Peers {
        denied: c.each("denied-peer-ip", parse_range),
        allowed: c.each("allowed-peer-ip", parse_range),
        allow_loopback: c.flag("allow-loopback-peers"),
    }
}

/// Quotas, lifetimes and bandwidth.
struct Limits {
    user_quota: u32,
    total_quota: u32,
    max_allocate_lifetime: u32,
    max_bps: u64,
    bps_capacity: u64,
    channel_lifetime: u32,
    permission_lifetime: u32,
}

fn limits(c: &mut Checker<'_>) -> Limits {
    let user_quota = c.value("user-quota", "a number").unwrap_or(0);
    let total_quota = c.value("total-quota", "a number").unwrap_or(0);
    let max_allocate_lifetime = c
        .value("max-allocate-lifetime", "a number of seconds")
        .unwrap_or(3600);
    let max_bps = c
        .value::<u64>("max-bps", "a number of bytes per second")
        .unwrap_or(0);
    let bps_capacity = c
        .value::<u64>("bps-capacity", "a number of bytes per second")
        .unwrap_or(0);
    if bps_capacity > 0 && max_bps == 0 {
        c.require(
            "bps-capacity",
            "bps-capacity needs max-bps (what each allocation reserves of it), as in coturn",
        );
    }
    let channel_lifetime = c
        .value::<u32>("channel-lifetime", "a number of seconds")
        .unwrap_or(600);
    let permission_lifetime = c
        .value::<u32>("permission-lifetime", "a number of seconds")
        .unwrap_or(300);
    for (name, v) in [
        ("channel-lifetime", channel_lifetime),
        ("permission-lifetime", permission_lifetime),
    ] {
        if v == 0 {
            c.require(name, &format!("{name}=0: expected at least 1 second"));
        }
    }
    Limits {
        user_quota,
        total_quota,
        max_allocate_lifetime,
        max_bps,
        bps_capacity,
        channel_lifetime,
        permission_lifetime,
    }
}

/// What the drain does: when it ends, where new allocations are sent, idle reclaim.
struct Drain {
    idle_timeout: Duration,
    min_allocations: Option<u64>,
    alternate_servers: Vec<SocketAddr>,
    transport_alternates: TransportAlternates,
}

fn drain(c: &mut Checker<'_>) -> Drain {
    let idle_timeout = match c.raw.last("drain-idle-timeout") {
        Some((v, source)) => match lastcall::duration::parse(v) {
            Ok(d) => d,
            Err(e) => {
                let why = format!("not a duration (30s, 2m, 0 = never): {e}");
                c.bad(source, "drain-idle-timeout", v, &why);
                DEFAULT_DRAIN_IDLE_TIMEOUT
            }
        },
        None => DEFAULT_DRAIN_IDLE_TIMEOUT,
    };
    Drain {
        idle_timeout,
        min_allocations: c.value("drain-min-allocations", "a number"),
        alternate_servers: c.each("alternate-server", parse_alternate),
        transport_alternates: TransportAlternates {
            udp: c.each("udp-alternate-server", parse_alternate),
            tcp: c.each("tcp-alternate-server", parse_alternate),
            tls: c.each("tls-alternate-server", parse_alternate),
        },
    }
}

/// What requests get: the services, the default address family, the attributes sent.
struct Answers {
    default_family: DefaultFamily,
    service: Service,
    secure_stun: bool,
    check_origin: bool,
    reason_phrases: bool,
    fingerprint: bool,
    software_attribute: bool,
}

fn answers(c: &mut Checker<'_>) -> Answers {
    let keep_family = c.flag("keep-address-family");
    let default_family = match c.raw.last("allocation-default-address-family") {
        None if keep_family => DefaultFamily::Keep,
        None => DefaultFamily::Ipv4,
        Some((v, source)) => match v.to_ascii_lowercase().as_str() {
            "ipv4" => DefaultFamily::Ipv4,
            "ipv6" => DefaultFamily::Ipv6,
            "keep" => DefaultFamily::Keep,
            _ => {
                let (v, source) = (v.clone(), source.clone());
                c.bad(
                    &source,
                    "allocation-default-address-family",
                    &v,
                    "expected ipv4, ipv6 or keep",
                );
                DefaultFamily::Ipv4
            }
        },
    };
    let stun_only = c.flag("stun-only");
    let no_stun = c.flag("no-stun");
    if stun_only && no_stun {
        c.require(
            "no-stun",
            "stun-only and no-stun together answer nothing: give one",
        );
    }
    let service = match (stun_only, no_stun) {
        (true, _) => Service::StunOnly,
        (false, true) => Service::TurnOnly,
        (false, false) => Service::StunAndTurn,
    };
    Answers {
        default_family,
        service,
        secure_stun: c.flag("secure-stun"),
        check_origin: c.flag("check-origin-consistency"),
        reason_phrases: c.flag("include-reason-string"),
        fingerprint: c.flag("fingerprint"),
        software_attribute: c.flag("software-attribute")
            && !c.flag("no-software-attribute")
            && !c.flag("prod"),
    }
}

/// The process: its pidfile, its log level, coturn's Prometheus address.
struct Process {
    pidfile: Option<PathBuf>,
    log_level: Option<&'static str>,
    prometheus_ip: Option<IpAddr>,
    prometheus_port: Option<u16>,
    user_labels: Option<usize>,
}

fn process(c: &mut Checker<'_>) -> Process {
    // coturn's `--pidfile=` (Debian's coturn.service gives it): no pidfile.
    let pidfile = c
        .raw
        .last("pidfile")
        .filter(|(v, _)| !v.is_empty())
        .map(|(v, _)| PathBuf::from(v));
    let log_min_level = match c.raw.last("log-min-level") {
        None => None,
        Some((v, source)) => match v.to_ascii_lowercase().as_str() {
            "debug" => Some("debug"),
            "info" => Some("info"),
            "warning" | "warn" => Some("warn"),
            "error" => Some("error"),
            _ => {
                let (v, source) = (v.clone(), source.clone());
                c.bad(
                    &source,
                    "log-min-level",
                    &v,
                    "expected debug, info, warning or error",
                );
                None
            }
        },
    };
    let log_level = if c.flag("Verbose") {
        Some("trace")
    } else if c.flag("verbose") {
        Some("debug")
    } else {
        log_min_level
    };
    let labels = c.flag("prometheus-username-labels");
    let max = c
        .value::<usize>("prometheus-username-labels-max", "a number of users")
        .unwrap_or(crate::usertraffic::DEFAULT_MAX_USERS);
    if max == 0 {
        c.require(
            "prometheus-username-labels-max",
            "prometheus-username-labels-max=0: at least 1 (to label no user, leave prometheus-username-labels off)",
        );
    }
    Process {
        pidfile,
        log_level,
        prometheus_ip: prometheus_ip(c),
        prometheus_port: c.value::<u16>("prometheus-port", "a port number"),
        user_labels: labels.then_some(max),
    }
}

/// coturn's `prometheus-address`, or Wire's fork's name of it, `prometheus-ip`; not both.
fn prometheus_ip(c: &mut Checker<'_>) -> Option<IpAddr> {
    let address = c.value::<IpAddr>("prometheus-address", "an IP address");
    let ip = c.value::<IpAddr>("prometheus-ip", "an IP address");
    if let (Some(_), Some(_)) = (address, ip) {
        c.require(
            "prometheus-ip",
            "prometheus-ip is Wire's fork's name of prometheus-address: give one of them",
        );
    }
    address.or(ip)
}

/// Every flag's value is checked, those that change nothing too.
fn every_flag_checked(c: &mut Checker<'_>) {
    for spec in options::OPTIONS {
        if spec.accepted() && spec.kind == Kind::Flag {
            c.flag(spec.name);
        }
    }
}

/// An accepted option, given, gets one start-up warning: what lastcall-turn does instead.
fn accepted_warnings(c: &mut Checker<'_>, warnings: &mut Vec<Problem>) {
    for spec in options::OPTIONS {
        if spec.policy != options::Policy::Accepted {
            continue;
        }
        let Some((v, source)) = c.raw.last(spec.name) else {
            continue;
        };
        // A flag given as false asks for nothing.
        if spec.kind == Kind::Flag && parse_bool(v) == Some(false) {
            continue;
        }
        warnings.push(
            Problem::new(
                spec.name,
                format!("is accepted and changes nothing: {}", spec.help),
            )
            .at(source.clone()),
        );
    }
}
