//! The demo's steps.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;

use crate::net::{self, Load, Origin, Stats};
use crate::procs::{self, check_interrupted, wait_until, Exit, Proc, Registry};
use crate::say;
use crate::timeline::Timeline;
use crate::ui::Ticker;
use crate::Opts;

/// The HAProxy configuration `docs/spoa.md` documents (and the spoa tests run), verbatim.
const HAPROXY_CFG: &str = include_str!("../../spoa/examples/haproxy/haproxy.cfg");
/// Its SPOE file.
const CORAZA_CFG: &str = include_str!("../../spoa/examples/haproxy/coraza.cfg");

/// The TURN REST API secret shared by lastcall-turn and the clients.
const SECRET: &str = "demo-secret-not-for-production";
/// How long the agents announce before refusing (readiness 503, everything served: in
/// Kubernetes, the time for the pod to leave its Service's endpoints). Then each connection
/// says goodbye on its next ACK and health checks are refused (docs/spoa.md, *Drain*).
const AGENT_SHUTDOWN_DELAY: &str = "3s";
/// How long lastcall-turn announces before refusing new allocations.
const TURN_SHUTDOWN_DELAY: &str = "1s";
/// Generous bound for anything the demo waits for.
const WAIT: Duration = Duration::from_secs(30);
/// A daemon that takes longer than this to leave after its last session is a failure
/// (termination.md: "a daemon with nothing left to do leaves within a second").
const MAX_EXIT_AFTER_LAST: Duration = Duration::from_secs(5);

/// Sizes of the two variants.
struct Plan {
    workers: usize,
    rate: u32,
    show_packets: u32,
    call_packets: u32,
    settle: Duration,
}

impl Plan {
    fn new(fast: bool) -> Plan {
        if fast {
            Plan {
                workers: 3,
                rate: 15,
                show_packets: 20,
                call_packets: 250,
                settle: Duration::from_millis(500),
            }
        } else {
            Plan {
                workers: 4,
                rate: 25,
                show_packets: 50,
                call_packets: 500,
                settle: Duration::from_secs(2),
            }
        }
    }
}

/// A running agent.
struct Agent {
    proc: Proc,
    addr: SocketAddr,
    admin: SocketAddr,
}

/// What a rolled or drained daemon did, for the summary.
struct Drained {
    what: String,
    pid: u32,
    exit: Exit,
    drain: Duration,
    after_last: Duration,
    after_last_exact: bool,
    last_line: String,
}

/// What the summary shows.
#[derive(Default)]
struct Totals {
    http_sent: u64,
    http_passed: u64,
    http_blocked: u64,
    http_failed: u64,
    origin_served: u64,
    packets_sent: u64,
    packets_echoed: u64,
    packets_lost: u64,
    late_call_refused: bool,
    drained: Vec<Drained>,
}

/// A uclient run's summary.
#[derive(Debug, Default)]
struct Call {
    sent: u64,
    received: u64,
    lost: Option<u64>,
}

/// Everything the demo started.
struct Demo<'a> {
    opts: &'a Opts,
    plan: Plan,
    registry: Registry,
    dir: PathBuf,
    spoa_bin: PathBuf,
    turn_bin: PathBuf,
    origin: Option<Origin>,
    agents: Vec<Agent>,
    haproxy: Option<Proc>,
    frontend: Option<SocketAddr>,
    stats: Option<Stats>,
    peer: Option<Proc>,
    peer_port: u16,
    turn: Option<Proc>,
    turn_port: u16,
    turn_admin: Option<SocketAddr>,
    /// Every process ever started (stopped ones included), for the final check.
    finished: Vec<Proc>,
    totals: Totals,
    ticker: Ticker,
    /// `--record`, `--timeline`: what a Prometheus server would have seen.
    timeline: Option<Timeline>,
}

/// Runs the demo; returns the exit status.
pub(crate) fn main(opts: &Opts, registry: &Registry, started: Instant) -> i32 {
    let workdir = match tempfile::Builder::new().prefix("lastcall-demo-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("lastcall-demo: cannot create a temporary directory: {e}");
            return 1;
        }
    };
    let (spoa_bin, turn_bin) = match binaries(opts) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("lastcall-demo FAILED before starting: {e:#}");
            return 1;
        }
    };
    let mut demo = Demo {
        opts,
        plan: Plan::new(opts.fast),
        registry: registry.clone(),
        dir: workdir.path().to_path_buf(),
        spoa_bin,
        turn_bin,
        origin: None,
        agents: Vec::new(),
        haproxy: None,
        frontend: None,
        stats: None,
        peer: None,
        peer_port: 0,
        turn: None,
        turn_port: 0,
        turn_admin: None,
        finished: Vec::new(),
        totals: Totals::default(),
        ticker: Ticker::new(started),
        timeline: (opts.record.is_some() || opts.timeline.is_some()).then(Timeline::start),
    };
    let mut result = demo.run();
    demo.ticker.clear();
    if let Some(t) = demo.timeline.take() {
        let dir = opts.record.clone().unwrap_or_else(|| demo.dir.clone());
        let written = t.finish(&dir, opts.timeline.as_deref());
        match written {
            Ok(()) => {
                if let Some(png) = &opts.timeline {
                    say!("timeline: {}", png.display());
                }
                if let Some(dir) = &opts.record {
                    say!(
                        "recorded: {} (every /metrics scrape), {}",
                        dir.join("metrics.jsonl").display(),
                        dir.join("timeline.json").display()
                    );
                }
            }
            Err(e) if result.is_ok() => result = Err(e.context("writing the timeline")),
            Err(e) => say!("(the timeline was not written: {e:#})"),
        }
    }
    let failed = result.is_err();
    if let Err(e) = &result {
        say!("");
        if procs::INTERRUPTED.load(Ordering::SeqCst) {
            say!("lastcall-demo interrupted: {e:#}; stopping everything it started");
        } else {
            say!("lastcall-demo FAILED: {e:#}");
        }
    }
    let stopped = demo.stop_everything();
    let left = match stopped {
        Ok(n) => {
            say!("stopped {n} processes; nothing left running");
            false
        }
        Err(e) => {
            say!("lastcall-demo FAILED at cleanup: {e:#}");
            true
        }
    };
    let interrupted = procs::INTERRUPTED.load(Ordering::SeqCst);
    // Kept to look into a failure (not after a Ctrl-C, unless asked).
    if ((failed || left) && !interrupted) || opts.keep {
        let kept = workdir.keep();
        say!(
            "configurations and logs kept in {} (rm -r it when done)",
            kept.display()
        );
    }
    if interrupted {
        130
    } else if failed || left {
        1
    } else {
        say!(
            "lastcall-demo: OK in {:.0} s",
            started.elapsed().as_secs_f64()
        );
        0
    }
}

/// lastcall-spoa and lastcall-turn: the options, else next to this program.
fn binaries(opts: &Opts) -> Result<(PathBuf, PathBuf)> {
    let here = std::env::current_exe()
        .context("cannot find this program's path")?
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("this program has no directory"))?;
    let spoa = opts
        .spoa_bin
        .clone()
        .unwrap_or_else(|| here.join("lastcall-spoa"));
    let turn = opts
        .turn_bin
        .clone()
        .unwrap_or_else(|| here.join("lastcall-turn"));
    for (bin, pkg) in [(&spoa, "lastcall-spoa"), (&turn, "lastcall-turn")] {
        if !bin.is_file() {
            bail!(
                "{} not found: build it (cargo build --release -p {pkg}) or pass its path (--{}-bin)",
                bin.display(),
                pkg.trim_start_matches("lastcall-")
            );
        }
    }
    for (bin, pkg) in [
        (&opts.haproxy, "haproxy"),
        (&opts.uclient, "coturn"),
        (&opts.peer, "coturn"),
    ] {
        if !bin.is_file() {
            bail!(
                "{} not found: install Debian's {pkg} package (bash scripts/setup.sh)",
                bin.display()
            );
        }
    }
    Ok((spoa, turn))
}

/// A command with no LASTCALL_* variable from the caller's environment.
fn command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("LASTCALL_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// `0.02 s` when measured, `<= 0.02 s` when only bounded (the process left between two polls
/// of its `/drain`, both of which still showed a session).
fn within(d: Duration, exact: bool) -> String {
    if exact {
        secs(d)
    } else {
        format!("<= {}", secs(d))
    }
}

impl Demo<'_> {
    fn run(&mut self) -> Result<()> {
        say!(
            "lastcall demo: everything on 127.0.0.1, in {}",
            self.dir.display()
        );
        say!("");
        say!("== 1. Start: an origin, HAProxy 2.6 with two lastcall-spoa agents (ModSecurity + OWASP CRS), lastcall-turn");
        self.start().context("step 1 (start everything)")?;
        say!("");
        say!("== 2. What they do");
        self.show()
            .context("step 2 (show a request passing, an attack blocked, a TURN call)")?;
        say!("");
        say!("== 3a. Roll both WAF agents under steady HTTP load (SIGTERM A, wait, start A'; then B)");
        self.roll_agents()
            .context("step 3a (roll the agents under load)")?;
        say!("");
        say!("== 3b. Drain lastcall-turn (SIGTERM) in the middle of a live call");
        self.drain_turn()
            .context("step 3b (drain the TURN server under a live call)")?;
        say!("");
        self.summary().context("step 4 (summary)")?;
        Ok(())
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn event(&mut self, msg: &str) {
        self.ticker.event(msg);
    }

    // ---- step 1 ---------------------------------------------------------------------------

    fn start(&mut self) -> Result<()> {
        let origin = Origin::try_start().context("origin")?;
        self.event(&format!(
            "origin (in-process HTTP server) on {}",
            origin.addr
        ));
        let origin_addr = origin.addr;
        self.origin = Some(origin);

        let a = net::free_addr()?;
        let b = net::free_addr()?;
        let agent_a = self.start_agent("agent A", a, None)?;
        let agent_b = self.start_agent("agent B", b, None)?;
        self.agents = vec![agent_a, agent_b];
        self.wait_agents_listening()?;

        self.start_haproxy(origin_addr, a, b)?;
        self.start_peer()?;
        self.start_turn()?;
        Ok(())
    }

    /// Starts an agent on `addr` (admin port: a fresh one, or `admin` for a replacement).
    fn start_agent(
        &mut self,
        name: &str,
        addr: SocketAddr,
        admin: Option<SocketAddr>,
    ) -> Result<Agent> {
        let admin = match admin {
            Some(a) => a,
            None => net::free_addr()?,
        };
        let mut cmd = command(&self.spoa_bin);
        cmd.args(["--bind", &addr.to_string()])
            .args(["--admin-addr", &admin.to_string()])
            .args(["--shutdown-delay", AGENT_SHUTDOWN_DELAY])
            .args(["--drain-timeout", "20s"]);
        let file = name.replace(' ', "-").replace('\'', "-new");
        let proc = Proc::spawn(name, cmd, &self.log(&file), &self.registry)?;
        if let Some(t) = &self.timeline {
            t.started(name, "lastcall-spoa", admin);
        }
        Ok(Agent { proc, addr, admin })
    }

    fn wait_agents_listening(&mut self) -> Result<()> {
        for i in 0..self.agents.len() {
            self.wait_agent_listening(i)?;
        }
        Ok(())
    }

    fn wait_agent_listening(&mut self, i: usize) -> Result<()> {
        let agent = self
            .agents
            .get_mut(i)
            .ok_or_else(|| anyhow!("no agent {i}"))?;
        agent.proc.wait_for_log("listening on", WAIT)?;
        let addr = agent.addr;
        wait_until(
            &format!("{} to accept connections on {addr}", agent.proc.name),
            WAIT,
            Duration::from_millis(20),
            || Ok(net::tcp_open(addr).then_some(())),
        )?;
        let msg = format!(
            "{} (lastcall-spoa, pid {}) listening on {} (SPOP), admin {}",
            agent.proc.name,
            agent.proc.pid(),
            agent.addr,
            agent.admin
        );
        self.event(&msg);
        Ok(())
    }

    fn start_haproxy(&mut self, origin: SocketAddr, a: SocketAddr, b: SocketAddr) -> Result<()> {
        let cfg = self.dir.join("haproxy.cfg");
        let spoe = self.dir.join("coraza.cfg");
        std::fs::write(&cfg, HAPROXY_CFG)?;
        std::fs::write(&spoe, CORAZA_CFG)?;
        let stats = self.dir.join("haproxy.sock");
        let frontend = net::free_addr()?;
        let mut cmd = command(&self.opts.haproxy);
        cmd.arg("-db")
            .arg("-f")
            .arg(&cfg)
            .env("FRONTEND_ADDR", frontend.to_string())
            .env("ORIGIN_ADDR", origin.to_string())
            .env("SPOA1_ADDR", a.to_string())
            .env("SPOA2_ADDR", b.to_string())
            .env("CORAZA_SPOE_CFG", &spoe)
            .env("STATS_SOCKET", &stats);
        let mut proc = Proc::spawn("haproxy", cmd, &self.log("haproxy"), &self.registry)?;
        // HAProxy binds its stats socket under a temporary name and renames it after the
        // frontend listens: wait for both.
        wait_until(
            &format!("HAProxy to listen on {frontend} and {}", stats.display()),
            WAIT,
            Duration::from_millis(20),
            || {
                proc.ensure_running()?;
                Ok((net::tcp_open(frontend) && stats.exists()).then_some(()))
            },
        )?;
        let stats = Stats(stats);
        // Both agents UP, and a request answered through them.
        for server in ["spoa1", "spoa2"] {
            wait_until(
                &format!("HAProxy to see agent server {server} UP"),
                WAIT,
                Duration::from_millis(100),
                || {
                    proc.ensure_running()?;
                    Ok(stats
                        .server_status("coraza-spoa", server)?
                        .starts_with("UP")
                        .then_some(()))
                },
            )?;
        }
        let mut last = String::new();
        wait_until(
            "a first request to pass through HAProxy and an agent",
            WAIT,
            Duration::from_millis(100),
            || {
                proc.ensure_running()?;
                match net::get(frontend, "/warmup") {
                    Ok(r) if r.status == 200 => Ok(Some(())),
                    Ok(r) => {
                        last = format!("status {}", r.status);
                        Ok(None)
                    }
                    Err(e) => {
                        last = format!("{e:#}");
                        Ok(None)
                    }
                }
            },
        )
        .with_context(|| format!("last answer: {last}"))?;
        let msg = format!(
            "HAProxy (pid {}) on {frontend}: agent servers spoa1 = A, spoa2 = B (option spop-check, check inter 1s fall 2 rise 1), fail-closed",
            proc.pid()
        );
        self.haproxy = Some(proc);
        self.frontend = Some(frontend);
        self.stats = Some(stats);
        self.event(&msg);
        Ok(())
    }

    fn start_peer(&mut self) -> Result<()> {
        let port = net::free_port()?;
        let mut cmd = command(&self.opts.peer);
        cmd.args(["-L", "127.0.0.1", "-p", &port.to_string()]);
        let mut proc = Proc::spawn(
            "turnutils_peer",
            cmd,
            &self.log("turnutils_peer"),
            &self.registry,
        )?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        wait_until(
            "turnutils_peer to echo UDP",
            WAIT,
            Duration::from_millis(20),
            || {
                proc.ensure_running()?;
                Ok(net::udp_echoes(addr)?.then_some(()))
            },
        )?;
        let msg = format!(
            "turnutils_peer (coturn's UDP echo peer, pid {}) on {addr}",
            proc.pid()
        );
        self.peer = Some(proc);
        self.peer_port = port;
        self.event(&msg);
        Ok(())
    }

    fn start_turn(&mut self) -> Result<()> {
        let port = net::free_port()?;
        let admin = net::free_addr()?;
        // A relay port window of its own (parallel demos on one machine do not collide).
        let base = 40000 + (std::process::id() % 100) * 200;
        let mut cmd = command(&self.turn_bin);
        cmd.args([
            "-n",
            "--listening-ip=127.0.0.1",
            &format!("--listening-port={port}"),
            "--relay-ip=127.0.0.1",
            "--realm=example.org",
            "--use-auth-secret",
            &format!("--static-auth-secret={SECRET}"),
            "--allow-loopback-peers",
            &format!("--admin-addr={admin}"),
            &format!("--min-port={base}"),
            &format!("--max-port={}", base + 199),
            &format!("--shutdown-delay={TURN_SHUTDOWN_DELAY}"),
            "--drain-timeout=60s",
        ]);
        let mut proc = Proc::spawn(
            "lastcall-turn",
            cmd,
            &self.log("lastcall-turn"),
            &self.registry,
        )?;
        proc.wait_for_log("lastcall-turn listening", WAIT)?;
        if let Some(t) = &self.timeline {
            t.started("lastcall-turn", "lastcall-turn", admin);
        }
        let msg = format!(
            "lastcall-turn (pid {}) on 127.0.0.1:{port} (UDP+TCP), relays 127.0.0.1:{base}-{}, admin {admin}",
            proc.pid(),
            base + 199
        );
        self.turn = Some(proc);
        self.turn_port = port;
        self.turn_admin = Some(admin);
        self.event(&msg);
        Ok(())
    }

    // ---- step 2 ---------------------------------------------------------------------------

    fn frontend(&self) -> Result<SocketAddr> {
        self.frontend
            .ok_or_else(|| anyhow!("HAProxy is not running"))
    }

    fn show(&mut self) -> Result<()> {
        let frontend = self.frontend()?;
        let benign = "/products?page=2&sort=price";
        let r = net::get(frontend, benign).with_context(|| format!("GET {benign}"))?;
        if r.status != 200 {
            bail!(
                "GET {benign}: status {} (wanted 200 from the origin): {}",
                r.status,
                r.text().trim()
            );
        }
        self.event(&format!(
            "GET {benign}  -> {} {} (CRS anomaly score {})",
            r.status,
            r.text().trim(),
            r.header("x-waf-anomaly-score").unwrap_or("?")
        ));
        let r = net::get(frontend, net::ATTACK).with_context(|| format!("GET {}", net::ATTACK))?;
        if r.status != 403 {
            bail!(
                "the attack GET {} got status {} (wanted 403)",
                net::ATTACK,
                r.status
            );
        }
        let rule = r
            .header("x-waf-ruleid")
            .ok_or_else(|| anyhow!("the 403 carries no x-waf-ruleid header"))?
            .to_string();
        self.event(&format!(
            "GET {}  -> 403 blocked by CRS rule {rule} (rules hit: {}; anomaly score {})",
            net::ATTACK,
            r.header("x-waf-rules-hit").unwrap_or("?"),
            r.header("x-waf-anomaly-score").unwrap_or("?"),
        ));
        let n = self.plan.show_packets;
        let mut call = self.spawn_call("call-1", "alice", n)?;
        let exit = call.wait_exit(Duration::from_secs(60))?;
        let report = check_call(&call, exit, n).context("the TURN call")?;
        self.count_call(&report);
        self.event(&format!(
            "TURN call: turnutils_uclient -> lastcall-turn (TCP) -> UDP relay -> turnutils_peer and back: {}/{} packets echoed, {} lost",
            report.received,
            report.sent,
            report.lost.unwrap_or(0)
        ));
        self.finished.push(call);
        Ok(())
    }

    /// Starts `turnutils_uclient`: one client over TCP (its allocation ends when the
    /// connection closes), no RTCP, `packets` messages of 100 bytes every 20 ms to the peer.
    fn spawn_call(&mut self, log: &str, user: &str, packets: u32) -> Result<Proc> {
        let mut cmd = command(&self.opts.uclient);
        cmd.args(["-t", "-c", "-X", "-m", "1", "-l", "100", "-z", "20"])
            .args(["-n", &packets.to_string()])
            .args(["-p", &self.turn_port.to_string()])
            .args(["-e", "127.0.0.1", "-r", &self.peer_port.to_string()])
            .args(["-u", user, "-W", SECRET])
            .arg("127.0.0.1");
        Proc::spawn("turnutils_uclient", cmd, &self.log(log), &self.registry)
    }

    fn count_call(&mut self, call: &Call) {
        self.totals.packets_sent += call.sent;
        self.totals.packets_echoed += call.received;
        self.totals.packets_lost += call.lost.unwrap_or(0);
    }

    // ---- step 3a --------------------------------------------------------------------------

    fn roll_agents(&mut self) -> Result<()> {
        let frontend = self.frontend()?;
        let mut load = Load::start(frontend, self.plan.workers, self.plan.rate);
        if let Some(t) = &self.timeline {
            t.watch_load(load.counters.clone());
        }
        let outcome = self.roll_under(&load);
        load.stop();
        if let Some(t) = &self.timeline {
            t.load_stopped();
        }
        let c = &load.counters;
        self.totals.http_sent = c.sent.load(Ordering::SeqCst);
        self.totals.http_passed = c.passed.load(Ordering::SeqCst);
        self.totals.http_blocked = c.blocked.load(Ordering::SeqCst);
        self.totals.http_failed = c.failed.load(Ordering::SeqCst);
        self.totals.origin_served = self
            .origin
            .as_ref()
            .map_or(0, |o| o.served.load(Ordering::SeqCst));
        if outcome.is_err() {
            let failures = c.failures.lock();
            self.event(&format!(
                "load stopped: {} requests sent, {} failed{}{}",
                self.totals.http_sent,
                self.totals.http_failed,
                if failures.is_empty() {
                    ""
                } else {
                    ", e.g.:\n    "
                },
                failures.join("\n    ")
            ));
        }
        outcome?;
        self.event(&format!(
            "load stopped: {} requests sent, {} passed, {} blocked (attacks), {} failed",
            self.totals.http_sent,
            self.totals.http_passed,
            self.totals.http_blocked,
            self.totals.http_failed
        ));
        if self.totals.http_failed > 0 {
            let failures = c.failures.lock();
            bail!(
                "{} of {} requests failed during the rollout, e.g.:\n  {}",
                self.totals.http_failed,
                self.totals.http_sent,
                failures.join("\n  ")
            );
        }
        let mut per_agent = Vec::new();
        for agent in &self.agents {
            let mut n = 0.0;
            for verdict in ["allow", "deny"] {
                let series = format!("spoa_requests_total{{verdict=\"{verdict}\"}}");
                n += net::metric(agent.admin, &series)?.unwrap_or(0.0);
            }
            per_agent.push(format!("{} {n}", agent.proc.name));
        }
        self.event(&format!(
            "requests evaluated by the new agents: {} (HAProxy keeps using the SPOP connections it has, so the first replacement takes most of it)",
            per_agent.join(", ")
        ));
        Ok(())
    }

    fn roll_under(&mut self, load: &Load) -> Result<()> {
        self.event(&format!(
            "steady load: {} clients x {} req/s through HAProxy, every 5th request an SQL injection (must get 403), the rest must get 200",
            self.plan.workers, self.plan.rate
        ));
        self.wait_load(load, 20, "the load to start")?;
        for (i, server, old, new) in [
            (0, "spoa1", "agent A", "agent A'"),
            (1, "spoa2", "agent B", "agent B'"),
        ] {
            let drained = self.roll_one(i, server, old, new, load)?;
            self.totals.drained.push(drained);
        }
        let settle_end = Instant::now() + self.plan.settle;
        while Instant::now() < settle_end {
            check_interrupted()?;
            self.progress(load, None);
            std::thread::sleep(Duration::from_millis(20));
        }
        self.wait_load(load, 10, "requests through the new agents")?;
        Ok(())
    }

    /// Waits until `n` more requests were answered (traffic is flowing).
    fn wait_load(&mut self, load: &Load, n: u64, what: &str) -> Result<()> {
        let target = load.answered() + n;
        let end = Instant::now() + WAIT;
        while load.answered() < target {
            check_interrupted()?;
            if Instant::now() >= end {
                bail!("timed out after {WAIT:?} waiting for {what} (requests stalled)");
            }
            self.check_haproxy()?;
            self.progress(load, None);
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn check_haproxy(&mut self) -> Result<()> {
        match self.haproxy.as_mut() {
            Some(h) => h.ensure_running(),
            None => bail!("HAProxy is not running"),
        }
    }

    fn server_status(&self, server: &str) -> String {
        self.stats
            .as_ref()
            .and_then(|s| s.server_status("coraza-spoa", server).ok())
            .unwrap_or_else(|| "?".to_string())
    }

    fn progress(&mut self, load: &Load, draining: Option<(&str, &serde_json::Value)>) {
        if !self.ticker.due() {
            return;
        }
        let c = &load.counters;
        let mut line = format!(
            "http {} sent, {} passed, {} blocked, {} failed | spoa1 {}, spoa2 {}",
            c.sent.load(Ordering::SeqCst),
            c.passed.load(Ordering::SeqCst),
            c.blocked.load(Ordering::SeqCst),
            c.failed.load(Ordering::SeqCst),
            self.server_status("spoa1"),
            self.server_status("spoa2"),
        );
        if let Some((name, state)) = draining {
            line.push_str(&format!(
                " | {name}: {}, {} sessions",
                state
                    .get("phase")
                    .and_then(|v| v.as_str())
                    .unwrap_or("exiting"),
                state
                    .get("sessions")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0)
            ));
        }
        self.ticker.tick(|| line);
    }

    fn roll_one(
        &mut self,
        i: usize,
        server: &str,
        old: &str,
        new: &str,
        load: &Load,
    ) -> Result<Drained> {
        for s in ["spoa1", "spoa2"] {
            let status = self.server_status(s);
            if !status.starts_with("UP") {
                bail!("before rolling {old}: HAProxy's {s} is {status}, not UP");
            }
        }
        let (pid, addr, admin) = {
            let a = self
                .agents
                .get_mut(i)
                .ok_or_else(|| anyhow!("no agent {i}"))?;
            a.proc.signal(Signal::SIGTERM)?;
            (a.proc.pid(), a.addr, a.admin)
        };
        if let Some(t) = &self.timeline {
            t.signalled(old, "SIGTERM");
        }
        let signalled = Instant::now();
        self.event(&format!(
            "SIGTERM -> {old} (pid {pid}): readiness 503, everything served for {AGENT_SHUTDOWN_DELAY}; then each connection says goodbye on its next ACK, health checks refused"
        ));
        let mut tracker = SessionTracker::new(signalled);
        let mut state = serde_json::Value::Null;
        let mut seen_down = false;
        let exit = loop {
            check_interrupted()?;
            self.check_haproxy()?;
            let a = self
                .agents
                .get_mut(i)
                .ok_or_else(|| anyhow!("no agent {i}"))?;
            if let Some(exit) = a.proc.try_exit()? {
                if let Some(t) = &self.timeline {
                    t.exited(old, &exit.describe());
                }
                break exit;
            }
            if signalled.elapsed() > WAIT {
                bail!(
                    "{old} did not exit within {WAIT:?} of SIGTERM; its last log lines:\n{}",
                    a.proc.tail(10)
                );
            }
            let asked = Instant::now();
            if let Ok(s) = net::drain_state(admin) {
                tracker.observe(&s, asked);
                state = s;
            }
            if !seen_down && self.server_status(server).starts_with("DOWN") {
                seen_down = true;
                self.event(&format!(
                    "HAProxy marked {server} ({old}) DOWN: new SPOP connections go to the other agent"
                ));
            }
            self.progress(load, Some((old, &state)));
            std::thread::sleep(Duration::from_millis(10));
        };
        let a = self
            .agents
            .get_mut(i)
            .ok_or_else(|| anyhow!("no agent {i}"))?;
        let last_line = a
            .proc
            .last_line_with("drain ended")
            .map(|l| drain_ended(&l))
            .unwrap_or_default();
        if exit.status.code() != Some(0) {
            bail!(
                "{old} exited with {} (wanted 0: drained); its last log lines:\n{}",
                exit.describe(),
                a.proc.tail(10)
            );
        }
        if !seen_down {
            self.event(&format!(
                "{old} left before HAProxy marked {server} DOWN: its connections said goodbye as it began refusing, and HAProxy opened new ones on the other agent"
            ));
        }
        let (after_last, exact) = tracker.after_last(exit.at);
        let drained = Drained {
            what: format!("{old} (lastcall-spoa, {server})"),
            pid,
            exit,
            drain: exit.at.saturating_duration_since(signalled),
            after_last,
            after_last_exact: exact,
            last_line: last_line.clone(),
        };
        self.event(&format!(
            "{old} exited 0, {} after SIGTERM, {} after its last session ended ({})",
            secs(drained.drain),
            within(after_last, exact),
            last_line.trim()
        ));
        if after_last > MAX_EXIT_AFTER_LAST {
            bail!(
                "{old} took {} to exit after its last connection closed (expected well under {MAX_EXIT_AFTER_LAST:?})",
                secs(after_last)
            );
        }
        let old_proc = self.agents.remove(i).proc;
        self.finished.push(old_proc);
        // The replacement, on the same address (as a new pod behind the same Service name).
        let agent = self.start_agent(new, addr, Some(admin))?;
        self.agents.insert(i, agent);
        self.wait_agent_listening(i)?;
        let end = Instant::now() + WAIT;
        while !self.server_status(server).starts_with("UP") {
            check_interrupted()?;
            self.check_haproxy()?;
            if Instant::now() >= end {
                bail!("HAProxy did not mark {server} ({new}) UP within {WAIT:?}");
            }
            self.progress(load, None);
            std::thread::sleep(Duration::from_millis(20));
        }
        self.event(&format!("HAProxy marked {server} ({new}) UP"));
        Ok(drained)
    }

    // ---- step 3b --------------------------------------------------------------------------

    fn turn_admin(&self) -> Result<SocketAddr> {
        self.turn_admin
            .ok_or_else(|| anyhow!("lastcall-turn is not running"))
    }

    fn turn_metric(&self, series: &str) -> f64 {
        self.turn_admin
            .and_then(|a| net::metric(a, series).ok().flatten())
            .unwrap_or(0.0)
    }

    fn drain_turn(&mut self) -> Result<()> {
        let admin = self.turn_admin()?;
        let n = self.plan.call_packets;
        // Packets relayed before this call (the first call's), so that the signal is sent
        // only once this call relays.
        let before = self.turn_metric("turn_total_traffic_peer_sentp");
        let mut call = self.spawn_call("call-2", "caller", n)?;
        let call_started = Instant::now();
        self.event(&format!(
            "a call starts: turnutils_uclient over TCP, {n} packets of 100 bytes, one every 20 ms, echoed by the peer"
        ));
        // Relaying before the signal.
        wait_until(
            "the call's allocation to relay packets",
            WAIT,
            Duration::from_millis(20),
            || {
                call.ensure_running()?;
                if let Some(t) = self.turn.as_mut() {
                    t.ensure_running()?;
                }
                let alloc =
                    net::metric(admin, "turn_total_allocations{type=\"TCP\"}")?.unwrap_or(0.0);
                let relayed = net::metric(admin, "turn_total_traffic_peer_sentp")?.unwrap_or(0.0);
                Ok((alloc >= 1.0 && relayed >= before + 10.0).then_some(()))
            },
        )?;
        let turn = self
            .turn
            .as_mut()
            .ok_or_else(|| anyhow!("lastcall-turn is not running"))?;
        turn.signal(Signal::SIGTERM)?;
        let signalled = Instant::now();
        if let Some(t) = &self.timeline {
            t.signalled("lastcall-turn", "SIGTERM");
        }
        let pid = turn.pid();
        self.event(&format!(
            "SIGTERM -> lastcall-turn (pid {pid}) while the call relays: readiness 503 for {TURN_SHUTDOWN_DELAY}, then new allocations refused"
        ));
        let mut tracker = SessionTracker::new(signalled);
        let mut late: Option<Proc> = None;
        let mut late_checked = false;
        let mut call_exit: Option<Exit> = None;
        let turn_exit = loop {
            check_interrupted()?;
            if call_exit.is_none() {
                if let Some(exit) = call.try_exit()? {
                    self.call_ended(&call, exit, n, call_started)?;
                    call_exit = Some(exit);
                } else if call_started.elapsed() > Duration::from_secs(90) {
                    bail!("the call did not end within 90 s");
                }
            }
            let turn = self
                .turn
                .as_mut()
                .ok_or_else(|| anyhow!("lastcall-turn is not running"))?;
            if let Some(exit) = turn.try_exit()? {
                if let Some(t) = &self.timeline {
                    t.exited("lastcall-turn", &exit.describe());
                }
                // The client closes its connection (ending the allocation) just before it
                // exits: give it a moment to be seen exiting.
                if call_exit.is_none() {
                    if let Ok(c) = call.wait_exit(Duration::from_secs(3)) {
                        self.call_ended(&call, c, n, call_started)?;
                        call_exit = Some(c);
                    }
                }
                let turn = self
                    .turn
                    .as_mut()
                    .ok_or_else(|| anyhow!("lastcall-turn is not running"))?;
                if call_exit.is_none() {
                    bail!(
                        "lastcall-turn exited ({}) while the call was still live; its last log lines:\n{}",
                        exit.describe(),
                        turn.tail(10)
                    );
                }
                break exit;
            }
            if signalled.elapsed() > Duration::from_secs(90) {
                bail!(
                    "lastcall-turn did not exit within 90 s of SIGTERM; its last log lines:\n{}",
                    turn.tail(10)
                );
            }
            let asked = Instant::now();
            let state = net::drain_state(admin).ok();
            if let Some(s) = &state {
                tracker.observe(s, asked);
            }
            let phase = state
                .as_ref()
                .and_then(|s| s.get("phase"))
                .and_then(|v| v.as_str())
                .unwrap_or("exiting")
                .to_string();
            // Once refusing, a new call must be turned away at once (403, coturn's answer).
            if late.is_none() && !late_checked && phase == "refusing" && call_exit.is_none() {
                late = Some(self.spawn_call("call-late", "latecomer", 5)?);
                self.event("a new call tries to allocate while draining ...");
            }
            if let Some(l) = late.as_mut() {
                if let Some(exit) = l.try_exit()? {
                    let text = l.log_text();
                    if exit.status.success() || !text.contains("403") {
                        bail!(
                            "a new allocation during the drain was not refused with 403 ({}):\n{}",
                            exit.describe(),
                            l.tail(10)
                        );
                    }
                    self.totals.late_call_refused = true;
                    late_checked = true;
                    self.event("... and is refused with 403 at once (its client would try another server); the live call goes on");
                    if let Some(l) = late.take() {
                        self.finished.push(l);
                    }
                } else if signalled.elapsed() > WAIT {
                    bail!("the new call was neither refused nor served within {WAIT:?}");
                }
            }
            if self.ticker.due() {
                let relayed = self.turn_metric("turn_total_traffic_peer_sentp") - before;
                let line = format!(
                    "lastcall-turn: {phase}, {} allocation(s), {relayed} of the call's packets relayed to the peer, {:.1} s since SIGTERM",
                    state
                        .as_ref()
                        .and_then(|s| s.get("sessions"))
                        .and_then(serde_json::Value::as_u64)
                        .unwrap_or(0),
                    signalled.elapsed().as_secs_f64()
                );
                self.ticker.tick(|| line);
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let turn = self
            .turn
            .as_mut()
            .ok_or_else(|| anyhow!("lastcall-turn is not running"))?;
        if turn_exit.status.code() != Some(0) {
            bail!(
                "lastcall-turn exited with {} (wanted 0: drained); its last log lines:\n{}",
                turn_exit.describe(),
                turn.tail(10)
            );
        }
        if !late_checked {
            say!("  (the call ended before the server started refusing: no new call was tried)");
        }
        let last_line = turn
            .last_line_with("drain ended")
            .map(|l| drain_ended(&l))
            .unwrap_or_default();
        let (after_last, exact) = tracker.after_last(turn_exit.at);
        self.event(&format!(
            "lastcall-turn exited 0, {} after SIGTERM, {} after its last allocation ended ({})",
            secs(turn_exit.at.saturating_duration_since(signalled)),
            within(after_last, exact),
            last_line.trim()
        ));
        self.totals.drained.push(Drained {
            what: "lastcall-turn".to_string(),
            pid,
            exit: turn_exit,
            drain: turn_exit.at.saturating_duration_since(signalled),
            after_last,
            after_last_exact: exact,
            last_line,
        });
        self.finished.push(call);
        if let Some(t) = self.turn.take() {
            self.finished.push(t);
        }
        if after_last > MAX_EXIT_AFTER_LAST {
            bail!(
                "lastcall-turn took {} to exit after its last allocation ended (expected well under {MAX_EXIT_AFTER_LAST:?})",
                secs(after_last)
            );
        }
        Ok(())
    }

    /// Checks and counts the call that outlived the signal.
    fn call_ended(&mut self, call: &Proc, exit: Exit, n: u32, started: Instant) -> Result<()> {
        let report = check_call(call, exit, n).context("the call that outlived SIGTERM")?;
        self.count_call(&report);
        self.event(&format!(
            "the call ended by itself after {:.1} s: {}/{} packets echoed, {} lost; its allocation is gone",
            exit.at.saturating_duration_since(started).as_secs_f64(),
            report.received,
            report.sent,
            report.lost.unwrap_or(0)
        ));
        Ok(())
    }

    // ---- step 4 ---------------------------------------------------------------------------

    fn summary(&mut self) -> Result<()> {
        let t = &self.totals;
        say!("== 4. Summary");
        say!(
            "  HTTP requests sent during the rollout    {:>8}",
            t.http_sent
        );
        say!(
            "    passed (200) / blocked attacks (403)   {:>8} / {}",
            t.http_passed,
            t.http_blocked
        );
        say!(
            "    failed                                 {:>8}",
            t.http_failed
        );
        say!(
            "  requests the origin answered in all      {:>8} (attacks never reach it)",
            t.origin_served
        );
        say!(
            "  TURN packets relayed and echoed back     {:>8} of {} sent",
            t.packets_echoed,
            t.packets_sent
        );
        say!(
            "    lost                                   {:>8}",
            t.packets_lost
        );
        say!(
            "  new TURN allocation while draining       {:>8}",
            if t.late_call_refused {
                "refused"
            } else {
                "not tried"
            }
        );
        say!("");
        say!(
            "  {:<34} {:>7}  {:<7} {:>14}  {:>24}",
            "process (SIGTERM)",
            "pid",
            "exit",
            "SIGTERM->exit",
            "last session->exit"
        );
        for d in &t.drained {
            say!(
                "  {:<34} {:>7}  {:<7} {:>14}  {:>24}",
                d.what,
                d.pid,
                d.exit.describe(),
                secs(d.drain),
                within(d.after_last, d.after_last_exact)
            );
        }
        say!("");
        say!("  (SIGTERM->exit includes the announce delay: {AGENT_SHUTDOWN_DELAY} for the agents, {TURN_SHUTDOWN_DELAY} for lastcall-turn, during which load");
        say!("   balancers take them out of rotation; 'last session' = last SPOP connection / TURN allocation, seen from /drain)");
        for d in &t.drained {
            if !d.last_line.is_empty() {
                say!("  {}: {}", d.what, d.last_line.trim());
            }
        }
        if t.http_failed != 0 || t.packets_lost != 0 || t.packets_echoed != t.packets_sent {
            bail!("requests failed or packets were lost");
        }
        Ok(())
    }

    // ---- step 5 ---------------------------------------------------------------------------

    /// Stops every process still running (HAProxy first, then the agents, the TURN server
    /// and the peer), checks that none is left, and returns how many processes the demo ran.
    fn stop_everything(&mut self) -> Result<usize> {
        let fast_kill = procs::INTERRUPTED.load(Ordering::SeqCst);
        let grace = if fast_kill {
            Duration::ZERO
        } else {
            Duration::from_secs(5)
        };
        let mut all: Vec<Proc> = Vec::new();
        if let Some(h) = self.haproxy.take() {
            all.push(h);
        }
        all.extend(self.agents.drain(..).map(|a| a.proc));
        all.extend(self.turn.take());
        all.extend(self.peer.take());
        all.append(&mut self.finished);
        self.origin = None;
        let mut problems = Vec::new();
        for p in &mut all {
            // HAProxy: SIGUSR1 = soft stop; the daemons: SIGQUIT = leave now (nothing is
            // being served any more); coturn's tools: SIGTERM.
            let sig = match p.name.as_str() {
                "haproxy" => Signal::SIGUSR1,
                n if n.starts_with("agent") || n == "lastcall-turn" => Signal::SIGQUIT,
                _ => Signal::SIGTERM,
            };
            if let Err(e) = p.stop(sig, grace) {
                problems.push(format!("{}: {e:#}", p.name));
            }
        }
        for p in &all {
            if p.group_alive() {
                problems.push(format!(
                    "{} (pid {}) left processes behind",
                    p.name,
                    p.pid()
                ));
            }
        }
        if !problems.is_empty() {
            bail!("{}", problems.join("; "));
        }
        Ok(all.len())
    }
}

/// Follows a daemon's `GET /drain` after its signal: when its session count was last seen
/// above zero and first seen at zero.
struct SessionTracker {
    last_live: Instant,
    first_idle: Option<Instant>,
}

impl SessionTracker {
    fn new(signalled: Instant) -> SessionTracker {
        SessionTracker {
            last_live: signalled,
            first_idle: None,
        }
    }

    /// `state` is the answer to a request sent at `asked`.
    fn observe(&mut self, state: &serde_json::Value, asked: Instant) {
        let sessions = state.get("sessions").and_then(serde_json::Value::as_u64);
        match sessions {
            Some(0) => {
                self.first_idle.get_or_insert(asked);
            }
            Some(_) => {
                self.last_live = asked;
                self.first_idle = None;
            }
            None => {}
        }
    }

    /// Time from the last session's end to `exit`: exact (to the polling interval) if the
    /// idle state was seen, else an upper bound from the last time a session was seen.
    fn after_last(&self, exit: Instant) -> (Duration, bool) {
        match self.first_idle {
            Some(idle) => (exit.saturating_duration_since(idle), true),
            None => (exit.saturating_duration_since(self.last_live), false),
        }
    }
}

/// The daemon's last drain line, from "drain ended" to "exit status N" (without the
/// timestamp, level and structured fields around it).
fn drain_ended(line: &str) -> String {
    let from = line.find("drain ended").unwrap_or(0);
    let text = line.get(from..).unwrap_or(line);
    match text.find("exit status ") {
        Some(at) => {
            let rest = text.get(at + "exit status ".len()..).unwrap_or("");
            let digits = rest.chars().take_while(char::is_ascii_digit).count();
            text.get(..at + "exit status ".len() + digits)
                .unwrap_or(text)
                .to_string()
        }
        None => text.to_string(),
    }
}

/// Parses and checks a uclient run: exit 0, every packet echoed, none lost.
fn check_call(call: &Proc, exit: Exit, packets: u32) -> Result<Call> {
    let text = call.log_text();
    let report = parse_uclient(&text);
    let want = u64::from(packets);
    if !exit.status.success()
        || report.sent != want
        || report.received != want
        || report.lost != Some(0)
    {
        bail!(
            "turnutils_uclient {} with {} of {want} packets sent, {} echoed, {} lost; its last lines:\n{}",
            exit.describe(),
            report.sent,
            report.received,
            report.lost.map_or("?".to_string(), |l| l.to_string()),
            call.tail(12)
        );
    }
    Ok(report)
}

/// The totals of `turnutils_uclient`'s output (the testkit's parser of its summary lines).
fn parse_uclient(output: &str) -> Call {
    let r = lastcall_testkit::coturn::parse_report(output);
    Call {
        sent: r.send_msgs,
        received: r.recv_msgs,
        lost: r.lost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uclient_totals() {
        let text = "1: : start_mclient: msz=1, tot_send_msgs=0, tot_recv_msgs=0\n\
                    4: : start_mclient: tot_send_msgs=50, tot_recv_msgs=49\n\
                    4: : Total lost packets 1 (2.000000%), total send dropped 0 (0.000000%)\n";
        let c = parse_uclient(text);
        assert_eq!((c.sent, c.received, c.lost), (50, 49, Some(1)));
        assert_eq!(parse_uclient("error 403").lost, None);
    }

    #[test]
    fn drain_line() {
        let l = "2026-11-29T18:00:00Z  INFO lastcall::lifecycle: drain ended: idle, no session left after 3.0s; exit status 0 status=0";
        assert_eq!(
            drain_ended(l),
            "drain ended: idle, no session left after 3.0s; exit status 0"
        );
    }

    #[test]
    fn tracker_exact_or_bound() {
        let t0 = Instant::now();
        let mut t = SessionTracker::new(t0);
        t.observe(&serde_json::json!({"sessions": 2}), Instant::now());
        let (_, exact) = t.after_last(Instant::now());
        assert!(!exact);
        t.observe(&serde_json::json!({"sessions": 0}), Instant::now());
        let (_, exact) = t.after_last(Instant::now());
        assert!(exact);
        t.observe(&serde_json::json!({"sessions": 1}), Instant::now());
        assert!(t.first_idle.is_none());
    }
}
