//! `lastcall-turn`: a TURN/STUN relay that reads coturn's configuration and drains on SIGTERM.
#![forbid(unsafe_code)]

use std::sync::Arc;

use lastcall::Daemon;
use lastcall_turn::config::{self, Parsed, Settings};
use lastcall_turn::listen;
use lastcall_turn::metrics::Metrics;
use lastcall_turn::server;
use lastcall_turn::tls::Certs;

fn main() {
    let settings = match config::parse(std::env::args()) {
        Ok(Parsed::Run(s)) => *s,
        Ok(Parsed::Print(text)) => {
            print!("{text}");
            std::process::exit(0);
        }
        Err(problems) => problems.exit("lastcall-turn"),
    };
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
    let code = runtime.block_on(run(settings));
    std::process::exit(code);
}

/// Serves until the lifecycle says to leave; returns the exit status.
async fn run(settings: Settings) -> i32 {
    let Settings {
        turn,
        certs,
        term,
        log,
        warnings,
    } = settings;
    lastcall::logging::init(&log);
    for w in &warnings {
        tracing::warn!("{w}");
    }
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
    running.register_metrics(&mut registry, &turn.realm);
    let admin = match lastcall::admin::serve(&handle, Arc::new(registry)).await {
        Ok(a) => a,
        Err(e) => {
            tracing::error!("{e}");
            return lastcall::exit::OS_ERROR;
        }
    };
    if let Some(pidfile) = &turn.pidfile {
        if let Err(e) = std::fs::write(pidfile, format!("{}\n", std::process::id())) {
            tracing::warn!(pidfile = %pidfile.display(), "cannot write pidfile: {e}");
        }
    }
    if let Some(certs) = certs {
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
            Ok(()) => tracing::info!("TLS certificate reloaded"),
            Err(e) => {
                metrics.tls_reload_failures.inc();
                tracing::error!("TLS certificate reload failed, keeping the previous one: {e}");
            }
        }
    }
}
