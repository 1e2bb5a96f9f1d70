//! [`Daemon`]: the serve entry. It starts the lifecycle in [`Phase::Starting`] (signals
//! handled from the first instant, readiness 503 until [`Daemon::ready`]), owns the accept
//! loops ([`Daemon::accept`]) and every task that must finish its goodbye
//! ([`Daemon::spawn`]), and owns the time after the exit decision: [`Daemon::serve`] waits
//! for those tasks, then runs the exit hooks ([`Daemon::on_exit`], blocking work such as an
//! evaluation pool or I/O threads), all by the instant the machine decided
//! ([`Machine::leave_by`](crate::machine::Machine::leave_by)): what is left of
//! `--drain-timeout` plus [`EXIT_GRACE`](crate::machine::EXIT_GRACE), or just `EXIT_GRACE`
//! after a forced exit. The deadline is the deadline: whatever still runs then is left
//! behind, and [`Served`] says so.
//!
//! ```no_run
//! # async fn demo(config: lastcall::TerminationConfig) {
//! use lastcall::{AcceptUntil, Daemon, PeerId};
//! let daemon = Daemon::start(config); // Starting: readiness 503
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! daemon.accept(listener, AcceptUntil::Refusing, |(stream, peer), mut watch| async move {
//!     let _session = watch.handle().session(PeerId::from(peer));
//!     // serve `stream`; return once `watch.is_exiting()` (after `watch.changed()`)
//! #   let _ = (stream, watch.changed().await);
//! });
//! daemon.ready(); // ports bound: readiness 200
//! daemon.serve().await.exit();
//! # }
//! ```

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use prometheus_client::registry::Registry;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::TerminationConfig;
use crate::lifecycle::{signal_stream, Decision, Handle, Lifecycle};
use crate::machine::{Outcome, Phase, Trigger};
use crate::watch::Watch;

/// How long an accept loop waits after a failed `accept` (out of file descriptors and the
/// like) before it tries again, instead of spinning.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A listener the [`Daemon`] can accept connections from.
pub trait Accept: Send + 'static {
    /// What one accepted connection is (a stream and its peer address, usually).
    type Conn: Send + 'static;

    /// Waits for the next connection. Must be cancel-safe (as tokio's listeners are): the
    /// accept loop drops it when the phase changes.
    fn accept(&mut self) -> impl Future<Output = io::Result<Self::Conn>> + Send;

    /// The listener in log lines (`127.0.0.1:9000`, `unix:///run/spoa.sock`).
    fn describe(&self) -> String;
}

impl Accept for tokio::net::TcpListener {
    type Conn = (tokio::net::TcpStream, SocketAddr);

    fn accept(&mut self) -> impl Future<Output = io::Result<Self::Conn>> + Send {
        tokio::net::TcpListener::accept(self)
    }

    fn describe(&self) -> String {
        self.local_addr()
            .map_or_else(|_| "tcp".to_string(), |a| a.to_string())
    }
}

impl Accept for tokio::net::UnixListener {
    type Conn = (tokio::net::UnixStream, tokio::net::unix::SocketAddr);

    fn accept(&mut self) -> impl Future<Output = io::Result<Self::Conn>> + Send {
        tokio::net::UnixListener::accept(self)
    }

    fn describe(&self) -> String {
        match self
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(|p| p.to_owned()))
        {
            Some(path) => format!("unix://{}", path.display()),
            None => "unix".to_string(),
        }
    }
}

/// When an accept loop stops accepting and closes its listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptUntil {
    /// At [`Phase::Refusing`] (or the exit): new connections are then refused by the kernel.
    /// For protocols with no polite way to refuse a connection (the echo example).
    Refusing,
    /// At the exit decision: while refusing, new connections are still accepted so that the
    /// protocol can refuse their work politely (SPOP's AGENT-DISCONNECT, TURN's 403/300).
    Exiting,
}

/// A blocking piece of work run after the exit decision.
struct Hook {
    name: &'static str,
    run: Box<dyn FnOnce(Duration) -> bool + Send>,
}

/// The serve entry (see the [module documentation](self)).
pub struct Daemon {
    handle: Handle,
    driver: JoinHandle<Decision>,
    tasks: Spawner,
    hooks: Vec<Hook>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("handle", &self.handle)
            .field("tasks", &self.tasks.live())
            .field(
                "hooks",
                &self.hooks.iter().map(|h| h.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Daemon {
    /// Starts the lifecycle in [`Phase::Starting`] with the real signals (SIGTERM, SIGINT,
    /// SIGQUIT, SIGUSR1, SIGHUP, SIGUSR2), handled from now on: a drain trigger while starting skips
    /// the shutdown delay, and with nothing live the exit is decided at once (watch
    /// [`Handle::exiting`] during long start-up work, then call [`serve`](Self::serve)).
    ///
    /// Panics outside a tokio runtime.
    ///
    /// Under a service manager that set `NOTIFY_SOCKET` (systemd's `Type=notify`) the
    /// lifecycle tells it `READY=1` when Starting ends, `STOPPING=1` when a drain starts and
    /// `STATUS=` what it waits for (`sd_notify(3)`).
    pub fn start(config: TerminationConfig) -> Daemon {
        Self::start_driver(config, signal_stream(), true)
    }

    /// [`start`](Self::start) with `events` in place of the real signals (tests, embedding).
    /// [`Handle::start_drain`] works as well.
    pub fn start_with<S>(config: TerminationConfig, events: S) -> Daemon
    where
        S: Stream<Item = Trigger> + Send + 'static,
    {
        Self::start_driver(config, Box::pin(events), false)
    }

    fn start_driver(
        config: TerminationConfig,
        events: crate::lifecycle::TriggerStream,
        notify: bool,
    ) -> Daemon {
        let mut lifecycle = Lifecycle::build(config, Phase::Starting);
        lifecycle.notify_service_manager = notify;
        let handle = lifecycle.handle();
        let driver = tokio::spawn(lifecycle.drive(events));
        Daemon {
            handle,
            driver,
            tasks: Spawner::default(),
            hooks: Vec::new(),
        }
    }

    /// The lifecycle's handle (sessions, phase, watches, the admin listener).
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Registers the `lastcall_*` metrics in the daemon's registry (see
    /// [`Lifecycle::register_metrics`]).
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.handle.register_metrics(registry);
    }

    /// The readiness latch ([`Handle::ready`]): Starting ends, `/readyz` answers 200. Call it
    /// once every listener is bound.
    pub fn ready(&self) {
        self.handle.ready();
    }

    /// Accepts connections from `listener` until `until`, then closes it. Each connection
    /// runs `serve(conn, watch)` as a tracked task: [`serve`](Self::serve) waits for it after
    /// the exit decision, so it must return soon after [`Watch::exiting`] becomes true.
    /// Sessions are the connection's business ([`Handle::session`] through
    /// [`Watch::handle`]): a connection need not be a session.
    pub fn accept<A, F, Fut>(&self, listener: A, until: AcceptUntil, serve: F)
    where
        A: Accept,
        F: Fn(A::Conn, Watch) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let tasks = self.tasks.clone();
        let handle = self.handle.clone();
        self.tasks
            .spawn(accept_loop(listener, until, serve, tasks, handle));
    }

    /// Runs `task` as a tracked task (it must return soon after the exit decision, e.g. a
    /// task holding a [`Watch`] that says its goodbye when [`Watch::exiting`]). Background
    /// chores that need no goodbye (timers, sweepers) are better spawned with plain
    /// `tokio::spawn`: a tracked task that never ends holds the exit until the deadline.
    pub fn spawn<Fut>(&self, task: Fut)
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// A cloneable spawner of tracked tasks, for code that starts them later (a connection
    /// task's helpers, a listener of the daemon's own).
    pub fn spawner(&self) -> Spawner {
        self.tasks.clone()
    }

    /// Adds blocking work to run after the exit decision, once the tracked tasks have ended
    /// (or the time is up), in the order added, each on a thread of its own. The hook is
    /// given the time left before the process must be gone and returns whether everything it
    /// waited for finished (`false`: something is left running, e.g. an evaluation that
    /// outlived the budget). A hook still running when the time is up is left behind.
    pub fn on_exit<F>(&mut self, name: &'static str, hook: F)
    where
        F: FnOnce(Duration) -> bool + Send + 'static,
    {
        self.hooks.push(Hook {
            name,
            run: Box::new(hook),
        });
    }

    /// Serves until the exit decision, then waits for the tracked tasks (and the answers to
    /// `POST /drain`), then runs the exit hooks, all by the machine's
    /// [`leave_by`](crate::machine::Machine::leave_by). Returns at once when everything
    /// ended sooner. Exit with [`Served::exit`].
    pub async fn serve(self) -> Served {
        let Daemon {
            handle,
            driver,
            tasks,
            hooks,
        } = self;
        let decision = match driver.await {
            Ok(decision) => decision,
            Err(err) => std::panic::resume_unwind(err.into_panic()),
        };
        let decided = Instant::now();
        let leave_by = decision.leave_by;
        let (tasks_left, ()) = tokio::join!(
            tasks.wait_all(leave_by),
            handle.admin_answers_sent(leave_by)
        );
        let mut hooks_unfinished = Vec::new();
        for hook in hooks {
            if !run_hook(hook.name, hook.run, leave_by).await {
                hooks_unfinished.push(hook.name);
            }
        }
        let served = Served {
            outcome: decision.outcome,
            tasks_left,
            hooks_unfinished,
            teardown: decided.elapsed(),
        };
        served.log();
        served
    }
}

/// Runs one exit hook on its own thread; true when it finished (cleanly) by `leave_by`.
async fn run_hook(
    name: &'static str,
    hook: Box<dyn FnOnce(Duration) -> bool + Send>,
    leave_by: Instant,
) -> bool {
    let budget = leave_by.saturating_duration_since(Instant::now());
    let (done_tx, done) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(format!("exit-{name}"))
        .spawn(move || {
            let _ = done_tx.send(hook(budget));
        });
    if let Err(err) = spawned {
        tracing::error!("exit hook {name}: cannot start a thread for it: {err}");
        return false;
    }
    match tokio::time::timeout_at(leave_by, done).await {
        Ok(Ok(finished)) => finished,
        Ok(Err(_)) => {
            tracing::error!("exit hook {name} panicked");
            false
        }
        Err(_) => false,
    }
}

/// Accepts until `until`, spawning `serve` per connection as a tracked task.
async fn accept_loop<A, F, Fut>(
    mut listener: A,
    until: AcceptUntil,
    serve: F,
    tasks: Spawner,
    handle: Handle,
) where
    A: Accept,
    F: Fn(A::Conn, Watch) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut watch = handle.watch();
    let stop = |w: &Watch| match until {
        AcceptUntil::Refusing => w.is_refusing(),
        AcceptUntil::Exiting => w.is_exiting(),
    };
    let name = listener.describe();
    while !stop(&watch) {
        tokio::select! {
            biased;
            _ = watch.changed() => {}
            accepted = listener.accept() => match accepted {
                Ok(conn) => tasks.spawn(serve(conn, handle.watch())),
                Err(err) => {
                    tracing::warn!("{name}: accept failed: {err}");
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                        _ = watch.changed() => {}
                    }
                }
            },
        }
    }
    drop(listener);
    if watch.is_exiting() {
        tracing::info!("listener closed ({name})");
    } else {
        tracing::info!("listener closed ({name}): new connections are refused");
    }
}

/// Spawns tracked tasks: [`Daemon::serve`] waits for them after the exit decision.
#[derive(Debug, Clone, Default)]
pub struct Spawner {
    live: Arc<watch::Sender<usize>>,
}

impl Spawner {
    /// Runs `task` on the runtime as a tracked task.
    pub fn spawn<Fut>(&self, task: Fut)
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.live.send_modify(|n| *n += 1);
        let guard = TaskGuard(self.live.clone());
        tokio::spawn(async move {
            let _guard = guard;
            task.await;
        });
    }

    /// Tracked tasks still running.
    pub fn live(&self) -> usize {
        *self.live.borrow()
    }

    /// Waits until every tracked task ended, or `until`; returns how many are left.
    async fn wait_all(&self, until: Instant) -> usize {
        let mut rx = self.live.subscribe();
        let _ = tokio::time::timeout_at(until, rx.wait_for(|n| *n == 0)).await;
        self.live()
    }
}

/// Counts a tracked task down when it ends (returns, panics or is dropped with the runtime).
struct TaskGuard(Arc<watch::Sender<usize>>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// How a [`Daemon`] ended: the lifecycle's [`Outcome`] and what the time after the exit
/// decision came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// Why the lifecycle ended (and its exit status).
    pub outcome: Outcome,
    /// Tracked tasks still running when the time was up.
    pub tasks_left: usize,
    /// Exit hooks that had not finished, or left something running, when the time was up.
    pub hooks_unfinished: Vec<&'static str>,
    /// Time from the exit decision to the return of [`Daemon::serve`].
    pub teardown: Duration,
}

impl Served {
    /// The process exit status ([`Outcome::exit_code`]).
    pub fn exit_code(&self) -> i32 {
        self.outcome.exit_code()
    }

    /// Whether every tracked task and exit hook finished in time.
    pub fn is_clean(&self) -> bool {
        self.tasks_left == 0 && self.hooks_unfinished.is_empty()
    }

    /// Exits the process with [`exit_code`](Self::exit_code), at once: without waiting for
    /// the runtime (and any thread left behind) to wind down.
    pub fn exit(&self) -> ! {
        std::process::exit(self.exit_code())
    }

    fn log(&self) {
        let ms = self.teardown.as_millis();
        if self.is_clean() {
            tracing::debug!("every task ended {ms} ms after the exit decision");
            return;
        }
        let mut left = Vec::new();
        if self.tasks_left > 0 {
            left.push(crate::machine::count(self.tasks_left as u64, "task"));
        }
        for name in &self.hooks_unfinished {
            left.push(format!("exit hook {name}"));
        }
        tracing::warn!(
            tasks_left = self.tasks_left,
            "leaving {ms} ms after the exit decision with {} still running (the deadline is the deadline)",
            left.join(", ")
        );
    }
}
