//! The cap on bytes held for SPOP frames, all connections together (`max_buffered_bytes`):
//! each connection's read buffer (an [`Account`]), and each decoded NOTIFY until its
//! evaluation ends (a [`Charge`]).
//!
//! A read buffer grows only while the total stays under the cap. When it would not, the
//! connection stops reading (the kernel's buffers and then TCP push back on the peer) until
//! bytes are released; and if a frame has been unfinished for [`EVICT_AGE`] somewhere, the
//! oldest such frame is dropped: its connection gets AGENT-DISCONNECT status 13 (resource
//! allocation error). HAProxy writes frames whole, so a frame still unfinished after a second
//! is most likely a stranger's that will never end; the evaluations in flight release their
//! bytes within their budget.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use lastcall_spop_proto::conn::Pressure;
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long a frame must have been unfinished before it may be dropped to make room.
pub(crate) const EVICT_AGE: Duration = Duration::from_secs(1);

/// Told to a connection whose unfinished frame is dropped.
#[derive(Debug, Default)]
pub(crate) struct Evict {
    flag: AtomicBool,
    notify: Notify,
}

impl Evict {
    /// Whether the connection was told to drop its frame.
    pub(crate) fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Resolves once the connection is told to drop its frame.
    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }

    fn set(&self) {
        self.flag.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

/// The shared cap.
#[derive(Debug)]
pub(crate) struct Memory {
    cap: usize,
    used: AtomicUsize,
    released: Notify,
    /// Unfinished frames, oldest first: (since, connection) → its eviction flag.
    partials: Mutex<BTreeMap<(Instant, u64), Arc<Evict>>>,
    next_id: AtomicU64,
    gauge: Gauge,
}

/// What a connection under pressure may do ([`Memory::relieve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Relief {
    /// A frame was dropped somewhere: try again.
    Evicted,
    /// Wait for bytes to be released, or until this instant (when the oldest unfinished
    /// frame becomes old enough to drop).
    Wait(Option<Instant>),
}

impl Memory {
    /// A cap of `cap` bytes; `gauge` shows the bytes held (`spoa_buffered_bytes`).
    pub(crate) fn new(cap: usize, gauge: Gauge) -> Arc<Memory> {
        Arc::new(Memory {
            cap,
            used: AtomicUsize::new(0),
            released: Notify::new(),
            partials: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            gauge,
        })
    }

    /// Bytes held now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// The cap.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    fn add(&self, n: usize) {
        let now = self.used.fetch_add(n, Ordering::SeqCst) + n;
        self.gauge.set(i64::try_from(now).unwrap_or(i64::MAX));
    }

    fn sub(&self, n: usize) {
        if n == 0 {
            return;
        }
        let now = self.used.fetch_sub(n, Ordering::SeqCst).saturating_sub(n);
        self.gauge.set(i64::try_from(now).unwrap_or(i64::MAX));
        self.released.notify_waiters();
    }

    /// Takes `n` more bytes if the total stays within the cap.
    fn try_add(&self, n: usize) -> bool {
        let mut cur = self.used.load(Ordering::SeqCst);
        loop {
            let Some(next) = cur.checked_add(n).filter(|&t| t <= self.cap) else {
                return false;
            };
            match self
                .used
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    self.gauge.set(i64::try_from(next).unwrap_or(i64::MAX));
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// A new connection's account.
    pub(crate) fn account(self: &Arc<Self>) -> Account {
        Account {
            mem: Arc::clone(self),
            held: 0,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            partial: None,
            evict: Arc::new(Evict::default()),
        }
    }

    /// Bytes of a decoded NOTIFY, held until the charge is dropped (not checked against
    /// the cap: they were in a read buffer a moment ago). Called by [`super::notify`] only,
    /// when the NOTIFY is received.
    pub(super) fn charge(self: &Arc<Self>, bytes: usize) -> Charge {
        self.add(bytes);
        Charge {
            mem: Arc::clone(self),
            bytes,
        }
    }

    /// Resolves when bytes are released.
    pub(crate) async fn released(&self) {
        self.released.notified().await;
    }

    /// Under pressure, connection `me` (unfinished since `mine`, if at all) asks for room:
    /// the oldest unfinished frame elsewhere is dropped if it has been unfinished for
    /// [`EVICT_AGE`] and is older than `me`'s own.
    pub(crate) fn relieve(&self, me: u64, mine: Option<Instant>, now: Instant) -> Relief {
        let mut partials = self.partials.lock();
        let oldest = partials
            .iter()
            .find(|((_, id), _)| *id != me)
            .map(|(k, v)| (*k, Arc::clone(v)));
        let Some(((since, id), evict)) = oldest else {
            return Relief::Wait(None);
        };
        if mine.is_some_and(|m| m <= since) {
            // Ours is the oldest: wait for the others to finish or be released.
            return Relief::Wait(None);
        }
        if now.saturating_duration_since(since) < EVICT_AGE {
            return Relief::Wait(Some(since + EVICT_AGE));
        }
        partials.remove(&(since, id));
        drop(partials);
        evict.set();
        Relief::Evicted
    }
}

/// One connection's read buffer, as the cap counts it. Released when dropped.
#[derive(Debug)]
pub(crate) struct Account {
    mem: Arc<Memory>,
    held: usize,
    id: u64,
    partial: Option<Instant>,
    evict: Arc<Evict>,
}

impl Account {
    /// This connection's id among the accounts.
    #[cfg(test)]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Since when its buffer has held an unfinished frame, as last told.
    #[cfg(test)]
    pub(crate) fn partial(&self) -> Option<Instant> {
        self.partial
    }

    /// Its eviction flag.
    pub(crate) fn evict(&self) -> &Arc<Evict> {
        &self.evict
    }

    /// Makes `want` bytes of free room in `buf` (this account's read buffer) for the next
    /// read, within the cap; under pressure, what the connection may do instead (an
    /// unfinished frame elsewhere dropped: ask again; or wait).
    pub(crate) fn room(&mut self, buf: &mut BytesMut, want: usize) -> Result<(), Pressure> {
        if buf.capacity() - buf.len() >= want {
            return Ok(());
        }
        let needed = buf.len() + want;
        if self.try_grow(needed) {
            buf.reserve(want);
            // `reserve` may double the allocation: beyond what the cap grants, the buffer is
            // built anew at the size asked for.
            if !self.try_grow(buf.capacity()) {
                let mut exact = BytesMut::with_capacity(needed);
                exact.extend_from_slice(buf);
                *buf = exact;
            }
            self.set(buf.capacity());
            return Ok(());
        }
        match self.mem.relieve(self.id, self.partial, Instant::now()) {
            Relief::Evicted => Err(Pressure::Evicted),
            Relief::Wait(at) => Err(Pressure::Wait(at.map(Instant::into_std))),
        }
    }

    /// Whether the buffer may grow to `bytes` (taken from the cap if so).
    pub(crate) fn try_grow(&mut self, bytes: usize) -> bool {
        if bytes <= self.held {
            return true;
        }
        if self.mem.try_add(bytes - self.held) {
            self.held = bytes;
            true
        } else {
            false
        }
    }

    /// The buffer now holds `bytes` (its capacity): counted as is, even above the cap (a
    /// reservation may round up).
    pub(crate) fn set(&mut self, bytes: usize) {
        match bytes.cmp(&self.held) {
            std::cmp::Ordering::Greater => self.mem.add(bytes - self.held),
            std::cmp::Ordering::Less => self.mem.sub(self.held - bytes),
            std::cmp::Ordering::Equal => {}
        }
        self.held = bytes;
    }

    /// The buffer holds an unfinished frame since `since` (or none).
    pub(crate) fn set_partial(&mut self, since: Option<Instant>) {
        if since == self.partial {
            return;
        }
        let mut partials = self.mem.partials.lock();
        if let Some(old) = self.partial {
            partials.remove(&(old, self.id));
        }
        if let Some(new) = since {
            partials.insert((new, self.id), Arc::clone(&self.evict));
        }
        self.partial = since;
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        self.set_partial(None);
        self.set(0);
    }
}

/// A decoded NOTIFY's bytes, released when dropped (its evaluation ended or was skipped). A
/// guard of the NOTIFY's record ([`super::notify`]), made by [`Memory::charge`] only.
#[derive(Debug)]
pub(super) struct Charge {
    mem: Arc<Memory>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.mem.sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_holds_and_bytes_come_back() {
        let mem = Memory::new(1000, Gauge::default());
        let mut a = mem.account();
        let mut b = mem.account();
        assert!(a.try_grow(600));
        assert!(!b.try_grow(500), "600 + 500 > 1000");
        assert!(b.try_grow(400));
        let c = mem.charge(100);
        assert_eq!(mem.used(), 1100, "charges are transfers, not checked");
        drop(c);
        a.set(100);
        assert_eq!(mem.used(), 500);
        drop(a);
        drop(b);
        assert_eq!(mem.used(), 0);
    }

    #[test]
    fn the_oldest_unfinished_frame_is_dropped_once_old_enough() {
        let mem = Memory::new(1000, Gauge::default());
        let t0 = Instant::now();
        let mut old = mem.account();
        let mut young = mem.account();
        let me = mem.account();
        old.set_partial(Some(t0));
        young.set_partial(Some(t0 + Duration::from_millis(500)));
        assert_eq!(
            mem.relieve(me.id(), None, t0 + Duration::from_millis(100)),
            Relief::Wait(Some(t0 + EVICT_AGE))
        );
        // The oldest asking for room waits for the others.
        assert_eq!(
            mem.relieve(old.id(), old.partial(), t0 + EVICT_AGE * 2),
            Relief::Wait(None)
        );
        assert_eq!(mem.relieve(me.id(), None, t0 + EVICT_AGE), Relief::Evicted);
        assert!(old.evict().is_set());
        assert!(!young.evict().is_set());
        young.set_partial(None);
        assert_eq!(
            mem.relieve(me.id(), None, t0 + EVICT_AGE * 3),
            Relief::Wait(None)
        );
    }
}
