//! The idle reclaim of a drain: while refusing, an allocation whose client has sent nothing
//! (no data, no request) for [`ServerConfig::drain_idle_timeout`](crate::ServerConfig) is
//! ended as if expired ([`DeleteReason::Reclaimed`](crate::DeleteReason::Reclaimed)), so a
//! client that vanished without deleting its allocation (coturn's `turnutils_uclient` over
//! UDP, a crashed tab, a phone that lost its network) does not hold the drain until the
//! allocation's lifetime ends.
//!
//! 30 s by default in `lastcall-turn`: RFC 7675 consent freshness declares a WebRTC path dead
//! after 30 s without an answer, and a live one sends its consent checks every few seconds
//! through the relay. What counts as "heard from": any datagram or frame on the allocation's
//! 5-tuple that reaches the core (ChannelData, Send, any request, even one refused), and
//! [`Server::note_client_activity`] for a client whose packets the core does not see (a
//! kernel fast path relaying ChannelData on its own reports them from its counters).
//!
//! Cost: one timestamp written per client datagram; no timer work per packet. While
//! reclaiming, an allocation's next timer is at most its idle deadline; when that comes and
//! the client was heard meanwhile, the timer moves to the new deadline.

use std::time::{Duration, Instant};

use super::{Allocation, Server};
use crate::types::{ClientAddr, DrainMode};

/// Whether `a` has heard nothing from its client for `idle` (`None`: not reclaiming).
pub(super) fn is_idle(a: &Allocation, idle: Option<Duration>, now: Instant) -> bool {
    idle.is_some_and(|limit| now.saturating_duration_since(a.last_heard) >= limit)
}

/// `next`, or the allocation's idle deadline if that comes first.
pub(super) fn with_idle_deadline(next: Instant, a: &Allocation, idle: Option<Duration>) -> Instant {
    match idle.and_then(|limit| a.last_heard.checked_add(limit)) {
        Some(deadline) => next.min(deadline),
        None => next,
    }
}

impl Server {
    /// The idle limit in force: while refusing, with `drain_idle_timeout` set.
    pub(super) fn idle_limit(&self) -> Option<Duration> {
        match self.drain {
            DrainMode::Refuse { .. } => self.config.drain_idle_timeout,
            DrainMode::Off => None,
        }
    }

    /// Allocation `idx` heard from its client at `now`.
    pub(super) fn heard(&mut self, idx: Option<usize>, now: Instant) {
        if let Some(Some(a)) = idx.and_then(|i| self.allocs.get_mut(i)) {
            a.last_heard = a.last_heard.max(now);
        }
    }

    /// Puts every allocation's idle deadline on the timers (the reclaim just began).
    pub(super) fn schedule_idle_checks(&mut self) {
        let Some(limit) = self.idle_limit() else {
            return;
        };
        for (idx, slot) in self.allocs.iter_mut().enumerate() {
            let Some(a) = slot else { continue };
            let Some(deadline) = a.last_heard.checked_add(limit) else {
                continue;
            };
            if deadline < a.scheduled {
                a.scheduled = deadline;
                self.timers.push(std::cmp::Reverse((deadline, idx, a.gen)));
            }
        }
    }

    /// Another source saw `client` active at `at` (for a client whose datagrams do not all
    /// pass through the core, e.g. a kernel fast path relaying its ChannelData: feed it from
    /// that path's per-allocation counters). Keeps its allocation from being reclaimed for
    /// `drain_idle_timeout` after `at`. Unknown clients are ignored.
    pub fn note_client_activity(&mut self, client: &ClientAddr, at: Instant) {
        let idx = self.by_client.get(client).copied();
        self.heard(idx, at);
    }

    /// When `client`'s allocation last heard from it (`None`: no allocation).
    pub fn last_client_activity(&self, client: &ClientAddr) -> Option<Instant> {
        let idx = self.by_client.get(client).copied()?;
        self.allocs.get(idx)?.as_ref().map(|a| a.last_heard)
    }
}
