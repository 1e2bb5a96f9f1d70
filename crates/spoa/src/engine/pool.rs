//! The evaluation pool: exactly `workers` long-lived threads fed by one bounded FIFO queue.
//!
//! The threads bound how many evaluations run at once, all connections together; the queue
//! holds what waits for a thread. A connection submits without waiting while the queue has
//! room (an atomic operation, no hand-off), and waits asynchronously, in order, when it is
//! full. A sleeping thread is woken only when a job needs it, so a busy pool takes jobs
//! back to back without any park/unpark.
//!
//! Long-lived threads and a queue of our own, rather than a semaphore in front of tokio's
//! blocking pool: with the permit taken first, that pool's queue is always empty when an
//! evaluation finishes, so every evaluation costs a thread park/unpark plus an async wake
//! (docs/benchmarks.md, *Optimisations*).

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Queue slots per thread.
const QUEUE_PER_WORKER: usize = 256;

/// One unit of work: runs once on a pool thread.
pub type Work = Box<dyn FnOnce() + Send + 'static>;

/// Room for one job in the queue, reserved while the queue was full.
#[derive(Debug)]
pub struct Slot(OwnedSemaphorePermit);

/// Waits (in order with every other waiter) for a [`Slot`]; `None` if the pool is gone.
pub type SlotFuture = Pin<Box<dyn Future<Output = Option<Slot>> + Send>>;

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
    /// Evaluations running.
    running: usize,
    /// Most evaluations at once (the threads started).
    limit: usize,
    /// Threads alive.
    alive: usize,
    closed: bool,
}

struct Inner {
    state: Mutex<State>,
    /// Signalled when a job is queued or the pool closes.
    ready: Condvar,
    /// Signalled when a thread exits.
    exited: Condvar,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// The pool. Dropping it closes the queue (threads finish their job and exit; what was
/// queued is dropped).
pub struct Pool {
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
    /// Starts `workers` threads (at least one) named `name-N`.
    pub fn new(workers: usize, name: &str) -> Pool {
        let workers = workers.max(1);
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            ready: Condvar::new(),
            exited: Condvar::new(),
        });
        let mut started = 0;
        for n in 0..workers {
            let inner2 = Arc::clone(&inner);
            inner.lock().alive += 1;
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{n}"))
                .spawn(move || work(&inner2));
            match spawned {
                Ok(_) => started += 1,
                Err(e) => {
                    inner.lock().alive -= 1;
                    tracing::error!("cannot start evaluation thread {n}: {e}");
                }
            }
        }
        if started == 0 {
            // Every job is then dropped at once: its connection answers with an error.
            tracing::error!("no evaluation thread could start");
        }
        inner.lock().limit = started;
        Pool {
            inner,
            slots: Arc::new(Semaphore::new(workers * QUEUE_PER_WORKER)),
            workers: started,
        }
    }

    /// Threads started.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Queues `work` if there is room; gives it back otherwise.
    pub fn try_submit(&self, work: Work) -> Result<(), Work> {
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(slot) => {
                self.push(Job { work, _slot: slot });
                Ok(())
            }
            Err(_) => Err(work),
        }
    }

    /// Waits for room in the queue (keep the future to keep the place in line).
    pub fn slot(&self) -> SlotFuture {
        let slots = Arc::clone(&self.slots);
        Box::pin(async move { slots.acquire_owned().await.ok().map(Slot) })
    }

    /// Queues `work` in a reserved slot.
    pub fn submit(&self, slot: Slot, work: Work) {
        self.push(Job {
            work,
            _slot: slot.0,
        });
    }

    fn push(&self, job: Job) {
        let mut st = self.inner.lock();
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

    /// Closes the queue (queued jobs are dropped) and waits up to `within` for the threads
    /// to finish the jobs they are running. True when all have exited.
    pub fn shutdown(&self, within: Duration) -> bool {
        let mut st = self.inner.lock();
        st.closed = true;
        st.jobs.clear();
        self.inner.ready.notify_all();
        let end = Instant::now() + within;
        while st.alive > 0 {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = match self.inner.exited.wait_timeout(st, left) {
                Ok((g, _)) => g,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        true
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let mut st = self.inner.lock();
        st.closed = true;
        st.jobs.clear();
        drop(st);
        self.inner.ready.notify_all();
    }
}

fn work(inner: &Inner) {
    let mut ran = false;
    loop {
        let work = {
            let mut st = inner.lock();
            if ran {
                st.running -= 1;
            }
            loop {
                if st.running < st.limit {
                    if let Some(Job { work, _slot }) = st.jobs.pop_front() {
                        st.running += 1;
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
                st = match inner.ready.wait(st) {
                    Ok(g) => g,
                    Err(poisoned) => poisoned.into_inner(),
                };
                st.idle -= 1;
            }
        };
        // A panicking evaluation drops its ACK ticket (the connection answers with the error
        // variable) and the thread goes on.
        if std::panic::catch_unwind(AssertUnwindSafe(work)).is_err() {
            tracing::error!("evaluation panicked");
        }
        ran = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn runs_every_job_on_its_own_threads() {
        let pool = Pool::new(2, "test-eval");
        let (tx, rx) = mpsc::channel();
        for i in 0..100 {
            let tx = tx.clone();
            let work: Work = Box::new(move || {
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
        let pool = Pool::new(2, "test-eval");
        let running = Arc::new(Mutex::new((0usize, 0usize)));
        let (tx, rx) = mpsc::channel();
        let boom: Work = Box::new(|| panic!("boom"));
        assert!(pool.try_submit(boom).is_ok());
        for _ in 0..20 {
            let running = Arc::clone(&running);
            let tx = tx.clone();
            let work: Work = Box::new(move || {
                {
                    let mut r = running.lock().unwrap();
                    r.0 += 1;
                    r.1 = r.1.max(r.0);
                }
                std::thread::sleep(Duration::from_millis(2));
                running.lock().unwrap().0 -= 1;
                let _ = tx.send(());
            });
            assert!(pool.try_submit(work).is_ok());
        }
        for _ in 0..20 {
            rx.recv_timeout(Duration::from_secs(20)).unwrap();
        }
        let max = running.lock().unwrap().1;
        assert!((1..=2).contains(&max), "{max}");
        assert_eq!(pool.workers(), 2);
        assert!(pool.shutdown(Duration::from_secs(20)));
    }

    #[tokio::test]
    async fn a_full_queue_waits_for_room() {
        let pool = Arc::new(Pool::new(1, "test-eval"));
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        let gate: Work = Box::new(move || {
            let _ = gate_rx.recv_timeout(Duration::from_secs(20));
        });
        assert!(pool.try_submit(gate).is_ok());
        // Wait until the thread took the gate job (its slot is free again).
        let end = Instant::now() + Duration::from_secs(20);
        while {
            let st = pool.inner.lock();
            st.idle > 0 || !st.jobs.is_empty()
        } {
            assert!(Instant::now() < end);
            tokio::task::yield_now().await;
        }
        for _ in 0..QUEUE_PER_WORKER {
            let d = done_tx.clone();
            let work: Work = Box::new(move || {
                let _ = d.send(());
            });
            assert!(pool.try_submit(work).is_ok());
        }
        let d = done_tx.clone();
        let extra: Work = Box::new(move || {
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
