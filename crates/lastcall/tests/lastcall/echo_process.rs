//! Process-level tests: the echo example as a real process, real signals, real sockets
//! (127.0.0.1, ephemeral ports), driven by `lastcall_testkit`'s process harness like a kubelet would.
//! Timing bounds are generous (busy machine); measured figures are printed.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use lastcall_testkit::{self as testkit, Pod, Signal};

const START: Duration = Duration::from_secs(30);
const GRACE: Duration = Duration::from_secs(30);
/// "Within 1 s" checks allow this much on a busy machine (the figure is printed).
const ONE_SECOND_BOUND: Duration = Duration::from_secs(3);

struct Echo {
    pod: Pod,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Echo {
    fn start(args: &[&str]) -> Echo {
        let mut cmd = Command::new(testkit::example_path("lastcall", "echo"));
        cmd.args(["--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .args(args);
        for (key, _) in std::env::vars() {
            if key.starts_with("LASTCALL_") || key == "ECHO_LISTEN" {
                cmd.env_remove(key);
            }
        }
        let pod = Pod::spawn(cmd);
        let admin = addr_after(
            &pod.wait_for_log("admin listener on ", START),
            "admin listener on ",
        );
        let listen = addr_after(
            &pod.wait_for_log("echo listening on ", START),
            "echo listening on ",
        );
        Echo { pod, listen, admin }
    }

    fn connect(&self) -> Conn {
        Conn::open(self.listen)
    }

    fn get(&self, path: &str) -> (u16, String) {
        testkit::http_get(self.admin, path)
    }

    fn post(&self, path: &str, bearer: Option<&str>) -> (u16, String) {
        testkit::http_post(self.admin, path, bearer)
    }

    /// Polls `GET /readyz` until it answers `status`; returns how long that took.
    fn wait_ready_status(&self, status: u16) -> Duration {
        let start = Instant::now();
        loop {
            if self.get("/readyz").0 == status {
                return start.elapsed();
            }
            assert!(start.elapsed() < START, "/readyz never answered {status}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn addr_after(line: &str, marker: &str) -> SocketAddr {
    let at = line.find(marker).map(|i| i + marker.len()).unwrap_or(0);
    let word: String = line[at..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ',' && *c != '(')
        .collect();
    word.parse()
        .unwrap_or_else(|_| panic!("no address after {marker:?} in {line:?}"))
}

/// An echo connection.
struct Conn {
    stream: TcpStream,
    n: u32,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|err| panic!("connect {addr}: {err}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut conn = Conn { stream, n: 0 };
        conn.assert_echoes();
        conn
    }

    /// Sends a line and reads it back.
    fn assert_echoes(&mut self) {
        self.n += 1;
        let msg = format!("ping {}\n", self.n);
        self.stream.write_all(msg.as_bytes()).unwrap();
        let mut back = vec![0u8; msg.len()];
        self.stream.read_exact(&mut back).expect("echo reply");
        assert_eq!(back, msg.as_bytes());
    }
}

fn assert_refused(addr: SocketAddr) {
    match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Err(err) if err.kind() == ErrorKind::ConnectionRefused => {}
        Err(err) => panic!("expected connection refused, got {err}"),
        Ok(mut stream) => {
            // Accepted by the kernel after all? It must not be served.
            stream
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            let _ = stream.write_all(b"ping\n");
            let mut buf = [0u8; 8];
            let served = matches!(stream.read(&mut buf), Ok(n) if n > 0);
            panic!("connection after the delay was accepted (served: {served})");
        }
    }
}

fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} not found in:\n{body}"))
}

#[test]
fn drain_with_delay_serves_then_refuses_then_exits_when_the_last_connection_closes() {
    let mut echo = Echo::start(&["--shutdown-delay", "1s", "--drain-timeout", "20s"]);
    let mut a = echo.connect();
    let mut b = echo.connect();
    assert_eq!(echo.get("/readyz").0, 200);
    let (code, body) = echo.get("/metrics");
    assert_eq!(code, 200);
    assert_eq!(metric(&body, "lastcall_sessions"), 2.0);
    assert_eq!(metric(&body, "lastcall_drain_phase"), 0.0);

    echo.pod.signal(Signal::Term);
    let signalled = Instant::now();
    let to_503 = echo.wait_ready_status(503);
    println!("readyz 503 {to_503:?} after SIGTERM");
    assert!(
        to_503 < Duration::from_millis(500),
        "readiness fell after {to_503:?}"
    );
    assert_eq!(echo.get("/livez").0, 200, "liveness never falls");
    // New work during the delay is still served.
    let mut c = echo.connect();
    let during = signalled.elapsed();
    println!("new connection served {during:?} after SIGTERM");
    assert!(
        during < Duration::from_secs(1),
        "too slow to test the 1 s delay: {during:?}"
    );
    let (_, drain) = echo.get("/drain");
    assert!(drain.contains("\"phase\": \"announcing\""), "{drain}");

    echo.pod.wait_for_log("phase announcing -> refusing", START);
    echo.pod.wait_for_log("listener closed", START);
    let refusing_after = signalled.elapsed();
    println!("refusing {refusing_after:?} after SIGTERM");
    assert!(refusing_after >= Duration::from_secs(1));
    assert_refused(echo.listen);
    assert_eq!(echo.get("/readyz").0, 503);
    assert_eq!(echo.get("/livez").0, 200);
    let (_, body) = echo.get("/metrics");
    assert_eq!(metric(&body, "lastcall_drain_phase"), 2.0);
    assert_eq!(metric(&body, "lastcall_sessions"), 3.0);

    // Open connections keep echoing to their natural end.
    a.assert_echoes();
    b.assert_echoes();
    c.assert_echoes();
    drop(c);
    drop(a);
    b.assert_echoes();
    assert!(echo.pod.is_running());
    let last_close = Instant::now();
    drop(b);
    let report = echo.pod.wait_exit(GRACE);
    let after_close = last_close.elapsed();
    println!("exit {after_close:?} after the last connection closed: {report:?}");
    assert_eq!(report.code, Some(0));
    assert!(!report.killed);
    assert!(
        after_close < ONE_SECOND_BOUND,
        "exit {after_close:?} after the last close"
    );
    assert!(echo.pod.has_log("drain ended: idle"));
}

#[test]
fn deadline_cuts_a_connection_that_never_closes() {
    let mut echo = Echo::start(&["--shutdown-delay", "0", "--drain-timeout", "3s"]);
    let _stuck = echo.connect();
    echo.pod.signal(Signal::Term);
    let report = echo.pod.wait_exit(GRACE);
    println!(
        "deadline exit after {:?}: {report:?}",
        report.elapsed_since_signal
    );
    assert_eq!(report.code, Some(lastcall::exit::DEADLINE));
    assert!(report.elapsed_since_signal >= Duration::from_millis(2900));
    assert!(report.elapsed_since_signal < Duration::from_secs(6));
    let line = echo.pod.wait_for_log("drain ended: deadline", START);
    assert!(line.contains("1 session cut"), "{line}");
}

#[test]
fn second_sigterm_exits_now() {
    let mut echo = Echo::start(&["--shutdown-delay", "5s", "--drain-timeout", "20s"]);
    let _open = echo.connect();
    echo.pod.signal(Signal::Term);
    echo.pod.wait_for_log("SIGTERM received", START);
    echo.pod.signal(Signal::Term);
    let report = echo.pod.wait_exit(GRACE);
    println!(
        "second SIGTERM: exit after {:?}",
        report.elapsed_since_signal
    );
    assert_eq!(report.code, Some(lastcall::exit::FORCED));
    assert!(report.elapsed_since_signal < ONE_SECOND_BOUND);
    assert!(echo.pod.has_log("forced by SIGTERM"));
}

#[test]
fn sigquit_exits_at_once() {
    let mut echo = Echo::start(&[]);
    let _open = echo.connect();
    echo.pod.signal(Signal::Quit);
    let report = echo.pod.wait_exit(GRACE);
    println!("SIGQUIT: exit after {:?}", report.elapsed_since_signal);
    assert_eq!(report.code, Some(lastcall::exit::FORCED));
    assert!(report.elapsed_since_signal < ONE_SECOND_BOUND);
}

#[test]
fn ignore_survives_sigterm_and_drains_on_sigusr1() {
    let mut echo = Echo::start(&["--on-sigterm", "ignore", "--shutdown-delay", "0"]);
    let mut open = echo.connect();
    let mark = echo.pod.log_len();
    echo.pod.signal(Signal::Term);
    echo.pod
        .wait_for_log_after(mark, "ignored (--on-sigterm ignore)", START);
    assert!(echo.pod.is_running());
    assert_eq!(echo.get("/readyz").0, 200);
    let _late = echo.connect();
    open.assert_echoes();
    // SIGHUP and SIGUSR2 are not exits either (SIGUSR2's default action would end it).
    echo.pod.signal(Signal::Hup);
    echo.pod.wait_for_log("SIGHUP received: reloading", START);
    assert!(echo.pod.is_running());
    echo.pod.signal(Signal::Usr2);
    echo.pod.wait_for_log("SIGUSR2 received: reloading", START);
    assert!(echo.pod.is_running());
    open.assert_echoes();

    echo.pod.signal(Signal::Usr1);
    echo.pod.wait_for_log("SIGUSR1 received", START);
    echo.wait_ready_status(503);
    echo.pod.wait_for_log("listener closed", START);
    assert_refused(echo.listen);
    open.assert_echoes();
    drop(open);
    drop(_late);
    let report = echo.pod.wait_exit(GRACE);
    assert_eq!(report.code, Some(0));
}

#[test]
fn linger_never_refuses_and_exits_when_the_last_connection_closes() {
    let mut echo = Echo::start(&["--on-sigterm", "linger", "--shutdown-delay", "1s"]);
    let a = echo.connect();
    echo.pod.signal(Signal::Term);
    echo.pod.wait_for_log("lingering", START);
    let to_503 = echo.wait_ready_status(503);
    assert!(to_503 < Duration::from_secs(1), "{to_503:?}");
    // Past the delay (read from the daemon's own clock), new connections are still served.
    loop {
        let (_, body) = echo.get("/drain");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["phase"], "lingering");
        if json["seconds_since_trigger"].as_f64().unwrap() > 1.3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut b = echo.connect();
    b.assert_echoes();
    assert!(echo.pod.is_running());
    drop(a);
    b.assert_echoes();
    let last = Instant::now();
    drop(b);
    let report = echo.pod.wait_exit(GRACE);
    println!("linger: exit {:?} after the last close", last.elapsed());
    assert_eq!(report.code, Some(0));
    assert!(last.elapsed() < ONE_SECOND_BOUND);
    assert!(!echo.pod.has_log("-> refusing"), "linger must not refuse");
}

#[test]
fn post_drain_from_loopback_drains() {
    let mut echo = Echo::start(&["--shutdown-delay", "0"]);
    let mut open = echo.connect();
    assert_eq!(echo.get("/nope").0, 404);
    assert_eq!(echo.post("/livez", None).0, 405);
    let (code, body) = echo.post("/drain", None);
    assert_eq!(code, 202, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["trigger"], "POST /drain");
    assert_eq!(json["phase"], "refusing");
    assert_eq!(echo.get("/readyz").0, 503);
    echo.pod.wait_for_log("listener closed", START);
    open.assert_echoes();
    drop(open);
    let report = echo.pod.wait_exit(GRACE);
    assert_eq!(report.code, Some(0));
}

#[test]
fn post_drain_with_a_token_requires_it() {
    let dir = std::env::temp_dir().join(format!("lastcall-echo-token-{}", std::process::id()));
    std::fs::write(&dir, "t0ken-42\n").unwrap();
    let mut echo = Echo::start(&[
        "--shutdown-delay",
        "0",
        "--admin-token-file",
        dir.to_str().unwrap(),
    ]);
    std::fs::remove_file(&dir).unwrap();
    let (code, _) = echo.post("/drain", None);
    assert_eq!(code, 401, "no token, even from loopback");
    let (code, _) = echo.post("/drain", Some("wrong"));
    assert_eq!(code, 401);
    assert_eq!(echo.get("/readyz").0, 200, "still serving");
    assert!(echo.pod.is_running());
    let (code, _) = echo.post("/drain", Some("t0ken-42"));
    assert_eq!(code, 202);
    let report = echo.pod.wait_exit(GRACE);
    assert_eq!(report.code, Some(0));
}

#[test]
fn sigint_drains() {
    let mut echo = Echo::start(&["--shutdown-delay", "0"]);
    let open = echo.connect();
    echo.pod.signal(Signal::Int);
    echo.pod.wait_for_log("listener closed", START);
    drop(open);
    assert_eq!(echo.pod.wait_exit(GRACE).code, Some(0));
}

#[test]
fn help_lists_every_option_with_default_and_env() {
    let out = Command::new(testkit::example_path("lastcall", "echo"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    println!("{help}");
    for (flag, env, default) in [
        (
            "--on-sigterm <",
            "[env: LASTCALL_ON_SIGTERM=",
            "[default: drain]",
        ),
        (
            "--shutdown-delay <",
            "[env: LASTCALL_SHUTDOWN_DELAY=",
            "[default: 2s]",
        ),
        (
            "--drain-timeout <",
            "[env: LASTCALL_DRAIN_TIMEOUT=",
            "[default: 25s]",
        ),
        (
            "--drain-min-sessions <",
            "[env: LASTCALL_DRAIN_MIN_SESSIONS=",
            "[default: 0]",
        ),
        (
            "--admin-addr <",
            "[env: LASTCALL_ADMIN_ADDR=",
            "[default: 127.0.0.1:9090]",
        ),
        (
            "--admin-token <",
            "[env: LASTCALL_ADMIN_TOKEN]",
            "[default: none]",
        ),
        (
            "--admin-token-file <",
            "[env: LASTCALL_ADMIN_TOKEN_FILE=",
            "[default: none]",
        ),
        (
            "--log-format <",
            "[env: LASTCALL_LOG_FORMAT=",
            "[default: text]",
        ),
        (
            "--log-level <",
            "[env: LASTCALL_LOG_LEVEL=",
            "[default: info]",
        ),
        (
            "--listen <",
            "[env: ECHO_LISTEN=",
            "[default: 127.0.0.1:7007]",
        ),
    ] {
        let at = help.find(flag).unwrap_or_else(|| panic!("{flag} missing"));
        let rest = &help[at + flag.len()..];
        let section = &rest[..rest.find("\n  -").unwrap_or(rest.len())];
        assert!(section.contains(env), "{flag}: no {env} in {section}");
        assert!(
            section.contains(default),
            "{flag}: no {default} in {section}"
        );
    }
    assert!(help.contains("--shutdown-grace-period"));
}

#[test]
fn impossible_options_exit_64_naming_both() {
    let out = Command::new(testkit::example_path("lastcall", "echo"))
        .args(["--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .args([
            "--shutdown-delay",
            "10s",
            "--drain-timeout",
            "5s",
            "--drain-min-sessions",
            "x",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(lastcall::exit::CONFIG), "{err}");
    assert!(
        err.contains("--shutdown-delay (10s)") && err.contains("--drain-timeout (5s)"),
        "{err}"
    );
    assert!(err.contains("--drain-min-sessions"), "{err}");
    let out = Command::new(testkit::example_path("lastcall", "echo"))
        .arg("--no-such-option")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(lastcall::exit::CONFIG));
}

#[test]
fn json_logs_are_one_object_per_line() {
    let mut echo = Echo::start(&["--shutdown-delay", "0", "--log-format", "json"]);
    let open = echo.connect();
    echo.pod.signal(Signal::Term);
    echo.pod.wait_for_log("refusing", START);
    drop(open);
    assert_eq!(echo.pod.wait_exit(GRACE).code, Some(0));
    let logs = echo.pod.logs();
    assert!(logs.len() >= 5, "{logs:?}");
    for line in &logs {
        let json: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(json["message"].is_string(), "{line}");
        assert!(json["level"].is_string(), "{line}");
    }
    let last = logs
        .iter()
        .rfind(|l| l.contains("drain ended"))
        .expect("last line");
    let json: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(json["status"], 0);
}

#[test]
fn kubelet_rollout_loses_no_new_connection_during_endpoint_propagation() {
    let mut echo = Echo::start(&["--shutdown-delay", "2s", "--drain-timeout", "20s"]);
    let listen = echo.listen;
    // New connections keep coming for 1 s after SIGTERM (shorter than the 2 s delay).
    let report = echo
        .pod
        .terminate_under_load(Duration::from_secs(1), GRACE, || {
            let Ok(mut stream) = TcpStream::connect_timeout(&listen, Duration::from_secs(2)) else {
                return false;
            };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut back = [0u8; 5];
            stream.write_all(b"ping\n").is_ok()
                && stream.read_exact(&mut back).is_ok()
                && &back == b"ping\n"
        });
    println!("rollout: {report:?}");
    assert!(report.succeeded > 10, "{report:?}");
    assert_eq!(report.failed, 0, "{report:?}");
    // Nothing open once the load moved: the pod leaves at the end of the 2 s delay.
    assert_eq!(report.exit.code, Some(0));
    assert!(!report.exit.killed);
    assert!(report.exit.elapsed_since_signal >= Duration::from_secs(2));
    assert!(report.exit.elapsed_since_signal < Duration::from_secs(2) + ONE_SECOND_BOUND);
}

/// Starts echo with `args` and waits only for its admin listener (start-up work follows).
fn start_admin_only(args: &[&str]) -> (Pod, SocketAddr) {
    let mut cmd = Command::new(testkit::example_path("lastcall", "echo"));
    cmd.args(["--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("LASTCALL_") || key == "ECHO_LISTEN" {
            cmd.env_remove(key);
        }
    }
    let pod = Pod::spawn(cmd);
    let admin = addr_after(
        &pod.wait_for_log("admin listener on ", START),
        "admin listener on ",
    );
    (pod, admin)
}

#[test]
fn readiness_is_503_while_starting_and_a_sigterm_then_exits_at_once() {
    let (mut pod, admin) = start_admin_only(&["--startup-work", "60s"]);
    pod.wait_for_log("start-up work", START);
    assert_eq!(
        testkit::http_get(admin, "/readyz"),
        (503, "starting\n".to_string())
    );
    assert_eq!(testkit::http_get(admin, "/livez").0, 200);
    let (_, drain) = testkit::http_get(admin, "/drain");
    assert!(drain.contains("\"phase\": \"starting\""), "{drain}");
    let (_, metrics) = testkit::http_get(admin, "/metrics");
    assert_eq!(metric(&metrics, "lastcall_drain_phase"), 4.0);
    pod.signal(Signal::Term);
    let report = pod.wait_exit(GRACE);
    println!(
        "SIGTERM while starting: exit after {:?}",
        report.elapsed_since_signal
    );
    assert_eq!(report.code, Some(0));
    assert!(report.elapsed_since_signal < ONE_SECOND_BOUND);
    assert!(pod.has_log("SIGTERM received while starting"));
    assert!(!pod.has_log("echo listening on"), "nothing was bound");
}

#[test]
fn readiness_rises_when_start_up_work_is_done() {
    let (pod, admin) = start_admin_only(&["--startup-work", "1s"]);
    pod.wait_for_log("start-up work", START);
    assert_eq!(testkit::http_get(admin, "/readyz").0, 503);
    let line = pod.wait_for_log("echo listening on ", START);
    let listen = addr_after(&line, "echo listening on ");
    pod.wait_for_log("phase starting -> serving", START);
    assert_eq!(
        testkit::http_get(admin, "/readyz"),
        (200, "ready\n".to_string())
    );
    Conn::open(listen).assert_echoes();
}

/// An exit hook that outlives the deadline (an evaluation that cannot be interrupted): the
/// process still leaves at `--drain-timeout` plus `EXIT_GRACE`, with the deadline's status.
#[test]
fn a_slow_exit_hook_does_not_hold_the_process_past_the_deadline() {
    let mut echo = Echo::start(&[
        "--shutdown-delay",
        "0",
        "--drain-timeout",
        "2s",
        "--exit-work",
        "60s",
    ]);
    let _stuck = echo.connect();
    echo.pod.signal(Signal::Term);
    let report = echo.pod.wait_exit(GRACE);
    let bound = Duration::from_secs(2) + lastcall::EXIT_GRACE;
    println!(
        "exit {:?} after SIGTERM (deadline + grace = {bound:?}): {report:?}",
        report.elapsed_since_signal
    );
    assert_eq!(report.code, Some(lastcall::exit::DEADLINE));
    assert!(!report.killed);
    assert!(report.elapsed_since_signal >= bound - Duration::from_millis(100));
    assert!(report.elapsed_since_signal < bound + ONE_SECOND_BOUND);
    assert!(echo.pod.has_log("exit hook exit-work still running"));
}

/// Idle before the deadline: the hook gets what is left of it (and a quick one costs nothing).
#[test]
fn an_exit_hook_gets_what_is_left_of_the_deadline() {
    let mut echo = Echo::start(&[
        "--shutdown-delay",
        "0",
        "--drain-timeout",
        "20s",
        "--exit-work",
        "1500ms",
    ]);
    echo.pod.signal(Signal::Term);
    let report = echo.pod.wait_exit(GRACE);
    println!("idle exit with a 1.5 s hook: {report:?}");
    assert_eq!(report.code, Some(0));
    assert!(report.elapsed_since_signal >= Duration::from_millis(1500));
    assert!(report.elapsed_since_signal < Duration::from_millis(1500) + ONE_SECOND_BOUND);
    assert!(!echo.pod.has_log("still running"));
}

#[test]
fn problems_name_the_environment_variable_a_value_came_from() {
    let out = Command::new(testkit::example_path("lastcall", "echo"))
        .args(["--admin-addr", "127.0.0.1:0", "--exit-work", "later"])
        .env("LASTCALL_DRAIN_TIMEOUT", "soon")
        .env_remove("LASTCALL_SHUTDOWN_DELAY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    println!("{err}");
    assert_eq!(out.status.code(), Some(lastcall::exit::CONFIG), "{err}");
    assert!(err.starts_with("echo: configuration errors:\n"), "{err}");
    assert!(err.contains("  - --exit-work (later): "), "{err}");
    assert!(
        err.contains("  - --drain-timeout (LASTCALL_DRAIN_TIMEOUT=soon): expected a number"),
        "{err}"
    );
}
