//! Wire's deployment: the configuration wire's coturn chart writes (our rendering of its
//! template, `tests/data/wire-coturn.conf.template`) turned into turnserver.conf by the
//! StatefulSet's own command line (its two `sed` runs, under `/bin/sh`), then read with `-c`
//! alone but for the test's ports and loopback peers. A client holding credentials as Wire's
//! backend (brig) issues them allocates and relays a call through the real daemon; an
//! expired one and one of another scheme get 401 and are counted; a conference server's
//! (`sft-`) name past its expiry still works. With a TLS listener and `CA-file`, a TLS client
//! without a certificate signed by that CA fails the handshake, one with it relays. The
//! StatefulSet's command line runs under Debian's dumb-init and drains a call on SIGTERM, and
//! the image's `pre-stop-hook` drains the `turnserver` process and returns at its exit.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lastcall_testkit::turn::{TurnClient, TurnError, ZrestCredentials};

use crate::common::{Peer, Turn, Uclient, WAIT};
use lastcall_testkit as harness;

/// The secrets file of wire's chart: one secret a line, ending in a newline.
const SECRETS: &str = "wire-first-secret\nwire-second-secret\n";
/// A user id (a UUID's bytes), as brig has it.
const USER: [u8; 16] = [
    0x6e, 0x0c, 0x8f, 0x3c, 0x7a, 0x1b, 0x4c, 0x2d, 0x9e, 0x8f, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
];

/// Writes `dir/turnserver.conf` as wire's StatefulSet does: the placeholders replaced with
/// the pod's, host's and external addresses (all 127.0.0.1 here), then one
/// `static-auth-secret=` line per line of the secrets file.
fn render(dir: &Path) -> std::path::PathBuf {
    let template =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/wire-coturn.conf.template");
    std::fs::create_dir_all(dir.join("external-ip")).unwrap();
    std::fs::write(dir.join("external-ip/ip"), "127.0.0.1").unwrap();
    std::fs::write(dir.join("zrest_secret.txt"), SECRETS).unwrap();
    let conf = dir.join("turnserver.conf");
    let script = r#"set -e
EXTERNAL_IP=$(cat "$DIR/external-ip/ip")
sed -Ee "s;__COTURN_EXT_IP__;$EXTERNAL_IP;g" -e "s;__COTURN_POD_IP__;$POD_IP;g" -e "s;__COTURN_HOST_IP__;$HOST_IP;g" "$TEMPLATE" > "$DIR/turnserver.conf"
sed -Ee 's/^/static-auth-secret=/' "$DIR/zrest_secret.txt" >> "$DIR/turnserver.conf"
"#;
    let status = Command::new("/bin/sh")
        .args(["-c", script])
        .env("DIR", dir)
        .env("TEMPLATE", &template)
        .env("POD_IP", "127.0.0.1")
        .env("HOST_IP", "127.0.0.1")
        .status()
        .expect("run /bin/sh");
    assert!(status.success());
    conf
}

/// `lastcall-turn -c turnserver.conf` with the test's free ports, a pidfile in `dir`, and
/// loopback peers (wire's file denies 127/8, as it should in production), plus `extra`.
fn start(dir: &Path, extra: &[String]) -> Turn {
    let conf = render(dir);
    let port = harness::free_udp_tcp_port();
    let metrics = harness::free_port();
    let mut args: Vec<String> = vec![
        "-c".into(),
        conf.display().to_string(),
        format!("--listening-port={port}"),
        format!("--prometheus-port={metrics}"),
        format!("--pidfile={}", dir.join("turnserver.pid").display()),
        "--allow-loopback-peers".into(),
        "--allowed-peer-ip=127.0.0.1".into(),
    ];
    args.extend(extra.iter().cloned());
    Turn::spawn(args, port, 0, format!("127.0.0.1:{metrics}"))
}

fn failures(turn: &Turn) -> f64 {
    turn.metric("lastcall_turn_auth_failures_total")
        .unwrap_or(0.0)
}

#[test]
fn a_client_with_brigs_zrest_credentials_allocates_and_relays() {
    let dir = tempfile::tempdir().unwrap();
    let turn = start(dir.path(), &[]);
    let server = SocketAddr::from(([127, 0, 0, 1], turn.port));
    let peer = Peer::start();
    let peer_addr = SocketAddr::from(([127, 0, 0, 1], peer.port));

    // Made with the second line of the secrets file: every secret is tried.
    let creds = ZrestCredentials::valid_for("wire-second-secret", &USER, Duration::from_secs(3600));
    let mut c = TurnClient::long_term(server, &creds.username, &creds.password);
    c.call(peer_addr, 0x4000)
        .expect("a call with brig's credentials");
    c.stream(Duration::from_millis(10));
    c.wait_received(50, WAIT);
    c.stop_stream(Duration::from_millis(200));
    println!("zrest call: {} sent, {} echoed", c.sent(), c.received());
    assert_eq!(
        turn.metric("turn_total_allocations{type=\"UDP\"}"),
        Some(1.0)
    );
    assert_eq!(failures(&turn), 0.0);

    // A conference server's name (sft-) a day past its d still allocates.
    let day_ago = ZrestCredentials::valid_for("wire-first-secret", &USER, Duration::ZERO);
    let d = day_ago
        .username
        .split(['=', '.'])
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        - 86_400;
    let sft = ZrestCredentials::brig("wire-first-secret", &USER, d, true);
    let mut s = TurnClient::long_term(server, &sft.username, &sft.password);
    s.allocate(600).expect("sft- never expires");

    // The same name without sft-: expired, 401, counted.
    let expired = ZrestCredentials::brig("wire-first-secret", &USER, d, false);
    let mut e = TurnClient::long_term(server, &expired.username, &expired.password);
    assert!(matches!(
        e.allocate(600),
        Err(TurnError::Code { code: 401, .. })
    ));
    let after_expired = failures(&turn);
    assert!(after_expired >= 1.0, "{after_expired}");

    // coturn's TURN REST API credentials: no fallback while zrest is on.
    let rest = lastcall_testkit::turn::RestCredentials::new("wire-first-secret", "alice");
    let mut r = TurnClient::long_term(server, &rest.username, &rest.password);
    assert!(matches!(
        r.allocate(600),
        Err(TurnError::Code { code: 401, .. })
    ));
    assert!(failures(&turn) > after_expired);
    assert_eq!(
        turn.metric("turn_total_allocations{type=\"UDP\"}"),
        Some(2.0)
    );
}

/// A CA and a client certificate it signed (openssl CLI), in `dir`.
fn ca_and_client(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let (ca_cert, ca_key) = lastcall_testkit::tls::self_signed(dir, "ca", "Test CA");
    let (key, csr, cert) = (
        dir.join("client-key.pem"),
        dir.join("client.csr"),
        dir.join("client-cert.pem"),
    );
    let run = |args: &[&str]| {
        let ok = Command::new("openssl")
            .args(args)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl")
            .success();
        assert!(ok, "openssl {args:?}");
    };
    let p = |x: &std::path::PathBuf| x.display().to_string();
    // An X.509 v3 client certificate (webpki, like browsers, takes no v1 certificate).
    let ext = dir.join("client.ext");
    std::fs::write(
        &ext,
        "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=wire-client",
        "-keyout",
        &p(&key),
        "-out",
        &p(&csr),
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &p(&csr),
        "-CA",
        &p(&ca_cert),
        "-CAkey",
        &p(&ca_key),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &p(&ext),
        "-out",
        &p(&cert),
    ]);
    (ca_cert, cert, key)
}

#[test]
fn with_tls_ca_file_verifies_client_certificates_as_coturn_does() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, client_cert, client_key) = ca_and_client(dir.path());
    let (cert, key) = crate::common::self_signed(dir.path(), "turn", "turn.test");
    let tls_port = harness::free_udp_tcp_port();
    // wire's chart with tls.enabled: cert and pkey instead of no-tls (given here), CA-file.
    let _turn = start(
        dir.path(),
        &[
            "--no-tls=false".into(),
            format!("--cert={}", cert.display()),
            format!("--pkey={}", key.display()),
            format!("--tls-listening-port={tls_port}"),
            format!("--CA-file={}", ca.display()),
        ],
    );
    let peer = Peer::start();
    let creds = ZrestCredentials::valid_for("wire-first-secret", &USER, Duration::from_secs(3600));
    let uclient = |with_cert: bool| {
        let mut u = Uclient::new(tls_port)
            .flags(&["-c", "-t", "-S"])
            .peer(peer.port)
            .messages(5)
            .gap_ms(5)
            .credentials(&["-u", &creds.username, "-w", &creds.password]);
        if with_cert {
            let (c, k) = (
                client_cert.display().to_string(),
                client_key.display().to_string(),
            );
            u = u.flags(&["-i", &c, "-k", &k]);
        }
        u.run(Duration::from_secs(30))
    };
    let verified = uclient(true);
    println!(
        "TLS with a client certificate: {} sent, {} echoed",
        verified.send_msgs, verified.recv_msgs
    );
    verified.assert_all_echoed(5);
    let refused = uclient(false);
    println!(
        "TLS without: {} sent, {} echoed",
        refused.send_msgs, refused.recv_msgs
    );
    assert_eq!(
        refused.recv_msgs, 0,
        "a client without a certificate relays nothing"
    );
}

/// wire's chart with `coturnGracefulTermination: true`: the kubelet runs
/// `/usr/local/bin/pre-stop-hook "$POD_IP" 9641` before its SIGTERM. The image's names are
/// symlinks here: the daemon runs as `turnserver`, the hook is the same binary as
/// `pre-stop-hook`. The hook starts the drain, waits while a call keeps relaying, and returns
/// 0 right after the daemon's exit at the call's end (exit 0, nothing lost).
#[test]
fn the_pre_stop_hook_drains_turnserver_and_returns_when_its_last_call_ends() {
    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_lastcall-turn"));
    let (turnserver, hook) = (
        dir.path().join("turnserver"),
        dir.path().join("pre-stop-hook"),
    );
    std::os::unix::fs::symlink(bin, &turnserver).unwrap();
    std::os::unix::fs::symlink(bin, &hook).unwrap();
    let conf = render(dir.path());
    let port = harness::free_udp_tcp_port();
    let metrics = harness::free_port();
    let mut cmd = Command::new(&turnserver);
    cmd.args(["-c", &conf.display().to_string()])
        .arg(format!("--listening-port={port}"))
        .arg(format!("--prometheus-port={metrics}"))
        .arg(format!(
            "--pidfile={}",
            dir.path().join("turnserver.pid").display()
        ))
        .args(["--allow-loopback-peers", "--allowed-peer-ip=127.0.0.1"]);
    let mut daemon = harness::Pod::spawn(cmd);
    daemon.wait_for_log("lastcall-turn listening", WAIT);
    let comm = lastcall_testkit::procfs::comm(daemon.pid()).expect("the daemon runs");
    assert_eq!(comm, "turnserver", "the name wire's reloader looks for");

    let peer = Peer::start();
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let creds = ZrestCredentials::valid_for("wire-first-secret", &USER, Duration::from_secs(3600));
    let mut c = TurnClient::long_term(server, &creds.username, &creds.password);
    c.call(SocketAddr::from(([127, 0, 0, 1], peer.port)), 0x4000)
        .expect("a call");
    c.stream(Duration::from_millis(10));
    c.wait_received(20, WAIT);

    let mut run = Command::new(&hook);
    run.args(["127.0.0.1", &metrics.to_string()]);
    let mut prestop = harness::Pod::spawn(run);
    daemon.wait_for_log("pre-stop-hook: SIGUSR1 to turnserver", WAIT);
    daemon.wait_for_log("SIGUSR1 received", WAIT);
    // The call goes on while the hook waits.
    let before = c.received();
    c.wait_received(before + 20, WAIT);
    assert!(
        prestop.is_running(),
        "the hook returned with a call still up"
    );

    c.stop_stream(Duration::from_millis(200));
    assert_eq!(c.sent(), c.received(), "nothing lost");
    c.refresh(0).expect("the call's end");
    let exit = daemon.wait_exit(WAIT);
    assert_eq!(exit.code, Some(0), "{exit:?}");
    let returned = prestop.wait_exit(WAIT);
    assert_eq!(returned.code, Some(0), "{returned:?}");
    assert!(
        prestop.has_log("drained and exited"),
        "{:?}",
        prestop.logs()
    );
}

/// wire's StatefulSet's command line, for real: Debian's `/usr/bin/dumb-init -- /bin/sh -c`
/// with the chart's script (its two `sed` runs, then `exec` the daemon as `turnserver`, a
/// symlink here as in the image). The kubelet's SIGTERM goes to dumb-init, PID 1 of the
/// container: it passes it on, the daemon drains, a call in progress keeps relaying, a new
/// one is refused, and everything exits 0 once the call ends, nothing lost.
#[test]
fn wires_command_line_under_dumb_init_drains_on_sigterm() {
    let dumb_init = Path::new("/usr/bin/dumb-init");
    assert!(
        dumb_init.exists(),
        "/usr/bin/dumb-init is missing: apt-get install dumb-init (scripts/setup.sh does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_lastcall-turn"));
    let turnserver = dir.path().join("turnserver");
    std::os::unix::fs::symlink(bin, &turnserver).unwrap();
    let template =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/wire-coturn.conf.template");
    std::fs::create_dir_all(dir.path().join("external-ip")).unwrap();
    std::fs::write(dir.path().join("external-ip/ip"), "127.0.0.1").unwrap();
    std::fs::write(dir.path().join("zrest_secret.txt"), SECRETS).unwrap();
    let port = harness::free_udp_tcp_port();
    let metrics = harness::free_port();
    // The chart's script, its paths made the test's (and the test's ports and loopback peers
    // added to the daemon's command line, with a 1 s shutdown delay).
    let script = r#"set -e
EXTERNAL_IP=$(cat "$DIR/external-ip/ip")
sed -Ee "s;__COTURN_EXT_IP__;$EXTERNAL_IP;g" -e "s;__COTURN_POD_IP__;$POD_IP;g" -e "s;__COTURN_HOST_IP__;$HOST_IP;g" "$TEMPLATE" > "$DIR/turnserver.conf"
sed -Ee 's/^/static-auth-secret=/' "$DIR/zrest_secret.txt" >> "$DIR/turnserver.conf"
exec "$TURNSERVER" -c "$DIR/turnserver.conf" --listening-port="$PORT" --prometheus-port="$METRICS" --pidfile="$DIR/turnserver.pid" --allow-loopback-peers --allowed-peer-ip=127.0.0.1 --shutdown-delay=1s
"#;
    let mut cmd = Command::new(dumb_init);
    cmd.args(["--", "/bin/sh", "-c", script])
        .env("DIR", dir.path())
        .env("TEMPLATE", &template)
        .env("TURNSERVER", &turnserver)
        .env("POD_IP", "127.0.0.1")
        .env("HOST_IP", "127.0.0.1")
        .env("PORT", port.to_string())
        .env("METRICS", metrics.to_string());
    let mut pod = harness::Pod::spawn(cmd);
    pod.wait_for_log("lastcall-turn listening", WAIT);

    let peer = Peer::start();
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let peer_addr = SocketAddr::from(([127, 0, 0, 1], peer.port));
    let creds = ZrestCredentials::valid_for("wire-first-secret", &USER, Duration::from_secs(3600));
    let mut c = TurnClient::long_term(server, &creds.username, &creds.password);
    c.call(peer_addr, 0x4000).expect("a call");
    c.stream(Duration::from_millis(10));
    c.wait_received(20, WAIT);

    pod.signal(harness::Signal::Term);
    pod.wait_for_log("phase announcing -> refusing", WAIT);
    let mut late = TurnClient::long_term(server, &creds.username, &creds.password);
    assert!(
        matches!(late.allocate(600), Err(TurnError::Code { code: 403, .. })),
        "a new Allocate is refused while draining"
    );
    let before = c.received();
    c.wait_received(before + 20, WAIT);
    assert!(
        pod.is_running(),
        "dumb-init and the daemon wait for the call"
    );

    c.stop_stream(Duration::from_millis(200));
    assert_eq!(c.sent(), c.received(), "nothing lost");
    c.refresh(0).expect("the call's end");
    let exit = pod.wait_exit(WAIT);
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(!exit.killed);
}
