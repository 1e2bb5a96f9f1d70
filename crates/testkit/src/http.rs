//! The one HTTP/1.1 client of the tests: a request on its own connection (`Connection:
//! close`) with its whole answer, and the readers a keep-alive client needs (one message
//! head and body at a time). Blocking, with [`WAIT`] timeouts.

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::net::resolve;
use crate::WAIT;

/// An HTTP response as the client saw it.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Headers (names lower-cased).
    pub headers: Vec<(String, String)>,
    /// Body (a chunked one decoded).
    pub body: Vec<u8>,
}

impl Reply {
    /// First header named `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 request on a new connection (`Connection: close`), with a browser-like
/// `Host` (`test.example`, not an IP address, which the CRS scores), `User-Agent` and
/// `Accept`, then `headers`; a `Content-Length` when there is a body or the method is POST.
pub fn http(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(WAIT))?;
    s.set_write_timeout(Some(WAIT))?;
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: test.example\r\nUser-Agent: lastcall-test/1.0\r\nAccept: */*\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    match s.read_to_end(&mut raw) {
        Ok(_) => {}
        // HAProxy may reset after answering early (e.g. 413 before the body was read).
        Err(e) if !raw.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => return Err(e),
    }
    parse_reply(&raw)
}

/// A whole response read to the end of the connection.
fn parse_reply(raw: &[u8]) -> std::io::Result<Reply> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no HTTP head in {} bytes", raw.len())))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        let mut body = Vec::new();
        read_chunked(&mut &rest[..], Some(&mut body))?;
        body
    } else {
        rest.to_vec()
    };
    Ok(Reply {
        status,
        headers,
        body,
    })
}

/// `GET target`. Panics on I/O errors.
pub fn get(addr: SocketAddr, target: &str) -> Reply {
    http(addr, "GET", target, &[], b"").unwrap_or_else(|e| panic!("GET {target}: {e}"))
}

/// `POST target` with a form body. Panics on I/O errors.
pub fn post_form(addr: SocketAddr, target: &str, body: &str) -> Reply {
    http(
        addr,
        "POST",
        target,
        &[("Content-Type", "application/x-www-form-urlencoded")],
        body.as_bytes(),
    )
    .unwrap_or_else(|e| panic!("POST {target}: {e}"))
}

/// `GET path` (an admin endpoint); returns (status, body). Panics on I/O errors.
pub fn http_get(addr: impl ToSocketAddrs, path: &str) -> (u16, String) {
    try_http(addr, "GET", path, None).unwrap_or_else(|err| panic!("GET {path}: {err}"))
}

/// `POST path` with an empty body and an optional bearer token; returns (status, body).
/// Panics on I/O errors.
pub fn http_post(addr: impl ToSocketAddrs, path: &str, bearer: Option<&str>) -> (u16, String) {
    try_http(addr, "POST", path, bearer).unwrap_or_else(|err| panic!("POST {path}: {err}"))
}

/// A request without a body and with an optional bearer token; returns (status, body).
pub fn try_http(
    addr: impl ToSocketAddrs,
    method: &str,
    path: &str,
    bearer: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let auth = bearer.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| ("Authorization", a))
        .into_iter()
        .collect();
    let reply = http(resolve(addr), method, path, &headers, b"")?;
    Ok((reply.status, reply.text()))
}

/// Reads one HTTP/1.1 response from a keep-alive connection (status line, headers, body);
/// returns the status and whether the server closes the connection.
pub fn read_response(reader: &mut impl BufRead) -> std::io::Result<(u16, bool)> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::other("connection closed before the answer"));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let (_, close) = read_headers_and_body(reader)?;
    Ok((status, close))
}

/// Reads the rest of an HTTP/1.1 message whose start line has been read: the header lines
/// up to the blank line, then a `Content-Length` or chunked body (read and discarded).
/// Returns the body length and whether the message carries `Connection: close`. Used by the
/// [`Origin`](crate::Origin) for requests and by keep-alive clients ([`read_response`]) for
/// answers.
pub fn read_headers_and_body(reader: &mut impl BufRead) -> std::io::Result<(usize, bool)> {
    let mut len = 0usize;
    let mut close = false;
    let mut chunked = false;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            return Err(std::io::Error::other("eof in headers"));
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
            if k.eq_ignore_ascii_case("connection") && v.trim().eq_ignore_ascii_case("close") {
                close = true;
            }
            if k.eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
            {
                chunked = true;
            }
        }
    }
    if chunked {
        // Read the whole chunked body: left in the buffer, its lines would be read as the
        // next request on this connection (a phantom request, counted late).
        return Ok((read_chunked(reader, None)?, close));
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    Ok((len, close))
}

/// Reads a chunked body through its last chunk and trailers, appending the data to `into`
/// if given; returns its decoded length.
fn read_chunked(
    reader: &mut impl BufRead,
    mut into: Option<&mut Vec<u8>>,
) -> std::io::Result<usize> {
    let mut total = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("eof in a chunked body"));
        }
        let size = line.trim_end().split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk size line {line:?}")))?;
        if size == 0 {
            loop {
                let mut trailer = String::new();
                if reader.read_line(&mut trailer)? == 0 || trailer.trim_end().is_empty() {
                    return Ok(total);
                }
            }
        }
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk)?;
        if let Some(into) = into.as_deref_mut() {
            into.extend_from_slice(&chunk[..size]);
        }
        total += size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_body_is_decoded() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
        let reply = parse_reply(raw).expect("parses");
        assert_eq!(reply.status, 200);
        assert_eq!(reply.text(), "hello world");
    }

    #[test]
    fn a_keep_alive_reader_stops_at_the_end_of_each_message() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 403 Forbidden\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nno!\r\n0\r\n\r\n";
        let mut reader = std::io::BufReader::new(&raw[..]);
        assert_eq!(read_response(&mut reader).expect("first"), (200, false));
        assert_eq!(read_response(&mut reader).expect("second"), (403, true));
        assert!(
            read_response(&mut reader).is_err(),
            "nothing after the second"
        );
    }
}
