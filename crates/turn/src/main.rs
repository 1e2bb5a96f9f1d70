//! `lastcall-turn`: a TURN/STUN relay that reads coturn's configuration and drains on SIGTERM.
#![forbid(unsafe_code)]

use std::sync::Arc;

use lastcall::Lifecycle;
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
    let ips = match listen::listening_addresses(&turn) {
        Ok(ips) => ips,
        Err(e) => {
            tracing::error!("{e}");
            return lastcall::exit::OS_ERROR;
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
                return lastcall::exit::OS_ERROR;
            }
        };
    running.register_metrics(&mut registry, &turn.realm);
    let admin = match lastcall::admin::serve(&handle, Arc::new(registry)).await {
        Ok(a) => Some(a),
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
