//! The lifecycle driver under tokio's paused clock: triggers come from a channel
//! (`Lifecycle::run_with`), sessions from real `SessionGuard`s, time from the test clock.
//! Every transition, every signal in every phase, a second signal, a trigger during
//! Announcing, the threshold reached during the delay, the deadline with sessions left.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use futures::channel::mpsc::{unbounded, UnboundedSender};
use lastcall::{
    EndReason, Handle, Lifecycle, OnSigterm, Outcome, PeerId, Phase, TerminationConfig, Trigger,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn peer(n: u8) -> PeerId {
    PeerId::from(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)))
}

struct Rig {
    handle: Handle,
    tx: UnboundedSender<Trigger>,
    task: JoinHandle<Outcome>,
    t0: Instant,
}

impl Rig {
    fn start(policy: OnSigterm, delay: u64, timeout: u64, min: u64) -> Rig {
        let mut cfg = TerminationConfig::new(policy, s(delay), s(timeout));
        cfg.drain_min_sessions = min;
        let lifecycle = Lifecycle::without_signals(cfg);
        let handle = lifecycle.handle();
        let (tx, rx) = unbounded();
        let task = tokio::spawn(lifecycle.run_with(rx));
        Rig {
            handle,
            tx,
            task,
            t0: Instant::now(),
        }
    }

    /// Sends a trigger and lets the lifecycle task process it (no time passes).
    async fn send(&self, trigger: Trigger) {
        self.tx.unbounded_send(trigger).unwrap();
        settle().await;
    }

    fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    fn assert_running(&self) {
        assert!(
            !self.task.is_finished(),
            "lifecycle ended early: {:?}",
            self.handle.outcome()
        );
        assert!(!self.handle.is_exiting());
    }

    async fn outcome(self) -> Outcome {
        self.task.await.unwrap()
    }
}

/// Lets every ready task run, without advancing the paused clock.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn drain_phases_readiness_and_exit_when_the_last_session_ends() {
    let rig = Rig::start(OnSigterm::Drain, 5, 30, 0);
    let h = rig.handle.clone();
    let a = h.session(peer(1));
    let b = h.session(peer(1));
    let c = h.session(peer(2));
    assert_eq!((h.sessions(), h.peers()), (3, 2));
    drop(c);
    assert_eq!((h.sessions(), h.peers()), (2, 1));
    settle().await;
    assert_eq!(h.phase(), Phase::Serving);
    assert!(h.is_accepting() && !h.is_draining());

    rig.send(Trigger::Sigterm).await;
    assert_eq!(h.phase(), Phase::Announcing);
    assert!(h.is_accepting(), "announcing still accepts new work");
    assert!(h.is_draining(), "readiness falls at the trigger");
    let status = h.status();
    assert_eq!(status.trigger, Some(Trigger::Sigterm));
    assert_eq!(status.seconds_to_deadline, Some(30.0));

    h.refusing().await;
    assert_eq!(rig.elapsed(), s(5));
    assert_eq!(h.phase(), Phase::Refusing);
    assert!(!h.is_accepting());

    tokio::time::sleep(s(3)).await;
    drop(a);
    settle().await;
    rig.assert_running();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(b);
    let elapsed_at_last_drop = rig.elapsed();
    h.exiting().await;
    assert_eq!(
        rig.elapsed(),
        elapsed_at_last_drop,
        "exit at once, no fixed sleep"
    );
    let outcome = rig.outcome().await;
    assert_eq!(outcome.reason, EndReason::Idle);
    assert_eq!(outcome.exit_code(), lastcall::exit::DRAINED);
    assert_eq!(outcome.drain_duration, Duration::from_millis(9500));
}

#[tokio::test(start_paused = true)]
async fn metrics_follow_the_lifecycle() {
    let lifecycle =
        Lifecycle::without_signals(TerminationConfig::new(OnSigterm::Drain, s(2), s(30)));
    let mut registry = prometheus_client::registry::Registry::default();
    lifecycle.register_metrics(&mut registry);
    let h = lifecycle.handle();
    let (tx, rx) = unbounded();
    let task = tokio::spawn(lifecycle.run_with(rx));
    let encode = |registry: &prometheus_client::registry::Registry| {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    };
    let g1 = h.session(peer(1));
    let g2 = h.session(peer(2));
    h.record_refused();
    let text = encode(&registry);
    for line in [
        "lastcall_drain_phase 0",
        "lastcall_sessions 2",
        "lastcall_peers 2",
        "lastcall_sessions_refused_total 1",
        "lastcall_drain_duration_seconds 0.0",
    ] {
        assert!(text.contains(line), "{line} not in {text}");
    }
    tx.unbounded_send(Trigger::Sigterm).unwrap();
    settle().await;
    assert!(encode(&registry).contains("lastcall_drain_phase 1"));
    h.refusing().await;
    assert!(encode(&registry).contains("lastcall_drain_phase 2"));
    drop(g1);
    tokio::time::sleep(Duration::from_millis(1250)).await;
    drop(g2);
    task.await.unwrap();
    let text = encode(&registry);
    for line in [
        "lastcall_sessions 0",
        "lastcall_peers 0",
        "lastcall_drain_duration_seconds 3.25",
    ] {
        assert!(text.contains(line), "{line} not in {text}");
    }
}

#[tokio::test(start_paused = true)]
async fn zero_delay_goes_straight_to_refusing() {
    let rig = Rig::start(OnSigterm::Drain, 0, 30, 0);
    let g = rig.handle.session(peer(1));
    rig.send(Trigger::Sigterm).await;
    assert_eq!(rig.handle.phase(), Phase::Refusing);
    tokio::time::sleep(s(2)).await;
    drop(g);
    let o = rig.outcome().await;
    assert_eq!((o.reason, o.drain_duration), (EndReason::Idle, s(2)));
}

#[tokio::test(start_paused = true)]
async fn threshold_reached_during_the_delay_exits_at_the_delay_end() {
    let rig = Rig::start(OnSigterm::Drain, 5, 30, 0);
    let g = rig.handle.session(peer(1));
    rig.send(Trigger::Sigterm).await;
    tokio::time::sleep(s(1)).await;
    drop(g);
    settle().await;
    rig.assert_running();
    assert_eq!(rig.handle.phase(), Phase::Announcing);
    let t0 = rig.t0;
    let o = rig.outcome().await;
    assert_eq!(t0.elapsed(), s(5));
    assert_eq!((o.reason, o.exit_code()), (EndReason::Idle, 0));
}

#[tokio::test(start_paused = true)]
async fn min_sessions_threshold() {
    let rig = Rig::start(OnSigterm::Drain, 1, 30, 1);
    let a = rig.handle.session(peer(1));
    let _b = rig.handle.session(peer(2));
    rig.send(Trigger::Sigint).await;
    tokio::time::sleep(s(4)).await;
    rig.assert_running();
    drop(a);
    let o = rig.outcome().await;
    assert_eq!(
        (o.reason, o.sessions_left, o.exit_code()),
        (EndReason::Threshold, 1, 0)
    );
    assert_eq!(o.drain_duration, s(4));
}

#[tokio::test(start_paused = true)]
async fn deadline_with_sessions_left_is_counted_from_the_trigger() {
    let rig = Rig::start(OnSigterm::Drain, 5, 12, 0);
    let _a = rig.handle.session(peer(1));
    let _b = rig.handle.session(peer(2));
    tokio::time::sleep(s(100)).await;
    rig.assert_running();
    let t_trigger = Instant::now();
    rig.send(Trigger::Sigterm).await;
    let h = rig.handle.clone();
    let o = rig.outcome().await;
    assert_eq!(t_trigger.elapsed(), s(12));
    assert_eq!(o.reason, EndReason::Deadline);
    assert_eq!((o.sessions_cut(), o.peers_left), (2, 2));
    assert_eq!(o.exit_code(), lastcall::exit::DEADLINE);
    assert_eq!(h.outcome(), Some(o));
    assert!(h.is_exiting() && !h.is_accepting());
}

#[tokio::test(start_paused = true)]
async fn second_sigterm_exits_now_in_announcing_and_refusing() {
    for wait in [s(1), s(7)] {
        let rig = Rig::start(OnSigterm::Drain, 5, 30, 0);
        let _g = rig.handle.session(peer(1));
        rig.send(Trigger::Sigterm).await;
        tokio::time::sleep(wait).await;
        let phase = rig.handle.phase();
        rig.send(Trigger::Sigterm).await;
        let o = rig.outcome().await;
        assert_eq!(
            (o.reason, o.forced_by),
            (EndReason::Forced, Some(Trigger::Sigterm)),
            "{phase}"
        );
        assert_eq!(
            (o.drain_duration, o.exit_code()),
            (wait, lastcall::exit::FORCED),
            "{phase}"
        );
    }
    // A forced exit with nothing live is a clean exit.
    let rig = Rig::start(OnSigterm::Drain, 5, 30, 0);
    rig.send(Trigger::Sigint).await;
    rig.send(Trigger::Sigterm).await;
    let o = rig.outcome().await;
    assert_eq!((o.reason, o.exit_code()), (EndReason::Forced, 0));
}

#[tokio::test(start_paused = true)]
async fn sigquit_exits_now_in_every_phase() {
    for (policy, entry, wait, phase) in [
        (OnSigterm::Drain, None, s(0), Phase::Serving),
        (
            OnSigterm::Drain,
            Some(Trigger::Sigterm),
            s(1),
            Phase::Announcing,
        ),
        (
            OnSigterm::Drain,
            Some(Trigger::Sigterm),
            s(6),
            Phase::Refusing,
        ),
        (
            OnSigterm::Linger,
            Some(Trigger::Sigterm),
            s(6),
            Phase::Lingering,
        ),
    ] {
        let rig = Rig::start(policy, 5, 30, 0);
        let _g = rig.handle.session(peer(1));
        if let Some(t) = entry {
            rig.send(t).await;
        }
        tokio::time::sleep(wait).await;
        assert_eq!(rig.handle.phase(), phase);
        rig.send(Trigger::Sigquit).await;
        let o = rig.outcome().await;
        assert_eq!(
            (o.reason, o.forced_by, o.exit_code()),
            (EndReason::Forced, Some(Trigger::Sigquit), 76),
            "{phase}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn trigger_during_announcing_keeps_the_schedule() {
    let rig = Rig::start(OnSigterm::Drain, 5, 30, 0);
    let g = rig.handle.session(peer(1));
    rig.send(Trigger::Sigusr1).await;
    tokio::time::sleep(s(2)).await;
    rig.send(Trigger::Admin).await;
    rig.send(Trigger::Api).await;
    // The kubelet's SIGTERM after a preStop POST /drain: absorbed, not an exit.
    rig.send(Trigger::Sigterm).await;
    rig.assert_running();
    assert_eq!(rig.handle.status().trigger, Some(Trigger::Sigusr1));
    rig.handle.refusing().await;
    assert_eq!(rig.elapsed(), s(5), "Refusing still at trigger + delay");
    tokio::time::sleep(s(1)).await;
    drop(g);
    let o = rig.outcome().await;
    assert_eq!(
        (o.reason, o.trigger, o.drain_duration),
        (EndReason::Idle, Some(Trigger::Sigusr1), s(6))
    );
}

#[tokio::test(start_paused = true)]
async fn ignore_policy_survives_sigterm_and_drains_on_sigusr1() {
    let rig = Rig::start(OnSigterm::Ignore, 2, 30, 0);
    let g = rig.handle.session(peer(1));
    for _ in 0..3 {
        rig.send(Trigger::Sigterm).await;
    }
    tokio::time::sleep(s(60)).await;
    rig.assert_running();
    assert_eq!(rig.handle.phase(), Phase::Serving);
    assert!(!rig.handle.is_draining());

    let t = Instant::now();
    rig.send(Trigger::Sigusr1).await;
    assert_eq!(rig.handle.phase(), Phase::Announcing);
    rig.send(Trigger::Sigterm).await; // still ignored while draining
    rig.handle.refusing().await;
    assert_eq!(t.elapsed(), s(2));
    rig.assert_running();
    drop(g);
    let o = rig.outcome().await;
    assert_eq!(
        (o.reason, o.trigger, o.exit_code()),
        (EndReason::Idle, Some(Trigger::Sigusr1), 0)
    );
}

#[tokio::test(start_paused = true)]
async fn ignore_policy_drains_on_post_drain() {
    let rig = Rig::start(OnSigterm::Ignore, 0, 30, 0);
    rig.send(Trigger::Sigterm).await;
    rig.assert_running();
    rig.handle.start_drain(Trigger::Admin);
    let o = rig.outcome().await;
    assert_eq!(
        (o.reason, o.trigger),
        (EndReason::Idle, Some(Trigger::Admin))
    );
}

#[tokio::test(start_paused = true)]
async fn linger_never_refuses_and_leaves_when_the_last_session_ends() {
    let rig = Rig::start(OnSigterm::Linger, 3, 30, 0);
    let h = rig.handle.clone();
    let a = h.session(peer(1));
    rig.send(Trigger::Sigterm).await;
    assert_eq!(h.phase(), Phase::Lingering);
    assert!(h.is_draining() && h.is_accepting());
    let refusing = tokio::spawn(h.refusing());
    // Idle during the delay: stays for the delay.
    drop(a);
    tokio::time::sleep(s(1)).await;
    rig.assert_running();
    let b = h.session(peer(1)); // the local client still connects
    tokio::time::sleep(s(10)).await;
    rig.assert_running();
    assert_eq!(h.phase(), Phase::Lingering);
    assert!(!refusing.is_finished(), "linger never refuses");
    drop(b);
    let o = rig.outcome().await;
    assert_eq!(
        (o.reason, o.drain_duration, o.exit_code()),
        (EndReason::Idle, s(11), 0)
    );
}

#[tokio::test(start_paused = true)]
async fn linger_idle_leaves_at_the_delay_and_deadline_bounds_it() {
    let rig = Rig::start(OnSigterm::Linger, 3, 30, 0);
    rig.send(Trigger::Sigterm).await;
    let t0 = rig.t0;
    let o = rig.outcome().await;
    assert_eq!((o.reason, t0.elapsed()), (EndReason::Idle, s(3)));

    let rig = Rig::start(OnSigterm::Linger, 3, 30, 0);
    let _g = rig.handle.session(peer(1));
    rig.send(Trigger::Sigterm).await;
    let t0 = rig.t0;
    let o = rig.outcome().await;
    assert_eq!(
        (o.reason, t0.elapsed(), o.exit_code()),
        (EndReason::Deadline, s(30), 75)
    );
}

#[tokio::test(start_paused = true)]
async fn exit_policy_leaves_at_once() {
    let rig = Rig::start(OnSigterm::Exit, 5, 30, 0);
    let _g = rig.handle.session(peer(1));
    rig.send(Trigger::Sigterm).await;
    let o = rig.outcome().await;
    assert_eq!(
        (o.reason, o.forced_by, o.exit_code()),
        (EndReason::Forced, Some(Trigger::Sigterm), 76)
    );
    assert_eq!(o.drain_duration, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn sighup_and_sigusr2_bump_reloads_in_every_phase() {
    let rig = Rig::start(OnSigterm::Drain, 5, 30, 0);
    let g = rig.handle.session(peer(1));
    let mut reloads = rig.handle.reloads();
    assert_eq!(*reloads.borrow_and_update(), 0);
    rig.send(Trigger::Sighup).await;
    assert!(reloads.has_changed().unwrap());
    assert_eq!(*reloads.borrow_and_update(), 1);
    assert_eq!(rig.handle.phase(), Phase::Serving);
    rig.send(Trigger::Sigterm).await;
    rig.send(Trigger::Sighup).await;
    assert_eq!(
        (*reloads.borrow_and_update(), rig.handle.phase()),
        (2, Phase::Announcing)
    );
    tokio::time::sleep(s(6)).await;
    rig.send(Trigger::Sighup).await;
    assert_eq!(
        (*reloads.borrow_and_update(), rig.handle.phase()),
        (3, Phase::Refusing)
    );
    // SIGUSR2 (coturn's certificate reload) is the same reload.
    rig.send(Trigger::Sigusr2).await;
    assert_eq!(
        (*reloads.borrow_and_update(), rig.handle.phase()),
        (4, Phase::Refusing)
    );
    assert_eq!(rig.handle.status().reloads, 4);
    drop(g);
    rig.outcome().await;
}

#[tokio::test(start_paused = true)]
async fn refused_counter_and_status() {
    let rig = Rig::start(OnSigterm::Drain, 0, 30, 0);
    let _g = rig.handle.session(peer(7));
    rig.handle.record_refused();
    rig.handle.record_refused();
    let st = rig.handle.status();
    assert_eq!(
        (st.sessions_refused_total, st.sessions, st.peers),
        (2, 1, 1)
    );
    assert_eq!(st.phase, Phase::Serving);
    assert_eq!(st.started_at, None);
    let json = serde_json::to_value(&st).unwrap();
    assert_eq!(json["phase"], "serving");
    assert_eq!(json["policy"], "drain");
    rig.send(Trigger::Sigterm).await;
    let json = serde_json::to_value(rig.handle.status()).unwrap();
    assert_eq!(json["phase"], "refusing");
    assert_eq!(json["trigger"], "SIGTERM");
    assert!(json["started_at"].as_str().unwrap().ends_with('Z'));
}
