//! Reading the file: its YAML tree walked key by key into a [`Config`], every problem
//! collected with its line (unknown and duplicate keys, wrong types, values out of range,
//! names that refer to nothing), and what would be valid.
//!
//! Each problem is a [`lastcall::Problem`] placed by line, keyed by where it is in the file
//! (`applications[0].response_check`), in serde's words where coraza-spoa users have seen
//! them (``unknown field `x` ``, `invalid type: string "yes"`), with what would be valid.

use std::collections::HashSet;
use std::time::Duration;

use lastcall::{Problem, Problems, Source};
use lastcall_spop_proto::payload::MIN_FRAME_SIZE;

use super::yaml::{self, Node, Typed, Value};
use super::{
    Application, Bind, BodyLimitAction, Config, Directives, Evaluation, LogFile, LogSettings,
};
use crate::log::FileFormat;

/// The top-level keys (coraza-spoa's, then ours).
const TOP: &[&str] = &[
    "bind",
    "log_level",
    "log_file",
    "log_format",
    "default_application",
    "applications",
    "max_frame_size",
    "workers",
    "max_inflight_per_connection",
    "evaluation",
    "crs_dir",
    "evaluation_timeout",
    "hello_timeout",
    "idle_timeout",
    "max_buffered_bytes",
];

/// The keys of one application (coraza-spoa's, its older names, then ours).
const APPLICATION: &[&str] = &[
    "name",
    "directives",
    "response_check",
    "transaction_ttl_ms",
    "transaction_ttl",
    "transaction_active_limit",
    "log_level",
    "log_file",
    "log_format",
    "rules",
    "detect_only",
    "body_limit_action",
    "paranoia_level",
    "engine_limits",
];

const LOG_LEVELS: &str = "trace, debug, info, warn, error, fatal, panic or disabled";
const LOG_FORMATS: &str = crate::log::FORMATS;

/// Reads YAML text into a checked configuration, or returns every problem found, in the
/// order of their lines.
pub(super) fn read(text: &str) -> Result<Config, Problems> {
    let mut r = Reader::default();
    let root = match yaml::parse(text) {
        Ok(root) => root,
        Err(e) => {
            return Err(Problems::from(
                Problem::new("", format!("invalid YAML: {}", e.message)).at(Source::line(e.line)),
            ))
        }
    };
    let cfg = r.config(root.as_ref());
    if r.problems.is_empty() {
        return Ok(cfg);
    }
    r.problems.sort_by_key(|p| match p.source {
        Source::File {
            line: Some(line), ..
        } => line,
        _ => usize::MAX,
    });
    Err(Problems::from(r.problems))
}

/// Maps coraza-spoa's log levels (zerolog's names and numbers) to ours.
fn map_level(level: &str) -> Option<&'static str> {
    match level.to_ascii_lowercase().as_str() {
        "trace" | "-1" => Some("trace"),
        "debug" | "0" => Some("debug"),
        "info" | "1" => Some("info"),
        "warn" | "warning" | "2" => Some("warn"),
        "error" | "panic" | "fatal" | "3" | "4" | "5" => Some("error"),
        "disabled" | "7" => Some("off"),
        _ => None,
    }
}

/// Reads `log_format`: coraza-spoa's `console` and `json`, and `text` and `json-flat`.
fn map_format(format: &str) -> Option<FileFormat> {
    FileFormat::parse(format)
}

#[derive(Default)]
struct Reader {
    problems: Vec<Problem>,
}

impl Reader {
    /// A problem whose message says it all (the wording users know), at `line`.
    fn problem(&mut self, line: usize, message: String) {
        self.keyed(line, "", message, None);
    }

    /// A problem with `key` (where it is in the file), what is wrong, and what is valid.
    fn keyed(&mut self, line: usize, key: &str, message: String, expected: Option<String>) {
        let mut p = Problem::new(key, message).at(Source::line(line));
        if let Some(expected) = expected {
            p = p.expected(expected);
        }
        self.problems.push(p);
    }

    fn invalid_type(&mut self, path: &str, node: &Node, expected: &str) {
        self.keyed(
            node.line,
            path,
            format!("invalid type: {}", node.describe()),
            Some(expected.to_owned()),
        );
    }

    /// The entries of a mapping whose keys must be among `known`: unknown keys, duplicate
    /// keys and keys that are not text are reported (with `prefix`, where the mapping is),
    /// and left out.
    fn entries<'n>(
        &mut self,
        prefix: &str,
        entries: &'n [(Node, Node)],
        known: &[&str],
    ) -> Vec<(&'n str, &'n Node)> {
        let mut seen: Vec<(&str, usize)> = Vec::new();
        let mut out = Vec::new();
        for (key, value) in entries {
            let Some(name) = key.text() else {
                self.keyed(
                    key.line,
                    prefix,
                    format!("a key must be a name, found {}", key.describe()),
                    None,
                );
                continue;
            };
            if !known.contains(&name) {
                let expected = known
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                self.keyed(
                    key.line,
                    prefix,
                    format!("unknown field `{name}`"),
                    Some(format!("one of {expected}")),
                );
                continue;
            }
            if let Some((_, first)) = seen.iter().find(|(k, _)| *k == name) {
                self.keyed(
                    key.line,
                    prefix,
                    format!("duplicate field `{name}` (first given on line {first})"),
                    None,
                );
                continue;
            }
            seen.push((name, key.line));
            out.push((name, value));
        }
        out
    }

    /// Any scalar, as text; `None` for null.
    fn string(&mut self, path: &str, node: &Node) -> Option<String> {
        match node.typed() {
            Some(Typed::Null) => None,
            Some(_) => node.text().map(str::to_owned),
            None => {
                self.invalid_type(path, node, "a string");
                None
            }
        }
    }

    fn boolean(&mut self, path: &str, node: &Node) -> Option<bool> {
        match node.typed() {
            Some(Typed::Bool(b)) => Some(b),
            _ => {
                self.invalid_type(path, node, "a boolean (true or false)");
                None
            }
        }
    }

    /// A non-negative integer; `None` for null, or after reporting anything else.
    fn unsigned(&mut self, path: &str, node: &Node) -> Option<u64> {
        match node.typed() {
            Some(Typed::Null) => None,
            Some(Typed::Int(n)) => match u64::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    self.keyed(
                        node.line,
                        path,
                        format!("invalid value: integer `{n}`"),
                        Some("a non-negative integer".into()),
                    );
                    None
                }
            },
            _ => {
                self.invalid_type(path, node, "a non-negative integer");
                None
            }
        }
    }

    /// A duration (`1s`, `500ms`, `2m`; a bare number is seconds) between `min` and `max`.
    fn duration(
        &mut self,
        path: &str,
        node: &Node,
        min: Duration,
        max: Duration,
    ) -> Option<Duration> {
        const EXPECTED: &str = "a duration such as 1s, 500ms or 2m";
        let text = match node.typed() {
            Some(Typed::Null) => return None,
            Some(Typed::Str(_) | Typed::Int(_)) => node.text()?,
            _ => {
                self.invalid_type(path, node, EXPECTED);
                return None;
            }
        };
        match lastcall::duration::parse(text) {
            Ok(d) if (min..=max).contains(&d) => Some(d),
            Ok(d) => {
                self.problem(
                    node.line,
                    format!(
                        "{path} {}: must be between {} and {}",
                        lastcall::duration::format(d),
                        lastcall::duration::format(min),
                        lastcall::duration::format(max)
                    ),
                );
                None
            }
            Err(e) => {
                self.problem(node.line, format!("{path} ({text}): {e}"));
                None
            }
        }
    }

    fn config(&mut self, root: Option<&Node>) -> Config {
        let mut cfg = Config::builtin();
        cfg.applications.clear();
        cfg.default_application = None;
        let entries = self.top_level(root);
        let mut default_application = None;
        let mut buffered_line = None;
        for (key, node) in self.entries("", entries, TOP) {
            match key {
                "bind" => {
                    if let Some(b) = self.string(key, node) {
                        match Bind::parse(&b) {
                            Ok(bind) => cfg.bind = bind,
                            Err(message) => self.problem(node.line, message),
                        }
                    }
                }
                "log_level" | "log_file" | "log_format" => self.log(key, node, &mut cfg.log),
                "crs_dir" => {
                    if let Some(dir) = self.string(key, node) {
                        if let Err(e) = cfg.use_crs_dir(std::path::Path::new(&dir)) {
                            self.problems
                                .push(Problem::new(key, e).value(dir).at(Source::line(node.line)));
                        }
                    }
                }
                "default_application" => {
                    default_application = self.string(key, node).map(|d| (d, node.line));
                }
                "applications" => self.applications(node, &mut cfg),
                "max_buffered_bytes" => {
                    if let Some(n) = self.unsigned(key, node) {
                        cfg.max_buffered_bytes = usize::try_from(n).unwrap_or(usize::MAX);
                        buffered_line = Some(node.line);
                    }
                }
                _ => self.engine(key, node, &mut cfg),
            }
        }
        self.check_buffering(&cfg, buffered_line);
        self.pick_default_application(&mut cfg, default_application);
        if cfg.applications.is_empty() {
            self.problems.push(Problem::new(
                "",
                "no applications defined (omit --config to run the built-in CRS application)",
            ));
        }
        cfg
    }

    /// The file's top-level mapping (an empty file is an empty one).
    fn top_level<'n>(&mut self, root: Option<&'n Node>) -> &'n [(Node, Node)] {
        match root {
            None
            | Some(Node {
                value: Value::Null, ..
            }) => &[],
            Some(Node {
                value: Value::Map(entries),
                ..
            }) => entries,
            Some(other) => {
                self.problem(
                    other.line,
                    format!(
                        "the file must be a mapping of keys (bind, applications, ...), found {}",
                        other.describe()
                    ),
                );
                &[]
            }
        }
    }

    /// The process's log: `log_level`, `log_file`, `log_format`.
    fn log(&mut self, key: &str, node: &Node, log: &mut LogSettings) {
        match key {
            "log_level" => {
                if let Some(level) = self.string(key, node) {
                    match map_level(&level) {
                        Some(l) => log.level = Some(l.into()),
                        None => self.problem(
                            node.line,
                            format!("log_level `{level}`: expected {LOG_LEVELS}"),
                        ),
                    }
                }
            }
            "log_file" => {
                log.file = self
                    .string(key, node)
                    .and_then(|f| LogFile::parse(&f))
                    .map(|f| (f, node.line));
            }
            _ => {
                if let Some(format) = self.string(key, node) {
                    match map_format(&format) {
                        Some(f) => log.format = Some(f),
                        None => self.problem(
                            node.line,
                            format!("log_format `{format}`: expected {LOG_FORMATS}"),
                        ),
                    }
                }
            }
        }
    }

    /// How the engine runs: frame size, threads, in-flight messages, timeouts, where
    /// evaluations run. Other keys are not the engine's.
    fn engine(&mut self, key: &str, node: &Node, cfg: &mut Config) {
        match key {
            "max_frame_size" => {
                if let Some(n) = self.unsigned(key, node) {
                    match u32::try_from(n) {
                        Ok(n)
                            if (MIN_FRAME_SIZE..=crate::config::MAX_FRAME_SIZE_CAP)
                                .contains(&n) =>
                        {
                            cfg.max_frame_size = n;
                        }
                        _ => self.problem(
                            node.line,
                            format!(
                                "max_frame_size {n}: must be between {MIN_FRAME_SIZE} and {}",
                                crate::config::MAX_FRAME_SIZE_CAP
                            ),
                        ),
                    }
                }
            }
            "workers" | "max_inflight_per_connection" => {
                let n = self.unsigned(key, node);
                let target = match key {
                    "workers" => &mut cfg.workers,
                    _ => &mut cfg.max_inflight_per_connection,
                };
                match n {
                    Some(0) => self.problem(node.line, format!("{key}: must be at least 1")),
                    Some(n) => *target = usize::try_from(n).unwrap_or(usize::MAX),
                    None => {}
                }
            }
            "evaluation_timeout" => {
                let (min, max) = (Duration::from_millis(10), Duration::from_secs(3600));
                if let Some(d) = self.duration(key, node, min, max) {
                    cfg.evaluation_timeout = d;
                }
            }
            "hello_timeout" | "idle_timeout" => {
                let (min, max) = (Duration::from_secs(1), Duration::from_secs(86_400));
                if let Some(d) = self.duration(key, node, min, max) {
                    match key {
                        "hello_timeout" => cfg.hello_timeout = d,
                        _ => cfg.idle_timeout = d,
                    }
                }
            }
            "evaluation" => match self.string(key, node).as_deref() {
                None | Some("pool") => {}
                Some("inline") => cfg.evaluation = Evaluation::Inline,
                Some(other) => self.problem(
                    node.line,
                    format!("evaluation `{other}`: expected inline or pool"),
                ),
            },
            _ => {}
        }
    }

    /// `max_buffered_bytes` (given at `line`) holds at least one frame of `max_frame_size`.
    fn check_buffering(&mut self, cfg: &Config, line: Option<usize>) {
        let least = cfg.max_frame_size as usize + 4;
        if let Some(line) = line.filter(|_| cfg.max_buffered_bytes < least) {
            self.problem(
                line,
                format!(
                    "max_buffered_bytes {}: must be at least max_frame_size + 4 ({least})",
                    cfg.max_buffered_bytes
                ),
            );
        }
    }

    /// `default_application` (and its line), which must be one of the applications.
    fn pick_default_application(&mut self, cfg: &mut Config, default: Option<(String, usize)>) {
        match default {
            Some((d, line)) if !cfg.applications.iter().any(|a| a.name == d) => self.problem(
                line,
                format!("default_application `{d}` is not among the applications"),
            ),
            other => cfg.default_application = other.map(|(d, _)| d),
        }
    }

    fn applications(&mut self, node: &Node, cfg: &mut Config) {
        let items = match &node.value {
            Value::Seq(items) => items.as_slice(),
            Value::Null => &[],
            _ => {
                self.invalid_type("applications", node, "a sequence of applications");
                return;
            }
        };
        let mut names = HashSet::new();
        for (i, item) in items.iter().enumerate() {
            let path = format!("applications[{i}]");
            let Value::Map(entries) = &item.value else {
                self.invalid_type(&path, item, "an application (a mapping with a `name`)");
                continue;
            };
            let Some(app) = self.application(&path, item, entries) else {
                continue;
            };
            let (app, name_line) = app;
            if app.name.trim().is_empty() {
                self.problem(name_line, "application with an empty name".into());
            }
            if !names.insert(app.name.clone()) {
                self.problem(
                    name_line,
                    format!("application `{}` defined twice", app.name),
                );
            }
            cfg.applications.push(app);
        }
    }

    /// One application; `None` (reported) without a name. Also returns the name's line.
    fn application(
        &mut self,
        path: &str,
        item: &Node,
        entries: &[(Node, Node)],
    ) -> Option<(Application, usize)> {
        let mut name = None;
        let mut directives = None;
        let mut rules: Option<Directives> = None;
        let mut ttl_ms = None;
        let mut ttl_s = None;
        let mut app = Application::new("");
        for (key, node) in self.entries(path, entries, APPLICATION) {
            let at = format!("{path}.{key}");
            match key {
                "name" => match node.text() {
                    Some(n) => name = Some((n.to_owned(), node.line)),
                    None => self.invalid_type(&at, node, "a string"),
                },
                "directives" => {
                    directives = self.string(&at, node).map(|text| Directives {
                        text,
                        lines: node.text_lines(),
                        key: at.clone(),
                    });
                }
                "response_check" => {
                    app.response_check = self.boolean(&at, node).unwrap_or(false);
                }
                "detect_only" => app.detect_only = self.boolean(&at, node).unwrap_or(false),
                "engine_limits" => app.engine_limits = self.boolean(&at, node).unwrap_or(true),
                "transaction_ttl_ms" => ttl_ms = self.unsigned(&at, node),
                "transaction_ttl" => ttl_s = self.unsigned(&at, node),
                "transaction_active_limit" => {
                    if let Some(n) = self.unsigned(&at, node) {
                        app.transaction_active_limit = usize::try_from(n).unwrap_or(usize::MAX);
                    }
                }
                "log_file" | "log_format" | "log_level" => {
                    self.app_log(&at, key, node, &mut app.log)
                }
                "rules" => rules = self.rule_lines(&at, node),
                "body_limit_action" => match self.string(&at, node).as_deref() {
                    None | Some("reject") => app.body_limit_action = BodyLimitAction::Reject,
                    Some("process_partial") => {
                        app.body_limit_action = BodyLimitAction::ProcessPartial;
                    }
                    Some(other) => self.keyed(
                        node.line,
                        &at,
                        format!("unknown variant `{other}`"),
                        Some("`reject` or `process_partial`".into()),
                    ),
                },
                "paranoia_level" => match self.unsigned(&at, node) {
                    Some(p @ 1..=4) => app.paranoia_level = p as u8,
                    Some(p) => {
                        self.problem(node.line, format!("paranoia_level {p}: must be 1 to 4"));
                    }
                    None => {}
                },
                _ => {}
            }
        }
        let Some((name, name_line)) = name else {
            self.keyed(item.line, path, "missing field `name`".into(), None);
            return None;
        };
        app.name = name;
        app.line = name_line;
        app.directives = directives.or(rules);
        app.transaction_ttl_ms = ttl_ms
            .or(ttl_s.map(|s| s.saturating_mul(1000)))
            .unwrap_or(app.transaction_ttl_ms);
        Some((app, name_line))
    }

    /// One of an application's `log_level`, `log_format` and `log_file` (`at` is where).
    fn app_log(&mut self, at: &str, key: &str, node: &Node, log: &mut LogSettings) {
        let Some(value) = self.string(at, node) else {
            return;
        };
        let bad = |expected: &str| {
            Problem::new(at, "")
                .value(value.clone())
                .expected(expected)
                .at(Source::line(node.line))
        };
        match key {
            "log_level" => match map_level(&value) {
                Some(l) => log.level = Some(l.into()),
                None => self.problems.push(bad(LOG_LEVELS)),
            },
            "log_format" => match map_format(&value) {
                Some(f) => log.format = Some(f),
                None => self.problems.push(bad(LOG_FORMATS)),
            },
            _ => log.file = LogFile::parse(&value).map(|f| (f, node.line)),
        }
    }

    /// coraza-spoa's older `rules`: a list of directive lines.
    fn rule_lines(&mut self, path: &str, node: &Node) -> Option<Directives> {
        match &node.value {
            Value::Null => None,
            Value::Seq(items) => {
                let mut text = Vec::new();
                let mut lines = Vec::new();
                for (i, line) in items.iter().enumerate() {
                    if let Some(t) = self.string(&format!("{path}[{i}]"), line) {
                        lines.extend(line.text_lines());
                        text.push(t);
                    }
                }
                Some(Directives {
                    text: text.join("\n"),
                    lines,
                    key: path.to_owned(),
                })
            }
            _ => {
                self.invalid_type(path, node, "a sequence of directive lines");
                None
            }
        }
    }
}
