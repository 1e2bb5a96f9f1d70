//! In-process tests of the connection engine over `tokio::io::duplex`, with a trivial
//! handler (the WAF itself is tested in `waf` and end to end through HAProxy).
use super::*;
use crate::engine::{Answer, Handler, Limits, Vars};
use crate::metrics::Metrics;
use bytes::BytesMut;
use lastcall::{Handle, Lifecycle, OnSigterm, TerminationConfig, Trigger};
use lastcall_spop_proto::frame::{self, decode_agent_frame, AgentFrame};
use parking_lot::Mutex;
use spop::frame::Message;
use spop::TypedData;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::DuplexStream;
use tokio::net::TcpListener;

/// Answers `verdict=ok`; blocks while the gate is closed.
struct Gated(Mutex<std::sync::mpsc::Receiver<()>>);

impl Handler for Gated {
    fn handle(&self, _: &[Message]) -> Answer {
        let _ = self.0.lock().recv_timeout(Duration::from_secs(20));
        Answer::from(vec![("verdict", TypedData::String("ok".into()))])
    }
}

/// A [`Gated`] handler that also says when an evaluation has started (and so is
/// blocked at the gate).
struct GatedTelling {
    gate: Gated,
    started: Mutex<std::sync::mpsc::Sender<()>>,
}

impl Handler for GatedTelling {
    fn handle(&self, messages: &[Message]) -> Answer {
        let _ = self.started.lock().send(());
        self.gate.handle(messages)
    }
}

struct Open;
impl Handler for Open {
    fn handle(&self, _: &[Message]) -> Answer {
        Answer::from(Vec::new())
    }
}

fn shared(handler: Arc<dyn Handler>, handle: &Handle) -> Arc<Engine> {
    Engine::new(
        handler,
        Arc::new(Metrics::default()),
        handle.clone(),
        2,
        limits(),
    )
}

/// The defaults, without rebalancing goodbyes (tested on their own): these tests hold a
/// connection longer than `rebalance_after`.
fn limits() -> Limits {
    Limits {
        rebalance_after: Duration::ZERO,
        ..Limits::default()
    }
}

/// Records the name of the thread each evaluation ran on; panics on request.
struct Where {
    threads: Mutex<Vec<String>>,
    panic: bool,
}

impl Handler for Where {
    fn handle(&self, _: &[Message]) -> Answer {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.threads.lock().push(name);
        assert!(!self.panic, "handler asked to panic");
        Answer::from(vec![("verdict", TypedData::String("ok".into()))])
    }
}

/// A lifecycle without signals (drain: no delay, 30 s timeout), running on the test's
/// runtime; its handle.
fn serving_lifecycle() -> Handle {
    let lc = Lifecycle::without_signals(TerminationConfig::new(
        OnSigterm::Drain,
        Duration::ZERO,
        Duration::from_secs(30),
    ));
    let handle = lc.handle();
    tokio::spawn(lc.run_with(futures_never()));
    handle
}

async fn evaluate_three(panic: bool, burst: bool) -> (Vec<AgentFrame>, Vec<String>) {
    let handle = serving_lifecycle();
    let handler = Arc::new(Where {
        threads: Mutex::new(Vec::new()),
        panic,
    });
    let limits = limits();
    let s = Engine::new(
        handler.clone(),
        Arc::new(Metrics::default()),
        handle,
        2,
        limits,
    );
    let mut c = connect(&s);
    assert!(matches!(
        hello(&mut c, false).await[..],
        [AgentFrame::Hello(_)]
    ));
    let mut frames = Vec::new();
    if burst {
        // Three pipelined NOTIFYs in one write.
        let mut three = notify(1);
        three.extend(notify(2));
        three.extend(notify(3));
        c.write_all(&three).await.unwrap();
        frames = read_frames(&mut c, 3).await.0;
    } else {
        // One at a time, each after the previous ACK.
        for sid in 1..=3 {
            c.write_all(&notify(sid)).await.unwrap();
            frames.extend(read_frames(&mut c, 1).await.0);
        }
    }
    let threads = handler.threads.lock().clone();
    (frames, threads)
}

/// With a single I/O thread the pool never evaluates on it: that thread must stay free
/// for timers, the other connections and the drain.
#[tokio::test]
async fn a_single_io_thread_leaves_every_evaluation_to_the_pool() {
    let (frames, threads) = evaluate_three(false, false).await;
    assert_eq!(frames.len(), 3, "{frames:?}");
    assert!(
        threads.iter().all(|t| t.starts_with("spoa-eval")),
        "{threads:?}"
    );
}

/// One at a time or pipelined, on a runtime with two I/O threads: every evaluation runs
/// on the pool, and each NOTIFY gets its ACK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_evaluation_runs_on_an_io_thread() {
    for burst in [false, true] {
        let (frames, threads) = evaluate_three(false, burst).await;
        let mut sids: Vec<u64> = frames
            .iter()
            .map(|f| match f {
                AgentFrame::Ack(sid, 1, vars) if vars[0].0 == "verdict" => *sid,
                other => panic!("{other:?}"),
            })
            .collect();
        if !burst {
            assert_eq!(sids, [1, 2, 3], "in order");
        }
        sids.sort_unstable();
        assert_eq!(sids, [1, 2, 3]);
        assert_eq!(threads.len(), 3);
        assert!(
            threads.iter().all(|t| t.starts_with("spoa-eval")),
            "{threads:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evaluation_that_panics_answers_the_error_variable() {
    let (frames, threads) = evaluate_three(true, false).await;
    assert_eq!(threads.len(), 3);
    for f in &frames {
        match f {
            AgentFrame::Ack(_, 1, vars) => assert_eq!(vars[0].0, "error", "{vars:?}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(frames.len(), 3);
}

/// At `evaluation_timeout` the NOTIFY is answered with the error variable while its
/// evaluation goes on; with `max_overruns` runaways running, the next NOTIFY is answered
/// at once; once the runaway ends, evaluations run again.
///
/// The budget is 1 s: the last NOTIFY's evaluation must start and end inside it, and with
/// 200 ms it did not once at load 11-14 (answered with the error variable after 3.2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_answers_for_a_runaway_and_bounds_them() {
    const BUDGET: Duration = Duration::from_secs(1);
    let handle = serving_lifecycle();
    let (tx, rx) = std::sync::mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    let s = Engine::new(
        Arc::new(Gated(Mutex::new(rx))),
        Arc::clone(&metrics),
        handle,
        1,
        Limits {
            evaluation_timeout: BUDGET,
            max_overruns: 1,
            ..limits()
        },
    );
    let mut c = connect(&s);
    assert!(matches!(
        hello(&mut c, false).await[..],
        [AgentFrame::Hello(_)]
    ));
    let started = Instant::now();
    c.write_all(&notify(1)).await.unwrap();
    let (frames, _, _) = read_frames(&mut c, 1).await;
    assert!(
        matches!(&frames[..], [AgentFrame::Ack(1, 1, vars)] if vars.last().is_some_and(|v| v.0 == "error")),
        "{frames:?}"
    );
    assert!(started.elapsed() >= BUDGET);
    // The watchdog counts after the ACK it sent (and only if it sent it): wait for both.
    let end = Instant::now() + Duration::from_secs(20);
    while metrics.failed_closed_with("deadline") < 1 || metrics.overrunning.get() < 1 {
        assert!(Instant::now() < end, "the deadline's counters");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(metrics.failed_closed_with("deadline"), 1);
    assert_eq!(metrics.overrunning.get(), 1);
    // Saturated: answered at once, without an evaluation.
    c.write_all(&notify(2)).await.unwrap();
    let (frames, _, _) = read_frames(&mut c, 1).await;
    assert!(
        matches!(&frames[..], [AgentFrame::Ack(2, 1, vars)] if vars.last().is_some_and(|v| v.0 == "error")),
        "{frames:?}"
    );
    assert_eq!(metrics.failed_closed_with("overloaded"), 1);
    // The runaway ends (its answer is dropped); the next NOTIFY is evaluated.
    tx.send(()).unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while metrics.overrunning.get() > 0 {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    c.write_all(&notify(3)).await.unwrap();
    tx.send(()).unwrap();
    let (frames, _, _) = read_frames(&mut c, 1).await;
    assert!(
        matches!(&frames[..], [AgentFrame::Ack(3, 1, vars)] if vars[0].0 == "verdict"),
        "{frames:?}"
    );
}

/// An evaluation that does not end (held at a gate) on an otherwise idle two-thread
/// runtime: the listener still accepts, and another connection's health check is still
/// answered, over real sockets (an evaluation on an I/O thread would leave the I/O driver
/// unpolled while the other thread sleeps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_evaluation_never_holds_up_the_runtime() {
    let daemon = lastcall::Daemon::start_with(
        TerminationConfig::new(OnSigterm::Drain, Duration::ZERO, Duration::from_secs(30)),
        futures_never(),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let (started_tx, started) = std::sync::mpsc::channel();
    let handler = GatedTelling {
        gate: Gated(Mutex::new(rx)),
        started: Mutex::new(started_tx),
    };
    let s = shared(Arc::new(handler), daemon.handle());
    let listener = crate::engine::Listener::bind(&crate::engine::Bind::Tcp("127.0.0.1:0".into()))
        .await
        .unwrap();
    let addr: std::net::SocketAddr = listener.local_addr().parse().unwrap();
    let conns = Arc::clone(&s);
    daemon.accept(
        listener,
        lastcall::AcceptUntil::Exiting,
        move |conn, watch| crate::engine::serve_accepted(conn, Arc::clone(&conns), watch),
    );
    daemon.ready();
    let clients = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let exchange = |bytes: &[u8], busy: &mut Vec<std::net::TcpStream>| {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.write_all(bytes).unwrap();
            let mut got = [0u8; 4];
            let answered = c.read_exact(&mut got).is_ok();
            busy.push(c);
            answered
        };
        let mut conns = Vec::new();
        let mut first = Vec::new();
        frame::encode_haproxy_hello(16380, false, &mut first);
        assert!(exchange(&first, &mut conns), "the first HELLO");
        conns[0].write_all(&notify(1)).unwrap();
        // The evaluation has started and blocks at the gate.
        started
            .recv_timeout(Duration::from_secs(10))
            .expect("the evaluation started");
        let mut check = Vec::new();
        frame::encode_haproxy_hello(16380, true, &mut check);
        let started = std::time::Instant::now();
        let answered = exchange(&check, &mut conns);
        (answered, started.elapsed())
    });
    let (answered, took) = clients.await.unwrap();
    tx.send(()).unwrap();
    assert!(answered, "the health check was not answered within 10 s");
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
}

fn connect(shared: &Arc<Engine>) -> DuplexStream {
    connect_counting(shared).0
}

/// Also returns the size of every `poll_write` the agent made on this connection.
fn connect_counting(shared: &Arc<Engine>) -> (DuplexStream, Arc<Mutex<Vec<usize>>>) {
    let (client, server) = tokio::io::duplex(1 << 16);
    let writes = Arc::new(Mutex::new(Vec::new()));
    let io = Counting {
        inner: server,
        writes: Arc::clone(&writes),
    };
    tokio::spawn(serve_conn(
        io,
        Some([127, 0, 0, 1].into()),
        Arc::clone(shared),
    ));
    (client, writes)
}

struct Counting {
    inner: DuplexStream,
    writes: Arc<Mutex<Vec<usize>>>,
}

impl AsyncRead for Counting {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counting {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            self.writes.lock().push(*n);
        }
        r
    }
    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Reads frames until `n` are decoded or EOF; also returns how many reads it took.
async fn read_frames(c: &mut DuplexStream, n: usize) -> (Vec<AgentFrame>, usize, bool) {
    let mut buf = BytesMut::with_capacity(1 << 16);
    let mut out = Vec::new();
    let mut reads = 0;
    loop {
        while let Some(f) = decode_agent_frame(&mut buf).unwrap() {
            out.push(f);
        }
        if out.len() >= n {
            return (out, reads, false);
        }
        // Longer than the agent's 30 s partial-frame timeout (the clock may be paused).
        let got = tokio::time::timeout(Duration::from_secs(60), c.read_buf(&mut buf))
            .await
            .expect("agent answered in time")
            .unwrap();
        reads += 1;
        if got == 0 {
            return (out, reads, true);
        }
    }
}

async fn hello(c: &mut DuplexStream, healthcheck: bool) -> Vec<AgentFrame> {
    let mut v = Vec::new();
    frame::encode_haproxy_hello(16380, healthcheck, &mut v);
    c.write_all(&v).await.unwrap();
    read_frames(c, 1).await.0
}

fn notify(sid: u64) -> Vec<u8> {
    let mut v = Vec::new();
    let msg = Message {
        name: "coraza-req".into(),
        args: vec![],
    };
    frame::encode_notify(sid, 1, &msg, &mut v);
    v
}

#[tokio::test]
async fn refusing_closes_with_last_ack_and_disconnect_in_one_write() {
    let handle = serving_lifecycle();
    let (tx, rx) = std::sync::mpsc::channel();
    let s = shared(Arc::new(Gated(Mutex::new(rx))), &handle);

    let (mut busy, busy_writes) = connect_counting(&s);
    assert!(matches!(
        hello(&mut busy, false).await[..],
        [AgentFrame::Hello(_)]
    ));
    let mut idle = connect(&s);
    assert!(matches!(
        hello(&mut idle, false).await[..],
        [AgentFrame::Hello(_)]
    ));
    busy.write_all(&notify(7)).await.unwrap();
    // Wait until the evaluation is in flight.
    while s.metrics.inflight.get() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    handle.start_drain(Trigger::Sigterm);
    handle.refusing().await;

    // The idle connection says goodbye at once.
    let (frames, _, eof) = read_frames(&mut idle, 2).await;
    assert!(
        matches!(frames[..], [AgentFrame::Disconnect(0, _)]),
        "{frames:?}"
    );
    assert!(eof);

    // New connections and health checks are refused politely.
    let mut late = connect(&s);
    assert!(matches!(
        hello(&mut late, false).await[..],
        [AgentFrame::Disconnect(0, _)]
    ));

    // The busy one finishes its evaluation: ACK + DISCONNECT arrive in one read.
    tx.send(()).unwrap();
    let (frames, _, _) = read_frames(&mut busy, 2).await;
    match &frames[..] {
        [AgentFrame::Ack(7, 1, vars), AgentFrame::Disconnect(0, _)] => {
            assert_eq!(vars[0].0, "verdict");
        }
        other => panic!("{other:?}"),
    }
    // Writes on this connection: AGENT-HELLO, then ACK + DISCONNECT together.
    let writes = busy_writes.lock().clone();
    assert_eq!(writes.len(), 2, "one write per frame group: {writes:?}");
    let (rest, _, eof) = read_frames(&mut busy, 1).await;
    assert!(
        rest.is_empty() && eof,
        "closed after the DISCONNECT: {rest:?}"
    );
}

/// Announcing serves everything, health checks included: HAProxy keeps the agent UP until
/// it refuses work, so that it marks it DOWN only once its connections have said goodbye
/// (`on-marked-down shutdown-sessions` then cuts none). Refusing refuses both.
#[tokio::test]
async fn announcing_serves_health_checks_and_hellos_refusing_neither() {
    let lc = Lifecycle::without_signals(TerminationConfig::new(
        OnSigterm::Drain,
        Duration::from_millis(300),
        Duration::from_secs(120),
    ));
    let handle = lc.handle();
    tokio::spawn(lc.run_with(futures_never()));
    let s = shared(Arc::new(Open), &handle);
    let mut hc = connect(&s);
    assert!(matches!(
        hello(&mut hc, true).await[..],
        [AgentFrame::Hello(_)]
    ));

    handle.start_drain(Trigger::Sigterm);
    handle.drain_started().await;
    let mut hc = connect(&s);
    assert!(matches!(
        hello(&mut hc, true).await[..],
        [AgentFrame::Hello(_)]
    ));
    let mut normal = connect(&s);
    assert!(matches!(
        hello(&mut normal, false).await[..],
        [AgentFrame::Hello(_)]
    ));
    normal.write_all(&notify(1)).await.unwrap();
    let (frames, _, _) = read_frames(&mut normal, 1).await;
    assert!(matches!(frames[..], [AgentFrame::Ack(1, 1, _)]));

    handle.refusing().await;
    for healthcheck in [true, false] {
        let mut late = connect(&s);
        assert!(matches!(
            hello(&mut late, healthcheck).await[..],
            [AgentFrame::Disconnect(0, _)]
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn unfinished_frame_times_out_with_status_2() {
    let lc = Lifecycle::without_signals(TerminationConfig::new(
        OnSigterm::Drain,
        Duration::ZERO,
        Duration::from_secs(30),
    ));
    let s = shared(Arc::new(Open), &lc.handle());
    let mut c = connect(&s);
    c.write_all(&[0, 0, 0, 50, 1]).await.unwrap();
    let (frames, _, eof) = read_frames(&mut c, 1).await;
    assert!(
        matches!(frames[..], [AgentFrame::Disconnect(2, _)]),
        "{frames:?}"
    );
    let _ = eof;
}

#[tokio::test]
async fn deadline_closes_what_is_left() {
    let lc = Lifecycle::without_signals(TerminationConfig::new(
        OnSigterm::Drain,
        Duration::ZERO,
        Duration::from_millis(300),
    ));
    let handle = lc.handle();
    let run = tokio::spawn(lc.run_with(futures_never()));
    let (tx, rx) = std::sync::mpsc::channel();
    let s = shared(Arc::new(Gated(Mutex::new(rx))), &handle);
    let mut c = connect(&s);
    assert!(matches!(
        hello(&mut c, false).await[..],
        [AgentFrame::Hello(_)]
    ));
    c.write_all(&notify(3)).await.unwrap();
    while s.metrics.inflight.get() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    handle.start_drain(Trigger::Sigterm);
    // The evaluation never finishes: at the deadline the connection gets its goodbye.
    let (frames, _, eof) = read_frames(&mut c, 2).await;
    assert!(
        matches!(frames[..], [AgentFrame::Disconnect(0, _)]),
        "{frames:?}"
    );
    assert!(eof);
    let outcome = run.await.unwrap();
    assert_eq!(outcome.exit_code(), lastcall::exit::DEADLINE);
    tx.send(()).unwrap();
}

/// The socket itself is asked: bytes written by the peer are seen as unread before any
/// read, and not once they were read.
#[tokio::test]
async fn unread_asks_the_socket() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let (mut rd, _wr) = server.into_split();
    assert_eq!(rd.unread(), Some(false));
    client.write_all(b"notify").await.unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while rd.unread() != Some(true) {
        assert!(Instant::now() < end, "bytes never seen");
        tokio::task::yield_now().await;
    }
    let mut buf = [0u8; 6];
    rd.read_exact(&mut buf).await.unwrap();
    assert_eq!(rd.unread(), Some(false));
    let (duplex_rd, _) = tokio::io::split(tokio::io::duplex(8).0);
    assert_eq!(duplex_rd.unread(), None);
}

/// Without pipelining (an engine limit, off by default) the AGENT-HELLO does not announce
/// it, and a refusing connection closes with the ACK of its only NOTIFY.
#[tokio::test]
async fn without_pipelining_the_goodbye_rides_on_the_ack() {
    let handle = serving_lifecycle();
    let (tx, rx) = std::sync::mpsc::channel();
    let s = Engine::new(
        Arc::new(Gated(Mutex::new(rx))),
        Arc::new(Metrics::default()),
        handle.clone(),
        2,
        Limits {
            pipelining: false,
            ..limits()
        },
    );
    let mut c = connect(&s);
    match &hello(&mut c, false).await[..] {
        [AgentFrame::Hello(kv)] => assert!(
            !kv.iter()
                .any(|(_, v)| matches!(v, TypedData::String(t) if t.contains("pipelining"))),
            "{kv:?}"
        ),
        other => panic!("{other:?}"),
    }
    c.write_all(&notify(5)).await.unwrap();
    while s.metrics.inflight.get() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    handle.start_drain(Trigger::Sigterm);
    handle.refusing().await;
    tx.send(()).unwrap();
    let (frames, _, _) = read_frames(&mut c, 2).await;
    assert!(
        matches!(
            frames[..],
            [AgentFrame::Ack(5, 1, _), AgentFrame::Disconnect(0, _)]
        ),
        "{frames:?}"
    );
}

/// Answers inline when told to; panics when asked to evaluate a `coraza-req` with
/// `boom` in its name, counts the other evaluations.
struct Split(std::sync::atomic::AtomicUsize);

impl Handler for Split {
    fn handle(&self, m: &[Message]) -> Answer {
        assert!(!m.iter().any(|m| m.name.contains("boom")), "boom");
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Answer::from(vec![("verdict", TypedData::String("pool".into()))])
    }
    fn answer_inline(&self, m: &[Message]) -> Option<Vars> {
        m.iter()
            .all(|m| m.name == "inline")
            .then(|| vec![("verdict", TypedData::String("inline".into()))])
    }
}

fn notify_named(sid: u64, name: &str) -> Vec<u8> {
    let mut v = Vec::new();
    let msg = Message {
        name: name.into(),
        args: vec![],
    };
    frame::encode_notify(sid, 1, &msg, &mut v);
    v
}

/// Messages that need no engine work are answered on the connection task; a panicking
/// evaluation is answered with an error and the pool goes on.
#[tokio::test]
async fn inline_answers_and_a_panicking_evaluation() {
    let lc = Lifecycle::without_signals(TerminationConfig::new(
        OnSigterm::Drain,
        Duration::ZERO,
        Duration::from_secs(30),
    ));
    let split = Arc::new(Split(std::sync::atomic::AtomicUsize::new(0)));
    let s = shared(split.clone(), &lc.handle());
    let mut c = connect(&s);
    assert!(matches!(
        hello(&mut c, false).await[..],
        [AgentFrame::Hello(_)]
    ));
    let mut all = notify_named(1, "inline");
    all.extend(notify_named(2, "coraza-req"));
    all.extend(notify_named(3, "boom"));
    all.extend(notify_named(4, "coraza-req"));
    c.write_all(&all).await.unwrap();
    let (frames, _, _) = read_frames(&mut c, 4).await;
    let mut got: Vec<(u64, String)> = frames
        .iter()
        .map(|f| match f {
            AgentFrame::Ack(sid, 1, vars) => (*sid, format!("{:?}", vars[0])),
            other => panic!("{other:?}"),
        })
        .collect();
    got.sort();
    assert!(got[0].1.contains("inline"), "{got:?}");
    assert!(got[1].1.contains("pool"), "{got:?}");
    assert!(
        got[2].1.contains("error") && got[2].1.contains("99"),
        "{got:?}"
    );
    assert!(got[3].1.contains("pool"), "{got:?}");
    assert_eq!(split.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(s.metrics.inflight.get(), 0);
    assert!(s.stop_workers(Duration::from_secs(20)));
}

fn futures_never() -> impl futures::Stream<Item = Trigger> + Send + 'static {
    futures::stream::pending()
}
