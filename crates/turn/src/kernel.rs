//! `--kernel-relay`: the daemon's side of the kernel fast path ([`lastcall_turn_kernel`]).
//!
//! At start the program is attached to the interfaces that carry the UDP listening and relay
//! addresses; if the kernel, the process's privileges or the build refuse it, one warning
//! says why and every datagram keeps going through user space. Then the core's route
//! changes ([`lastcall_turn_proto::fastpath`]) are taken out under the core's lock, in the
//! order the core made them, and applied to the maps once that lock is released (map updates
//! are system calls), one caller at a time so that order holds across threads. The routes'
//! counters join the live traffic counters (`turn_traffic_*`), and have their own metrics.
//!
//! With `prometheus-username-labels`, each installed route keeps its allocation's user
//! traffic handle (taken from the core when the route change is taken, not per datagram);
//! what a route relayed is added to that handle before each scrape and, finally, just before
//! the route is removed, so a user's counts include the kernel's and never go back.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use lastcall_turn_kernel::{KernelRelay, RouteStats, Totals};
use lastcall_turn_proto::{ClientAddr, Counters, RouteChange, Server, TrafficCounts, UserTraffic};
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// A route change, with the user traffic handle of an installed route's allocation.
type Change = (RouteChange, Option<Arc<UserTraffic>>);

/// A route, as the program keys it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum RouteKey {
    Channel(ClientAddr, u16),
    Permission(ClientAddr, IpAddr),
}

/// A route's user, and what of the route's counters was added to it so far.
struct Owner {
    traffic: Arc<UserTraffic>,
    counted: RouteStats,
}

/// The attached program, and the route changes not applied yet.
pub(crate) struct Kernel {
    relay: KernelRelay,
    pending: Mutex<Vec<Change>>,
    /// Held while changes are applied, so that they are applied in order.
    applying: Mutex<Vec<Change>>,
    /// The installed routes whose allocations have a user traffic handle.
    owners: Mutex<HashMap<RouteKey, Owner>>,
}

impl Kernel {
    /// Starts the fast path for the listening and relay addresses `ips`, or logs why not.
    pub(crate) fn start(ips: &[IpAddr]) -> Option<Kernel> {
        match KernelRelay::start(ips) {
            Ok(relay) => {
                tracing::info!(interfaces = ?relay.interfaces(),
                    "kernel fast path on: the data of UDP allocations (ChannelData, Send and Data indications) is relayed in the kernel");
                Some(Kernel {
                    relay,
                    pending: Mutex::new(Vec::new()),
                    applying: Mutex::new(Vec::new()),
                    owners: Mutex::new(HashMap::new()),
                })
            }
            Err(e) => {
                tracing::warn!(
                    "kernel-relay: the kernel fast path is off, relaying in user space: {e}"
                );
                None
            }
        }
    }

    /// Takes the core's route changes (under the core's lock: no system call).
    pub(crate) fn take(&self, server: &mut Server) {
        let mut first = server.poll_route();
        if first.is_none() {
            return;
        }
        let mut pending = self.pending.lock();
        while let Some(change) = first.take().or_else(|| server.poll_route()) {
            let traffic = match &change {
                RouteChange::Install(r) => server.user_traffic_of(&r.client),
                RouteChange::InstallPermission(r) => server.user_traffic_of(&r.client),
                RouteChange::Remove { .. } | RouteChange::RemovePermission { .. } => None,
            };
            pending.push((change, traffic));
        }
    }

    /// Applies the changes taken so far, in order (the core's lock is not held).
    pub(crate) fn apply(&self) {
        if self.pending.lock().is_empty() {
            return;
        }
        let mut batch = self.applying.lock();
        std::mem::swap(&mut *batch, &mut *self.pending.lock());
        for (change, traffic) in batch.drain(..) {
            let key = key_of(&change);
            let removed = matches!(
                change,
                RouteChange::Remove { .. } | RouteChange::RemovePermission { .. }
            );
            if removed {
                // What the route relayed since the last scrape, before its counters go.
                let mut owners = self.owners.lock();
                if let Some(mut owner) = owners.remove(&key) {
                    self.count(key, &mut owner);
                }
            }
            self.relay.apply(&change);
            if let Some(traffic) = traffic {
                self.owners.lock().entry(key).or_insert(Owner {
                    traffic,
                    counted: RouteStats::default(),
                });
            }
        }
    }

    /// Adds what the route `key` relayed since `owner.counted` to its user.
    fn count(&self, key: RouteKey, owner: &mut Owner) {
        let now = match key {
            RouteKey::Channel(client, channel) => self.relay.route_stats(&client, channel),
            RouteKey::Permission(client, peer) => self.relay.permission_stats(&client, peer),
        };
        let Some(now) = now else { return };
        owner.traffic.add(&since(&now, &owner.counted));
        owner.counted = now;
    }

    /// When each client with a kernel route last sent through it.
    pub(crate) fn client_activity(
        &self,
    ) -> Vec<(lastcall_turn_proto::ClientAddr, std::time::Instant)> {
        self.relay.client_activity()
    }

    /// Adds what the routes relayed since the last call to their users' traffic counters
    /// (`prometheus-username-labels`): before each scrape.
    pub(crate) fn sync_user_traffic(&self) {
        let mut owners = self.owners.lock();
        for (key, owner) in owners.iter_mut() {
            self.count(*key, owner);
        }
    }

    /// What the program relayed.
    pub(crate) fn totals(&self) -> Totals {
        self.relay.totals()
    }
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("relay", &self.relay)
            .finish_non_exhaustive()
    }
}

/// The route a change is about.
fn key_of(change: &RouteChange) -> RouteKey {
    match change {
        RouteChange::Install(r) => RouteKey::Channel(r.client, r.channel),
        RouteChange::Remove {
            client, channel, ..
        } => RouteKey::Channel(*client, *channel),
        RouteChange::InstallPermission(r) => RouteKey::Permission(r.client, r.peer),
        RouteChange::RemovePermission { client, peer, .. } => RouteKey::Permission(*client, *peer),
    }
}

/// What a route relayed between `before` and `now`, as a user's traffic (a counter below
/// its earlier value was started again: all of it is new).
fn since(now: &RouteStats, before: &RouteStats) -> TrafficCounts {
    let d = |n: u64, b: u64| if n >= b { n - b } else { n };
    let up = d(now.to_peer_packets, before.to_peer_packets);
    let down = d(now.to_client_packets, before.to_client_packets);
    TrafficCounts {
        client_packets_in: up,
        client_bytes_in: d(now.to_peer_wire_bytes, before.to_peer_wire_bytes),
        peer_packets_out: up,
        peer_bytes_out: d(now.to_peer_bytes, before.to_peer_bytes),
        peer_packets_in: down,
        peer_bytes_in: d(now.to_client_bytes, before.to_client_bytes),
        client_packets_out: down,
        client_bytes_out: d(now.to_client_wire_bytes, before.to_client_wire_bytes),
    }
}

/// Adds what the kernel relayed to the core's traffic counters: a client's datagram (its
/// ChannelData or Send indication, framing included) is sent to the peer as the data alone,
/// and the other way round.
pub(crate) fn add_traffic(c: &mut Counters, t: &Totals) {
    c.client_packets_in += t.to_peer_packets;
    c.client_bytes_in += t.to_peer_wire_bytes;
    c.peer_packets_out += t.to_peer_packets;
    c.peer_bytes_out += t.to_peer_bytes;
    c.peer_packets_in += t.to_client_packets;
    c.peer_bytes_in += t.to_client_bytes;
    c.client_packets_out += t.to_client_packets;
    c.client_bytes_out += t.to_client_wire_bytes;
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Direction {
    direction: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Kind {
    kind: &'static str,
}

/// The fast path's own metrics, read at each scrape.
#[derive(Debug)]
pub(crate) struct KernelMetrics(pub(crate) std::sync::Arc<Kernel>);

impl Collector for KernelMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let k = &self.0;
        let t = k.totals();
        for (name, help, to_peer, to_client) in [
            (
                "lastcall_turn_kernel_relayed_packets",
                "Datagrams relayed by the kernel fast path (to_peer: client ChannelData and Send indications; to_client: peer datagrams).",
                t.to_peer_packets,
                t.to_client_packets,
            ),
            (
                "lastcall_turn_kernel_relayed_bytes",
                "Application data bytes relayed by the kernel fast path.",
                t.to_peer_bytes,
                t.to_client_bytes,
            ),
        ] {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (direction, v) in [("to_peer", to_peer), ("to_client", to_client)] {
                ConstCounter::new(v).encode(e.encode_family(&Direction { direction })?)?;
            }
        }
        let mut e = encoder.encode_descriptor(
            "lastcall_turn_kernel_handed_on",
            "Datagrams of a kernel route the fast path left to the daemon (expired: past the route's expiry; gso: a same-host sender's GSO batch, several datagrams in one packet; unhandled: too big, no direct route).",
            None,
            MetricType::Counter,
        )?;
        for (reason, v) in [
            ("expired", t.expired),
            ("gso", t.gso),
            ("unhandled", t.unhandled),
        ] {
            ConstCounter::new(v).encode(e.encode_family(&Reason { reason })?)?;
        }
        let mut e = encoder.encode_descriptor(
            "lastcall_turn_kernel_framed",
            "Datagrams the kernel fast path relayed with other framing than plain ChannelData (send_indication: a client's Send indication; data_indication: written for a client without a channel; padded: ChannelData whose padding was dropped; hairpin: from one client of this server to another in one pass).",
            None,
            MetricType::Counter,
        )?;
        for (reason, v) in [
            ("send_indication", t.send_indications),
            ("data_indication", t.data_indications),
            ("padded", t.padded),
            ("hairpin", t.hairpin),
        ] {
            ConstCounter::new(v).encode(e.encode_family(&Kind { kind: reason })?)?;
        }
        let e = encoder.encode_descriptor(
            "lastcall_turn_kernel_routes",
            "Routes installed in the kernel fast path (channel bindings and permissions).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(k.relay.routes() as i64).encode(e)?;
        Ok(())
    }
}
