//! The I/O around the sans-IO core: client listeners (UDP, TCP, TLS), relay sockets, timers,
//! session guards, metrics and the drain.
//!
//! One [`Server`](lastcall_turn_proto::Server) sits behind one mutex. UDP (client listeners
//! and every relay socket) is served by `relay-threads` I/O threads of [`crate::udp`], which
//! take the lock once per batch of datagrams; TCP/TLS clients, timers, the drain and the admin
//! listener run on tokio and take it per frame or event. Sends happen outside the lock.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant, SystemTime};

use lastcall::{Handle, PeerId, SessionGuard};
use lastcall_turn_proto::{
    ClientAddr, DeleteReason, DrainMode, Event, RelayError, RelayProvider, Server, ServerConfig,
    Transmit, Transport,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::config::TurnConfig;
use crate::metrics::{self, Metrics};
use crate::tls::Certs;
use crate::udp::{Cmd, Mailbox, Worker};

/// Largest UDP datagram we read.
pub(crate) const MAX_DATAGRAM: usize = 65_536;
/// Frames queued towards one TCP/TLS client before further ones are dropped.
const STREAM_QUEUE: usize = 1024;
/// Longest a TLS handshake may take.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a TCP/TLS connection may stay open without an allocation.
const STREAM_SETUP: Duration = Duration::from_secs(60);
/// Timers are checked at least this often.
const TIMER_TICK: Duration = Duration::from_millis(500);

/// A start-up failure (binding a socket).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot bind {proto} {addr}: {source}")]
    Bind {
        proto: &'static str,
        addr: SocketAddr,
        source: io::Error,
    },
    #[error("cannot list the host's addresses for the default listening-ip: {0}")]
    Interfaces(String),
    #[error("no address to listen on")]
    NoAddress,
    #[error("cannot start UDP I/O thread {worker}: {source}")]
    Worker { worker: usize, source: io::Error },
}

/// The core and what is changed under the same lock.
pub(crate) struct Core {
    pub(crate) server: Server,
    pub(crate) ports: PortPool,
    pub(crate) guards: HashMap<ClientAddr, SessionGuard>,
}

/// A relay socket and the UDP I/O thread that reads it.
struct RelaySocket {
    sock: Arc<std::net::UdpSocket>,
    worker: usize,
}

/// State shared by every task and thread.
pub struct Shared {
    core: Mutex<Core>,
    /// Every relay socket, for sends from outside the worker that reads it.
    relay_sockets: RwLock<HashMap<SocketAddr, RelaySocket>>,
    /// A listener socket per listening address (worker 0's), for UDP sends from outside a
    /// worker (none today: a UDP client's traffic is all handled by its worker).
    udp_listeners: HashMap<SocketAddr, std::net::UdpSocket>,
    pub(crate) streams: Mutex<HashMap<ClientAddr, StreamHandle>>,
    pub(crate) metrics: Metrics,
    handle: Handle,
    /// One per UDP I/O thread.
    mailboxes: Vec<Arc<Mailbox>>,
    /// Round-robin over the workers for relay sockets of TCP/TLS clients.
    next_worker: AtomicUsize,
}

/// How other tasks reach a TCP/TLS client connection.
pub(crate) struct StreamHandle {
    /// Frames to write to the client.
    pub(crate) tx: mpsc::Sender<Vec<u8>>,
    /// Asks the connection to close (its allocation expired).
    close: Arc<tokio::sync::Notify>,
}

/// A running server: its bound addresses, for logs and tests.
pub struct Running {
    pub shared: Arc<Shared>,
    pub udp: Vec<SocketAddr>,
    pub tcp: Vec<SocketAddr>,
    pub tls: Vec<SocketAddr>,
    /// UDP I/O threads.
    pub udp_workers: usize,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Stops the UDP I/O threads (after [`Shared::clear`]: their last sends are done when
    /// this returns).
    pub fn stop_workers(&mut self) {
        for m in &self.shared.mailboxes {
            m.post(Cmd::Stop);
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The protocol core's configuration from ours.
pub fn core_config(c: &TurnConfig) -> ServerConfig {
    let mut s = ServerConfig::new(c.realm.clone());
    if c.use_auth_secret {
        s.auth.rest_secrets = c
            .static_auth_secrets
            .iter()
            .map(|x| x.as_bytes().to_vec())
            .collect();
    }
    for (name, key) in &c.users {
        s.auth.users.insert(name.clone(), key.clone());
    }
    s.lifetimes.allocation_max = Duration::from_secs(u64::from(c.max_allocate_lifetime));
    if s.lifetimes.allocation_default > s.lifetimes.allocation_max {
        s.lifetimes.allocation_default = s.lifetimes.allocation_max;
    }
    s.quotas.per_user = c.user_quota;
    s.quotas.total = c.total_quota;
    s.nonce.lifetime = Duration::from_secs(u64::from(c.stale_nonce));
    s.peer_policy.allow_loopback = c.allow_loopback_peers;
    s.peer_policy.allowed = c.allowed_peer_ips.clone();
    s.peer_policy.denied = c.denied_peer_ips.clone();
    s.relay.relay_ips = c.relay_ips.clone();
    s.relay.external_ips = c.external_ips.clone();
    s
}

/// The addresses to listen on: the configured ones, a wildcard expanded to the host's
/// addresses of that family (the core needs the concrete local address of each datagram),
/// or every host address when none is configured (coturn's default).
pub fn listening_addresses(c: &TurnConfig) -> Result<Vec<IpAddr>, StartError> {
    let wants_host =
        c.listening_ips.is_empty() || c.listening_ips.iter().any(IpAddr::is_unspecified);
    let host = if wants_host {
        host_addresses()?
    } else {
        Vec::new()
    };
    let mut out: Vec<IpAddr> = Vec::new();
    if c.listening_ips.is_empty() {
        out = host;
    } else {
        for ip in &c.listening_ips {
            if ip.is_unspecified() {
                out.extend(host.iter().filter(|h| h.is_ipv4() == ip.is_ipv4()));
            } else {
                out.push(*ip);
            }
        }
    }
    let mut seen = HashSet::new();
    out.retain(|ip| seen.insert(*ip));
    if out.is_empty() {
        return Err(StartError::NoAddress);
    }
    Ok(out)
}

fn host_addresses() -> Result<Vec<IpAddr>, StartError> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| StartError::Interfaces(e.to_string()))?;
    let mut out = Vec::new();
    for ifa in addrs {
        let Some(addr) = ifa.address else { continue };
        let ip = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        let link_local_v6 = matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
        if !ip.is_unspecified() && !link_local_v6 {
            out.push(ip);
        }
    }
    Ok(out)
}

/// Socket buffer sizes asked for (the kernel caps them at net.core.rmem_max/wmem_max):
/// a client listener carries every client's traffic, a relay socket one allocation's.
const LISTENER_BUFFER: usize = 4 << 20;
const RELAY_BUFFER: usize = 1 << 20;

fn bind_udp(addr: SocketAddr, buffer: usize, reuse_port: bool) -> io::Result<std::net::UdpSocket> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    if reuse_port {
        // One listener per worker on the same address: the kernel picks the socket by the
        // client's 4-tuple hash, so a client always reaches the same worker.
        s.set_reuse_port(true)?;
    }
    // Larger buffers absorb bursts while a worker waits for the core's lock; failure to
    // enlarge them is not fatal.
    if buffer > 0 {
        let _ = s.set_recv_buffer_size(buffer);
        let _ = s.set_send_buffer_size(buffer);
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

fn bind_tcp(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// Binds every listener and starts every task. Must run inside a tokio runtime.
pub fn start(
    config: &TurnConfig,
    ips: &[IpAddr],
    certs: Option<Arc<Certs>>,
    metrics: Metrics,
    handle: Handle,
) -> Result<Running, StartError> {
    let workers = config.udp_workers().max(1);
    // Per worker, its listener socket of each listening address.
    let mut udp_std: Vec<Vec<(SocketAddr, std::net::UdpSocket)>> =
        (0..workers).map(|_| Vec::new()).collect();
    let mut udp = Vec::new();
    let mut tcp_std = Vec::new();
    let mut tls_std = Vec::new();
    for ip in ips {
        if !config.no_udp {
            let mut addr = SocketAddr::new(*ip, config.listening_port);
            let reuse = workers > 1;
            if reuse && addr.port() != 0 {
                // SO_REUSEPORT would let us join another process's group on this port (same
                // user) and split its clients: first make sure the port is free.
                drop(bind_udp(addr, 0, false).map_err(|source| StartError::Bind {
                    proto: "UDP",
                    addr,
                    source,
                })?);
            }
            for per_worker in &mut udp_std {
                let s =
                    bind_udp(addr, LISTENER_BUFFER, reuse).map_err(|source| StartError::Bind {
                        proto: "UDP",
                        addr,
                        source,
                    })?;
                // Port 0: the others join the port the first one got.
                addr = s.local_addr().map_err(|source| StartError::Bind {
                    proto: "UDP",
                    addr,
                    source,
                })?;
                per_worker.push((addr, s));
            }
            udp.push(addr);
        }
        if !config.no_tcp {
            let addr = SocketAddr::new(*ip, config.listening_port);
            tcp_std.push(bind_tcp(addr).map_err(|source| StartError::Bind {
                proto: "TCP",
                addr,
                source,
            })?);
        }
        if certs.is_some() {
            let addr = SocketAddr::new(*ip, config.tls_listening_port);
            tls_std.push(bind_tcp(addr).map_err(|source| StartError::Bind {
                proto: "TLS",
                addr,
                source,
            })?);
        }
    }
    let bind_err = |proto, addr| {
        move |source| StartError::Bind {
            proto,
            addr,
            source,
        }
    };
    let mut udp_listeners = HashMap::new();
    if let Some(first) = udp_std.first() {
        for (addr, s) in first {
            udp_listeners.insert(*addr, s.try_clone().map_err(bind_err("UDP", *addr))?);
        }
    }
    let mailboxes = (0..workers)
        .map(|worker| {
            Mailbox::new(worker)
                .map(Arc::new)
                .map_err(|source| StartError::Worker { worker, source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let now = Instant::now();
    let server = Server::new(core_config(config), now, SystemTime::now());
    let shared = Arc::new(Shared {
        core: Mutex::new(Core {
            server,
            ports: PortPool::new(config.min_port, config.max_port),
            guards: HashMap::new(),
        }),
        relay_sockets: RwLock::new(HashMap::new()),
        udp_listeners,
        streams: Mutex::new(HashMap::new()),
        metrics,
        handle,
        mailboxes,
        next_worker: AtomicUsize::new(0),
    });
    let mut threads = Vec::new();
    for (worker, listeners) in udp_std.into_iter().enumerate() {
        threads.push(spawn_worker(&shared, worker, listeners)?);
    }
    let mut tcp = Vec::new();
    for l in tcp_std {
        let l = TcpListener::from_std(l)
            .map_err(bind_err("TCP", SocketAddr::from(([0, 0, 0, 0], 0))))?;
        if let Ok(a) = l.local_addr() {
            tcp.push(a);
        }
        tokio::spawn(accept_loop(Arc::clone(&shared), l, None));
    }
    let mut tls = Vec::new();
    if let Some(certs) = certs {
        for l in tls_std {
            let l = TcpListener::from_std(l)
                .map_err(bind_err("TLS", SocketAddr::from(([0, 0, 0, 0], 0))))?;
            if let Ok(a) = l.local_addr() {
                tls.push(a);
            }
            tokio::spawn(accept_loop(
                Arc::clone(&shared),
                l,
                Some(Arc::clone(&certs)),
            ));
        }
    }
    tokio::spawn(timer_loop(Arc::clone(&shared)));
    // One list for every pod (a chart renders one config): a server never sends new clients
    // to itself, by a listening or an external (public) address on its own ports.
    let own_ips: Vec<IpAddr> = udp
        .iter()
        .chain(&tcp)
        .map(SocketAddr::ip)
        .chain(config.external_ips.iter().map(|e| e.public))
        .collect();
    let own_ports = [config.listening_port, config.tls_listening_port];
    let alternates = config
        .alternate_servers
        .iter()
        .filter(|a| !(own_ips.contains(&a.ip()) && own_ports.contains(&a.port())))
        .copied()
        .collect();
    tokio::spawn(drain_on_refusing(Arc::clone(&shared), alternates));
    Ok(Running {
        shared,
        udp,
        tcp,
        tls,
        udp_workers: workers,
        workers: threads,
    })
}

/// A server with `workers` mailboxes and neither threads nor listeners, for tests that drive
/// a [`Worker`] by hand.
#[cfg(test)]
pub(crate) fn for_tests(config: &TurnConfig, handle: Handle, workers: usize) -> Arc<Shared> {
    let now = Instant::now();
    Arc::new(Shared {
        core: Mutex::new(Core {
            server: Server::new(core_config(config), now, SystemTime::now()),
            ports: PortPool::new(config.min_port, config.max_port),
            guards: HashMap::new(),
        }),
        relay_sockets: RwLock::new(HashMap::new()),
        udp_listeners: HashMap::new(),
        streams: Mutex::new(HashMap::new()),
        metrics: Metrics::default(),
        handle,
        mailboxes: (0..workers)
            .map(|w| Arc::new(Mailbox::new(w).expect("eventfd")))
            .collect(),
        next_worker: AtomicUsize::new(0),
    })
}

#[cfg(test)]
impl Shared {
    pub(crate) fn mailbox(&self, worker: usize) -> Arc<Mailbox> {
        Arc::clone(&self.mailboxes[worker])
    }
}

/// Starts UDP I/O thread `worker` on `listeners`; returns once it is ready.
fn spawn_worker(
    shared: &Arc<Shared>,
    worker: usize,
    listeners: Vec<(SocketAddr, std::net::UdpSocket)>,
) -> Result<std::thread::JoinHandle<()>, StartError> {
    let mailbox = shared
        .mailboxes
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

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        match self.core.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Live allocations.
    pub fn allocations(&self) -> usize {
        self.lock().server.allocation_count()
    }

    /// Deletes every allocation (the deadline has come).
    pub fn clear(self: &Arc<Self>) {
        self.with_core(|server, relays| server.clear(relays));
    }

    /// Runs `f` on the locked core with a [`RelayProvider`], then applies the core's events.
    fn with_core<R>(self: &Arc<Self>, f: impl FnOnce(&mut Server, &mut Relays<'_>) -> R) -> R {
        self.with_core_ended(f).0
    }

    /// [`with_core`](Self::with_core), handing back the session guards of the allocations
    /// that ended, for the caller to drop once the response is sent: the last guard may end
    /// the drain and the process, before a Refresh(0) was answered.
    fn with_core_ended<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Server, &mut Relays<'_>) -> R,
    ) -> (R, Vec<SessionGuard>) {
        let mut core = self.lock();
        let Core {
            server,
            ports,
            guards,
        } = &mut *core;
        let mut relays = Relays {
            shared: self,
            ports,
            worker: None,
        };
        let r = f(server, &mut relays);
        let mut ended = Vec::new();
        self.events(server, guards, &mut ended);
        (r, ended)
    }

    /// Runs one client datagram/frame through the core; returns what to send and the session
    /// guards of allocations it ended (drop them after sending).
    fn on_client<'a>(
        self: &Arc<Self>,
        from: ClientAddr,
        data: &'a [u8],
        out: &'a mut Vec<u8>,
    ) -> (Option<Transmit<'a>>, Vec<SessionGuard>) {
        self.metrics.client_rx.add(data.len());
        self.with_core_ended(|server, relays| {
            server.handle_client(Instant::now(), from, data, relays, out)
        })
    }

    /// The relay socket bound on `relay`.
    pub(crate) fn relay_socket(&self, relay: SocketAddr) -> Option<Arc<std::net::UdpSocket>> {
        read(&self.relay_sockets)
            .get(&relay)
            .map(|r| Arc::clone(&r.sock))
    }

    /// UDP I/O threads.
    pub fn udp_workers(&self) -> usize {
        self.mailboxes.len()
    }

    /// Applies the core's events: session guards, metrics, logs.
    pub(crate) fn events(
        &self,
        server: &mut Server,
        guards: &mut HashMap<ClientAddr, SessionGuard>,
        ended: &mut Vec<SessionGuard>,
    ) {
        while let Some(ev) = server.poll_event() {
            match ev {
                Event::AllocationCreated {
                    client,
                    relays,
                    username,
                    lifetime,
                } => {
                    self.metrics.allocations(transport(client.transport)).inc();
                    self.metrics.allocations_created.inc();
                    let guard = self.handle.session(PeerId::from(client.client.ip()));
                    guards.insert(client, guard);
                    tracing::debug!(client = %client.client, transport = %client.transport,
                        relay = ?relays, user = %username, lifetime, "allocation created");
                }
                Event::AllocationDeleted {
                    client,
                    relays,
                    reason,
                    ..
                } => {
                    self.metrics.allocations(transport(client.transport)).dec();
                    ended.extend(guards.remove(&client));
                    // An expired allocation means a silent client: close its connection.
                    if client.transport.is_stream() && reason == DeleteReason::Expired {
                        if let Some(h) = lock(&self.streams).get(&client) {
                            h.close.notify_one();
                        }
                    }
                    tracing::debug!(client = %client.client, relay = ?relays,
                        reason = reason.as_str(), "allocation deleted");
                }
                Event::AuthFailed {
                    client,
                    username,
                    reason,
                } => {
                    self.metrics.auth_failures.inc();
                    tracing::info!(client = %client.client, user = ?username,
                        reason = reason.as_str(), "authentication failed");
                }
                Event::AllocateRefusedDraining { client, alternate } => {
                    self.metrics.refused_draining.inc();
                    self.handle.record_refused();
                    tracing::debug!(client = %client.client, ?alternate, "allocate refused: draining");
                }
                Event::AllocateRefused { client, code } => {
                    if code == 508 {
                        self.metrics.relay_port_exhausted.inc();
                    }
                    tracing::info!(client = %client.client, code, "allocate refused");
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
    }

    /// Sends what the core returned, never waiting: a datagram that finds its socket's
    /// buffer full, or a frame that finds its connection's queue full, is dropped (and
    /// counted), as the network would.
    fn transmit_now(&self, t: Transmit<'_>) {
        let (sock, to, data, flow) = match t {
            Transmit::Client { to, data } if to.transport == Transport::Udp => {
                let sent = match self.udp_listeners.get(&to.local) {
                    Some(s) => s.send_to(data, to.client),
                    None => return,
                };
                match sent {
                    Ok(_) => self.metrics.client_tx.add(data.len()),
                    Err(_) => {
                        self.metrics.send_dropped.inc();
                    }
                }
                return;
            }
            Transmit::Client { to, data } => {
                let tx = lock(&self.streams).get(&to).map(|h| h.tx.clone());
                match tx.map(|tx| tx.try_send(data.to_vec())) {
                    Some(Ok(())) => self.metrics.client_tx.add(data.len()),
                    Some(Err(_)) => {
                        self.metrics.send_dropped.inc();
                    }
                    None => {}
                }
                return;
            }
            Transmit::Peer { relay, peer, data } => match self.relay_socket(relay) {
                Some(s) => (s, peer, data, &self.metrics.peer_tx),
                None => return,
            },
        };
        // A plain non-blocking send on the kernel's socket: no readiness cache stands in the
        // way (tokio's try_send_to dropped the first datagram of a new relay socket, before
        // its I/O driver had seen it writable); only a full buffer drops.
        match sock.send_to(data, to) {
            Ok(_) => flow.add(data.len()),
            Err(_) => {
                self.metrics.send_dropped.inc();
            }
        }
    }
}

fn transport(t: Transport) -> metrics::Transport {
    match t {
        Transport::Udp => metrics::Transport::Udp,
        Transport::Tcp => metrics::Transport::Tcp,
        Transport::Tls => metrics::Transport::Tls,
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    match m.read() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    match m.write() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Accepts TCP (or, with `certs`, TLS) client connections.
async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, certs: Option<Arc<Certs>>) {
    loop {
        let (stream, client) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        let shared = Arc::clone(&shared);
        match &certs {
            None => {
                let addr = ClientAddr {
                    transport: Transport::Tcp,
                    client,
                    local,
                };
                tokio::spawn(stream_conn(shared, stream, addr));
            }
            Some(certs) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(certs.current());
                tokio::spawn(async move {
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                    {
                        Ok(Ok(tls)) => {
                            let addr = ClientAddr {
                                transport: Transport::Tls,
                                client,
                                local,
                            };
                            stream_conn(shared, tls, addr).await;
                        }
                        Ok(Err(e)) => {
                            shared.metrics.tls_handshake_failures.inc();
                            tracing::debug!(%client, "TLS handshake failed: {e}");
                        }
                        Err(_) => {
                            shared.metrics.tls_handshake_failures.inc();
                            tracing::debug!(%client, "TLS handshake timed out");
                        }
                    }
                });
            }
        }
    }
}

/// Serves one TCP/TLS client connection: frames in, frames out, allocation deleted at close.
async fn stream_conn<S>(shared: Arc<Shared>, stream: S, addr: ClientAddr)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(STREAM_QUEUE);
    let close = Arc::new(tokio::sync::Notify::new());
    lock(&shared.streams).insert(
        addr,
        StreamHandle {
            tx,
            close: Arc::clone(&close),
        },
    );
    shared.metrics.stream_connections.inc();
    let writer = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if wr.write_all(&frame).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let mut buf: Vec<u8> = Vec::with_capacity(8192);
    let mut chunk = vec![0u8; 16 * 1024];
    let mut out = Vec::with_capacity(MAX_DATAGRAM);
    // A connection must hold an allocation within STREAM_SETUP of connecting; one that
    // does not (a scanner, a slow-loris) is closed. Expiry closes the others (see `events`).
    let setup = tokio::time::sleep(STREAM_SETUP);
    tokio::pin!(setup);
    let mut setup_checked = false;
    'conn: loop {
        let n = tokio::select! {
            r = rd.read(&mut chunk) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            () = close.notified() => break,
            () = &mut setup, if !setup_checked => {
                setup_checked = true;
                if shared.lock().guards.contains_key(&addr) {
                    continue;
                }
                tracing::debug!(client = %addr.client, "closing a connection without allocation");
                break;
            }
        };
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        let mut start = 0;
        loop {
            let rest = buf.get(start..).unwrap_or_default();
            match lastcall_turn_proto::stream_frame_len(rest) {
                Ok(Some(len)) => {
                    let Some(frame) = rest.get(..len) else {
                        break 'conn;
                    };
                    let (t, ended) = shared.on_client(addr, frame, &mut out);
                    if let Some(t) = t {
                        shared.transmit_now(t);
                    }
                    drop(ended);
                    start += len;
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(client = %addr.client, "closing stream: {e}");
                    break 'conn;
                }
            }
        }
        buf.drain(..start);
        if buf.len() > 2 * MAX_DATAGRAM {
            break;
        }
    }
    lock(&shared.streams).remove(&addr);
    shared.metrics.stream_connections.dec();
    writer.abort();
    shared.with_core(|server, relays| server.close_client(Instant::now(), &addr, relays));
}

/// Expires allocations, permissions and channels.
async fn timer_loop(shared: Arc<Shared>) {
    loop {
        let next = shared.lock().server.poll_timeout();
        let now = Instant::now();
        let wait = next
            .map(|t| t.saturating_duration_since(now))
            .unwrap_or(TIMER_TICK)
            .min(TIMER_TICK);
        tokio::time::sleep(wait).await;
        shared.with_core(|server, relays| server.handle_timeout(Instant::now(), relays));
    }
}

/// When the drain reaches Refusing, new Allocates get 300 (with alternates) or 403.
async fn drain_on_refusing(shared: Arc<Shared>, alternates: Vec<SocketAddr>) {
    shared.handle.refusing().await;
    if shared.handle.is_exiting() {
        return;
    }
    let n = alternates.len();
    shared
        .lock()
        .server
        .set_drain(DrainMode::Refuse { alternates });
    tracing::info!(
        alternates = n,
        "refusing new allocations ({}); existing allocations keep relaying",
        if n == 0 { "403" } else { "300 Try Alternate" }
    );
}

/// Relay ports in `min-port..=max-port`, per relay address.
pub(crate) struct PortPool {
    min: u16,
    max: u16,
    used: HashMap<IpAddr, HashSet<u16>>,
    cursor: u32,
}

impl PortPool {
    fn new(min: u16, max: u16) -> PortPool {
        let span = u32::from(max.saturating_sub(min)) + 1;
        // A random starting point, so relay ports are not predictable.
        let seed = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
        PortPool {
            min,
            max,
            used: HashMap::new(),
            cursor: (seed % u64::from(span)) as u32,
        }
    }

    fn span(&self) -> u32 {
        u32::from(self.max.saturating_sub(self.min)) + 1
    }
}

/// The [`RelayProvider`] the core calls, with the pool borrowed from the locked core.
pub(crate) struct Relays<'a> {
    pub(crate) shared: &'a Arc<Shared>,
    pub(crate) ports: &'a mut PortPool,
    /// The UDP I/O thread calling (its client's relay sockets are read by it), or `None`
    /// from a tokio task (round-robin).
    pub(crate) worker: Option<usize>,
}

impl Relays<'_> {
    /// Binds `ip:port` unless the port is ours already or taken by someone else (`Ok(None)`).
    fn try_bind(
        &self,
        ip: IpAddr,
        port: u16,
    ) -> Result<Option<(SocketAddr, std::net::UdpSocket)>, RelayError> {
        if self.ports.used.get(&ip).is_some_and(|u| u.contains(&port)) {
            return Ok(None);
        }
        let addr = SocketAddr::new(ip, port);
        match bind_udp(addr, RELAY_BUFFER, false) {
            Ok(s) => Ok(Some((addr, s))),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
                Err(RelayError::FamilyNotSupported)
            }
            Err(e) => Err(RelayError::Failed(e.to_string())),
        }
    }

    /// Makes a bound socket a relay: marks its port used and hands it to a UDP I/O thread.
    fn register(&mut self, addr: SocketAddr, sock: std::net::UdpSocket) {
        let sock = Arc::new(sock);
        self.ports
            .used
            .entry(addr.ip())
            .or_default()
            .insert(addr.port());
        let n = self.shared.mailboxes.len().max(1);
        let worker = self
            .worker
            .unwrap_or_else(|| self.shared.next_worker.fetch_add(1, Ordering::Relaxed))
            % n;
        write(&self.shared.relay_sockets).insert(
            addr,
            RelaySocket {
                sock: Arc::clone(&sock),
                worker,
            },
        );
        if let Some(m) = self.shared.mailboxes.get(worker) {
            m.post(Cmd::Add(addr, sock));
        }
    }

    /// The next candidate port (cycling through the range from a random start).
    fn next_port(&mut self) -> Option<u16> {
        let span = self.ports.span();
        let offset = self.ports.cursor % span;
        self.ports.cursor = self.ports.cursor.wrapping_add(1);
        u16::try_from(u32::from(self.ports.min) + offset).ok()
    }
}

impl RelayProvider for Relays<'_> {
    fn allocate(&mut self, ip: IpAddr, _client: &ClientAddr) -> Result<SocketAddr, RelayError> {
        for _ in 0..self.ports.span() {
            let Some(port) = self.next_port() else {
                continue;
            };
            if let Some((addr, sock)) = self.try_bind(ip, port)? {
                self.register(addr, sock);
                return Ok(addr);
            }
        }
        Err(RelayError::NoPort)
    }

    fn allocate_even(
        &mut self,
        ip: IpAddr,
        _client: &ClientAddr,
        reserve_next: bool,
    ) -> Result<(SocketAddr, Option<SocketAddr>), RelayError> {
        for _ in 0..self.ports.span() {
            let Some(port) = self.next_port() else {
                continue;
            };
            if port % 2 != 0 {
                continue;
            }
            let Some((addr, sock)) = self.try_bind(ip, port)? else {
                continue;
            };
            if !reserve_next {
                self.register(addr, sock);
                return Ok((addr, None));
            }
            let Some(next) = port.checked_add(1).filter(|p| *p <= self.ports.max) else {
                continue;
            };
            // Both or neither: dropping `sock` frees the even port again.
            let Some((addr2, sock2)) = self.try_bind(ip, next)? else {
                continue;
            };
            self.register(addr, sock);
            self.register(addr2, sock2);
            return Ok((addr, Some(addr2)));
        }
        Err(RelayError::NoPort)
    }

    fn release(&mut self, relay: SocketAddr) {
        let removed = write(&self.shared.relay_sockets).remove(&relay);
        if let Some(r) = removed {
            if let Some(m) = self.shared.mailboxes.get(r.worker) {
                m.post(Cmd::Remove(relay));
            }
        }
        if let Some(u) = self.ports.used.get_mut(&relay.ip()) {
            u.remove(&relay.port());
        }
    }
}
