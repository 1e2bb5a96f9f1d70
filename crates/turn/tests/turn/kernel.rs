//! `--kernel-relay`: the kernel fast path on real processes. coturn's uclient (Debian 12's
//! 4.6.1, or 4.18 from the peers matrix: `LASTCALL_UCLIENT`) with every flag set the tests
//! use, over IPv4 and IPv6, and our own client relay through it: at least 99 % of their data
//! each way is relayed in the kernel, by the kernel's counters; a peer without a permission
//! is still dropped (by the daemon); a binding that expires stops relaying; a drain with
//! calls on the fast path loses nothing and ends at the last allocation. The browsers' and
//! aioice's shares are in `chromium`, `firefox` and `aioice`.
//!
//! uclient's runs are made in a private network namespace whose loopback puts every datagram
//! on the "wire" one by one (`gso_max_segs 1`), as a network interface does: coturn 4.18's
//! uclient batches its datagrams with UDP GSO, and a GSO batch from a sender on the same host
//! reaches the program as one packet, which no tc helper can split (it goes to the daemon,
//! counted as `handed_on{reason="gso"}`: 636 of about 3,000 packets of `-m 10 -n 300 -l 120
//! -z 1` on plain loopback, against none with the namespace's setting; docs/benchmarks.md).
//!
//! In a build without the `kernel-relay` feature (or where the kernel refuses the program
//! and this is not CI) the option must say so in one log line and relay in user space:
//! that is checked instead.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use lastcall_testkit::turn::TurnClient;
use lastcall_testkit::Signal;

use crate::common::{Peer, Report, Turn, Uclient, SECRET, WAIT};

const ON: &str = "kernel fast path on";
const OFF: &str = "the kernel fast path is off";

/// A `lastcall-turn --kernel-relay`, and whether its fast path runs.
pub(crate) enum Started {
    /// The fast path runs.
    Kernel(Turn),
    /// It said why not and relays in user space.
    UserSpace(Turn),
}

/// `lastcall-turn --kernel-relay EXTRA`; where the fast path does not run, checks that it
/// said why in one line (and, in a build with the feature, that this is neither root nor
/// CI).
pub(crate) fn kernel_turn(extra: &[&str]) -> Started {
    let mut args = vec!["--kernel-relay"];
    args.extend(extra);
    let turn = Turn::start(&args);
    if fast_path_runs(&turn) {
        Started::Kernel(turn)
    } else {
        Started::UserSpace(turn)
    }
}

/// Whether the fast path of `turn` (started with `--kernel-relay`) runs; where it does not,
/// checks that it said why in one line, and that it may not run here (a build without the
/// feature, or neither root nor CI).
pub(crate) fn fast_path_runs(turn: &Turn) -> bool {
    if turn.pod.has_log(ON) {
        return true;
    }
    let why: Vec<String> = turn
        .pod
        .logs()
        .into_iter()
        .filter(|l| l.contains(OFF))
        .collect();
    assert_eq!(why.len(), 1, "one line says why: {:?}", turn.pod.logs());
    if cfg!(feature = "kernel-relay") {
        assert!(
            std::env::var_os("CI").is_none() && !is_root(),
            "the fast path must run as root and in CI: {why:?}"
        );
        eprintln!("SKIP: {}", why[0]);
    } else {
        assert!(why[0].contains("kernel-relay` feature"), "{why:?}");
    }
    false
}

fn datagrams_read(turn: &Turn) -> f64 {
    lastcall_testkit::metrics::scrape(&turn.admin)
        .lines()
        .filter(|l| l.starts_with("lastcall_turn_udp_worker_datagrams_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What the kernel relayed, each way, against all that was relayed (the live traffic
/// counters include the kernel's): client to peer, then peer to client.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Share {
    pub kernel_to_peer: f64,
    pub all_to_peer: f64,
    pub kernel_to_client: f64,
    pub all_to_client: f64,
}

/// Datagrams each way a browser call carries, at least, while its test looks: the page sends
/// a data-channel message every 20 ms, but SCTP bundles messages sent while a packet waits
/// (under load one datagram carried 2-3 of them: 56 datagrams for about 127 messages, seen
/// with Firefox in CI), so the floor is a count of datagrams, not of messages.
pub(crate) const BROWSER_DATAGRAMS: f64 = 20.0;

impl Share {
    /// The four counters from one scrape: read apart, datagrams relayed between the reads
    /// would count on one side only (a call of 80 datagrams showed 98.8 % and 102.5 %).
    pub(crate) fn of(turn: &Turn) -> Share {
        let text = lastcall_testkit::metrics::scrape(&turn.admin);
        let m = |s: &str| lastcall_testkit::metrics::value(&text, s).unwrap_or(0.0);
        let k = |d: &str| {
            m(&format!(
                "lastcall_turn_kernel_relayed_packets_total{{direction=\"{d}\"}}"
            ))
        };
        Share {
            kernel_to_peer: k("to_peer"),
            all_to_peer: m("turn_traffic_peer_sentp{realm=\"example.org\"}"),
            kernel_to_client: k("to_client"),
            all_to_client: m("turn_traffic_peer_rcvp{realm=\"example.org\"}"),
        }
    }

    /// What was relayed between `self` (earlier) and `later`.
    pub(crate) fn until(&self, later: &Share) -> Share {
        Share {
            kernel_to_peer: later.kernel_to_peer - self.kernel_to_peer,
            all_to_peer: later.all_to_peer - self.all_to_peer,
            kernel_to_client: later.kernel_to_client - self.kernel_to_client,
            all_to_client: later.all_to_client - self.all_to_client,
        }
    }

    /// Asserts that at least `min` of `at_least` datagrams each way went through the kernel.
    pub(crate) fn assert_kernel(&self, min: f64, at_least: f64, what: &str) {
        println!(
            "FIGURES kernel share {what}: to peers {}/{} ({:.2} %), to clients {}/{} ({:.2} %)",
            self.kernel_to_peer,
            self.all_to_peer,
            100.0 * self.kernel_to_peer / self.all_to_peer.max(1.0),
            self.kernel_to_client,
            self.all_to_client,
            100.0 * self.kernel_to_client / self.all_to_client.max(1.0),
        );
        assert!(
            self.all_to_peer >= at_least && self.all_to_client >= at_least,
            "{what}: too little relayed: {self:?}"
        );
        assert!(
            self.kernel_to_peer >= min * self.all_to_peer
                && self.kernel_to_client >= min * self.all_to_client,
            "{what}: the kernel relayed less than {:.0} %: {self:?}",
            100.0 * min
        );
    }
}

/// Runs `f` on a thread moved into a network namespace of its own whose loopback sends every
/// datagram alone (`gso_max_segs 1`: a same-host GSO batch is segmented before it reaches the
/// program, as a NIC segments it before the wire); every process `f` starts lives there.
/// `false`: no namespace here (not root, not CI).
pub(crate) fn in_wire_like_namespace(f: impl FnOnce() + Send + 'static) -> bool {
    let t = std::thread::spawn(move || {
        if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
            assert!(std::env::var_os("CI").is_none(), "unshare: {e}");
            eprintln!("SKIP: no new network namespace here (needs root): {e}");
            return false;
        }
        for args in [
            &["link", "set", "lo", "up"][..],
            &["link", "set", "lo", "gso_max_segs", "1"],
        ] {
            let s = std::process::Command::new("ip")
                .args(args)
                .status()
                .expect("run ip");
            assert!(s.success(), "ip {args:?}: {s}");
        }
        f();
        true
    });
    match t.join() {
        Ok(ran) => ran,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn kernel(turn: &Turn, direction: &str) -> f64 {
    turn.metric(&format!(
        "lastcall_turn_kernel_relayed_packets_total{{direction=\"{direction}\"}}"
    ))
    .unwrap_or(0.0)
}

/// Where the fast path cannot run, `--kernel-relay` relays in user space (after its one
/// log line); where it can, the same without the option.
#[test]
fn without_the_fast_path_uclient_relays_in_user_space() {
    let turn = match kernel_turn(&[]) {
        Started::Kernel(_) => Turn::start(&[]),
        Started::UserSpace(turn) => turn,
    };
    let peer = Peer::start();
    let r = Uclient::call(turn.port, peer.port, "alice")
        .flags(&["-g", "-c"])
        .messages(20)
        .clients(2)
        .gap_ms(5)
        .run(Duration::from_secs(60));
    r.assert_all_echoed(40);
    assert_eq!(
        turn.metric("lastcall_turn_kernel_routes"),
        None,
        "no fast path here"
    );
}

/// coturn's uclient with every flag set the tests use, all at once on one server: each run
/// echoes every message, and at least 99 % of all their datagrams each way go through the
/// kernel (every set is more than 1 % of the whole; the Allocates, permissions, bindings and
/// refreshes are the daemon's): ChannelData (`-c`), RTP and RTCP pairs with EVEN-PORT, Send
/// indications (`-s`), client to client (`-y`: both ends are clients of this server, one pass
/// in the kernel), DONT-FRAGMENT (`-g`), padded ChannelData (`-D`, an odd length), and the
/// issue's load (`-m 10 -l 120 -z 1`: 4.18's sender threads).
#[test]
fn uclient_relays_through_the_kernel() {
    in_wire_like_namespace(|| {
        let Started::Kernel(turn) = kernel_turn(&[]) else {
            return;
        };
        let peer = Peer::start();
        let call = |flags: &[&str], n: u64, m: u64| {
            Uclient::call(turn.port, peer.port, "alice")
                .flags(flags)
                .messages(n)
                .clients(m)
                .gap_ms(2)
        };
        let runs: [(&str, Uclient, u64); 7] = [
            ("channels -g -c", call(&["-g", "-c"], 200, 2), 1),
            ("RTP+RTCP -g", call(&["-g"], 100, 2), 1),
            ("Send indications -s -c", call(&["-s", "-c"], 150, 2), 1),
            ("client to client -y -c", call(&["-y", "-c"], 100, 2), 1),
            (
                "client to client -y -s -c",
                call(&["-y", "-s", "-c"], 100, 2),
                1,
            ),
            (
                "padded -D -c -l 101",
                call(&["-D", "-c"], 150, 2).length(101),
                1,
            ),
            (
                "the issue's load -m 10 -l 120 -z 1",
                call(&["-c"], 100, 10).length(120).gap_ms(1),
                1,
            ),
        ];
        let read0 = datagrams_read(&turn);
        let before = Share::of(&turn);
        // All at once (each run is its own clients): the server sees them together, and the
        // test takes the time of one.
        let running: Vec<_> = runs
            .into_iter()
            .map(|(what, run, legs)| {
                let expected = run.total() * legs;
                (what, expected, run.spawn(Duration::from_secs(120)))
            })
            .collect();
        let mut total = 0;
        for (what, expected, t) in running {
            let r: Report = t.join().expect("uclient thread");
            println!(
                "FIGURES uclient {what}: sent {} received {}",
                r.send_msgs, r.recv_msgs
            );
            r.assert_all_echoed(expected);
            total += expected;
        }
        // Every flag set is more than 1 % of the whole: one that left the kernel would show.
        before.until(&Share::of(&turn)).assert_kernel(
            0.99,
            total as f64,
            "uclient, every flag set",
        );
        // The daemon read the Allocates, permissions, bindings and refreshes only.
        let read = datagrams_read(&turn) - read0;
        assert!(
            read < (total / 5) as f64,
            "the daemon read {read} datagrams"
        );
        let padded = turn
            .metric("lastcall_turn_kernel_framed_total{kind=\"padded\"}")
            .unwrap_or(0.0);
        assert!(padded >= 150.0, "padded ChannelData relayed {padded}");
    });
}

/// IPv6 allocations on the fast path: uclient over IPv6 with an IPv6 relay (`-x`), channels
/// and Send indications, at least 99 % of it in the kernel.
#[test]
fn ipv6_allocations_take_the_fast_path() {
    in_wire_like_namespace(|| {
        let Started::Kernel(turn) = kernel_turn(&["--listening-ip=::1", "--relay-ip=::1"]) else {
            return;
        };
        let peer = Peer::start_on("::1");
        for (what, flags) in [("IPv6 channels", &["-c"][..]), ("IPv6 Send", &["-s", "-c"])] {
            let run = Uclient::new(turn.port)
                .ipv6_relay()
                .flags(flags)
                .peer_at("::1", peer.port)
                .messages(150)
                .clients(2)
                .gap_ms(2)
                .rest("alice")
                .server("::1");
            let before = Share::of(&turn);
            run.run(Duration::from_secs(90))
                .assert_all_echoed(run.total());
            before
                .until(&Share::of(&turn))
                .assert_kernel(0.99, run.total() as f64, what);
        }
    });
}

/// Our client: a call relayed by the kernel; a peer without a permission (another IP) is
/// dropped by the daemon and reaches nobody; a permitted IP on another port (no channel)
/// is the daemon's to relay; when the binding expires the kernel stops relaying.
#[test]
fn permissions_and_expiry_hold_on_the_fast_path() {
    let Started::Kernel(turn) = kernel_turn(&["--channel-lifetime=3", "--permission-lifetime=3"])
    else {
        return;
    };
    let peer = Peer::start();
    let server: SocketAddr = format!("127.0.0.1:{}", turn.port).parse().unwrap();
    let mut c = TurnClient::new(server, SECRET, "alice");
    let peer_addr: SocketAddr = format!("127.0.0.1:{}", peer.port).parse().unwrap();
    let relayed = c.call(peer_addr, 0x4001).expect("call");
    let read0 = datagrams_read(&turn);
    c.stream(Duration::from_millis(2));
    c.wait_received(200, WAIT);
    assert!(kernel(&turn, "to_client") >= 200.0);
    // The operator's list says so (`/sessions`: what the kernel relays is not in its counts).
    let (_, body) = lastcall_testkit::try_http(&turn.admin, "GET", "/sessions", None).unwrap();
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["sessions"][0]["kernel"], true, "{page}");
    assert_eq!(
        page["sessions"][0]["relayed"][0],
        relayed.to_string(),
        "{page}"
    );
    // A peer on 127.0.0.2 has no permission: dropped by the daemon, not relayed.
    let stranger = UdpSocket::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    let dropped0 = turn
        .metric("lastcall_turn_peer_dropped_total")
        .unwrap_or(0.0);
    stranger
        .send_to(b"LCTT\0\0\0\0\0\0\0\x01no permission", relayed)
        .expect("send");
    turn.wait_metric_at_least("lastcall_turn_peer_dropped_total", dropped0 + 1.0);
    // While streaming the daemon read almost nothing (the stranger's datagram, a refresh).
    let read = datagrams_read(&turn) - read0;
    assert!(
        read < 20.0,
        "the daemon read {read} datagrams while the kernel relayed"
    );
    // Stop refreshing: within 3 s the route expires and the kernel hands the datagrams to
    // the daemon, which drops them (the channel and permission expired).
    turn.wait_metric_at_least(
        "lastcall_turn_kernel_handed_on_total{reason=\"expired\"}",
        1.0,
    );
    let dropped = turn
        .metric("lastcall_turn_client_data_dropped_total")
        .unwrap_or(0.0);
    turn.wait_metric_at_least("lastcall_turn_client_data_dropped_total", dropped + 10.0);
    let received = c.received();
    let relayed_before = kernel(&turn, "to_peer");
    turn.wait_metric_at_least("lastcall_turn_client_data_dropped_total", dropped + 50.0);
    assert_eq!(
        kernel(&turn, "to_peer"),
        relayed_before,
        "an expired route relayed"
    );
    assert!(
        c.received() <= received + 2,
        "echoes after the binding expired"
    );
    c.stop_stream(Duration::from_millis(200));
}

/// SIGTERM while calls stream through the kernel: nothing lost, none reclaimed as idle (the
/// kernel's counters tell the core they are not), the process waits for the last allocation
/// and exits when it is deleted.
#[test]
fn a_drain_with_calls_on_the_fast_path_loses_nothing_and_ends_at_the_last_allocation() {
    // A short idle reclaim: calls whose datagrams only the kernel sees must not look idle.
    let Started::Kernel(mut turn) = kernel_turn(&[
        "--shutdown-delay=0s",
        "--drain-timeout=60s",
        "--drain-idle-timeout=2s",
    ]) else {
        return;
    };
    let peer = Peer::start();
    let server: SocketAddr = format!("127.0.0.1:{}", turn.port).parse().unwrap();
    let peer_addr: SocketAddr = format!("127.0.0.1:{}", peer.port).parse().unwrap();
    let mut calls: Vec<TurnClient> = (0..3)
        .map(|i| {
            let mut c = TurnClient::new(server, SECRET, "alice");
            c.call(peer_addr, 0x4001 + i).expect("call");
            c.stream(Duration::from_millis(5));
            c
        })
        .collect();
    for c in &calls {
        c.wait_received(50, WAIT);
    }
    let kernel_before = kernel(&turn, "to_client");
    turn.pod.signal(Signal::Term);
    let mark = turn.pod.log_len();
    // 4 s of streaming (800 datagrams at 5 ms), twice the idle timeout: none reclaimed.
    for c in &calls {
        let n = c.received();
        c.wait_received(n + 800, WAIT);
    }
    assert!(
        kernel(&turn, "to_client") >= kernel_before + 300.0,
        "calls left the kernel"
    );
    assert!(turn.pod.is_running(), "exited with calls up");
    let last = calls.len() - 1;
    for (i, c) in calls.iter_mut().enumerate() {
        c.stop_stream(Duration::from_millis(500));
        let at = Instant::now();
        assert_eq!(c.split(at).lost(), 0, "call {i} lost datagrams");
        if i < last {
            c.refresh(0).expect("delete");
            assert!(turn.pod.is_running(), "exited before the last allocation");
        }
    }
    calls[last].refresh(0).expect("delete the last");
    let exit = turn.pod.wait_exit(WAIT);
    assert_eq!(exit.code, Some(0), "{:?}", turn.pod.logs().get(mark..));
}

/// Whether this process runs as root.
fn is_root() -> bool {
    lastcall_testkit::procfs::euid() == 0
}
