//! The demo's steps: the order and the summary here; each daemon's own steps in `spoa`
//! (the agents behind HAProxy, rolled under load) and `turn` (the relay, drained during
//! a call).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;

use crate::net::{self, Origin, Stats};
use crate::procs::{self, Exit, Proc, Registry};
use crate::say;
use crate::timeline::Timeline;
use crate::ui::Ticker;
use crate::Opts;

mod spoa;
mod turn;

use spoa::{Agent, AGENT_SHUTDOWN_DELAY};
use turn::{check_call, TURN_SHUTDOWN_DELAY};

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

#[cfg(test)]
mod tests {
    use super::turn::parse_uclient;
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
