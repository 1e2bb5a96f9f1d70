//! `lastcall-turn`: a TURN/STUN relay that reads coturn's configuration and drains on SIGTERM.
#![forbid(unsafe_code)]

use std::sync::Arc;

use lastcall::Lifecycle;
use lastcall_turn::config::{self, Parsed, Settings};
use lastcall_turn::listen;
use lastcall_turn::metrics::Metrics;
use lastcall_turn::server;
use lastcall_turn::tls::Certs;

/// Exit status when a socket cannot be bound (EX_OSERR).
const EXIT_BIND: i32 = 71;

fn main() {
    let settings = match config::parse(std::env::args()) {
        Ok(Parsed::Run(s)) => *s,
        Ok(Parsed::Print(text)) => {
            print!("{text}");
            std::process::exit(0);
        }
        Err(errors) => config_exit(errors.0.iter().map(ToString::to_string)),
    };
    // Certificates are configuration too: a bad one is reported before any port is bound.
    let certs = match (&settings.turn.cert, &settings.turn.pkey) {
        (Some(cert), Some(key)) if !settings.turn.no_tls => {
            match Certs::load(cert, key, settings.turn.tls13_only) {
                Ok(c) => Some(Arc::new(c)),
                Err(e) => config_exit(std::iter::once(format!("cert/pkey: {e}"))),
            }
        }
        _ => None,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lastcall-turn: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(run(settings, certs));
    std::process::exit(code);
}

fn config_exit(problems: impl Iterator<Item = String>) -> ! {
    eprintln!("lastcall-turn: configuration errors:");
    for p in problems {
        eprintln!("  - {p}");
    }
    std::process::exit(lastcall::exit::CONFIG);
}

async fn run(settings: Settings, certs: Option<Arc<Certs>>) -> i32 {
    let Settings { turn, term, log } = settings;
    lastcall::logging::init(&log);
    if let Some(file) = turn.log_file.as_deref() {
        if !matches!(file, "stdout" | "stderr" | "-" | "syslog") {
            tracing::warn!(log_file = file, "log-file is ignored: logs go to stderr");
        }
    }
    if !turn.no_tls && certs.is_none() {
        tracing::info!("no cert/pkey: the TLS listener is off");
    }
    if turn.allow_loopback_peers {
        tracing::warn!(
            "allow-loopback-peers is on: clients can reach this host's own services (tests only)"
        );
    }
    let ips = match listen::listening_addresses(&turn) {
        Ok(ips) => ips,
        Err(e) => {
            tracing::error!("{e}");
            return EXIT_BIND;
        }
    };
    let lifecycle = Lifecycle::new(term);
    let handle = lifecycle.handle();
    let mut registry = prometheus_client::registry::Registry::default();
    lifecycle.register_metrics(&mut registry);
    let metrics = Metrics::default();
    metrics.register(&mut registry);

    let mut running =
        match server::start(&turn, &ips, certs.clone(), metrics.clone(), handle.clone()) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("{e}");
                return EXIT_BIND;
            }
        };
    running.register_metrics(&mut registry, &turn.realm);
    let admin = match lastcall::admin::serve(&handle, Arc::new(registry)).await {
        Ok(a) => Some(a),
        Err(e) => {
            tracing::error!("{e}");
            return EXIT_BIND;
        }
    };
    if let Some(pidfile) = &turn.pidfile {
        if let Err(e) = std::fs::write(pidfile, format!("{}\n", std::process::id())) {
            tracing::warn!(pidfile = %pidfile.display(), "cannot write pidfile: {e}");
        }
    }
    tracing::info!(
        udp = ?running.udp,
        udp_threads = running.udp_workers,
        tcp = ?running.tcp,
        tls = ?running.tls,
        relay_ports = %format!("{}-{}", turn.min_port, turn.max_port),
        admin = ?admin.as_ref().and_then(|a| a.local_addr()),
        realm = %turn.realm,
        "lastcall-turn listening"
    );
    if let Some(certs) = certs {
        tokio::spawn(reload_on_sighup(handle.clone(), certs, metrics.clone()));
    }

    let outcome = lifecycle.run().await;
    let left = running.shared.allocations();
    if left > 0 {
        tracing::info!(allocations = left, "ending the remaining allocations");
    }
    running.shared.clear();
    // The I/O threads finish the batch in hand (its responses are sent) and stop.
    running.stop_workers();
    if let Some(pidfile) = &turn.pidfile {
        let _ = std::fs::remove_file(pidfile);
    }
    outcome.exit_code()
}

/// Reloads the certificate on SIGHUP; a failed reload keeps the old one.
async fn reload_on_sighup(handle: lastcall::Handle, certs: Arc<Certs>, metrics: Metrics) {
    let mut reloads = handle.reloads();
    while reloads.changed().await.is_ok() {
        match certs.reload() {
            Ok(()) => tracing::info!("TLS certificate reloaded"),
            Err(e) => {
                metrics.tls_reload_failures.inc();
                tracing::error!("TLS certificate reload failed, keeping the previous one: {e}");
            }
        }
    }
}
