//! A real HAProxy (`haproxy -db`, the one `lastcall_testkit::peers::haproxy` names) running the documented configuration
//! (`examples/haproxy/haproxy.cfg` + `coraza.cfg`, the files `docs/spoa.md` shows), on
//! loopback with free ports; killed on drop.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use lastcall_testkit::{self as testkit, Pod};

use super::{crate_dir, http, WAIT};

/// The HAProxy every test runs, from one place ([`testkit::peers::haproxy`]:
/// `LASTCALL_HAPROXY`, a command, words split on spaces, e.g.
/// `scripts/peer-run trixie /usr/sbin/haproxy` for 3.0 in a chroot that shares /tmp; else
/// Debian 12's 2.6).
pub(crate) fn command() -> Command {
    testkit::peers::haproxy()
}

/// `haproxy -v`'s first line, for test output.
pub(crate) fn version() -> String {
    let out = command().arg("-v").output().expect("run haproxy -v");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Whether the HAProxy under test is 3.1 or later (the SPOP multiplexer): the documented
/// file then runs without `on-marked-down shutdown-sessions` on the agent servers, as
/// docs/spoa.md says for those releases.
pub(crate) fn multiplexer() -> bool {
    static IT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IT.get_or_init(|| {
        let v = version();
        let release = v
            .split_whitespace()
            .nth(2)
            .and_then(|r| {
                let mut parts = r.split('.').map(|p| p.parse::<u32>().ok());
                Some((parts.next()??, parts.next()??))
            })
            .unwrap_or_else(|| panic!("cannot read HAProxy's release from {v:?}"));
        release >= (3, 1)
    })
}

/// Variants of the documented configuration, for measurements.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Variant {
    /// Without the `log stdout` line (no per-request log: load runs).
    pub quiet: bool,
    /// Without the safety net: no second `send-spoe-group` on `txn.coraza.error` (the lines
    /// mentioning `retried`); `option continue-on-error` stays.
    pub no_retry: bool,
    /// The SPOE file with `timeout processing 30s` instead of 5s: 1 MiB bodies take about
    /// 1 s of CPU to inspect, several on a machine other builds load (the agent's
    /// `evaluation_timeout` must be raised with it).
    pub slow_bodies: bool,
    /// Without `max-waiting-frames 1` (HAProxy's default, 20 NOTIFYs in flight per
    /// connection on 2.6 and 3.0): what the line saves.
    pub pipelined: bool,
    /// Words added to each agent `server` line (e.g. `on-marked-down shutdown-sessions`).
    pub server_options: &'static str,
    /// The agent `server` lines without `on-marked-down shutdown-sessions` (as on 3.1+).
    pub keep_sessions: bool,
}

/// The SPOE log lines among `lines` (`SPOE: [coraza-agent] <GROUP:...> sid=.. st=N ...`,
/// one per message HAProxy processed, with `log global`): how many, and those whose status
/// is not 0 (an error: 256 + N for an AGENT-DISCONNECT with status N crossing the message, 1
/// for `timeout processing`, ...).
pub(crate) fn spoe_statuses(lines: &[String]) -> (usize, Vec<String>) {
    let mut n = 0;
    let mut bad = Vec::new();
    for l in lines.iter().filter(|l| l.contains("SPOE: [")) {
        let Some(st) = l.split_whitespace().find_map(|w| w.strip_prefix("st=")) else {
            continue;
        };
        n += 1;
        if st != "0" {
            bad.push(l.clone());
        }
    }
    (n, bad)
}

/// A running HAProxy.
pub(crate) struct Haproxy {
    /// The process (its log lines, one per request, are captured).
    pub pod: Pod,
    /// HTTP frontend.
    pub addr: SocketAddr,
    /// Admin socket path.
    pub stats: PathBuf,
    _dir: tempfile::TempDir,
}

/// The documented HAProxy configuration.
pub(crate) fn config_path() -> PathBuf {
    crate_dir().join("examples/haproxy/haproxy.cfg")
}

/// The documented SPOE configuration.
pub(crate) fn spoe_path() -> PathBuf {
    crate_dir().join("examples/haproxy/coraza.cfg")
}

impl Haproxy {
    /// Starts HAProxy in front of `origin`, with agent servers `spoa1` and `spoa2`, running
    /// the documented files or a variant of them (see [`Variant`]), and waits until a benign
    /// request passes through an agent.
    pub(crate) fn start_variant(
        origin: SocketAddr,
        spoa1: SocketAddr,
        spoa2: SocketAddr,
        variant: &Variant,
    ) -> Haproxy {
        Self::start_agents(origin, &[spoa1, spoa2], variant)
    }

    /// [`Haproxy::start_variant`] with the agent servers `spoa1`, `spoa2`, ... at `agents`
    /// (two or more: the documented file's `spoa2` line is repeated for each one beyond it).
    pub(crate) fn start_agents(
        origin: SocketAddr,
        agents: &[SocketAddr],
        variant: &Variant,
    ) -> Haproxy {
        assert!(
            agents.len() >= 2,
            "the documented file has two agent servers"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let edited = variant.quiet
            || variant.no_retry
            || variant.keep_sessions
            || !variant.server_options.is_empty()
            || agents.len() > 2
            || multiplexer();
        let config = if edited {
            let text = std::fs::read_to_string(config_path()).expect("read haproxy.cfg");
            let mut out = String::new();
            for l in text.lines() {
                if variant.quiet && l.trim_start().starts_with("log stdout") {
                    continue;
                }
                if variant.no_retry && l.contains("retried") {
                    continue;
                }
                let server = l.trim_start().starts_with("server spoa");
                // As docs/spoa.md tells users of 3.1+ (*HAProxy 2.6, 3.0, 3.1 and later*).
                let l = if server && (multiplexer() || variant.keep_sessions) {
                    l.replace(" on-marked-down shutdown-sessions", "")
                } else {
                    l.to_owned()
                };
                let extra = if server && !variant.server_options.is_empty() {
                    format!(" {}", variant.server_options)
                } else {
                    String::new()
                };
                out.push_str(&format!("{l}{extra}\n"));
                if l.trim_start().starts_with("server spoa2 ") {
                    for n in 3..=agents.len() {
                        let more = l
                            .replace("spoa2", &format!("spoa{n}"))
                            .replace("SPOA2", &format!("SPOA{n}"));
                        out.push_str(&format!("{more}{extra}\n"));
                    }
                }
            }
            let path = dir.path().join("haproxy.cfg");
            std::fs::write(&path, out).expect("write haproxy.cfg");
            path
        } else {
            config_path()
        };
        let spoe = if variant.slow_bodies || variant.pipelined {
            let mut text = std::fs::read_to_string(spoe_path()).expect("read coraza.cfg");
            if variant.slow_bodies {
                let line = "    timeout         processing      5s\n";
                assert!(text.contains(line), "coraza.cfg's timeout processing");
                text = text.replace(line, "    timeout         processing      30s\n");
            }
            if variant.pipelined {
                let line = "    max-waiting-frames 1\n";
                assert!(text.contains(line), "coraza.cfg's max-waiting-frames");
                text = text.replace(line, "");
            }
            let path = dir.path().join("coraza.cfg");
            std::fs::write(&path, text).expect("write coraza.cfg");
            path
        } else {
            spoe_path()
        };
        Self::start_files_with(dir, &config, &spoe, origin, agents)
    }

    /// Starts HAProxy with the configuration `config` and the SPOE file `spoe`, which read
    /// their addresses from the environment as the documented files do (`FRONTEND_ADDR`,
    /// `ORIGIN_ADDR`, `SPOA1_ADDR`, `SPOA2_ADDR`, `CORAZA_SPOE_CFG`, `STATS_SOCKET`), and
    /// waits until a benign request passes through an agent. `dir` lives as long as it.
    pub(crate) fn start_files(
        dir: tempfile::TempDir,
        config: &std::path::Path,
        spoe: &std::path::Path,
        origin: SocketAddr,
        spoa1: SocketAddr,
        spoa2: SocketAddr,
    ) -> Haproxy {
        Self::start_files_with(dir, config, spoe, origin, &[spoa1, spoa2])
    }

    fn start_files_with(
        dir: tempfile::TempDir,
        config: &std::path::Path,
        spoe: &std::path::Path,
        origin: SocketAddr,
        agents: &[SocketAddr],
    ) -> Haproxy {
        let stats = dir.path().join("admin.sock");
        let addr: SocketAddr = format!("127.0.0.1:{}", testkit::free_port())
            .parse()
            .expect("addr");
        let mut cmd = command();
        cmd.arg("-db")
            .arg("-f")
            .arg(config)
            .env("FRONTEND_ADDR", addr.to_string())
            .env("ORIGIN_ADDR", origin.to_string())
            .env("CORAZA_SPOE_CFG", spoe)
            .env("STATS_SOCKET", &stats);
        for (i, agent) in agents.iter().enumerate() {
            cmd.env(format!("SPOA{}_ADDR", i + 1), agent.to_string());
        }
        let pod = Pod::spawn(cmd);
        testkit::wait_for_tcp(addr, WAIT);
        let h = Haproxy {
            pod,
            addr,
            stats,
            _dir: dir,
        };
        h.wait_until_serving();
        h
    }

    fn wait_until_serving(&self) {
        let end = Instant::now() + WAIT;
        loop {
            match http(self.addr, "GET", "/warmup", &[], b"") {
                Ok(r) if r.status == 200 => return,
                other => {
                    assert!(
                        Instant::now() < end,
                        "HAProxy did not serve through the agent within {WAIT:?}: {other:?}"
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Runs an admin-socket command (e.g. `show servers state coraza-spoa`).
    pub(crate) fn admin(&self, command: &str) -> String {
        let mut s = UnixStream::connect(&self.stats).expect("stats socket");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        s.write_all(format!("{command}\n").as_bytes())
            .expect("write");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// Soft stop (SIGUSR1, HAProxy's graceful stop): stops listening, finishes what it has,
    /// closes its SPOE connections and exits.
    pub(crate) fn soft_stop(&mut self) {
        self.pod.signal(lastcall_testkit::Signal::Usr1);
    }

    /// The operational state of backend `coraza-spoa`'s server `name` ("UP", "DOWN", ...),
    /// from `show stat`.
    pub(crate) fn agent_server_status(&self, name: &str) -> String {
        let stat = self.admin("show stat");
        stat.lines()
            .map(|l| l.split(',').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&"coraza-spoa") && f.get(1) == Some(&name))
            .and_then(|f| f.get(17).map(|s| s.to_string()))
            .unwrap_or_default()
    }
}
