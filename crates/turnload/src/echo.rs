//! The echo peer and the machine's own references: `echo` sends every datagram back where it
//! came from (`recvmmsg`/`sendmmsg`, one thread); `reflect` attaches a tc program that does the
//! same in the kernel (the turn-kernel crate's reflector, with the `kernel` feature), the least
//! a datagram's round trip can cost here.
//!
//! The echo either blocks while idle (then every datagram that finds it asleep costs its
//! sender a wake-up of this process, on another CPU), or, with `poll`, reads what arrived every
//! `poll` (sleeping between, timer slack 1 µs): no sender ever wakes it, and it handles a
//! batch per wake-up, as a media server's tick does. The benchmark uses the latter for every
//! design alike; its added latency (half the period on average) cancels out of the relays'
//! figures against the direct echo.

use std::io::{IoSlice, IoSliceMut, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use nix::sys::socket::{recvmmsg, sendmmsg, MsgFlags, MultiHeaders, SockaddrStorage};

const BATCH: usize = 64;
const MAX_DGRAM: usize = 2048;

/// Binds `bind`, prints `echo ADDR` on stdout, then echoes until killed: blocking while idle,
/// or reading every `poll`.
pub(crate) fn run(bind: SocketAddr, poll: Option<std::time::Duration>) -> anyhow::Result<()> {
    if poll.is_some() {
        let _ = nix::sys::prctl::set_timerslack(1_000);
    }
    let sock = UdpSocket::bind(bind)?;
    let s = socket2::SockRef::from(&sock);
    let _ = s.set_recv_buffer_size(8 << 20);
    let _ = s.set_send_buffer_size(8 << 20);
    let mut out = std::io::stdout();
    writeln!(out, "echo {}", sock.local_addr()?)?;
    out.flush()?;
    let fd = sock.as_raw_fd();
    let mut buf = vec![0u8; BATCH * MAX_DGRAM];
    let mut rh: MultiHeaders<SockaddrStorage> = MultiHeaders::preallocate(BATCH, None);
    let mut sh: MultiHeaders<SockaddrStorage> = MultiHeaders::preallocate(BATCH, None);
    loop {
        let mut got: Vec<(usize, Option<SockaddrStorage>)> = Vec::with_capacity(BATCH);
        {
            let mut iovs: Vec<[IoSliceMut<'_>; 1]> = buf
                .chunks_mut(MAX_DGRAM)
                .map(|c| [IoSliceMut::new(c)])
                .collect();
            let flags = match poll {
                Some(_) => MsgFlags::MSG_DONTWAIT,
                None => MsgFlags::MSG_WAITFORONE,
            };
            match recvmmsg(fd, &mut rh, iovs.iter_mut(), flags, None) {
                Ok(msgs) => got.extend(msgs.map(|m| (m.bytes, m.address))),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if got.is_empty() {
            if let Some(p) = poll {
                std::thread::sleep(p);
            }
            continue;
        }
        let slices: Vec<[IoSlice<'_>; 1]> = got
            .iter()
            .enumerate()
            .map(|(i, (len, _))| [IoSlice::new(&buf[i * MAX_DGRAM..i * MAX_DGRAM + len])])
            .collect();
        let addrs: Vec<Option<SockaddrStorage>> = got.iter().map(|(_, a)| *a).collect();
        let _ = sendmmsg(fd, &mut sh, &slices, &addrs, [], MsgFlags::empty());
    }
}

/// Attaches the kernel reflector for UDP port `port` on `iface`, prints `reflect PORT`, then
/// keeps it attached until killed.
#[cfg(feature = "kernel")]
pub(crate) fn reflect(iface: &str, port: u16) -> anyhow::Result<()> {
    let r = lastcall_turn_kernel::Reflector::attach(iface, port)?;
    let mut out = std::io::stdout();
    writeln!(out, "reflect {port}")?;
    out.flush()?;
    loop {
        std::thread::park();
        let _ = &r;
    }
}

/// Without the `kernel` feature there is no reflector.
#[cfg(not(feature = "kernel"))]
pub(crate) fn reflect(_iface: &str, _port: u16) -> anyhow::Result<()> {
    anyhow::bail!("built without the `kernel` feature: no kernel reflector")
}
