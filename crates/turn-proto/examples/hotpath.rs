//! Micro-benchmark of the data paths of the protocol core (no sockets):
//!
//! ```text
//! cargo run --release -p lastcall-turn-proto --example hotpath [ALLOCATIONS] [PAYLOAD]
//! ```
//!
//! Prints nanoseconds per packet for peer -> client (ChannelData and Data indication) and
//! client -> peer (ChannelData and Send indication) with ALLOCATIONS live allocations
//! (default 10000), each with one permission and one channel.

use std::hint::black_box;
use std::net::{IpAddr, SocketAddr};
use std::time::{Instant, SystemTime};

use lastcall_turn_proto::stun::{attr, encode_xor_address, method, Builder, Class};
use lastcall_turn_proto::{
    ClientAddr, Output, RelayBound, Server, ServerConfig, Transmit, Transport,
};

/// A relay address of its own for allocation `n` (nothing is bound: no sockets here).
fn relay_for(n: u32) -> SocketAddr {
    let ip = IpAddr::from([10, 1, (n >> 16) as u8, (n >> 8) as u8]);
    SocketAddr::new(ip, 1024 + (n & 0xff) as u16)
}

fn request(m: u16, attrs: &[(u16, Vec<u8>)], txid: [u8; 12]) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut b = Builder::new(&mut buf, m, Class::Request, txid);
    for (t, v) in attrs {
        b.attr(*t, v);
    }
    b.attr(attr::SOFTWARE, &[b' '; 64]); // keep anonymous answers under the size guard
    buf
}

fn xor_peer(peer: SocketAddr, txid: &[u8; 12]) -> Vec<u8> {
    let mut v = [0u8; 20];
    let n = encode_xor_address(&mut v, peer, txid);
    v[..n].to_vec()
}

fn time<F: FnMut(usize) -> bool>(name: &str, iters: usize, mut f: F) {
    let start = Instant::now();
    let mut ok = 0usize;
    for i in 0..iters {
        ok += usize::from(f(i));
    }
    let ns = start.elapsed().as_nanos() as f64 / iters as f64;
    assert_eq!(ok, iters, "{name}: some packets were not relayed");
    println!("{name:<40} {ns:8.1} ns/packet");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let payload = vec![0xABu8; args.next().and_then(|a| a.parse().ok()).unwrap_or(160)];
    let mut config = ServerConfig::new("example.org"); // anonymous: no per-request HMAC here
    config.relay.relay_ips = vec!["10.1.0.0".parse().unwrap()];
    let now = Instant::now();
    let mut server = Server::new(config, now, SystemTime::now());
    let mut out = Vec::with_capacity(2048);
    let local: SocketAddr = "198.51.100.1:3478".parse().unwrap();
    let mut clients = Vec::new();
    let mut relay_addrs = Vec::new();
    for i in 0..n {
        let client = ClientAddr {
            transport: Transport::Udp,
            client: SocketAddr::new(
                IpAddr::from([192, 0, 2, (i % 250) as u8]),
                10000 + (i / 250) as u16,
            ),
            local,
        };
        let peer: SocketAddr = SocketAddr::new(IpAddr::from([8, 8, (i >> 8) as u8, i as u8]), 5000);
        let txid = [i as u8; 12];
        let alloc = request(
            method::ALLOCATE,
            &[(attr::REQUESTED_TRANSPORT, vec![17, 0, 0, 0])],
            txid,
        );
        if let Some(Output::BindRelay(r)) = server.handle_client(now, client, &alloc, &mut out) {
            let answer = RelayBound {
                id: r.id,
                primary: Ok((relay_for(i as u32 + 1), None)),
                additional: None,
            };
            server.relay_bound(now, answer, &mut out);
        }
        while let Some(e) = server.poll_event() {
            if let lastcall_turn_proto::Event::AllocationCreated { relays: r, .. } = e {
                relay_addrs.extend(r.v4);
            }
        }
        let bind = request(
            method::CHANNEL_BIND,
            &[
                (attr::CHANNEL_NUMBER, vec![0x40, 0x01, 0, 0]),
                (attr::XOR_PEER_ADDRESS, xor_peer(peer, &txid)),
            ],
            txid,
        );
        server.handle_client(now, client, &bind, &mut out);
        let peer2 = SocketAddr::new(peer.ip(), 6000);
        clients.push((client, peer, peer2));
    }
    assert_eq!(server.allocation_count(), n);
    assert_eq!(relay_addrs.len(), n);
    let iters = 2_000_000;
    time("peer -> client ChannelData", iters, |i| {
        let k = i % n;
        let (_, peer, _) = clients[k];
        let t = server.handle_peer(now, relay_addrs[k], peer, &payload, &mut out);
        black_box(matches!(t, Some(Transmit::Client { .. })))
    });
    time("peer -> client Data indication", iters, |i| {
        let k = i % n;
        let (_, _, peer2) = clients[k];
        let t = server.handle_peer(now, relay_addrs[k], peer2, &payload, &mut out);
        black_box(matches!(t, Some(Transmit::Client { .. })))
    });
    let mut cd = vec![0x40, 0x01];
    cd.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    cd.extend_from_slice(&payload);
    time("client -> peer ChannelData", iters, |i| {
        let (client, _, _) = clients[i % n];
        let t = server.handle_client(now, client, &cd, &mut out);
        black_box(matches!(t, Some(Output::Transmit(Transmit::Peer { .. }))))
    });
    let sends: Vec<Vec<u8>> = clients
        .iter()
        .map(|(_, _, peer2)| {
            let mut buf = Vec::new();
            let txid = [7u8; 12];
            Builder::new(&mut buf, method::SEND, Class::Indication, txid)
                .xor_address(attr::XOR_PEER_ADDRESS, *peer2)
                .attr(attr::DATA, &payload);
            buf
        })
        .collect();
    time("client -> peer Send indication", iters, |i| {
        let k = i % n;
        let t = server.handle_client(now, clients[k].0, &sends[k], &mut out);
        black_box(matches!(t, Some(Output::Transmit(Transmit::Peer { .. }))))
    });
    println!("allocations: {n}, payload: {} bytes", payload.len());
}
