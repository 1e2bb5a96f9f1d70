//! The client listeners: which addresses to listen on, and binding every listening socket
//! (UDP per I/O thread, TCP, TLS) before anything starts.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};

use crate::config::TurnConfig;
use crate::sockets::{bind_tcp, bind_udp, LISTENER_BUFFER};

/// A listening socket that could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
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
}

/// Every listening socket, bound.
pub(crate) struct Listeners {
    /// Per UDP I/O thread, its listener socket of each listening address.
    pub(crate) udp: Vec<Vec<(SocketAddr, UdpSocket)>>,
    /// The UDP listening addresses.
    pub(crate) udp_addrs: Vec<SocketAddr>,
    pub(crate) tcp: Vec<TcpListener>,
    pub(crate) tls: Vec<TcpListener>,
}

/// The addresses to listen on: the configured ones, a wildcard expanded to the host's
/// addresses of that family (the core needs the concrete local address of each datagram),
/// or every host address when none is configured (coturn's default).
pub fn listening_addresses(c: &TurnConfig) -> Result<Vec<IpAddr>, ListenError> {
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
        return Err(ListenError::NoAddress);
    }
    Ok(out)
}

fn host_addresses() -> Result<Vec<IpAddr>, ListenError> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| ListenError::Interfaces(e.to_string()))?;
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

fn bind_error(proto: &'static str, addr: SocketAddr) -> impl FnOnce(io::Error) -> ListenError {
    move |source| ListenError::Bind {
        proto,
        addr,
        source,
    }
}

/// Binds every listener on `ips`: a UDP socket per address for each of `workers` I/O
/// threads (SO_REUSEPORT with two or more), a TCP listener per address, and with `tls` a TLS
/// listener per address.
pub(crate) fn bind(
    config: &TurnConfig,
    ips: &[IpAddr],
    workers: usize,
    tls: bool,
) -> Result<Listeners, ListenError> {
    let mut l = Listeners {
        udp: (0..workers).map(|_| Vec::new()).collect(),
        udp_addrs: Vec::new(),
        tcp: Vec::new(),
        tls: Vec::new(),
    };
    for ip in ips {
        if config.udp {
            l.udp_addrs.push(bind_udp_group(
                SocketAddr::new(*ip, config.listening_port),
                &mut l.udp,
            )?);
        }
        if config.tcp {
            let addr = SocketAddr::new(*ip, config.listening_port);
            l.tcp.push(bind_tcp(addr).map_err(bind_error("TCP", addr))?);
        }
        if tls {
            let addr = SocketAddr::new(*ip, config.tls_listening_port);
            l.tls.push(bind_tcp(addr).map_err(bind_error("TLS", addr))?);
        }
    }
    Ok(l)
}

/// One UDP listener on `addr` per I/O thread; returns the address bound (its port chosen by
/// the kernel for port 0).
fn bind_udp_group(
    mut addr: SocketAddr,
    per_worker: &mut [Vec<(SocketAddr, UdpSocket)>],
) -> Result<SocketAddr, ListenError> {
    let reuse = per_worker.len() > 1;
    if reuse && addr.port() != 0 {
        // SO_REUSEPORT would let us join another process's group on this port (same user)
        // and split its clients: first make sure the port is free.
        drop(bind_udp(addr, 0, false).map_err(bind_error("UDP", addr))?);
    }
    for sockets in per_worker {
        let s = bind_udp(addr, LISTENER_BUFFER, reuse).map_err(bind_error("UDP", addr))?;
        // Port 0: the others join the port the first one got.
        addr = s.local_addr().map_err(bind_error("UDP", addr))?;
        sockets.push((addr, s));
    }
    Ok(addr)
}
