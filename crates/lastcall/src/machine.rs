//! The termination state machine, sans-IO: `now` and an [`Input`] go in, [`Action`]s come
//! out. No clock, no signals, no sockets: [`crate::Lifecycle`] drives it from a tokio task,
//! and tests drive it directly or under tokio's paused clock.
//!
//! ```text
//!  Starting ──ready──▶ Serving ──trigger──▶ Announcing ──shutdown-delay──▶ Refusing ──idle/threshold/deadline──▶ exit
//!  Serving ──SIGTERM (linger)──▶ Lingering ──(after the delay) idle/threshold, or deadline──▶ exit
//!  Starting ──trigger──▶ Refusing (or Lingering), the delay skipped: nobody was told it was ready
//! ```
//!
//! The machine also decides how long the process may take to leave once the exit is decided
//! ([`Machine::leave_by`]): what is left of `--drain-timeout` plus [`EXIT_GRACE`], or just
//! [`EXIT_GRACE`] for a forced exit.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{OnSigterm, TerminationConfig};
use crate::exit;

// The lifecycle phase; in `lastcall-phase`, which the sans-IO protocol cores use without
// tokio.
pub use lastcall_phase::Phase;

/// How often a progress line is logged while draining.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// The time a daemon's tasks get after the exit decision beyond `--drain-timeout` (and all
/// they get after a forced exit): enough for every connection task to write its goodbye and
/// close, never enough to keep a pod past a grace period chosen a little longer than the
/// timeout.
pub const EXIT_GRACE: Duration = Duration::from_secs(1);

/// An input of the signal map: a signal, the admin endpoint, or a programmatic request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// SIGTERM: per `--on-sigterm`; a second one while draining exits now.
    Sigterm,
    /// SIGINT: drain (whatever `--on-sigterm` says); a second one while draining exits now.
    Sigint,
    /// SIGQUIT: exit now.
    Sigquit,
    /// SIGUSR1: drain, whatever `--on-sigterm` says.
    Sigusr1,
    /// SIGHUP: reload (bumps [`crate::Handle::reloads`]); no phase change.
    Sighup,
    /// SIGUSR2: the same reload as SIGHUP (coturn reloads its TLS certificates on SIGUSR2;
    /// certbot deploy hooks and reloader sidecars send it); no phase change.
    Sigusr2,
    /// `POST /drain` on the admin listener: drain.
    Admin,
    /// A drain asked for by the daemon's own code ([`crate::Handle::start_drain`]).
    Api,
}

impl Trigger {
    /// Name as in logs and `GET /drain`: `SIGTERM`, ..., `POST /drain`, `api`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Sigterm => "SIGTERM",
            Trigger::Sigint => "SIGINT",
            Trigger::Sigquit => "SIGQUIT",
            Trigger::Sigusr1 => "SIGUSR1",
            Trigger::Sighup => "SIGHUP",
            Trigger::Sigusr2 => "SIGUSR2",
            Trigger::Admin => "POST /drain",
            Trigger::Api => "api",
        }
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Trigger {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// What the state machine is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// A signal, `POST /drain` or a programmatic trigger.
    Trigger(Trigger),
    /// The live session, distinct peer and hold counts changed.
    Sessions {
        /// Live sessions.
        sessions: u64,
        /// Distinct peers among them.
        peers: u64,
        /// Holds: things outside the daemon that may still send it work (a load balancer
        /// that has not yet marked it down). While refusing, the drain ends only when none
        /// is left, whatever `--drain-min-sessions` says; they do not hold a lingering
        /// daemon, and the deadline ends them like sessions.
        holds: u64,
    },
    /// The daemon is ready for work (its ports are bound): Starting ends, readiness rises.
    /// Ignored in every other phase.
    Ready,
    /// Time passed (a wake-up asked for by [`Machine::next_wakeup`]).
    Tick,
}

/// How the lifecycle ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EndReason {
    /// No session left.
    Idle,
    /// Sessions at or below `--drain-min-sessions` (but not zero).
    Threshold,
    /// `--drain-timeout` ran out.
    Deadline,
    /// Exit now: second SIGTERM/SIGINT, SIGQUIT, or `--on-sigterm exit`.
    Forced,
}

/// The end of the lifecycle, returned by [`crate::Lifecycle::run_with`] and [`crate::Daemon::serve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    /// Why it ended.
    pub reason: EndReason,
    /// What started the drain, if one was started.
    pub trigger: Option<Trigger>,
    /// What forced the exit, for [`EndReason::Forced`].
    pub forced_by: Option<Trigger>,
    /// Sessions still live at the end (cut, for a deadline or a forced exit).
    pub sessions_left: u64,
    /// Distinct peers among them.
    pub peers_left: u64,
    /// Time from the trigger to the end (zero without a drain).
    pub drain_duration: Duration,
}

impl Outcome {
    /// The process exit status: [`exit::DRAINED`] (0), [`exit::DEADLINE`] (75) when the
    /// deadline cut sessions, [`exit::FORCED`] (76) when a forced exit cut sessions.
    pub fn exit_code(&self) -> i32 {
        match self.reason {
            EndReason::Idle | EndReason::Threshold => exit::DRAINED,
            EndReason::Deadline if self.sessions_left > 0 => exit::DEADLINE,
            EndReason::Forced if self.sessions_left > 0 => exit::FORCED,
            EndReason::Deadline | EndReason::Forced => exit::DRAINED,
        }
    }

    /// Sessions cut by the exit (zero for idle and threshold endings).
    pub fn sessions_cut(&self) -> u64 {
        match self.reason {
            EndReason::Idle | EndReason::Threshold => 0,
            EndReason::Deadline | EndReason::Forced => self.sessions_left,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let took = secs(self.drain_duration);
        let code = self.exit_code();
        match self.reason {
            EndReason::Idle => write!(f, "drain ended: idle, no session left after {took}"),
            EndReason::Threshold => write!(
                f,
                "drain ended: threshold, {} left (at or below --drain-min-sessions) after {took}",
                count(self.sessions_left, "session")
            ),
            EndReason::Deadline => write!(
                f,
                "drain ended: deadline after {took}, {} cut from {}",
                count(self.sessions_left, "session"),
                count(self.peers_left, "peer")
            ),
            EndReason::Forced => write!(
                f,
                "drain ended: forced by {} after {took}, {} cut from {}",
                self.forced_by.map_or("?", Trigger::as_str),
                count(self.sessions_left, "session"),
                count(self.peers_left, "peer")
            ),
        }?;
        write!(f, "; exit status {code}")
    }
}

/// What the driver must do (log, publish, exit) after an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A drain started.
    DrainStarted {
        /// What started it.
        trigger: Trigger,
        /// The phase it started from (Serving, or Starting when the delay is skipped).
        from: Phase,
        /// The phase it starts in.
        phase: Phase,
        /// `--on-sigterm`.
        policy: OnSigterm,
        /// Length of Announcing (or the minimum linger).
        shutdown_delay: Duration,
        /// Time from now to the deadline.
        deadline_in: Duration,
    },
    /// A drain trigger arrived while already draining; nothing changes.
    AlreadyDraining {
        /// The trigger.
        trigger: Trigger,
        /// The current phase.
        phase: Phase,
    },
    /// SIGTERM under `--on-sigterm ignore`.
    Ignored {
        /// The trigger.
        trigger: Trigger,
    },
    /// SIGHUP or SIGUSR2: reload.
    Reload {
        /// The signal.
        trigger: Trigger,
    },
    /// The phase changed.
    PhaseChanged {
        /// Old phase.
        from: Phase,
        /// New phase.
        to: Phase,
    },
    /// A progress report while draining.
    Progress {
        /// Current phase.
        phase: Phase,
        /// Live sessions.
        sessions: u64,
        /// Distinct peers.
        peers: u64,
        /// Holds the drain waits for besides sessions ([`Input::Sessions`]).
        holds: u64,
        /// Time left to the deadline.
        to_deadline: Duration,
    },
    /// Time to exit.
    Exit(Outcome),
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::DrainStarted {
                trigger,
                from,
                phase,
                policy,
                shutdown_delay,
                deadline_in,
            } => {
                let plan = match phase {
                    Phase::Lingering => format!(
                        "lingering: serving everything, leaving when sessions are at or below the threshold, after at least {}",
                        secs(*shutdown_delay)
                    ),
                    Phase::Announcing => format!(
                        "draining: announcing (readiness 503) for {}, then refusing new work",
                        secs(*shutdown_delay)
                    ),
                    _ => "draining: refusing new work now".to_string(),
                };
                let when = if *from == Phase::Starting {
                    " while starting"
                } else {
                    ""
                };
                write!(
                    f,
                    "{trigger} received{when} (--on-sigterm {policy}): {plan}; deadline in {}",
                    secs(*deadline_in)
                )
            }
            Action::AlreadyDraining { trigger, phase } => write!(
                f,
                "{trigger} received while {phase}: already draining (another SIGTERM or SIGINT exits now)"
            ),
            Action::Ignored { trigger } => write!(
                f,
                "{trigger} received and ignored (--on-sigterm ignore); SIGUSR1, SIGINT, SIGQUIT or POST /drain end the process"
            ),
            Action::Reload { trigger } => write!(f, "{trigger} received: reloading"),
            Action::PhaseChanged { from, to } => write!(f, "phase {from} -> {to}"),
            Action::Progress {
                phase,
                sessions,
                peers,
                holds,
                to_deadline,
            } => {
                write!(
                    f,
                    "{}: {} left from {}, ",
                    if *phase == Phase::Lingering { "lingering" } else { "draining" },
                    count(*sessions, "session"),
                    count(*peers, "peer"),
                )?;
                if *holds > 0 {
                    write!(f, "{} to mark it down, ", count(*holds, "load balancer"))?;
                }
                write!(f, "{} s to deadline", (to_deadline.as_millis() + 500) / 1000)
            }
            Action::Exit(outcome) => outcome.fmt(f),
        }
    }
}

/// `1 session`, `3 sessions`.
pub(crate) fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `1.5s`, `30s`.
fn secs(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// An ongoing drain.
#[derive(Debug, Clone)]
struct Drain {
    trigger: Trigger,
    started: Instant,
    delay_end: Instant,
    delay_passed: bool,
    deadline: Instant,
    next_progress: Instant,
    /// A SIGTERM or SIGINT was already taken into account: the next one exits now.
    term_seen: bool,
}

/// The exit decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Exit {
    /// By when the process must be gone.
    leave_by: Instant,
}

/// The termination state machine.
#[derive(Debug, Clone)]
pub struct Machine {
    on_sigterm: OnSigterm,
    shutdown_delay: Duration,
    drain_timeout: Duration,
    min_sessions: u64,
    sigusr1_refuses_at_once: bool,
    phase: Phase,
    drain: Option<Drain>,
    sessions: u64,
    peers: u64,
    holds: u64,
    exit: Option<Exit>,
}

impl Machine {
    /// A machine in [`Phase::Serving`] with no session (a daemon that is ready from the start).
    pub fn new(config: &TerminationConfig) -> Self {
        Machine {
            on_sigterm: config.on_sigterm,
            shutdown_delay: config.shutdown_delay,
            drain_timeout: config.drain_timeout,
            min_sessions: config.drain_min_sessions,
            sigusr1_refuses_at_once: config.sigusr1_refuses_at_once,
            phase: Phase::Serving,
            drain: None,
            sessions: 0,
            peers: 0,
            holds: 0,
            exit: None,
        }
    }

    /// A machine in [`Phase::Starting`]: readiness stays down until [`Input::Ready`].
    pub fn starting(config: &TerminationConfig) -> Self {
        Machine {
            phase: Phase::Starting,
            ..Machine::new(config)
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether [`Action::Exit`] was returned; later inputs are ignored.
    pub fn is_finished(&self) -> bool {
        self.exit.is_some()
    }

    /// Once the exit is decided: the instant by which the process must be gone, its tasks
    /// finished or abandoned. After a drain (idle, threshold, deadline) that is the drain's
    /// deadline, or the decision if later, plus [`EXIT_GRACE`]; after a forced exit, or an
    /// exit without a drain, the decision plus [`EXIT_GRACE`].
    pub fn leave_by(&self) -> Option<Instant> {
        self.exit.map(|e| e.leave_by)
    }

    /// When the drain started and what started it.
    pub fn drain_started(&self) -> Option<(Trigger, Instant)> {
        self.drain.as_ref().map(|d| (d.trigger, d.started))
    }

    /// The deadline of the ongoing drain.
    pub fn deadline(&self) -> Option<Instant> {
        self.drain.as_ref().map(|d| d.deadline)
    }

    /// Feeds one input at time `now` (never earlier than a previous `now`).
    pub fn handle(&mut self, now: Instant, input: Input) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.is_finished() {
            return actions;
        }
        match input {
            Input::Trigger(trigger) => self.on_trigger(now, trigger, &mut actions),
            Input::Sessions {
                sessions,
                peers,
                holds,
            } => {
                self.sessions = sessions;
                self.peers = peers;
                self.holds = holds;
            }
            Input::Ready => {
                if self.phase == Phase::Starting {
                    self.set_phase(Phase::Serving, &mut actions);
                }
            }
            Input::Tick => {}
        }
        if !self.is_finished() {
            self.advance(now, &mut actions);
        }
        actions
    }

    /// When the machine wants a [`Input::Tick`] (end of the delay, progress, deadline).
    pub fn next_wakeup(&self) -> Option<Instant> {
        if self.is_finished() {
            return None;
        }
        let drain = self.drain.as_ref()?;
        let mut wake = drain.deadline.min(drain.next_progress);
        if !drain.delay_passed {
            wake = wake.min(drain.delay_end);
        }
        Some(wake)
    }

    fn on_trigger(&mut self, now: Instant, trigger: Trigger, actions: &mut Vec<Action>) {
        match trigger {
            Trigger::Sighup | Trigger::Sigusr2 => actions.push(Action::Reload { trigger }),
            Trigger::Sigquit => self.force(now, trigger, actions),
            Trigger::Sigterm => match self.on_sigterm {
                OnSigterm::Ignore => actions.push(Action::Ignored { trigger }),
                OnSigterm::Exit => self.force(now, trigger, actions),
                OnSigterm::Drain => self.term_or_int(now, trigger, false, actions),
                OnSigterm::Linger => self.term_or_int(now, trigger, true, actions),
            },
            Trigger::Sigint => self.term_or_int(now, trigger, false, actions),
            Trigger::Sigusr1 | Trigger::Admin | Trigger::Api => match &self.drain {
                Some(_) => actions.push(Action::AlreadyDraining {
                    trigger,
                    phase: self.phase,
                }),
                None => self.start(now, trigger, false, actions),
            },
        }
    }

    /// SIGTERM (drain/linger) or SIGINT: start a drain, or exit now if one was already seen.
    fn term_or_int(&mut self, now: Instant, trigger: Trigger, linger: bool, out: &mut Vec<Action>) {
        match &mut self.drain {
            Some(drain) if drain.term_seen => self.force(now, trigger, out),
            Some(drain) => {
                drain.term_seen = true;
                out.push(Action::AlreadyDraining {
                    trigger,
                    phase: self.phase,
                });
            }
            None => {
                self.start(now, trigger, linger, out);
                if let Some(drain) = &mut self.drain {
                    drain.term_seen = true;
                }
            }
        }
    }

    fn start(&mut self, now: Instant, trigger: Trigger, linger: bool, out: &mut Vec<Action>) {
        // While starting, readiness never rose: there is nothing to announce. A daemon whose
        // SIGUSR1 means "refuse now" (coturn's) skips the announce too.
        let refuse_now = trigger == Trigger::Sigusr1 && self.sigusr1_refuses_at_once;
        let delay = if self.phase == Phase::Starting || refuse_now {
            Duration::ZERO
        } else {
            self.shutdown_delay
        };
        let phase = if linger {
            Phase::Lingering
        } else if delay.is_zero() {
            Phase::Refusing
        } else {
            Phase::Announcing
        };
        self.drain = Some(Drain {
            trigger,
            started: now,
            delay_end: now + delay,
            delay_passed: delay.is_zero(),
            deadline: now + self.drain_timeout,
            next_progress: now + PROGRESS_EVERY,
            term_seen: false,
        });
        out.push(Action::DrainStarted {
            trigger,
            from: self.phase,
            phase,
            policy: self.on_sigterm,
            shutdown_delay: delay,
            deadline_in: self.drain_timeout,
        });
        self.set_phase(phase, out);
    }

    fn set_phase(&mut self, to: Phase, out: &mut Vec<Action>) {
        if self.phase != to {
            out.push(Action::PhaseChanged {
                from: self.phase,
                to,
            });
            self.phase = to;
        }
    }

    fn advance(&mut self, now: Instant, out: &mut Vec<Action>) {
        let Some(drain) = &mut self.drain else {
            return;
        };
        if !drain.delay_passed && now >= drain.delay_end {
            drain.delay_passed = true;
        }
        let (delay_passed, deadline) = (drain.delay_passed, drain.deadline);
        if self.phase == Phase::Announcing && delay_passed {
            self.set_phase(Phase::Refusing, out);
        }
        let may_leave = match self.phase {
            Phase::Refusing => self.holds == 0,
            Phase::Lingering => delay_passed,
            Phase::Starting | Phase::Serving | Phase::Announcing => false,
        };
        if may_leave && self.sessions <= self.min_sessions {
            let reason = if self.sessions == 0 {
                EndReason::Idle
            } else {
                EndReason::Threshold
            };
            self.finish(now, reason, None, out);
        } else if now >= deadline {
            self.finish(now, EndReason::Deadline, None, out);
        } else if let Some(drain) = &mut self.drain {
            if now >= drain.next_progress {
                while drain.next_progress <= now {
                    drain.next_progress += PROGRESS_EVERY;
                }
                out.push(Action::Progress {
                    phase: self.phase,
                    sessions: self.sessions,
                    peers: self.peers,
                    holds: if self.phase == Phase::Refusing {
                        self.holds
                    } else {
                        0
                    },
                    to_deadline: deadline.saturating_duration_since(now),
                });
            }
        }
    }

    fn force(&mut self, now: Instant, by: Trigger, out: &mut Vec<Action>) {
        self.finish(now, EndReason::Forced, Some(by), out);
    }

    fn finish(
        &mut self,
        now: Instant,
        reason: EndReason,
        by: Option<Trigger>,
        out: &mut Vec<Action>,
    ) {
        let drain = self.drain.as_ref();
        let leave_by = match (reason, drain) {
            (EndReason::Forced, _) | (_, None) => now + EXIT_GRACE,
            (_, Some(d)) => d.deadline.max(now) + EXIT_GRACE,
        };
        self.exit = Some(Exit { leave_by });
        out.push(Action::Exit(Outcome {
            reason,
            trigger: drain.map(|d| d.trigger),
            forced_by: by,
            sessions_left: self.sessions,
            peers_left: self.peers,
            drain_duration: drain
                .map_or(Duration::ZERO, |d| now.saturating_duration_since(d.started)),
        }));
    }
}
