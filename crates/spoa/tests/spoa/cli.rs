//! The command line and process behaviour: `--validate` exit codes, configuration errors
//! (unknown YAML keys named with their line), SIGHUP reloads while requests flow.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{agent_bin, agent_command, get, Agent, Stack, StackOptions, WAIT};
use lastcall_testkit::Signal;

fn validate(config: &str) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, config).expect("write");
    let out = Command::new(agent_bin())
        .arg("--validate")
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn validate_exit_codes() {
    let ok = Command::new(agent_bin())
        .arg("--validate")
        .output()
        .expect("run");
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    assert!(String::from_utf8_lossy(&ok.stdout).contains("configuration OK"));

    let (code, text) = validate(
        "bind: 127.0.0.1:9000\napplications:\n  - name: a\n    directives: |\n      SecRuleEngine On\n",
    );
    assert_eq!(code, 0, "{text}");

    // Rules that do not compile: 64, with libmodsecurity's message.
    let (code, text) =
        validate("applications:\n  - name: a\n    directives: |\n      SecRuleEngine Sometimes\n");
    assert_eq!(code, 64, "{text}");
    assert!(text.contains("application `a`"), "{text}");

    // A bad termination option and a bad file are reported together.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, "bind: nowhere\napplications: []\n").expect("write");
    let out = Command::new(agent_bin())
        .args(["--validate", "--drain-timeout", "soon", "--config"])
        .arg(&path)
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{text}");
    assert!(text.contains("--drain-timeout"), "{text}");
    assert!(text.contains("bind `nowhere`"), "{text}");
    assert!(text.contains("no applications"), "{text}");
}

#[test]
fn unknown_yaml_keys_are_named_with_their_lines() {
    let (code, text) = validate(
        "\
bind: 127.0.0.1:9000
log_levle: debug
applications:
  - name: a
    directives: SecRuleEngine On
    reponse_check: true
",
    );
    assert_eq!(code, 64, "{text}");
    // The file and the line, as `FILE:LINE:`.
    assert!(
        text.contains("/c.yaml:2: unknown field `log_levle`"),
        "{text}"
    );
    assert!(
        text.contains("/c.yaml:6: applications[0]: unknown field `reponse_check`"),
        "{text}"
    );
}

#[test]
fn sighup_reload_while_requests_flow_fails_nothing() {
    let detect = "\
default_application: default
applications:
  - name: default
    detect_only: true
";
    let block = "\
default_application: default
applications:
  - name: default
";
    let mut stack = Stack::start(StackOptions {
        agent_config: Some(detect.into()),
        agents: 1,
        ..StackOptions::default()
    });
    let http = stack.http();
    let attack = "/?id=1'%20OR%20'1'='1";
    assert_eq!(get(http, attack).status, 200, "detect-only lets it through");

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    match crate::support::http(http, "GET", &format!("/w{w}/{i}?q=fine"), &[], b"")
                    {
                        Ok(r) if r.status == 200 => ok.fetch_add(1, Ordering::SeqCst),
                        other => {
                            eprintln!("failed: {other:?}");
                            failed.fetch_add(1, Ordering::SeqCst)
                        }
                    };
                }
            })
        })
        .collect();

    let agent = &mut stack.agents[0];
    let path = agent.config_path().expect("config path");
    let wait_some = |n: u64| {
        let target = ok.load(Ordering::SeqCst) + n;
        let end = std::time::Instant::now() + WAIT;
        while ok.load(Ordering::SeqCst) < target {
            assert!(std::time::Instant::now() < end, "traffic stalled");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    for round in 0..4 {
        wait_some(20);
        let text = if round % 2 == 0 { block } else { detect };
        std::fs::write(&path, text).expect("rewrite config");
        agent.signal_and_wait_for_log(Signal::Hup, "rules reloaded");
        let want = if round % 2 == 0 { 403 } else { 200 };
        assert_eq!(get(http, attack).status, want, "after reload {round}");
    }
    // A broken file: the reload fails, the running rules stay.
    wait_some(20);
    std::fs::write(
        &path,
        "applications:\n  - name: default\n    directives: SecRuleEngine Maybe\n",
    )
    .expect("rewrite");
    agent.signal_and_wait_for_log(Signal::Hup, "reload failed, keeping the running rules");
    wait_some(20);
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        let _ = w.join();
    }
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "requests failed during reloads"
    );
    assert!(ok.load(Ordering::SeqCst) >= 100);

    // The last good reload (round 3) installed detect-only again; round 2 had blocked.
    assert_eq!(get(http, attack).status, 200);
    assert_eq!(agent.metric("spoa_reloads_total{result=\"ok\"}"), 4.0);
    assert_eq!(agent.metric("spoa_reloads_total{result=\"error\"}"), 1.0);
    assert!(agent.pod.is_running());
}

/// A configuration whose rules take seconds to compile (20 applications running CRS).
fn slow_to_compile(bind: &str) -> String {
    let apps: String = (0..20)
        .map(|i| format!("  - name: app{i}\n    paranoia_level: {}\n", 1 + i % 4))
        .collect();
    format!("bind: {bind}\ndefault_application: app0\napplications:\n{apps}")
}

/// Starts the agent on free ports with [`slow_to_compile`] rules and `--on-sigterm policy`;
/// returns once it logs that the rules are compiling (the config's directory must outlive
/// the process).
fn start_compiling_slowly(policy: &str) -> (tempfile::TempDir, lastcall_testkit::Pod) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.yaml");
    let port = lastcall_testkit::free_port();
    std::fs::write(&path, slow_to_compile(&format!("127.0.0.1:{port}"))).expect("write");
    let admin = format!("127.0.0.1:{}", lastcall_testkit::free_port());
    let mut cmd = Command::new(agent_bin());
    cmd.arg("--config")
        .arg(&path)
        .args(["--admin-addr", &admin, "--on-sigterm", policy])
        .args(["--log-level", "info,lastcall_spoa::config::apps=debug"]);
    let pod = lastcall_testkit::Pod::spawn(cmd);
    pod.wait_for_log("compiling the rules of 20 application(s)", WAIT);
    (dir, pod)
}

/// The signal handlers exist before the rules compile: a SIGTERM while they compile ends the
/// process at once with status 0 (nothing is live), instead of being lost (PID 1) or waiting
/// for the compilation: it leaves once the application being compiled is done (how long that
/// takes depends on the machine's load: 3.5 s for a CRS application at a load average of 11),
/// so at most two are compiled after the signal (the one in progress, and one started in the
/// milliseconds before the exit decision reaches the compiling thread), never the 20. Deterministic: the log line is
/// written after the handlers are installed, and the rules take seconds to compile.
#[test]
fn sigterm_while_the_rules_compile_exits_at_once_with_status_0() {
    for (signal, policy) in [(Signal::Term, "drain"), (Signal::Quit, "drain")] {
        let (_dir, mut pod) = start_compiling_slowly(policy);
        let mark = pod.log_len();
        pod.signal(signal);
        let report = pod.wait_exit(WAIT);
        assert_eq!(report.code, Some(0), "{report:?}");
        let compiled_after = pod.logs()[mark..]
            .iter()
            .filter(|l| l.contains("compiled application"))
            .count();
        assert!(
            compiled_after <= 2,
            "{compiled_after} applications compiled after the signal (exit {:?} after it)",
            report.elapsed_since_signal
        );
        assert!(pod.has_log("received during start-up: nothing is live yet"));
        assert!(!pod.has_log("listening on"), "it should not have started");
    }
}

/// Under `--on-sigterm ignore` a SIGTERM during start-up is ignored like any other: the
/// agent starts and serves.
#[test]
fn ignored_sigterm_during_start_up_lets_the_agent_start() {
    let (_dir, mut pod) = start_compiling_slowly("ignore");
    pod.signal(Signal::Term);
    pod.wait_for_log("listening on", Duration::from_secs(60));
    assert!(pod.has_log("SIGTERM received and ignored (--on-sigterm ignore)"));
    assert!(pod.is_running());
    pod.signal(Signal::Quit);
    assert_eq!(pod.wait_exit(WAIT).code, Some(0));
}

/// Runs the agent with `args` (the working directory `dir`) to its exit: status and output.
fn run_in(dir: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(agent_bin())
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// coraza-spoa's flags as Go's `flag` package takes them (one dash or two, `-flag value` or
/// `-flag=value`, `-switch=false`), on the real binary; mistakes name the flag and what is
/// valid, exit 64.
#[test]
fn coraza_spoa_flags_as_go_takes_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("config.yaml"),
        "applications:\n  - name: a\n    directives: |\n      Include @coraza.conf-recommended\n      SecRuleEngine On\n",
    )
    .expect("write");
    for args in [
        &["-config=config.yaml", "-validate"][..],
        &["-config", "config.yaml", "-validate"],
        &["--config=config.yaml", "--validate"],
        &["-validate=true", "-config", "config.yaml"],
    ] {
        let (code, out, err) = run_in(dir.path(), args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(
            out.contains("configuration OK: 1 application(s)"),
            "{args:?}: {out}"
        );
    }
    // -validate=false: not a validation (the bad bind is then a start-up error).
    let (code, _, err) = run_in(
        dir.path(),
        &[
            "-config=config.yaml",
            "-validate=false",
            "--bind",
            "nowhere",
        ],
    );
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--bind"), "{err}");

    // A flag Go does not know is refused in Go's words (clap alone read `-confg` as
    // `-c onfg`).
    let (code, _, err) = run_in(dir.path(), &["-confg", "config.yaml"]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("flag provided but not defined: -confg"),
        "{err}"
    );
    assert!(!err.contains("onfg:"), "{err}");

    let (code, out, _) = run_in(dir.path(), &["-version"]);
    assert_eq!(code, 0);
    assert!(out.contains(env!("CARGO_PKG_VERSION")), "{out}");

    // Mistakes: all of them at once, each naming its flag and what would be valid.
    let (code, out, err) = run_in(
        dir.path(),
        &["-autoreload", "-metrics-addr=:x", "--drain-timeout", "soon"],
    );
    assert_eq!(code, 64, "{out}{err}");
    assert!(
        err.contains("-metrics-addr (:x): not an address to listen on; expected IP:PORT, or :PORT"),
        "{err}"
    );
    assert!(
        err.contains("-autoreload: watches the configuration file, and none is given; expected -config FILE too"),
        "{err}"
    );
    assert!(err.contains("--drain-timeout (soon)"), "{err}");
    let (code, _, err) = run_in(
        dir.path(),
        &[
            "-config=config.yaml",
            "-metrics-addr",
            "127.0.0.1:9090",
            "--admin-addr",
            "127.0.0.1:9091",
        ],
    );
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("-metrics-addr (127.0.0.1:9090): is coraza-spoa's name for --admin-addr, which is set too; expected one of them"),
        "{err}"
    );
}

/// `-metrics-addr` is where the admin listener (and coraza-spoa's histogram) is; the
/// profiling flags are accepted with a warning; the environment's admin address (the
/// image's) gives way to the flag.
#[test]
fn metrics_addr_and_profiling_flags_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spop = format!("127.0.0.1:{}", lastcall_testkit::free_port());
    std::fs::write(
        dir.path().join("config.yaml"),
        format!("bind: {spop}\napplications:\n  - name: a\n    directives: SecRuleEngine On\n"),
    )
    .expect("write");
    let metrics: std::net::SocketAddr = format!("127.0.0.1:{}", lastcall_testkit::free_port())
        .parse()
        .expect("addr");
    let mut cmd = Command::new(agent_bin());
    cmd.current_dir(dir.path())
        .env("LASTCALL_ADMIN_ADDR", "127.0.0.1:1")
        .args([
            "-config=config.yaml",
            "-cpuprofile=cpu.out",
            "-memprofile",
            "mem.out",
        ])
        .arg(format!("-metrics-addr={metrics}"));
    let mut pod = lastcall_testkit::Pod::spawn(cmd);
    pod.wait_for_log("listening on", WAIT);
    assert!(pod.has_log("-cpuprofile (Go's profiler in coraza-spoa) is accepted and ignored"));
    assert!(pod.has_log("-memprofile (Go's profiler in coraza-spoa) is accepted and ignored"));
    let (status, body) = lastcall_testkit::http_get(metrics, "/metrics");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("coraza_handle_spoe_duration_seconds"),
        "{body}"
    );
    assert!(!dir.path().join("cpu.out").exists());
    pod.signal(Signal::Quit);
    assert_eq!(pod.wait_exit(WAIT).code, Some(0));
}

/// Start-up errors in the file name the key, the line and what is valid, all of them,
/// and the process exits 64 without binding anything: first the keys, then (once they
/// load) the rules, Coraza's `@` names included.
#[test]
fn start_up_errors_name_the_key_the_line_and_what_is_valid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spop = format!("127.0.0.1:{}", lastcall_testkit::free_port());
    let admin = format!("127.0.0.1:{}", lastcall_testkit::free_port());
    let keys = format!(
        "\
bind: {spop}
log_level: loud
applications:
  - name: a
    directives: SecRuleEngine On
    log_format: xml
    log_level: chatty
    response_check: yes please
"
    );
    std::fs::write(dir.path().join("c.yaml"), keys).expect("write");
    let (code, out, err) = run_in(dir.path(), &["-config=c.yaml", "--admin-addr", &admin]);
    assert_eq!(code, 64, "{out}{err}");
    for want in [
        "c.yaml:2: log_level `loud`: expected trace, debug, info, warn, error",
        "c.yaml:6: applications[0].log_format (xml): expected console, text, json or json-flat",
        "c.yaml:7: applications[0].log_level (chatty): expected trace, debug, info",
        "c.yaml:8: applications[0].response_check: invalid type: string \"yes please\"; expected a boolean",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    assert!(
        !out.contains("listening") && !err.contains("listening"),
        "{out}{err}"
    );

    let rules = format!(
        "\
bind: {spop}
applications:
  - name: a
    directives: |
      Include @coraza.conf-recommended
      Include @crs-setup.conf.example
      Include @owasp_crs/REQUEST-999-NO-SUCH-FILE.conf
      Include @owasp_crs_plugins/wordpress-rule-exclusions-before.conf
      Include @coraza.conf
    log_file: /nonexistent-dir/a.log
"
    );
    std::fs::write(dir.path().join("c.yaml"), rules).expect("write");
    let (code, out, err) = run_in(dir.path(), &["-config=c.yaml", "--admin-addr", &admin]);
    assert_eq!(code, 64, "{out}{err}");
    for want in [
        "c.yaml:7: applications[0].directives: application `a`: Include @owasp_crs/REQUEST-999-NO-SUCH-FILE.conf: REQUEST-999-NO-SUCH-FILE.conf is not in the CRS at",
        "c.yaml:8: applications[0].directives: application `a`: Include @owasp_crs_plugins/wordpress-rule-exclusions-before.conf: CRS plugins are not built in; expected",
        "c.yaml:9: applications[0].directives: application `a`: Include @coraza.conf: not a file Coraza's embedded set has; expected @coraza.conf-recommended",
        "c.yaml:10: applications[0].log_file: cannot open /nonexistent-dir/a.log",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    assert!(
        !out.contains("listening") && !err.contains("listening"),
        "{out}{err}"
    );
    // Nothing was bound: both ports are still free.
    std::net::TcpListener::bind(&spop).expect("the SPOP port was never bound");
    std::net::TcpListener::bind(&admin).expect("the admin port was never bound");
}

/// The rules of [`autoreload_follows_a_configmap_update`]: requests with `x=WORD` denied.
fn deny_word(bind: &str, word: &str) -> String {
    format!(
        "bind: {bind}\ndefault_application: a\napplications:\n  - name: a\n    directives: |\n      SecRuleEngine On\n      SecRule ARGS:x \"@streq {word}\" \"id:10001,phase:1,deny,status:403,log,msg:'{word}'\"\n"
    )
}

/// `-autoreload` with the file mounted as Kubernetes mounts a ConfigMap (`config.yaml` ->
/// `..data/config.yaml`, `..data` -> a timestamped directory): the kubelet's update (a new
/// directory, `..data` renamed over) reloads the rules as SIGHUP does, on the real process,
/// with HAProxy in front; a file that does not compile keeps the running rules.
#[test]
fn autoreload_follows_a_configmap_update() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let spop: std::net::SocketAddr = format!("127.0.0.1:{}", lastcall_testkit::free_port())
        .parse()
        .expect("addr");
    let admin: std::net::SocketAddr = format!("127.0.0.1:{}", lastcall_testkit::free_port())
        .parse()
        .expect("addr");
    let version = |name: &str, text: &str| {
        std::fs::create_dir(d.join(name)).expect("mkdir");
        std::fs::write(d.join(name).join("config.yaml"), text).expect("write");
    };
    let publish = |name: &str| {
        std::os::unix::fs::symlink(name, d.join("..data_tmp")).expect("symlink");
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).expect("rename");
    };
    version("..2026_12_01_v1", &deny_word(&spop.to_string(), "one"));
    publish("..2026_12_01_v1");
    std::os::unix::fs::symlink("..data/config.yaml", d.join("config.yaml")).expect("symlink");

    let mut cmd = Command::new(agent_bin());
    cmd.arg(format!("-config={}", d.join("config.yaml").display()))
        .arg("-autoreload")
        .arg(format!("--admin-addr={admin}"));
    let agent = lastcall_testkit::Pod::spawn(cmd);
    agent.wait_for_log("listening on", WAIT);
    let origin = crate::support::Origin::start();
    let haproxy = crate::support::Haproxy::start_variant(
        origin.addr,
        spop,
        spop,
        &crate::support::haproxy::Variant::default(),
    );
    let http = haproxy.addr;
    assert_eq!(get(http, "/?x=one").status, 403);
    assert_eq!(get(http, "/?x=two").status, 200);

    // The kubelet's update.
    let mark = agent.log_len();
    version("..2026_12_01_v2", &deny_word(&spop.to_string(), "two"));
    publish("..2026_12_01_v2");
    std::fs::remove_dir_all(d.join("..2026_12_01_v1")).expect("rm");
    agent.wait_for_log_after(mark, "changed: reloading (-autoreload)", WAIT);
    agent.wait_for_log_after(mark, "rules reloaded: 1 application(s)", WAIT);
    assert_eq!(get(http, "/?x=two").status, 403);
    assert_eq!(get(http, "/?x=one").status, 200);
    let metrics = || lastcall_testkit::http_get(admin, "/metrics").1;
    assert_eq!(
        crate::support::metric_value(&metrics(), "spoa_reloads_total{result=\"ok\"}"),
        1.0
    );

    // An update that does not compile: logged, counted, the running rules stay.
    let mark = agent.log_len();
    version(
        "..2026_12_01_v3",
        "applications:\n  - name: a\n    directives: SecRuleEngine Maybe\n",
    );
    publish("..2026_12_01_v3");
    agent.wait_for_log_after(mark, "reload failed, keeping the running rules", WAIT);
    assert_eq!(get(http, "/?x=two").status, 403);
    assert_eq!(
        crate::support::metric_value(&metrics(), "spoa_reloads_total{result=\"error\"}"),
        1.0
    );
    // The lifecycle counts the same reloads (an autoreload is a SIGHUP to it).
    assert_eq!(
        crate::support::metric_value(&metrics(), "lastcall_reloads_total"),
        2.0
    );
    drop(haproxy);
    // SIGQUIT exits at once and cuts what is still open (76): HAProxy's connections are
    // gone first (the agent sees their close a moment after HAProxy's exit).
    let end = std::time::Instant::now() + WAIT;
    while crate::support::metric_value(&metrics(), "lastcall_sessions") != 0.0 {
        assert!(
            std::time::Instant::now() < end,
            "HAProxy's connections stay open"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut agent = agent;
    agent.signal(Signal::Quit);
    assert_eq!(agent.wait_exit(WAIT).code, Some(0));
}

/// `check-haproxy` on the real binary: coraza-spoa's example files (one agent server, HAProxy's
/// default `fall 3`: fixes;
/// no retry, a 500ms processing timeout and the SPOE timeouts HAProxy 3.1+ ignores: notes)
/// and the documented files (nothing to fix), line by line; an unreadable file is 64.
#[test]
fn check_haproxy_reads_the_files_line_by_line() {
    let crate_dir = crate::support::crate_dir();
    let fixture = crate_dir.join("tests/fixtures/coraza-spoa");
    let (code, out, err) = run_in(&fixture, &["check-haproxy", "haproxy.cfg", "coraza.cfg"]);
    assert_eq!(code, 1, "{out}{err}");
    let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with(' ')).collect();
    assert_eq!(
        lines,
        [
            "haproxy.cfg:14: frontend `default` does not wait for request bodies: HAProxy sends the request message as soon as the headers are in, a body that comes after them (a browser's upload, `Expect: 100-continue`) cannot be inspected, and the agent answers such requests with the error variable (spoa_bodies_not_waited_total)",
            "haproxy.cfg:53: backend `coraza-spoa` has 1 agent server(s): while one restarts or drains, requests fail; two or more keep them flowing",
            "haproxy.cfg:56: `fall 3` (HAProxy's default): a draining agent leaves once it has refused 2 health checks in a row, and HAProxy marks it DOWN only after 3; what HAProxy sends it in between fails",
            "haproxy.cfg:56: a hung agent (a stopped process, a frozen node) keeps this server's connections after HAProxy marks it DOWN: the messages on them wait `timeout processing`; with this, HAProxy 2.6 and 3.0 close them at DOWN and the retry asks another agent (a draining agent has said goodbye on every connection and waits for its DOWN before it leaves)",
            "coraza.cfg:4: spoe-agent `coraza-agent` lets HAProxy 2.6 and 3.0 send up to 20 (the default) NOTIFYs on an agent connection before the first ACK: an agent's goodbye (a drain, a rebalancing) can cross one, which HAProxy fails (`st=256` in its log, then the retry), and a hung agent's connections hold that many messages each; with 1, HAProxy waits for each ACK and the goodbye rides on it (3.1 and later ignore the line)",
            "coraza.cfg:4: note: no retry: a request queued on an agent connection that closes under it (an agent cut at its deadline) fails instead of being asked again",
            "coraza.cfg:9: note: ignored by HAProxy 3.1 and later: there the agents' backend's `timeout connect` and `timeout server` apply (and `timeout server` closes idle agent connections)",
            "coraza.cfg:10: note: ignored by HAProxy 3.1 and later: there the agents' backend's `timeout connect` and `timeout server` apply (and `timeout server` closes idle agent connections)",
            "coraza.cfg:11: note: a verdict must come within this, queueing included: under load this turns slowness into errors (docs/spoa.md uses 5s)",
            "5 to fix, 4 note(s)",
        ],
        "{out}"
    );
    assert!(
        out.contains("    add: server spoa2 ADDRESS:PORT check inter 1s fall 2 rise 1\n"),
        "{out}"
    );
    // docs/spoa.md shows this output whole.
    let doc = std::fs::read_to_string(crate_dir.join("../../docs/spoa.md")).expect("docs");
    assert!(
        doc.contains(&format!(
            "$ lastcall-spoa check-haproxy haproxy.cfg coraza.cfg\n{out}```"
        )),
        "docs/spoa.md, *Checking HAProxy's files*, differs from:\n{out}"
    );

    let examples = crate_dir.join("examples/haproxy");
    let (code, out, err) = run_in(&examples, &["check-haproxy", "haproxy.cfg", "coraza.cfg"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.ends_with("fail-closed and lossless as docs/spoa.md recommends (2 note(s))\n"),
        "{out}"
    );

    let (code, _, err) = run_in(&examples, &["check-haproxy", "no-such.cfg"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("no-such.cfg"), "{err}");
}

/// `--version` and `/metrics` name the libmodsecurity the agent loaded: the release in its
/// file name as the running process mapped it (on 3.0.14 and 3.0.16 too, under
/// scripts/test_peers.sh's runner).
#[test]
fn engine_version_is_the_loaded_library() {
    let out = agent_command()
        .arg("--version")
        .output()
        .expect("run --version");
    assert!(out.status.success(), "{out:?}");
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let agent = Agent::start(None, &[]);
    let mapped = lastcall_testkit::peers::mapped_release(agent.pod.pid(), "libmodsecurity")
        .expect("libmodsecurity.so.X.Y.Z mapped by the agent");
    assert_eq!(
        line,
        format!(
            "lastcall-spoa {} (engine: ModSecurity {mapped})",
            env!("CARGO_PKG_VERSION")
        )
    );
    let gauge = format!("spoa_engine_info{{engine=\"ModSecurity\",version=\"{mapped}\"}}");
    assert_eq!(agent.metric(&gauge), 1.0, "{}", agent.metrics());
}

/// Rules written for CRS 4 (a CRS-4-only `setvar:tx.*`, coraza-spoa's `@owasp_crs` names)
/// against a CRS 3 tree are refused, at start and by `-validate` (exit 64, the file's line,
/// the fix and `--accept-crs3`), before a port is bound; with `--accept-crs3` (or
/// `LASTCALL_SPOA_ACCEPT_CRS3=true`) they run, each a warning, and the CRS 3 release is named
/// with the end of its support. Against a CRS 4 tree nothing of the kind is said: the tree
/// `LASTCALL_SPOA_CRS_DIR` names when it is a CRS 4 release a user unpacked, else a stand-in
/// (none can be fetched here). The CRS 3 tree is Debian's.
#[test]
fn crs_4_rules_against_a_crs_3_tree_are_refused_unless_accepted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spop = format!("127.0.0.1:{}", lastcall_testkit::free_port());
    let admin = format!("127.0.0.1:{}", lastcall_testkit::free_port());
    let config = format!("bind: {spop}\napplications:\n  - name: a\n    directives: |\n      Include @coraza.conf-recommended\n      Include @crs-setup.conf.example\n      SecAction \"id:900000,phase:1,pass,nolog,setvar:tx.blocking_paranoia_level=2\"\n      Include @owasp_crs/*.conf\n      SecRuleEngine On\n");
    std::fs::write(dir.path().join("config.yaml"), config).expect("write");
    // The CRS 4 half: the tree LASTCALL_SPOA_CRS_DIR names when it is a CRS 4 release, else a
    // stand-in (Debian's rules, signed as a CRS 4 release): nothing refused, nothing warned.
    let stand_in = tempfile::tempdir().expect("tempdir");
    let crs4 = std::env::var_os("LASTCALL_SPOA_CRS_DIR")
        .map(std::path::PathBuf::from)
        .filter(|d| lastcall_modsec::crs::Location::from_dir(d).is_ok_and(|l| l.major() == Some(4)))
        .unwrap_or_else(|| crs4_stand_in(stand_in.path()));
    let loc = lastcall_modsec::crs::Location::from_dir(&crs4).expect("a CRS tree");
    eprintln!("CRS {:?} at {}", loc.version(), crs4.display());
    let crs_dir = format!("--crs-dir={}", crs4.display());
    let (code, out, err) = run_in(dir.path(), &["-validate", "-config=config.yaml", &crs_dir]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("warning"), "{err}");

    // The CRS 3 half: Debian's (LASTCALL_SPOA_CRS_DIR left out).
    let run_in = |dir: &std::path::Path, args: &[&str]| {
        let out = Command::new(agent_bin())
            .current_dir(dir)
            .args(args)
            .env_remove("LASTCALL_SPOA_CRS_DIR")
            .output()
            .expect("run");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let refusals = [
        "config.yaml:5: applications[0].directives: application `a`: setvar:tx.blocking_paranoia_level is read by CRS 4 only",
        "its CRS 3 name is tx.paranoia_level",
        "config.yaml:5: applications[0].directives: application `a`: @owasp_crs/ and @crs-setup.conf.example are coraza-spoa's embedded CRS (4.25.0 in coraza-spoa 0.7.2)",
        "set crs_dir in the file (or --crs-dir",
        "or --accept-crs3 (LASTCALL_SPOA_ACCEPT_CRS3=true) to run CRS 3.",
    ];
    for args in [
        &["-validate", "-config=config.yaml"][..],
        &["-config=config.yaml", "--admin-addr", &admin],
    ] {
        let (code, out, err) = run_in(dir.path(), args);
        assert_eq!(code, 64, "{args:?}: {out}{err}");
        for want in refusals {
            assert!(err.contains(want), "{args:?}: missing {want:?} in:\n{err}");
        }
        assert!(!out.contains("configuration OK"), "{out}");
    }
    // Nothing was bound: both ports are still free.
    std::net::TcpListener::bind(&spop).expect("the SPOP port was never bound");
    std::net::TcpListener::bind(&admin).expect("the admin port was never bound");

    let ended = "ended support for CRS 3.3 in Q3 2026";
    let accepted = |args: &[&str], env: Option<&str>| {
        let mut cmd = Command::new(agent_bin());
        cmd.current_dir(dir.path())
            .args(args)
            .env_remove("LASTCALL_SPOA_CRS_DIR");
        if let Some(v) = env {
            cmd.env("LASTCALL_SPOA_ACCEPT_CRS3", v);
        }
        let out = cmd.output().expect("run");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (args, env) in [
        (
            &["-validate", "-config=config.yaml", "--accept-crs3"][..],
            None,
        ),
        (
            &["-validate", "-config=config.yaml", "-accept-crs3=true"],
            None,
        ),
        (&["-validate", "-config=config.yaml"], Some("true")),
    ] {
        let (code, out, err) = accepted(args, env);
        assert_eq!(code, 0, "{args:?} {env:?}: {out}{err}");
        assert!(out.contains("configuration OK"), "{out}");
        assert!(
            err.contains(&format!("lastcall-spoa: warning: {}", refusals[0])),
            "{err}"
        );
        assert!(err.contains(refusals[2]), "{err}");
        assert!(err.contains(ended), "{err}");
    }
    // `=false` is the default: refused.
    let (code, _, err) = accepted(&["-validate", "-config=config.yaml"], Some("false"));
    assert_eq!(code, 64, "{err}");

    // Without coraza-spoa's names and CRS 4 variables: only the release and its support.
    std::fs::write(
        dir.path().join("plain.yaml"),
        "applications:\n  - name: a\n    directives: SecRuleEngine On\n",
    )
    .expect("write");
    let (code, _, err) = run_in(dir.path(), &["-validate", "-config=plain.yaml"]);
    assert_eq!(code, 0, "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("the rules run CRS 3.") && warnings[0].contains(ended),
        "{err}"
    );
}

/// A stand-in for a CRS 4 release in `dir`: Debian's CRS 3 rules and setup file laid out as a
/// release, `REQUEST-901-INITIALIZATION.conf` signed `OWASP_CRS/4.99.0` (what
/// `Location::version` reads). It loads like the CRS it copies; only the release it names
/// differs.
fn crs4_stand_in(dir: &std::path::Path) -> std::path::PathBuf {
    let debian = lastcall_modsec::crs::Location::debian();
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).expect("mkdir");
    for entry in std::fs::read_dir(&debian.rules_dir).expect("Debian's CRS rules") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name").to_owned();
        let mut bytes = std::fs::read(&path).expect("read");
        if name == "REQUEST-901-INITIALIZATION.conf" {
            let text = String::from_utf8(bytes).expect("UTF-8");
            let signed: Vec<String> = text
                .lines()
                .map(|l| {
                    if l.trim_start().starts_with("SecComponentSignature") {
                        "SecComponentSignature \"OWASP_CRS/4.99.0\"".to_owned()
                    } else {
                        l.to_owned()
                    }
                })
                .collect();
            bytes = signed.join("\n").into_bytes();
        }
        std::fs::write(rules.join(name), bytes).expect("write");
    }
    std::fs::copy(&debian.setup, dir.join("crs-setup.conf.example")).expect("copy");
    dir.to_owned()
}
