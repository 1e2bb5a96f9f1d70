//! `lastcall-turn`: a TURN/STUN relay that reads coturn's configuration and drains on SIGTERM.
#![forbid(unsafe_code)]

use std::sync::Arc;

use lastcall::Daemon;
use lastcall_turn::certwatch;
use lastcall_turn::config::{self, Parsed, Settings};
use lastcall_turn::listen;
use lastcall_turn::metrics::Metrics;
use lastcall_turn::privileged;
use lastcall_turn::server;
use lastcall_turn::tls::Certs;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("node-external-ip") {
        node_external_ip(args.get(2..).unwrap_or_default());
    }
    // The image's /usr/local/bin/pre-stop-hook is this binary under that name.
    let invoked_as = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str());
    if invoked_as == Some("pre-stop-hook") {
        pre_stop_hook(args.get(1..).unwrap_or_default());
    }
    if args.get(1).map(String::as_str) == Some("pre-stop-hook") {
        pre_stop_hook(args.get(2..).unwrap_or_default());
    }
    if args.get(1).map(String::as_str) == Some("sessions") {
        lastcall::sessions::command(
            "lastcall-turn",
            args.get(2..).unwrap_or_default(),
            config::termination_defaults().admin_addr,
            lastcall_turn::sessions::COLUMNS,
        );
    }
    let settings = match config::parse(args) {
        Ok(Parsed::Run(s)) => *s,
        Ok(Parsed::Validated(s)) => validated(&s),
        Ok(Parsed::Print(text)) => {
            print!("{text}");
            std::process::exit(0);
        }
        Err(problems) => problems.exit("lastcall-turn"),
    };
    // Before any thread: the capability sets are per thread, and threads inherit them.
    let port_start = privileged::unprivileged_port_start();
    let low = privileged::low_ports(
        &settings,
        port_start.unwrap_or(privileged::DEFAULT_PORT_START),
    );
    let caps = privileged::apply(low);
    if let (privileged::Outcome::Missing(low), Some(start)) = (&caps, port_start) {
        // Reported before anything is bound, as a configuration error is; the status is the
        // one the refused bind would give (the same file runs where the capability is given).
        let uid = rustix::process::getuid().as_raw();
        eprintln!(
            "lastcall-turn: {}",
            privileged::missing_message(low, start, uid, privileged::Why::of_this_process())
        );
        std::process::exit(lastcall::exit::OS_ERROR);
    }
    let raised = raise_open_file_limit();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lastcall-turn: cannot start the runtime: {e}");
            std::process::exit(lastcall::exit::OS_ERROR);
        }
    };
    let code = runtime.block_on(run(settings, raised, (caps, port_start)));
    std::process::exit(code);
}

/// `lastcall-turn node-external-ip ...`: the chart's init container (see
/// [`lastcall_turn::nodeip`]); exits 0 with the file written, 64 on bad arguments, 1 else.
fn node_external_ip(args: &[String]) -> ! {
    use lastcall_turn::nodeip::{Lookup, LookupError, Origin, WIRE_EXTERNAL_IP_ANNOTATION};
    let lookup = match Lookup::from_args(args) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("lastcall-turn node-external-ip: {e}");
            std::process::exit(lastcall::exit::CONFIG);
        }
    };
    match lookup.run() {
        Ok((ips, origin)) => {
            let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
            let from = match origin {
                Origin::Status => lookup.address_type.clone(),
                Origin::Annotation => format!(
                    "no {}; annotation {WIRE_EXTERNAL_IP_ANNOTATION}",
                    lookup.address_type
                ),
            };
            println!(
                "lastcall-turn node-external-ip: node {}: {from} {} written to {}",
                lookup.node,
                ips.join(" "),
                lookup.out.display()
            );
            std::process::exit(0);
        }
        Err(e @ LookupError::Usage(_)) => {
            eprintln!("lastcall-turn node-external-ip: {e}");
            std::process::exit(lastcall::exit::CONFIG);
        }
        Err(e) => {
            eprintln!("lastcall-turn node-external-ip: {e}");
            std::process::exit(1);
        }
    }
}

/// `pre-stop-hook [HOST PORT]`: wire's chart's preStop hook (see [`lastcall_turn::prestop`]);
/// exits 0 once the daemon is gone (or was not running), 1 if it could not be drained.
fn pre_stop_hook(args: &[String]) -> ! {
    use lastcall_turn::prestop::{self, Outcome};
    let admin = match args {
        [host, port] => format!("{host}:{port}"),
        [] => "not given".to_string(),
        _ => {
            eprintln!("usage: pre-stop-hook [HOST PORT] (wire's chart: \"$POD_IP\" 9641)");
            std::process::exit(lastcall::exit::CONFIG);
        }
    };
    match prestop::run(std::path::Path::new("/proc"), &admin) {
        Ok(Outcome::NotRunning) => {
            println!(
                "pre-stop-hook: no {} running: nothing to drain",
                prestop::PROCESS_NAME
            );
            std::process::exit(0);
        }
        Ok(Outcome::Drained { pid }) => {
            println!(
                "pre-stop-hook: {} (pid {pid}) drained and exited",
                prestop::PROCESS_NAME
            );
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("pre-stop-hook: {e}");
            std::process::exit(1);
        }
    }
}

/// `--validate`: everything start-up checks passed (the configuration, the files it names,
/// the listening addresses); nothing was bound. Prints what would run and exits 0.
fn validated(s: &Settings) -> ! {
    let turn = &s.turn;
    for w in &s.warnings {
        println!("warning: {w}");
    }
    // The capability is the environment's, not the file's: a warning here, exit 71 at start.
    let port_start = privileged::unprivileged_port_start();
    let start = port_start.unwrap_or(privileged::DEFAULT_PORT_START);
    if let privileged::Outcome::Missing(low) = privileged::check(privileged::low_ports(s, start)) {
        let uid = rustix::process::getuid().as_raw();
        println!(
            "warning: {} (start-up here would exit {})",
            privileged::missing_message(&low, start, uid, privileged::Why::of_this_process()),
            lastcall::exit::OS_ERROR
        );
    }
    match listen::listening_addresses(turn) {
        Ok(ips) => {
            let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
            println!(
                "lastcall-turn: configuration valid{}: realm {}, listening on {} port {} (UDP {}, TCP {}, TLS {}), relay ports {}-{}, admin {}",
                turn.config_file
                    .as_ref()
                    .map(|f| format!(" ({})", f.display()))
                    .unwrap_or_default(),
                turn.realm,
                ips.join(", "),
                turn.listening_port,
                on(turn.udp),
                on(turn.tcp),
                turn.tls
                    .as_ref()
                    .map_or("off".to_string(), |_| format!("on, port {}", turn.tls_listening_port)),
                turn.min_port,
                turn.max_port,
                s.term
                    .admin_addr
                    .map_or("off".to_string(), |a| a.to_string()),
            );
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("lastcall-turn: configuration errors:\n  - listening-ip: {e}");
            std::process::exit(lastcall::exit::CONFIG);
        }
    }
}

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// coturn raises its open-file limit to the hard limit at start (every allocation holds a
/// relay socket, every TCP client a connection); so does lastcall-turn. Under systemd the
/// soft limit is 1,024 unless the unit says `LimitNOFILE=`, about 1,000 allocations.
/// Returns the limits before and after, when raised.
fn raise_open_file_limit() -> Option<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft >= hard {
        return None;
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).ok()?;
    Some((soft, hard))
}

/// Serves until the lifecycle says to leave; returns the exit status.
async fn run(
    settings: Settings,
    raised: Option<(u64, u64)>,
    caps: (privileged::Outcome, Option<u16>),
) -> i32 {
    let Settings {
        turn,
        certs,
        term,
        log,
        warnings,
        prometheus_addr,
    } = settings;
    lastcall::logging::init(&log);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    if let Some((from, to)) = raised {
        tracing::info!("open-file limit raised from {from} to {to} (as coturn does)");
    }
    privileged::report(&caps.0, caps.1);
    if turn.tls.is_none() {
        tracing::info!("the TLS listener is off (no cert and pkey, or no-tls)");
    }
    // Starting: signals are handled from here on, readiness is 503 until every port is bound.
    let mut daemon = Daemon::start(term);
    let handle = daemon.handle().clone();
    let mut registry = prometheus_client::registry::Registry::default();
    daemon.register_metrics(&mut registry);
    let metrics = Metrics::default();
    metrics.register(&mut registry);
    let ips = match listen::listening_addresses(&turn) {
        Ok(ips) => ips,
        Err(e) => {
            tracing::error!("{e}");
            return lastcall::exit::OS_ERROR;
        }
    };
    let running = match server::start(&turn, &ips, certs.clone(), metrics.clone(), &daemon) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("{e}");
            return lastcall::exit::OS_ERROR;
        }
    };
    running.register_metrics(&mut registry);
    handle.provide_sessions(Arc::new(lastcall_turn::sessions::Allocations::new(
        Arc::clone(&running.shared),
    )));
    // coturn's text format and families, so coturn's dashboards and scrape configs carry over.
    let exposition = lastcall::admin::Exposition::PrometheusText {
        extra: Some(running.coturn_metrics(&turn.realm)),
    };
    let registry = Arc::new(registry);
    let admin =
        match lastcall::admin::serve_with(&handle, Arc::clone(&registry), exposition.clone()).await
        {
            Ok(a) => a,
            Err(e) => {
                tracing::error!("{e}");
                return lastcall::exit::OS_ERROR;
            }
        };
    // coturn's Prometheus port, when --admin-addr is elsewhere: the same endpoints there.
    let _prometheus = match prometheus_addr
        .map(|addr| lastcall::admin::serve_addr(addr, &handle, registry, exposition))
        .transpose()
    {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("coturn's prometheus-port: {e}");
            return lastcall::exit::OS_ERROR;
        }
    };
    if let Some(pidfile) = &turn.pidfile {
        if let Err(e) = std::fs::write(pidfile, format!("{}\n", std::process::id())) {
            tracing::warn!(pidfile = %pidfile.display(), "cannot write pidfile: {e}");
        }
    }
    if let Some(certs) = certs {
        if certs.files().watch {
            let counters = certwatch::Counters::new(
                metrics.tls_reloads.clone(),
                metrics.tls_reload_failures.clone(),
            );
            tokio::spawn(certwatch::watch(
                Arc::clone(&certs),
                counters,
                certwatch::Timing::DEFAULT,
            ));
        }
        tokio::spawn(reload_certificates(handle.clone(), certs, metrics.clone()));
    }
    let listening = (
        running.udp.clone(),
        running.udp_workers,
        running.tcp.clone(),
        running.tls.clone(),
    );
    // After the exit decision (and the TCP/TLS connections' tasks), within the time left.
    daemon.on_exit("allocations-and-io-threads", move |left| {
        running.end_within(left)
    });
    daemon.ready();
    let (udp, udp_threads, tcp, tls) = listening;
    tracing::info!(
        udp = ?udp,
        udp_threads,
        tcp = ?tcp,
        tls = ?tls,
        relay_ports = %format!("{}-{}", turn.min_port, turn.max_port),
        admin = ?admin.local_addr(),
        realm = %turn.realm,
        "lastcall-turn listening"
    );
    let served = daemon.serve().await;
    if let Some(pidfile) = &turn.pidfile {
        let _ = std::fs::remove_file(pidfile);
    }
    served.exit_code()
}

/// Reloads the certificate on SIGUSR2 (coturn's) and SIGHUP; a failed reload keeps the old one.
async fn reload_certificates(handle: lastcall::Handle, certs: Arc<Certs>, metrics: Metrics) {
    let mut reloads = handle.reloads();
    while reloads.changed().await.is_ok() {
        match certs.reload() {
            Ok(()) => {
                metrics.tls_reloads.inc();
                tracing::info!("TLS certificate reloaded");
            }
            Err(e) => {
                metrics.tls_reload_failures.inc();
                tracing::error!("TLS certificate reload failed, keeping the previous one: {e}");
            }
        }
    }
}
