//! What every decoder of peer bytes must hold on any input, as functions that panic when it
//! does not: the fuzz targets in `fuzz/` call them on the fuzzer's inputs, and the tests
//! below run them over the seed corpus in `fuzz/seeds/` (so CI checks every seed on stable,
//! without a sanitizer).

#![allow(
    clippy::expect_used,
    reason = "a check that does not hold panics: that is how the fuzzer and the corpus tests see it"
)]

use bytes::BytesMut;

use crate::conn::{Conn, Counts, Event, Input, Rebalance, Settings};
use crate::coraza::{self, Request, Response};
use crate::{frame, hdrs, payload};

/// SPOP frames: decoding a stream never panics, takes only whole frames off the front, and
/// a connection fed the stream (after a good HELLO) ends in events, a wait or a close; one
/// whose ACKs are written as each NOTIFY comes takes them in before it decodes the next
/// ([`Conn::before_decode`]) and ends owing nothing, with nothing left to take in.
pub fn frames(data: &[u8]) {
    for max in [frame_size_bound(), 1 << 20] {
        let mut buf = BytesMut::from(data);
        loop {
            let before = buf.len();
            match frame::decode_frame(&mut buf, max) {
                Ok(Some(f)) => {
                    let taken = before - buf.len();
                    assert!(taken >= 9 && taken <= before, "took {taken} of {before}");
                    assert!(f.payload.len() < taken);
                }
                Ok(None) => {
                    assert_eq!(buf.len(), before, "need-more took bytes");
                    break;
                }
                Err(_) => break,
            }
        }
    }
    let now = std::time::Instant::now();
    let settings = Settings {
        max_frame_size: 1 << 20,
        pipelining: true,
        max_inflight: 1 << 20,
        max_unsent: 1 << 16,
        drain_quiet: std::time::Duration::ZERO,
        rebalance: Rebalance::OFF,
        partial_frame_timeout: std::time::Duration::from_secs(30),
        hello_timeout: std::time::Duration::from_secs(10),
        idle_timeout: std::time::Duration::from_secs(600),
    };
    let mut hello = Vec::new();
    frame::encode_haproxy_hello(16380, false, &mut hello);
    let fed = || {
        let mut conn = Conn::new(settings, lastcall_phase::Seen::SERVING, now);
        conn.buffer().extend_from_slice(&hello);
        conn.buffer().extend_from_slice(data);
        conn
    };
    let mut conn = fed();
    while conn.poll(now).is_some() {}
    let _ = conn.handle(now, Input::Eof);
    let mut conn = fed();
    let mut acks = AckedAtOnce::default();
    loop {
        if let Some(input) = conn.before_decode(&mut acks) {
            let _ = conn.handle(now, input);
            continue;
        }
        match conn.poll(now) {
            Some(Event::Notify { .. }) => acks.written += 1,
            Some(_) => {}
            None => break,
        }
    }
    assert_eq!(conn.owed(), 0, "ACKs written were not taken in");
    assert_eq!(conn.before_wait(&mut acks), None);
}

/// ACKs written as each NOTIFY comes, nothing else counted.
#[derive(Debug, Default)]
struct AckedAtOnce {
    written: usize,
}

impl Counts for AckedAtOnce {
    fn take_written(&mut self) -> usize {
        std::mem::take(&mut self.written)
    }

    fn take_held(&mut self) -> Option<(Vec<u8>, usize)> {
        None
    }

    fn evicted(&self) -> bool {
        false
    }

    fn unsent(&self) -> usize {
        0
    }

    fn evaluations(&self) -> usize {
        0
    }
}

fn frame_size_bound() -> u32 {
    payload::MIN_FRAME_SIZE
}

/// SPOP payloads: the KV-LIST and LIST-OF-MESSAGES decoders and the HELLO negotiation never
/// panic; a decoded list of messages encodes back to one that decodes the same; coraza-spoa's
/// messages are read from any arguments.
pub fn messages(data: &[u8]) {
    let _ = payload::parse_kv_list(data);
    if let Ok(n) = payload::negotiate_hello(data, 1 << 20) {
        assert!(n.max_frame_size >= payload::MIN_FRAME_SIZE && n.max_frame_size <= 1 << 20);
    }
    let Ok(messages) = payload::parse_messages(data) else {
        return;
    };
    for m in &messages {
        let _ = Request::from_message(m);
        let _ = Response::from_message(m);
        let _ = coraza::app_of(m);
        let mut notify = Vec::new();
        frame::encode_notify(1, 1, m, &mut notify);
        let back = frame::decode_frame(&mut BytesMut::from(&notify[..]), u32::MAX)
            .expect("our NOTIFY decodes")
            .expect("a whole frame");
        let again = payload::parse_messages(&back.payload).expect("our payload decodes");
        // Names and text were decoded lossily to UTF-8 once; from there they stay the same.
        assert!(
            again.len() == 1 && again[0].name == m.name && again[0].args == m.args,
            "a message changed through encode and decode: {m:?} -> {again:?}"
        );
    }
}

/// HAProxy's header blocks: the binary decoder never panics, and what it decodes encodes back
/// to a block that decodes the same; the text decoder never panics; neither returns more
/// than `MAX_HEADERS`.
pub fn header_blocks(data: &[u8]) {
    if let Ok(text) = hdrs::parse_hdrs_text(data) {
        assert!(text.len() <= hdrs::MAX_HEADERS);
    }
    let _ = hdrs::parse_hdrs(data, true);
    let Ok(headers) = hdrs::parse_hdrs_bin(data) else {
        return;
    };
    assert!(headers.len() <= hdrs::MAX_HEADERS);
    let mut block = Vec::new();
    for (name, value) in &headers {
        assert!(!name.is_empty());
        for s in [name, value] {
            spop::encode_varint_into(s.len() as u64, &mut block);
            block.extend_from_slice(s.as_bytes());
        }
    }
    block.extend_from_slice(&[0, 0]);
    assert_eq!(hdrs::parse_hdrs_bin(&block).as_ref(), Ok(&headers));
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// Every seed of `fuzz/seeds/<target>` through its check.
    fn corpus(target: &str, check: fn(&[u8])) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/seeds")
            .join(target);
        let mut seeds = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("corpus entry").path();
            let data = std::fs::read(&path).expect("seed");
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{} fails its check", path.display());
            seeds += 1;
        }
        assert!(seeds >= 3, "{}: only {seeds} seeds", dir.display());
    }

    fn seed(path: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/seeds")
            .join(path);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The seeds are what their names say, so the fuzzer starts from real traffic.
    #[test]
    fn seeds_decode_as_named() {
        use crate::coraza::Request;
        use crate::{frame, payload};
        let messages = payload::parse_messages(&seed("spop_message/request")).unwrap();
        let r = Request::from_message(&messages[0]);
        assert_eq!(
            (r.method.as_str(), r.uri().as_str()),
            ("POST", "/login?id=1' OR '1'='1")
        );
        assert_eq!(r.headers.len(), 4, "{:?}", r.headers);
        assert_eq!(r.body, b"a=1&b=2");
        let mut buf = bytes::BytesMut::from(&seed("spop_frame/notify_pipelined")[..]);
        let mut ids = Vec::new();
        while let Some(f) = frame::decode_frame(&mut buf, 16380).unwrap() {
            ids.push(f.stream_id);
        }
        assert_eq!(ids, [1, 2, 300]);
        let hello = seed("spop_frame/hello");
        let f = frame::decode_frame(&mut bytes::BytesMut::from(&hello[..]), 16380)
            .unwrap()
            .unwrap();
        assert!(
            payload::negotiate_hello(&f.payload, 1 << 20)
                .unwrap()
                .pipelining
        );
    }

    #[test]
    fn frame_seeds() {
        corpus("spop_frame", super::frames);
    }

    #[test]
    fn message_seeds() {
        corpus("spop_message", super::messages);
    }

    #[test]
    fn header_block_seeds() {
        corpus("hdrs_bin", super::header_blocks);
    }
}
