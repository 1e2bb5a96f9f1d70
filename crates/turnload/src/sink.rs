//! `sink`: what the generator offers from its core when nothing comes back. The load is the
//! same as `direct`'s (the engine's paced `sendmmsg` bursts over many connected sockets,
//! every payload stamped), to a port on 127.0.0.1 whose datagrams a tc program drops at `lo`
//! ingress (turn-kernel's reflector object, `lastcall_drop`): no socket receives them, no
//! reply is read. The generator's CPU over a phase is then the sending alone, with the
//! kernel's loopback transmit and its ingress up to tc (which on loopback run in the
//! sender's softirq, so in its CPU time; what `ksoftirqd` took is reported beside it).
//!
//! Each phase reports the rate asked for, what was sent per second, the generator's CPU per
//! datagram sent and how busy it kept its core; a phase passes when it sent ≥ 97 % of the rate.

#[cfg(feature = "kernel")]
use std::net::{SocketAddr, UdpSocket};

#[cfg(any(feature = "kernel", test))]
use serde_json::json;

#[cfg(any(feature = "kernel", test))]
use crate::engine::Phase;
#[cfg(feature = "kernel")]
use crate::{
    engine::Engine,
    relay::{direct_lanes, ladder, Meter, RelayOpts},
};

/// The phase's figures as one JSON object (kind `sink`, or `search` in the bisection).
#[cfg(any(feature = "kernel", test))]
fn phase_json(
    kind: &str,
    p: &Phase,
    cpu: serde_json::Map<String, serde_json::Value>,
) -> serde_json::Value {
    let get = |k: &str| cpu.get(k).and_then(serde_json::Value::as_f64);
    let generator = get("generator");
    let softirq = get("softirq");
    let per = |s: f64| (p.sent > 0).then(|| s * 1e6 / p.sent as f64);
    json!({
        "kind": kind,
        "rate": p.rate,
        "offered": (p.offered * 10.0).round() / 10.0,
        "duration_s": (p.secs * 1000.0).round() / 1000.0,
        "sent": p.sent,
        "send_errors": p.send_errors,
        "cpu_s": cpu,
        "generator_us_per_datagram": generator.and_then(per),
        "generator_and_softirq_us_per_datagram": generator.zip(softirq).and_then(|(g, s)| per(g + s)),
        "generator_busy": generator.map(|g| g / p.secs.max(1e-9)),
    })
}

/// A sink phase passes when the generator sent ≥ 97 % of the rate.
#[cfg(any(feature = "kernel", test))]
fn offered(p: &Phase) -> bool {
    p.offered >= 0.97 * p.rate
}

/// Attaches the drop, runs every rate, then the search; one JSON object per phase, then the
/// summary (the highest rate offered).
#[cfg(feature = "kernel")]
pub(crate) fn run(o: &RelayOpts, iface: &str) -> anyhow::Result<()> {
    // The port stays bound (so nothing else takes it) and never receives: tc drops first.
    let hold = UdpSocket::bind(("127.0.0.1", 0))?;
    let port = hold.local_addr()?.port();
    let _drop = lastcall_turn_kernel::Reflector::attach_drop(iface, port)?;
    let peer = SocketAddr::from(([127, 0, 0, 1], port));
    let lanes = direct_lanes(o.clients, peer)?;
    eprintln!(
        "turnload: {} lanes to {peer}, dropped at {iface} ingress",
        lanes.len()
    );
    let meter = Meter::new(&o.cpu, None);
    let mut engine = Engine::new(lanes, o.size)?.without_echoes();
    let (best, worst) = ladder(&o.rates, o.search_steps, |rate, search| {
        let before = meter.read();
        let p = engine.phase(rate, o.duration);
        let after = meter.read();
        let cpu = meter.delta(&before, &after);
        let j = phase_json(if search { "search" } else { "sink" }, &p, cpu);
        eprintln!(
            "turnload: sink rate {:.0}/s sent {:.0}/s ({} refused) generator {:?} us/datagram, busy {:?}",
            p.rate, p.offered, p.send_errors, j["generator_us_per_datagram"], j["generator_busy"]
        );
        println!("{j}");
        offered(&p)
    });
    println!(
        "{}",
        json!({
            "kind": "summary",
            "mode": "sink",
            "max_rate_offered": best,
            "lowest_rate_not_offered": worst,
            "lanes": o.clients,
            "size": o.size,
        })
    );
    Ok(())
}

/// Without the `kernel` feature there is no tc program to drop the load.
#[cfg(not(feature = "kernel"))]
pub(crate) fn run(_o: &crate::relay::RelayOpts, _iface: &str) -> anyhow::Result<()> {
    anyhow::bail!("built without the `kernel` feature: no tc sink")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::Histogram;

    #[test]
    fn a_phase_passes_when_the_rate_was_sent() {
        let mut p = Phase {
            rate: 1000.0,
            offered: 980.0,
            sent: 9_800,
            hist: Histogram::default(),
            secs: 10.0,
            ..Phase::default()
        };
        assert!(offered(&p));
        p.offered = 960.0;
        assert!(!offered(&p));
        let mut cpu = serde_json::Map::new();
        cpu.insert("generator".into(), json!(0.0196));
        cpu.insert("softirq".into(), json!(0.0));
        let j = phase_json("sink", &p, cpu);
        assert_eq!(j["generator_us_per_datagram"], json!(2.0));
        assert_eq!(j["generator_busy"], json!(0.00196));
    }
}
