//! Starting the server: the core and its relay sockets, every listener, the UDP I/O threads
//! and the tokio tasks (TCP/TLS through the lifecycle's accept loops, timers, the drain); and
//! its end, within the time the lifecycle gives after the exit decision.
//!
//! One [`Server`](lastcall_turn_proto::Server) sits behind one mutex ([`ServerState`]). UDP
//! (client listeners and every relay socket) is served by `relay-threads` I/O threads
//! ([`crate::udp`]), which take the lock once per batch of datagrams; TCP/TLS clients, timers
//! and the drain run on tokio and take it per frame or event. No system call runs under the
//! lock.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime};

use lastcall::{AcceptUntil, Daemon, Handle};
use lastcall_turn_proto::{Server, Transport};
use tokio::net::TcpListener;

use crate::config::TurnConfig;
use crate::listen::{self, ListenError};
use crate::mailbox::{Cmd, Mailbox};
use crate::metrics::Metrics;
use crate::relay::RelaySockets;
pub use crate::shared::ServerState;
use crate::tls::Certs;
use crate::udp::Worker;
use crate::{drain, stream, timers};

/// A start-up failure (binding a socket, starting a thread).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listening socket could not be bound.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// A UDP I/O thread could not be started.
    #[error("cannot start UDP I/O thread {worker}: {source}")]
    Worker {
        /// The thread's index.
        worker: usize,
        /// What the OS said.
        source: io::Error,
    },
}

/// A running server: its bound addresses, for logs and tests.
pub struct Running {
    /// The state every task shares.
    pub shared: Arc<ServerState>,
    /// Bound UDP listeners.
    pub udp: Vec<SocketAddr>,
    /// Bound TCP listeners.
    pub tcp: Vec<SocketAddr>,
    /// Bound TLS listeners.
    pub tls: Vec<SocketAddr>,
    /// UDP I/O threads.
    pub udp_workers: usize,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Each I/O thread says here that it has ended.
    ended: mpsc::Receiver<usize>,
}

impl Running {
    /// Registers the core's counters (read under its lock at each scrape) in `registry`;
    /// coturn's counter families are [`Running::coturn_metrics`]'.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let core: Arc<dyn crate::metrics::CoreCounters> = self.shared.clone();
        crate::metrics::CoreMetrics::register(registry, core);
        if let Some(kernel) = self.shared.kernel() {
            let kernel = Arc::clone(kernel);
            registry.register_collector(Box::new(crate::kernel::KernelMetrics(kernel)));
        }
        if let Some(labels) = self.shared.user_labels() {
            registry.register_collector(Box::new(crate::usertraffic::UserLabelMetrics(
                Arc::clone(labels),
            )));
        }
    }

    /// coturn's counter families of the core, written at each scrape in Prometheus text
    /// 0.0.4 (see [`crate::metrics`]); `realm` labels the traffic counters.
    pub fn coturn_metrics(&self, realm: &str) -> lastcall::admin::ExtraFamilies {
        let core: Arc<dyn crate::metrics::CoreCounters> = self.shared.clone();
        crate::metrics::coturn_counters(core, realm)
    }

    /// Ends every allocation (logging how many were left) and stops the UDP I/O threads,
    /// within `budget`; returns whether every thread ended in time (they finish the batch in
    /// hand, so its responses are sent).
    pub fn end_within(mut self, budget: Duration) -> bool {
        let deadline = Instant::now() + budget;
        let left = self.shared.allocations();
        if left > 0 {
            tracing::info!(allocations = left, "ending the remaining allocations");
        }
        self.shared.clear();
        for m in self.shared.relays.mailboxes() {
            m.post(Cmd::Stop);
        }
        for _ in 0..self.workers.len() {
            let wait = deadline.saturating_duration_since(Instant::now());
            if self.ended.recv_timeout(wait).is_err() {
                return false;
            }
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        true
    }
}

/// Tells `Running::end_within` that an I/O thread ended (also when it panicked).
struct Ended(usize, mpsc::Sender<usize>);

impl Drop for Ended {
    fn drop(&mut self) {
        let _ = self.1.send(self.0);
    }
}

/// The core and its relay sockets, with `workers` UDP I/O threads' mailboxes.
fn shared(
    config: &TurnConfig,
    metrics: Metrics,
    handle: Handle,
    workers: usize,
    kernel: Option<crate::kernel::Kernel>,
) -> Result<Arc<ServerState>, StartError> {
    let mailboxes = (0..workers)
        .map(|worker| {
            Mailbox::new(worker)
                .map(Arc::new)
                .map_err(|source| StartError::Worker { worker, source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let core = config.core_config();
    let fixed = crate::userdb::Static {
        realm: core.realm.clone(),
        allowed: core.peer_policy.allowed.clone(),
        denied: core.peer_policy.denied.clone(),
        quotas: core.quotas,
        bandwidth: core.bandwidth,
    };
    let server = Server::new(core, Instant::now(), SystemTime::now());
    let relays = RelaySockets::new(config.min_port, config.max_port, mailboxes);
    let labels = config
        .user_labels
        .map(|max| crate::usertraffic::UserLabels::new(max, crate::usertraffic::IDLE));
    let mut shared = ServerState::new(server, relays, metrics, handle)
        .with_kernel(kernel)
        .with_user_labels(labels);
    let Some(userdb) = &config.userdb else {
        return Ok(Arc::new(shared));
    };
    // The core's lookups go to the user database's task, which answers into the core.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    shared.set_lookups(tx);
    let shared = Arc::new(shared);
    crate::userdb::UserDb::spawn(userdb, fixed, &shared, rx);
    Ok(shared)
}

/// The addresses the kernel fast path serves: the UDP listeners' and the relay addresses
/// (the listening addresses when `relay-ip` is not given).
fn kernel_ips(config: &TurnConfig, udp: &[SocketAddr]) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = udp.iter().map(SocketAddr::ip).collect();
    ips.extend(&config.relay_ips);
    ips.sort();
    ips.dedup();
    ips
}

/// Binds every listener and starts every thread and task (TCP/TLS connections as tracked
/// tasks of `daemon`). Must run inside a tokio runtime.
pub fn start(
    config: &TurnConfig,
    ips: &[IpAddr],
    certs: Option<Arc<Certs>>,
    metrics: Metrics,
    daemon: &Daemon,
) -> Result<Running, StartError> {
    let workers = config.udp_workers().max(1);
    let listeners = listen::bind(config, ips, workers, certs.is_some())?;
    let kernel = config
        .kernel_relay
        .then(|| crate::kernel::Kernel::start(&kernel_ips(config, &listeners.udp_addrs)))
        .flatten();
    let shared = shared(config, metrics, daemon.handle().clone(), workers, kernel)?;
    let (ended_tx, ended) = mpsc::channel();
    let mut threads = Vec::new();
    for (worker, sockets) in listeners.udp.into_iter().enumerate() {
        let ended = Ended(worker, ended_tx.clone());
        threads.push(spawn_worker(&shared, worker, sockets, ended)?);
    }
    let tcp = serve_streams(&shared, daemon, listeners.tcp, None)?;
    let tls = match certs {
        Some(certs) => serve_streams(&shared, daemon, listeners.tls, Some(certs))?,
        None => Vec::new(),
    };
    tokio::spawn(timers::timer_loop(Arc::clone(&shared)));
    let own_ips: Vec<IpAddr> = listeners
        .udp_addrs
        .iter()
        .chain(&tcp)
        .map(SocketAddr::ip)
        .chain(config.external_ips.iter().map(|e| e.public))
        .collect();
    let own_ports = [config.listening_port, config.tls_listening_port];
    let alternates = drain::alternates(&config.alternate_servers, &own_ips, &own_ports);
    let by_transport = &config.transport_alternates;
    for (transport, list) in [
        (Transport::Udp, &by_transport.udp),
        (Transport::Tcp, &by_transport.tcp),
        (Transport::Tls, &by_transport.tls),
    ] {
        let list = drain::alternates(list, &own_ips, &own_ports);
        shared.run(|server| server.set_transport_alternates(transport, list));
    }
    tokio::spawn(drain::refuse_when_refusing(Arc::clone(&shared), alternates));
    Ok(Running {
        shared,
        udp: listeners.udp_addrs,
        tcp,
        tls,
        udp_workers: workers,
        workers: threads,
        ended,
    })
}

/// Starts accepting on `listeners` (TLS with `certs`) until the exit decision: while
/// refusing, new clients still get their 300/403; returns the listeners' addresses.
fn serve_streams(
    shared: &Arc<ServerState>,
    daemon: &Daemon,
    listeners: Vec<std::net::TcpListener>,
    certs: Option<Arc<Certs>>,
) -> Result<Vec<SocketAddr>, StartError> {
    let proto = if certs.is_some() { "TLS" } else { "TCP" };
    let mut addrs = Vec::new();
    for l in listeners {
        let addr = l
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let l = TcpListener::from_std(l).map_err(|source| ListenError::Bind {
            proto,
            addr,
            source,
        })?;
        addrs.push(addr);
        let shared = Arc::clone(shared);
        match certs.clone() {
            None => daemon.accept(l, AcceptUntil::Exiting, move |conn, watch| {
                stream::serve_tcp(Arc::clone(&shared), conn, watch)
            }),
            Some(certs) => daemon.accept(l, AcceptUntil::Exiting, move |conn, watch| {
                stream::serve_tls(Arc::clone(&shared), Arc::clone(&certs), conn, watch)
            }),
        }
    }
    Ok(addrs)
}

/// Starts UDP I/O thread `worker` on `listeners`; returns once it is ready. `ended` is
/// dropped when the thread ends.
fn spawn_worker(
    shared: &Arc<ServerState>,
    worker: usize,
    listeners: Vec<(SocketAddr, std::net::UdpSocket)>,
    ended: Ended,
) -> Result<std::thread::JoinHandle<()>, StartError> {
    let mailbox = shared
        .relays
        .mailboxes()
        .get(worker)
        .cloned()
        .ok_or(StartError::Worker {
            worker,
            source: io::Error::other("no mailbox"),
        })?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let shared = Arc::clone(shared);
    let thread = std::thread::Builder::new()
        .name(format!("turn-udp-{worker}"))
        .spawn(move || match Worker::new(shared, mailbox, listeners) {
            Ok(w) => {
                let _ended = ended;
                let _ = ready_tx.send(Ok(()));
                w.run();
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })
        .map_err(|source| StartError::Worker { worker, source })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(thread),
        Ok(Err(source)) => Err(StartError::Worker { worker, source }),
        Err(_) => Err(StartError::Worker {
            worker,
            source: io::Error::other("the thread ended at start"),
        }),
    }
}
