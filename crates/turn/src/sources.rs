//! Where coturn option values come from: a `turnserver.conf` (coturn's syntax) and the
//! command line. Every value is kept with its [`Source`]; options that are refused or unknown
//! are reported with theirs, and removed from the command line so that clap parses the rest
//! (every other problem is then found too).

use std::collections::BTreeMap;
use std::path::Path;

use clap::{ArgMatches, Command};
use lastcall::{Problem, Problems, Source};

use crate::options::{self, parse_bool, Kind, Policy, Spec};

/// Option values by name, in the order given, with where each came from.
#[derive(Debug, Default)]
pub(crate) struct RawOptions {
    values: BTreeMap<&'static str, Vec<(String, Source)>>,
}

impl RawOptions {
    fn push(&mut self, name: &'static str, value: String, source: Source) {
        self.values.entry(name).or_default().push((value, source));
    }

    /// Every value of `name`, the file's first.
    pub(crate) fn all(&self, name: &str) -> &[(String, Source)] {
        self.values.get(name).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The value that counts for a single-valued option: the last one.
    pub(crate) fn last(&self, name: &str) -> Option<&(String, Source)> {
        self.all(name).last()
    }

    /// Adds the values of every accepted option given on the command line.
    pub(crate) fn add_flags(&mut self, m: &ArgMatches) {
        for s in options::accepted() {
            if let Ok(Some(values)) = m.try_get_many::<String>(s.name) {
                for v in values {
                    self.push(s.name, v.clone(), Source::Flag);
                }
            }
        }
    }
}

/// "unsupported coturn option X", with the option's hint.
fn unsupported(source: Source, shown: &str, spec: &Spec) -> Problem {
    let mut message = format!("unsupported coturn option {shown}");
    if let Policy::Refused { hint: Some(h) } = spec.policy {
        message.push_str(&format!(" ({h})"));
    }
    Problem::new("", message).at(source)
}

fn unknown(source: Source, shown: &str) -> Problem {
    Problem::new("", format!("unknown option {shown}")).at(source)
}

/// Reads a turnserver.conf into `raw`; unknown and refused options go to `problems`, each
/// with its line.
pub(crate) fn parse_file(path: &Path, text: &str, raw: &mut RawOptions, problems: &mut Problems) {
    for (i, line) in text.lines().enumerate() {
        let source = Source::file(path, i + 1);
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = match line.find(['=', ' ', '\t']) {
            Some(at) => {
                let (n, v) = line.split_at(at);
                let v = v.trim_start_matches(['=', ' ', '\t']);
                (n, unquote(v))
            }
            None => (line, String::new()),
        };
        let name = name.strip_prefix("--").unwrap_or(name);
        match options::find(name) {
            Some(spec) if spec.accepted() => raw.push(spec.name, value, source),
            // A refused flag turned off (`dtls=0`) asks for nothing.
            Some(spec) if spec.kind == Kind::Flag && parse_bool(&value) == Some(false) => {}
            Some(spec) => problems.push(unsupported(source, name, spec)),
            None => problems.push(unknown(source, name)),
        }
    }
}

fn unquote(v: &str) -> String {
    let v = v.trim();
    match v.strip_prefix('"') {
        Some(inner) => inner.strip_suffix('"').unwrap_or(inner).to_string(),
        None => v.to_string(),
    }
}

/// Removes refused and unknown options (and their values) from a command line, reporting
/// each; returns what clap should parse.
pub(crate) fn prescan(cmd: &Command, args: &[String], problems: &mut Problems) -> Vec<String> {
    let mut known_long: BTreeMap<String, bool> = BTreeMap::new();
    let mut known_short: BTreeMap<char, bool> = BTreeMap::new();
    for a in cmd.get_arguments() {
        let takes =
            a.get_action().takes_values() && a.get_num_args().is_some_and(|n| n.min_values() > 0);
        if let Some(l) = a.get_long() {
            known_long.insert(l.to_string(), takes);
        }
        for alias in a.get_all_aliases().unwrap_or_default() {
            known_long.insert(alias.to_string(), takes);
        }
        if let Some(s) = a.get_short() {
            known_short.insert(s, takes);
        }
    }
    known_long.insert("help".into(), false);
    known_short.insert('h', false);

    let mut kept = Vec::with_capacity(args.len());
    let mut it = args.iter();
    if let Some(prog) = it.next() {
        kept.push(prog.clone());
    }
    let mut rest_positional = false;
    while let Some(arg) = it.next() {
        if rest_positional || arg == "-" || !arg.starts_with('-') {
            kept.push(arg.clone());
            continue;
        }
        if arg == "--" {
            rest_positional = true;
            kept.push(arg.clone());
            continue;
        }
        let Some(long) = arg.strip_prefix("--") else {
            // A short option; coturn's are one letter, possibly with the value attached.
            let c = arg.chars().nth(1).unwrap_or('-');
            let attached = arg.chars().count() > 2;
            if let Some(&takes) = known_short.get(&c) {
                kept.push(arg.clone());
                if takes && !attached {
                    kept.extend(it.next().cloned());
                }
            } else if let Some(spec) = options::find_short(c) {
                let shown = format!("-{c} (--{})", spec.name);
                problems.push(unsupported(Source::Flag, &shown, spec));
                if spec.kind.takes_value() && !attached {
                    it.next();
                }
            } else {
                problems.push(unknown(Source::Flag, &format!("-{c}")));
            }
            continue;
        };
        let (name, has_eq) = match long.split_once('=') {
            Some((n, _)) => (n, true),
            None => (long, false),
        };
        if let Some(&takes) = known_long.get(name) {
            kept.push(arg.clone());
            if takes && !has_eq {
                kept.extend(it.next().cloned());
            }
        } else if let Some(spec) = options::find(name).filter(|s| {
            // `--dtls=false` asks for nothing.
            !(s.kind == Kind::Flag
                && long.split_once('=').and_then(|(_, v)| parse_bool(v)) == Some(false))
        }) {
            problems.push(unsupported(Source::Flag, &format!("--{name}"), spec));
            if spec.kind.takes_value() && !has_eq {
                it.next();
            }
        } else if options::find(name).is_none() {
            problems.push(unknown(Source::Flag, &format!("--{name}")));
        }
    }
    kept
}
