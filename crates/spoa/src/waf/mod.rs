//! The WAF: `coraza-req` / `coraza-res` messages through libmodsecurity, and the variables
//! set back in HAProxy (coraza-spoa's names, types and meanings).
//!
//! Everything here is blocking and CPU-bound: the engine calls [`Waf`]'s
//! [`Handler::handle`] on an evaluation thread, never on an async worker, and asks
//! [`Handler::answer_inline`] first, on the connection task, whether the engine is needed at
//! all. The logging phase (phase 5) and a transaction's cleanup come back with the answer as
//! a `Later`, which the engine runs once the ACK is written, as nginx runs ModSecurity's log
//! phase after the response; so does the whole evaluation of a `detect-only` response.
//!
//! Each matched rule is one log line (the application's log, else the process log): its id,
//! message, matched data, severity, file, line and phase, with the transaction id; in a
//! JSON log in coraza-spoa's shape ([`crate::log`]).
//!
//! - the applications' compiled rules ([`Apps`], from `crate::config::apps`) are swapped
//!   all at once by a reload (`Waf::swap`; evaluations already running keep the rules they
//!   started with);
//! - `handler`: the engine's [`Handler`]: a NOTIFY's messages to their answer;
//! - `request`: a `coraza-req` evaluated, its transaction kept for the response check;
//! - `response`: a `coraza-res` evaluated on the transaction its request left;
//! - `matches`: what a transaction matched, as variables, metrics and log lines;
//! - `body`: whether HAProxy handed over the whole request body;
//! - `cache`: request transactions kept for their response check.
//!
//! [`Handler`]: crate::engine::Handler
//! [`Handler::handle`]: crate::engine::Handler::handle
//! [`Handler::answer_inline`]: crate::engine::Handler::answer_inline

mod body;
mod cache;
mod handler;
mod matches;
mod request;
mod response;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lastcall_modsec::{ModSecurity, Transaction};
use parking_lot::{Mutex, RwLock};

pub use crate::config::apps::directives_for;
pub(crate) use crate::config::apps::{App, Apps};
use cache::{Kept, TxCache};
pub use matches::is_attack_rule;

use crate::metrics::Metrics;

/// Runs the logging phase of finished request transactions, then frees them.
fn finish(txs: impl IntoIterator<Item = Transaction>) {
    for mut tx in txs {
        let _ = tx.process_logging();
    }
}

/// The WAF: the engine, the current applications, kept transactions and metrics.
pub struct Waf {
    engine: Arc<ModSecurity>,
    apps: RwLock<Arc<Apps>>,
    cache: Mutex<TxCache>,
    metrics: Arc<Metrics>,
    ids: AtomicU64,
    warn_not_waited: RateLimit,
}

/// At most one event per minute (the warnings a misconfigured HAProxy would repeat for every
/// request).
#[derive(Debug, Default)]
struct RateLimit(Mutex<Option<Instant>>);

impl RateLimit {
    /// Whether an event at `now` may be reported (and if so, the minute starts now).
    fn due(&self, now: Instant) -> bool {
        let mut last = self.0.lock();
        match *last {
            Some(t) if now.duration_since(t) < Duration::from_secs(60) => false,
            _ => {
                *last = Some(now);
                true
            }
        }
    }
}

impl std::fmt::Debug for Waf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waf").finish_non_exhaustive()
    }
}

impl Waf {
    /// A WAF running `apps`.
    pub fn new(engine: Arc<ModSecurity>, apps: Apps, metrics: Arc<Metrics>) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
        Waf {
            engine,
            apps: RwLock::new(Arc::new(apps)),
            cache: Mutex::new(TxCache::default()),
            metrics,
            ids: AtomicU64::new(seed | 1),
            warn_not_waited: RateLimit::default(),
        }
    }

    /// Replaces all applications at once. Evaluations in progress finish with the rules
    /// they started with; kept transactions keep theirs.
    pub(crate) fn swap(&self, apps: Apps) {
        let new = Arc::new(apps);
        *self.apps.write() = new;
    }

    fn current(&self) -> Arc<Apps> {
        Arc::clone(&self.apps.read())
    }

    /// Frees kept transactions whose TTL ran out (call periodically).
    pub fn expire(&self) {
        let expired = self.cache.lock().expire(Instant::now());
        self.finish_kept(expired);
    }

    fn finish_kept(&self, kept: Vec<Kept>) {
        for mut k in kept {
            self.metrics.transactions_expired.inc();
            // No verdict came: what the request matched is counted, no action.
            self.metrics.matched(k.tx.report());
            let _ = k.tx.process_logging();
        }
        self.count_cached();
    }

    fn count_cached(&self) {
        let n = self.cache.lock().map.len();
        self.metrics
            .transactions_cached
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    fn new_id(&self) -> String {
        // xorshift64*: unique enough for transaction ids (16 upper-case letters, like
        // coraza-spoa's generated ids).
        let mut x = self.ids.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let mut v = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (0..16)
            .map(|_| {
                let c = char::from(b'A' + (v % 26) as u8);
                v /= 26;
                if v == 0 {
                    v = x.rotate_left(17) | 1;
                }
                c
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
