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
    ClientAddr, Output, RelayBound, RelayError, RelayPorts, RelayRequest, Server, ServerConfig,
    Transmit, Transport,
};

/// The relay sockets, by local address.
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

    /// An even port, and with `pair` port + 1 too.
    fn bind_even(
        &mut self,
        ip: IpAddr,
        pair: bool,
    ) -> Result<(SocketAddr, Option<SocketAddr>), RelayError> {
        for port in (49152u16..65534).step_by(2) {
            let Ok(a) = self.bind(SocketAddr::new(ip, port)) else {
                continue;
            };
            if !pair {
                return Ok((a, None));
            }
            match self.bind(SocketAddr::new(ip, port + 1)) {
                Ok(b) => return Ok((a, Some(b))),
                Err(_) => {
                    self.socks.remove(&a);
                }
            }
        }
        Err(RelayError::NoPort)
    }

    /// The answer to the core's request for relay sockets.
    fn answer(&mut self, r: &RelayRequest) -> RelayBound {
        let primary = match r.ports {
            RelayPorts::Any => self.bind(SocketAddr::new(r.ip, 0)).map(|a| (a, None)),
            RelayPorts::Even => self.bind_even(r.ip, false),
            RelayPorts::EvenPair => self.bind_even(r.ip, true),
        };
        let additional = r.additional.map(|ip| self.bind(SocketAddr::new(ip, 0)));
        RelayBound {
            id: r.id,
            primary,
            additional,
        }
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
                    let now = Instant::now();
                    let t = match server.handle_client(now, c, &buf[..n], &mut out) {
                        Some(Output::BindRelay(r)) => {
                            let answer = relays.answer(&r);
                            server.relay_bound(now, answer, &mut out)
                        }
                        Some(Output::Transmit(t)) => Some(t),
                        None => None,
                    };
                    match t {
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
            server.handle_timeout(now);
        }
        while let Some(relay) = server.poll_release() {
            relays.socks.remove(&relay);
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
