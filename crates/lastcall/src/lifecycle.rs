//! The lifecycle driver: a thin tokio task around [`Machine`] that listens to signals (or a
//! stream of [`Trigger`]s), session counts and the clock, publishes the phase to every
//! [`Handle`], logs, keeps the metrics, and returns the [`Outcome`] when it is time to exit.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::{OnSigterm, TerminationConfig};
use crate::machine::{Action, Input, Machine, Outcome, Phase, Trigger};
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

/// The published state, read by handles and the admin listener.
#[derive(Debug, Clone)]
struct State {
    phase: Phase,
    exiting: bool,
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

/// Live sessions and distinct peers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    sessions: u64,
    peers: u64,
}

struct Shared {
    config: TerminationConfig,
    state: watch::Sender<State>,
    counts: watch::Sender<Counts>,
    peers: Mutex<HashMap<PeerId, u64>>,
    reloads: watch::Sender<u64>,
    triggers: mpsc::UnboundedSender<Trigger>,
    metrics: Metrics,
    metrics_registered: AtomicBool,
    /// Admin connections that carried an accepted `POST /drain` and are still open.
    admin_drain_requests: watch::Sender<usize>,
}

impl Shared {
    fn peers(&self) -> MutexGuard<'_, HashMap<PeerId, u64>> {
        // A panic while holding this lock cannot leave the map inconsistent (single
        // insert/remove), so a poisoned lock is still usable.
        self.peers.lock().unwrap_or_else(|e| e.into_inner())
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

/// How long the exit waits for `POST /drain` answers to be written.
const ADMIN_FLUSH: Duration = Duration::from_secs(1);

type TriggerStream = Pin<Box<dyn Stream<Item = Trigger> + Send>>;

/// Owns the termination state machine; create it early (inside the tokio runtime, so that
/// signal handlers are installed at once), hand out [`Handle`]s, then [`run`](Self::run) it.
pub struct Lifecycle {
    shared: Arc<Shared>,
    triggers: mpsc::UnboundedReceiver<Trigger>,
    signals: Option<TriggerStream>,
}

impl Lifecycle {
    /// A lifecycle in [`Phase::Serving`]. Inside a tokio runtime this also installs the
    /// SIGTERM, SIGINT, SIGQUIT, SIGUSR1 and SIGHUP handlers used by [`run`](Self::run), so
    /// that a signal arriving before `run` is queued instead of killing the process.
    pub fn new(config: TerminationConfig) -> Self {
        let mut lifecycle = Self::build(config);
        lifecycle.signals = tokio::runtime::Handle::try_current()
            .ok()
            .map(|_| signal_stream());
        lifecycle
    }

    fn build(config: TerminationConfig) -> Self {
        let (triggers_tx, triggers) = mpsc::unbounded_channel();
        let metrics = Metrics::default();
        let shared = Arc::new(Shared {
            config,
            state: watch::Sender::new(State {
                phase: Phase::Serving,
                exiting: false,
                drain: None,
                outcome: None,
            }),
            counts: watch::Sender::new(Counts::default()),
            peers: Mutex::new(HashMap::new()),
            reloads: watch::Sender::new(0),
            triggers: triggers_tx,
            metrics,
            metrics_registered: AtomicBool::new(false),
            admin_drain_requests: watch::Sender::new(0),
        });
        Lifecycle {
            shared,
            triggers,
            signals: None,
        }
    }

    /// A lifecycle that never installs signal handlers, for [`run_with`](Self::run_with)
    /// (tests, embedding in a process that handles signals itself).
    pub fn without_signals(config: TerminationConfig) -> Self {
        let mut lifecycle = Self::build(config);
        lifecycle.signals = None;
        lifecycle
    }

    /// A handle for the daemon's tasks and the admin listener.
    pub fn handle(&self) -> Handle {
        Handle {
            shared: self.shared.clone(),
        }
    }

    /// Registers `lastcall_drain_phase`, `lastcall_sessions`, `lastcall_peers`,
    /// `lastcall_sessions_refused_total`, `lastcall_reloads_total` and
    /// `lastcall_drain_duration_seconds` in the daemon's registry. (If it is never called,
    /// the admin listener's `/metrics` adds them by itself.)
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.shared.metrics.register(registry);
        self.shared.metrics_registered.store(true, Ordering::SeqCst);
    }

    /// Runs the lifecycle with the real signals until it is time to exit.
    pub async fn run(mut self) -> Outcome {
        let signals = self.signals.take().unwrap_or_else(signal_stream);
        self.drive(signals).await
    }

    /// Runs the lifecycle with `events` in place of the real signals (tests, embedding).
    /// [`Handle::start_drain`] works as well. The lifecycle keeps running when `events` ends.
    pub async fn run_with<S>(mut self, events: S) -> Outcome
    where
        S: Stream<Item = Trigger> + Send + 'static,
    {
        self.signals = None;
        self.drive(Box::pin(events)).await
    }

    async fn drive(mut self, mut events: TriggerStream) -> Outcome {
        let shared = self.shared.clone();
        let mut machine = Machine::new(&shared.config);
        let mut counts = shared.counts.subscribe();
        let mut events_open = true;
        let c = *counts.borrow_and_update();
        let mut input = Input::Sessions {
            sessions: c.sessions,
            peers: c.peers,
        };
        loop {
            let now = Instant::now();
            // Session counts first: a trigger must see the sessions live at its arrival,
            // even when both woke the task at once.
            if counts.has_changed().unwrap_or(false) {
                let c = *counts.borrow_and_update();
                let actions = machine.handle(
                    now,
                    Input::Sessions {
                        sessions: c.sessions,
                        peers: c.peers,
                    },
                );
                if let Some(outcome) = self.apply(&machine, actions) {
                    return finish(&shared, outcome).await;
                }
            }
            let actions = machine.handle(now, input);
            if let Some(outcome) = self.apply(&machine, actions) {
                return finish(&shared, outcome).await;
            }
            let wake = machine.next_wakeup();
            input = tokio::select! {
                biased;
                event = events.next(), if events_open => match event {
                    Some(trigger) => Input::Trigger(trigger),
                    None => {
                        events_open = false;
                        Input::Tick
                    }
                },
                Some(trigger) = self.triggers.recv() => Input::Trigger(trigger),
                Ok(()) = counts.changed() => {
                    let c = *counts.borrow_and_update();
                    Input::Sessions { sessions: c.sessions, peers: c.peers }
                }
                () = sleep_until(wake), if wake.is_some() => Input::Tick,
            };
        }
    }

    /// Logs and publishes the actions; returns the outcome when it is time to exit.
    fn apply(&self, machine: &Machine, actions: Vec<Action>) -> Option<Outcome> {
        let shared = &self.shared;
        let mut exit = None;
        for action in actions {
            match &action {
                Action::DrainStarted { trigger, .. } => {
                    tracing::warn!(trigger = %trigger, policy = %shared.config.on_sigterm, "{action}");
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
                    shared.state.send_modify(|s| s.drain = Some(info));
                }
                Action::PhaseChanged { to, .. } => {
                    tracing::info!(phase = %to, "{action}");
                    shared.metrics.drain_phase.set(to.metric_value());
                    shared.state.send_modify(|s| s.phase = *to);
                }
                Action::Reload => {
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
                    exit = Some(*outcome);
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

/// Lets the answers to `POST /drain` requests reach their clients (at most 1 s), so that a
/// drain that ends at once does not leave the caller without a response.
async fn finish(shared: &Shared, outcome: Outcome) -> Outcome {
    let mut inflight = shared.admin_drain_requests.subscribe();
    let _ = tokio::time::timeout(ADMIN_FLUSH, inflight.wait_for(|n| *n == 0)).await;
    outcome
}

async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The real signals as a stream of triggers. A handler that cannot be installed is logged
/// and left out.
fn signal_stream() -> TriggerStream {
    use tokio::signal::unix::{signal, SignalKind};
    let kinds = [
        (SignalKind::terminate(), Trigger::Sigterm),
        (SignalKind::interrupt(), Trigger::Sigint),
        (SignalKind::quit(), Trigger::Sigquit),
        (SignalKind::user_defined1(), Trigger::Sigusr1),
        (SignalKind::hangup(), Trigger::Sighup),
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
    shared: Arc<Shared>,
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
    pub fn accepting(&self) -> bool {
        let state = self.shared.state.borrow();
        state.phase != Phase::Refusing && !state.exiting
    }

    /// Whether a drain (or linger) has started: readiness is 503.
    pub fn draining(&self) -> bool {
        let state = self.shared.state.borrow();
        state.phase != Phase::Serving || state.exiting
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

    /// Resolves when a drain starts (readiness falls): Announcing, Refusing or Lingering.
    pub fn drain_started(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.shared.state.subscribe();
        async move {
            let _ = rx
                .wait_for(|s| s.phase != Phase::Serving || s.exiting)
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

    /// A receiver of the reload counter, bumped on each SIGHUP.
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
        let _ = self.shared.triggers.send(trigger);
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

    /// Live sessions.
    pub fn sessions(&self) -> u64 {
        self.shared.counts.borrow().sessions
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
            started_at: drain.map(|d| rfc3339(d.started_at)),
            deadline: drain.map(|d| rfc3339(d.deadline_at)),
            seconds_since_trigger: drain
                .map(|d| now.saturating_duration_since(d.started).as_secs_f64()),
            seconds_to_deadline: drain
                .map(|d| d.deadline.saturating_duration_since(now).as_secs_f64()),
            sessions: counts.sessions,
            peers: counts.peers,
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

    /// An admin connection carried an accepted `POST /drain`: the exit waits (briefly) for
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
    /// `--drain-min-sessions`.
    pub drain_min_sessions: u64,
    /// `--shutdown-delay` in seconds.
    pub shutdown_delay_seconds: f64,
    /// `--drain-timeout` in seconds.
    pub drain_timeout_seconds: f64,
    /// Refused pieces of new work so far.
    pub sessions_refused_total: u64,
    /// SIGHUP reloads so far.
    pub reloads: u64,
    /// How it ended, once decided.
    pub outcome: Option<Outcome>,
}

/// An open session; dropping it ends the session (RAII, so a count cannot leak).
#[must_use = "the session ends when the guard is dropped"]
pub struct SessionGuard {
    shared: Arc<Shared>,
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

/// `2026-11-29T17:50:54.123Z`.
fn rfc3339(t: SystemTime) -> String {
    let d = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's method).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_974_654_123);
        assert_eq!(rfc3339(t), "2026-11-29T17:50:54.123Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

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
