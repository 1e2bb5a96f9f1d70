//! A minimal, single-threaded UDP driver for the protocol core, for interop smoke tests of the
//! core alone (the real server is `lastcall-turn`). Loopback only, busy-polling, no TCP/TLS.
//!
//! ```text
//! cargo run -p lastcall-turn-proto --example mini_udp -- 127.0.0.1:3478 SECRET
//! turnutils_uclient -e 127.0.0.1 -X -g -u user -W SECRET -p 3478 127.0.0.1
//! ```
//!
//! A third argument starts it draining: `drain` (new Allocates get 403) or
//! `drain=ADDR,ADDR` (300 Try Alternate with those ALTERNATE-SERVERs).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant, SystemTime};

use lastcall_turn_proto::{
    ClientAddr, RelayError, RelayProvider, Server, ServerConfig, Transmit, Transport,
};

#[derive(Default)]
struct Relays {
    socks: HashMap<SocketAddr, UdpSocket>,
}

impl Relays {
    fn bind(&mut self, addr: SocketAddr) -> Result<SocketAddr, RelayError> {
        let s = UdpSocket::bind(addr).map_err(|_| RelayError::NoPort)?;
        s.set_nonblocking(true)
            .map_err(|e| RelayError::Failed(e.to_string()))?;
        let a = s
            .local_addr()
            .map_err(|e| RelayError::Failed(e.to_string()))?;
        self.socks.insert(a, s);
        Ok(a)
    }
}

impl RelayProvider for Relays {
    fn allocate(&mut self, ip: IpAddr, _c: &ClientAddr) -> Result<SocketAddr, RelayError> {
        self.bind(SocketAddr::new(ip, 0))
    }

    fn release(&mut self, relay: SocketAddr) {
        self.socks.remove(&relay);
    }

    fn allocate_even(
        &mut self,
        ip: IpAddr,
        _c: &ClientAddr,
        reserve_next: bool,
    ) -> Result<(SocketAddr, Option<SocketAddr>), RelayError> {
        for port in (49152u16..65534).step_by(2) {
            let Ok(a) = self.bind(SocketAddr::new(ip, port)) else {
                continue;
            };
            if !reserve_next {
                return Ok((a, None));
            }
            match self.bind(SocketAddr::new(ip, port + 1)) {
                Ok(b) => return Ok((a, Some(b))),
                Err(_) => self.release(a),
            }
        }
        Err(RelayError::NoPort)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let listen: SocketAddr = args.next().unwrap_or("127.0.0.1:3478".into()).parse()?;
    let secret = args.next().unwrap_or("secret".into());
    let mut config = ServerConfig::new("example.org");
    config.auth.rest_secrets.push(secret.into_bytes());
    config.auth.add_coturn_user("user:pass")?;
    config.peer_policy.allow_loopback = true;
    let sock = UdpSocket::bind(listen)?;
    sock.set_nonblocking(true)?;
    let local = sock.local_addr()?;
    eprintln!("listening on {local}");
    let mut server = Server::new(config, Instant::now(), SystemTime::now());
    if let Some(d) = args.next() {
        let alternates = match d.strip_prefix("drain=") {
            Some(list) => list
                .split(',')
                .map(str::parse)
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        server.set_drain(lastcall_turn_proto::DrainMode::Refuse { alternates });
    }
    let mut relays = Relays::default();
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::with_capacity(65536);
    let mut last_report = Instant::now();
    loop {
        let mut busy = false;
        loop {
            match sock.recv_from(&mut buf) {
                Ok((n, from)) => {
                    busy = true;
                    let c = ClientAddr {
                        transport: Transport::Udp,
                        client: from,
                        local,
                    };
                    match server.handle_client(Instant::now(), c, &buf[..n], &mut relays, &mut out)
                    {
                        Some(Transmit::Client { to, data }) => {
                            let _ = sock.send_to(data, to.client);
                        }
                        Some(Transmit::Peer { relay, peer, data }) => {
                            if let Some(s) = relays.socks.get(&relay) {
                                let _ = s.send_to(data, peer);
                            }
                        }
                        None => {}
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => break,
            }
        }
        let addrs: Vec<SocketAddr> = relays.socks.keys().copied().collect();
        for relay in addrs {
            while let Some(s) = relays.socks.get(&relay) {
                match s.recv_from(&mut buf) {
                    Ok((n, peer)) => {
                        busy = true;
                        if let Some(Transmit::Client { to, data }) =
                            server.handle_peer(Instant::now(), relay, peer, &buf[..n], &mut out)
                        {
                            let _ = sock.send_to(data, to.client);
                        }
                    }
                    Err(_) => break,
                }
            }
        }
        let now = Instant::now();
        if server.poll_timeout().is_some_and(|t| t <= now) {
            server.handle_timeout(now, &mut relays);
        }
        while let Some(e) = server.poll_event() {
            eprintln!("event: {e:?}");
        }
        if now.duration_since(last_report) > Duration::from_secs(5) {
            last_report = now;
            eprintln!("counters: {:?}", server.counters());
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}
