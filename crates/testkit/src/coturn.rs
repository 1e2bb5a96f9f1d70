//! coturn's test programs as peers: `turnutils_peer` (a UDP echo server) and runs of
//! `turnutils_uclient` with its summary parsed. The programs come from
//! [`peers::coturn`](crate::peers::coturn): Debian 12's coturn unless the environment names
//! another command.

use std::net::UdpSocket;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::net::free_udp_tcp_port;
use crate::peers;
use crate::turn::SECRET;
use crate::WAIT;

/// coturn's UDP echo peer.
pub struct Peer {
    child: Child,
    /// The UDP port it echoes on.
    pub port: u16,
}

impl Peer {
    /// Starts `turnutils_peer` on 127.0.0.1 on a free port and waits until it echoes.
    pub fn start() -> Peer {
        Peer::start_on("127.0.0.1")
    }

    /// Starts `turnutils_peer` on `ip` (127.0.0.1 or ::1) and waits until it echoes.
    pub fn start_on(ip: &str) -> Peer {
        let port = free_udp_tcp_port();
        let child = peers::coturn("turnutils_peer")
            .args(["-L", ip, "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start turnutils_peer");
        let peer = Peer { child, port };
        let target: std::net::IpAddr = ip.parse().expect("peer address");
        let probe = UdpSocket::bind((target, 0)).expect("bind probe");
        probe
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let deadline = Instant::now() + WAIT;
        let mut buf = [0u8; 64];
        loop {
            let _ = probe.send_to(b"ping", (target, port));
            if matches!(probe.recv_from(&mut buf), Ok((4, _))) {
                return peer;
            }
            assert!(Instant::now() < deadline, "turnutils_peer never echoed");
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `turnutils_uclient` reported.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Exit status; `None` if killed at the limit (or by a signal).
    pub status: Option<i32>,
    /// Messages sent (`tot_send_msgs`).
    pub send_msgs: u64,
    /// Messages received back (`tot_recv_msgs`).
    pub recv_msgs: u64,
    /// Bytes sent (`tot_send_bytes`).
    pub send_bytes: u64,
    /// Bytes received back (`tot_recv_bytes`).
    pub recv_bytes: u64,
    /// `Total lost packets`, if reported.
    pub lost: Option<u64>,
    /// stdout then stderr.
    pub output: String,
    /// How long it ran.
    pub elapsed: Duration,
}

impl Report {
    /// Every message echoed, none lost, a clean exit.
    pub fn assert_all_echoed(&self, expected_msgs: u64) {
        assert_eq!(self.status, Some(0), "uclient failed:\n{}", self.output);
        assert_eq!(self.send_msgs, expected_msgs, "sent:\n{}", self.output);
        assert_eq!(self.recv_msgs, expected_msgs, "received:\n{}", self.output);
        assert_eq!(self.send_bytes, self.recv_bytes, "bytes:\n{}", self.output);
        assert_eq!(self.lost, Some(0), "lost:\n{}", self.output);
    }
}

/// Runs `turnutils_uclient ARGS 127.0.0.1`, killed after `limit`.
pub fn uclient(args: &[&str], limit: Duration) -> Report {
    uclient_to("127.0.0.1", args, limit)
}

/// A `turnutils_uclient` command line, built once for every test that runs one:
/// `FLAGS -n N -m M [-z Z] [-l L] -p PORT [-e PEER_IP -r PEER_PORT] [CREDENTIALS] SERVER`.
///
/// [`Uclient::call`] is the usual one: a UDP call (`-X`: an IPv4 relay) to the echo peer with
/// TURN REST credentials. Flags are uclient's own (`-c` no RTCP allocation, `-t` TCP, `-S`
/// TLS, `-s` Send indications, `-y` client to client, `-g` DONT-FRAGMENT, `-v` verbose).
#[derive(Clone, Debug)]
pub struct Uclient {
    server: String,
    port: u16,
    flags: Vec<String>,
    messages: u64,
    clients: u64,
    gap_ms: Option<u64>,
    length: Option<u64>,
    peer: Option<(String, u16)>,
    credentials: Vec<String>,
}

impl Uclient {
    /// `turnutils_uclient -X -n 10 -m 1 -p PORT 127.0.0.1`: no peer, no credentials yet.
    pub fn new(port: u16) -> Uclient {
        Uclient {
            server: "127.0.0.1".into(),
            port,
            flags: vec!["-X".into()],
            messages: 10,
            clients: 1,
            gap_ms: None,
            length: None,
            peer: None,
            credentials: Vec::new(),
        }
    }

    /// A UDP call through the server on `port` to the echo peer on 127.0.0.1:`peer_port`,
    /// with TURN REST credentials for `user` (`-u USER -W SECRET`).
    pub fn call(port: u16, peer_port: u16, user: &str) -> Uclient {
        Uclient::new(port).peer(peer_port).rest(user)
    }

    /// uclient flags, added to `-X`.
    pub fn flags(mut self, flags: &[&str]) -> Uclient {
        self.flags.extend(flags.iter().map(ToString::to_string));
        self
    }

    /// An IPv6 relay (`-x` instead of `-X`).
    pub fn ipv6_relay(mut self) -> Uclient {
        self.flags.retain(|f| f != "-X");
        self.flags.insert(0, "-x".into());
        self
    }

    /// Messages per client (`-n`).
    pub fn messages(mut self, n: u64) -> Uclient {
        self.messages = n;
        self
    }

    /// Clients (`-m`).
    pub fn clients(mut self, m: u64) -> Uclient {
        self.clients = m;
        self
    }

    /// Milliseconds between a client's messages (`-z`; uclient's default without it).
    pub fn gap_ms(mut self, z: u64) -> Uclient {
        self.gap_ms = Some(z);
        self
    }

    /// Message length in bytes (`-l`; uclient's default without it).
    pub fn length(mut self, l: u64) -> Uclient {
        self.length = Some(l);
        self
    }

    /// The echo peer on 127.0.0.1:`port` (`-e 127.0.0.1 -r PORT`).
    pub fn peer(self, port: u16) -> Uclient {
        self.peer_at("127.0.0.1", port)
    }

    /// The echo peer on `ip`:`port`.
    pub fn peer_at(mut self, ip: &str, port: u16) -> Uclient {
        self.peer = Some((ip.into(), port));
        self
    }

    /// TURN REST credentials for `user` with the tests' [`SECRET`] (`-u USER -W SECRET`).
    pub fn rest(self, user: &str) -> Uclient {
        self.credentials(&["-u", user, "-W", SECRET])
    }

    /// Other credentials (`-u USER -w PASSWORD`, a wrong `-W`), replacing any.
    pub fn credentials(mut self, args: &[&str]) -> Uclient {
        self.credentials = args.iter().map(ToString::to_string).collect();
        self
    }

    /// The server's address (127.0.0.1 unless given: `::1`).
    pub fn server(mut self, ip: &str) -> Uclient {
        self.server = ip.into();
        self
    }

    /// Every message of every client: what [`Report::assert_all_echoed`] expects.
    pub fn total(&self) -> u64 {
        self.messages * self.clients
    }

    /// The arguments before the server's address.
    pub fn args(&self) -> Vec<String> {
        let mut a = self.flags.clone();
        a.extend(["-n".into(), self.messages.to_string()]);
        a.extend(["-m".into(), self.clients.to_string()]);
        if let Some(z) = self.gap_ms {
            a.extend(["-z".into(), z.to_string()]);
        }
        if let Some(l) = self.length {
            a.extend(["-l".into(), l.to_string()]);
        }
        a.extend(["-p".into(), self.port.to_string()]);
        if let Some((ip, port)) = &self.peer {
            a.extend(["-e".into(), ip.clone(), "-r".into(), port.to_string()]);
        }
        a.extend(self.credentials.iter().cloned());
        a
    }

    /// Runs it, killed after `limit`.
    pub fn run(&self, limit: Duration) -> Report {
        let args = self.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        uclient_to(&self.server, &args, limit)
    }

    /// Runs it in a thread, killed after `limit`.
    pub fn spawn(self, limit: Duration) -> std::thread::JoinHandle<Report> {
        std::thread::spawn(move || self.run(limit))
    }
}

/// Runs `turnutils_uclient ARGS SERVER`, killed after `limit`.
pub fn uclient_to(server: &str, args: &[&str], limit: Duration) -> Report {
    let started = Instant::now();
    let mut child = peers::coturn("turnutils_uclient")
        .args(args)
        .arg(server)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start turnutils_uclient");
    let out = child.stdout.take();
    let err = child.stderr.take();
    let read = |s: Option<std::process::ChildStdout>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut s) = s {
                let _ = std::io::Read::read_to_string(&mut s, &mut text);
            }
            text
        })
    };
    let out_t = read(out);
    let err_t = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut s) = err {
            let _ = std::io::Read::read_to_string(&mut s, &mut text);
        }
        text
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s.code(),
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break None,
        }
    };
    let mut output = out_t.join().unwrap_or_default();
    output.push_str(&err_t.join().unwrap_or_default());
    let mut r = parse_report(&output);
    r.status = status;
    r.output = output;
    r.elapsed = started.elapsed();
    r
}

fn number_after(line: &str, key: &str) -> Option<u64> {
    let at = line.find(key)? + key.len();
    let rest = line.get(at..)?.trim_start_matches([' ', '~', '=']);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Parses uclient's summary lines (the totals, not the per-client `msz=` lines).
pub fn parse_report(output: &str) -> Report {
    let mut r = Report::default();
    for line in output.lines() {
        if line.contains("msz=") {
            continue;
        }
        if line.contains("tot_send_msgs=") {
            r.send_msgs = number_after(line, "tot_send_msgs").unwrap_or(0);
            r.recv_msgs = number_after(line, "tot_recv_msgs").unwrap_or(0);
        }
        if line.contains("tot_send_bytes") {
            r.send_bytes = number_after(line, "tot_send_bytes").unwrap_or(0);
            r.recv_bytes = number_after(line, "tot_recv_bytes").unwrap_or(0);
        }
        if line.contains("Total lost packets") {
            r.lost = number_after(line, "Total lost packets");
        }
    }
    r
}

/// The release of the `turnserver` [`peers::coturn`] runs (`turnserver --version`, e.g.
/// "4.6.1" or "4.18.0"), and whether it knows `option` (`--help` lists it): coturn 4.18
/// dropped options 4.6 had, such as `--no-dtls`.
pub fn turnserver_release_and(option: &str) -> (String, bool) {
    let run = |arg: &str| {
        peers::coturn("turnserver")
            .arg(arg)
            .output()
            .map(|o| {
                let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&o.stderr));
                text
            })
            .unwrap_or_default()
    };
    let release = run("--version").trim().to_owned();
    let known = run("--help").split_whitespace().any(|word| word == option);
    (release, known)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_parser() {
        let text = "1: : start_mclient: msz=1, tot_send_msgs=0, tot_recv_msgs=0, tot_send_bytes ~ 0, tot_recv_bytes ~ 0\n\
                    5: : start_mclient: tot_send_msgs=50, tot_recv_msgs=49\n\
                    5: : start_mclient: tot_send_bytes ~ 5000, tot_recv_bytes ~ 4900\n\
                    5: : Total lost packets 1 (2.000000%), total send dropped 0 (0.000000%)\n";
        let r = parse_report(text);
        assert_eq!((r.send_msgs, r.recv_msgs), (50, 49));
        assert_eq!((r.send_bytes, r.recv_bytes), (5000, 4900));
        assert_eq!(r.lost, Some(1));
    }

    #[test]
    fn uclient_command_line() {
        let call = Uclient::call(3478, 3480, "alice")
            .flags(&["-c"])
            .messages(5)
            .gap_ms(20);
        assert_eq!(
            call.args().join(" "),
            format!("-X -c -n 5 -m 1 -z 20 -p 3478 -e 127.0.0.1 -r 3480 -u alice -W {SECRET}")
        );
        let v6 = Uclient::new(1)
            .flags(&["-t"])
            .ipv6_relay()
            .clients(2)
            .length(120);
        assert_eq!(v6.args().join(" "), "-x -t -n 10 -m 2 -l 120 -p 1");
        assert_eq!(v6.total(), 20);
    }
}
