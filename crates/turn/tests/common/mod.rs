//! Test support: a `lastcall-turn` process, coturn's `turnutils_peer`, and runs of coturn's
//! `turnutils_uclient` with its summary parsed. Everything on loopback, free ports, killed
//! on drop.
#![allow(dead_code)]

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lastcall::harness::{self, Pod};

pub const SECRET: &str = "s3cret-for-tests";
pub const UCLIENT: &str = "/usr/bin/turnutils_uclient";

/// The `turnutils_uclient` command: `LASTCALL_TURN_UCLIENT` (a command line, split at
/// spaces, e.g. `/var/cache/lastcall-scratch/run sid /usr/bin/turnutils_uclient` for coturn
/// 4.18's) or Debian's [`UCLIENT`]. The one place a test's uclient comes from.
pub fn uclient_command() -> Command {
    let line = std::env::var("LASTCALL_TURN_UCLIENT").unwrap_or_else(|_| UCLIENT.to_string());
    let mut words = line.split_whitespace();
    let mut cmd = Command::new(words.next().unwrap_or(UCLIENT));
    cmd.args(words);
    cmd
}
pub const PEER: &str = "/usr/bin/turnutils_peer";
pub const WAIT: Duration = Duration::from_secs(30);

/// A running `lastcall-turn`.
pub struct Turn {
    pub pod: Pod,
    pub port: u16,
    pub tls_port: u16,
    pub admin: String,
}

/// The start-up command of docs/turn.md (*Running it*) on free ports.
pub fn turn_args(port: u16, admin: &str) -> Vec<String> {
    [
        "-n",
        "--listening-ip=127.0.0.1",
        &format!("--listening-port={port}"),
        "--relay-ip=127.0.0.1",
        "--realm=example.org",
        "--use-auth-secret",
        &format!("--static-auth-secret={SECRET}"),
        "--allow-loopback-peers",
        &format!("--admin-addr={admin}"),
    ]
    .iter()
    .map(ToString::to_string)
    .collect()
}

impl Turn {
    /// Starts with that command line and `extra` options; waits until it listens.
    pub fn start(extra: &[&str]) -> Turn {
        let port = free_udp_tcp_port();
        let admin = format!("127.0.0.1:{}", harness::free_port());
        let mut args = turn_args(port, &admin);
        args.extend(extra.iter().map(ToString::to_string));
        Turn::spawn(args, port, 0, admin)
    }

    /// Starts with exactly `args` (the caller chose the ports).
    pub fn spawn(args: Vec<String>, port: u16, tls_port: u16, admin: String) -> Turn {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lastcall-turn"));
        cmd.args(&args);
        let pod = Pod::spawn(cmd);
        pod.wait_for_log("lastcall-turn listening", WAIT);
        Turn {
            pod,
            port,
            tls_port,
            admin,
        }
    }

    /// The value of one metric line (`name{labels}`), if present.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (status, body) = harness::http_get(&self.admin, "/metrics");
        assert_eq!(status, 200, "GET /metrics");
        body.lines().find_map(|l| {
            let rest = l.strip_prefix(series)?;
            rest.strip_prefix(' ')?.trim().parse().ok()
        })
    }

    /// Waits until `series` is at least `min`.
    pub fn wait_metric_at_least(&self, series: &str, min: f64) {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.metric(series).is_some_and(|v| v >= min) {
                return;
            }
            assert!(Instant::now() < deadline, "{series} never reached {min}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A port free for both UDP and TCP on 127.0.0.1.
pub fn free_udp_tcp_port() -> u16 {
    loop {
        let port = harness::free_port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// coturn's UDP echo peer.
pub struct Peer {
    child: Child,
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
        let child = Command::new(PEER)
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
    pub status: Option<i32>,
    pub send_msgs: u64,
    pub recv_msgs: u64,
    pub send_bytes: u64,
    pub recv_bytes: u64,
    pub lost: Option<u64>,
    pub output: String,
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

/// A bounded uclient call to a peer with TURN REST credentials (`-W SECRET`):
/// `turnutils_uclient FLAGS -X -n N -m M -z Z -p PORT -e 127.0.0.1 -r PEER_PORT -u USER`,
/// with `(n, m, z)` = messages per client, clients, and milliseconds between messages.
pub fn rest_call(
    flags: &[&str],
    (n, m, z): (u32, u32, u32),
    port: &str,
    peer_port: &str,
    user: &str,
    limit: Duration,
) -> Report {
    let (n, m, z) = (n.to_string(), m.to_string(), z.to_string());
    let mut args = flags.to_vec();
    args.extend([
        "-X",
        "-n",
        &n,
        "-m",
        &m,
        "-z",
        &z,
        "-p",
        port,
        "-e",
        "127.0.0.1",
        "-r",
        peer_port,
        "-u",
        user,
        "-W",
        SECRET,
    ]);
    uclient(&args, limit)
}

/// Runs `turnutils_uclient ARGS SERVER`, killed after `limit`.
pub fn uclient_to(server: &str, args: &[&str], limit: Duration) -> Report {
    let started = Instant::now();
    let mut child = uclient_command()
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

/// A self-signed certificate and key (PEM) for CN `cn`, made with the openssl CLI.
pub fn self_signed(dir: &Path, name: &str, cn: &str) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{name}-cert.pem"));
    let key = dir.join(format!("{name}-key.pem"));
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", &format!("/CN={cn}")])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success(), "openssl req failed");
    (cert, key)
}

/// The subject of the certificate a TLS server presents (openssl s_client).
pub fn served_subject(port: u16) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect 127.0.0.1:{port} </dev/null 2>/dev/null | openssl x509 -noout -subject"
        ))
        .output()
        .expect("run openssl s_client");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

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
