//! One configuration problem and the printer every lastcall daemon reports through.
//!
//! A [`Problem`] names the option or key, where its value came from ([`Source`]: a flag, an
//! environment variable, a file and line), what is wrong, and what would be valid. A daemon
//! collects every problem of its command line, environment and files into [`Problems`]
//! before it binds a port, then prints them all at once and exits 64
//! ([`Problems::exit`]):
//!
//! ```text
//! lastcall-turn: configuration errors:
//!   - /etc/turnserver.conf:12: listening-port (abc): not a port number; expected 1 to 65535
//!   - --drain-timeout (LASTCALL_DRAIN_TIMEOUT=soon): expected a number at `soon`
//!   - --shutdown-delay (30s): must be shorter than --drain-timeout (10s)
//! ```

use std::fmt;
use std::path::PathBuf;

use crate::exit;

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// The command line.
    Flag,
    /// An environment variable (its name).
    Env(String),
    /// A configuration file (when known) and its 1-based line (when known).
    File {
        /// The file.
        path: Option<PathBuf>,
        /// The line.
        line: Option<usize>,
    },
    /// The daemon's default (in a problem about a combination of options).
    Default,
}

impl Source {
    /// A file and line.
    pub fn file(path: impl Into<PathBuf>, line: usize) -> Source {
        Source::File {
            path: Some(path.into()),
            line: Some(line),
        }
    }

    /// A line of a configuration whose file name is not known (text parsed on its own).
    pub fn line(line: usize) -> Source {
        Source::File {
            path: None,
            line: Some(line),
        }
    }

    /// Where argument `id` of `matches` came from (see
    /// [`parse_cli_matches_from`](crate::config::parse_cli_matches_from)); `env` is its environment
    /// variable. An id clap does not know is [`Source::Default`].
    pub fn from_matches(matches: &clap::ArgMatches, id: &str, env: Option<&str>) -> Source {
        if !matches.try_contains_id(id).unwrap_or(false) {
            return Source::Default;
        }
        Source::from_clap(matches.value_source(id), env)
    }

    /// From clap's record of where an argument's value came from; `env` is the argument's
    /// environment variable.
    pub fn from_clap(source: Option<clap::parser::ValueSource>, env: Option<&str>) -> Source {
        use clap::parser::ValueSource;
        match (source, env) {
            (Some(ValueSource::CommandLine), _) => Source::Flag,
            (Some(ValueSource::EnvVariable), Some(var)) => Source::Env(var.to_string()),
            (Some(ValueSource::EnvVariable), None) => Source::Flag,
            _ => Source::Default,
        }
    }
}

/// One configuration problem.
///
/// Printed as `[FILE:LINE: ]KEY[ (VALUE)]: MESSAGE[; expected EXPECTED]`, with the value
/// written `VAR=VALUE` when it came from an environment variable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Problem {
    /// The option or key: `--drain-timeout`, `listening-port`, `applications[1].name`.
    /// Empty for a problem about a whole file or command line (`cannot read: ...`).
    pub key: String,
    /// Where the value came from.
    pub source: Source,
    /// The value as given, if it helps to show it (never a secret).
    pub value: Option<String>,
    /// What is wrong.
    pub message: String,
    /// What would be valid, if it can be said briefly.
    pub expected: Option<String>,
}

impl Problem {
    /// A problem with `key` given on the command line.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            key: key.into(),
            source: Source::Flag,
            value: None,
            message: message.into(),
            expected: None,
        }
    }

    /// Sets where the value came from.
    #[must_use]
    pub fn at(mut self, source: Source) -> Problem {
        self.source = source;
        self
    }

    /// Shows the value as given.
    #[must_use]
    pub fn value(mut self, value: impl Into<String>) -> Problem {
        self.value = Some(value.into());
        self
    }

    /// Says what would be valid.
    #[must_use]
    pub fn expected(mut self, expected: impl Into<String>) -> Problem {
        self.expected = Some(expected.into());
        self
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Source::File { path, line } = &self.source {
            match (path, line) {
                (Some(path), Some(line)) => write!(f, "{}:{line}: ", path.display())?,
                (Some(path), None) => write!(f, "{}: ", path.display())?,
                (None, Some(line)) => write!(f, "line {line}: ")?,
                (None, None) => {}
            }
        }
        f.write_str(&self.key)?;
        match (&self.value, &self.source) {
            (Some(value), Source::Env(var)) => write!(f, " ({var}={value})")?,
            (Some(value), _) => write!(f, " ({value})")?,
            (None, Source::Env(var)) => write!(f, " (from {var})")?,
            (None, _) => {}
        }
        let said_something = !self.key.is_empty() || self.value.is_some();
        match (self.message.is_empty(), &self.expected) {
            (false, expected) => {
                if said_something {
                    f.write_str(": ")?;
                }
                f.write_str(&self.message)?;
                if let Some(expected) = expected {
                    write!(f, "; expected {expected}")?;
                }
            }
            (true, Some(expected)) => {
                if said_something {
                    f.write_str(": ")?;
                }
                write!(f, "expected {expected}")?;
            }
            (true, None) => {}
        }
        Ok(())
    }
}

/// Every problem found, in the order found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Problems(Vec<Problem>);

impl Problems {
    /// No problem yet.
    pub fn new() -> Problems {
        Problems(Vec::new())
    }

    /// Adds one.
    pub fn push(&mut self, problem: Problem) {
        self.0.push(problem);
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The problems, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Problem> {
        self.0.iter()
    }

    /// `Ok(value)` when there is no problem.
    pub fn into_result<T>(self, value: T) -> Result<T, Problems> {
        if self.is_empty() {
            Ok(value)
        } else {
            Err(self)
        }
    }

    /// The report a daemon prints: `PROGRAM: configuration errors:` and one `  - ` line
    /// per problem.
    pub fn report(&self, program: &str) -> String {
        let mut out = format!("{program}: configuration errors:\n");
        for problem in &self.0 {
            out.push_str(&format!("  - {problem}\n"));
        }
        out
    }

    /// Prints the [`report`](Self::report) to stderr and exits with [`exit::CONFIG`] (64).
    pub fn exit(&self, program: &str) -> ! {
        eprint!("{}", self.report(program));
        std::process::exit(exit::CONFIG)
    }
}

/// One problem a line.
impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            problem.fmt(f)?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

impl From<Problem> for Problems {
    fn from(problem: Problem) -> Problems {
        Problems(vec![problem])
    }
}

impl From<Vec<Problem>> for Problems {
    fn from(problems: Vec<Problem>) -> Problems {
        Problems(problems)
    }
}

impl FromIterator<Problem> for Problems {
    fn from_iter<I: IntoIterator<Item = Problem>>(iter: I) -> Problems {
        Problems(iter.into_iter().collect())
    }
}

impl Extend<Problem> for Problems {
    fn extend<I: IntoIterator<Item = Problem>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl IntoIterator for Problems {
    type Item = Problem;
    type IntoIter = std::vec::IntoIter<Problem>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Problems {
    type Item = &'a Problem;
    type IntoIter = std::slice::Iter<'a, Problem>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_prints_where_the_value_came_from() {
        let cases = [
            (
                Problem::new("--drain-min-sessions", "not a whole number of sessions")
                    .value("many"),
                "--drain-min-sessions (many): not a whole number of sessions",
            ),
            (
                Problem::new("--drain-timeout", "expected a number at `soon`")
                    .value("soon")
                    .at(Source::Env("LASTCALL_DRAIN_TIMEOUT".into())),
                "--drain-timeout (LASTCALL_DRAIN_TIMEOUT=soon): expected a number at `soon`",
            ),
            (
                Problem::new("--admin-token", "is empty")
                    .at(Source::Env("LASTCALL_ADMIN_TOKEN".into())),
                "--admin-token (from LASTCALL_ADMIN_TOKEN): is empty",
            ),
            (
                Problem::new("listening-port", "not a port number")
                    .value("abc")
                    .at(Source::file("/etc/turnserver.conf", 12))
                    .expected("1 to 65535"),
                "/etc/turnserver.conf:12: listening-port (abc): not a port number; expected 1 to 65535",
            ),
            (
                Problem::new("log_level", "")
                    .value("loud")
                    .at(Source::line(3))
                    .expected("debug, info, warn or error"),
                "line 3: log_level (loud): expected debug, info, warn or error",
            ),
            (
                Problem::new("", "cannot read: No such file or directory").at(Source::File {
                    path: Some("/etc/spoa.yaml".into()),
                    line: None,
                }),
                "/etc/spoa.yaml: cannot read: No such file or directory",
            ),
            (
                Problem::new("", "no applications defined"),
                "no applications defined",
            ),
        ];
        for (problem, printed) in cases {
            assert_eq!(problem.to_string(), printed);
        }
    }

    #[test]
    fn the_report_names_the_program_and_lists_every_problem() {
        let mut problems = Problems::new();
        assert!(problems.clone().into_result(1).is_ok());
        problems.push(Problem::new("--bind", "not an address").value("x"));
        problems.extend([Problem::new("--workers", "must be at least 1").value("0")]);
        assert_eq!(problems.len(), 2);
        assert_eq!(
            problems.report("lastcall-spoa"),
            "lastcall-spoa: configuration errors:\n  - --bind (x): not an address\n  - --workers (0): must be at least 1\n"
        );
        assert_eq!(
            problems.to_string(),
            "--bind (x): not an address\n--workers (0): must be at least 1"
        );
        assert_eq!(problems.into_result(()).unwrap_err().len(), 2);
    }

    #[test]
    fn clap_sources() {
        use clap::parser::ValueSource;
        assert_eq!(
            Source::from_clap(Some(ValueSource::CommandLine), Some("X")),
            Source::Flag
        );
        assert_eq!(
            Source::from_clap(Some(ValueSource::EnvVariable), Some("X")),
            Source::Env("X".into())
        );
        assert_eq!(
            Source::from_clap(Some(ValueSource::DefaultValue), Some("X")),
            Source::Default
        );
        assert_eq!(Source::from_clap(None, None), Source::Default);
    }
}
