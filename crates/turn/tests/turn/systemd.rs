//! `lastcall-turn` under Debian's own `coturn.service`, as systemd runs it: the unit is read
//! from Debian's coturn package on this machine (`Type=notify`, `ExecStart=/usr/bin/turnserver
//! -c /etc/turnserver.conf --pidfile=`), its command line run with our binary in place of
//! `turnserver` and a test's turnserver.conf in place of `/etc/turnserver.conf`, with
//! `NOTIFY_SOCKET` naming a datagram socket this test listens on, as systemd's is.
//!
//! What systemd needs: `READY=1` once the server answers (the start job ends there; without
//! it systemd times the start out), `STOPPING=1` when `systemctl stop` (SIGTERM) starts the
//! drain, `STATUS=` what the drain waits for, and exit status 0 (`Restart=on-failure`
//! restarts nothing); the empty `--pidfile=` writes no pidfile and warns about nothing.

use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{free_udp_tcp_port, Peer, SECRET, WAIT};
use lastcall_testkit::turn::TurnClient;
use lastcall_testkit::{Pod, Signal};

/// Where Debian's coturn package puts its unit (Debian 12: /lib, 13 and later: /usr/lib).
const UNITS: [&str; 2] = [
    "/lib/systemd/system/coturn.service",
    "/usr/lib/systemd/system/coturn.service",
];

/// The unit's `[Service]` settings this test follows.
struct Unit {
    kind: String,
    exec_start: Vec<String>,
}

fn debian_unit() -> Unit {
    let path = UNITS
        .iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or_else(|| {
            panic!("no coturn.service in {UNITS:?}: install Debian's coturn (scripts/setup.sh)")
        });
    let text = std::fs::read_to_string(path).expect("read the unit");
    let value = |key: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{path}: no {key}="))
            .to_string()
    };
    Unit {
        kind: value("Type"),
        exec_start: value("ExecStart")
            .split_whitespace()
            .map(ToString::to_string)
            .collect(),
    }
}

/// Every datagram the "service manager" got so far, split into its `KEY=value` lines.
fn received(sock: &UnixDatagram, until: Instant, want: &str, seen: &mut Vec<String>) {
    let mut buf = [0u8; 4096];
    while !seen.iter().any(|l| l.starts_with(want)) {
        let left = until.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no {want} from the daemon; got {seen:?}");
        sock.set_read_timeout(Some(left)).expect("timeout");
        if let Ok(n) = sock.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            seen.extend(text.lines().map(ToString::to_string));
        }
    }
}

#[test]
fn debians_coturn_service_notify_ready_stopping_and_status_with_no_pidfile() {
    let unit = debian_unit();
    assert_eq!(
        unit.kind, "notify",
        "Debian's coturn.service is Type=notify"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, admin) = (free_udp_tcp_port(), lastcall_testkit::free_port());
    let conf = dir.path().join("turnserver.conf");
    std::fs::write(
        &conf,
        format!(
            "listening-ip=127.0.0.1\nlistening-port={port}\nrelay-ip=127.0.0.1\n\
             realm=example.org\nuse-auth-secret\nstatic-auth-secret={SECRET}\n\
             allow-loopback-peers\nprometheus-address=127.0.0.1\nprometheus-port={admin}\n"
        ),
    )
    .expect("write turnserver.conf");
    // The unit's command line: the program and the file are ours, the rest is the unit's.
    let (program, args) = unit.exec_start.split_first().expect("ExecStart");
    assert_eq!(program, "/usr/bin/turnserver", "{:?}", unit.exec_start);
    let args: Vec<String> = args
        .iter()
        .map(|a| match a.as_str() {
            "/etc/turnserver.conf" => conf.display().to_string(),
            _ => a.clone(),
        })
        .collect();
    assert!(args.contains(&"--pidfile=".to_string()), "{args:?}");
    let socket_path = dir.path().join("notify");
    let manager = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lastcall-turn"));
    cmd.args(&args)
        .env("NOTIFY_SOCKET", &socket_path)
        .current_dir(dir.path());
    let started = Instant::now();
    let mut pod = Pod::spawn(cmd);
    let mut seen = Vec::new();
    received(&manager, started + WAIT, "READY=1", &mut seen);
    let ready_after = started.elapsed();
    // systemd's start job ends here: the server must answer at once.
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let peer = Peer::start();
    let mut call = TurnClient::new(server, SECRET, "systemd");
    call.call(SocketAddr::from(([127, 0, 0, 1], peer.port)), 0x4000)
        .expect("a call right after READY=1");
    call.stream(Duration::from_millis(20));
    call.wait_received(10, WAIT);
    assert!(seen.contains(&"STATUS=serving".to_string()), "{seen:?}");
    assert_eq!(
        lastcall_testkit::http_get(format!("127.0.0.1:{admin}"), "/readyz").0,
        200
    );

    // `systemctl stop`: SIGTERM (KillSignal's default) to the main process.
    let origin = Instant::now();
    pod.signal(Signal::Term);
    received(&manager, origin + WAIT, "STOPPING=1", &mut seen);
    assert!(
        seen.iter()
            .any(|l| l == "STATUS=SIGTERM: draining: announcing (readiness 503), new work still served; waiting for 1 session from 1 peer to end"),
        "{seen:?}"
    );
    // The drain announces for the default 5 s, then refuses; the call relays through both.
    received(
        &manager,
        origin + WAIT,
        "STATUS=draining: refusing new work",
        &mut seen,
    );
    call.wait_received(call.received() + 10, WAIT);
    call.stop_stream(Duration::from_millis(500));
    assert_eq!(call.split(origin).lost(), 0);
    call.refresh(0).expect("delete");
    received(&manager, origin + WAIT, "STATUS=drain ended", &mut seen);
    let exit = pod.wait_exit(WAIT);
    println!(
        "FIGURES systemd: READY=1 {} ms after exec; notifications {seen:?}",
        ready_after.as_millis()
    );
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(
        !pod.has_log("pidfile"),
        "the empty --pidfile= is no pidfile: {:?}",
        pod.logs()
    );
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(files.len(), 2, "only the conf and the socket: {files:?}");
}
