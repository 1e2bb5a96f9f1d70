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

//!
//! The module's parts: `types` (the typed configuration and the core's configuration
//! derived from it), `check` (typed values read out of the raw options, every bad one
//! reported), `sections` (one function per part of turnserver.conf), and here the command
//! line, the file and the termination and log options around them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use lastcall::{Problem, Problems, Source};

use crate::options::{self, Kind, Spec};
use crate::sources::{parse_file, prescan, RawOptions};
use crate::tls::Certs;

mod check;
mod sections;
#[cfg(test)]
mod tests;
mod types;
pub mod userdb;

pub use crate::tls::TlsFiles;
pub use lastcall_turn_proto::{DefaultFamily, ExternalIp, IpRange, Service, UserKey};
pub use types::{AuthMode, TransportAlternates, TurnConfig, MAX_RELAY_THREADS};

use sections::{typed, Typed};

/// What parsing the command line came to.
#[derive(Debug)]
pub enum Parsed {
    /// Run with this configuration.
    Run(Box<Settings>),
    /// `--validate`: the configuration is valid; report it and exit 0, binding nothing.
    Validated(Box<Settings>),
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
    /// coturn's `prometheus-address`/`prometheus-port` when `--admin-addr` names another
    /// address: the admin endpoints are served there too, so coturn's scrape configs and
    /// health checks keep working.
    pub prometheus_addr: Option<SocketAddr>,
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
        )
        .arg(
            Arg::new("validate")
                .long("validate")
                .action(ArgAction::SetTrue)
                .help("Check the configuration (-c FILE and the flags, certificates and files included) as start-up does, bind nothing, and exit: 0 if valid, 64 with every problem"),
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
    let certs = typed
        .turn
        .tls
        .as_ref()
        .and_then(|files| match Certs::load(files) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                let ca = files.client_ca.as_ref();
                let (name, option) = match &e {
                    crate::tls::TlsError::ClientCa { .. } => ("CA-file", "CA-file"),
                    crate::tls::TlsError::Read { path, .. } if Some(path) == ca => {
                        ("CA-file", "CA-file")
                    }
                    _ => ("cert/pkey", "cert"),
                };
                let source = raw.last(option).map_or(Source::Flag, |(_, s)| s.clone());
                problems.push(Problem::new(name, e.to_string()).at(source));
                None
            }
        });
    let term = termination(&matches, &typed, &mut problems);
    let log = log_args(&matches, typed.log_level, &mut problems);
    let prometheus_addr = term
        .as_ref()
        .and_then(|t| prometheus_addr(&matches, &typed, t.admin_addr));
    if let Some(term) = &term {
        ports_apart(&typed.turn, term.admin_addr, prometheus_addr, &mut problems);
    }
    let validate = matches.get_flag("validate");
    match (term, log) {
        (Some(term), Some(log)) if problems.is_empty() => {
            let settings = Box::new(Settings {
                turn: typed.turn,
                certs,
                term,
                log,
                warnings,
                prometheus_addr,
            });
            Ok(match validate {
                true => Parsed::Validated(settings),
                false => Parsed::Run(settings),
            })
        }
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

/// coturn's Prometheus address, when given and `--admin-addr` (explicit) names another.
fn prometheus_addr(
    matches: &ArgMatches,
    typed: &Typed,
    admin: Option<SocketAddr>,
) -> Option<SocketAddr> {
    let admin_explicit = matches!(
        matches.value_source("admin_addr"),
        Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
    );
    if !admin_explicit || (typed.prometheus_ip.is_none() && typed.prometheus_port.is_none()) {
        return None;
    }
    let default = SocketAddr::from(([0, 0, 0, 0], 9641));
    let addr = SocketAddr::new(
        typed.prometheus_ip.unwrap_or(default.ip()),
        typed.prometheus_port.unwrap_or(default.port()),
    );
    (Some(addr) != admin).then_some(addr)
}

/// The TCP ports start-up binds must not collide (a collision is exit 71 at start-up, found
/// here before any port is bound): the admin listener, coturn's Prometheus port, the TCP and
/// TLS client listeners.
fn ports_apart(
    turn: &TurnConfig,
    admin: Option<SocketAddr>,
    prometheus: Option<SocketAddr>,
    problems: &mut Problems,
) {
    let mut tcp: Vec<(&str, u16)> = Vec::new();
    if turn.tcp {
        tcp.push(("listening-port", turn.listening_port));
    }
    if turn.tls.is_some() {
        tcp.push(("tls-listening-port", turn.tls_listening_port));
    }
    for (what, addr) in [("--admin-addr", admin), ("prometheus-port", prometheus)] {
        let Some(addr) = addr else { continue };
        for (name, port) in &tcp {
            let overlaps = addr.ip().is_unspecified()
                || turn.listening_ips.is_empty()
                || turn
                    .listening_ips
                    .iter()
                    .any(|ip| ip.is_unspecified() || *ip == addr.ip());
            if addr.port() == *port && overlaps {
                problems.push(Problem::new(
                    what,
                    format!("{addr} is the {name} ({port}) too: give them different ports"),
                ));
            }
        }
    }
    if let (Some(a), Some(p)) = (admin, prometheus) {
        if a.port() == p.port() && (a.ip().is_unspecified() || p.ip().is_unspecified()) {
            problems.push(Problem::new(
                "prometheus-port",
                format!("{p} overlaps --admin-addr {a}: give the same address, or another port"),
            ));
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
