//! `lastcall-turnload`: a microsecond-resolution TURN load generator.
//!
//! It speaks TURN itself (long-term authentication with TURN REST API credentials: username
//! `expiry:user`, password base64(HMAC-SHA1(secret, username)); Allocate, CreatePermission,
//! ChannelBind, Refresh), and every datagram carries its send time, which comes back to the
//! sender through an echo peer.
//!
//! - `relay`: many allocations relay ChannelData to the echo peer and back at fixed offered
//!   rates from one thread (`sendmmsg`/`recvmmsg` over many sockets, paced; the kernel's
//!   receive timestamps time the round trips): a ladder, then a bisection for the highest rate
//!   under the loss threshold; each phase reports sent/received/lost, round-trip p50/p99 and
//!   the CPU time of every process on the path (`--cpu NAME=PID`, the generator, the echo,
//!   the kernel's softirq threads).
//! - `direct`: the same straight to the echo: the machine's own reference (with `reflect`,
//!   the kernel's).
//! - `sink`: the same load into a tc drop on `lo`: what the generator offers from one core
//!   when nothing comes back (the `kernel` feature).
//! - `echo`: the echo peer, a process of its own so that its CPU is its own.
//! - `reflect`: the kernel echo (a tc program; the `kernel` feature).
//! - `hold`: opens N allocations from N client 5-tuples (each with its own 401 round trip),
//!   reports allocations per second and, with `--rss-pid`, the server's resident memory per
//!   allocation (`VmRSS` delta / N), then holds them (refreshing) and deletes them; with
//!   `--lt-user` as long-term users (`user=` lines or a user database) instead.
//!
//! Output: one JSON object per line on stdout (for `bench/turn/run.sh`), progress on stderr.
//! Loopback (or the project's test hosts) only: this is a load generator.
#![forbid(unsafe_code)]

mod client;
mod echo;
mod engine;
mod histogram;
mod hold;
mod procfs;
mod relay;
mod sink;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "lastcall-turnload", version, about)]
struct Cli {
    /// The TURN server's UDP address.
    #[arg(long, default_value = "127.0.0.1:3478")]
    server: SocketAddr,
    /// The server's `static-auth-secret` (TURN REST API).
    #[arg(long, default_value = "SECRET")]
    secret: String,
    /// Clock ticks per second of /proc/PID/stat (`getconf CLK_TCK`).
    #[arg(long, default_value_t = 100)]
    clk_tck: u64,
    /// The server's PID: its CPU time is reported (as `server`).
    #[arg(long)]
    cpu_pid: Option<u32>,
    /// Another process whose CPU time each phase reports, as NAME=PID (repeatable).
    #[arg(long, value_parser = parse_named_pid)]
    cpu: Vec<(String, u32)>,
    #[command(subcommand)]
    cmd: Cmd,
}

fn parse_named_pid(s: &str) -> Result<(String, u32), String> {
    let (name, pid) = s.split_once('=').ok_or("NAME=PID")?;
    Ok((
        name.to_string(),
        pid.parse().map_err(|e| format!("{pid}: {e}"))?,
    ))
}

/// The load's shape, common to `relay` and `direct`.
#[derive(clap::Args, Debug)]
struct Load {
    /// The echo peer's address (default: an echo process of our own).
    #[arg(long)]
    peer: Option<SocketAddr>,
    /// Sockets the load is spread over (allocations through the server).
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Payload bytes per datagram (at least 24, the timestamp).
    #[arg(long, default_value_t = 160)]
    size: usize,
    /// Seconds per rate.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Offered rates in datagrams per second (client -> peer), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    rates: Vec<f64>,
    /// Bisection steps between the best passing and the lowest failing rate.
    #[arg(long, default_value_t = 0)]
    search_steps: u32,
    /// A phase passes under this loss (percent) if the rate was offered.
    #[arg(long, default_value_t = 0.1)]
    loss_threshold: f64,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// ChannelData through the relay to the echo peer and back at fixed offered rates.
    Relay(Load),
    /// The same straight to the echo peer (no server): the machine's own reference.
    Direct(Load),
    /// The same load into a tc drop on `lo` (nothing comes back): what the generator offers
    /// from its core, sending alone (the `kernel` feature; root). `--peer` is not used.
    Sink {
        #[command(flatten)]
        load: Load,
        /// The interface the drop is attached to.
        #[arg(long, default_value = "lo")]
        iface: String,
    },
    /// The echo peer: every datagram back to its sender.
    Echo {
        /// Address to bind (port 0: any; printed as `echo ADDR`).
        #[arg(long, default_value = "127.0.0.1:0")]
        bind: SocketAddr,
        /// Read what arrived every this many µs instead of blocking while idle (0: block).
        #[arg(long, default_value_t = 0)]
        poll_us: u64,
    },
    /// The kernel echo: a tc program reflecting UDP datagrams to PORT (the `kernel` feature).
    Reflect {
        /// The UDP port reflected.
        #[arg(long)]
        port: u16,
        /// The interface it is attached to.
        #[arg(long, default_value = "lo")]
        iface: String,
    },
    /// Open N allocations, report allocations/s and RSS per allocation, hold, delete.
    Hold {
        /// Allocations to open.
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// Allocations being set up at once (threads).
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Requested allocation lifetime (seconds).
        #[arg(long, default_value_t = 600)]
        lifetime: u32,
        /// Seconds to keep them once all are up.
        #[arg(long, default_value_t = 1.0)]
        hold: f64,
        /// Refresh every allocation this often while holding (seconds).
        #[arg(long, default_value_t = 60.0)]
        refresh: f64,
        /// Leave the allocations to expire instead of deleting them at the end.
        #[arg(long)]
        no_release: bool,
        /// Measure this process's VmRSS before and after.
        #[arg(long)]
        rss_pid: Option<u32>,
        /// Long-term users instead of TURN REST API credentials: allocation i authenticates
        /// as PREFIX(i mod --lt-users) with --lt-password (a `user=` line, a user database).
        #[arg(long, value_name = "PREFIX")]
        lt_user: Option<String>,
        /// How many distinct long-term users (1: every allocation is the same user).
        #[arg(long, default_value_t = 1)]
        lt_users: usize,
        /// The long-term users' password.
        #[arg(long, default_value = "")]
        lt_password: String,
    },
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::from_secs(1))
}

fn relay_opts(
    cli: &Cli,
    load: &Load,
    server: Option<SocketAddr>,
) -> Result<relay::RelayOpts, String> {
    if load.clients == 0 || load.rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
        return Err("--clients must be > 0 and --rates positive".into());
    }
    let mut cpu = cli.cpu.clone();
    if let Some(pid) = cli.cpu_pid {
        cpu.insert(0, ("server".into(), pid));
    }
    Ok(relay::RelayOpts {
        server,
        secret: cli.secret.clone(),
        peer: load.peer,
        clients: load.clients,
        size: load.size.max(engine::STAMP_LEN),
        duration: secs(load.duration),
        rates: load.rates.clone(),
        search_steps: load.search_steps,
        loss_threshold_pct: load.loss_threshold,
        cpu,
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.cmd {
        Cmd::Relay(load) | Cmd::Direct(load) => {
            let server = matches!(cli.cmd, Cmd::Relay(_)).then_some(cli.server);
            match relay_opts(&cli, load, server) {
                Ok(o) => relay::run(&o),
                Err(e) => {
                    eprintln!("lastcall-turnload: {e}");
                    return ExitCode::from(64);
                }
            }
        }
        Cmd::Sink { load, iface } => match relay_opts(&cli, load, None) {
            Ok(o) if o.peer.is_none() => sink::run(&o, iface),
            Ok(_) => {
                eprintln!("lastcall-turnload: sink sends to its own dropped port, not --peer");
                return ExitCode::from(64);
            }
            Err(e) => {
                eprintln!("lastcall-turnload: {e}");
                return ExitCode::from(64);
            }
        },
        Cmd::Echo { bind, poll_us } => echo::run(
            *bind,
            (*poll_us > 0).then(|| Duration::from_micros(*poll_us)),
        ),
        Cmd::Reflect { port, iface } => echo::reflect(iface, *port),
        Cmd::Hold {
            count,
            concurrency,
            lifetime,
            hold,
            refresh,
            no_release,
            rss_pid,
            lt_user,
            lt_users,
            lt_password,
        } => hold::run(&hold::HoldOpts {
            server: cli.server,
            secret: cli.secret.clone(),
            count: *count,
            concurrency: *concurrency,
            lifetime: *lifetime,
            hold: secs(*hold),
            refresh: secs(refresh.max(1.0)),
            release: !no_release,
            rss_pid: *rss_pid,
            cpu_pid: cli.cpu_pid,
            clk_tck: cli.clk_tck,
            long_term: lt_user.clone().map(|prefix| hold::LongTerm {
                prefix,
                users: (*lt_users).max(1),
                password: lt_password.clone(),
            }),
        }),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lastcall-turnload: {e:#}");
            ExitCode::FAILURE
        }
    }
}
