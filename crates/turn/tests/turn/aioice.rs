//! aioice's TURN client (Python, PyPI: an independent stack, aiortc's) through
//! `lastcall-turn --kernel-relay`: it binds a channel before its first datagram to a peer and
//! sends unpadded ChannelData over UDP (it pads over TCP only); every datagram comes back
//! from `turnutils_peer`, and at least 99 % each way go through the kernel.
//!
//! The interpreter is `peers::python` (`LASTCALL_PYTHON`, else the one `scripts/test_python.sh`
//! installs `scripts/requirements.txt` for, aioice among them).

use std::path::Path;

use lastcall_testkit::peers;

use crate::common::{Peer, RestCredentials};
use crate::kernel::{kernel_turn, Share, Started};

const N: u64 = 500;

#[test]
fn aioice_call_takes_the_fast_path() {
    let has_aioice = peers::python()
        .args(["-c", "import aioice"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_aioice {
        assert!(
            std::env::var_os("CI").is_none(),
            "aioice is missing: scripts/test_python.sh --setup installs scripts/requirements.txt"
        );
        eprintln!("SKIP: no Python with aioice (bash scripts/test_python.sh --setup)");
        return;
    }
    let turn = match kernel_turn(&[]) {
        Started::Kernel(turn) => turn,
        Started::UserSpace(turn) => turn,
    };
    let kernel = turn.pod.has_log("kernel fast path on");
    let peer = Peer::start();
    let creds = RestCredentials::for_user("aioice");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/aioice_call.py");
    let before = Share::of(&turn);
    let out = peers::python()
        .arg(script)
        .args([&turn.port.to_string(), &peer.port.to_string()])
        .args([&creds.username, &creds.password, &N.to_string()])
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.trim();
    let got = line
        .split("\"got\": ")
        .nth(1)
        .and_then(|v| v.trim_end_matches('}').trim().parse::<u64>().ok());
    println!("FIGURES aioice: {line}");
    assert_eq!(got, Some(N), "{line}");
    if kernel {
        let channels = turn
            .metric("lastcall_turn_kernel_framed_total{kind=\"send_indication\"}")
            .unwrap_or(0.0);
        assert_eq!(channels, 0.0, "aioice sent Send indications");
        before
            .until(&Share::of(&turn))
            .assert_kernel(0.99, N as f64, "aioice");
    }
}
