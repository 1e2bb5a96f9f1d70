//! The serve entry ([`Daemon`]): the Starting phase and its readiness latch, the per-
//! connection [`Watch`], accept loops, and the time after the exit decision, counted inside
//! `--drain-timeout` (paused clock where only timers are involved; real loopback sockets and
//! the real clock, with generous bounds, where sockets or threads are).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use futures::channel::mpsc::{unbounded, UnboundedSender};
use lastcall::{
    AcceptUntil, Daemon, EndReason, OnSigterm, PeerId, Phase, Seen, TerminationConfig, Trigger,
    EXIT_GRACE,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn peer(n: u8) -> PeerId {
    PeerId::from(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)))
}

fn daemon(policy: OnSigterm, delay: u64, timeout: u64) -> (Daemon, UnboundedSender<Trigger>) {
    let (tx, rx) = unbounded();
    let config = TerminationConfig::new(policy, s(delay), s(timeout));
    (Daemon::start_with(config, rx), tx)
}

/// Lets every ready task run, without advancing the paused clock.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn readiness_stays_down_while_starting_and_rises_at_ready() {
    let (daemon, _tx) = daemon(OnSigterm::Drain, 5, 30);
    let h = daemon.handle().clone();
    let mut watch = h.watch();
    settle().await;
    assert_eq!(h.phase(), Phase::Starting);
    assert!(!h.is_ready(), "readiness 503 while starting");
    assert!(h.is_accepting(), "nothing is refused while starting");
    assert!(!h.is_draining());
    assert_eq!(h.status().phase, Phase::Starting);
    tokio::time::sleep(s(600)).await;
    assert_eq!(h.phase(), Phase::Starting, "starting has no time limit");

    daemon.ready();
    let seen = watch.changed().await;
    assert_eq!(
        seen,
        Seen {
            phase: Phase::Serving,
            exiting: false,
            held: false,
        }
    );
    assert!(h.is_ready());
    assert!(!watch.is_refusing() && !watch.is_exiting());
    // A hold wakes the watches when the first is taken and when the last is released.
    let first = h.hold();
    assert!(watch.changed().await.held);
    let second = h.hold();
    drop(first);
    assert_eq!((h.holds(), watch.now().held), (1, true));
    drop(second);
    assert!(!watch.changed().await.held);
    assert_eq!(h.status().holds, 0);
}

#[tokio::test(start_paused = true)]
async fn a_sigterm_while_starting_with_nothing_live_leaves_at_once() {
    let (daemon, tx) = daemon(OnSigterm::Drain, 5, 30);
    let h = daemon.handle().clone();
    let t0 = Instant::now();
    tx.unbounded_send(Trigger::Sigterm).unwrap();
    h.exiting().await;
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "no shutdown delay while starting"
    );
    let served = daemon.serve().await;
    assert_eq!(served.outcome.reason, EndReason::Idle);
    assert_eq!(served.exit_code(), 0);
    assert!(served.is_clean());
    assert_eq!(served.teardown, Duration::ZERO);
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

/// `ready()` and a signal pending at the same instant: the signal comes after, as it was
/// sent after (a test, or the kubelet, reacting to the "listening" line).
#[tokio::test(start_paused = true)]
async fn a_signal_sent_after_ready_finds_the_daemon_serving() {
    let (daemon, tx) = daemon(OnSigterm::Drain, 5, 30);
    let h = daemon.handle().clone();
    let _session = h.session(peer(1));
    daemon.ready();
    tx.unbounded_send(Trigger::Sigterm).unwrap();
    h.drain_started().await;
    assert_eq!(h.phase(), Phase::Announcing, "the delay is not skipped");
}

#[tokio::test(start_paused = true)]
async fn a_watch_wakes_once_per_change() {
    let (daemon, tx) = daemon(OnSigterm::Drain, 5, 30);
    let h = daemon.handle().clone();
    daemon.ready();
    settle().await;
    let mut watch = h.watch();
    let _session = h.session(peer(1));
    let t0 = Instant::now();
    tx.unbounded_send(Trigger::Sigterm).unwrap();
    let seen = watch.changed().await;
    assert_eq!((seen.phase, seen.exiting), (Phase::Announcing, false));
    assert!(!watch.is_refusing(), "announcing still accepts");
    let seen = watch.changed().await;
    assert_eq!(
        (seen.phase, seen.exiting, t0.elapsed()),
        (Phase::Refusing, false, s(5))
    );
    assert!(watch.is_refusing() && !watch.is_exiting());
    let seen = watch.changed().await;
    assert_eq!(
        (seen.phase, seen.exiting, t0.elapsed()),
        (Phase::Refusing, true, s(30))
    );
    assert!(watch.is_exiting());
    // Nothing changes after the exit decision.
    assert!(
        tokio::time::timeout(s(60), watch.changed()).await.is_err(),
        "changed after exiting"
    );
    drop(_session);
    let served = daemon.serve().await;
    assert_eq!(served.exit_code(), lastcall::exit::DEADLINE);
}

/// A tracked task that ignores the exit (a connection stuck in a write, an evaluation that
/// runs for minutes): the daemon still returns at the deadline plus `EXIT_GRACE`, not later.
#[tokio::test(start_paused = true)]
async fn the_deadline_is_the_deadline_for_tasks_that_do_not_end() {
    let (daemon, tx) = daemon(OnSigterm::Drain, 0, 10);
    let h = daemon.handle().clone();
    daemon.ready();
    let session = h.session(peer(1));
    daemon.spawn(async move {
        let _session = session;
        tokio::time::sleep(s(3600)).await;
    });
    let t0 = Instant::now();
    tx.unbounded_send(Trigger::Sigterm).unwrap();
    let served = daemon.serve().await;
    assert_eq!(t0.elapsed(), s(10) + EXIT_GRACE);
    assert_eq!(served.teardown, EXIT_GRACE);
    assert_eq!(served.outcome.reason, EndReason::Deadline);
    assert_eq!(served.exit_code(), lastcall::exit::DEADLINE);
    assert_eq!(served.tasks_left, 1);
    assert!(!served.is_clean());
}

/// Tasks that end at the exit decision: no time is spent after it.
#[tokio::test(start_paused = true)]
async fn tasks_that_end_at_the_decision_cost_no_time() {
    let (daemon, tx) = daemon(OnSigterm::Drain, 0, 10);
    let h = daemon.handle().clone();
    daemon.ready();
    for n in 0..3 {
        let session = h.session(peer(n));
        let mut watch = h.watch();
        daemon.spawn(async move {
            let _session = session;
            while !watch.is_exiting() {
                watch.changed().await;
            }
        });
    }
    let t0 = Instant::now();
    tx.unbounded_send(Trigger::Sigterm).unwrap();
    let served = daemon.serve().await;
    assert_eq!(t0.elapsed(), s(10), "the deadline, and not a moment more");
    assert_eq!(served.teardown, Duration::ZERO);
    assert!(served.is_clean(), "{served:?}");
    assert_eq!(served.outcome.sessions_cut(), 3);
}

/// A forced exit gives the tasks `EXIT_GRACE`, however far the deadline is.
#[tokio::test(start_paused = true)]
async fn a_forced_exit_gives_the_tasks_only_the_grace() {
    let (daemon, tx) = daemon(OnSigterm::Drain, 5, 3600);
    let h = daemon.handle().clone();
    daemon.ready();
    let session = h.session(peer(1));
    daemon.spawn(async move {
        let _session = session;
        std::future::pending::<()>().await;
    });
    let t0 = Instant::now();
    tx.unbounded_send(Trigger::Sigterm).unwrap();
    tokio::time::sleep(s(2)).await;
    tx.unbounded_send(Trigger::Sigterm).unwrap();
    let served = daemon.serve().await;
    assert_eq!(t0.elapsed(), s(2) + EXIT_GRACE);
    assert_eq!(served.exit_code(), lastcall::exit::FORCED);
    assert_eq!(served.tasks_left, 1);
}

/// An exit hook is given what is left of the deadline plus the grace, and is left behind
/// when it takes longer.
#[tokio::test(start_paused = true)]
async fn an_exit_hook_gets_what_is_left_of_the_deadline() {
    let (mut daemon, tx) = daemon(OnSigterm::Drain, 0, 10);
    let h = daemon.handle().clone();
    daemon.ready();
    let session = h.session(peer(1));
    let (budget_tx, budget_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    daemon.on_exit("stuck", move |budget| {
        budget_tx.send(budget).unwrap();
        let _ = release_rx.recv();
        true
    });
    let t0 = Instant::now();
    tx.unbounded_send(Trigger::Sigterm).unwrap();
    tokio::time::sleep(s(3)).await;
    drop(session); // idle at 3 s: the exit is decided
    let served = daemon.serve().await;
    let budget = budget_rx.recv().unwrap();
    assert_eq!(budget, s(10 - 3) + EXIT_GRACE);
    assert_eq!(t0.elapsed(), s(10) + EXIT_GRACE);
    assert_eq!(served.outcome.reason, EndReason::Idle);
    assert_eq!(served.exit_code(), 0, "nothing was cut");
    assert_eq!(served.hooks_unfinished, ["stuck"]);
    release_tx.send(()).unwrap();
}

/// Hooks that finish, fail or panic (real clock: hooks run on threads of their own).
#[tokio::test]
async fn exit_hooks_run_in_order_and_report_how_they_ended() {
    let (mut daemon, tx) = daemon(OnSigterm::Drain, 0, 60);
    daemon.ready();
    let order = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    for (name, result) in [("first", true), ("failing", false), ("last", true)] {
        let order = order.clone();
        daemon.on_exit(name, move |budget| {
            assert!(budget > s(50), "{budget:?}");
            order.lock().push(name);
            result
        });
    }
    daemon.on_exit("panicking", |_| panic!("a hook that panics"));
    let t0 = std::time::Instant::now();
    tx.unbounded_send(Trigger::Sigterm).unwrap();
    let served = daemon.serve().await;
    let took = t0.elapsed();
    println!("exit hooks done {took:?} after SIGTERM");
    assert!(took < s(20), "{took:?}");
    assert_eq!(*order.lock(), ["first", "failing", "last"]);
    assert_eq!(served.hooks_unfinished, ["failing", "panicking"]);
    assert_eq!(served.exit_code(), 0);
}

/// Waits (real clock, bounded) until the live session count is `n`.
async fn sessions_become(h: &lastcall::Handle, n: u64) {
    let t0 = std::time::Instant::now();
    while h.sessions() != n {
        assert!(t0.elapsed() < s(20), "{} sessions, not {n}", h.sessions());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn echo_once(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(b"x").await?;
    let mut back = [0u8; 1];
    stream.read_exact(&mut back).await?;
    Ok(stream)
}

/// Accept loops on real loopback sockets: `Refusing` closes the listener at Refusing,
/// `Exiting` keeps it open until the exit; connection tasks are waited for.
#[tokio::test]
async fn accept_loops_close_their_listeners_when_told() {
    let (daemon, tx) = daemon(OnSigterm::Drain, 0, 60);
    let h = daemon.handle().clone();
    let serve = |(mut stream, peer): (tokio::net::TcpStream, std::net::SocketAddr),
                 mut watch: lastcall::Watch| async move {
        let _session = watch.handle().session(PeerId::from(peer));
        let mut buf = [0u8; 64];
        while !watch.is_exiting() {
            tokio::select! {
                read = stream.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => { let _ = stream.write_all(&buf[..n]).await; }
                },
                _ = watch.changed() => {}
            }
        }
    };
    let refusing = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let exiting = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (a, b) = (
        refusing.local_addr().unwrap(),
        exiting.local_addr().unwrap(),
    );
    daemon.accept(refusing, AcceptUntil::Refusing, serve);
    daemon.accept(exiting, AcceptUntil::Exiting, serve);
    daemon.ready();
    let open = echo_once(a).await.unwrap();
    echo_once(b).await.unwrap();
    sessions_become(&h, 1).await; // the second one closed

    tx.unbounded_send(Trigger::Sigterm).unwrap();
    h.refusing().await;
    // The Refusing listener closes (new connections refused by the kernel)...
    let t0 = std::time::Instant::now();
    loop {
        match tokio::net::TcpStream::connect(a).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            _ => assert!(t0.elapsed() < s(20), "listener {a} still open"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ... the Exiting one keeps accepting while refusing.
    let late = echo_once(b).await.unwrap();
    sessions_become(&h, 2).await;
    drop(open);
    drop(late);
    let served = daemon.serve().await;
    assert!(served.is_clean(), "{served:?}");
    assert_eq!(served.outcome.reason, EndReason::Idle);
    assert!(
        tokio::net::TcpStream::connect(b).await.is_err(),
        "closed at exit"
    );
}
