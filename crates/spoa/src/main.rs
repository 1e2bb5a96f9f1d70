//! `lastcall-spoa`: an HAProxy SPOE agent running ModSecurity with the OWASP Core Rule Set,
//! a drop-in for coraza-spoa that drains gracefully on SIGTERM (see `docs/spoa.md`).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use lastcall::{Defaults, Lifecycle, LogArgs, TerminationArgs};
use lastcall_modsec::ModSecurity;
use lastcall_spoa::config::{Bind, Config};
use lastcall_spoa::metrics::Metrics;
use lastcall_spoa::server::{self, Limits, Listener, Shared};
use lastcall_spoa::waf::{Apps, Waf};

/// HAProxy SPOE agent running ModSecurity + OWASP CRS (drop-in for coraza-spoa).
#[derive(Debug, Parser)]
#[command(name = "lastcall-spoa", version, about)]
struct Cli {
    /// coraza-spoa YAML configuration; without it, one application (`default`) runs
    /// Debian's OWASP CRS at paranoia level 1
    #[arg(long, short = 'c', env = "LASTCALL_SPOA_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Load the configuration and compile the rules, then exit 0 (valid) or 64 (errors)
    #[arg(long)]
    validate: bool,

    /// Listen here instead of the file's `bind` (host:port or unix:///path)
    #[arg(long, env = "LASTCALL_SPOA_BIND", value_name = "ADDR")]
    bind: Option<String>,

    #[command(flatten)]
    term: TerminationArgs,

    #[command(flatten)]
    log: LogArgs,
}

/// SPOA defaults. HAProxy needs `fall x inter` (2 x 1s in the documented config) after the
/// first refused health check to mark this agent DOWN, so Announcing lasts 5s; SPOE
/// evaluations take milliseconds and idle connections are closed as soon as Refusing starts,
/// so 25s to the deadline is plenty and ends inside Kubernetes' default 30s grace period.
fn defaults() -> Defaults {
    Defaults {
        shutdown_delay: Duration::from_secs(5),
        drain_timeout: Duration::from_secs(25),
        drain_min_sessions: 0,
        admin_addr: Some(std::net::SocketAddr::from(([0, 0, 0, 0], 9901))),
    }
}

fn main() -> ExitCode {
    let cli: Cli = lastcall::parse_cli(&defaults());
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("lastcall-spoa: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Everything that can be wrong with the command line and the file, at once.
fn load(cli: &Cli) -> Result<(lastcall::TerminationConfig, Config, Apps), Vec<String>> {
    let mut problems = Vec::new();
    let term = cli
        .term
        .resolve(&defaults())
        .map_err(|e| problems.extend(e.problems))
        .ok();
    let mut cfg = match &cli.config {
        None => Some(Config::builtin()),
        Some(path) => match Config::load(path) {
            Ok(c) => Some(c),
            Err(e) => {
                problems.extend(e.to_string().lines().map(str::to_owned));
                None
            }
        },
    };
    if let (Some(b), Some(cfg)) = (&cli.bind, cfg.as_mut()) {
        match Bind::parse(b) {
            Ok(bind) => cfg.bind = bind,
            Err(e) => problems.push(format!("--bind: {e}")),
        }
    }
    let apps = cfg.as_ref().and_then(|c| match Apps::compile(c) {
        Ok(a) => Some(a),
        Err(errs) => {
            problems.extend(errs);
            None
        }
    });
    match (term, cfg, apps) {
        (Some(t), Some(c), Some(a)) if problems.is_empty() => Ok((t, c, a)),
        _ => Err(problems),
    }
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    let (term, cfg, apps) = match load(&cli) {
        Ok(x) => x,
        Err(problems) => {
            eprintln!("lastcall-spoa: configuration errors:");
            for p in problems {
                eprintln!("  - {p}");
            }
            return Ok(lastcall::exit::CONFIG);
        }
    };
    if cli.validate {
        println!(
            "configuration OK: {} application(s), {} rules, bind {}",
            cfg.applications.len(),
            apps.rule_count(),
            cfg.bind
        );
        return Ok(0);
    }
    let log = effective_log_args(&cli.log, &cfg);
    lastcall::logging::init(&log);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?
        .block_on(serve(cli, term, cfg, apps))
}

/// The file's `log_level`/`log_format` apply unless given on the command line or in the
/// environment.
fn effective_log_args(cli: &LogArgs, cfg: &Config) -> LogArgs {
    let given = |flag: &str, env: &str| {
        std::env::var_os(env).is_some()
            || std::env::args().any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    let mut log = cli.clone();
    if let Some(level) = &cfg.log_level {
        if !given("--log-level", "LASTCALL_LOG_LEVEL") {
            log.log_level = level.clone();
        }
    }
    if let Some(json) = cfg.log_json {
        if !given("--log-format", "LASTCALL_LOG_FORMAT") {
            log.log_format = if json {
                lastcall::LogFormat::Json
            } else {
                lastcall::LogFormat::Text
            };
        }
    }
    log
}

async fn serve(
    cli: Cli,
    term: lastcall::TerminationConfig,
    cfg: Config,
    apps: Apps,
) -> anyhow::Result<i32> {
    let metrics = Arc::new(Metrics::default());
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let lifecycle = Lifecycle::new(term);
    lifecycle.register_metrics(&mut registry);
    let handle = lifecycle.handle();

    let engine = ModSecurity::new().context("starting libmodsecurity")?;
    tracing::info!(
        "{} application(s), {} rules compiled",
        cfg.applications.len(),
        apps.rule_count()
    );
    let waf = Arc::new(Waf::new(engine, apps, Arc::clone(&metrics)));

    let listener = Listener::bind(&cfg.bind)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.bind))?;
    let _admin = lastcall::admin::serve(&handle, Arc::new(registry)).await?;
    tracing::info!(
        "listening on {} (SPOP; max-frame-size {}, {} workers)",
        listener.local_addr(),
        cfg.max_frame_size,
        cfg.workers
    );

    let limits = Limits {
        max_frame_size: cfg.max_frame_size,
        max_inflight_per_connection: cfg.max_inflight_per_connection,
        ..Limits::default()
    };
    let handler: Arc<dyn lastcall_spoa::waf::Handler> = waf.clone();
    let shared = Shared::new(
        handler,
        Arc::clone(&metrics),
        handle.clone(),
        cfg.workers,
        limits,
    );
    let server = tokio::spawn(server::serve(listener, shared));
    tokio::spawn(reload_loop(
        handle.clone(),
        cli.config.clone(),
        Arc::clone(&waf),
        Arc::clone(&metrics),
    ));
    let sweeper = Arc::clone(&waf);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            let w = Arc::clone(&sweeper);
            let _ = tokio::task::spawn_blocking(move || w.expire()).await;
        }
    });

    let outcome = lifecycle.run().await;
    let _ = tokio::time::timeout(Duration::from_secs(3), server).await;
    Ok(outcome.exit_code())
}

/// SIGHUP: re-read the file, recompile every application, swap all at once. A failed reload
/// keeps the running rules.
async fn reload_loop(
    handle: lastcall::Handle,
    path: Option<PathBuf>,
    waf: Arc<Waf>,
    metrics: Arc<Metrics>,
) {
    let mut reloads = handle.reloads();
    while reloads.changed().await.is_ok() {
        let path = path.clone();
        let result = tokio::task::spawn_blocking(move || {
            let cfg = match &path {
                Some(p) => Config::load(p).map_err(|e| e.to_string())?,
                None => Config::builtin(),
            };
            let apps = Apps::compile(&cfg).map_err(|e| e.join("; "))?;
            Ok::<_, String>((cfg, apps))
        })
        .await
        .unwrap_or_else(|e| Err(format!("reload task failed: {e}")));
        match result {
            Ok((cfg, apps)) => {
                let rules = apps.rule_count();
                waf.swap(apps);
                metrics.reload(true);
                tracing::info!(
                    "rules reloaded: {} application(s), {rules} rules (bind and limits need a restart)",
                    cfg.applications.len()
                );
            }
            Err(e) => {
                metrics.reload(false);
                tracing::error!("reload failed, keeping the running rules: {e}");
            }
        }
    }
}
