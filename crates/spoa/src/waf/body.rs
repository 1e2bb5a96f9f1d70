//! What the agent can tell about a request body HAProxy handed it: whether it is the whole
//! body, or whether more of it reaches the origin than the agent saw, and why. Pure: a
//! table of the cases HAProxy 2.6, 3.0 and 3.2 produce (docs/spoa.md, *Request bodies*,
//! measured with `bench/spoa/body_probe.py`).
//!
//! HAProxy fills `req.body` with what its buffer holds when the rule sending the message
//! runs. With `option http-buffer-request` (or `http-request wait-for-body`) it first waits
//! until the body is complete or its buffer is full; without, the message often goes out
//! before the body arrives (a browser's upload, `Expect: 100-continue`, anything sent after
//! the headers). `req.body_size` is the `Content-Length`, or for chunked bodies what HAProxy
//! knows so far (the data plus the rest of the current chunk); HTTP/2 without
//! `content-length` says nothing.
//!
//! The two cases where more reaches the origin than the agent saw:
//!
//! - [`BodyState::OverBuffer`]: HAProxy's buffer was full (a body larger than
//!   `tune.bufsize` allows): the operator's `body_limit_action` decides (413, or the part
//!   inspected);
//! - [`BodyState::NotWaited`]: HAProxy did not wait for the body. No verdict can be given
//!   without the body and none may pass it unseen: the agent answers `error` (the HAProxy
//!   file refuses the request, a documented file asks again), warns with the line to add,
//!   and counts it; `process_partial` inspects the part received instead.
//!
//! - [`BodyState::Conflicting`]: a chunked body whose size HAProxy counts larger than what
//!   arrived, though the buffer is not full. HAProxy 2.6 drops a `Content-Length` sent beside
//!   `Transfer-Encoding: chunked` (the shape of request smuggling; CRS test 920181-1) but
//!   keeps counting it in `req.body_size` (`Content-Length: 7` and 10 bytes of chunks:
//!   `body_size` 17); a chunk that had only begun to arrive when HAProxy did not wait looks
//!   the same. Refused as a bad request (400, as nginx answers both headers), with a log line
//!   that names both causes; `process_partial` inspects the part received.
//!   HAProxy 3.0 and later count only the chunks: they forward such a request chunked, without
//!   the `Content-Length`, and the agent sees an ordinary chunked body.
//!
//! What the agent cannot tell, and the HAProxy file must: a chunked or HTTP/2 body cut at a
//! chunk boundary while HAProxy did not wait (only the buffering lines rule it out), and
//! whether an HTTP/2 request without `content-length` has a body at all.

use lastcall_spop_proto::coraza::{content_length, is_chunked, Request};

/// What HAProxy's buffer keeps free of data (`tune.maxrewrite`, 1024 by default) plus room
/// for its own block headers: an HTTP/1 body within this of the frame size is taken for cut
/// (measured: HAProxy stopped 1,287 bytes short of a 16 KB buffer, headers included).
pub(crate) const BUFFER_MARGIN: u64 = 2560;
/// The same for HTTP/2 and later: HAProxy stopped 1,755 bytes short of a 1 MiB buffer
/// (headers included), more than over HTTP/1, so the margin is wider.
pub(crate) const H2_BUFFER_MARGIN: u64 = 4096;

/// What the agent can say about a request's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyState {
    /// Everything that reaches the origin was inspected.
    Whole,
    /// HAProxy's buffer was full: the rest of the body reaches the origin unseen.
    OverBuffer {
        /// Bytes received.
        received: u64,
        /// The size the request declares, if it declares one.
        declared: Option<u64>,
    },
    /// A chunked body counted larger than what arrived, the buffer not full (see the module
    /// docs).
    Conflicting {
        /// Bytes received.
        received: u64,
        /// What HAProxy counts (`req.body_size`).
        declared: u64,
    },
    /// HAProxy sent the message before the body (or all of it) arrived.
    NotWaited {
        /// Bytes received.
        received: u64,
        /// The size the request declares, if it declares one.
        declared: Option<u64>,
    },
}

/// Whether a body of `received` bytes, with headers of `header_bytes`, filled HAProxy's
/// buffer, given the connection's SPOP frame size (HAProxy announces `tune.bufsize - 4`).
/// Without a frame size, a body shorter than declared is taken for cut.
fn filled(received: u64, header_bytes: u64, margin: u64, frame_size: Option<u32>) -> Option<bool> {
    frame_size.map(|f| received + header_bytes + margin >= u64::from(f) + 4)
}

/// The state of `req`'s body, received on a connection whose frame size is `frame_size`.
pub(crate) fn body_state(req: &Request, frame_size: Option<u32>) -> BodyState {
    let received = req.body.len() as u64;
    let header_bytes: u64 = req
        .headers
        .iter()
        .map(|(k, v)| (k.len() + v.len() + 4) as u64)
        .sum();
    let h2 =
        !req.version.is_empty() && !req.version.starts_with('1') && !req.version.starts_with('0');
    let margin = if h2 { H2_BUFFER_MARGIN } else { BUFFER_MARGIN };
    let full = filled(received, header_bytes, margin, frame_size);
    let chunked = is_chunked(&req.headers);
    // A chunked request's Content-Length is no length (HAProxy drops it, RFC 9112 6.1).
    let length = if chunked {
        None
    } else {
        content_length(&req.headers)
    };
    let declared = if chunked {
        req.body_size
    } else {
        length.or(req.body_size)
    };
    let short = declared.is_some_and(|d| d > received);
    let cut = || BodyState::OverBuffer { received, declared };
    let late = || BodyState::NotWaited { received, declared };
    match full {
        Some(true) if short || chunked || length.is_none() => cut(),
        None if short => cut(),
        _ if short && chunked && received > 0 => BodyState::Conflicting {
            received,
            declared: declared.unwrap_or(received),
        },
        _ if short => late(),
        // An empty chunked body is indistinguishable from one HAProxy did not wait for.
        _ if chunked && received == 0 => late(),
        _ => BodyState::Whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HAProxy 2.6 with `Content-Length: 7` beside `Transfer-Encoding: chunked` and 10 bytes
    /// of chunks: `body_size` 17 (measured); 3.0 and 3.2 say 10, a whole body.
    #[test]
    fn content_length_beside_chunked() {
        let te = [("transfer-encoding", "chunked")];
        assert_eq!(
            body_state(&req(&te, 10, Some(17)), Some(16380)),
            BodyState::Conflicting {
                received: 10,
                declared: 17
            }
        );
        assert_eq!(
            body_state(&req(&te, 10, Some(10)), Some(16380)),
            BodyState::Whole
        );
        assert_eq!(
            body_state(&req(&te, 0, Some(0)), Some(16380)),
            BodyState::NotWaited {
                received: 0,
                declared: Some(0)
            }
        );
    }

    fn req(headers: &[(&str, &str)], body: usize, body_size: Option<u64>) -> Request {
        Request {
            method: "POST".into(),
            version: "1.1".into(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            body: vec![b'a'; body],
            body_size,
            ..Request::default()
        }
    }

    const F: Option<u32> = Some(16_380);

    fn h2(mut r: Request) -> Request {
        r.version = "2.0".into();
        r
    }

    #[test]
    fn the_cases_haproxy_produces() {
        use BodyState::*;
        let cl = |n: &'static str| vec![("content-length", n)];
        let te = vec![("transfer-encoding", "chunked")];
        let both = vec![("content-length", "1200"), ("transfer-encoding", "chunked")];
        let cases: Vec<(&str, Request, Option<u32>, BodyState)> = vec![
            ("GET, no body", req(&[], 0, Some(0)), F, Whole),
            (
                "Content-Length, whole",
                req(&cl("1200"), 1200, Some(1200)),
                F,
                Whole,
            ),
            (
                "Content-Length, not arrived (no http-buffer-request)",
                req(&cl("1200"), 0, Some(1200)),
                F,
                NotWaited {
                    received: 0,
                    declared: Some(1200),
                },
            ),
            (
                "Content-Length, without body_size argument, not arrived",
                req(&cl("1200"), 0, None),
                F,
                NotWaited {
                    received: 0,
                    declared: Some(1200),
                },
            ),
            (
                "Content-Length, buffer full",
                req(&cl("102400"), 15097, Some(102400)),
                F,
                OverBuffer {
                    received: 15097,
                    declared: Some(102400),
                },
            ),
            (
                "Content-Length, part arrived",
                req(&cl("102400"), 4000, Some(102400)),
                F,
                NotWaited {
                    received: 4000,
                    declared: Some(102400),
                },
            ),
            ("chunked, whole", req(&te, 1200, Some(1200)), F, Whole),
            (
                "chunked, not arrived",
                req(&te, 0, Some(0)),
                F,
                NotWaited {
                    received: 0,
                    declared: Some(0),
                },
            ),
            (
                "chunked, buffer full inside a chunk",
                req(&te, 15085, Some(65524)),
                F,
                OverBuffer {
                    received: 15085,
                    declared: Some(65524),
                },
            ),
            (
                "chunked, buffer full at a chunk's end",
                req(&te, 15103, Some(15103)),
                F,
                OverBuffer {
                    received: 15103,
                    declared: Some(15103),
                },
            ),
            (
                "chunked, part of a chunk arrived",
                req(&te, 300, Some(1200)),
                F,
                // Indistinguishable from HAProxy 2.6's count of a Content-Length beside
                // chunked (`content_length_beside_chunked`): refused as a bad request.
                Conflicting {
                    received: 300,
                    declared: 1200,
                },
            ),
            (
                "Content-Length + chunked: the chunks count",
                req(&both, 1200, Some(1200)),
                F,
                Whole,
            ),
            (
                "HTTP/2 without length, buffer full",
                h2(req(&[], 15103, Some(15103))),
                F,
                OverBuffer {
                    received: 15103,
                    declared: Some(15103),
                },
            ),
            (
                "HTTP/2 without length, whole",
                h2(req(&[], 1200, Some(1200))),
                F,
                Whole,
            ),
            (
                "HTTP/2, 2 MiB into a 1 MiB buffer (HAProxy stopped 1,755 short)",
                h2(req(&cl("2097149"), 1_112_357, Some(2_097_149))),
                Some(1_114_108),
                OverBuffer {
                    received: 1_112_357,
                    declared: Some(2_097_149),
                },
            ),
            (
                "HTTP/2 without length, 3 KB short of a 1 MiB buffer",
                h2(req(&[], 1_111_000, Some(1_111_000))),
                Some(1_114_108),
                OverBuffer {
                    received: 1_111_000,
                    declared: Some(1_111_000),
                },
            ),
            (
                "HTTP/1 without length or chunks: no body HAProxy could cut",
                req(&[], 1_111_000, Some(1_111_000)),
                Some(1_114_108),
                Whole,
            ),
            (
                "HTTP/1 without length or body",
                req(&[], 0, Some(0)),
                F,
                Whole,
            ),
            (
                "1 MiB buffer, 1 MiB body whole",
                req(&cl("1048576"), 1_048_576, Some(1_048_576)),
                Some(1_114_108),
                Whole,
            ),
            (
                "no frame size known, short",
                req(&cl("1200"), 0, Some(1200)),
                None,
                OverBuffer {
                    received: 0,
                    declared: Some(1200),
                },
            ),
        ];
        for (name, r, frame, want) in cases {
            assert_eq!(body_state(&r, frame), want, "{name}");
        }
    }
}
