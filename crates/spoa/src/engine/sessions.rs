//! HAProxy's connections on the admin listener's `/sessions` (see [`lastcall::sessions`]) and
//! the table of `lastcall-spoa sessions`.
//!
//! A session is a handshaken SPOP connection (a health check is none): what the drain waits
//! for. Its id is unique for the process's life. Ending one says AGENT-DISCONNECT at once,
//! whatever it owes, as the deadline does (HAProxy fails the NOTIFYs it has in flight there,
//! and places the next ones on another connection).
//!
//! Each connection, in JSON (durations in seconds as floats, millisecond precision): `id`,
//! `peer` (HAProxy's address, or `unix`), `age_seconds` (since its HELLO), `notifies`
//! (NOTIFY frames received), `in_flight` (its evaluations queued or running),
//! `held_for_down` (whether its HAProxy holds the drain until it has marked the agent DOWN:
//! see `down`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use lastcall::sessions::{field, Column, SessionPage, SessionTable};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::down::Down;

/// One connection as the table sees it.
struct Entry {
    peer: String,
    ip: Option<IpAddr>,
    since: Instant,
    notifies: Arc<AtomicU64>,
    in_flight: Arc<dyn Fn() -> usize + Send + Sync>,
    end: Arc<Notify>,
}

/// The live connections, by id.
#[derive(Default)]
pub(crate) struct Connections {
    live: Mutex<BTreeMap<u64, Entry>>,
    next: AtomicU64,
}

/// A connection's place in [`Connections`]; dropping it removes it.
pub(crate) struct Registered {
    conns: Arc<Connections>,
    id: u64,
    /// NOTIFYs received, for the table.
    pub(crate) notifies: Arc<AtomicU64>,
    /// Told when the operator ends the connection.
    pub(crate) end: Arc<Notify>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.conns.live.lock().remove(&self.id);
    }
}

impl Connections {
    /// A handshaken connection from `peer` (`ip` its address, `None` over a Unix socket);
    /// `in_flight` counts its evaluations.
    pub(crate) fn add(
        self: &Arc<Self>,
        peer: String,
        ip: Option<IpAddr>,
        in_flight: Arc<dyn Fn() -> usize + Send + Sync>,
    ) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let notifies = Arc::new(AtomicU64::new(0));
        let end = Arc::new(Notify::new());
        self.live.lock().insert(
            id,
            Entry {
                peer,
                ip,
                since: Instant::now(),
                notifies: Arc::clone(&notifies),
                in_flight,
                end: Arc::clone(&end),
            },
        );
        Registered {
            conns: Arc::clone(self),
            id,
            notifies,
            end,
        }
    }
}

/// The table `/sessions` shows: the connections, and the holds of their HAProxies.
pub(crate) struct Table {
    pub(crate) conns: Arc<Connections>,
    pub(crate) down: Arc<Down>,
}

impl Table {
    fn to_json(&self, id: u64, e: &Entry, now: Instant) -> Value {
        json!({
            "id": id,
            "peer": e.peer,
            "age_seconds": now.saturating_duration_since(e.since).as_millis() as f64 / 1000.0,
            "notifies": e.notifies.load(Ordering::Relaxed),
            "in_flight": (e.in_flight)(),
            "held_for_down": self.down.holding(e.ip),
        })
    }
}

impl SessionTable for Table {
    fn page(&self, after: u64, limit: usize) -> SessionPage {
        let now = Instant::now();
        let live = self.conns.live.lock();
        let mut rest = live.range(after.saturating_add(1)..);
        let sessions = rest
            .by_ref()
            .take(limit)
            .map(|(id, e)| self.to_json(*id, e, now))
            .collect();
        SessionPage {
            total: live.len() as u64,
            sessions,
            more: after < u64::MAX && rest.next().is_some(),
        }
    }

    fn end(&self, id: u64) -> Option<Value> {
        let live = self.conns.live.lock();
        let e = live.get(&id)?;
        e.end.notify_one();
        tracing::info!(peer = %e.peer, id, "SPOP connection ended by the operator (DELETE /sessions): AGENT-DISCONNECT now, as at the deadline");
        Some(self.to_json(id, e, Instant::now()))
    }
}

/// The columns of `lastcall-spoa sessions`.
pub const COLUMNS: &[Column] = &[
    ("ID", |v| field(v, "id")),
    ("PEER", |v| field(v, "peer")),
    ("AGE", |v| field(v, "age_seconds")),
    ("NOTIFIES", |v| field(v, "notifies")),
    ("IN_FLIGHT", |v| field(v, "in_flight")),
    ("HELD_FOR_DOWN", |v| {
        match v.get("held_for_down").and_then(Value::as_bool) {
            Some(true) => "yes".into(),
            Some(false) => "no".into(),
            None => "-".into(),
        }
    }),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_in_id_order_and_ends_by_id() {
        let conns = Arc::new(Connections::default());
        let table = Table {
            conns: Arc::clone(&conns),
            down: Arc::default(),
        };
        let regs: Vec<Registered> = (0..3)
            .map(|i| {
                conns.add(
                    format!("127.0.0.1:{}", 4000 + i),
                    Some(IpAddr::from([127, 0, 0, 1])),
                    Arc::new(move || i),
                )
            })
            .collect();
        regs[1].notifies.fetch_add(5, Ordering::Relaxed);
        let page = table.page(0, 2);
        assert_eq!(page.total, 3);
        assert!(page.more);
        assert_eq!(page.sessions[0]["id"], 1);
        assert_eq!(page.sessions[1]["peer"], "127.0.0.1:4001");
        assert_eq!(page.sessions[1]["notifies"], 5);
        assert_eq!(page.sessions[1]["in_flight"], 1);
        assert_eq!(page.sessions[1]["held_for_down"], false);
        let rest = table.page(2, 2);
        assert_eq!(rest.sessions.len(), 1);
        assert!(!rest.more);
        assert!(table.end(2).is_some());
        assert!(table.end(99).is_none());
        assert!(table.end_user("x").is_none(), "no users");
        drop(regs);
        assert_eq!(table.page(0, 10).total, 0);
    }
}
