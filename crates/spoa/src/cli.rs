//! The command line as coraza-spoa users write it: Go's `flag` package takes `-config
//! FILE`, `-config=FILE`, `--config FILE`, `-validate` and `-validate=true`; clap takes
//! long options with two dashes only (and would read `-config` as `-c onfig`). Before clap
//! sees the arguments, [`go_style`] gives every single-dash word that names one of the
//! command's long options its second dash, and writes Go's boolean `-flag=true` /
//! `-flag=false` as clap's `--flag` / nothing.
//!
//! [`listen_addr`] reads coraza-spoa's `-metrics-addr`, where Go's `:9090` means every
//! address.

use std::ffi::OsString;
use std::net::SocketAddr;

/// A long option of the command: its name, and whether it takes a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongOption {
    /// The name, without dashes.
    pub name: String,
    /// Whether it takes a value (`false`: a switch).
    pub takes_value: bool,
}

/// The long options of `cmd` (aliases included) and of its subcommands' names are left
/// alone: those are words, not options.
pub fn long_options(cmd: &clap::Command) -> Vec<LongOption> {
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
pub fn go_style(args: impl IntoIterator<Item = OsString>, longs: &[LongOption]) -> Vec<OsString> {
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

/// An address to listen on, as Go writes it: `HOST:PORT`, `[V6]:PORT`, or `:PORT` for every
/// address.
pub fn listen_addr(text: &str) -> Option<SocketAddr> {
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
