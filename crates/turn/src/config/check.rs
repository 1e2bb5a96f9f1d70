//! Reading typed values out of the raw options: [`Checker`] reports every bad one (with the
//! option, its value unless it is a secret, and where it came from), and the value parsers
//! the sections share.

use std::net::{IpAddr, SocketAddr};

use lastcall::{Problem, Problems, Source};

use super::IpRange;
use crate::options::parse_bool;
use crate::sources::RawOptions;

/// Options whose values must never be printed in a problem.
fn shown_value(name: &str, value: &str) -> String {
    match name {
        "static-auth-secret" | "nonce-secret" | "stateless-nonce-secret" if !value.is_empty() => {
            "(secret)".to_string()
        }
        // A connection string may hold a password.
        "psql-userdb" | "sql-userdb" | "redis-userdb" => "(connection string)".to_string(),
        // The user's name helps; the password or key after the colon never.
        "user" => match value.split_once(':') {
            Some((user, _)) => format!("{user}:(secret)"),
            None => value.to_string(),
        },
        _ => value.to_string(),
    }
}

/// Reads typed values out of the raw options, reporting every bad one.
pub(super) struct Checker<'a> {
    pub(super) raw: &'a RawOptions,
    problems: &'a mut Problems,
    /// Flags whose values were checked (each is reported once).
    flags_checked: std::collections::BTreeSet<&'static str>,
}

impl<'a> Checker<'a> {
    /// A checker reporting into `problems`.
    pub(super) fn new(raw: &'a RawOptions, problems: &'a mut Problems) -> Self {
        Checker {
            raw,
            problems,
            flags_checked: std::collections::BTreeSet::new(),
        }
    }

    /// `name=value: why`, at the value's source.
    pub(super) fn bad(&mut self, source: &Source, name: &str, value: &str, why: &str) {
        let key = format!("{name}={}", shown_value(name, value));
        self.problems
            .push(Problem::new(key, why).at(source.clone()));
    }

    pub(super) fn flag(&mut self, name: &'static str) -> bool {
        let mut out = false;
        let report = self.flags_checked.insert(name);
        for (v, source) in self.raw.all(name) {
            match parse_bool(v) {
                Some(b) => out = b,
                None if !report => {}
                None => self.bad(
                    source,
                    name,
                    v,
                    "not a boolean (on/off, yes/no, 1/0, true/false)",
                ),
            }
        }
        out
    }

    pub(super) fn value<T: std::str::FromStr>(&mut self, name: &str, what: &str) -> Option<T> {
        let (v, source) = self.raw.last(name)?;
        match v.parse() {
            Ok(x) => Some(x),
            Err(_) => {
                self.bad(source, name, v, &format!("not {what}"));
                None
            }
        }
    }

    pub(super) fn each<T>(&mut self, name: &str, f: impl Fn(&str) -> Result<T, String>) -> Vec<T> {
        let mut out = Vec::new();
        for (v, source) in self.raw.all(name) {
            match f(v) {
                Ok(x) => out.push(x),
                Err(why) => self.bad(source, name, v, &why),
            }
        }
        out
    }

    /// A problem about option `name` as a whole, at its last value's source.
    pub(super) fn require(&mut self, name: &str, message: &str) {
        let source = self.raw.last(name).map_or(Source::Flag, |(_, s)| s.clone());
        self.problems.push(Problem::new("", message).at(source));
    }
}

pub(super) fn parse_range(v: &str) -> Result<IpRange, String> {
    v.parse::<IpRange>()
        .map_err(|_| "expected IP, IP-IP or IP/PREFIX of one family".to_string())
}

pub(super) fn parse_ip(v: &str) -> Result<IpAddr, String> {
    let v = v.trim_start_matches('[').trim_end_matches(']');
    v.parse().map_err(|_| "not an IP address".to_string())
}

pub(super) fn parse_alternate(v: &str) -> Result<SocketAddr, String> {
    v.parse::<SocketAddr>()
        .or_else(|_| v.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 3478)))
        .map_err(|_| "expected IP:PORT".to_string())
}
