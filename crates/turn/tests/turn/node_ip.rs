//! `lastcall-turn node-external-ip` (the chart's init container) against recorded API
//! answers: a small HTTPS server here, with its own CA, replays Node objects in the API's
//! JSON shape (`tests/data/kubernetes/`) and a 403 `Status`, checks the request (path, bearer
//! token), and the daemon then starts with the file the lookup wrote (`external-ip-file`) and
//! hands out the node's ExternalIP as its relay address. A node without one gives its
//! `wire.com/external-ip` annotation instead, as wire's chart's init container reads it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::common::{Turn, SECRET};
use lastcall_testkit::turn::TurnClient;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kubernetes");
const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.test-token";

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, and a server certificate it signed for IP 127.0.0.1 (as an API server's is for its
/// service IP).
fn pki(dir: &Path) -> (String, String, String) {
    let p = |f: &str| dir.join(f).display().to_string();
    let (ca, ca_key, crt, key, csr, ext) = (
        p("ca.crt"),
        p("ca.key"),
        p("api.crt"),
        p("api.key"),
        p("api.csr"),
        p("ext"),
    );
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=kubernetes-ca",
        "-keyout",
        &ca_key,
        "-out",
        &ca,
    ]);
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=kube-apiserver",
        "-keyout",
        &key,
        "-out",
        &csr,
    ]);
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &ext,
        "-out",
        &crt,
    ]);
    (ca, crt, key)
}

/// An HTTPS server answering `GET /api/v1/nodes/NAME` from `answers` (status, body); the
/// request heads it got.
struct ApiServer {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl ApiServer {
    fn start(crt: &str, key: &str, answers: HashMap<String, (u16, String)>) -> ApiServer {
        let certs: Vec<_> = rustls_pemfile::certs(&mut &std::fs::read(crt).expect("crt")[..])
            .collect::<Result<_, _>>()
            .expect("certs");
        let key = rustls_pemfile::private_key(&mut &std::fs::read(key).expect("key")[..])
            .expect("key")
            .expect("a key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config");
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&heads);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let conn = rustls::ServerConnection::new(Arc::clone(&config)).expect("conn");
                let mut tls = rustls::StreamOwned::new(conn, stream);
                let mut head = String::new();
                {
                    let mut reader = BufReader::new(&mut tls);
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                            break;
                        }
                        head.push_str(&line);
                    }
                }
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                let authorized = head.contains(&format!("Authorization: Bearer {TOKEN}\r\n"));
                seen.lock().push(head);
                let (status, body) = match (authorized, answers.get(&path)) {
                    (false, _) => (
                        401,
                        "{\"kind\":\"Status\",\"message\":\"Unauthorized\",\"code\":401}"
                            .to_string(),
                    ),
                    (true, Some(a)) => a.clone(),
                    (true, None) => (
                        404,
                        "{\"kind\":\"Status\",\"message\":\"nodes not found\",\"code\":404}"
                            .to_string(),
                    ),
                };
                // Chunked, as the API server sends large objects.
                let _ = write!(
                    tls,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                    body.len()
                );
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        ApiServer { addr, heads }
    }
}

fn lookup(api: &ApiServer, dir: &Path, ca: &str, node: &str) -> (Option<i32>, String, String) {
    let token = dir.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
    let out = dir.join(format!("{node}.external-ip"));
    let run = Command::new(env!("CARGO_BIN_EXE_lastcall-turn"))
        .args(["node-external-ip", "--node", node])
        .arg(format!("--out={}", out.display()))
        .args(["--api", &format!("https://127.0.0.1:{}", api.addr.port())])
        .arg(format!("--token-file={}", token.display()))
        .args(["--ca-file", ca])
        .output()
        .expect("run");
    let written = std::fs::read_to_string(&out).unwrap_or_default();
    (
        run.status.code(),
        written,
        String::from_utf8_lossy(&run.stderr).to_string(),
    )
}

#[test]
fn the_nodes_external_ip_from_recorded_api_answers_becomes_the_relay_address() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, crt, key) = pki(dir.path());
    let body = |f: &str| std::fs::read_to_string(Path::new(DATA).join(f)).expect("fixture");
    let answers = HashMap::from([
        (
            "/api/v1/nodes/pool-a-7f3c9".to_string(),
            (200, body("node-external-ip.json")),
        ),
        (
            "/api/v1/nodes/onprem-3".to_string(),
            (200, body("node-internal-only.json")),
        ),
        (
            "/api/v1/nodes/locked".to_string(),
            (403, body("status-forbidden.json")),
        ),
        (
            "/api/v1/nodes/onprem-4".to_string(),
            (200, body("node-wire-annotation.json")),
        ),
        (
            "/api/v1/nodes/onprem-5".to_string(),
            (200, body("node-wire-annotation-bad.json")),
        ),
    ]);
    let api = ApiServer::start(&crt, &key, answers);

    let (code, written, err) = lookup(&api, dir.path(), &ca, "pool-a-7f3c9");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(written, "203.0.113.57 2001:db8:20::57\n");
    let head = api.heads.lock()[0].clone();
    assert!(
        head.starts_with("GET /api/v1/nodes/pool-a-7f3c9 HTTP/1.1\r\n"),
        "{head}"
    );

    // No ExternalIP, but the node annotation wire's chart falls back to (on premises).
    let (code, written, err) = lookup(&api, dir.path(), &ca, "onprem-4");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(written, "198.51.100.44\n");

    // A node without an ExternalIP or the annotation, an annotation that is no address, RBAC
    // missing, a node that does not exist: the init container fails with what to fix, and
    // writes nothing.
    for (node, needle) in [
        ("onprem-3", "node onprem-3 has no ExternalIP in status.addresses (it has: InternalIP 192.168.10.23, Hostname onprem-3), and no wire.com/external-ip annotation"),
        ("onprem-5", "node onprem-5: annotation wire.com/external-ip=\"node-5.example.net\" is not an IP address"),
        ("locked", "HTTP 403 (the service account may not get nodes: the chart's ClusterRole and its binding): nodes \"pool-a-7f3c9\" is forbidden"),
        ("gone", "HTTP 404 (no such node"),
    ] {
        let (code, written, err) = lookup(&api, dir.path(), &ca, node);
        assert_eq!(code, Some(1), "{node}: {err}");
        assert!(err.contains(needle), "{node}: {err}");
        assert!(written.is_empty(), "{node}: {written}");
    }
    // Another CA: the API's certificate is refused.
    let other = tempfile::tempdir().expect("tempdir");
    let (other_ca, _, _) = pki(other.path());
    let (code, _, err) = lookup(&api, dir.path(), &other_ca, "pool-a-7f3c9");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("the Kubernetes API at https://127.0.0.1:"),
        "{err}"
    );

    // The daemon reads the file: an Allocate's relay address is the node's ExternalIP.
    let file = dir.path().join("pool-a-7f3c9.external-ip");
    let turn = Turn::start(&[&format!("--external-ip-file={}", file.display())]);
    let mut c = TurnClient::new(SocketAddr::from(([127, 0, 0, 1], turn.port)), SECRET, "n");
    let relayed = c.allocate(600).expect("allocate");
    assert_eq!(relayed.ip(), std::net::IpAddr::from([203, 0, 113, 57]));
    c.refresh(0).expect("delete");
}
