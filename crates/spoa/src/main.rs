//! `lastcall-spoa`: an HAProxy SPOE agent running ModSecurity with the OWASP Core Rule Set,
//! a drop-in for coraza-spoa that drains gracefully on SIGTERM (see `docs/spoa.md`).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use lastcall::{Defaults, Lifecycle, LogArgs, TerminationArgs};
use lastcall_modsec::ModSecurity;
use lastcall_spoa::config::{Bind, Config, Evaluation};
use lastcall_spoa::engine::{self, Limits, Listener, Shared};
use lastcall_spoa::metrics::Metrics;
use lastcall_spoa::waf::{Apps, Waf};

/// mimalloc for Rust's allocations; its `override` feature also makes it the process's
/// `malloc`, so libmodsecurity's many small C++ allocations (most of an evaluation's time
/// outside the regex engine) skip glibc's arenas. Measured in docs/benchmarks.md.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

/// The command line and the file, without compiling the rules (cheap: done before the signal
/// handlers exist). On errors, also returns the file if it loaded, so that the rules' own
/// errors can be reported with the others.
#[allow(clippy::type_complexity, clippy::result_large_err)]
fn load_options(
    cli: &Cli,
) -> Result<(lastcall::TerminationConfig, Config), (Vec<String>, Option<Config>)> {
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
    match (term, cfg) {
        (Some(t), Some(c)) if problems.is_empty() => Ok((t, c)),
        (_, cfg) => Err((problems, cfg)),
    }
}

/// Everything that can be wrong with the command line and the file, at once (the options,
/// the file, and every application's rules).
fn load(cli: &Cli) -> Result<(lastcall::TerminationConfig, Config, Apps), Vec<String>> {
    match load_options(cli) {
        Ok((term, cfg)) => Apps::compile(&cfg).map(|apps| (term, cfg, apps)),
        Err((mut problems, cfg)) => {
            if let Some(Err(errs)) = cfg.as_ref().map(Apps::compile) {
                problems.extend(errs);
            }
            Err(problems)
        }
    }
}

fn config_errors(problems: Vec<String>) -> i32 {
    eprintln!("lastcall-spoa: configuration errors:");
    for p in problems {
        eprintln!("  - {p}");
    }
    lastcall::exit::CONFIG
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    if cli.validate {
        let (_, cfg, apps) = match load(&cli) {
            Ok(x) => x,
            Err(problems) => return Ok(config_errors(problems)),
        };
        println!(
            "configuration OK: {} application(s), {} rules, bind {}",
            cfg.applications.len(),
            apps.rule_count(),
            cfg.bind
        );
        return Ok(0);
    }
    let (term, cfg) = match load_options(&cli) {
        Ok(x) => x,
        // Report the rules' errors too, all at once (nothing is bound yet).
        Err(_) => return Ok(config_errors(load(&cli).err().unwrap_or_default())),
    };
    let log = effective_log_args(&cli.log, &cfg);
    lastcall::logging::init(&log);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if cfg.evaluation == Evaluation::Inline {
        // Evaluations run on the I/O threads: `workers` of them bound how many run at once.
        builder.worker_threads(cfg.workers);
    }
    let runtime = builder
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = runtime.block_on(start(cli, term, cfg));
    let stopping = std::time::Instant::now();
    drop(runtime);
    tracing::debug!("runtime stopped in {} ms", stopping.elapsed().as_millis());
    result
}

/// Installs the signal handlers first (the lifecycle's, plus a watch for the start-up
/// window), then compiles the rules. A signal that ends the process, arriving while the rules
/// compile (50-200 ms per application), exits 0 after the application being compiled:
/// nothing is live yet. (Before this,
/// a SIGTERM in that window was lost when the agent ran as PID 1, where a signal without a
/// handler does nothing.)
async fn start(cli: Cli, term: lastcall::TerminationConfig, cfg: Config) -> anyhow::Result<i32> {
    let on_sigterm = term.on_sigterm;
    let lifecycle = Lifecycle::new(term);
    let mut early = StartupSignals::install();
    tracing::info!(
        "compiling the rules of {} application(s)",
        cfg.applications.len()
    );
    let cancel = Arc::new(AtomicBool::new(false));
    let cancelled = Arc::clone(&cancel);
    let compile = tokio::task::spawn_blocking(move || {
        let apps = Apps::compile_unless(&cfg, &cancelled);
        (cfg, apps)
    });
    tokio::pin!(compile);
    let (cfg, apps) = loop {
        tokio::select! {
            biased;
            signal = early.next() => {
                if signal == "SIGTERM" && on_sigterm == lastcall::OnSigterm::Ignore {
                    tracing::warn!("SIGTERM received during start-up and ignored (--on-sigterm ignore)");
                    continue;
                }
                tracing::warn!("{signal} received during start-up: nothing is live yet, exiting (status 0)");
                // Stop after the application being compiled: exiting while libmodsecurity
                // runs on another thread would race its static destructors.
                cancel.store(true, Ordering::SeqCst);
                let _ = (&mut compile).await;
                return Ok(lastcall::exit::DRAINED);
            }
            done = &mut compile => break done.context("compiling the rules")?,
        }
    };
    drop(early);
    match apps {
        Some(Ok(apps)) => serve(cli, lifecycle, cfg, apps).await,
        Some(Err(problems)) => Ok(config_errors(problems)),
        None => Ok(lastcall::exit::DRAINED),
    }
}

/// The signals that end a process with nothing live, watched only while starting (the
/// lifecycle's handlers are installed first and queue the same signals for
/// `Lifecycle::run`, so none is lost when start-up completes).
struct StartupSignals(Vec<(tokio::signal::unix::Signal, &'static str)>);

impl StartupSignals {
    fn install() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        let kinds = [
            (SignalKind::terminate(), "SIGTERM"),
            (SignalKind::interrupt(), "SIGINT"),
            (SignalKind::quit(), "SIGQUIT"),
            (SignalKind::user_defined1(), "SIGUSR1"),
        ];
        StartupSignals(
            kinds
                .into_iter()
                .filter_map(|(kind, name)| signal(kind).ok().map(|s| (s, name)))
                .collect(),
        )
    }

    /// The name of the next signal received.
    async fn next(&mut self) -> &'static str {
        std::future::poll_fn(|cx| {
            for (sig, name) in &mut self.0 {
                if let std::task::Poll::Ready(Some(())) = sig.poll_recv(cx) {
                    return std::task::Poll::Ready(*name);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
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

async fn serve(cli: Cli, lifecycle: Lifecycle, cfg: Config, apps: Apps) -> anyhow::Result<i32> {
    let metrics = Arc::new(Metrics::default());
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
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
        "listening on {} (SPOP; max-frame-size {}, {} workers, evaluation {})",
        listener.local_addr(),
        cfg.max_frame_size,
        cfg.workers,
        cfg.evaluation.as_str()
    );

    let limits = Limits {
        max_frame_size: cfg.max_frame_size,
        max_inflight_per_connection: cfg.max_inflight_per_connection,
        evaluation: cfg.evaluation,
        ..Limits::default()
    };
    let handler: Arc<dyn lastcall_spoa::engine::Handler> = waf.clone();
    let shared = Shared::new(
        handler,
        Arc::clone(&metrics),
        handle.clone(),
        cfg.workers,
        limits,
    );
    let server = tokio::spawn(engine::serve(listener, Arc::clone(&shared)));
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
    let exiting = std::time::Instant::now();
    let _ = tokio::time::timeout(Duration::from_secs(3), server).await;
    tracing::debug!(
        "connection tasks stopped {} ms after the exit decision",
        exiting.elapsed().as_millis()
    );
    // Let running evaluations finish (libmodsecurity must not run while the process exits).
    let stopped = tokio::task::spawn_blocking(move || shared.stop_workers(Duration::from_secs(5)))
        .await
        .unwrap_or(false);
    if !stopped {
        tracing::warn!("an evaluation was still running at exit");
    }
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
