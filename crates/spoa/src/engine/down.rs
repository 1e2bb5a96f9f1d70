//! Until HAProxy has marked this agent DOWN, the drain's room is not empty.
//!
//! HAProxy places work only on agents it has UP, and marks one DOWN after `fall`
//! consecutive failed health checks; the drain refuses them from the moment it refuses work.
//! An agent that left before that would close its listener while HAProxy still connects to
//! it: measured behind HAProxy 3.0 and 3.2 (`on-marked-down shutdown-sessions`, no retry
//! lines, tests/spoa/rollout.rs `an_agent_leaving_for_good_fails_nothing`), 2-54 messages of
//! about 1,000 requests failed per drain: 3.0's applets retried the closed address and the
//! messages queued for them timed out (`st=1` after `timeout processing`), 3.2's streams on
//! the refused connections failed (`st=257`). So each HAProxy (a peer address) that
//! health-checks the agent holds a session from its first refused check until its
//! [`DOWN_AFTER_CHECKS`]-th, when it marks the agent DOWN, or until it has not checked for
//! [`CHECK_HOLD`] (a HAProxy that went away, or checks further apart than that).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use lastcall::{Handle, PeerId, SessionGuard};

/// Refused health checks after which a HAProxy has marked the agent DOWN: `fall 2`, as in
/// the documented HAProxy file, the chart's sidecar file and what `check-haproxy` asks for.
pub(crate) const DOWN_AFTER_CHECKS: u32 = 2;

/// How long a HAProxy that health-checks the agent holds a session, from the drain's start
/// or its last refused check, while it has not yet marked the agent DOWN: longer than
/// `inter` (1 s in the documented file, 2 s HAProxy's default), so the next check renews it.
pub(crate) const CHECK_HOLD: Duration = Duration::from_millis(2500);

/// How long the session is still held after the check that made HAProxy mark the agent
/// DOWN: its threads may be placing a connection as it does.
pub(crate) const DOWN_MARGIN: Duration = Duration::from_millis(200);

/// How long the session of a HAProxy that has had `refused` health checks refused so far
/// (this one included) is held from now: none after the check that marked the agent DOWN
/// (HAProxy goes on checking a DOWN server; those checks hold nothing).
pub(crate) fn hold_after_check(refused: u32) -> Option<Duration> {
    match refused.cmp(&DOWN_AFTER_CHECKS) {
        std::cmp::Ordering::Less => Some(CHECK_HOLD),
        std::cmp::Ordering::Equal => Some(DOWN_MARGIN),
        std::cmp::Ordering::Greater => None,
    }
}

/// The HAProxies that health-check the agent, and the sessions held for them while draining.
#[derive(Default)]
pub(crate) struct Down {
    peers: Mutex<HashMap<IpAddr, Peer>>,
}

#[derive(Default)]
struct Peer {
    refused: u32,
    last_check: Option<Instant>,
    generation: u64,
    held: Option<SessionGuard>,
}

impl Down {
    /// A health check came from `peer`: answered, or `refused` (the drain).
    pub(crate) fn checked(self: &Arc<Self>, handle: &Handle, peer: IpAddr, refused: bool) {
        let mut peers = self.lock();
        let p = peers.entry(peer).or_default();
        p.last_check = Some(Instant::now());
        if refused {
            p.refused += 1;
            if let Some(hold) = hold_after_check(p.refused) {
                self.hold(handle, peer, p, hold);
            }
        }
    }

    /// The drain refuses work from now: every HAProxy that checked the agent within
    /// [`CHECK_HOLD`] has not marked it DOWN yet.
    pub(crate) fn refusing(self: &Arc<Self>, handle: &Handle) {
        let mut peers = self.lock();
        for (peer, p) in peers.iter_mut() {
            let recent = p.last_check.is_some_and(|t| t.elapsed() < CHECK_HOLD);
            if recent && p.refused == 0 && p.held.is_none() {
                self.hold(handle, *peer, p, CHECK_HOLD);
            }
        }
    }

    fn hold(self: &Arc<Self>, handle: &Handle, peer: IpAddr, p: &mut Peer, hold: Duration) {
        if p.held.is_none() {
            p.held = Some(handle.session(PeerId::from(peer)));
        }
        p.generation += 1;
        let generation = p.generation;
        let me = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            if let Some(p) = me.lock().get_mut(&peer) {
                if p.generation == generation {
                    p.held = None;
                }
            }
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Peer>> {
        self.peers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_until_the_fall_th_refused_check() {
        let table = [
            (1, Some(CHECK_HOLD)),
            (2, Some(DOWN_MARGIN)),
            (3, None),
            (10, None),
        ];
        for (refused, want) in table {
            assert_eq!(hold_after_check(refused), want, "{refused}");
        }
        assert_eq!(DOWN_AFTER_CHECKS, 2);
    }
}
