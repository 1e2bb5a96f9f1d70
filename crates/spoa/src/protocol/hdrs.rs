//! HAProxy's header blocks, sans-IO: `req.hdrs`/`res.hdrs` (HTTP/1 text) and
//! `req.hdrs_bin`/`res.hdrs_bin` (HAProxy's binary format), as sent in the `headers`
//! argument of coraza-spoa's messages.

/// Parses `req.hdrs` / `res.hdrs`: `Name: value` lines separated by CRLF, ending with an empty
/// line. Lines without a colon are skipped (HAProxy never produces them).
pub fn parse_hdrs_text(block: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(block);
    text.split('\n')
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect()
}

/// Parses `req.hdrs_bin` / `res.hdrs_bin`: `<name-len:varint><name><value-len:varint><value>`
/// repeated, ending with two zero-length strings. Returns `None` if the block is not in that
/// format (then it is treated as text).
pub fn parse_hdrs_bin(mut block: &[u8]) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    loop {
        let (rest, name) = bin_str(block)?;
        let (rest, value) = bin_str(rest)?;
        block = rest;
        if name.is_empty() && value.is_empty() {
            return block.is_empty().then_some(out);
        }
        if name.is_empty() {
            return None;
        }
        out.push((
            String::from_utf8_lossy(name).into_owned(),
            String::from_utf8_lossy(value).into_owned(),
        ));
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
        let h = parse_hdrs_text(b"host: a.example\r\nX-Y:  z:w \r\n\r\n");
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
        assert!(parse_hdrs_bin(b"host: x\r\n\r\n").is_none());
    }
}
