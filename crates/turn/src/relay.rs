//! Relay sockets: bound for the core's [`RelayRequest`]s (a port of `min-port..=max-port`,
//! outside the core's lock), registered where every sender finds them and handed to the UDP
//! I/O thread that reads them, and released when the core lets them go.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use lastcall_turn_proto::{RelayBound, RelayError, RelayPorts, RelayRequest};
use parking_lot::{Mutex, RwLock};

use crate::mailbox::{Cmd, Mailbox};
use crate::sockets::{bind_udp, RELAY_BUFFER};

/// Every relay socket, and the ports in use.
pub(crate) struct RelaySockets {
    ports: Mutex<PortPool>,
    sockets: RwLock<HashMap<SocketAddr, RelaySocket>>,
    /// One per UDP I/O thread.
    mailboxes: Vec<Arc<Mailbox>>,
    /// Round-robin over the threads for the relay sockets of TCP/TLS clients.
    next_worker: AtomicUsize,
}

/// A relay socket and the UDP I/O thread that reads it.
struct RelaySocket {
    sock: Arc<UdpSocket>,
    worker: usize,
}

impl RelaySockets {
    /// Relay ports `min..=max`, read by the threads behind `mailboxes`.
    pub(crate) fn new(min: u16, max: u16, mailboxes: Vec<Arc<Mailbox>>) -> RelaySockets {
        RelaySockets {
            ports: Mutex::new(PortPool::new(min, max)),
            sockets: RwLock::new(HashMap::new()),
            mailboxes,
            next_worker: AtomicUsize::new(0),
        }
    }

    /// The UDP I/O threads' mailboxes.
    pub(crate) fn mailboxes(&self) -> &[Arc<Mailbox>] {
        &self.mailboxes
    }

    /// Binds what `request` asks for. Each socket is registered before the answer returns,
    /// read by thread `worker` (the UDP I/O thread whose client asked), or by the next
    /// thread in turn for a TCP/TLS client.
    pub(crate) fn bind(&self, request: &RelayRequest, worker: Option<usize>) -> RelayBound {
        let worker = worker.unwrap_or_else(|| self.next_worker.fetch_add(1, Ordering::Relaxed))
            % self.mailboxes.len().max(1);
        let mut ports = self.ports.lock();
        let primary = match request.ports {
            RelayPorts::Any => ports.bind_any(request.ip).map(|s| (s, None)),
            RelayPorts::Even => ports.bind_even(request.ip, false),
            RelayPorts::EvenPair => ports.bind_even(request.ip, true),
        };
        let additional = match (&primary, request.additional) {
            (Ok(_), Some(ip)) => Some(ports.bind_any(ip)),
            _ => None,
        };
        drop(ports);
        let primary = primary.map(|(a, pair)| {
            let pair = pair.map(|b| self.register(b, worker));
            (self.register(a, worker), pair)
        });
        let additional = additional.map(|r| r.map(|s| self.register(s, worker)));
        RelayBound {
            id: request.id,
            primary,
            additional,
        }
    }

    /// Makes a bound socket a relay: in the registry, and read by `worker`.
    fn register(&self, (addr, sock): (SocketAddr, UdpSocket), worker: usize) -> SocketAddr {
        let sock = Arc::new(sock);
        self.sockets.write().insert(
            addr,
            RelaySocket {
                sock: Arc::clone(&sock),
                worker,
            },
        );
        if let Some(m) = self.mailboxes.get(worker) {
            m.post(Cmd::Add(addr, sock));
        }
        addr
    }

    /// Closes the relay socket bound on `relay` and frees its port.
    pub(crate) fn release(&self, relay: SocketAddr) {
        let removed = self.sockets.write().remove(&relay);
        if let Some(r) = removed {
            if let Some(m) = self.mailboxes.get(r.worker) {
                m.post(Cmd::Remove(relay));
            }
        }
        self.ports.lock().free(relay);
    }

    /// The relay port range and the ports in use in it (all relay addresses together), for
    /// the log line of a refusal.
    pub(crate) fn ports(&self) -> (u16, u16, usize) {
        let pool = self.ports.lock();
        let used = pool.used.values().map(HashSet::len).sum();
        (pool.min, pool.max, used)
    }

    /// The relay socket bound on `relay`, for a sender that does not read it.
    pub(crate) fn get(&self, relay: SocketAddr) -> Option<Arc<UdpSocket>> {
        self.sockets.read().get(&relay).map(|r| Arc::clone(&r.sock))
    }
}

/// Relay ports in `min..=max`, per relay address.
struct PortPool {
    min: u16,
    max: u16,
    used: HashMap<IpAddr, HashSet<u16>>,
    cursor: u32,
}

type Bound = (SocketAddr, UdpSocket);

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

    /// The next candidate port (cycling through the range from a random start).
    fn next_port(&mut self) -> Option<u16> {
        let offset = self.cursor % self.span();
        self.cursor = self.cursor.wrapping_add(1);
        u16::try_from(u32::from(self.min) + offset).ok()
    }

    /// Binds `ip:port` and marks the port used, unless it is ours already or taken by
    /// someone else (`Ok(None)`).
    fn try_bind(&mut self, ip: IpAddr, port: u16) -> Result<Option<Bound>, RelayError> {
        if self.used.get(&ip).is_some_and(|u| u.contains(&port)) {
            return Ok(None);
        }
        let addr = SocketAddr::new(ip, port);
        match bind_udp(addr, RELAY_BUFFER, false) {
            Ok(s) => {
                self.used.entry(ip).or_default().insert(port);
                Ok(Some((addr, s)))
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
                Err(RelayError::FamilyNotSupported)
            }
            Err(e) => Err(RelayError::Failed(describe(&e))),
        }
    }

    fn free(&mut self, relay: SocketAddr) {
        if let Some(u) = self.used.get_mut(&relay.ip()) {
            u.remove(&relay.port());
        }
    }

    fn bind_any(&mut self, ip: IpAddr) -> Result<Bound, RelayError> {
        for _ in 0..self.span() {
            let Some(port) = self.next_port() else {
                continue;
            };
            if let Some(bound) = self.try_bind(ip, port)? {
                return Ok(bound);
            }
        }
        Err(RelayError::NoPort)
    }

    /// An even port, and with `pair` port + 1 too (both or neither).
    fn bind_even(&mut self, ip: IpAddr, pair: bool) -> Result<(Bound, Option<Bound>), RelayError> {
        for _ in 0..self.span() {
            let Some(port) = self.next_port() else {
                continue;
            };
            if port % 2 != 0 {
                continue;
            }
            let Some(even) = self.try_bind(ip, port)? else {
                continue;
            };
            if !pair {
                return Ok((even, None));
            }
            let next = port.checked_add(1).filter(|p| *p <= self.max);
            match next.map(|p| self.try_bind(ip, p)).transpose() {
                Ok(Some(Some(odd))) => return Ok((even, Some(odd))),
                other => {
                    // Dropping the even socket closes it; its port is free again.
                    self.free(even.0);
                    other?;
                }
            }
        }
        Err(RelayError::NoPort)
    }
}

/// A relay socket's bind error, with the limit it means: the process's open-file limit, the
/// system's, or memory.
fn describe(e: &io::Error) -> String {
    use nix::errno::Errno;
    let limit = match e.raw_os_error().map(Errno::from_raw) {
        Some(Errno::EMFILE) => {
            "the process's open-file limit (RLIMIT_NOFILE, `ulimit -n`, systemd LimitNOFILE=)"
        }
        Some(Errno::ENFILE) => "the system's open-file limit (fs.file-max)",
        Some(Errno::ENOMEM | Errno::ENOBUFS) => "memory",
        _ => return e.to_string(),
    };
    format!("{limit}: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_errors_name_the_limit() {
        let emfile = io::Error::from_raw_os_error(nix::errno::Errno::EMFILE as i32);
        assert!(describe(&emfile).starts_with("the process's open-file limit (RLIMIT_NOFILE"));
        let nobufs = io::Error::from_raw_os_error(nix::errno::Errno::ENOBUFS as i32);
        assert!(
            describe(&nobufs).starts_with("memory: "),
            "{}",
            describe(&nobufs)
        );
        let acces = io::Error::from_raw_os_error(nix::errno::Errno::EACCES as i32);
        assert_eq!(describe(&acces), acces.to_string());
    }
}
