//! Where the peer programs the tests start come from: HAProxy, nginx and coturn's test
//! programs. Every test gets them from here (never from a path of its own), so that one
//! place chooses the version a run tests against. Debian's packages by default (installed
//! by `scripts/setup.sh`); an environment variable points at another build:
//!
//! | program | default | variable |
//! |---|---|---|
//! | HAProxy | `/usr/sbin/haproxy` | `LASTCALL_HAPROXY` |
//! | nginx | `/usr/sbin/nginx` | `LASTCALL_NGINX` |
//! | coturn's `turnutils_*` | `/usr/bin/` | `LASTCALL_COTURN_BIN` (a directory) |

use std::path::PathBuf;
use std::process::Command;

/// The program named by `var`, else `default`.
fn program(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// The HAProxy executable.
pub fn haproxy() -> PathBuf {
    program("LASTCALL_HAPROXY", "/usr/sbin/haproxy")
}

/// The nginx executable.
pub fn nginx() -> PathBuf {
    program("LASTCALL_NGINX", "/usr/sbin/nginx")
}

/// coturn's test programs.
#[derive(Debug, Clone)]
pub struct Coturn {
    /// The directory holding `turnutils_peer`, `turnutils_uclient`, ...
    pub bin: PathBuf,
}

impl Coturn {
    /// The path of `tool` (`turnutils_uclient`, `turnutils_peer`, ...).
    pub fn path(&self, tool: &str) -> PathBuf {
        self.bin.join(tool)
    }

    /// A command running `tool`.
    pub fn command(&self, tool: &str) -> Command {
        Command::new(self.path(tool))
    }
}

/// coturn's test programs to run.
pub fn coturn() -> Coturn {
    Coturn {
        bin: program("LASTCALL_COTURN_BIN", "/usr/bin"),
    }
}
