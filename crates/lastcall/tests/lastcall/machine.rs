//! The sans-IO state machine on its own: every trigger in every phase under every policy,
//! the timers, progress lines and outcomes, with explicit instants (no clock at all).

use std::time::Duration;

use lastcall::machine::{
    Action, EndReason, Input, Machine, Outcome, Phase, Trigger, EXIT_GRACE, PROGRESS_EVERY,
};
use lastcall::{OnSigterm, TerminationConfig};
use tokio::time::Instant;

const ALL: [Trigger; 8] = [
    Trigger::Sigterm,
    Trigger::Sigint,
    Trigger::Sigquit,
    Trigger::Sigusr1,
    Trigger::Sighup,
    Trigger::Sigusr2,
    Trigger::Admin,
    Trigger::Api,
];

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn machine(policy: OnSigterm, delay: u64, timeout: u64, min: u64) -> Machine {
    let mut cfg = TerminationConfig::new(policy, s(delay), s(timeout));
    cfg.drain_min_sessions = min;
    Machine::new(&cfg)
}

fn sessions(m: &mut Machine, now: Instant, sessions: u64, peers: u64) -> Vec<Action> {
    counts(m, now, sessions, peers, 0)
}

fn counts(m: &mut Machine, now: Instant, sessions: u64, peers: u64, holds: u64) -> Vec<Action> {
    m.handle(
        now,
        Input::Sessions {
            sessions,
            peers,
            holds,
        },
    )
}

fn exit_of(actions: &[Action]) -> Option<Outcome> {
    actions.iter().find_map(|a| match a {
        Action::Exit(o) => Some(*o),
        _ => None,
    })
}

/// Nothing but progress lines.
fn quiet(actions: Vec<Action>) -> bool {
    actions.iter().all(|a| matches!(a, Action::Progress { .. }))
}

/// What one trigger did.
#[derive(Debug, PartialEq, Eq)]
enum Effect {
    /// Now in this phase, not exiting.
    To(Phase),
    /// Exit now, forced.
    Forced,
    /// Already draining, nothing changed.
    Already,
    /// Ignored (SIGTERM under `ignore`).
    Ignored,
    /// Reload, nothing else changed.
    Reload,
}

fn effect(m: &mut Machine, now: Instant, trigger: Trigger) -> Effect {
    let before = m.phase();
    let actions = m.handle(now, Input::Trigger(trigger));
    if let Some(o) = exit_of(&actions) {
        assert_eq!(o.reason, EndReason::Forced, "{trigger}: {actions:?}");
        assert_eq!(o.forced_by, Some(trigger));
        return Effect::Forced;
    }
    match actions.first() {
        Some(Action::Reload { trigger: t }) => {
            assert_eq!(*t, trigger);
            assert_eq!(actions.len(), 1, "{actions:?}");
            assert_eq!(m.phase(), before);
            Effect::Reload
        }
        Some(Action::Ignored { .. }) => {
            assert_eq!(m.phase(), before);
            Effect::Ignored
        }
        Some(Action::AlreadyDraining { .. }) => {
            assert_eq!(m.phase(), before);
            Effect::Already
        }
        Some(Action::DrainStarted { trigger: t, .. }) => {
            assert_eq!(*t, trigger);
            Effect::To(m.phase())
        }
        other => panic!("{trigger} in {before}: unexpected {other:?}"),
    }
}

/// A machine with one live session in `phase`, entered with `entry` (under `policy`).
fn in_phase(policy: OnSigterm, entry: Option<Trigger>, phase: Phase) -> (Machine, Instant) {
    let t0 = Instant::now();
    let mut m = machine(policy, 5, 30, 0);
    sessions(&mut m, t0, 1, 1);
    let mut now = t0;
    if let Some(trigger) = entry {
        m.handle(now, Input::Trigger(trigger));
    }
    if phase == Phase::Refusing {
        now += s(6);
        m.handle(now, Input::Tick);
    }
    assert_eq!(m.phase(), phase, "{policy} {entry:?}");
    assert!(!m.is_finished());
    (m, now)
}

#[test]
fn every_trigger_in_every_phase_under_every_policy() {
    use Effect::*;
    use OnSigterm::*;
    use Phase::*;
    // (policy, how the phase was entered, phase, expected effect of each trigger in ALL order:
    //  SIGTERM, SIGINT, SIGQUIT, SIGUSR1, SIGHUP, SIGUSR2, POST /drain, api)
    let table: Vec<(OnSigterm, Option<Trigger>, Phase, [Effect; 8])> = vec![
        (
            Drain,
            None,
            Serving,
            [
                To(Announcing),
                To(Announcing),
                Forced,
                To(Announcing),
                Reload,
                Reload,
                To(Announcing),
                To(Announcing),
            ],
        ),
        (
            Linger,
            None,
            Serving,
            [
                To(Lingering),
                To(Announcing),
                Forced,
                To(Announcing),
                Reload,
                Reload,
                To(Announcing),
                To(Announcing),
            ],
        ),
        (
            Ignore,
            None,
            Serving,
            [
                Ignored,
                To(Announcing),
                Forced,
                To(Announcing),
                Reload,
                Reload,
                To(Announcing),
                To(Announcing),
            ],
        ),
        (
            Exit,
            None,
            Serving,
            [
                Forced,
                To(Announcing),
                Forced,
                To(Announcing),
                Reload,
                Reload,
                To(Announcing),
                To(Announcing),
            ],
        ),
        // Entered with SIGTERM: another SIGTERM or SIGINT exits now.
        (
            Drain,
            Some(Trigger::Sigterm),
            Announcing,
            [
                Forced, Forced, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
        (
            Drain,
            Some(Trigger::Sigterm),
            Refusing,
            [
                Forced, Forced, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
        (
            Linger,
            Some(Trigger::Sigterm),
            Lingering,
            [
                Forced, Forced, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
        // Entered with SIGINT (Ctrl-C) under any policy: the same, except SIGTERM's own policy.
        (
            Drain,
            Some(Trigger::Sigint),
            Announcing,
            [
                Forced, Forced, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
        (
            Ignore,
            Some(Trigger::Sigint),
            Refusing,
            [
                Ignored, Forced, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
        (
            Exit,
            Some(Trigger::Sigint),
            Announcing,
            [
                Forced, Forced, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
        // Entered with SIGUSR1 or POST /drain: the first SIGTERM/SIGINT is absorbed (a preStop
        // hook calling POST /drain is followed by the kubelet's SIGTERM).
        (
            Drain,
            Some(Trigger::Sigusr1),
            Announcing,
            [
                Already, Already, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
        (
            Drain,
            Some(Trigger::Admin),
            Refusing,
            [
                Already, Already, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
        (
            Linger,
            Some(Trigger::Admin),
            Announcing,
            [
                Already, Already, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
        (
            Ignore,
            Some(Trigger::Sigusr1),
            Announcing,
            [
                Ignored, Already, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
        (
            Ignore,
            Some(Trigger::Api),
            Refusing,
            [
                Ignored, Already, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
        (
            Exit,
            Some(Trigger::Sigusr1),
            Refusing,
            [
                Forced, Already, Forced, Already, Reload, Reload, Already, Already,
            ],
        ),
    ];
    for (policy, entry, phase, expected) in table {
        for (trigger, want) in ALL.iter().zip(expected) {
            let (mut m, now) = in_phase(policy, entry, phase);
            let got = effect(&mut m, now, *trigger);
            assert_eq!(
                got, want,
                "--on-sigterm {policy}, {phase} entered by {entry:?}, then {trigger}"
            );
        }
    }
}

#[test]
fn second_term_or_int_after_an_absorbed_one_exits() {
    for first in [Trigger::Sigterm, Trigger::Sigint] {
        for second in [Trigger::Sigterm, Trigger::Sigint] {
            let (mut m, now) = in_phase(OnSigterm::Drain, Some(Trigger::Admin), Phase::Announcing);
            assert_eq!(effect(&mut m, now, first), Effect::Already);
            assert_eq!(
                effect(&mut m, now, second),
                Effect::Forced,
                "{first} then {second}"
            );
        }
    }
}

#[test]
fn drain_walks_the_phases_and_leaves_when_idle() {
    let t0 = Instant::now();
    let mut m = machine(OnSigterm::Drain, 4, 30, 0);
    sessions(&mut m, t0, 2, 1);
    let a = m.handle(t0, Input::Trigger(Trigger::Sigterm));
    assert!(
        matches!(a[0], Action::DrainStarted { phase: Phase::Announcing, deadline_in, .. } if deadline_in == s(30))
    );
    assert_eq!(
        a[1],
        Action::PhaseChanged {
            from: Phase::Serving,
            to: Phase::Announcing
        }
    );
    assert_eq!(m.next_wakeup(), Some(t0 + s(4)));
    assert!(m.handle(t0 + s(3), Input::Tick).is_empty());
    let a = m.handle(t0 + s(4), Input::Tick);
    assert_eq!(
        a,
        vec![Action::PhaseChanged {
            from: Phase::Announcing,
            to: Phase::Refusing
        }]
    );
    assert_eq!(m.next_wakeup(), Some(t0 + PROGRESS_EVERY), "next: progress");
    assert!(quiet(sessions(&mut m, t0 + s(6), 1, 1)));
    let a = sessions(&mut m, t0 + s(7), 0, 0);
    let o = exit_of(&a).expect("exit when the last session ends");
    assert_eq!(o.reason, EndReason::Idle);
    assert_eq!(o.exit_code(), 0);
    assert_eq!(o.drain_duration, s(7));
    assert_eq!(o.trigger, Some(Trigger::Sigterm));
    assert!(m.is_finished());
    assert_eq!(m.next_wakeup(), None);
    assert!(
        m.handle(t0 + s(8), Input::Trigger(Trigger::Sigquit))
            .is_empty(),
        "finished is final"
    );
}

#[test]
fn zero_delay_skips_announcing_and_an_idle_daemon_leaves_at_once() {
    let t0 = Instant::now();
    let mut m = machine(OnSigterm::Drain, 0, 30, 0);
    let a = m.handle(t0, Input::Trigger(Trigger::Sigterm));
    assert_eq!(
        a[1],
        Action::PhaseChanged {
            from: Phase::Serving,
            to: Phase::Refusing
        }
    );
    let o = exit_of(&a).unwrap();
    assert_eq!(
        (o.reason, o.drain_duration, o.exit_code()),
        (EndReason::Idle, Duration::ZERO, 0)
    );
}

#[test]
fn threshold_reached_during_the_delay_waits_for_the_delay_end() {
    let t0 = Instant::now();
    let mut m = machine(OnSigterm::Drain, 5, 30, 0);
    sessions(&mut m, t0, 1, 1);
    m.handle(t0, Input::Trigger(Trigger::Sigterm));
    assert!(
        sessions(&mut m, t0 + s(1), 0, 0).is_empty(),
        "no exit while announcing"
    );
    let a = m.handle(t0 + s(5), Input::Tick);
    assert_eq!(
        a[0],
        Action::PhaseChanged {
            from: Phase::Announcing,
            to: Phase::Refusing
        }
    );
    let o = exit_of(&a).unwrap();
    assert_eq!((o.reason, o.drain_duration), (EndReason::Idle, s(5)));
}

#[test]
fn min_sessions_threshold_exits_zero_with_sessions_left() {
    let t0 = Instant::now();
    let mut m = machine(OnSigterm::Drain, 0, 30, 1);
    sessions(&mut m, t0, 3, 2);
    m.handle(t0, Input::Trigger(Trigger::Sigterm));
    assert!(sessions(&mut m, t0 + s(1), 2, 2).is_empty());
    let o = exit_of(&sessions(&mut m, t0 + s(2), 1, 1)).unwrap();
    assert_eq!(o.reason, EndReason::Threshold);
    assert_eq!(
        (o.sessions_left, o.sessions_cut(), o.exit_code()),
        (1, 0, 0)
    );
    assert!(o.to_string().contains("threshold, 1 session left"), "{o}");
}

#[test]
fn deadline_counts_from_the_trigger_and_cuts_what_is_left() {
    let t0 = Instant::now();
    let mut m = machine(OnSigterm::Drain, 5, 30, 0);
    sessions(&mut m, t0, 3, 2);
    m.handle(t0, Input::Trigger(Trigger::Sigterm));
    m.handle(t0 + s(5), Input::Tick);
    assert!(exit_of(&m.handle(t0 + s(29), Input::Tick)).is_none());
    let o = exit_of(&m.handle(t0 + s(30), Input::Tick)).unwrap();
    assert_eq!(o.reason, EndReason::Deadline);
    assert_eq!((o.sessions_cut(), o.peers_left, o.exit_code()), (3, 2, 75));
    assert_eq!(o.drain_duration, s(30));
    assert!(
        o.to_string()
            .contains("deadline after 30s, 3 sessions cut from 2 peers"),
        "{o}"
    );
}

#[test]
fn forced_exit_status_depends_on_live_sessions() {
    let t0 = Instant::now();
    let mut m = machine(OnSigterm::Drain, 5, 30, 0);
    sessions(&mut m, t0, 1, 1);
    m.handle(t0, Input::Trigger(Trigger::Sigterm));
    let o = exit_of(&m.handle(t0 + s(1), Input::Trigger(Trigger::Sigterm))).unwrap();
    assert_eq!(
        (o.reason, o.exit_code(), o.sessions_cut()),
        (EndReason::Forced, 76, 1)
    );
    assert!(
        o.to_string()
            .contains("forced by SIGTERM after 1s, 1 session cut from 1 peer"),
        "{o}"
    );

    let mut m = machine(OnSigterm::Exit, 5, 30, 0);
    let o = exit_of(&m.handle(t0, Input::Trigger(Trigger::Sigterm))).unwrap();
    assert_eq!(
        (o.reason, o.exit_code(), o.trigger),
        (EndReason::Forced, 0, None)
    );
}

#[test]
fn linger_refuses_nothing_and_leaves_after_the_delay_when_idle() {
    let t0 = Instant::now();
    let mut m = machine(OnSigterm::Linger, 4, 30, 0);
    sessions(&mut m, t0, 1, 1);
    let a = m.handle(t0, Input::Trigger(Trigger::Sigterm));
    assert!(matches!(
        a[0],
        Action::DrainStarted {
            phase: Phase::Lingering,
            ..
        }
    ));
    // Idle before the delay: stay (the local client may still be draining towards us).
    assert!(sessions(&mut m, t0 + s(1), 0, 0).is_empty());
    assert!(
        sessions(&mut m, t0 + s(2), 2, 1).is_empty(),
        "new sessions welcome"
    );
    assert!(
        m.handle(t0 + s(4), Input::Tick).is_empty(),
        "still 2 sessions"
    );
    assert_eq!(m.phase(), Phase::Lingering, "never refusing");
    assert!(quiet(sessions(&mut m, t0 + s(8), 1, 1)));
    let o = exit_of(&sessions(&mut m, t0 + s(9), 0, 0)).unwrap();
    assert_eq!(
        (o.reason, o.drain_duration, o.exit_code()),
        (EndReason::Idle, s(9), 0)
    );

    // Idle all along: leaves exactly at the delay end.
    let mut m = machine(OnSigterm::Linger, 5, 30, 0);
    m.handle(t0, Input::Trigger(Trigger::Sigterm));
    assert_eq!(m.next_wakeup(), Some(t0 + s(5)));
    let o = exit_of(&m.handle(t0 + s(5), Input::Tick)).unwrap();
    assert_eq!(o.drain_duration, s(5));

    // Deadline while lingering.
    let mut m = machine(OnSigterm::Linger, 5, 30, 0);
    sessions(&mut m, t0, 1, 1);
    m.handle(t0, Input::Trigger(Trigger::Sigterm));
    let o = exit_of(&m.handle(t0 + s(30), Input::Tick)).unwrap();
    assert_eq!((o.reason, o.exit_code()), (EndReason::Deadline, 75));
}

#[test]
fn progress_every_few_seconds_while_draining() {
    let t0 = Instant::now();
    let mut m = machine(OnSigterm::Drain, 5, 30, 0);
    sessions(&mut m, t0, 3, 1);
    m.handle(t0, Input::Trigger(Trigger::Sigterm));
    let mut lines = Vec::new();
    let mut now = t0;
    while let Some(wake) = m.next_wakeup() {
        now = wake;
        for a in m.handle(now, Input::Tick) {
            if let Action::Progress { .. } = a {
                lines.push((now - t0, a.to_string()));
            }
        }
    }
    assert_eq!(now - t0, s(30));
    let every = PROGRESS_EVERY.as_secs();
    let expected: Vec<_> = (1..30 / every)
        .map(|i| {
            (
                s(i * every),
                format!(
                    "draining: 3 sessions left from 1 peer, {} s to deadline",
                    30 - i * every
                ),
            )
        })
        .collect();
    assert_eq!(lines, expected);
}

/// A hold (a load balancer yet to mark the daemon down) keeps a refusing drain from ending,
/// whatever the sessions and `--drain-min-sessions` say; it is present before refusing
/// starts, so the step that enters Refusing already sees it. It does not hold a lingering
/// daemon, and the deadline ends it without counting it as cut.
#[test]
fn holds_keep_a_refusing_drain_until_released() {
    let t0 = Instant::now();
    for (delay, min, live) in [(5, 0, 0), (0, 0, 0), (5, 2, 1)] {
        let mut m = machine(OnSigterm::Drain, delay, 30, min);
        counts(&mut m, t0, live, live, 1);
        let a = m.handle(t0, Input::Trigger(Trigger::Sigterm));
        assert!(exit_of(&a).is_none(), "{a:?}");
        let a = m.handle(t0 + s(delay), Input::Tick);
        assert!(exit_of(&a).is_none(), "{a:?}");
        assert_eq!(m.phase(), Phase::Refusing);
        let progress = m.handle(t0 + s(10), Input::Tick);
        assert_eq!(
            progress.iter().map(ToString::to_string).collect::<Vec<_>>(),
            vec![format!(
                "draining: {} left from {}, 1 load balancer to mark it down, 20 s to deadline",
                if live == 1 { "1 session" } else { "0 sessions" },
                if live == 1 { "1 peer" } else { "0 peers" },
            )],
            "delay {delay}, min {min}"
        );
        let o = exit_of(&counts(&mut m, t0 + s(12), live, live, 0)).expect("released");
        let reason = if live == 0 {
            EndReason::Idle
        } else {
            EndReason::Threshold
        };
        assert_eq!(
            (o.reason, o.drain_duration, o.exit_code()),
            (reason, s(12), 0)
        );
    }

    // The deadline: nothing cut.
    let mut m = machine(OnSigterm::Drain, 5, 30, 0);
    counts(&mut m, t0, 0, 0, 2);
    m.handle(t0, Input::Trigger(Trigger::Sigterm));
    let o = exit_of(&m.handle(t0 + s(30), Input::Tick)).unwrap();
    assert_eq!(
        (o.reason, o.exit_code(), o.sessions_cut()),
        (EndReason::Deadline, 0, 0)
    );

    // Lingering: holds do not count.
    let mut m = machine(OnSigterm::Linger, 5, 30, 0);
    counts(&mut m, t0, 0, 0, 1);
    m.handle(t0, Input::Trigger(Trigger::Sigterm));
    let o = exit_of(&m.handle(t0 + s(5), Input::Tick)).unwrap();
    assert_eq!((o.reason, o.drain_duration), (EndReason::Idle, s(5)));
}

#[test]
fn sighup_and_sigusr2_reload_in_every_phase_without_changing_it() {
    for trigger in [Trigger::Sighup, Trigger::Sigusr2] {
        for (policy, entry, phase) in [
            (OnSigterm::Drain, None, Phase::Serving),
            (OnSigterm::Drain, Some(Trigger::Sigterm), Phase::Announcing),
            (OnSigterm::Drain, Some(Trigger::Sigterm), Phase::Refusing),
            (OnSigterm::Linger, Some(Trigger::Sigterm), Phase::Lingering),
        ] {
            let (mut m, now) = in_phase(policy, entry, phase);
            let actions = m.handle(now, Input::Trigger(trigger));
            assert_eq!(actions, vec![Action::Reload { trigger }]);
            assert_eq!(
                actions[0].to_string(),
                format!("{trigger} received: reloading")
            );
            assert_eq!(m.phase(), phase);
        }
    }
}

#[test]
fn log_lines_say_what_happened() {
    let t0 = Instant::now();
    let mut m = machine(OnSigterm::Drain, 5, 30, 0);
    let a = m.handle(t0, Input::Trigger(Trigger::Sigterm));
    let line = a[0].to_string();
    assert!(
        line.contains("SIGTERM received (--on-sigterm drain)"),
        "{line}"
    );
    assert!(line.contains("deadline in 30s"), "{line}");
    assert_eq!(a[1].to_string(), "phase serving -> announcing");
    let mut m = machine(OnSigterm::Ignore, 5, 30, 0);
    let a = m.handle(t0, Input::Trigger(Trigger::Sigterm));
    assert!(
        a[0].to_string().contains("ignored (--on-sigterm ignore)"),
        "{}",
        a[0]
    );
}

/// A machine in Starting with `live` sessions (under `policy`, delay 5 s, timeout 30 s).
fn starting(policy: OnSigterm, live: u64) -> (Machine, Instant) {
    let t0 = Instant::now();
    let mut cfg = TerminationConfig::new(policy, s(5), s(30));
    cfg.drain_min_sessions = 0;
    let mut m = Machine::starting(&cfg);
    sessions(&mut m, t0, live, live);
    assert_eq!(m.phase(), Phase::Starting);
    (m, t0)
}

#[test]
fn every_trigger_while_starting_under_every_policy() {
    use Effect::*;
    use OnSigterm::*;
    use Phase::*;
    // A drain trigger while starting skips the shutdown delay: readiness never rose, so
    // there is nothing to announce. (SIGTERM, SIGINT, SIGQUIT, SIGUSR1, SIGHUP, SIGUSR2, POST /drain,
    // api), with one live session so that nothing exits at once.
    let table: [(OnSigterm, [Effect; 8]); 4] = [
        (
            Drain,
            [
                To(Refusing),
                To(Refusing),
                Forced,
                To(Refusing),
                Reload,
                Reload,
                To(Refusing),
                To(Refusing),
            ],
        ),
        (
            Linger,
            [
                To(Lingering),
                To(Refusing),
                Forced,
                To(Refusing),
                Reload,
                Reload,
                To(Refusing),
                To(Refusing),
            ],
        ),
        (
            Ignore,
            [
                Ignored,
                To(Refusing),
                Forced,
                To(Refusing),
                Reload,
                Reload,
                To(Refusing),
                To(Refusing),
            ],
        ),
        (
            Exit,
            [
                Forced,
                To(Refusing),
                Forced,
                To(Refusing),
                Reload,
                Reload,
                To(Refusing),
                To(Refusing),
            ],
        ),
    ];
    for (policy, expected) in table {
        for (trigger, want) in ALL.iter().zip(expected) {
            let (mut m, t0) = starting(policy, 1);
            let got = effect(&mut m, t0, *trigger);
            assert_eq!(got, want, "--on-sigterm {policy}, starting, then {trigger}");
        }
    }
}

#[test]
fn a_drain_trigger_while_starting_with_nothing_live_exits_at_once() {
    for policy in [OnSigterm::Drain, OnSigterm::Linger] {
        for trigger in [
            Trigger::Sigterm,
            Trigger::Sigint,
            Trigger::Sigusr1,
            Trigger::Admin,
        ] {
            let (mut m, t0) = starting(policy, 0);
            let a = m.handle(t0, Input::Trigger(trigger));
            let Some(Action::DrainStarted {
                from,
                shutdown_delay,
                ..
            }) = a.first()
            else {
                panic!("{policy} {trigger}: {a:?}");
            };
            assert_eq!((*from, *shutdown_delay), (Phase::Starting, Duration::ZERO));
            assert!(
                a[0].to_string()
                    .contains(&format!("{trigger} received while starting")),
                "{}",
                a[0]
            );
            let o = exit_of(&a).unwrap_or_else(|| panic!("{policy} {trigger}: {a:?}"));
            assert_eq!(
                (o.reason, o.exit_code(), o.drain_duration),
                (EndReason::Idle, 0, Duration::ZERO),
                "{policy} {trigger}"
            );
        }
    }
}

#[test]
fn a_drain_started_while_starting_counts_its_deadline_and_a_second_sigterm_forces() {
    let (mut m, t0) = starting(OnSigterm::Drain, 2);
    m.handle(t0, Input::Trigger(Trigger::Sigterm));
    assert_eq!(m.phase(), Phase::Refusing);
    assert_eq!(m.deadline(), Some(t0 + s(30)));
    assert!(
        m.handle(t0 + s(1), Input::Ready).is_empty(),
        "ready changes nothing"
    );
    assert_eq!(m.phase(), Phase::Refusing);
    assert_eq!(effect(&mut m, t0 + s(2), Trigger::Sigterm), Effect::Forced);

    let (mut m, t0) = starting(OnSigterm::Drain, 2);
    m.handle(t0, Input::Trigger(Trigger::Sigterm));
    let o = exit_of(&m.handle(t0 + s(30), Input::Tick)).unwrap();
    assert_eq!((o.reason, o.exit_code()), (EndReason::Deadline, 75));
}

#[test]
fn ready_ends_starting_and_nothing_else() {
    let (mut m, t0) = starting(OnSigterm::Drain, 0);
    assert_eq!(m.next_wakeup(), None, "starting has no timer");
    assert_eq!(
        m.handle(t0 + s(3600), Input::Ready),
        vec![Action::PhaseChanged {
            from: Phase::Starting,
            to: Phase::Serving
        }]
    );
    assert_eq!(
        m.handle(t0 + s(3601), Input::Ready),
        vec![],
        "a second ready"
    );
    // Then the usual drain, with its delay.
    let a = m.handle(t0 + s(3602), Input::Trigger(Trigger::Sigterm));
    assert!(
        matches!(
            a[0],
            Action::DrainStarted {
                from: Phase::Serving,
                phase: Phase::Announcing,
                ..
            }
        ),
        "{a:?}"
    );
    // Ready in every other phase changes nothing.
    for (policy, entry, phase) in [
        (OnSigterm::Drain, None, Phase::Serving),
        (OnSigterm::Drain, Some(Trigger::Sigterm), Phase::Announcing),
        (OnSigterm::Drain, Some(Trigger::Sigterm), Phase::Refusing),
        (OnSigterm::Linger, Some(Trigger::Sigterm), Phase::Lingering),
    ] {
        let (mut m, now) = in_phase(policy, entry, phase);
        assert!(quiet(m.handle(now, Input::Ready)), "{phase}");
        assert_eq!(m.phase(), phase);
    }
    // And after the exit decision, nothing at all.
    let (mut m, t0) = starting(OnSigterm::Drain, 0);
    m.handle(t0, Input::Trigger(Trigger::Sigquit));
    assert!(m.is_finished());
    assert!(m.handle(t0, Input::Ready).is_empty());
    assert_eq!(m.phase(), Phase::Starting);
}

#[test]
fn starting_is_a_phase_of_its_own() {
    assert_eq!(Phase::Starting.as_str(), "starting");
    assert_eq!(Phase::Starting.metric_value(), 4);
    assert_eq!(
        Machine::new(&TerminationConfig::new(OnSigterm::Drain, s(1), s(2))).phase(),
        Phase::Serving
    );
}

/// When the process must be gone, by how the exit was decided: what is left of the deadline
/// plus `EXIT_GRACE` after a drain, `EXIT_GRACE` after a forced exit.
#[test]
fn leave_by_is_inside_the_deadline_plus_the_grace() {
    let t0 = Instant::now();
    // (how, decided at, leave by), drain timeout 30 s from t0, delay 5 s.
    type Case = (&'static str, fn(&mut Machine, Instant) -> Instant);
    let cases: [Case; 7] = [
        ("idle at 7 s", |m, t0| {
            sessions(m, t0, 1, 1);
            m.handle(t0, Input::Trigger(Trigger::Sigterm));
            m.handle(t0 + s(5), Input::Tick);
            sessions(m, t0 + s(7), 0, 0);
            t0 + s(30) + EXIT_GRACE
        }),
        ("threshold at 6 s", |m, t0| {
            sessions(m, t0, 1, 1);
            m.handle(t0, Input::Trigger(Trigger::Sigusr1));
            m.handle(t0 + s(6), Input::Tick);
            t0 + s(30) + EXIT_GRACE
        }),
        ("deadline", |m, t0| {
            sessions(m, t0, 2, 1);
            m.handle(t0, Input::Trigger(Trigger::Sigterm));
            m.handle(t0 + s(30), Input::Tick);
            t0 + s(30) + EXIT_GRACE
        }),
        ("deadline noticed late", |m, t0| {
            sessions(m, t0, 2, 1);
            m.handle(t0, Input::Trigger(Trigger::Sigterm));
            m.handle(t0 + s(33), Input::Tick);
            t0 + s(33) + EXIT_GRACE
        }),
        ("second SIGTERM at 2 s", |m, t0| {
            sessions(m, t0, 2, 1);
            m.handle(t0, Input::Trigger(Trigger::Sigterm));
            m.handle(t0 + s(2), Input::Trigger(Trigger::Sigterm));
            t0 + s(2) + EXIT_GRACE
        }),
        ("SIGQUIT while serving", |m, t0| {
            sessions(m, t0, 2, 1);
            m.handle(t0 + s(4), Input::Trigger(Trigger::Sigquit));
            t0 + s(4) + EXIT_GRACE
        }),
        ("--on-sigterm exit", |m, t0| {
            m.handle(t0 + s(1), Input::Trigger(Trigger::Sigterm));
            t0 + s(1) + EXIT_GRACE
        }),
    ];
    for (how, run) in cases {
        let policy = if how.contains("exit") {
            OnSigterm::Exit
        } else {
            OnSigterm::Drain
        };
        let mut m = machine(policy, 5, 30, if how.contains("threshold") { 1 } else { 0 });
        assert_eq!(m.leave_by(), None, "{how}: not decided yet");
        let want = run(&mut m, t0);
        assert!(m.is_finished(), "{how}");
        assert_eq!(m.leave_by(), Some(want), "{how}");
    }
}

/// `sigusr1_refuses_at_once` (turn: coturn's SIGUSR1): SIGUSR1 goes straight to Refusing,
/// skipping `--shutdown-delay`, under every policy; SIGTERM and `POST /drain` still announce,
/// and without the setting SIGUSR1 announces too.
#[test]
fn sigusr1_refuses_at_once_when_the_daemon_says_so() {
    for policy in [
        OnSigterm::Drain,
        OnSigterm::Linger,
        OnSigterm::Ignore,
        OnSigterm::Exit,
    ] {
        for (at_once, trigger, want) in [
            (true, Trigger::Sigusr1, Phase::Refusing),
            (false, Trigger::Sigusr1, Phase::Announcing),
            (true, Trigger::Admin, Phase::Announcing),
        ] {
            let mut cfg = TerminationConfig::new(policy, s(5), s(30));
            cfg.sigusr1_refuses_at_once = at_once;
            let mut m = Machine::new(&cfg);
            let t0 = Instant::now();
            sessions(&mut m, t0, 1, 1);
            let a = m.handle(t0, Input::Trigger(trigger));
            assert_eq!(
                m.phase(),
                want,
                "{policy} {trigger} at_once={at_once}: {a:?}"
            );
            assert_eq!(m.deadline(), Some(t0 + s(30)), "{policy} {trigger}");
        }
    }
}
