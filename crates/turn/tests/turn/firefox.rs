//! Headless Firefox's own WebRTC stack (nICEr) through `lastcall-turn --kernel-relay`: the
//! page of `chromium` (two RTCPeerConnections, `iceTransportPolicy: "relay"`, a data channel
//! between them) over UDP. Firefox binds no channel: every datagram is a Send indication
//! (XOR-PEER-ADDRESS, DATA, FINGERPRINT) or a Data indication, and the kernel relays those
//! too; at least 99 % of the call's datagrams each way go through it, every message arrives.
//!
//! Firefox (`peers::firefox`, `LASTCALL_FIREFOX`; Debian's firefox-esr) runs as root with a
//! profile of its own whose prefs allow loopback candidates.

use std::process::{Child, Stdio};
use std::time::Duration;

use lastcall_testkit::peers;

use crate::chromium::{encode, Control};
use crate::common::{RestCredentials, WAIT};
use crate::kernel::{kernel_turn, Share, Started};

/// The profile's prefs: loopback candidates (the suite runs on loopback only), addresses
/// shown as they are, nothing phoned home.
const PREFS: &str = r#"
user_pref("media.peerconnection.ice.loopback", true);
user_pref("media.peerconnection.ice.obfuscate_host_addresses", false);
user_pref("media.peerconnection.ice.default_address_only", false);
user_pref("browser.shell.checkDefaultBrowser", false);
user_pref("datareporting.policy.dataSubmissionEnabled", false);
user_pref("toolkit.telemetry.reportingpolicy.firstRun", false);
user_pref("app.update.enabled", false);
user_pref("browser.startup.homepage_override.mstone", "ignore");
user_pref("network.proxy.type", 0);
"#;

/// Headless Firefox on the page, calling through `url` with REST credentials for `user`.
struct Firefox {
    child: Child,
    _profile: tempfile::TempDir,
}

impl Firefox {
    fn open(control: &Control, url: &str, user: &str) -> Firefox {
        let RestCredentials { username, password } = RestCredentials::for_user(user);
        let page = format!(
            "http://{}/page.html?url={}&u={}&p={}",
            control.addr,
            encode(url),
            encode(&username),
            encode(&password)
        );
        let profile = tempfile::tempdir().expect("profile dir");
        std::fs::write(profile.path().join("user.js"), PREFS).expect("prefs");
        let child = peers::firefox()
            .args(["--headless", "--no-remote", "--profile"])
            .arg(profile.path())
            .arg(page)
            .env("HOME", profile.path())
            .env("MOZ_HEADLESS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start firefox");
        Firefox {
            child,
            _profile: profile,
        }
    }
}

impl Drop for Firefox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn firefox_call_over_udp_takes_the_fast_path() {
    let turn = match kernel_turn(&[]) {
        Started::Kernel(turn) => turn,
        // Where the fast path cannot run the call still works, in user space.
        Started::UserSpace(turn) => turn,
    };
    let kernel = turn.pod.has_log("kernel fast path on");
    let control = Control::start();
    let url = format!("turn:127.0.0.1:{}?transport=udp", turn.port);
    let _firefox = Firefox::open(&control, &url, "firefox");
    let open = control.wait("open", Duration::from_secs(90), |_| true);
    let kinds = open.fields.get("kinds").cloned().unwrap_or_default();
    assert!(
        kinds.split(',').all(|k| k.starts_with("relay/")),
        "local candidates {kinds}"
    );
    let started = control.wait("progress", WAIT, |r| r.num("got") >= 25);
    // Its permissions are installed by now (Firefox sends only once it has them).
    let permitted = Share::of(&turn);
    control.wait("progress", WAIT, |r| {
        r.num("got") >= started.num("sent") + 100
    });
    control.order("close");
    let closing = control.wait("closing", WAIT, |_| true);
    let (sent, got) = (closing.num("sent"), closing.num("got"));
    let framed = |k: &str| {
        turn.metric(&format!(
            "lastcall_turn_kernel_framed_total{{kind=\"{k}\"}}"
        ))
        .unwrap_or(0.0)
    };
    let channels = turn.metric("lastcall_turn_kernel_routes").unwrap_or(0.0);
    println!(
        "FIGURES firefox udp: candidates {kinds}; sent {sent} got {got}; kernel routes {channels}, \
         send_indication {} data_indication {} padded {} hairpin {}",
        framed("send_indication"),
        framed("data_indication"),
        framed("padded"),
        framed("hairpin")
    );
    assert_eq!(got, sent, "messages lost");
    if kernel {
        permitted.until(&Share::of(&turn)).assert_kernel(
            0.99,
            crate::kernel::BROWSER_DATAGRAMS,
            "firefox udp",
        );
        assert!(
            framed("send_indication") > 0.0 && framed("data_indication") > 0.0,
            "Firefox's indications were not the kernel's"
        );
    }
}
