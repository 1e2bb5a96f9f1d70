//! What the TURN tests share beyond `lastcall-testkit`: a `lastcall-turn` process started
//! the way docs/turn.md shows, and the subject of the certificate its TLS listener serves.

use std::process::Command;

use lastcall_testkit::{self as testkit, metrics, Pod};

pub(crate) use lastcall_testkit::coturn::{uclient, Peer, Report, Uclient};
pub(crate) use lastcall_testkit::tls::self_signed;
pub(crate) use lastcall_testkit::turn::{RestCredentials, REALM, SECRET};
pub(crate) use lastcall_testkit::{free_udp_tcp_port, WAIT};

/// A running `lastcall-turn`.
pub(crate) struct Turn {
    /// The process.
    pub pod: Pod,
    /// The UDP and TCP listening port.
    pub port: u16,
    /// The TLS listening port (0: none chosen by the test).
    pub tls_port: u16,
    /// The admin listener.
    pub admin: String,
}

/// The start-up command of docs/turn.md (*Running it*) on free ports.
pub(crate) fn turn_args(port: u16, admin: &str) -> Vec<String> {
    [
        "-n",
        "--listening-ip=127.0.0.1",
        &format!("--listening-port={port}"),
        "--relay-ip=127.0.0.1",
        "--realm=example.org",
        "--use-auth-secret",
        &format!("--static-auth-secret={SECRET}"),
        "--allow-loopback-peers",
        &format!("--admin-addr={admin}"),
    ]
    .iter()
    .map(ToString::to_string)
    .collect()
}

impl Turn {
    /// Starts with that command line and `extra` options; waits until it listens.
    pub(crate) fn start(extra: &[&str]) -> Turn {
        let port = free_udp_tcp_port();
        let admin = format!("127.0.0.1:{}", testkit::free_port());
        let mut args = turn_args(port, &admin);
        args.extend(extra.iter().map(ToString::to_string));
        Turn::spawn(args, port, 0, admin)
    }

    /// Starts with exactly `args` (the caller chose the ports).
    pub(crate) fn spawn(args: Vec<String>, port: u16, tls_port: u16, admin: String) -> Turn {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lastcall-turn"));
        cmd.args(&args);
        let pod = Pod::spawn(cmd);
        pod.wait_for_log("lastcall-turn listening", WAIT);
        Turn {
            pod,
            port,
            tls_port,
            admin,
        }
    }

    /// The value of one metric line (`name{labels}`), if present.
    pub(crate) fn metric(&self, series: &str) -> Option<f64> {
        metrics::metric(&self.admin, series)
    }

    /// Waits until `series` is at least `min`.
    pub(crate) fn wait_metric_at_least(&self, series: &str, min: f64) {
        metrics::wait_at_least(self.admin.as_str(), series, min, WAIT);
    }
}

/// The subject of the certificate a TLS server presents (openssl s_client).
pub(crate) fn served_subject(port: u16) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect 127.0.0.1:{port} </dev/null 2>/dev/null | openssl x509 -noout -subject"
        ))
        .output()
        .expect("run openssl s_client");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
