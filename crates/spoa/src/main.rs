//! `lastcall-spoa`: an HAProxy SPOE agent running ModSecurity with the OWASP Core Rule Set,
//! a drop-in for coraza-spoa that drains gracefully on SIGTERM (see `docs/spoa.md`).
//!
//! Only wiring: [`config::parse`] reads everything and reports every problem at once; here
//! the lifecycle starts, the rules compile, and the listeners, the WAF and the reloads are
//! put together.
// Denied, not forbidden: one call into the allocator below (`give_back_to_mimalloc`).
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lastcall::{exit, AcceptUntil, Daemon};
use lastcall_modsec::ModSecurity;
use lastcall_spoa::config::{self, Apps, Config, Parsed, Settings};
use lastcall_spoa::engine::{self, Engine, Listener};
use lastcall_spoa::metrics::Metrics;
use lastcall_spoa::waf::Waf;
use lastcall_spoa::{autoreload, haproxy_check};
use prometheus_client::registry::Registry;

/// The name configuration errors are reported under.
const NAME: &str = "lastcall-spoa";

/// mimalloc for Rust's allocations; its `override` feature also makes it the process's
/// `malloc`, so libmodsecurity's many small C++ allocations (most of an evaluation's time
/// outside the regex engine) skip glibc's arenas. Measured in docs/benchmarks.md.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Run after each rule set is freed (a reload's old rules), on the thread that freed them:
/// mimalloc keeps freed pages for reuse and purges them only when its own calls get round
/// to it, so without this an agent kept about a rule set's worth (~15 MB) more after its
/// reloads (docs/benchmarks.md, *Soak*). `mi_collect(true)` frees that thread's pages and
/// purges every arena's free pages now.
#[cfg(feature = "mimalloc")]
#[allow(
    unsafe_code,
    reason = "mimalloc's C API: one call, no arguments to check"
)]
fn give_back_to_mimalloc() {
    // SAFETY: mi_collect takes a flag and works only on mimalloc's own state (the calling
    // thread's heap and the shared arenas, under mimalloc's own locks); it may run on any
    // thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

fn main() {
    #[cfg(feature = "mimalloc")]
    lastcall_modsec::after_rules_freed(give_back_to_mimalloc);
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "sessions") {
        let rest: Vec<String> = args
            .iter()
            .skip(2)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        lastcall::sessions::command(
            NAME,
            &rest,
            lastcall_spoa::config::default_admin_addr(),
            engine::SESSION_COLUMNS,
        );
    }
    let settings = match config::parse(std::env::args_os()) {
        Ok(Parsed::Run(settings)) => *settings,
        Ok(Parsed::Print { text, warnings }) => {
            for w in warnings {
                eprintln!("{NAME}: warning: {w}");
            }
            print!("{text}");
            std::process::exit(0)
        }
        Ok(Parsed::CheckHaproxy(files)) => std::process::exit(haproxy_check::run(&files)),
        Ok(Parsed::Usage(e)) => {
            // Printing can only fail if stderr is gone; nothing better to do then.
            let _ = e.print();
            std::process::exit(exit::CONFIG)
        }
        Err(problems) => problems.exit(NAME),
    };
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
    runtime.block_on(start(settings))
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
async fn start(settings: Settings) -> ! {
    let Settings {
        config: cfg,
        term,
        log,
        log_rules,
        log_writer,
        warnings,
        source,
        autoreload: watched,
    } = settings;
    lastcall_spoa::log::init(&log, log_rules, log_writer);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    let daemon = Daemon::start(term);
    let metrics = Arc::new(Metrics::default());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    daemon.register_metrics(&mut registry);
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
    let apps = match apps {
        Ok(apps) => apps,
        Err(errs) => errs.exit(NAME),
    };
    let serving = Serving {
        daemon,
        registry,
        metrics,
        cfg,
        apps,
        source,
        watched,
    };
    serve(serving).await
}

/// What [`serve`] puts together.
struct Serving {
    daemon: Daemon,
    registry: Registry,
    metrics: Arc<Metrics>,
    cfg: Config,
    apps: Apps,
    source: config::FileSource,
    watched: Option<std::path::PathBuf>,
}

async fn serve(s: Serving) -> ! {
    let Serving {
        mut daemon,
        registry,
        metrics,
        cfg,
        apps,
        source,
        watched,
    } = s;
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
    let handler: Arc<dyn engine::Handler> = waf.clone();
    let engine = Engine::new(
        handler,
        Arc::clone(&metrics),
        handle.clone(),
        cfg.workers,
        cfg.limits(),
    );
    engine.listening();
    handle.provide_sessions(engine.sessions());
    // New connections are accepted to the end, so that the drain refuses their HELLO with
    // AGENT-DISCONNECT instead of a refused TCP connection.
    let conns = Arc::clone(&engine);
    daemon.accept(listener, AcceptUntil::Exiting, move |conn, watch| {
        engine::serve_accepted(conn, Arc::clone(&conns), watch)
    });
    // After the connections: running evaluations finish (libmodsecurity must not run while
    // the process exits), within what is left of the deadline.
    daemon.on_exit("evaluations", move |left| engine.stop_workers(left));
    if let Some(path) = &watched {
        if let Err(e) = autoreload::follow(path, handle.clone()) {
            fail(exit::OS_ERROR, &format!("-autoreload: {e}"));
        }
    }
    tokio::spawn(autoreload::reload_on_request(
        handle.clone(),
        source,
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
