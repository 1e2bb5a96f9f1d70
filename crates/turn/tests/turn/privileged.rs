//! Ports below 1024 without root (`src/privileged.rs`): the real binary as uid 65534 with the
//! image's file capability `cap_net_bind_service=p` (set with Debian's `setcap` on a copy)
//! binds a port below net.ipv4.ip_unprivileged_port_start holding CAP_NET_BIND_SERVICE in
//! its effective set and nothing else; on a port above it holds no capability at all; and
//! without the file capability it refuses to start before binding anything, naming the
//! option, the port and what gives the capability (exit 71). Also: the ambient capability a
//! systemd unit's `AmbientCapabilities=` gives (kept for a low port, dropped otherwise), and
//! what no_new_privs does to the file capability (granted only from a parent holding it in
//! its permitted set, as runc does; withheld after runuser's uid change).
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

/// CAP_NET_BIND_SERVICE alone, as a capability set of `/proc/PID/status`.
const BIND: u64 = 1 << 10;

fn is_root() -> bool {
    testkit::procfs::euid() == 0
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

/// The exit status and output of a command expected to exit by itself (SIGKILLed after 30 s
/// if it does not, so a daemon that starts after all fails the test instead of hanging it).
fn exit_of(cmd: Command) -> (Option<i32>, String) {
    let mut pod = Pod::spawn(cmd);
    let exit = pod.wait_exit(Duration::from_secs(30));
    assert!(
        !exit.killed,
        "still running after 30 s:\n{}",
        pod.logs().join("\n")
    );
    (exit.code, pod.logs().join("\n"))
}

/// CapPrm and CapEff of a running process.
fn caps_of(pid: u32) -> (u64, u64) {
    let status = testkit::procfs::status(pid).expect("the daemon runs");
    (status.capprm, status.capeff)
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
    let threads = testkit::procfs::thread_statuses(pod.pid());
    assert!(!threads.is_empty(), "the daemon runs");
    for status in threads {
        assert_eq!(status.ruid.to_string(), NOBODY);
        assert_eq!(status.capeff, BIND, "{status:?}");
        assert_eq!(status.capprm, BIND, "{status:?}");
    }
    // Readiness follows the listening line through the lifecycle's task: awaited.
    testkit::wait_for("/readyz 200", WAIT, || {
        testkit::try_http(admin.as_str(), "GET", "/readyz", None).is_ok_and(|(code, _)| code == 200)
    });
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
    assert_eq!(caps_of(pod.pid()), (0, 0));
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
    let (code, stderr) = exit_of(as_nobody(&bin, port, &admin));
    assert_eq!(code, Some(71), "{stderr}");
    for needle in [
        format!("listening-port {port} is below net.ipv4.ip_unprivileged_port_start ({start})"),
        format!("(uid {NOBODY}) has no CAP_NET_BIND_SERVICE"),
        // setpriv keeps the bounding set and sets no no_new_privs: the copy lacks the file
        // capability.
        "nothing was bound (it is in the bounding set, but this binary has no file capability"
            .to_string(),
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

/// systemd's `AmbientCapabilities=CAP_NET_BIND_SERVICE` with `User=` (what a unit needs for
/// a port below 1024; Debian's coturn.service has no such line), emulated with setpriv's
/// ambient set on a binary without the file capability: the low port is bound with the
/// capability as systemd gave it; with no low port it is dropped from every set, ambient too.
#[test]
fn an_ambient_capability_as_systemd_gives_it_binds_a_low_port_and_is_dropped_when_unneeded() {
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
    for port in [free_low_port(700, start), free_udp_tcp_port()] {
        let admin = format!("127.0.0.1:{}", testkit::free_port());
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
            .args([
                "--inh-caps",
                "+net_bind_service",
                "--ambient-caps",
                "+net_bind_service",
                "--",
            ])
            .arg(&bin)
            .args(turn_args(port, &admin))
            .arg("--shutdown-delay=0s");
        let mut pod = Pod::spawn(cmd);
        pod.wait_for_log("lastcall-turn listening", WAIT);
        let status = testkit::procfs::status(pod.pid()).expect("the daemon runs");
        let want = if port < start { BIND } else { 0 };
        for (key, caps) in [
            ("CapEff", Some(status.capeff)),
            ("CapPrm", Some(status.capprm)),
            ("CapAmb", status.capamb),
        ] {
            assert_eq!(caps, Some(want), "port {port} {key}\n{status:?}");
        }
        assert_eq!(
            pod.has_log("CAP_NET_BIND_SERVICE dropped"),
            port >= start,
            "port {port}"
        );
        pod.signal(Signal::Term);
        assert_eq!(pod.wait_exit(Duration::from_secs(60)).code, Some(0));
    }
}

/// no_new_privs (`allowPrivilegeEscalation: false`, `NoNewPrivileges=yes`) and the file
/// capability: the kernel caps the new permitted set at the parent's. With the capability in
/// the parent's permitted set before the exec (setpriv keeps its permitted set across
/// `--reuid`, as runc does for an added capability) it is granted and raised; from a parent
/// that changed uid without keeping it (runuser, as a unit's `User=` does) it is withheld and
/// start-up says so (exit 71): under `NoNewPrivileges=yes` a unit needs
/// `AmbientCapabilities=`.
#[test]
fn no_new_privs_grants_the_file_capability_only_from_a_parent_that_holds_it() {
    if !is_root() {
        eprintln!("skipped: needs root (setpriv, runuser, setcap)");
        return;
    }
    let start = boundary();
    if start == 0 {
        eprintln!("skipped: net.ipv4.ip_unprivileged_port_start is 0 here (no port is privileged)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = binary(dir.path(), Some("cap_net_bind_service=p"));
    // The parent holds it (runc's case): granted, raised, the low port bound.
    let port = free_low_port(900, start);
    let admin = format!("127.0.0.1:{}", testkit::free_port());
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid",
        NOBODY,
        "--regid",
        NOBODY,
        "--clear-groups",
        "--no-new-privs",
        "--",
    ])
    .arg(&bin)
    .args(turn_args(port, &admin))
    .arg("--shutdown-delay=0s");
    let mut pod = Pod::spawn(cmd);
    pod.wait_for_log("lastcall-turn listening", WAIT);
    let status = testkit::procfs::status(pod.pid()).expect("the daemon runs");
    assert_eq!(status.nonewprivs, Some(1));
    assert_eq!(status.capeff, BIND, "{status:?}");
    pod.signal(Signal::Term);
    assert_eq!(pod.wait_exit(Duration::from_secs(60)).code, Some(0));
    // The parent does not (runuser drops it with the uid change): withheld, exit 71.
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "nobody", "--", "setpriv", "--no-new-privs"])
        .arg(&bin)
        .args(turn_args(port, &admin));
    let (code, text) = exit_of(cmd);
    assert_eq!(code, Some(71), "{text}");
    assert!(
        text.contains(&format!("listening-port {port} is below")),
        "{text}"
    );
}
