//! One SPOP connection, sans-IO: the handshake, the NOTIFYs it owes an ACK for, and the drain
//! recipe of `docs/spoa.md` (when a connection says goodbye, and with what).
//!
//! The connection task ([`super::task`]) reads bytes into [`Conn::buffer`], takes protocol
//! events from [`Conn::poll`] (a handshake, a NOTIFY to evaluate, a frame that ends the
//! connection), and feeds every other thing that happens as an [`Input`] to
//! [`Conn::handle`], which answers with the one [`Action`] to take next. `now` is passed in;
//! there is no clock, socket or thread here, so every decision is tested without them
//! (the table tests at the bottom).
//!
//! The drain, by phase ([`Drain`], read from the lifecycle's watch):
//!
//! | phase | HELLO | health-check HELLO | an idle connection | ACKs |
//! |---|---|---|---|---|
//! | serving | served | answered | kept | written by whoever has them |
//! | announcing | served | refused | kept | handed to the connection |
//! | refusing | refused | refused | goodbye, after the quiet period and a look at the socket | handed to the connection; the last one carries the goodbye |
//! | lingering | served | served | kept; when it closes, its session is held a moment | handed to the connection |
//! | exiting | refused | refused | goodbye at once, whatever it owes | cut |
//!
//! "Idle" is the handshake done, no NOTIFY owed, nothing buffered, the peer not at EOF, and
//! nothing unread on the socket: the kernel's receive buffer is asked ([`Input::Probed`]),
//! because the reactor's readiness can lag behind it, and closing on that stale "nothing to
//! read" fails the NOTIFYs already sitting there.

use std::time::Duration;

use bytes::BytesMut;
use lastcall::Phase;
use spop::frame::Message;
use spop::StatusCode;
use tokio::time::Instant;

use crate::protocol::frame::{self, kind, ProtocolError};
use crate::protocol::payload::{self, Negotiated};

/// How long a connection closed while lingering still counts as a session: HAProxy 2.6
/// soft-stopping closes every idle SPOE connection and opens a new one for the next message,
/// and a lingering agent that saw no session in between would leave and fail that message
/// (measured in tests/spoa/rollout.rs's sidecar test).
pub const LINGER_HOLD: Duration = Duration::from_millis(250);

/// The lifecycle as one connection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drain {
    /// The lifecycle's phase.
    pub phase: Phase,
    /// Whether the lifecycle has decided to exit (idle, threshold, deadline, forced).
    pub exiting: bool,
}

impl From<lastcall::Seen> for Drain {
    fn from(seen: lastcall::Seen) -> Drain {
        Drain {
            phase: seen.phase,
            exiting: seen.exiting,
        }
    }
}

impl Drain {
    /// Serving, not exiting.
    pub const SERVING: Drain = Drain {
        phase: Phase::Serving,
        exiting: false,
    };

    /// Serving normally: ACKs may be written by whoever has them, answers need no hand-off.
    pub fn serving(self) -> bool {
        self.phase == Phase::Serving && !self.exiting
    }

    fn refuses_healthchecks(self) -> bool {
        matches!(self.phase, Phase::Announcing | Phase::Refusing) || self.exiting
    }

    fn refuses_hellos(self) -> bool {
        self.phase == Phase::Refusing || self.exiting
    }

    fn closes_idle(self) -> bool {
        self.phase == Phase::Refusing && !self.exiting
    }

    fn lingering(self) -> bool {
        self.phase == Phase::Lingering && !self.exiting
    }
}

/// A connection's fixed settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Largest frame accepted before the handshake (then min'd with HAProxy's).
    pub max_frame_size: u32,
    /// Announce `pipelining` when HAProxy offers it.
    pub pipelining: bool,
    /// NOTIFYs owed at most; decoding (and reading) pauses at the bound.
    pub max_inflight: usize,
    /// While refusing, an idle connection says goodbye only after nothing came or went on it
    /// for this long.
    pub drain_quiet: Duration,
    /// A frame started but not finished within this time closes the connection (status 2).
    pub partial_frame_timeout: Duration,
    /// A connection that has not completed its HELLO within this time is closed (status 2).
    pub hello_timeout: Duration,
    /// A connection with nothing owed, nothing buffered and nothing received or sent for
    /// this long is closed (AGENT-DISCONNECT status 0).
    pub idle_timeout: Duration,
}

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
    /// The drain: the connection was idle while refusing.
    Drained,
    /// The lifecycle is exiting.
    Exiting,
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
    /// The lifecycle's phase changed.
    Drain(Drain),
    /// This many ACKs were written to the socket by whoever had them.
    AcksWritten(usize),
    /// ACKs handed to the connection to write (outside [`Drain::serving`]): `count` whole
    /// frames in `bytes`.
    HeldAcks {
        /// The frames, back to back.
        bytes: Vec<u8>,
        /// How many.
        count: usize,
    },
    /// What [`Action::Probe`] found.
    Probed(Probe),
    /// The time of [`Action::Wait`]'s `until` has come.
    Timeout,
    /// The connection's unfinished frame is dropped to make room under `max_buffered_bytes`.
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
    /// Wait for the next input: read more bytes if `read`, feed [`Input::Timeout`] at
    /// `until`.
    Wait {
        /// Whether to read (there is room for more NOTIFYs and the peer is not at EOF).
        read: bool,
        /// When to wake up without any other input.
        until: Option<Instant>,
    },
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitHello,
    Ready,
    Closed,
}

/// One SPOP connection's state.
#[derive(Debug)]
pub struct Conn {
    settings: Settings,
    state: State,
    max_frame_size: u32,
    pipelined: bool,
    /// Whether a handshake completed (a session was opened).
    had_session: bool,
    buf: BytesMut,
    drain: Drain,
    /// NOTIFYs handed out by [`Conn::poll`] whose ACK has not been written.
    owed: usize,
    /// Last NOTIFY received or ACK written.
    last_activity: Instant,
    /// Since when the buffer has held an unfinished (or not yet decoded) frame.
    partial_since: Option<Instant>,
    eof: bool,
    /// A look at the socket said bytes are waiting: no new look before the next read.
    unread_waiting: bool,
    /// ACKs kept while [`Action::Probe`] decides whether the goodbye rides on them.
    held: Option<Vec<u8>>,
    /// When the connection was accepted (for `hello_timeout`).
    accepted: Instant,
    /// The look at the socket in progress is for `idle_timeout`.
    probing_idle: bool,
}

impl Conn {
    /// A new connection, accepted at `now`, in the lifecycle's `drain`.
    pub fn new(settings: Settings, drain: Drain, now: Instant) -> Self {
        Conn {
            settings,
            state: State::AwaitHello,
            max_frame_size: settings.max_frame_size,
            pipelined: false,
            had_session: false,
            buf: BytesMut::new(),
            drain,
            owed: 0,
            last_activity: now,
            partial_since: None,
            eof: false,
            unread_waiting: false,
            held: None,
            accepted: now,
            probing_idle: false,
        }
    }

    /// Where the task reads bytes into (then feeds [`Input::Read`]).
    pub fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// How many free bytes the buffer should have for the next read: what is missing of the
    /// frame being read (at least [`READ_ROOM`], at most [`READ_ROOM_MAX`] at once), or
    /// enough for a HELLO before the handshake.
    pub fn read_room(&self) -> usize {
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

    /// Since when the buffer has held an unfinished frame (not a whole one waiting to be
    /// decoded), as of the last action.
    pub fn unfinished_since(&self) -> Option<Instant> {
        if self.frame_waiting() {
            None
        } else {
            self.partial_since
        }
    }

    /// Gives the buffer's memory back when it is empty and larger than a read needs (after
    /// a large frame).
    pub fn shrink_buffer(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > READ_ROOM_MAX {
            self.buf = BytesMut::new();
        }
    }

    /// The largest frame accepted now: [`HELLO_FRAME_LIMIT`] before the handshake.
    fn frame_limit(&self) -> u32 {
        match self.state {
            State::AwaitHello => HELLO_FRAME_LIMIT.min(self.settings.max_frame_size),
            _ => self.max_frame_size,
        }
    }

    /// The negotiated (or, before HELLO, our own) maximum frame size.
    pub fn max_frame_size(&self) -> u32 {
        self.max_frame_size
    }

    /// NOTIFYs whose ACK is owed.
    pub fn owed(&self) -> usize {
        self.owed
    }

    /// The lifecycle as last fed.
    pub fn drain(&self) -> Drain {
        self.drain
    }

    /// Whether ACKs may be written straight to the socket by whoever has them: only while
    /// serving. Otherwise they are handed to the connection, which decides whether the goodbye
    /// rides on the last one.
    pub fn direct_acks(&self) -> bool {
        self.drain.serving()
    }

    /// Whether the task wants a wake for every ACK written: it waits for owed NOTIFYs
    /// (decoding paused at the bound, end of input, or a drain).
    pub fn wants_ack_wakes(&self) -> bool {
        !self.drain.serving() || self.eof || self.owed >= self.max_inflight()
    }

    /// Whether [`Conn::poll`] has a frame to give now (a whole one is buffered and the bound
    /// of NOTIFYs owed allows it): the task polls again before it waits.
    pub fn decodable(&self) -> bool {
        self.state != State::Closed && self.owed < self.max_inflight() && self.frame_waiting()
    }

    /// Whether another whole frame is already buffered (HAProxy pipelined a burst).
    pub fn frame_waiting(&self) -> bool {
        match self.buf.get(..4) {
            Some(&[a, b, c, d]) => {
                let len = u32::from_be_bytes([a, b, c, d]) as usize;
                self.buf.len() >= len.saturating_add(4)
            }
            _ => false,
        }
    }

    /// How long the session of this connection, now closed, must still be held given the
    /// lifecycle `now` (lingering), if at all.
    pub fn linger_hold(&self, now: Drain) -> Option<Duration> {
        (self.had_session && now.lingering()).then_some(LINGER_HOLD)
    }

    fn max_inflight(&self) -> usize {
        self.settings.max_inflight.max(1)
    }

    /// Takes the next protocol event from the buffer, while fewer than the bound of NOTIFYs
    /// are owed; `None` when more bytes (or room) are needed.
    pub fn poll(&mut self, now: Instant) -> Option<Event> {
        if self.state == State::Closed || self.owed >= self.max_inflight() {
            return None;
        }
        let limit = self.frame_limit();
        let event = match frame::decode_frame(&mut self.buf, limit) {
            Ok(None) => return None,
            Ok(Some(f)) => self.on_frame(f),
            Err(e) if self.state == State::AwaitHello && e.status == StatusCode::TooBig => self
                .fail(ProtocolError::new(
                    StatusCode::TooBig,
                    format!("{} (before HAPROXY-HELLO)", e.reason),
                )),
            Err(e) => self.fail(e),
        };
        match event {
            Event::Notify { .. } => {
                self.owed += 1;
                self.last_activity = now;
            }
            Event::Ready { .. } => self.last_activity = now,
            Event::Close { .. } => {}
        }
        Some(event)
    }

    /// Feeds one input at `now` (never earlier than a previous `now`); returns what to do.
    pub fn handle(&mut self, now: Instant, input: Input) -> Action {
        if self.state == State::Closed && self.held.is_none() {
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
            Input::Read => self.unread_waiting = false,
            Input::Eof => self.eof = true,
            Input::Drain(drain) => {
                self.drain = drain;
                if drain.exiting {
                    return self.goodbye(Vec::new(), CloseReason::Exiting, "shutting down");
                }
            }
            Input::AcksWritten(n) => self.acked(now, n),
            Input::HeldAcks { bytes, count } => {
                self.acked(now, count);
                return self.place_acks(bytes);
            }
            Input::Probed(probe) => {
                if probe == Probe::Waiting {
                    self.unread_waiting = true;
                }
                if std::mem::take(&mut self.probing_idle) {
                    if probe == Probe::Idle
                        && self.quiet()
                        && self.idle_at().is_some_and(|at| now >= at)
                    {
                        return self.goodbye(Vec::new(), CloseReason::Idle, "idle");
                    }
                    return self.next(now);
                }
                if let Some(acks) = self.held.take() {
                    return match probe {
                        Probe::Idle if self.idle() => {
                            self.goodbye(acks, CloseReason::Drained, "draining")
                        }
                        _ => Action::Write(acks),
                    };
                }
                if probe == Probe::Idle && self.idle() {
                    return self.goodbye(Vec::new(), CloseReason::Drained, "draining");
                }
            }
        }
        self.next(now)
    }

    fn acked(&mut self, now: Instant, n: usize) {
        debug_assert!(n <= self.owed, "{n} ACKs written, {} owed", self.owed);
        self.owed = self.owed.saturating_sub(n);
        if n > 0 {
            self.last_activity = now;
        }
    }

    /// Held ACKs: the last one of a connection that is idle while refusing carries the
    /// goodbye in the same write, once the socket says nothing is unread.
    ///
    /// Without pipelining this is race-free: HAProxy sends nothing on the connection while
    /// it waits for the ACK, and reads the ACK and the DISCONNECT together. With pipelining
    /// HAProxy may already have sent the next NOTIFY, so the goodbye waits for `drain_quiet`
    /// like any idle connection (unless that is zero).
    fn place_acks(&mut self, bytes: Vec<u8>) -> Action {
        let rides = !self.pipelined || self.settings.drain_quiet.is_zero();
        if rides && self.idle() {
            self.held = Some(bytes);
            return Action::Probe;
        }
        Action::Write(bytes)
    }

    /// Nothing owed, nothing buffered, the peer still there, while refusing.
    fn idle(&self) -> bool {
        self.drain.closes_idle() && self.quiet()
    }

    /// After the handshake, nothing owed, nothing buffered, the peer still there.
    fn quiet(&self) -> bool {
        self.state == State::Ready && self.owed == 0 && self.buf.is_empty() && !self.eof
    }

    /// When a quiet connection is closed for idleness (never, if that is beyond time).
    fn idle_at(&self) -> Option<Instant> {
        self.last_activity.checked_add(self.settings.idle_timeout)
    }

    /// The next action when nothing needs an answer: close at EOF, on a stalled frame, or
    /// when idle while refusing (after a look at the socket); otherwise wait.
    fn next(&mut self, now: Instant) -> Action {
        if self.eof && self.owed == 0 {
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
        let mut until = stalled_at;
        let hello_at = match self.state {
            State::AwaitHello => self.accepted.checked_add(self.settings.hello_timeout),
            _ => None,
        };
        if let Some(hello_at) = hello_at {
            if now >= hello_at {
                self.state = State::Closed;
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
            until = Some(until.map_or(hello_at, |u| u.min(hello_at)));
        }
        if let Some(idle_at) = self
            .idle_at()
            .filter(|_| self.quiet() && !self.unread_waiting)
        {
            if now >= idle_at {
                self.probing_idle = true;
                return Action::Probe;
            }
            until = Some(until.map_or(idle_at, |u| u.min(idle_at)));
        }
        if self.idle() && !self.unread_waiting {
            let quiet_at = self.last_activity + self.settings.drain_quiet;
            if now >= quiet_at {
                return Action::Probe;
            }
            until = Some(until.map_or(quiet_at, |u| u.min(quiet_at)));
        }
        Action::Wait {
            // Not while a whole frame waits to be decoded: a peer that pipelines faster than
            // its ACKs are taken would otherwise fill the buffer (measured: 64 MiB from one
            // connection that never read, 8 KiB per ACK).
            read: !self.eof && self.owed < self.max_inflight() && !self.frame_waiting(),
            until,
        }
    }

    fn on_eof(&mut self) -> Action {
        if self.buf.is_empty() || self.state == State::Closed {
            self.state = State::Closed;
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
        self.state = State::Closed;
        frame::encode_agent_disconnect(StatusCode::None, message, &mut before);
        Action::Close {
            bytes: before,
            reason,
        }
    }

    /// The peer broke the protocol: AGENT-DISCONNECT with the status SPOE.txt assigns.
    fn failure(&mut self, e: ProtocolError) -> (Vec<u8>, CloseReason) {
        self.state = State::Closed;
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

    fn on_frame(&mut self, f: frame::RawFrame) -> Event {
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
        let wire = f.payload.len();
        match (self.state, f.kind) {
            (_, kind::HAPROXY_DISCONNECT) => {
                self.state = State::Closed;
                let status = payload::parse_kv_list(&f.payload)
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
            (State::AwaitHello, kind::HAPROXY_HELLO) => self.on_hello(&f.payload),
            (State::AwaitHello, other) => self.fail(ProtocolError::new(
                StatusCode::Invalid,
                format!("frame type {other} before HAPROXY-HELLO"),
            )),
            (State::Ready, kind::NOTIFY) => match payload::parse_messages(&f.payload) {
                Ok(messages) => Event::Notify {
                    stream_id: f.stream_id,
                    frame_id: f.frame_id,
                    size: held_size(wire, &messages),
                    messages,
                },
                Err(e) => self.fail(e),
            },
            (_, other) => self.fail(ProtocolError::new(
                StatusCode::Invalid,
                format!("unexpected frame type {other} after the handshake"),
            )),
        }
    }

    fn on_hello(&mut self, hello: &[u8]) -> Event {
        let mut negotiated = match payload::negotiate_hello(hello, self.settings.max_frame_size) {
            Ok(n) => n,
            Err(e) => return self.fail(e),
        };
        negotiated.pipelining &= self.settings.pipelining;
        let refuse = self.drain.refuses_hellos()
            || (negotiated.healthcheck && self.drain.refuses_healthchecks());
        if refuse {
            self.state = State::Closed;
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
            self.state = State::Closed;
            return Event::Close {
                reply,
                reason: CloseReason::HealthCheck,
            };
        }
        self.state = State::Ready;
        self.had_session = true;
        self.max_frame_size = negotiated.max_frame_size;
        self.pipelined = negotiated.pipelining;
        Event::Ready { reply, negotiated }
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
