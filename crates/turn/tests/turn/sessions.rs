//! `/sessions` and `lastcall-turn sessions` on the real process, with real clients: our UDP
//! client in a call through coturn's echo peer, a second one without traffic, and coturn's
//! `turnutils_uclient` over TCP. The list shows each with its user, addresses, transport
//! and the traffic it relayed; ending one by id or by user deletes it as the deadline would
//! (the client's Refresh gets 437, uclient's connection is closed), counted and logged;
//! during a drain the list shows who is left (uclient's call included, ended there), and
//! ending the last ends the drain at once.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use lastcall_testkit::turn::{TurnClient, TurnError, PAYLOAD};
use lastcall_testkit::{try_http, wait_until, Signal};
use serde_json::Value;

use crate::common::{Peer, Turn, Uclient, SECRET, WAIT};

fn sessions(admin: &str, query: &str) -> Value {
    let (code, body) = try_http(admin, "GET", &format!("/sessions{query}"), None).unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The listed allocations whose REST username is `*:user`.
fn of_user<'a>(page: &'a Value, user: &str) -> Vec<&'a Value> {
    page["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["user"].as_str().unwrap().ends_with(&format!(":{user}")))
        .collect()
}

/// `lastcall-turn sessions ARGS` against the daemon's admin listener; stdout and status.
fn command(admin: &str, args: &[&str]) -> (String, Option<i32>) {
    let out = Command::new(env!("CARGO_BIN_EXE_lastcall-turn"))
        .arg("sessions")
        .arg(format!("--admin-addr={admin}"))
        .args(args)
        .env_remove("LASTCALL_ADMIN_TOKEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    println!(
        "$ lastcall-turn sessions {}\n{text}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    (text, out.status.code())
}

#[test]
fn sessions_of_real_clients_are_listed_and_ended_during_a_drain() {
    let mut turn = Turn::start(&["--shutdown-delay=0s", "--drain-timeout=300s"]);
    let admin = turn.admin.clone();
    let server = SocketAddr::from(([127, 0, 0, 1], turn.port));
    let peer = Peer::start();
    let peer_addr = SocketAddr::from(([127, 0, 0, 1], peer.port));

    // alice: a call, 50 datagrams each way.
    let mut alice = TurnClient::new(server, SECRET, "alice");
    let alice_relay = alice.call(peer_addr, 0x4001).unwrap();
    alice.stream(Duration::from_millis(5));
    alice.wait_received(50, WAIT);
    alice.stop_stream(Duration::from_millis(500));
    let (sent, echoed) = (alice.sent(), alice.received());
    // bob: an allocation, nothing relayed.
    let mut bob = TurnClient::new(server, SECRET, "bob");
    let bob_relay = bob.allocate(600).unwrap();
    // carol: uclient over TCP (no RTCP allocation), a message every 20 ms for 10 s.
    let carol = Uclient::call(turn.port, peer.port, "carol")
        .flags(&["-t", "-c"])
        .messages(500)
        .gap_ms(20)
        .spawn(Duration::from_secs(30));

    let page = wait_until("carol's TCP allocation listed, relaying", WAIT, || {
        let page = sessions(&admin, "");
        let relaying = of_user(&page, "carol")
            .first()
            .is_some_and(|c| c["to_peer_datagrams"].as_u64() >= Some(20));
        relaying.then_some(page)
    });
    println!(
        "GET /sessions\n{}",
        serde_json::to_string_pretty(&page).unwrap()
    );
    let (_, raw) = try_http(&admin, "GET", "/sessions", None).unwrap();
    println!("FIGURES a page of 3 allocations: {} bytes", raw.len());
    assert_eq!(page["total"], 3);
    assert_eq!(page["next"], Value::Null);
    let a = of_user(&page, "alice")[0];
    assert_eq!(a["transport"], "udp");
    assert_eq!(a["realm"], "example.org");
    assert_eq!(a["listener"], server.to_string());
    assert_eq!(a["relayed"], serde_json::json!([alice_relay.to_string()]));
    assert_eq!(
        (a["channels"].as_u64(), a["permissions"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(a["to_peer_datagrams"].as_u64(), Some(sent), "{a}");
    assert_eq!(
        a["to_peer_bytes"].as_u64(),
        Some(sent * PAYLOAD as u64),
        "{a}"
    );
    // Every echo that reached alice was relayed; one may still be on its way.
    let back = a["from_peer_datagrams"].as_u64().unwrap();
    assert!(back >= echoed && back <= sent, "{a}: {echoed} echoed");
    assert_eq!(
        a["from_peer_bytes"].as_u64(),
        Some(back * PAYLOAD as u64),
        "{a}"
    );
    assert_eq!(a["kernel"], false);
    let b = of_user(&page, "bob")[0];
    assert_eq!(b["relayed"], serde_json::json!([bob_relay.to_string()]));
    assert_eq!(b["to_peer_datagrams"], 0);
    assert!(a["id"].as_u64() < b["id"].as_u64(), "oldest first");
    let c = of_user(&page, "carol")[0];
    assert_eq!(c["transport"], "tcp");
    assert_eq!(c["listener"], server.to_string());
    let (to, from) = (
        c["to_peer_datagrams"].as_u64(),
        c["from_peer_datagrams"].as_u64(),
    );
    assert!(from > Some(0) && from <= to, "{c}");

    // Paging: one at a time, in id order, to the end.
    let first = sessions(&admin, "?limit=1");
    assert_eq!(first["sessions"][0]["id"], a["id"]);
    let second = sessions(&admin, &format!("?limit=1&after={}", first["next"]));
    assert_eq!(second["sessions"][0]["id"], b["id"]);
    let third = sessions(&admin, &format!("?limit=1&after={}", second["next"]));
    assert_eq!(third["next"], Value::Null);
    let (code, body) = try_http(&admin, "GET", "/sessions?limit=0", None).unwrap();
    assert_eq!(
        (code, body.as_str()),
        (
            400,
            "limit: `0` is not valid; give 1 to 1000 (default 100)\n"
        )
    );

    // The command's table.
    let (table, status) = command(&admin, &[]);
    assert_eq!(status, Some(0));
    assert!(table.starts_with("ID "), "{table}");
    assert!(table.contains(&alice_relay.to_string()), "{table}");
    assert!(
        table.contains(&format!("{sent}/{}B", sent * PAYLOAD as u64)),
        "{table}"
    );
    assert!(table.contains("3 of 3 session(s) shown"), "{table}");

    // The drain waits for all three (existing allocations keep relaying); the list says so.
    turn.pod.signal(Signal::Term);
    lastcall_testkit::wait_for("refusing", WAIT, || {
        try_http(&admin, "GET", "/drain", None)
            .is_ok_and(|(_, b)| b.contains("\"phase\": \"refusing\""))
    });
    let draining = sessions(&admin, "");
    assert_eq!(draining["total"], 3, "{draining}");

    // carol, by user, while uclient talks: its connection is closed, its calls stop.
    let carol_user = c["user"].as_str().unwrap();
    let (code, body) = try_http(
        &admin,
        "DELETE",
        &format!("/sessions?user={}", carol_user.replace(':', "%3A")),
        None,
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let ended: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ended["ended"][0]["id"], c["id"]);
    turn.pod
        .wait_for_log("allocation ended by the operator (DELETE /sessions)", WAIT);
    let report = carol.join().unwrap();
    println!(
        "uclient: sent {} received {} in {:?} (status {:?})",
        report.send_msgs, report.recv_msgs, report.elapsed, report.status
    );
    assert!(report.recv_msgs >= 20, "{}", report.output);
    assert!(
        report.recv_msgs < 500,
        "uclient got every echo:\n{}",
        report.output
    );

    let left = sessions(&admin, "");
    assert_eq!(left["total"], 2, "{left}");
    // bob by id, with the command: ended as the deadline would; his Refresh finds nothing.
    let (out, status) = command(&admin, &["--end", &b["id"].to_string(), "--json"]);
    assert_eq!(status, Some(0));
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["ended"][0]["id"], b["id"]);
    assert!(
        matches!(bob.refresh(600), Err(TurnError::Code { code: 437, .. })),
        "bob's allocation is gone"
    );
    let (_, status) = command(&admin, &["--end", &b["id"].to_string()]);
    assert_eq!(status, Some(1), "a second end finds no session");
    assert_eq!(turn.metric("lastcall_sessions_ended_total"), Some(2.0));
    // alice is the last: ending her ends the drain at once, not at its deadline.
    let ended_at = Instant::now();
    let (code, _) = try_http(&admin, "DELETE", &format!("/sessions/{}", a["id"]), None).unwrap();
    assert_eq!(code, 200);
    let exit = turn.pod.wait_exit(Duration::from_secs(30));
    println!(
        "exit {:?} {:.3} s after the last DELETE",
        exit.code,
        ended_at.elapsed().as_secs_f64()
    );
    assert_eq!(exit.code, Some(0), "{exit:?}");
}

/// What a page costs on the real process with 10,000 allocations (one client socket each,
/// made by `drain_ends`' bulk allocator): the time of `GET /sessions` over HTTP and its size,
/// a page of 100 and of 1,000 and every page in turn, while a call streams through the same
/// server (its datagrams all come back: listing does not stall the data path). A
/// measurement, run on its own:
/// `cargo nextest run -p lastcall-turn --test turn --run-ignored only --no-capture a_page_of`.
#[test]
#[ignore = "measurement (10,000 allocations); run explicitly with --run-ignored"]
fn a_page_of_ten_thousand_allocations_is_fast_and_small() {
    const N: usize = 10_000;
    let hard = crate::drain_ends::raise_nofile();
    assert!(
        hard >= N as u64 + 1000,
        "needs {} open files (hard limit {hard})",
        N + 1000
    );
    let turn = Turn::start(&["--min-port=40000", "--max-port=65000"]);
    let admin = turn.admin.clone();
    let server = SocketAddr::from(([127, 0, 0, 1], turn.port));
    let socks = crate::drain_ends::bulk_allocate(server, N);
    let peer = Peer::start();
    let mut call = TurnClient::new(server, SECRET, "call");
    call.call(SocketAddr::from(([127, 0, 0, 1], peer.port)), 0x4001)
        .unwrap();
    call.stream(Duration::from_millis(5));
    let get = |query: &str| {
        let started = Instant::now();
        let (code, body) = try_http(&admin, "GET", &format!("/sessions{query}"), None).unwrap();
        assert_eq!(code, 200, "{body}");
        (started.elapsed(), body)
    };
    for limit in [100, 1000] {
        let runs = 20;
        let mut times: Vec<Duration> = (0..runs)
            .map(|_| get(&format!("?limit={limit}")).0)
            .collect();
        times.sort();
        let (_, body) = get(&format!("?limit={limit}"));
        let page: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(page["total"].as_u64(), Some(N as u64 + 1));
        assert_eq!(page["sessions"].as_array().unwrap().len(), limit);
        println!(
            "FIGURES GET /sessions?limit={limit} of {}: median {:.2} ms, max {:.2} ms, {} bytes",
            N + 1,
            times[runs / 2].as_secs_f64() * 1e3,
            times[runs - 1].as_secs_f64() * 1e3,
            body.len()
        );
    }
    let started = Instant::now();
    let (mut after, mut seen, mut pages) = (0u64, 0usize, 0);
    loop {
        let (_, body) = get(&format!("?limit=1000&after={after}"));
        let page: Value = serde_json::from_str(&body).unwrap();
        seen += page["sessions"].as_array().unwrap().len();
        pages += 1;
        match page["next"].as_u64() {
            Some(n) => after = n,
            None => break,
        }
    }
    assert_eq!(seen, N + 1);
    println!(
        "FIGURES every page of 1,000 ({pages}): {:.1} ms in all",
        started.elapsed().as_secs_f64() * 1e3
    );
    call.stop_stream(Duration::from_secs(1));
    println!(
        "FIGURES the call meanwhile: {} sent, {} echoed",
        call.sent(),
        call.received()
    );
    assert_eq!(call.received(), call.sent(), "the call lost datagrams");
    drop(socks);
}
