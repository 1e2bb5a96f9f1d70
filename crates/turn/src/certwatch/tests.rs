//! The watcher on real files and a real inotify: a kubelet-style swap, a pair written one
//! file at a time, a bad pair, and the poll where inotify is not used.

use super::*;
use lastcall_testkit::tls::{self_signed, SecretVolume};

/// Short times, so a bad pair is counted quickly.
const FAST: Timing = Timing {
    debounce: Duration::from_millis(20),
    settle: Duration::from_millis(300),
    poll: Duration::from_millis(50),
};

struct Setup {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    certs: Arc<Certs>,
    counters: Counters,
}

fn pem(dir: &Path, name: &str) -> (Vec<u8>, Vec<u8>) {
    let (c, k) = self_signed(dir, name, &format!("{name}.test"));
    (std::fs::read(c).unwrap(), std::fs::read(k).unwrap())
}

fn files(cert: PathBuf, pkey: PathBuf) -> TlsFiles {
    TlsFiles {
        cert,
        pkey,
        tls13_only: false,
        client_ca: None,
        watch: true,
    }
}

fn setup(cert: PathBuf, pkey: PathBuf, dir: tempfile::TempDir) -> Setup {
    let certs = Arc::new(Certs::load(&files(cert, pkey)).expect("load"));
    Setup {
        dir: dir.path().to_path_buf(),
        _dir: dir,
        certs,
        counters: Counters::new(Counter::default(), Counter::default()),
    }
}

/// Waits (up to 10 s) until `cond` holds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts the watcher on `s`, with inotify or the poll.
fn start(s: &Setup, poll: bool) {
    let files = s.certs.files().clone();
    let source = if poll {
        Source::poll(FAST)
    } else {
        Source::new(&files, FAST)
    };
    tokio::spawn(run(Arc::clone(&s.certs), s.counters.clone(), FAST, source));
}

#[tokio::test]
async fn a_secret_volume_update_is_reloaded_and_a_bad_pair_is_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let (c1, k1) = pem(dir.path(), "one");
    let (c2, k2) = pem(dir.path(), "two");
    let (c3, _) = pem(dir.path(), "three");
    let vol_dir = dir.path().join("vol");
    let mut vol = SecretVolume::new(&vol_dir, &[("tls.crt", &c1), ("tls.key", &k1)]);
    let s = setup(vol.path("tls.crt"), vol.path("tls.key"), dir);
    start(&s, false);
    // The watch is in place before the update: inotify was set up synchronously in start().
    let first = s.certs.current();
    vol.update(&[("tls.crt", &c2), ("tls.key", &k2)]);
    until("the reload", || s.counters.reloads.get() == 1).await;
    let second = s.certs.current();
    assert!(
        !Arc::ptr_eq(&first, &second),
        "the configuration was not swapped"
    );

    // A certificate with another's key: tried for the settle time, then one failure.
    vol.update(&[("tls.crt", &c3), ("tls.key", &k2)]);
    until("the failure", || s.counters.failures.get() == 1).await;
    assert!(
        Arc::ptr_eq(&second, &s.certs.current()),
        "the bad pair was installed"
    );
    // Another file of the directory changes: the same bad pair is not counted again, and a
    // good update after it is reloaded (events are handled in order).
    std::fs::write(s.dir.join("vol/unrelated"), b"x").unwrap();
    vol.update(&[("tls.crt", &c1), ("tls.key", &k1)]);
    until("the second reload", || s.counters.reloads.get() == 2).await;
    assert_eq!(s.counters.failures.get(), 1);
}

#[tokio::test]
async fn a_certificate_then_its_key_written_in_place_is_one_reload_and_no_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (c1, k1) = pem(dir.path(), "one");
    let (c2, k2) = pem(dir.path(), "two");
    let tls = dir.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    std::fs::write(tls.join("cert.pem"), &c1).unwrap();
    std::fs::write(tls.join("key.pem"), &k1).unwrap();
    let s = setup(tls.join("cert.pem"), tls.join("key.pem"), dir);
    start(&s, false);
    // The certificate first: it does not match the old key, so the watcher waits for the
    // key (well within the settle time), then loads the pair.
    std::fs::write(tls.join("cert.pem"), &c2).unwrap();
    until("the half-written pair tried", || {
        s.counters.waits.get() == 1
    })
    .await;
    std::fs::write(tls.join("key.pem"), &k2).unwrap();
    until("the reload", || s.counters.reloads.get() == 1).await;
    assert_eq!(s.counters.failures.get(), 0);
}

#[tokio::test]
async fn without_inotify_the_poll_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let (c1, k1) = pem(dir.path(), "one");
    let (c2, k2) = pem(dir.path(), "two");
    let mut vol = SecretVolume::new(
        &dir.path().join("vol"),
        &[("tls.crt", &c1), ("tls.key", &k1)],
    );
    let s = setup(vol.path("tls.crt"), vol.path("tls.key"), dir);
    start(&s, true);
    vol.update(&[("tls.crt", &c2), ("tls.key", &k2)]);
    until("the reload", || s.counters.reloads.get() == 1).await;
    vol.update(&[("tls.crt", &c2), ("tls.key", &k1)]);
    until("the failure", || s.counters.failures.get() == 1).await;
}

/// Which events wake the watcher: the files', the kubelet writer's `..` entries and errors;
/// not another file of the directory (a log written beside the certificate), nor an open
/// (the watcher's own reads, which would wake it again and again).
#[test]
fn other_files_of_the_directory_and_its_own_reads_do_not_wake_it() {
    let names: HashSet<OsString> = ["tls.crt".into(), "tls.key".into()].into();
    let event = |kind, path: &str| Ok(notify::Event::new(kind).add_path(PathBuf::from(path)));
    use notify::event::{CreateKind, DataChange, ModifyKind};
    let modify = EventKind::Modify(ModifyKind::Data(DataChange::Any));
    assert!(concerns(&event(modify, "/tls/tls.crt"), &names));
    assert!(!concerns(&event(modify, "/tls/turn.log"), &names));
    assert!(concerns(
        &event(EventKind::Create(CreateKind::Any), "/tls/..data_tmp"),
        &names
    ));
    assert!(concerns(
        &event(
            EventKind::Create(CreateKind::Folder),
            "/tls/..2026_12_04_10_00_00.1"
        ),
        &names
    ));
    assert!(!concerns(
        &event(
            EventKind::Access(AccessKind::Open(notify::event::AccessMode::Any)),
            "/tls/tls.crt"
        ),
        &names
    ));
    assert!(concerns(
        &Err(notify::Error::generic("queue overflow")),
        &names
    ));
}

#[test]
fn a_directory_that_cannot_be_watched_falls_back_to_the_poll() {
    let f = files(
        PathBuf::from("/nonexistent-dir/cert.pem"),
        PathBuf::from("/nonexistent-dir/key.pem"),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        assert!(matches!(Source::new(&f, FAST), Source::Poll(_)));
    });
}
