//! The configuration file: coraza-spoa's YAML format, plus a few options of our own.
//!
//! Every problem is collected and reported at once, each with the line it is on, before any
//! port is bound. Unknown keys are errors (coraza-spoa also decodes with known-fields only).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where the agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bind {
    /// `host:port`.
    Tcp(String),
    /// `unix:///path/to.sock`.
    Unix(PathBuf),
}

impl Bind {
    /// Parses `host:port`, `tcp://host:port` or `unix://path`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("unix://") {
            if path.is_empty() {
                return Err(format!("bind `{s}`: empty unix socket path"));
            }
            return Ok(Bind::Unix(PathBuf::from(path)));
        }
        let hostport = s.strip_prefix("tcp://").unwrap_or(s);
        match hostport.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Ok(Bind::Tcp(hostport.to_owned()))
            }
            _ => Err(format!(
                "bind `{s}`: expected host:port (e.g. 127.0.0.1:9000) or unix:///path"
            )),
        }
    }
}

impl std::fmt::Display for Bind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bind::Tcp(a) => f.write_str(a),
            Bind::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

/// What to do when HAProxy hands the agent a truncated body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BodyLimitAction {
    /// Deny with status 413 (never a silent fail-open). The default.
    #[default]
    Reject,
    /// Inspect the part that arrived and decide on it (logged and counted).
    ProcessPartial,
}

/// The file as written (coraza-spoa's field names).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `host:port` or `unix:///path`.
    pub bind: Option<String>,
    /// Log level (coraza-spoa: debug/info/warn/error/panic/fatal).
    pub log_level: Option<String>,
    /// Accepted for compatibility; logs go to stderr.
    pub log_file: Option<String>,
    /// `console`/`text` or `json`.
    pub log_format: Option<String>,
    /// Application used when HAProxy sends an unknown `app`.
    pub default_application: Option<String>,
    /// The applications.
    #[serde(default)]
    pub applications: Vec<FileApplication>,
    /// Largest SPOP frame we accept (ours; min'd with HAProxy's). Default 1 MiB.
    pub max_frame_size: Option<u32>,
    /// Concurrent WAF evaluations, all connections together. Default 2 x CPUs.
    pub workers: Option<usize>,
    /// Concurrent evaluations per connection (pipelined NOTIFYs). Default 64.
    pub max_inflight_per_connection: Option<usize>,
    /// Where requests are evaluated: `pool` (default) or `inline`.
    pub evaluation: Option<String>,
}

/// One application as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileApplication {
    /// Matched against the `app` argument.
    pub name: String,
    /// ModSecurity directives (SecLang).
    #[serde(default)]
    pub directives: Option<String>,
    /// Keep the transaction for `coraza-res`.
    #[serde(default)]
    pub response_check: bool,
    /// How long a transaction waits for its response, in milliseconds.
    pub transaction_ttl_ms: Option<u64>,
    /// Old coraza-spoa name (seconds).
    pub transaction_ttl: Option<u64>,
    /// Most transactions kept waiting for their response.
    pub transaction_active_limit: Option<usize>,
    /// Accepted for compatibility (per-application logging goes to the process log).
    pub log_level: Option<String>,
    /// Accepted for compatibility.
    pub log_file: Option<String>,
    /// Accepted for compatibility.
    pub log_format: Option<String>,
    /// Old coraza-spoa name for `directives`, a list of lines.
    pub rules: Option<Vec<String>>,
    /// Ours: run in DetectionOnly (record, never deny).
    #[serde(default)]
    pub detect_only: bool,
    /// Ours: truncated-body policy.
    #[serde(default)]
    pub body_limit_action: BodyLimitAction,
    /// Ours: with no `directives`, the CRS paranoia level for Debian's CRS (1-4).
    pub paranoia_level: Option<u8>,
}

/// A checked application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Application {
    /// Name.
    pub name: String,
    /// Directives, or `None` for Debian's CRS with our engine settings.
    pub directives: Option<String>,
    /// Inspect responses.
    pub response_check: bool,
    /// Transaction TTL in milliseconds.
    pub transaction_ttl_ms: u64,
    /// Bound on kept transactions.
    pub transaction_active_limit: usize,
    /// DetectionOnly.
    pub detect_only: bool,
    /// Truncated-body policy.
    pub body_limit_action: BodyLimitAction,
    /// Paranoia level when using the default CRS.
    pub paranoia_level: u8,
}

/// The checked configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Listener.
    pub bind: Bind,
    /// Log level from the file, if any.
    pub log_level: Option<String>,
    /// `json` if the file asked for it.
    pub log_json: Option<bool>,
    /// Default application name.
    pub default_application: Option<String>,
    /// Applications.
    pub applications: Vec<Application>,
    /// Our max frame size.
    pub max_frame_size: u32,
    /// Global evaluation bound.
    pub workers: usize,
    /// Per-connection evaluation bound.
    pub max_inflight_per_connection: usize,
    /// Where requests are evaluated.
    pub evaluation: Evaluation,
}

/// Where the engine runs a request (`evaluation` in the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evaluation {
    /// On the connection's own I/O thread, right after its NOTIFY is decoded (`workers` I/O
    /// threads): no hand-off between threads, as nginx's in-process WAF.
    Inline,
    /// On `workers` dedicated evaluation threads fed by one queue: a slow evaluation never
    /// holds up another connection's I/O.
    Pool,
}

impl Evaluation {
    /// The file's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Evaluation::Inline => "inline",
            Evaluation::Pool => "pool",
        }
    }
}

/// Default listener when neither the file nor `--bind` says.
pub const DEFAULT_BIND: &str = "127.0.0.1:9000";
/// Default transaction TTL (coraza-spoa's example value).
pub const DEFAULT_TTL_MS: u64 = 60_000;
/// Default bound on transactions waiting for a response.
pub const DEFAULT_ACTIVE_LIMIT: usize = 100_000;
/// Name of the built-in application used when no file is given.
pub const DEFAULT_APP: &str = "default";

/// One configuration problem, with its line when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line, if known.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "line {l}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Every problem found in a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render(.file, .problems))]
pub struct ConfigErrors {
    /// The file, if any.
    pub file: Option<PathBuf>,
    /// The problems.
    pub problems: Vec<Problem>,
}

fn render(file: &Option<PathBuf>, problems: &[Problem]) -> String {
    let name = file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "configuration".into());
    problems
        .iter()
        .map(|p| format!("{name}: {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

impl Config {
    /// The configuration used when no file is given: one application running Debian's CRS
    /// at paranoia level 1.
    pub fn builtin() -> Self {
        Config {
            bind: Bind::Tcp(DEFAULT_BIND.into()),
            log_level: None,
            log_json: None,
            default_application: Some(DEFAULT_APP.into()),
            applications: vec![Application {
                name: DEFAULT_APP.into(),
                directives: None,
                response_check: false,
                transaction_ttl_ms: DEFAULT_TTL_MS,
                transaction_active_limit: DEFAULT_ACTIVE_LIMIT,
                detect_only: false,
                body_limit_action: BodyLimitAction::Reject,
                paranoia_level: 1,
            }],
            max_frame_size: spop::MAX_FRAME_SIZE_LIMIT,
            workers: 2 * cpus(),
            max_inflight_per_connection: 64,
            evaluation: Evaluation::Pool,
        }
    }

    /// Reads and checks a file.
    pub fn load(path: &Path) -> Result<Self, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigErrors {
            file: Some(path.to_owned()),
            problems: vec![Problem {
                line: None,
                message: format!("cannot read: {e}"),
            }],
        })?;
        Self::parse(&text).map_err(|problems| ConfigErrors {
            file: Some(path.to_owned()),
            problems,
        })
    }

    /// Parses and checks YAML text, returning every problem found.
    pub fn parse(text: &str) -> Result<Self, Vec<Problem>> {
        let (file, mut problems) = deserialize_collecting(text);
        let Some(file) = file else {
            return Err(problems);
        };
        let cfg = check(file, text, &mut problems);
        if problems.is_empty() {
            Ok(cfg)
        } else {
            problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
            Err(problems)
        }
    }
}

/// Deserializes, blanking out each offending key (and its block) and retrying, so that every
/// unknown key and wrongly typed value is reported, each with its own line.
fn deserialize_collecting(text: &str) -> (Option<FileConfig>, Vec<Problem>) {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut problems = Vec::new();
    for _ in 0..100 {
        let current = lines.join("\n");
        match serde_yaml::from_str::<FileConfig>(&current) {
            Ok(f) => return (problems.is_empty().then_some(f), problems),
            Err(e) => {
                let line = e.location().map(|l| l.line());
                let message = strip_location(&e.to_string());
                let retryable = message.contains("unknown field")
                    || message.contains("invalid type")
                    || message.contains("invalid value");
                problems.push(Problem { line, message });
                match line {
                    Some(l) if retryable && l >= 1 && l <= lines.len() => {
                        blank_block(&mut lines, l - 1)
                    }
                    _ => return (None, problems),
                }
            }
        }
    }
    (None, problems)
}

fn strip_location(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

/// Blanks line `idx` and the more-indented lines under it. A `- key:` list item keeps its
/// dash so the list stays a list.
fn blank_block(lines: &mut [String], idx: usize) {
    let Some(first) = lines.get(idx).cloned() else {
        return;
    };
    let indent = first.len() - first.trim_start().len();
    let trimmed = first.trim_start();
    let key_col = if trimmed.starts_with("- ") {
        indent + 2
    } else {
        indent
    };
    lines[idx] = if trimmed.starts_with("- ") {
        format!("{}- {{}}", " ".repeat(indent))
    } else {
        String::new()
    };
    // If the dash item was blanked, merging remaining keys into `{}` would break the item, so
    // for list items we only blank the key line itself and its deeper block.
    for line in lines.iter_mut().skip(idx + 1) {
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let ind = line.len() - t.len();
        if ind > key_col {
            line.clear();
        } else {
            break;
        }
    }
    if trimmed.starts_with("- ") {
        // Re-attach the item's remaining keys: turn `- {}` back into a plain dash so the
        // following sibling keys (indented at key_col) form the mapping.
        let has_siblings = lines
            .iter()
            .skip(idx + 1)
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| {
                let t = l.trim_start();
                l.len() - t.len() == key_col && !t.starts_with("- ")
            });
        if has_siblings {
            lines[idx] = format!("{}-", " ".repeat(indent));
        }
    }
}

fn find_line(text: &str, key: &str, value: Option<&str>) -> Option<usize> {
    text.lines()
        .position(|l| {
            let t = l.trim_start().trim_start_matches("- ");
            t.strip_prefix(key)
                .is_some_and(|r| r.trim_start().starts_with(':'))
                && value.is_none_or(|v| l.contains(v))
        })
        .map(|i| i + 1)
}

fn check(f: FileConfig, text: &str, problems: &mut Vec<Problem>) -> Config {
    let mut cfg = Config::builtin();
    cfg.applications.clear();
    cfg.default_application = None;
    if let Some(b) = &f.bind {
        match Bind::parse(b) {
            Ok(bind) => cfg.bind = bind,
            Err(message) => problems.push(Problem {
                line: find_line(text, "bind", None),
                message,
            }),
        }
    }
    if let Some(level) = &f.log_level {
        match map_level(level) {
            Some(l) => cfg.log_level = Some(l.into()),
            None => problems.push(Problem {
                line: find_line(text, "log_level", Some(level)),
                message: format!(
                    "log_level `{level}`: expected debug, info, warn, error, panic or fatal"
                ),
            }),
        }
    }
    if let Some(fmt) = &f.log_format {
        match fmt.as_str() {
            "console" | "text" => cfg.log_json = Some(false),
            "json" => cfg.log_json = Some(true),
            other => problems.push(Problem {
                line: find_line(text, "log_format", Some(other)),
                message: format!("log_format `{other}`: expected console, text or json"),
            }),
        }
    }
    if let Some(n) = f.max_frame_size {
        if !(crate::protocol::payload::MIN_FRAME_SIZE..=spop::MAX_FRAME_SIZE_LIMIT).contains(&n) {
            problems.push(Problem {
                line: find_line(text, "max_frame_size", None),
                message: format!(
                    "max_frame_size {n}: must be between {} and {}",
                    crate::protocol::payload::MIN_FRAME_SIZE,
                    spop::MAX_FRAME_SIZE_LIMIT
                ),
            });
        } else {
            cfg.max_frame_size = n;
        }
    }
    for (key, value, target) in [
        ("workers", f.workers, &mut cfg.workers),
        (
            "max_inflight_per_connection",
            f.max_inflight_per_connection,
            &mut cfg.max_inflight_per_connection,
        ),
    ] {
        match value {
            Some(0) => problems.push(Problem {
                line: find_line(text, key, None),
                message: format!("{key}: must be at least 1"),
            }),
            Some(n) => *target = n,
            None => {}
        }
    }
    match f.evaluation.as_deref() {
        None | Some("pool") => {}
        Some("inline") => cfg.evaluation = Evaluation::Inline,
        Some(other) => problems.push(Problem {
            line: find_line(text, "evaluation", Some(other)),
            message: format!("evaluation `{other}`: expected inline or pool"),
        }),
    }
    let mut names = HashSet::new();
    for app in f.applications {
        let line = find_line(text, "name", Some(&app.name));
        if app.name.trim().is_empty() {
            problems.push(Problem {
                line,
                message: "application with an empty name".into(),
            });
        }
        if !names.insert(app.name.clone()) {
            problems.push(Problem {
                line,
                message: format!("application `{}` defined twice", app.name),
            });
        }
        if let Some(p) = app.paranoia_level {
            if !(1..=4).contains(&p) {
                problems.push(Problem {
                    line: find_line(text, "paranoia_level", None),
                    message: format!("paranoia_level {p}: must be 1 to 4"),
                });
            }
        }
        if let Some(level) = &app.log_level {
            if map_level(level).is_none() {
                problems.push(Problem {
                    line: find_line(text, "log_level", Some(level)),
                    message: format!(
                        "log_level `{level}`: expected debug, info, warn, error, panic or fatal"
                    ),
                });
            }
        }
        let directives = match (app.directives, app.rules) {
            (Some(d), _) => Some(d),
            (None, Some(lines)) => Some(lines.join("\n")),
            (None, None) => None,
        };
        cfg.applications.push(Application {
            name: app.name,
            directives,
            response_check: app.response_check,
            transaction_ttl_ms: app
                .transaction_ttl_ms
                .or(app.transaction_ttl.map(|s| s.saturating_mul(1000)))
                .unwrap_or(DEFAULT_TTL_MS),
            transaction_active_limit: app.transaction_active_limit.unwrap_or(DEFAULT_ACTIVE_LIMIT),
            detect_only: app.detect_only,
            body_limit_action: app.body_limit_action,
            paranoia_level: app.paranoia_level.unwrap_or(1),
        });
    }
    match f.default_application {
        Some(d) if !names.contains(&d) => problems.push(Problem {
            line: find_line(text, "default_application", None),
            message: format!("default_application `{d}` is not among the applications"),
        }),
        other => cfg.default_application = other,
    }
    if cfg.applications.is_empty() {
        problems.push(Problem {
            line: None,
            message: "no applications defined (omit --config to run the built-in CRS application)"
                .into(),
        });
    }
    cfg
}

fn map_level(level: &str) -> Option<&'static str> {
    match level.to_ascii_lowercase().as_str() {
        "trace" => Some("trace"),
        "debug" => Some("debug"),
        "info" => Some("info"),
        "warn" | "warning" => Some("warn"),
        "error" | "panic" | "fatal" => Some("error"),
        _ => None,
    }
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
        assert_eq!(c.log_json, Some(false));
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
        assert_eq!(errs[0].line, Some(1));
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
