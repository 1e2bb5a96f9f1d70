//! HAProxy's header blocks, sans-IO: `req.hdrs`/`res.hdrs` (HTTP/1 text) and
//! `req.hdrs_bin`/`res.hdrs_bin` (HAProxy's binary format), as sent in the `headers`
//! argument of coraza-spoa's messages.
//!
//! A block that is not in its format is an error, never "no headers": the request would
//! otherwise be evaluated without the headers it carries.

/// The most headers a block may hold: HAProxy's `tune.http.maxhdr` cannot exceed 32767, so a
/// longer block did not come from HAProxy (and the rules' cost grows with the count).
pub const MAX_HEADERS: usize = 32_767;

/// Parses `req.hdrs` / `res.hdrs`: `Name: value` lines separated by CRLF, ending with an empty
/// line. A line without a colon, or with an empty name, is an error (HAProxy never produces
/// one; coraza-spoa refuses it too).
pub fn parse_hdrs_text(block: &[u8]) -> Result<Vec<(String, String)>, String> {
    let text = String::from_utf8_lossy(block);
    let mut out = Vec::new();
    for line in text.split('\n').map(|l| l.trim_end_matches('\r')) {
        if line.trim().is_empty() {
            continue;
        }
        match line.split_once(':') {
            Some((k, v)) if !k.trim().is_empty() => {
                out.push((k.trim().to_owned(), v.trim().to_owned()));
            }
            _ => {
                let shown: String = line.chars().take(40).collect();
                return Err(format!("header line without a name and a colon: {shown:?}"));
            }
        }
        if out.len() > MAX_HEADERS {
            return Err(format!("more than {MAX_HEADERS} headers"));
        }
    }
    Ok(out)
}

/// Parses `req.hdrs_bin` / `res.hdrs_bin`: `<name-len:varint><name><value-len:varint><value>`
/// repeated, ending with two zero-length strings and nothing after them.
pub fn parse_hdrs_bin(mut block: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    loop {
        let at = out.len();
        let (rest, name) = bin_str(block).ok_or_else(|| format!("header {at}: bad name"))?;
        let (rest, value) = bin_str(rest).ok_or_else(|| format!("header {at}: bad value"))?;
        block = rest;
        if name.is_empty() && value.is_empty() {
            if !block.is_empty() {
                return Err(format!("{} bytes after the end marker", block.len()));
            }
            return Ok(out);
        }
        if name.is_empty() {
            return Err(format!("header {at}: empty name"));
        }
        if out.len() == MAX_HEADERS {
            return Err(format!("more than {MAX_HEADERS} headers"));
        }
        out.push((
            String::from_utf8_lossy(name).into_owned(),
            String::from_utf8_lossy(value).into_owned(),
        ));
    }
}

/// A `headers` argument: `req.hdrs_bin` if it reads as one, else a `req.hdrs` text block;
/// neither is an error (the one of the binary reading, for a blob that is not text).
pub fn parse_hdrs(block: &[u8], binary: bool) -> Result<Vec<(String, String)>, String> {
    if !binary {
        return parse_hdrs_text(block);
    }
    match parse_hdrs_bin(block) {
        Ok(h) => Ok(h),
        // A text block sent as binary (e.g. through a converter) is still read as text.
        Err(e) if std::str::from_utf8(block).is_err() => Err(format!("req.hdrs_bin: {e}")),
        Err(e) => parse_hdrs_text(block).map_err(|t| format!("req.hdrs_bin: {e}; as text: {t}")),
    }
}

fn bin_str(input: &[u8]) -> Option<(&[u8], &[u8])> {
    let (rest, len) = spop::decode_varint(input).ok()?;
    let len = usize::try_from(len).ok()?;
    Some((rest.get(len..)?, rest.get(..len)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_headers() {
        let h = parse_hdrs_text(b"host: a.example\r\nX-Y:  z:w \r\n\r\n").unwrap();
        assert_eq!(
            h,
            vec![
                ("host".into(), "a.example".into()),
                ("X-Y".into(), "z:w".into())
            ]
        );
    }

    #[test]
    fn binary_headers() {
        let mut b = Vec::new();
        for s in ["host", "x", "accept", "*/*", "", ""] {
            spop::encode_varint_into(s.len() as u64, &mut b);
            b.extend_from_slice(s.as_bytes());
        }
        assert_eq!(
            parse_hdrs_bin(&b).unwrap(),
            vec![("host".into(), "x".into()), ("accept".into(), "*/*".into())]
        );
        assert!(parse_hdrs_bin(b"host: x\r\n\r\n").is_err());
        assert_eq!(parse_hdrs(b"host: x\r\n\r\n", true).unwrap().len(), 1);
    }

    /// What cannot be read is an error: truncated or trailing binary blocks, an empty name,
    /// text lines without a colon, more headers than HAProxy can send.
    #[test]
    fn malformed_blocks_are_errors() {
        let mut good = Vec::new();
        for s in ["host", "x", "", ""] {
            spop::encode_varint_into(s.len() as u64, &mut good);
            good.extend_from_slice(s.as_bytes());
        }
        for bad in [
            &good[..good.len() - 1],
            &[good.as_slice(), b"\xff"].concat()[..],
            &[4, b'h', b'o', b's', b't', 9, b'x'][..],
            &[0, 1, b'x', 0, 0][..],
            &[0xff, 0xff, 0xff, 0xff][..],
        ] {
            assert!(parse_hdrs(bad, true).is_err(), "{bad:?}");
        }
        assert!(parse_hdrs(b"host x\r\n\r\n", false).is_err());
        assert!(parse_hdrs(b": x\r\n\r\n", false).is_err());
        let mut many = Vec::new();
        for _ in 0..=MAX_HEADERS {
            many.extend_from_slice(&[1, b'a', 0]);
        }
        many.extend_from_slice(&[0, 0]);
        assert!(parse_hdrs(&many, true).unwrap_err().contains("more than"));
    }
}
