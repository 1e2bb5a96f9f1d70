//! Per-user traffic (coturn's `prometheus-username-labels`): a handle the I/O layer gives
//! each allocation when it is created ([`Server::set_user_traffic`](crate::Server::set_user_traffic)),
//! shared by the allocations of one user, counted as their data is relayed. The data path
//! adds to the handle it already holds: no lookup by name per datagram.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Packets and bytes each way, as coturn's `turn_traffic_*` families count them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficCounts {
    /// Datagrams (or frames) received from the client (`turn_traffic_rcvp`).
    pub client_packets_in: u64,
    /// Their bytes (`turn_traffic_rcvb`).
    pub client_bytes_in: u64,
    /// Datagrams sent to the client (`turn_traffic_sentp`).
    pub client_packets_out: u64,
    /// Their bytes (`turn_traffic_sentb`).
    pub client_bytes_out: u64,
    /// Datagrams received from peers (`turn_traffic_peer_rcvp`).
    pub peer_packets_in: u64,
    /// Their bytes (`turn_traffic_peer_rcvb`).
    pub peer_bytes_in: u64,
    /// Datagrams sent to peers (`turn_traffic_peer_sentp`).
    pub peer_packets_out: u64,
    /// Their bytes (`turn_traffic_peer_sentb`).
    pub peer_bytes_out: u64,
}

/// One user's traffic counters, shared (`Arc`) by that user's allocations and whoever
/// exports them; relaxed atomics, so a scrape reads them without the core's lock.
#[derive(Debug, Default)]
pub struct UserTraffic {
    c: [AtomicU64; 8],
}

impl UserTraffic {
    /// What was counted so far.
    pub fn get(&self) -> TrafficCounts {
        let v = |i: usize| self.c[i].load(Relaxed);
        TrafficCounts {
            client_packets_in: v(0),
            client_bytes_in: v(1),
            client_packets_out: v(2),
            client_bytes_out: v(3),
            peer_packets_in: v(4),
            peer_bytes_in: v(5),
            peer_packets_out: v(6),
            peer_bytes_out: v(7),
        }
    }

    /// Adds `t` (what the kernel fast path relayed for this user's routes).
    pub fn add(&self, t: &TrafficCounts) {
        let all = [
            t.client_packets_in,
            t.client_bytes_in,
            t.client_packets_out,
            t.client_bytes_out,
            t.peer_packets_in,
            t.peer_bytes_in,
            t.peer_packets_out,
            t.peer_bytes_out,
        ];
        for (c, v) in self.c.iter().zip(all) {
            if v > 0 {
                c.fetch_add(v, Relaxed);
            }
        }
    }

    /// A client's datagram of `bytes` relayed to a peer as `payload` bytes.
    pub(crate) fn to_peer(&self, bytes: usize, payload: usize) {
        self.c[0].fetch_add(1, Relaxed);
        self.c[1].fetch_add(bytes as u64, Relaxed);
        self.c[6].fetch_add(1, Relaxed);
        self.c[7].fetch_add(payload as u64, Relaxed);
    }

    /// A peer's datagram of `payload` bytes relayed to the client as `bytes` bytes.
    pub(crate) fn to_client(&self, payload: usize, bytes: usize) {
        self.c[4].fetch_add(1, Relaxed);
        self.c[5].fetch_add(payload as u64, Relaxed);
        self.c[2].fetch_add(1, Relaxed);
        self.c[3].fetch_add(bytes as u64, Relaxed);
    }
}

/// Gives the handle of a user (the allocation's USERNAME) when an allocation is created.
pub type UserTrafficFn = Box<dyn FnMut(&str) -> std::sync::Arc<UserTraffic> + Send>;
