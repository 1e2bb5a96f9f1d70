//! One SPOP connection, sans-IO, deciding everything about it: the handshake, the NOTIFYs it
//! owes an ACK for, when to read and how much, who writes the ACKs, and the goodbye (when a
//! connection says AGENT-DISCONNECT, and with what), as quinn-proto's `Connection` does for
//! QUIC.
//!
//! The connection task (`lastcall-spoa`'s `engine::task`) is a plain executor: it reads bytes into
//! [`Conn::buffer`], takes protocol events from [`Conn::poll`] (a handshake, a NOTIFY to
//! evaluate, a frame that ends the connection), feeds everything else that happens as an
//! [`Input`] to [`Conn::handle`] (ACKs written or handed over, the lifecycle, evaluations
//! ended, bytes not yet taken by the socket, room refused under `max_buffered_bytes`, a
//! timer), and carries out the one [`Action`] it gets back. What the task's parts count for
//! it (ACKs written or held by the ACK sink, the evaluations, unsent bytes, an eviction) the
//! `Conn` reads through [`Counts`] and turns into inputs itself, in the order the protocol
//! needs ([`Conn::before_decode`], [`Conn::before_wait`]): the task keeps no count of its own.
//! `now` is passed in; there is no clock, socket, runtime or thread here, so every decision
//! is table-tested without them (`conn/tests.rs`).
//!
//! ## The goodbye
//!
//! SPOP has no "stop sending me work" frame, and HAProxy fails every NOTIFY it has sent on a
//! connection that says AGENT-DISCONNECT (`st=256` in its log). A goodbye is therefore only
//! lossless when HAProxy cannot be sending on that connection while the DISCONNECT is on its
//! way: when it waits for the ACK of the one NOTIFY it sent there, and reads that ACK and the
//! DISCONNECT in one go. That holds on a connection that carries one NOTIFY at a time
//! ([`Conn::one_at_a_time`]): HAProxy 2.6 and 3.0 with `max-waiting-frames 1` in the SPOE
//! file (their applet neither sends nor is woken for new work while it waits), and 3.1+
//! when `pipelining` is not agreed (its multiplexer then allows one stream per connection).
//! So the goodbye rides on the ACK of the connection's only NOTIFY, in one write, once the
//! socket says nothing more is unread. It is used:
//!
//! - while refusing (the drain): at the next ACK; a connection with nothing owed says it
//!   after `drain_quiet` of silence (under load HAProxy hands it a NOTIFY before that, and the
//!   goodbye rides on its ACK);
//! - while serving or announcing, to rebalance ([`Rebalance`]): after so many NOTIFYs or so
//!   long, so that HAProxy places a new connection (its `balance` only places new ones);
//! - at the exit decision: at once, whatever is owed.
//!
//! | phase | HELLO | health-check HELLO | goodbye | ACKs |
//! |---|---|---|---|---|
//! | serving | served | answered | rebalancing, on an ACK | written by whoever has them (handed to the connection once a rebalance is due) |
//! | announcing | served | answered | rebalancing, on an ACK | handed to the connection |
//! | refusing | refused (3.1+'s multiplexer: served, then the goodbye on its first ACK) | refused | on the next ACK, or after `drain_quiet` of silence | handed to the connection |
//! | lingering | served | served | none; when it closes, its session is held a moment | handed to the connection |
//! | exiting | refused | refused | at once, whatever it owes | cut |
//!
//! "Nothing unread" is asked of the kernel's receive buffer ([`Action::Probe`],
//! [`Input::Probed`]): the reactor's readiness can lag behind it, and a goodbye on that
//! stale "nothing to read" fails the NOTIFYs already sitting there.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use lastcall_phase::{Phase, Seen};
use spop::frame::Message;
use spop::StatusCode;

use crate::error::ProtocolError;
use crate::frame::{self, kind};
use crate::payload::{self, Negotiated};

/// How long a connection closed while lingering still counts as a session: HAProxy 2.6
/// soft-stopping closes every idle SPOE connection and opens a new one for the next message,
/// and a lingering agent that saw no session in between would leave and fail that message
/// (measured in crates/spoa/tests/spoa/rollout.rs's sidecar test).
pub const LINGER_HOLD: Duration = Duration::from_millis(250);

/// How long a HELLO refused while draining still counts as a session: HAProxy only opens
/// connections to an agent it has UP, so a refused HELLO says it has not yet marked this one
/// DOWN, and an agent that left then would close its listener while HAProxy still places
/// work on it (see `lastcall-spoa`'s `engine::down`, which holds the session of each HAProxy
/// that checks the agent until it has marked it DOWN; this covers one that does not check it).
pub const REFUSED_HOLD: Duration = Duration::from_millis(1000);

/// The largest frame accepted before the handshake: a HAPROXY-HELLO is a few hundred bytes
/// (its KV-LIST names a version list, `max-frame-size`, `capabilities`, `healthcheck` and
/// `engine-id`), and a stranger's bytes must not be held up to `max_frame_size` before anyone
/// knows it speaks SPOP.
pub const HELLO_FRAME_LIMIT: u32 = 4096;

/// How much room a read asks for when no frame length is known yet (after the handshake):
/// most NOTIFYs of HAProxy's default 16 KB buffer fit, and a connection waiting for its next
/// frame holds no more.
pub const READ_ROOM: usize = 8 * 1024;

/// The most one read asks room for at once: a 1 MiB frame arrives in pieces of this size,
/// each taken from `max_buffered_bytes` as it comes.
pub const READ_ROOM_MAX: usize = 64 * 1024;

/// When a connection says goodbye to be placed again by HAProxy's `balance` (serving or
/// announcing; never while lingering). Zero turns a bound off; with both off, connections
/// stay until HAProxy or the drain closes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rebalance {
    /// After this many NOTIFYs.
    pub after_messages: u64,
    /// After this long since the handshake.
    pub after: Duration,
}

impl Rebalance {
    /// Never.
    pub const OFF: Rebalance = Rebalance {
        after_messages: 0,
        after: Duration::ZERO,
    };
}

/// A connection's fixed settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Largest frame accepted before the handshake (then min'd with HAProxy's).
    pub max_frame_size: u32,
    /// Agree to `pipelining` when HAProxy's SPOE applet (2.6, 3.0: it offers `async` too)
    /// offers it. Never with the multiplexer of 3.1+ (it offers `pipelining` alone): without
    /// it, the multiplexer sends one NOTIFY at a time on a connection, so a goodbye can ride
    /// on its ACK. (2.6.12 and 3.0 need it: without it their applet leaves NOTIFYs queued
    /// after an ACK, HAProxy bc9fb6462, measured as 5 s `timeout processing` failures.)
    pub pipelining: bool,
    /// NOTIFYs owed at most, and evaluations running at most; decoding (and reading) pause at
    /// the bound.
    pub max_inflight: usize,
    /// ACK bytes waiting for a peer that does not read them, above which reading pauses.
    pub max_unsent: usize,
    /// While refusing, a connection with nothing owed says goodbye after nothing came or went
    /// on it for this long.
    pub drain_quiet: Duration,
    /// When a connection says goodbye to be placed again.
    pub rebalance: Rebalance,
    /// A frame started but not finished within this time closes the connection (status 2).
    pub partial_frame_timeout: Duration,
    /// A connection that has not completed its HELLO within this time is closed (status 2).
    pub hello_timeout: Duration,
    /// A connection with nothing owed, nothing buffered and nothing received or sent for
    /// this long is closed (AGENT-DISCONNECT status 0).
    pub idle_timeout: Duration,
}

/// A protocol event taken from the buffer.
#[derive(Debug)]
pub enum Event {
    /// Handshake done: write `reply` (AGENT-HELLO); a session begins.
    Ready {
        /// The AGENT-HELLO frame.
        reply: Vec<u8>,
        /// What was agreed.
        negotiated: Negotiated,
    },
    /// A NOTIFY to evaluate. Its ACK is owed from now on, until [`Input::AcksWritten`] or
    /// [`Input::HeldAcks`] counts it.
    Notify {
        /// Stream id to echo.
        stream_id: u64,
        /// Frame id to echo.
        frame_id: u64,
        /// The messages.
        messages: Vec<Message>,
        /// About what its decoded messages hold in memory (their bytes, plus what each
        /// argument costs beside them).
        size: usize,
        /// Whether it may be answered on the connection task when it needs no engine work
        /// (only while serving: answered at once during a drain, a request waited for
        /// HAProxy's `timeout processing` in 3 of 4 sidecar rollouts, measured without
        /// [`LINGER_HOLD`]).
        inline: bool,
    },
    /// Write `reply` whole and close.
    Close {
        /// The last frame: AGENT-HELLO for a health check, or AGENT-DISCONNECT.
        reply: Vec<u8>,
        /// Why.
        reason: CloseReason,
    },
}

/// Why a connection ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// A health check was answered.
    HealthCheck,
    /// A HELLO was refused because we are draining.
    Refused,
    /// HAProxy sent HAPROXY-DISCONNECT (its status code).
    PeerDisconnect(u32),
    /// HAProxy closed its side with nothing owed and nothing half-sent.
    PeerClosed,
    /// The drain: the goodbye while refusing.
    Drained,
    /// The drain's goodbye on a connection HAProxy pipelines on (more than one NOTIFY owed
    /// at once: no `max-waiting-frames 1`), said on an ACK once nothing is unread and no
    /// HAProxy has the agent UP any more: a NOTIFY HAProxy sent as it crossed fails. Without
    /// it such a connection, busy to the end, held the drain to its deadline.
    DrainedPipelined,
    /// A rebalancing goodbye ([`Rebalance`]).
    Rebalanced,
    /// The lifecycle is exiting.
    Exiting,
    /// The operator ended it (`DELETE /sessions/ID`), as the deadline would.
    Ended,
    /// Nothing came or went for `idle_timeout`.
    Idle,
    /// No HELLO within `hello_timeout` (closed with status 2).
    HelloTimeout,
    /// The peer broke the protocol, or its unfinished frame was dropped to make room.
    Protocol(ProtocolError),
}

/// Something that happened, for [`Conn::handle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Nothing new: the events of [`Conn::poll`] were handled, or an action was carried out.
    Nothing,
    /// Bytes were read into [`Conn::buffer`].
    Read,
    /// The peer closed its side.
    Eof,
    /// The lifecycle changed.
    Drain(Seen),
    /// This many ACKs were written to the socket by whoever had them.
    AcksWritten(usize),
    /// ACKs handed to the connection to write (whenever [`Wait::direct_acks`] is false):
    /// `count` whole frames in `bytes`.
    HeldAcks {
        /// The frames, back to back.
        bytes: Vec<u8>,
        /// How many.
        count: usize,
    },
    /// This connection's evaluations, queued or running, now number this many (one started
    /// or ended). An evaluation answered at its deadline still runs, and still counts.
    Evaluations(usize),
    /// This many bytes of what was written wait for the socket to take them.
    Unsent(usize),
    /// The room [`Wait::read`] asked for is not available under `max_buffered_bytes`.
    NoRoom(Pressure),
    /// Bytes held for frames were released somewhere (room may be available again).
    Released,
    /// What [`Action::Probe`] found.
    Probed(Probe),
    /// The time of [`Wait::until`] has come.
    Timeout,
    /// The connection's unfinished frame is dropped to make room under `max_buffered_bytes`.
    Evicted,
    /// The operator ends the connection (`DELETE /sessions/ID`): the goodbye at once,
    /// whatever is owed, as at the exit decision.
    End,
}

/// Why room for a read was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    /// Wait for bytes to be released, or until this instant (when the oldest unfinished
    /// frame elsewhere may be dropped), then ask again.
    Wait(Option<Instant>),
    /// A frame was dropped elsewhere to make room: ask again at once.
    Evicted,
}

/// What a look at the socket found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Nothing waiting.
    Idle,
    /// Bytes were moved into [`Conn::buffer`].
    Read,
    /// The kernel holds bytes the reactor has not reported yet: wait for the read.
    Waiting,
}

/// What the connection task must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Wait for the next input, as [`Wait`] says.
    Wait(Wait),
    /// Look for bytes not yet read (move what the socket has into the buffer, else ask the
    /// kernel) and feed [`Input::Probed`].
    Probe,
    /// Write these frames whole, then feed [`Input::Nothing`].
    Write(Vec<u8>),
    /// Write these frames whole (possibly none), then close.
    Close {
        /// The last frames.
        bytes: Vec<u8>,
        /// Why.
        reason: CloseReason,
    },
}

/// How to wait: what to read, until when, and what else ends the wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// Read into [`Conn::buffer`] with this much free room in it (taken from
    /// `max_buffered_bytes` first; when that is refused, feed [`Input::NoRoom`]), or do not
    /// read.
    pub read: Option<usize>,
    /// When to feed [`Input::Timeout`] without any other input.
    pub until: Option<Instant>,
    /// Whether the evaluation threads write ACKs to the socket themselves (only while
    /// serving and no goodbye is due); otherwise they hand them to the connection
    /// ([`Input::HeldAcks`]).
    pub direct_acks: bool,
    /// Wake for every ACK written directly ([`Input::AcksWritten`]): the connection waits
    /// for owed NOTIFYs.
    pub ack_wakes: bool,
    /// Wake when one of its evaluations ends ([`Input::Evaluations`]): reading waits for one.
    pub evaluation_wakes: bool,
    /// Wake when bytes are released ([`Input::Released`]): reading waits for room.
    pub memory_wakes: bool,
    /// What the buffer holds, for `max_buffered_bytes`.
    pub holding: Holding,
}

/// What a connection's read buffer holds, as `max_buffered_bytes` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// The buffer's capacity.
    pub capacity: usize,
    /// Since when it has held an unfinished frame (not a whole one waiting to be decoded).
    pub unfinished_since: Option<Instant>,
}

/// What the connection task's parts count for the [`Conn`] (the ACK sink, the connection's
/// evaluations, its memory account), read by [`Conn::before_decode`] and
/// [`Conn::before_wait`]. Each count is kept by its owner alone; the `Conn` keeps what it was
/// last told and turns a difference into an [`Input`].
pub trait Counts {
    /// ACKs written to the socket by whoever had them since last asked (taken).
    fn take_written(&mut self) -> usize;
    /// ACKs handed to the connection since last asked (taken): `count` whole frames, back to
    /// back.
    fn take_held(&mut self) -> Option<(Vec<u8>, usize)>;
    /// Whether the connection's unfinished frame is to be dropped to make room under
    /// `max_buffered_bytes`.
    fn evicted(&self) -> bool;
    /// ACK bytes waiting for the socket to take them.
    fn unsent(&self) -> usize;
    /// The connection's evaluations queued or running.
    fn evaluations(&self) -> usize;
}

/// Where a connection is in its life; each stage owns what it needs.
#[derive(Debug)]
enum State {
    /// Accepted at this instant, waiting for HAPROXY-HELLO (until `hello_timeout`).
    AwaitHello { accepted: Instant },
    /// Handshaken: a session.
    Ready(Session),
    /// Its last frame said (or its peer gone); how it ended.
    Closed(Closed),
}

/// A handshaken connection: what HAProxy owes and is owed on it.
#[derive(Debug)]
struct Session {
    /// The negotiated maximum frame size.
    max_frame_size: u32,
    /// When the handshake completed (for [`Rebalance::after`]).
    ready_at: Instant,
    /// Last NOTIFY received or ACK written.
    last_activity: Instant,
    /// NOTIFYs since the handshake.
    messages: u64,
    /// NOTIFYs handed out by [`Conn::poll`] whose ACK has not been written: the one count
    /// of owed ACKs.
    owed: usize,
    /// Whether HAProxy has never had more than one NOTIFY owed here.
    one_at_a_time: bool,
    /// A look at the socket said bytes are waiting: no new look before the next read.
    unread_waiting: bool,
    /// The look at the socket in progress, and what it is for.
    probing: Option<Probing>,
}

impl Session {
    fn new(max_frame_size: u32, now: Instant) -> Self {
        Session {
            max_frame_size,
            ready_at: now,
            last_activity: now,
            messages: 0,
            owed: 0,
            one_at_a_time: true,
            unread_waiting: false,
            probing: None,
        }
    }

    /// ACKs kept while a look at the socket decides whether the goodbye rides on them.
    fn held_acks(&self) -> usize {
        match self.probing {
            Some(Probing::Acks { count, .. }) => count,
            _ => 0,
        }
    }
}

/// Why a look at the socket was asked for.
#[derive(Debug)]
enum Probing {
    /// Whether an idle connection may say goodbye (drain or `idle_timeout`).
    Idle,
    /// Whether the goodbye rides on these ACKs, kept meanwhile (`count` of them: HAProxy
    /// still counts them as owed).
    Acks { bytes: Vec<u8>, count: usize },
}

/// How a connection ended, as far as what comes after its close asks ([`Conn::hold`],
/// [`Conn::health_check`]).
#[derive(Debug)]
enum Closed {
    /// Before a session: a HELLO that was bad, late or never came.
    Unopened,
    /// A health check, answered or refused.
    HealthCheck,
    /// A HELLO (not a health check) refused because we are draining.
    Refused,
    /// After a session.
    Session(Session),
}

/// Whether a read may ask for room under `max_buffered_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Room {
    /// It may.
    Free,
    /// Room was refused: wait for released bytes, or until this instant (if any).
    Refused { until: Option<Instant> },
}

/// One SPOP connection's state.
#[derive(Debug)]
pub struct Conn {
    settings: Settings,
    state: State,
    buf: BytesMut,
    drain: Seen,
    /// The peer closed its side.
    eof: bool,
    /// Since when the buffer has held an unfinished (or not yet decoded) frame.
    partial_since: Option<Instant>,
    /// This connection's evaluations queued or running, as last fed.
    evaluations: usize,
    /// ACK bytes waiting for the socket, as last fed.
    unsent: usize,
    /// Whether a read may ask for room now.
    room: Room,
}

impl Conn {
    /// A new connection, accepted at `now`, in the lifecycle's `drain`.
    pub fn new(settings: Settings, drain: Seen, now: Instant) -> Self {
        Conn {
            settings,
            state: State::AwaitHello { accepted: now },
            buf: BytesMut::new(),
            drain,
            eof: false,
            partial_since: None,
            evaluations: 0,
            unsent: 0,
            room: Room::Free,
        }
    }

    /// Where the task reads bytes into (then feeds [`Input::Read`]).
    pub fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// The negotiated (or, before HELLO, our own) maximum frame size.
    pub fn max_frame_size(&self) -> u32 {
        self.session()
            .map_or(self.settings.max_frame_size, |s| s.max_frame_size)
    }

    /// What to take in before the next frame is decoded ([`Conn::poll`]): ACKs written
    /// directly are counted first, so that a NOTIFY HAProxy sent in answer to one does not
    /// find it still owed. `None`: decode.
    pub fn before_decode(&self, counts: &mut impl Counts) -> Option<Input> {
        let written = counts.take_written();
        (written > 0).then_some(Input::AcksWritten(written))
    }

    /// What to take in before a [`Wait`] is carried out, the first of: ACKs written, ACKs
    /// held, an eviction, then a count that differs from what the `Conn` was last told
    /// (unsent bytes, evaluations). `None`: nothing; carry out the wait. Call it once the
    /// wait's [`Wait::direct_acks`] and [`Wait::ack_wakes`] are in force, so that no ACK
    /// written after the count goes unnoticed.
    pub fn before_wait(&self, counts: &mut impl Counts) -> Option<Input> {
        if let Some(input) = self.before_decode(counts) {
            return Some(input);
        }
        if let Some((bytes, count)) = counts.take_held() {
            return Some(Input::HeldAcks { bytes, count });
        }
        if counts.evicted() {
            return Some(Input::Evicted);
        }
        let unsent = counts.unsent();
        if unsent != self.unsent {
            return Some(Input::Unsent(unsent));
        }
        let evaluations = counts.evaluations();
        (evaluations != self.evaluations).then_some(Input::Evaluations(evaluations))
    }

    /// NOTIFYs whose ACK is owed.
    pub fn owed(&self) -> usize {
        self.session().map_or(0, |s| s.owed)
    }

    /// Whether HAProxy has never had more than one NOTIFY owed on this connection: a
    /// goodbye riding on the ACK of its only NOTIFY then crosses nothing (see the module's
    /// doc).
    pub fn one_at_a_time(&self) -> bool {
        self.session().is_none_or(|s| s.one_at_a_time)
    }

    /// Whether this connection was a health check (see `lastcall-spoa`'s `engine::down`).
    pub fn health_check(&self) -> bool {
        matches!(self.state, State::Closed(Closed::HealthCheck))
    }

    /// How long this connection, now closed, must still count as a session given the
    /// lifecycle `now`, if at all: a session closed while lingering ([`LINGER_HOLD`]), a
    /// HELLO refused while draining ([`REFUSED_HOLD`]; not at the exit decision).
    pub fn hold(&self, now: Seen) -> Option<Duration> {
        match self.state {
            State::Closed(Closed::Refused) if !now.is_exiting() => Some(REFUSED_HOLD),
            State::Ready(_) | State::Closed(Closed::Session(_)) if lingering(now) => {
                Some(LINGER_HOLD)
            }
            _ => None,
        }
    }

    /// Takes the next protocol event from the buffer, while fewer than the bound of NOTIFYs
    /// are owed; `None` when more bytes (or room) are needed.
    pub fn poll(&mut self, now: Instant) -> Option<Event> {
        if matches!(self.state, State::Closed(_)) || self.owed() >= self.max_inflight() {
            return None;
        }
        let limit = self.frame_limit();
        match frame::decode_frame(&mut self.buf, limit) {
            Ok(None) => None,
            Ok(Some(f)) => Some(self.on_frame(now, f)),
            Err(e) if self.awaiting_hello() && e.status == StatusCode::TooBig => {
                Some(self.fail(ProtocolError::new(
                    StatusCode::TooBig,
                    format!("{} (before HAPROXY-HELLO)", e.reason),
                )))
            }
            Err(e) => Some(self.fail(e)),
        }
    }

    /// Feeds one input at `now` (never earlier than a previous `now`); returns what to do.
    pub fn handle(&mut self, now: Instant, input: Input) -> Action {
        if matches!(self.state, State::Closed(_)) {
            // Only reachable if the task goes on after a close: nothing more to say.
            return Action::Close {
                bytes: Vec::new(),
                reason: CloseReason::PeerClosed,
            };
        }
        match input {
            Input::Nothing | Input::Timeout => {}
            Input::Evicted => {
                return self.fail_close(ProtocolError::new(
                    StatusCode::Resource,
                    "buffered bytes at max_buffered_bytes: the oldest unfinished frame is dropped",
                ));
            }
            Input::Read => {
                if let Some(s) = self.ready_mut() {
                    s.unread_waiting = false;
                }
            }
            Input::Eof => self.eof = true,
            Input::Drain(drain) => {
                self.drain = drain;
                if drain.is_exiting() {
                    return self.goodbye(Vec::new(), CloseReason::Exiting, "shutting down");
                }
            }
            Input::End => {
                return self.goodbye(Vec::new(), CloseReason::Ended, "ended by the operator")
            }
            Input::AcksWritten(n) => self.acked(now, n),
            Input::HeldAcks { bytes, count } => {
                self.acked(now, count);
                return self.place_acks(now, bytes, count);
            }
            Input::Evaluations(n) => self.evaluations = n,
            Input::Unsent(n) => self.unsent = n,
            Input::NoRoom(Pressure::Wait(until)) => self.room = Room::Refused { until },
            Input::NoRoom(Pressure::Evicted) | Input::Released => self.room = Room::Free,
            Input::Probed(probe) => return self.probed(now, probe),
        }
        self.next(now)
    }

    /// The session, while handshaken.
    fn ready(&self) -> Option<&Session> {
        match &self.state {
            State::Ready(s) => Some(s),
            _ => None,
        }
    }

    fn ready_mut(&mut self) -> Option<&mut Session> {
        match &mut self.state {
            State::Ready(s) => Some(s),
            _ => None,
        }
    }

    /// The session, while handshaken or after it closed.
    fn session(&self) -> Option<&Session> {
        match &self.state {
            State::Ready(s) | State::Closed(Closed::Session(s)) => Some(s),
            _ => None,
        }
    }

    fn awaiting_hello(&self) -> bool {
        matches!(self.state, State::AwaitHello { .. })
    }

    /// Closed from now on; a session keeps what it was for the questions asked after.
    fn close(&mut self) {
        let closed = match std::mem::replace(&mut self.state, State::Closed(Closed::Unopened)) {
            State::AwaitHello { .. } => Closed::Unopened,
            State::Ready(s) => Closed::Session(s),
            State::Closed(c) => c,
        };
        self.state = State::Closed(closed);
    }

    fn acked(&mut self, now: Instant, n: usize) {
        let Some(s) = self.ready_mut() else {
            debug_assert_eq!(n, 0, "ACKs written before the handshake");
            return;
        };
        debug_assert!(n <= s.owed, "{n} ACKs written, {} owed", s.owed);
        s.owed = s.owed.saturating_sub(n);
        if n > 0 {
            s.last_activity = now;
        }
    }

    fn probed(&mut self, now: Instant, probe: Probe) -> Action {
        let Some(s) = self.ready_mut() else {
            return self.next(now);
        };
        if probe == Probe::Waiting {
            s.unread_waiting = true;
        }
        let probing = s.probing.take();
        let idle = probe == Probe::Idle && self.quiet();
        match probing {
            Some(Probing::Acks { bytes, .. }) => match self.goodbye_reason(now) {
                Some((reason, message)) if idle => self.goodbye(bytes, reason, message),
                _ => Action::Write(bytes),
            },
            _ if idle => {
                if self.idle_at().is_some_and(|at| now >= at) {
                    return self.goodbye(Vec::new(), CloseReason::Idle, "idle");
                }
                if self.refusing() && self.quiet_at().is_some_and(|at| now >= at) {
                    return self.goodbye(Vec::new(), CloseReason::Drained, "draining");
                }
                self.next(now)
            }
            _ => self.next(now),
        }
    }

    /// Held ACKs: the last ones of a connection whose goodbye is due carry it in the same
    /// write, once the socket says nothing is unread.
    fn place_acks(&mut self, now: Instant, bytes: Vec<u8>, count: usize) -> Action {
        if !(self.rides(now) && self.quiet()) {
            return Action::Write(bytes);
        }
        match self.ready_mut() {
            Some(s) => {
                s.probing = Some(Probing::Acks { bytes, count });
                Action::Probe
            }
            None => Action::Write(bytes),
        }
    }

    /// Whether a goodbye may ride on the ACKs being placed now: one is due, and HAProxy
    /// waits for them before it sends anything more here (it never had more than one NOTIFY
    /// owed on this connection). On a connection HAProxy pipelines, the drain's goodbye
    /// still rides on the last ACK when `drain_quiet` is zero (nothing makes it lossless
    /// there: it only saves a write).
    fn rides(&self, now: Instant) -> bool {
        match self.goodbye_reason(now) {
            Some((CloseReason::DrainedPipelined, _)) => {
                self.settings.drain_quiet.is_zero() || !self.drain.held
            }
            Some(_) => self.one_at_a_time(),
            None => false,
        }
    }

    /// The goodbye due now, if any: the drain's (on a connection HAProxy pipelines on, a
    /// risked one), or a rebalancing one.
    fn goodbye_reason(&self, now: Instant) -> Option<(CloseReason, &'static str)> {
        if self.refusing() {
            if !self.one_at_a_time() {
                return Some((CloseReason::DrainedPipelined, "draining"));
            }
            return Some((CloseReason::Drained, "draining"));
        }
        self.rebalance_due(now)
            .then_some((CloseReason::Rebalanced, "rebalancing"))
    }

    /// While serving or announcing, after [`Rebalance`]'s bounds, on a connection a goodbye
    /// can ride on.
    fn rebalance_due(&self, now: Instant) -> bool {
        let Some(s) = self.ready() else {
            return false;
        };
        let r = self.settings.rebalance;
        let by_count = r.after_messages > 0 && s.messages >= r.after_messages;
        let by_age =
            !r.after.is_zero() && s.ready_at.checked_add(r.after).is_some_and(|at| now >= at);
        s.one_at_a_time
            && matches!(self.drain.phase, Phase::Serving | Phase::Announcing)
            && !self.drain.is_exiting()
            && (by_count || by_age)
    }

    /// When [`Rebalance::after`] makes a goodbye due, if that is still to come.
    fn rebalance_at(&self) -> Option<Instant> {
        let after = self.settings.rebalance.after;
        let s = self.ready()?;
        (!after.is_zero() && s.one_at_a_time)
            .then(|| s.ready_at.checked_add(after))
            .flatten()
    }

    /// Refusing, the exit not decided: the drain's goodbye.
    fn refusing(&self) -> bool {
        self.drain.phase == Phase::Refusing && !self.drain.is_exiting()
    }

    /// After the handshake, nothing owed, nothing buffered, the peer still there.
    fn quiet(&self) -> bool {
        self.ready().is_some_and(|s| s.owed == 0) && self.buf.is_empty() && !self.eof
    }

    /// When a quiet connection is closed for idleness (never, if that is beyond time).
    fn idle_at(&self) -> Option<Instant> {
        self.ready()?
            .last_activity
            .checked_add(self.settings.idle_timeout)
    }

    /// When a quiet connection says the drain's goodbye.
    fn quiet_at(&self) -> Option<Instant> {
        let last = self.ready()?.last_activity;
        Some(last.checked_add(self.settings.drain_quiet).unwrap_or(last))
    }

    /// Whether ACKs may be written straight to the socket by whoever has them: only while
    /// serving, and until a goodbye is due. Otherwise they are handed to the connection,
    /// which decides whether the goodbye rides on the last one.
    fn direct_acks(&self, now: Instant) -> bool {
        self.drain.is_serving() && !self.rebalance_due(now)
    }

    fn max_inflight(&self) -> usize {
        self.settings.max_inflight.max(1)
    }

    /// The largest frame accepted now: [`HELLO_FRAME_LIMIT`] before the handshake.
    fn frame_limit(&self) -> u32 {
        if self.awaiting_hello() {
            return HELLO_FRAME_LIMIT.min(self.settings.max_frame_size);
        }
        self.max_frame_size()
    }

    /// Whether another whole frame is already buffered (HAProxy pipelined a burst).
    fn frame_waiting(&self) -> bool {
        match self.buf.get(..4) {
            Some(&[a, b, c, d]) => {
                let len = u32::from_be_bytes([a, b, c, d]) as usize;
                self.buf.len() >= len.saturating_add(4)
            }
            _ => false,
        }
    }

    /// How many free bytes the buffer should have for the next read: what is missing of the
    /// frame being read (at least [`READ_ROOM`], at most [`READ_ROOM_MAX`] at once), or
    /// enough for a HELLO before the handshake.
    fn read_room(&self) -> usize {
        let limit = self.frame_limit() as usize + 4;
        match self.buf.get(..4) {
            Some(&[a, b, c, d]) => {
                let total = (u32::from_be_bytes([a, b, c, d]) as usize).saturating_add(4);
                let missing = total.saturating_sub(self.buf.len()).min(limit);
                missing.clamp(READ_ROOM.min(limit), READ_ROOM_MAX)
            }
            _ => READ_ROOM.min(limit),
        }
    }

    /// The next action when nothing needs an answer: close at EOF, on a stalled frame or a
    /// missing HELLO, look at the socket when a goodbye may be due, otherwise wait.
    fn next(&mut self, now: Instant) -> Action {
        if self.eof && self.owed() == 0 {
            return self.on_eof();
        }
        self.partial_since = match (self.buf.is_empty(), self.partial_since) {
            (true, _) => None,
            (false, None) => Some(now),
            (false, since) => since,
        };
        let stalled_at = self
            .partial_since
            .map(|s| s + self.settings.partial_frame_timeout);
        if stalled_at.is_some_and(|at| now >= at) {
            return self.fail_close(ProtocolError::new(
                StatusCode::Timeout,
                "frame not completed in time",
            ));
        }
        let mut timers = Timers::default();
        timers.add(stalled_at);
        if let State::AwaitHello { accepted } = self.state {
            let hello_at = accepted.checked_add(self.settings.hello_timeout);
            if hello_at.is_some_and(|at| now >= at) {
                self.close();
                let mut bytes = Vec::new();
                frame::encode_agent_disconnect(
                    StatusCode::Timeout,
                    "no HAPROXY-HELLO within hello_timeout",
                    &mut bytes,
                );
                return Action::Close {
                    bytes,
                    reason: CloseReason::HelloTimeout,
                };
            }
            timers.add(hello_at);
        }
        if self.quiet() && self.ready().is_some_and(|s| !s.unread_waiting) {
            let idle_at = self.idle_at();
            let drain_at = self.quiet_at().filter(|_| self.refusing());
            if [idle_at, drain_at].iter().flatten().any(|at| now >= *at) {
                if let Some(s) = self.ready_mut() {
                    s.probing = Some(Probing::Idle);
                }
                return Action::Probe;
            }
            timers.add(idle_at);
            timers.add(drain_at);
        }
        if !self.rebalance_due(now) && self.drain.is_serving() {
            // The goodbye's due time turns the ACKs over to the connection.
            timers.add(self.rebalance_at());
        }
        if let Room::Refused { until: Some(at) } = self.room {
            if now >= at {
                self.room = Room::Free;
            }
        }
        if let Room::Refused { until } = self.room {
            timers.add(until);
        }
        if self.buf.is_empty() && self.buf.capacity() > READ_ROOM_MAX {
            // Give a large frame's memory back.
            self.buf = BytesMut::new();
        }
        Action::Wait(self.wait(now, timers.first))
    }

    fn wait(&self, now: Instant, until: Option<Instant>) -> Wait {
        let bound = self.max_inflight();
        let evaluations_full = self.evaluations >= bound;
        // Not while a whole frame waits to be decoded: a peer that pipelines faster than its
        // ACKs are taken would otherwise fill the buffer (measured: 64 MiB from one
        // connection that never read, 8 KiB per ACK).
        let read = !self.eof
            && self.owed() < bound
            && !evaluations_full
            && self.unsent <= self.settings.max_unsent
            && !self.frame_waiting()
            && self.room == Room::Free;
        let direct_acks = self.direct_acks(now);
        Wait {
            read: read.then(|| self.read_room()),
            until,
            direct_acks,
            ack_wakes: !direct_acks || self.eof || self.owed() >= bound,
            evaluation_wakes: evaluations_full,
            memory_wakes: self.room != Room::Free,
            holding: Holding {
                capacity: self.buf.capacity(),
                unfinished_since: self.partial_since.filter(|_| !self.frame_waiting()),
            },
        }
    }

    fn on_eof(&mut self) -> Action {
        if self.buf.is_empty() || matches!(self.state, State::Closed(_)) {
            self.close();
            return Action::Close {
                bytes: Vec::new(),
                reason: CloseReason::PeerClosed,
            };
        }
        let len = self.buf.len();
        self.fail_close(ProtocolError::new(
            StatusCode::Invalid,
            format!("truncated frame: connection closed with {len} bytes of a frame"),
        ))
    }

    /// `before` (ACKs, or nothing) and AGENT-DISCONNECT status 0, then close.
    fn goodbye(&mut self, mut before: Vec<u8>, reason: CloseReason, message: &str) -> Action {
        self.close();
        frame::encode_agent_disconnect(StatusCode::None, message, &mut before);
        Action::Close {
            bytes: before,
            reason,
        }
    }

    /// The peer broke the protocol: AGENT-DISCONNECT with the status SPOE.txt assigns.
    fn failure(&mut self, e: ProtocolError) -> (Vec<u8>, CloseReason) {
        self.close();
        let mut reply = Vec::new();
        frame::encode_agent_disconnect(e.status, &e.reason, &mut reply);
        (reply, CloseReason::Protocol(e))
    }

    fn fail(&mut self, e: ProtocolError) -> Event {
        let (reply, reason) = self.failure(e);
        Event::Close { reply, reason }
    }

    fn fail_close(&mut self, e: ProtocolError) -> Action {
        let (bytes, reason) = self.failure(e);
        Action::Close { bytes, reason }
    }

    fn on_frame(&mut self, now: Instant, f: frame::RawFrame) -> Event {
        if matches!(f.kind, kind::HAPROXY_HELLO | kind::HAPROXY_DISCONNECT)
            && (f.stream_id != 0 || f.frame_id != 0)
        {
            // SPOE.txt 3.2.4 and 3.2.8: STREAM-ID and FRAME-ID must be 0.
            let name = if f.kind == kind::HAPROXY_HELLO {
                "HAPROXY-HELLO"
            } else {
                "HAPROXY-DISCONNECT"
            };
            return self.fail(ProtocolError::invalid(format!(
                "{name} with stream-id {} and frame-id {} (both must be 0)",
                f.stream_id, f.frame_id
            )));
        }
        match f.kind {
            kind::HAPROXY_DISCONNECT => self.on_disconnect(&f.payload),
            kind::HAPROXY_HELLO if self.awaiting_hello() => self.on_hello(now, &f.payload),
            other if self.awaiting_hello() => self.fail(ProtocolError::new(
                StatusCode::Invalid,
                format!("frame type {other} before HAPROXY-HELLO"),
            )),
            kind::NOTIFY if self.ready().is_some() => self.on_notify(now, f),
            other => self.fail(ProtocolError::new(
                StatusCode::Invalid,
                format!("unexpected frame type {other} after the handshake"),
            )),
        }
    }

    fn on_disconnect(&mut self, payload: &[u8]) -> Event {
        self.close();
        let status = payload::parse_kv_list(payload)
            .ok()
            .and_then(|kv| {
                kv.into_iter().find_map(|(k, v)| match (k.as_str(), v) {
                    ("status-code", spop::TypedData::UInt32(s)) => Some(s),
                    _ => None,
                })
            })
            .unwrap_or(0);
        let mut reply = Vec::new();
        frame::encode_agent_disconnect(StatusCode::None, "normal", &mut reply);
        Event::Close {
            reply,
            reason: CloseReason::PeerDisconnect(status),
        }
    }

    /// A NOTIFY: its ACK is owed from now on.
    fn on_notify(&mut self, now: Instant, f: frame::RawFrame) -> Event {
        let messages = match payload::parse_messages(&f.payload) {
            Ok(messages) => messages,
            Err(e) => return self.fail(e),
        };
        let inline = self.drain.is_serving();
        if let Some(s) = self.ready_mut() {
            s.owed += 1;
            s.messages += 1;
            if s.owed + s.held_acks() > 1 {
                s.one_at_a_time = false;
            }
            s.last_activity = now;
        }
        Event::Notify {
            stream_id: f.stream_id,
            frame_id: f.frame_id,
            size: held_size(f.payload.len(), &messages),
            messages,
            inline,
        }
    }

    fn on_hello(&mut self, now: Instant, hello: &[u8]) -> Event {
        let mut negotiated = match payload::negotiate_hello(hello, self.settings.max_frame_size) {
            Ok(n) => n,
            Err(e) => return self.fail(e),
        };
        negotiated.pipelining &= self.settings.pipelining && negotiated.offered_async;
        // Health checks are answered until the drain refuses work, like HELLOs: HAProxy
        // then marks the agent DOWN only after its connections have said goodbye, so that
        // `on-marked-down shutdown-sessions` (which contains a hung agent) finds none to cut.
        // While refusing, HAProxy 3.1+'s multiplexer (it does not offer `async`) fails the
        // messages waiting for a connection whose HELLO is refused (`st=257`, measured behind
        // 3.2: one per client in each drain); served, such a connection carries one NOTIFY
        // at a time and says the drain's goodbye on its first ACK, as every connection does.
        let multiplexer = !negotiated.offered_async;
        let refuse = self.drain.is_refusing()
            && (negotiated.healthcheck || !multiplexer || self.drain.is_exiting());
        if refuse {
            self.state = State::Closed(if negotiated.healthcheck {
                Closed::HealthCheck
            } else {
                Closed::Refused
            });
            let mut reply = Vec::new();
            frame::encode_agent_disconnect(StatusCode::None, "draining", &mut reply);
            return Event::Close {
                reply,
                reason: CloseReason::Refused,
            };
        }
        let mut reply = Vec::new();
        frame::encode_agent_hello(&negotiated, &mut reply);
        if negotiated.healthcheck {
            self.state = State::Closed(Closed::HealthCheck);
            return Event::Close {
                reply,
                reason: CloseReason::HealthCheck,
            };
        }
        self.state = State::Ready(Session::new(negotiated.max_frame_size, now));
        Event::Ready { reply, negotiated }
    }
}

fn lingering(drain: Seen) -> bool {
    drain.phase == Phase::Lingering && !drain.is_exiting()
}

/// The earliest of a few optional instants.
#[derive(Debug, Default)]
struct Timers {
    first: Option<Instant>,
}

impl Timers {
    fn add(&mut self, at: Option<Instant>) {
        if let Some(at) = at {
            self.first = Some(self.first.map_or(at, |f| f.min(at)));
        }
    }
}

/// About what decoded messages hold: the frame's bytes, plus a string, a typed value and two
/// allocations per argument.
fn held_size(wire: usize, messages: &[Message]) -> usize {
    let args: usize = messages.iter().map(|m| m.args.len() + 1).sum();
    wire + 128 * args
}

#[cfg(test)]
mod tests;
