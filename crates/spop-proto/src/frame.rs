//! SPOP frames, sans-IO: splitting a byte stream into frames (SPOE.txt 3.2: length, type,
//! flags, stream-id, frame-id, payload) and encoding the frames the agent sends.
//!
//! Typed data and varints come from the `spop` crate; the frame header is parsed here so every
//! problem maps to the status code SPOE.txt (section 3.5) assigns to it, which the crate's own
//! parser cannot express (it reports one opaque `InvalidData` error for all of them, and it
//! rejects a missing `version` and a missing `max-frame-size` the same way). The payloads are
//! read by `super::payload`.

use bytes::{Buf, BytesMut};
use spop::frame::Message;
use spop::frames::{Ack, AgentDisconnect, AgentHello, FrameCapabilities};
use spop::{SpopFrame, StatusCode, TypedData, VarScope};

use super::error::ProtocolError;
use super::payload::{parse_kv_list, put_kv, put_string, string, typed, varint, Negotiated};

/// Frame type bytes (SPOE.txt 3.2).
pub mod kind {
    /// HAPROXY-HELLO.
    pub const HAPROXY_HELLO: u8 = 1;
    /// HAPROXY-DISCONNECT.
    pub const HAPROXY_DISCONNECT: u8 = 2;
    /// NOTIFY.
    pub const NOTIFY: u8 = 3;
}

const FLAG_FIN: u32 = 0x1;
const FLAG_ABORT: u32 = 0x2;

/// One frame as read off the wire, header decoded, payload not yet interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// Frame type byte.
    pub kind: u8,
    /// Stream identifier.
    pub stream_id: u64,
    /// Frame identifier.
    pub frame_id: u64,
    /// Payload bytes.
    pub payload: bytes::Bytes,
}

/// Takes one complete frame off the front of `buf`.
///
/// `Ok(None)` means more bytes are needed ("need more bytes" is not "invalid"). A frame whose
/// length prefix exceeds `max_frame_size` is refused before its body arrives.
pub fn decode_frame(
    buf: &mut BytesMut,
    max_frame_size: u32,
) -> Result<Option<RawFrame>, ProtocolError> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    if len > max_frame_size {
        return Err(ProtocolError::new(
            StatusCode::TooBig,
            format!("frame of {len} bytes exceeds max-frame-size {max_frame_size}"),
        ));
    }
    let total = 4 + len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let mut frame = buf.split_to(total).freeze();
    frame.advance(4);
    parse_header(frame).map(Some)
}

fn parse_header(mut frame: bytes::Bytes) -> Result<RawFrame, ProtocolError> {
    if frame.len() < 5 {
        return Err(ProtocolError::invalid("frame shorter than its header"));
    }
    let kind = frame.get_u8();
    let flags = frame.get_u32();
    if !matches!(
        kind,
        kind::HAPROXY_HELLO | kind::HAPROXY_DISCONNECT | kind::NOTIFY
    ) {
        return Err(ProtocolError::invalid(format!("unknown frame type {kind}")));
    }
    if flags & FLAG_FIN == 0 || flags & FLAG_ABORT != 0 {
        return Err(ProtocolError::new(
            StatusCode::FragmentationNotSupported,
            "fragmented or aborted frame (fragmentation was not negotiated)",
        ));
    }
    if flags & !(FLAG_FIN | FLAG_ABORT) != 0 {
        return Err(ProtocolError::invalid(format!(
            "reserved flag bits set: {flags:#x}"
        )));
    }
    let (rest, stream_id) = varint(&frame, "stream-id")?;
    let (rest, frame_id) = varint(rest, "frame-id")?;
    let consumed = frame.len() - rest.len();
    frame.advance(consumed);
    Ok(RawFrame {
        kind,
        stream_id,
        frame_id,
        payload: frame,
    })
}

/// Encodes AGENT-HELLO. We announce `pipelining` only when HAProxy offered it, and never
/// `async` or fragmentation.
pub fn encode_agent_hello(n: &Negotiated, out: &mut Vec<u8>) {
    let capabilities = if n.pipelining {
        vec![FrameCapabilities::Pipelining]
    } else {
        Vec::new()
    };
    let hello = AgentHello {
        version: spop::Version::new(2, 0, 0),
        max_frame_size: n.max_frame_size,
        capabilities,
    };
    // Serialising a KV-LIST cannot fail (only LIST-OF-MESSAGES is unsupported by the encoder).
    let _ = hello.serialize_into(out);
}

/// Encodes AGENT-DISCONNECT.
pub fn encode_agent_disconnect(status: StatusCode, message: &str, out: &mut Vec<u8>) {
    let frame = AgentDisconnect {
        status_code: status.to_u32(),
        message: message.to_owned(),
    };
    let _ = frame.serialize_into(out);
}

/// Encodes an ACK with `set-var` actions in transaction scope.
///
/// If the frame would exceed `max_frame_size`, the longest string values are cut until it fits
/// (a long `rules_hit` list is the usual cause); the ACK itself is never dropped.
pub fn encode_ack(
    stream_id: u64,
    frame_id: u64,
    vars: &[(&str, TypedData)],
    max_frame_size: u32,
    out: &mut Vec<u8>,
) {
    let mut vars: Vec<(&str, TypedData)> = vars.to_vec();
    loop {
        let mut ack = Ack::new(stream_id, frame_id);
        for (name, value) in &vars {
            ack = ack.set_var(VarScope::Transaction, name, value.clone());
        }
        let mut buf = Vec::new();
        let _ = ack.serialize_into(&mut buf);
        let len = buf.len().saturating_sub(4);
        if len <= max_frame_size as usize || !shrink_longest(&mut vars) {
            out.extend_from_slice(&buf);
            return;
        }
    }
}

fn shrink_longest(vars: &mut [(&str, TypedData)]) -> bool {
    let longest = vars
        .iter_mut()
        .filter_map(|(_, v)| match v {
            TypedData::String(s) if !s.is_empty() => Some(s),
            _ => None,
        })
        .max_by_key(|s| s.len());
    match longest {
        Some(s) => {
            let mut cut = s.len() / 2;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
            true
        }
        None => false,
    }
}

/// Encodes a HAPROXY-HELLO as HAProxy 2.6 and 3.0's applet sends it, offering `pipelining`
/// and `async` (used by tests and raw clients).
pub fn encode_haproxy_hello(max_frame_size: u32, healthcheck: bool, out: &mut Vec<u8>) {
    encode_haproxy_hello_offering(max_frame_size, healthcheck, "pipelining,async", out);
}

/// Encodes a HAPROXY-HELLO offering `capabilities` (`"pipelining"`: HAProxy 3.1+'s
/// multiplexer).
pub fn encode_haproxy_hello_offering(
    max_frame_size: u32,
    healthcheck: bool,
    capabilities: &str,
    out: &mut Vec<u8>,
) {
    let mut payload = Vec::new();
    put_kv(
        &mut payload,
        "supported-versions",
        &TypedData::String("2.0".into()),
    );
    put_kv(
        &mut payload,
        "max-frame-size",
        &TypedData::UInt32(max_frame_size),
    );
    put_kv(
        &mut payload,
        "capabilities",
        &TypedData::String(capabilities.into()),
    );
    if healthcheck {
        put_kv(&mut payload, "healthcheck", &TypedData::Bool(true));
    }
    put_frame(kind::HAPROXY_HELLO, 0, 0, &payload, out);
}

/// Encodes a NOTIFY carrying one message (used by tests and raw clients).
pub fn encode_notify(stream_id: u64, frame_id: u64, msg: &Message, out: &mut Vec<u8>) {
    let mut payload = Vec::new();
    put_string(&mut payload, &msg.name);
    payload.push(u8::try_from(msg.args.len()).unwrap_or(u8::MAX));
    for (name, value) in msg.args.iter().take(255) {
        put_kv(&mut payload, name, value);
    }
    put_frame(kind::NOTIFY, stream_id, frame_id, &payload, out);
}

/// Encodes a HAPROXY-DISCONNECT (used by tests and raw clients).
pub fn encode_haproxy_disconnect(status: u32, message: &str, out: &mut Vec<u8>) {
    let mut payload = Vec::new();
    put_kv(&mut payload, "status-code", &TypedData::UInt32(status));
    put_kv(&mut payload, "message", &TypedData::String(message.into()));
    put_frame(kind::HAPROXY_DISCONNECT, 0, 0, &payload, out);
}

/// Writes a frame with the given header fields and payload (FIN set).
pub fn put_frame(kind: u8, stream_id: u64, frame_id: u64, payload: &[u8], out: &mut Vec<u8>) {
    let mut body = vec![kind];
    body.extend_from_slice(&FLAG_FIN.to_be_bytes());
    spop::encode_varint_into(stream_id, &mut body);
    spop::encode_varint_into(frame_id, &mut body);
    body.extend_from_slice(payload);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&body);
}

/// A decoded agent-side frame, for tests and raw clients reading what the agent sent.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentFrame {
    /// AGENT-HELLO with its KV-LIST.
    Hello(Vec<(String, TypedData)>),
    /// AGENT-DISCONNECT: status code and message.
    Disconnect(u32, String),
    /// ACK: stream-id, frame-id and the `set-var` actions (name, value).
    Ack(u64, u64, Vec<(String, TypedData)>),
}

/// Decodes a frame the agent sent (inverse of the encoders above), for tests and tools.
pub fn decode_agent_frame(buf: &mut BytesMut) -> Result<Option<AgentFrame>, ProtocolError> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let mut frame = buf.split_to(4 + len).freeze();
    frame.advance(4);
    if frame.len() < 5 {
        return Err(ProtocolError::invalid("short agent frame"));
    }
    let kind = frame.get_u8();
    let _flags = frame.get_u32();
    let (rest, sid) = varint(&frame, "stream-id")?;
    let (rest, fid) = varint(rest, "frame-id")?;
    match kind {
        101 => Ok(Some(AgentFrame::Hello(parse_kv_list(rest)?))),
        102 => {
            let kv = parse_kv_list(rest)?;
            let status = kv.iter().find_map(|(k, v)| match (k.as_str(), v) {
                ("status-code", TypedData::UInt32(s)) => Some(*s),
                _ => None,
            });
            let msg = kv.iter().find_map(|(k, v)| match (k.as_str(), v) {
                ("message", TypedData::String(s)) => Some(s.clone()),
                _ => None,
            });
            Ok(Some(AgentFrame::Disconnect(
                status.unwrap_or(u32::MAX),
                msg.unwrap_or_default(),
            )))
        }
        103 => Ok(Some(AgentFrame::Ack(sid, fid, parse_actions(rest)?))),
        other => Err(ProtocolError::invalid(format!(
            "unexpected agent frame {other}"
        ))),
    }
}

fn parse_actions(mut input: &[u8]) -> Result<Vec<(String, TypedData)>, ProtocolError> {
    let mut out = Vec::new();
    while let Some((&action, rest)) = input.split_first() {
        let (_nb, rest) = rest
            .split_first()
            .ok_or_else(|| ProtocolError::invalid("action without NB-ARGS"))?;
        let (_scope, rest) = rest
            .split_first()
            .ok_or_else(|| ProtocolError::invalid("action without scope"))?;
        let (rest, name) = string(rest, "variable name")?;
        if action == 1 {
            let (rest, value) = typed(rest, "variable value")?;
            out.push((name, value));
            input = rest;
        } else {
            out.push((name, TypedData::Null));
            input = rest;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::payload::{negotiate_hello, parse_messages};
    use super::*;

    #[test]
    fn varint_matches_haproxy_encoding() {
        let mut out = Vec::new();
        spop::encode_varint_into(239, &mut out);
        assert_eq!(out, [239]);
        out.clear();
        spop::encode_varint_into(240, &mut out);
        assert_eq!(out, [0xF0, 0x00]);
        out.clear();
        spop::encode_varint_into(2287, &mut out);
        assert_eq!(out, [0xFF, 0x7F]);
        out.clear();
        spop::encode_varint_into(2288, &mut out);
        assert_eq!(out, [0xF0, 0x80, 0x00]);
    }

    #[test]
    fn needs_more_bytes_is_not_an_error() {
        let mut whole = Vec::new();
        encode_haproxy_hello(16380, false, &mut whole);
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(decode_frame(&mut buf, 16380), Ok(None), "cut at {cut}");
        }
        let mut buf = BytesMut::from(&whole[..]);
        let f = decode_frame(&mut buf, 16380).unwrap().unwrap();
        assert_eq!(f.kind, kind::HAPROXY_HELLO);
        assert!(buf.is_empty());
    }

    #[test]
    fn too_big_frame_is_refused_before_its_body() {
        let mut buf = BytesMut::from(&20_000u32.to_be_bytes()[..]);
        let e = decode_frame(&mut buf, 16380).unwrap_err();
        assert_eq!(e.status, StatusCode::TooBig);
    }

    #[test]
    fn unknown_type_and_bad_varint_are_invalid() {
        let mut out = Vec::new();
        put_frame(42, 0, 0, &[], &mut out);
        let e = decode_frame(&mut BytesMut::from(&out[..]), 16380).unwrap_err();
        assert_eq!(e.status, StatusCode::Invalid);

        // NOTIFY whose stream-id varint never terminates inside the frame.
        let body = [kind::NOTIFY, 0, 0, 0, 1, 0xF5, 0xFF, 0xFF];
        let mut raw = (body.len() as u32).to_be_bytes().to_vec();
        raw.extend_from_slice(&body);
        let e = decode_frame(&mut BytesMut::from(&raw[..]), 16380).unwrap_err();
        assert_eq!(e.status, StatusCode::Invalid);
    }

    #[test]
    fn fragmented_frame_is_refused() {
        let body = [kind::NOTIFY, 0, 0, 0, 0, 1, 1];
        let mut raw = (body.len() as u32).to_be_bytes().to_vec();
        raw.extend_from_slice(&body);
        let e = decode_frame(&mut BytesMut::from(&raw[..]), 16380).unwrap_err();
        assert_eq!(e.status, StatusCode::FragmentationNotSupported);
    }

    #[test]
    fn notify_roundtrip_and_ack_fits() {
        let msg = Message {
            name: "coraza-req".into(),
            args: vec![
                ("app".into(), TypedData::String("x".into())),
                ("src-port".into(), TypedData::Int32(1234)),
                ("body".into(), TypedData::Binary(vec![1, 2, 3])),
            ],
        };
        let mut out = Vec::new();
        encode_notify(7, 9, &msg, &mut out);
        let f = decode_frame(&mut BytesMut::from(&out[..]), 16380)
            .unwrap()
            .unwrap();
        assert_eq!((f.kind, f.stream_id, f.frame_id), (kind::NOTIFY, 7, 9));
        let msgs = parse_messages(&f.payload).unwrap();
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].args, msg.args);

        let long = "9".repeat(2000);
        let mut ack = Vec::new();
        encode_ack(
            7,
            9,
            &[
                ("action", "deny".into()),
                ("rules_hit", TypedData::String(long)),
            ],
            300,
            &mut ack,
        );
        assert!(ack.len() - 4 <= 300);
        let got = decode_agent_frame(&mut BytesMut::from(&ack[..]))
            .unwrap()
            .unwrap();
        match got {
            AgentFrame::Ack(7, 9, vars) => assert_eq!(vars[0].1, TypedData::String("deny".into())),
            other => panic!("{other:?}"),
        }
    }

    proptest::proptest! {
        /// Whatever a peer sends, decoding returns a frame, "need more" or a status; it never
        /// panics, and a decoded frame is a prefix of the input.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let mut buf = BytesMut::from(&bytes[..]);
            let before = buf.len();
            if let Ok(Some(f)) = decode_frame(&mut buf, 512) {
                proptest::prop_assert!(buf.len() < before);
                let _ = parse_messages(&f.payload);
                let _ = parse_kv_list(&f.payload);
                let _ = negotiate_hello(&f.payload, 1 << 20);
            }
            let _ = parse_messages(&bytes);
            let _ = negotiate_hello(&bytes, 1 << 20);
            let _ = super::super::hdrs::parse_hdrs_bin(&bytes);
        }

        /// Every NOTIFY we encode decodes back to the same message.
        #[test]
        fn notify_roundtrips(sid in 0u64..u64::MAX, fid in 0u64..u64::MAX, name in "[a-z-]{1,20}", val in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let msg = Message { name, args: vec![("body".into(), TypedData::Binary(val))] };
            let mut out = Vec::new();
            encode_notify(sid, fid, &msg, &mut out);
            let f = decode_frame(&mut BytesMut::from(&out[..]), 1 << 20).unwrap().unwrap();
            proptest::prop_assert_eq!((f.stream_id, f.frame_id), (sid, fid));
            let back = parse_messages(&f.payload).unwrap();
            proptest::prop_assert_eq!(&back[0].args, &msg.args);
            proptest::prop_assert_eq!(&back[0].name, &msg.name);
        }
    }
}
