//! The evaluation pool: `workers` long-lived threads fed by one bounded FIFO queue.
//!
//! The threads bound how many evaluations run at once, all connections together; the queue
//! holds what waits for a thread. A connection submits without waiting while the queue has
//! room (an atomic operation, no hand-off), and waits asynchronously, in order, when it is
//! full. A sleeping thread is woken only when a job needs it, so a busy pool takes jobs
//! back to back without any park/unpark.
//!
//! An evaluation that outlives its budget ([`super::budget`]) is answered for by the
//! watchdog and no longer counts against `workers`: [`Pool::overran`] starts a thread in its
//! place, so a runaway never holds up the jobs behind it. At most `max_overruns` of them
//! at once; beyond that a runaway keeps its place (the pool is then [`saturated`], and the
//! connections answer new NOTIFYs at once instead of queueing them). A replacement thread
//! leaves when a job ends with more threads than `workers` plus the runaways still running.
//!
//! Long-lived threads and a queue of our own, rather than a semaphore in front of tokio's
//! blocking pool: with the permit taken first, that pool's queue is always empty when an
//! evaluation finishes, so every evaluation costs a thread park/unpark plus an async wake
//! (the profile in docs/benchmarks.md as of commit 10d56c9, *Where the agent's CPU goes*).
//!
//! Each connection counts its own evaluations queued or running ([`Evaluations`]): reading
//! pauses at its bound.
//!
//! [`saturated`]: Pool::saturated

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Queue slots per thread.
const QUEUE_PER_WORKER: usize = 256;

/// One unit of work: runs once on a pool thread.
pub(crate) struct Work {
    run: Box<dyn FnOnce() + Send + 'static>,
    tracked: Option<Arc<Tracked>>,
}

impl Work {
    /// Work the budget does not follow.
    #[cfg(test)]
    pub(crate) fn new(run: impl FnOnce() + Send + 'static) -> Work {
        Work {
            run: Box::new(run),
            tracked: None,
        }
    }

    /// Work whose state the budget's watchdog follows (see [`Pool::overran`]).
    pub(super) fn tracked(run: impl FnOnce() + Send + 'static, tracked: Arc<Tracked>) -> Work {
        Work {
            run: Box::new(run),
            tracked: Some(tracked),
        }
    }
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work").finish_non_exhaustive()
    }
}

/// Where a tracked job is; changed only under the pool's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobState {
    Queued,
    Running,
    /// Past its budget, moved out of `running`, a thread started in its place.
    Overrun,
    /// Past its budget with `max_overruns` already running: it keeps its place.
    Stuck,
    Done,
}

/// A job's state as the pool and the watchdog share it (queued at first). A guard of the
/// NOTIFY's record ([`super::notify`]), which makes it when the NOTIFY is queued; done when
/// its job ends on its thread.
#[derive(Debug)]
pub(super) struct Tracked(Mutex<JobState>);

impl Default for Tracked {
    fn default() -> Self {
        Tracked(Mutex::new(JobState::Queued))
    }
}

impl Tracked {
    fn get(&self) -> JobState {
        *self.0.lock()
    }

    fn set(&self, state: JobState) -> JobState {
        std::mem::replace(&mut *self.0.lock(), state)
    }
}

/// What [`Pool::overran`] did with a job past its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overran {
    /// It was not running (still queued, or finished).
    NotRunning,
    /// A thread was started in its place.
    Replaced,
    /// `max_overruns` were already running: it keeps its place.
    Kept,
}

/// Room for one job in the queue, reserved while the queue was full.
#[derive(Debug)]
pub(crate) struct Slot(OwnedSemaphorePermit);

/// Waits (in order with every other waiter) for a [`Slot`]; `None` if the pool is gone.
pub(crate) type SlotFuture = Pin<Box<dyn Future<Output = Option<Slot>> + Send>>;

struct Job {
    work: Work,
    /// The job's queue slot, given back when a thread takes the job.
    _slot: OwnedSemaphorePermit,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Threads waiting for a job.
    idle: usize,
    /// Evaluations running that count against `limit` (stuck runaways included).
    running: usize,
    /// Most evaluations at once (the threads started).
    limit: usize,
    /// Runaways moved out of `running` (a thread each was started in their place).
    overruns: usize,
    /// Runaways that kept their place.
    stuck: usize,
    /// Most runaways moved out at once.
    max_overruns: usize,
    /// Threads alive.
    alive: usize,
    closed: bool,
}

struct Inner {
    state: Mutex<State>,
    /// Signalled when a job is queued or the pool closes.
    ready: Condvar,
    /// Signalled when a thread exits or a job ends.
    exited: Condvar,
    name: String,
    /// Runaways running (`spoa_evaluations_overrunning`).
    overrunning: Gauge,
}

impl Inner {
    fn count_runaways(&self, st: &State) {
        self.overrunning
            .set(i64::try_from(st.overruns + st.stuck).unwrap_or(i64::MAX));
    }
}

/// The pool. Dropping it closes the queue (threads finish their job and exit; what was
/// queued is dropped).
pub(crate) struct Pool {
    inner: Arc<Inner>,
    slots: Arc<Semaphore>,
    workers: usize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Starts `workers` threads (at least one) named `name-N`; at most `max_overruns`
    /// runaways get a thread in their place; `overrunning` counts the runaways.
    pub(crate) fn new(workers: usize, max_overruns: usize, name: &str, overrunning: Gauge) -> Pool {
        let workers = workers.max(1);
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                max_overruns,
                ..State::default()
            }),
            ready: Condvar::new(),
            exited: Condvar::new(),
            name: name.to_owned(),
            overrunning,
        });
        let mut started = 0;
        for n in 0..workers {
            inner.state.lock().alive += 1;
            match spawn(&inner, n) {
                Ok(()) => started += 1,
                Err(e) => {
                    inner.state.lock().alive -= 1;
                    tracing::error!("cannot start evaluation thread {n}: {e}");
                }
            }
        }
        if started == 0 {
            // Every job is then dropped at once: its connection answers with an error.
            tracing::error!("no evaluation thread could start");
        }
        inner.state.lock().limit = started;
        Pool {
            inner,
            slots: Arc::new(Semaphore::new(workers * QUEUE_PER_WORKER)),
            workers: started,
        }
    }

    /// Threads started.
    #[cfg(test)]
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// Whether `max_overruns` runaways (at least one) are running: new jobs should not be
    /// queued.
    pub(crate) fn saturated(&self) -> bool {
        let st = self.inner.state.lock();
        let runaways = st.overruns + st.stuck;
        runaways > 0 && runaways >= st.max_overruns
    }

    /// Runaways running (replaced or not).
    pub(crate) fn overrunning(&self) -> usize {
        let st = self.inner.state.lock();
        st.overruns + st.stuck
    }

    /// Queues `work` if there is room; gives it back otherwise.
    pub(crate) fn try_submit(&self, work: Work) -> Result<(), Work> {
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(slot) => {
                self.push(Job { work, _slot: slot });
                Ok(())
            }
            Err(_) => Err(work),
        }
    }

    /// Waits for room in the queue (keep the future to keep the place in line).
    pub(crate) fn slot(&self) -> SlotFuture {
        let slots = Arc::clone(&self.slots);
        Box::pin(async move { slots.acquire_owned().await.ok().map(Slot) })
    }

    /// Queues `work` in a reserved slot.
    pub(crate) fn submit(&self, slot: Slot, work: Work) {
        self.push(Job {
            work,
            _slot: slot.0,
        });
    }

    fn push(&self, job: Job) {
        let mut st = self.inner.state.lock();
        if st.closed || st.alive == 0 {
            return;
        }
        st.jobs.push_back(job);
        // Jobs already queued have had a thread woken for them; wake one more only if an
        // idle thread is left over and the job may start.
        let wake = st.idle >= st.jobs.len() && st.running + st.jobs.len() <= st.limit;
        drop(st);
        if wake {
            self.inner.ready.notify_one();
        }
    }

    /// A job's budget ran out (its answer is sent): if it is running, it stops counting
    /// against `workers` and a thread is started in its place, unless `max_overruns` are
    /// running already.
    pub(crate) fn overran(&self, job: &Tracked) -> Overran {
        let mut st = self.inner.state.lock();
        if job.get() != JobState::Running {
            return Overran::NotRunning;
        }
        if st.closed || st.overruns >= st.max_overruns {
            job.set(JobState::Stuck);
            st.stuck += 1;
            self.inner.count_runaways(&st);
            return Overran::Kept;
        }
        job.set(JobState::Overrun);
        st.running -= 1;
        st.overruns += 1;
        st.alive += 1;
        self.inner.count_runaways(&st);
        let n = st.alive;
        drop(st);
        match spawn(&self.inner, n) {
            Ok(()) => {
                // The new thread takes what is queued, if anything.
                self.inner.ready.notify_one();
                Overran::Replaced
            }
            Err(e) => {
                tracing::error!("cannot start an evaluation thread for a runaway: {e}");
                let mut st = self.inner.state.lock();
                st.alive -= 1;
                if job.get() == JobState::Overrun {
                    job.set(JobState::Stuck);
                    st.overruns -= 1;
                    st.running += 1;
                    st.stuck += 1;
                }
                Overran::Kept
            }
        }
    }

    /// Closes the queue (queued jobs are dropped) and waits up to `within` for the threads
    /// to finish the jobs they are running; runaways (answered already) are not waited for.
    /// True when all threads have exited.
    pub(crate) fn shutdown(&self, within: Duration) -> bool {
        let mut st = self.inner.state.lock();
        st.closed = true;
        st.jobs.clear();
        self.inner.ready.notify_all();
        let end = Instant::now() + within;
        while st.alive > st.overruns + st.stuck {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.inner.exited.wait_for(&mut st, left);
        }
        st.alive == 0
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let mut st = self.inner.state.lock();
        st.closed = true;
        st.jobs.clear();
        drop(st);
        self.inner.ready.notify_all();
    }
}

/// A connection's evaluations queued or running (not its owed ACKs, which the `Conn`
/// counts: an evaluation answered at its deadline still runs, and its phase 5 runs after
/// its ACK).
#[derive(Debug, Default)]
pub(crate) struct Evaluations {
    n: AtomicUsize,
    done: tokio::sync::Notify,
}

/// One of a connection's evaluations, counted until dropped. A guard of the NOTIFY's record
/// ([`super::notify`]), made by [`Evaluations::start`] only.
pub(super) struct Running(Arc<Evaluations>);

impl Evaluations {
    /// One more evaluation, counted until its [`Running`] is dropped. Called by
    /// [`super::notify`] only, when the NOTIFY is queued.
    pub(super) fn start(evaluations: &Arc<Evaluations>) -> Running {
        evaluations.n.fetch_add(1, Ordering::SeqCst);
        Running(Arc::clone(evaluations))
    }

    pub(crate) fn count(&self) -> usize {
        self.n.load(Ordering::SeqCst)
    }

    /// Resolves when one of them has ended (since the last wait, if nobody waited).
    pub(crate) async fn ended(&self) {
        self.done.notified().await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.n.fetch_sub(1, Ordering::SeqCst);
        self.0.done.notify_one();
    }
}

fn spawn(inner: &Arc<Inner>, n: usize) -> std::io::Result<()> {
    let inner2 = Arc::clone(inner);
    std::thread::Builder::new()
        .name(format!("{}-{n}", inner.name))
        .spawn(move || work(&inner2))
        .map(|_| ())
}

fn work(inner: &Inner) {
    let mut ran: Option<Option<Arc<Tracked>>> = None;
    loop {
        let work = {
            let mut st = inner.state.lock();
            if let Some(tracked) = ran.take() {
                let state = tracked.as_ref().map(|t| t.set(JobState::Done));
                match state {
                    Some(JobState::Overrun) => st.overruns -= 1,
                    Some(JobState::Stuck) => {
                        st.stuck -= 1;
                        st.running -= 1;
                    }
                    _ => st.running -= 1,
                }
                inner.count_runaways(&st);
                inner.exited.notify_all();
                // A thread started for a runaway that has ended, or the runaway's own.
                if st.alive > st.limit + st.overruns {
                    st.alive -= 1;
                    drop(st);
                    inner.exited.notify_all();
                    return;
                }
            }
            loop {
                if st.running < st.limit {
                    if let Some(Job { work, _slot }) = st.jobs.pop_front() {
                        st.running += 1;
                        if let Some(t) = &work.tracked {
                            t.set(JobState::Running);
                        }
                        // The queue slot is given back under the lock, with the pop: whoever
                        // sees the queue empty also sees all its room free.
                        drop(_slot);
                        break work;
                    }
                }
                if st.closed {
                    st.alive -= 1;
                    drop(st);
                    inner.exited.notify_all();
                    return;
                }
                st.idle += 1;
                inner.ready.wait(&mut st);
                st.idle -= 1;
            }
        };
        let Work { run, tracked } = work;
        // A panicking evaluation drops its ACK ticket (the connection answers with the error
        // variable) and the thread goes on.
        if std::panic::catch_unwind(AssertUnwindSafe(run)).is_err() {
            tracing::error!("evaluation panicked");
        }
        ran = Some(tracked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn runs_every_job_on_its_own_threads() {
        let pool = Pool::new(2, 2, "test-eval", Gauge::default());
        let (tx, rx) = mpsc::channel();
        for i in 0..100 {
            let tx = tx.clone();
            let work = Work::new(move || {
                let name = std::thread::current().name().map(str::to_owned);
                let _ = tx.send((i, name));
            });
            assert!(pool.try_submit(work).is_ok());
        }
        let mut seen = Vec::new();
        for _ in 0..100 {
            let (i, name) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
            let name = name.unwrap_or_default();
            assert!(name.starts_with("test-eval-"), "{name}");
            seen.push(i);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        assert!(pool.shutdown(Duration::from_secs(20)));
    }

    #[test]
    fn at_most_workers_at_once_and_a_panic_keeps_the_thread() {
        let pool = Pool::new(2, 2, "test-eval", Gauge::default());
        let running = Arc::new(Mutex::new((0usize, 0usize)));
        let (tx, rx) = mpsc::channel();
        let boom = Work::new(|| panic!("boom"));
        assert!(pool.try_submit(boom).is_ok());
        for _ in 0..20 {
            let running = Arc::clone(&running);
            let tx = tx.clone();
            let work = Work::new(move || {
                {
                    let mut r = running.lock();
                    r.0 += 1;
                    r.1 = r.1.max(r.0);
                }
                std::thread::sleep(Duration::from_millis(2));
                running.lock().0 -= 1;
                let _ = tx.send(());
            });
            assert!(pool.try_submit(work).is_ok());
        }
        for _ in 0..20 {
            rx.recv_timeout(Duration::from_secs(20)).unwrap();
        }
        let max = running.lock().1;
        assert!((1..=2).contains(&max), "{max}");
        assert_eq!(pool.workers(), 2);
        assert!(pool.shutdown(Duration::from_secs(20)));
    }

    #[tokio::test]
    async fn a_full_queue_waits_for_room() {
        let pool = Arc::new(Pool::new(1, 1, "test-eval", Gauge::default()));
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        let gate = Work::new(move || {
            let _ = gate_rx.recv_timeout(Duration::from_secs(20));
        });
        assert!(pool.try_submit(gate).is_ok());
        // Wait until the thread took the gate job (its slot is free again).
        let end = Instant::now() + Duration::from_secs(20);
        while {
            let st = pool.inner.state.lock();
            st.idle > 0 || !st.jobs.is_empty()
        } {
            assert!(Instant::now() < end);
            tokio::task::yield_now().await;
        }
        for _ in 0..QUEUE_PER_WORKER {
            let d = done_tx.clone();
            let work = Work::new(move || {
                let _ = d.send(());
            });
            assert!(pool.try_submit(work).is_ok());
        }
        let d = done_tx.clone();
        let extra = Work::new(move || {
            let _ = d.send(());
        });
        let extra = pool.try_submit(extra).expect_err("the queue is full");
        let slot = pool.slot();
        gate_tx.send(()).unwrap();
        let slot = tokio::time::timeout(Duration::from_secs(20), slot)
            .await
            .unwrap()
            .unwrap();
        pool.submit(slot, extra);
        for _ in 0..=QUEUE_PER_WORKER {
            done_rx.recv_timeout(Duration::from_secs(20)).unwrap();
        }
        assert!(pool.shutdown(Duration::from_secs(20)));
    }
}
