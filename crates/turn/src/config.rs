//! Configuration: coturn's option names as `--flags` and in a `-c turnserver.conf` file,
//! plus lastcall's termination and log options, parsed into a typed [`TurnConfig`] from
//! which the protocol core's configuration is derived. Every problem is collected and
//! reported at once (with the option, and the file and line it came from), before any port
//! is bound.
//!
//! Precedence is coturn's: the file is read first, then the command line; a single-valued
//! option given in both takes the command line's value, a repeatable one gets both lists
//! (the file's first). Without `-c` no file is read (coturn would read
//! `/etc/turnserver.conf`; `-n` is accepted and means the same as not giving `-c`).
//! What each coturn option does is in the table of [`crate::options`].

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use lastcall::{Problem, Problems, Source};

use crate::options::{self, parse_bool, Kind, Spec};
use crate::sources::{parse_file, prescan, RawOptions};
use crate::tls::Certs;

pub use lastcall_turn_proto::{DefaultFamily, ExternalIp, IpRange, Service, UserKey};

/// What parsing the command line came to.
#[derive(Debug)]
pub enum Parsed {
    /// Run with this configuration.
    Run(Box<Settings>),
    /// Print this (help, version) to stdout and exit 0.
    Print(String),
}

/// Everything `main` needs.
#[derive(Debug)]
pub struct Settings {
    /// The TURN server's own settings.
    pub turn: TurnConfig,
    /// The certificate and key of [`TurnConfig::tls`], loaded (they are configuration too:
    /// a bad one is a problem reported with the others).
    pub certs: Option<Arc<Certs>>,
    /// The termination options (`--drain-timeout`, ...).
    pub term: lastcall::TerminationConfig,
    /// Log format and level.
    pub log: lastcall::LogArgs,
    /// Options accepted with a caveat, to log once logging is up.
    pub warnings: Vec<Problem>,
}

/// The termination defaults of a TURN server, whose sessions are calls (see docs/turn.md):
/// 5 s of Announcing (endpoint removal), a 1 h deadline, the admin listener on coturn's
/// Prometheus port.
pub fn termination_defaults() -> lastcall::Defaults {
    lastcall::Defaults {
        shutdown_delay: Duration::from_secs(5),
        drain_timeout: Duration::from_secs(3600),
        drain_min_sessions: 0,
        admin_addr: Some(SocketAddr::from(([0, 0, 0, 0], 9641))),
    }
}

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

/// The TLS listener's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain (coturn's `cert`).
    pub cert: PathBuf,
    /// PEM private key (coturn's `pkey`).
    pub pkey: PathBuf,
    /// TLS 1.3 only (coturn's `no-tlsv1_2`).
    pub tls13_only: bool,
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
}

impl AuthMode {
    /// Whether TURN REST API credentials are accepted.
    pub fn uses_rest_api(&self) -> bool {
        matches!(self, AuthMode::RestApi { .. })
    }

    /// The TURN REST API secrets (none for static users only).
    pub fn rest_secrets(&self) -> &[String] {
        match self {
            AuthMode::RestApi { secrets, .. } => secrets,
            AuthMode::StaticUsers(_) | AuthMode::Open => &[],
        }
    }

    /// The static users.
    pub fn users(&self) -> &[(String, UserKey)] {
        match self {
            AuthMode::RestApi { users, .. } | AuthMode::StaticUsers(users) => users,
            AuthMode::Open => &[],
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
            AuthMode::Open => f.write_str("Open"),
        }
    }
}

/// `--drain-idle-timeout` when not given: RFC 7675 consent freshness declares a WebRTC path
/// dead after 30 s, and a live one sends consent checks every few seconds.
const DEFAULT_DRAIN_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The most `relay-threads` accepted.
pub const MAX_RELAY_THREADS: usize = 1024;

/// coturn's `unauthorized-ratelimit-rps` default, when its `unauthorized-ratelimit` is given.
const COTURN_UNAUTHORIZED_RPS: u32 = 10;

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
        s.auth.allow_anonymous = self.auth == AuthMode::Open;
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

const ABOUT: &str = "TURN/STUN relay that reads coturn's configuration (-c turnserver.conf, \
or the same names as --flags) and drains without cutting a call (see docs/turn.md)";

/// The clap command: coturn's options, lastcall's termination and log options, `-c`, `-n`.
pub fn command() -> Command {
    let mut cmd = Command::new("lastcall-turn")
        .about(
            "TURN/STUN relay that reads coturn's configuration and drains without cutting a call",
        )
        .version(env!("CARGO_PKG_VERSION"))
        .disable_version_flag(true)
        .arg(
            Arg::new("version")
                .long("version")
                .action(ArgAction::Version)
                .help("Print version"),
        )
        .arg(
            Arg::new("config")
                .short('c')
                .value_name("FILE")
                .help("Read this coturn turnserver.conf (without -c no file is read)"),
        )
        .arg(
            Arg::new("no-config")
                .short('n')
                .action(ArgAction::SetTrue)
                .help("No configuration file (accepted for coturn compatibility; the default)"),
        );
    cmd = cmd.next_help_heading("coturn options (the same names work in the -c file)");
    for s in options::accepted() {
        cmd = cmd.arg(clap_arg(s));
    }
    let cmd = lastcall::TerminationArgs::augment_args(cmd);
    let cmd = lastcall::LogArgs::augment_args(cmd);
    // After flattening: the flattened structs' doc comments would otherwise be the about.
    lastcall::TerminationArgs::augment_help(cmd, &termination_defaults()).about(ABOUT)
}

fn clap_arg(s: &'static Spec) -> Arg {
    let mut a = Arg::new(s.name).long(s.name).help(s.help);
    if let Some(c) = s.shorts.first() {
        a = a.short(*c);
    }
    match s.kind {
        Kind::Flag | Kind::OptionalValue => a
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value("")
            .action(ArgAction::Append)
            .value_name(if s.value_name.is_empty() {
                "BOOL"
            } else {
                s.value_name
            }),
        Kind::Value | Kind::Multi => a
            .num_args(1)
            .action(ArgAction::Append)
            .value_name(s.value_name),
    }
}

/// Parses a command line (the first item is the program name) and the file it names.
pub fn parse<I, T>(args: I) -> Result<Parsed, Problems>
where
    I: IntoIterator<Item = T>,
    T: Into<String>,
{
    let args: Vec<String> = args.into_iter().map(Into::into).collect();
    let cmd = command();
    let mut problems = Problems::new();
    let kept = prescan(&cmd, &args, &mut problems);
    let matches = match cmd.try_get_matches_from(kept) {
        Ok(m) => m,
        Err(e) => {
            use clap::error::ErrorKind;
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    Ok(Parsed::Print(e.render().to_string()))
                }
                _ => {
                    problems.push(Problem::new("", e.render().to_string().trim()));
                    Err(problems)
                }
            };
        }
    };
    let mut raw = RawOptions::default();
    let config_file = matches.get_one::<String>("config").map(PathBuf::from);
    if let Some(path) = &config_file {
        match std::fs::read_to_string(path) {
            Ok(text) => parse_file(path, &text, &mut raw, &mut problems),
            Err(e) => {
                let source = Source::File {
                    path: Some(path.clone()),
                    line: None,
                };
                problems.push(Problem::new("", format!("cannot read: {e}")).at(source));
            }
        }
    }
    raw.add_flags(&matches);
    let mut warnings = Vec::new();
    let typed = typed(&raw, config_file, &mut problems, &mut warnings);
    let certs = typed.turn.tls.as_ref().and_then(|files| {
        let source = raw.last("cert").map_or(Source::Flag, |(_, s)| s.clone());
        match Certs::load(&files.cert, &files.pkey, files.tls13_only) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                problems.push(Problem::new("cert/pkey", e.to_string()).at(source));
                None
            }
        }
    });
    let term = termination(&matches, &typed, &mut problems);
    let log = log_args(&matches, typed.log_level, &mut problems);
    match (term, log) {
        (Some(term), Some(log)) if problems.is_empty() => Ok(Parsed::Run(Box::new(Settings {
            turn: typed.turn,
            certs,
            term,
            log,
            warnings,
        }))),
        _ => Err(problems),
    }
}

/// The termination options; coturn's `drain-min-allocations` is the default of
/// `--drain-min-sessions`.
fn termination(
    matches: &ArgMatches,
    typed: &Typed,
    problems: &mut Problems,
) -> Option<lastcall::TerminationConfig> {
    let drain_min_allocations = typed.drain_min_allocations;
    let mut args = match lastcall::TerminationArgs::from_arg_matches(matches) {
        Ok(a) => a,
        Err(e) => {
            problems.push(Problem::new("", e.to_string().trim()));
            return None;
        }
    };
    let explicit = matches!(
        matches.value_source("drain_min_sessions"),
        Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
    );
    if let (false, Some(n)) = (explicit, drain_min_allocations) {
        args.drain_min_sessions = Some(n.to_string());
    }
    let admin_explicit = matches!(
        matches.value_source("admin_addr"),
        Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
    );
    if !admin_explicit && (typed.prometheus_ip.is_some() || typed.prometheus_port.is_some()) {
        let default = termination_defaults()
            .admin_addr
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 9641)));
        let addr = SocketAddr::new(
            typed.prometheus_ip.unwrap_or(default.ip()),
            typed.prometheus_port.unwrap_or(default.port()),
        );
        args.admin_addr = Some(addr.to_string());
    }
    match args.validate(&termination_defaults()) {
        Ok(mut t) => {
            // coturn's SIGUSR1 (4.6.3 and later): refuse new allocations at once.
            t.sigusr1_refuses_at_once = true;
            Some(t)
        }
        Err(p) => {
            problems.extend(p);
            None
        }
    }
}

/// The log options; coturn's `verbose`/`Verbose` set the level unless `--log-level` is
/// given.
fn log_args(
    matches: &ArgMatches,
    level: Option<&'static str>,
    problems: &mut Problems,
) -> Option<lastcall::LogArgs> {
    let mut log = match lastcall::LogArgs::from_arg_matches(matches) {
        Ok(l) => l,
        Err(e) => {
            problems.push(Problem::new("", e.to_string().trim()));
            return None;
        }
    };
    let explicit_level = matches!(
        matches.value_source("log_level"),
        Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
    );
    if let (false, Some(level)) = (explicit_level, level) {
        log.log_level = level.to_string();
    }
    Some(log)
}

/// Options whose values must never be printed in a problem.
fn shown_value(name: &str, value: &str) -> String {
    match name {
        "static-auth-secret" | "nonce-secret" | "stateless-nonce-secret" if !value.is_empty() => {
            "(secret)".to_string()
        }
        // The user's name helps; the password or key after the colon never.
        "user" => match value.split_once(':') {
            Some((user, _)) => format!("{user}:(secret)"),
            None => value.to_string(),
        },
        _ => value.to_string(),
    }
}

/// Reads typed values out of the raw options, reporting every bad one.
struct Checker<'a> {
    raw: &'a RawOptions,
    problems: &'a mut Problems,
    /// Flags whose values were checked (each is reported once).
    flags_checked: std::collections::BTreeSet<&'static str>,
}

impl Checker<'_> {
    /// `name=value: why`, at the value's source.
    fn bad(&mut self, source: &Source, name: &str, value: &str, why: &str) {
        let key = format!("{name}={}", shown_value(name, value));
        self.problems
            .push(Problem::new(key, why).at(source.clone()));
    }

    fn flag(&mut self, name: &'static str) -> bool {
        let mut out = false;
        let report = self.flags_checked.insert(name);
        for (v, source) in self.raw.all(name) {
            match parse_bool(v) {
                Some(b) => out = b,
                None if !report => {}
                None => self.bad(
                    source,
                    name,
                    v,
                    "not a boolean (on/off, yes/no, 1/0, true/false)",
                ),
            }
        }
        out
    }

    fn value<T: std::str::FromStr>(&mut self, name: &str, what: &str) -> Option<T> {
        let (v, source) = self.raw.last(name)?;
        match v.parse() {
            Ok(x) => Some(x),
            Err(_) => {
                self.bad(source, name, v, &format!("not {what}"));
                None
            }
        }
    }

    fn each<T>(&mut self, name: &str, f: impl Fn(&str) -> Result<T, String>) -> Vec<T> {
        let mut out = Vec::new();
        for (v, source) in self.raw.all(name) {
            match f(v) {
                Ok(x) => out.push(x),
                Err(why) => self.bad(source, name, v, &why),
            }
        }
        out
    }

    /// A problem about option `name` as a whole, at its last value's source.
    fn require(&mut self, name: &str, message: &str) {
        let source = self.raw.last(name).map_or(Source::Flag, |(_, s)| s.clone());
        self.problems.push(Problem::new("", message).at(source));
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

fn parse_range(v: &str) -> Result<IpRange, String> {
    v.parse::<IpRange>()
        .map_err(|_| "expected IP, IP-IP or IP/PREFIX of one family".to_string())
}

fn parse_ip(v: &str) -> Result<IpAddr, String> {
    let v = v.trim_start_matches('[').trim_end_matches(']');
    v.parse().map_err(|_| "not an IP address".to_string())
}

/// The typed configuration, and what is read from coturn's options but used elsewhere.
struct Typed {
    turn: TurnConfig,
    /// coturn's `drain-min-allocations` (the default of `--drain-min-sessions`).
    drain_min_allocations: Option<u64>,
    /// From `verbose`, `Verbose`, `log-min-level`: the default of `--log-level`.
    log_level: Option<&'static str>,
    /// coturn's `prometheus-address` / `prometheus-port`: the default of `--admin-addr`.
    prometheus_ip: Option<IpAddr>,
    prometheus_port: Option<u16>,
}

fn parse_alternate(v: &str) -> Result<SocketAddr, String> {
    v.parse::<SocketAddr>()
        .or_else(|_| v.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 3478)))
        .map_err(|_| "expected IP:PORT".to_string())
}

fn typed(
    raw: &RawOptions,
    config_file: Option<PathBuf>,
    problems: &mut Problems,
    warnings: &mut Vec<Problem>,
) -> Typed {
    let mut c = Checker {
        raw,
        problems,
        flags_checked: std::collections::BTreeSet::new(),
    };
    let listening_port = c.value("listening-port", "a port number").unwrap_or(3478);
    let tls_listening_port = c
        .value("tls-listening-port", "a port number")
        .unwrap_or(5349);
    let listening_ips = c.each("listening-ip", parse_ip);
    let relay_ips = c.each("relay-ip", parse_ip);
    let external_ips = c.each("external-ip", |v| {
        v.parse::<ExternalIp>()
            .map_err(|_| "expected PUBLIC-IP[/PRIVATE-IP] of one family".to_string())
    });
    let min_port = c.value("min-port", "a port number").unwrap_or(49152u16);
    let max_port = c.value("max-port", "a port number").unwrap_or(65535u16);
    let realm = c.raw.last("realm").map(|(v, _)| v.clone());
    let use_auth_secret = c.flag("use-auth-secret");
    let static_auth_secrets = c.each("static-auth-secret", |v| {
        if v.is_empty() {
            Err("empty secret".into())
        } else {
            Ok(v.to_string())
        }
    });
    let users = c.each("user", |v| {
        lastcall_turn_proto::parse_coturn_user(v).map_err(|e| e.to_string())
    });
    let denied_peer_ips = c.each("denied-peer-ip", parse_range);
    let allowed_peer_ips = c.each("allowed-peer-ip", parse_range);
    let allow_loopback_peers = c.flag("allow-loopback-peers");
    let kernel_relay = c.flag("kernel-relay");
    let user_quota = c.value("user-quota", "a number").unwrap_or(0);
    let total_quota = c.value("total-quota", "a number").unwrap_or(0);
    let max_allocate_lifetime = c
        .value("max-allocate-lifetime", "a number of seconds")
        .unwrap_or(3600);
    let drain_idle_timeout = match c.raw.last("drain-idle-timeout") {
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
    let nonce_secret = nonce_secret(&mut c);
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
    let cert = c.raw.last("cert").map(|(v, _)| PathBuf::from(v));
    let pkey = c.raw.last("pkey").map(|(v, _)| PathBuf::from(v));
    let no_tls = c.flag("no-tls");
    let no_udp = c.flag("no-udp");
    let no_tcp = c.flag("no-tcp");
    let tls13_only = c.flag("no-tlsv1_2");
    // Every flag's value is checked, those that change nothing too.
    for spec in options::OPTIONS {
        if spec.accepted() && spec.kind == Kind::Flag {
            c.flag(spec.name);
        }
    }
    // An accepted option, given, gets one start-up warning: what lastcall-turn does instead.
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
    let drain_min_allocations = c.value("drain-min-allocations", "a number");
    let relay_threads = c
        .value::<usize>("relay-threads", "a number of threads")
        .unwrap_or(0);
    if relay_threads > MAX_RELAY_THREADS {
        c.require(
            "relay-threads",
            &format!("relay-threads={relay_threads}: at most {MAX_RELAY_THREADS}"),
        );
    }
    let pidfile = c.raw.last("pidfile").map(|(v, _)| PathBuf::from(v));
    let log_min_level = match c.raw.last("log-min-level") {
        None => None,
        Some((v, source)) => match v.to_ascii_lowercase().as_str() {
            "debug" => Some("debug"),
            "info" => Some("info"),
            "warning" | "warn" => Some("warn"),
            "error" => Some("error"),
            _ => {
                let source = source.clone();
                c.bad(
                    &source,
                    "log-min-level",
                    &v.clone(),
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
    let alternate_servers = c.each("alternate-server", parse_alternate);
    let transport_alternates = TransportAlternates {
        udp: c.each("udp-alternate-server", parse_alternate),
        tcp: c.each("tcp-alternate-server", parse_alternate),
        tls: c.each("tls-alternate-server", parse_alternate),
    };
    let rest_separator = match c.raw.last("rest-api-separator") {
        None => ':',
        Some((v, source)) => {
            let mut chars = v.chars();
            match (chars.next(), chars.next()) {
                (Some(ch), None) => ch,
                _ => {
                    let source = source.clone();
                    c.bad(
                        &source,
                        "rest-api-separator",
                        &v.clone(),
                        "expected one character",
                    );
                    ':'
                }
            }
        }
    };
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
    let keep_family = c.flag("keep-address-family");
    let default_family = match c.raw.last("allocation-default-address-family") {
        None if keep_family => DefaultFamily::Keep,
        None => DefaultFamily::Ipv4,
        Some((v, source)) => match v.to_ascii_lowercase().as_str() {
            "ipv4" => DefaultFamily::Ipv4,
            "ipv6" => DefaultFamily::Ipv6,
            "keep" => DefaultFamily::Keep,
            _ => {
                let source = source.clone();
                c.bad(
                    &source,
                    "allocation-default-address-family",
                    &v.clone(),
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
    let secure_stun = c.flag("secure-stun");
    let check_origin = c.flag("check-origin-consistency");
    let reason_phrases = c.flag("include-reason-string");
    let fingerprint = c.flag("fingerprint");
    let software_attribute =
        c.flag("software-attribute") && !c.flag("no-software-attribute") && !c.flag("prod");
    let prometheus_ip = c.value::<IpAddr>("prometheus-address", "an IP address");
    let prometheus_port = c.value::<u16>("prometheus-port", "a port number");
    let no_auth = c.flag("no-auth");
    let open_relay_acknowledged = c.flag("no-auth-acknowledge-open-relay");
    if no_auth && !open_relay_acknowledged {
        c.require(
            "no-auth",
            "no-auth makes an open relay (anyone may relay through this server to any peer the peer policy allows): give no-auth-acknowledge-open-relay too if that is meant, or use use-auth-secret / user",
        );
    }
    if no_auth && (use_auth_secret || !users.is_empty()) {
        c.require(
            "no-auth",
            "no-auth and credentials (use-auth-secret, user) together: give one or the other",
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
    if !no_auth && !use_auth_secret && users.is_empty() {
        c.require(
            "use-auth-secret",
            "no credentials: give use-auth-secret with static-auth-secret, or user=NAME:PASSWORD (or, for an open relay, no-auth with no-auth-acknowledge-open-relay)",
        );
    }
    if use_auth_secret && static_auth_secrets.is_empty() {
        c.require(
            "use-auth-secret",
            "use-auth-secret needs at least one static-auth-secret",
        );
    }
    if !static_auth_secrets.is_empty() && !use_auth_secret {
        c.require(
            "static-auth-secret",
            "static-auth-secret is given but use-auth-secret is not",
        );
    }
    let realm = match realm {
        Some(r) if !r.is_empty() => r,
        _ => {
            c.require("realm", "realm is required (e.g. --realm=example.org)");
            String::new()
        }
    };
    if !no_tls && cert.is_some() != pkey.is_some() {
        c.require("cert", "cert and pkey go together: give both or neither");
    }
    let cert_given = cert.is_some();
    let tls = match (cert, pkey) {
        (Some(cert), Some(pkey)) if !no_tls => Some(TlsFiles {
            cert,
            pkey,
            tls13_only,
        }),
        _ => None,
    };
    if no_udp && no_tcp && (no_tls || !cert_given) {
        c.require("no-udp", "no-udp, no-tcp and no TLS: nothing to listen on");
    }
    for e in &external_ips {
        if let Some(p) = e.private {
            if !relay_ips.is_empty() && !relay_ips.contains(&p) {
                c.require(
                    "external-ip",
                    &format!("external-ip private address {p} is not a relay-ip"),
                );
            }
        }
    }
    for ip in &relay_ips {
        if ip.is_unspecified() {
            c.require(
                "relay-ip",
                &format!("relay-ip {ip} is a wildcard: give the host's address"),
            );
        }
    }
    if allow_loopback_peers {
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
    let auth = if no_auth {
        AuthMode::Open
    } else if use_auth_secret {
        AuthMode::RestApi {
            secrets: static_auth_secrets,
            users,
        }
    } else {
        AuthMode::StaticUsers(users)
    };
    Typed {
        turn: TurnConfig {
            config_file,
            realm,
            listening_ips,
            listening_port,
            tls_listening_port,
            udp: !no_udp,
            tcp: !no_tcp,
            tls,
            relay_ips,
            external_ips,
            min_port,
            max_port,
            relay_threads,
            kernel_relay,
            auth,
            denied_peer_ips,
            allowed_peer_ips,
            allow_loopback_peers,
            user_quota,
            total_quota,
            max_allocate_lifetime,
            stale_nonce,
            drain_idle_timeout,
            nonce_secret,
            unauthorized_rps,
            pidfile,
            alternate_servers,
            transport_alternates,
            rest_separator,
            max_bps,
            bps_capacity,
            channel_lifetime,
            permission_lifetime,
            default_family,
            service,
            secure_stun,
            check_origin,
            reason_phrases,
            fingerprint,
            software_attribute,
        },
        drain_min_allocations,
        log_level,
        prometheus_ip,
        prometheus_port,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const BASE: &[&str] = &[
        "lastcall-turn",
        "-n",
        "--realm=example.org",
        "--use-auth-secret",
        "--static-auth-secret=s3cret",
    ];

    fn run(extra: &[&str]) -> Result<Settings, Problems> {
        let args: Vec<&str> = BASE.iter().chain(extra).copied().collect();
        match parse(args)? {
            Parsed::Run(s) => Ok(*s),
            Parsed::Print(p) => panic!("unexpected print: {p}"),
        }
    }

    fn errors(extra: &[&str]) -> Vec<String> {
        match run(extra) {
            Ok(s) => panic!("expected errors, got {:?}", s.turn),
            Err(e) => e.iter().map(ToString::to_string).collect(),
        }
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(text.as_bytes()).expect("write");
        f
    }

    #[test]
    fn the_documented_startup_command_parses() {
        let s = run(&[
            "--listening-ip=127.0.0.1",
            "--listening-port=34780",
            "--relay-ip=127.0.0.1",
            "--allow-loopback-peers",
            "--admin-addr=127.0.0.1:9999",
        ])
        .expect("valid");
        assert_eq!(s.turn.listening_port, 34780);
        assert_eq!(s.turn.listening_ips, vec![IpAddr::from([127, 0, 0, 1])]);
        assert_eq!(s.turn.relay_ips, vec![IpAddr::from([127, 0, 0, 1])]);
        assert!(s.turn.allow_loopback_peers);
        assert!(s.turn.auth.uses_rest_api());
        assert_eq!(s.turn.auth.rest_secrets(), vec!["s3cret".to_string()]);
        assert_eq!(s.term.admin_addr, Some("127.0.0.1:9999".parse().unwrap()));
        assert_eq!(s.term.drain_timeout, std::time::Duration::from_secs(3600));
    }

    #[test]
    fn space_separated_values_and_short_forms() {
        let s = run(&[
            "--listening-port",
            "4000",
            "-L",
            "127.0.0.2",
            "-E",
            "127.0.0.3",
            "-p",
            "4001",
        ])
        .expect("valid");
        assert_eq!(s.turn.listening_port, 4001, "the last value wins");
        assert_eq!(s.turn.listening_ips, vec![IpAddr::from([127, 0, 0, 2])]);
        assert_eq!(s.turn.relay_ips, vec![IpAddr::from([127, 0, 0, 3])]);
    }

    #[test]
    fn defaults() {
        let s = run(&[]).expect("valid");
        let t = &s.turn;
        assert_eq!((t.listening_port, t.tls_listening_port), (3478, 5349));
        assert_eq!((t.min_port, t.max_port), (49152, 65535));
        assert_eq!(t.max_allocate_lifetime, 3600);
        assert_eq!(t.stale_nonce, 600);
        assert_eq!(t.unauthorized_rps, 100, "on by default, unlike coturn");
        assert!(!t.allow_loopback_peers);
        assert!(!t.tls_enabled());
        assert_eq!(s.term.shutdown_delay, std::time::Duration::from_secs(5));
        assert_eq!(s.term.drain_min_sessions, 0);
    }

    #[test]
    fn unauthorized_ratelimit_like_coturn_but_on_by_default() {
        for (args, rps) in [
            (&[][..], 100),
            (&["--unauthorized-ratelimit"][..], 10),
            (&["--unauthorized-ratelimit-rps=50"][..], 50),
            (
                &["--unauthorized-ratelimit", "--unauthorized-ratelimit-rps=7"][..],
                7,
            ),
            (&["--unauthorized-ratelimit=false"][..], 0),
            (
                &[
                    "--unauthorized-ratelimit=off",
                    "--unauthorized-ratelimit-rps=50",
                ][..],
                0,
            ),
        ] {
            assert_eq!(
                run(args).expect("valid").turn.unauthorized_rps,
                rps,
                "{args:?}"
            );
        }
        assert!(run(&["--unauthorized-ratelimit-rps=many"]).is_err());
    }

    #[test]
    fn file_syntax_and_flags_override() {
        let f = file(
            "# a comment\n\
             \n\
             listening-port=3479\n\
             tls-listening-port 5350\n\
             \tmin-port = 50000\n\
             max-port=50010\n\
             realm=\"file.example\"\n\
             use-auth-secret\n\
             static-auth-secret=one\n\
             static-auth-secret=two\n\
             no-tls=false\n\
             stale-nonce\n\
             fingerprint\n\
             external-ip=203.0.113.7/10.0.0.7\n\
             relay-ip=10.0.0.7\n\
             user=alice:wonder\n\
             user=bob:0x0123456789abcdef0123456789ABCDEF\n",
        );
        let path = f.path().to_str().unwrap().to_string();
        let args = [
            "lastcall-turn",
            "-c",
            &path,
            "--listening-port=4000",
            "--static-auth-secret=three",
            "--realm=flag.example",
        ];
        let Parsed::Run(s) = parse(args).expect("valid") else {
            panic!("print")
        };
        let t = s.turn;
        assert_eq!(t.listening_port, 4000, "the flag overrides the file");
        assert_eq!(t.tls_listening_port, 5350);
        assert_eq!((t.min_port, t.max_port), (50000, 50010));
        assert_eq!(t.realm, "flag.example");
        assert_eq!(t.auth.rest_secrets(), vec!["one", "two", "three"]);
        assert!(
            t.tls.is_none(),
            "no-tls=false without cert and pkey: no TLS listener"
        );
        assert_eq!(t.stale_nonce, 600);
        assert_eq!(
            t.external_ips,
            vec![ExternalIp {
                public: IpAddr::from([203, 0, 113, 7]),
                private: Some(IpAddr::from([10, 0, 0, 7])),
            }]
        );
        let users = t.auth.users();
        assert_eq!(users.len(), 2);
        assert!(matches!(&users[0], (n, UserKey::Password(p)) if n == "alice" && p == "wonder"));
        assert!(matches!(users[1].1, UserKey::Key(k) if k[0] == 0x01 && k[15] == 0xef));
    }

    #[test]
    fn every_error_is_reported_at_once() {
        let f = file("listening-port=notaport\ndaemon\nfrobnicate=1\nuser=nocolon\n");
        let path = f.path().to_str().unwrap().to_string();
        let errs = errors(&["-c", &path, "--min-port=60000", "--max-port=50000"]);
        let all = errs.join("\n");
        assert!(all.contains(":1: listening-port=notaport"), "{all}");
        assert!(
            all.contains(":2: unsupported coturn option daemon (run it in the foreground"),
            "{all}"
        );
        assert!(all.contains(":3: unknown option frobnicate"), "{all}");
        assert!(all.contains(":4: user=nocolon"), "{all}");
        assert!(
            all.contains("min-port 60000 is above max-port 50000"),
            "{all}"
        );
        assert_eq!(errs.len(), 5, "{all}");
    }

    #[test]
    fn unsupported_and_unknown_flags_are_named_together() {
        let errs = errors(&[
            "--daemon",
            "--userdb",
            "/tmp/x.db",
            "--mobility",
            "--bogus",
            "-d",
            "eth0",
        ]);
        let all = errs.join("\n");
        assert!(all.contains("unsupported coturn option --daemon"), "{all}");
        assert!(all.contains("unsupported coturn option --userdb"), "{all}");
        assert!(
            all.contains("unsupported coturn option --mobility (RFC 8016"),
            "{all}"
        );
        assert!(all.contains("unknown option --bogus"), "{all}");
        assert!(
            all.contains("unsupported coturn option -d (--listening-device)"),
            "{all}"
        );
        assert_eq!(
            errs.len(),
            5,
            "the values of unsupported options are skipped: {all}"
        );
    }

    #[test]
    fn credentials_and_realm_are_required() {
        let errs = match parse(["lastcall-turn", "-n"]) {
            Err(e) => e,
            Ok(_) => panic!("no credentials must fail"),
        };
        let all = errs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(all.contains("no credentials"), "{all}");
        assert!(all.contains("realm is required"), "{all}");
    }

    #[test]
    fn static_user_alone_is_enough() {
        let Parsed::Run(s) =
            parse(["lastcall-turn", "--realm=r", "--lt-cred-mech", "--user=u:p"]).expect("valid")
        else {
            panic!("print")
        };
        assert!(!s.turn.auth.uses_rest_api());
        assert_eq!(s.turn.auth.users().len(), 1);
    }

    #[test]
    fn cert_needs_pkey() {
        let errs = errors(&["--cert=/x.pem"]);
        assert!(errs.join("\n").contains("cert and pkey go together"));
    }

    #[test]
    fn drain_min_allocations_feeds_drain_min_sessions() {
        assert_eq!(
            run(&["--drain-min-allocations=3"])
                .unwrap()
                .term
                .drain_min_sessions,
            3
        );
        let s = run(&["--drain-min-allocations=3", "--drain-min-sessions=1"]).unwrap();
        assert_eq!(s.term.drain_min_sessions, 1, "lastcall's own option wins");
    }

    #[test]
    fn nonce_key_from_nonce_secret_its_file_or_the_first_static_auth_secret() {
        use lastcall_turn_proto::nonce_key;
        let key = |args: &[&str]| {
            let n = run(args).unwrap().turn.core_config().nonce;
            (n.secret, n.accepted)
        };
        // run() gives static-auth-secret s3cret (see `run`): the fleet key is derived from it.
        let (derived, accepted) = key(&[]);
        assert_eq!(derived, key(&[]).0, "the same on every server");
        assert!(accepted.is_empty());
        assert_eq!(key(&["--nonce-secret=fleet"]).0, nonce_key(b"fleet"));
        assert_eq!(
            key(&["--stateless-nonce-secret=fleet"]).0,
            nonce_key(b"fleet")
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nonce");
        std::fs::write(&file, "fleet\n").unwrap();
        let arg = format!("--nonce-secret-file={}", file.display());
        assert_eq!(key(&[&arg]).0, nonce_key(b"fleet"));
        let both = errors(&["--nonce-secret=a", &arg]).join("\n");
        assert!(both.contains("not both"), "{both}");
        let missing = errors(&["--nonce-secret-file=/nonexistent/nonce"]).join("\n");
        assert!(missing.contains("cannot read it"), "{missing}");
        assert!(!missing.contains("fleet"));
    }

    #[test]
    fn drain_idle_timeout_defaults_to_30s_and_0_turns_it_off() {
        let core = |args: &[&str]| run(args).unwrap().turn.core_config().drain_idle_timeout;
        assert_eq!(core(&[]), Some(Duration::from_secs(30)));
        assert_eq!(
            core(&["--drain-idle-timeout=2m"]),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            core(&["--drain-idle-timeout=45"]),
            Some(Duration::from_secs(45))
        );
        assert_eq!(core(&["--drain-idle-timeout=0"]), None);
        let all = errors(&["--drain-idle-timeout=soon"]).join("\n");
        assert!(all.contains("drain-idle-timeout=soon"), "{all}");
    }

    #[test]
    fn termination_errors_are_collected_with_the_rest() {
        let errs = errors(&["--drain-timeout=1s", "--shutdown-delay=5s", "--min-port=0"]);
        let all = errs.join("\n");
        assert!(all.contains("--shutdown-delay"), "{all}");
        assert!(all.contains("min-port must be at least 1"), "{all}");
    }

    #[test]
    fn verbose_sets_the_log_level_unless_given() {
        assert_eq!(run(&["-v"]).unwrap().log.log_level, "debug");
        assert_eq!(
            run(&["--verbose", "--log-level=warn"])
                .unwrap()
                .log
                .log_level,
            "warn"
        );
    }

    #[test]
    fn help_and_version_print() {
        let Parsed::Print(help) = parse(["lastcall-turn", "--help"]).expect("help") else {
            panic!("help must print")
        };
        assert!(help.contains("--allow-loopback-peers"));
        assert!(help.contains("FOR TESTS ONLY"));
        assert!(help.contains("--drain-timeout"));
        assert!(matches!(
            parse(["lastcall-turn", "--version"]),
            Ok(Parsed::Print(_))
        ));
    }

    #[test]
    fn ranges() {
        let r = parse_range("10.0.0.0/8").unwrap();
        assert!(r.contains(IpAddr::from([10, 255, 1, 1])));
        assert!(!r.contains(IpAddr::from([11, 0, 0, 0])));
        let r = parse_range("192.168.0.10-192.168.0.20").unwrap();
        assert!(r.contains(IpAddr::from([192, 168, 0, 15])));
        assert!(parse_range("192.168.0.20-192.168.0.10").is_err());
        assert!(parse_range("fc00::/7")
            .unwrap()
            .contains("fdff::1".parse().unwrap()));
        assert!(parse_range("1.2.3.4-::1").is_err());
        assert!(parse_range("1.2.3.4/33").is_err());
    }

    #[test]
    fn relay_threads_flag_file_and_default() {
        assert_eq!(run(&[]).unwrap().turn.relay_threads, 0);
        let s = run(&["--relay-threads=3"]).unwrap();
        assert_eq!(s.turn.relay_threads, 3);
        assert_eq!(s.turn.udp_workers(), 3);
        assert_eq!(run(&["-m", "2"]).unwrap().turn.relay_threads, 2);
        let f = file("relay-threads=4\n");
        let path = f.path().to_str().unwrap().to_string();
        assert_eq!(run(&["-c", &path]).unwrap().turn.relay_threads, 4);
        let s = run(&["-c", &path, "--relay-threads", "5"]).unwrap();
        assert_eq!(s.turn.relay_threads, 5, "the flag overrides the file");
        let auto = run(&["--relay-threads=0"]).unwrap().turn;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(auto.udp_workers(), cpus);
    }

    #[test]
    fn relay_threads_errors_name_the_option_and_line() {
        let f = file("realm=x\nrelay-threads=many\n");
        let path = f.path().to_str().unwrap().to_string();
        let errs = errors(&["-c", &path]);
        let all = errs.join("\n");
        assert!(
            all.contains(":2: relay-threads=many: not a number of threads"),
            "{all}"
        );
        assert_eq!(errs.len(), 1, "{all}");
        let all = errors(&["--relay-threads=-1"]).join("\n");
        assert!(
            all.contains("relay-threads=-1: not a number of threads"),
            "{all}"
        );
        let all = errors(&["--relay-threads=5000"]).join("\n");
        assert!(all.contains("relay-threads=5000: at most 1024"), "{all}");
    }

    #[test]
    fn booleans_follow_coturn() {
        for (v, b) in [
            ("", true),
            ("1", true),
            ("yes", true),
            ("on", true),
            ("0", false),
            ("off", false),
            ("false", false),
        ] {
            assert_eq!(parse_bool(v), Some(b), "{v}");
        }
        assert_eq!(parse_bool("maybe"), None);
        let errs = errors(&["--no-udp=maybe"]);
        assert!(errs.join("\n").contains("not a boolean"));
    }
    #[test]
    fn no_auth_needs_its_acknowledgement_and_no_credentials() {
        let open = ["lastcall-turn", "-n", "--realm=example.org", "--no-auth"];
        let errs: Vec<String> = match parse(open) {
            Err(p) => p.iter().map(ToString::to_string).collect(),
            Ok(_) => panic!("no-auth alone must be an error"),
        };
        assert!(
            errs.join("\n").contains("no-auth-acknowledge-open-relay"),
            "{errs:?}"
        );
        let acked = [&open[..], &["--no-auth-acknowledge-open-relay"]].concat();
        let Ok(Parsed::Run(s)) = parse(acked) else {
            panic!("acknowledged no-auth runs")
        };
        assert_eq!(s.turn.auth, AuthMode::Open);
        let core = s.turn.core_config();
        assert!(!core.auth.required(), "anonymous");
        // Credentials and no-auth together: an error, not a silent choice.
        let errs = errors(&["--no-auth", "--no-auth-acknowledge-open-relay"]);
        assert!(
            errs.join("\n").contains("give one or the other"),
            "{errs:?}"
        );
        // Without no-auth a server never runs anonymously.
        assert!(run(&[]).expect("runs").turn.core_config().auth.required());
    }

    #[test]
    fn coturn_options_reach_the_core() {
        let s = run(&[
            "--max-bps=125000",
            "--bps-capacity=1000000",
            "--channel-lifetime=300",
            "--permission-lifetime=120",
            "--allocation-default-address-family=keep",
            "--stun-only",
            "--secure-stun",
            "--check-origin-consistency",
            "--include-reason-string",
            "--fingerprint",
            "--rest-api-separator=-",
            "--udp-alternate-server=192.0.2.1:3478",
            "--log-min-level=warning",
            "--prometheus-port=9700",
        ])
        .expect("runs");
        let c = s.turn.core_config();
        assert_eq!(
            (c.bandwidth.max_bps, c.bandwidth.capacity),
            (125_000, 1_000_000)
        );
        assert_eq!(c.lifetimes.channel, Duration::from_secs(300));
        assert_eq!(c.lifetimes.permission, Duration::from_secs(120));
        assert_eq!(c.default_family, DefaultFamily::Keep);
        assert_eq!(c.service, Service::StunOnly);
        assert!(c.secure_stun && c.check_origin && c.reason_phrases && c.fingerprint);
        assert_eq!(c.auth.rest_separator, '-');
        assert_eq!(s.turn.transport_alternates.udp.len(), 1);
        assert_eq!(s.log.log_level, "warn");
        assert_eq!(
            s.term.admin_addr,
            Some(SocketAddr::from(([0, 0, 0, 0], 9700)))
        );
        assert!(s.term.sigusr1_refuses_at_once);
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    }

    #[test]
    fn coturn_option_errors_name_the_option() {
        let all = errors(&[
            "--bps-capacity=1000",
            "--allocation-default-address-family=ipv5",
            "--rest-api-separator=::",
            "--stun-only",
            "--no-stun",
            "--log-min-level=loud",
        ])
        .join("\n");
        for needle in [
            "bps-capacity needs max-bps",
            "allocation-default-address-family=ipv5: expected ipv4, ipv6 or keep",
            "rest-api-separator=::: expected one character",
            "stun-only and no-stun",
            "log-min-level=loud: expected debug, info, warning or error",
        ] {
            assert!(all.contains(needle), "{needle}:\n{all}");
        }
    }

    #[test]
    fn accepted_options_warn_once_and_a_refused_flag_turned_off_is_no_error() {
        let f = file("syslog\nudp-gso\nudp-gso\ncli=0\ndtls=0\nmobility=false\n");
        let path = f.path().to_str().unwrap().to_string();
        let s = run(&["-c", &path, "--cpus=4"]).expect("runs");
        let w: Vec<String> = s.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(w.len(), 3, "{w:?}");
        for needle in [
            ":1: syslog: is accepted and changes nothing: logs go to stderr",
            ":3: udp-gso: is accepted",
        ] {
            assert!(w.iter().any(|l| l.contains(needle)), "{needle}: {w:?}");
        }
        assert!(
            w.iter().any(|l| l.starts_with("cpus: is accepted")),
            "{w:?}"
        );
    }
}
