//! The modules of every crate of the workspace form layers: no module uses a sibling that
//! (directly or not) uses it (`lastcall_testkit::layering`); every dependency a crate
//! declares is used by it; and the sans-IO cores depend on no runtime and no engine.
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
