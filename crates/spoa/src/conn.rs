//! The per-connection SPOP state machine, sans-IO: bytes in, events out.
//!
//! The async driver (`server`) reads into a buffer, asks [`Conn::poll`] for the next event,
//! writes what the event says, and runs evaluations. Everything the peer can get wrong is
//! decided here, so it is unit-tested without sockets.

use bytes::BytesMut;
use spop::frame::Message;
use spop::StatusCode;

use crate::frame::{self, kind, Negotiated, ProtocolError};

/// How HELLOs are answered right now (changes while draining).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HelloPolicy {
    /// Answer health-check HELLOs with AGENT-DISCONNECT (the drain has started), so HAProxy
    /// marks this server DOWN and stops choosing it.
    pub refuse_healthchecks: bool,
    /// Answer every HELLO with AGENT-DISCONNECT (new connections are refused).
    pub refuse_all: bool,
}

/// What the driver must do next.
#[derive(Debug)]
pub enum Event {
    /// Handshake done: write `reply` (AGENT-HELLO) and keep reading.
    Ready {
        /// The AGENT-HELLO frame.
        reply: Vec<u8>,
        /// What was agreed.
        negotiated: Negotiated,
    },
    /// A NOTIFY to evaluate and ACK.
    Notify {
        /// Stream id to echo.
        stream_id: u64,
        /// Frame id to echo.
        frame_id: u64,
        /// The messages.
        messages: Vec<Message>,
    },
    /// Write `reply` (whole, in one write, after any ACKs the driver still owes if
    /// `after_acks`) and close.
    Close {
        /// The last frame(s): AGENT-HELLO for a health check, or AGENT-DISCONNECT.
        reply: Vec<u8>,
        /// Why the connection ends.
        reason: CloseReason,
    },
}

/// Why a connection is closing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// A health check was answered.
    HealthCheck,
    /// A HELLO was refused because we are draining.
    Refused,
    /// HAProxy sent HAPROXY-DISCONNECT (its status code).
    PeerDisconnect(u32),
    /// The peer broke the protocol.
    Protocol(ProtocolError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitHello,
    Ready,
    Closed,
}

/// One SPOP connection's protocol state.
#[derive(Debug)]
pub struct Conn {
    state: State,
    our_max: u32,
    max_frame_size: u32,
    allow_pipelining: bool,
    pipelined: bool,
}

impl Conn {
    /// A new connection; `our_max` is the largest frame we accept.
    pub fn new(our_max: u32) -> Self {
        Self {
            state: State::AwaitHello,
            our_max,
            max_frame_size: our_max,
            allow_pipelining: true,
            pipelined: false,
        }
    }

    /// Whether `pipelining` is announced when HAProxy offers it (default true). Without it
    /// HAProxy sends one NOTIFY at a time on the connection and waits for its ACK.
    pub fn with_pipelining(mut self, allow: bool) -> Self {
        self.allow_pipelining = allow;
        self
    }

    /// Whether pipelining was agreed in the handshake.
    pub fn pipelined(&self) -> bool {
        self.pipelined
    }

    /// The negotiated (or, before HELLO, our own) maximum frame size.
    pub fn max_frame_size(&self) -> u32 {
        self.max_frame_size
    }

    /// Whether the handshake is complete and the connection not closed.
    pub fn is_ready(&self) -> bool {
        self.state == State::Ready
    }

    /// Takes the next event from `buf`, or `None` if more bytes are needed.
    pub fn poll(&mut self, buf: &mut BytesMut, policy: HelloPolicy) -> Option<Event> {
        if self.state == State::Closed {
            return None;
        }
        match frame::decode_frame(buf, self.max_frame_size) {
            Ok(None) => None,
            Ok(Some(f)) => Some(self.on_frame(f, policy)),
            Err(e) => Some(self.fail(e)),
        }
    }

    /// The peer closed its side. Bytes left in `buf` are a truncated frame.
    pub fn on_eof(&mut self, buf: &BytesMut) -> Option<Event> {
        if self.state == State::Closed || buf.is_empty() {
            self.state = State::Closed;
            return None;
        }
        Some(self.fail(ProtocolError::new(
            StatusCode::Invalid,
            format!(
                "truncated frame: connection closed with {} bytes of a frame",
                buf.len()
            ),
        )))
    }

    /// A partial frame sat unfinished for too long.
    pub fn on_read_timeout(&mut self) -> Event {
        self.fail(ProtocolError::new(
            StatusCode::Timeout,
            "frame not completed in time",
        ))
    }

    /// Builds the AGENT-DISCONNECT we send when we close on our own (drain, deadline).
    pub fn goodbye(&mut self, message: &str) -> Vec<u8> {
        self.state = State::Closed;
        let mut out = Vec::new();
        frame::encode_agent_disconnect(StatusCode::None, message, &mut out);
        out
    }

    fn fail(&mut self, e: ProtocolError) -> Event {
        self.state = State::Closed;
        let mut reply = Vec::new();
        frame::encode_agent_disconnect(e.status, &e.reason, &mut reply);
        Event::Close {
            reply,
            reason: CloseReason::Protocol(e),
        }
    }

    fn on_frame(&mut self, f: frame::RawFrame, policy: HelloPolicy) -> Event {
        match (self.state, f.kind) {
            (_, kind::HAPROXY_DISCONNECT) => {
                self.state = State::Closed;
                let status = frame::parse_kv_list(&f.payload)
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
            (State::AwaitHello, kind::HAPROXY_HELLO) => self.on_hello(&f.payload, policy),
            (State::AwaitHello, other) => self.fail(ProtocolError::new(
                StatusCode::Invalid,
                format!("frame type {other} before HAPROXY-HELLO"),
            )),
            (State::Ready, kind::NOTIFY) => match frame::parse_messages(&f.payload) {
                Ok(messages) => Event::Notify {
                    stream_id: f.stream_id,
                    frame_id: f.frame_id,
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

    fn on_hello(&mut self, payload: &[u8], policy: HelloPolicy) -> Event {
        let mut negotiated = match frame::negotiate_hello(payload, self.our_max) {
            Ok(n) => n,
            Err(e) => return self.fail(e),
        };
        negotiated.pipelining &= self.allow_pipelining;
        let refuse = policy.refuse_all || (negotiated.healthcheck && policy.refuse_healthchecks);
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
        self.max_frame_size = negotiated.max_frame_size;
        self.pipelined = negotiated.pipelining;
        Event::Ready { reply, negotiated }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_agent_frame, AgentFrame};

    fn agent_frames(bytes: &[u8]) -> Vec<AgentFrame> {
        let mut buf = BytesMut::from(bytes);
        let mut out = Vec::new();
        while let Some(f) = decode_agent_frame(&mut buf).unwrap() {
            out.push(f);
        }
        assert!(buf.is_empty());
        out
    }

    fn hello(hc: bool) -> BytesMut {
        let mut v = Vec::new();
        frame::encode_haproxy_hello(16380, hc, &mut v);
        BytesMut::from(&v[..])
    }

    #[test]
    fn handshake_then_notify() {
        let mut c = Conn::new(1 << 20);
        let mut buf = hello(false);
        let Some(Event::Ready { reply, negotiated }) = c.poll(&mut buf, HelloPolicy::default())
        else {
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
        let mut v = Vec::new();
        let msg = Message {
            name: "coraza-req".into(),
            args: vec![],
        };
        frame::encode_notify(1, 2, &msg, &mut v);
        buf.extend_from_slice(&v);
        assert!(matches!(
            c.poll(&mut buf, HelloPolicy::default()),
            Some(Event::Notify {
                stream_id: 1,
                frame_id: 2,
                ..
            })
        ));
        assert!(c.poll(&mut buf, HelloPolicy::default()).is_none());
    }

    #[test]
    fn healthcheck_answered_or_refused() {
        let mut c = Conn::new(1 << 20);
        match c.poll(&mut hello(true), HelloPolicy::default()) {
            Some(Event::Close {
                reason: CloseReason::HealthCheck,
                reply,
            }) => {
                assert!(matches!(agent_frames(&reply)[..], [AgentFrame::Hello(_)]));
            }
            other => panic!("{other:?}"),
        }
        let mut c = Conn::new(1 << 20);
        let policy = HelloPolicy {
            refuse_healthchecks: true,
            refuse_all: false,
        };
        match c.poll(&mut hello(true), policy) {
            Some(Event::Close {
                reason: CloseReason::Refused,
                reply,
            }) => {
                assert!(matches!(
                    agent_frames(&reply)[..],
                    [AgentFrame::Disconnect(0, _)]
                ));
            }
            other => panic!("{other:?}"),
        }
        // A normal HELLO is still served while only health checks are refused.
        let mut c = Conn::new(1 << 20);
        assert!(matches!(
            c.poll(&mut hello(false), policy),
            Some(Event::Ready { .. })
        ));
    }

    #[test]
    fn notify_before_hello_is_invalid() {
        let mut c = Conn::new(1 << 20);
        let mut v = Vec::new();
        let msg = Message {
            name: "x".into(),
            args: vec![],
        };
        frame::encode_notify(1, 1, &msg, &mut v);
        match c.poll(&mut BytesMut::from(&v[..]), HelloPolicy::default()) {
            Some(Event::Close { reply, .. }) => {
                assert!(matches!(
                    agent_frames(&reply)[..],
                    [AgentFrame::Disconnect(4, _)]
                ));
            }
            other => panic!("{other:?}"),
        }
        assert!(c
            .poll(&mut BytesMut::from(&v[..]), HelloPolicy::default())
            .is_none());
    }

    #[test]
    fn haproxy_disconnect_is_answered_with_status_0() {
        let mut c = Conn::new(1 << 20);
        let mut buf = hello(false);
        let _ = c.poll(&mut buf, HelloPolicy::default());
        let mut v = Vec::new();
        frame::encode_haproxy_disconnect(0, "bye", &mut v);
        match c.poll(&mut BytesMut::from(&v[..]), HelloPolicy::default()) {
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

    #[test]
    fn eof_mid_frame_is_invalid() {
        let mut c = Conn::new(1 << 20);
        let mut buf = hello(false);
        buf.truncate(10);
        assert!(c.poll(&mut buf, HelloPolicy::default()).is_none());
        assert!(matches!(
            c.on_eof(&buf),
            Some(Event::Close {
                reason: CloseReason::Protocol(_),
                ..
            })
        ));
        let mut c = Conn::new(1 << 20);
        assert!(c.on_eof(&BytesMut::new()).is_none());
    }
}
