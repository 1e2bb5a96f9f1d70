//! `lastcall-spoa`: an HAProxy SPOE agent running ModSecurity with the OWASP Core Rule Set,
//! a drop-in for coraza-spoa that drains gracefully on SIGTERM (see `docs/spoa.md`).
#![forbid(unsafe_code)]

use std::path::PathBuf;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, Parser, Subcommand};
use lastcall::{
    exit, AcceptUntil, Daemon, Defaults, LogArgs, Problem, Problems, Source, TerminationArgs,
    TerminationConfig,
};
use lastcall_modsec::ModSecurity;
use lastcall_spoa::cli;
use lastcall_spoa::config::{Bind, Config, Evaluation, LogFile};
use lastcall_spoa::engine::{self, Engine, Limits, Listener};
use lastcall_spoa::metrics::Metrics;
use lastcall_spoa::waf::{Apps, Waf};

/// The name configuration errors are reported under.
const NAME: &str = "lastcall-spoa";

/// mimalloc for Rust's allocations; its `override` feature also makes it the process's
/// `malloc`, so libmodsecurity's many small C++ allocations (most of an evaluation's time
/// outside the regex engine) skip glibc's arenas. Measured in docs/benchmarks.md.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// HAProxy SPOE agent running ModSecurity + OWASP CRS (drop-in for coraza-spoa).
///
/// coraza-spoa's flags are taken as Go writes them too: -config FILE, -config=FILE,
/// -validate, -metrics-addr ADDR, -autoreload, -version.
#[derive(Debug, Parser)]
#[command(name = "lastcall-spoa", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// coraza-spoa YAML configuration; without it, one application (`default`) runs the
    /// OWASP CRS at paranoia level 1
    #[arg(long, short = 'c', env = "LASTCALL_SPOA_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Load the configuration and compile the rules, then exit 0 (valid) or 64 (errors)
    #[arg(long)]
    validate: bool,

    /// Listen here instead of the file's `bind` (host:port or unix:///path)
    #[arg(long, env = "LASTCALL_SPOA_BIND", value_name = "ADDR")]
    bind: Option<String>,

    /// The OWASP CRS to use: a CRS release unpacked here (crs-setup.conf or
    /// crs-setup.conf.example beside rules/); overrides the file's `crs_dir`
    /// [default: Debian's modsecurity-crs]
    #[arg(long, env = "LASTCALL_SPOA_CRS_DIR", value_name = "DIR")]
    crs_dir: Option<PathBuf>,

    /// coraza-spoa's name for --admin-addr (/metrics, /livez, /readyz, /drain); `:PORT`
    /// listens on every address
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<String>,

    /// Reload when the configuration file changes, as SIGHUP does (a Kubernetes ConfigMap
    /// update included)
    #[arg(long)]
    autoreload: bool,

    /// coraza-spoa's Go CPU profile: accepted and ignored, with a warning
    #[arg(long, hide = true, value_name = "FILE")]
    cpuprofile: Option<String>,

    /// coraza-spoa's Go heap profile: accepted and ignored, with a warning
    #[arg(long, hide = true, value_name = "FILE")]
    memprofile: Option<String>,

    #[command(flatten)]
    term: TerminationArgs,

    #[command(flatten)]
    log: LogArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Read HAProxy and SPOE configuration files and say, line by line, what differs from
    /// the fail-closed, lossless setup of docs/spoa.md and what to add (exit 0: nothing to
    /// add; 1: findings; 64: a file cannot be read)
    CheckHaproxy {
        /// haproxy.cfg, and the SPOE files (those its `filter spoe` lines name are read too)
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
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
        // Loopback unless told otherwise (coraza-spoa serves metrics only when asked to);
        // the charts bind the pod's address for the kubelet's probes.
        admin_addr: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 9901))),
    }
}

fn main() {
    let args = cli::go_style(std::env::args_os(), &cli::long_options(&Cli::command()));
    let (cli, matches): (Cli, ArgMatches) =
        lastcall::config::parse_cli_matches_from(args, &defaults(), |cmd| {
            cmd.version(version_line())
        });
    if let Some(Command::CheckHaproxy { files }) = &cli.command {
        std::process::exit(lastcall_spoa::check::run(files));
    }
    if cli.validate {
        validate(&cli, &matches);
    }
    let (term, cfg) = match load_options(&cli, &matches) {
        Ok(x) => x,
        // Report the rules' errors too, all at once (nothing is bound yet).
        Err(_) => config_errors(load(&cli, &matches).err().unwrap_or_default()),
    };
    let (log, writer) = match process_log(&cli.log, &matches, &cfg) {
        Ok(x) => x,
        Err(problem) => config_errors(Problems::from(problem)),
    };
    lastcall::logging::init_to(&log, writer);
    for (flag, given) in [
        ("-cpuprofile", &cli.cpuprofile),
        ("-memprofile", &cli.memprofile),
    ] {
        if given.is_some() {
            tracing::warn!("{flag} (Go's profiler in coraza-spoa) is accepted and ignored; profile with perf instead");
        }
    }
    if cfg.evaluation == Evaluation::Inline {
        tracing::warn!(
            "evaluation: inline is no longer done and is ignored: every evaluation runs on the \
             evaluation threads (one slow evaluation on an I/O thread held up every connection, \
             the signals and the probes; docs/spoa.md)"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => fail(
            exit::OS_ERROR,
            &format!("cannot start the tokio runtime: {e}"),
        ),
    };
    runtime.block_on(start(cli, matches, term, cfg))
}

/// `--version`'s text: ours, and the libmodsecurity this process loaded (its own version
/// string, so a newer shared library under the same binary shows as itself).
fn version_line() -> &'static str {
    let engine = match ModSecurity::new() {
        Ok(engine) => format!("ModSecurity {}", engine.version()),
        Err(e) => format!("libmodsecurity failed to start: {e}"),
    };
    // Once per process, before anything else runs: clap wants a 'static string.
    Box::leak(format!("{} (engine: {engine})", env!("CARGO_PKG_VERSION")).into_boxed_str())
}

/// `--validate`: the options, the file and every application's rules, then exit 0 or 64.
fn validate(cli: &Cli, matches: &ArgMatches) -> ! {
    let (_, cfg, apps) = match load(cli, matches) {
        Ok(x) => x,
        Err(problems) => config_errors(problems),
    };
    println!(
        "configuration OK: {} application(s), {} rules, bind {}",
        cfg.applications.len(),
        apps.rule_count(),
        cfg.bind
    );
    std::process::exit(exit::DRAINED)
}

/// The command line and the file, without compiling the rules (cheap: done before the
/// runtime exists). On errors, also returns the file if it loaded, so that the rules' own
/// errors can be reported with the others.
#[allow(clippy::result_large_err)]
fn load_options(
    cli: &Cli,
    matches: &ArgMatches,
) -> Result<(TerminationConfig, Config), (Problems, Option<Config>)> {
    let mut problems = Problems::new();
    let mut term = cli
        .term
        .validate(&defaults())
        .map_err(|e| problems.extend(e))
        .ok();
    if let Some(text) = &cli.metrics_addr {
        match cli::listen_addr(text) {
            // A flag beats the environment (the image sets LASTCALL_ADMIN_ADDR): only the two
            // flags together are a conflict.
            _ if matches.value_source("admin_addr") == Some(ValueSource::CommandLine) => problems
                .push(
                    Problem::new(
                        "-metrics-addr",
                        "is coraza-spoa's name for --admin-addr, which is set too",
                    )
                    .value(text.as_str())
                    .expected("one of them"),
                ),
            Some(addr) => {
                if let Some(t) = term.as_mut() {
                    t.admin_addr = Some(addr);
                }
            }
            None => problems.push(
                Problem::new("-metrics-addr", "not an address to listen on")
                    .value(text.as_str())
                    .expected("IP:PORT, or :PORT for every address (e.g. 127.0.0.1:9090, :9090)"),
            ),
        }
    }
    if cli.autoreload && cli.config.is_none() {
        problems.push(
            Problem::new(
                "-autoreload",
                "watches the configuration file, and none is given",
            )
            .expected("-config FILE too"),
        );
    }
    let cfg = match load_file(cli, matches) {
        Ok(c) => Some(c),
        Err(e) => {
            problems.extend(e);
            None
        }
    };
    let mut cfg = cfg;
    if let Some(Err(p)) = cfg.as_ref().map(|c| process_log(&cli.log, matches, c)) {
        problems.push(p);
    }
    if let (Some(b), Some(cfg)) = (&cli.bind, cfg.as_mut()) {
        match Bind::parse(b) {
            Ok(bind) => cfg.bind = bind,
            Err(e) => problems.push(Problem::new("--bind", e).at(Source::from_matches(
                matches,
                "bind",
                Some("LASTCALL_SPOA_BIND"),
            ))),
        }
    }
    match (term, cfg) {
        (Some(t), Some(c)) if problems.is_empty() => Ok((t, c)),
        (_, cfg) => Err((problems, cfg)),
    }
}

/// Whether argument `id` was given on the command line or in the environment.
fn given(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// The file (or the built-in configuration) with `--crs-dir` applied: at start and at
/// every reload.
fn load_file(cli: &Cli, matches: &ArgMatches) -> Result<Config, Problems> {
    let mut cfg = match &cli.config {
        None => Config::builtin(),
        Some(path) => Config::load(path)?,
    };
    if let Some(dir) = &cli.crs_dir {
        cfg.use_crs_dir(dir).map_err(|e| {
            Problems::from(
                Problem::new("--crs-dir", e)
                    .value(dir.display().to_string())
                    .at(Source::from_matches(
                        matches,
                        "crs_dir",
                        Some("LASTCALL_SPOA_CRS_DIR"),
                    )),
            )
        })?;
    }
    Ok(cfg)
}

/// Everything that can be wrong with the command line and the file, at once (the options,
/// the file, and every application's rules).
fn load(cli: &Cli, matches: &ArgMatches) -> Result<(TerminationConfig, Config, Apps), Problems> {
    match load_options(cli, matches) {
        Ok((term, cfg)) => Apps::compile(&cfg).map(|apps| (term, cfg, apps)),
        Err((mut problems, cfg)) => {
            if let Some(Err(errs)) = cfg.as_ref().map(Apps::compile) {
                problems.extend(errs);
            }
            Err(problems)
        }
    }
}

/// Prints every problem and exits 64 (nothing is bound yet).
fn config_errors(problems: Problems) -> ! {
    problems.exit(NAME)
}

/// Prints `message` and exits with `code` (start-up failures that are not configuration).
fn fail(code: i32, message: &str) -> ! {
    tracing::error!("{message}");
    eprintln!("{NAME}: {message}");
    std::process::exit(code)
}

/// Starts the lifecycle (Starting: signals handled from here on, readiness 503), then
/// compiles the rules. An exit decided while they compile (50-200 ms per application; a
/// SIGTERM with nothing live, SIGQUIT) ends the process with status 0 after the application
/// being compiled, and never while libmodsecurity is compiling on another thread.
async fn start(cli: Cli, matches: ArgMatches, term: TerminationConfig, cfg: Config) -> ! {
    let daemon = Daemon::start(term);
    let handle = daemon.handle().clone();
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
    let compiled = tokio::select! {
        biased;
        () = handle.exiting() => None,
        done = &mut compile => match done {
            Ok((cfg, Some(apps))) => Some((cfg, apps)),
            // Cancelled: only after the exit was decided.
            Ok((_, None)) => None,
            Err(e) => fail(exit::SOFTWARE, &format!("compiling the rules: {e}")),
        },
    };
    let Some((cfg, apps)) = compiled else {
        // The exit was decided while starting: nothing is live.
        cancel.store(true, Ordering::SeqCst);
        let _ = (&mut compile).await;
        let served = daemon.serve().await;
        let by = served
            .outcome
            .forced_by
            .or(served.outcome.trigger)
            .map_or("a trigger", |t| t.as_str());
        tracing::warn!(
            "{by} received during start-up: nothing is live yet, exiting (status {})",
            served.exit_code()
        );
        served.exit()
    };
    match apps {
        Ok(apps) => serve(cli, matches, daemon, cfg, apps).await,
        Err(errs) => config_errors(errs),
    }
}

#[allow(clippy::result_large_err)]
/// The process log: the file's `log_level`/`log_format` unless given on the command line
/// or in the environment, written where its `log_file` says (stderr by default).
fn process_log(
    cli: &LogArgs,
    matches: &ArgMatches,
    cfg: &Config,
) -> Result<(LogArgs, BoxMakeWriter), Problem> {
    let mut log = cli.clone();
    if let Some(level) = &cfg.log.level {
        if !given(matches, "log_level") {
            log.log_level = level.clone();
        }
    }
    if let Some(json) = cfg.log.json {
        if !given(matches, "log_format") {
            log.log_format = if json {
                lastcall::LogFormat::Json
            } else {
                lastcall::LogFormat::Text
            };
        }
    }
    let writer = match &cfg.log.file {
        None | Some((LogFile::Stderr, _)) => BoxMakeWriter::new(std::io::stderr),
        Some((LogFile::Stdout, _)) => BoxMakeWriter::new(std::io::stdout),
        Some((LogFile::Null, _)) => BoxMakeWriter::new(std::io::sink),
        Some((LogFile::Path(path), line)) => match lastcall_spoa::waf::apps::append(path) {
            Ok(f) => BoxMakeWriter::new(std::sync::Mutex::new(f)),
            Err(e) => {
                return Err(Problem::new(
                    "log_file",
                    format!("cannot open {}: {e}", path.display()),
                )
                .at(cfg.source(*line)))
            }
        },
    };
    Ok((log, writer))
}

async fn serve(cli: Cli, matches: ArgMatches, mut daemon: Daemon, cfg: Config, apps: Apps) -> ! {
    let metrics = Arc::new(Metrics::default());
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    daemon.register_metrics(&mut registry);
    let handle = daemon.handle().clone();

    let engine = match ModSecurity::new() {
        Ok(engine) => engine,
        Err(e) => fail(exit::SOFTWARE, &format!("starting libmodsecurity: {e}")),
    };
    tracing::info!(
        "{} application(s), {} rules compiled; engine: {}",
        cfg.applications.len(),
        apps.rule_count(),
        engine.who_am_i()
    );
    metrics.set_engine("ModSecurity", &engine.version());
    let waf = Arc::new(Waf::new(engine, apps, Arc::clone(&metrics)));

    let listener = match Listener::bind(&cfg.bind).await {
        Ok(l) => l,
        Err(e) => fail(
            exit::OS_ERROR,
            &format!("cannot listen on {}: {e}", cfg.bind),
        ),
    };
    let _admin = match lastcall::admin::serve(&handle, Arc::new(registry)).await {
        Ok(admin) => admin,
        Err(e) => fail(exit::OS_ERROR, &format!("{e:#}")),
    };
    let addr = listener.local_addr();

    let limits = Limits {
        max_frame_size: cfg.max_frame_size,
        max_inflight_per_connection: cfg.max_inflight_per_connection,
        evaluation_timeout: cfg.evaluation_timeout,
        hello_timeout: cfg.hello_timeout,
        idle_timeout: cfg.idle_timeout,
        max_buffered_bytes: cfg.max_buffered_bytes,
        ..Limits::default()
    };
    let handler: Arc<dyn engine::Handler> = waf.clone();
    let engine = Engine::new(
        handler,
        Arc::clone(&metrics),
        handle.clone(),
        cfg.workers,
        limits,
    );
    // New connections are accepted to the end, so that the drain refuses their HELLO with
    // AGENT-DISCONNECT instead of a refused TCP connection.
    let conns = Arc::clone(&engine);
    daemon.accept(listener, AcceptUntil::Exiting, move |conn, watch| {
        engine::serve_accepted(conn, Arc::clone(&conns), watch)
    });
    // After the connections: running evaluations finish (libmodsecurity must not run while
    // the process exits), within what is left of the deadline.
    daemon.on_exit("evaluations", move |left| engine.stop_workers(left));
    let watched = match (&cli.config, cli.autoreload) {
        (Some(path), true) => match lastcall_spoa::autoreload::watch(path) {
            Ok(rx) => Some(rx),
            Err(e) => fail(exit::OS_ERROR, &format!("-autoreload: {e}")),
        },
        _ => None,
    };
    tokio::spawn(reload_loop(
        handle.clone(),
        cli,
        matches,
        watched,
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
    daemon.ready();
    tracing::info!(
        "listening on {addr} (SPOP; max-frame-size {}, {} workers, evaluation_timeout {})",
        cfg.max_frame_size,
        cfg.workers,
        lastcall::duration::format(cfg.evaluation_timeout)
    );

    let served = daemon.serve().await;
    if served.is_clean() {
        served.exit()
    }
    // An evaluation outlived the deadline: leave without tearing libmodsecurity down
    // under it.
    lastcall_modsec::exit_now(served.exit_code())
}

/// SIGHUP (or a change of the file, with `-autoreload`): re-read the file, recompile every
/// application, swap all at once. A failed reload keeps the running rules.
async fn reload_loop(
    handle: lastcall::Handle,
    cli: Cli,
    matches: ArgMatches,
    mut watched: Option<tokio::sync::mpsc::Receiver<()>>,
    waf: Arc<Waf>,
    metrics: Arc<Metrics>,
) {
    let mut reloads = handle.reloads();
    let cli = Arc::new((cli, matches));
    loop {
        let changed = async {
            match watched.as_mut() {
                Some(rx) => rx.recv().await.is_some(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = reloads.changed() => if r.is_err() { return },
            true = changed => {}
        }
        let cli = Arc::clone(&cli);
        let result = tokio::task::spawn_blocking(move || {
            let (cli, matches) = &*cli;
            let cfg = load_file(cli, matches).map_err(|e| e.to_string())?;
            let apps = Apps::compile(&cfg).map_err(|e| e.to_string())?;
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
