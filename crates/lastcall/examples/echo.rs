//! A TCP echo server built on the `lastcall` lifecycle: each connection is a session.
//!
//! ```text
//! cargo run -p lastcall --example echo -- --listen 127.0.0.1:7007 --admin-addr 127.0.0.1:9090
//! ```
//!
//! Defaults: `--listen 127.0.0.1:7007`, `--shutdown-delay 2s`, `--drain-timeout 25s` (under a
//! Kubernetes default grace period of 30 s), `--drain-min-sessions 0`,
//! `--admin-addr 127.0.0.1:9090`. In Refusing the listener is closed, so new connections are
//! refused by the kernel; open connections keep echoing until the client closes them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use lastcall::{Defaults, Handle, Lifecycle, LogArgs, PeerId, TerminationArgs};
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

#[tokio::main]
async fn main() {
    let cli: Cli = lastcall::parse_cli(&defaults());
    let term = match cli.term.resolve(&defaults()) {
        Ok(term) => term,
        Err(err) => {
            eprintln!("echo: {err}");
            std::process::exit(lastcall::exit::CONFIG);
        }
    };
    lastcall::logging::init(&cli.log);
    let lifecycle = Lifecycle::new(term);
    let mut registry = prometheus_client::registry::Registry::default();
    lifecycle.register_metrics(&mut registry);
    let handle = lifecycle.handle();

    let listener = match TcpListener::bind(cli.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("echo: cannot listen on {}: {err}", cli.listen);
            std::process::exit(1);
        }
    };
    let admin = match lastcall::admin::serve(&handle, Arc::new(registry)).await {
        Ok(admin) => admin,
        Err(err) => {
            eprintln!("echo: {err}");
            std::process::exit(1);
        }
    };
    let local = listener.local_addr().unwrap_or(cli.listen);
    let admin = admin
        .local_addr()
        .map_or_else(|| "off".to_string(), |a| a.to_string());
    tracing::info!("echo listening on {local} (admin {admin})");
    tokio::spawn(accept_loop(listener, handle.clone()));

    let outcome = lifecycle.run().await;
    std::process::exit(outcome.exit_code());
}

/// Accepts until Refusing starts, then closes the listener (new connections are refused).
async fn accept_loop(listener: TcpListener, handle: Handle) {
    let refusing = handle.refusing();
    tokio::pin!(refusing);
    loop {
        tokio::select! {
            () = &mut refusing => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let guard = handle.session(PeerId::from(peer));
                    tokio::spawn(async move {
                        echo(stream).await;
                        drop(guard);
                    });
                }
                Err(err) => {
                    tracing::warn!("accept failed: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(listener);
    tracing::info!("listener closed: new connections are refused");
}

/// Echoes until the client closes (or an error).
async fn echo(mut stream: TcpStream) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let Some(data) = buf.get(..n) else { return };
        if stream.write_all(data).await.is_err() {
            return;
        }
    }
}
