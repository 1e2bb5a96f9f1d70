//! The program loaded with aya, attached with TCX links, and its maps.
//!
//! Map layouts mirror the structs in `relay.bpf.c` (`#[repr(C)]`, same field order and
//! sizes, no implicit padding). Expiries are CLOCK_MONOTONIC nanoseconds, the clock of both
//! [`Instant`] on Linux and `bpf_ktime_get_ns`. Each installed route half owns a slot of
//! `COUNTERS` (allocated here), so that refreshing a route rewrites its expiry and leaves what
//! it counted alone.
#![allow(unsafe_code)]

use std::collections::HashMap as StdMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use aya::maps::{Array, HashMap, MapData, PerCpuArray};
use aya::programs::{tc, SchedClassifier, TcAttachType};
use aya::Ebpf;
use lastcall_turn_proto::{ChannelRoute, ClientAddr, PermissionRoute, RouteChange, Transport};
use nix::time::{clock_gettime, ClockId};
use parking_lot::Mutex;

use crate::{ip16, wire, KernelError, RouteStats, Totals};

/// The object clang built (build.rs).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/relay.bpf.o"));

const PROGRAM: &str = "lastcall_turn_ingress";

/// `SLOTS` of the program: counter slots for route halves.
const SLOTS: u32 = 2 * 65536;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct ToPeerKey {
    client_ip: [u8; 16],
    server_ip: [u8; 16],
    client_port: [u8; 2],
    server_port: [u8; 2],
    channel: u16,
    pad: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct SendKey {
    client_ip: [u8; 16],
    server_ip: [u8; 16],
    peer_ip: [u8; 16],
    client_port: [u8; 2],
    server_port: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct ToClientKey {
    peer_ip: [u8; 16],
    relay_ip: [u8; 16],
    peer_port: [u8; 2],
    relay_port: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct DataKey {
    peer_ip: [u8; 16],
    relay_ip: [u8; 16],
    relay_port: [u8; 2],
    pad: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Route {
    src_ip: [u8; 16],
    dst_ip: [u8; 16],
    src_port: [u8; 2],
    dst_port: [u8; 2],
    channel: u16,
    pad: u16,
    slot: u32,
    pad2: u32,
    expires_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counters {
    packets: u64,
    bytes: u64,
    wire_bytes: u64,
    last_ns: u64,
}

// SAFETY: plain `#[repr(C)]` data of integers and byte arrays without padding (sizes 40, 52,
// 36, 36, 56 and 32 bytes, alignments 2, 1, 1, 2, 8 and 8); every bit pattern is a valid
// value.
unsafe impl aya::Pod for ToPeerKey {}
// SAFETY: as above.
unsafe impl aya::Pod for SendKey {}
// SAFETY: as above.
unsafe impl aya::Pod for ToClientKey {}
// SAFETY: as above.
unsafe impl aya::Pod for DataKey {}
// SAFETY: as above.
unsafe impl aya::Pod for Route {}
// SAFETY: as above.
unsafe impl aya::Pod for Counters {}

const STAT_TO_PEER: u32 = 0;
const STAT_TO_CLIENT: u32 = 1;
const STAT_EXPIRED: u32 = 2;
const STAT_UNHANDLED: u32 = 3;
const STAT_GSO: u32 = 4;
const STAT_PADDED: u32 = 5;
const STAT_SEND: u32 = 6;
const STAT_DATA: u32 = 7;
const STAT_HAIRPIN: u32 = 8;

/// One installed channel route: its two halves' keys and counter slots.
#[derive(Clone, Copy, Debug)]
struct ChannelHalves {
    to_peer: (ToPeerKey, u32),
    to_client: (ToClientKey, u32),
}

/// One installed permission route: the Send half, and the Data half if allowed.
#[derive(Clone, Copy, Debug)]
struct PermissionHalves {
    send: (SendKey, u32),
    data: Option<(DataKey, u32)>,
}

struct Maps {
    to_peer: HashMap<MapData, ToPeerKey, Route>,
    to_client: HashMap<MapData, ToClientKey, Route>,
    send: HashMap<MapData, SendKey, Route>,
    data: HashMap<MapData, DataKey, Route>,
    counters: Array<MapData, Counters>,
    /// Counter slots not in use.
    free: Vec<u32>,
    channels: StdMap<(ClientAddr, u16), ChannelHalves>,
    permissions: StdMap<(ClientAddr, IpAddr), PermissionHalves>,
    /// Counters of routes removed, so that totals never go back.
    retired: Totals,
}

/// The loaded program (its TCX links live as long as this) and its maps.
pub(crate) struct Loaded {
    _ebpf: Ebpf,
    maps: Mutex<Maps>,
    stats: PerCpuArray<MapData, u64>,
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

/// An address as the program has it: 16 bytes and the port in network order.
type Wire = ([u8; 16], [u8; 2]);

/// A route half's rewrite: from `src` to `dst` (for Send indications `dst`'s port is the
/// indication's), writing `channel`.
fn route(src: Wire, dst: Wire, channel: u16, slot: u32, expires_ns: u64) -> Route {
    Route {
        src_ip: src.0,
        dst_ip: dst.0,
        src_port: src.1,
        dst_port: dst.1,
        channel,
        slot,
        expires_ns,
        ..Route::default()
    }
}

/// The keys of a channel route: (client, listener, relay, peer) as the program sees them.
fn channel_keys(
    client: &ClientAddr,
    channel: u16,
    relay: SocketAddr,
    peer: SocketAddr,
) -> Option<(ToPeerKey, ToClientKey, [Wire; 4])> {
    let a = [
        wire(client.client)?,
        wire(client.local)?,
        wire(relay)?,
        wire(peer)?,
    ];
    let [(cip, cport), (lip, lport), (rip, rport), (pip, pport)] = a;
    Some((
        ToPeerKey {
            client_ip: cip,
            server_ip: lip,
            client_port: cport,
            server_port: lport,
            channel,
            pad: 0,
        },
        ToClientKey {
            peer_ip: pip,
            relay_ip: rip,
            peer_port: pport,
            relay_port: rport,
        },
        a,
    ))
}

/// The keys of a permission route and its addresses (client, listener, relay).
fn permission_keys(
    client: &ClientAddr,
    relay: SocketAddr,
    peer: IpAddr,
) -> Option<(SendKey, DataKey, [Wire; 3])> {
    let a = [wire(client.client)?, wire(client.local)?, wire(relay)?];
    let [(cip, cport), (lip, lport), (rip, rport)] = a;
    let pip = ip16(peer);
    Some((
        SendKey {
            client_ip: cip,
            server_ip: lip,
            peer_ip: pip,
            client_port: cport,
            server_port: lport,
        },
        DataKey {
            peer_ip: pip,
            relay_ip: rip,
            relay_port: rport,
            pad: 0,
        },
        a,
    ))
}

impl Totals {
    fn add_up(&mut self, c: &Counters) {
        self.to_peer_packets += c.packets;
        self.to_peer_bytes += c.bytes;
        self.to_peer_wire_bytes += c.wire_bytes;
    }

    fn add_down(&mut self, c: &Counters) {
        self.to_client_packets += c.packets;
        self.to_client_bytes += c.bytes;
        self.to_client_wire_bytes += c.wire_bytes;
    }
}

impl Maps {
    /// A counter slot, zeroed.
    fn slot(&mut self) -> Option<u32> {
        let slot = self.free.pop()?;
        if self.counters.set(slot, Counters::default(), 0).is_err() {
            self.free.push(slot);
            return None;
        }
        Some(slot)
    }

    fn counted(&self, slot: u32) -> Counters {
        self.counters.get(&slot, 0).unwrap_or_default()
    }

    fn install_channel(&mut self, r: &ChannelRoute) -> Result<(), String> {
        let Some((pk, ck, [c, l, relay, peer])) =
            channel_keys(&r.client, r.channel, r.relay, r.peer)
        else {
            return Ok(());
        };
        let expires_ns = monotonic_ns(r.expires);
        let id = (r.client, r.channel);
        let halves = match self.channels.get(&id) {
            Some(h) if h.to_peer.0 == pk && h.to_client.0 == ck => *h,
            Some(_) => {
                // The same client and channel to another peer or relay: take the old one out.
                self.remove_channel(&r.client, r.channel);
                return self.install_channel(r);
            }
            None => {
                let (Some(a), Some(b)) = (self.slot(), self.slot()) else {
                    return Err("no counter slot left".into());
                };
                ChannelHalves {
                    to_peer: (pk, a),
                    to_client: (ck, b),
                }
            }
        };
        let up = route(relay, peer, r.channel, halves.to_peer.1, expires_ns);
        let down = route(l, c, r.channel, halves.to_client.1, expires_ns);
        self.channels.insert(id, halves);
        let p = self.to_peer.insert(pk, up, 0);
        let q = self.to_client.insert(ck, down, 0);
        p.and(q).map_err(|e| e.to_string())
    }

    fn remove_channel(&mut self, client: &ClientAddr, channel: u16) {
        let Some(h) = self.channels.remove(&(*client, channel)) else {
            return;
        };
        let _ = self.to_peer.remove(&h.to_peer.0);
        let _ = self.to_client.remove(&h.to_client.0);
        let (up, down) = (self.counted(h.to_peer.1), self.counted(h.to_client.1));
        self.retired.add_up(&up);
        self.retired.add_down(&down);
        self.free.extend([h.to_peer.1, h.to_client.1]);
    }

    fn install_permission(&mut self, r: &PermissionRoute) -> Result<(), String> {
        let Some((sk, dk, [c, l, relay])) = permission_keys(&r.client, r.relay, r.peer) else {
            return Ok(());
        };
        let expires_ns = monotonic_ns(r.expires);
        let id = (r.client, r.peer);
        let mut halves = match self.permissions.get(&id) {
            Some(h) if h.send.0 == sk && h.data.is_none_or(|d| d.0 == dk) => *h,
            Some(_) => {
                self.remove_permission(&r.client, r.peer);
                return self.install_permission(r);
            }
            None => {
                let Some(a) = self.slot() else {
                    return Err("no counter slot left".into());
                };
                PermissionHalves {
                    send: (sk, a),
                    data: None,
                }
            }
        };
        if r.data_indications && halves.data.is_none() {
            halves.data = self.slot().map(|b| (dk, b));
        }
        let peer = (ip16(r.peer), [0, 0]);
        let up = route(relay, peer, 0, halves.send.1, expires_ns);
        self.permissions.insert(id, halves);
        let p = self.send.insert(sk, up, 0);
        let q = match halves.data {
            Some((dk, slot)) => self.data.insert(dk, route(l, c, 0, slot, expires_ns), 0),
            None => Ok(()),
        };
        p.and(q).map_err(|e| e.to_string())
    }

    fn remove_permission(&mut self, client: &ClientAddr, peer: IpAddr) {
        let Some(h) = self.permissions.remove(&(*client, peer)) else {
            return;
        };
        let _ = self.send.remove(&h.send.0);
        let up = self.counted(h.send.1);
        self.retired.add_up(&up);
        self.free.push(h.send.1);
        if let Some((dk, slot)) = h.data {
            let _ = self.data.remove(&dk);
            let down = self.counted(slot);
            self.retired.add_down(&down);
            self.free.push(slot);
        }
    }
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
        let send = HashMap::try_from(map("SEND")?).map_err(load_err)?;
        let data = HashMap::try_from(map("DATA")?).map_err(load_err)?;
        let counters = Array::try_from(map("COUNTERS")?).map_err(load_err)?;
        let stats = PerCpuArray::try_from(map("STATS")?).map_err(load_err)?;
        Ok(Loaded {
            _ebpf: ebpf,
            maps: Mutex::new(Maps {
                to_peer,
                to_client,
                send,
                data,
                counters,
                free: (0..SLOTS).rev().collect(),
                channels: StdMap::new(),
                permissions: StdMap::new(),
                retired: Totals::default(),
            }),
            stats,
        })
    }

    pub(crate) fn apply(&self, change: &RouteChange) {
        let mut maps = self.maps.lock();
        let failed = match change {
            RouteChange::Install(r) => maps
                .install_channel(r)
                .map_err(|e| {
                    maps.remove_channel(&r.client, r.channel);
                    (r.client, e)
                })
                .err(),
            RouteChange::Remove {
                client, channel, ..
            } => {
                maps.remove_channel(client, *channel);
                None
            }
            RouteChange::InstallPermission(r) => maps
                .install_permission(r)
                .map_err(|e| {
                    maps.remove_permission(&r.client, r.peer);
                    (r.client, e)
                })
                .err(),
            RouteChange::RemovePermission { client, peer, .. } => {
                maps.remove_permission(client, *peer);
                None
            }
        };
        if let Some((client, e)) = failed {
            // Half a route relays one way only: it was taken out; the daemon relays.
            tracing::warn!(client = %client.client,
                "kernel fast path: route not installed, relayed in user space: {e}");
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
        for h in maps.channels.values() {
            t.add_up(&maps.counted(h.to_peer.1));
            t.add_down(&maps.counted(h.to_client.1));
        }
        for h in maps.permissions.values() {
            t.add_up(&maps.counted(h.send.1));
            if let Some((_, slot)) = h.data {
                t.add_down(&maps.counted(slot));
            }
        }
        drop(maps);
        t.expired = self.stat(STAT_EXPIRED);
        t.unhandled = self.stat(STAT_UNHANDLED);
        t.gso = self.stat(STAT_GSO);
        t.padded = self.stat(STAT_PADDED);
        t.send_indications = self.stat(STAT_SEND);
        t.data_indications = self.stat(STAT_DATA);
        t.hairpin = self.stat(STAT_HAIRPIN);
        // The per-route counters are what the metrics use; the per-CPU ones say the same
        // for routes removed meanwhile, and never less.
        t.to_peer_packets = t.to_peer_packets.max(self.stat(STAT_TO_PEER));
        t.to_client_packets = t.to_client_packets.max(self.stat(STAT_TO_CLIENT));
        t
    }

    fn stats_of(maps: &Maps, up: u32, down: Option<u32>) -> RouteStats {
        let u = maps.counted(up);
        let d = down.map(|s| maps.counted(s)).unwrap_or_default();
        let last = u.last_ns.max(d.last_ns);
        RouteStats {
            to_peer_packets: u.packets,
            to_client_packets: d.packets,
            to_peer_bytes: u.bytes,
            to_peer_wire_bytes: u.wire_bytes,
            to_client_bytes: d.bytes,
            to_client_wire_bytes: d.wire_bytes,
            last: (last > 0).then(|| instant_of(last)).flatten(),
        }
    }

    pub(crate) fn route_stats(&self, client: &ClientAddr, channel: u16) -> Option<RouteStats> {
        let maps = self.maps.lock();
        let h = maps.channels.get(&(*client, channel))?;
        Some(Self::stats_of(&maps, h.to_peer.1, Some(h.to_client.1)))
    }

    pub(crate) fn permission_stats(&self, client: &ClientAddr, peer: IpAddr) -> Option<RouteStats> {
        let maps = self.maps.lock();
        let h = maps.permissions.get(&(*client, peer))?;
        Some(Self::stats_of(&maps, h.send.1, h.data.map(|d| d.1)))
    }

    pub(crate) fn client_activity(&self) -> Vec<(ClientAddr, Instant)> {
        let maps = self.maps.lock();
        let ups = maps
            .channels
            .iter()
            .map(|((c, _), h)| (*c, h.to_peer.1))
            .chain(maps.permissions.iter().map(|((c, _), h)| (*c, h.send.1)));
        let mut heard: StdMap<ClientAddr, u64> = StdMap::new();
        for (client, slot) in ups {
            let last = maps.counted(slot).last_ns;
            if last > 0 && client.transport == Transport::Udp {
                let e = heard.entry(client).or_default();
                *e = (*e).max(last);
            }
        }
        heard
            .into_iter()
            .filter_map(|(c, ns)| Some((c, instant_of(ns)?)))
            .collect()
    }

    pub(crate) fn routes(&self) -> usize {
        let maps = self.maps.lock();
        maps.channels.len() + maps.permissions.len()
    }
}

#[cfg(test)]
mod tests {
    //! The program on real sockets: loopback as it is (checksum offload: the stack sees
    //! CHECKSUM_PARTIAL packets), and a fresh network namespace whose loopback computes
    //! full UDP checksums in software, where the receiver verifies them. IPv4 and IPv6;
    //! ChannelData (padded or not) and Send/Data indications; two clients of the server
    //! calling each other; a same-host sender's GSO batch.
    use super::*;
    use lastcall_turn_proto::stun::{attr, decode_address, method, Builder, Class, Message};
    use lastcall_turn_proto::{ChannelRoute, PermissionRoute, Transport};
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

    fn lo() -> Option<Loaded> {
        load(&["lo".to_string()])
    }

    fn udp_on(ip: &str) -> (UdpSocket, SocketAddr) {
        let s = UdpSocket::bind((ip, 0)).expect("bind");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let a = s.local_addr().expect("addr");
        (s, a)
    }

    fn udp() -> (UdpSocket, SocketAddr) {
        udp_on("127.0.0.1")
    }

    fn client_of(client: SocketAddr, listener: SocketAddr) -> ClientAddr {
        ClientAddr {
            transport: Transport::Udp,
            client,
            local: listener,
        }
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// `Udp InCsumErrors` (IPv4) plus `Udp6InCsumErrors` of this thread's network namespace.
    fn csum_errors() -> u64 {
        let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("snmp");
        let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
        let (names, values) = (udp.next().expect("names"), udp.next().expect("values"));
        let i = names
            .split_whitespace()
            .position(|n| n == "InCsumErrors")
            .expect("InCsumErrors");
        let v4: u64 = values
            .split_whitespace()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .expect("value");
        let snmp6 = std::fs::read_to_string("/proc/thread-self/net/snmp6").unwrap_or_default();
        let v6: u64 = snmp6
            .lines()
            .find(|l| l.starts_with("Udp6InCsumErrors"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0);
        v4 + v6
    }

    /// The Internet checksum of UDP `seg` (its checksum field zero) from `src` to `dst`.
    fn udp_checksum(src: SocketAddr, dst: SocketAddr, seg: &[u8]) -> u16 {
        let mut pseudo = Vec::new();
        match (src, dst) {
            (SocketAddr::V4(s), SocketAddr::V4(d)) => {
                pseudo.extend_from_slice(&s.ip().octets());
                pseudo.extend_from_slice(&d.ip().octets());
                pseudo.extend_from_slice(&[0, 17]);
                pseudo.extend_from_slice(&(seg.len() as u16).to_be_bytes());
            }
            (SocketAddr::V6(s), SocketAddr::V6(d)) => {
                pseudo.extend_from_slice(&s.ip().octets());
                pseudo.extend_from_slice(&d.ip().octets());
                pseudo.extend_from_slice(&(seg.len() as u32).to_be_bytes());
                pseudo.extend_from_slice(&[0, 0, 0, 17]);
            }
            _ => panic!("one family"),
        }
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
        let domain = if from.is_ipv4() {
            socket2::Domain::IPV4
        } else {
            socket2::Domain::IPV6
        };
        let raw = socket2::Socket::new(domain, socket2::Type::RAW, Some(socket2::Protocol::UDP))
            .expect("raw socket");
        raw.bind(&SocketAddr::new(from.ip(), 0).into())
            .expect("bind the raw socket");
        let mut seg = Vec::new();
        seg.extend_from_slice(&from.port().to_be_bytes());
        seg.extend_from_slice(&to.port().to_be_bytes());
        seg.extend_from_slice(&(8 + data.len() as u16).to_be_bytes());
        seg.extend_from_slice(&[0, 0]);
        seg.extend_from_slice(data);
        let sum = udp_checksum(from, to, &seg).wrapping_add(u16::from(wrong));
        seg[6..8].copy_from_slice(&sum.to_be_bytes());
        // IPv6 raw sockets take the port from the address: 0 (the header is ours).
        raw.send_to(&seg, &SocketAddr::new(to.ip(), 0).into())
            .expect("raw send");
    }

    /// How the test's client and peer send.
    #[derive(Clone, Copy, Debug)]
    enum Send {
        /// UDP sockets (on loopback: CHECKSUM_PARTIAL, the pseudo header only).
        Socket,
        /// Raw sockets with full checksums, which the receiver verifies.
        Raw,
    }

    /// How the client wraps its data.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Wrap {
        /// ChannelData on a bound channel, both ways.
        Channel,
        /// ChannelData padded to 4 bytes by the client (RFC 8656 allows it over UDP).
        Padded,
        /// Send indications to the peer, Data indications back (a permission only).
        Indication,
    }

    fn send(how: Send, sock: &UdpSocket, from: SocketAddr, to: SocketAddr, data: &[u8]) {
        match how {
            Send::Socket => {
                sock.send_to(data, to).expect("send");
            }
            Send::Raw => send_raw(from, to, data, false),
        }
    }

    fn channel_data(channel: u16, data: &[u8], pad: bool) -> Vec<u8> {
        let mut cd = Vec::new();
        lastcall_turn_proto::frame::write_channel_data(&mut cd, channel, data, pad);
        cd
    }

    /// A Send indication to `peer` carrying `data`, with FINGERPRINT: XOR-PEER-ADDRESS first
    /// as Firefox sends it, or (odd `n`) DATA first as coturn's uclient does.
    fn send_indication(peer: SocketAddr, data: &[u8], n: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut txid = [7u8; 12];
        txid[4..].copy_from_slice(&n.to_be_bytes());
        let mut b = Builder::new(&mut out, method::SEND, Class::Indication, txid);
        if n % 2 == 0 {
            b.xor_address(attr::XOR_PEER_ADDRESS, peer)
                .attr(attr::DATA, data);
        } else {
            b.attr(attr::DATA, data)
                .xor_address(attr::XOR_PEER_ADDRESS, peer);
        }
        b.fingerprint();
        out
    }

    /// The peer and data of a Data indication (panics on anything else).
    fn data_indication(bytes: &[u8]) -> (SocketAddr, Vec<u8>) {
        let m = Message::parse(bytes).expect("a STUN message");
        assert_eq!((m.method(), m.class()), (method::DATA, Class::Indication));
        let txid = m.transaction_id();
        let mut peer = None;
        let mut data = None;
        for a in m.attributes() {
            match a.typ {
                attr::XOR_PEER_ADDRESS => peer = decode_address(a.value, &txid, true),
                attr::DATA => data = Some(a.value.to_vec()),
                t => panic!("attribute {t:#x} in a Data indication"),
            }
        }
        (peer.expect("XOR-PEER-ADDRESS"), data.expect("DATA"))
    }

    /// Installs a route between real sockets on `ip` and relays `n` datagrams each way
    /// through it: none reaches the listener or the relay socket, every one reaches the
    /// other side with the right addresses and bytes, and the counters say so.
    fn relay_both_ways(l: &Loaded, n: u64, how: Send, ip: &str, wrap: Wrap) {
        let (client, client_addr) = udp_on(ip);
        let (listener, listen_addr) = udp_on(ip);
        let (relay, relay_addr) = udp_on(ip);
        let (peer, peer_addr) = udp_on(ip);
        let from = client_of(client_addr, listen_addr);
        let before = l.totals();
        match wrap {
            Wrap::Channel | Wrap::Padded => l.apply(&RouteChange::Install(ChannelRoute {
                client: from,
                channel: 0x4001,
                relay: relay_addr,
                peer: peer_addr,
                expires: later(),
            })),
            Wrap::Indication => l.apply(&RouteChange::InstallPermission(PermissionRoute {
                client: from,
                relay: relay_addr,
                peer: peer_addr.ip(),
                data_indications: true,
                expires: later(),
            })),
        }
        let mut buf = [0u8; 2048];
        for i in 0..n {
            // Odd and even lengths: the checksum's byte alignment matters.
            let data: Vec<u8> = (0..(100 + i as usize % 7))
                .map(|b| b as u8 ^ i as u8)
                .collect();
            let out = match wrap {
                Wrap::Channel => channel_data(0x4001, &data, false),
                Wrap::Padded => channel_data(0x4001, &data, true),
                Wrap::Indication => send_indication(peer_addr, &data, i),
            };
            send(how, &client, client_addr, listen_addr, &out);
            let (len, src) = peer.recv_from(&mut buf).expect("the peer's datagram");
            assert_eq!((src, &buf[..len]), (relay_addr, &data[..]), "{wrap:?} {i}");
            send(how, &peer, peer_addr, relay_addr, &data);
            let (len, src) = client.recv_from(&mut buf).expect("to the client");
            assert_eq!(src, listen_addr);
            match wrap {
                Wrap::Channel | Wrap::Padded => {
                    assert_eq!(&buf[..len], &channel_data(0x4001, &data, false)[..]);
                }
                Wrap::Indication => {
                    assert_eq!(data_indication(&buf[..len]), (peer_addr, data.clone()));
                }
            }
        }
        for s in [&listener, &relay] {
            s.set_nonblocking(true).expect("non-blocking");
            assert!(
                s.recv_from(&mut buf).is_err(),
                "the daemon's socket got one"
            );
        }
        let stats = match wrap {
            Wrap::Indication => l.permission_stats(&from, peer_addr.ip()),
            _ => l.route_stats(&from, 0x4001),
        }
        .expect("route");
        assert_eq!((stats.to_peer_packets, stats.to_client_packets), (n, n));
        assert!(stats.last.is_some());
        let t = l.totals();
        match wrap {
            Wrap::Channel => assert_eq!(t.padded, before.padded),
            Wrap::Padded => {
                let odd = (0..n).filter(|i| (100 + i % 7) % 4 != 0).count() as u64;
                assert_eq!(t.padded - before.padded, odd, "{t:?}");
            }
            Wrap::Indication => {
                assert_eq!(t.send_indications - before.send_indications, n);
                assert_eq!(t.data_indications - before.data_indications, n);
            }
        }
        // The client was heard from just now, through the kernel.
        let heard = l.client_activity();
        let at = heard.iter().find(|(c, _)| *c == from).map(|(_, at)| *at);
        assert!(
            at.is_some_and(|at| at.elapsed() < Duration::from_secs(30)),
            "{heard:?}"
        );
        // Removed: datagrams go to the sockets again, counters stay in the totals.
        let before = l.totals();
        match wrap {
            Wrap::Indication => l.apply(&RouteChange::RemovePermission {
                client: from,
                relay: relay_addr,
                peer: peer_addr.ip(),
            }),
            _ => l.apply(&RouteChange::Remove {
                client: from,
                channel: 0x4001,
                relay: relay_addr,
                peer: peer_addr,
            }),
        }
        assert_eq!(l.totals().to_peer_packets, before.to_peer_packets);
        listener.set_nonblocking(false).expect("blocking");
        let late = match wrap {
            Wrap::Indication => send_indication(peer_addr, &[7], 99),
            _ => vec![0x40, 0x01, 0, 1, 7],
        };
        client.send_to(&late, listen_addr).expect("send");
        let (len, _) = listener.recv_from(&mut buf).expect("to the daemon");
        assert_eq!(&buf[..len], &late[..]);
    }

    #[test]
    fn channel_data_is_relayed_both_ways_on_loopback_and_stops_when_removed() {
        let Some(l) = lo() else {
            return;
        };
        relay_both_ways(&l, 50, Send::Socket, "127.0.0.1", Wrap::Channel);
    }

    #[test]
    fn ipv6_is_relayed_like_ipv4() {
        let Some(l) = lo() else {
            return;
        };
        for wrap in [Wrap::Channel, Wrap::Padded, Wrap::Indication] {
            relay_both_ways(&l, 30, Send::Socket, "::1", wrap);
        }
    }

    /// Padded ChannelData (coturn's uclient with -D, pjnath): the padding is dropped, the
    /// peer gets the data; answers go back unpadded.
    #[test]
    fn padded_channel_data_is_relayed_without_its_padding() {
        let Some(l) = lo() else {
            return;
        };
        relay_both_ways(&l, 50, Send::Socket, "127.0.0.1", Wrap::Padded);
    }

    /// A client that binds no channel (Firefox): its Send indications reach the peer as the
    /// data alone, the peer's answers come back as Data indications naming it.
    #[test]
    fn send_and_data_indications_are_relayed_in_the_kernel() {
        let Some(l) = lo() else {
            return;
        };
        relay_both_ways(&l, 50, Send::Socket, "127.0.0.1", Wrap::Indication);
    }

    /// Two clients of the server calling each other (each one's peer is the other's relay
    /// address): ChannelData from one arrives as ChannelData on the other's channel, and a
    /// Send indication as a Data indication, in one pass; no relay socket sees a datagram.
    #[test]
    fn two_clients_of_the_server_are_relayed_to_each_other_in_one_pass() {
        let Some(l) = lo() else {
            return;
        };
        let (a, a_addr) = udp();
        let (b, b_addr) = udp();
        let (listener, listen_addr) = udp();
        let (relay_a_sock, relay_a) = udp();
        let (relay_b_sock, relay_b) = udp();
        let (ca, cb) = (
            client_of(a_addr, listen_addr),
            client_of(b_addr, listen_addr),
        );
        // A: a channel to B's relay; B: a permission only for A's relay (Data indications).
        l.apply(&RouteChange::Install(ChannelRoute {
            client: ca,
            channel: 0x4001,
            relay: relay_a,
            peer: relay_b,
            expires: later(),
        }));
        l.apply(&RouteChange::InstallPermission(PermissionRoute {
            client: cb,
            relay: relay_b,
            peer: relay_a.ip(),
            data_indications: true,
            expires: later(),
        }));
        l.apply(&RouteChange::InstallPermission(PermissionRoute {
            client: ca,
            relay: relay_a,
            peer: relay_b.ip(),
            data_indications: true,
            expires: later(),
        }));
        let before = l.totals();
        let mut buf = [0u8; 2048];
        for i in 0..20u8 {
            let data = vec![i; 50 + usize::from(i)];
            a.send_to(&channel_data(0x4001, &data, false), listen_addr)
                .expect("send");
            let (len, src) = b.recv_from(&mut buf).expect("B gets it");
            assert_eq!(src, listen_addr);
            assert_eq!(data_indication(&buf[..len]), (relay_a, data.clone()));
            // B answers with a Send indication to A's relay: A has a channel to B's relay,
            // so it gets ChannelData.
            b.send_to(&send_indication(relay_a, &data, u64::from(i)), listen_addr)
                .expect("send");
            let (len, _) = a.recv_from(&mut buf).expect("A gets it");
            assert_eq!(&buf[..len], &channel_data(0x4001, &data, false)[..]);
        }
        // B has no channel to A's relay: its answer arrives as a Data indication unless a
        // channel matches, and A's channel 0x4001 carries B's relay: ChannelData above.
        for s in [&listener, &relay_a_sock, &relay_b_sock] {
            s.set_nonblocking(true).expect("non-blocking");
            assert!(s.recv_from(&mut buf).is_err(), "a daemon socket got one");
        }
        let t = l.totals();
        assert_eq!(t.hairpin - before.hairpin, 40, "{t:?}");
        assert_eq!(t.to_peer_packets - before.to_peer_packets, 40);
        assert_eq!(t.to_client_packets - before.to_client_packets, 40);
    }

    /// A same-host sender's GSO batch (UDP_SEGMENT: several ChannelData messages in one
    /// packet on loopback) cannot be split here: it goes to the daemon whole, counted, and
    /// the daemon's socket receives each datagram.
    #[test]
    fn a_gso_batch_is_left_to_the_daemon_and_counted() {
        let Some(l) = lo() else {
            return;
        };
        let (client, client_addr) = udp();
        let (listener, listen_addr) = udp();
        let (_relay, relay_addr) = udp();
        let (peer, peer_addr) = udp();
        l.apply(&RouteChange::Install(ChannelRoute {
            client: client_of(client_addr, listen_addr),
            channel: 0x4001,
            relay: relay_addr,
            peer: peer_addr,
            expires: later(),
        }));
        let one = channel_data(0x4001, &[9u8; 96], false);
        nix::sys::socket::setsockopt(
            &client,
            nix::sys::socket::sockopt::UdpGsoSegment,
            &(one.len() as i32),
        )
        .expect("UDP_SEGMENT");
        let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 3).collect();
        let before = l.totals();
        client.send_to(&batch, listen_addr).expect("send the batch");
        let mut buf = [0u8; 2048];
        for _ in 0..3 {
            let (len, src) = listener.recv_from(&mut buf).expect("to the daemon");
            assert_eq!((src, &buf[..len]), (client_addr, &one[..]));
        }
        assert_eq!(l.totals().gso - before.gso, 1);
        peer.set_nonblocking(true).expect("non-blocking");
        assert!(peer.recv_from(&mut buf).is_err());
    }

    #[test]
    fn an_expired_route_is_handed_to_the_daemon_unchanged() {
        let Some(l) = lo() else {
            return;
        };
        let (client, client_addr) = udp();
        let (listener, listen_addr) = udp();
        let (_relay, relay_addr) = udp();
        let (peer, peer_addr) = udp();
        let from = client_of(client_addr, listen_addr);
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

    /// A refresh (the same route, a new expiry) keeps what the route counted.
    #[test]
    fn a_refresh_keeps_the_counters() {
        let Some(l) = lo() else {
            return;
        };
        let (client, client_addr) = udp();
        let (_listener, listen_addr) = udp();
        let (_relay, relay_addr) = udp();
        let (peer, peer_addr) = udp();
        let from = client_of(client_addr, listen_addr);
        let route = ChannelRoute {
            client: from,
            channel: 0x4003,
            relay: relay_addr,
            peer: peer_addr,
            expires: later(),
        };
        l.apply(&RouteChange::Install(route));
        let mut buf = [0u8; 64];
        for _ in 0..5 {
            client
                .send_to(&channel_data(0x4003, b"x", false), listen_addr)
                .expect("send");
            peer.recv_from(&mut buf).expect("relayed");
        }
        l.apply(&RouteChange::Install(ChannelRoute {
            expires: later() + Duration::from_secs(60),
            ..route
        }));
        assert_eq!(
            l.route_stats(&from, 0x4003).map(|s| s.to_peer_packets),
            Some(5)
        );
    }

    /// Full UDP checksums, verified by the receiving stack: in a new network namespace (its
    /// own loopback and counters), a datagram with a wrong checksum is dropped and counted
    /// (`InCsumErrors`: the receiver checks), then datagrams relayed both ways, IPv4 and
    /// IPv6, ChannelData (padded or not) and indications, all arrive and none is counted.
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
            let Some(l) = lo() else {
                return;
            };
            // Through a route too: a wrong checksum stays wrong (the program updates it, it
            // does not recompute it) and the receiver drops it.
            let (client, client_addr) = udp();
            let (_listener, listen_addr) = udp();
            let (_relay, relay_addr) = udp();
            let (peer, peer_addr) = udp();
            l.apply(&RouteChange::Install(ChannelRoute {
                client: client_of(client_addr, listen_addr),
                channel: 0x4001,
                relay: relay_addr,
                peer: peer_addr,
                expires: later(),
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
            for ip in ["127.0.0.1", "::1"] {
                for wrap in [Wrap::Channel, Wrap::Padded, Wrap::Indication] {
                    relay_both_ways(&l, 60, Send::Raw, ip, wrap);
                }
            }
            assert_eq!(
                csum_errors(),
                errors,
                "relayed datagrams had wrong checksums"
            );
        });
        t.join().expect("namespace thread");
    }
}
