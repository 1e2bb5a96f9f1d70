//! What the spoa tests share beyond `lastcall-testkit`: the `lastcall-spoa` agent process,
//! and (in `haproxy`) a real HAProxy in front of it and the testkit's origin, with
//! `nginx` + ModSecurity as the reference and `traffic` as the load.
//!
//! [`Stack::start`] brings all of it up on loopback with free ports and returns the
//! addresses; everything is killed when the values are dropped (also on panic).

pub(crate) mod haproxy;
pub(crate) mod nginx;
pub(crate) mod spop;
pub(crate) mod traffic;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use lastcall_testkit::{self as testkit, metrics, Pod, Signal};

pub(crate) use haproxy::Haproxy;
pub(crate) use lastcall_testkit::http::{get, http, post_form, read_response, Reply};
pub(crate) use lastcall_testkit::metrics::metric_value;
pub(crate) use lastcall_testkit::{Origin, WAIT};

/// Path of the agent binary under test.
pub(crate) fn agent_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lastcall-spoa"))
}

/// The agent's command: [`agent_bin`], through `LASTCALL_SPOA_RUNNER` when that is set
/// (scripts/test_peers.sh runs it on Debian 13's and unstable's libmodsecurity).
pub(crate) fn agent_command() -> Command {
    lastcall_testkit::peers::ours("LASTCALL_SPOA_RUNNER", &agent_bin())
}

/// A running `lastcall-spoa` process.
pub(crate) struct Agent {
    /// The process (stderr lines captured).
    pub pod: Pod,
    /// SPOP listener.
    pub addr: SocketAddr,
    /// Admin listener (`/metrics`, `/readyz`, `/drain`).
    pub admin: SocketAddr,
    _dir: Option<tempfile::TempDir>,
}

impl Agent {
    /// Sends `signal` and waits (up to [`WAIT`]) for a log line containing `needle` written
    /// after the signal; returns that line.
    pub(crate) fn signal_and_wait_for_log(&mut self, signal: Signal, needle: &str) -> String {
        let mark = self.pod.log_len();
        self.pod.signal(signal);
        self.pod.wait_for_log_after(mark, needle, WAIT)
    }

    /// Starts an agent on free loopback ports with `config` (YAML; `None` = built-in CRS
    /// application) and extra arguments; waits until it listens.
    pub(crate) fn start(config: Option<&str>, extra: &[&str]) -> Agent {
        let port = testkit::free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        Self::start_at(addr, config, extra)
    }

    /// Like [`Agent::start`], on a given SPOP address (a restarted agent takes its
    /// predecessor's address, as a new pod takes the Service's).
    pub(crate) fn start_at(addr: SocketAddr, config: Option<&str>, extra: &[&str]) -> Agent {
        let admin: SocketAddr = format!("127.0.0.1:{}", testkit::free_port())
            .parse()
            .expect("addr");
        let mut cmd = agent_command();
        cmd.args([
            "--bind",
            &addr.to_string(),
            "--admin-addr",
            &admin.to_string(),
        ]);
        let dir = config.map(|text| {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("lastcall-spoa.yaml");
            std::fs::write(&path, text).expect("write config");
            cmd.arg("--config").arg(&path);
            dir
        });
        cmd.args(extra);
        let pod = Pod::spawn(cmd);
        pod.wait_for_log("listening on", WAIT);
        testkit::wait_for_tcp(addr, WAIT);
        Agent {
            pod,
            addr,
            admin,
            _dir: dir,
        }
    }

    /// The config file path, if one was given.
    pub(crate) fn config_path(&self) -> Option<PathBuf> {
        self._dir
            .as_ref()
            .map(|d| d.path().join("lastcall-spoa.yaml"))
    }

    /// `/metrics` text.
    pub(crate) fn metrics(&self) -> String {
        metrics::scrape(self.admin)
    }

    /// Value of one metric line (exact name with labels), 0 if absent.
    pub(crate) fn metric(&self, name_and_labels: &str) -> f64 {
        metric_value(&self.metrics(), name_and_labels)
    }
}

/// Options for [`Stack::start`].
#[derive(Debug, Clone, Default)]
pub(crate) struct StackOptions {
    /// Agent configuration (YAML); `None` = the built-in CRS application.
    pub agent_config: Option<String>,
    /// How many agent processes (with 1, both HAProxy servers point at it; beyond 2, the
    /// documented file gets a server line for each).
    pub agents: usize,
    /// Extra agent arguments.
    pub agent_args: Vec<String>,
    /// Run HAProxy without per-request logs (load measurements).
    pub quiet_haproxy: bool,
    /// Run HAProxy without the retry safety net (measurements; see [`haproxy::Variant`]).
    pub no_retry: bool,
    /// Timeouts for 1 MiB bodies on a loaded machine: SPOE `timeout processing 30s`, and
    /// the agent's `evaluation_timeout: 25s` (before `agent_config`, else with the built-in
    /// application).
    pub slow_bodies: bool,
    /// The SPOE file without `max-waiting-frames 1` (see [`haproxy::Variant::pipelined`]).
    pub pipelined: bool,
    /// Words added to each agent `server` line.
    pub server_options: &'static str,
    /// The agent `server` lines without `on-marked-down shutdown-sessions`.
    pub keep_sessions: bool,
}

/// Origin + agent(s) + HAProxy, all on loopback.
pub(crate) struct Stack {
    /// HAProxy (drop order: HAProxy first, then agents, then origin).
    pub haproxy: Haproxy,
    /// The agents.
    pub agents: Vec<Agent>,
    /// The origin.
    pub origin: Origin,
}

impl Stack {
    /// Starts everything and waits until HAProxy answers through the agent.
    pub(crate) fn start(opts: StackOptions) -> Stack {
        let origin = Origin::start();
        let args: Vec<&str> = opts.agent_args.iter().map(String::as_str).collect();
        let slow = opts.slow_bodies.then(|| {
            let rest = opts
                .agent_config
                .as_deref()
                .unwrap_or("default_application: default\napplications:\n  - name: default\n");
            format!("evaluation_timeout: 25s\n{rest}")
        });
        let config = slow.as_deref().or(opts.agent_config.as_deref());
        let agents: Vec<Agent> = (0..opts.agents.max(1))
            .map(|_| Agent::start(config, &args))
            .collect();
        let mut addrs: Vec<SocketAddr> = agents.iter().map(|a| a.addr).collect();
        if addrs.len() == 1 {
            addrs.push(addrs[0]);
        }
        let haproxy = Haproxy::start_agents(
            origin.addr,
            &addrs,
            &haproxy::Variant {
                quiet: opts.quiet_haproxy,
                no_retry: opts.no_retry,
                slow_bodies: opts.slow_bodies,
                pipelined: opts.pipelined,
                server_options: opts.server_options,
                keep_sessions: opts.keep_sessions,
            },
        );
        Stack {
            haproxy,
            agents,
            origin,
        }
    }

    /// HAProxy's HTTP address.
    pub(crate) fn http(&self) -> SocketAddr {
        self.haproxy.addr
    }
}

/// The directory of this crate (for example files).
pub(crate) fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}
