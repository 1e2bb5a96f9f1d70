//! Loopback ports and addresses: free ports for the servers a test starts, and waiting
//! until one accepts connections.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

/// A TCP port that was free a moment ago on 127.0.0.1, below the kernel's ephemeral range.
///
/// A port the kernel handed out for `bind(0)` is in its ephemeral range, which every
/// socket bound to port 0 and every outgoing connection draws from too (the tests' own
/// clients, relay sockets, HAProxy's connections): between this call and the moment the
/// process under test binds the port, one of them could take it ("Address already in use",
/// seen once in fifty TURN drains in a row). Ports here come from below that range (and
/// below the TURN relay ranges the tests use, 40000 up), so only another test's pick can
/// collide, and picks are spread at random over [`TEST_PORTS`].
pub fn free_port() -> u16 {
    let (low, high) = test_ports();
    for _ in 0..10_000 {
        let port = low + (next_random() % u64::from(high - low)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free TCP port in {low}..{high} on 127.0.0.1")
}

/// Where [`free_port`] picks: 20000 up to the start of the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768 by default), at most 32768.
pub const TEST_PORTS: std::ops::Range<u16> = 20_000..32_768;

fn test_ports() -> (u16, u16) {
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(TEST_PORTS.end);
    let high = TEST_PORTS.end.min(ephemeral_start);
    assert!(
        high > TEST_PORTS.start + 1000,
        "the kernel's ephemeral ports start at {ephemeral_start}: no room below for test ports"
    );
    (TEST_PORTS.start, high)
}

/// A xorshift generator seeded from the clock and the process id, stepped atomically (two
/// threads never get the same number): picks spread over the range in every test process.
fn next_random() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0);
    let step = |mut x: u64| {
        if x == 0 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            x = nanos ^ (u64::from(std::process::id()) << 32) | 1;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    match STATE.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| Some(step(x))) {
        Ok(previous) | Err(previous) => step(previous),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Picks fall below the kernel's ephemeral range, spread out: 200 picks from 8 threads
    /// at once are all free, in range, and nearly all different.
    #[test]
    fn free_ports_are_below_the_ephemeral_range() {
        let (low, high) = test_ports();
        let picks: Vec<u16> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..25).map(|_| free_port()).collect::<Vec<_>>()))
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap_or_default())
                .collect()
        });
        assert_eq!(picks.len(), 200);
        assert!(picks.iter().all(|p| (low..high).contains(p)), "{picks:?}");
        let mut distinct = picks.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 190, "{} distinct of 200", distinct.len());
    }
}
