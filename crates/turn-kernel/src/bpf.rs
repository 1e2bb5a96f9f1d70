//! The program loaded with aya, attached with TCX links, and its maps.
//!
//! Map layouts mirror the structs in `relay.bpf.c` (`#[repr(C)]`, same field order and
//! sizes, no implicit padding). Expiries are CLOCK_MONOTONIC nanoseconds, the clock of both
//! [`Instant`] on Linux and `bpf_ktime_get_ns`.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use aya::maps::{HashMap, MapData, PerCpuArray};
use aya::programs::{tc, SchedClassifier, TcAttachType};
use aya::Ebpf;
use lastcall_turn_proto::{ClientAddr, RouteChange};
use nix::time::{clock_gettime, ClockId};
use parking_lot::Mutex;

use crate::{addrs, route_addrs, Addrs, KernelError, RouteStats, Totals};

/// The object clang built (build.rs).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/relay.bpf.o"));

const PROGRAM: &str = "lastcall_turn_ingress";

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ToPeerKey {
    client_ip: [u8; 4],
    server_ip: [u8; 4],
    client_port: [u8; 2],
    server_port: [u8; 2],
    channel: u16,
    pad: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ToClientKey {
    peer_ip: [u8; 4],
    relay_ip: [u8; 4],
    peer_port: [u8; 2],
    relay_port: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Route {
    src_ip: [u8; 4],
    dst_ip: [u8; 4],
    src_port: [u8; 2],
    dst_port: [u8; 2],
    channel: u16,
    pad: u16,
    expires_ns: u64,
    packets: u64,
    bytes: u64,
    last_ns: u64,
}

// SAFETY: plain `#[repr(C)]` data of integers and byte arrays without padding (sizes 16, 12
// and 48 bytes, alignment 2, 2 and 8); every bit pattern is a valid value.
unsafe impl aya::Pod for ToPeerKey {}
// SAFETY: as above.
unsafe impl aya::Pod for ToClientKey {}
// SAFETY: as above.
unsafe impl aya::Pod for Route {}

const STAT_TO_PEER: u32 = 0;
const STAT_TO_CLIENT: u32 = 1;
const STAT_EXPIRED: u32 = 2;
const STAT_UNHANDLED: u32 = 3;

struct Maps {
    to_peer: HashMap<MapData, ToPeerKey, Route>,
    to_client: HashMap<MapData, ToClientKey, Route>,
    /// Counters of routes removed, so that totals never go back.
    retired: Totals,
}

/// The loaded program (its TCX links live as long as this) and its maps.
pub(crate) struct Loaded {
    _ebpf: Ebpf,
    maps: Mutex<Maps>,
    stats: PerCpuArray<MapData, u64>,
}

fn keys(a: &Addrs, channel: u16) -> (ToPeerKey, ToClientKey) {
    let [(cip, cport), (lip, lport), (rip, rport), (pip, pport)] = *a;
    (
        ToPeerKey {
            client_ip: cip,
            server_ip: lip,
            client_port: cport.to_be_bytes(),
            server_port: lport.to_be_bytes(),
            channel,
            pad: 0,
        },
        ToClientKey {
            peer_ip: pip,
            relay_ip: rip,
            peer_port: pport.to_be_bytes(),
            relay_port: rport.to_be_bytes(),
        },
    )
}

/// `at` in CLOCK_MONOTONIC nanoseconds.
fn monotonic_ns(at: Instant) -> u64 {
    let now = Instant::now();
    let Ok(ts) = clock_gettime(ClockId::CLOCK_MONOTONIC) else {
        return 0;
    };
    let now_ns = (ts.tv_sec() as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec() as u64);
    if at >= now {
        now_ns.saturating_add(u64::try_from((at - now).as_nanos()).unwrap_or(u64::MAX))
    } else {
        now_ns.saturating_sub(u64::try_from((now - at).as_nanos()).unwrap_or(u64::MAX))
    }
}

/// The [`Instant`] of a CLOCK_MONOTONIC time in nanoseconds.
fn instant_of(ns: u64) -> Option<Instant> {
    let now = Instant::now();
    let now_ns = monotonic_ns(now);
    now.checked_sub(Duration::from_nanos(now_ns.checked_sub(ns)?))
}

fn load_err(e: impl std::fmt::Display) -> KernelError {
    KernelError::Load(e.to_string())
}

impl Loaded {
    pub(crate) fn attach(interfaces: &[String]) -> Result<Loaded, KernelError> {
        let mut ebpf = Ebpf::load(OBJECT).map_err(load_err)?;
        let prog: &mut SchedClassifier = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| load_err(format!("the object has no program {PROGRAM}")))?
            .try_into()
            .map_err(load_err)?;
        prog.load().map_err(load_err)?;
        for iface in interfaces {
            // Before TCX (kernel < 6.6) aya attaches through a clsact qdisc.
            let _ = tc::qdisc_add_clsact(iface);
            prog.attach(iface, TcAttachType::Ingress)
                .map_err(|e| KernelError::Attach {
                    iface: iface.clone(),
                    msg: e.to_string(),
                })?;
        }
        let mut map = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| load_err(format!("the object has no map {name}")))
        };
        let to_peer = HashMap::try_from(map("TO_PEER")?).map_err(load_err)?;
        let to_client = HashMap::try_from(map("TO_CLIENT")?).map_err(load_err)?;
        let stats = PerCpuArray::try_from(map("STATS")?).map_err(load_err)?;
        Ok(Loaded {
            _ebpf: ebpf,
            maps: Mutex::new(Maps {
                to_peer,
                to_client,
                retired: Totals::default(),
            }),
            stats,
        })
    }

    pub(crate) fn apply(&self, change: &RouteChange) {
        let mut maps = self.maps.lock();
        match change {
            RouteChange::Install(r) => {
                let Some(a) = route_addrs(r) else {
                    return;
                };
                let (pk, ck) = keys(&a, r.channel);
                let [(cip, cport), (lip, lport), (rip, rport), (pip, pport)] = a;
                let expires_ns = monotonic_ns(r.expires);
                // A refresh keeps what the route relayed so far.
                let old_p = maps.to_peer.get(&pk, 0).unwrap_or_default();
                let old_c = maps.to_client.get(&ck, 0).unwrap_or_default();
                let to_peer = Route {
                    src_ip: rip,
                    dst_ip: pip,
                    src_port: rport.to_be_bytes(),
                    dst_port: pport.to_be_bytes(),
                    channel: r.channel,
                    expires_ns,
                    ..old_p
                };
                let to_client = Route {
                    src_ip: lip,
                    dst_ip: cip,
                    src_port: lport.to_be_bytes(),
                    dst_port: cport.to_be_bytes(),
                    channel: r.channel,
                    expires_ns,
                    ..old_c
                };
                let p = maps.to_peer.insert(pk, to_peer, 0);
                let c = maps.to_client.insert(ck, to_client, 0);
                if let Err(e) = p.and(c) {
                    // Half a route relays one way only: take both out, the daemon relays.
                    let _ = maps.to_peer.remove(&pk);
                    let _ = maps.to_client.remove(&ck);
                    tracing::warn!(client = %r.client.client, channel = r.channel,
                        "kernel fast path: route not installed, relayed in user space: {e}");
                }
            }
            RouteChange::Remove {
                client,
                channel,
                relay,
                peer,
            } => {
                let Some(a) = addrs(client, *relay, *peer) else {
                    return;
                };
                let (pk, ck) = keys(&a, *channel);
                if let Ok(v) = maps.to_peer.get(&pk, 0) {
                    maps.retired.to_peer_packets += v.packets;
                    maps.retired.to_peer_bytes += v.bytes;
                    let _ = maps.to_peer.remove(&pk);
                }
                if let Ok(v) = maps.to_client.get(&ck, 0) {
                    maps.retired.to_client_packets += v.packets;
                    maps.retired.to_client_bytes += v.bytes;
                    let _ = maps.to_client.remove(&ck);
                }
            }
        }
    }

    fn stat(&self, which: u32) -> u64 {
        self.stats
            .get(&which, 0)
            .map(|v| v.iter().sum())
            .unwrap_or(0)
    }

    pub(crate) fn totals(&self) -> Totals {
        let maps = self.maps.lock();
        let mut t = maps.retired;
        for (_, v) in maps.to_peer.iter().flatten() {
            t.to_peer_packets += v.packets;
            t.to_peer_bytes += v.bytes;
        }
        for (_, v) in maps.to_client.iter().flatten() {
            t.to_client_packets += v.packets;
            t.to_client_bytes += v.bytes;
        }
        drop(maps);
        t.expired = self.stat(STAT_EXPIRED);
        t.unhandled = self.stat(STAT_UNHANDLED);
        // The per-route counters are what the metrics use; the per-CPU ones say the same
        // for routes removed meanwhile, and never less.
        t.to_peer_packets = t.to_peer_packets.max(self.stat(STAT_TO_PEER));
        t.to_client_packets = t.to_client_packets.max(self.stat(STAT_TO_CLIENT));
        t
    }

    pub(crate) fn route_stats(&self, client: &ClientAddr, channel: u16) -> Option<RouteStats> {
        let maps = self.maps.lock();
        let (pk, _) = keys(&addrs(client, client.local, client.local)?, channel);
        let p = maps.to_peer.get(&pk, 0).ok()?;
        let ck = ToClientKey {
            peer_ip: p.dst_ip,
            relay_ip: p.src_ip,
            peer_port: p.dst_port,
            relay_port: p.src_port,
        };
        let c = maps.to_client.get(&ck, 0).unwrap_or_default();
        let last = p.last_ns.max(c.last_ns);
        Some(RouteStats {
            to_peer_packets: p.packets,
            to_client_packets: c.packets,
            last: (last > 0).then(|| instant_of(last)).flatten(),
        })
    }

    pub(crate) fn client_activity(&self) -> Vec<(ClientAddr, Instant)> {
        let maps = self.maps.lock();
        maps.to_peer
            .iter()
            .flatten()
            .filter(|(_, v)| v.last_ns > 0)
            .filter_map(|(k, v)| {
                let addr = |ip: [u8; 4], port: [u8; 2]| {
                    std::net::SocketAddr::from((ip, u16::from_be_bytes(port)))
                };
                let client = ClientAddr {
                    transport: lastcall_turn_proto::Transport::Udp,
                    client: addr(k.client_ip, k.client_port),
                    local: addr(k.server_ip, k.server_port),
                };
                Some((client, instant_of(v.last_ns)?))
            })
            .collect()
    }

    pub(crate) fn routes(&self) -> usize {
        self.maps.lock().to_peer.keys().count()
    }
}

#[cfg(test)]
mod tests {
    //! The program on real sockets: loopback as it is (checksum offload: the stack sees
    //! CHECKSUM_PARTIAL packets), and a fresh network namespace whose loopback computes
    //! full UDP checksums in software, where the receiver verifies them.
    use super::*;
    use lastcall_turn_proto::{ChannelRoute, Transport};
    use std::net::{SocketAddr, UdpSocket};
    use std::process::Command;
    use std::time::Duration;

    /// Loads the program, or says why not: a skip when not root outside CI; as root or in
    /// CI, a failure.
    fn load(ifaces: &[String]) -> Option<Loaded> {
        match Loaded::attach(ifaces) {
            Ok(l) => Some(l),
            Err(e) if std::env::var_os("CI").is_none() && !nix::unistd::geteuid().is_root() => {
                eprintln!("SKIP: the BPF program cannot load here (root and BPF needed): {e}");
                None
            }
            Err(e) => panic!("the BPF program must load in CI: {e}"),
        }
    }

    fn udp() -> (UdpSocket, SocketAddr) {
        let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let a = s.local_addr().expect("addr");
        (s, a)
    }

    /// `Udp InCsumErrors` of this thread's network namespace.
    fn csum_errors() -> u64 {
        let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("snmp");
        let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
        let (names, values) = (udp.next().expect("names"), udp.next().expect("values"));
        let i = names
            .split_whitespace()
            .position(|n| n == "InCsumErrors")
            .expect("InCsumErrors");
        values
            .split_whitespace()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .expect("value")
    }

    /// The Internet checksum of UDP `seg` (its checksum field zero) from `src` to `dst`.
    fn udp_checksum(src: SocketAddr, dst: SocketAddr, seg: &[u8]) -> u16 {
        let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
            panic!("IPv4 only")
        };
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&s.ip().octets());
        pseudo.extend_from_slice(&d.ip().octets());
        pseudo.extend_from_slice(&[0, 17]);
        pseudo.extend_from_slice(&(seg.len() as u16).to_be_bytes());
        let mut sum: u32 = 0;
        for chunk in pseudo.chunks(2).chain(seg.chunks(2)) {
            let hi = u32::from(chunk[0]) << 8;
            sum += hi | chunk.get(1).map_or(0, |b| u32::from(*b));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        match !(sum as u16) {
            0 => 0xffff,
            c => c,
        }
    }

    /// Sends `data` from `from` (a bound UDP socket's address) to `to` through a raw socket,
    /// with a full checksum (`wrong`: off by one): raw sockets get no checksum offload, so
    /// the receiving UDP stack verifies it.
    fn send_raw(from: SocketAddr, to: SocketAddr, data: &[u8], wrong: bool) {
        let raw = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::RAW,
            Some(socket2::Protocol::UDP),
        )
        .expect("raw socket");
        let mut seg = Vec::new();
        seg.extend_from_slice(&from.port().to_be_bytes());
        seg.extend_from_slice(&to.port().to_be_bytes());
        seg.extend_from_slice(&(8 + data.len() as u16).to_be_bytes());
        seg.extend_from_slice(&[0, 0]);
        seg.extend_from_slice(data);
        let sum = udp_checksum(from, to, &seg).wrapping_add(u16::from(wrong));
        seg[6..8].copy_from_slice(&sum.to_be_bytes());
        raw.send_to(&seg, &to.into()).expect("raw send");
    }

    /// How the test's client and peer send.
    #[derive(Clone, Copy)]
    enum Send {
        /// UDP sockets (on loopback: CHECKSUM_PARTIAL, the pseudo header only).
        Socket,
        /// Raw sockets with full checksums, which the receiver verifies.
        Raw,
    }

    /// Installs a route between real sockets and relays `n` datagrams each way through it:
    /// none reaches the listener or the relay socket, every one reaches the other side with
    /// the right addresses and bytes, and the counters say so.
    fn relay_both_ways(l: &Loaded, n: u64, how: Send) {
        let (client, client_addr) = udp();
        let (listener, listen_addr) = udp();
        let (relay, relay_addr) = udp();
        let (peer, peer_addr) = udp();
        let from = ClientAddr {
            transport: Transport::Udp,
            client: client_addr,
            local: listen_addr,
        };
        let route = ChannelRoute {
            client: from,
            channel: 0x4001,
            relay: relay_addr,
            peer: peer_addr,
            expires: Instant::now() + Duration::from_secs(60),
        };
        l.apply(&RouteChange::Install(route));
        let mut buf = [0u8; 2048];
        for i in 0..n {
            // Odd and even lengths: the checksum's byte alignment matters.
            let data: Vec<u8> = (0..(100 + i as usize % 7))
                .map(|b| b as u8 ^ i as u8)
                .collect();
            let mut cd = vec![0x40, 0x01];
            cd.extend_from_slice(&(data.len() as u16).to_be_bytes());
            cd.extend_from_slice(&data);
            match how {
                Send::Socket => {
                    client.send_to(&cd, listen_addr).expect("send ChannelData");
                }
                Send::Raw => send_raw(client_addr, listen_addr, &cd, false),
            }
            let (len, src) = peer.recv_from(&mut buf).expect("the peer's datagram");
            assert_eq!((src, &buf[..len]), (relay_addr, &data[..]));
            match how {
                Send::Socket => {
                    peer.send_to(&data, relay_addr).expect("send to the relay");
                }
                Send::Raw => send_raw(peer_addr, relay_addr, &data, false),
            }
            let (len, src) = client.recv_from(&mut buf).expect("ChannelData");
            assert_eq!((src, &buf[..len]), (listen_addr, &cd[..]));
        }
        for s in [&listener, &relay] {
            s.set_nonblocking(true).expect("non-blocking");
            assert!(
                s.recv_from(&mut buf).is_err(),
                "the daemon's socket got one"
            );
        }
        let stats = l.route_stats(&from, 0x4001).expect("route");
        assert_eq!((stats.to_peer_packets, stats.to_client_packets), (n, n));
        assert!(stats.last.is_some());
        // The client was heard from just now, through the kernel.
        let heard = l.client_activity();
        let at = heard.iter().find(|(c, _)| *c == from).map(|(_, at)| *at);
        assert!(
            at.is_some_and(|at| at.elapsed() < Duration::from_secs(30)),
            "{heard:?}"
        );
        // Removed: datagrams go to the sockets again, counters stay in the totals.
        let before = l.totals();
        l.apply(&RouteChange::Remove {
            client: from,
            channel: 0x4001,
            relay: relay_addr,
            peer: peer_addr,
        });
        assert_eq!(l.totals().to_peer_packets, before.to_peer_packets);
        listener.set_nonblocking(false).expect("blocking");
        listener
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        client
            .send_to(&[0x40, 0x01, 0, 1, 7], listen_addr)
            .expect("send");
        let (len, _) = listener.recv_from(&mut buf).expect("to the daemon");
        assert_eq!(&buf[..len], &[0x40, 0x01, 0, 1, 7]);
    }

    #[test]
    fn channel_data_is_relayed_both_ways_on_loopback_and_stops_when_removed() {
        let Some(l) = load(&["lo".to_string()]) else {
            return;
        };
        relay_both_ways(&l, 50, Send::Socket);
    }

    #[test]
    fn an_expired_route_is_handed_to_the_daemon_unchanged() {
        let Some(l) = load(&["lo".to_string()]) else {
            return;
        };
        let (client, client_addr) = udp();
        let (listener, listen_addr) = udp();
        let (_relay, relay_addr) = udp();
        let (peer, peer_addr) = udp();
        let from = ClientAddr {
            transport: Transport::Udp,
            client: client_addr,
            local: listen_addr,
        };
        l.apply(&RouteChange::Install(ChannelRoute {
            client: from,
            channel: 0x4002,
            relay: relay_addr,
            peer: peer_addr,
            expires: Instant::now(),
        }));
        let cd = [0x40, 0x02, 0, 3, 1, 2, 3];
        client.send_to(&cd, listen_addr).expect("send");
        let mut buf = [0u8; 64];
        let (len, src) = listener.recv_from(&mut buf).expect("to the daemon");
        assert_eq!((src, &buf[..len]), (client_addr, &cd[..]));
        peer.set_nonblocking(true).expect("non-blocking");
        assert!(peer.recv_from(&mut buf).is_err());
        assert!(l.totals().expired >= 1);
    }

    /// Full UDP checksums, verified by the receiving stack: in a new network namespace (its
    /// own loopback and counters), a datagram with a wrong checksum is dropped and counted
    /// (`InCsumErrors`: the receiver checks), then datagrams relayed both ways all arrive and
    /// none is counted.
    #[test]
    fn checksums_are_right_where_the_receiver_verifies_them() {
        let t = std::thread::spawn(|| {
            if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
                assert!(std::env::var_os("CI").is_none(), "unshare: {e}");
                eprintln!("SKIP: no new network namespace here: {e}");
                return;
            }
            let s = Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status()
                .expect("ip");
            assert!(s.success(), "ip link set lo up: {s}");
            let (sink, sink_addr) = udp();
            let (_, from) = udp();
            let errors = csum_errors();
            send_raw(from, sink_addr, b"oops", true);
            let deadline = Instant::now() + Duration::from_secs(20);
            while csum_errors() == errors {
                assert!(Instant::now() < deadline, "a bad checksum was not counted");
                std::thread::yield_now();
            }
            send_raw(from, sink_addr, b"fine", false);
            let mut buf = [0u8; 16];
            let (len, _) = sink.recv_from(&mut buf).expect("a right checksum arrives");
            assert_eq!(&buf[..len], b"fine");
            let Some(l) = load(&["lo".to_string()]) else {
                return;
            };
            // Through a route too: a wrong checksum stays wrong (the program updates it, it
            // does not recompute it) and the receiver drops it.
            let (client, client_addr) = udp();
            let (_listener, listen_addr) = udp();
            let (_relay, relay_addr) = udp();
            let (peer, peer_addr) = udp();
            l.apply(&RouteChange::Install(ChannelRoute {
                client: ClientAddr {
                    transport: Transport::Udp,
                    client: client_addr,
                    local: listen_addr,
                },
                channel: 0x4001,
                relay: relay_addr,
                peer: peer_addr,
                expires: Instant::now() + Duration::from_secs(60),
            }));
            let errors = csum_errors();
            send_raw(client_addr, listen_addr, &[0x40, 1, 0, 4, 1, 2, 3, 4], true);
            while csum_errors() == errors {
                assert!(
                    Instant::now() < deadline,
                    "a bad relayed checksum was not counted"
                );
                std::thread::yield_now();
            }
            peer.set_nonblocking(true).expect("non-blocking");
            assert!(
                peer.recv_from(&mut buf).is_err(),
                "a bad checksum was delivered"
            );
            assert_eq!(l.totals().to_peer_packets, 1);
            drop(client);
            let errors = csum_errors();
            relay_both_ways(&l, 200, Send::Raw);
            assert_eq!(
                csum_errors(),
                errors,
                "relayed datagrams had wrong checksums"
            );
        });
        t.join().expect("namespace thread");
    }
}
