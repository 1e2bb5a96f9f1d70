//! The protocol core behind its one lock, and what is done once the lock is released.
//!
//! Every call into the [`Server`] runs through [`ServerState::with_core`], which moves the core's
//! events and relay-socket releases into the caller's [`Effects`] before unlocking; the caller
//! then [`apply`](ServerState::apply)s them: session guards, relay sockets closed, TCP/TLS
//! connections whose allocation expired closed, logs. No system call runs under the lock:
//! relay sockets are bound between two calls ([`ServerState::bind_relays`]), sends happen after.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Instant;

use lastcall::{Handle, PeerId, SessionGuard};
use lastcall_turn_proto::{
    ClientAddr, Counters, DeleteReason, Event, Lookup, RelayAddrs, RelayRequest, Replay, Server,
};
use parking_lot::Mutex;

use crate::kernel::Kernel;
use crate::metrics::{CoreCounters, Metrics};
use crate::ratelog::LogBudget;
use crate::relay::RelaySockets;
use crate::route::{LocalSockets, Streams, TxQueue};

/// Authentication refusals logged a second (at debug); the rest are counted in the next line.
const AUTH_LOG_PER_SECOND: u32 = 10;

/// Capacity refusals (486, 508) logged a second (at warn); the rest are counted likewise.
const CAPACITY_LOG_PER_SECOND: u32 = 10;

/// The server's state, shared by every thread and task: the protocol core behind its lock,
/// the session guards, relay sockets, TCP/TLS streams and metrics.
pub struct ServerState {
    auth_log: LogBudget,
    /// Capacity refusals: clients can cause them at will too (quotas, tokens).
    capacity_log: LogBudget,
    core: Mutex<Server>,
    guards: Mutex<Guards>,
    pub(crate) relays: RelaySockets,
    pub(crate) streams: Streams,
    pub(crate) metrics: Metrics,
    handle: Handle,
    /// The kernel fast path (`--kernel-relay`), when it runs.
    kernel: Option<std::sync::Arc<Kernel>>,
    /// The traffic counters by user (`prometheus-username-labels`), when asked for.
    user_labels: Option<std::sync::Arc<crate::usertraffic::UserLabels>>,
    /// Where the core's user-database lookups go (the user database's task), when there is
    /// one.
    lookups: Option<tokio::sync::mpsc::UnboundedSender<Lookup>>,
    /// The UDP I/O thread the next replayed request goes to (round-robin).
    replay_rr: std::sync::atomic::AtomicUsize,
}

/// What calls into the core left to do once the lock is released.
#[derive(Default)]
pub(crate) struct Effects {
    events: Vec<Event>,
    releases: Vec<SocketAddr>,
    /// User-database lookups for its task, and requests that waited for one, to run again.
    lookups: Vec<Lookup>,
    replays: Vec<Replay>,
    /// Session guards of allocations that ended, for the caller to drop once it has sent
    /// what the same calls produced: the last guard may end the drain and the process, and
    /// a Refresh with lifetime 0 must be answered first.
    pub(crate) ended: Vec<SessionGuard>,
}

impl Effects {
    fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.releases.is_empty()
            && self.lookups.is_empty()
            && self.replays.is_empty()
    }
}

/// One session guard per allocation, keyed by its first relay address: unique among the
/// allocations whose sockets are not released yet, and a released socket is closed only
/// after its allocation's deletion was applied here.
#[derive(Default)]
struct Guards {
    live: HashMap<SocketAddr, SessionGuard>,
    /// Allocations whose deletion was applied before their creation (two threads applying
    /// effects in the other order): their creation takes no guard.
    gone: HashSet<SocketAddr>,
}

/// The key of an allocation's session guard.
fn guard_key(relays: &RelayAddrs) -> Option<SocketAddr> {
    relays.iter().next()
}

impl ServerState {
    /// The core, its relay sockets and metrics, and the lifecycle's handle.
    pub(crate) fn new(
        server: Server,
        relays: RelaySockets,
        metrics: Metrics,
        handle: Handle,
    ) -> ServerState {
        ServerState {
            auth_log: LogBudget::new(AUTH_LOG_PER_SECOND, std::time::Duration::from_secs(1)),
            capacity_log: LogBudget::new(
                CAPACITY_LOG_PER_SECOND,
                std::time::Duration::from_secs(1),
            ),
            core: Mutex::new(server),
            guards: Mutex::new(Guards::default()),
            relays,
            streams: Streams::default(),
            metrics,
            handle,
            kernel: None,
            user_labels: None,
            lookups: None,
            replay_rr: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// With a user database: the core's lookups go to `lookups`.
    pub(crate) fn set_lookups(&mut self, lookups: tokio::sync::mpsc::UnboundedSender<Lookup>) {
        self.lookups = Some(lookups);
    }

    /// With the kernel fast path `kernel`: the core's route changes go to it.
    pub(crate) fn with_kernel(mut self, kernel: Option<Kernel>) -> ServerState {
        if kernel.is_some() {
            self.core.get_mut().set_route_output(true);
        }
        self.kernel = kernel.map(std::sync::Arc::new);
        self
    }

    /// The kernel fast path, when it runs.
    pub(crate) fn kernel(&self) -> Option<&std::sync::Arc<Kernel>> {
        self.kernel.as_ref()
    }

    /// With the traffic counters by user: each new allocation gets its user's handle.
    pub(crate) fn with_user_labels(
        mut self,
        labels: Option<crate::usertraffic::UserLabels>,
    ) -> ServerState {
        if let Some(labels) = labels {
            let labels = std::sync::Arc::new(labels);
            let give = std::sync::Arc::clone(&labels);
            self.core
                .get_mut()
                .set_user_traffic(Box::new(move |user: &str| {
                    give.handle(user, std::time::Instant::now())
                }));
            self.user_labels = Some(labels);
        }
        self
    }

    /// The traffic counters by user, when asked for.
    pub(crate) fn user_labels(&self) -> Option<&std::sync::Arc<crate::usertraffic::UserLabels>> {
        self.user_labels.as_ref()
    }

    /// Runs `f` on the locked core; its events and relay releases are moved into `fx`
    /// before the lock is released.
    pub(crate) fn with_core<R>(&self, fx: &mut Effects, f: impl FnOnce(&mut Server) -> R) -> R {
        let mut server = self.core.lock();
        let r = f(&mut server);
        fx.events.extend(std::iter::from_fn(|| server.poll_event()));
        fx.releases
            .extend(std::iter::from_fn(|| server.poll_release()));
        fx.lookups
            .extend(std::iter::from_fn(|| server.poll_lookup()));
        fx.replays
            .extend(std::iter::from_fn(|| server.poll_replay()));
        if let Some(k) = &self.kernel {
            k.take(&mut server);
        }
        r
    }

    /// Binds the relay sockets `requests` ask for, with no lock held, then answers them under
    /// one lock, queueing the Allocate responses into `tx`. `worker` is the UDP I/O thread
    /// whose clients asked (its relay sockets are read by it), `None` from a tokio task.
    pub(crate) fn bind_relays(
        &self,
        requests: &mut Vec<RelayRequest>,
        worker: Option<usize>,
        fx: &mut Effects,
        route: (&mut TxQueue, &LocalSockets),
        out: &mut Vec<u8>,
    ) {
        if requests.is_empty() {
            return;
        }
        let answers: Vec<_> = requests
            .drain(..)
            .map(|r| self.relays.bind(&r, worker))
            .collect();
        let (tx, local) = route;
        let now = Instant::now();
        self.with_core(fx, |server| {
            for answer in answers {
                if let Some(t) = server.relay_bound(now, answer, out) {
                    tx.queue(t, local);
                }
            }
        });
    }

    /// Applies `fx` (the lock is not held): session guards taken and ended (the ended ones
    /// stay in `fx.ended`), relay sockets released, connections of expired allocations
    /// closed, log lines.
    pub(crate) fn apply(&self, fx: &mut Effects) {
        if let Some(k) = &self.kernel {
            k.apply();
        }
        if fx.is_empty() {
            return;
        }
        if fx.events.iter().any(is_session_event) {
            let mut guards = self.guards.lock();
            for ev in fx.events.iter().filter(|e| is_session_event(e)) {
                self.session(&mut guards, ev, &mut fx.ended);
            }
        }
        for ev in fx.events.drain(..) {
            self.report(ev);
        }
        for relay in fx.releases.drain(..) {
            self.relays.release(relay);
        }
        self.dispatch_userdb(fx);
    }

    /// Sends the core's lookups to the user database's task, and the requests that waited
    /// for one to a UDP I/O thread, which runs them again (every thread can answer every
    /// client: it has a listener on each listening address, and TCP/TLS answers go through
    /// the connection's queue).
    fn dispatch_userdb(&self, fx: &mut Effects) {
        for lookup in fx.lookups.drain(..) {
            let sent = self.lookups.as_ref().map(|tx| tx.send(lookup));
            if !matches!(sent, Some(Ok(()))) {
                // No task to ask (ended, or none): the core's timeout answers 500.
                tracing::error!("a user-database lookup had nowhere to go");
            }
        }
        if fx.replays.is_empty() {
            return;
        }
        let mailboxes = self.relays.mailboxes();
        for replay in fx.replays.drain(..) {
            let n = self
                .replay_rr
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Some(m) = mailboxes.get(n % mailboxes.len().max(1)) {
                m.post(crate::mailbox::Cmd::Replay(replay));
            }
        }
    }

    /// Takes or ends the session guard of an allocation event.
    fn session(&self, guards: &mut Guards, ev: &Event, ended: &mut Vec<SessionGuard>) {
        match ev {
            Event::AllocationCreated { client, relays, .. } => {
                let Some(key) = guard_key(relays) else {
                    return;
                };
                if !guards.gone.remove(&key) {
                    let guard = self.handle.session(PeerId::from(client.client.ip()));
                    guards.live.insert(key, guard);
                }
            }
            Event::AllocationDeleted { relays, .. } => {
                let Some(key) = guard_key(relays) else {
                    return;
                };
                match guards.live.remove(&key) {
                    Some(guard) => ended.push(guard),
                    None => {
                        guards.gone.insert(key);
                    }
                }
            }
            _ => {}
        }
    }

    /// Logs an event, closes the connection of an expired TCP/TLS allocation.
    fn report(&self, ev: Event) {
        match ev {
            Event::AllocationCreated {
                client,
                relays,
                username,
                lifetime,
            } => {
                tracing::debug!(client = %client.client, transport = %client.transport,
                    relay = ?relays, user = %username, lifetime, "allocation created");
            }
            Event::AllocationDeleted {
                client,
                relays,
                reason,
                username,
            } => {
                // An expired or reclaimed allocation means a silent client: close its
                // connection.
                // Ended by the operator: the client's connection goes with it too.
                let silent = matches!(
                    reason,
                    DeleteReason::Expired | DeleteReason::Reclaimed | DeleteReason::Ended
                );
                if client.transport.is_stream() && silent {
                    self.streams.close(&client);
                }
                if reason == DeleteReason::Ended {
                    tracing::info!(client = %client.client, transport = %client.transport,
                        relay = ?relays, user = %username, "allocation ended by the operator (DELETE /sessions)");
                } else if reason == DeleteReason::Reclaimed {
                    tracing::info!(client = %client.client, transport = %client.transport,
                        relay = ?relays, "allocation reclaimed: nothing from its client for drain-idle-timeout");
                } else {
                    tracing::debug!(client = %client.client, relay = ?relays,
                        reason = reason.as_str(), "allocation deleted");
                }
            }
            Event::AuthFailed {
                client,
                username,
                reason,
            } => {
                // Clients cause these at will: debug, and a few a second.
                if let Some(unlogged) = self.auth_log.admit(Instant::now()) {
                    tracing::debug!(client = %client.client, transport = %client.transport,
                        user = ?username, reason = reason.as_str(), unlogged,
                        "authentication refused");
                }
            }
            Event::AllocateRefusedDraining { client, alternate } => {
                self.handle.record_refused();
                tracing::debug!(client = %client.client, ?alternate, "allocate refused: draining");
            }
            Event::AllocateRefused {
                client,
                code,
                limit,
            } => {
                if let Some(unlogged) = self.capacity_log.admit(Instant::now()) {
                    let (min, max, in_use) = self.relays.ports();
                    let allocations = self.handle.sessions();
                    tracing::warn!(client = %client.client, transport = %client.transport,
                        code, limit = limit.kind(), allocations,
                        relay_ports = format!("{in_use} of {min}-{max} in use").as_str(), unlogged,
                        "allocate refused ({code}): {limit}");
                }
            }
            Event::PeerDenied {
                client,
                peer,
                reason,
            } => {
                tracing::info!(client = %client.client, %peer, %reason, "peer refused");
            }
        }
    }

    /// Runs `f` on the core and applies its effects at once (for callers that send nothing).
    pub(crate) fn run<R>(&self, f: impl FnOnce(&mut Server) -> R) -> R {
        let mut fx = Effects::default();
        let r = self.with_core(&mut fx, f);
        self.apply(&mut fx);
        r
    }

    /// Runs `f` on the core without changing it (the operator's pages).
    pub(crate) fn inspect<R>(&self, f: impl FnOnce(&Server) -> R) -> R {
        f(&self.core.lock())
    }

    /// Live allocations.
    pub fn allocations(&self) -> usize {
        self.core.lock().allocation_count()
    }

    /// Whether `client` holds an allocation.
    pub(crate) fn has_allocation(&self, client: &ClientAddr) -> bool {
        self.core.lock().has_allocation(client)
    }

    /// Deletes every allocation (the deadline has come).
    pub fn clear(&self) {
        self.run(Server::clear);
    }

    /// The lifecycle's handle.
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl CoreCounters for ServerState {
    fn snapshot(&self) -> (Counters, (usize, usize, usize)) {
        let (mut counters, live) = {
            let server = self.core.lock();
            (*server.counters(), server.allocation_count_by_transport())
        };
        if let Some(k) = &self.kernel {
            crate::kernel::add_traffic(&mut counters, &k.totals());
        }
        (counters, live)
    }

    fn user_traffic(&self) -> Option<Vec<(String, lastcall_turn_proto::TrafficCounts)>> {
        let labels = self.user_labels.as_ref()?;
        if let Some(k) = &self.kernel {
            k.sync_user_traffic();
        }
        Some(labels.snapshot(std::time::Instant::now()))
    }
}

impl std::fmt::Debug for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerState").finish_non_exhaustive()
    }
}

fn is_session_event(ev: &Event) -> bool {
    matches!(
        ev,
        Event::AllocationCreated { .. } | Event::AllocationDeleted { .. }
    )
}

#[cfg(test)]
impl ServerState {
    /// A core with `workers` mailboxes and neither threads nor listeners, for tests that
    /// drive a UDP I/O thread by hand.
    pub(crate) fn for_tests(
        config: &crate::config::TurnConfig,
        handle: Handle,
        workers: usize,
    ) -> std::sync::Arc<ServerState> {
        use crate::mailbox::Mailbox;
        let mailboxes = (0..workers)
            .map(|w| match Mailbox::new(w) {
                Ok(m) => std::sync::Arc::new(m),
                Err(e) => panic!("eventfd: {e}"),
            })
            .collect();
        let now = Instant::now();
        let server = Server::new(config.core_config(), now, std::time::SystemTime::now());
        let relays = RelaySockets::new(config.min_port, config.max_port, mailboxes);
        std::sync::Arc::new(ServerState::new(server, relays, Metrics::default(), handle))
    }

    pub(crate) fn mailbox(&self, worker: usize) -> std::sync::Arc<crate::mailbox::Mailbox> {
        std::sync::Arc::clone(&self.relays.mailboxes()[worker])
    }
}
