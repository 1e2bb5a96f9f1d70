//! The command line, the environment and the file, read in one pass into what `main` needs
//! ([`parse`]): every problem of all three is collected and reported at once, with the
//! rules' own compile errors when anything else is wrong too, before a port is bound.
//!
//! The rules are compiled here only to report (`--validate`, or other problems); a valid
//! configuration's rules are compiled after the lifecycle has started (signals are handled
//! while they compile; `main`).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory};
use lastcall::{LogArgs, Problem, Problems, Source, TerminationConfig};
use tracing_subscriber::fmt::writer::BoxMakeWriter;

use super::apps::Apps;
use super::{Config, Evaluation, LogFile};
use crate::cli::{self, Cli, Command};
use crate::engine::Bind;

/// What the command line comes to.
#[derive(Debug)]
pub enum Parsed {
    /// Serve with these settings.
    Run(Box<Settings>),
    /// Print this on stdout and exit 0 (`--help`, `--version`, `show-config`,
    /// `show-rules`, a `--validate` that passed), after `warnings` on stderr.
    Print {
        /// For stdout.
        text: String,
        /// For stderr, one line each (`lastcall-spoa: warning: ...`).
        warnings: Vec<String>,
    },
    /// `check-haproxy FILE...`.
    CheckHaproxy(Vec<PathBuf>),
    /// A command line clap cannot read: its own message, exit 64.
    Usage(clap::Error),
}

/// Everything the daemon needs to serve.
pub struct Settings {
    /// The file (or the built-in application), with `--bind` and `--crs-dir` applied.
    pub config: Config,
    /// The termination options (`-metrics-addr` applied).
    pub term: TerminationConfig,
    /// The process log: the file's `log_level`/`log_format` unless the command line or the
    /// environment says otherwise.
    pub log: LogArgs,
    /// How the process log writes matched rules (in JSON: coraza-spoa's shape unless the
    /// file's `log_format` is `json-flat`).
    pub log_rules: crate::log::RuleLines,
    /// Where the process log goes (the file's `log_file`; stderr by default).
    pub log_writer: BoxMakeWriter,
    /// Accepted with a caveat, to log once logging is up.
    pub warnings: Vec<String>,
    /// How a reload reads the file again.
    pub source: FileSource,
    /// `-autoreload`: the file to watch.
    pub autoreload: Option<PathBuf>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("config", &self.config)
            .field("term", &self.term)
            .field("log", &self.log)
            .field("warnings", &self.warnings)
            .field("source", &self.source)
            .field("autoreload", &self.autoreload)
            .finish_non_exhaustive()
    }
}

/// Where the configuration comes from: the file (`None`: the built-in application) and
/// `--crs-dir`, read at start and again at every reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSource {
    /// `--config`.
    pub(crate) path: Option<PathBuf>,
    /// `--crs-dir` (or `LASTCALL_SPOA_CRS_DIR`), and where it was given.
    pub(crate) crs_dir: Option<(PathBuf, Source)>,
    /// `--accept-crs3`: rules written for CRS 4 may run on a CRS 3 tree (with warnings).
    pub(crate) accept_crs3: bool,
}

impl FileSource {
    /// Reads the file (or takes the built-in configuration) and applies `--crs-dir`.
    pub(crate) fn load(&self) -> Result<Config, Problems> {
        let mut cfg = match &self.path {
            None => Config::builtin(),
            Some(path) => Config::load(path)?,
        };
        if let Some((dir, source)) = &self.crs_dir {
            cfg.use_crs_dir(dir).map_err(|e| {
                Problems::from(
                    Problem::new("--crs-dir", e)
                        .value(dir.display().to_string())
                        .at(source.clone()),
                )
            })?;
        }
        Ok(cfg)
    }

    /// [`load`](Self::load), then the CRS check ([`super::crs_check`]): the configuration
    /// and its warnings, or every reason it is refused.
    pub(crate) fn load_checked(&self) -> Result<(Config, Vec<String>), Problems> {
        let cfg = self.load()?;
        let warnings = super::crs_check(&cfg, self.accept_crs3)?;
        Ok((cfg, warnings))
    }
}

/// Reads the command line (the first item is the program name), the environment and the
/// file it names; see the module docs.
pub fn parse<I, T>(args: I) -> Result<Parsed, Problems>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let (cli, matches) = match command_line(args.into_iter().map(Into::into).collect()) {
        Ok(read) => read,
        Err(answer) => return answer,
    };
    if let Some(Command::CheckHaproxy { files }) = &cli.command {
        return Ok(Parsed::CheckHaproxy(files.clone()));
    }
    let mut problems = Problems::new();
    let term = termination(&cli, &matches, &mut problems);
    if cli.autoreload && cli.config.is_none() {
        problems.push(
            Problem::new(
                "-autoreload",
                "watches the configuration file, and none is given",
            )
            .expected("-config FILE too"),
        );
    }
    let source = file_source(&cli, &matches);
    let cfg = match source.load() {
        Ok(mut cfg) => {
            apply_bind(&cli, &matches, &mut cfg, &mut problems);
            Some(cfg)
        }
        Err(e) => {
            problems.extend(e);
            None
        }
    };
    let log = cfg
        .as_ref()
        .and_then(|c| match process_log(&cli.log, &matches, c) {
            Ok(log) => Some(log),
            Err(p) => {
                problems.push(p);
                None
            }
        });
    let (Some(term), Some(cfg), Some((log, log_rules, log_writer))) = (term, cfg.clone(), log)
    else {
        return Err(with_rule_errors(problems, cfg.as_ref()));
    };
    if !problems.is_empty() {
        return Err(with_rule_errors(problems, Some(&cfg)));
    }
    // show-config and show-rules print what would run, refused or not.
    let showing = matches!(
        cli.command,
        Some(Command::ShowConfig | Command::ShowRules { .. })
    );
    let crs = match super::crs_check(&cfg, source.accept_crs3 || showing) {
        Ok(crs) => crs,
        Err(refused) => {
            problems.extend(refused);
            return Err(with_rule_errors(problems, Some(&cfg)));
        }
    };
    let mut warnings = warnings(&cli, &cfg);
    warnings.extend(crs);
    if let Some(printed) = printed(&cli, &cfg, &mut warnings) {
        return printed;
    }
    warnings.shrink_to_fit();
    Ok(Parsed::Run(Box::new(Settings {
        config: cfg,
        term,
        log,
        log_rules,
        log_writer,
        warnings,
        source,
        autoreload: cli.config.clone().filter(|_| cli.autoreload),
    })))
}

/// The command line read by clap, coraza-spoa's Go-style flags (`-config`) understood;
/// `Err` is [`parse`]'s answer already: an unknown flag, a usage error, `--help`,
/// `--version`.
fn command_line(args: Vec<OsString>) -> Result<(Cli, ArgMatches), Result<Parsed, Problems>> {
    let longs = cli::long_options(&Cli::command());
    if let Some(message) = cli::go_unknown(&args, &longs) {
        return Err(Err(Problems::from(
            Problem::new("", message).expected("one of the flags `lastcall-spoa --help` lists"),
        )));
    }
    let args = cli::go_style(args, &longs);
    let version = cli::version_line();
    lastcall::config::try_parse_cli_matches::<Cli, _, _>(args, &cli::defaults(), |cmd| {
        cmd.version(version)
    })
    .map_err(|e| match e.use_stderr() {
        true => Ok(Parsed::Usage(e)),
        false => Ok(Parsed::Print {
            text: e.render().to_string(),
            warnings: Vec::new(),
        }),
    })
}

/// The file to read (`--config`, else the built-in configuration) and the CRS it takes.
fn file_source(cli: &Cli, matches: &ArgMatches) -> FileSource {
    FileSource {
        path: cli.config.clone(),
        // Empty (the image's LASTCALL_SPOA_CRS_DIR without a CRS archive): not given.
        crs_dir: cli.crs_dir.clone().filter(|d| !d.is_empty()).map(|dir| {
            let at = Source::from_matches(matches, "crs_dir", Some("LASTCALL_SPOA_CRS_DIR"));
            (PathBuf::from(dir), at)
        }),
        accept_crs3: cli.accept_crs3,
    }
}

/// `problems` and the rules' compile errors too: every reason at once (nothing is bound
/// yet).
fn with_rule_errors(mut problems: Problems, cfg: Option<&Config>) -> Problems {
    if let Some(Err(errs)) = cfg.map(Apps::compile) {
        problems.extend(errs);
    }
    problems
}

/// What `show-config`, `show-rules` and `-validate` print (with the `warnings`), or
/// `None` when the agent is to run.
fn printed(
    cli: &Cli,
    cfg: &Config,
    warnings: &mut Vec<String>,
) -> Option<Result<Parsed, Problems>> {
    let text = match &cli.command {
        Some(Command::ShowConfig) => Ok(super::show::config(cfg)),
        Some(Command::ShowRules { app }) => super::show::rules(cfg, app.as_deref()),
        Some(Command::CheckHaproxy { .. }) | None if cli.validate => {
            Apps::compile(cfg).map(|apps| {
                format!(
                    "configuration OK: {} application(s), {} rules, bind {}\n",
                    cfg.applications.len(),
                    apps.rule_count(),
                    cfg.bind
                )
            })
        }
        Some(Command::CheckHaproxy { .. }) | None => return None,
    };
    let warnings = std::mem::take(warnings);
    Some(text.map(|text| Parsed::Print { text, warnings }))
}

/// The termination options, with coraza-spoa's `-metrics-addr` for `--admin-addr`.
fn termination(
    cli: &Cli,
    matches: &ArgMatches,
    problems: &mut Problems,
) -> Option<TerminationConfig> {
    let mut term = cli
        .term
        .validate(&cli::defaults())
        .map_err(|e| problems.extend(e))
        .ok();
    let Some(text) = &cli.metrics_addr else {
        return term;
    };
    match cli::listen_addr(text) {
        // A flag beats the environment (the image sets LASTCALL_ADMIN_ADDR): only the two
        // flags together are a conflict.
        _ if matches.value_source("admin_addr") == Some(ValueSource::CommandLine) => problems.push(
            Problem::new(
                "-metrics-addr",
                "is coraza-spoa's name for --admin-addr, which is set too",
            )
            .value(text.as_str())
            .expected("one of them"),
        ),
        Some(addr) => {
            if let Some(t) = term.as_mut() {
                t.admin_addr = Some(addr);
            }
        }
        None => problems.push(
            Problem::new("-metrics-addr", "not an address to listen on")
                .value(text.as_str())
                .expected("IP:PORT, or :PORT for every address (e.g. 127.0.0.1:9090, :9090)"),
        ),
    }
    term
}

/// `--bind` over the file's `bind`.
fn apply_bind(cli: &Cli, matches: &ArgMatches, cfg: &mut Config, problems: &mut Problems) {
    let Some(b) = &cli.bind else {
        return;
    };
    match Bind::parse(b) {
        Ok(bind) => cfg.bind = bind,
        Err(e) => problems.push(Problem::new("--bind", e).at(Source::from_matches(
            matches,
            "bind",
            Some("LASTCALL_SPOA_BIND"),
        ))),
    }
}

/// What is accepted with a caveat: coraza-spoa's profiling flags and `evaluation: inline`
/// (the CRS check adds its own: [`super::crs_check`]).
fn warnings(cli: &Cli, cfg: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for (flag, given) in [
        ("-cpuprofile", &cli.cpuprofile),
        ("-memprofile", &cli.memprofile),
    ] {
        if given.is_some() {
            out.push(format!(
                "{flag} (Go's profiler in coraza-spoa) is accepted and ignored; profile with perf instead"
            ));
        }
    }
    if cfg.evaluation == Evaluation::Inline {
        out.push(
            "evaluation: inline is no longer done and is ignored: every evaluation runs on the \
             evaluation threads (one slow evaluation on an I/O thread held up every connection, \
             the signals and the probes; docs/spoa.md)"
                .into(),
        );
    }
    out
}

/// Whether argument `id` was given on the command line or in the environment.
fn given(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// The process log: the file's `log_level`/`log_format` unless given on the command line
/// or in the environment, written where its `log_file` says (stderr by default).
#[allow(clippy::result_large_err)]
fn process_log(
    cli: &LogArgs,
    matches: &ArgMatches,
    cfg: &Config,
) -> Result<(LogArgs, crate::log::RuleLines, BoxMakeWriter), Problem> {
    let mut log = cli.clone();
    if let Some(level) = &cfg.log.level {
        if !given(matches, "log_level") {
            log.log_level = level.clone();
        }
    }
    let mut flat = false;
    if let Some(format) = cfg.log.format {
        if !given(matches, "log_format") {
            log.log_format = format.split().0;
            flat = format == crate::log::FileFormat::JsonFlat;
        }
    }
    let rules = crate::log::RuleLines::of(log.log_format, flat);
    let writer = match &cfg.log.file {
        None | Some((LogFile::Stderr, _)) => BoxMakeWriter::new(std::io::stderr),
        Some((LogFile::Stdout, _)) => BoxMakeWriter::new(std::io::stdout),
        Some((LogFile::Null, _)) => BoxMakeWriter::new(std::io::sink),
        Some((LogFile::Path(path), line)) => match super::apps::append(path) {
            // std's mutex: tracing-subscriber's `MakeWriter` is implemented for it.
            Ok(f) => BoxMakeWriter::new(std::sync::Mutex::new(f)),
            Err(e) => {
                return Err(Problem::new(
                    "log_file",
                    format!("cannot open {}: {e}", path.display()),
                )
                .at(cfg.source(*line)))
            }
        },
    };
    Ok((log, rules, writer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(args: &[&str]) -> Vec<String> {
        match parse(args.iter().copied()) {
            Err(p) => p.iter().map(ToString::to_string).collect(),
            Ok(other) => panic!("{other:?}"),
        }
    }

    /// One pass: the options, the file and the rules' errors together.
    #[test]
    fn every_problem_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(
            &path,
            "bind: nowhere\napplications:\n  - name: a\n    directives: SecFoo bar\n",
        )
        .unwrap();
        let file = format!("--config={}", path.display());
        // A file that does not load: its problems (the rules cannot be compiled).
        let shown = problems(&["x", &file, "--drain-timeout", "soon"]);
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert!(shown[0].starts_with("--drain-timeout (soon)"), "{shown:?}");
        assert!(shown[1].contains(":1: bind `nowhere`"), "{shown:?}");
        // A file that loads, with options that do not: its rules are reported too.
        std::fs::write(
            &path,
            "applications:\n  - name: a\n    directives: SecFoo bar\n",
        )
        .unwrap();
        let shown = problems(&["x", &file, "--bind", "nowhere", "--drain-timeout", "soon"]);
        assert_eq!(shown.len(), 3, "{shown:?}");
        assert!(shown[0].starts_with("--drain-timeout (soon)"), "{shown:?}");
        assert!(shown[1].starts_with("--bind"), "{shown:?}");
        assert!(shown[2].contains("application `a`"), "{shown:?}");
    }

    #[test]
    fn go_style_mistakes_are_reported_as_go_reports_them() {
        assert_eq!(
            problems(&["x", "-confg", "x.yaml"]),
            ["flag provided but not defined: -confg; expected one of the flags `lastcall-spoa --help` lists"]
        );
    }

    #[test]
    fn subcommands_and_settings() {
        match parse(["x", "check-haproxy", "a.cfg"]) {
            Ok(Parsed::CheckHaproxy(files)) => assert_eq!(files, [PathBuf::from("a.cfg")]),
            other => panic!("{other:?}"),
        }
        match parse(["x", "--bind", "127.0.0.1:1", "-autoreload=false"]) {
            Ok(Parsed::Run(s)) => {
                assert_eq!(s.config.bind, Bind::Tcp("127.0.0.1:1".into()));
                assert_eq!(s.autoreload, None);
                assert_eq!(s.source.path, None);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse(["x", "--nope"]), Ok(Parsed::Usage(_))));
        assert!(matches!(parse(["x", "--help"]), Ok(Parsed::Print { .. })));
    }

    /// How the process log writes matched rules: coraza-spoa's shape in JSON (the file's
    /// `json`, or `--log-format json`), fields with `json-flat` or in text; the command
    /// line wins over the file.
    #[test]
    fn the_process_logs_rule_lines() {
        use crate::log::RuleLines;
        use lastcall::LogFormat;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        let file = format!("--config={}", path.display());
        let lines = |yaml: &str, extra: &[&str]| {
            std::fs::write(&path, yaml).unwrap();
            let mut args = vec!["x", file.as_str()];
            args.extend_from_slice(extra);
            match parse(args) {
                Ok(Parsed::Run(s)) => (s.log.log_format, s.log_rules),
                other => panic!("{other:?}"),
            }
        };
        let app = "applications:\n  - name: a\n";
        let json = format!("log_format: json\n{app}");
        let flat = format!("log_format: json-flat\n{app}");
        let console = format!("log_format: console\n{app}");
        assert_eq!(lines(&json, &[]), (LogFormat::Json, RuleLines::Coraza));
        assert_eq!(lines(&flat, &[]), (LogFormat::Json, RuleLines::Fields));
        assert_eq!(lines(&console, &[]), (LogFormat::Text, RuleLines::Fields));
        assert_eq!(
            lines(&console, &["--log-format", "json"]),
            (LogFormat::Json, RuleLines::Coraza)
        );
        assert_eq!(
            lines(&flat, &["--log-format", "text"]),
            (LogFormat::Text, RuleLines::Fields)
        );
    }
}
