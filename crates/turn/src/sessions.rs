//! The allocations on the admin listener's `/sessions` (see [`lastcall::sessions`]) and the
//! table of `lastcall-turn sessions`.
//!
//! A session is an allocation; its id is the core's, unique for the process's life. A page
//! is copied under the core's lock in O(log n + limit) (a page of 1,000 out of 100,000
//! allocations holds it for about 70 µs, one of 100 for 6 µs) and written to JSON after the
//! lock is released; ending one deletes it as the shutdown deadline does (its relay sockets closed,
//! its session guard dropped, a TCP/TLS client's connection closed), with reason `ended`.
//!
//! Each allocation, in JSON (durations in seconds as floats, millisecond precision):
//! `id`, `user` (empty when anonymous), `realm`, `transport` (`udp`, `tcp`, `tls`), `client`
//! (its address), `listener` (the server's address it talks to), `relayed` (relay
//! addresses), `origin` (or null), `age_seconds`, `idle_seconds` (since its client was last
//! heard), `expires_in_seconds` (lifetime left), `channels`, `permissions`,
//! `to_peer_datagrams` / `to_peer_bytes` (payloads relayed from the client to peers),
//! `from_peer_datagrams` / `from_peer_bytes` (from peers to the client), `kernel` (whether
//! the kernel fast path carries some of its traffic; what it carries is not in the counts).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lastcall::sessions::{field, Column, SessionPage, SessionTable};
use lastcall_turn_proto::AllocationInfo;
use serde_json::{json, Value};

use crate::shared::ServerState;

/// The allocations of a running server, as `/sessions` shows them.
pub struct Allocations {
    shared: Arc<ServerState>,
}

impl Allocations {
    /// The allocations of `shared`.
    pub fn new(shared: Arc<ServerState>) -> Allocations {
        Allocations { shared }
    }
}

impl SessionTable for Allocations {
    fn page(&self, after: u64, limit: usize) -> SessionPage {
        let now = Instant::now();
        let (total, realm, (page, more)) = self.shared.inspect(|s| {
            (
                s.allocation_count() as u64,
                s.config().realm.clone(),
                s.allocations_page(now, after, limit),
            )
        });
        SessionPage {
            total,
            sessions: page.iter().map(|a| to_json(a, &realm)).collect(),
            more,
        }
    }

    fn end(&self, id: u64) -> Option<Value> {
        let now = Instant::now();
        let (realm, ended) = self
            .shared
            .run(|s| (s.config().realm.clone(), s.end_allocation(now, id)));
        ended.map(|a| to_json(&a, &realm))
    }

    fn end_user(&self, user: &str) -> Option<Vec<Value>> {
        let now = Instant::now();
        let (realm, ended) = self
            .shared
            .run(|s| (s.config().realm.clone(), s.end_user(now, user)));
        Some(ended.iter().map(|a| to_json(a, &realm)).collect())
    }
}

/// Seconds with millisecond precision.
fn seconds(d: Duration) -> f64 {
    d.as_millis() as f64 / 1000.0
}

/// One allocation in the JSON of `/sessions`.
pub fn to_json(a: &AllocationInfo, realm: &str) -> Value {
    json!({
        "id": a.id,
        "user": a.username,
        "realm": realm,
        "transport": a.client.transport.as_str(),
        "client": a.client.client.to_string(),
        "listener": a.client.local.to_string(),
        "relayed": a.relays.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
        "origin": a.origin,
        "age_seconds": seconds(a.age),
        "idle_seconds": seconds(a.idle),
        "expires_in_seconds": seconds(a.expires_in),
        "channels": a.channels,
        "permissions": a.permissions,
        "to_peer_datagrams": a.traffic.to_peer_datagrams,
        "to_peer_bytes": a.traffic.to_peer_bytes,
        "from_peer_datagrams": a.traffic.from_peer_datagrams,
        "from_peer_bytes": a.traffic.from_peer_bytes,
        "kernel": a.fast_path,
    })
}

/// The columns of `lastcall-turn sessions`.
pub const COLUMNS: &[Column] = &[
    ("ID", |v| field(v, "id")),
    ("USER", |v| field(v, "user")),
    ("PROTO", |v| field(v, "transport")),
    ("CLIENT", |v| field(v, "client")),
    ("RELAYED", |v| field(v, "relayed")),
    ("AGE", |v| field(v, "age_seconds")),
    ("IDLE", |v| field(v, "idle_seconds")),
    ("CH", |v| field(v, "channels")),
    ("PERM", |v| field(v, "permissions")),
    ("TO_PEER", |v| traffic(v, "to_peer")),
    ("FROM_PEER", |v| traffic(v, "from_peer")),
    ("KERNEL", |v| {
        match v.get("kernel").and_then(Value::as_bool) {
            Some(true) => "yes".into(),
            Some(false) => "no".into(),
            None => "-".into(),
        }
    }),
];

/// `N pkt/B bytes` of one direction.
fn traffic(v: &Value, way: &str) -> String {
    format!(
        "{}/{}B",
        field(v, &format!("{way}_datagrams")),
        field(v, &format!("{way}_bytes"))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use lastcall_turn_proto::{AllocationTraffic, ClientAddr, RelayAddrs, Transport};

    #[test]
    fn json_names_and_units() {
        let a = AllocationInfo {
            id: 7,
            client: ClientAddr {
                transport: Transport::Tcp,
                client: "192.0.2.1:4000".parse().unwrap(),
                local: "10.0.0.1:3478".parse().unwrap(),
            },
            relays: RelayAddrs {
                v4: Some("10.0.0.1:50000".parse().unwrap()),
                v6: None,
            },
            username: "alice".into(),
            origin: None,
            age: Duration::from_millis(12_345),
            idle: Duration::from_micros(1_999),
            expires_in: Duration::from_secs(600),
            channels: 1,
            permissions: 2,
            traffic: AllocationTraffic {
                to_peer_datagrams: 3,
                to_peer_bytes: 300,
                from_peer_datagrams: 4,
                from_peer_bytes: 400,
            },
            fast_path: false,
        };
        let v = to_json(&a, "example.org");
        assert_eq!(
            v,
            json!({"id": 7, "user": "alice", "realm": "example.org", "transport": "tcp",
                "client": "192.0.2.1:4000", "listener": "10.0.0.1:3478",
                "relayed": ["10.0.0.1:50000"], "origin": null, "age_seconds": 12.345,
                "idle_seconds": 0.001, "expires_in_seconds": 600.0, "channels": 1,
                "permissions": 2, "to_peer_datagrams": 3, "to_peer_bytes": 300,
                "from_peer_datagrams": 4, "from_peer_bytes": 400, "kernel": false})
        );
        let mut out = Vec::new();
        lastcall::sessions::write_table(&mut out, COLUMNS, &[v]).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("ID  USER   PROTO  CLIENT"), "{text}");
        assert!(text.contains("3/300B   4/400B     no"), "{text}");
    }
}
