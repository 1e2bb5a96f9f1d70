//! Binding the sockets: UDP (client listeners and relay sockets) and TCP listeners, with the
//! options every one of them gets.

use std::io;
use std::net::SocketAddr;

/// Largest UDP datagram read.
pub(crate) const MAX_DATAGRAM: usize = 65_536;

/// Socket buffer sizes asked for (the kernel caps them at net.core.rmem_max/wmem_max): a
/// client listener carries every client's traffic, a relay socket one allocation's.
pub(crate) const LISTENER_BUFFER: usize = 4 << 20;
pub(crate) const RELAY_BUFFER: usize = 1 << 20;

/// A non-blocking UDP socket bound on `addr` (IPv6 only for an IPv6 address).
pub(crate) fn bind_udp(
    addr: SocketAddr,
    buffer: usize,
    reuse_port: bool,
) -> io::Result<std::net::UdpSocket> {
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

/// A non-blocking TCP listener on `addr`.
pub(crate) fn bind_tcp(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
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
