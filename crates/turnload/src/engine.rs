//! The load itself, on one thread: datagrams paced at a fixed offered rate over many
//! connected sockets ("lanes", one per allocation or direct to the echo), sent with
//! `sendmmsg` in small per-lane bursts, and the echoes read with `recvmmsg` on the lanes that
//! `epoll` says are readable. Each payload carries its phase, sequence number and send time
//! (CLOCK_REALTIME ns); each echo's arrival time is the kernel's receive timestamp
//! (`SO_TIMESTAMPNS`), so the round trip is exact whatever the loop was doing when it read it.
//!
//! The thread sleeps between bursts of half a millisecond's worth (timer slack 1 µs) and never
//! waits in a system call on a socket, so no datagram costs its sender a wake-up of this process: at high rates the
//! kernel's per-datagram work is what is left, which is what the benchmark measures. When it
//! falls behind (descheduled, or more than one core's worth of work) it sends what is due at
//! once, and the offered rate reported is what it sent.

use std::io::{IoSlice, IoSliceMut};
use std::net::UdpSocket;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lastcall_turn_proto::frame::{parse_channel_data, CHANNEL_HEADER_LEN};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{
    recvmmsg, sendmmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, MultiHeaders,
    SockaddrStorage,
};
use nix::sys::time::TimeSpec;

use crate::histogram::Histogram;

/// Payload marker.
const MAGIC: [u8; 4] = *b"LCTL";
/// Bytes of the stamp at the start of each payload: magic, phase, sequence, send time (ns).
pub(crate) const STAMP_LEN: usize = 24;
/// Largest datagram sent or read.
const MAX_DGRAM: usize = 2048;
/// Datagrams read by one `recvmmsg`.
const RECV_BATCH: usize = 64;
/// Datagrams one lane sends per burst, at most.
const MAX_BURST: usize = 64;
/// Socket buffers asked for (the kernel caps them at rmem_max/wmem_max).
const SOCK_BUF: usize = 4 << 20;
/// How often the echoes are read while sending.
const DRAIN: Duration = Duration::from_micros(500);
/// The shortest sleep between bursts: a wake-up from a timer costs this VM about 20 µs of
/// CPU (measured: 27 µs per round trip at 10,000/s with a sleep per datagram, against 5.5 at
/// 100,000/s), so the load goes out in bursts of at most half a millisecond's worth.
const MIN_NAP: Duration = Duration::from_micros(500);

/// One socket of the load: to the server (ChannelData on `channel`) or straight to the echo.
pub(crate) struct Lane {
    pub sock: UdpSocket,
    pub channel: Option<u16>,
}

impl Lane {
    /// Prepares `sock` (connected already): non-blocking, big buffers, receive timestamps.
    pub(crate) fn new(sock: UdpSocket, channel: Option<u16>) -> std::io::Result<Lane> {
        sock.set_nonblocking(true)?;
        let s = socket2::SockRef::from(&sock);
        let _ = s.set_recv_buffer_size(SOCK_BUF);
        let _ = s.set_send_buffer_size(SOCK_BUF);
        setsockopt(&sock, sockopt::ReceiveTimestampns, &true).map_err(std::io::Error::from)?;
        Ok(Lane { sock, channel })
    }
}

/// What one phase did.
#[derive(Clone, Debug, Default)]
pub(crate) struct Phase {
    pub rate: f64,
    /// Datagrams sent per second over the phase (what was offered).
    pub offered: f64,
    pub sent: u64,
    /// Datagrams the kernel refused (send buffer full).
    pub send_errors: u64,
    pub received: u64,
    /// Round trips, µs.
    pub hist: Histogram,
    pub secs: f64,
}

impl Phase {
    pub(crate) fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }

    pub(crate) fn loss_pct(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        self.lost() as f64 * 100.0 / self.sent as f64
    }
}

/// The sockets, buffers and headers of the load, reused from phase to phase.
pub(crate) struct Engine {
    lanes: Vec<Lane>,
    epoll: Epoll,
    size: usize,
    /// Per lane: MAX_BURST frames (ChannelData header, then the payload).
    frames: Vec<Vec<u8>>,
    recv_buf: Vec<u8>,
    recv_hdrs: MultiHeaders<SockaddrStorage>,
    send_hdrs: MultiHeaders<SockaddrStorage>,
    next_lane: usize,
    phase: u32,
    /// Whether anything comes back (false: a sink; the phase neither reads nor waits).
    echoes: bool,
}

fn realtime_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Writes the stamp at the start of `payload` (at least [`STAMP_LEN`] bytes).
pub(crate) fn write_stamp(payload: &mut [u8], phase: u32, seq: u64, sent_ns: u64) {
    if let Some(p) = payload.get_mut(..STAMP_LEN) {
        p[..4].copy_from_slice(&MAGIC);
        p[4..8].copy_from_slice(&phase.to_be_bytes());
        p[8..16].copy_from_slice(&seq.to_be_bytes());
        p[16..24].copy_from_slice(&sent_ns.to_be_bytes());
    }
}

/// Reads a stamp: `(phase, sequence, send time in ns)`.
pub(crate) fn read_stamp(payload: &[u8]) -> Option<(u32, u64, u64)> {
    let p = payload.get(..STAMP_LEN)?;
    if p[..4] != MAGIC {
        return None;
    }
    let phase = u32::from_be_bytes(p[4..8].try_into().ok()?);
    let seq = u64::from_be_bytes(p[8..16].try_into().ok()?);
    let sent = u64::from_be_bytes(p[16..24].try_into().ok()?);
    Some((phase, seq, sent))
}

impl Engine {
    /// An engine over `lanes` sending payloads of `size` bytes (at least [`STAMP_LEN`]).
    pub(crate) fn new(lanes: Vec<Lane>, size: usize) -> anyhow::Result<Engine> {
        let size = size.clamp(STAMP_LEN, MAX_DGRAM - CHANNEL_HEADER_LEN);
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        for (i, l) in lanes.iter().enumerate() {
            epoll.add(
                l.sock.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, i as u64),
            )?;
        }
        let frames = lanes
            .iter()
            .map(|l| {
                let one = match l.channel {
                    Some(ch) => {
                        let mut f = Vec::new();
                        lastcall_turn_proto::frame::write_channel_data(
                            &mut f,
                            ch,
                            &vec![0u8; size],
                            false,
                        );
                        f
                    }
                    None => vec![0u8; size],
                };
                one.repeat(MAX_BURST)
            })
            .collect();
        // Timer slack 1 µs: the pacing sleeps are tens of µs at high rates.
        let _ = nix::sys::prctl::set_timerslack(1_000);
        Ok(Engine {
            lanes,
            epoll,
            size,
            frames,
            recv_buf: vec![0u8; RECV_BATCH * MAX_DGRAM],
            recv_hdrs: MultiHeaders::preallocate(
                RECV_BATCH,
                Some(nix::cmsg_space!(nix::libc::timespec)),
            ),
            send_hdrs: MultiHeaders::preallocate(MAX_BURST, None),
            next_lane: 0,
            phase: 0,
            echoes: true,
        })
    }

    /// Nothing comes back (the far end drops everything): the phases only send, so the
    /// generator's CPU is the sending alone.
    #[cfg(feature = "kernel")]
    pub(crate) fn without_echoes(mut self) -> Engine {
        self.echoes = false;
        self
    }

    /// The lanes' local addresses (the clients' 5-tuples).
    pub(crate) fn lanes(&self) -> &[Lane] {
        &self.lanes
    }

    fn frame_len(&self, lane: usize) -> usize {
        match self.lanes.get(lane).and_then(|l| l.channel) {
            Some(_) => CHANNEL_HEADER_LEN + self.size,
            None => self.size,
        }
    }

    /// Sends `n` datagrams on lane `lane`, stamped `seq0..`; returns (sent, refused).
    fn send_burst(&mut self, lane: usize, n: usize, seq0: u64) -> (u64, u64) {
        let n = n.min(MAX_BURST);
        let flen = self.frame_len(lane);
        let off = if self.lanes[lane].channel.is_some() {
            CHANNEL_HEADER_LEN
        } else {
            0
        };
        let now = realtime_ns();
        let frames = &mut self.frames[lane];
        for k in 0..n {
            if let Some(f) = frames.get_mut(k * flen + off..(k + 1) * flen) {
                write_stamp(f, self.phase, seq0 + k as u64, now);
            }
        }
        let slices: Vec<[IoSlice<'_>; 1]> = frames
            .chunks(flen)
            .take(n)
            .map(|f| [IoSlice::new(f)])
            .collect();
        let addrs = vec![None; n];
        let fd = self.lanes[lane].sock.as_raw_fd();
        match sendmmsg(
            fd,
            &mut self.send_hdrs,
            &slices,
            &addrs,
            [],
            MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(r) => {
                let sent = r.count() as u64;
                (sent, n as u64 - sent)
            }
            Err(_) => (0, n as u64),
        }
    }

    /// Reads what is waiting on every readable lane into `phase`.
    fn drain(&mut self, out: &mut Phase) {
        let mut events = [EpollEvent::empty(); 64];
        let Ok(ready) = self.epoll.wait(&mut events, EpollTimeout::ZERO) else {
            return;
        };
        for ev in &events[..ready] {
            let lane = ev.data() as usize;
            // Until the lane is empty (bounded: a few batches).
            for _ in 0..8 {
                if self.recv_lane(lane, out) < RECV_BATCH {
                    break;
                }
            }
        }
    }

    /// One `recvmmsg` on `lane`; returns how many datagrams it read.
    fn recv_lane(&mut self, lane: usize, out: &mut Phase) -> usize {
        let Some(l) = self.lanes.get(lane) else {
            return 0;
        };
        let fd = l.sock.as_raw_fd();
        let channel = l.channel;
        let mut meta = Vec::with_capacity(RECV_BATCH);
        {
            let mut iovs: Vec<[IoSliceMut<'_>; 1]> = self
                .recv_buf
                .chunks_mut(MAX_DGRAM)
                .map(|c| [IoSliceMut::new(c)])
                .collect();
            let Ok(msgs) = recvmmsg(
                fd,
                &mut self.recv_hdrs,
                iovs.iter_mut(),
                MsgFlags::MSG_DONTWAIT,
                None,
            ) else {
                return 0;
            };
            for m in msgs {
                let mut at = None;
                if let Ok(cmsgs) = m.cmsgs() {
                    for c in cmsgs {
                        if let ControlMessageOwned::ScmTimestampns(ts) = c {
                            at = Some(timespec_ns(ts));
                        }
                    }
                }
                meta.push((m.bytes, at));
            }
        }
        let n = meta.len();
        for (i, (len, at)) in meta.into_iter().enumerate() {
            let Some(d) = self.recv_buf.get(i * MAX_DGRAM..i * MAX_DGRAM + len) else {
                continue;
            };
            let payload = match channel {
                Some(ch) => match parse_channel_data(d) {
                    Some((c, p)) if c == ch => p,
                    _ => continue,
                },
                None => d,
            };
            let Some((phase, _seq, sent)) = read_stamp(payload) else {
                continue;
            };
            if phase != self.phase {
                continue; // a straggler from an earlier phase
            }
            out.received += 1;
            let at = at.unwrap_or_else(realtime_ns);
            out.hist.record(at.saturating_sub(sent) / 1000);
        }
        n
    }

    /// Offers `rate` datagrams/s over every lane for `duration`, then waits for the echoes
    /// (until all came back, or 300 ms without one, at most 3 s).
    pub(crate) fn phase(&mut self, rate: f64, duration: Duration) -> Phase {
        self.phase += 1;
        let mut out = Phase {
            rate,
            ..Phase::default()
        };
        let lanes = self.lanes.len().max(1);
        // Per-lane burst: about 50 µs of the rate, 8 to MAX_BURST datagrams.
        let burst = ((rate * 50e-6) as usize).clamp(8, MAX_BURST);
        let start = Instant::now();
        let mut seq = 0u64;
        let mut drained = Duration::ZERO;
        loop {
            let elapsed = start.elapsed();
            if elapsed >= duration {
                break;
            }
            let due = (elapsed.as_secs_f64() * rate) as u64;
            while seq < due {
                let n = usize::try_from(due - seq).unwrap_or(MAX_BURST).min(burst);
                let lane = self.next_lane % lanes;
                self.next_lane = self.next_lane.wrapping_add(1);
                let (sent, refused) = self.send_burst(lane, n, seq);
                out.sent += sent;
                out.send_errors += refused;
                seq += n as u64;
            }
            // The echoes are read every DRAIN (their arrival times are the kernel's): a few per
            // lane per `recvmmsg` rather than one.
            let now = start.elapsed();
            if self.echoes && now.saturating_sub(drained) >= DRAIN {
                self.drain(&mut out);
                drained = now;
            }
            // Until the next datagram is due: at least MIN_NAP (at high rates, what is due by
            // then goes out together), at most 1 ms.
            let next = Duration::from_secs_f64((seq + 1) as f64 / rate);
            let nap = next.saturating_sub(now).max(MIN_NAP);
            std::thread::sleep(nap.min(Duration::from_millis(1)));
        }
        out.secs = start.elapsed().as_secs_f64();
        out.offered = out.sent as f64 / out.secs.max(1e-9);
        let wait = Instant::now();
        let mut last = out.received;
        let mut last_change = Instant::now();
        while self.echoes && out.received < out.sent && wait.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_micros(500));
            self.drain(&mut out);
            if out.received != last {
                last = out.received;
                last_change = Instant::now();
            } else if last_change.elapsed() > Duration::from_millis(300) {
                break;
            }
        }
        out
    }
}

fn timespec_ns(ts: TimeSpec) -> u64 {
    u64::try_from(ts.tv_sec())
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec()).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip() {
        let mut p = [0u8; 40];
        write_stamp(&mut p, 3, 42, 123_456);
        assert_eq!(read_stamp(&p), Some((3, 42, 123_456)));
        assert_eq!(read_stamp(&p[..20]), None);
        p[0] = b'X';
        assert_eq!(read_stamp(&p), None);
    }

    /// Straight to a real echo socket on loopback: every datagram offered comes back with a
    /// round trip, at the rate asked for.
    #[test]
    fn a_phase_offers_its_rate_and_counts_the_echoes() {
        let echo = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let at = echo.local_addr().expect("addr");
        echo.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((n, from)) = echo.recv_from(&mut buf) {
                    let _ = echo.send_to(&buf[..n], from);
                }
            }
        });
        let lanes = (0..4)
            .map(|_| {
                let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
                s.connect(at).expect("connect");
                Lane::new(s, None).expect("lane")
            })
            .collect();
        let mut e = Engine::new(lanes, 64).expect("engine");
        let p = e.phase(2000.0, Duration::from_millis(500));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        t.join().expect("echo");
        assert!(p.sent >= 900 && p.offered > 1800.0, "{p:?}");
        assert_eq!(p.received, p.sent, "{p:?}");
        assert_eq!(p.hist.count(), p.sent);
        assert!(p.hist.quantile(0.5).is_some());
    }
}
