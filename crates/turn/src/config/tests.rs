//! The configuration's table tests: flags, files, defaults and every problem.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};

use super::check::parse_range;
use super::*;
use crate::options::parse_bool;

const BASE: &[&str] = &[
    "lastcall-turn",
    "-n",
    "--realm=example.org",
    "--use-auth-secret",
    "--static-auth-secret=s3cret",
];

fn run(extra: &[&str]) -> Result<Settings, Problems> {
    let args: Vec<&str> = BASE.iter().chain(extra).copied().collect();
    match parse(args)? {
        Parsed::Run(s) => Ok(*s),
        Parsed::Validated(_) => panic!("unexpected --validate"),
        Parsed::Print(p) => panic!("unexpected print: {p}"),
    }
}

fn errors(extra: &[&str]) -> Vec<String> {
    match run(extra) {
        Ok(s) => panic!("expected errors, got {:?}", s.turn),
        Err(e) => e.iter().map(ToString::to_string).collect(),
    }
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(text.as_bytes()).expect("write");
    f
}

#[test]
fn the_documented_startup_command_parses() {
    let s = run(&[
        "--listening-ip=127.0.0.1",
        "--listening-port=34780",
        "--relay-ip=127.0.0.1",
        "--allow-loopback-peers",
        "--admin-addr=127.0.0.1:9999",
    ])
    .expect("valid");
    assert_eq!(s.turn.listening_port, 34780);
    assert_eq!(s.turn.listening_ips, vec![IpAddr::from([127, 0, 0, 1])]);
    assert_eq!(s.turn.relay_ips, vec![IpAddr::from([127, 0, 0, 1])]);
    assert!(s.turn.allow_loopback_peers);
    assert!(s.turn.auth.uses_rest_api());
    assert_eq!(s.turn.auth.rest_secrets(), vec!["s3cret".to_string()]);
    assert_eq!(s.term.admin_addr, Some("127.0.0.1:9999".parse().unwrap()));
    assert_eq!(s.term.drain_timeout, std::time::Duration::from_secs(3600));
}

#[test]
fn space_separated_values_and_short_forms() {
    let s = run(&[
        "--listening-port",
        "4000",
        "-L",
        "127.0.0.2",
        "-E",
        "127.0.0.3",
        "-p",
        "4001",
    ])
    .expect("valid");
    assert_eq!(s.turn.listening_port, 4001, "the last value wins");
    assert_eq!(s.turn.listening_ips, vec![IpAddr::from([127, 0, 0, 2])]);
    assert_eq!(s.turn.relay_ips, vec![IpAddr::from([127, 0, 0, 3])]);
}

#[test]
fn defaults() {
    let s = run(&[]).expect("valid");
    let t = &s.turn;
    assert_eq!((t.listening_port, t.tls_listening_port), (3478, 5349));
    assert_eq!((t.min_port, t.max_port), (49152, 65535));
    assert_eq!(t.max_allocate_lifetime, 3600);
    assert_eq!(t.stale_nonce, 600);
    assert_eq!(t.unauthorized_rps, 100, "on by default, unlike coturn");
    assert!(!t.allow_loopback_peers);
    assert!(!t.tls_enabled());
    assert_eq!(s.term.shutdown_delay, std::time::Duration::from_secs(5));
    assert_eq!(s.term.drain_min_sessions, 0);
}

#[test]
fn unauthorized_ratelimit_like_coturn_but_on_by_default() {
    for (args, rps) in [
        (&[][..], 100),
        (&["--unauthorized-ratelimit"][..], 10),
        (&["--unauthorized-ratelimit-rps=50"][..], 50),
        (
            &["--unauthorized-ratelimit", "--unauthorized-ratelimit-rps=7"][..],
            7,
        ),
        (&["--unauthorized-ratelimit=false"][..], 0),
        (
            &[
                "--unauthorized-ratelimit=off",
                "--unauthorized-ratelimit-rps=50",
            ][..],
            0,
        ),
    ] {
        assert_eq!(
            run(args).expect("valid").turn.unauthorized_rps,
            rps,
            "{args:?}"
        );
    }
    assert!(run(&["--unauthorized-ratelimit-rps=many"]).is_err());
}

#[test]
fn file_syntax_and_flags_override() {
    let f = file(
        "# a comment\n\
         \n\
         listening-port=3479\n\
         tls-listening-port 5350\n\
         \tmin-port = 50000\n\
         max-port=50010\n\
         realm=\"file.example\"\n\
         use-auth-secret\n\
         static-auth-secret=one\n\
         static-auth-secret=two\n\
         no-tls=false\n\
         stale-nonce\n\
         fingerprint\n\
         external-ip=203.0.113.7/10.0.0.7\n\
         relay-ip=10.0.0.7\n\
         user=alice:wonder\n\
         user=bob:0x0123456789abcdef0123456789ABCDEF\n",
    );
    let path = f.path().to_str().unwrap().to_string();
    let args = [
        "lastcall-turn",
        "-c",
        &path,
        "--listening-port=4000",
        "--static-auth-secret=three",
        "--realm=flag.example",
    ];
    let Parsed::Run(s) = parse(args).expect("valid") else {
        panic!("print")
    };
    let t = s.turn;
    assert_eq!(t.listening_port, 4000, "the flag overrides the file");
    assert_eq!(t.tls_listening_port, 5350);
    assert_eq!((t.min_port, t.max_port), (50000, 50010));
    assert_eq!(t.realm, "flag.example");
    assert_eq!(t.auth.rest_secrets(), vec!["one", "two", "three"]);
    assert!(
        t.tls.is_none(),
        "no-tls=false without cert and pkey: no TLS listener"
    );
    assert_eq!(t.stale_nonce, 600);
    assert_eq!(
        t.external_ips,
        vec![ExternalIp {
            public: IpAddr::from([203, 0, 113, 7]),
            private: Some(IpAddr::from([10, 0, 0, 7])),
        }]
    );
    let users = t.auth.users();
    assert_eq!(users.len(), 2);
    assert!(matches!(&users[0], (n, UserKey::Password(p)) if n == "alice" && p == "wonder"));
    assert!(matches!(users[1].1, UserKey::Key(k) if k[0] == 0x01 && k[15] == 0xef));
}

#[test]
fn every_error_is_reported_at_once() {
    let f = file("listening-port=notaport\ndaemon\nfrobnicate=1\nuser=nocolon\n");
    let path = f.path().to_str().unwrap().to_string();
    let errs = errors(&["-c", &path, "--min-port=60000", "--max-port=50000"]);
    let all = errs.join("\n");
    assert!(all.contains(":1: listening-port=notaport"), "{all}");
    assert!(
        all.contains(":2: unsupported coturn option daemon (run it in the foreground"),
        "{all}"
    );
    assert!(all.contains(":3: unknown option frobnicate"), "{all}");
    assert!(all.contains(":4: user=nocolon"), "{all}");
    assert!(
        all.contains("min-port 60000 is above max-port 50000"),
        "{all}"
    );
    assert_eq!(errs.len(), 5, "{all}");
}

#[test]
fn unsupported_and_unknown_flags_are_named_together() {
    let errs = errors(&[
        "--daemon",
        "--mysql-userdb",
        "host=db dbname=coturn",
        "--mobility",
        "--bogus",
        "-d",
        "eth0",
    ]);
    let all = errs.join("\n");
    assert!(all.contains("unsupported coturn option --daemon"), "{all}");
    assert!(all.contains("unsupported coturn option --mysql-userdb (MySQL is not supported: use userdb (SQLite), psql-userdb (PostgreSQL) or redis-userdb (Redis)"), "{all}");
    assert!(
        all.contains("unsupported coturn option --mobility (RFC 8016"),
        "{all}"
    );
    assert!(all.contains("unknown option --bogus"), "{all}");
    assert!(
        all.contains("unsupported coturn option -d (--listening-device)"),
        "{all}"
    );
    assert_eq!(
        errs.len(),
        5,
        "the values of unsupported options are skipped: {all}"
    );
}

#[test]
fn credentials_and_realm_are_required() {
    let errs = match parse(["lastcall-turn", "-n"]) {
        Err(e) => e,
        Ok(_) => panic!("no credentials must fail"),
    };
    let all = errs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(all.contains("no credentials"), "{all}");
    assert!(all.contains("realm is required"), "{all}");
}

#[test]
fn static_user_alone_is_enough() {
    let Parsed::Run(s) =
        parse(["lastcall-turn", "--realm=r", "--lt-cred-mech", "--user=u:p"]).expect("valid")
    else {
        panic!("print")
    };
    assert!(!s.turn.auth.uses_rest_api());
    assert_eq!(s.turn.auth.users().len(), 1);
}

#[test]
fn cert_needs_pkey() {
    let errs = errors(&["--cert=/x.pem"]);
    assert!(errs.join("\n").contains("cert and pkey go together"));
}

#[test]
fn drain_min_allocations_feeds_drain_min_sessions() {
    assert_eq!(
        run(&["--drain-min-allocations=3"])
            .unwrap()
            .term
            .drain_min_sessions,
        3
    );
    let s = run(&["--drain-min-allocations=3", "--drain-min-sessions=1"]).unwrap();
    assert_eq!(s.term.drain_min_sessions, 1, "lastcall's own option wins");
}

#[test]
fn nonce_key_from_nonce_secret_its_file_or_the_first_static_auth_secret() {
    use lastcall_turn_proto::nonce_key;
    let key = |args: &[&str]| {
        let n = run(args).unwrap().turn.core_config().nonce;
        (n.secret, n.accepted)
    };
    // run() gives static-auth-secret s3cret (see `run`): the fleet key is derived from it.
    let (derived, accepted) = key(&[]);
    assert_eq!(derived, key(&[]).0, "the same on every server");
    assert!(accepted.is_empty());
    assert_eq!(key(&["--nonce-secret=fleet"]).0, nonce_key(b"fleet"));
    assert_eq!(
        key(&["--stateless-nonce-secret=fleet"]).0,
        nonce_key(b"fleet")
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nonce");
    std::fs::write(&file, "fleet\n").unwrap();
    let arg = format!("--nonce-secret-file={}", file.display());
    assert_eq!(key(&[&arg]).0, nonce_key(b"fleet"));
    let both = errors(&["--nonce-secret=a", &arg]).join("\n");
    assert!(both.contains("not both"), "{both}");
    let missing = errors(&["--nonce-secret-file=/nonexistent/nonce"]).join("\n");
    assert!(missing.contains("cannot read it"), "{missing}");
    assert!(!missing.contains("fleet"));
}

#[test]
fn drain_idle_timeout_defaults_to_30s_and_0_turns_it_off() {
    let core = |args: &[&str]| run(args).unwrap().turn.core_config().drain_idle_timeout;
    assert_eq!(core(&[]), Some(Duration::from_secs(30)));
    assert_eq!(
        core(&["--drain-idle-timeout=2m"]),
        Some(Duration::from_secs(120))
    );
    assert_eq!(
        core(&["--drain-idle-timeout=45"]),
        Some(Duration::from_secs(45))
    );
    assert_eq!(core(&["--drain-idle-timeout=0"]), None);
    let all = errors(&["--drain-idle-timeout=soon"]).join("\n");
    assert!(all.contains("drain-idle-timeout=soon"), "{all}");
}

#[test]
fn termination_errors_are_collected_with_the_rest() {
    let errs = errors(&["--drain-timeout=1s", "--shutdown-delay=5s", "--min-port=0"]);
    let all = errs.join("\n");
    assert!(all.contains("--shutdown-delay"), "{all}");
    assert!(all.contains("min-port must be at least 1"), "{all}");
}

#[test]
fn verbose_sets_the_log_level_unless_given() {
    assert_eq!(run(&["-v"]).unwrap().log.log_level, "debug");
    assert_eq!(
        run(&["--verbose", "--log-level=warn"])
            .unwrap()
            .log
            .log_level,
        "warn"
    );
}

#[test]
fn help_and_version_print() {
    let Parsed::Print(help) = parse(["lastcall-turn", "--help"]).expect("help") else {
        panic!("help must print")
    };
    assert!(help.contains("--allow-loopback-peers"));
    assert!(help.contains("FOR TESTS ONLY"));
    assert!(help.contains("--drain-timeout"));
    assert!(matches!(
        parse(["lastcall-turn", "--version"]),
        Ok(Parsed::Print(_))
    ));
}

#[test]
fn ranges() {
    let r = parse_range("10.0.0.0/8").unwrap();
    assert!(r.contains(IpAddr::from([10, 255, 1, 1])));
    assert!(!r.contains(IpAddr::from([11, 0, 0, 0])));
    let r = parse_range("192.168.0.10-192.168.0.20").unwrap();
    assert!(r.contains(IpAddr::from([192, 168, 0, 15])));
    assert!(parse_range("192.168.0.20-192.168.0.10").is_err());
    assert!(parse_range("fc00::/7")
        .unwrap()
        .contains("fdff::1".parse().unwrap()));
    assert!(parse_range("1.2.3.4-::1").is_err());
    assert!(parse_range("1.2.3.4/33").is_err());
}

#[test]
fn relay_threads_flag_file_and_default() {
    assert_eq!(run(&[]).unwrap().turn.relay_threads, 0);
    let s = run(&["--relay-threads=3"]).unwrap();
    assert_eq!(s.turn.relay_threads, 3);
    assert_eq!(s.turn.udp_workers(), 3);
    assert_eq!(run(&["-m", "2"]).unwrap().turn.relay_threads, 2);
    let f = file("relay-threads=4\n");
    let path = f.path().to_str().unwrap().to_string();
    assert_eq!(run(&["-c", &path]).unwrap().turn.relay_threads, 4);
    let s = run(&["-c", &path, "--relay-threads", "5"]).unwrap();
    assert_eq!(s.turn.relay_threads, 5, "the flag overrides the file");
    let auto = run(&["--relay-threads=0"]).unwrap().turn;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(auto.udp_workers(), cpus);
}

#[test]
fn relay_threads_errors_name_the_option_and_line() {
    let f = file("realm=x\nrelay-threads=many\n");
    let path = f.path().to_str().unwrap().to_string();
    let errs = errors(&["-c", &path]);
    let all = errs.join("\n");
    assert!(
        all.contains(":2: relay-threads=many: not a number of threads"),
        "{all}"
    );
    assert_eq!(errs.len(), 1, "{all}");
    let all = errors(&["--relay-threads=-1"]).join("\n");
    assert!(
        all.contains("relay-threads=-1: not a number of threads"),
        "{all}"
    );
    let all = errors(&["--relay-threads=5000"]).join("\n");
    assert!(all.contains("relay-threads=5000: at most 1024"), "{all}");
}

#[test]
fn booleans_follow_coturn() {
    for (v, b) in [
        ("", true),
        ("1", true),
        ("yes", true),
        ("on", true),
        ("0", false),
        ("off", false),
        ("false", false),
    ] {
        assert_eq!(parse_bool(v), Some(b), "{v}");
    }
    assert_eq!(parse_bool("maybe"), None);
    let errs = errors(&["--no-udp=maybe"]);
    assert!(errs.join("\n").contains("not a boolean"));
}
#[test]
fn no_auth_needs_its_acknowledgement_and_no_credentials() {
    let open = ["lastcall-turn", "-n", "--realm=example.org", "--no-auth"];
    let errs: Vec<String> = match parse(open) {
        Err(p) => p.iter().map(ToString::to_string).collect(),
        Ok(_) => panic!("no-auth alone must be an error"),
    };
    assert!(
        errs.join("\n").contains("no-auth-acknowledge-open-relay"),
        "{errs:?}"
    );
    let acked = [&open[..], &["--no-auth-acknowledge-open-relay"]].concat();
    let Ok(Parsed::Run(s)) = parse(acked) else {
        panic!("acknowledged no-auth runs")
    };
    assert_eq!(s.turn.auth, AuthMode::Open);
    let core = s.turn.core_config();
    assert!(!core.auth.required(), "anonymous");
    // Credentials and no-auth together: an error, not a silent choice.
    let errs = errors(&["--no-auth", "--no-auth-acknowledge-open-relay"]);
    assert!(
        errs.join("\n").contains("give one or the other"),
        "{errs:?}"
    );
    // Without no-auth a server never runs anonymously.
    assert!(run(&[]).expect("runs").turn.core_config().auth.required());
}

#[test]
fn coturn_options_reach_the_core() {
    let s = run(&[
        "--max-bps=125000",
        "--bps-capacity=1000000",
        "--channel-lifetime=300",
        "--permission-lifetime=120",
        "--allocation-default-address-family=keep",
        "--stun-only",
        "--secure-stun",
        "--check-origin-consistency",
        "--include-reason-string",
        "--fingerprint",
        "--rest-api-separator=-",
        "--udp-alternate-server=192.0.2.1:3478",
        "--log-min-level=warning",
        "--prometheus-port=9700",
    ])
    .expect("runs");
    let c = s.turn.core_config();
    assert_eq!(
        (c.bandwidth.max_bps, c.bandwidth.capacity),
        (125_000, 1_000_000)
    );
    assert_eq!(c.lifetimes.channel, Duration::from_secs(300));
    assert_eq!(c.lifetimes.permission, Duration::from_secs(120));
    assert_eq!(c.default_family, DefaultFamily::Keep);
    assert_eq!(c.service, Service::StunOnly);
    assert!(c.secure_stun && c.check_origin && c.reason_phrases && c.fingerprint);
    assert_eq!(c.auth.rest_separator, '-');
    assert_eq!(s.turn.transport_alternates.udp.len(), 1);
    assert_eq!(s.log.log_level, "warn");
    assert_eq!(
        s.term.admin_addr,
        Some(SocketAddr::from(([0, 0, 0, 0], 9700)))
    );
    assert!(s.term.sigusr1_refuses_at_once);
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
}

#[test]
fn coturn_option_errors_name_the_option() {
    let all = errors(&[
        "--bps-capacity=1000",
        "--allocation-default-address-family=ipv5",
        "--rest-api-separator=::",
        "--stun-only",
        "--no-stun",
        "--log-min-level=loud",
    ])
    .join("\n");
    for needle in [
        "bps-capacity needs max-bps",
        "allocation-default-address-family=ipv5: expected ipv4, ipv6 or keep",
        "rest-api-separator=::: expected one character",
        "stun-only and no-stun",
        "log-min-level=loud: expected debug, info, warning or error",
    ] {
        assert!(all.contains(needle), "{needle}:\n{all}");
    }
}

#[test]
fn accepted_options_warn_once_and_a_refused_flag_turned_off_is_no_error() {
    let f = file("syslog\nudp-gso\nudp-gso\ncli=0\ndtls=0\nmobility=false\n");
    let path = f.path().to_str().unwrap().to_string();
    let s = run(&["-c", &path, "--cpus=4"]).expect("runs");
    let w: Vec<String> = s.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(w.len(), 3, "{w:?}");
    for needle in [
        ":1: syslog: is accepted and changes nothing: logs go to stderr",
        ":3: udp-gso: is accepted",
    ] {
        assert!(w.iter().any(|l| l.contains(needle)), "{needle}: {w:?}");
    }
    assert!(
        w.iter().any(|l| l.starts_with("cpus: is accepted")),
        "{w:?}"
    );
}

#[test]
fn an_empty_pidfile_means_none_as_in_coturn() {
    assert_eq!(run(&[]).unwrap().turn.pidfile, None);
    assert_eq!(run(&["--pidfile="]).unwrap().turn.pidfile, None);
    let f = file("pidfile=\"/run/turnserver.pid\"\n");
    let path = f.path().to_str().unwrap().to_string();
    let s = run(&["-c", &path]).unwrap();
    assert_eq!(s.turn.pidfile, Some(PathBuf::from("/run/turnserver.pid")));
    // Debian's coturn.service: `-c /etc/turnserver.conf --pidfile=` overrides the file's.
    assert_eq!(
        run(&["-c", &path, "--pidfile="]).unwrap().turn.pidfile,
        None
    );
    assert!(run(&["--pidfile="]).unwrap().warnings.is_empty());
}

#[test]
fn validate_checks_the_same_and_says_so() {
    let Ok(Parsed::Validated(s)) = parse(BASE.iter().copied().chain(["--validate"])) else {
        panic!("--validate of a valid configuration")
    };
    assert_eq!(s.turn.realm, "example.org");
    // The same problems as a start, every one of them.
    let errs = match parse(["lastcall-turn", "-n", "--validate", "--min-port=0"]) {
        Err(e) => e
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        Ok(_) => panic!("must fail"),
    };
    for needle in [
        "min-port must be at least 1",
        "no credentials",
        "realm is required",
    ] {
        assert!(errs.contains(needle), "{needle}: {errs}");
    }
}

#[test]
fn ports_that_would_collide_at_start_up_are_problems() {
    let all = errors(&["--listening-port=9700", "--admin-addr=0.0.0.0:9700"]).join("\n");
    assert!(
        all.contains("--admin-addr: 0.0.0.0:9700 is the listening-port (9700) too"),
        "{all}"
    );
    // UDP only: the admin listener is TCP, no collision.
    assert!(run(&[
        "--listening-port=9700",
        "--admin-addr=0.0.0.0:9700",
        "--no-tcp"
    ])
    .is_ok());
    // coturn's Prometheus port beside --admin-addr: served too, unless it is the same.
    let s = run(&["--admin-addr=127.0.0.1:9800", "--prometheus-port=9641"]).unwrap();
    assert_eq!(
        s.prometheus_addr,
        Some(SocketAddr::from(([0, 0, 0, 0], 9641)))
    );
    let s = run(&["--admin-addr=0.0.0.0:9641", "--prometheus-port=9641"]).unwrap();
    assert_eq!(s.prometheus_addr, None);
    let s = run(&["--prometheus-port=9700"]).unwrap();
    assert_eq!(
        s.prometheus_addr, None,
        "the admin listener is there already"
    );
    assert_eq!(
        s.term.admin_addr,
        Some(SocketAddr::from(([0, 0, 0, 0], 9700)))
    );
}

#[test]
fn external_ip_file_adds_what_it_holds_and_a_missing_one_is_a_problem() {
    let f = file("# node-a, from the chart's map\n203.0.113.7/10.0.0.7 2001:db8::7\n");
    let arg = format!("--external-ip-file={}", f.path().display());
    let s = run(&[&arg, "--external-ip=198.51.100.1"]).unwrap();
    let public: Vec<IpAddr> = s.turn.external_ips.iter().map(|e| e.public).collect();
    assert_eq!(
        public,
        [
            IpAddr::from([198, 51, 100, 1]),
            IpAddr::from([203, 0, 113, 7]),
            "2001:db8::7".parse().unwrap()
        ]
    );
    assert_eq!(
        s.turn.external_ips[1].private,
        Some(IpAddr::from([10, 0, 0, 7]))
    );
    let empty = file("");
    let arg = format!("--external-ip-file={}", empty.path().display());
    assert!(run(&[&arg]).unwrap().turn.external_ips.is_empty());
    let all = errors(&["--external-ip-file=/nonexistent/node-b"]).join("\n");
    assert!(
        all.contains("external-ip-file=/nonexistent/node-b: cannot read it"),
        "{all}"
    );
    let bad = file("203.0.113.7/2001:db8::1\n");
    let arg = format!("--external-ip-file={}", bad.path().display());
    let all = errors(&[&arg]).join("\n");
    assert!(all.contains("of one family"), "{all}");
}

/// wire's chart's configuration (our rendering of its template, with its StatefulSet's
/// substitutions and the secrets file's lines appended as its sed does), as `-c` alone.
fn wire_conf(secrets_file: &str) -> tempfile::NamedTempFile {
    let template = include_str!("../../tests/data/wire-coturn.conf.template");
    let mut text = template
        .replace("__COTURN_EXT_IP__", "203.0.113.9")
        .replace("__COTURN_POD_IP__", "10.0.0.9");
    for line in secrets_file.lines() {
        text.push_str(&format!("static-auth-secret={line}\n"));
    }
    file(&text)
}

fn parse_file_only(path: &std::path::Path) -> Result<Settings, Problems> {
    let path = path.to_str().unwrap().to_string();
    match parse(["lastcall-turn", "-c", &path])? {
        Parsed::Run(s) => Ok(*s),
        _ => panic!("not a run"),
    }
}

#[test]
fn wires_chart_configuration_runs_as_it_is() {
    // One secret per line, the file ending in a newline (as `kubectl create secret
    // --from-file` keeps it).
    let f = wire_conf("first-secret\nsecond-secret\n");
    let s = parse_file_only(f.path()).expect("wire's configuration runs");
    let t = &s.turn;
    assert_eq!(
        t.auth,
        AuthMode::Zrest {
            secrets: vec!["first-secret".into(), "second-secret".into()]
        }
    );
    let core = t.core_config();
    assert_eq!(
        core.auth.rest_scheme,
        lastcall_turn_proto::RestScheme::Zrest
    );
    assert_eq!(core.realm, "dummy.io");
    assert!(core.secure_stun);
    assert_eq!(t.pidfile, Some(PathBuf::from("/var/tmp/turnserver.pid")));
    // The chart's defaults (coturnTurnListenIP, coturnTurnRelayIP: __COTURN_EXT_IP__).
    assert_eq!(t.listening_ips, vec![IpAddr::from([203, 0, 113, 9])]);
    assert_eq!(t.relay_ips, vec![IpAddr::from([203, 0, 113, 9])]);
    assert_eq!(t.external_ips[0].public, IpAddr::from([203, 0, 113, 9]));
    assert!(t.tls.is_none(), "no-tls");
    assert_eq!(t.denied_peer_ips.len(), 19);
    // prometheus-ip and prometheus-port: the admin listener (probes, metrics, /drain).
    assert_eq!(s.term.admin_addr, Some("10.0.0.9:9641".parse().unwrap()));
    let w: Vec<String> = s.warnings.iter().map(ToString::to_string).collect();
    for needle in [
        ":12: CA-file: has no effect: there is no TLS listener",
        ":27: log-file: is accepted and changes nothing",
        ":48: 401-req-limit: is accepted and changes nothing: no 401 count per window: unauthorized-ratelimit-rps",
        ":49: 401-window: is accepted and changes nothing",
    ] {
        assert!(w.iter().any(|l| l.contains(needle)), "{needle}: {w:#?}");
    }
    assert_eq!(w.len(), 4, "{w:#?}");
}

#[test]
fn zrest_needs_a_secret_and_takes_nothing_else() {
    let all = errors(&["--zrest", "--static-auth-secret="]).join("\n");
    assert!(all.contains("static-auth-secret=: empty secret"), "{all}");
    let f = file("realm=dummy.io\nzrest\n");
    let all = parse_file_only(f.path())
        .expect_err("no secret")
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        all.contains(":2: zrest needs at least one static-auth-secret, or a user database whose turn_secret holds them"),
        "{all}"
    );
    // With zrest, use-auth-secret and user are given for nothing: a warning each.
    let s = run(&["--zrest", "--user=alice:pw"]).expect("runs");
    assert_eq!(
        s.turn.auth,
        AuthMode::Zrest {
            secrets: vec!["s3cret".into()]
        }
    );
    assert!(s.turn.auth.users().is_empty());
    let w: Vec<String> = s.warnings.iter().map(ToString::to_string).collect();
    assert!(
        w.iter().any(|l| l
            .contains("use-auth-secret: TURN REST API credentials are not accepted with zrest")),
        "{w:?}"
    );
    assert!(
        w.iter()
            .any(|l| l.contains("user: static users are not accepted with zrest")),
        "{w:?}"
    );
}

#[test]
fn static_auth_secret_alone_turns_the_rest_api_on_as_in_coturn() {
    let Parsed::Run(s) = parse([
        "lastcall-turn",
        "--realm=r",
        "--static-auth-secret=one",
        "--static-auth-secret=two",
    ])
    .expect("valid") else {
        panic!("print")
    };
    assert_eq!(
        s.turn.auth,
        AuthMode::RestApi {
            secrets: vec!["one".into(), "two".into()],
            users: vec![]
        }
    );
}

#[test]
fn wires_fork_options_prometheus_ip_and_federation() {
    let s = run(&["--prometheus-ip=127.0.0.2", "--prometheus-port=9700"]).unwrap();
    assert_eq!(s.term.admin_addr, Some("127.0.0.2:9700".parse().unwrap()));
    let all = errors(&[
        "--prometheus-ip=127.0.0.2",
        "--prometheus-address=127.0.0.3",
    ])
    .join("\n");
    assert!(
        all.contains("prometheus-ip is Wire's fork's name of prometheus-address: give one of them"),
        "{all}"
    );
    let f = file("federation-listening-ip=10.0.0.9\nfederation-listening-port=9191\nfederation-no-dtls=false\n");
    let path = f.path().to_str().unwrap().to_string();
    let errs = errors(&["-c", &path]);
    let all = errs.join("\n");
    for line in [1, 2] {
        assert!(
            all.contains(&format!(":{line}: unsupported coturn option federation-")),
            "{all}"
        );
    }
    assert!(
        all.contains(
            "(Wire's federation (links between Wire backends' TURN servers for conference calls"
        ),
        "{all}"
    );
    assert_eq!(
        errs.len(),
        2,
        "federation-no-dtls=false asks for nothing: {all}"
    );
}

#[test]
fn ca_file_is_checked_with_the_tls_listener() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = lastcall_testkit::tls::self_signed(dir.path(), "turn", "turn.test");
    let tls = [
        format!("--cert={}", cert.display()),
        format!("--pkey={}", key.display()),
    ];
    let with = |ca: &str| {
        let mut args: Vec<String> = tls.to_vec();
        args.push(format!("--CA-file={ca}"));
        args
    };
    // A CA file: clients are verified against it.
    let args = with(&cert.display().to_string());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = run(&refs).expect("runs");
    assert_eq!(
        s.turn.tls.as_ref().and_then(|t| t.client_ca.clone()),
        Some(cert.clone())
    );
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    // Missing, or holding no certificate: a problem naming CA-file.
    let empty = file("");
    for ca in [
        "/nonexistent/ca.pem".to_string(),
        empty.path().display().to_string(),
    ] {
        let args = with(&ca);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let all = errors(&refs).join("\n");
        assert!(all.contains("CA-file: "), "{all}");
        assert!(all.contains(&ca), "{all}");
    }
}

#[test]
fn prometheus_username_labels_is_bounded_by_its_max() {
    let s = run(&[]).expect("valid");
    assert_eq!(s.turn.user_labels, None, "off by default");
    let s = run(&["--prometheus-username-labels"]).expect("valid");
    assert_eq!(
        s.turn.user_labels,
        Some(crate::usertraffic::DEFAULT_MAX_USERS)
    );
    let s = run(&[
        "--prometheus-username-labels",
        "--prometheus-username-labels-max=20",
    ])
    .expect("valid");
    assert_eq!(s.turn.user_labels, Some(20));
    let all = errors(&["--prometheus-username-labels-max=0"]).join("\n");
    assert!(
        all.contains("prometheus-username-labels-max=0: at least 1"),
        "{all}"
    );
    let all = errors(&["--prometheus-username-labels-max=many"]).join("\n");
    assert!(
        all.contains("prometheus-username-labels-max") && all.contains("a number of users"),
        "{all}"
    );
}
