//! Timers: one heap entry per allocation at its next deadline (its expiry, a permission's
//! or a channel's, a quarantine's end, a drain's idle deadline); stale entries are skipped.

use std::cmp::Reverse;
use std::time::Instant;

use super::{reclaim, Allocation, Server, CHANNEL_QUARANTINE};
use crate::types::DeleteReason;

impl Server {
    /// When [`handle_timeout`](Self::handle_timeout) should next be called (may be early;
    /// calling early is harmless).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let alloc = self.timers.peek().map(|Reverse((t, _, _))| *t);
        [alloc, self.allocate_deadline(), self.lookup_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Expire allocations (releasing their relays), permissions, channels, reservations,
    /// Allocates that waited too long for their relay sockets and user-database lookups that
    /// took too long, all due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.expire_allocates(now);
        self.expire_lookups(now);
        while let Some(Reverse((t, idx, gen))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            let idle = self.idle_limit();
            let end = match self.allocs.get(idx) {
                Some(Some(a)) if a.gen == gen && a.scheduled == t => {
                    if a.expires <= now {
                        Some(DeleteReason::Expired)
                    } else if reclaim::is_idle(a, idle, now) {
                        Some(DeleteReason::Reclaimed)
                    } else {
                        None
                    }
                }
                _ => continue, // stale entry
            };
            if let Some(reason) = end {
                if reason == DeleteReason::Reclaimed {
                    self.counters.allocations_reclaimed += 1;
                }
                self.delete(idx, reason);
                continue;
            }
            let Some(Some(a)) = self.allocs.get_mut(idx) else {
                continue;
            };
            a.perms.retain(|(_, exp)| *exp > now);
            Server::unpublish_routes(
                &mut self.routes,
                a,
                a.channels
                    .iter()
                    .filter(|c| c.expires + CHANNEL_QUARANTINE <= now),
            );
            a.channels.retain(|c| c.expires + CHANNEL_QUARANTINE > now);
            let next = reclaim::with_idle_deadline(next_deadline(a, now), a, idle);
            a.scheduled = next;
            self.timers.push(Reverse((next, idx, gen)));
        }
    }

    pub(super) fn reschedule(&mut self, idx: usize, now: Instant) {
        let idle = self.idle_limit();
        if let Some(Some(a)) = self.allocs.get_mut(idx) {
            let next = reclaim::with_idle_deadline(next_deadline(a, now), a, idle);
            if next < a.scheduled {
                a.scheduled = next;
                self.timers.push(Reverse((next, idx, a.gen)));
            }
        }
    }
}

fn next_deadline(a: &Allocation, now: Instant) -> Instant {
    let mut next = a.expires;
    for (_, exp) in &a.perms {
        next = next.min(*exp);
    }
    for c in &a.channels {
        let t = if c.expires > now {
            c.expires
        } else {
            c.expires + CHANNEL_QUARANTINE
        };
        next = next.min(t);
    }
    next
}
