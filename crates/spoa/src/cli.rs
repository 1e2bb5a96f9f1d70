//! The command line: the options (`Cli`, clap's derive) and the subcommands, read as
//! coraza-spoa users write them. Go's `flag` package takes `-config FILE`, `-config=FILE`,
//! `--config FILE`, `-validate` and `-validate=true`; clap takes long options with two
//! dashes only (and would read `-config` as `-c onfig`). Before clap sees the arguments,
//! [`go_style`] gives every single-dash word that names one of the command's long options
//! its second dash, and writes Go's boolean `-flag=true` / `-flag=false` as clap's `--flag` /
//! nothing; [`go_unknown`] finds a single-dash word that names no option, which Go refuses
//! with `flag provided but not defined: -confg` (clap would read `-confg` as `-c onfg`).
//!
//! [`listen_addr`] reads coraza-spoa's `-metrics-addr`, where Go's `:9090` means every
//! address. What the options mean once read is [`crate::config::parse`]'s business.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lastcall::{Defaults, LogArgs, TerminationArgs};
use lastcall_modsec::ModSecurity;

/// HAProxy SPOE agent running ModSecurity + OWASP CRS (drop-in for coraza-spoa).
///
/// coraza-spoa's flags are taken as Go writes them too: -config FILE, -config=FILE,
/// -validate, -metrics-addr ADDR, -autoreload, -version.
#[derive(Debug, Parser)]
#[command(name = "lastcall-spoa", version, about)]
pub(crate) struct Cli {
    /// A subcommand instead of serving.
    #[command(subcommand)]
    pub(crate) command: Option<Command>,

    /// coraza-spoa YAML configuration; without it, one application (`default`) runs the
    /// OWASP CRS at paranoia level 1
    #[arg(
        long,
        short = 'c',
        env = "LASTCALL_SPOA_CONFIG",
        value_name = "FILE",
        global = true
    )]
    pub(crate) config: Option<PathBuf>,

    /// Load the configuration and compile the rules, then exit 0 (valid) or 64 (errors)
    #[arg(long)]
    pub(crate) validate: bool,

    /// Listen here instead of the file's `bind` (host:port or unix:///path)
    #[arg(long, env = "LASTCALL_SPOA_BIND", value_name = "ADDR")]
    pub(crate) bind: Option<String>,

    /// The OWASP CRS to use: a CRS release unpacked here (crs-setup.conf or
    /// crs-setup.conf.example beside rules/); overrides the file's `crs_dir`; empty: not
    /// given [default: Debian's modsecurity-crs]
    #[arg(long, env = "LASTCALL_SPOA_CRS_DIR", value_name = "DIR", global = true)]
    pub(crate) crs_dir: Option<String>,

    /// Run rules written for CRS 4 (CRS-4-only `setvar:tx.*` tuning, coraza-spoa's
    /// `@owasp_crs/` names) on a CRS 3 tree, with a warning each, instead of refusing to
    /// start: they load there and protect less than they say
    #[arg(long, env = "LASTCALL_SPOA_ACCEPT_CRS3", global = true)]
    pub(crate) accept_crs3: bool,

    /// coraza-spoa's name for --admin-addr (/metrics, /livez, /readyz, /drain); `:PORT`
    /// listens on every address
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_addr: Option<String>,

    /// Reload when the configuration file changes, as SIGHUP does (a Kubernetes ConfigMap
    /// update included)
    #[arg(long)]
    pub(crate) autoreload: bool,

    /// coraza-spoa's Go CPU profile: accepted and ignored, with a warning
    #[arg(long, hide = true, value_name = "FILE")]
    pub(crate) cpuprofile: Option<String>,

    /// coraza-spoa's Go heap profile: accepted and ignored, with a warning
    #[arg(long, hide = true, value_name = "FILE")]
    pub(crate) memprofile: Option<String>,

    /// The termination options (`--on-sigterm`, `--drain-timeout`, ...).
    #[command(flatten)]
    pub(crate) term: TerminationArgs,

    /// `--log-level`, `--log-format`.
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

/// The subcommands.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub(crate) enum Command {
    /// Read HAProxy and SPOE configuration files and say, line by line, what differs from
    /// the fail-closed, lossless setup of docs/spoa.md and what to add (exit 0: nothing to
    /// add; 1: findings; 64: a file cannot be read)
    CheckHaproxy {
        /// haproxy.cfg, and the SPOE files (those its `filter spoe` lines name are read too)
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Print the effective configuration as YAML (the file, or the built-in application
    /// without one), each application's `directives` the SecLang text the agent compiles:
    /// what `--config` of the printed file runs
    ShowConfig,
    /// Print the SecLang text one application compiles (default: the default application),
    /// e.g. for nginx's ModSecurity module or a benchmark
    ShowRules {
        /// The application's name
        #[arg(value_name = "APP")]
        app: Option<String>,
    },
}

/// SPOA defaults. HAProxy needs `fall x inter` (2 x 1s in the documented config) after the
/// first refused health check to mark this agent DOWN, so Announcing lasts 5s; SPOE
/// evaluations take milliseconds and idle connections are closed as soon as Refusing starts,
/// so 25s to the deadline is plenty and ends inside Kubernetes' default 30s grace period.
pub(crate) fn defaults() -> Defaults {
    Defaults {
        shutdown_delay: Duration::from_secs(5),
        drain_timeout: Duration::from_secs(25),
        drain_min_sessions: 0,
        // Loopback unless told otherwise (coraza-spoa serves metrics only when asked to);
        // the charts bind the pod's address for the kubelet's probes.
        admin_addr: Some(SocketAddr::from(([127, 0, 0, 1], 9901))),
    }
}

/// `--version`'s text: ours, and the libmodsecurity this process loaded (its own version
/// string, so a newer shared library under the same binary shows as itself).
pub(crate) fn version_line() -> String {
    let engine = match ModSecurity::new() {
        Ok(engine) => format!("ModSecurity {}", engine.version()),
        Err(e) => format!("libmodsecurity failed to start: {e}"),
    };
    format!("{} (engine: {engine})", env!("CARGO_PKG_VERSION"))
}

/// A long option of the command: its name, and whether it takes a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LongOption {
    /// The name, without dashes.
    pub(crate) name: String,
    /// Whether it takes a value (`false`: a switch).
    pub(crate) takes_value: bool,
}

/// The long options of `cmd` (aliases included) and of its subcommands' names are left
/// alone: those are words, not options.
pub(crate) fn long_options(cmd: &clap::Command) -> Vec<LongOption> {
    let mut out = vec![
        LongOption {
            name: "help".into(),
            takes_value: false,
        },
        LongOption {
            name: "version".into(),
            takes_value: false,
        },
    ];
    for arg in cmd.get_arguments() {
        let takes_value = arg.get_action().takes_values();
        let names = arg
            .get_long()
            .into_iter()
            .chain(arg.get_all_aliases().unwrap_or_default());
        for name in names {
            out.push(LongOption {
                name: name.to_owned(),
                takes_value,
            });
        }
    }
    out
}

/// The arguments with Go's single-dash long options written as clap's (see the module
/// docs). The program name, values, words that are no known option and everything after
/// `--` are left as they are.
pub(crate) fn go_style(
    args: impl IntoIterator<Item = OsString>,
    longs: &[LongOption],
) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut rest_verbatim = false;
    let mut value_next = false;
    for (i, arg) in args.into_iter().enumerate() {
        if i == 0 || rest_verbatim || value_next {
            value_next = false;
            out.push(arg);
            continue;
        }
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            rest_verbatim = true;
            out.push(arg);
            continue;
        }
        let Some(word) = text.strip_prefix("--").or_else(|| text.strip_prefix('-')) else {
            out.push(arg);
            continue;
        };
        let (name, value) = match word.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (word, None),
        };
        // One letter after one dash (`-c FILE`) is a short option: no long name is that short.
        let known = longs.iter().find(|o| o.name == name);
        match known {
            Some(o) if !o.takes_value => match value {
                // Go's booleans: `-flag=false` turns it off (clap: leave it out).
                Some(v) if v.eq_ignore_ascii_case("false") || v == "0" => {}
                _ => out.push(format!("--{name}").into()),
            },
            Some(_) => {
                value_next = value.is_none();
                out.push(format!("--{word}").into());
            }
            None => out.push(arg),
        }
    }
    out
}

/// The first single-dash word that names no option of the command, in Go's words (`flag
/// provided but not defined: -confg`), as coraza-spoa users know them. One letter after the
/// dash is a short option (`-c FILE`); values of options that take one are skipped, and so is
/// everything after `--`.
pub(crate) fn go_unknown(args: &[OsString], longs: &[LongOption]) -> Option<String> {
    let mut value_next = false;
    for arg in args.iter().skip(1) {
        if std::mem::take(&mut value_next) {
            continue;
        }
        let text = arg.to_str()?;
        if text == "--" {
            return None;
        }
        if let Some(long) = text.strip_prefix("--") {
            let name = long.split('=').next().unwrap_or("");
            value_next =
                !text.contains('=') && longs.iter().any(|o| o.name == name && o.takes_value);
            continue;
        }
        let Some(word) = text.strip_prefix('-') else {
            continue;
        };
        let name = word.split('=').next().unwrap_or("");
        match longs.iter().find(|o| o.name == name) {
            Some(o) => value_next = o.takes_value && !word.contains('='),
            // `-c FILE`: a short option takes the next word.
            None if name.chars().count() == 1 => value_next = name == "c" && !word.contains('='),
            None if word.is_empty() || word.starts_with(|c: char| c.is_ascii_digit()) => {}
            None => return Some(format!("flag provided but not defined: -{name}")),
        }
    }
    None
}

/// An address to listen on, as Go writes it: `HOST:PORT`, `[V6]:PORT`, or `:PORT` for every
/// address.
pub(crate) fn listen_addr(text: &str) -> Option<SocketAddr> {
    let text = text.trim();
    match text.strip_prefix(':') {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .map(|p| SocketAddr::from(([0, 0, 0, 0], p))),
        None => text.parse().ok().or_else(|| {
            let (host, port) = text.rsplit_once(':')?;
            let port = port.parse::<u16>().ok()?;
            (host == "localhost").then(|| SocketAddr::from(([127, 0, 0, 1], port)))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn longs() -> Vec<LongOption> {
        [
            ("config", true),
            ("validate", false),
            ("autoreload", false),
            ("metrics-addr", true),
            ("bind", true),
            ("version", false),
        ]
        .iter()
        .map(|(n, v)| LongOption {
            name: (*n).into(),
            takes_value: *v,
        })
        .collect()
    }

    fn run(args: &[&str]) -> Vec<String> {
        go_style(args.iter().map(OsString::from), &longs())
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn coraza_spoa_command_lines() {
        // The systemd unit, the Dockerfile, the README.
        assert_eq!(
            run(&["coraza-spoa", "-config=/etc/coraza-spoa/config.yaml"]),
            ["coraza-spoa", "--config=/etc/coraza-spoa/config.yaml"]
        );
        assert_eq!(
            run(&["x", "--config", "/config.yaml"]),
            ["x", "--config", "/config.yaml"]
        );
        assert_eq!(
            run(&[
                "x",
                "-config",
                "/c.yaml",
                "-validate",
                "-metrics-addr",
                ":9090",
                "-autoreload"
            ]),
            [
                "x",
                "--config",
                "/c.yaml",
                "--validate",
                "--metrics-addr",
                ":9090",
                "--autoreload"
            ]
        );
        assert_eq!(
            run(&["x", "-validate=true", "-autoreload=false", "-version"]),
            ["x", "--validate", "--version"]
        );
    }

    #[test]
    fn values_shorts_and_the_rest_are_left_alone() {
        // A value that looks like an option is still the value.
        assert_eq!(
            run(&["x", "-config", "-validate"]),
            ["x", "--config", "-validate"]
        );
        assert_eq!(run(&["x", "-c", "f.yaml"]), ["x", "-c", "f.yaml"]);
        assert_eq!(
            run(&["x", "-nothing", "check-haproxy"]),
            ["x", "-nothing", "check-haproxy"]
        );
        assert_eq!(run(&["x", "--", "-config"]), ["x", "--", "-config"]);
    }

    /// Go's flag package refuses a single-dash word that names no flag; clap would read
    /// `-confg x.yaml` as `-c onfg` and then fail on a file named `onfg`.
    #[test]
    fn unknown_single_dash_words_are_refused_as_go_does() {
        let unknown = |args: &[&str]| {
            let args: Vec<OsString> = args.iter().map(OsString::from).collect();
            go_unknown(&args, &longs())
        };
        assert_eq!(
            unknown(&["x", "-confg", "x.yaml"]).as_deref(),
            Some("flag provided but not defined: -confg")
        );
        assert_eq!(
            unknown(&["x", "-validate", "-metrics-adr=:9"]).as_deref(),
            Some("flag provided but not defined: -metrics-adr")
        );
        for fine in [
            &["x", "-config", "-weird.yaml", "-validate"][..],
            &["x", "-c", "-confg"],
            &["x", "--config", "-confg"],
            &["x", "--", "-confg"],
            &["x", "check-haproxy", "a.cfg"],
            &["x", "--bind=-1", "-autoreload=false"],
        ] {
            assert_eq!(unknown(fine), None, "{fine:?}");
        }
    }

    #[test]
    fn go_listen_addresses() {
        assert_eq!(listen_addr(":9090"), Some("0.0.0.0:9090".parse().unwrap()));
        assert_eq!(
            listen_addr("127.0.0.1:9090"),
            Some("127.0.0.1:9090".parse().unwrap())
        );
        assert_eq!(listen_addr("[::1]:1"), Some("[::1]:1".parse().unwrap()));
        assert_eq!(
            listen_addr("localhost:9"),
            Some("127.0.0.1:9".parse().unwrap())
        );
        assert_eq!(listen_addr("9090"), None);
        assert_eq!(listen_addr(":x"), None);
    }
}
