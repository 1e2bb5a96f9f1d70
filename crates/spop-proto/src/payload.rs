//! SPOP payloads, sans-IO: the KV-LIST of HELLO and DISCONNECT frames, the
//! LIST-OF-MESSAGES of NOTIFY frames (names and typed data, SPOE.txt 3.1 and 3.2.4), and the
//! HELLO negotiation.
//!
//! Typed data and varints are decoded by the `spop` crate; every failure here maps to the
//! status code SPOE.txt assigns to it, so the connection can answer with the right
//! AGENT-DISCONNECT.

use spop::frame::Message;
use spop::{decode_varint, StatusCode, TypedData};

use super::error::ProtocolError;

/// The smallest `max-frame-size` a peer may announce (SPOE.txt 3.2).
pub const MIN_FRAME_SIZE: u32 = 256;

pub(crate) fn varint<'a>(input: &'a [u8], what: &str) -> Result<(&'a [u8], u64), ProtocolError> {
    decode_varint(input).map_err(|_| ProtocolError::invalid(format!("bad varint in {what}")))
}

pub(crate) fn string<'a>(input: &'a [u8], what: &str) -> Result<(&'a [u8], String), ProtocolError> {
    let (rest, len) = varint(input, what)?;
    let len =
        usize::try_from(len).map_err(|_| ProtocolError::invalid(format!("{what} too long")))?;
    let bytes = rest
        .get(..len)
        .ok_or_else(|| ProtocolError::invalid(format!("{what} runs past the frame end")))?;
    let rest = rest.get(len..).unwrap_or_default();
    Ok((rest, String::from_utf8_lossy(bytes).into_owned()))
}

pub(crate) fn typed<'a>(
    input: &'a [u8],
    what: &str,
) -> Result<(&'a [u8], TypedData), ProtocolError> {
    spop::types::typed_data(input)
        .map_err(|_| ProtocolError::invalid(format!("bad typed data in {what}")))
}

/// Decodes a KV-LIST payload (HELLO and DISCONNECT frames).
pub fn parse_kv_list(mut input: &[u8]) -> Result<Vec<(String, TypedData)>, ProtocolError> {
    let mut out = Vec::new();
    while !input.is_empty() {
        let (rest, name) = string(input, "KV name")?;
        let (rest, value) = typed(rest, "KV value")?;
        out.push((name, value));
        input = rest;
    }
    Ok(out)
}

/// Decodes a LIST-OF-MESSAGES payload (NOTIFY frames).
pub fn parse_messages(mut input: &[u8]) -> Result<Vec<Message>, ProtocolError> {
    let mut out = Vec::new();
    while !input.is_empty() {
        let (rest, name) = string(input, "message name")?;
        let (&nb_args, mut rest) = rest
            .split_first()
            .ok_or_else(|| ProtocolError::invalid("message without NB-ARGS"))?;
        let mut args = Vec::with_capacity(usize::from(nb_args));
        for _ in 0..nb_args {
            let (r, arg) = string(rest, "argument name")?;
            let (r, value) = typed(r, "argument value")?;
            args.push((arg, value));
            rest = r;
        }
        out.push(Message { name, args });
        input = rest;
    }
    Ok(out)
}

/// What the agent agreed to in the HELLO handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// `min(HAProxy's max-frame-size, ours)`.
    pub max_frame_size: u32,
    /// HAProxy's max-frame-size (2.6 to 3.2 offer `tune.bufsize - 4`).
    pub offered: u32,
    /// Whether pipelining is agreed: offered by HAProxy, and accepted by the connection
    /// ([`crate::conn`] decides; [`negotiate_hello`] says what was offered).
    pub pipelining: bool,
    /// Whether HAProxy offered `async` too: its SPOE applet does (2.6, 3.0), the
    /// multiplexer of 3.1 and later does not (SPOE.txt: "async ... deprecated and ignored").
    pub offered_async: bool,
    /// A health-check HELLO: answer and close.
    pub healthcheck: bool,
    /// HAProxy's `engine-id`, if sent.
    pub engine_id: Option<String>,
}

/// Validates a HAPROXY-HELLO payload and negotiates with our own `max-frame-size`.
pub fn negotiate_hello(payload: &[u8], our_max: u32) -> Result<Negotiated, ProtocolError> {
    let kv = parse_kv_list(payload)?;
    let get = |name: &str| kv.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let versions = match get("supported-versions") {
        Some(TypedData::String(s)) => s.clone(),
        _ => {
            return Err(ProtocolError::new(
                StatusCode::NoVersion,
                "supported-versions not found",
            ))
        }
    };
    if !versions.split(',').any(|v| version_is_2x(v.trim())) {
        return Err(ProtocolError::new(
            StatusCode::BadVersion,
            format!("no supported SPOP version in \"{versions}\" (we speak 2.0)"),
        ));
    }
    let theirs = match get("max-frame-size") {
        Some(TypedData::UInt32(n)) => *n,
        Some(TypedData::UInt64(n)) => u32::try_from(*n).unwrap_or(u32::MAX),
        _ => {
            return Err(ProtocolError::new(
                StatusCode::NoFrameSize,
                "max-frame-size not found",
            ))
        }
    };
    if theirs < MIN_FRAME_SIZE {
        return Err(ProtocolError::new(
            StatusCode::BadFrameSize,
            format!("max-frame-size {theirs} is below {MIN_FRAME_SIZE}"),
        ));
    }
    let caps = match get("capabilities") {
        Some(TypedData::String(s)) => s.clone(),
        _ => {
            return Err(ProtocolError::new(
                StatusCode::NoCapabilities,
                "capabilities not found",
            ))
        }
    };
    let offers = |cap: &str| caps.split(',').any(|c| c.trim().eq_ignore_ascii_case(cap));
    let pipelining = offers("pipelining");
    let offered_async = offers("async");
    let healthcheck = matches!(get("healthcheck"), Some(TypedData::Bool(true)));
    let engine_id = match get("engine-id") {
        Some(TypedData::String(s)) => Some(s.clone()),
        _ => None,
    };
    Ok(Negotiated {
        max_frame_size: theirs.min(our_max),
        offered: theirs,
        pipelining,
        offered_async,
        healthcheck,
        engine_id,
    })
}

fn version_is_2x(v: &str) -> bool {
    let mut parts = v.splitn(2, '.');
    let major = parts.next().and_then(|m| m.trim().parse::<u32>().ok());
    let minor_ok = parts.next().is_none_or(|m| m.trim().parse::<u32>().is_ok());
    major == Some(2) && minor_ok
}

pub(crate) fn put_string(out: &mut Vec<u8>, s: &str) {
    spop::encode_varint_into(s.len() as u64, out);
    out.extend_from_slice(s.as_bytes());
}

pub(crate) fn put_kv(out: &mut Vec<u8>, name: &str, value: &TypedData) {
    put_string(out, name);
    value.to_bytes(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello_payload(items: &[(&str, TypedData)]) -> Vec<u8> {
        let mut p = Vec::new();
        for (k, v) in items {
            put_kv(&mut p, k, v);
        }
        p
    }

    #[test]
    fn hello_negotiation_statuses() {
        let ok = hello_payload(&[
            ("supported-versions", TypedData::String("2.0".into())),
            ("max-frame-size", TypedData::UInt32(16380)),
            ("capabilities", TypedData::String("pipelining,async".into())),
            ("healthcheck", TypedData::Bool(true)),
        ]);
        let n = negotiate_hello(&ok, 1 << 20).unwrap();
        assert_eq!(n.max_frame_size, 16380);
        assert!(n.pipelining && n.healthcheck);
        assert_eq!(negotiate_hello(&ok, 4096).unwrap().max_frame_size, 4096);

        let cases: [(&[(&str, TypedData)], StatusCode); 5] = [
            (
                &[
                    ("max-frame-size", TypedData::UInt32(16380)),
                    ("capabilities", TypedData::String(String::new())),
                ],
                StatusCode::NoVersion,
            ),
            (
                &[
                    ("supported-versions", TypedData::String("1.0, 3.0".into())),
                    ("max-frame-size", TypedData::UInt32(16380)),
                    ("capabilities", TypedData::String(String::new())),
                ],
                StatusCode::BadVersion,
            ),
            (
                &[
                    ("supported-versions", TypedData::String("2.0".into())),
                    ("capabilities", TypedData::String(String::new())),
                ],
                StatusCode::NoFrameSize,
            ),
            (
                &[
                    ("supported-versions", TypedData::String("2.0".into())),
                    ("max-frame-size", TypedData::UInt32(100)),
                    ("capabilities", TypedData::String(String::new())),
                ],
                StatusCode::BadFrameSize,
            ),
            (
                &[
                    ("supported-versions", TypedData::String("2.0".into())),
                    ("max-frame-size", TypedData::UInt32(16380)),
                ],
                StatusCode::NoCapabilities,
            ),
        ];
        for (items, status) in cases {
            let e = negotiate_hello(&hello_payload(items), 1 << 20).unwrap_err();
            assert_eq!(e.status, status, "{e}");
        }
    }

    #[test]
    fn truncated_message_inside_frame_is_invalid() {
        // NB-ARGS says 2 but only one argument follows.
        let mut p = Vec::new();
        put_string(&mut p, "coraza-req");
        p.push(2);
        put_kv(&mut p, "app", &TypedData::String("a".into()));
        assert_eq!(parse_messages(&p).unwrap_err().status, StatusCode::Invalid);
    }
}
