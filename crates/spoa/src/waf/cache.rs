//! Request transactions kept for their response check (`response_check: true`), by id,
//! each with its application's TTL, and bounded in number.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lastcall_modsec::Transaction;

use crate::config::apps::App;

/// A kept transaction, the application whose rules it runs, and what the response's log
/// lines need: how many of its matches the request already logged, the client and the URI.
pub(super) struct Kept {
    pub(super) tx: Transaction,
    pub(super) app: Arc<App>,
    pub(super) logged: usize,
    pub(super) client: String,
    pub(super) uri: String,
}

/// Transactions waiting for their response, by id, with a TTL and a bound.
#[derive(Default)]
pub(super) struct TxCache {
    pub(super) map: HashMap<String, (Instant, Kept)>,
    order: VecDeque<(Instant, String)>,
}

impl TxCache {
    pub(super) fn insert(
        &mut self,
        id: String,
        kept: Kept,
        ttl: Duration,
        limit: usize,
    ) -> Vec<Kept> {
        let mut evicted = Vec::new();
        while self.map.len() >= limit.max(1) {
            match self.pop_oldest() {
                Some(k) => evicted.push(k),
                None => break,
            }
        }
        let expiry = Instant::now() + ttl;
        if let Some((_, old)) = self.map.insert(id.clone(), (expiry, kept)) {
            evicted.push(old);
        }
        self.order.push_back((expiry, id));
        evicted
    }

    fn pop_oldest(&mut self) -> Option<Kept> {
        while let Some((_, id)) = self.order.pop_front() {
            if let Some((_, k)) = self.map.remove(&id) {
                return Some(k);
            }
        }
        None
    }

    pub(super) fn expire(&mut self, now: Instant) -> Vec<Kept> {
        let mut out = Vec::new();
        // TTLs differ per application, so the queue is not strictly ordered by expiry; this
        // frees what is due at the front and leaves the rest for the next sweep.
        while let Some((at, _)) = self.order.front() {
            if *at > now {
                break;
            }
            let Some((at, id)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&id).is_some_and(|(exp, _)| *exp == at) {
                if let Some((_, k)) = self.map.remove(&id) {
                    out.push(k);
                }
            }
        }
        if self.order.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.order
                .retain(|(at, id)| map.get(id).is_some_and(|(e, _)| e == at));
        }
        out
    }
}
