//! A TCP echo server built on the `lastcall` lifecycle: each connection is a session.
//!
//! ```text
//! cargo run -p lastcall --example echo -- --listen 127.0.0.1:7007 --admin-addr 127.0.0.1:9090
//! ```
//!
//! Defaults: `--listen 127.0.0.1:7007`, `--shutdown-delay 2s`, `--drain-timeout 25s` (under a
//! Kubernetes default grace period of 30 s), `--drain-min-sessions 0`,
//! `--admin-addr 127.0.0.1:9090`. In Refusing the listener is closed, so new connections are
//! refused by the kernel; open connections keep echoing until the client closes them, or
//! until the exit is decided (the deadline, a forced exit), when they are closed.
//!
//! Two options stand in for a real daemon's start-up and exit work, to try the lifecycle:
//! `--startup-work DURATION` (readiness stays 503 that long after the admin listener is up;
//! a drain trigger meanwhile ends the process at once) and `--exit-work DURATION` (an exit
//! hook that takes that long, ignoring the time it is given, like an evaluation that cannot
//! be interrupted: the process still leaves by the deadline plus `lastcall::EXIT_GRACE`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use lastcall::{AcceptUntil, Daemon, Defaults, LogArgs, PeerId, Problem, TerminationArgs, Watch};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// TCP echo server that drains gracefully (a lastcall example).
#[derive(Debug, Parser)]
#[command(name = "echo")]
struct Cli {
    /// Address to listen on for echo connections
    #[arg(
        long,
        env = "ECHO_LISTEN",
        default_value = "127.0.0.1:7007",
        value_name = "ADDR"
    )]
    listen: SocketAddr,

    /// Pretend start-up takes this long after the admin listener is up (readiness 503 meanwhile)
    #[arg(long, value_name = "DURATION", default_value = "0")]
    startup_work: String,

    /// Pretend the exit needs a blocking job that takes this long (and cannot be interrupted)
    #[arg(long, value_name = "DURATION", default_value = "0")]
    exit_work: String,

    #[command(flatten)]
    term: TerminationArgs,

    #[command(flatten)]
    log: LogArgs,
}

fn defaults() -> Defaults {
    Defaults {
        shutdown_delay: Duration::from_secs(2),
        drain_timeout: Duration::from_secs(25),
        drain_min_sessions: 0,
        admin_addr: Some(SocketAddr::from(([127, 0, 0, 1], 9090))),
    }
}

/// The validated command line.
struct Settings {
    term: lastcall::TerminationConfig,
    startup_work: Duration,
    exit_work: Duration,
}

/// Every problem of the command line at once: the termination options' and echo's own.
fn settings(cli: &Cli) -> Result<Settings, lastcall::Problems> {
    let mut problems = lastcall::Problems::new();
    let mut duration = |flag: &str, text: &str| {
        lastcall::duration::parse(text).unwrap_or_else(|err| {
            problems.push(Problem::new(flag, err.to_string()).value(text));
            Duration::ZERO
        })
    };
    let startup_work = duration("--startup-work", &cli.startup_work);
    let exit_work = duration("--exit-work", &cli.exit_work);
    let term = cli
        .term
        .validate(&defaults())
        .map_err(|p| problems.extend(p));
    match term {
        Ok(term) => problems.into_result(Settings {
            term,
            startup_work,
            exit_work,
        }),
        Err(()) => Err(problems),
    }
}

#[tokio::main]
async fn main() {
    let cli: Cli = lastcall::parse_cli(&defaults());
    let settings = settings(&cli).unwrap_or_else(|problems| problems.exit("echo"));
    lastcall::logging::init(&cli.log);
    // Starting from here: signals are handled, readiness is 503.
    let mut daemon = Daemon::start(settings.term);
    let mut registry = prometheus_client::registry::Registry::default();
    daemon.register_metrics(&mut registry);
    let handle = daemon.handle().clone();
    let admin = match lastcall::admin::serve(&handle, Arc::new(registry)).await {
        Ok(admin) => admin,
        Err(err) => {
            eprintln!("echo: {err}");
            std::process::exit(lastcall::exit::OS_ERROR);
        }
    };
    if !settings.startup_work.is_zero() {
        tracing::info!("start-up work for {:?}", settings.startup_work);
        tokio::select! {
            () = tokio::time::sleep(settings.startup_work) => {}
            // A drain trigger with nothing live: the exit is decided, leave without binding.
            () = handle.exiting() => daemon.serve().await.exit(),
        }
    }
    let listener = match TcpListener::bind(cli.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("echo: cannot listen on {}: {err}", cli.listen);
            std::process::exit(lastcall::exit::OS_ERROR);
        }
    };
    let local = listener.local_addr().unwrap_or(cli.listen);
    daemon.accept(listener, AcceptUntil::Refusing, |(stream, peer), watch| {
        echo(stream, peer, watch)
    });
    if !settings.exit_work.is_zero() {
        let work = settings.exit_work;
        daemon.on_exit("exit-work", move |_budget| {
            std::thread::sleep(work);
            true
        });
    }
    daemon.ready();
    let admin = admin
        .local_addr()
        .map_or_else(|| "off".to_string(), |a| a.to_string());
    tracing::info!("echo listening on {local} (admin {admin})");
    daemon.serve().await.exit()
}

/// One session: echoes until the client closes (or an error), or until the exit is decided.
async fn echo(mut stream: TcpStream, peer: SocketAddr, mut watch: Watch) {
    let _session = watch.handle().session(PeerId::from(peer));
    let mut buf = vec![0u8; 16 * 1024];
    while !watch.is_exiting() {
        let n = tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = watch.changed() => continue,
        };
        let Some(data) = buf.get(..n) else { return };
        if stream.write_all(data).await.is_err() {
            return;
        }
    }
}
