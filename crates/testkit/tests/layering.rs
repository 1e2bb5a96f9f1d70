//! The modules of every crate of the workspace form layers: no module uses a sibling that
//! (directly or not) uses it (`lastcall_testkit::layering`); every dependency a crate
//! declares is used by it; the sans-IO cores depend on no runtime and no engine; and each
//! concern has one idiom across the workspace (one lock type, one `/proc` reader).
#![allow(
    clippy::expect_used,
    reason = "test code: a panic is the failure report"
)]

use std::path::Path;

/// Cycles known and owned elsewhere, each with why it may stay for now. An entry that no
/// longer matches a cycle fails the test, so the list only shrinks.
const KNOWN: &[(&str, &str)] = &[];

#[test]
fn no_module_depends_on_itself() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    let mut found = Vec::new();
    let mut known_seen = vec![false; KNOWN.len()];
    for name in [
        "lastcall",
        "phase",
        "spop-proto",
        "spoa",
        "turn",
        "turn-proto",
        "turn-kernel",
        "modsec",
        "testkit",
        "demo",
        "turnload",
    ] {
        let src = crates.join(name).join("src");
        assert!(src.is_dir(), "{}", src.display());
        let (edges, cycles) = lastcall_testkit::layering::edges_and_cycles(&src);
        assert!(
            !edges.is_empty() || ["phase", "turnload", "turn-kernel"].contains(&name),
            "{name}: no use between modules read at all"
        );
        checked += 1;
        for cycle in cycles {
            match KNOWN
                .iter()
                .position(|(c, prefix)| *c == name && cycle.starts_with(prefix))
            {
                Some(i) => known_seen[i] = true,
                None => found.push(format!("{name} {cycle}")),
            }
        }
    }
    assert_eq!(checked, 11);
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
    for (i, seen) in known_seen.iter().enumerate() {
        assert!(
            seen,
            "{:?} is gone: remove it from KNOWN in tests/layering.rs",
            KNOWN[i]
        );
    }
}

/// Dependencies whose library has another name than the package.
const LIB_NAMES: &[(&str, &str)] = &[("md-5", "md5")];

/// The dependencies `manifest` declares (normal, dev and build, any target), by section.
fn declared(manifest: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        if !section.ends_with("dependencies") || line.starts_with('#') {
            continue;
        }
        let Some((key, _)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim().trim_end_matches(".workspace");
        if !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            out.push((section.clone(), key.to_owned()));
        }
    }
    out
}

/// Whether `ident` occurs in `text` as a whole word.
fn mentions(text: &str, ident: &str) -> bool {
    text.match_indices(ident).any(|(at, _)| {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        !text[..at].ends_with(word) && !text[at + ident.len()..].starts_with(word)
    })
}

fn rust_text(dir: &Path, out: &mut String) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_text(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).expect("read"));
        }
    }
}

/// Every dependency of every crate is named in its code (src/, tests/, examples/,
/// benches/, build.rs): none is declared and unused.
#[test]
fn every_declared_dependency_is_used() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut unused = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(&crates).expect("crates/") {
        let dir = entry.expect("entry").path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let mut text = String::new();
        for sub in ["src", "tests", "examples", "benches"] {
            rust_text(&dir.join(sub), &mut text);
        }
        text.push_str(&std::fs::read_to_string(dir.join("build.rs")).unwrap_or_default());
        for (section, dep) in declared(&manifest) {
            checked += 1;
            let lib = LIB_NAMES
                .iter()
                .find(|(p, _)| *p == dep)
                .map_or_else(|| dep.replace('-', "_"), |(_, l)| (*l).to_owned());
            if !mentions(&text, &lib) {
                unused.push(format!("{} [{section}] {dep}", dir.display()));
            }
        }
    }
    assert!(checked > 50, "only {checked} dependencies read");
    assert!(
        unused.is_empty(),
        "declared and unused:\n{}",
        unused.join("\n")
    );
}

#[test]
fn an_unused_dependency_is_found() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\nanyhow = { workspace = true }\nmd-5.workspace = true\n[target.'cfg(unix)'.dev-dependencies]\nlibc = \"0.2\"\n";
    let deps = declared(manifest);
    assert_eq!(
        deps,
        [
            ("dependencies".to_owned(), "anyhow".to_owned()),
            ("dependencies".to_owned(), "md-5".to_owned()),
            (
                "target.'cfg(unix)'.dev-dependencies".to_owned(),
                "libc".to_owned()
            ),
        ]
    );
    assert!(mentions("use md5::Md5;", "md5"));
    assert!(!mentions("let anyhow_like = 1;", "anyhow"));
    assert!(!mentions("libcore", "libc"));
}

/// The packages of `Cargo.lock` with what each depends on (normal, dev and build alike).
fn locked_graph(lock: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut graph = std::collections::BTreeMap::new();
    for package in lock.split("[[package]]").skip(1) {
        let mut name = None;
        let mut deps = Vec::new();
        let mut in_deps = false;
        for line in package.lines() {
            if let Some(n) = line.strip_prefix("name = ") {
                name = Some(n.trim_matches('"').to_owned());
            } else if line.starts_with("dependencies = [") {
                in_deps = true;
            } else if in_deps && line.starts_with(']') {
                in_deps = false;
            } else if in_deps {
                // ` "name",` or ` "name version",` when two versions are locked.
                let dep = line.trim().trim_matches(|c| c == '"' || c == ',');
                deps.push(dep.split(' ').next().unwrap_or(dep).to_owned());
            }
        }
        if let Some(name) = name {
            graph.entry(name).or_insert_with(Vec::new).extend(deps);
        }
    }
    graph
}

/// Every package `from` depends on, directly or not, not looking past the packages in
/// `stop`.
fn reachable(
    graph: &std::collections::BTreeMap<String, Vec<String>>,
    from: &str,
    stop: &[&str],
) -> std::collections::BTreeSet<String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec![from.to_owned()];
    while let Some(package) = todo.pop() {
        if stop.contains(&package.as_str()) {
            continue;
        }
        for dep in graph.get(&package).into_iter().flatten() {
            if seen.insert(dep.clone()) {
                todo.push(dep.clone());
            }
        }
    }
    seen
}

/// The sans-IO cores take bytes and `now` and return what to do: no runtime (tokio, or
/// `lastcall`, which drives the lifecycle with it) and no engine (libmodsecurity) below them,
/// so that their tests and fuzz targets build without either. `spop`'s codec brings
/// `tokio-util` (and through it tokio's `sync` feature, no runtime), which the cores do not
/// use: the walk stops there, and no core may declare either itself.
#[test]
fn sans_io_cores_depend_on_no_runtime_and_no_engine() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).expect("Cargo.lock");
    let graph = locked_graph(&lock);
    for (core, dir) in [
        ("lastcall-phase", "phase"),
        ("lastcall-spop-proto", "spop-proto"),
        ("lastcall-turn-proto", "turn-proto"),
    ] {
        assert!(graph.contains_key(core), "{core} is not in Cargo.lock");
        let manifest =
            std::fs::read_to_string(root.join("crates").join(dir).join("Cargo.toml")).expect(dir);
        for (_, dep) in declared(&manifest) {
            assert!(
                ![
                    "tokio",
                    "tokio-util",
                    "futures",
                    "lastcall",
                    "lastcall-modsec"
                ]
                .contains(&dep.as_str()),
                "{core} declares {dep}"
            );
        }
        let below = reachable(&graph, core, &["tokio-util"]);
        for f in ["tokio", "mio", "lastcall", "lastcall-modsec"] {
            assert!(!below.contains(f), "{core} depends on {f}");
        }
    }
    // The walk sees through the workspace: the agent is above both.
    let agent = reachable(&graph, "lastcall-spoa", &["tokio-util"]);
    assert!(agent.contains("tokio") && agent.contains("lastcall-modsec"));
}

/// Every Rust file of the workspace's crates and fuzz targets: its path from the workspace
/// root, and its text.
fn workspace_rust() -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    walk(root, &path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path.strip_prefix(root).expect("under the root");
                let text = std::fs::read_to_string(&path).expect("read");
                out.push((name.display().to_string(), text));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut out = Vec::new();
    walk(&root, &root.join("crates"), &mut out);
    walk(&root, &root.join("fuzz"), &mut out);
    out
}

/// The line of `text` at byte `at`, trimmed, for a report.
fn line_at(text: &str, at: usize) -> String {
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = text[..at].matches('\n').count() + 1;
    let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    format!("{line}: {}", text[start..end].trim())
}

/// Uses of std's locks (`std::sync::{Mutex, RwLock, Condvar}`, their guards, poisoning): the
/// workspace's lock is `parking_lot`'s, which has no poisoning to recover from.
fn std_locks(text: &str) -> Vec<String> {
    const LOCKS: [&str; 6] = [
        "Mutex",
        "MutexGuard",
        "RwLock",
        "Condvar",
        "LockResult",
        "PoisonError",
    ];
    let mut found = Vec::new();
    for (at, _) in text.match_indices("std::") {
        // The path or use tree from here, up to what ends it (`;`, `(`, `<`, ...).
        let rest = &text[at..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "_:{}, \n\t".contains(c)))
            .unwrap_or(rest.len());
        let path = &rest[..end];
        if (path.starts_with("std::sync") || path.starts_with("std::{"))
            && LOCKS.iter().any(|l| mentions(path, l))
        {
            found.push(line_at(text, at));
        }
    }
    for (at, _) in text.match_indices("PoisonError") {
        let line = line_at(text, at);
        if !found.contains(&line) {
            found.push(line);
        }
    }
    found
}

/// A process's own files under `/proc` (`/proc/PID/stat`, `status`, `fd`, ...) read by
/// hand: the workspace reads them with the `procfs` crate (`lastcall::process`,
/// `lastcall_testkit::procfs`, turnload's `procfs`).
fn hand_read_proc(text: &str) -> Vec<String> {
    const PROCESS_FILES: [&str; 8] = [
        "stat",
        "statm",
        "status",
        "schedstat",
        "fd",
        "task",
        "comm",
        "limits",
    ];
    let mut found = Vec::new();
    for (at, _) in text.match_indices("\"/proc/") {
        let literal = &text[at + 1..];
        let literal = &literal[..literal.find('"').unwrap_or(literal.len())];
        let last = literal.rsplit('/').next().unwrap_or_default();
        let per_process = ["/proc/{", "/proc/self/", "/proc/thread-self/"]
            .iter()
            .any(|p| literal.starts_with(p));
        if per_process && PROCESS_FILES.contains(&last) {
            found.push(line_at(text, at));
        }
    }
    for file in PROCESS_FILES {
        for (at, _) in text.match_indices(&format!(".join(\"{file}\")")) {
            found.push(line_at(text, at));
        }
    }
    found
}

/// Files where a replaced idiom may stay, each with why. An entry that no longer matches
/// fails the test, so the lists only shrink.
const STD_LOCK_ALLOWED: &[(&str, &str)] = &[
    (
        "crates/spoa/src/config/apps.rs",
        "a log file's writer: tracing-subscriber's MakeWriter is implemented for std's mutex",
    ),
    (
        "crates/spoa/src/config/settings.rs",
        "a log file's writer: tracing-subscriber's MakeWriter is implemented for std's mutex",
    ),
];
const PROC_ALLOWED: &[(&str, &str)] = &[
    (
        "crates/lastcall/src/process.rs",
        "its test reads /proc/self/stat itself to check what procfs gives the metrics",
    ),
    (
        "crates/turn/src/prestop.rs",
        "the preStop hook reads the /proc it is given, which its tests fake with a comm and a \
         cmdline per process, and a non-dumpable daemon's files by what it may read",
    ),
];

/// Runs `find` over every file and reports what is not allowed, and allowances no longer used.
fn one_idiom(concern: &str, find: fn(&str) -> Vec<String>, allowed: &[(&str, &str)]) {
    let files = workspace_rust();
    assert!(files.len() > 100, "only {} files read", files.len());
    let mut found = Vec::new();
    let mut used = vec![false; allowed.len()];
    // This file, whose examples are what the test looks for.
    for (path, text) in files
        .iter()
        .filter(|(p, _)| p != "crates/testkit/tests/layering.rs")
    {
        let hits = find(text);
        if hits.is_empty() {
            continue;
        }
        match allowed.iter().position(|(p, _)| p == path) {
            Some(i) => used[i] = true,
            None => found.extend(hits.into_iter().map(|h| format!("{path}:{h}"))),
        }
    }
    assert!(found.is_empty(), "{concern}:\n{}", found.join("\n"));
    for (i, seen) in used.iter().enumerate() {
        assert!(
            seen,
            "{:?} no longer needs its allowance: remove it from tests/layering.rs",
            allowed[i]
        );
    }
}

#[test]
fn one_lock_type() {
    one_idiom(
        "std's locks (the workspace's are parking_lot's)",
        std_locks,
        STD_LOCK_ALLOWED,
    );
}

#[test]
fn one_proc_reader() {
    one_idiom(
        "a process's /proc files read by hand (the workspace reads them with procfs)",
        hand_read_proc,
        PROC_ALLOWED,
    );
}

#[test]
fn a_second_idiom_is_found() {
    let std_lock =
        "use std::sync::atomic::AtomicU64;\nuse std::sync::{\n    Arc,\n    Mutex,\n};\n";
    assert_eq!(std_locks(std_lock), ["2: use std::sync::{"]);
    assert_eq!(std_locks("let m = std::sync::Mutex::new(0);").len(), 1);
    assert_eq!(std_locks("use std::{io, sync::RwLock};").len(), 1);
    assert_eq!(
        std_locks("m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)").len(),
        1
    );
    let fine = "use std::sync::Arc;\nuse parking_lot::{Condvar, Mutex};\nuse tokio::sync::Mutex;\nlet a = std::sync::Arc::new(parking_lot::Mutex::new(0));";
    assert!(std_locks(fine).is_empty(), "{:?}", std_locks(fine));

    let by_hand = "read_to_string(format!(\"/proc/{pid}/stat\"))\nread_dir(format!(\"/proc/{}/task\", p))\nt.path().join(\"schedstat\")\nread_to_string(\"/proc/self/status\")";
    assert_eq!(
        hand_read_proc(by_hand).len(),
        4,
        "{:?}",
        hand_read_proc(by_hand)
    );
    let fine = "read_to_string(\"/proc/sys/net/ipv4/ip_local_port_range\")\nread_to_string(\"/proc/net/udp\")\nProcess::new(pid)?.stat()";
    assert!(
        hand_read_proc(fine).is_empty(),
        "{:?}",
        hand_read_proc(fine)
    );
}
