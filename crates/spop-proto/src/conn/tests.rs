//! [`Conn`] on its own, with explicit instants: the handshake and protocol errors, then the
//! drain policy as tables (phase × state × input → action).

use std::time::Duration;

use bytes::BytesMut;
use lastcall_phase::{Phase, Seen};
use spop::frame::Message;
use std::time::Instant;

use super::*;
use crate::frame::{decode_agent_frame, AgentFrame};

const SERVING: Seen = Seen::SERVING;
// Draining, a HAProxy still has the agent UP (a hold is left) unless the name says DOWN.
const ANNOUNCING: Seen = Seen {
    phase: Phase::Announcing,
    exiting: false,
    held: true,
};
const REFUSING: Seen = Seen {
    phase: Phase::Refusing,
    exiting: false,
    held: true,
};
/// Refusing, and every HAProxy has marked the agent DOWN (no hold left).
const REFUSING_DOWN: Seen = Seen {
    phase: Phase::Refusing,
    exiting: false,
    held: false,
};
const LINGERING: Seen = Seen {
    phase: Phase::Lingering,
    exiting: false,
    held: true,
};
const EXITING: Seen = Seen {
    phase: Phase::Refusing,
    exiting: true,
    held: true,
};

fn settings() -> Settings {
    Settings {
        max_frame_size: 1 << 20,
        pipelining: true,
        max_inflight: 4,
        max_unsent: 64 * 1024,
        drain_quiet: Duration::ZERO,
        rebalance: Rebalance::OFF,
        partial_frame_timeout: Duration::from_secs(30),
        // Off in the tables (tested on their own in `timeouts`).
        hello_timeout: Duration::MAX,
        idle_timeout: Duration::MAX,
    }
}

fn agent_frames(bytes: &[u8]) -> Vec<AgentFrame> {
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    while let Some(f) = decode_agent_frame(&mut buf).unwrap() {
        out.push(f);
    }
    assert!(buf.is_empty());
    out
}

fn hello(healthcheck: bool) -> Vec<u8> {
    let mut v = Vec::new();
    frame::encode_haproxy_hello(16380, healthcheck, &mut v);
    v
}

/// HAPROXY-HELLO without `pipelining` in its capabilities.
fn hello_without_pipelining() -> Vec<u8> {
    let mut payload = Vec::new();
    payload::put_kv(
        &mut payload,
        "supported-versions",
        &spop::TypedData::String("2.0".into()),
    );
    payload::put_kv(
        &mut payload,
        "max-frame-size",
        &spop::TypedData::UInt32(16380),
    );
    payload::put_kv(
        &mut payload,
        "capabilities",
        &spop::TypedData::String(String::new()),
    );
    let mut v = Vec::new();
    frame::put_frame(kind::HAPROXY_HELLO, 0, 0, &payload, &mut v);
    v
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

/// A wait, reduced to whether it reads and until when.
fn waits(action: Action) -> (bool, Option<Instant>) {
    match action {
        Action::Wait(w) => (w.read.is_some(), w.until),
        other => panic!("not a wait: {other:?}"),
    }
}

fn feed(c: &mut Conn, bytes: &[u8]) {
    c.buffer().extend_from_slice(bytes);
}

#[test]
fn handshake_then_notify() {
    let t0 = Instant::now();
    let mut c = Conn::new(settings(), SERVING, t0);
    feed(&mut c, &hello(false));
    let Some(Event::Ready { reply, negotiated }) = c.poll(t0) else {
        panic!("expected Ready");
    };
    assert_eq!(negotiated.max_frame_size, 16380);
    assert_eq!(c.max_frame_size(), 16380);
    match &agent_frames(&reply)[..] {
        [AgentFrame::Hello(kv)] => {
            assert!(kv.contains(&(
                "capabilities".into(),
                spop::TypedData::String("pipelining".into())
            )));
            assert!(kv.contains(&("version".into(), spop::TypedData::String("2.0".into()))));
        }
        other => panic!("{other:?}"),
    }
    feed(&mut c, &notify(2));
    assert!(matches!(
        c.poll(t0),
        Some(Event::Notify {
            stream_id: 2,
            frame_id: 1,
            ..
        })
    ));
    assert_eq!(c.owed(), 1);
    assert!(c.poll(t0).is_none());
}

#[test]
fn notify_before_hello_is_invalid() {
    let t0 = Instant::now();
    let mut c = Conn::new(settings(), SERVING, t0);
    feed(&mut c, &notify(1));
    match c.poll(t0) {
        Some(Event::Close { reply, .. }) => {
            assert!(matches!(
                agent_frames(&reply)[..],
                [AgentFrame::Disconnect(4, _)]
            ));
        }
        other => panic!("{other:?}"),
    }
    feed(&mut c, &notify(1));
    assert!(c.poll(t0).is_none(), "nothing after the close");
}

#[test]
fn haproxy_disconnect_is_answered_with_status_0() {
    let t0 = Instant::now();
    let mut c = Conn::new(settings(), SERVING, t0);
    feed(&mut c, &hello(false));
    let _ = c.poll(t0);
    let mut v = Vec::new();
    frame::encode_haproxy_disconnect(0, "bye", &mut v);
    feed(&mut c, &v);
    match c.poll(t0) {
        Some(Event::Close {
            reply,
            reason: CloseReason::PeerDisconnect(0),
        }) => {
            assert!(matches!(
                agent_frames(&reply)[..],
                [AgentFrame::Disconnect(0, _)]
            ));
        }
        other => panic!("{other:?}"),
    }
}

/// Before the handshake a frame may not be larger than a HELLO needs, whatever
/// `max_frame_size` says; HELLO and HAPROXY-DISCONNECT must carry stream-id and frame-id 0.
#[test]
fn strangers_before_and_at_the_handshake() {
    let t0 = Instant::now();
    let mut c = Conn::new(settings(), SERVING, t0);
    feed(&mut c, &(1u32 << 20).saturating_sub(1).to_be_bytes());
    match c.poll(t0) {
        Some(Event::Close { reply, reason }) => {
            assert!(matches!(reason, CloseReason::Protocol(_)));
            assert!(matches!(
                &agent_frames(&reply)[..],
                [AgentFrame::Disconnect(3, m)] if m.contains("before HAPROXY-HELLO")
            ));
        }
        other => panic!("{other:?}"),
    }
    let c = Conn::new(settings(), SERVING, t0);
    assert!(c.read_room() <= HELLO_FRAME_LIMIT as usize + 4);

    for (kind, sid, fid) in [
        (kind::HAPROXY_HELLO, 1, 0),
        (kind::HAPROXY_HELLO, 0, 7),
        (kind::HAPROXY_DISCONNECT, 3, 3),
    ] {
        let mut c = Conn::new(settings(), SERVING, t0);
        if kind == kind::HAPROXY_DISCONNECT {
            feed(&mut c, &hello(false));
            assert!(matches!(c.poll(t0), Some(Event::Ready { .. })));
        }
        let mut whole = Vec::new();
        frame::encode_haproxy_hello(16380, false, &mut whole);
        let mut payload = Vec::new();
        payload::put_kv(&mut payload, "status-code", &spop::TypedData::UInt32(0));
        let body = if kind == kind::HAPROXY_HELLO {
            // The HELLO's own payload, after its 4-byte length, type, flags and two ids.
            whole[11..].to_vec()
        } else {
            payload
        };
        let mut v = Vec::new();
        frame::put_frame(kind, sid, fid, &body, &mut v);
        feed(&mut c, &v);
        match c.poll(t0) {
            Some(Event::Close { reply, .. }) => assert!(
                matches!(&agent_frames(&reply)[..], [AgentFrame::Disconnect(4, m)] if m.contains("must be 0")),
                "{kind} {sid} {fid}"
            ),
            other => panic!("{kind} {sid} {fid}: {other:?}"),
        }
    }
}

/// `hello_timeout` closes a connection that has not said HELLO (status 2); `idle_timeout`
/// closes a quiet one after a look at the socket (status 0), and any traffic restarts it.
#[test]
fn timeouts() {
    let t0 = Instant::now();
    let s = Settings {
        hello_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(600),
        ..settings()
    };
    let mut c = Conn::new(s, SERVING, t0);
    assert_eq!(
        waits(c.handle(t0, Input::Nothing)),
        (true, Some(t0 + Duration::from_secs(10)))
    );
    match c.handle(t0 + Duration::from_secs(10), Input::Timeout) {
        Action::Close {
            bytes,
            reason: CloseReason::HelloTimeout,
        } => assert!(matches!(
            agent_frames(&bytes)[..],
            [AgentFrame::Disconnect(2, _)]
        )),
        other => panic!("{other:?}"),
    }

    let mut c = Conn::new(s, SERVING, t0);
    let t1 = t0 + Duration::from_secs(5);
    feed(&mut c, &hello(false));
    assert!(matches!(c.poll(t1), Some(Event::Ready { .. })));
    let idle_at = t1 + Duration::from_secs(600);
    assert_eq!(waits(c.handle(t1, Input::Nothing)), (true, Some(idle_at)));
    // A NOTIFY and its ACK push the deadline on.
    let t2 = t1 + Duration::from_secs(100);
    feed(&mut c, &notify(1));
    assert!(matches!(c.poll(t2), Some(Event::Notify { .. })));
    let t3 = t2 + Duration::from_secs(1);
    assert_eq!(
        waits(c.handle(t3, Input::AcksWritten(1))),
        (true, Some(t3 + Duration::from_secs(600)))
    );
    let idle_at = t3 + Duration::from_secs(600);
    assert_eq!(c.handle(idle_at, Input::Timeout), Action::Probe);
    // Bytes waiting on the socket: no goodbye.
    assert!(matches!(
        c.handle(idle_at, Input::Probed(Probe::Waiting)),
        Action::Wait(_)
    ));
    assert!(matches!(c.handle(idle_at, Input::Read), Action::Probe));
    match act(c.handle(idle_at, Input::Probed(Probe::Idle))) {
        Act::Goodbye {
            acks: 0,
            status: 0,
            reason: CloseReason::Idle,
        } => {}
        other => panic!("{other:?}"),
    }
}

/// A connection told its unfinished frame is dropped says so with status 13.
#[test]
fn evicted_is_status_13() {
    let t0 = Instant::now();
    let mut c = conn(
        SERVING,
        Setup {
            partial: true,
            ..READY
        },
        t0,
    );
    match act(c.handle(t0, Input::Evicted)) {
        Act::Goodbye {
            acks: 0,
            status: 13,
            reason: CloseReason::Protocol(_),
        } => {}
        other => panic!("{other:?}"),
    }
}

/// What a HELLO gets, by phase: the health checks and every HELLO are refused once
/// refusing (so HAProxy marks the agent DOWN); nothing while lingering. A refused HELLO
/// (HAProxy still has the agent UP) is held as a session for [`REFUSED_HOLD`] after it
/// closes, a refused health check is not, nor anything at the exit decision.
#[test]
fn hellos_by_phase() {
    #[derive(Debug, PartialEq)]
    enum Got {
        Served,
        Answered,
        Refused,
    }
    use Got::*;
    let table = [
        // (phase, HELLO, health check, hold after a refused HELLO)
        (SERVING, Served, Answered, None),
        (ANNOUNCING, Served, Answered, None),
        (REFUSING, Refused, Refused, Some(REFUSED_HOLD)),
        (LINGERING, Served, Answered, None),
        (EXITING, Refused, Refused, None),
    ];
    for (drain, normal, healthcheck, refused_hold) in table {
        for (hc, want) in [(false, normal), (true, healthcheck)] {
            let t0 = Instant::now();
            let mut c = Conn::new(settings(), drain, t0);
            feed(&mut c, &hello(hc));
            let got = match c.poll(t0) {
                Some(Event::Ready { .. }) => Served,
                Some(Event::Close {
                    reason: CloseReason::HealthCheck,
                    reply,
                }) => {
                    assert!(matches!(agent_frames(&reply)[..], [AgentFrame::Hello(_)]));
                    Answered
                }
                Some(Event::Close {
                    reason: CloseReason::Refused,
                    reply,
                }) => {
                    assert!(matches!(
                        agent_frames(&reply)[..],
                        [AgentFrame::Disconnect(0, _)]
                    ));
                    Refused
                }
                other => panic!("{drain:?} healthcheck={hc}: {other:?}"),
            };
            assert_eq!(got, want, "{drain:?} healthcheck={hc}");
            if got == Refused {
                let hold = if hc { None } else { refused_hold };
                assert_eq!(c.hold(drain), hold, "{drain:?} healthcheck={hc}");
            }
        }
    }
}

/// While refusing, the HELLO of HAProxy 3.1+'s multiplexer (no `async` offered) is served,
/// not refused (the multiplexer fails the messages waiting for a refused connection), and
/// its connection says the drain's goodbye as every other; its health checks are refused,
/// and at the exit decision everything is.
#[test]
fn multiplexer_hellos_while_refusing() {
    let table = [
        // (phase, health check, served)
        (REFUSING, false, true),
        (REFUSING, true, false),
        (EXITING, false, false),
        (SERVING, false, true),
    ];
    for (drain, hc, served) in table {
        let t0 = Instant::now();
        let mut c = Conn::new(settings(), drain, t0);
        let mut v = Vec::new();
        frame::encode_haproxy_hello_offering(16380, hc, "pipelining", &mut v);
        feed(&mut c, &v);
        let got = match c.poll(t0) {
            Some(Event::Ready { negotiated, .. }) => {
                assert!(!negotiated.pipelining, "never with the multiplexer");
                true
            }
            Some(Event::Close { .. }) => false,
            other => panic!("{drain:?} healthcheck={hc}: {other:?}"),
        };
        assert_eq!(got, served, "{drain:?} healthcheck={hc}");
        assert_eq!(c.hold(drain), None, "{drain:?} healthcheck={hc}");
    }
}

/// The connection's state for a drain-policy row.
#[derive(Debug, Clone, Copy)]
struct Setup {
    /// Handshake done (pipelining agreed or not), or still waiting for the HELLO.
    hello: Hello,
    /// NOTIFYs decoded whose ACK is owed.
    owed: u64,
    /// Half a frame in the buffer.
    partial: bool,
    /// The peer closed its side.
    eof: bool,
    /// `drain_quiet`.
    quiet: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hello {
    Waiting,
    Pipelined,
    OneAtATime,
}

const READY: Setup = Setup {
    hello: Hello::Pipelined,
    owed: 0,
    partial: false,
    eof: false,
    quiet: Duration::ZERO,
};

/// The action, reduced to what a row checks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Act {
    /// Wait, reading or not, with a wake-up or not.
    Wait {
        read: bool,
        timer: bool,
    },
    Probe,
    /// Write this many ACKs.
    Write(usize),
    /// Close after this many ACKs and an AGENT-DISCONNECT with this status.
    Goodbye {
        acks: usize,
        status: u32,
        reason: CloseReason,
    },
    /// Close without writing anything.
    Close(CloseReason),
}

fn act(action: Action) -> Act {
    match action {
        Action::Wait(w) => Act::Wait {
            read: w.read.is_some(),
            timer: w.until.is_some(),
        },
        Action::Probe => Act::Probe,
        Action::Write(bytes) => {
            let frames = agent_frames(&bytes);
            assert!(frames.iter().all(|f| matches!(f, AgentFrame::Ack(..))));
            Act::Write(frames.len())
        }
        Action::Close { bytes, reason } if bytes.is_empty() => Act::Close(reason),
        Action::Close { bytes, reason } => {
            let frames = agent_frames(&bytes);
            let (last, acks) = frames.split_last().expect("frames");
            assert!(acks.iter().all(|f| matches!(f, AgentFrame::Ack(..))));
            let AgentFrame::Disconnect(status, _) = last else {
                panic!("{frames:?}");
            };
            Act::Goodbye {
                acks: acks.len(),
                status: *status,
                reason,
            }
        }
    }
}

/// A connection in `drain` brought to `setup` at `t0`.
fn conn(drain: Seen, setup: Setup, t0: Instant) -> Conn {
    let mut c = Conn::new(
        Settings {
            drain_quiet: setup.quiet,
            ..settings()
        },
        SERVING,
        t0,
    );
    match setup.hello {
        Hello::Waiting => {}
        Hello::Pipelined => feed(&mut c, &hello(false)),
        Hello::OneAtATime => feed(&mut c, &hello_without_pipelining()),
    }
    for sid in 0..setup.owed {
        feed(&mut c, &notify(sid));
    }
    while let Some(event) = c.poll(t0) {
        assert!(matches!(event, Event::Ready { .. } | Event::Notify { .. }));
    }
    assert_eq!(c.owed() as u64, setup.owed);
    if setup.partial {
        feed(&mut c, &notify(99)[..5]);
    }
    if setup.eof {
        c.eof = true;
    }
    c.drain = drain;
    c
}

/// One ACK frame, as the sink holds it.
fn held(count: usize) -> Input {
    let mut bytes = Vec::new();
    for sid in 0..count {
        frame::encode_ack(sid as u64, 1, &[], 16380, &mut bytes);
    }
    Input::HeldAcks { bytes, count }
}

fn goodbye(acks: usize, reason: CloseReason) -> Act {
    Act::Goodbye {
        acks,
        status: 0,
        reason,
    }
}

const WAIT: Act = Act::Wait {
    read: true,
    timer: false,
};

/// The drain recipe, one row per (phase, state, inputs fed in order): the action after the
/// last input.
#[test]
fn drain_policy() {
    use CloseReason::{Drained, DrainedPipelined, Exiting, PeerClosed};
    let quiet = Duration::from_secs(1);
    let one_at_a_time = Setup {
        hello: Hello::OneAtATime,
        ..READY
    };
    let owed = |n| Setup { owed: n, ..READY };
    let table: Vec<(Seen, Setup, Vec<Input>, Act)> = vec![
        // An idle connection: kept, except while refusing, where a look at the socket comes
        // first and an empty socket gets the goodbye.
        (SERVING, READY, vec![Input::Nothing], WAIT),
        (ANNOUNCING, READY, vec![Input::Nothing], WAIT),
        (LINGERING, READY, vec![Input::Nothing], WAIT),
        (REFUSING, READY, vec![Input::Nothing], Act::Probe),
        (
            REFUSING,
            READY,
            vec![Input::Probed(Probe::Idle)],
            goodbye(0, Drained),
        ),
        // Bytes the reactor has not reported: no new look before they are read.
        (REFUSING, READY, vec![Input::Probed(Probe::Waiting)], WAIT),
        (
            REFUSING,
            READY,
            vec![
                Input::Probed(Probe::Waiting),
                Input::Nothing,
                Input::Timeout,
            ],
            WAIT,
        ),
        (
            REFUSING,
            READY,
            vec![Input::Probed(Probe::Waiting), Input::Read],
            Act::Probe,
        ),
        // Before the handshake a connection is not idle: the drain does not close it.
        (
            REFUSING,
            Setup {
                hello: Hello::Waiting,
                ..READY
            },
            vec![Input::Nothing],
            WAIT,
        ),
        // Exiting: goodbye at once, whatever is owed or buffered.
        (
            SERVING,
            READY,
            vec![Input::Drain(EXITING)],
            goodbye(0, Exiting),
        ),
        (
            REFUSING,
            owed(3),
            vec![Input::Drain(EXITING)],
            goodbye(0, Exiting),
        ),
        (
            LINGERING,
            Setup {
                hello: Hello::Waiting,
                partial: true,
                ..READY
            },
            vec![Input::Drain(EXITING)],
            goodbye(0, Exiting),
        ),
        // A phase change that is not an exit changes what the idle connection gets.
        (SERVING, READY, vec![Input::Drain(REFUSING)], Act::Probe),
        (REFUSING, READY, vec![Input::Drain(LINGERING)], WAIT),
        // Owed NOTIFYs keep a refusing connection open; their ACKs are placed by the
        // connection: the last one rides with the goodbye once the socket is empty (without
        // a quiet period even where HAProxy pipelines, two owed at once: a risked goodbye).
        (REFUSING, owed(1), vec![Input::Nothing], WAIT),
        (REFUSING, owed(2), vec![held(1)], Act::Write(1)),
        (REFUSING, owed(2), vec![held(2)], Act::Probe),
        (
            REFUSING,
            owed(2),
            vec![held(2), Input::Probed(Probe::Idle)],
            goodbye(2, DrainedPipelined),
        ),
        (
            REFUSING,
            owed(1),
            vec![held(1), Input::Probed(Probe::Waiting)],
            Act::Write(1),
        ),
        (
            REFUSING,
            owed(1),
            vec![held(1), Input::Probed(Probe::Read)],
            Act::Write(1),
        ),
        (ANNOUNCING, owed(1), vec![held(1)], Act::Write(1)),
        (LINGERING, owed(1), vec![held(1)], Act::Write(1)),
        (SERVING, owed(1), vec![held(1)], Act::Write(1)),
        // An ACK written directly (a drain that began while it was written): the connection
        // is idle after it, and looks.
        (REFUSING, owed(1), vec![Input::AcksWritten(1)], Act::Probe),
        (SERVING, owed(1), vec![Input::AcksWritten(1)], WAIT),
        // Where HAProxy pipelines (two owed at once) and with a quiet period, HAProxy may have
        // sent the next NOTIFY: the goodbye waits for the quiet period instead of riding on
        // the ACK.
        (
            REFUSING,
            Setup { quiet, ..owed(2) },
            vec![held(2)],
            Act::Write(2),
        ),
        (
            REFUSING,
            Setup { quiet, ..owed(2) },
            vec![held(2), Input::Nothing],
            Act::Wait {
                read: true,
                timer: true,
            },
        ),
        // Once no HAProxy has the agent UP (no hold left), a pipelined connection says a
        // risked goodbye on the ACKs that leave nothing owed, once nothing is unread:
        // nothing else would end it while HAProxy keeps it busy.
        (
            REFUSING_DOWN,
            Setup { quiet, ..owed(2) },
            vec![held(2)],
            Act::Probe,
        ),
        (
            REFUSING_DOWN,
            Setup { quiet, ..owed(2) },
            vec![held(2), Input::Probed(Probe::Idle)],
            goodbye(2, DrainedPipelined),
        ),
        (
            REFUSING_DOWN,
            Setup { quiet, ..owed(2) },
            vec![held(2), Input::Probed(Probe::Waiting)],
            Act::Write(2),
        ),
        (
            REFUSING_DOWN,
            Setup { quiet, ..owed(2) },
            vec![held(1)],
            Act::Write(1),
        ),
        // One NOTIFY at a time (HAProxy's `max-waiting-frames 1`, or no pipelining): HAProxy
        // waits for the ACK, so the goodbye rides on it even with a quiet period.
        (
            REFUSING,
            Setup { quiet, ..owed(1) },
            vec![held(1)],
            Act::Probe,
        ),
        (
            REFUSING,
            Setup { quiet, ..owed(1) },
            vec![held(1), Input::Probed(Probe::Idle)],
            goodbye(1, Drained),
        ),
        (
            REFUSING,
            Setup { quiet, ..owed(1) },
            vec![held(1), Input::Probed(Probe::Read)],
            Act::Write(1),
        ),
        // Nothing owed and a quiet period: no goodbye before it has passed.
        (
            REFUSING,
            Setup { quiet, ..READY },
            vec![Input::Nothing],
            Act::Wait {
                read: true,
                timer: true,
            },
        ),
        // Without pipelining HAProxy sends nothing while it waits for the ACK: the goodbye
        // rides on it even with a quiet period.
        (
            REFUSING,
            Setup {
                quiet,
                owed: 1,
                ..one_at_a_time
            },
            vec![held(1)],
            Act::Probe,
        ),
        (
            REFUSING,
            Setup {
                quiet,
                owed: 1,
                ..one_at_a_time
            },
            vec![held(1), Input::Probed(Probe::Idle)],
            goodbye(1, Drained),
        ),
        // End of input: close once nothing is owed; a half frame is a protocol error.
        (
            SERVING,
            Setup { eof: true, ..READY },
            vec![Input::Nothing],
            Act::Close(PeerClosed),
        ),
        (
            REFUSING,
            Setup { eof: true, ..READY },
            vec![Input::Nothing],
            Act::Close(PeerClosed),
        ),
        (
            SERVING,
            Setup {
                eof: true,
                ..owed(1)
            },
            vec![Input::Nothing],
            Act::Wait {
                read: false,
                timer: false,
            },
        ),
        (
            SERVING,
            Setup {
                eof: true,
                ..owed(1)
            },
            vec![Input::AcksWritten(1)],
            Act::Close(PeerClosed),
        ),
        (
            REFUSING,
            Setup {
                eof: true,
                ..owed(1)
            },
            vec![held(1)],
            Act::Write(1),
        ),
        // A half frame: waits with the stall timer, and is not idle.
        (
            SERVING,
            Setup {
                partial: true,
                ..READY
            },
            vec![Input::Nothing],
            Act::Wait {
                read: true,
                timer: true,
            },
        ),
        (
            REFUSING,
            Setup {
                partial: true,
                ..READY
            },
            vec![Input::Nothing],
            Act::Wait {
                read: true,
                timer: true,
            },
        ),
        // Reading pauses at the bound of owed NOTIFYs.
        (
            SERVING,
            owed(4),
            vec![Input::Nothing],
            Act::Wait {
                read: false,
                timer: false,
            },
        ),
    ];
    for (i, (drain, setup, inputs, want)) in table.into_iter().enumerate() {
        let t0 = Instant::now();
        let mut c = conn(drain, setup, t0);
        let mut last = None;
        for input in inputs.clone() {
            last = Some(c.handle(t0, input));
        }
        let got = act(last.expect("at least one input"));
        assert_eq!(got, want, "row {i}: {drain:?} {setup:?} after {inputs:?}");
    }
}

/// The quiet period and the stall timer, with time passing.
#[test]
fn timers() {
    let t0 = Instant::now();
    let quiet = Duration::from_secs(1);
    // HAProxy pipelines here (two NOTIFYs owed at once): no goodbye rides on an ACK.
    let mut c = conn(
        REFUSING,
        Setup {
            quiet,
            owed: 2,
            ..READY
        },
        t0,
    );
    let t1 = t0 + Duration::from_millis(300);
    assert_eq!(act(c.handle(t1, held(2))), Act::Write(2));
    assert!(!c.one_at_a_time());
    // Quiet since the ACK at t1: the look comes at t1 + 1 s, not before.
    assert_eq!(
        waits(c.handle(t1, Input::Nothing)),
        (true, Some(t1 + quiet))
    );
    assert!(matches!(
        c.handle(t1 + Duration::from_millis(999), Input::Timeout),
        Action::Wait(_)
    ));
    assert_eq!(c.handle(t1 + quiet, Input::Timeout), Action::Probe);

    // A frame begun and not finished within the timeout: status 2 (timeout).
    let mut c = conn(
        SERVING,
        Setup {
            partial: true,
            ..READY
        },
        t0,
    );
    assert_eq!(
        waits(c.handle(t0, Input::Read)),
        (true, Some(t0 + Duration::from_secs(30)))
    );
    assert!(matches!(
        c.handle(t0 + Duration::from_secs(29), Input::Timeout),
        Action::Wait(_)
    ));
    match act(c.handle(t0 + Duration::from_secs(30), Input::Timeout)) {
        Act::Goodbye {
            acks: 0,
            status: 2,
            reason: CloseReason::Protocol(_),
        } => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn eof_mid_frame_is_invalid() {
    let t0 = Instant::now();
    let mut c = Conn::new(settings(), SERVING, t0);
    feed(&mut c, &hello(false)[..10]);
    assert!(c.poll(t0).is_none());
    match act(c.handle(t0, Input::Eof)) {
        Act::Goodbye {
            acks: 0,
            status: 4,
            reason: CloseReason::Protocol(_),
        } => {}
        other => panic!("{other:?}"),
    }
    let mut c = Conn::new(settings(), SERVING, t0);
    assert_eq!(
        act(c.handle(t0, Input::Eof)),
        Act::Close(CloseReason::PeerClosed)
    );
}

/// Who writes ACKs, who is woken for them, and whose session is held after the close.
#[test]
fn ack_routing_and_linger_hold() {
    let t0 = Instant::now();
    let table = [
        // (phase, writes ACKs directly, wakes for every ACK, hold after close)
        (SERVING, true, false, None),
        (ANNOUNCING, false, true, None),
        (REFUSING, false, true, None),
        (LINGERING, false, true, Some(LINGER_HOLD)),
        (
            Seen {
                phase: Phase::Lingering,
                exiting: true,
                held: true,
            },
            false,
            true,
            None,
        ),
    ];
    for (drain, direct, wakes, hold) in table {
        let c = conn(drain, READY, t0);
        assert_eq!(c.wait(t0, None).direct_acks, direct, "{drain:?}");
        assert_eq!(c.wait(t0, None).ack_wakes, wakes, "{drain:?}");
        assert_eq!(c.hold(drain), hold, "{drain:?}");
        let before_hello = conn(
            drain,
            Setup {
                hello: Hello::Waiting,
                ..READY
            },
            t0,
        );
        assert_eq!(before_hello.hold(drain), None, "no session: {drain:?}");
    }
    // Serving, the task is woken for ACKs only when it waits for them.
    assert!(
        conn(SERVING, Setup { owed: 4, ..READY }, t0)
            .wait(t0, None)
            .ack_wakes
    );
    assert!(
        conn(SERVING, Setup { eof: true, ..READY }, t0)
            .wait(t0, None)
            .ack_wakes
    );
}

proptest::proptest! {
    /// Whatever a peer sends after a good HELLO, the connection ends in events or waits for
    /// more; it never panics.
    #[test]
    fn arbitrary_frames_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
        for kind in [kind::HAPROXY_HELLO, kind::NOTIFY, kind::HAPROXY_DISCONNECT] {
            let t0 = Instant::now();
            let mut framed = Vec::new();
            frame::put_frame(kind, 1, 1, &bytes, &mut framed);
            let mut c = Conn::new(settings(), SERVING, t0);
            feed(&mut c, &hello(false));
            feed(&mut c, &framed);
            feed(&mut c, &bytes);
            while c.poll(t0).is_some() {}
            let _ = c.handle(t0, Input::Eof);
        }
    }
}

/// While a whole frame is buffered the task is not asked to read more: it decodes first.
/// A peer pipelining NOTIFYs faster than their ACKs go out cannot fill the buffer.
#[test]
fn no_read_while_a_whole_frame_waits() {
    let t0 = Instant::now();
    let mut c = Conn::new(settings(), SERVING, t0);
    feed(&mut c, &hello(false));
    assert!(matches!(c.poll(t0), Some(Event::Ready { .. })));
    for sid in 1..=6 {
        feed(&mut c, &notify(sid));
    }
    for _ in 0..4 {
        assert!(matches!(c.poll(t0), Some(Event::Notify { .. })));
    }
    assert!(c.poll(t0).is_none(), "at the bound of 4 owed");
    assert!(matches!(
        c.handle(t0, Input::Read),
        Action::Wait(Wait { read: None, .. })
    ));
    // One ACK out: a frame may be decoded, and still no read before it is.
    assert!(matches!(
        c.handle(t0, Input::AcksWritten(1)),
        Action::Wait(Wait { read: None, .. })
    ));
    assert!(matches!(c.poll(t0), Some(Event::Notify { .. })));
    assert!(c.poll(t0).is_none(), "at the bound again");
    assert!(matches!(
        c.handle(t0, Input::AcksWritten(2)),
        Action::Wait(Wait { read: None, .. })
    ));
    assert!(matches!(c.poll(t0), Some(Event::Notify { .. })));
    // Nothing whole left: read again.
    assert!(matches!(
        c.handle(t0, Input::Nothing),
        Action::Wait(Wait { read: Some(_), .. })
    ));
}

/// When the connection reads, and what else wakes it: one row per (state, inputs fed in
/// order) → the wait's read, wake flags and timer. These are the limits the task used to
/// decide itself: the bound of evaluations running, ACK bytes the peer has not taken, and
/// room refused under `max_buffered_bytes`.
#[test]
fn reading() {
    #[derive(Debug, PartialEq, Eq)]
    struct Got {
        read: bool,
        ack_wakes: bool,
        evaluation_wakes: bool,
        memory_wakes: bool,
        timer: bool,
    }
    const READS: Got = Got {
        read: true,
        ack_wakes: false,
        evaluation_wakes: false,
        memory_wakes: false,
        timer: false,
    };
    let t0 = Instant::now();
    let retry = t0 + Duration::from_millis(700);
    let table: Vec<(Setup, Vec<Input>, Got)> = vec![
        (READY, vec![Input::Nothing], READS),
        // Evaluations at the bound (4): no read until one ends; woken when one does.
        (
            READY,
            vec![Input::Evaluations(4)],
            Got {
                read: false,
                evaluation_wakes: true,
                ..READS
            },
        ),
        (
            READY,
            vec![Input::Evaluations(4), Input::Evaluations(3)],
            READS,
        ),
        // More ACK bytes than `max_unsent` wait for the socket: no read.
        (
            READY,
            vec![Input::Unsent(64 * 1024 + 1)],
            Got {
                read: false,
                ..READS
            },
        ),
        (
            READY,
            vec![Input::Unsent(64 * 1024 + 1), Input::Unsent(0)],
            READS,
        ),
        // Room refused: no read; woken when bytes are released, or at the retry instant.
        (
            READY,
            vec![Input::NoRoom(Pressure::Wait(None))],
            Got {
                read: false,
                memory_wakes: true,
                ..READS
            },
        ),
        (
            READY,
            vec![Input::NoRoom(Pressure::Wait(Some(retry)))],
            Got {
                read: false,
                memory_wakes: true,
                timer: true,
                ..READS
            },
        ),
        (
            READY,
            vec![Input::NoRoom(Pressure::Wait(None)), Input::Released],
            READS,
        ),
        (READY, vec![Input::NoRoom(Pressure::Evicted)], READS),
        // Owed NOTIFYs at the bound: no read, woken for ACKs.
        (
            Setup { owed: 4, ..READY },
            vec![Input::Nothing],
            Got {
                read: false,
                ack_wakes: true,
                ..READS
            },
        ),
    ];
    for (i, (setup, inputs, want)) in table.into_iter().enumerate() {
        let mut c = conn(SERVING, setup, t0);
        let mut last = None;
        for input in inputs.clone() {
            last = Some(c.handle(t0, input));
        }
        let Some(Action::Wait(w)) = last else {
            panic!("row {i}: {last:?}");
        };
        let got = Got {
            read: w.read.is_some(),
            ack_wakes: w.ack_wakes,
            evaluation_wakes: w.evaluation_wakes,
            memory_wakes: w.memory_wakes,
            timer: w.until.is_some(),
        };
        assert_eq!(got, want, "row {i}: {setup:?} after {inputs:?}");
    }
    // At the retry instant the room is asked for again.
    let mut c = conn(SERVING, READY, t0);
    let _ = c.handle(t0, Input::NoRoom(Pressure::Wait(Some(retry))));
    assert_eq!(waits(c.handle(retry, Input::Timeout)), (true, None));
}

/// How much room a read asks for, and what the buffer holds for `max_buffered_bytes`.
#[test]
fn read_room_and_holding() {
    let t0 = Instant::now();
    let mut c = Conn::new(settings(), SERVING, t0);
    // Before the handshake: enough for a HELLO, no more.
    let Action::Wait(w) = c.handle(t0, Input::Nothing) else {
        panic!()
    };
    assert_eq!(w.read, Some((HELLO_FRAME_LIMIT + 4) as usize));
    feed(&mut c, &hello(false));
    assert!(matches!(c.poll(t0), Some(Event::Ready { .. })));
    let Action::Wait(w) = c.handle(t0, Input::Nothing) else {
        panic!()
    };
    assert_eq!(w.read, Some(READ_ROOM));
    assert_eq!(w.holding.unfinished_since, None);
    // A 12 KiB frame begun: what is missing of it (more than READ_ROOM); the buffer holds
    // an unfinished frame since t1.
    let t1 = t0 + Duration::from_millis(5);
    feed(&mut c, &(12u32 << 10).to_be_bytes());
    feed(&mut c, &[kind::NOTIFY]);
    let Action::Wait(w) = c.handle(t1, Input::Read) else {
        panic!()
    };
    assert_eq!(w.read, Some((12 << 10) + 4 - 5));
    assert_eq!(w.holding.unfinished_since, Some(t1));
    assert!(w.holding.capacity >= 5);
}

/// Rebalancing goodbyes: after `after_messages` NOTIFYs or `after` since the handshake, on a
/// connection that carries one NOTIFY at a time, while serving or announcing. From then on
/// the ACKs are handed to the connection, and the next one carries the goodbye (after a
/// look at the socket). Never while lingering, and never where HAProxy pipelines.
#[test]
fn rebalancing() {
    let t0 = Instant::now();
    let by_count = Rebalance {
        after_messages: 3,
        after: Duration::ZERO,
    };
    let by_age = Rebalance {
        after_messages: 0,
        after: Duration::from_secs(5),
    };
    let make = |drain: Seen, rebalance: Rebalance| {
        let mut c = Conn::new(
            Settings {
                rebalance,
                ..settings()
            },
            drain,
            t0,
        );
        feed(&mut c, &hello(false));
        assert!(matches!(c.poll(t0), Some(Event::Ready { .. })));
        c
    };
    let one = |c: &mut Conn, sid: u64, now: Instant| {
        feed(c, &notify(sid));
        assert!(matches!(c.poll(now), Some(Event::Notify { .. })));
    };

    // By count: the first two ACKs go direct; with the third NOTIFY the goodbye is due.
    let mut c = make(SERVING, by_count);
    for sid in 1..=2 {
        one(&mut c, sid, t0);
        let Action::Wait(w) = c.handle(t0, Input::Nothing) else {
            panic!()
        };
        assert!(w.direct_acks, "NOTIFY {sid}");
        assert!(matches!(
            c.handle(t0, Input::AcksWritten(1)),
            Action::Wait(_)
        ));
    }
    one(&mut c, 3, t0);
    let Action::Wait(w) = c.handle(t0, Input::Nothing) else {
        panic!()
    };
    assert!(!w.direct_acks && w.ack_wakes);
    assert_eq!(c.handle(t0, held(1)), Action::Probe);
    assert_eq!(
        act(c.handle(t0, Input::Probed(Probe::Idle))),
        goodbye(1, CloseReason::Rebalanced)
    );

    // Bytes unread at the look: the ACK goes out alone, and the next one tries again.
    let mut c = make(SERVING, by_count);
    for sid in 1..=3 {
        one(&mut c, sid, t0);
        let _ = c.handle(t0, Input::AcksWritten(1));
    }
    one(&mut c, 4, t0);
    assert_eq!(c.handle(t0, held(1)), Action::Probe);
    assert_eq!(
        act(c.handle(t0, Input::Probed(Probe::Waiting))),
        Act::Write(1)
    );

    // By age: the timer of the wait is the due time; then the ACKs are held.
    let mut c = make(SERVING, by_age);
    assert_eq!(
        waits(c.handle(t0, Input::Nothing)),
        (true, Some(t0 + Duration::from_secs(5)))
    );
    let due = t0 + Duration::from_secs(5);
    let Action::Wait(w) = c.handle(due, Input::Timeout) else {
        panic!()
    };
    assert!(!w.direct_acks);
    // An idle connection with its goodbye due waits for the next NOTIFY (no goodbye that
    // could cross one).
    assert!(w.until.is_none() || w.until > Some(due));
    one(&mut c, 1, due);
    assert_eq!(c.handle(due, held(1)), Action::Probe);
    assert_eq!(
        act(c.handle(due, Input::Probed(Probe::Idle))),
        goodbye(1, CloseReason::Rebalanced)
    );

    // Announcing too; never while lingering.
    for (drain, goes) in [(ANNOUNCING, true), (LINGERING, false)] {
        let mut c = make(drain, by_count);
        for sid in 1..=2 {
            one(&mut c, sid, t0);
            let _ = c.handle(t0, held(1));
        }
        one(&mut c, 3, t0);
        let got = c.handle(t0, held(1));
        assert_eq!(got == Action::Probe, goes, "{drain:?}: {got:?}");
    }

    // Where HAProxy pipelines (two owed at once), no rebalancing goodbye: ACKs stay direct.
    let mut c = make(SERVING, by_count);
    one(&mut c, 1, t0);
    one(&mut c, 2, t0);
    let _ = c.handle(t0, Input::AcksWritten(2));
    one(&mut c, 3, t0);
    assert!(!c.one_at_a_time());
    let Action::Wait(w) = c.handle(t0, Input::Nothing) else {
        panic!()
    };
    assert!(w.direct_acks);
}

/// Pipelining is agreed with HAProxy's SPOE applet (it offers `async` too: 2.6, 3.0), never
/// with the multiplexer of 3.1+ (it offers `pipelining` alone), and never when the
/// settings say no; a NOTIFY may be answered inline only while serving.
#[test]
fn what_is_agreed_and_answered_inline() {
    let t0 = Instant::now();
    let hello_offering = |caps: &str| {
        let mut payload = Vec::new();
        payload::put_kv(
            &mut payload,
            "supported-versions",
            &spop::TypedData::String("2.0".into()),
        );
        payload::put_kv(
            &mut payload,
            "max-frame-size",
            &spop::TypedData::UInt32(16380),
        );
        payload::put_kv(
            &mut payload,
            "capabilities",
            &spop::TypedData::String(caps.into()),
        );
        let mut v = Vec::new();
        frame::put_frame(kind::HAPROXY_HELLO, 0, 0, &payload, &mut v);
        v
    };
    for (caps, ours, agreed) in [
        ("pipelining,async", true, true),
        ("pipelining", true, false),
        ("pipelining,async", false, false),
        ("", true, false),
    ] {
        let mut c = Conn::new(
            Settings {
                pipelining: ours,
                ..settings()
            },
            SERVING,
            t0,
        );
        feed(&mut c, &hello_offering(caps));
        let Some(Event::Ready { negotiated, reply }) = c.poll(t0) else {
            panic!("{caps}")
        };
        assert_eq!(negotiated.pipelining, agreed, "{caps} {ours}");
        let announced = match &agent_frames(&reply)[..] {
            [AgentFrame::Hello(kv)] => kv.iter().any(|(k, v)| {
                k == "capabilities"
                    && matches!(v, spop::TypedData::String(s) if s.contains("pipelining"))
            }),
            other => panic!("{other:?}"),
        };
        assert_eq!(announced, agreed, "{caps} {ours}");
    }
    for (drain, inline) in [(SERVING, true), (ANNOUNCING, false), (LINGERING, false)] {
        let mut c = conn(drain, READY, t0);
        feed(&mut c, &notify(1));
        let Some(Event::Notify { inline: got, .. }) = c.poll(t0) else {
            panic!()
        };
        assert_eq!(got, inline, "{drain:?}");
    }
}

/// What the connection task's parts count, as a table row gives it ([`Counts`]).
#[derive(Debug, Default, Clone)]
struct Counted {
    written: usize,
    held: Option<(Vec<u8>, usize)>,
    evicted: bool,
    unsent: usize,
    evaluations: usize,
}

impl Counts for Counted {
    fn take_written(&mut self) -> usize {
        std::mem::take(&mut self.written)
    }

    fn take_held(&mut self) -> Option<(Vec<u8>, usize)> {
        self.held.take()
    }

    fn evicted(&self) -> bool {
        self.evicted
    }

    fn unsent(&self) -> usize {
        self.unsent
    }

    fn evaluations(&self) -> usize {
        self.evaluations
    }
}

/// One row of [`counts_taken_in`].
struct CountsRow {
    counts: Counted,
    /// What the `Conn` was last told: unsent bytes, evaluations.
    told: (usize, usize),
    /// What it takes in before decoding.
    decode: Option<Input>,
    /// What it takes in before a wait, in order, each fed back before the next.
    wait: Vec<Input>,
}

/// What the `Conn` takes in of the counts, and in which order: before decoding, only the
/// ACKs written (a NOTIFY sent in answer to one must not find it owed); before a wait, the
/// ACKs written, then held, then an eviction, then a count that differs from what it was last
/// told (unsent bytes, then evaluations). Fed back one at a time, they leave nothing behind.
#[test]
fn counts_taken_in() {
    let t0 = Instant::now();
    let held = || Input::HeldAcks {
        bytes: vec![1, 2, 3],
        count: 2,
    };
    let table = vec![
        CountsRow {
            counts: Counted::default(),
            told: (0, 0),
            decode: None,
            wait: vec![],
        },
        CountsRow {
            counts: Counted {
                written: 1,
                held: Some((vec![1, 2, 3], 2)),
                evicted: true,
                unsent: 10,
                evaluations: 3,
            },
            told: (0, 0),
            decode: Some(Input::AcksWritten(1)),
            wait: vec![Input::AcksWritten(1), held(), Input::Evicted],
        },
        CountsRow {
            counts: Counted {
                held: Some((vec![1, 2, 3], 2)),
                unsent: 10,
                evaluations: 3,
                ..Counted::default()
            },
            told: (0, 0),
            decode: None,
            wait: vec![held(), Input::Unsent(10), Input::Evaluations(3)],
        },
        // A count already told is not fed again; a changed one is, even back to zero.
        CountsRow {
            counts: Counted {
                unsent: 10,
                evaluations: 3,
                ..Counted::default()
            },
            told: (10, 3),
            decode: None,
            wait: vec![],
        },
        CountsRow {
            counts: Counted::default(),
            told: (10, 3),
            decode: None,
            wait: vec![Input::Unsent(0), Input::Evaluations(0)],
        },
    ];
    for (i, row) in table.into_iter().enumerate() {
        // Three NOTIFYs owed, so that the ACKs counted are owed ones.
        let mut c = conn(SERVING, Setup { owed: 3, ..READY }, t0);
        c.handle(t0, Input::Unsent(row.told.0));
        c.handle(t0, Input::Evaluations(row.told.1));
        assert_eq!(
            c.before_decode(&mut row.counts.clone()),
            row.decode,
            "row {i}: before decode"
        );
        let mut counts = row.counts;
        let mut got = Vec::new();
        while let Some(input) = c.before_wait(&mut counts) {
            got.push(input.clone());
            if let Action::Close { .. } = c.handle(t0, input) {
                break;
            }
        }
        assert_eq!(got, row.wait, "row {i}: before wait");
    }
}
