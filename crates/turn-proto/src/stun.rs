//! A small, allocation-free STUN codec (RFC 8489) with the TURN attributes (RFC 8656).
//!
//! [`Message::parse`] validates the header and the whole attribute layout once (every length
//! in bounds, padding present), so iterating attributes afterwards cannot fail. Nothing here
//! panics on any input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hmac::{Hmac, Mac};

/// The fixed magic cookie of RFC 5389 and later.
pub const MAGIC_COOKIE: u32 = 0x2112_A442;
/// STUN header length.
pub const HEADER_LEN: usize = 20;
/// XOR value of the FINGERPRINT attribute.
const FINGERPRINT_XOR: u32 = 0x5354_554e;

/// STUN/TURN methods.
pub mod method {
    /// Binding.
    pub const BINDING: u16 = 0x001;
    /// Allocate.
    pub const ALLOCATE: u16 = 0x003;
    /// Refresh.
    pub const REFRESH: u16 = 0x004;
    /// Send (indication).
    pub const SEND: u16 = 0x006;
    /// Data (indication).
    pub const DATA: u16 = 0x007;
    /// CreatePermission.
    pub const CREATE_PERMISSION: u16 = 0x008;
    /// ChannelBind.
    pub const CHANNEL_BIND: u16 = 0x009;
}

/// Attribute types used here.
pub mod attr {
    #![allow(missing_docs)]
    pub const MAPPED_ADDRESS: u16 = 0x0001;
    pub const USERNAME: u16 = 0x0006;
    pub const MESSAGE_INTEGRITY: u16 = 0x0008;
    pub const ERROR_CODE: u16 = 0x0009;
    pub const UNKNOWN_ATTRIBUTES: u16 = 0x000A;
    pub const CHANNEL_NUMBER: u16 = 0x000C;
    pub const LIFETIME: u16 = 0x000D;
    pub const XOR_PEER_ADDRESS: u16 = 0x0012;
    pub const DATA: u16 = 0x0013;
    pub const REALM: u16 = 0x0014;
    pub const NONCE: u16 = 0x0015;
    pub const XOR_RELAYED_ADDRESS: u16 = 0x0016;
    pub const REQUESTED_ADDRESS_FAMILY: u16 = 0x0017;
    pub const EVEN_PORT: u16 = 0x0018;
    pub const REQUESTED_TRANSPORT: u16 = 0x0019;
    pub const DONT_FRAGMENT: u16 = 0x001A;
    pub const MESSAGE_INTEGRITY_SHA256: u16 = 0x001C;
    pub const PASSWORD_ALGORITHM: u16 = 0x001D;
    pub const USERHASH: u16 = 0x001E;
    pub const XOR_MAPPED_ADDRESS: u16 = 0x0020;
    pub const RESERVATION_TOKEN: u16 = 0x0022;
    pub const PRIORITY: u16 = 0x0024;
    pub const USE_CANDIDATE: u16 = 0x0025;
    pub const PADDING: u16 = 0x0026;
    pub const RESPONSE_PORT: u16 = 0x0027;
    pub const CONNECTION_ID: u16 = 0x002A;
    pub const ADDITIONAL_ADDRESS_FAMILY: u16 = 0x8000;
    pub const ADDRESS_ERROR_CODE: u16 = 0x8001;
    pub const PASSWORD_ALGORITHMS: u16 = 0x8002;
    pub const ALTERNATE_DOMAIN: u16 = 0x8003;
    pub const SOFTWARE: u16 = 0x8022;
    pub const ALTERNATE_SERVER: u16 = 0x8023;
    pub const FINGERPRINT: u16 = 0x8028;
    /// ORIGIN (draft-ietf-tram-stun-origin; coturn's `check-origin-consistency`).
    pub const ORIGIN: u16 = 0x802F;
}

/// The class of a STUN message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Request.
    Request,
    /// Indication.
    Indication,
    /// Success response.
    Success,
    /// Error response.
    Error,
}

/// Compose the 16-bit message type from a method and a class.
pub fn message_type(method: u16, class: Class) -> u16 {
    let c: u16 = match class {
        Class::Request => 0,
        Class::Indication => 1,
        Class::Success => 2,
        Class::Error => 3,
    };
    (method & 0x000F)
        | ((method & 0x0070) << 1)
        | ((method & 0x0F80) << 2)
        | ((c & 1) << 4)
        | ((c & 2) << 7)
}

/// Split a message type into method and class.
pub fn split_type(t: u16) -> (u16, Class) {
    let method = (t & 0x000F) | ((t >> 1) & 0x0070) | ((t >> 2) & 0x0F80);
    let class = match ((t >> 4) & 1) | ((t >> 7) & 2) {
        0 => Class::Request,
        1 => Class::Indication,
        2 => Class::Success,
        _ => Class::Error,
    };
    (method, class)
}

/// Why bytes are not a STUN message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Shorter than the 20-byte header.
    #[error("shorter than a STUN header")]
    Short,
    /// The first two bits are not zero, or the magic cookie is wrong.
    #[error("not a STUN message")]
    NotStun,
    /// The length field is not a multiple of 4 or disagrees with the datagram.
    #[error("STUN length field does not match the message")]
    Length,
    /// An attribute runs past the end of the message.
    #[error("truncated STUN attribute")]
    Attribute,
    /// An attribute follows FINGERPRINT.
    #[error("attribute after FINGERPRINT")]
    AfterFingerprint,
}

/// A validated STUN message borrowing its bytes.
#[derive(Clone, Copy, Debug)]
pub struct Message<'a> {
    buf: &'a [u8],
    typ: u16,
}

impl<'a> Message<'a> {
    /// Validate `buf` as exactly one STUN message (header, cookie, length, attribute layout).
    pub fn parse(buf: &'a [u8]) -> Result<Message<'a>, ParseError> {
        let head = buf.get(..HEADER_LEN).ok_or(ParseError::Short)?;
        let typ = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let cookie = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if typ & 0xC000 != 0 || cookie != MAGIC_COOKIE {
            return Err(ParseError::NotStun);
        }
        if len % 4 != 0 || HEADER_LEN + len != buf.len() {
            return Err(ParseError::Length);
        }
        let mut pos = HEADER_LEN;
        let mut seen_fingerprint = false;
        while pos < buf.len() {
            if seen_fingerprint {
                return Err(ParseError::AfterFingerprint);
            }
            let h = buf.get(pos..pos + 4).ok_or(ParseError::Attribute)?;
            let at = u16::from_be_bytes([h[0], h[1]]);
            let alen = usize::from(u16::from_be_bytes([h[2], h[3]]));
            let next = pos + 4 + pad4(alen);
            if next > buf.len() {
                return Err(ParseError::Attribute);
            }
            seen_fingerprint = at == attr::FINGERPRINT;
            pos = next;
        }
        Ok(Message { buf, typ })
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.buf
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Always `false` (a message has at least a header).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The 16-bit message type.
    pub fn message_type(&self) -> u16 {
        self.typ
    }

    /// Method.
    pub fn method(&self) -> u16 {
        split_type(self.typ).0
    }

    /// Class.
    pub fn class(&self) -> Class {
        split_type(self.typ).1
    }

    /// The 96-bit transaction id.
    pub fn transaction_id(&self) -> [u8; 12] {
        let mut t = [0u8; 12];
        t.copy_from_slice(self.buf.get(8..20).unwrap_or(&[0; 12]));
        t
    }

    /// Iterate over the attributes in order.
    pub fn attributes(&self) -> AttrIter<'a> {
        AttrIter {
            buf: self.buf,
            pos: HEADER_LEN,
        }
    }

    /// Verify FINGERPRINT at attribute offset `at` (the attribute header position).
    pub fn check_fingerprint(&self, at: usize, value: &[u8]) -> bool {
        let Some(prefix) = self.buf.get(..at) else {
            return false;
        };
        let Ok(v) = <[u8; 4]>::try_from(value) else {
            return false;
        };
        fingerprint_of(prefix, at + 8 - HEADER_LEN) == u32::from_be_bytes(v)
    }

    /// Verify MESSAGE-INTEGRITY (HMAC-SHA1) at attribute offset `at` with `key`.
    pub fn check_integrity_sha1(&self, at: usize, value: &[u8], key: &[u8]) -> bool {
        let Some(prefix) = self.buf.get(..at) else {
            return false;
        };
        let Ok(mut mac) = Hmac::<sha1::Sha1>::new_from_slice(key) else {
            return false;
        };
        feed_with_length(&mut mac, prefix, at + 24 - HEADER_LEN);
        value.len() == 20 && mac.verify_slice(value).is_ok()
    }

    /// Verify MESSAGE-INTEGRITY-SHA256 at attribute offset `at` with `key` (RFC 8489 allows
    /// a truncated value of 16..=32 bytes, a multiple of 4).
    pub fn check_integrity_sha256(&self, at: usize, value: &[u8], key: &[u8]) -> bool {
        let Some(prefix) = self.buf.get(..at) else {
            return false;
        };
        if value.len() < 16 || value.len() > 32 || value.len() % 4 != 0 {
            return false;
        }
        let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(key) else {
            return false;
        };
        feed_with_length(&mut mac, prefix, at + 4 + value.len() - HEADER_LEN);
        mac.verify_truncated_left(value).is_ok()
    }
}

fn feed_with_length<M: Mac>(mac: &mut M, prefix: &[u8], len: usize) {
    let l = u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes();
    mac.update(prefix.get(..2).unwrap_or(&[]));
    mac.update(&l);
    mac.update(prefix.get(4..).unwrap_or(&[]));
}

fn fingerprint_of(prefix: &[u8], len: usize) -> u32 {
    let mut h = crc32fast::Hasher::new();
    let l = u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes();
    h.update(prefix.get(..2).unwrap_or(&[]));
    h.update(&l);
    h.update(prefix.get(4..).unwrap_or(&[]));
    h.finalize() ^ FINGERPRINT_XOR
}

/// One attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr<'a> {
    /// Attribute type.
    pub typ: u16,
    /// Value (without padding).
    pub value: &'a [u8],
    /// Offset of the attribute header in the message.
    pub offset: usize,
}

/// Iterator over the attributes of a validated [`Message`].
#[derive(Clone, Debug)]
pub struct AttrIter<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Iterator for AttrIter<'a> {
    type Item = Attr<'a>;

    fn next(&mut self) -> Option<Attr<'a>> {
        let h = self.buf.get(self.pos..self.pos + 4)?;
        let typ = u16::from_be_bytes([h[0], h[1]]);
        let len = usize::from(u16::from_be_bytes([h[2], h[3]]));
        let value = self.buf.get(self.pos + 4..self.pos + 4 + len)?;
        let offset = self.pos;
        self.pos += 4 + pad4(len);
        Some(Attr { typ, value, offset })
    }
}

/// Round up to a multiple of 4.
pub fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

/// Decode an (XOR-)address attribute value. `xor` selects XOR-MAPPED style decoding.
pub fn decode_address(value: &[u8], txid: &[u8; 12], xor: bool) -> Option<SocketAddr> {
    let family = *value.get(1)?;
    let port = u16::from_be_bytes([*value.get(2)?, *value.get(3)?]);
    let port = if xor { port ^ 0x2112 } else { port };
    let mut mask = [0u8; 16];
    if xor {
        mask[..4].copy_from_slice(&MAGIC_COOKIE.to_be_bytes());
        mask[4..].copy_from_slice(txid);
    }
    match (family, value.len()) {
        (0x01, 8) => {
            let mut a = [0u8; 4];
            for (i, b) in a.iter_mut().enumerate() {
                *b = value.get(4 + i)? ^ mask[i];
            }
            Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(a)), port))
        }
        (0x02, 20) => {
            let mut a = [0u8; 16];
            for (i, b) in a.iter_mut().enumerate() {
                *b = value.get(4 + i)? ^ mask[i];
            }
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(a)), port))
        }
        _ => None,
    }
}

/// Builds a STUN message into a caller-owned buffer (cleared first).
pub struct Builder<'b> {
    buf: &'b mut Vec<u8>,
    txid: [u8; 12],
}

impl<'b> Builder<'b> {
    /// Start a message of `method`/`class` with transaction id `txid`.
    pub fn new(buf: &'b mut Vec<u8>, method: u16, class: Class, txid: [u8; 12]) -> Builder<'b> {
        buf.clear();
        buf.extend_from_slice(&message_type(method, class).to_be_bytes());
        buf.extend_from_slice(&[0, 0]);
        buf.extend_from_slice(&MAGIC_COOKIE.to_be_bytes());
        buf.extend_from_slice(&txid);
        Builder { buf, txid }
    }

    fn set_len(&mut self, len: usize) {
        let l = u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes();
        if let Some(s) = self.buf.get_mut(2..4) {
            s.copy_from_slice(&l);
        }
    }

    /// Append an attribute (padded with zeros).
    pub fn attr(&mut self, typ: u16, value: &[u8]) -> &mut Self {
        let len = u16::try_from(value.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&typ.to_be_bytes());
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(&value[..usize::from(len)]);
        let pad = pad4(value.len()) - value.len();
        self.buf.extend_from_slice(&[0u8; 3][..pad.min(3)]);
        let total = self.buf.len() - HEADER_LEN;
        self.set_len(total);
        self
    }

    /// Append an XOR-address attribute.
    pub fn xor_address(&mut self, typ: u16, addr: SocketAddr) -> &mut Self {
        let mut v = [0u8; 20];
        let n = encode_xor_address(&mut v, addr, &self.txid);
        self.attr(typ, &v[..n])
    }

    /// Append a plain (non-XOR) address attribute (ALTERNATE-SERVER).
    pub fn address(&mut self, typ: u16, addr: SocketAddr) -> &mut Self {
        let mut v = [0u8; 20];
        v[2..4].copy_from_slice(&addr.port().to_be_bytes());
        let n = match addr.ip() {
            IpAddr::V4(a) => {
                v[1] = 1;
                v[4..8].copy_from_slice(&a.octets());
                8
            }
            IpAddr::V6(a) => {
                v[1] = 2;
                v[4..20].copy_from_slice(&a.octets());
                20
            }
        };
        self.attr(typ, &v[..n])
    }

    /// Append a 32-bit attribute.
    pub fn u32(&mut self, typ: u16, value: u32) -> &mut Self {
        self.attr(typ, &value.to_be_bytes())
    }

    /// Append ERROR-CODE without a reason phrase (no amplification).
    pub fn error_code(&mut self, code: u16) -> &mut Self {
        let v = [0, 0, (code / 100) as u8, (code % 100) as u8];
        self.attr(attr::ERROR_CODE, &v)
    }

    /// Append ERROR-CODE with a reason phrase (coturn's `include-reason-string`).
    pub fn error_code_with_reason(&mut self, code: u16, reason: &str) -> &mut Self {
        let mut v = Vec::with_capacity(4 + reason.len());
        v.extend_from_slice(&[0, 0, (code / 100) as u8, (code % 100) as u8]);
        v.extend_from_slice(reason.as_bytes());
        self.attr(attr::ERROR_CODE, &v)
    }

    /// Append MESSAGE-INTEGRITY (HMAC-SHA1) with `key`.
    pub fn integrity_sha1(&mut self, key: &[u8]) -> &mut Self {
        let len = self.buf.len() + 24 - HEADER_LEN;
        self.set_len(len);
        let mac = Hmac::<sha1::Sha1>::new_from_slice(key).map(|mut m| {
            m.update(self.buf);
            m.finalize().into_bytes()
        });
        match mac {
            Ok(tag) => self.attr(attr::MESSAGE_INTEGRITY, &tag),
            Err(_) => self.attr(attr::MESSAGE_INTEGRITY, &[0u8; 20]),
        }
    }

    /// Append MESSAGE-INTEGRITY-SHA256 (full 32 bytes) with `key`.
    pub fn integrity_sha256(&mut self, key: &[u8]) -> &mut Self {
        let len = self.buf.len() + 36 - HEADER_LEN;
        self.set_len(len);
        let mac = Hmac::<sha2::Sha256>::new_from_slice(key).map(|mut m| {
            m.update(self.buf);
            m.finalize().into_bytes()
        });
        match mac {
            Ok(tag) => self.attr(attr::MESSAGE_INTEGRITY_SHA256, &tag),
            Err(_) => self.attr(attr::MESSAGE_INTEGRITY_SHA256, &[0u8; 32]),
        }
    }

    /// Append FINGERPRINT (must be last).
    pub fn fingerprint(&mut self) -> &mut Self {
        let len = self.buf.len() + 8 - HEADER_LEN;
        let crc = fingerprint_of(self.buf, len);
        self.u32(attr::FINGERPRINT, crc)
    }

    /// Current length of the message.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// `true` if nothing but the header was written.
    pub fn is_empty(&self) -> bool {
        self.buf.len() <= HEADER_LEN
    }
}

/// The reason phrase of an error code (RFC 8489 §14.8, RFC 8656 §18).
pub fn reason_phrase(code: u16) -> &'static str {
    match code {
        300 => "Try Alternate",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        420 => "Unknown Attribute",
        437 => "Allocation Mismatch",
        438 => "Stale Nonce",
        440 => "Address Family not Supported",
        441 => "Wrong Credentials",
        442 => "Unsupported Transport Protocol",
        443 => "Peer Address Family Mismatch",
        486 => "Allocation Quota Reached",
        500 => "Server Error",
        508 => "Insufficient Capacity",
        _ => "Error",
    }
}

/// Encode an XOR address value into `out`; returns its length (8 or 20).
pub fn encode_xor_address(out: &mut [u8; 20], addr: SocketAddr, txid: &[u8; 12]) -> usize {
    let cookie = MAGIC_COOKIE.to_be_bytes();
    out[0] = 0;
    out[2..4].copy_from_slice(&(addr.port() ^ 0x2112).to_be_bytes());
    match addr.ip() {
        IpAddr::V4(a) => {
            out[1] = 1;
            for (i, b) in a.octets().iter().enumerate() {
                out[4 + i] = b ^ cookie[i];
            }
            8
        }
        IpAddr::V6(a) => {
            out[1] = 2;
            let mut mask = [0u8; 16];
            mask[..4].copy_from_slice(&cookie);
            mask[4..].copy_from_slice(txid);
            for (i, b) in a.octets().iter().enumerate() {
                out[4 + i] = b ^ mask[i];
            }
            20
        }
    }
}

/// The long-term credential key: MD5(username ":" realm ":" password).
pub fn long_term_key(username: &str, realm: &str, password: &str) -> [u8; 16] {
    use md5::{Digest, Md5};
    let mut h = Md5::new();
    h.update(username.as_bytes());
    h.update(b":");
    h.update(realm.as_bytes());
    h.update(b":");
    h.update(password.as_bytes());
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_round_trip() {
        for m in [
            method::BINDING,
            method::ALLOCATE,
            method::CHANNEL_BIND,
            0xFFF,
        ] {
            for c in [
                Class::Request,
                Class::Indication,
                Class::Success,
                Class::Error,
            ] {
                assert_eq!(split_type(message_type(m, c)), (m, c));
            }
        }
        assert_eq!(message_type(method::BINDING, Class::Request), 0x0001);
        assert_eq!(message_type(method::BINDING, Class::Success), 0x0101);
        assert_eq!(message_type(method::ALLOCATE, Class::Error), 0x0113);
        assert_eq!(message_type(method::SEND, Class::Indication), 0x0016);
        assert_eq!(message_type(method::DATA, Class::Indication), 0x0017);
    }

    /// RFC 5769 2.1 sample request: integrity with short-term password and fingerprint.
    #[test]
    fn rfc5769_sample_request() {
        let hex = "00010058 2112a442 b7e7a701 bc34d686 fa87dfae 80220010 5354554e 20746573 \
                   7420636c 69656e74 00240004 6e0001ff 80290008 932ff9b1 51263b36 00060009 \
                   6576746a 3a683676 59202020 00080014 9aeaa70c bfd8cb56 781ef2b5 b2d3f249 \
                   c1b571a2 80280004 e57a3bcf";
        let hex: String = hex.chars().filter(|c| !c.is_whitespace()).collect();
        let bytes: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        // The SOFTWARE value in the RFC is "STUN test client" (16 bytes).
        let m = Message::parse(&bytes).unwrap();
        assert_eq!(m.class(), Class::Request);
        let mut mi = None;
        let mut fp = None;
        for a in m.attributes() {
            if a.typ == attr::MESSAGE_INTEGRITY {
                mi = Some(a);
            }
            if a.typ == attr::FINGERPRINT {
                fp = Some(a);
            }
        }
        let (mi, fp) = (mi.unwrap(), fp.unwrap());
        assert!(m.check_integrity_sha1(mi.offset, mi.value, b"VOkJxbRl1RmTxUk/WvJxBt"));
        assert!(!m.check_integrity_sha1(mi.offset, mi.value, b"wrong"));
        assert!(m.check_fingerprint(fp.offset, fp.value));
    }

    #[test]
    fn build_and_parse() {
        let mut buf = Vec::new();
        let txid = [7u8; 12];
        let peer: SocketAddr = "[2001:db8::1]:4000".parse().unwrap();
        let mut b = Builder::new(&mut buf, method::ALLOCATE, Class::Success, txid);
        b.xor_address(attr::XOR_RELAYED_ADDRESS, peer)
            .u32(attr::LIFETIME, 600)
            .attr(attr::SOFTWARE, b"abcde")
            .integrity_sha1(b"key")
            .fingerprint();
        let m = Message::parse(&buf).unwrap();
        assert_eq!(m.method(), method::ALLOCATE);
        let attrs: Vec<_> = m.attributes().collect();
        assert_eq!(attrs.len(), 5);
        assert_eq!(decode_address(attrs[0].value, &txid, true), Some(peer));
        assert_eq!(attrs[2].value, b"abcde");
        assert!(m.check_integrity_sha1(attrs[3].offset, attrs[3].value, b"key"));
        assert!(m.check_fingerprint(attrs[4].offset, attrs[4].value));
    }

    #[test]
    fn rejects_bad_layout() {
        let mut buf = Vec::new();
        Builder::new(&mut buf, method::BINDING, Class::Request, [1; 12]).attr(0x8022, b"x");
        assert!(Message::parse(&buf).is_ok());
        let mut short = buf.clone();
        short.pop();
        assert_eq!(Message::parse(&short).unwrap_err(), ParseError::Length);
        let mut long_attr = buf.clone();
        long_attr[23] = 9; // attribute length past the end
        assert_eq!(
            Message::parse(&long_attr).unwrap_err(),
            ParseError::Attribute
        );
        let mut cookie = buf.clone();
        cookie[4] = 0;
        assert_eq!(Message::parse(&cookie).unwrap_err(), ParseError::NotStun);
        assert_eq!(Message::parse(&buf[..10]).unwrap_err(), ParseError::Short);
    }
}
