//! The benchmark's kernel echo (`src/bpf/reflect.bpf.c`): UDP datagrams to one port go straight
//! back to their sender from tc ingress; or, the load generator's own reference, are dropped
//! there (nothing comes back). Detached when dropped.

use aya::maps::Array;
use aya::programs::{tc, SchedClassifier, TcAttachType};
use aya::Ebpf;

use crate::KernelError;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/reflect.bpf.o"));

/// The attached reflector.
pub struct Reflector {
    _ebpf: Ebpf,
}

impl Reflector {
    /// Reflects every IPv4 UDP datagram to `port` arriving on `iface` (e.g. `lo`).
    pub fn attach(iface: &str, port: u16) -> Result<Reflector, KernelError> {
        Self::attach_program(iface, port, "lastcall_reflect")
    }

    /// Drops every IPv4 UDP datagram to `port` arriving on `iface` at tc ingress instead
    /// (a sink: no socket receives them, nothing is sent back).
    pub fn attach_drop(iface: &str, port: u16) -> Result<Reflector, KernelError> {
        Self::attach_program(iface, port, "lastcall_drop")
    }

    fn attach_program(iface: &str, port: u16, name: &str) -> Result<Reflector, KernelError> {
        let load = |e: &dyn std::fmt::Display| KernelError::Load(e.to_string());
        let mut ebpf = Ebpf::load(OBJECT).map_err(|e| load(&e))?;
        let mut ports: Array<_, u32> =
            Array::try_from(ebpf.map_mut("PORT").ok_or_else(|| load(&"no map PORT"))?)
                .map_err(|e| load(&e))?;
        ports
            .set(0, u32::from(port.to_be()), 0)
            .map_err(|e| load(&e))?;
        let prog: &mut SchedClassifier = ebpf
            .program_mut(name)
            .ok_or_else(|| load(&format!("no program {name}")))?
            .try_into()
            .map_err(|e| load(&e))?;
        prog.load().map_err(|e| load(&e))?;
        let _ = tc::qdisc_add_clsact(iface);
        prog.attach(iface, TcAttachType::Ingress)
            .map_err(|e| KernelError::Attach {
                iface: iface.to_string(),
                msg: e.to_string(),
            })?;
        Ok(Reflector { _ebpf: ebpf })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::time::Duration;

    /// A datagram to the reflected port comes back to its sender from that port.
    #[test]
    fn datagrams_come_back() {
        let port = {
            let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
            s.local_addr().expect("addr").port()
        };
        let r = match Reflector::attach("lo", port) {
            Ok(r) => r,
            Err(e) if std::env::var_os("CI").is_none() && !nix::unistd::geteuid().is_root() => {
                eprintln!("SKIP: {e}");
                return;
            }
            Err(e) => panic!("the reflector must load in CI: {e}"),
        };
        let c = UdpSocket::bind("127.0.0.1:0").expect("bind");
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        for i in 0..10u8 {
            c.send_to(&[i; 33], ("127.0.0.1", port)).expect("send");
            let mut buf = [0u8; 64];
            let (n, from) = c.recv_from(&mut buf).expect("reflected");
            assert_eq!((n, from.port(), buf[0]), (33, port, i));
        }
        drop(r);
    }

    /// A datagram to the dropped port never reaches the socket bound there, while one sent
    /// after it to another port does (loopback delivers them in order, in the sender's
    /// softirq); once detached, the port receives again.
    #[test]
    fn datagrams_to_the_sink_are_dropped() {
        let sunk = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let port = sunk.local_addr().expect("addr").port();
        sunk.set_nonblocking(true).expect("nonblocking");
        let other = UdpSocket::bind("127.0.0.1:0").expect("bind");
        other
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let r = match Reflector::attach_drop("lo", port) {
            Ok(r) => r,
            Err(e) if std::env::var_os("CI").is_none() && !nix::unistd::geteuid().is_root() => {
                eprintln!("SKIP: {e}");
                return;
            }
            Err(e) => panic!("the sink must load in CI: {e}"),
        };
        let c = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let mut buf = [0u8; 64];
        for i in 0..10u8 {
            c.send_to(&[i; 33], ("127.0.0.1", port)).expect("send");
            c.send_to(&[i; 7], other.local_addr().expect("addr"))
                .expect("send");
            let (n, _) = other.recv_from(&mut buf).expect("the other port receives");
            assert_eq!((n, buf[0]), (7, i));
            let e = sunk.recv_from(&mut buf).expect_err("dropped");
            assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        }
        drop(r);
        c.send_to(&[9; 33], ("127.0.0.1", port)).expect("send");
        c.send_to(&[9; 7], other.local_addr().expect("addr"))
            .expect("send");
        other.recv_from(&mut buf).expect("the other port receives");
        let (n, _) = sunk.recv_from(&mut buf).expect("detached: received");
        assert_eq!((n, buf[0]), (33, 9));
    }
}
