//! coturn's `prometheus-username-labels`: the `turn_traffic_*` counters by user, bounded.
//!
//! coturn (`src/apps/relay/prom_server.c`) registers its eight `turn_traffic_*` counter
//! families with the labels `realm` and, with this option, `user` (the session's USERNAME), and
//! adds each session's totals when it ends. Its label sets are never removed: coturn's README
//! warns that ephemeral usernames (the TURN REST API's `timestamp:user`, Wire's zrest
//! `d=….r=…`, unique per credential) leak memory. Here:
//!
//! - each allocation is given its user's [`UserTraffic`] handle when it is created (the core
//!   calls [`UserLabels::handle`] under its lock); the data path adds to the handle it holds,
//!   so relaying looks nothing up by name, and the counts are live, not at the session's end;
//! - at most `max` users (`prometheus-username-labels-max`, [`DEFAULT_MAX_USERS`]) have a label
//!   at once; an allocation of a further user is counted under `user="_overflow"`
//!   ([`OVERFLOW`]) and in `lastcall_turn_user_labels_overflow_total`;
//! - a user none of whose allocations is left is dropped after [`IDLE`] (at the next scrape or
//!   new user after that), with its series: memory follows the users of the last hour, not
//!   every user ever seen.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lastcall_turn_proto::{TrafficCounts, UserTraffic};
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// Users labelled at once unless `prometheus-username-labels-max` says otherwise.
pub const DEFAULT_MAX_USERS: usize = 1000;

/// How long a user without allocations keeps its label.
pub const IDLE: Duration = Duration::from_secs(3600);

/// The `user` label value of the allocations of users past the limit.
pub const OVERFLOW: &str = "_overflow";

/// The labelled users and their handles.
#[derive(Debug)]
pub struct UserLabels {
    max: usize,
    idle: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    users: HashMap<String, Entry>,
    overflow: Arc<UserTraffic>,
    /// Allocations counted under [`OVERFLOW`].
    overflowed: u64,
}

#[derive(Debug)]
struct Entry {
    traffic: Arc<UserTraffic>,
    /// Since when no allocation holds the handle (as first seen by a sweep).
    unused_since: Option<Instant>,
}

impl UserLabels {
    /// At most `max` users labelled, each dropped `idle` after its last allocation.
    pub fn new(max: usize, idle: Duration) -> UserLabels {
        UserLabels {
            max,
            idle,
            state: Mutex::new(State {
                users: HashMap::new(),
                overflow: Arc::new(UserTraffic::default()),
                overflowed: 0,
            }),
        }
    }

    /// The handle of `user`'s new allocation: its own, or the overflow's past the limit.
    pub fn handle(&self, user: &str, now: Instant) -> Arc<UserTraffic> {
        let mut s = self.state.lock();
        if let Some(e) = s.users.get_mut(user) {
            e.unused_since = None;
            return Arc::clone(&e.traffic);
        }
        if s.users.len() >= self.max {
            self.sweep(&mut s, now);
        }
        if s.users.len() >= self.max {
            s.overflowed += 1;
            return Arc::clone(&s.overflow);
        }
        let traffic = Arc::new(UserTraffic::default());
        s.users.insert(
            user.to_string(),
            Entry {
                traffic: Arc::clone(&traffic),
                unused_since: None,
            },
        );
        traffic
    }

    /// Drops the users without allocations for `idle`; notes those newly without.
    fn sweep(&self, s: &mut State, now: Instant) {
        let idle = self.idle;
        s.users.retain(|_, e| {
            if Arc::strong_count(&e.traffic) > 1 {
                e.unused_since = None;
                return true;
            }
            let since = *e.unused_since.get_or_insert(now);
            now.duration_since(since) < idle
        });
    }

    /// Every labelled user's counts (sorted by user; the overflow last, once used), after a
    /// sweep.
    pub fn snapshot(&self, now: Instant) -> Vec<(String, TrafficCounts)> {
        let mut s = self.state.lock();
        self.sweep(&mut s, now);
        let mut out: Vec<(String, TrafficCounts)> = s
            .users
            .iter()
            .map(|(u, e)| (u.clone(), e.traffic.get()))
            .collect();
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if s.overflowed > 0 {
            out.push((OVERFLOW.to_string(), s.overflow.get()));
        }
        out
    }

    /// Labelled users now, and allocations counted under [`OVERFLOW`] since start.
    fn usage(&self) -> (usize, u64) {
        let s = self.state.lock();
        (s.users.len(), s.overflowed)
    }
}

/// The labels' own metrics: users labelled, allocations past the limit.
#[derive(Debug)]
pub(crate) struct UserLabelMetrics(pub(crate) Arc<UserLabels>);

impl Collector for UserLabelMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (users, overflowed) = self.0.usage();
        let e = encoder.encode_descriptor(
            "lastcall_turn_user_labels",
            "Users with their own user label on the turn_traffic_* counters now (prometheus-username-labels; at most prometheus-username-labels-max).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(users as i64).encode(e)?;
        let e = encoder.encode_descriptor(
            "lastcall_turn_user_labels_overflow",
            "Allocations whose user found no free label (prometheus-username-labels-max reached): counted under user=\"_overflow\".",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(overflowed).encode(e)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_past_the_limit_share_the_overflow_and_idle_users_are_dropped() {
        let t0 = Instant::now();
        let labels = UserLabels::new(2, Duration::from_secs(60));
        let a = labels.handle("alice", t0);
        let a2 = labels.handle("alice", t0);
        assert!(Arc::ptr_eq(&a, &a2), "one handle per user");
        let b = labels.handle("bob", t0);
        let c = labels.handle("carol", t0);
        let d = labels.handle("dave", t0);
        assert!(Arc::ptr_eq(&c, &d), "both past the limit: the overflow's");
        assert_eq!(labels.usage(), (2, 2));
        c.add(&TrafficCounts {
            client_packets_in: 1,
            ..TrafficCounts::default()
        });
        let names: Vec<String> = labels.snapshot(t0).into_iter().map(|(u, _)| u).collect();
        assert_eq!(names, ["alice", "bob", OVERFLOW]);

        // bob's allocation ends: his label stays for the idle time, then goes.
        drop(b);
        assert_eq!(labels.snapshot(t0 + Duration::from_secs(1)).len(), 3);
        assert_eq!(labels.snapshot(t0 + Duration::from_secs(59)).len(), 3);
        let left = labels.snapshot(t0 + Duration::from_secs(62));
        assert_eq!(
            left.iter().map(|(u, _)| u.as_str()).collect::<Vec<_>>(),
            ["alice", OVERFLOW]
        );
        // Its place is free for a new user; alice, still allocated, is never dropped.
        let e = labels.handle("erin", t0 + Duration::from_secs(3600));
        assert!(!Arc::ptr_eq(&e, &c));
        assert_eq!(labels.usage(), (2, 2));
        drop((a, a2));
    }

    /// The option table's help says the default and the idle time these constants are.
    #[test]
    fn the_help_gives_these_defaults() {
        let help = |name: &str| {
            crate::options::OPTIONS
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.help)
                .unwrap_or_default()
        };
        assert!(help("prometheus-username-labels-max")
            .contains(&format!("[default: {DEFAULT_MAX_USERS}]")));
        assert!(help("prometheus-username-labels-max").contains(&format!("user=\"{OVERFLOW}\"")));
        assert_eq!(IDLE, Duration::from_secs(3600));
        assert!(help("prometheus-username-labels").contains("after an hour"));
    }

    #[test]
    fn a_full_table_sweeps_before_refusing() {
        let t0 = Instant::now();
        let labels = UserLabels::new(1, Duration::from_secs(10));
        drop(labels.handle("old", t0));
        // Seen unused by the sweep of this handle() (the table is full), kept: not idle yet.
        let x = labels.handle("new", t0 + Duration::from_secs(5));
        assert_eq!(labels.usage(), (1, 1));
        drop(x);
        // Ten seconds after it was first seen unused, "old" makes room.
        let y = labels.handle("newer", t0 + Duration::from_secs(16));
        assert_eq!(labels.usage(), (1, 1));
        assert_eq!(labels.snapshot(t0 + Duration::from_secs(16))[0].0, "newer");
        drop(y);
    }
}
