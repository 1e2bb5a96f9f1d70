//! The server's client entry point: no panic, and no unauthenticated answer larger than the
//! request except the bounded Binding success and 401/438 challenge.
#![no_main]

use std::net::{IpAddr, SocketAddr};
use std::time::{Instant, SystemTime};

use lastcall_turn_proto::{
    ClientAddr, RelayError, RelayProvider, Server, ServerConfig, Transmit, Transport,
};
use libfuzzer_sys::fuzz_target;

struct Relays;

impl RelayProvider for Relays {
    fn allocate(&mut self, ip: IpAddr, _c: &ClientAddr) -> Result<SocketAddr, RelayError> {
        Ok(SocketAddr::new(ip, 50000))
    }
    fn release(&mut self, _relay: SocketAddr) {}
}

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
    if let Some(Transmit::Client { data: resp, .. }) =
        server.handle_client(Instant::now(), from, data, &mut Relays, &mut out)
    {
        // 52: Binding success with IPv6 XOR-MAPPED-ADDRESS and FINGERPRINT;
        // 72: 401/438 with REALM "example.org", NONCE and FINGERPRINT.
        assert!(resp.len() <= data.len().max(72));
    }
});
