//! `lastcall-demo`: shows the whole mission on loopback in under two minutes, with nothing to
//! configure.
//!
//! It starts an origin (in-process), HAProxy 2.6 in front of it with two `lastcall-spoa`
//! agents running the OWASP CRS (the fail-closed configuration of `docs/spoa.md`), coturn's
//! `turnutils_peer` and `lastcall-turn`; shows a benign request passing, an attack blocked
//! with its rule id, and a TURN call relayed by coturn's `turnutils_uclient`; rolls both agents
//! under steady HTTP load and drains the TURN server under a live call, with a progress line;
//! prints a summary; stops everything it started (also on Ctrl-C). Any step that does not
//! behave (a failed request, a lost packet, a daemon that does not leave) ends the demo with
//! a non-zero status and a message naming the step and what broke.
//!
//! Exit statuses: 0 success, 1 a step failed, 64 usage error, 130 interrupted.

#![forbid(unsafe_code)]

mod demo;
mod net;
mod procs;
mod timeline;
mod ui;

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;

/// The two-minute lastcall demo: WAF agents rolled and a TURN server drained under live load.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Opts {
    /// The short variant (fewer requests and packets, shorter runs): what the test suite runs.
    #[arg(long)]
    pub fast: bool,
    /// The lastcall-spoa binary (default: next to this program).
    #[arg(long, value_name = "PATH")]
    pub spoa_bin: Option<PathBuf>,
    /// The lastcall-turn binary (default: next to this program).
    #[arg(long, value_name = "PATH")]
    pub turn_bin: Option<PathBuf>,
    /// HAProxy 2.6.
    #[arg(long, value_name = "PATH", default_value = "/usr/sbin/haproxy")]
    pub haproxy: PathBuf,
    /// coturn's TURN test client.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/usr/bin/turnutils_uclient"
    )]
    pub uclient: PathBuf,
    /// coturn's UDP echo peer.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/turnutils_peer")]
    pub peer: PathBuf,
    /// Keep the work directory (configurations and every process's log) at the end.
    #[arg(long)]
    pub keep: bool,
    /// Draw the rollout as a PNG: requests per second and failures, each daemon's sessions,
    /// each process's phase, signal and exit (Debian's python3-matplotlib).
    #[arg(long, value_name = "PNG")]
    pub timeline: Option<PathBuf>,
    /// Record what a Prometheus server would have scraped: every daemon's /metrics every
    /// 0.5 s (DIR/metrics.jsonl) and the timeline's data (DIR/timeline.json).
    #[arg(long, value_name = "DIR")]
    pub record: Option<PathBuf>,
}

fn main() {
    let opts = match Opts::try_parse() {
        Ok(o) => o,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            std::process::exit(if usage { 64 } else { 0 });
        }
    };
    let started = Instant::now();
    let registry = procs::Registry::default();
    if let Err(e) = install_signal_handlers(registry.clone()) {
        eprintln!("lastcall-demo: cannot install the Ctrl-C handler: {e:#}");
        std::process::exit(1);
    }
    let code = demo::main(&opts, &registry, started);
    std::process::exit(code);
}

/// First SIGINT/SIGTERM: every wait of the demo gives up and it stops what it started.
/// A second one: SIGKILL to every child process group, exit 130 at once.
fn install_signal_handlers(registry: procs::Registry) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut int, mut term) = {
        let _guard = rt.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        )
    };
    std::thread::spawn(move || {
        rt.block_on(async move {
            loop {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                if procs::INTERRUPTED.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    eprintln!("\nlastcall-demo: interrupted again: killing everything now");
                    registry.kill_all();
                    std::process::exit(130);
                }
                eprintln!(
                    "\nlastcall-demo: interrupted: stopping everything it started (again to kill at once)"
                );
            }
        });
    });
    Ok(())
}
