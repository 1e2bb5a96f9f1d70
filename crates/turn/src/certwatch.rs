//! Certificate renewal without a signal: the TLS files are watched, and a change is
//! reloaded as SIGHUP reloads it ([`Certs::reload_changed`]).
//!
//! **What is watched.** The directory of each of `cert`, `pkey` and `CA-file`, with inotify,
//! not the files: a Kubernetes Secret volume holds `tls.crt -> ..data/tls.crt` and
//! `..data -> ..2026_12_04_10_00_00.123456789`, and the kubelet's update writes a new
//! timestamped directory, renames a new `..data` symlink over the old one and removes the old
//! directory; the files themselves are never written, so a watch on them (or on what they
//! resolve to) sees nothing until their directory is gone. The rename is an event in the
//! mount directory. The directory a symlinked file resolves to is watched too (a file
//! copied over its target), and watches are added again after each change, as targets move.
//! Only events about the files (or their symlinks' targets, or the `..`-named entries of
//! the kubelet's writer) count: opening a file (the watcher's own reads) and other files of
//! the directory (a log beside the certificate) do not wake it.
//!
//! **When it reloads.** After a change, events are let settle for [`Timing::debounce`] (a
//! writer of several files, a `cp` of the certificate then the key); then the files are read
//! together and, if their bytes differ from those in use, built into a configuration. A pair
//! that does not load (the certificate renewed, the key not yet) is tried again at every
//! further change for [`Timing::settle`]; still bad then, it is an error in the log and one
//! more `lastcall_turn_tls_reload_failures_total`, the previous certificate stays, and the
//! same bytes are not counted again (new bytes are tried afresh).
//!
//! **Without inotify** (no watch can be added: the kernel's `max_user_watches`, a filesystem
//! without it) the files are read every [`Timing::poll`] instead, with the same rules, after
//! one warning.
//!
//! inotify comes from the `notify` crate, as for lastcall-spoa's `-autoreload` (one idiom in
//! the workspace, and its safe API: this crate forbids `unsafe`, which tokio's `AsyncFd` on a
//! raw inotify descriptor now needs); its thread only forwards events to this task.

use std::collections::HashSet;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, EventKind};
use notify::{RecursiveMode, Watcher};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::tls::{Certs, Pems, TlsFiles};

/// The watcher's times.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Quiet time after the last event before the files are read.
    pub debounce: Duration,
    /// How long a pair that does not load is tried again before it is an error.
    pub settle: Duration,
    /// The interval of the fallback poll, where inotify is unavailable.
    pub poll: Duration,
}

impl Timing {
    /// The daemon's: 100 ms quiet, 5 s to settle, a poll every 10 s.
    pub const DEFAULT: Timing = Timing {
        debounce: Duration::from_millis(100),
        settle: Duration::from_secs(5),
        poll: Duration::from_secs(10),
    };
}

/// The counters the watcher moves.
#[derive(Debug, Clone)]
pub struct Counters {
    /// Reloads that installed a new certificate.
    reloads: Counter,
    /// Changes whose files still did not load after [`Timing::settle`].
    failures: Counter,
    /// Changes that did not load at once (tried again until the settle time).
    waits: Counter,
}

impl Counters {
    /// The daemon's reload and reload-failure counters.
    pub fn new(reloads: Counter, failures: Counter) -> Counters {
        Counters {
            reloads,
            failures,
            waits: Counter::default(),
        }
    }
}

/// Where changes come from.
enum Source {
    Inotify(Inotify),
    Poll(tokio::time::Interval),
}

impl Source {
    /// inotify on the files' directories, or the poll if a watch cannot be added.
    fn new(files: &TlsFiles, timing: Timing) -> Source {
        match Inotify::new(files) {
            Ok(i) => {
                tracing::info!(
                    dirs = ?i.dirs,
                    "watching the TLS certificate and key for changes (inotify); no-cert-watch turns it off"
                );
                Source::Inotify(i)
            }
            Err(e) => {
                tracing::warn!(
                    "cannot watch the TLS files with inotify ({e}): reading them every {:?} instead",
                    timing.poll
                );
                Source::poll(timing)
            }
        }
    }

    fn poll(timing: Timing) -> Source {
        let mut every = tokio::time::interval_at(Instant::now() + timing.poll, timing.poll);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Source::Poll(every)
    }

    /// Waits for a change (an event, or the next poll).
    async fn changed(&mut self) -> io::Result<()> {
        match self {
            Source::Inotify(i) => i.next().await,
            Source::Poll(every) => {
                every.tick().await;
                Ok(())
            }
        }
    }

    /// Waits until no event came for `quiet` (nothing to wait for when polling).
    async fn settle(&mut self, quiet: Duration) -> io::Result<()> {
        if let Source::Inotify(i) = self {
            while let Ok(next) = tokio::time::timeout(quiet, i.next()).await {
                next?;
            }
        }
        Ok(())
    }

    /// Watches the directories the files resolve to now (symlink targets move).
    fn rewatch(&mut self, files: &TlsFiles) {
        if let Source::Inotify(i) = self {
            i.add_targets(files);
        }
    }
}

/// notify's watcher of the files' directories, its events forwarded to a channel.
struct Inotify {
    watcher: notify::RecommendedWatcher,
    events: mpsc::UnboundedReceiver<()>,
    dirs: Vec<PathBuf>,
    /// The names an event must be about to count: the files' and their targets'.
    names: Arc<Mutex<HashSet<OsString>>>,
}

impl Inotify {
    fn new(files: &TlsFiles) -> Result<Inotify, String> {
        let (tx, events) = mpsc::unbounded_channel();
        let names = Arc::new(Mutex::new(HashSet::new()));
        let relevant = Arc::clone(&names);
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if concerns(&event, &relevant.lock()) {
                    let _ = tx.send(());
                }
            })
            .map_err(|e| e.to_string())?;
        let mut dirs = Vec::new();
        for file in paths(files) {
            let dir = directory(file);
            if !dirs.contains(&dir) {
                watcher
                    .watch(&dir, RecursiveMode::NonRecursive)
                    .map_err(|e| format!("{}: {e}", dir.display()))?;
                dirs.push(dir);
            }
        }
        let mut i = Inotify {
            watcher,
            events,
            dirs,
            names,
        };
        i.add_targets(files);
        Ok(i)
    }

    /// Adds the directories the files resolve to (best effort: such a directory may be gone
    /// by the time it is watched, and the next change adds its successor).
    fn add_targets(&mut self, files: &TlsFiles) {
        {
            let mut names = self.names.lock();
            for file in paths(files) {
                names.extend(file.file_name().map(ToOwned::to_owned));
                if let Ok(real) = std::fs::canonicalize(file) {
                    names.extend(real.file_name().map(ToOwned::to_owned));
                }
            }
        }
        for file in paths(files) {
            if let Ok(real) = std::fs::canonicalize(file) {
                let dir = directory(&real);
                if !self.dirs.contains(&dir)
                    && self
                        .watcher
                        .watch(&dir, RecursiveMode::NonRecursive)
                        .is_ok()
                {
                    tracing::debug!(dir = %dir.display(), "watching a TLS file's target directory");
                    self.dirs.push(dir);
                }
            }
        }
        // A directory gone (a Secret volume's old timestamped one) is no longer watched.
        self.dirs.retain(|d| d.exists());
    }

    /// Waits for an event.
    async fn next(&mut self) -> io::Result<()> {
        match self.events.recv().await {
            Some(()) => Ok(()),
            None => Err(io::Error::other("the watcher stopped")),
        }
    }
}

/// Whether `event` may have changed the files: it names one of `names` (the files and their
/// symlinks' targets) or a Kubernetes atomic writer's entry (`..data`, `..data_tmp`, the
/// timestamped directories), or says nothing of which (an error, the queue overflowed).
/// Opening a file changes nothing (the watcher opens them itself), and other files of the
/// directory (a log written beside the certificate) do not wake it.
fn concerns(event: &notify::Result<notify::Event>, names: &HashSet<OsString>) -> bool {
    let Ok(event) = event else { return true };
    if matches!(event.kind, EventKind::Access(AccessKind::Open(_))) {
        return false;
    }
    event.paths.is_empty()
        || event.paths.iter().any(|p| match p.file_name() {
            None => true,
            Some(n) => names.contains(n) || n.as_encoded_bytes().starts_with(b".."),
        })
}

fn paths(files: &TlsFiles) -> impl Iterator<Item = &Path> {
    [
        Some(files.cert.as_path()),
        Some(files.pkey.as_path()),
        files.client_ca.as_deref(),
    ]
    .into_iter()
    .flatten()
}

/// The directory holding `file` (`.` for a bare name).
fn directory(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// What the files held, or why they could not be read (compared to count one error once).
type Read = Result<Pems, String>;

/// Watches `certs`' files and reloads them when they change, for as long as the daemon runs.
pub async fn watch(certs: Arc<Certs>, counters: Counters, timing: Timing) {
    let source = Source::new(certs.files(), timing);
    run(certs, counters, timing, source).await;
}

async fn run(certs: Arc<Certs>, counters: Counters, timing: Timing, mut source: Source) {
    let files = certs.files().clone();
    // A change that did not load yet, and until when it is tried again.
    let mut pending: Option<Instant> = None;
    // What was counted as a failure, not counted again.
    let mut failed: Option<Read> = None;
    loop {
        let woke = match pending {
            Some(deadline) => tokio::time::timeout_at(deadline, source.changed())
                .await
                .ok(),
            None => Some(source.changed().await),
        };
        let waited = match woke {
            Some(Ok(())) => source.settle(timing.debounce).await,
            Some(Err(e)) => Err(e),
            None => Ok(()),
        };
        if let Err(e) = waited {
            tracing::warn!(
                "the TLS files' inotify failed ({e}): reading them every {:?} instead",
                timing.poll
            );
            source = Source::poll(timing);
        }
        source.rewatch(&files);
        let read: Read = Pems::read(&files).map_err(|e| e.to_string());
        if pending.is_none() && failed.as_ref() == Some(&read) {
            continue;
        }
        let outcome = read
            .clone()
            .and_then(|pems| certs.reload_changed(pems).map_err(|e| e.to_string()));
        match outcome {
            Ok(changed) => {
                if changed {
                    counters.reloads.inc();
                    tracing::info!(
                        cert = %files.cert.display(),
                        "TLS certificate reloaded: the files changed"
                    );
                }
                pending = None;
                failed = None;
            }
            Err(e) => match pending {
                None => {
                    counters.waits.inc();
                    tracing::debug!("the TLS files changed and do not load yet ({e}): waiting up to {:?} for the rest", timing.settle);
                    pending = Some(Instant::now() + timing.settle);
                }
                Some(deadline) if Instant::now() >= deadline => {
                    counters.failures.inc();
                    tracing::error!(
                        "TLS certificate reload failed after the files changed, keeping the previous one: {e}"
                    );
                    pending = None;
                    failed = Some(read);
                }
                Some(_) => {}
            },
        }
    }
}

#[cfg(test)]
mod tests;
