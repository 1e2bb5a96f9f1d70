//! What an operator of coturn uses beside the relay: `GET /` on the Prometheus port (coturn's
//! documented health check), its families typed as coturn types them (Prometheus text
//! 0.0.4, checked by Debian's `promtool`), the Prometheus port served beside `--admin-addr`,
//! and `lastcall-turn --validate` (check a turnserver.conf without starting the server).

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::process::Command;

use crate::common::{self_signed, uclient, Peer, Turn, SECRET};
use lastcall_testkit::{self as testkit, free_port, free_udp_tcp_port};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lastcall-turn"))
}

#[test]
fn the_prometheus_port_answers_get_root_and_serves_coturns_families_as_coturn_types_them() {
    let prometheus = free_port();
    let turn = Turn::start(&[
        "--prometheus-address=127.0.0.1",
        &format!("--prometheus-port={prometheus}"),
    ]);
    let peer = Peer::start();
    let port = turn.port.to_string();
    let peer_port = peer.port.to_string();
    uclient(
        &[
            "-c",
            "-e",
            "127.0.0.1",
            "-r",
            &peer_port,
            "-X",
            "-g",
            "-n",
            "5",
            "-m",
            "1",
            "-p",
            &port,
            "-u",
            "alice",
            "-W",
            SECRET,
        ],
        std::time::Duration::from_secs(60),
    )
    .assert_all_echoed(5);
    let coturn_port = format!("127.0.0.1:{prometheus}");
    for addr in [turn.admin.as_str(), coturn_port.as_str()] {
        assert_eq!(
            testkit::http_get(addr, "/"),
            (200, "ok\n".to_string()),
            "{addr}"
        );
    }
    let (code, text) = testkit::http_get(&coturn_port, "/metrics");
    assert_eq!(code, 200);
    // coturn's prom_server.c: counters by these names (no _total), the allocations a gauge.
    for family in [
        "# TYPE stun_binding_request counter",
        "# TYPE turn_traffic_rcvp counter",
        "# TYPE turn_traffic_peer_sentb counter",
        "# TYPE turn_total_traffic_sentp counter",
        "# TYPE turn_total_allocations gauge",
        "# TYPE lastcall_turn_auth_failures_total counter",
        "# TYPE lastcall_sessions gauge",
        // The process's own (lastcall's, client_golang's names), on coturn's port too.
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_open_fds gauge",
        "# TYPE process_start_time_seconds gauge",
    ] {
        assert!(text.contains(family), "{family}\n{text}");
    }
    assert!(
        text.lines().any(
            |l| l.starts_with("turn_traffic_rcvp{realm=\"example.org\"} ") && !l.ends_with(" 0")
        ),
        "{text}"
    );
    assert!(
        !text.contains("# EOF"),
        "Prometheus text 0.0.4 has no EOF: {text}"
    );
    // Debian's promtool reads it as Prometheus does, without a complaint.
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package, scripts/setup.sh)");
    std::io::Write::write_all(&mut check.stdin.take().expect("stdin"), text.as_bytes())
        .expect("feed promtool");
    let out = check.wait_with_output().expect("promtool");
    let said =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    // promtool lints names too: coturn's counters lack _total, which it reports as such and
    // nothing else.
    let other: Vec<&str> = said
        .lines()
        .filter(|l| {
            !l.trim().is_empty() && !l.contains("counter metrics should have \"_total\" suffix")
        })
        .collect();
    assert!(other.is_empty(), "promtool: {said}");
    assert!(
        said.contains("turn_traffic_rcvp counter metrics should have \"_total\" suffix"),
        "promtool sees them as counters: {said}"
    );
}

#[test]
fn validate_checks_what_start_up_checks_binds_nothing_and_exits_0_or_64() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = self_signed(dir.path(), "v", "validate.test");
    let port = free_udp_tcp_port();
    // The ports it would use are taken: --validate must not try to bind them.
    let _udp = UdpSocket::bind(("127.0.0.1", port)).expect("hold udp");
    let _tcp = TcpListener::bind(("127.0.0.1", port)).expect("hold tcp");
    let admin = TcpListener::bind("127.0.0.1:0").expect("hold admin");
    let admin: SocketAddr = admin.local_addr().expect("addr");
    let conf = dir.path().join("turnserver.conf");
    std::fs::write(
        &conf,
        format!(
            "listening-ip=127.0.0.1\nlistening-port={port}\nrealm=example.org\n\
             use-auth-secret\nstatic-auth-secret={SECRET}\ncert={}\npkey={}\nsyslog\n",
            cert.display(),
            key.display()
        ),
    )
    .expect("conf");
    let out = bin()
        .arg("-c")
        .arg(&conf)
        .args(["--validate", &format!("--admin-addr={admin}")])
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("configuration valid"), "{stdout}");
    assert!(
        stdout.contains("warning: "),
        "the accepted options' warnings: {stdout}"
    );
    assert!(stdout.contains("TLS on"), "{stdout}");

    // Every problem start-up would find, found here: a certificate that does not load, a
    // bad value, an unsupported option; exit 64, nothing bound.
    std::fs::write(&key, "not a key").expect("break key");
    std::fs::write(
        &conf,
        format!(
            "{}listening-port=notaport\nmobility\n",
            std::fs::read_to_string(&conf).expect("read conf")
        ),
    )
    .expect("conf");
    let out = bin()
        .arg("-c")
        .arg(&conf)
        .args(["--validate", "--drain-timeout=soon"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    for needle in [
        "cert/pkey",
        "listening-port=notaport",
        "unsupported coturn option mobility",
        "--drain-timeout",
    ] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
}
