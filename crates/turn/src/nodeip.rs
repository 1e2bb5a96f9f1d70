//! `lastcall-turn node-external-ip`: the chart's init container, as wire's coturn chart had
//! one. It reads the pod's Node from the Kubernetes API (`GET /api/v1/nodes/NAME` with the
//! pod's service account token: the least RBAC that allows it is `get` on `nodes`) and
//! writes the node's `ExternalIP` addresses to a file, which the daemon reads with
//! `external-ip-file`. A node without one falls back to its `wire.com/external-ip` annotation,
//! as wire's chart's init container does for on-premises nodes (whose operators set it). A
//! node with neither, a bad annotation, or an answer that is not a Node, is an error that says
//! what to fix: the pod does not start with wrong relay addresses.
//!
//! ```text
//! lastcall-turn node-external-ip --node NAME --out FILE [--api https://HOST:PORT]
//!     [--token-file PATH] [--ca-file PATH] [--address-type ExternalIP]
//! ```
//!
//! Defaults are the in-cluster ones: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`
//! and the service account's token and CA under `/var/run/secrets/kubernetes.io/serviceaccount/`.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The service account's files in a pod.
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The most of an answer read (a Node object is a few KB; its images list can be long).
const MAX_ANSWER: u64 = 4 << 20;
/// How long the API may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The node annotation wire's chart reads when a node has no ExternalIP (on premises).
pub const WIRE_EXTERNAL_IP_ANNOTATION: &str = "wire.com/external-ip";

/// What to look up, and where to write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The node's name (the downward API's `spec.nodeName`).
    pub node: String,
    /// The file to write.
    pub out: PathBuf,
    /// The API server's base URL (`https://host:port`).
    pub api: String,
    /// The bearer token's file.
    pub token_file: PathBuf,
    /// The API server's CA certificate (PEM).
    pub ca_file: PathBuf,
    /// The address type to take from `status.addresses`.
    pub address_type: String,
}

/// Why the lookup failed.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The API could not be reached or spoke no HTTP.
    #[error("the Kubernetes API at {api}: {why}")]
    Api {
        /// The base URL.
        api: String,
        /// What went wrong.
        why: String,
    },
    /// The API answered with an error status.
    #[error("GET {path}: HTTP {status}{hint}: {body}")]
    Status {
        /// The request path.
        path: String,
        /// The status code.
        status: u16,
        /// What it usually means.
        hint: &'static str,
        /// The answer's message (the API's `Status` object's), cut short.
        body: String,
    },
    /// The Node has no address of the type asked for (nor, for ExternalIP, the
    /// `wire.com/external-ip` annotation).
    #[error("node {node} has no {kind} in status.addresses (it has: {has}){annotation}; give the node's public address in turn.externalIPs instead, or none")]
    NoAddress {
        /// The node.
        node: String,
        /// The address type.
        kind: String,
        /// The addresses it has.
        has: String,
        /// ", and no wire.com/external-ip annotation" when it was looked for.
        annotation: &'static str,
    },
    /// The `wire.com/external-ip` annotation holds something that is not IP addresses.
    #[error("node {node}: annotation {WIRE_EXTERNAL_IP_ANNOTATION}={value:?} is not an IP address (or several, space- or comma-separated)")]
    BadAnnotation {
        /// The node.
        node: String,
        /// The annotation's value.
        value: String,
    },
    /// The answer is not a Node object.
    #[error("the answer is not a Node object: {0}")]
    NotANode(String),
}

impl Lookup {
    /// Reads the arguments after `node-external-ip`; the environment gives the in-cluster
    /// API address.
    pub fn from_args(args: &[String]) -> Result<Lookup, LookupError> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let api = match (
            env("KUBERNETES_SERVICE_HOST"),
            env("KUBERNETES_SERVICE_PORT"),
        ) {
            (Some(h), Some(p)) if h.contains(':') => format!("https://[{h}]:{p}"),
            (Some(h), Some(p)) => format!("https://{h}:{p}"),
            _ => String::new(),
        };
        let mut l = Lookup {
            node: String::new(),
            out: PathBuf::new(),
            api,
            token_file: PathBuf::from(SA_DIR).join("token"),
            ca_file: PathBuf::from(SA_DIR).join("ca.crt"),
            address_type: "ExternalIP".to_string(),
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (key, inline) = match a.split_once('=') {
                Some((k, v)) => (k, Some(v.to_string())),
                None => (a.as_str(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| it.next().cloned())
                    .ok_or_else(|| LookupError::Usage(format!("{key} needs a value")))
            };
            match key {
                "--node" => l.node = value()?,
                "--out" => l.out = PathBuf::from(value()?),
                "--api" => l.api = value()?,
                "--token-file" => l.token_file = PathBuf::from(value()?),
                "--ca-file" => l.ca_file = PathBuf::from(value()?),
                "--address-type" => l.address_type = value()?,
                other => {
                    return Err(LookupError::Usage(format!(
                        "unknown argument {other}; usage: lastcall-turn node-external-ip --node NAME --out FILE [--api URL] [--token-file PATH] [--ca-file PATH] [--address-type ExternalIP]"
                    )))
                }
            }
        }
        if l.node.is_empty() || l.out.as_os_str().is_empty() {
            return Err(LookupError::Usage(
                "--node NAME and --out FILE are required (the chart passes $(NODE_NAME))".into(),
            ));
        }
        if l.api.is_empty() {
            return Err(LookupError::Usage(
                "no --api and no KUBERNETES_SERVICE_HOST/PORT: not in a pod?".into(),
            ));
        }
        Ok(l)
    }

    /// Looks the node up and writes its addresses to [`Lookup::out`]; returns them, and
    /// where they were found.
    pub fn run(&self) -> Result<(Vec<IpAddr>, Origin), LookupError> {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|source| LookupError::File {
                path: path.clone(),
                source,
            })
        };
        let token = String::from_utf8_lossy(&read(&self.token_file)?)
            .trim()
            .to_string();
        let ca = read(&self.ca_file)?;
        let path = format!("/api/v1/nodes/{}", self.node);
        let body = get(&self.api, &path, &token, &ca)?;
        let (ips, origin) = addresses(&body, &self.node, &self.address_type)?;
        let text: Vec<String> = ips.iter().map(ToString::to_string).collect();
        std::fs::write(&self.out, format!("{}\n", text.join(" "))).map_err(|source| {
            LookupError::File {
                path: self.out.clone(),
                source,
            }
        })?;
        Ok((ips, origin))
    }
}

/// Where a node's addresses were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// In `status.addresses`, of the type asked for.
    Status,
    /// In the `wire.com/external-ip` annotation (no ExternalIP in `status.addresses`).
    Annotation,
}

/// The addresses of `kind` in a Node object's `status.addresses`; for `ExternalIP`, when
/// there is none, those of its `wire.com/external-ip` annotation (wire's chart's fallback).
pub fn addresses(
    body: &[u8],
    node: &str,
    kind: &str,
) -> Result<(Vec<IpAddr>, Origin), LookupError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| LookupError::NotANode(e.to_string()))?;
    if v.get("kind").and_then(|k| k.as_str()) != Some("Node") {
        return Err(LookupError::NotANode(format!(
            "kind {}",
            v.get("kind")
                .map_or("none".to_string(), ToString::to_string)
        )));
    }
    let all = v
        .pointer("/status/addresses")
        .and_then(|a| a.as_array())
        .cloned()
        .unwrap_or_default();
    let pair = |a: &serde_json::Value| {
        (
            a.get("type")
                .and_then(|t| t.as_str())
                .unwrap_or("")
                .to_string(),
            a.get("address")
                .and_then(|t| t.as_str())
                .unwrap_or("")
                .to_string(),
        )
    };
    let ips: Vec<IpAddr> = all
        .iter()
        .map(pair)
        .filter(|(t, _)| t == kind)
        .filter_map(|(_, a)| a.parse().ok())
        .collect();
    if !ips.is_empty() {
        return Ok((ips, Origin::Status));
    }
    let annotation = (kind == "ExternalIP")
        .then(|| {
            v.pointer("/metadata/annotations")
                .and_then(|a| a.get(WIRE_EXTERNAL_IP_ANNOTATION))
                .and_then(|a| a.as_str())
        })
        .flatten()
        .filter(|a| !a.trim().is_empty());
    if let Some(value) = annotation {
        let bad = || LookupError::BadAnnotation {
            node: node.to_string(),
            value: value.to_string(),
        };
        let ips = value
            .split([' ', ',', '\t', '\n'])
            .filter(|a| !a.is_empty())
            .map(|a| a.parse::<IpAddr>().map_err(|_| bad()))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok((ips, Origin::Annotation));
    }
    let has: Vec<String> = all
        .iter()
        .map(pair)
        .map(|(t, a)| format!("{t} {a}"))
        .collect();
    Err(LookupError::NoAddress {
        node: node.to_string(),
        kind: kind.to_string(),
        has: if has.is_empty() {
            "none".into()
        } else {
            has.join(", ")
        },
        annotation: if kind == "ExternalIP" {
            ", and no wire.com/external-ip annotation"
        } else {
            ""
        },
    })
}

/// `GET path` on the API over TLS (verified against `ca`), with the bearer token; the body
/// of a 200 answer.
fn get(api: &str, path: &str, token: &str, ca: &[u8]) -> Result<Vec<u8>, LookupError> {
    let fail = |why: String| LookupError::Api {
        api: api.to_string(),
        why,
    };
    let hostport = api
        .strip_prefix("https://")
        .ok_or_else(|| fail("only https:// is spoken".into()))?
        .trim_end_matches('/');
    let host = match hostport.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => hostport,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &ca[..]) {
        let cert = cert.map_err(|e| fail(format!("the CA file: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| fail(format!("the CA file: {e}")))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| fail(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| fail(format!("server name {host}: {e}")))?;
    let conn =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| fail(e.to_string()))?;
    let addr = hostport
        .to_socket_addrs()
        .map_err(|e| fail(e.to_string()))?
        .next()
        .ok_or_else(|| fail("no address".into()))?;
    let tcp = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| fail(e.to_string()))?;
    tcp.set_read_timeout(Some(TIMEOUT))
        .and_then(|()| tcp.set_write_timeout(Some(TIMEOUT)))
        .map_err(|e| fail(e.to_string()))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {hostport}\r\nAuthorization: Bearer {token}\r\nAccept: application/json\r\nUser-Agent: lastcall-turn\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes())
        .map_err(|e| fail(e.to_string()))?;
    let mut answer = Vec::new();
    // A peer that closes without close_notify ends the answer too (Connection: close).
    match tls.take(MAX_ANSWER).read_to_end(&mut answer) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
        Err(e) => return Err(fail(e.to_string())),
    }
    let (status, body) = parse_http(&answer).ok_or_else(|| fail("not an HTTP answer".into()))?;
    if status != 200 {
        let hint = match status {
            401 => " (the service account token was refused)",
            403 => {
                " (the service account may not get nodes: the chart's ClusterRole and its binding)"
            }
            404 => " (no such node: --node is the downward API's spec.nodeName)",
            _ => "",
        };
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| {
                v.get("message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(300).collect());
        return Err(LookupError::Status {
            path: path.to_string(),
            status,
            hint,
            body: message,
        });
    }
    Ok(body)
}

/// The status and body of an HTTP/1.1 answer (Content-Length, chunked, or to the close).
fn parse_http(answer: &[u8]) -> Option<(u16, Vec<u8>)> {
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(answer.get(..end)?).ok()?;
    let rest = answer.get(end + 4..)?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let mut chunked = false;
    let mut length = None;
    for l in lines {
        let (k, v) = l.split_once(':')?;
        match k.trim().to_ascii_lowercase().as_str() {
            "transfer-encoding" => chunked = v.trim().eq_ignore_ascii_case("chunked"),
            "content-length" => length = v.trim().parse::<usize>().ok(),
            _ => {}
        }
    }
    if !chunked {
        let body = match length {
            Some(n) => rest.get(..n)?,
            None => rest,
        };
        return Some((status, body.to_vec()));
    }
    let mut body = Vec::new();
    let mut at = rest;
    loop {
        let line_end = at.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(at.get(..line_end)?).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        at = at.get(line_end + 2..)?;
        if size == 0 {
            return Some((status, body));
        }
        body.extend_from_slice(at.get(..size)?);
        at = at.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_answers_by_length_chunks_or_close() {
        let by_len = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}extra";
        assert_eq!(parse_http(by_len), Some((200, b"{}".to_vec())));
        let chunked = b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_http(chunked), Some((403, b"abcde".to_vec())));
        assert_eq!(
            parse_http(b"HTTP/1.1 200 OK\r\n\r\nall"),
            Some((200, b"all".to_vec()))
        );
        assert_eq!(parse_http(b"garbage"), None);
    }

    #[test]
    fn arguments_and_the_in_cluster_defaults() {
        let args: Vec<String> = [
            "--node",
            "n1",
            "--out=/run/x",
            "--api",
            "https://127.0.0.1:6443",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        let l = Lookup::from_args(&args).unwrap();
        assert_eq!(
            (l.node.as_str(), l.api.as_str()),
            ("n1", "https://127.0.0.1:6443")
        );
        assert_eq!(l.token_file, PathBuf::from(SA_DIR).join("token"));
        assert_eq!(l.address_type, "ExternalIP");
        assert!(Lookup::from_args(&["--node".to_string()]).is_err());
        assert!(Lookup::from_args(&["--bogus".to_string()]).is_err());
    }
}
