//! A coturn user's turnserver.conf starts `lastcall-turn`: our fixtures with the options of
//! Debian 12's and 13's default `/etc/turnserver.conf`, of coturn 4.6.1's shipped example and of
//! coturn 4.18's (its active lines, and every option its example shows), each with a realm and
//! credentials added. Each starts, logs one warning per accepted option (what we do instead),
//! and relays for coturn's `turnutils_uclient` over UDP, TCP and TLS, every message echoed.
//! The options refused by design are each an error naming the option and its line (exit 64).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{uclient, Peer, Turn, SECRET};
use lastcall_testkit as harness;

const MSGS: u64 = 10;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The options of `conf` (one `name[=value]` a line, `#` comments).
fn names(conf: &Path) -> Vec<String> {
    std::fs::read_to_string(conf)
        .expect("read fixture")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split(['=', ' ']).next().unwrap_or(l).to_string())
        .collect()
}

/// Starts `lastcall-turn -c conf` on free loopback ports with a TLS listener; returns it
/// (UDP/TCP port in `port`, TLS in `tls_port`).
fn start(conf: &Path, dir: &Path) -> Turn {
    let (cert, key) = crate::common::self_signed(dir, "turn", "turn.test");
    let port = crate::common::free_udp_tcp_port();
    let tls_port = crate::common::free_udp_tcp_port();
    let admin = format!("127.0.0.1:{}", harness::free_port());
    let args: Vec<String> = vec![
        "-c".into(),
        conf.display().to_string(),
        "--listening-ip=127.0.0.1".into(),
        format!("--listening-port={port}"),
        format!("--tls-listening-port={tls_port}"),
        "--relay-ip=127.0.0.1".into(),
        "--allow-loopback-peers".into(),
        format!("--cert={}", cert.display()),
        format!("--pkey={}", key.display()),
        format!("--pidfile={}", dir.join("turn.pid").display()),
        format!("--admin-addr={admin}"),
    ];
    Turn::spawn(args, port, tls_port, admin)
}

/// uclient over UDP, TCP and TLS (channels, REST or static credentials) through `turn` to a
/// `turnutils_peer`: every message echoed.
fn relays_over_udp_tcp_tls(turn: &Turn, auth: &[&str]) {
    let peer = Peer::start();
    let peer_port = peer.port.to_string();
    for (what, mode, port) in [
        ("UDP", &[][..], turn.port),
        ("TCP", &["-t"][..], turn.port),
        ("TLS", &["-t", "-S"][..], turn.tls_port),
    ] {
        let port = port.to_string();
        let n = MSGS.to_string();
        let mut args = vec!["-c", "-X", "-n", &n, "-m", "1", "-z", "5", "-p", &port];
        args.extend(["-e", "127.0.0.1", "-r", &peer_port]);
        args.extend(mode);
        args.extend(auth);
        let r = uclient(&args, Duration::from_secs(60));
        println!(
            "uclient over {what}: {} sent, {} echoed",
            r.send_msgs, r.recv_msgs
        );
        r.assert_all_echoed(MSGS);
    }
}

/// Every accepted option of `conf` was warned about once, naming it and its line.
fn warned_once_each(turn: &Turn, conf: &Path, accepted: &[&str]) {
    let logs = turn.pod.logs().join("\n");
    let file = conf.display().to_string();
    let text = std::fs::read_to_string(conf).expect("read fixture");
    for name in accepted {
        let line = text
            .lines()
            .position(|l| l.split(['=', ' ']).next() == Some(name))
            .map(|i| i + 1)
            .unwrap_or_else(|| panic!("{name} not in {file}"));
        let needle = format!("{file}:{line}: {name}: is accepted and changes nothing: ");
        assert_eq!(
            logs.matches(&needle).count(),
            1,
            "one warning for {name} at line {line}:\n{logs}"
        );
    }
    let warnings = logs.matches("is accepted and changes nothing").count();
    assert_eq!(warnings, accepted.len(), "no other such warning:\n{logs}");
}

fn rest() -> [&'static str; 4] {
    ["-u", "alice", "-W", SECRET]
}

#[test]
fn debian_12_default_conf_starts_warns_and_relays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = data("debian-12.conf");
    let turn = start(&conf, dir.path());
    warned_once_each(&turn, &conf, &["syslog"]);
    relays_over_udp_tcp_tls(&turn, &rest());
}

#[test]
fn debian_13_default_conf_starts_warns_and_relays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = data("debian-13.conf");
    let turn = start(&conf, dir.path());
    warned_once_each(&turn, &conf, &["syslog"]);
    relays_over_udp_tcp_tls(&turn, &rest());
}

#[test]
fn coturn_4_6_1_example_conf_starts_and_relays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = data("coturn-4.6.1.conf");
    let turn = start(&conf, dir.path());
    warned_once_each(&turn, &conf, &[]);
    relays_over_udp_tcp_tls(&turn, &["-u", "bob", "-w", "builder"]);
}

#[test]
fn coturn_4_18_conf_starts_warns_and_relays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = data("coturn-4.18.conf");
    let turn = start(&conf, dir.path());
    warned_once_each(&turn, &conf, &["syslog"]);
    relays_over_udp_tcp_tls(&turn, &rest());
}

/// Every option of coturn 4.18's example (but the refused and the test's own), given: one
/// warning for each accepted one, and uclient relays with REST and static credentials.
#[test]
fn every_option_of_coturn_4_18s_example_starts_warns_and_relays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = data("coturn-4.18-every-option.conf");
    let turn = start(&conf, dir.path());
    let text = std::fs::read_to_string(&conf).expect("read fixture");
    // The accepted ones are those after the marker comment.
    let accepted: Vec<&str> = text
        .split("# Accepted, each with one start-up warning.")
        .nth(1)
        .expect("marker")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(['=', ' ']).next().unwrap_or(l))
        .collect();
    assert!(accepted.len() > 30, "{accepted:?}");
    warned_once_each(&turn, &conf, &accepted);
    relays_over_udp_tcp_tls(&turn, &rest());
    relays_over_udp_tcp_tls(&turn, &["-u", "bob", "-w", "builder"]);
}

/// Each option lastcall-turn refuses: exit 64, an error naming it, its line and what to do.
#[test]
fn refused_options_exit_64_each_named_with_its_line_and_what_to_do() {
    let conf = data("refused.conf");
    let out = Command::new(env!("CARGO_BIN_EXE_lastcall-turn"))
        .arg("-c")
        .arg(&conf)
        .args(["--realm=example.org", "--user=bob:builder"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    let file = conf.display().to_string();
    let text = std::fs::read_to_string(&conf).expect("read fixture");
    let refused = names(&conf);
    assert!(refused.len() > 20, "{refused:?}");
    for name in &refused {
        let line = text
            .lines()
            .position(|l| l.split(['=', ' ']).next() == Some(name.as_str()))
            .expect("line")
            + 1;
        let needle = format!("{file}:{line}: unsupported coturn option {name} (");
        let found = err.lines().find(|l| l.contains(&needle));
        let found = found.unwrap_or_else(|| panic!("{needle}:\n{err}"));
        // What to do: a hint, in brackets, after the name.
        assert!(found.trim_end().ends_with(')'), "{found}");
    }
    assert_eq!(
        err.matches("unsupported coturn option").count(),
        refused.len(),
        "{err}"
    );
}
