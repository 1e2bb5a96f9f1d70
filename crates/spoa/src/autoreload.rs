//! Reloads: on SIGHUP, and with `-autoreload` when the configuration file changes, as
//! SIGHUP does ([`follow`] feeds the lifecycle a SIGHUP trigger, so `lastcall_reloads_total`
//! and `spoa_reloads_total` count the same reloads); [`reload_on_request`] re-reads the file,
//! recompiles every application and swaps them all at once.
//!
//!
//! The file's directory is watched (inotify), not the file: editors replace files by
//! renaming, and Kubernetes updates a mounted ConfigMap by swapping the `..data` symlink the
//! file's own symlink points through, so the file's inode never changes. After a burst of
//! events has been quiet for `SETTLE`, the file is read again through its symlinks; a
//! reload is asked for only when its bytes differ from the last ones seen (an unrelated file
//! in the directory, or a save that changed nothing, reloads nothing).

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::config::{Apps, FileSource};
use crate::metrics::Metrics;
use crate::waf::Waf;

/// How long a burst of events must be quiet before the file is read: a ConfigMap swap is a
/// few events within a millisecond, an editor's save a few within some.
pub(crate) const SETTLE: Duration = Duration::from_millis(200);

/// Watches `path`; each message on the returned channel asks for one reload. The watcher
/// lives as long as the receiver. The error says why the directory cannot be watched.
pub(crate) fn watch(path: &Path) -> Result<mpsc::Receiver<()>, String> {
    let path = path.to_path_buf();
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."));
    let (events_tx, events_rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| wakes(&e.kind)) {
            let _ = events_tx.send(());
        }
    })
    .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
    let (reload_tx, reload_rx) = mpsc::channel(1);
    // What is running now: read before anything can change it.
    let last = std::fs::read(&path).ok();
    tokio::spawn(settle(path, last, watcher, events_rx, reload_tx));
    Ok(reload_rx)
}

/// Whether an event in the watched directory may have changed the file: not an access
/// (opening, reading, closing unwritten), which the watcher's own read of the file causes
/// too; woken by those, it read the file again every [`SETTLE`], for ever.
fn wakes(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        notify::EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        notify::EventKind::Access(_) => false,
        _ => true,
    }
}

/// `-autoreload`: watches `path` (`watch`) and asks the lifecycle for a reload, as a
/// SIGHUP does, at each change.
pub fn follow(path: &Path, handle: lastcall::Handle) -> Result<(), String> {
    let mut rx = watch(path)?;
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            handle.start_drain(lastcall::Trigger::Sighup);
        }
    });
    Ok(())
}

/// At each reload the lifecycle announces (SIGHUP, [`follow`]): re-reads the file,
/// recompiles every application, swaps all at once. A failed reload keeps the running rules.
pub async fn reload_on_request(
    handle: lastcall::Handle,
    source: FileSource,
    waf: Arc<Waf>,
    metrics: Arc<Metrics>,
) {
    let mut reloads = handle.reloads();
    let source = Arc::new(source);
    while reloads.changed().await.is_ok() {
        let source = Arc::clone(&source);
        let result = tokio::task::spawn_blocking(move || {
            let (cfg, warnings) = source.load_checked().map_err(|e| e.to_string())?;
            let apps = Apps::compile(&cfg).map_err(|e| e.to_string())?;
            for w in warnings {
                tracing::warn!("{w}");
            }
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

async fn settle(
    path: PathBuf,
    mut last: Option<Vec<u8>>,
    _watcher: notify::RecommendedWatcher,
    mut events: mpsc::UnboundedReceiver<()>,
    reload: mpsc::Sender<()>,
) {
    while events.recv().await.is_some() {
        // Quiet for SETTLE: every event in the burst restarts the wait.
        loop {
            match tokio::time::timeout(SETTLE, events.recv()).await {
                Ok(Some(())) => continue,
                Ok(None) => return,
                Err(_) => break,
            }
        }
        let now = std::fs::read(&path).ok();
        if now.is_some() && now != last {
            last = now;
            tracing::info!("{} changed: reloading (-autoreload)", path.display());
            if reload.send(()).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind, RemoveKind, RenameMode};
    use notify::EventKind;

    /// The watcher's own read of the file (open, read, close) wakes nothing; a write, a
    /// rename into place (a ConfigMap's `..data` swap), a creation or a removal does.
    #[test]
    fn reads_do_not_wake_the_watch() {
        for kind in [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            EventKind::Access(AccessKind::Read),
        ] {
            assert!(!wakes(&kind), "{kind:?}");
        }
        for kind in [
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Modify(ModifyKind::Any),
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Remove(RemoveKind::File),
        ] {
            assert!(wakes(&kind), "{kind:?}");
        }
    }
}
