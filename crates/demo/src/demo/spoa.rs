//! The agents' steps: lastcall-spoa behind HAProxy (the configuration docs/spoa.md
//! documents), started, then rolled one at a time under load.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;

use crate::net::{self, Load, Stats};
use crate::procs::{check_interrupted, wait_until, Proc};

use super::{
    command, drain_ended, secs, within, Demo, Drained, SessionTracker, MAX_EXIT_AFTER_LAST, WAIT,
};

/// The HAProxy configuration `docs/spoa.md` documents (and the spoa tests run), verbatim.
const HAPROXY_CFG: &str = include_str!("../../../spoa/examples/haproxy/haproxy.cfg");
/// Its SPOE file.
const CORAZA_CFG: &str = include_str!("../../../spoa/examples/haproxy/coraza.cfg");

/// How long the agents announce before refusing (readiness 503, everything served: in
/// Kubernetes, the time for the pod to leave its Service's endpoints). Then each connection
/// says goodbye on its next ACK and health checks are refused (docs/spoa.md, *Drain*).
pub(super) const AGENT_SHUTDOWN_DELAY: &str = "3s";
/// A running agent.
pub(super) struct Agent {
    pub(super) proc: Proc,
    pub(super) addr: SocketAddr,
    pub(super) admin: SocketAddr,
}

impl Demo<'_> {
    /// Starts an agent on `addr` (admin port: a fresh one, or `admin` for a replacement).
    pub(super) fn start_agent(
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

    pub(super) fn wait_agents_listening(&mut self) -> Result<()> {
        for i in 0..self.agents.len() {
            self.wait_agent_listening(i)?;
        }
        Ok(())
    }

    pub(super) fn wait_agent_listening(&mut self, i: usize) -> Result<()> {
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

    pub(super) fn start_haproxy(
        &mut self,
        origin: SocketAddr,
        a: SocketAddr,
        b: SocketAddr,
    ) -> Result<()> {
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

    pub(super) fn frontend(&self) -> Result<SocketAddr> {
        self.frontend
            .ok_or_else(|| anyhow!("HAProxy is not running"))
    }

    pub(super) fn roll_agents(&mut self) -> Result<()> {
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

    pub(super) fn roll_under(&mut self, load: &Load) -> Result<()> {
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
    pub(super) fn wait_load(&mut self, load: &Load, n: u64, what: &str) -> Result<()> {
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

    pub(super) fn check_haproxy(&mut self) -> Result<()> {
        match self.haproxy.as_mut() {
            Some(h) => h.ensure_running(),
            None => bail!("HAProxy is not running"),
        }
    }

    pub(super) fn server_status(&self, server: &str) -> String {
        self.stats
            .as_ref()
            .and_then(|s| s.server_status("coraza-spoa", server).ok())
            .unwrap_or_else(|| "?".to_string())
    }

    pub(super) fn progress(&mut self, load: &Load, draining: Option<(&str, &serde_json::Value)>) {
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

    pub(super) fn roll_one(
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
}
