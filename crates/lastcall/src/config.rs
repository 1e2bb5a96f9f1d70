//! The termination options (`--on-sigterm`, `--shutdown-delay`, ...) as a reusable clap
//! [`Args`](clap::Args), and their validation into a [`TerminationConfig`].
//!
//! Each option is optional on the command line so that each daemon supplies its own
//! defaults ([`Defaults`]); [`TerminationArgs::validate`] fills them in and reports every
//! problem at once, as [`Problems`] that name the flag or environment variable each value
//! came from. [`TerminationArgs::augment_help`] writes the daemon's defaults into `--help`,
//! and [`parse_cli`] does both plus exit status 64 for usage errors.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::ArgMatches;

use crate::duration;
use crate::exit;
use crate::problem::{Problem, Problems, Source};

/// What SIGTERM means (`--on-sigterm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnSigterm {
    /// Announce (readiness 503) for `--shutdown-delay`, then refuse new work, serve the rest
    /// to its end, exit when idle or at `--drain-timeout` (standalone deployment).
    #[default]
    Drain,
    /// Refuse nothing; after at least `--shutdown-delay`, exit once the sessions are at or
    /// below the threshold, bounded by `--drain-timeout` (sidecar next to its only client).
    Linger,
    /// Log SIGTERM and carry on (SIGQUIT, SIGUSR1, SIGINT or `POST /drain` end it).
    Ignore,
    /// Exit at once.
    Exit,
}

impl OnSigterm {
    /// The value as written on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            OnSigterm::Drain => "drain",
            OnSigterm::Linger => "linger",
            OnSigterm::Ignore => "ignore",
            OnSigterm::Exit => "exit",
        }
    }
}

impl fmt::Display for OnSigterm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The termination options, to `#[command(flatten)]` into a daemon's CLI.
///
/// Values are kept as given (strings for durations, numbers and addresses) so that
/// [`validate`](Self::validate) can report every malformed value at once, not just the
/// first; parsed from clap's matches, it also remembers whether each came from its flag, its
/// environment variable or the default, for the problems it reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TerminationArgs {
    /// `--on-sigterm`.
    pub on_sigterm: Option<OnSigterm>,
    /// `--shutdown-delay`, as given.
    pub shutdown_delay: Option<String>,
    /// `--drain-timeout`, as given.
    pub drain_timeout: Option<String>,
    /// `--drain-min-sessions`, as given.
    pub drain_min_sessions: Option<String>,
    /// `--admin-addr`, as given.
    pub admin_addr: Option<String>,
    /// `--admin-token`.
    pub admin_token: Option<String>,
    /// `--admin-token-file`.
    pub admin_token_file: Option<PathBuf>,
    /// Where each value came from, by argument id (absent: the command line).
    sources: Vec<(&'static str, Source)>,
}

/// The clap definition behind [`TerminationArgs`] (which adds the value sources).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Termination (see docs/termination.md)")]
struct TerminationFlags {
    /// What SIGTERM does: drain (announce, then refuse new work and serve the rest to its
    /// end), linger (sidecar: refuse nothing, leave when no session is left), ignore (log
    /// and carry on), exit (leave at once)
    #[arg(long, env = "LASTCALL_ON_SIGTERM", value_enum, value_name = "POLICY")]
    pub on_sigterm: Option<OnSigterm>,

    /// Length of the Announcing phase: readiness answers 503 but new work is still
    /// accepted (0 skips it); --shutdown-grace-period is ingress-nginx's name for it
    #[arg(
        long,
        env = "LASTCALL_SHUTDOWN_DELAY",
        value_name = "DURATION",
        visible_alias = "shutdown-grace-period"
    )]
    pub shutdown_delay: Option<String>,

    /// Hard deadline counted from the trigger; sessions still live then are cut (exit 75)
    #[arg(long, env = "LASTCALL_DRAIN_TIMEOUT", value_name = "DURATION")]
    pub drain_timeout: Option<String>,

    /// Exit once the live sessions are at or below this count (after the delay)
    #[arg(long, env = "LASTCALL_DRAIN_MIN_SESSIONS", value_name = "N")]
    pub drain_min_sessions: Option<String>,

    /// Admin listener for /livez, /readyz, /metrics and /drain (`off` disables it)
    #[arg(long, env = "LASTCALL_ADMIN_ADDR", value_name = "ADDR")]
    pub admin_addr: Option<String>,

    /// Bearer token that `POST /drain` must present (then required from every peer);
    /// without a token, only loopback peers may POST /drain [default: none]
    #[arg(
        long,
        env = "LASTCALL_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,

    /// File holding the admin token (surrounding whitespace is trimmed) [default: none]
    #[arg(long, env = "LASTCALL_ADMIN_TOKEN_FILE", value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>,
}

/// Argument ids (the field names, as clap names them) and their environment variables.
const ARG_ENVS: [(&str, &str); 7] = [
    (ID_ON_SIGTERM, "LASTCALL_ON_SIGTERM"),
    (ID_SHUTDOWN_DELAY, "LASTCALL_SHUTDOWN_DELAY"),
    (ID_DRAIN_TIMEOUT, "LASTCALL_DRAIN_TIMEOUT"),
    (ID_DRAIN_MIN_SESSIONS, "LASTCALL_DRAIN_MIN_SESSIONS"),
    (ID_ADMIN_ADDR, "LASTCALL_ADMIN_ADDR"),
    (ID_ADMIN_TOKEN, "LASTCALL_ADMIN_TOKEN"),
    (ID_ADMIN_TOKEN_FILE, "LASTCALL_ADMIN_TOKEN_FILE"),
];

impl TerminationArgs {
    fn from_flags(f: TerminationFlags, matches: &ArgMatches) -> TerminationArgs {
        let sources = ARG_ENVS
            .iter()
            .map(|(id, env)| (*id, Source::from_matches(matches, id, Some(env))))
            .collect();
        TerminationArgs {
            on_sigterm: f.on_sigterm,
            shutdown_delay: f.shutdown_delay,
            drain_timeout: f.drain_timeout,
            drain_min_sessions: f.drain_min_sessions,
            admin_addr: f.admin_addr,
            admin_token: f.admin_token,
            admin_token_file: f.admin_token_file,
            sources,
        }
    }

    fn to_flags(&self) -> TerminationFlags {
        TerminationFlags {
            on_sigterm: self.on_sigterm,
            shutdown_delay: self.shutdown_delay.clone(),
            drain_timeout: self.drain_timeout.clone(),
            drain_min_sessions: self.drain_min_sessions.clone(),
            admin_addr: self.admin_addr.clone(),
            admin_token: self.admin_token.clone(),
            admin_token_file: self.admin_token_file.clone(),
        }
    }

    /// Where the value of argument `id` came from.
    fn source(&self, id: &str) -> Source {
        self.sources
            .iter()
            .find(|(i, _)| *i == id)
            .map_or(Source::Flag, |(_, s)| s.clone())
    }

    /// A problem with the option `flag` (argument `id`), at its source.
    fn problem(&self, flag: &str, id: &str, message: impl Into<String>) -> Problem {
        Problem::new(flag, message).at(self.source(id))
    }
}

impl clap::FromArgMatches for TerminationArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let flags = TerminationFlags::from_arg_matches(matches)?;
        Ok(TerminationArgs::from_flags(flags, matches))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        let mut flags = self.to_flags();
        flags.update_from_arg_matches(matches)?;
        *self = TerminationArgs::from_flags(flags, matches);
        Ok(())
    }
}

impl clap::Args for TerminationArgs {
    fn group_id() -> Option<clap::Id> {
        TerminationFlags::group_id()
    }

    fn augment_args(cmd: clap::Command) -> clap::Command {
        TerminationFlags::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        TerminationFlags::augment_args_for_update(cmd)
    }
}

/// A daemon's defaults for the termination options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    /// Default `--shutdown-delay`.
    pub shutdown_delay: Duration,
    /// Default `--drain-timeout`.
    pub drain_timeout: Duration,
    /// Default `--drain-min-sessions` (usually 0).
    pub drain_min_sessions: u64,
    /// Default `--admin-addr`; `None` means no admin listener unless one is asked for.
    pub admin_addr: Option<SocketAddr>,
}

/// The validated termination settings.
#[derive(Clone, PartialEq, Eq)]
pub struct TerminationConfig {
    /// What SIGTERM does.
    pub on_sigterm: OnSigterm,
    /// Length of Announcing (zero skips it; for `linger`, the minimum time before exiting).
    pub shutdown_delay: Duration,
    /// Deadline counted from the trigger. Always longer than `shutdown_delay`.
    pub drain_timeout: Duration,
    /// Exit threshold.
    pub drain_min_sessions: u64,
    /// Where the admin listener binds, if anywhere.
    pub admin_addr: Option<SocketAddr>,
    /// Bearer token required by `POST /drain`, if configured (never printed by `Debug`).
    pub admin_token: Option<String>,
    /// SIGUSR1 refuses new work at once, without `--shutdown-delay`'s Announcing (coturn's
    /// SIGUSR1 since 4.6.3; set by the daemon, not by a flag). Default false: SIGUSR1 drains
    /// as SIGTERM's `drain` does.
    pub sigusr1_refuses_at_once: bool,
}

impl TerminationConfig {
    /// A configuration from a policy and durations, with no admin listener (mostly for tests).
    pub fn new(on_sigterm: OnSigterm, shutdown_delay: Duration, drain_timeout: Duration) -> Self {
        TerminationConfig {
            on_sigterm,
            shutdown_delay,
            drain_timeout,
            drain_min_sessions: 0,
            admin_addr: None,
            admin_token: None,
            sigusr1_refuses_at_once: false,
        }
    }
}

impl fmt::Debug for TerminationConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TerminationConfig")
            .field("on_sigterm", &self.on_sigterm)
            .field("shutdown_delay", &self.shutdown_delay)
            .field("drain_timeout", &self.drain_timeout)
            .field("drain_min_sessions", &self.drain_min_sessions)
            .field("admin_addr", &self.admin_addr)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("sigusr1_refuses_at_once", &self.sigusr1_refuses_at_once)
            .finish()
    }
}

/// Ids of the flattened arguments, as clap names them (the field names).
const ID_ON_SIGTERM: &str = "on_sigterm";
const ID_SHUTDOWN_DELAY: &str = "shutdown_delay";
const ID_DRAIN_TIMEOUT: &str = "drain_timeout";
const ID_DRAIN_MIN_SESSIONS: &str = "drain_min_sessions";
const ID_ADMIN_ADDR: &str = "admin_addr";
const ID_ADMIN_TOKEN: &str = "admin_token";
const ID_ADMIN_TOKEN_FILE: &str = "admin_token_file";

impl TerminationArgs {
    /// Validates the options, filling unset ones from `defaults`, and reports every problem,
    /// each with the flag or environment variable its value came from.
    pub fn validate(&self, defaults: &Defaults) -> Result<TerminationConfig, Problems> {
        let mut problems = Problems::new();
        let on_sigterm = self.on_sigterm.unwrap_or_default();
        let shutdown_delay = self.duration(
            "--shutdown-delay",
            ID_SHUTDOWN_DELAY,
            self.shutdown_delay.as_deref(),
            defaults.shutdown_delay,
            &mut problems,
        );
        let drain_timeout = self.duration(
            "--drain-timeout",
            ID_DRAIN_TIMEOUT,
            self.drain_timeout.as_deref(),
            defaults.drain_timeout,
            &mut problems,
        );
        let drain_min_sessions = match self.drain_min_sessions.as_deref() {
            None => defaults.drain_min_sessions,
            Some(text) => text.trim().parse().unwrap_or_else(|_| {
                problems.push(
                    self.problem(
                        "--drain-min-sessions",
                        ID_DRAIN_MIN_SESSIONS,
                        "not a whole number of sessions",
                    )
                    .value(text)
                    .expected("0 or more"),
                );
                defaults.drain_min_sessions
            }),
        };
        let admin_addr = match self.admin_addr.as_deref().map(str::trim) {
            None => defaults.admin_addr,
            Some("off" | "none" | "") => None,
            Some(text) => text.parse().map(Some).unwrap_or_else(|_| {
                problems.push(
                    self.problem("--admin-addr", ID_ADMIN_ADDR, "not an IP:PORT address")
                        .value(text)
                        .expected("IP:PORT (e.g. 127.0.0.1:9090, [::1]:9090) or `off`"),
                );
                defaults.admin_addr
            }),
        };
        let admin_token = self.resolve_token(&mut problems);
        self.check_durations(shutdown_delay, drain_timeout, &mut problems);
        if admin_addr.is_none() {
            let given = [
                ("--admin-token", ID_ADMIN_TOKEN, self.admin_token.is_some()),
                (
                    "--admin-token-file",
                    ID_ADMIN_TOKEN_FILE,
                    self.admin_token_file.is_some(),
                ),
            ];
            if let Some((flag, id, _)) = given.into_iter().find(|(_, _, set)| *set) {
                problems.push(
                    self.problem(flag, id, "is set but the admin listener is off")
                        .expected("--admin-addr too"),
                );
            }
        }
        problems.into_result(TerminationConfig {
            on_sigterm,
            shutdown_delay,
            drain_timeout,
            drain_min_sessions,
            admin_addr,
            admin_token,
            sigusr1_refuses_at_once: false,
        })
    }

    fn duration(
        &self,
        flag: &str,
        id: &str,
        given: Option<&str>,
        default: Duration,
        problems: &mut Problems,
    ) -> Duration {
        match given {
            None => default,
            Some(text) => duration::parse(text).unwrap_or_else(|err| {
                problems.push(self.problem(flag, id, err.to_string()).value(text));
                default
            }),
        }
    }

    fn check_durations(&self, delay: Duration, timeout: Duration, problems: &mut Problems) {
        if timeout.is_zero() {
            problems.push(
                self.problem(
                    "--drain-timeout",
                    ID_DRAIN_TIMEOUT,
                    "leaves no time to drain",
                )
                .value(duration::format(timeout))
                .expected("a longer duration (--on-sigterm exit leaves at once)"),
            );
        } else if delay >= timeout {
            let why = "the deadline is counted from the trigger and would end the drain before \
                       new work is refused";
            // Name the option the operator set: the delay, unless only the timeout was given.
            let delay_defaulted =
                self.shutdown_delay.is_none() || self.source(ID_SHUTDOWN_DELAY) == Source::Default;
            let problem = if delay_defaulted {
                self.problem(
                    "--drain-timeout",
                    ID_DRAIN_TIMEOUT,
                    format!(
                        "must be longer than --shutdown-delay ({}): {why}",
                        duration::format(delay)
                    ),
                )
                .value(duration::format(timeout))
            } else {
                self.problem(
                    "--shutdown-delay",
                    ID_SHUTDOWN_DELAY,
                    format!(
                        "must be shorter than --drain-timeout ({}): {why}",
                        duration::format(timeout)
                    ),
                )
                .value(duration::format(delay))
            };
            problems.push(problem);
        }
    }

    fn resolve_token(&self, problems: &mut Problems) -> Option<String> {
        match (&self.admin_token, &self.admin_token_file) {
            (Some(_), Some(_)) => {
                problems.push(
                    Problem::new(
                        "--admin-token and --admin-token-file",
                        "both are set (LASTCALL_ADMIN_TOKEN / LASTCALL_ADMIN_TOKEN_FILE)",
                    )
                    .expected("one of them"),
                );
                None
            }
            (Some(token), None) => {
                let token = token.trim();
                if token.is_empty() {
                    problems.push(self.problem("--admin-token", ID_ADMIN_TOKEN, "is empty"));
                    None
                } else {
                    Some(token.to_string())
                }
            }
            (None, Some(path)) => {
                let problem = |message: String| {
                    self.problem("--admin-token-file", ID_ADMIN_TOKEN_FILE, message)
                        .value(path.display().to_string())
                };
                match std::fs::read_to_string(path) {
                    Ok(text) if text.trim().is_empty() => {
                        problems.push(problem("file is empty".to_string()));
                        None
                    }
                    Ok(text) => Some(text.trim().to_string()),
                    Err(err) => {
                        problems.push(problem(format!("cannot read: {err}")));
                        None
                    }
                }
            }
            (None, None) => None,
        }
    }

    /// Writes the daemon's defaults into the help of a command that flattens
    /// `TerminationArgs` (`[default: ...]` next to clap's `[env: ...]`).
    ///
    /// Use it on `Cli::command()` and parse with the result, or simply call [`parse_cli`].
    /// The defaults become clap defaults, which [`resolve`](Self::resolve) reads back as the
    /// same values, so parsing with or without this gives the same configuration.
    pub fn augment_help(cmd: clap::Command, defaults: &Defaults) -> clap::Command {
        let admin = defaults
            .admin_addr
            .map(|addr| addr.to_string())
            .unwrap_or_else(|| "off".to_string());
        let has = |cmd: &clap::Command, id: &str| cmd.get_arguments().any(|a| a.get_id() == id);
        let mut cmd = cmd;
        let settings = [
            (ID_ON_SIGTERM, OnSigterm::default().to_string()),
            (ID_SHUTDOWN_DELAY, duration::format(defaults.shutdown_delay)),
            (ID_DRAIN_TIMEOUT, duration::format(defaults.drain_timeout)),
            (
                ID_DRAIN_MIN_SESSIONS,
                defaults.drain_min_sessions.to_string(),
            ),
            (ID_ADMIN_ADDR, admin),
        ];
        for (id, value) in settings {
            if has(&cmd, id) {
                cmd = cmd.mut_arg(id, |arg| arg.default_value(value));
            }
        }
        cmd
    }
}

/// Parses the command line of a daemon whose CLI flattens [`TerminationArgs`], with the
/// daemon's defaults shown in `--help`. `--help`/`--version` exit 0; usage errors print
/// clap's message and exit 64 (not clap's usual 2), like the other configuration errors.
///
/// The three entry points, for three kinds of caller: this one for a daemon with no option
/// of its own to check; [`parse_cli_matches_from`] for one whose problems say where a value
/// came from ([`Source::from_matches`](crate::Source::from_matches)); [`try_parse_cli_matches`]
/// for one that reports clap's error with its own problems.
pub fn parse_cli<C: clap::Parser>(defaults: &Defaults) -> C {
    parse_cli_matches_from(std::env::args_os(), defaults, |cmd| cmd).0
}

/// [`parse_cli`] from an explicit argument list (the first item is the program name), with a
/// last change to the command (e.g. an extra alias), also returning clap's matches:
///
/// ```
/// # use clap::Parser;
/// #[derive(Parser)]
/// struct Cli {
///     #[command(flatten)]
///     term: lastcall::TerminationArgs,
/// }
/// let defaults = lastcall::Defaults {
///     shutdown_delay: std::time::Duration::from_secs(5),
///     drain_timeout: std::time::Duration::from_secs(30),
///     drain_min_sessions: 0,
///     admin_addr: None,
/// };
/// let (cli, _matches): (Cli, _) = lastcall::config::parse_cli_matches_from(
///     ["turn", "--drain-min-allocations", "3"],
///     &defaults,
///     |cmd| cmd.mut_arg("drain_min_sessions", |a| a.visible_alias("drain-min-allocations")),
/// );
/// assert_eq!(cli.term.validate(&defaults).unwrap().drain_min_sessions, 3);
/// ```
pub fn parse_cli_matches_from<C, I, T>(
    args: I,
    defaults: &Defaults,
    customize: impl FnOnce(clap::Command) -> clap::Command,
) -> (C, ArgMatches)
where
    C: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match try_parse_cli_matches(args, defaults, customize) {
        Ok(parsed) => parsed,
        Err(err) => exit_on_clap_error(err),
    }
}

/// [`parse_cli_matches_from`] returning clap's error instead of printing it and exiting.
pub fn try_parse_cli_matches<C, I, T>(
    args: I,
    defaults: &Defaults,
    customize: impl FnOnce(clap::Command) -> clap::Command,
) -> Result<(C, ArgMatches), clap::Error>
where
    C: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cmd = customize(TerminationArgs::augment_help(C::command(), defaults));
    let matches = cmd.try_get_matches_from(args)?;
    // `from_arg_matches_mut` takes the values out of the matches it is given.
    let cli = C::from_arg_matches_mut(&mut matches.clone())?;
    Ok((cli, matches))
}

/// Prints clap's message and exits: 0 for `--help`/`--version`, 64 for usage errors.
fn exit_on_clap_error(err: clap::Error) -> ! {
    let code = if err.use_stderr() { exit::CONFIG } else { 0 };
    // Printing can only fail if stderr/stdout is gone; nothing better to do then.
    let _ = err.print();
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        term: TerminationArgs,
    }

    fn defaults() -> Defaults {
        Defaults {
            shutdown_delay: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(30),
            drain_min_sessions: 0,
            admin_addr: Some("127.0.0.1:9090".parse().unwrap()),
        }
    }

    /// The problems as lines of text, for assertions on their wording.
    #[derive(Debug)]
    struct Lines {
        problems: Vec<String>,
    }

    impl std::fmt::Display for Lines {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.problems.join("\n"))
        }
    }

    fn lines(problems: &Problems) -> Vec<String> {
        problems.iter().map(ToString::to_string).collect()
    }

    fn parse(args: &[&str]) -> Result<TerminationConfig, Lines> {
        let mut argv = vec!["daemon"];
        argv.extend_from_slice(args);
        let (cli, _): (Cli, _) = try_parse_cli_matches(argv, &defaults(), |c| c).unwrap();
        cli.term.validate(&defaults()).map_err(|p| Lines {
            problems: lines(&p),
        })
    }

    #[test]
    fn defaults_apply() {
        let cli = Cli::try_parse_from(["daemon"]).unwrap();
        let cfg = cli.term.validate(&defaults()).unwrap();
        assert_eq!(cfg.on_sigterm, OnSigterm::Drain);
        assert_eq!(cfg.shutdown_delay, Duration::from_secs(5));
        assert_eq!(cfg.drain_timeout, Duration::from_secs(30));
        assert_eq!(cfg.drain_min_sessions, 0);
        assert_eq!(cfg.admin_addr, defaults().admin_addr);
        assert_eq!(cfg.admin_token, None);
        // Same result through the augmented command.
        assert_eq!(parse(&[]).unwrap(), cfg);
    }

    #[test]
    fn options_and_alias() {
        let cfg = parse(&[
            "--on-sigterm",
            "linger",
            "--shutdown-grace-period",
            "1s",
            "--drain-timeout",
            "1h30m",
            "--drain-min-sessions",
            "2",
            "--admin-addr",
            "[::1]:0",
            "--admin-token",
            "s3cret",
        ])
        .unwrap();
        assert_eq!(cfg.on_sigterm, OnSigterm::Linger);
        assert_eq!(cfg.shutdown_delay, Duration::from_secs(1));
        assert_eq!(cfg.drain_timeout, Duration::from_secs(5400));
        assert_eq!(cfg.drain_min_sessions, 2);
        assert_eq!(cfg.admin_addr, Some("[::1]:0".parse().unwrap()));
        assert_eq!(cfg.admin_token.as_deref(), Some("s3cret"));
        assert!(!format!("{cfg:?}").contains("s3cret"));
        assert_eq!(parse(&["--admin-addr", "off"]).unwrap().admin_addr, None);
    }

    #[test]
    fn every_problem_is_reported() {
        let err = parse(&[
            "--shutdown-delay",
            "5x",
            "--drain-timeout",
            "soon",
            "--drain-min-sessions=-1",
            "--admin-addr",
            "localhost",
        ])
        .unwrap_err();
        assert_eq!(err.problems.len(), 4, "{err}");
        let text = err.to_string();
        for flag in [
            "--shutdown-delay",
            "--drain-timeout",
            "--drain-min-sessions",
            "--admin-addr",
        ] {
            assert!(text.contains(flag), "{flag} missing from {text}");
        }
    }

    #[test]
    fn impossible_combinations_name_both_options() {
        let err = parse(&["--shutdown-delay", "30s", "--drain-timeout", "10s"]).unwrap_err();
        assert_eq!(err.problems.len(), 1);
        assert!(err.problems[0].contains("--shutdown-delay (30s)"), "{err}");
        assert!(err.problems[0].contains("--drain-timeout (10s)"), "{err}");
        // Equal is impossible too; the default delay counts.
        let err = parse(&["--drain-timeout", "5s"]).unwrap_err();
        assert!(err.problems[0].contains("--shutdown-delay (5s)"), "{err}");
        assert!(err.problems[0].starts_with("--drain-timeout (5s)"), "{err}");
        let err = parse(&["--shutdown-delay", "0", "--drain-timeout", "0"]).unwrap_err();
        assert!(
            err.problems[0].contains("--drain-timeout (0s): leaves no time to drain"),
            "{err}"
        );

        let dir = std::env::temp_dir().join(format!("lastcall-no-such-dir-{}", std::process::id()));
        let err = parse(&[
            "--admin-token",
            "a",
            "--admin-token-file",
            dir.join("nope").to_str().unwrap(),
            "--admin-addr",
            "off",
        ])
        .unwrap_err();
        assert!(
            err.problems[0].contains("--admin-token and --admin-token-file"),
            "{err}"
        );
        assert!(err.problems[1].contains("--admin-addr"), "{err}");
    }

    #[test]
    fn problems_say_where_each_value_came_from() {
        let mut argv = vec![
            "daemon",
            "--drain-min-sessions",
            "x",
            "--admin-addr",
            "nope",
        ];
        argv.extend(["--shutdown-delay", "1s", "--drain-timeout", "1s"]);
        let (cli, _): (Cli, _) = try_parse_cli_matches(argv, &defaults(), |c| c).unwrap();
        let problems = cli.term.validate(&defaults()).unwrap_err();
        let keys: Vec<_> = problems
            .iter()
            .map(|p| (p.key.as_str(), &p.source))
            .collect();
        assert_eq!(
            keys,
            [
                ("--drain-min-sessions", &Source::Flag),
                ("--admin-addr", &Source::Flag),
                ("--shutdown-delay", &Source::Flag),
            ],
            "{problems}"
        );
        assert_eq!(
            problems.iter().next().map(|p| p.value.as_deref()),
            Some(Some("x"))
        );
        // Without the daemon's defaults in the command (no augment_help), a missing delay is
        // still the default: the problem names the timeout that was given.
        let cmd = <Cli as CommandFactory>::command();
        let matches = cmd
            .try_get_matches_from(["daemon", "--drain-timeout", "2s"])
            .unwrap();
        let cli = <Cli as FromArgMatches>::from_arg_matches(&matches).unwrap();
        let problems = cli.term.validate(&defaults()).unwrap_err();
        assert!(
            problems
                .to_string()
                .starts_with("--drain-timeout (2s): must be longer than --shutdown-delay (5s)"),
            "{problems}"
        );
        // Not parsed by clap (built in code): the command line is assumed.
        let args = TerminationArgs {
            drain_timeout: Some("soon".into()),
            ..TerminationArgs::default()
        };
        let problems = args.validate(&defaults()).unwrap_err();
        assert_eq!(
            problems.to_string(),
            "--drain-timeout (soon): expected a number at `soon` (write e.g. 30s, 5m, 1h30m, 250ms or 30)"
        );
        assert_eq!(
            lines(&problems),
            ["--drain-timeout (soon): expected a number at `soon` (write e.g. 30s, 5m, 1h30m, 250ms or 30)"]
        );
    }

    #[test]
    fn matches_tell_where_a_daemons_own_option_came_from() {
        #[derive(Debug, Parser)]
        struct Own {
            #[arg(long, env = "LASTCALL_TEST_NO_SUCH_VAR_BIND")]
            bind: Option<String>,
            #[arg(long, default_value = "x")]
            mode: String,
            #[command(flatten)]
            term: TerminationArgs,
        }
        let (cli, matches): (Own, _) =
            try_parse_cli_matches(["daemon", "--bind", "b"], &defaults(), |c| c).unwrap();
        assert_eq!(cli.bind.as_deref(), Some("b"));
        let of = |id| Source::from_matches(&matches, id, None);
        assert_eq!(of("bind"), Source::Flag);
        assert_eq!(of("mode"), Source::Default);
        assert_eq!(of("drain_timeout"), Source::Default);
        assert_eq!(of("no_such_argument"), Source::Default);
    }

    #[test]
    fn token_file_is_read_and_trimmed() {
        let path = std::env::temp_dir().join(format!("lastcall-token-{}", std::process::id()));
        std::fs::write(&path, "  tok3n\n").unwrap();
        let cfg = parse(&["--admin-token-file", path.to_str().unwrap()]).unwrap();
        assert_eq!(cfg.admin_token.as_deref(), Some("tok3n"));
        std::fs::write(&path, "\n").unwrap();
        let err = parse(&["--admin-token-file", path.to_str().unwrap()]).unwrap_err();
        assert!(err.problems[0].contains("empty"), "{err}");
        std::fs::remove_file(&path).unwrap();
        let err = parse(&["--admin-token-file", path.to_str().unwrap()]).unwrap_err();
        assert!(err.problems[0].contains("cannot read"), "{err}");
    }

    #[test]
    fn help_shows_defaults_and_env() {
        let help = TerminationArgs::augment_help(Cli::command(), &defaults())
            .render_long_help()
            .to_string();
        for (flag, env, default) in [
            ("--on-sigterm", "LASTCALL_ON_SIGTERM", "[default: drain]"),
            (
                "--shutdown-delay",
                "LASTCALL_SHUTDOWN_DELAY",
                "[default: 5s]",
            ),
            (
                "--drain-timeout",
                "LASTCALL_DRAIN_TIMEOUT",
                "[default: 30s]",
            ),
            (
                "--drain-min-sessions",
                "LASTCALL_DRAIN_MIN_SESSIONS",
                "[default: 0]",
            ),
            (
                "--admin-addr",
                "LASTCALL_ADMIN_ADDR",
                "[default: 127.0.0.1:9090]",
            ),
            ("--admin-token ", "LASTCALL_ADMIN_TOKEN]", "[default: none]"),
            (
                "--admin-token-file",
                "LASTCALL_ADMIN_TOKEN_FILE",
                "[default: none]",
            ),
        ] {
            let at = help
                .find(flag)
                .unwrap_or_else(|| panic!("{flag} not in {help}"));
            let section = &help[at..];
            let end = section[2..].find("\n  -").map_or(section.len(), |e| e + 2);
            let section = &section[..end];
            assert!(section.contains(env), "{env} not in {section}");
            assert!(section.contains(default), "{default} not in {section}");
        }
        assert!(help.contains("shutdown-grace-period"));
    }
}
