//! Where the peer programs the tests start come from: HAProxy, nginx and coturn's
//! programs. Every test gets its command from here (never a path of its own), so that one
//! place chooses the version a run tests against. Debian's packages by default (installed
//! by `scripts/setup.sh`); an environment variable gives another command, split on
//! whitespace (e.g. `LASTCALL_HAPROXY="scripts/peer-run sid /usr/sbin/haproxy"`):
//!
//! | program | default | variable |
//! |---|---|---|
//! | HAProxy | `/usr/sbin/haproxy` | `LASTCALL_HAPROXY` |
//! | nginx | `/usr/sbin/nginx` | `LASTCALL_NGINX` |
//! | coturn's `turnutils_uclient` | `/usr/bin/turnutils_uclient` | `LASTCALL_UCLIENT` |
//! | coturn's `turnutils_peer` | `/usr/bin/turnutils_peer` | `LASTCALL_PEER` |
//! | coturn's `turnserver` | `/usr/bin/turnserver` | `LASTCALL_TURNSERVER` |
//! | coturn's `turnadmin` (the user-database tests) | `/usr/bin/turnadmin` | `LASTCALL_TURNADMIN` |
//! | Chromium (headless WebRTC) | `/usr/bin/chromium` | `LASTCALL_CHROMIUM` |
//! | our own daemon under test | the binary itself | `LASTCALL_SPOA_RUNNER`, a prefix (e.g. `scripts/peer-run trixie`: the agent on Debian 13's libmodsecurity) |

use std::process::Command;

/// The command named by `var` (words split on whitespace), else `default`.
fn command(var: &str, default: &str) -> Command {
    let given = std::env::var(var).unwrap_or_default();
    let mut words = given.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words);
            cmd
        }
        None => Command::new(default),
    }
}

/// A command running HAProxy.
pub fn haproxy() -> Command {
    command("LASTCALL_HAPROXY", "/usr/sbin/haproxy")
}

/// A command running nginx.
pub fn nginx() -> Command {
    command("LASTCALL_NGINX", "/usr/sbin/nginx")
}

/// Chromium (`LASTCALL_CHROMIUM`), for the browser tests.
pub fn chromium() -> Command {
    command("LASTCALL_CHROMIUM", "/usr/bin/chromium")
}

/// A command running coturn's `tool` (`turnutils_uclient`, `turnutils_peer`,
/// `turnserver`): `LASTCALL_` + the name without `turnutils_`, upper-cased.
pub fn coturn(tool: &str) -> Command {
    let var = format!(
        "LASTCALL_{}",
        tool.trim_start_matches("turnutils_").to_ascii_uppercase()
    );
    command(&var, &format!("/usr/bin/{tool}"))
}

/// A command running `binary` (a daemon under test) through the prefix in `var`, if set:
/// the same binary on another system's libraries (`scripts/peer-run SUITE`).
pub fn ours(var: &str, binary: &std::path::Path) -> Command {
    let given = std::env::var(var).unwrap_or_default();
    let mut words = given.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(binary);
            cmd
        }
        None => Command::new(binary),
    }
}

/// The release in the file name of the shared library `stem` (e.g. `libmodsecurity`) that
/// process `pid` has mapped, as in `libmodsecurity.so.3.0.14` (`/proc/PID/maps`): which
/// library a peer or our own daemon actually loaded, whatever it was built against.
pub fn mapped_release(pid: u32, stem: &str) -> Option<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let marker = format!("/{stem}.so.");
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter_map(|path| path.rsplit_once(marker.as_str()))
        .map(|(_, release)| release.to_owned())
        .find(|release| release.matches('.').count() == 2)
}
