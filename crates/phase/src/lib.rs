//! The termination lifecycle's phase ([`Phase`]) and what a connection follows of it
//! ([`Seen`]), with no runtime, so that a sans-IO protocol core can decide what a connection
//! does in each phase without depending on `lastcall`, which drives the phases with tokio
//! and re-exports both types (`lastcall::Phase`, `lastcall::Seen`).
#![forbid(unsafe_code)]

use std::fmt;

/// The lifecycle phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// From the start until the daemon says it is ready (lastcall's `Input::Ready`): readiness 503,
    /// nothing refused. A drain trigger here skips the shutdown delay.
    Starting,
    /// Normal operation; readiness 200.
    Serving,
    /// From the trigger for `--shutdown-delay`: readiness 503, new work still accepted.
    Announcing,
    /// New work refused with the protocol's goodbye; existing work served to its end.
    Refusing,
    /// `--on-sigterm linger`: readiness 503, nothing refused; exit once idle (after the delay).
    Lingering,
}

impl Phase {
    /// Value of the `lastcall_drain_phase` gauge: 0 serving, 1 announcing, 2 refusing,
    /// 3 lingering, 4 starting.
    pub fn metric_value(self) -> i64 {
        match self {
            Phase::Starting => 4,
            Phase::Serving => 0,
            Phase::Announcing => 1,
            Phase::Refusing => 2,
            Phase::Lingering => 3,
        }
    }

    /// Lower-case name, as in logs and `GET /drain`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Serving => "serving",
            Phase::Announcing => "announcing",
            Phase::Refusing => "refusing",
            Phase::Lingering => "lingering",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The part of the lifecycle's state a connection follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Seen {
    /// The phase.
    pub phase: Phase,
    /// Whether the exit is decided.
    pub exiting: bool,
    /// Whether a hold is left (lastcall's `Handle::hold`): something outside the daemon, e.g. a load
    /// balancer that has not yet marked it down, may still send it work.
    pub held: bool,
}

impl Seen {
    /// Serving, the exit not decided, no hold: `/readyz` answers 200 and nothing is being
    /// drained.
    pub const SERVING: Seen = Seen {
        phase: Phase::Serving,
        exiting: false,
        held: false,
    };

    /// Serving, and the exit not decided.
    pub fn is_serving(self) -> bool {
        self.phase == Phase::Serving && !self.exiting
    }

    /// New work is refused: Refusing, or the exit is decided.
    pub fn is_refusing(self) -> bool {
        self.phase == Phase::Refusing || self.exiting
    }

    /// A drain (or linger) has started, or the exit is decided: `/readyz` answers 503.
    pub fn is_draining(self) -> bool {
        !matches!(self.phase, Phase::Serving | Phase::Starting) || self.exiting
    }

    /// The exit is decided: close what is left, now.
    pub fn is_exiting(self) -> bool {
        self.exiting
    }
}
