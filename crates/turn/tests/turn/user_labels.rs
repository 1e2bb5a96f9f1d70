//! coturn's `prometheus-username-labels`: after real relayed exchanges through coturn's
//! `turnutils_peer`, `/metrics` has each user's packets and bytes both ways under coturn's
//! names and labels (`turn_traffic_*{realm,user}`, compared with a fixture of coturn's
//! exposition written from its source), and the limit holds: a user past
//! `prometheus-username-labels-max` is counted under `user="_overflow"`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::{Peer, RestCredentials, Turn, REALM};
use lastcall_testkit::metrics;
use lastcall_testkit::turn::{TurnClient, PAYLOAD};

/// The families of coturn's exposition (`# TYPE` lines) and, for each sample, its name and
/// label names in order.
fn shape(text: &str) -> (Vec<String>, Vec<(String, Vec<String>)>) {
    let types = text
        .lines()
        .filter(|l| l.starts_with("# TYPE "))
        .map(ToString::to_string)
        .collect();
    let samples = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let series = l.split_whitespace().next().unwrap_or_default();
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let names = labels
                .trim_end_matches('}')
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| kv.split('=').next().unwrap_or_default().to_string())
                .collect();
            (name.to_string(), names)
        })
        .collect();
    (types, samples)
}

/// A call of `user` that relayed until `n` echoes came back; returns it (its allocation
/// stays) and its username and datagram count each way.
fn exchange(turn: &Turn, peer: &Peer, user: &str, n: u64) -> (TurnClient, String, u64) {
    exchange_on(turn.port, peer, user, n)
}

fn exchange_on(port: u16, peer: &Peer, user: &str, n: u64) -> (TurnClient, String, u64) {
    let creds = RestCredentials::for_user(user);
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let mut c = TurnClient::long_term(server, &creds.username, &creds.password);
    c.call(SocketAddr::from(([127, 0, 0, 1], peer.port)), 0x4000)
        .expect("call");
    c.stream(Duration::from_millis(5));
    c.wait_received(n, crate::common::WAIT);
    c.stop_stream(Duration::from_millis(500));
    assert_eq!(c.sent(), c.received(), "{user}: every datagram echoed");
    let k = c.sent();
    (c, creds.username, k)
}

/// Every one of `user`'s eight counters in `text` is that of `k` datagrams each way.
fn assert_user(text: &str, user: &str, k: u64) {
    let (k, frame, payload) = (k as f64, (PAYLOAD + 4) as f64, PAYLOAD as f64);
    for (family, want) in [
        ("rcvp", k),
        ("rcvb", k * frame),
        ("sentp", k),
        ("sentb", k * frame),
        ("peer_rcvp", k),
        ("peer_rcvb", k * payload),
        ("peer_sentp", k),
        ("peer_sentb", k * payload),
    ] {
        let series = format!("turn_traffic_{family}{{realm=\"{REALM}\",user=\"{user}\"}}");
        assert_eq!(
            metrics::value(text, &series),
            Some(want),
            "{series}:\n{text}"
        );
    }
}

#[test]
fn per_user_traffic_has_coturns_names_and_labels_and_is_bounded() {
    let turn = Turn::start(&[
        "--prometheus-username-labels",
        "--prometheus-username-labels-max=2",
    ]);
    let peer = Peer::start();
    let (_alice, alice, a) = exchange(&turn, &peer, "alice", 12);
    let (_bob, bob, b) = exchange(&turn, &peer, "bob", 25);
    // A third user: past the limit of 2.
    let (_carol, _, c) = exchange(&turn, &peer, "carol", 7);
    let text = metrics::scrape(&turn.admin);

    // coturn's shape: every family and every sample's label names, in order.
    let (want_types, want_samples) = shape(include_str!("../data/coturn-username-labels.prom"));
    let (types, samples) = shape(&text);
    for t in &want_types {
        assert!(types.contains(t), "no `{t}`:\n{text}");
    }
    for (name, labels) in &want_samples {
        assert!(
            samples.iter().any(|(n, l)| n == name && l == labels),
            "no sample {name} labelled {labels:?}:\n{text}"
        );
    }
    // With the option, coturn's traffic families have no realm-only sample.
    assert!(
        !samples
            .iter()
            .any(|(n, l)| n.starts_with("turn_traffic_") && l == &["realm"]),
        "{text}"
    );

    for (user, k) in [(alice.as_str(), a), (bob.as_str(), b), ("_overflow", c)] {
        assert_user(&text, user, k);
    }
    println!("FIGURES user_labels: alice {a}, bob {b}, carol (overflow) {c} datagrams each way");
    assert_eq!(
        metrics::value(&text, "lastcall_turn_user_labels"),
        Some(2.0)
    );
    assert_eq!(
        metrics::value(&text, "lastcall_turn_user_labels_overflow_total"),
        Some(1.0)
    );
}

/// With the kernel fast path the routes' counts reach the users too: alice's call ends (its
/// routes removed) before any scrape, bob's is live at the scrape; each user's counters are
/// its whole exchange, most of it relayed by the kernel.
#[test]
fn kernel_relayed_traffic_reaches_each_user() {
    use crate::kernel::{kernel_turn, Started};
    let Started::Kernel(turn) = kernel_turn(&["--prometheus-username-labels"]) else {
        return;
    };
    let peer = Peer::start();
    let (mut alice_call, alice, a) = exchange(&turn, &peer, "alice", 200);
    alice_call.refresh(0).expect("delete alice's allocation");
    lastcall_testkit::wait_until("alice's routes removed", crate::common::WAIT, || {
        (turn.metric("lastcall_turn_kernel_routes") == Some(0.0)).then_some(())
    });
    let (_bob_call, bob, b) = exchange(&turn, &peer, "bob", 300);
    let text = metrics::scrape(&turn.admin);
    let kernel = metrics::value(
        &text,
        "lastcall_turn_kernel_relayed_packets_total{direction=\"to_peer\"}",
    )
    .unwrap_or(0.0);
    println!(
        "FIGURES user_labels kernel: alice {a}, bob {b}; {kernel} relayed to peers in the kernel"
    );
    assert!(
        kernel >= 0.9 * (a + b) as f64,
        "the kernel relayed {kernel} of {}",
        a + b
    );
    assert_user(&text, &alice, a);
    assert_user(&text, &bob, b);
}
