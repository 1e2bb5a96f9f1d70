//! Bodies larger than HAProxy's buffer (`tune.bufsize 1114112` in the documented file):
//! HAProxy hands the agent only what fits, without any error. The agent sees that the body
//! fills the frame and is shorter than declared, and applies `body_limit_action`: `reject`
//! (default) answers 413, `process_partial` inspects the part it got. Never a silent
//! fail-open.

use crate::support::{http, Stack, StackOptions};

fn form(size: usize, payload: &str, at_end: bool) -> Vec<u8> {
    let filler_len = size.saturating_sub(payload.len() + 16);
    let filler = "a".repeat(filler_len);
    let body = if at_end {
        format!("filler={filler}&text={payload}")
    } else {
        format!("text={payload}&filler={filler}")
    };
    body.into_bytes()
}

fn post(stack: &Stack, body: &[u8]) -> crate::support::Reply {
    http(
        stack.http(),
        "POST",
        "/upload",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        body,
    )
    .expect("POST")
}

#[test]
fn large_body_is_rejected_by_default_never_passed_unseen() {
    let stack = Stack::start(StackOptions {
        agents: 1,
        ..StackOptions::default()
    });
    // Fits in HAProxy's buffer: inspected whole, allowed.
    let small = post(&stack, &form(100 * 1024, "hello", false));
    assert_eq!(small.status, 200, "{}", small.text());

    // 2 MiB benign body: cut by HAProxy, so the agent cannot vouch for it: 413.
    let big = post(&stack, &form(2 * 1024 * 1024, "hello", false));
    assert_eq!(big.status, 413, "{}", big.text());

    // 2 MiB with an attack at the end (beyond what HAProxy forwards): still 413, not 200.
    let hidden = post(
        &stack,
        &form(2 * 1024 * 1024, "<script>alert(1)</script>", true),
    );
    assert_eq!(hidden.status, 413, "{}", hidden.text());

    let agent = &stack.agents[0];
    assert!(agent.metric("spoa_truncated_bodies_total{policy=\"reject\"}") >= 2.0);
    agent.pod.wait_for_log(
        "request body larger than HAProxy's buffer",
        crate::support::WAIT,
    );
}

#[test]
fn process_partial_inspects_the_part_received() {
    let config = "\
default_application: default
applications:
  - name: default
    body_limit_action: process_partial
";
    let stack = Stack::start(StackOptions {
        agent_config: Some(config.into()),
        agents: 1,
        slow_bodies: true,
        ..StackOptions::default()
    });
    let body = form(2 * 1024 * 1024, "hello", false);
    let big = post(&stack, &body);
    assert_eq!(big.status, 200, "{}", big.text());
    // The origin got the whole body.
    assert!(
        big.text().ends_with(&format!(" {}\n", body.len())),
        "{}",
        big.text()
    );

    // An attack in the part HAProxy forwards is still found.
    let early = post(
        &stack,
        &form(2 * 1024 * 1024, "<script>alert(1)</script>", false),
    );
    assert_eq!(early.status, 403, "{}", early.text());

    // An attack past the buffer passes: that is what process_partial means (documented).
    let late = post(
        &stack,
        &form(2 * 1024 * 1024, "<script>alert(1)</script>", true),
    );
    assert_eq!(late.status, 200, "{}", late.text());
    let agent = &stack.agents[0];
    assert!(agent.metric("spoa_truncated_bodies_total{policy=\"process_partial\"}") >= 3.0);
}
