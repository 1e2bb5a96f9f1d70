//! Request bodies however HAProxy hands them over (docs/spoa.md, *Request bodies*): no byte
//! of a body the agent did not see reaches the origin (unless `process_partial`), and no
//! benign body is refused for arriving late where HAProxy waits for it.
//!
//! Clients send as browsers do: the headers, then the body a moment later (the delay is the
//! input, not a wait). The origin records every request it began to read, so "never reached
//! the origin" is checked where it matters.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{crate_dir, Agent, Haproxy, Origin, Stack, StackOptions, WAIT};

const BOUNDARY: &str = "----WebKitFormBoundary7MA4YWxkTrZu0gW";

/// A browser's upload: a text field and a small text file, about 1.2 KB.
fn multipart(n: usize) -> Vec<u8> {
    let file: String = (0..24)
        .map(|i| format!("line {i} of the notes for upload {n}, nothing to see here\n"))
        .collect();
    format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\nHoliday notes {n}\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"notes.txt\"\r\n\
         Content-Type: text/plain\r\n\r\n{file}\r\n--{BOUNDARY}--\r\n"
    )
    .into_bytes()
}

/// A form body of `size` bytes, `payload` in its last field.
fn form_ending_with(size: usize, payload: &str) -> Vec<u8> {
    let filler = "a".repeat(size.saturating_sub(payload.len() + 16));
    format!("filler={filler}&text={payload}").into_bytes()
}

/// How the body goes on the wire.
#[derive(Clone, Copy)]
enum Framing {
    Length,
    /// Chunks of this many bytes.
    Chunked(usize),
}

/// Sends `POST target` with `headers`, then after `delay` the body, framed as `framing`;
/// returns the status (0 if the connection ended without an answer).
fn send(
    addr: SocketAddr,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    framing: Framing,
    delay: Duration,
) -> u16 {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut head = format!(
        "POST {target} HTTP/1.1\r\nHost: test.example\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) lastcall-test\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    match framing {
        Framing::Length => head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len())),
        Framing::Chunked(_) => head.push_str("Transfer-Encoding: chunked\r\n\r\n"),
    }
    s.write_all(head.as_bytes()).expect("headers");
    std::thread::sleep(delay);
    // HAProxy may answer and close before the body is all written: the answer is the result.
    let _ = match framing {
        Framing::Length => s.write_all(body),
        Framing::Chunked(size) => body
            .chunks(size)
            .try_for_each(|c| {
                s.write_all(format!("{:x}\r\n", c.len()).as_bytes())?;
                s.write_all(c)?;
                s.write_all(b"\r\n")
            })
            .and_then(|()| s.write_all(b"0\r\n\r\n")),
    };
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let head = String::from_utf8_lossy(&raw[..raw.len().min(64)]).into_owned();
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn fixture(name: &str) -> PathBuf {
    crate_dir().join("tests/fixtures/coraza-spoa").join(name)
}

/// coraza-spoa's example HAProxy file (our text of it), with `extra` lines added after the
/// frontend's `mode http`.
fn coraza_spoa_file(dir: &Path, extra: &str) -> PathBuf {
    let text = std::fs::read_to_string(fixture("haproxy.cfg")).expect("haproxy.cfg");
    let marker = "frontend default\n    mode http\n";
    assert!(text.contains(marker));
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, text.replacen(marker, &format!("{marker}{extra}"), 1)).expect("write");
    path
}

const AGENT_CONFIG: &str = "\
default_application: default
applications:
  - name: default
";

struct Setup {
    haproxy: Haproxy,
    agent: Agent,
    origin: Origin,
    _dir: tempfile::TempDir,
}

fn start_coraza_spoa(extra: &str) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = coraza_spoa_file(dir.path(), extra);
    let origin = Origin::start();
    let agent = Agent::start(Some(AGENT_CONFIG), &[]);
    let haproxy = Haproxy::start_files(
        tempfile::tempdir().expect("tempdir"),
        &config,
        &fixture("coraza.cfg"),
        origin.addr,
        agent.addr,
        agent.addr,
    );
    Setup {
        haproxy,
        agent,
        origin,
        _dir: dir,
    }
}

const MULTIPART: &str = "multipart/form-data; boundary=----WebKitFormBoundary7MA4YWxkTrZu0gW";
const FORM: &str = "application/x-www-form-urlencoded";
const LATE: Duration = Duration::from_millis(150);

/// 20 uploads sent as browsers send them, and a chunked 100 KB body with an SQL injection at
/// its end; returns the uploads' statuses.
fn uploads_and_a_chunked_attack(s: &Setup) -> (Vec<u16>, u16) {
    let statuses: Vec<u16> = (0..20)
        .map(|n| {
            send(
                s.haproxy.addr,
                &format!("/upload/{n}/"),
                &[("Content-Type", MULTIPART)],
                &multipart(n),
                Framing::Length,
                LATE,
            )
        })
        .collect();
    let attack = form_ending_with(100 * 1024, "1' UNION SELECT password FROM users-- ");
    let chunked = send(
        s.haproxy.addr,
        "/chunked-attack",
        &[("Content-Type", FORM)],
        &attack,
        Framing::Chunked(8192),
        Duration::ZERO,
    );
    (statuses, chunked)
}

/// coraza-spoa's file as it ships (no `option http-buffer-request`): HAProxy sends the
/// message before the upload's body arrives. Nothing passes unseen: each upload is refused
/// (the error variable, HAProxy's 500), warned about once with the line to add, counted; the
/// chunked attack never reaches the origin. (Both guarantees at once are impossible with this
/// file: HAProxy never gives the agent the body; `check-haproxy` names the line.)
#[test]
fn coraza_spoa_file_as_it_ships_lets_nothing_pass_unseen() {
    let s = start_coraza_spoa("");
    let (statuses, chunked) = uploads_and_a_chunked_attack(&s);
    eprintln!(
        "HAProxy {}: uploads {statuses:?}, chunked attack {chunked}",
        crate::support::haproxy::version()
    );
    for (n, status) in statuses.iter().enumerate() {
        let seen = s.origin.seen(&format!("/upload/{n}/"));
        match status {
            // The body came with the headers (HAProxy read both at once): inspected whole.
            200 => assert_eq!(seen.len(), 1, "upload {n}"),
            500 => assert!(seen.is_empty(), "upload {n} reached the origin: {seen:?}"),
            other => panic!("upload {n}: {other}"),
        }
    }
    assert!(
        s.origin.seen("/chunked-attack").is_empty(),
        "the chunked attack reached the origin (status {chunked})"
    );
    assert_ne!(chunked, 200);
    let refused = statuses.iter().filter(|&&c| c == 500).count() as f64;
    assert!(
        refused > 0.0,
        "no upload came late: the test proves nothing"
    );
    let counted = s
        .agent
        .metric("spoa_bodies_not_waited_total{policy=\"reject\"}");
    assert!(counted >= refused, "{counted} counted, {refused} refused");
    let warning = "add `option http-buffer-request` to the frontend";
    s.agent.pod.wait_for_log(warning, WAIT);
    assert_eq!(
        s.agent
            .pod
            .logs()
            .iter()
            .filter(|l| l.contains(warning))
            .count(),
        1,
        "the warning is rate-limited"
    );
}

/// The same file with the one line `check-haproxy` asks for: 20 of 20 uploads pass, each
/// whole at the origin; the chunked attack (over HAProxy's buffer) is refused and never
/// reaches the origin.
#[test]
fn coraza_spoa_file_with_http_buffer_request_passes_every_upload() {
    let s = start_coraza_spoa("    option http-buffer-request\n");
    let (statuses, chunked) = uploads_and_a_chunked_attack(&s);
    assert_eq!(statuses, vec![200; 20]);
    for n in 0..20 {
        let seen = s.origin.seen(&format!("/upload/{n}/"));
        assert_eq!(
            seen.iter().map(|s| s.body).collect::<Vec<_>>(),
            [Some(multipart(n).len())],
            "upload {n}"
        );
    }
    assert_eq!(
        chunked, 403,
        "coraza-spoa's file answers every deny with 403"
    );
    assert!(s.origin.seen("/chunked-attack").is_empty());
    assert_eq!(
        s.agent
            .metric("spoa_bodies_not_waited_total{policy=\"reject\"}"),
        0.0
    );
}

const SQLI: &str = "1' UNION SELECT password FROM users-- ";

/// A body of about `size` bytes of `kind` whose last field is `last`, and its content type.
fn body_of(kind: &str, size: usize, last: &str) -> (Vec<u8>, String) {
    let filler = |room: usize| "a".repeat(size.saturating_sub(room + last.len()));
    match kind {
        "form" => (
            format!("filler={}&text={last}", filler(16)).into_bytes(),
            FORM.into(),
        ),
        "multipart" => (
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.txt\"\r\n\
                 Content-Type: text/plain\r\n\r\n{}\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; \
                 name=\"comment\"\r\n\r\n{last}\r\n--{BOUNDARY}--\r\n",
                filler(300)
            )
            .into_bytes(),
            MULTIPART.into(),
        ),
        "json" => (
            format!(
                "{{\"filler\":\"{}\",\"comment\":\"{}\"}}",
                filler(32),
                last.replace('"', "\\\"")
            )
            .into_bytes(),
            "application/json".into(),
        ),
        "xml" => (
            format!(
                "<?xml version=\"1.0\"?><doc><filler>{}</filler><comment>{last}</comment></doc>",
                filler(80)
            )
            .into_bytes(),
            "application/xml".into(),
        ),
        other => panic!("{other}"),
    }
}

/// The documented configuration (`tune.bufsize 1114112`, `option http-buffer-request`):
/// 100 KB and 1 MiB bodies, form, multipart, JSON and XML, by `Content-Length` and chunked,
/// pass whole when benign, and are denied (403) with an SQL injection at their very end,
/// which then never reaches the origin.
#[test]
fn large_bodies_are_inspected_whole_with_the_documented_configuration() {
    let stack = Stack::start(StackOptions {
        agents: 1,
        slow_bodies: true,
        ..StackOptions::default()
    });
    let addr = stack.http();
    let mut n = 0;
    let mut rows = Vec::new();
    for size in [100 * 1024, 1024 * 1024] {
        for kind in ["form", "multipart", "json", "xml"] {
            for framing in [Framing::Length, Framing::Chunked(64 * 1024)] {
                for (last, want) in [("thanks for the lovely stay", 200), (SQLI, 403)] {
                    n += 1;
                    let target = format!("/big/{n}/");
                    let (body, ctype) = body_of(kind, size, last);
                    let started = std::time::Instant::now();
                    let status = send(
                        addr,
                        &target,
                        &[("Content-Type", &ctype)],
                        &body,
                        framing,
                        Duration::ZERO,
                    );
                    let framed = match framing {
                        Framing::Length => "length",
                        Framing::Chunked(_) => "chunked",
                    };
                    rows.push(format!(
                        "{size} {kind} {framed} {}: {status} in {:?}",
                        if want == 200 { "benign" } else { "attack" },
                        started.elapsed()
                    ));
                    let seen = stack.origin.seen(&target);
                    assert_eq!(status, want, "{kind} {size} {framed} ({last}): {rows:#?}");
                    if want == 200 {
                        let got: Vec<_> = seen.iter().map(|s| s.body).collect();
                        assert_eq!(got, [Some(body.len())], "{kind} {size} {framed}");
                    } else {
                        assert!(seen.is_empty(), "{kind} {size} {framed}: {seen:?}");
                    }
                }
            }
        }
    }
    eprintln!(
        "{}\n{}",
        crate::support::haproxy::version(),
        rows.join("\n")
    );
    let agent = &stack.agents[0];
    assert_eq!(
        agent.metric("spoa_truncated_bodies_total{policy=\"reject\"}"),
        0.0
    );
    assert_eq!(
        agent.metric("spoa_bodies_not_waited_total{policy=\"reject\"}"),
        0.0
    );
}

/// HTTP/2 clients (h2c, `curl --http2-prior-knowledge`) through the documented files with an
/// h2 listener added: a benign 100 KB body passes, an attack gets 403, a body over HAProxy's
/// buffer gets 413 on HAProxy 3.1 and later. HAProxy 2.6 and 3.0 answer a request refused
/// while its body is still coming (past the client's 64 KB HTTP/2 window) with RST_STREAM
/// CANCEL and no response (curl exit 92), whatever the agent says: there the test asserts
/// that, and that the body never reached the origin.
#[test]
fn http2_clients_get_responses_not_resets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text =
        std::fs::read_to_string(crate::support::haproxy::config_path()).expect("haproxy.cfg");
    let h2: SocketAddr = format!("127.0.0.1:{}", lastcall_testkit::free_port())
        .parse()
        .expect("addr");
    let bind = "    bind \"${FRONTEND_ADDR}\"\n";
    assert!(text.contains(bind));
    let config = dir.path().join("haproxy.cfg");
    std::fs::write(
        &config,
        text.replacen(bind, &format!("{bind}    bind {h2} proto h2\n"), 1),
    )
    .expect("write");
    let origin = Origin::start();
    let agent = Agent::start(None, &[]);
    let _haproxy = Haproxy::start_files(
        dir,
        &config,
        &crate::support::haproxy::spoe_path(),
        origin.addr,
        agent.addr,
        agent.addr,
    );
    let curl = |target: &str, body: &[u8]| -> (String, String) {
        let file = tempfile::NamedTempFile::new().expect("temp");
        std::fs::write(file.path(), body).expect("write body");
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{http_version}",
            ])
            .args(["--http2-prior-knowledge", "--max-time", "60"])
            .args(["-H", &format!("Content-Type: {FORM}")])
            .arg("--data-binary")
            .arg(format!("@{}", file.path().display()))
            .arg(format!("http://{h2}{target}"))
            .output()
            .expect("run curl");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            format!("curl exit {}", out.status.code().unwrap_or(-1)),
        )
    };
    let ok = "curl exit 0".to_owned();
    let benign = form_ending_with(100 * 1024, "thanks");
    assert_eq!(curl("/h2/benign/", &benign), ("200 2".into(), ok.clone()));
    assert_eq!(
        origin
            .seen("/h2/benign/")
            .iter()
            .map(|s| s.body)
            .collect::<Vec<_>>(),
        [Some(benign.len())]
    );
    let attack = form_ending_with(100 * 1024, SQLI);
    assert_eq!(curl("/h2/attack/", &attack), ("403 2".into(), ok.clone()));
    let over = form_ending_with(2 * 1024 * 1024, "thanks");
    let version = crate::support::haproxy::version();
    let old = ["version 2.", "version 3.0."]
        .iter()
        .any(|v| version.contains(v));
    let got = curl("/h2/over/", &over);
    let answered = ("413 2".to_owned(), ok);
    if old {
        // HAProxy 2.6/3.0 reset an upload refused while it is still being sent (RST_STREAM,
        // curl exit 92); one that curl finished sending first gets the 413: which one
        // depends on timing. Either way the body never reaches the origin (below).
        let reset = ("000 0".to_owned(), "curl exit 92".to_owned());
        assert!(got == reset || got == answered, "{version}: {got:?}");
    } else {
        assert_eq!(got, answered, "{version}");
    }
    assert!(origin.seen("/h2/attack/").is_empty());
    assert!(origin.seen("/h2/over/").is_empty());
}

/// A request with both `Content-Length` and `Transfer-Encoding: chunked` (CRS test 920181-1,
/// the shape of request smuggling) through the documented files. HAProxy 2.6 drops the
/// `Content-Length` but counts it in `body_size`: the agent refuses it as a bad request (400,
/// as nginx answers it) with a log line that says why, never a 500 with the hint to add
/// `option http-buffer-request` (which the file has). HAProxy 3.0 and later forward it
/// chunked without the `Content-Length` (RFC 9112 6.3): an ordinary chunked body, inspected.
#[test]
fn content_length_with_chunked_is_a_bad_request() {
    let stack = Stack::start(StackOptions {
        agents: 1,
        ..StackOptions::default()
    });
    let mut s = TcpStream::connect_timeout(&stack.http(), Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    s.write_all(
        b"POST /smuggle HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\nContent-Length: 7\r\n\
          Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\
          User-Agent: lastcall-test\r\nConnection: close\r\n\r\n7\r\nfoo=bar\r\n3\r\n&a=\r\n0\r\n\r\n",
    )
    .expect("send");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    let version = crate::support::haproxy::version();
    eprintln!("{version}: {}", text.lines().next().unwrap_or(""));
    let agent = &stack.agents[0];
    if version.contains("version 2.") {
        assert!(text.starts_with("HTTP/1.1 400"), "{text}");
        assert!(stack.origin.seen("/smuggle").is_empty());
        agent.pod.wait_for_log(
            "the request had both Content-Length and Transfer-Encoding: chunked",
            WAIT,
        );
    } else {
        assert!(text.starts_with("HTTP/1.1 200"), "{version}: {text}");
        let seen = stack.origin.seen("/smuggle");
        assert_eq!(seen.iter().map(|s| s.body).collect::<Vec<_>>(), [Some(10)]);
    }
    assert!(!agent
        .pod
        .logs()
        .iter()
        .any(|l| l.contains("add `option http-buffer-request`")));
}

/// What the chart renders for the agent container with `values` (JSON): its `config.yaml`
/// and its arguments (tests/charts/render_agent.py, Helm embedded in helm-python-sdk).
fn chart_agent(values: &str) -> (String, Vec<String>) {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = crate_dir().join("../../tests/charts/render_agent.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .arg(values)
        .output()
        .expect("run tests/charts/render_agent.py");
    assert!(
        out.status.success(),
        "rendering the chart failed (bash scripts/test_python.sh --setup installs helm-python-sdk): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let config = v["config"].as_str().expect("config").to_owned();
    let args = v["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg").to_owned())
        .collect();
    (config, args)
}

/// The bodies suite: what a user's clients send, benign and with an SQL injection, by
/// `Content-Length` and chunked; each request's path names it.
fn bodies_suite(addr: SocketAddr) -> Vec<(String, u16)> {
    let json = "application/json";
    let cases: Vec<(&str, Vec<u8>, &str, Framing)> = vec![
        (
            "json-benign",
            br#"{"id":"42","note":"hello"}"#.to_vec(),
            json,
            Framing::Length,
        ),
        (
            "json-sqli",
            br#"{"id":"1' OR '1'='1"}"#.to_vec(),
            json,
            Framing::Length,
        ),
        (
            "form-200k-benign",
            form_ending_with(200 * 1024, "thanks"),
            FORM,
            Framing::Length,
        ),
        (
            "form-200k-sqli-at-end",
            form_ending_with(200 * 1024, SQLI),
            FORM,
            Framing::Length,
        ),
        ("multipart-benign", multipart(1), MULTIPART, Framing::Length),
        (
            "multipart-sqli",
            body_of("multipart", 4096, SQLI).0,
            MULTIPART,
            Framing::Length,
        ),
        (
            "chunked-100k-benign",
            form_ending_with(100 * 1024, "thanks"),
            FORM,
            Framing::Chunked(8192),
        ),
        (
            "chunked-100k-sqli",
            form_ending_with(100 * 1024, SQLI),
            FORM,
            Framing::Chunked(8192),
        ),
    ];
    cases
        .into_iter()
        .map(|(name, body, ctype, framing)| {
            let status = send(
                addr,
                &format!("/suite/{name}"),
                &[("Content-Type", ctype)],
                &body,
                framing,
                Duration::ZERO,
            );
            (name.to_owned(), status)
        })
        .collect()
}

/// Issue 28, item 1: the chart's default configuration, and one with a user `directives`
/// block (coraza-spoa's), run as rendered (its file and its arguments, less the paths and
/// ports of the pod) behind the documented HAProxy: every body of the suite is refused or
/// passed exactly as the binary's built-in default does it, and every attack is refused.
#[test]
fn the_chart_runs_the_built_in_rules() {
    let user = r#"{"agent": {"config": {"default_application": "default", "applications": [{"name": "default", "directives": "Include @coraza.conf-recommended\nInclude @crs-setup.conf.example\nInclude @owasp_crs/*.conf\nSecRuleEngine On\n"}]}}}"#;
    let run = |config: Option<String>, args: Vec<String>| {
        let stack = Stack::start(StackOptions {
            agent_config: config,
            agent_args: args,
            agents: 1,
            ..StackOptions::default()
        });
        let rows = bodies_suite(stack.http());
        for (name, status) in &rows {
            if *status != 200 {
                assert!(
                    stack.origin.seen(&format!("/suite/{name}")).is_empty(),
                    "{name}"
                );
            }
        }
        rows
    };
    let builtin = run(None, Vec::new());
    eprintln!(
        "{}: built-in {builtin:?}",
        crate::support::haproxy::version()
    );
    for (name, want) in &builtin {
        let attack = name.contains("sqli");
        assert_eq!(*want, if attack { 403 } else { 200 }, "built-in: {name}");
    }
    for (label, values) in [("chart defaults", "{}"), ("chart with directives", user)] {
        let (config, args) = chart_agent(values);
        // The pod's paths and ports are the test's (Agent::start gives --config, --bind and
        // --admin-addr); every other argument is the chart's.
        let mut args: Vec<String> = args
            .into_iter()
            .filter(|a| !a.starts_with("--config=") && !a.starts_with("--admin-addr="))
            .collect();
        assert!(args.iter().any(|a| a == "--on-sigterm=drain"), "{args:?}");
        // The user's `@owasp_crs/` names coraza-spoa's CRS 4; this machine's Debian 3.3
        // stands in for it (the chart's image runs CRS 4).
        args.push("--accept-crs3".into());
        let got = run(Some(config), args);
        assert_eq!(got, builtin, "{label}");
    }
}
