//! Threads and memory: transactions moved across threads, rules shared, no leaks.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;

use crate::common::{crs_engine, drive_request, drive_response, run_request, Req};
use lastcall_modsec::crs::CrsOptions;
use lastcall_modsec::{ModSecurity, RuleSet, Transaction};

const SQLI: &str = "/?id=1'%20OR%20'1'='1";

#[test]
fn transactions_move_between_threads() {
    let (ms, rules) = crs_engine(&CrsOptions {
        response_check: true,
        ..CrsOptions::default()
    });
    // Created here, request phases on a worker, response phases back here.
    let (to_main, from_worker) = mpsc::channel::<Transaction>();
    let worker = {
        let (ms, rules) = (Arc::clone(&ms), Arc::clone(&rules));
        thread::spawn(move || {
            for i in 0..20 {
                let mut tx = Transaction::new(&ms, &rules, Some(&format!("t{i}"))).expect("tx");
                assert_eq!(drive_request(&mut tx, &Req::get("/a?b=c")), None);
                to_main.send(tx).expect("send");
            }
        })
    };
    let mut n = 0;
    for mut tx in from_worker {
        let it = drive_response(&mut tx, 200, &[("Content-Type", "text/html")], b"<p>ok</p>");
        assert_eq!(it, None);
        tx.process_logging().expect("logging");
        n += 1;
    }
    worker.join().expect("worker");
    assert_eq!(n, 20);
}

#[test]
fn shared_rules_evaluate_concurrently_and_reload_does_not_disturb() {
    let (ms, rules) = crs_engine(&CrsOptions::default());
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (ms, rules) = (Arc::clone(&ms), Arc::clone(&rules));
            thread::spawn(move || {
                for i in 0..150 {
                    let attack = (i + w) % 3 == 0;
                    let req = if attack {
                        Req::get(SQLI)
                    } else {
                        Req::get("/catalog?page=2&sort=price")
                    };
                    let (v, tx) = run_request(&ms, &rules, &req);
                    assert_eq!(
                        v.map(|i| i.status),
                        attack.then_some(403),
                        "worker {w} #{i}"
                    );
                    assert_eq!(tx.report().rule_ids().contains(&942100), attack);
                }
            })
        })
        .collect();
    // Meanwhile compile the rules again, twice (a SIGHUP reload): the parser lock keeps
    // the compilations apart, evaluation goes on.
    let opts = CrsOptions::default();
    let reloaded: Vec<Arc<RuleSet>> = (0..2)
        .map(|_| {
            let text = lastcall_modsec::crs::debian_default_directives(&opts);
            RuleSet::from_directives(&text, "reload").expect("reload")
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let (v, _) = run_request(&ms, &reloaded[1], &Req::get(SQLI));
    assert_eq!(v.map(|i| i.status), Some(403));
}

#[test]
fn engines_and_rules_can_be_created_from_many_threads() {
    let handles: Vec<_> = (0..4)
        .map(|i| {
            thread::spawn(move || {
                let ms = ModSecurity::new().expect("engine");
                let rules = RuleSet::from_directives(
                    &format!("SecRuleEngine On\nSecRule ARGS \"@streq x{i}\" \"id:{},phase:1,deny,status:401\"\n", 100 + i),
                    "t",
                )
                .expect("rules");
                let (v, _) = run_request(&ms, &rules, &Req::get(&format!("/?a=x{i}")));
                assert_eq!(v.map(|i| i.status), Some(401));
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    // One engine per process (its destructor tears down libxml2 and curl globals).
    let a = ModSecurity::new().expect("engine");
    let b = ModSecurity::new().expect("engine");
    assert!(Arc::ptr_eq(&a, &b));
}

/// The threads `after_rules_freed`'s hook ran on (every test of this binary that frees a
/// rule set, under `cargo test`, adds to it).
static FREED_ON: parking_lot::Mutex<Vec<String>> = parking_lot::Mutex::new(Vec::new());

fn record_freed() {
    let name = thread::current().name().unwrap_or("").to_owned();
    FREED_ON.lock().push(name);
}

#[test]
fn the_rules_freed_hook_runs_on_the_rules_thread_once_the_last_reference_drops() {
    lastcall_modsec::after_rules_freed(record_freed);
    let ms = ModSecurity::new().expect("engine");
    let rules = RuleSet::from_directives(
        "SecRuleEngine On\nSecRule ARGS \"@streq x\" \"id:150,phase:1,deny,status:401\"\n",
        "hook",
    )
    .expect("rules");
    let mut tx = Transaction::new(&ms, &rules, None).expect("transaction");
    // A transaction holds the rules: they are freed (and the hook runs, before `drop`
    // returns) when it ends, not when the set's own reference drops.
    drop(rules);
    tx.process_connection("127.0.0.1", 40000, "127.0.0.1", 80)
        .expect("connection");
    tx.process_uri("/?a=x", "GET", "1.1").expect("uri");
    assert_eq!(
        tx.process_request_headers()
            .expect("headers")
            .map(|i| i.status),
        Some(401)
    );
    let before = FREED_ON.lock().len();
    drop(tx);
    let names = FREED_ON.lock().clone();
    assert!(
        names.len() > before,
        "the hook did not run when the rules were freed"
    );
    assert!(
        names.iter().all(|n| n == "lastcall-rules"),
        "the hook ran on another thread than the one that frees rule sets: {names:?}"
    );
}

fn rss_kib() -> u64 {
    lastcall_testkit::procfs::rss_self() / 1024
}

/// 20,000 transactions (a third of them denied, with intervention strings, response
/// phases and logging) on two threads; resident memory after a warm-up must stay
/// roughly flat. A leak of even ~500 bytes per transaction (the intervention log is
/// ~700) would add ~9 MiB over the measured 18,000.
#[test]
fn twenty_thousand_transactions_keep_rss_flat() {
    let (ms, rules) = crs_engine(&CrsOptions {
        response_check: true,
        ..CrsOptions::default()
    });
    let run = |count: usize| {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (ms, rules) = (Arc::clone(&ms), Arc::clone(&rules));
                thread::spawn(move || {
                    let body = b"comment=%3Cscript%3Ealert(1)%3C%2Fscript%3E";
                    for i in 0..count / 2 {
                        let req = match (i + w) % 3 {
                            0 => Req::get(SQLI),
                            1 => Req::post_form("/c", body),
                            _ => Req::get("/static/app.js?v=3"),
                        };
                        let (v, mut tx) = run_request(&ms, &rules, &req);
                        if v.is_none() {
                            drive_response(
                                &mut tx,
                                200,
                                &[("Content-Type", "text/html")],
                                b"<p>fine</p>",
                            );
                        }
                        tx.process_logging().expect("logging");
                        assert!(!tx.report().is_empty() || (i + w) % 3 == 2);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
    };
    run(2_000);
    let before = rss_kib();
    run(18_000);
    let after = rss_kib();
    let growth = after.saturating_sub(before);
    println!(
        "RSS before {before} KiB, after {after} KiB, growth {growth} KiB over 18,000 transactions"
    );
    assert!(
        growth < 6 * 1024,
        "RSS grew {growth} KiB over 18,000 transactions"
    );
}
