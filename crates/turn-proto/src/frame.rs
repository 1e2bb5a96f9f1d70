//! ChannelData (RFC 8656 §12.4) and stream framing for TCP/TLS client connections.

use crate::stun::{pad4, HEADER_LEN, MAGIC_COOKIE};

/// First channel number a client may bind.
pub const CHANNEL_MIN: u16 = 0x4000;
/// Last channel number a client may bind: 0x7FFF, the RFC 5766 range. RFC 8656 narrowed it
/// to 0x4FFF, but coturn (server and `turnutils_uclient`, which picks channel numbers at
/// random in 0x4000..=0x7FFF) still uses the full range, so refusing 0x5000..=0x7FFF would
/// break those clients; a TURN client port carries no DTLS/SRTP that could collide with it.
pub const CHANNEL_MAX: u16 = 0x7FFF;

/// Bytes before a ChannelData payload.
pub const CHANNEL_HEADER_LEN: usize = 4;

/// What a stream does not frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first byte is neither a STUN message (`0b00`) nor ChannelData (`0b01`), or the
    /// magic cookie is wrong: the connection is out of sync and must be closed.
    #[error("neither STUN nor ChannelData")]
    Unrecognized,
    /// A STUN length that is not a multiple of 4.
    #[error("invalid STUN length")]
    BadLength,
    /// A ChannelData channel number outside 0x4000..=0x7FFF.
    #[error("channel number out of range")]
    BadChannel,
}

/// Length of the next frame at the start of a TCP/TLS byte stream.
///
/// `Ok(None)`: need more bytes (not an error). `Ok(Some(n))`: the first `n` bytes are one
/// frame (a STUN message, or a ChannelData message including its padding to 4 bytes, as
/// RFC 8656 §12.5 requires over streams); pass exactly those bytes to
/// [`Server::handle_client`](crate::Server::handle_client). `Err`: the stream is not TURN;
/// close the connection.
pub fn stream_frame_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    match first >> 6 {
        0 => {
            if buf.len() >= 8 {
                let cookie = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
                if cookie != MAGIC_COOKIE {
                    return Err(FrameError::Unrecognized);
                }
            }
            let Some(h) = buf.get(..4) else {
                return Ok(None);
            };
            let len = usize::from(u16::from_be_bytes([h[2], h[3]]));
            if len % 4 != 0 {
                return Err(FrameError::BadLength);
            }
            let total = HEADER_LEN + len;
            Ok((buf.len() >= total).then_some(total))
        }
        1 => {
            let Some(h) = buf.get(..4) else {
                return if buf.len() >= 2 && !channel_in_range(u16::from_be_bytes([buf[0], buf[1]]))
                {
                    Err(FrameError::BadChannel)
                } else {
                    Ok(None)
                };
            };
            let ch = u16::from_be_bytes([h[0], h[1]]);
            if !channel_in_range(ch) {
                return Err(FrameError::BadChannel);
            }
            let len = usize::from(u16::from_be_bytes([h[2], h[3]]));
            let total = CHANNEL_HEADER_LEN + pad4(len);
            Ok((buf.len() >= total).then_some(total))
        }
        _ => Err(FrameError::Unrecognized),
    }
}

/// `true` for 0x4000..=0x7FFF.
pub fn channel_in_range(ch: u16) -> bool {
    (CHANNEL_MIN..=CHANNEL_MAX).contains(&ch)
}

/// Parse a ChannelData message: `(channel number, payload)`. The payload length comes from
/// the header; trailing bytes (padding) are allowed, a short message is not. Channel numbers
/// outside 0x4000..=0x7FFF are refused.
pub fn parse_channel_data(buf: &[u8]) -> Option<(u16, &[u8])> {
    let h = buf.get(..CHANNEL_HEADER_LEN)?;
    let ch = u16::from_be_bytes([h[0], h[1]]);
    if !channel_in_range(ch) {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([h[2], h[3]]));
    let data = buf.get(CHANNEL_HEADER_LEN..CHANNEL_HEADER_LEN + len)?;
    if buf.len() > CHANNEL_HEADER_LEN + pad4(len) {
        return None; // more than padding follows: not one ChannelData message
    }
    Some((ch, data))
}

/// Write a ChannelData message into `out` (cleared first); `pad` adds the stream padding.
pub fn write_channel_data(out: &mut Vec<u8>, channel: u16, data: &[u8], pad: bool) -> bool {
    let Ok(len) = u16::try_from(data.len()) else {
        return false;
    };
    out.clear();
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(data);
    if pad {
        let p = pad4(data.len()) - data.len();
        out.extend_from_slice(&[0u8; 3][..p.min(3)]);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames() {
        assert_eq!(stream_frame_len(&[]), Ok(None));
        assert_eq!(stream_frame_len(&[0x40]), Ok(None));
        assert_eq!(stream_frame_len(&[0x40, 0x00, 0x00]), Ok(None));
        assert_eq!(stream_frame_len(&[0x40, 0x00, 0x00, 0x05]), Ok(None));
        assert_eq!(
            stream_frame_len(&[0x40, 0x00, 0x00, 0x05, 1, 2, 3, 4, 5, 0, 0, 0]),
            Ok(Some(12))
        );
        assert_eq!(
            stream_frame_len(&[0x80, 0x00]),
            Err(FrameError::Unrecognized)
        );
        assert_eq!(stream_frame_len(&[0x7f, 0xff]), Ok(None));
        assert_eq!(stream_frame_len(&[0x80]), Err(FrameError::Unrecognized));
        let mut stun = vec![0x00, 0x01, 0x00, 0x04, 0x21, 0x12, 0xa4, 0x42];
        assert_eq!(stream_frame_len(&stun), Ok(None));
        stun.extend_from_slice(&[0; 16]);
        assert_eq!(stream_frame_len(&stun), Ok(Some(24)));
        stun[3] = 3;
        assert_eq!(stream_frame_len(&stun), Err(FrameError::BadLength));
        stun[4] = 0;
        assert_eq!(stream_frame_len(&stun), Err(FrameError::Unrecognized));
    }

    #[test]
    fn channel_data() {
        let mut out = Vec::new();
        assert!(write_channel_data(&mut out, 0x4001, b"hello", true));
        assert_eq!(out.len(), 12);
        assert_eq!(parse_channel_data(&out), Some((0x4001, &b"hello"[..])));
        assert_eq!(parse_channel_data(&out[..8]), None);
        assert_eq!(parse_channel_data(&[0x3f, 0xff, 0, 0]), None);
        assert_eq!(parse_channel_data(&[0x80, 0x00, 0, 0]), None);
        assert_eq!(
            parse_channel_data(&[0x7f, 0xff, 0, 0]),
            Some((0x7fff, &b""[..]))
        );
        assert_eq!(
            parse_channel_data(&[0x40, 0x00, 0, 0]),
            Some((0x4000, &b""[..]))
        );
    }
}
