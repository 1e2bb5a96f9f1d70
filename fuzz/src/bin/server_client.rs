//! The server's client entry point: no panic, and no unauthenticated answer larger than the
//! request except the bounded Binding success and 401/438 challenge. A request for relay
//! sockets is answered at once, as the I/O layer does.
#![no_main]

use std::net::SocketAddr;
use std::time::{Instant, SystemTime};

use lastcall_turn_proto::{
    ClientAddr, Output, RelayBound, Server, ServerConfig, Transmit, Transport,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut config = ServerConfig::new("example.org");
    config.auth.rest_secrets.push(b"secret".to_vec());
    config.relay.relay_ips = vec!["192.0.2.1".parse().unwrap()];
    let mut server = Server::new(config, Instant::now(), SystemTime::now());
    let from = ClientAddr {
        transport: Transport::Udp,
        client: "198.51.100.7:40000".parse().unwrap(),
        local: "192.0.2.1:3478".parse().unwrap(),
    };
    let mut out = Vec::new();
    let now = Instant::now();
    let sent = match server.handle_client(now, from, data, &mut out) {
        Some(Output::Transmit(t)) => Some(t),
        Some(Output::BindRelay(r)) => {
            let answer = RelayBound {
                id: r.id,
                primary: Ok((SocketAddr::new(r.ip, 50000), None)),
                additional: None,
            };
            server.relay_bound(now, answer, &mut out)
        }
        None => None,
    };
    if let Some(Transmit::Client { data: resp, .. }) = sent {
        // 52: Binding success with IPv6 XOR-MAPPED-ADDRESS and FINGERPRINT;
        // 72: 401/438 with REALM "example.org", NONCE and FINGERPRINT.
        assert!(resp.len() <= data.len().max(72));
    }
});
