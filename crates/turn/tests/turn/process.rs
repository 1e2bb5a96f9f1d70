//! The `lastcall-turn` process: a coturn turnserver.conf starts unchanged, unsupported options
//! exit 64 naming them, `--help`, TLS certificate reload on SIGHUP, and the drain (SIGTERM:
//! live allocations keep relaying, a new Allocate gets 403).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{Peer, Turn, Uclient, SECRET, WAIT};
use lastcall_testkit::{self as testkit, Signal};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lastcall-turn"))
}

/// Datagrams relayed to peers: a call is up once this moves.
const PEER_SENT: &str = "turn_traffic_peer_sentp{realm=\"example.org\"}";

#[test]
fn coturn_conf_starts_unchanged_and_relays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = crate::common::self_signed(dir.path(), "turn", "turn.test");
    let port = crate::common::free_udp_tcp_port();
    let tls_port = crate::common::free_udp_tcp_port();
    let admin = format!("127.0.0.1:{}", testkit::free_port());
    let conf = dir.path().join("turnserver.conf");
    // A coturn configuration as Kubernetes deployments write it (loopback for the test).
    let text = format!(
        "# coturn configuration\n\
         listening-port={port}\n\
         tls-listening-port={tls_port}\n\
         listening-ip=127.0.0.1\n\
         relay-ip=127.0.0.1\n\
         external-ip=192.0.2.77/127.0.0.1\n\
         min-port=40000\n\
         max-port=40999\n\
         realm=example.org\n\
         fingerprint\n\
         lt-cred-mech\n\
         use-auth-secret\n\
         static-auth-secret=old-secret\n\
         static-auth-secret={SECRET}\n\
         no-multicast-peers\n\
         denied-peer-ip=10.0.0.0-10.255.255.255\n\
         denied-peer-ip=192.168.0.0-192.168.255.255\n\
         allowed-peer-ip=172.16.0.5\n\
         allow-loopback-peers\n\
         user-quota=12\n\
         total-quota=1200\n\
         max-allocate-lifetime=3600\n\
         stale-nonce=600\n\
         cert={cert}\n\
         pkey={key}\n\
         no-tcp-relay\n\
         no-cli\n\
         no-tlsv1\n\
         no-tlsv1_1\n\
         no-software-attribute\n\
         prometheus\n\
         log-file=stdout\n\
         verbose\n",
        cert = cert.display(),
        key = key.display(),
    );
    std::fs::write(&conf, text).expect("write conf");
    let mut cmd = bin();
    cmd.arg("-c")
        .arg(&conf)
        .arg(format!("--admin-addr={admin}"));
    let pod = lastcall_testkit::Pod::spawn(cmd);
    let line = pod.wait_for_log("lastcall-turn listening", WAIT);
    assert!(
        line.contains(&format!("127.0.0.1:{tls_port}")),
        "TLS listener: {line}"
    );
    let turn = Turn {
        pod,
        port,
        tls_port: 0,
        admin,
    };
    let peer = Peer::start();
    let r = Uclient::call(port, peer.port, "u")
        .flags(&["-v", "-c"])
        .gap_ms(5)
        .run(Duration::from_secs(60));
    r.assert_all_echoed(10);
    // external-ip: the relay address is advertised as the public one.
    assert!(
        r.output.contains("relay addr: 192.0.2.77:4"),
        "{}",
        r.output
    );
    assert_eq!(
        turn.metric("turn_total_allocations{type=\"UDP\"}"),
        Some(1.0)
    );
}

#[test]
fn unsupported_coturn_options_exit_64_naming_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("turnserver.conf");
    std::fs::write(
        &conf,
        "realm=example.org\nuse-auth-secret\nstatic-auth-secret=x\nmysql-userdb=host=db dbname=coturn\nfrobnicate=1\n",
    )
    .expect("write conf");
    let out = bin()
        .arg("-c")
        .arg(&conf)
        .args(["--mobility", "--no-such-thing"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("turnserver.conf:4: unsupported coturn option mysql-userdb"),
        "{err}"
    );
    assert!(
        err.contains("unsupported coturn option --mobility"),
        "{err}"
    );
    // An unknown option still exits 64, named with its line.
    assert!(
        err.contains("turnserver.conf:5: unknown option frobnicate"),
        "{err}"
    );
    assert!(err.contains("unknown option --no-such-thing"), "{err}");
}

#[test]
fn bad_values_exit_64_before_binding() {
    let port = crate::common::free_udp_tcp_port();
    let out = bin()
        .args(["-n", "--realm=example.org", "--use-auth-secret"])
        .arg(format!("--listening-port={port}"))
        .args([
            "--listening-ip=127.0.0.1",
            "--min-port=5000",
            "--max-port=4000",
        ])
        .args(["--cert=/nonexistent.pem", "--drain-timeout=soon"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("static-auth-secret"), "{err}");
    assert!(
        err.contains("min-port 5000 is above max-port 4000"),
        "{err}"
    );
    assert!(err.contains("cert and pkey go together"), "{err}");
    assert!(err.contains("--drain-timeout"), "{err}");
    // Nothing was bound.
    assert!(std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok());
}

#[test]
fn help_lists_coturn_and_termination_options() {
    let out = bin().arg("--help").output().expect("run");
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--listening-port",
        "--static-auth-secret",
        "--allow-loopback-peers",
        "FOR TESTS ONLY",
        "--alternate-server",
        "--on-sigterm",
        "--drain-timeout",
        "--admin-addr",
        "-c <FILE>",
    ] {
        assert!(help.contains(opt), "--help lacks {opt}:\n{help}");
    }
}

#[test]
fn tls_certificate_reloads_on_sighup_and_a_bad_one_is_kept_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = crate::common::self_signed(dir.path(), "one", "first.test");
    let tls_port = crate::common::free_udp_tcp_port();
    let mut turn = Turn::start(&[
        &format!("--tls-listening-port={tls_port}"),
        &format!("--cert={}", cert.display()),
        &format!("--pkey={}", key.display()),
        // The signal alone reloads (the files are written in place, one then the other).
        "--no-cert-watch",
    ]);
    assert!(crate::common::served_subject(tls_port).contains("first.test"));

    let (cert2, key2) = crate::common::self_signed(dir.path(), "two", "second.test");
    std::fs::copy(&cert2, &cert).expect("copy cert");
    std::fs::copy(&key2, &key).expect("copy key");
    let mark = turn.pod.log_len();
    turn.pod.signal(Signal::Hup);
    turn.pod
        .wait_for_log_after(mark, "TLS certificate reloaded", WAIT);
    assert!(crate::common::served_subject(tls_port).contains("second.test"));

    std::fs::write(&cert, "not a certificate").expect("break cert");
    let mark = turn.pod.log_len();
    turn.pod.signal(Signal::Hup);
    turn.pod.wait_for_log_after(mark, "reload failed", WAIT);
    assert!(crate::common::served_subject(tls_port).contains("second.test"));
    assert_eq!(
        turn.metric("lastcall_turn_tls_reload_failures_total"),
        Some(1.0)
    );
}

#[test]
fn sigterm_keeps_live_allocation_relaying_and_refuses_new_ones() {
    let mut turn = Turn::start(&["--shutdown-delay=1s", "--drain-timeout=120s"]);
    let peer = Peer::start();
    // A call of 300 packets, 20 ms apart (6 s), that outlives the signal.
    let call = Uclient::call(turn.port, peer.port, "caller")
        .flags(&["-c"])
        .messages(300)
        .gap_ms(20)
        .spawn(Duration::from_secs(90));
    // The call relays (uclient's first allocation is a probe: signalled before the call's own
    // Allocate, the call would get the drain's answer).
    turn.wait_metric_at_least(PEER_SENT, 1.0);
    turn.pod.signal(Signal::Term);
    turn.pod.wait_for_log("refusing new allocations", WAIT);

    let started = Instant::now();
    let late = Uclient::call(turn.port, peer.port, "late")
        .flags(&["-c"])
        .messages(5)
        .run(Duration::from_secs(60));
    assert_ne!(
        late.status,
        Some(0),
        "a new Allocate must be refused:\n{}",
        late.output
    );
    assert!(
        late.output.contains("error 403"),
        "403 expected:\n{}",
        late.output
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refused fast, not by timeout"
    );
    assert!(
        turn.metric("lastcall_turn_allocate_refused_draining_total")
            .unwrap_or(0.0)
            >= 1.0
    );

    let report = call.join().expect("call thread");
    report.assert_all_echoed(300);
    assert!(
        turn.pod.is_running(),
        "the drain waits for the live allocation"
    );
    // A second SIGTERM leaves now; the allocation that was still live is cut (status 76).
    turn.pod.signal(Signal::Term);
    let exit = turn.pod.wait_exit(WAIT);
    assert_eq!(exit.code, Some(lastcall::exit::FORCED), "{exit:?}");
}

#[test]
fn draining_server_sends_new_clients_to_the_alternate_server() {
    let b = Turn::start(&[]);
    let mut a = Turn::start(&[
        "--shutdown-delay=0s",
        "--drain-timeout=120s",
        &format!("--alternate-server=127.0.0.1:{}", b.port),
    ]);
    let peer = Peer::start();
    // A live call keeps A draining (it would exit at once with nothing left).
    let call = Uclient::call(a.port, peer.port, "caller")
        .flags(&["-c"])
        .messages(250)
        .gap_ms(20)
        .spawn(Duration::from_secs(90));
    // The call relays (uclient's first allocation is a probe: signalled before the call's own
    // Allocate, the call would get the drain's answer).
    a.wait_metric_at_least(PEER_SENT, 1.0);
    a.pod.signal(Signal::Term);
    a.pod
        .wait_for_log("refusing new allocations (300 Try Alternate)", WAIT);

    // uclient's probe Allocate gets 300 with ALTERNATE-SERVER; its clients then use B.
    let moved = Uclient::call(a.port, peer.port, "newcomer")
        .flags(&["-c"])
        .messages(20)
        .clients(2)
        .gap_ms(5)
        .run(Duration::from_secs(60));
    moved.assert_all_echoed(40);
    assert!(
        a.metric("lastcall_turn_allocate_refused_draining_total")
            .unwrap_or(0.0)
            >= 1.0
    );
    let on_b = b.metric("lastcall_turn_allocations_created_total");
    let on_a = a.metric("lastcall_turn_allocations_created_total");
    assert!(
        on_b.unwrap_or(0.0) >= 2.0,
        "allocations created on B: {on_b:?}, on A: {on_a:?}"
    );

    call.join().expect("call thread").assert_all_echoed(250);
    a.pod.signal(Signal::Term);
    a.pod.wait_exit(WAIT);
}

#[test]
fn sigterm_exits_0_as_soon_as_the_last_tcp_call_ends() {
    let mut turn = Turn::start(&["--shutdown-delay=1s", "--drain-timeout=120s"]);
    let peer = Peer::start();
    // Over TCP an allocation ends with its connection, i.e. when uclient exits.
    let call = Uclient::call(turn.port, peer.port, "caller")
        .flags(&["-t", "-c"])
        .messages(150)
        .gap_ms(20)
        .spawn(Duration::from_secs(90));
    // The call relays (uclient's first allocation is a probe: signalled before the call's own
    // Allocate, the call would get the drain's answer).
    turn.wait_metric_at_least(PEER_SENT, 1.0);
    turn.pod.signal(Signal::Term);
    let report = call.join().expect("call thread");
    report.assert_all_echoed(150);
    let call_ended = Instant::now();
    let exit = turn.pod.wait_exit(WAIT);
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(
        call_ended.elapsed() < Duration::from_secs(10),
        "left soon after the last allocation: {exit:?}"
    );
}

#[test]
fn drain_deadline_ends_remaining_allocations_with_status_75() {
    let mut turn = Turn::start(&["--shutdown-delay=1s", "--drain-timeout=3s"]);
    let peer = Peer::start();
    // uclient leaves its UDP allocations alive when it exits (lifetime 777 s).
    Uclient::call(turn.port, peer.port, "caller")
        .flags(&["-c"])
        .messages(5)
        .run(Duration::from_secs(60))
        .assert_all_echoed(5);
    turn.pod.signal(Signal::Term);
    let exit = turn.pod.wait_exit(WAIT);
    assert_eq!(exit.code, Some(lastcall::exit::DEADLINE), "{exit:?}");
    assert!(
        exit.elapsed_since_signal >= Duration::from_secs(3),
        "{exit:?}"
    );
    assert!(turn.pod.has_log("ending the remaining allocations"));
}

#[test]
fn sigusr1_drains_like_coturn_even_when_sigterm_is_ignored() {
    let mut turn = Turn::start(&["--on-sigterm=ignore", "--shutdown-delay=0s"]);
    let peer = Peer::start();
    let call = |user: &str| {
        Uclient::call(turn.port, peer.port, user)
            .flags(&["-c"])
            .messages(5)
            .run(Duration::from_secs(60))
    };
    // uclient leaves its allocation alive: the drain has something to wait for.
    call("first").assert_all_echoed(5);
    turn.pod.signal(Signal::Term);
    turn.pod.wait_for_log("SIGTERM", WAIT);
    call("second").assert_all_echoed(5);
    turn.pod.signal(Signal::Usr1);
    turn.pod
        .wait_for_log("refusing new allocations (403)", WAIT);
    let late = call("late");
    assert!(
        late.output.contains("error 403"),
        "403 expected:\n{}",
        late.output
    );
    turn.pod.signal(Signal::Quit);
    let exit = turn.pod.wait_exit(WAIT);
    assert_eq!(exit.code, Some(lastcall::exit::FORCED), "{exit:?}");
}

/// An open TCP connection without an allocation is no session: SIGTERM with nothing live
/// exits 0 at once, and the connection is closed at the exit decision instead of holding
/// the exit until the deadline (60 s here).
#[test]
fn an_open_tcp_connection_without_allocation_does_not_hold_the_exit() {
    use std::io::{Read, Write};
    let mut turn = Turn::start(&["--shutdown-delay=0s", "--drain-timeout=60s"]);
    let mut conn =
        std::net::TcpStream::connect(("127.0.0.1", turn.port)).expect("connect over TCP");
    conn.set_read_timeout(Some(WAIT)).expect("read timeout");
    // A Binding answered proves the connection is being served.
    let mut binding = [0u8; 20];
    binding[..2].copy_from_slice(&0x0001u16.to_be_bytes());
    binding[4..8].copy_from_slice(&0x2112_A442u32.to_be_bytes());
    binding[8..].copy_from_slice(b"open-tcp-con");
    conn.write_all(&binding).expect("send a Binding");
    let mut answer = [0u8; 32];
    conn.read_exact(&mut answer).expect("a Binding response");
    assert_eq!(&answer[..2], &[0x01, 0x01], "Binding success");
    turn.pod.signal(Signal::Term);
    let exit = turn.pod.wait_exit(WAIT);
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(
        exit.elapsed_since_signal < Duration::from_secs(10),
        "the connection held the exit: {exit:?}"
    );
    let mut rest = Vec::new();
    let closed = conn.read_to_end(&mut rest);
    assert!(
        matches!(closed, Ok(0)) || closed.is_err(),
        "the connection was left open: {closed:?}"
    );
    assert!(!turn.pod.has_log("still running"), "{:?}", turn.pod.logs());
}
