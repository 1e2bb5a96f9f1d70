//! The evaluation budget (`evaluation_timeout`): every NOTIFY is answered within it, counted
//! from the moment the NOTIFY was decoded (queueing included, as HAProxy's `timeout
//! processing` counts).
//!
//! A watchdog thread (`spoa-budget`) keeps the deadlines in the order they were set (one
//! budget for all, so that is also the order they come due). At a deadline still owed, it
//! answers for the evaluation with the failure verdict (the `error` variable, which the
//! documented HAProxy configuration denies on), counts it
//! (`spoa_evaluations_failed_closed_total{reason="deadline"}`) and logs it with the
//! transaction id; then it tells the pool ([`Pool::overran`]), so that a runaway stops holding
//! a thread's place. A NOTIFY still queued at its deadline is skipped when its turn comes.
//!
//! The evaluation itself cannot be stopped (libmodsecurity has no way to interrupt a
//! transaction): it runs to its end on its thread and its answer is dropped. The engine's own
//! limits (`lastcall_modsec::crs`) bound how long that can be.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use spop::TypedData;

use super::ack::Ticket;
use super::handler::{Vars, AGENT_ERROR};
use super::pool::{Overran, Pool, Tracked};
use crate::metrics::Metrics;

/// The failure verdict: the `error` variable, and the transaction id when known.
pub(crate) fn failure_vars(id: Option<&str>) -> Vars {
    let mut vars = Vars::new();
    if let Some(id) = id {
        vars.push(("id", TypedData::String(id.to_owned())));
    }
    vars.push(("error", TypedData::Int64(AGENT_ERROR)));
    vars
}

/// One NOTIFY's answer, owed once: by its evaluation, or at the deadline by the watchdog. A
/// guard of the NOTIFY's record ([`super::notify`]), made by [`Budget::owe`] only; the record
/// and the watchdog share it.
pub(super) struct Owed {
    ticket: Mutex<Option<Ticket>>,
    tracked: Arc<Tracked>,
    id: Option<String>,
    received: Instant,
}

impl std::fmt::Debug for Owed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owed")
            .field("id", &self.id)
            .field("answered", &self.answered())
            .finish_non_exhaustive()
    }
}

impl Owed {
    /// Whether the answer went out already (or nobody waits for it any more).
    pub(super) fn answered(&self) -> bool {
        self.ticket.lock().as_ref().is_none_or(Ticket::abandoned)
    }

    /// Sends the answer; false if it was sent already (the deadline passed).
    pub(super) fn send(&self, vars: &Vars) -> bool {
        let ticket = self.ticket.lock().take();
        match ticket {
            Some(t) => {
                t.send(vars);
                true
            }
            None => false,
        }
    }

    /// The transaction id, if the handler named one.
    fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// When the NOTIFY was decoded.
    pub(super) fn received(&self) -> Instant {
        self.received
    }
}

struct Queue {
    due: VecDeque<(Instant, Arc<Owed>)>,
    closed: bool,
}

struct Inner {
    timeout: Duration,
    queue: Mutex<Queue>,
    wake: Condvar,
    pool: Arc<Pool>,
    metrics: Arc<Metrics>,
}

/// The budget and its watchdog thread (stopped when this is dropped).
pub(crate) struct Budget {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

impl Budget {
    /// A budget of `timeout` per NOTIFY over `pool`'s evaluations.
    pub(crate) fn new(timeout: Duration, pool: Arc<Pool>, metrics: Arc<Metrics>) -> Budget {
        let inner = Arc::new(Inner {
            timeout,
            queue: Mutex::new(Queue {
                due: VecDeque::new(),
                closed: false,
            }),
            wake: Condvar::new(),
            pool,
            metrics,
        });
        let watchdog = Arc::clone(&inner);
        let spawned = std::thread::Builder::new()
            .name("spoa-budget".into())
            .spawn(move || watch(&watchdog));
        if let Err(e) = spawned {
            // Then nothing answers at the deadline: evaluations answer when they end.
            tracing::error!("cannot start the evaluation budget's watchdog thread: {e}");
        }
        Budget { inner }
    }

    /// Starts the clock for one NOTIFY's answer (`id`: its transaction id, for the log;
    /// `tracked`: its job's state, for [`Pool::overran`] at the deadline). Called by
    /// [`super::notify`] only, when the NOTIFY is queued.
    pub(super) fn owe(
        &self,
        ticket: Ticket,
        id: Option<String>,
        received: Instant,
        tracked: Arc<Tracked>,
    ) -> Arc<Owed> {
        let owed = Arc::new(Owed {
            ticket: Mutex::new(Some(ticket)),
            tracked,
            id,
            received,
        });
        let mut q = self.inner.queue.lock();
        let was_empty = q.due.is_empty();
        q.due
            .push_back((received + self.inner.timeout, Arc::clone(&owed)));
        drop(q);
        // Deadlines come in order: the watchdog only needs waking from an empty queue.
        if was_empty {
            self.inner.wake.notify_one();
        }
        owed
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        self.inner.queue.lock().closed = true;
        self.inner.wake.notify_one();
    }
}

fn watch(inner: &Inner) {
    let mut q = inner.queue.lock();
    loop {
        if q.closed {
            return;
        }
        let now = Instant::now();
        match q.due.front() {
            Some((at, _)) if *at <= now => {
                if let Some((_, owed)) = q.due.pop_front() {
                    drop(q);
                    expire(inner, &owed);
                    q = inner.queue.lock();
                }
            }
            Some((at, _)) => {
                let wait = *at - now;
                inner.wake.wait_for(&mut q, wait);
            }
            None => {
                inner.wake.wait(&mut q);
            }
        }
    }
}

/// The deadline of `owed` has come: answer for it if that is still owed.
fn expire(inner: &Inner, owed: &Owed) {
    if owed.answered() || !owed.send(&failure_vars(owed.id())) {
        return;
    }
    inner.metrics.failed_closed("deadline");
    let budget = inner.timeout;
    let tx = owed.id().unwrap_or("-");
    match inner.pool.overran(&owed.tracked) {
        Overran::NotRunning => tracing::warn!(
            tx, ?budget,
            "evaluation not started within evaluation_timeout (every evaluation thread busy): answered with the error variable"
        ),
        Overran::Replaced => tracing::warn!(
            tx, ?budget, overrunning = inner.pool.overrunning(),
            "evaluation over evaluation_timeout: answered with the error variable; it runs on to its end, a thread took its place"
        ),
        Overran::Kept => tracing::warn!(
            tx, ?budget, overrunning = inner.pool.overrunning(),
            "evaluation over evaluation_timeout: answered with the error variable; max_overruns are running already, so it keeps its thread"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ack::AckSink;
    use crate::engine::pool::Work;
    use lastcall_spop_proto::frame::{decode_agent_frame, AgentFrame};
    use prometheus_client::metrics::gauge::Gauge;
    use std::sync::mpsc;

    fn held(sink: &Arc<AckSink>) -> Vec<AgentFrame> {
        let Some((bytes, _)) = sink.take_held() else {
            return Vec::new();
        };
        let mut buf = bytes::BytesMut::from(&bytes[..]);
        let mut out = Vec::new();
        while let Some(f) = decode_agent_frame(&mut buf).unwrap() {
            out.push(f);
        }
        out
    }

    fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let end = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < end, "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A runaway is answered at its deadline with the error variable, a thread takes its
    /// place (the job behind it runs), and its own late answer is dropped; with
    /// `max_overruns` runaways running the pool is saturated.
    #[test]
    fn a_runaway_is_answered_and_replaced() {
        let pool = Arc::new(Pool::new(1, 1, "test-budget", Gauge::default()));
        let metrics = Arc::new(Metrics::default());
        let budget = Budget::new(
            Duration::from_millis(100),
            Arc::clone(&pool),
            Arc::clone(&metrics),
        );
        let sink = AckSink::held_only();
        let inflight = Gauge::default();
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let tracked = Arc::new(Tracked::default());
        let slow = budget.owe(
            sink.ticket(1, 1, 16380, &inflight),
            Some("SLOWTX".into()),
            Instant::now(),
            Arc::clone(&tracked),
        );
        let late = Arc::clone(&slow);
        let (done_tx, done_rx) = mpsc::channel();
        pool.try_submit(Work::tracked(
            move || {
                let _ = gate_rx.recv_timeout(Duration::from_secs(20));
                let _ = done_tx.send(late.send(&vec![("verdict", TypedData::Int64(1))]));
            },
            tracked,
        ))
        .unwrap();
        wait_for("the deadline answered", || {
            metrics.failed_closed_with("deadline") == 1
        });
        match &held(&sink)[..] {
            [AgentFrame::Ack(1, 1, vars)] => {
                assert_eq!(vars[0], ("id".into(), TypedData::String("SLOWTX".into())));
                assert_eq!(vars[1], ("error".into(), TypedData::Int64(AGENT_ERROR)));
            }
            other => panic!("{other:?}"),
        }
        assert!(pool.saturated());
        assert_eq!(pool.overrunning(), 1);
        // The one thread is held by the runaway, yet the next job runs.
        let (ran_tx, ran_rx) = mpsc::channel();
        pool.try_submit(Work::new(move || {
            let _ = ran_tx.send(());
        }))
        .unwrap();
        ran_rx.recv_timeout(Duration::from_secs(20)).unwrap();
        gate_tx.send(()).unwrap();
        assert!(!done_rx.recv_timeout(Duration::from_secs(20)).unwrap());
        wait_for("the runaway counted out", || pool.overrunning() == 0);
        assert!(!pool.saturated());
        assert!(held(&sink).is_empty(), "the late answer is dropped");
        assert!(pool.shutdown(Duration::from_secs(20)));
    }

    /// A NOTIFY still queued at its deadline is answered, then skipped.
    #[test]
    fn a_queued_notify_is_answered_at_its_deadline() {
        let pool = Arc::new(Pool::new(1, 0, "test-budget", Gauge::default()));
        let metrics = Arc::new(Metrics::default());
        let budget = Budget::new(
            Duration::from_millis(50),
            Arc::clone(&pool),
            Arc::clone(&metrics),
        );
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        pool.try_submit(Work::new(move || {
            let _ = gate_rx.recv_timeout(Duration::from_secs(20));
        }))
        .unwrap();
        let sink = AckSink::held_only();
        let inflight = Gauge::default();
        let tracked = Arc::new(Tracked::default());
        let owed = budget.owe(
            sink.ticket(7, 1, 16380, &inflight),
            None,
            Instant::now(),
            Arc::clone(&tracked),
        );
        let queued = Arc::clone(&owed);
        let (ran_tx, ran_rx) = mpsc::channel();
        pool.try_submit(Work::tracked(
            move || {
                let _ = ran_tx.send(queued.answered());
            },
            tracked,
        ))
        .unwrap();
        // The ACK itself, not `answered()`: the ticket is taken before its ACK is written.
        let mut frames = Vec::new();
        wait_for("answered while queued", || {
            frames.extend(held(&sink));
            !frames.is_empty()
        });
        assert!(owed.answered());
        assert!(
            matches!(
                &frames[..],
                [AgentFrame::Ack(7, 1, vars)] if vars == &[("error".to_string(), TypedData::Int64(AGENT_ERROR))]
            ),
            "{frames:?}"
        );
        gate_tx.send(()).unwrap();
        assert!(ran_rx.recv_timeout(Duration::from_secs(20)).unwrap());
        assert!(pool.shutdown(Duration::from_secs(20)));
    }
}
