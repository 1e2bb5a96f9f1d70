//! Ports below 1024 without root: CAP_NET_BIND_SERVICE, raised by the daemon itself from its
//! permitted set when a configured port needs it, and dropped when none does.
//!
//! The image's `lastcall-turn` carries the file capability `cap_net_bind_service=p`
//! (permitted, without the effective bit). On exec the kernel then puts the capability in
//! the process's permitted set if the container's bounding set holds it (Kubernetes:
//! `capabilities.add: [NET_BIND_SERVICE]`, which the chart adds only for a port below 1024),
//! also as a non-root user and under `no_new_privs` (`allowPrivilegeEscalation: false`) as
//! long as the runtime had it in the permitted set before the exec, as runc does for an added
//! capability. Without the effective bit the binary is "capability-aware": with the bounding
//! set lacking the capability (`drop: [ALL]`, the chart's default) it starts with none, where
//! `=ep` would make every exec fail with EPERM (the kernel refuses to run a binary whose
//! forced capabilities it cannot grant).
//!
//! So the process holds the capability in its permitted set only, and [`apply`], called
//! before any thread is started (capabilities are per thread; threads inherit them), moves it
//! to the effective set when a port it binds is below `net.ipv4.ip_unprivileged_port_start`,
//! and otherwise drops it from both: a relay on 3478 holds no capability at all. A daemon
//! given the capability some other way (root, systemd's `AmbientCapabilities=`, as Debian's
//! coturn.service does) is left as it is when it needs it.
//!
//! A port below the boundary with the capability in neither set cannot be bound: start-up
//! says so before binding anything, naming each option and port, the chart value that sets
//! it and what gives the capability (chart, `docker run --cap-add`, a unit's
//! `AmbientCapabilities=`), and exits 71 (`OS_ERROR`, the status the refused bind would
//! give: the same file is valid where the capability is given, so `--validate` warns and
//! exits 0). When the boundary cannot be read (no /proc), 1024 is assumed for raising, and a
//! missing capability is only a warning: the bind decides.

use std::fmt;

use rustix::thread::{capabilities, set_capabilities, CapabilitySet, CapabilitySets};

use crate::config::Settings;

/// Where the kernel keeps its boundary (Linux 4.11 and later; 1024 before). It is per
/// network namespace: Docker sets it to 0 in a container's own namespace (Docker 20.10 and
/// later), Kubernetes leaves the kernel's 1024 unless the pod sets the sysctl.
const UNPRIVILEGED_PORT_START: &str = "/proc/sys/net/ipv4/ip_unprivileged_port_start";

/// The boundary when it cannot be read (the kernel's default, and the only one before 4.11).
pub const DEFAULT_PORT_START: u16 = 1024;

/// A port this process binds below the unprivileged boundary, with the option that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LowPort {
    /// coturn's option (or ours) that names the port.
    pub option: &'static str,
    /// The port.
    pub port: u16,
}

impl LowPort {
    /// The lastcall-turn chart's value that sets this port (the chart adds
    /// NET_BIND_SERVICE when one of them is below 1024).
    pub fn chart_value(&self) -> &'static str {
        match self.option {
            "listening-port" => "turn.listeningPort",
            "tls-listening-port" => "turn.tlsListeningPort",
            "admin-addr" | "prometheus-port" => "admin.port",
            _ => "turn.minPort",
        }
    }
}

impl fmt::Display for LowPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.option, self.port)
    }
}

/// `net.ipv4.ip_unprivileged_port_start` of this network namespace, `None` if unreadable.
pub fn unprivileged_port_start() -> Option<u16> {
    parse_port_start(&std::fs::read_to_string(UNPRIVILEGED_PORT_START).ok()?)
}

/// The sysctl's text (`"1024\n"`); `None` unless it is a number (the kernel caps it at
/// 65535; a larger value would mean every port is privileged).
fn parse_port_start(text: &str) -> Option<u16> {
    let n: u32 = text.trim().parse().ok()?;
    Some(u16::try_from(n).unwrap_or(u16::MAX))
}

/// The ports `settings` binds that are below `start` (port 0, "any", never is): the client
/// listeners, the admin and Prometheus listeners, and the relay range.
pub fn low_ports(settings: &Settings, start: u16) -> Vec<LowPort> {
    let turn = &settings.turn;
    let candidates = [
        (turn.udp || turn.tcp).then_some(("listening-port", turn.listening_port)),
        turn.tls
            .as_ref()
            .map(|_| ("tls-listening-port", turn.tls_listening_port)),
        settings.term.admin_addr.map(|a| ("admin-addr", a.port())),
        settings
            .prometheus_addr
            .map(|a| ("prometheus-port", a.port())),
        Some(("min-port", turn.min_port)),
    ];
    let mut low: Vec<LowPort> = Vec::new();
    for (option, port) in candidates.into_iter().flatten() {
        if port != 0 && port < start && !low.iter().any(|l| l.option == option) {
            low.push(LowPort { option, port });
        }
    }
    low
}

/// What [`apply`] did with CAP_NET_BIND_SERVICE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No port needs it, and the process did not hold it.
    NotNeeded,
    /// No port needs it: dropped from the permitted and effective sets.
    Dropped,
    /// Moved from the permitted to the effective set, for these ports.
    Raised(Vec<LowPort>),
    /// Already effective (root, or an ambient capability), for these ports.
    AlreadyEffective(Vec<LowPort>),
    /// These ports need it and the process may not have it: binding them will fail.
    Missing(Vec<LowPort>),
    /// The capability sets could not be read or written.
    Failed(String),
}

/// The part of [`apply`] that decides, on the sets `capget` returned: the outcome, and the
/// sets to write when they change.
fn decide(low: Vec<LowPort>, mut sets: CapabilitySets) -> (Outcome, Option<CapabilitySets>) {
    let nbs = CapabilitySet::NET_BIND_SERVICE;
    if low.is_empty() {
        if !(sets.permitted | sets.effective).contains(nbs) {
            return (Outcome::NotNeeded, None);
        }
        sets.permitted.remove(nbs);
        sets.effective.remove(nbs);
        (Outcome::Dropped, Some(sets))
    } else if sets.effective.contains(nbs) {
        (Outcome::AlreadyEffective(low), None)
    } else if sets.permitted.contains(nbs) {
        sets.effective.insert(nbs);
        (Outcome::Raised(low), Some(sets))
    } else {
        (Outcome::Missing(low), None)
    }
}

/// Raises or drops CAP_NET_BIND_SERVICE for `low` (see the module's text). Call it before
/// any thread starts: it changes the calling thread's sets, which later threads inherit.
pub fn apply(low: Vec<LowPort>) -> Outcome {
    let sets = match capabilities(None) {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(format!("capget: {e}")),
    };
    let (outcome, write) = decide(low, sets);
    if let Some(sets) = write {
        if let Err(e) = set_capabilities(None, sets) {
            return Outcome::Failed(format!("capset: {e}"));
        }
    }
    outcome
}

/// Whether this process could bind `low`: what [`apply`] would say, changing nothing
/// (`--validate`).
pub fn check(low: Vec<LowPort>) -> Outcome {
    match capabilities(None) {
        Ok(sets) => decide(low, sets).0,
        Err(e) => Outcome::Failed(format!("capget: {e}")),
    }
}

/// Why a process lacks the capability, for the start-up error: what it can tell about
/// itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Not in the bounding set: the container or unit was not given it.
    NotGiven,
    /// In the bounding set, but no_new_privs is set and the runtime did not put it in the
    /// permitted set before the exec, so the kernel withheld the file capability.
    NoNewPrivs,
    /// In the bounding set, no no_new_privs: this binary has no file capability (a copy
    /// without the image's `cap_net_bind_service=p`, or a filesystem mounted nosuid).
    NoFileCapability,
}

impl Why {
    /// This process's case (bounding set and no_new_privs read from the kernel).
    pub fn of_this_process() -> Why {
        use rustix::thread::{capability_is_in_bounding_set, no_new_privs};
        match (
            capability_is_in_bounding_set(CapabilitySet::NET_BIND_SERVICE).unwrap_or(false),
            no_new_privs().unwrap_or(false),
        ) {
            (false, _) => Why::NotGiven,
            (true, true) => Why::NoNewPrivs,
            (true, false) => Why::NoFileCapability,
        }
    }

    fn text(self) -> &'static str {
        match self {
            Why::NotGiven => "it is not in this process's bounding set: the container or unit was not given it",
            Why::NoNewPrivs => "it is in the bounding set, but no_new_privs is set and the capability was not in the permitted set before the exec, so the kernel withheld the binary's file capability (Docker does this for a non-root user under --security-opt no-new-privileges; containerd's CRI gives an added capability as Kubernetes asks): give it as an ambient capability, or allow privilege escalation (Kubernetes: securityContext.allowPrivilegeEscalation: true; docker: without no-new-privileges); the process stays non-root either way",
            Why::NoFileCapability => "it is in the bounding set, but this binary has no file capability cap_net_bind_service=p (the image's has; setcap sets it on a copy) or its filesystem is mounted nosuid",
        }
    }
}

fn list(low: &[LowPort]) -> String {
    low.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The start-up error when `low` needs CAP_NET_BIND_SERVICE and this process (`uid`) may
/// not have it: which options and ports, the boundary, and how each way of running the
/// daemon gives the capability.
pub fn missing_message(low: &[LowPort], start: u16, uid: u32, why: Why) -> String {
    let mut values: Vec<&str> = low.iter().map(LowPort::chart_value).collect();
    values.dedup();
    format!(
        "{} {} below net.ipv4.ip_unprivileged_port_start ({start}) and this process (uid {uid}) \
         has no CAP_NET_BIND_SERVICE, so it cannot bind {}: nothing was bound ({}). Give it that \
         capability, and only it: the lastcall-turn chart adds it when {} is below 1024 (set \
         the port there, not in turn.extraConfig); docker run --cap-add NET_BIND_SERVICE (the \
         image's lastcall-turn carries the file capability cap_net_bind_service=p); a systemd \
         unit: AmbientCapabilities=CAP_NET_BIND_SERVICE. Or use ports from {start} up.",
        list(low),
        if low.len() == 1 { "is" } else { "are" },
        if low.len() == 1 { "it" } else { "them" },
        why.text(),
        values.join(", "),
    )
}

/// The log line for what [`apply`] did, once logging is up: (level, text); `None` when
/// there is nothing to say.
pub fn report_line(outcome: &Outcome, start: Option<u16>) -> Option<(tracing::Level, String)> {
    let boundary = match start {
        Some(s) => format!("net.ipv4.ip_unprivileged_port_start, {s}"),
        None => format!("{DEFAULT_PORT_START}: net.ipv4.ip_unprivileged_port_start unreadable"),
    };
    match outcome {
        Outcome::NotNeeded | Outcome::AlreadyEffective(_) => None,
        Outcome::Dropped => Some((
            tracing::Level::INFO,
            format!("CAP_NET_BIND_SERVICE dropped: no port below {boundary}"),
        )),
        Outcome::Raised(low) => Some((
            tracing::Level::INFO,
            format!(
                "CAP_NET_BIND_SERVICE raised from the permitted set for {} (below {boundary}); no other capability held",
                list(low)
            ),
        )),
        Outcome::Missing(low) => Some((
            tracing::Level::WARN,
            format!(
                "{} below {boundary} and no CAP_NET_BIND_SERVICE: binding may fail",
                list(low)
            ),
        )),
        Outcome::Failed(e) => Some((
            tracing::Level::WARN,
            format!("CAP_NET_BIND_SERVICE left as it is: {e}"),
        )),
    }
}

/// Logs what [`apply`] did (see [`report_line`]).
pub fn report(outcome: &Outcome, start: Option<u16>) {
    match report_line(outcome, start) {
        Some((tracing::Level::WARN, line)) => tracing::warn!("{line}"),
        Some((_, line)) => tracing::info!("{line}"),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{self, Parsed};

    fn settings(args: &[&str]) -> Settings {
        let mut argv = vec![
            "lastcall-turn".to_string(),
            "--realm=example.org".to_string(),
            "--use-auth-secret".to_string(),
            "--static-auth-secret=s".to_string(),
            "--listening-ip=127.0.0.1".to_string(),
        ];
        argv.extend(args.iter().map(ToString::to_string));
        match config::parse(argv) {
            Ok(Parsed::Run(s)) => *s,
            other => panic!("not a configuration to run: {other:?}"),
        }
    }

    fn options(low: &[LowPort]) -> Vec<(&'static str, u16)> {
        low.iter().map(|l| (l.option, l.port)).collect()
    }

    /// A self-signed certificate and key made with the openssl CLI, for a TLS listener.
    fn cert(dir: &std::path::Path) -> (String, String) {
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let out = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-days", "1", "-subj", "/CN=turn.test", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl");
        assert!(out.status.success(), "{out:?}");
        (
            format!("--cert={}", cert.display()),
            format!("--pkey={}", key.display()),
        )
    }

    #[test]
    fn the_defaults_bind_no_low_port() {
        assert_eq!(low_ports(&settings(&[]), 1024), []);
    }

    /// Which option names which port, below which boundary (a table: options, boundary,
    /// what counts).
    #[test]
    fn each_bound_port_below_the_boundary_counts_with_its_option() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, pkey) = cert(dir.path());
        let (cert, pkey) = (cert.as_str(), pkey.as_str());
        type Case<'a> = (&'a [&'a str], u16, &'a [(&'a str, u16)]);
        let cases: &[Case<'_>] = &[
            // The listening port serves UDP and TCP: one entry.
            (&["--listening-port=80"], 1024, &[("listening-port", 80)]),
            (
                &["--listening-port=80", "--no-udp"],
                1024,
                &[("listening-port", 80)],
            ),
            // Neither UDP nor TCP on it (TLS only): not bound, not counted.
            (
                &["--listening-port=80", "--no-udp", "--no-tcp", cert, pkey],
                1024,
                &[],
            ),
            // TLS on 443 with a certificate.
            (
                &["--tls-listening-port=443", cert, pkey],
                1024,
                &[("tls-listening-port", 443)],
            ),
            // No certificate: no TLS listener, so 443 is not bound.
            (&["--tls-listening-port=443"], 1024, &[]),
            (
                &["--tls-listening-port=443", cert, pkey, "--no-tls"],
                1024,
                &[],
            ),
            (&["--admin-addr=127.0.0.1:99"], 1024, &[("admin-addr", 99)]),
            // coturn's Prometheus port beside an explicit --admin-addr.
            (
                &["--admin-addr=127.0.0.1:9900", "--prometheus-port=90"],
                1024,
                &[("prometheus-port", 90)],
            ),
            // The relay range: its first port decides.
            (
                &["--min-port=900", "--max-port=2000"],
                1024,
                &[("min-port", 900)],
            ),
            // Every one at once, in a fixed order.
            (
                &[
                    "--listening-port=80",
                    "--tls-listening-port=443",
                    cert,
                    pkey,
                    "--admin-addr=127.0.0.1:99",
                    "--min-port=900",
                    "--max-port=2000",
                ],
                1024,
                &[
                    ("listening-port", 80),
                    ("tls-listening-port", 443),
                    ("admin-addr", 99),
                    ("min-port", 900),
                ],
            ),
            // The boundary is the sysctl's: a lower one needs less; 0 none; a port equal to
            // it is unprivileged.
            (
                &[
                    "--listening-port=80",
                    "--tls-listening-port=443",
                    cert,
                    pkey,
                ],
                443,
                &[("listening-port", 80)],
            ),
            (
                &[
                    "--listening-port=80",
                    "--tls-listening-port=443",
                    cert,
                    pkey,
                ],
                444,
                &[("listening-port", 80), ("tls-listening-port", 443)],
            ),
            (&["--listening-port=80"], 80, &[]),
            (&["--listening-port=80"], 0, &[]),
            // Above 1024 but below a raised boundary.
            (
                &["--listening-port=3478"],
                4000,
                &[("listening-port", 3478)],
            ),
        ];
        for (args, start, want) in cases {
            let got = low_ports(&settings(args), *start);
            assert_eq!(options(&got), *want, "{args:?} below {start}");
        }
    }

    #[test]
    fn port_zero_is_any_port() {
        for args in [["--admin-addr=127.0.0.1:0"], ["--listening-port=0"]] {
            assert_eq!(low_ports(&settings(&args), 1024), [], "{args:?}");
        }
    }

    #[test]
    fn the_boundary_is_read_from_proc_as_the_kernel_writes_it() {
        for (text, want) in [
            ("1024\n", Some(1024)),
            ("0\n", Some(0)),
            ("80", Some(80)),
            ("65535\n", Some(65535)),
            ("70000\n", Some(65535)),
            ("", None),
            ("-1\n", None),
            ("many\n", None),
        ] {
            assert_eq!(parse_port_start(text), want, "{text:?}");
        }
        // This machine's, as /proc has it (Linux 4.11 and later).
        let proc_text = std::fs::read_to_string(UNPRIVILEGED_PORT_START).unwrap();
        assert_eq!(
            unprivileged_port_start(),
            Some(proc_text.trim().parse().unwrap())
        );
    }

    fn sets(permitted: CapabilitySet, effective: CapabilitySet) -> CapabilitySets {
        CapabilitySets {
            effective,
            permitted,
            inheritable: CapabilitySet::empty(),
        }
    }

    /// What is done with each combination of sets, with and without a low port.
    #[test]
    fn the_capability_is_raised_kept_dropped_or_missing() {
        let nbs = CapabilitySet::NET_BIND_SERVICE;
        let other = CapabilitySet::CHOWN;
        let none = CapabilitySet::empty();
        let low = vec![LowPort {
            option: "tls-listening-port",
            port: 443,
        }];
        // The image's binary with the capability added: permitted only, raised.
        assert_eq!(
            decide(low.clone(), sets(nbs, none)),
            (Outcome::Raised(low.clone()), Some(sets(nbs, nbs)))
        );
        // Root or an ambient capability: already effective, nothing written.
        assert_eq!(
            decide(low.clone(), sets(nbs | other, nbs | other)),
            (Outcome::AlreadyEffective(low.clone()), None)
        );
        // Not given: missing.
        assert_eq!(
            decide(low.clone(), sets(other, other)),
            (Outcome::Missing(low.clone()), None)
        );
        // No low port: dropped from both sets, the others left as they are.
        assert_eq!(
            decide(vec![], sets(nbs | other, nbs | other)),
            (Outcome::Dropped, Some(sets(other, other)))
        );
        assert_eq!(
            decide(vec![], sets(nbs, none)),
            (Outcome::Dropped, Some(sets(none, none)))
        );
        assert_eq!(
            decide(vec![], sets(other, none)),
            (Outcome::NotNeeded, None)
        );
    }

    #[test]
    fn the_missing_capability_error_names_the_option_the_port_and_what_gives_it() {
        let low = vec![
            LowPort {
                option: "listening-port",
                port: 80,
            },
            LowPort {
                option: "tls-listening-port",
                port: 443,
            },
        ];
        let text = missing_message(&low, 1024, 65532, Why::NotGiven);
        for needle in [
            "listening-port 80, tls-listening-port 443 are below net.ipv4.ip_unprivileged_port_start (1024)",
            "(uid 65532) has no CAP_NET_BIND_SERVICE, so it cannot bind them: nothing was bound (it is not in this process's bounding set",
            "when turn.listeningPort, turn.tlsListeningPort is below 1024",
            "docker run --cap-add NET_BIND_SERVICE",
            "cap_net_bind_service=p",
            "AmbientCapabilities=CAP_NET_BIND_SERVICE",
            "Or use ports from 1024 up.",
        ] {
            assert!(text.contains(needle), "no `{needle}` in {text}");
        }
        let one = missing_message(&low[1..], 1024, 0, Why::NoNewPrivs);
        assert!(one.contains("no_new_privs is set"), "{one}");
        assert!(one.contains("allowPrivilegeEscalation: true"), "{one}");
        let copy = missing_message(&low[1..], 1024, 0, Why::NoFileCapability);
        assert!(
            copy.contains("this binary has no file capability cap_net_bind_service=p"),
            "{copy}"
        );
        assert!(one.contains("tls-listening-port 443 is below"), "{one}");
        assert!(one.contains("cannot bind it"), "{one}");
        assert!(
            one.contains("when turn.tlsListeningPort is below 1024"),
            "{one}"
        );
        for (option, value) in [
            ("listening-port", "turn.listeningPort"),
            ("tls-listening-port", "turn.tlsListeningPort"),
            ("admin-addr", "admin.port"),
            ("prometheus-port", "admin.port"),
            ("min-port", "turn.minPort"),
        ] {
            assert_eq!(LowPort { option, port: 1 }.chart_value(), value);
        }
    }

    #[test]
    fn the_log_line_says_what_was_done_and_below_what() {
        let low = vec![LowPort {
            option: "tls-listening-port",
            port: 443,
        }];
        let line =
            |o: &Outcome, s| report_line(o, s).map(|(level, text)| (level.to_string(), text));
        assert_eq!(
            line(&Outcome::Raised(low.clone()), Some(1024)),
            Some((
                "INFO".to_string(),
                "CAP_NET_BIND_SERVICE raised from the permitted set for tls-listening-port 443 (below net.ipv4.ip_unprivileged_port_start, 1024); no other capability held".to_string()
            ))
        );
        assert_eq!(
            line(&Outcome::Dropped, None),
            Some((
                "INFO".to_string(),
                "CAP_NET_BIND_SERVICE dropped: no port below 1024: net.ipv4.ip_unprivileged_port_start unreadable".to_string()
            ))
        );
        assert_eq!(
            line(&Outcome::Missing(low.clone()), None).unwrap().0,
            "WARN"
        );
        assert_eq!(line(&Outcome::NotNeeded, Some(1024)), None);
        assert_eq!(line(&Outcome::AlreadyEffective(low), Some(1024)), None);
    }
}
