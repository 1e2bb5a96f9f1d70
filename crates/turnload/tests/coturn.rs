//! The load generator against a real coturn (`turnserver` from Debian's coturn package), on
//! loopback: every datagram relayed and echoed at a low rate, allocations counted and
//! memory read. Skipped (with a message) where coturn is not installed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

use std::net::UdpSocket;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn have_coturn() -> bool {
    lastcall_testkit::peers::coturn("turnserver")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Starts coturn on a free port and waits until it answers a STUN Binding.
fn coturn() -> (Server, u16) {
    let port = lastcall_testkit::free_udp_tcp_port();
    let child = lastcall_testkit::peers::coturn("turnserver")
        .args([
            "-n",
            "--no-cli",
            "--listening-ip=127.0.0.1",
            "--relay-ip=127.0.0.1",
            "--no-tls",
            "--no-dtls",
            "--realm=example.org",
            "--use-auth-secret",
            "--static-auth-secret=SECRET",
            "--allow-loopback-peers",
            "--min-port=40000",
            "--max-port=40999",
            "--log-file=stdout",
            "--simple-log",
        ])
        .arg(format!("--listening-port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn turnserver");
    let server = Server(child);
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    probe
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut req = vec![0u8, 1, 0, 0, 0x21, 0x12, 0xa4, 0x42];
    req.extend_from_slice(&[7u8; 12]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut buf = [0u8; 512];
    loop {
        assert!(Instant::now() < deadline, "coturn did not answer on {port}");
        probe.send_to(&req, ("127.0.0.1", port)).unwrap();
        if probe.recv_from(&mut buf).is_ok() {
            return (server, port);
        }
    }
}

fn turnload(port: u16, pid: u32, args: &[&str]) -> (Output, Vec<serde_json::Value>) {
    let out = Command::new(env!("CARGO_BIN_EXE_lastcall-turnload"))
        .args(["--server", &format!("127.0.0.1:{port}"), "--cpu-pid"])
        .arg(pid.to_string())
        .args(args)
        .output()
        .expect("run lastcall-turnload");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (out, lines)
}

fn kind<'a>(lines: &'a [serde_json::Value], k: &str) -> Vec<&'a serde_json::Value> {
    lines.iter().filter(|l| l["kind"] == k).collect()
}

#[test]
fn relays_every_datagram_through_coturn_at_a_low_rate() {
    if !have_coturn() {
        eprintln!("skipped: coturn's turnserver is not installed");
        return;
    }
    let (server, port) = coturn();
    let (out, lines) = turnload(
        port,
        server.0.id(),
        &[
            "relay",
            "--clients",
            "2",
            "--rates",
            "200",
            "--duration",
            "1",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let relay = kind(&lines, "relay");
    assert_eq!(relay.len(), 1, "{lines:?}");
    let r = relay[0];
    let sent = r["sent"].as_u64().unwrap();
    assert!(sent >= 150, "{r}");
    assert_eq!(r["lost"], 0, "{r}");
    assert_eq!(r["received"].as_u64(), Some(sent), "{r}");
    assert_eq!(r["datagrams"].as_u64(), Some(2 * sent), "{r}");
    assert!(r["p50_us"].as_u64().unwrap() > 0, "{r}");
    // Every process on the path: the server, the echo peer (a process of its own), the
    // generator, the softirq threads.
    for who in ["server", "echo", "generator", "softirq"] {
        assert!(r["cpu_s"][who].is_f64(), "{who}: {r}");
    }
    assert!(r["whole_us_per_datagram"].as_f64().unwrap() > 0.0, "{r}");
    let summary = kind(&lines, "summary");
    assert_eq!(summary[0]["max_rate_under_threshold"], 200.0, "{lines:?}");
}

#[test]
fn opens_and_deletes_allocations_on_coturn() {
    if !have_coturn() {
        eprintln!("skipped: coturn's turnserver is not installed");
        return;
    }
    let (server, port) = coturn();
    let pid = server.0.id().to_string();
    let (out, lines) = turnload(
        port,
        server.0.id(),
        &[
            "hold",
            "--count",
            "50",
            "--concurrency",
            "4",
            "--hold",
            "0.2",
            "--rss-pid",
            &pid,
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let a = kind(&lines, "allocs");
    assert_eq!(a.len(), 1, "{lines:?}");
    assert_eq!(a[0]["ok"], 50, "{}", a[0]);
    assert_eq!(a[0]["failed"], 0, "{}", a[0]);
    assert!(a[0]["allocs_per_s"].as_f64().unwrap() > 0.0);
    assert!(
        a[0]["rss_after_kib"].as_u64() > a[0]["rss_before_kib"].as_u64(),
        "{}",
        a[0]
    );
    // A wrong secret: every allocation fails (401), and the tool says so.
    let (out, lines) = turnload(
        port,
        server.0.id(),
        &["--secret", "WRONG", "hold", "--count", "2", "--hold", "0"],
    );
    assert!(out.status.success());
    let a = kind(&lines, "allocs");
    assert_eq!(
        (a[0]["ok"].as_u64(), a[0]["failed"].as_u64()),
        (Some(0), Some(2))
    );
}
