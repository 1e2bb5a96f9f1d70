//! The configuration file: coraza-spoa's YAML format, plus a few options of our own.
//!
//! Every problem is collected and reported at once, each with the line it is on and what
//! would be valid, before any port is bound. Unknown keys are errors (coraza-spoa also
//! decodes with known fields only).
//!
//! - `yaml`: the document as a tree of nodes that know their line;
//! - `file`: that tree walked key by key into a [`Config`];
//! - `seclang`: an application's rule text (Coraza's `@` names resolved, the engine's
//!   limits and the score rules added) and libmodsecurity's errors placed on the file's
//!   lines;
//! - `apps`: the applications compiled, as the WAF runs them and a reload swaps them;
//! - `settings`: the command line, the environment and the file read in one pass
//!   ([`parse`]);
//! - `show`: the effective configuration printed (`show-config`, `show-rules`).
//!
//! The file's problems name the file and the line (`/etc/coraza-spoa/config.yaml:12: ...`).

pub(crate) mod apps;
mod file;
mod seclang;
mod settings;
mod show;
mod yaml;

pub(crate) use crate::engine::{Bind, DEFAULT_MAX_FRAME_SIZE};
pub use apps::Apps;
pub use settings::{parse, FileSource, Parsed, Settings};

/// The admin listener's default address (`--admin-addr`), where `lastcall-spoa sessions`
/// looks unless told otherwise.
pub fn default_admin_addr() -> Option<std::net::SocketAddr> {
    crate::cli::defaults().admin_addr
}

use std::path::{Path, PathBuf};
use std::time::Duration;

use lastcall::{Problem, Problems, Source};
use lastcall_modsec::crs;

/// What to do when HAProxy hands the agent a truncated body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum BodyLimitAction {
    /// Deny with status 413 (never a silent fail-open). The default.
    #[default]
    Reject,
    /// Inspect the part that arrived and decide on it (logged and counted).
    ProcessPartial,
}

impl BodyLimitAction {
    /// The name the configuration file uses.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BodyLimitAction::Reject => "reject",
            BodyLimitAction::ProcessPartial => "process_partial",
        }
    }
}

/// An application's SecLang text as the file wrote it, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Directives {
    /// The text.
    pub(crate) text: String,
    /// The file's line for each line of `text` (1-based).
    pub(crate) lines: Vec<usize>,
    /// Where it is in the file: `applications[0].directives`.
    pub(crate) key: String,
}

impl Directives {
    /// Text with no file behind it (tests, the chart's rendered values): every line at 1.
    #[cfg(test)]
    pub(crate) fn inline(text: &str) -> Directives {
        Directives {
            text: text.to_owned(),
            lines: vec![1; text.split('\n').count()],
            key: "directives".into(),
        }
    }
}

/// Where log lines go (`log_file`): coraza-spoa's names for the standard streams, or a
/// file (appended to, created if missing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LogFile {
    /// `/dev/stdout`.
    Stdout,
    /// `/dev/stderr`.
    Stderr,
    /// `/dev/null`: nothing is written.
    Null,
    /// Any other path.
    Path(PathBuf),
}

impl LogFile {
    /// Reads `log_file` as coraza-spoa does (an empty value is standard output there; here
    /// it means "not set").
    pub(crate) fn parse(s: &str) -> Option<LogFile> {
        match s.trim() {
            "" => None,
            "/dev/stdout" => Some(LogFile::Stdout),
            "/dev/stderr" => Some(LogFile::Stderr),
            "/dev/null" => Some(LogFile::Null),
            other => Some(LogFile::Path(PathBuf::from(other))),
        }
    }
}

/// Log settings (`log_level`, `log_format`, `log_file`), at the top of the file or of one
/// application. Unset fields follow the process log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LogSettings {
    /// `debug`, `info`, `warn`, `error` or `off` (coraza-spoa's other names mapped).
    pub(crate) level: Option<String>,
    /// `console`/`text`, `json` (matched rules in coraza-spoa's shape) or `json-flat`.
    pub(crate) format: Option<crate::log::FileFormat>,
    /// Where, and the line that said so.
    pub(crate) file: Option<(LogFile, usize)>,
}

impl LogSettings {
    /// Whether any of the three was given.
    pub(crate) fn is_set(&self) -> bool {
        self.level.is_some() || self.format.is_some() || self.file.is_some()
    }
}

/// A checked application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Application {
    /// Name.
    pub name: String,
    /// The line of its `name` (0 for the built-in application).
    pub(crate) line: usize,
    /// Directives, or `None` for the CRS with our engine settings.
    pub(crate) directives: Option<Directives>,
    /// Where its matched rules are logged.
    pub(crate) log: LogSettings,
    /// Inspect responses.
    pub(crate) response_check: bool,
    /// Transaction TTL in milliseconds.
    pub(crate) transaction_ttl_ms: u64,
    /// Bound on kept transactions.
    pub(crate) transaction_active_limit: usize,
    /// DetectionOnly.
    pub(crate) detect_only: bool,
    /// Truncated-body policy.
    pub(crate) body_limit_action: BodyLimitAction,
    /// Paranoia level when using the default CRS.
    pub(crate) paranoia_level: u8,
    /// The engine's limits before the application's own directives (`engine_limits`;
    /// default true; the built-in rules always have them).
    pub(crate) engine_limits: bool,
}

impl Application {
    /// An application with every option at its default.
    pub(crate) fn new(name: &str) -> Application {
        Application {
            name: name.to_owned(),
            line: 0,
            directives: None,
            log: LogSettings::default(),
            response_check: false,
            transaction_ttl_ms: DEFAULT_TTL_MS,
            transaction_active_limit: DEFAULT_ACTIVE_LIMIT,
            detect_only: false,
            body_limit_action: BodyLimitAction::Reject,
            paranoia_level: 1,
            engine_limits: true,
        }
    }
}

/// The checked configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The file it was read from (`None`: no file, the built-in application).
    pub(crate) path: Option<PathBuf>,
    /// Listener.
    pub bind: Bind,
    /// The process log's settings from the file (top-level `log_level`, `log_format`,
    /// `log_file`); the command line's `--log-level` and `--log-format` win.
    pub(crate) log: LogSettings,
    /// Where the CRS is (`crs_dir`, `--crs-dir`; Debian's packages by default): what
    /// `@crs-setup.conf.example` and `@owasp_crs/...` name, and what the built-in
    /// application runs.
    pub(crate) crs: crs::Location,
    /// Default application name.
    pub default_application: Option<String>,
    /// Applications.
    pub applications: Vec<Application>,
    /// Our max frame size.
    pub max_frame_size: u32,
    /// Global evaluation bound.
    pub workers: usize,
    /// Per-connection evaluation bound.
    pub(crate) max_inflight_per_connection: usize,
    /// Where requests are evaluated (only `pool` is left; `inline` is read, and ignored).
    pub(crate) evaluation: Evaluation,
    /// Every NOTIFY is answered within this time (`evaluation_timeout`).
    pub evaluation_timeout: Duration,
    /// A connection without HELLO for this long is closed (`hello_timeout`).
    pub(crate) hello_timeout: Duration,
    /// A connection with nothing to do for this long is closed (`idle_timeout`).
    pub(crate) idle_timeout: Duration,
    /// Bytes held for frames, all connections together (`max_buffered_bytes`).
    pub(crate) max_buffered_bytes: usize,
}

/// Where the engine runs a request (`evaluation` in the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Evaluation {
    /// Asked for evaluations on the I/O threads; no longer done (one slow evaluation held
    /// up every connection and the probes): read so that older files load, then ignored
    /// with a warning.
    Inline,
    /// On `workers` dedicated evaluation threads fed by one queue: a slow evaluation never
    /// holds up another connection's I/O.
    Pool,
}

/// Default listener when neither the file nor `--bind` says.
pub(crate) const DEFAULT_BIND: &str = "127.0.0.1:9000";
/// Largest `max_frame_size` accepted (what `max_buffered_bytes` holds by default).
pub(crate) const MAX_FRAME_SIZE_CAP: u32 = 64 * 1024 * 1024;
/// Default transaction TTL (coraza-spoa's example value).
pub(crate) const DEFAULT_TTL_MS: u64 = 60_000;
/// Default bound on transactions waiting for a response.
pub(crate) const DEFAULT_ACTIVE_LIMIT: usize = 100_000;
/// Name of the built-in application used when no file is given.
pub(crate) const DEFAULT_APP: &str = "default";

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

impl Config {
    /// The configuration used when no file is given: one application running Debian's CRS
    /// at paranoia level 1.
    pub fn builtin() -> Self {
        Config {
            path: None,
            bind: Bind::Tcp(DEFAULT_BIND.into()),
            log: LogSettings::default(),
            crs: crs::Location::debian(),
            default_application: Some(DEFAULT_APP.into()),
            applications: vec![Application::new(DEFAULT_APP)],
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            workers: 2 * cpus(),
            max_inflight_per_connection: 64,
            evaluation: Evaluation::Pool,
            evaluation_timeout: crate::engine::EVALUATION_TIMEOUT,
            hello_timeout: crate::engine::HELLO_TIMEOUT,
            idle_timeout: crate::engine::IDLE_TIMEOUT,
            max_buffered_bytes: crate::engine::MAX_BUFFERED_BYTES,
        }
    }

    /// Reads and checks a file. Its problems name the file and the line
    /// (`/etc/lastcall-spoa.yaml:6: ...`).
    pub(crate) fn load(path: &Path) -> Result<Self, Problems> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Problems::from(
                Problem::new("", format!("cannot read: {e}")).at(Source::File {
                    path: Some(path.to_owned()),
                    line: None,
                }),
            )
        })?;
        match Self::parse(&text) {
            Ok(mut cfg) => {
                cfg.path = Some(path.to_owned());
                Ok(cfg)
            }
            Err(problems) => Err(in_file(problems, path)),
        }
    }

    /// Uses the CRS in `dir` (a release unpacked there, or laid out like one) instead of
    /// the file's `crs_dir` or Debian's packages.
    pub(crate) fn use_crs_dir(&mut self, dir: &Path) -> Result<(), String> {
        self.crs = crs::Location::from_dir(dir)?;
        Ok(())
    }

    /// The engine's limits this configuration sets (the rest at the engine's defaults).
    pub fn limits(&self) -> crate::engine::Limits {
        crate::engine::Limits {
            max_frame_size: self.max_frame_size,
            max_inflight_per_connection: self.max_inflight_per_connection,
            evaluation_timeout: self.evaluation_timeout,
            hello_timeout: self.hello_timeout,
            idle_timeout: self.idle_timeout,
            max_buffered_bytes: self.max_buffered_bytes,
            ..crate::engine::Limits::default()
        }
    }

    /// Where a problem on `line` of this configuration's file is.
    pub(crate) fn source(&self, line: usize) -> Source {
        Source::File {
            path: self.path.clone(),
            line: Some(line).filter(|l| *l > 0),
        }
    }

    /// Parses and checks YAML text, returning every problem found, in the order of their
    /// lines.
    pub(crate) fn parse(text: &str) -> Result<Self, Problems> {
        file::read(text)
    }
}

/// The fix named by every CRS 3 notice.
const CRS4_FIX: &str = "run a CRS 4 release: unpack it and set crs_dir in the file (or --crs-dir, \
    LASTCALL_SPOA_CRS_DIR, the chart's crs.image or crs.volume; CRS 4.28 loads on \
    libmodsecurity 3.0.9 and later, 4.25.1 and later 4.25 LTS releases on 3.0.16, the image's; \
    docs/coming-from-coraza-spoa.md)";

/// What the configured CRS makes of the applications' own rules: against a CRS 3 tree, the
/// CRS 4 variables they set (which change nothing there) and coraza-spoa's `@owasp_crs` and
/// `@crs-setup.conf.example` names (CRS 4.25.0 in coraza-spoa 0.7.2, CRS 3 here), each at
/// its application's `directives` line and naming the fix. Refused unless
/// `--accept-crs3` ([`crs_check`]): the rules would load and run a weaker WAF than written.
pub(crate) fn crs_problems(cfg: &Config) -> Vec<Problem> {
    let crs = &cfg.crs;
    if crs.major() != Some(3) {
        return Vec::new();
    }
    let tree = crs_tree(crs);
    let release = crs.version().unwrap_or_default();
    let mut out = Vec::new();
    for a in &cfg.applications {
        let Some(d) = &a.directives else {
            continue;
        };
        let line = d.lines.first().copied().unwrap_or(a.line);
        let problem = |message: String| {
            Problem::new(
                d.key.clone(),
                format!("application `{}`: {message}", a.name),
            )
            .expected(format!(
                "a CRS 4 tree ({CRS4_FIX}), or --accept-crs3 (LASTCALL_SPOA_ACCEPT_CRS3=true) to run CRS {release} knowingly"
            ))
            .at(cfg.source(line))
        };
        let set = crs::tx_variables_set(&d.text);
        for (name, instead) in crs::crs4_only_variables(&d.text) {
            // Set together with its CRS 3 name (rules written for both, as the built-in
            // text is): CRS 3 reads that one, nothing is lost.
            let both = instead
                .and_then(|v| v.strip_prefix("tx."))
                .is_some_and(|v| set.iter().any(|s| s == v));
            if both {
                continue;
            }
            let instead = instead.map_or_else(String::new, |v| format!("; its CRS 3 name is {v}"));
            out.push(problem(format!(
                "setvar:tx.{name} is read by CRS 4 only: the CRS here ({tree}, {release}) ignores it, so it would change nothing{instead}"
            )));
        }
        let coraza_names = d
            .text
            .lines()
            .any(|l| l.contains("@owasp_crs/") || l.contains("@crs-setup.conf.example"));
        if coraza_names {
            out.push(problem(format!(
                "@owasp_crs/ and @crs-setup.conf.example are coraza-spoa's embedded CRS ({} in coraza-spoa 0.7.2); here they would be the CRS at {tree}, release {release}: rule ids, paranoia-level variables and plugins differ between CRS 3 and 4",
                crs::CORAZA_SPOA_CRS
            )));
        }
    }
    out
}

/// Where a CRS tree is, for messages: the directory holding `rules/`.
fn crs_tree(crs: &crs::Location) -> std::path::Display<'_> {
    crs.rules_dir.parent().unwrap_or(&crs.rules_dir).display()
}

/// The CRS check at start, `-validate` and every reload: [`crs_problems`] are refused
/// unless `accept_crs3`, then warnings; a CRS 3 tree also gets a warning that names the
/// release and says that its upstream support has ended.
pub(crate) fn crs_check(cfg: &Config, accept_crs3: bool) -> Result<Vec<String>, Problems> {
    let problems = crs_problems(cfg);
    if !accept_crs3 && !problems.is_empty() {
        return Err(problems.into_iter().collect());
    }
    let mut out: Vec<String> = problems.iter().map(ToString::to_string).collect();
    if cfg.crs.major() == Some(3) {
        out.push(crs3_notice(&cfg.crs));
    }
    Ok(out)
}

/// Which CRS 3 release runs, and that the OWASP CRS project no longer supports it.
fn crs3_notice(crs: &crs::Location) -> String {
    let release = crs.version().unwrap_or_else(|| "3.x".into());
    let debian = if *crs == crs::Location::debian() {
        " (Debian's modsecurity-crs package: its security updates are Debian's own)"
    } else {
        ""
    };
    format!(
        "the rules run CRS {release} from {}{debian}; the OWASP CRS project ended support for CRS 3.3 in Q3 2026. To {CRS4_FIX}",
        crs_tree(crs)
    )
}

/// Places problems found in text read from `path` in that file.
fn in_file(problems: Problems, path: &Path) -> Problems {
    problems
        .into_iter()
        .map(|mut p| {
            if let Source::File {
                path: at @ None, ..
            } = &mut p.source
            {
                *at = Some(path.to_owned());
            }
            p
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CORAZA_EXAMPLE: &str = "\
# The SPOA server bind address
bind: 0.0.0.0:9000
log_level: info
log_file: /dev/stdout
log_format: console

applications:
  - name: sample_app
    directives: |
      SecRuleEngine On
    response_check: false
    transaction_ttl_ms: 60000
    log_level: info
    log_file: /dev/stdout
    log_format: console
";

    #[test]
    fn coraza_spoa_example_loads() {
        let c = Config::parse(CORAZA_EXAMPLE).unwrap();
        assert_eq!(c.bind, Bind::Tcp("0.0.0.0:9000".into()));
        assert_eq!(c.applications.len(), 1);
        assert_eq!(c.applications[0].transaction_ttl_ms, 60_000);
        assert_eq!(c.log.format, Some(crate::log::FileFormat::Text));
        assert_eq!(c.log.file, Some((LogFile::Stdout, 4)));
        let app = &c.applications[0];
        assert_eq!(app.log.file, Some((LogFile::Stdout, 14)));
        assert_eq!(app.log.level.as_deref(), Some("info"));
        let d = app.directives.as_ref().expect("directives");
        assert_eq!(d.key, "applications[0].directives");
        assert_eq!(d.lines[0], 10, "{d:?}");
    }

    #[test]
    fn unknown_keys_are_all_reported_with_lines() {
        let text = "\
bind: 127.0.0.1:9000
bnid: oops
applications:
  - name: a
    directives: SecRuleEngine On
    respons_check: true
    transaction_ttl_ms: 5
";
        let errs = Config::parse(text).unwrap_err();
        let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert!(
            shown
                .iter()
                .any(|e| e.starts_with("line 2:") && e.contains("bnid")),
            "{shown:?}"
        );
        assert!(
            shown
                .iter()
                .any(|e| e.starts_with("line 6:") && e.contains("respons_check")),
            "{shown:?}"
        );
    }

    #[test]
    fn semantic_errors_collected() {
        let text = "\
bind: nowhere
default_application: missing
applications:
  - name: a
    paranoia_level: 9
";
        let errs = Config::parse(text).unwrap_err();
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert_eq!(
            errs.iter().next().map(|e| &e.source),
            Some(&Source::line(1))
        );
    }

    /// Wrong types, duplicates, missing names and bad values, all reported in one pass, each
    /// on its own line, with what would be valid.
    #[test]
    fn every_problem_at_once() {
        let text = "\
bind: 127.0.0.1:9000
workers: \"4\"
bind: 127.0.0.1:9001
max_frame_size: 100
applications:
  - name: a
    response_check: yes
    body_limit_action: drop
    rules: SecRuleEngine On
  - directives: SecRuleEngine On
  - 3
  - name: a
default_application: b
";
        let errs = Config::parse(text).unwrap_err();
        let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "line 2: workers: invalid type: string \"4\"; expected a non-negative integer",
                "line 3: duplicate field `bind` (first given on line 1)",
                "line 4: max_frame_size 100: must be between 256 and 67108864",
                "line 7: applications[0].response_check: invalid type: string \"yes\"; expected a boolean (true or false)",
                "line 8: applications[0].body_limit_action: unknown variant `drop`; expected `reject` or `process_partial`",
                "line 9: applications[0].rules: invalid type: string \"SecRuleEngine On\"; expected a sequence of directive lines",
                "line 10: applications[1]: missing field `name`",
                "line 11: applications[2]: invalid type: integer `3`; expected an application (a mapping with a `name`)",
                "line 12: application `a` defined twice",
                "line 13: default_application `b` is not among the applications",
            ]
        );
        let errs = Config::parse("applications:\n  - name: a\n    rules: [\n").unwrap_err();
        assert!(
            errs.len() == 1 && errs.to_string().contains("invalid YAML: "),
            "{errs:?}"
        );
    }

    /// What serde_yaml accepted is still accepted: scalars as text where text is expected,
    /// `0x` integers, capitalised booleans, coraza-spoa's older `rules` and
    /// `transaction_ttl` (seconds).
    #[test]
    fn lenient_where_coraza_spoa_users_are() {
        let c = Config::parse(
            "bind: ~\nworkers: 0x10\napplications:\n  - name: 12\n    response_check: True\n    transaction_ttl: 5\n    rules:\n      - SecRuleEngine On\n      - 1\n",
        )
        .unwrap();
        assert_eq!(c.bind, Bind::Tcp(DEFAULT_BIND.into()));
        assert_eq!(c.workers, 16);
        let a = &c.applications[0];
        assert_eq!(a.name, "12");
        assert!(a.response_check);
        assert_eq!(a.transaction_ttl_ms, 5000);
        assert_eq!(
            a.directives.as_ref().map(|d| d.text.as_str()),
            Some("SecRuleEngine On\n1")
        );
        assert_eq!(
            a.directives.as_ref().map(|d| d.lines.clone()),
            Some(vec![8, 9])
        );
    }

    /// Problems of a file name the file and the line, as the printer shows them.
    #[test]
    fn problems_of_a_file_name_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "bind: nowhere\napplications:\n  - name: a\n").unwrap();
        let errs = Config::load(&path).unwrap_err();
        let shown = errs.to_string();
        assert!(
            shown.starts_with(&format!("{}:1: bind `nowhere`", path.display())),
            "{shown}"
        );
    }

    /// Per-application and top-level log settings are checked like every other key.
    #[test]
    fn log_settings_are_checked() {
        let text = "\
log_format: fancy
log_file: \"\"
applications:
  - name: a
    log_level: loud
    log_format: xml
    log_file: /var/log/a.log
";
        let errs = Config::parse(text).unwrap_err();
        let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "line 1: log_format `fancy`: expected console, text, json or json-flat",
                "line 5: applications[0].log_level (loud): expected trace, debug, info, warn, error, fatal, panic or disabled",
                "line 6: applications[0].log_format (xml): expected console, text, json or json-flat",
            ]
        );
        let ok = Config::parse("applications:\n  - name: a\n    log_file: /var/log/a.log\n    log_format: json\n    log_level: disabled\n").unwrap();
        let log = &ok.applications[0].log;
        assert_eq!(log.file, Some((LogFile::Path("/var/log/a.log".into()), 3)));
        assert_eq!(
            (log.format, log.level.as_deref()),
            (Some(crate::log::FileFormat::Json), Some("off"))
        );
    }

    #[test]
    fn crs_dir_is_checked_where_it_is_written() {
        let errs =
            Config::parse("crs_dir: /nonexistent/crs\napplications:\n  - name: a\n").unwrap_err();
        let shown = errs.to_string();
        assert!(
            shown.starts_with(
                "line 1: crs_dir (/nonexistent/crs): /nonexistent/crs/rules has no REQUEST-*.conf"
            ),
            "{shown}"
        );
    }

    #[test]
    fn evaluation_modes() {
        let base = "applications:\n  - name: a\n";
        assert_eq!(Config::parse(base).unwrap().evaluation, Evaluation::Pool);
        let inline = format!("evaluation: inline\n{base}");
        assert_eq!(
            Config::parse(&inline).unwrap().evaluation,
            Evaluation::Inline
        );
        let bad = format!("{base}evaluation: threads\n");
        let errs = Config::parse(&bad).unwrap_err();
        let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            ["line 3: evaluation `threads`: expected inline or pool"],
            "{shown:?}"
        );
    }

    #[test]
    fn limits_and_timeouts() {
        let c = Config::parse(
            "evaluation_timeout: 250ms\nhello_timeout: 5s\nidle_timeout: 20m\nmax_buffered_bytes: 8388608\napplications:\n  - name: a\n",
        )
        .unwrap();
        assert_eq!(c.evaluation_timeout, Duration::from_millis(250));
        assert_eq!(c.hello_timeout, Duration::from_secs(5));
        assert_eq!(c.idle_timeout, Duration::from_secs(1200));
        assert_eq!(c.max_buffered_bytes, 8 << 20);
        let d = Config::parse("applications:\n  - name: a\n").unwrap();
        assert_eq!(d.evaluation_timeout, Duration::from_secs(4));
        assert_eq!(d.idle_timeout, Duration::from_secs(600));
        let errs = Config::parse(
            "evaluation_timeout: soon\nidle_timeout: 0\nmax_buffered_bytes: 1000\nhello_timeout: [1]\napplications:\n  - name: a\n",
        )
        .unwrap_err();
        let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "line 1: evaluation_timeout (soon): expected a number at `soon` (write e.g. 30s, 5m, 1h30m, 250ms or 30)",
                "line 2: idle_timeout 0s: must be between 1s and 1d",
                "line 3: max_buffered_bytes 1000: must be at least max_frame_size + 4 (4194308)",
                "line 4: hello_timeout: invalid type: sequence; expected a duration such as 1s, 500ms or 2m",
            ],
            "{shown:?}"
        );
    }

    /// Against Debian's CRS 3 tree (the stand-in for any CRS 3): CRS 4 variables and
    /// coraza-spoa's names are refused, each naming the fix and `--accept-crs3`; accepted,
    /// they are warnings. Every CRS 3 run says which release runs and that its support
    /// ended; the built-in application sets no CRS 4 variable and names no `@owasp_crs`.
    #[test]
    fn crs_4_rules_against_a_crs_3_tree() {
        let builtin = Config::builtin();
        assert!(crs_problems(&builtin).is_empty());
        let notice = crs_check(&builtin, false).unwrap();
        assert_eq!(notice.len(), 1, "{notice:?}");
        assert!(
            notice[0].starts_with("the rules run CRS 3.")
                && notice[0].contains(
                    "(Debian's modsecurity-crs package: its security updates are Debian's own)"
                )
                && notice[0].contains("ended support for CRS 3.3 in Q3 2026"),
            "{notice:?}"
        );
        let c = Config::parse(CORAZA_EXAMPLE).unwrap();
        assert!(crs_problems(&c).is_empty(), "no @owasp_crs in this example");
        let text = "applications:\n  - name: a\n    directives: |\n      Include @coraza.conf-recommended\n      Include @crs-setup.conf.example\n      SecAction \"id:900000,phase:1,pass,nolog,setvar:tx.blocking_paranoia_level=4\"\n      Include @owasp_crs/*.conf\n";
        let c = Config::parse(text).unwrap();
        let refused: Vec<String> = crs_check(&c, false)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(refused[0].starts_with("line 4: applications[0].directives: application `a`: setvar:tx.blocking_paranoia_level is read by CRS 4 only"), "{refused:?}");
        assert!(
            refused[0].contains("its CRS 3 name is tx.paranoia_level"),
            "{refused:?}"
        );
        assert!(
            refused[1].contains("coraza-spoa's embedded CRS (4.25.0 in coraza-spoa 0.7.2)"),
            "{refused:?}"
        );
        assert!(
            refused
                .iter()
                .all(|n| n.contains("crs_dir") && n.contains("--accept-crs3")),
            "{refused:?}"
        );
        // Set with its CRS 3 name too (the built-in text does): nothing to refuse for it.
        let both = text.replace(
            "setvar:tx.blocking_paranoia_level=4",
            "setvar:tx.paranoia_level=4,setvar:tx.blocking_paranoia_level=4",
        );
        let problems = crs_problems(&Config::parse(&both).unwrap());
        assert_eq!(problems.len(), 1, "only @owasp_crs: {problems:?}");
        let builtin_text = crs::debian_default_directives(&crs::CrsOptions::default());
        assert!(crs::crs4_only_variables(&builtin_text).len() == 1);
        let accepted = crs_check(&c, true).unwrap();
        assert_eq!(accepted.len(), 3, "{accepted:?}");
        assert_eq!(accepted[..2], refused[..], "the same text, as warnings");
    }

    #[test]
    fn bind_forms() {
        assert_eq!(
            Bind::parse("unix:///run/a.sock"),
            Ok(Bind::Unix("/run/a.sock".into()))
        );
        assert_eq!(
            Bind::parse("[::1]:9000"),
            Ok(Bind::Tcp("[::1]:9000".into()))
        );
        assert!(Bind::parse("9000").is_err());
    }
}
