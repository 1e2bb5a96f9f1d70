//! Certificate renewal without a signal: the TLS files in a Secret-style volume (the
//! kubelet's atomic writer: a new timestamped directory, a `..data` symlink renamed over the
//! old one) are swapped during a TLS call by coturn's `turnutils_uclient`; the call goes on,
//! new TLS connections get the new certificate, and a swap to a pair that does not match
//! keeps the old one, with an error and one `lastcall_turn_tls_reload_failures_total`.

use std::time::Duration;

use crate::common::{self_signed, served_subject, Peer, Turn, Uclient, WAIT};
use lastcall_testkit::tls::SecretVolume;

const TLS_ALLOCATIONS: &str = "turn_total_allocations{type=\"TLS/TCP\"}";

fn pem(dir: &std::path::Path, cn: &str) -> (Vec<u8>, Vec<u8>) {
    let (c, k) = self_signed(dir, cn, cn);
    (std::fs::read(c).unwrap(), std::fs::read(k).unwrap())
}

#[test]
fn a_secret_volume_swap_during_a_tls_call_reloads_the_certificate_and_a_bad_pair_is_kept_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (c1, k1) = pem(dir.path(), "first.test");
    let (c2, k2) = pem(dir.path(), "second.test");
    let (c3, _) = pem(dir.path(), "third.test");
    let mut vol = SecretVolume::new(
        &dir.path().join("tls"),
        &[("tls.crt", &c1), ("tls.key", &k1)],
    );
    let tls_port = crate::common::free_udp_tcp_port();
    // As the chart mounts tls.existingSecret: cert and pkey are the volume's visible names.
    let turn = Turn::start(&[
        &format!("--tls-listening-port={tls_port}"),
        &format!("--cert={}", vol.path("tls.crt").display()),
        &format!("--pkey={}", vol.path("tls.key").display()),
    ]);
    turn.pod
        .wait_for_log("watching the TLS certificate and key for changes", WAIT);
    assert!(served_subject(tls_port).contains("first.test"));
    let peer = Peer::start();
    // A TLS call of 15 s (750 messages 20 ms apart), longer than the swaps and the settle
    // time of the bad pair.
    let call = Uclient::call(tls_port, peer.port, "tls-caller")
        .flags(&["-c", "-t", "-S"])
        .messages(750)
        .gap_ms(20);
    let expected = call.total();
    let call = call.spawn(Duration::from_secs(90));
    turn.wait_metric_at_least(TLS_ALLOCATIONS, 1.0);

    let mark = turn.pod.log_len();
    vol.update(&[("tls.crt", &c2), ("tls.key", &k2)]);
    turn.pod
        .wait_for_log_after(mark, "TLS certificate reloaded: the files changed", WAIT);
    assert!(
        served_subject(tls_port).contains("second.test"),
        "a new TLS connection still gets the old certificate"
    );
    assert_eq!(turn.metric("lastcall_turn_tls_reloads_total"), Some(1.0));

    // The next Secret holds a certificate and another's key: not loaded, the old one kept.
    let mark = turn.pod.log_len();
    vol.update(&[("tls.crt", &c3), ("tls.key", &k2)]);
    turn.wait_metric_at_least("lastcall_turn_tls_reload_failures_total", 1.0);
    turn.pod.wait_for_log_after(
        mark,
        "TLS certificate reload failed after the files changed, keeping the previous one",
        WAIT,
    );
    assert!(served_subject(tls_port).contains("second.test"));
    assert_eq!(
        turn.metric("lastcall_turn_tls_reload_failures_total"),
        Some(1.0)
    );
    assert_eq!(turn.metric("lastcall_turn_tls_reloads_total"), Some(1.0));
    assert!(
        turn.metric(TLS_ALLOCATIONS).unwrap_or(0.0) >= 1.0,
        "the call ended before the swaps were done: make it longer"
    );

    let report = call.join().expect("uclient thread");
    println!(
        "FIGURES cert_watch: TLS call {} sent, {} echoed across two Secret swaps",
        report.send_msgs, report.recv_msgs
    );
    report.assert_all_echoed(expected);
}
