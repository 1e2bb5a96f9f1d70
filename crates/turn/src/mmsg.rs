//! Batched UDP system calls: `recvmmsg` into fixed slots of one buffer, `sendmmsg` of queued
//! datagrams, both non-blocking.

use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::{
    recvmmsg, sendmmsg, ControlMessage, MsgFlags, MultiHeaders, SockaddrIn, SockaddrIn6,
};

use crate::sockets::MAX_DATAGRAM;

/// Datagrams asked of one `recvmmsg`, and sent by one `sendmmsg`.
pub const BATCH: usize = 32;

/// `recvmmsg` headers, one set per address family: the kernel shortens a header's address
/// length to what it wrote, and nix does not reset it between calls.
pub(crate) struct RecvHeaders {
    v4: MultiHeaders<SockaddrIn>,
    v6: MultiHeaders<SockaddrIn6>,
}

impl RecvHeaders {
    pub(crate) fn new() -> RecvHeaders {
        RecvHeaders {
            v4: MultiHeaders::preallocate(BATCH, None),
            v6: MultiHeaders::preallocate(BATCH, None),
        }
    }
}

/// `sendmmsg` headers, apart from the receive ones: nix's `sendmmsg` points a header's
/// address at the caller's array, which `recvmmsg` would then write through.
pub(crate) struct SendHeaders {
    v4: MultiHeaders<SockaddrIn>,
    v6: MultiHeaders<SockaddrIn6>,
}

impl SendHeaders {
    pub(crate) fn new() -> SendHeaders {
        SendHeaders {
            v4: MultiHeaders::preallocate(BATCH, None),
            v6: MultiHeaders::preallocate(BATCH, None),
        }
    }
}

/// One `recvmmsg` of up to `want` datagrams into slots `start..start + want` of `buf` (each
/// [`MAX_DATAGRAM`] bytes); `push` gets each datagram's source and length. Returns how many
/// were read.
pub(crate) fn recv_batch(
    sock: &UdpSocket,
    v6: bool,
    buf: &mut [u8],
    start: usize,
    want: usize,
    hdrs: &mut RecvHeaders,
    mut push: impl FnMut(SocketAddr, usize),
) -> Result<usize, Errno> {
    let fd = sock.as_raw_fd();
    let want = want.min(BATCH);
    let region = buf
        .get_mut(start * MAX_DATAGRAM..(start + want) * MAX_DATAGRAM)
        .unwrap_or_default();
    let mut chunks = region.chunks_mut(MAX_DATAGRAM);
    let mut iovs: [[IoSliceMut<'_>; 1]; BATCH] =
        std::array::from_fn(|_| [IoSliceMut::new(chunks.next().unwrap_or_default())]);
    let iovs = iovs.get_mut(..want).unwrap_or_default();
    let flags = MsgFlags::MSG_DONTWAIT;
    let mut n = 0;
    if v6 {
        for msg in recvmmsg(fd, &mut hdrs.v6, iovs.iter_mut(), flags, None)? {
            n += 1;
            let from = msg
                .address
                .map(|a| SocketAddr::V6(SocketAddrV6::from(a)))
                .unwrap_or_else(|| SocketAddr::from(([0u16; 8], 0)));
            // A truncated datagram (longer than a slot: never for UDP) is dropped.
            if !msg.flags.contains(MsgFlags::MSG_TRUNC) {
                push(from, msg.bytes);
            }
        }
    } else {
        for msg in recvmmsg(fd, &mut hdrs.v4, iovs.iter_mut(), flags, None)? {
            n += 1;
            let from = msg
                .address
                .map(|a| SocketAddr::V4(SocketAddrV4::from(a)))
                .unwrap_or_else(|| SocketAddr::from(([0u8; 4], 0)));
            if !msg.flags.contains(MsgFlags::MSG_TRUNC) {
                push(from, msg.bytes);
            }
        }
    }
    Ok(n)
}

/// A datagram queued for [`send_run`]: where it goes and where its bytes are in the arena.
pub(crate) trait Queued {
    fn to(&self) -> SocketAddr;
    fn bytes(&self) -> Range<usize>;
}

/// Datagrams sent and dropped by one [`send_run`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendResult {
    pub(crate) sent: u64,
    pub(crate) dropped: u64,
    pub(crate) calls: u64,
}

/// No control messages.
const NO_CMSG: [ControlMessage<'static>; 0] = [];

/// Sends `run` (datagrams through one socket, all of its address family) with `sendmmsg`,
/// [`BATCH`] at a time, never waiting: a full buffer drops whatever is left.
pub(crate) fn send_run<Q: Queued>(
    sock: &UdpSocket,
    v6: bool,
    run: &[Q],
    arena: &[u8],
    hdrs: &mut SendHeaders,
) -> SendResult {
    let fd = sock.as_raw_fd();
    let mut r = SendResult::default();
    let mut rest = run;
    while !rest.is_empty() {
        let chunk = rest.get(..BATCH.min(rest.len())).unwrap_or_default();
        r.calls += 1;
        match send_chunk(fd, v6, chunk, arena, hdrs) {
            Ok(0) | Err(Errno::EAGAIN) => {
                r.dropped += rest.len() as u64;
                break;
            }
            Ok(n) => {
                let n = n.min(chunk.len());
                r.sent += n as u64;
                rest = rest.get(n..).unwrap_or_default();
            }
            Err(Errno::EINTR) => {}
            Err(_) => {
                // This datagram cannot go (a bad address, a message too long): drop it alone.
                r.dropped += 1;
                rest = rest.get(1..).unwrap_or_default();
            }
        }
    }
    r
}

/// One `sendmmsg` of `chunk` (at most [`BATCH`] datagrams).
fn send_chunk<Q: Queued>(
    fd: RawFd,
    v6: bool,
    chunk: &[Q],
    arena: &[u8],
    hdrs: &mut SendHeaders,
) -> Result<usize, Errno> {
    let iovs: [[IoSlice<'_>; 1]; BATCH] = std::array::from_fn(|k| {
        let data = chunk
            .get(k)
            .and_then(|i| arena.get(i.bytes()))
            .unwrap_or_default();
        [IoSlice::new(data)]
    });
    let iovs = iovs.get(..chunk.len()).unwrap_or_default();
    let flags = MsgFlags::MSG_DONTWAIT;
    if v6 {
        let addrs: [Option<SockaddrIn6>; BATCH] =
            std::array::from_fn(|k| match chunk.get(k).map(Queued::to) {
                Some(SocketAddr::V6(a)) => Some(SockaddrIn6::from(a)),
                _ => None,
            });
        let addrs = addrs.get(..chunk.len()).unwrap_or_default();
        Ok(sendmmsg(fd, &mut hdrs.v6, iovs, addrs, NO_CMSG, flags)?.count())
    } else {
        let addrs: [Option<SockaddrIn>; BATCH] =
            std::array::from_fn(|k| match chunk.get(k).map(Queued::to) {
                Some(SocketAddr::V4(a)) => Some(SockaddrIn::from(a)),
                _ => None,
            });
        let addrs = addrs.get(..chunk.len()).unwrap_or_default();
        Ok(sendmmsg(fd, &mut hdrs.v4, iovs, addrs, NO_CMSG, flags)?.count())
    }
}
