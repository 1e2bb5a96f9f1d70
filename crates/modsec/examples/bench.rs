//! CPU cost of one request through libmodsecurity + Debian's CRS (PL1 by default).
//!
//! ```text
//! cargo run --release -p lastcall-modsec --example bench -- [REQUESTS] [PARANOIA]
//! ```
//!
//! Prints the thread CPU time per request (phases 0-2 and logging, i.e. what the SPOE
//! agent runs per `coraza-req` message) for a benign GET, a benign form POST, a SQLi GET
//! and an XSS POST.

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use lastcall_modsec::crs::{debian_default_directives, CrsOptions};
use lastcall_modsec::{ModSecurity, RuleSet, Transaction};

struct Case {
    name: &'static str,
    method: &'static str,
    uri: &'static str,
    body: &'static [u8],
    expect_block: bool,
}

const CASES: &[Case] = &[
    Case {
        name: "benign GET",
        method: "GET",
        uri: "/products/42?color=blue&size=m&ref=newsletter",
        body: b"",
        expect_block: false,
    },
    Case {
        name: "benign form POST",
        method: "POST",
        uri: "/account/login",
        body: b"username=alice&password=correct%20horse%20battery&remember=1",
        expect_block: false,
    },
    Case {
        name: "SQLi GET",
        method: "GET",
        uri: "/?id=1'%20OR%20'1'='1",
        body: b"",
        expect_block: true,
    },
    Case {
        name: "XSS form POST",
        method: "POST",
        uri: "/guestbook",
        body: b"name=bob&comment=%3Cscript%3Ealert(document.cookie)%3C%2Fscript%3E",
        expect_block: true,
    },
];

fn thread_cpu_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    #[allow(unsafe_code, reason = "clock_gettime through libc")]
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts)
    };
    u128::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u128::try_from(ts.tv_nsec).unwrap_or(0)
}

fn one(
    ms: &Arc<ModSecurity>,
    rules: &Arc<RuleSet>,
    c: &Case,
) -> Result<bool, lastcall_modsec::Error> {
    let mut tx = Transaction::new(ms, rules, None)?;
    let mut blocked = tx
        .process_connection("192.0.2.7", 50123, "127.0.0.1", 8080)?
        .is_some();
    blocked |= tx.process_uri(c.uri, c.method, "1.1")?.is_some();
    let len = c.body.len().to_string();
    let mut headers: Vec<(&str, &str)> = vec![
        ("Host", "shop.example.com"),
        (
            "User-Agent",
            "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0",
        ),
        (
            "Accept",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
        ),
        ("Accept-Language", "en-US,en;q=0.5"),
        ("Accept-Encoding", "gzip, deflate, br"),
        (
            "Cookie",
            "session=8f14e45fceea167a5a36dedd4bea2543; theme=dark",
        ),
        ("Referer", "https://shop.example.com/"),
    ];
    if !c.body.is_empty() {
        headers.push(("Content-Type", "application/x-www-form-urlencoded"));
        headers.push(("Content-Length", &len));
    }
    for (k, v) in headers {
        tx.add_request_header(k.as_bytes(), v.as_bytes())?;
    }
    blocked |= tx.process_request_headers()?.is_some();
    if !c.body.is_empty() {
        tx.append_request_body(c.body)?;
    }
    blocked |= tx.process_request_body()?.is_some();
    tx.process_logging()?;
    Ok(blocked)
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let pl: u8 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let ms = ModSecurity::new()?;
    let t = Instant::now();
    let rules = RuleSet::from_directives(
        &debian_default_directives(&CrsOptions {
            paranoia_level: pl,
            ..CrsOptions::default()
        }),
        "bench",
    )?;
    println!(
        "{}; CRS PL{pl}: {} rules compiled in {:.0} ms",
        ms.who_am_i(),
        rules.rule_count(),
        t.elapsed().as_secs_f64() * 1e3
    );
    for c in CASES {
        for _ in 0..n.min(200) {
            one(&ms, &rules, c)?; // warm-up
        }
        let (cpu0, wall0) = (thread_cpu_ns(), Instant::now());
        for _ in 0..n {
            assert_eq!(one(&ms, &rules, c)?, c.expect_block, "{}", c.name);
        }
        let cpu = (thread_cpu_ns() - cpu0) as f64 / f64::from(n) / 1e3;
        let wall = wall0.elapsed().as_secs_f64() * 1e6 / f64::from(n);
        println!(
            "{:<18} {n} requests: {cpu:7.0} µs CPU/request ({wall:7.0} µs wall)",
            c.name
        );
    }
    Ok(())
}
