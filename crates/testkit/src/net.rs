//! Loopback ports and addresses: free ports for the servers a test starts, and waiting
//! until one accepts connections.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

/// A TCP port that was free a moment ago on 127.0.0.1 (bind port 0, read it, close).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|err| panic!("cannot find a free port: {err}"))
}

/// A port free for both UDP and TCP on 127.0.0.1 a moment ago (TURN listens on both).
pub fn free_udp_tcp_port() -> u16 {
    loop {
        let port = free_port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// `127.0.0.1:` a [`free_port`].
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// The first address `addr` names. Panics if it names none.
pub(crate) fn resolve(addr: impl ToSocketAddrs) -> SocketAddr {
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("not a socket address"))
}

/// Waits until `addr` accepts TCP connections. Panics on timeout.
pub fn wait_for_tcp(addr: impl ToSocketAddrs, timeout: Duration) {
    let addr = resolve(addr);
    let end = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
            return;
        }
        assert!(
            Instant::now() < end,
            "{addr} not accepting connections within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
