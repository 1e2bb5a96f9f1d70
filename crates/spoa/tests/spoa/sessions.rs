//! `/sessions` and `lastcall-spoa sessions` on the real agent: behind a real HAProxy the
//! list shows HAProxy's connections (peer, age, NOTIFYs, in flight, held for DOWN) and
//! ending one says AGENT-DISCONNECT as the deadline does (HAProxy opens another; requests
//! keep passing); during a drain, a connection that would hold it to its deadline (a frame
//! half-sent) is listed, and ending it ends the drain at once; an evaluation still running
//! is in flight.

use std::process::Output;
use std::time::{Duration, Instant};

use lastcall_testkit::{try_http, wait_until, Signal};
use serde_json::Value;

use lastcall_spop_proto::frame;
use spop::TypedData;

use crate::support::spop::{request, Raw, HEADERS};
use crate::support::{agent_command, http, Agent, Stack, StackOptions, WAIT};

fn sessions(admin: std::net::SocketAddr) -> Value {
    let (code, body) = try_http(admin, "GET", "/sessions", None).unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn list(page: &Value) -> Vec<Value> {
    page["sessions"].as_array().unwrap().clone()
}

/// `lastcall-spoa sessions ARGS` against `admin`.
fn command(admin: std::net::SocketAddr, args: &[&str]) -> Output {
    let out = agent_command()
        .arg("sessions")
        .arg(format!("--admin-addr={admin}"))
        .args(args)
        .env_remove("LASTCALL_ADMIN_TOKEN")
        .output()
        .unwrap();
    println!(
        "$ lastcall-spoa sessions {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn requests(stack: &Stack, n: usize) {
    for i in 0..n {
        let r = http(stack.http(), "GET", &format!("/s/{i}"), &[], b"").unwrap();
        assert_eq!(r.status, 200, "request {i}");
    }
}

#[test]
fn haproxys_connections_are_listed_and_one_is_ended() {
    let stack = Stack::start(StackOptions {
        agents: 1,
        ..StackOptions::default()
    });
    let agent = &stack.agents[0];
    wait_until("HAProxy has the agent UP", WAIT, || {
        (stack.haproxy.agent_server_status("spoa1") == "UP").then_some(())
    });
    requests(&stack, 30);
    let page = sessions(agent.admin);
    println!(
        "GET /sessions\n{}",
        serde_json::to_string_pretty(&page).unwrap()
    );
    let conns = list(&page);
    assert!(!conns.is_empty());
    assert_eq!(page["total"].as_u64(), Some(conns.len() as u64));
    let notifies: u64 = conns.iter().map(|c| c["notifies"].as_u64().unwrap()).sum();
    assert!(notifies >= 30, "{page}");
    for c in &conns {
        assert!(c["peer"].as_str().unwrap().starts_with("127.0.0.1:"), "{c}");
        assert!(c["age_seconds"].as_f64().unwrap() >= 0.0, "{c}");
        assert!(c["in_flight"].as_u64().is_some(), "{c}");
        // HAProxy checks the agent and has it UP: its connections hold the drain.
        assert_eq!(c["held_for_down"], true, "{c}");
    }
    let out = command(agent.admin, &[]);
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.starts_with("ID  PEER"), "{table}");
    assert!(
        table.contains(&format!(
            "{} of {} session(s) shown",
            conns.len(),
            conns.len()
        )),
        "{table}"
    );

    let id = conns[0]["id"].as_u64().unwrap();
    let (code, body) = try_http(agent.admin, "DELETE", &format!("/sessions/{id}"), None).unwrap();
    assert_eq!(code, 200, "{body}");
    agent
        .pod
        .wait_for_log("ended by the operator (DELETE /sessions)", WAIT);
    wait_until("the ended connection gone from the list", WAIT, || {
        (!list(&sessions(agent.admin)).iter().any(|c| c["id"] == id)).then_some(())
    });
    assert_eq!(agent.metric("lastcall_sessions_ended_total"), 1.0);
    let (code, body) = try_http(agent.admin, "DELETE", &format!("/sessions/{id}"), None).unwrap();
    assert_eq!((code, body.as_str()), (404, &*format!("no session {id}\n")));
    let (code, _) = try_http(agent.admin, "DELETE", "/sessions?user=x", None).unwrap();
    assert_eq!(code, 400, "the agent's sessions have no user");
    // HAProxy places its next messages on another connection.
    requests(&stack, 30);
}

#[test]
fn a_drain_held_by_a_listed_connection_ends_when_it_is_ended() {
    let mut agent = Agent::start(None, &["--shutdown-delay", "0s", "--drain-timeout", "60s"]);
    let mut raw = Raw::connect(agent.addr, WAIT);
    raw.hello(16380);
    // Half a NOTIFY: the connection is not quiet, so the drain's goodbye waits for the rest.
    let notify = request(1, "/index.html", None, None);
    raw.send(&notify[..notify.len() / 2]).unwrap();
    let page = sessions(agent.admin);
    let conns = list(&page);
    assert_eq!(conns.len(), 1, "{page}");
    assert_eq!(conns[0]["peer"], raw.s.local_addr().unwrap().to_string());
    let id = conns[0]["id"].as_u64().unwrap();
    // No HAProxy checks this agent: once the HAProxies not heard from stop holding it
    // (2.5 s after it listens), only the connection holds the drain.
    wait_until("no hold for DOWN", WAIT, || {
        let c = list(&sessions(agent.admin)).pop()?;
        (c["held_for_down"] == false).then_some(())
    });

    agent.pod.signal(Signal::Term);
    wait_until("refusing", WAIT, || {
        let (_, body) = try_http(agent.admin, "GET", "/drain", None).ok()?;
        body.contains("\"phase\": \"refusing\"").then_some(())
    });
    let left = sessions(agent.admin);
    assert_eq!(list(&left).len(), 1, "the drain waits for it: {left}");
    let ended_at = Instant::now();
    let out = command(agent.admin, &["--end", &id.to_string()]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(raw.expect_disconnect(0), "ended by the operator");
    let exit = agent.pod.wait_exit(Duration::from_secs(30));
    println!(
        "exit {:?} {:.3} s after the end",
        exit.code,
        ended_at.elapsed().as_secs_f64()
    );
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(
        ended_at.elapsed() < Duration::from_secs(5),
        "{exit:?}: the drain went on after its last connection ended"
    );
}

/// `in_flight` counts an evaluation still running: a 512 KB hostile query for an application
/// without the engine's limits runs for minutes (its NOTIFY is answered at
/// `evaluation_timeout` with the error variable, and the evaluation goes on), and its
/// connection shows it until the evaluation ends.
#[test]
fn a_running_evaluation_is_in_flight() {
    let agent = Agent::start(Some(&crate::hostile::unlimited_app()), &[]);
    let mut c = Raw::connect(agent.addr, WAIT);
    c.hello(1 << 20);
    let msg = spop::frame::Message {
        name: "coraza-req".into(),
        args: vec![
            ("app".into(), TypedData::String("unlimited".into())),
            ("method".into(), TypedData::String("GET".into())),
            ("path".into(), TypedData::String("/search".into())),
            (
                "query".into(),
                TypedData::String(crate::hostile::hostile(512 * 1024)),
            ),
            ("version".into(), TypedData::String("1.1".into())),
            ("headers".into(), TypedData::String(HEADERS.into())),
        ],
    };
    let mut notify = Vec::new();
    frame::encode_notify(1, 1, &msg, &mut notify);
    c.send(&notify).unwrap();
    let conn = wait_until("the evaluation in flight", WAIT, || {
        list(&sessions(agent.admin))
            .into_iter()
            .find(|s| s["in_flight"] == 1)
    });
    println!("{conn}");
    assert_eq!(conn["notifies"], 1);
    assert_eq!(conn["peer"], c.s.local_addr().unwrap().to_string());
}
