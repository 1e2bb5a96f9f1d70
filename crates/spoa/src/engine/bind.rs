//! Where the agent listens: `host:port` or `unix:///path` (the file's `bind`, `--bind`).

use std::path::PathBuf;

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
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
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
