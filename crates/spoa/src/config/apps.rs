//! The applications of a configuration, compiled: one rule set per application, shared by
//! every evaluation (`Arc`), and swapped all at once by a reload; and each application's
//! log of matched rules (its `log_*` keys, else the process log).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use lastcall::{LogArgs, Problem, Problems};
use lastcall_modsec::RuleSet;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

use super::seclang::RuleText;
use super::{Application, Config, LogFile, LogSettings};
use crate::log::{FileFormat, RuleLines};

/// One compiled application.
pub(crate) struct App {
    /// Its configuration.
    pub(crate) config: Application,
    /// Its compiled rules.
    pub(crate) rules: Arc<RuleSet>,
    /// Its own log, when its configuration has `log_*` keys, and how that log writes
    /// matched rules.
    log: Option<(tracing::Dispatch, RuleLines)>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("config", &self.config)
            .field("rules", &self.rules)
            .field("own_log", &self.log.is_some())
            .finish()
    }
}

impl App {
    /// Runs `f` with this application's log as the current one (tracing's events in `f` go
    /// there), or the process log when it has none of its own.
    pub(crate) fn in_log<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.log {
            Some((d, _)) => tracing::dispatcher::with_default(d, f),
            None => f(),
        }
    }

    /// How the log [`in_log`](Self::in_log) writes to writes matched rules.
    pub(crate) fn rule_lines(&self) -> RuleLines {
        self.log
            .as_ref()
            .map_or_else(crate::log::process_rule_lines, |(_, r)| *r)
    }
}

/// All applications, as swapped by a reload.
#[derive(Debug, Default)]
pub struct Apps {
    by_name: HashMap<String, Arc<App>>,
    default: Option<Arc<App>>,
}

impl Apps {
    /// Compiles every application of `cfg`; all problems are returned together, each on
    /// the line of the file it is about.
    pub(crate) fn compile(cfg: &Config) -> Result<Apps, Problems> {
        Self::compile_unless(cfg, &AtomicBool::new(false))
            .unwrap_or_else(|| Err(Problems::from(Problem::new("", "compilation cancelled"))))
    }

    /// Like `compile`, but checks `cancel` before each application and
    /// returns `None` once it is set (a signal during start-up: the process then exits
    /// normally, never while libmodsecurity is compiling on another thread).
    pub fn compile_unless(cfg: &Config, cancel: &AtomicBool) -> Option<Result<Apps, Problems>> {
        let mut apps = Apps::default();
        let mut problems = Problems::new();
        for (i, a) in cfg.applications.iter().enumerate() {
            if cancel.load(Ordering::SeqCst) {
                return None;
            }
            let key = a
                .directives
                .as_ref()
                .map_or_else(|| format!("applications[{i}]"), |d| d.key.clone());
            let key = if cfg.path.is_some() {
                key
            } else {
                String::new()
            };
            let place = |p: super::seclang::RuleProblem| {
                let mut problem = Problem::new(
                    key.clone(),
                    format!("application `{}`: {}", a.name, p.message),
                )
                .at(cfg.source(p.line));
                if let Some(e) = p.expected {
                    problem = problem.expected(e);
                }
                problem
            };
            let log = match open_log(&a.log) {
                Ok(log) => log,
                Err((line, e)) => {
                    problems.push(
                        Problem::new(format!("applications[{i}].log_file"), e).at(cfg.source(line)),
                    );
                    None
                }
            };
            let text = match RuleText::for_application(a, &cfg.crs) {
                Ok(text) => text,
                Err(errs) => {
                    problems.extend(errs.into_iter().map(place));
                    continue;
                }
            };
            match RuleSet::from_directives(&text.text, &format!("application {}", a.name)) {
                Ok(rules) => {
                    let app = Arc::new(App {
                        config: a.clone(),
                        rules,
                        log,
                    });
                    tracing::debug!(app = %a.name, "compiled application {} of {}", i + 1, cfg.applications.len());
                    apps.by_name.insert(a.name.clone(), app);
                }
                Err(lastcall_modsec::Error::Rules { message, .. }) => {
                    problems.push(place(text.place(&message, a.directives.as_ref(), a.line)));
                }
                Err(e) => problems.push(place(super::seclang::RuleProblem {
                    line: a.line,
                    message: e.to_string(),
                    expected: None,
                })),
            }
        }
        if !problems.is_empty() {
            return Some(Err(problems));
        }
        apps.default = cfg
            .default_application
            .as_ref()
            .and_then(|d| apps.by_name.get(d).cloned());
        Some(Ok(apps))
    }

    pub(crate) fn find(&self, name: &str) -> Option<Arc<App>> {
        self.by_name.get(name).or(self.default.as_ref()).cloned()
    }

    /// Total rules compiled (logs).
    pub fn rule_count(&self) -> usize {
        self.by_name.values().map(|a| a.rules.rule_count()).sum()
    }
}

/// The SecLang text an application runs (the CRS at `cfg.crs`).
pub fn directives_for(cfg: &Config, a: &Application) -> String {
    RuleText::for_application(a, &cfg.crs).map_or_else(|_| String::new(), |t| t.text)
}

/// An application's own log, when its settings ask for one (file opened for appending,
/// created if missing). The error is the `log_file` line and why it cannot be opened.
fn open_log(log: &LogSettings) -> Result<Option<(tracing::Dispatch, RuleLines)>, (usize, String)> {
    if !log.is_set() {
        return Ok(None);
    }
    let (log_format, rules) = log.format.unwrap_or(FileFormat::Text).split();
    let args = LogArgs {
        log_format,
        log_level: log.level.clone().unwrap_or_else(|| "info".into()),
    };
    let writer = match &log.file {
        None | Some((LogFile::Stdout, _)) => BoxMakeWriter::new(std::io::stdout),
        Some((LogFile::Stderr, _)) => BoxMakeWriter::new(std::io::stderr),
        Some((LogFile::Null, _)) => BoxMakeWriter::new(std::io::sink),
        // tracing-subscriber's `MakeWriter` is implemented for std's mutex: that lock is
        // tracing's, never taken here.
        Some((LogFile::Path(path), line)) => BoxMakeWriter::new(std::sync::Mutex::new(
            append(path).map_err(|e| (*line, format!("cannot open {}: {e}", path.display())))?,
        )),
    };
    Ok(Some((crate::log::dispatch(&args, rules, writer), rules)))
}

/// Opens `path` for appending, creating it (mode 0666 less the umask, as coraza-spoa).
pub(crate) fn append(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}
