//! The lifecycle driver: a thin tokio task around [`Machine`] that listens to signals (or a
//! stream of [`Trigger`]s), the readiness latch, session counts and the clock, publishes the
//! phase to every [`Handle`] and [`Watch`](crate::Watch), logs, keeps the metrics, and returns the
//! [`Outcome`] when it is time to exit.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use futures::{Stream, StreamExt};
use parking_lot::{Mutex, MutexGuard};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::{OnSigterm, TerminationConfig};
use crate::machine::{Action, Input, Machine, Outcome, Phase, Trigger, EXIT_GRACE};
use crate::metrics::Metrics;

/// Who a session belongs to, for the distinct-peer count: usually the client's IP address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerId(PeerKey);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum PeerKey {
    Ip(IpAddr),
    Name(Arc<str>),
}

impl PeerId {
    /// A peer known by name (a Unix socket client, a tenant, ...).
    pub fn named(name: &str) -> Self {
        PeerId(PeerKey::Name(Arc::from(name)))
    }
}

impl From<IpAddr> for PeerId {
    fn from(ip: IpAddr) -> Self {
        PeerId(PeerKey::Ip(ip.to_canonical()))
    }
}

impl From<SocketAddr> for PeerId {
    /// The address without the port: peers are hosts.
    fn from(addr: SocketAddr) -> Self {
        PeerId::from(addr.ip())
    }
}

impl From<std::net::Ipv4Addr> for PeerId {
    fn from(ip: std::net::Ipv4Addr) -> Self {
        PeerId::from(IpAddr::V4(ip))
    }
}

impl From<std::net::Ipv6Addr> for PeerId {
    fn from(ip: std::net::Ipv6Addr) -> Self {
        PeerId::from(IpAddr::V6(ip))
    }
}

/// The published state, read by handles, watches and the admin listener.
#[derive(Debug, Clone)]
pub(crate) struct State {
    pub(crate) phase: Phase,
    pub(crate) exiting: bool,
    /// A hold is left ([`Handle::hold`]).
    pub(crate) held: bool,
    drain: Option<DrainInfo>,
    outcome: Option<Outcome>,
}

#[derive(Debug, Clone)]
struct DrainInfo {
    trigger: Trigger,
    started_at: SystemTime,
    started: Instant,
    deadline_at: SystemTime,
    deadline: Instant,
}

/// Live sessions, distinct peers and holds ([`Handle::hold`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    sessions: u64,
    peers: u64,
    holds: u64,
}

impl Counts {
    fn input(self) -> Input {
        Input::Sessions {
            sessions: self.sessions,
            peers: self.peers,
            holds: self.holds,
        }
    }
}

/// What handles send to the driver.
#[derive(Debug, Clone, Copy)]
enum Event {
    Trigger(Trigger),
    Ready,
}

/// What the driver, every handle and every watch share: the configuration, the published
/// state and counts, the sessions per peer, the driver's inbox and the metrics.
struct Hub {
    config: TerminationConfig,
    state: watch::Sender<State>,
    counts: watch::Sender<Counts>,
    /// Sessions per peer. `parking_lot`'s mutex: no poisoning, and no code under it can
    /// panic half-way (one insert or remove).
    peers: Mutex<HashMap<PeerId, u64>>,
    reloads: watch::Sender<u64>,
    events: mpsc::UnboundedSender<Event>,
    metrics: Metrics,
    metrics_registered: AtomicBool,
    /// Admin connections that carried an accepted `POST /drain` and are still open.
    admin_drain_requests: watch::Sender<usize>,
    /// What `/sessions` lists and ends ([`Handle::provide_sessions`]).
    sessions: parking_lot::RwLock<Option<Arc<dyn crate::sessions::SessionTable>>>,
}

impl Hub {
    fn peers(&self) -> MutexGuard<'_, HashMap<PeerId, u64>> {
        self.peers.lock()
    }

    /// Adds `delta` to the holds and tells the watches whether one is left, when that
    /// changed (a connection may say goodbye differently once nothing outside may send
    /// work). Under the peers' lock, so that concurrent changes publish in order.
    fn change_holds(&self, delta: i64) {
        let _order = self.peers();
        self.counts
            .send_modify(|c| c.holds = c.holds.saturating_add_signed(delta));
        let held = self.counts.borrow().holds > 0;
        self.state.send_if_modified(|s| {
            let changed = s.held != held;
            s.held = held;
            changed
        });
    }

    fn publish_counts(&self, peers: &HashMap<PeerId, u64>, delta_sessions: i64) {
        let peer_count = peers.len() as u64;
        self.counts.send_modify(|c| {
            c.sessions = c.sessions.saturating_add_signed(delta_sessions);
            c.peers = peer_count;
        });
        let c = *self.counts.borrow();
        self.metrics
            .sessions
            .set(i64::try_from(c.sessions).unwrap_or(i64::MAX));
        self.metrics
            .peers
            .set(i64::try_from(c.peers).unwrap_or(i64::MAX));
    }
}

pub(crate) type TriggerStream = Pin<Box<dyn Stream<Item = Trigger> + Send>>;

/// The exit decision, as the driver returns it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decision {
    pub(crate) outcome: Outcome,
    /// By when the process must be gone ([`Machine::leave_by`]).
    pub(crate) leave_by: Instant,
}

/// Owns the termination state machine: hand out [`Handle`]s, then [`run_with`](Self::run_with)
/// it on the caller's triggers (tests, embedding in a process that handles signals itself).
///
/// A daemon uses [`Daemon`](crate::Daemon), which drives a `Lifecycle` itself on the real
/// signals, with the Starting phase, accept loops and a bounded exit.
pub struct Lifecycle {
    shared: Arc<Hub>,
    events: mpsc::UnboundedReceiver<Event>,
    initial: Phase,
    /// Tell systemd (`NOTIFY_SOCKET`) what happens: the real daemon's lifecycle only.
    pub(crate) notify_service_manager: bool,
}

impl Lifecycle {
    /// A lifecycle in `initial` (Serving, or Starting for [`Daemon`](crate::Daemon)).
    pub(crate) fn build(config: TerminationConfig, initial: Phase) -> Self {
        let (events_tx, events) = mpsc::unbounded_channel();
        let metrics = Metrics::default();
        metrics.drain_phase.set(initial.metric_value());
        metrics
            .drain_timeout
            .set(config.drain_timeout.as_secs_f64());
        let shared = Arc::new(Hub {
            config,
            state: watch::Sender::new(State {
                phase: initial,
                exiting: false,
                held: false,
                drain: None,
                outcome: None,
            }),
            counts: watch::Sender::new(Counts::default()),
            peers: Mutex::new(HashMap::new()),
            reloads: watch::Sender::new(0),
            events: events_tx,
            metrics,
            metrics_registered: AtomicBool::new(false),
            admin_drain_requests: watch::Sender::new(0),
            sessions: parking_lot::RwLock::new(None),
        });
        Lifecycle {
            shared,
            events,
            initial,
            notify_service_manager: false,
        }
    }

    /// A lifecycle that never installs signal handlers, for [`run_with`](Self::run_with)
    /// (tests, embedding in a process that handles signals itself).
    pub fn without_signals(config: TerminationConfig) -> Self {
        Self::build(config, Phase::Serving)
    }

    /// A handle for the daemon's tasks and the admin listener.
    pub fn handle(&self) -> Handle {
        Handle {
            shared: self.shared.clone(),
        }
    }

    /// Registers `lastcall_drain_phase`, `lastcall_sessions`, `lastcall_peers`,
    /// `lastcall_sessions_refused_total`, `lastcall_reloads_total`,
    /// `lastcall_drain_duration_seconds`, `lastcall_drain_timeout_seconds` and
    /// `lastcall_drain_deadline_timestamp_seconds` in the daemon's registry. (If it is never called,
    /// the admin listener's `/metrics` adds them by itself.)
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.handle().register_metrics(registry);
    }

    /// Runs the lifecycle with `events` in place of the real signals (tests, embedding).
    /// [`Handle::start_drain`] works as well. The lifecycle keeps running when `events` ends.
    pub async fn run_with<S>(self, events: S) -> Outcome
    where
        S: Stream<Item = Trigger> + Send + 'static,
    {
        let shared = self.shared.clone();
        let decision = self.drive(Box::pin(events)).await;
        flush_admin(&shared, decision).await;
        decision.outcome
    }

    /// Feeds the machine until it decides to exit; publishes the decision and returns it.
    pub(crate) async fn drive(mut self, mut events: TriggerStream) -> Decision {
        let shared = self.shared.clone();
        let mut machine = match self.initial {
            Phase::Starting => Machine::starting(&shared.config),
            _ => Machine::new(&shared.config),
        };
        let mut counts = shared.counts.subscribe();
        let mut events_open = true;
        let mut input = counts.borrow_and_update().input();
        loop {
            let now = Instant::now();
            // Session counts first: a trigger must see the sessions live at its arrival,
            // even when both woke the task at once.
            if counts.has_changed().unwrap_or(false) {
                let counted = counts.borrow_and_update().input();
                let actions = machine.handle(now, counted);
                if let Some(decision) = self.apply(&machine, actions) {
                    return decision;
                }
            }
            let actions = machine.handle(now, input);
            if let Some(decision) = self.apply(&machine, actions) {
                return decision;
            }
            let wake = machine.next_wakeup();
            // The handles' events before the signals: a signal sent after `ready()` returned
            // (or after a log line written after it) finds the daemon serving, even when
            // both are pending at once.
            input = tokio::select! {
                biased;
                Some(event) = self.events.recv() => match event {
                    Event::Trigger(trigger) => Input::Trigger(trigger),
                    Event::Ready => Input::Ready,
                },
                event = events.next(), if events_open => match event {
                    Some(trigger) => Input::Trigger(trigger),
                    None => {
                        events_open = false;
                        Input::Tick
                    }
                },
                Ok(()) = counts.changed() => counts.borrow_and_update().input(),
                () = sleep_until(wake), if wake.is_some() => Input::Tick,
            };
        }
    }

    /// Logs and publishes the actions; returns the decision when it is time to exit.
    fn apply(&self, machine: &Machine, actions: Vec<Action>) -> Option<Decision> {
        let shared = &self.shared;
        let mut exit = None;
        for action in actions {
            if self.notify_service_manager {
                let c = *shared.counts.borrow();
                if let Some(notice) = crate::notify::notices(&action, c.sessions, c.peers) {
                    crate::notify::send(&notice);
                }
            }
            match &action {
                Action::DrainStarted { trigger, phase, .. } => {
                    let now = Instant::now();
                    let wall = SystemTime::now();
                    let (started, deadline) = match (machine.drain_started(), machine.deadline()) {
                        (Some((_, s)), Some(d)) => (s, d),
                        _ => (now, now + shared.config.drain_timeout),
                    };
                    let started_at = wall
                        .checked_sub(now.saturating_duration_since(started))
                        .unwrap_or(wall);
                    let info = DrainInfo {
                        trigger: *trigger,
                        started_at,
                        started,
                        deadline_at: started_at + deadline.saturating_duration_since(started),
                        deadline,
                    };
                    let deadline_unix = info
                        .deadline_at
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64());
                    shared.metrics.drain_deadline.set(deadline_unix);
                    // The drain and the phase it enters are published together: a reader
                    // between this action and its PhaseChanged (GET /drain, a handle) never
                    // sees a drain under way in Serving (seen: "phase": "serving" with
                    // /readyz already 503, on a loaded machine).
                    shared.metrics.drain_phase.set(phase.metric_value());
                    shared.state.send_modify(|s| {
                        s.drain = Some(info);
                        s.phase = *phase;
                    });
                    tracing::warn!(trigger = %trigger, policy = %shared.config.on_sigterm, "{action}");
                }
                Action::PhaseChanged { to, .. } => {
                    // Published before it is logged: whoever reads the line (an operator, a
                    // test) then finds /readyz and the metric already saying so.
                    shared.metrics.drain_phase.set(to.metric_value());
                    shared.state.send_modify(|s| s.phase = *to);
                    tracing::info!(phase = %to, "{action}");
                }
                Action::Reload { .. } => {
                    tracing::info!("{action}");
                    shared.metrics.reloads.inc();
                    shared.reloads.send_modify(|n| *n += 1);
                }
                Action::Exit(outcome) => {
                    if outcome.sessions_cut() > 0 {
                        tracing::warn!(
                            status = outcome.exit_code(),
                            cut = outcome.sessions_cut(),
                            "{action}"
                        );
                    } else {
                        tracing::info!(status = outcome.exit_code(), "{action}");
                    }
                    shared
                        .metrics
                        .drain_duration
                        .set(outcome.drain_duration.as_secs_f64());
                    shared.state.send_modify(|s| {
                        s.exiting = true;
                        s.outcome = Some(*outcome);
                    });
                    exit = Some(Decision {
                        outcome: *outcome,
                        leave_by: machine
                            .leave_by()
                            .unwrap_or_else(|| Instant::now() + EXIT_GRACE),
                    });
                }
                Action::AlreadyDraining { .. } | Action::Ignored { .. } => {
                    tracing::warn!("{action}");
                }
                Action::Progress { .. } => tracing::info!("{action}"),
            }
        }
        exit
    }
}

/// Lets the answers to `POST /drain` requests reach their clients (at most [`EXIT_GRACE`],
/// never past the decision's `leave_by`), so that a drain that ends at once does not leave
/// the caller without a response.
async fn flush_admin(shared: &Hub, decision: Decision) {
    let until = decision.leave_by.min(Instant::now() + EXIT_GRACE);
    wait_admin_answers(shared, until).await;
}

/// Waits until no accepted `POST /drain` connection is open, or `until`.
async fn wait_admin_answers(shared: &Hub, until: Instant) {
    let mut inflight = shared.admin_drain_requests.subscribe();
    let _ = tokio::time::timeout_at(until, inflight.wait_for(|n| *n == 0)).await;
}

async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The real signals as a stream of triggers. A handler that cannot be installed is logged
/// and left out.
pub(crate) fn signal_stream() -> TriggerStream {
    use tokio::signal::unix::{signal, SignalKind};
    let kinds = [
        (SignalKind::terminate(), Trigger::Sigterm),
        (SignalKind::interrupt(), Trigger::Sigint),
        (SignalKind::quit(), Trigger::Sigquit),
        (SignalKind::user_defined1(), Trigger::Sigusr1),
        (SignalKind::hangup(), Trigger::Sighup),
        (SignalKind::user_defined2(), Trigger::Sigusr2),
    ];
    let mut streams: Vec<TriggerStream> = Vec::new();
    for (kind, trigger) in kinds {
        match signal(kind) {
            Ok(sig) => streams.push(Box::pin(futures::stream::unfold(
                sig,
                move |mut sig| async move { sig.recv().await.map(|()| (trigger, sig)) },
            ))),
            Err(err) => tracing::error!("cannot install the {trigger} handler: {err}"),
        }
    }
    Box::pin(futures::stream::select_all(streams))
}

/// A cheap, cloneable view of the lifecycle for connection tasks and the admin listener.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Hub>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("phase", &self.phase())
            .field("sessions", &self.sessions())
            .finish()
    }
}

impl Handle {
    /// The validated configuration.
    pub fn config(&self) -> &TerminationConfig {
        &self.shared.config
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.shared.state.borrow().phase
    }

    /// Whether new work should be accepted: false in [`Phase::Refusing`] and once exiting.
    pub fn is_accepting(&self) -> bool {
        let state = self.shared.state.borrow();
        state.phase != Phase::Refusing && !state.exiting
    }

    /// Whether `/readyz` answers 200: Serving, and not exiting.
    pub fn is_ready(&self) -> bool {
        let state = self.shared.state.borrow();
        // A drain's trigger is published (and logged) an action before its first phase
        // change: readiness falls with the trigger, so whoever reads the trigger's log line
        // finds /readyz already at 503.
        state.phase == Phase::Serving && !state.exiting && state.drain.is_none()
    }

    /// Whether a drain (or linger) has started, or the exit is decided.
    pub fn is_draining(&self) -> bool {
        let state = self.shared.state.borrow();
        !matches!(state.phase, Phase::Serving | Phase::Starting) || state.exiting
    }

    /// The readiness latch: the daemon is ready for work (its ports are bound), so Starting
    /// ends and `/readyz` answers 200. A no-op in any other phase (a drain that started
    /// while starting keeps readiness down).
    pub fn ready(&self) {
        // Err only if the lifecycle was dropped; then there is nothing to be ready for.
        let _ = self.shared.events.send(Event::Ready);
    }

    /// A receiver of the published state ([`Handle::watch`] is made from it).
    pub(crate) fn subscribe(&self) -> watch::Receiver<State> {
        self.shared.state.subscribe()
    }

    /// Whether the lifecycle has decided to exit.
    pub fn is_exiting(&self) -> bool {
        self.shared.state.borrow().exiting
    }

    /// The outcome, once the lifecycle has decided to exit.
    pub fn outcome(&self) -> Option<Outcome> {
        self.shared.state.borrow().outcome
    }

    /// Resolves when [`Phase::Refusing`] starts (or at exit, if it never did): time to stop
    /// accepting and to say the protocol's goodbye on idle connections. Under `linger` and
    /// `ignore` it only resolves if a refusing drain (SIGINT, SIGUSR1, `POST /drain`) starts.
    pub fn refusing(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.shared.state.subscribe();
        async move {
            // Err means the lifecycle is gone: nothing left to wait for.
            let _ = rx
                .wait_for(|s| s.phase == Phase::Refusing || s.exiting)
                .await;
        }
    }

    /// Resolves when a drain starts: Announcing, Refusing or Lingering (or at exit).
    pub fn drain_started(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.shared.state.subscribe();
        async move {
            let _ = rx
                .wait_for(|s| !matches!(s.phase, Phase::Serving | Phase::Starting) || s.exiting)
                .await;
        }
    }

    /// Resolves when the lifecycle has decided to exit (idle, threshold, deadline, forced):
    /// close what is left.
    pub fn exiting(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.shared.state.subscribe();
        async move {
            let _ = rx.wait_for(|s| s.exiting).await;
        }
    }

    /// A receiver of the reload counter, bumped on each SIGHUP and SIGUSR2.
    pub fn reloads(&self) -> watch::Receiver<u64> {
        self.shared.reloads.subscribe()
    }

    /// Counts one refused piece of new work (`lastcall_sessions_refused_total`).
    pub fn record_refused(&self) {
        self.shared.metrics.refused.inc();
    }

    /// Feeds a trigger to the lifecycle as if it came from a signal or `POST /drain`
    /// (`Trigger::Api` for a plain programmatic drain).
    pub fn start_drain(&self, trigger: Trigger) {
        // Err only if the lifecycle was dropped; then there is nothing to drain.
        let _ = self.shared.events.send(Event::Trigger(trigger));
    }

    /// Opens a session for `peer`; dropping the guard ends it.
    pub fn session(&self, peer: PeerId) -> SessionGuard {
        {
            let mut peers = self.shared.peers();
            *peers.entry(peer.clone()).or_insert(0) += 1;
            self.shared.publish_counts(&peers, 1);
        }
        SessionGuard {
            shared: self.shared.clone(),
            peer,
        }
    }

    /// Holds the drain until the guard is dropped: something outside the daemon may still
    /// send it work, e.g. a load balancer that has not yet marked it down. Unlike a session,
    /// a hold is not work: it is not counted in `lastcall_sessions` or the peers, does not
    /// hold a lingering daemon, and `--drain-min-sessions` does not cover it; while refusing,
    /// the drain ends only once no hold is left (or at the deadline). Take it before the
    /// drain can start refusing, so that the decision to leave sees it.
    pub fn hold(&self) -> HoldGuard {
        self.shared.change_holds(1);
        HoldGuard {
            shared: self.shared.clone(),
        }
    }

    /// Live sessions.
    pub fn sessions(&self) -> u64 {
        self.shared.counts.borrow().sessions
    }

    /// Live holds ([`hold`](Self::hold)).
    pub fn holds(&self) -> u64 {
        self.shared.counts.borrow().holds
    }

    /// Distinct peers among the live sessions.
    pub fn peers(&self) -> u64 {
        self.shared.counts.borrow().peers
    }

    /// The state as `GET /drain` reports it.
    pub fn status(&self) -> DrainStatus {
        let state = self.shared.state.borrow().clone();
        let counts = *self.shared.counts.borrow();
        let config = &self.shared.config;
        let now = Instant::now();
        let drain = state.drain.as_ref();
        DrainStatus {
            phase: state.phase,
            exiting: state.exiting,
            policy: config.on_sigterm,
            trigger: drain.map(|d| d.trigger),
            started_at: drain.map(|d| crate::rfc3339::millis(d.started_at)),
            deadline: drain.map(|d| crate::rfc3339::millis(d.deadline_at)),
            seconds_since_trigger: drain
                .map(|d| now.saturating_duration_since(d.started).as_secs_f64()),
            seconds_to_deadline: drain
                .map(|d| d.deadline.saturating_duration_since(now).as_secs_f64()),
            sessions: counts.sessions,
            peers: counts.peers,
            holds: counts.holds,
            drain_min_sessions: config.drain_min_sessions,
            shutdown_delay_seconds: config.shutdown_delay.as_secs_f64(),
            drain_timeout_seconds: config.drain_timeout.as_secs_f64(),
            sessions_refused_total: self.shared.metrics.refused.get(),
            reloads: *self.shared.reloads.borrow(),
            outcome: state.outcome,
        }
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Shows `table` on the admin listener's `/sessions` (see [`crate::sessions`]); it
    /// replaces a table given before.
    pub fn provide_sessions(&self, table: Arc<dyn crate::sessions::SessionTable>) {
        *self.shared.sessions.write() = Some(table);
    }

    /// The table `/sessions` shows, if the daemon gave one.
    pub(crate) fn session_table(&self) -> Option<Arc<dyn crate::sessions::SessionTable>> {
        self.shared.sessions.read().clone()
    }

    /// [`Lifecycle::register_metrics`], from a handle.
    pub(crate) fn register_metrics(&self, registry: &mut Registry) {
        self.shared.metrics.register(registry);
        self.shared.metrics_registered.store(true, Ordering::SeqCst);
    }

    /// Waits until no connection that carried an accepted `POST /drain` or a
    /// `DELETE /sessions` is open, or `until`.
    pub(crate) async fn admin_answers_sent(&self, until: Instant) {
        wait_admin_answers(&self.shared, until).await;
    }

    /// An admin connection carried an accepted `POST /drain` or a `DELETE /sessions` (which
    /// may end the last session): the exit waits (briefly) for
    /// [`admin_drain_request_done`](Self::admin_drain_request_done).
    pub(crate) fn admin_drain_request_open(&self) {
        self.shared.admin_drain_requests.send_modify(|n| *n += 1);
    }

    pub(crate) fn admin_drain_request_done(&self) {
        self.shared
            .admin_drain_requests
            .send_modify(|n| *n = n.saturating_sub(1));
    }

    pub(crate) fn metrics_registered(&self) -> bool {
        self.shared.metrics_registered.load(Ordering::SeqCst)
    }
}

/// The body of `GET /drain`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DrainStatus {
    /// Current phase.
    pub phase: Phase,
    /// Whether the exit has been decided.
    pub exiting: bool,
    /// `--on-sigterm`.
    pub policy: OnSigterm,
    /// What started the drain.
    pub trigger: Option<Trigger>,
    /// When the drain started (RFC 3339, UTC).
    pub started_at: Option<String>,
    /// The deadline (RFC 3339, UTC).
    pub deadline: Option<String>,
    /// Seconds since the trigger.
    pub seconds_since_trigger: Option<f64>,
    /// Seconds left to the deadline.
    pub seconds_to_deadline: Option<f64>,
    /// Live sessions.
    pub sessions: u64,
    /// Distinct peers.
    pub peers: u64,
    /// Holds: load balancers (or the like) that may still send work ([`Handle::hold`]).
    pub holds: u64,
    /// `--drain-min-sessions`.
    pub drain_min_sessions: u64,
    /// `--shutdown-delay` in seconds.
    pub shutdown_delay_seconds: f64,
    /// `--drain-timeout` in seconds.
    pub drain_timeout_seconds: f64,
    /// Refused pieces of new work so far.
    pub sessions_refused_total: u64,
    /// SIGHUP and SIGUSR2 reloads so far.
    pub reloads: u64,
    /// How it ended, once decided.
    pub outcome: Option<Outcome>,
}

/// An open session; dropping it ends the session (RAII, so a count cannot leak).
#[must_use = "the session ends when the guard is dropped"]
pub struct SessionGuard {
    shared: Arc<Hub>,
    peer: PeerId,
}

impl SessionGuard {
    /// The session's peer.
    pub fn peer(&self) -> &PeerId {
        &self.peer
    }
}

impl std::fmt::Debug for SessionGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionGuard")
            .field("peer", &self.peer)
            .finish()
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let mut peers = self.shared.peers();
        if let Some(n) = peers.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                peers.remove(&self.peer);
            }
        }
        self.shared.publish_counts(&peers, -1);
    }
}

/// A hold on the drain ([`Handle::hold`]); dropping it releases the hold.
#[must_use = "the hold ends when the guard is dropped"]
pub struct HoldGuard {
    shared: Arc<Hub>,
}

impl std::fmt::Debug for HoldGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HoldGuard")
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        self.shared.change_holds(-1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_hosts() {
        let a: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2000".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:3000".parse().unwrap();
        assert_eq!(PeerId::from(a), PeerId::from(b));
        assert_eq!(PeerId::from(a), PeerId::from(mapped));
        assert_ne!(PeerId::from(a), PeerId::named("127.0.0.1"));
    }
}
