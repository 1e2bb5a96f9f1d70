//! Until every HAProxy that may send the agent work has marked it DOWN, the drain holds.
//!
//! HAProxy places work only on agents it has UP, and marks one DOWN after `fall`
//! consecutive failed health checks, `inter` apart; the drain refuses them from the moment
//! it refuses work. An agent that left before that would close its listener while HAProxy
//! still places work on it: behind HAProxy 3.0 the messages queued for the closed address
//! wait `timeout processing` and fail (`st=1`), behind 3.2 the streams on refused
//! connections fail (`st=257`); measured in tests/spoa/rollout.rs
//! (`an_agent_leaving_for_good_fails_nothing`, `sigterm_at_any_age_fails_nothing`).
//!
//! The rule, from HAProxy's check scheduling (docs/termination.md, *Leaving after DOWN*):
//!
//! - A HAProxy (a peer address) that health-checks the agent has it UP from each check it
//!   gets answered, or refused fewer than [`DOWN_AFTER_CHECKS`] times in a row, until
//!   [`CHECK_HOLD`] later (its next check renews it: `inter` 1 s in the documented file, 2 s
//!   HAProxy's default); the check that makes it `fall` holds [`DOWN_MARGIN`] more. A HAProxy
//!   that stops checking (gone, or checks further apart than [`CHECK_HOLD`]) holds nothing
//!   after that, except one that has begun to mark the agent DOWN while it drains (a check
//!   refused, not yet `fall`): it holds until [`DRAINING_HOLD`] without a check, since on a
//!   loaded machine checks come late (measured at a load average of 25-36 on 2 cores: a
//!   second refused check more than 2.5 s after the first, and agents that left with HAProxy
//!   at `UP 1/2`).
//! - A HAProxy the agent has not heard from yet may have it UP too (HAProxy starts a server
//!   UP, and spreads its first checks over `inter`): for [`CHECK_HOLD`] from the moment the
//!   agent listens, the unseen ones hold it; by then each has checked it once and is known.
//!
//! Each is a [`lastcall::Handle::hold`], held from the check (not from the drain), so the
//! lifecycle's decision to leave, taken in the same step as the drain starts refusing,
//! already sees them: the holds taken when refusing began came too late, and an agent with no
//! connection open at that instant left at once (behind 3.0, 14 drains of 20).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use lastcall::{Handle, HoldGuard};
use parking_lot::Mutex;
use tokio::time::Instant;

/// Refused health checks after which a HAProxy has marked the agent DOWN: `fall 2`, as in
/// the documented HAProxy file, the chart's sidecar file and what `check-haproxy` asks for.
pub(crate) const DOWN_AFTER_CHECKS: u32 = 2;

/// How long a check holds the agent: longer than `inter` (1 s in the documented file, 2 s
/// HAProxy's default) with room for `spread-checks` and a slow check, so that the next check
/// renews it. Also how long after the agent starts listening the HAProxies it has not heard
/// from yet hold it.
pub(crate) const CHECK_HOLD: Duration = Duration::from_millis(2500);

/// How long the hold lasts after the check that made HAProxy mark the agent DOWN: its
/// threads may be placing a connection as it does.
pub(crate) const DOWN_MARGIN: Duration = Duration::from_millis(200);

/// While draining, how long a HAProxy that has refused checks but not yet marked the agent
/// DOWN holds it without a check: longer than any check interval a loaded machine stretches
/// `inter` to, and what a HAProxy that went away in the middle of marking it DOWN costs.
pub(crate) const DRAINING_HOLD: Duration = Duration::from_secs(10);

/// How long a check holds the agent, given the health checks refused in a row so far (this
/// one included; 0 for an answered check): none after the check that marked the agent DOWN
/// (HAProxy goes on checking a DOWN server; those checks hold nothing).
pub(crate) fn hold_after_check(refused: u32) -> Option<Duration> {
    match refused.cmp(&DOWN_AFTER_CHECKS) {
        std::cmp::Ordering::Less => Some(CHECK_HOLD),
        std::cmp::Ordering::Equal => Some(DOWN_MARGIN),
        std::cmp::Ordering::Greater => None,
    }
}

/// Who checks the agent: a peer address, or `None` for a Unix socket's peers (a HAProxy in
/// the same pod or host).
type Checker = Option<IpAddr>;

/// The HAProxies that health-check the agent, and the holds they keep on the drain.
#[derive(Default)]
pub(crate) struct Down {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    peers: HashMap<Checker, Peer>,
    /// The HAProxies not heard from yet, for [`CHECK_HOLD`] after the agent started
    /// listening.
    unseen: Option<HoldGuard>,
}

#[derive(Default)]
struct Peer {
    /// Health checks refused in a row.
    refused: u32,
    /// When it last checked.
    last: Option<Instant>,
    /// Which release timer is current: a later check outdates the earlier ones.
    generation: u64,
    held: Option<HoldGuard>,
}

impl Down {
    /// The agent listens from now: the HAProxies it has not heard from hold it for
    /// [`CHECK_HOLD`]. Call once, on the runtime, before the lifecycle can start refusing.
    pub(crate) fn listening(self: &Arc<Self>, handle: &Handle) {
        self.inner.lock().unseen = Some(handle.hold());
        let me = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(CHECK_HOLD).await;
            me.inner.lock().unseen = None;
        });
    }

    /// A health check came from `peer`: answered, or `refused` (the drain).
    pub(crate) fn checked(self: &Arc<Self>, handle: &Handle, peer: Checker, refused: bool) {
        let mut inner = self.inner.lock();
        let p = inner.peers.entry(peer).or_default();
        p.refused = if refused { p.refused + 1 } else { 0 };
        p.last = Some(Instant::now());
        let Some(hold) = hold_after_check(p.refused) else {
            return;
        };
        if p.held.is_none() {
            p.held = Some(handle.hold());
        }
        p.generation += 1;
        let generation = p.generation;
        let me = Arc::clone(self);
        let handle = handle.clone();
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            while let Some(more) = me.release(&handle, peer, generation) {
                tokio::time::sleep(more).await;
            }
        });
    }

    /// The hold of `peer` taken by its check `generation` has run out: released, unless a
    /// later check took over, or the agent is draining and that HAProxy has refused checks
    /// but not yet marked it DOWN (then `Some`: how long until [`DRAINING_HOLD`] without a
    /// check). One whose checks were all answered is released: it may be gone (a sidecar's
    /// HAProxy that exited before the agent's SIGTERM).
    fn release(&self, handle: &Handle, peer: Checker, generation: u64) -> Option<Duration> {
        let mut inner = self.inner.lock();
        let p = inner.peers.get_mut(&peer)?;
        if p.generation != generation {
            return None;
        }
        if handle.is_draining() && (1..DOWN_AFTER_CHECKS).contains(&p.refused) {
            let left = p.last.map_or(Duration::ZERO, |t| {
                DRAINING_HOLD.saturating_sub(t.elapsed())
            });
            if !left.is_zero() {
                return Some(left);
            }
        }
        p.held = None;
        None
    }

    /// Whether HAProxy `peer` holds the drain now: its checks have the agent UP, or it is
    /// marking it DOWN, or it has not checked yet while the unseen ones hold it.
    pub(crate) fn holding(&self, peer: Checker) -> bool {
        let inner = self.inner.lock();
        match inner.peers.get(&peer) {
            Some(p) => p.held.is_some(),
            None => inner.unseen.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lastcall::{Lifecycle, OnSigterm, TerminationConfig};

    #[test]
    fn held_until_the_fall_th_refused_check() {
        let table = [
            (0, Some(CHECK_HOLD)),
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

    fn handle() -> Handle {
        let config =
            TerminationConfig::new(OnSigterm::Drain, Duration::ZERO, Duration::from_secs(30));
        Lifecycle::without_signals(config).handle()
    }

    /// One HAProxy checking every second, answered then refused: held from its first check,
    /// released [`DOWN_MARGIN`] after its second refused check; an answered check in between
    /// starts the count again (HAProxy's `fall` counts failures in a row).
    #[tokio::test(start_paused = true)]
    async fn a_checker_holds_from_its_first_check_until_it_marks_the_agent_down() {
        let handle = handle();
        let down = Arc::new(Down::default());
        let peer = Some(IpAddr::from([127, 0, 0, 1]));
        let step = Duration::from_secs(1);
        assert_eq!(handle.holds(), 0);
        down.checked(&handle, peer, false);
        assert_eq!(handle.holds(), 1);
        for refused in [true, false, true] {
            tokio::time::sleep(step).await;
            down.checked(&handle, peer, refused);
            assert_eq!(handle.holds(), 1);
        }
        tokio::time::sleep(step).await;
        down.checked(&handle, peer, true);
        tokio::time::sleep(DOWN_MARGIN - Duration::from_millis(1)).await;
        assert_eq!(handle.holds(), 1, "DOWN_MARGIN after the fall-th check");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(handle.holds(), 0);
        // HAProxy goes on checking a DOWN server: those checks hold nothing.
        tokio::time::sleep(step).await;
        down.checked(&handle, peer, true);
        assert_eq!(handle.holds(), 0);
    }

    /// While draining, a HAProxy that has not marked the agent DOWN yet holds it until
    /// [`DRAINING_HOLD`] without a check (its checks come late on a loaded machine); its
    /// fall-th refused check still releases it [`DOWN_MARGIN`] later.
    #[tokio::test(start_paused = true)]
    async fn while_draining_a_checker_holds_until_down_or_long_silent() {
        let config =
            TerminationConfig::new(OnSigterm::Drain, Duration::ZERO, Duration::from_secs(60));
        let lifecycle = Lifecycle::without_signals(config);
        let handle = lifecycle.handle();
        tokio::spawn(lifecycle.run_with(futures::stream::pending()));
        let down = Arc::new(Down::default());
        let (late, prompt, gone) = (
            Some(IpAddr::from([10, 0, 0, 1])),
            Some(IpAddr::from([10, 0, 0, 2])),
            Some(IpAddr::from([10, 0, 0, 3])),
        );
        down.checked(&handle, late, false);
        down.checked(&handle, prompt, false);
        down.checked(&handle, gone, false);
        handle.start_drain(lastcall::Trigger::Api);
        handle.refusing().await;
        let ms = Duration::from_millis;
        tokio::time::sleep(ms(1000)).await;
        down.checked(&handle, late, true);
        down.checked(&handle, prompt, true);
        tokio::time::sleep(ms(1000)).await;
        down.checked(&handle, prompt, true);
        assert_eq!(handle.holds(), 3);
        tokio::time::sleep(DOWN_MARGIN + ms(1)).await;
        assert_eq!(handle.holds(), 2, "the prompt one marked the agent DOWN");
        tokio::time::sleep(CHECK_HOLD - ms(2000) - DOWN_MARGIN).await;
        assert_eq!(
            handle.holds(),
            1,
            "only answered checks: released at CHECK_HOLD"
        );
        // The late one's second check has not come: held past CHECK_HOLD.
        tokio::time::sleep(DRAINING_HOLD - ms(1000) - (CHECK_HOLD - ms(2000)) - ms(2)).await;
        assert_eq!(handle.holds(), 1);
        tokio::time::sleep(ms(2)).await;
        assert_eq!(handle.holds(), 0, "DRAINING_HOLD without a check");
    }

    /// A checker that stops checking (gone away) holds for [`CHECK_HOLD`] after its last
    /// check; two checkers hold one each; the unseen ones hold for [`CHECK_HOLD`] after the
    /// agent starts listening.
    #[tokio::test(start_paused = true)]
    async fn holds_end_when_checks_stop_and_the_unseen_after_one_check_hold() {
        let handle = handle();
        let down = Arc::new(Down::default());
        down.listening(&handle);
        assert_eq!(handle.holds(), 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
        down.checked(&handle, Some(IpAddr::from([10, 0, 0, 1])), false);
        down.checked(&handle, None, true);
        assert_eq!(handle.holds(), 3);
        let ms = Duration::from_millis;
        tokio::time::sleep(CHECK_HOLD - ms(500) + ms(1)).await;
        assert_eq!(
            handle.holds(),
            2,
            "the unseen ones: CHECK_HOLD after listening"
        );
        tokio::time::sleep(ms(500) - ms(2)).await;
        assert_eq!(handle.holds(), 2);
        tokio::time::sleep(ms(2)).await;
        assert_eq!(handle.holds(), 0, "CHECK_HOLD after the last check");
    }
}
