//! `lastcall-turnload`: a microsecond-resolution TURN load generator.
//!
//! It speaks TURN itself (long-term authentication with TURN REST API credentials: username
//! `expiry:user`, password base64(HMAC-SHA1(secret, username)); Allocate, CreatePermission,
//! ChannelBind, Refresh) and owns its UDP echo peer, so every relayed datagram carries a
//! microsecond send timestamp that comes back to the sender.
//!
//! - `relay`: a few allocations relay ChannelData to the echo peer and back at fixed offered
//!   rates (a ladder, then a bisection for the highest rate under the loss threshold); each
//!   phase reports sent/received/lost, round-trip p50/p99, the latency the relay *adds*
//!   over a direct-echo baseline at the same rate, and, with `--cpu-pid`, the server's CPU
//!   seconds per million relayed datagrams (utime+stime from `/proc/PID/stat`).
//! - `hold`: opens N allocations from N client 5-tuples (each with its own 401 round trip),
//!   reports allocations per second and, with `--rss-pid`, the server's resident memory per
//!   allocation (`VmRSS` delta / N), then holds them (refreshing) and deletes them; with
//!   `--lt-user` as long-term users (`user=` lines or a user database) instead.
//!
//! Output: one JSON object per line on stdout (for `bench/turn/run.sh`), progress on stderr.
//! Loopback (or the project's test hosts) only: this is a load generator.
#![forbid(unsafe_code)]

mod client;
mod histogram;
mod hold;
mod procfs;
mod relay;

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
    /// Measure this process's CPU time (utime+stime) over each phase.
    #[arg(long)]
    cpu_pid: Option<u32>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// ChannelData through the relay to our echo peer and back at fixed offered rates.
    Relay {
        /// Allocations (client sockets) the load is spread over.
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// Payload bytes per datagram (at least 24, the timestamp).
        #[arg(long, default_value_t = 160)]
        size: usize,
        /// Seconds per rate.
        #[arg(long, default_value_t = 5.0)]
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
        /// Skip the direct-echo baseline (then no added latency is reported).
        #[arg(long)]
        no_baseline: bool,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Relay {
            clients,
            size,
            duration,
            rates,
            search_steps,
            loss_threshold,
            no_baseline,
        } => {
            if clients == 0 || rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
                eprintln!("lastcall-turnload: --clients must be > 0 and --rates positive");
                return ExitCode::from(64);
            }
            relay::run(&relay::RelayOpts {
                server: cli.server,
                secret: cli.secret,
                clients,
                size: size.max(relay::STAMP_LEN),
                duration: secs(duration),
                rates,
                search_steps,
                loss_threshold_pct: loss_threshold,
                baseline: !no_baseline,
                cpu_pid: cli.cpu_pid,
                clk_tck: cli.clk_tck,
            })
        }
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
            secret: cli.secret,
            count,
            concurrency,
            lifetime,
            hold: secs(hold),
            refresh: secs(refresh.max(1.0)),
            release: !no_release,
            rss_pid,
            cpu_pid: cli.cpu_pid,
            clk_tck: cli.clk_tck,
            long_term: lt_user.map(|prefix| hold::LongTerm {
                prefix,
                users: lt_users.max(1),
                password: lt_password,
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
