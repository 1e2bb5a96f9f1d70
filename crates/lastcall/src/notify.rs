//! systemd's readiness protocol (`sd_notify(3)`), for a unit with `Type=notify` such as
//! Debian's `coturn.service`: `READY=1` when Starting ends (every port bound), `STOPPING=1`
//! when a drain starts, and `STATUS=` with what the daemon waits for (`systemctl status`
//! shows it). Sent only where the service manager set `NOTIFY_SOCKET` (a socket path;
//! abstract `@` addresses are not supported); elsewhere nothing happens.
//!
//! What to say after each of the machine's actions is decided here ([`notices`], a pure
//! function with table tests); [`send`] hands it to the `sd-notify` crate.

use crate::machine::{count, Action, Phase};

/// What the service manager is told after one action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notice {
    /// `READY=1`: start-up is finished.
    pub(crate) ready: bool,
    /// `STOPPING=1`: the daemon is leaving (a drain started).
    pub(crate) stopping: bool,
    /// `STATUS=...`.
    pub(crate) status: String,
}

/// The notice after `action`, given the live `sessions` from `peers` at that moment; `None`
/// when there is nothing new to say.
pub(crate) fn notices(action: &Action, sessions: u64, peers: u64) -> Option<Notice> {
    let waiting = || {
        format!(
            "waiting for {} from {} to end",
            count(sessions, "session"),
            count(peers, "peer")
        )
    };
    let notice = |ready, stopping, status| {
        Some(Notice {
            ready,
            stopping,
            status,
        })
    };
    match action {
        Action::PhaseChanged {
            from: Phase::Starting,
            to: Phase::Serving,
        } => notice(true, false, "serving".to_string()),
        Action::DrainStarted { trigger, phase, .. } => {
            let what = match phase {
                Phase::Lingering => "lingering",
                Phase::Announcing => "draining: announcing (readiness 503), new work still served",
                _ => "draining: refusing new work",
            };
            notice(false, true, format!("{trigger}: {what}; {}", waiting()))
        }
        Action::PhaseChanged {
            to: Phase::Refusing,
            ..
        } => notice(
            false,
            false,
            format!("draining: refusing new work; {}", waiting()),
        ),
        Action::Progress { .. } | Action::Exit(_) => notice(false, false, action.to_string()),
        Action::PhaseChanged { .. }
        | Action::AlreadyDraining { .. }
        | Action::Ignored { .. }
        | Action::Reload { .. } => None,
    }
}

/// Sends `notice` to `NOTIFY_SOCKET`, if it is set. A failure is logged once per process (a
/// service manager that went away must not flood the log).
pub(crate) fn send(notice: &Notice) {
    use sd_notify::NotifyState;
    static FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let mut states = Vec::with_capacity(3);
    if notice.ready {
        states.push(NotifyState::Ready);
    }
    if notice.stopping {
        states.push(NotifyState::Stopping);
    }
    states.push(NotifyState::Status(&notice.status));
    if let Err(err) = sd_notify::notify(&states) {
        if !FAILED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!("cannot notify the service manager (NOTIFY_SOCKET): {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::OnSigterm;
    use crate::machine::{EndReason, Outcome, Trigger};

    /// (`READY=1`, `STOPPING=1`, `STATUS=`).
    type Said = (bool, bool, String);

    fn started(trigger: Trigger, phase: Phase) -> Action {
        Action::DrainStarted {
            trigger,
            from: Phase::Serving,
            phase,
            policy: OnSigterm::Drain,
            shutdown_delay: Duration::from_secs(5),
            deadline_in: Duration::from_secs(3600),
        }
    }

    #[test]
    fn ready_when_starting_ends_stopping_when_a_drain_starts_and_what_it_waits_for() {
        let status = |s: &str| s.to_string();
        let table: Vec<(Action, Option<Said>)> = vec![
            (
                Action::PhaseChanged {
                    from: Phase::Starting,
                    to: Phase::Serving,
                },
                Some((true, false, status("serving"))),
            ),
            (
                started(Trigger::Sigterm, Phase::Announcing),
                Some((
                    false,
                    true,
                    status("SIGTERM: draining: announcing (readiness 503), new work still served; waiting for 3 sessions from 2 peers to end"),
                )),
            ),
            (
                started(Trigger::Sigusr1, Phase::Refusing),
                Some((
                    false,
                    true,
                    status("SIGUSR1: draining: refusing new work; waiting for 3 sessions from 2 peers to end"),
                )),
            ),
            (
                started(Trigger::Sigterm, Phase::Lingering),
                Some((
                    false,
                    true,
                    status("SIGTERM: lingering; waiting for 3 sessions from 2 peers to end"),
                )),
            ),
            (
                Action::PhaseChanged {
                    from: Phase::Announcing,
                    to: Phase::Refusing,
                },
                Some((
                    false,
                    false,
                    status("draining: refusing new work; waiting for 3 sessions from 2 peers to end"),
                )),
            ),
            (
                Action::Progress {
                    phase: Phase::Refusing,
                    sessions: 3,
                    peers: 2,
                    holds: 0,
                    to_deadline: Duration::from_secs(12),
                },
                Some((
                    false,
                    false,
                    status("draining: 3 sessions left from 2 peers, 12 s to deadline"),
                )),
            ),
            (
                Action::Exit(Outcome {
                    reason: EndReason::Idle,
                    trigger: Some(Trigger::Sigterm),
                    forced_by: None,
                    sessions_left: 0,
                    peers_left: 0,
                    drain_duration: Duration::from_secs(2),
                }),
                Some((
                    false,
                    false,
                    status("drain ended: idle, no session left after 2s; exit status 0"),
                )),
            ),
            (
                Action::PhaseChanged {
                    from: Phase::Serving,
                    to: Phase::Announcing,
                },
                None,
            ),
            (
                Action::Reload {
                    trigger: Trigger::Sigusr2,
                },
                None,
            ),
            (
                Action::AlreadyDraining {
                    trigger: Trigger::Sigterm,
                    phase: Phase::Refusing,
                },
                None,
            ),
            (
                Action::Ignored {
                    trigger: Trigger::Sigterm,
                },
                None,
            ),
        ];
        for (action, want) in table {
            let got = notices(&action, 3, 2).map(|n| (n.ready, n.stopping, n.status));
            assert_eq!(got, want, "{action:?}");
        }
    }
}
