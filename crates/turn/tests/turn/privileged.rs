//! Ports below 1024 without root (`src/privileged.rs`): the real binary as uid 65534 with the
//! image's file capability `cap_net_bind_service=p` (set with Debian's `setcap` on a copy)
//! binds a port below net.ipv4.ip_unprivileged_port_start holding CAP_NET_BIND_SERVICE in
//! its effective set and nothing else; on a port above it holds no capability at all; and
//! without the file capability it refuses to start before binding anything, naming the
//! option, the port and what gives the capability (exit 71).
//!
//! Needs root (to change uid with `setpriv` and to set the file capability) and a low port
//! free on 127.0.0.1; as CI runs. The process runs in the host's network namespace, whose
//! boundary is read from /proc.

use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lastcall_testkit::{self as testkit, free_udp_tcp_port, Pod, Signal, WAIT};

use crate::common::turn_args;

const NOBODY: &str = "65534";

fn is_root() -> bool {
    euid() == 0
}

/// The effective uid, from /proc.
fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    field(&status, "Uid:")
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} in\n{status}"))
        .trim()
}

fn boundary() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A port from `first` up, below `below`, free for UDP and TCP on 127.0.0.1 (bound as root
/// to see). Each test starts from its own `first`, so that one's probe never takes the port
/// another's daemon is binding (nextest runs them at once).
fn free_low_port(first: u16, below: u16) -> u16 {
    (first..below.min(first + 200))
        .find(|p| {
            UdpSocket::bind(("127.0.0.1", *p)).is_ok()
                && TcpListener::bind(("127.0.0.1", *p)).is_ok()
        })
        .unwrap_or_else(|| panic!("no free port from {first} below the boundary on 127.0.0.1"))
}

/// A copy of the binary that uid 65534 may run, with `caps` set on it by `setcap` (none:
/// no file capability).
fn binary(dir: &Path, caps: Option<&str>) -> PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("lastcall-turn");
    std::fs::copy(env!("CARGO_BIN_EXE_lastcall-turn"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    if let Some(caps) = caps {
        let out = Command::new("setcap").arg(caps).arg(&bin).output().unwrap();
        assert!(out.status.success(), "setcap {caps}: {out:?}");
        let got = Command::new("getcap").arg(&bin).output().unwrap();
        assert!(
            String::from_utf8_lossy(&got.stdout).contains("cap_net_bind_service=p"),
            "{got:?}"
        );
    }
    bin
}

/// `bin` as uid/gid 65534 with no supplementary groups (setpriv; the bounding set keeps
/// what this root process has, as a container's holds an added capability).
fn as_nobody(bin: &Path, port: u16, admin: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .arg(bin)
        .args(turn_args(port, admin))
        .arg("--shutdown-delay=0s");
    cmd
}

/// CapPrm and CapEff of a running process.
fn caps_of(pid: u32) -> (String, String) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    (
        field(&status, "CapPrm:").to_string(),
        field(&status, "CapEff:").to_string(),
    )
}

#[test]
fn a_low_port_is_bound_as_uid_65534_with_the_file_capability_raised_alone() {
    if !is_root() {
        eprintln!("skipped: needs root (setpriv, setcap)");
        return;
    }
    let start = boundary();
    if start == 0 {
        eprintln!("skipped: net.ipv4.ip_unprivileged_port_start is 0 here (no port is privileged)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = binary(dir.path(), Some("cap_net_bind_service=p"));
    let port = free_low_port(600, start);
    let admin = format!("127.0.0.1:{}", testkit::free_port());
    let mut pod = Pod::spawn(as_nobody(&bin, port, &admin));
    pod.wait_for_log("lastcall-turn listening", WAIT);
    let line = pod.wait_for_log("CAP_NET_BIND_SERVICE raised", WAIT);
    assert!(line.contains(&format!("listening-port {port}")), "{line}");
    // Every thread (the I/O threads were started after the raise) holds it, and only it.
    for task in std::fs::read_dir(format!("/proc/{}/task", pod.pid())).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        assert_eq!(
            field(&status, "Uid:").split_whitespace().next(),
            Some(NOBODY)
        );
        assert_eq!(field(&status, "CapEff:"), "0000000000000400", "{status}");
        assert_eq!(field(&status, "CapPrm:"), "0000000000000400", "{status}");
    }
    assert_eq!(testkit::http_get(admin.as_str(), "/readyz").0, 200);
    // The low port is really served: an Allocate over UDP on it succeeds.
    let server = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut client = testkit::turn::TurnClient::new(server, crate::common::SECRET, "alice");
    client
        .allocate(60)
        .unwrap_or_else(|e| panic!("Allocate on UDP {port}: {e:?}"));
    client.refresh(0).unwrap();
    pod.signal(Signal::Term);
    let exit = pod.wait_exit(Duration::from_secs(60));
    assert_eq!(exit.code, Some(0), "{exit:?}");
}

#[test]
fn a_high_port_leaves_the_file_capability_dropped() {
    if !is_root() {
        eprintln!("skipped: needs root (setpriv, setcap)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = binary(dir.path(), Some("cap_net_bind_service=p"));
    let port = free_udp_tcp_port();
    let admin = format!("127.0.0.1:{}", testkit::free_port());
    let mut pod = Pod::spawn(as_nobody(&bin, port, &admin));
    pod.wait_for_log("lastcall-turn listening", WAIT);
    assert!(pod.has_log("CAP_NET_BIND_SERVICE dropped: no port below"));
    assert_eq!(
        caps_of(pod.pid()),
        (
            "0000000000000000".to_string(),
            "0000000000000000".to_string()
        )
    );
    pod.signal(Signal::Term);
    assert_eq!(pod.wait_exit(Duration::from_secs(60)).code, Some(0));
}

#[test]
fn a_low_port_without_the_capability_is_refused_before_binding_with_what_gives_it() {
    if !is_root() {
        eprintln!("skipped: needs root (setpriv)");
        return;
    }
    let start = boundary();
    if start == 0 {
        eprintln!("skipped: net.ipv4.ip_unprivileged_port_start is 0 here (no port is privileged)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = binary(dir.path(), None);
    let port = free_low_port(800, start);
    let admin_port = testkit::free_port();
    let admin = format!("127.0.0.1:{admin_port}");
    let out = as_nobody(&bin, port, &admin).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(71), "{stderr}");
    for needle in [
        format!("listening-port {port} is below net.ipv4.ip_unprivileged_port_start ({start})"),
        format!("(uid {NOBODY}) has no CAP_NET_BIND_SERVICE"),
        "nothing was bound".to_string(),
        "turn.listeningPort".to_string(),
        "--cap-add NET_BIND_SERVICE".to_string(),
        "AmbientCapabilities=CAP_NET_BIND_SERVICE".to_string(),
    ] {
        assert!(stderr.contains(&needle), "no `{needle}` in:\n{stderr}");
    }
    // Nothing was bound: the admin port is still free (its listener comes after the check).
    assert!(TcpListener::bind(("127.0.0.1", admin_port)).is_ok());
    // --validate says the same as a warning and exits 0: the file is valid.
    let out = as_nobody(&bin, port, &admin)
        .arg("--validate")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stdout.contains(&format!("warning: listening-port {port} is below"))
            && stdout.contains("(start-up here would exit 71)"),
        "{stdout}"
    );
}
