//! The relay's steps: lastcall-turn with coturn's peer and clients, and its drain during
//! a call.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;

use crate::net;
use crate::procs::{check_interrupted, wait_until, Exit, Proc};
use crate::say;

use super::{
    command, drain_ended, secs, within, Demo, Drained, SessionTracker, MAX_EXIT_AFTER_LAST, WAIT,
};

/// The TURN REST API secret shared by lastcall-turn and the clients.
pub(super) const SECRET: &str = "demo-secret-not-for-production";
/// How long lastcall-turn announces before refusing new allocations.
pub(super) const TURN_SHUTDOWN_DELAY: &str = "1s";
/// A uclient run's summary.
#[derive(Debug, Default)]
pub(super) struct Call {
    pub(super) sent: u64,
    pub(super) received: u64,
    pub(super) lost: Option<u64>,
}

impl Demo<'_> {
    pub(super) fn start_peer(&mut self) -> Result<()> {
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

    pub(super) fn start_turn(&mut self) -> Result<()> {
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

    /// Starts `turnutils_uclient`: one client over TCP (its allocation ends when the
    /// connection closes), no RTCP, `packets` messages of 100 bytes every 20 ms to the peer.
    pub(super) fn spawn_call(&mut self, log: &str, user: &str, packets: u32) -> Result<Proc> {
        let mut cmd = command(&self.opts.uclient);
        cmd.args(["-t", "-c", "-X", "-m", "1", "-l", "100", "-z", "20"])
            .args(["-n", &packets.to_string()])
            .args(["-p", &self.turn_port.to_string()])
            .args(["-e", "127.0.0.1", "-r", &self.peer_port.to_string()])
            .args(["-u", user, "-W", SECRET])
            .arg("127.0.0.1");
        Proc::spawn("turnutils_uclient", cmd, &self.log(log), &self.registry)
    }

    pub(super) fn count_call(&mut self, call: &Call) {
        self.totals.packets_sent += call.sent;
        self.totals.packets_echoed += call.received;
        self.totals.packets_lost += call.lost.unwrap_or(0);
    }

    // ---- step 3a --------------------------------------------------------------------------

    pub(super) fn turn_admin(&self) -> Result<SocketAddr> {
        self.turn_admin
            .ok_or_else(|| anyhow!("lastcall-turn is not running"))
    }

    pub(super) fn turn_metric(&self, series: &str) -> f64 {
        self.turn_admin
            .and_then(|a| net::metric(a, series).ok().flatten())
            .unwrap_or(0.0)
    }

    pub(super) fn drain_turn(&mut self) -> Result<()> {
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
    pub(super) fn call_ended(
        &mut self,
        call: &Proc,
        exit: Exit,
        n: u32,
        started: Instant,
    ) -> Result<()> {
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
}

/// Parses and checks a uclient run: exit 0, every packet echoed, none lost.
pub(super) fn check_call(call: &Proc, exit: Exit, packets: u32) -> Result<Call> {
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
pub(super) fn parse_uclient(output: &str) -> Call {
    let r = lastcall_testkit::coturn::parse_report(output);
    Call {
        sent: r.send_msgs,
        received: r.recv_msgs,
        lost: r.lost,
    }
}
