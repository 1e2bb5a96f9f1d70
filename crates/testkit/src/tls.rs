//! Self-signed certificates for the TLS listeners under test, made with the openssl CLI.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A self-signed P-256 certificate and key (PEM, `NAME-cert.pem` and `NAME-key.pem` in
/// `dir`) for CN `cn`, valid two days. For clients that do not verify it (coturn's uclient
/// with `-S`, browsers told to ignore certificate errors) or check only its subject.
pub fn self_signed(dir: &Path, name: &str, cn: &str) -> (PathBuf, PathBuf) {
    make(dir, name, cn, &[])
}

/// The same for a server at `ip`, which a verifying client (rustls) accepts once it trusts
/// the certificate: CN and subjectAltName `ip`, and not a CA (basicConstraints CA:FALSE).
pub fn self_signed_for_ip(dir: &Path, name: &str, ip: &str) -> (PathBuf, PathBuf) {
    let san = format!("subjectAltName=IP:{ip}");
    make(
        dir,
        name,
        ip,
        &[
            "-addext",
            &san,
            "-addext",
            "basicConstraints=critical,CA:FALSE",
        ],
    )
}

fn make(dir: &Path, name: &str, cn: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{name}-cert.pem"));
    let key = dir.join(format!("{name}-key.pem"));
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", &format!("/CN={cn}")])
        .args(extra)
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success(), "openssl req failed");
    (cert, key)
}
