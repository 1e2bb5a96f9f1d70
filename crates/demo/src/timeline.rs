//! `--record DIR` and `--timeline PNG`: what a Prometheus server and a load dashboard would
//! have seen of the demo. Every daemon's `/metrics` is scraped on a fixed interval
//! (`lastcall_testkit::monitoring::Recorder`), the HTTP load's counters are sampled, and the
//! demo notes each process's start, signal and exit. At the end it writes
//! `DIR/metrics.jsonl` (every scrape), `DIR/timeline.json` (requests, each process's phase and
//! sessions, each exit) and, for `--timeline`, a PNG drawn by `timeline.py` with Debian's
//! matplotlib (`/usr/bin/python3`, package python3-matplotlib).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use lastcall_testkit::metrics;
use lastcall_testkit::monitoring::{Recorder, Scrape};
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::net::LoadCounters;

/// The plotting script, run by `python3 -` (so the binary carries it).
const PLOT: &str = include_str!("timeline.py");

/// How often every daemon is scraped.
pub(crate) const SCRAPE_EVERY: Duration = Duration::from_millis(500);
/// How often the load's counters are sampled.
const LOAD_EVERY: Duration = Duration::from_millis(250);

/// One process the demo started, as the timeline shows it.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    job: &'static str,
    admin: SocketAddr,
    start: f64,
    signal: Option<(f64, String)>,
    exit: Option<(f64, String)>,
}

/// What the demo records while it runs.
pub(crate) struct Timeline {
    recorder: Recorder,
    spans: Mutex<Vec<Span>>,
    load: Arc<Mutex<Vec<[f64; 5]>>>,
    load_stop: Arc<AtomicBool>,
}

impl Timeline {
    pub(crate) fn start() -> Timeline {
        Timeline {
            recorder: Recorder::start(SCRAPE_EVERY),
            spans: Mutex::new(Vec::new()),
            load: Arc::default(),
            load_stop: Arc::default(),
        }
    }

    /// A daemon started: scrape its admin listener from now on.
    pub(crate) fn started(&self, name: &str, job: &'static str, admin: SocketAddr) {
        let now = self.recorder.now();
        self.spans.lock().push(Span {
            name: name.to_string(),
            job,
            admin,
            start: now,
            signal: None,
            exit: None,
        });
        self.recorder.add(job, admin);
    }

    /// `name` was sent `what` (SIGTERM).
    pub(crate) fn signalled(&self, name: &str, what: &str) {
        let now = self.recorder.now();
        if let Some(mut s) = self.span(name) {
            s.signal = Some((now, what.to_string()));
        }
    }

    /// `name` exited (`how`: "exit 0").
    pub(crate) fn exited(&self, name: &str, how: &str) {
        let now = self.recorder.now();
        let admin = self.span(name).map(|mut s| {
            s.exit = Some((now, how.to_string()));
            s.admin
        });
        if let Some(a) = admin {
            self.recorder.remove(a);
        }
    }

    fn span(&self, name: &str) -> Option<parking_lot::MappedMutexGuard<'_, Span>> {
        let spans = self.spans.lock();
        parking_lot::MutexGuard::try_map(spans, |v| {
            v.iter_mut()
                .rev()
                .find(|s| s.name == name && s.exit.is_none())
        })
        .ok()
    }

    /// Samples the HTTP load's counters until [`Timeline::load_stopped`].
    pub(crate) fn watch_load(&self, counters: Arc<LoadCounters>) {
        let (load, stop) = (self.load.clone(), self.load_stop.clone());
        let started = std::time::Instant::now();
        let offset = self.recorder.now();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let t = offset + started.elapsed().as_secs_f64();
                load.lock().push([
                    t,
                    counters.sent.load(Ordering::SeqCst) as f64,
                    counters.passed.load(Ordering::SeqCst) as f64,
                    counters.blocked.load(Ordering::SeqCst) as f64,
                    counters.failed.load(Ordering::SeqCst) as f64,
                ]);
                std::thread::sleep(LOAD_EVERY);
            }
        });
    }

    /// The load stopped.
    pub(crate) fn load_stopped(&self) {
        self.load_stop.store(true, Ordering::SeqCst);
    }

    /// Stops recording and writes `dir/metrics.jsonl`, `dir/timeline.json` and, if asked, the
    /// PNG.
    pub(crate) fn finish(self, dir: &Path, png: Option<&Path>) -> Result<()> {
        self.load_stop.store(true, Ordering::SeqCst);
        // What Prometheus would see after the last exit: its targets gone (stale).
        let _ = self.recorder.wait_rounds(3, Duration::from_secs(10));
        let started_unix = self.recorder.started_unix;
        let scrapes = self.recorder.finish();
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut jsonl = String::new();
        for s in &scrapes {
            jsonl.push_str(
                &json!({"at": s.at, "job": s.job, "instance": s.instance, "text": s.text})
                    .to_string(),
            );
            jsonl.push('\n');
        }
        let metrics_path = dir.join("metrics.jsonl");
        std::fs::write(&metrics_path, jsonl)
            .with_context(|| format!("writing {}", metrics_path.display()))?;
        let spans = self.spans.lock().clone();
        let processes: Vec<Value> = spans.iter().map(|s| process(s, &scrapes)).collect();
        let data = json!({
            "started_unix": started_unix,
            "scrape_every": SCRAPE_EVERY.as_secs_f64(),
            "load": *self.load.lock(),
            "processes": processes,
        });
        let data_path = dir.join("timeline.json");
        std::fs::write(&data_path, serde_json::to_string_pretty(&data)?)
            .with_context(|| format!("writing {}", data_path.display()))?;
        if let Some(png) = png {
            plot(&data_path, png)?;
        }
        Ok(())
    }
}

/// A process's entry: its spans, and its phase and sessions from the scrapes of its admin
/// address while it ran.
fn process(s: &Span, scrapes: &[Scrape]) -> Value {
    let end = s.exit.as_ref().map_or(f64::INFINITY, |e| e.0);
    let admin = s.admin.to_string();
    let mut phases = Vec::new();
    let mut sessions = Vec::new();
    for sc in scrapes
        .iter()
        .filter(|sc| sc.instance == admin && sc.at >= s.start && sc.at <= end)
    {
        if let Some(p) = metrics::value(&sc.text, "lastcall_drain_phase") {
            phases.push(json!([sc.at, p]));
        }
        if let Some(n) = metrics::value(&sc.text, "lastcall_sessions") {
            sessions.push(json!([sc.at, n]));
        }
    }
    json!({
        "name": s.name,
        "job": s.job,
        "start": s.start,
        "signal": s.signal,
        "exit": s.exit,
        "phases": phases,
        "sessions": sessions,
    })
}

/// Draws the PNG with Debian's Python and matplotlib.
fn plot(data: &Path, png: &Path) -> Result<()> {
    let python = Path::new("/usr/bin/python3");
    if !python.is_file() {
        bail!("--timeline needs /usr/bin/python3 with matplotlib (Debian's python3-matplotlib: bash scripts/setup.sh)");
    }
    let mut child = Command::new(python)
        .arg("-")
        .arg(data)
        .arg(png)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting /usr/bin/python3")?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write as _;
        stdin.write_all(PLOT.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "drawing {} failed (Debian's python3-matplotlib installed? bash scripts/setup.sh): {}",
            png.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
