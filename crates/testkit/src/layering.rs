//! Import cycles inside a crate: [`cycles`] reads a crate's `src/` and reports every set of
//! sibling modules that use each other, directly or not (`tests/layering.rs` runs it on the
//! workspace's crates).
//!
//! Siblings are the modules of one directory (the files of `src/`, of `src/engine/`, ...),
//! each with everything below it. A module uses a sibling when its code (comments and test
//! modules left out) names a path into it: `crate::engine::conn::...`, `super::frame::...`,
//! `self::...`, grouped or not (`super::{ack, conn::Conn}`). A module using its own parent
//! (`super::Engine` from `engine/task.rs`) or its children (`mod.rs` re-exporting them) is
//! not a cycle: the parent is the namespace the children live in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The module path of every `.rs` file under `src` (`engine/conn.rs` is `["engine",
/// "conn"]`, `engine/mod.rs` is `["engine"]`, `lib.rs`/`main.rs` are `[]`), test files
/// (`tests.rs`, anything under a `tests/` directory) left out.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut todo = vec![src.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "tests" && name != "bin" {
                    todo.push(path);
                }
                continue;
            }
            let Some(stem) = name.strip_suffix(".rs") else {
                continue;
            };
            if stem == "tests" {
                continue;
            }
            let rel = dir.strip_prefix(src).unwrap_or(Path::new(""));
            let mut module: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if !matches!(stem, "mod" | "lib" | "main") {
                module.push(stem.to_string());
            }
            out.insert(module, path);
        }
    }
    out
}

/// The code of a file without comments, string literals' contents and inline test modules
/// (`#[cfg(test)] mod tests { ... }` to the end of the file, where this workspace keeps it).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = '\0';
        let mut kept = String::new();
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if in_str {
                if c == '"' && prev != '\\' {
                    in_str = false;
                    kept.push('"');
                }
                prev = if prev == '\\' && c == '\\' { '\0' } else { c };
                continue;
            }
            if c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' {
                in_str = true;
            }
            kept.push(c);
            prev = c;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// Every path `crate::`, `super::` or `self::` starts in `code`, with `{...}` groups
/// expanded, as segments (`["super", "conn", "Conn"]`).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .find(|p| rest.starts_with(**p));
        let preceded = at > 0 && {
            let b = bytes[at - 1];
            b.is_ascii_alphanumeric() || b == b'_' || b == b':'
        };
        match starts {
            Some(_) if !preceded => {
                let (segments, len) = path_at(rest);
                out.extend(segments);
                at += len.max(1);
            }
            _ => at += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    out
}

/// The paths of the path expression at the start of `text` (`a::b::{c, d::e}`), and how
/// many bytes it takes.
fn path_at(text: &str) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    let mut at = 0;
    loop {
        let rest = &text[at..];
        let word: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !word.is_empty() {
            at += word.len();
            prefix.push(word);
            if text[at..].starts_with("::") {
                at += 2;
                continue;
            }
            return (vec![prefix], at);
        }
        if rest.starts_with('{') {
            let Some(end) = matching_brace(rest) else {
                return (vec![prefix], at);
            };
            let inner = &rest[1..end];
            let mut out = Vec::new();
            for part in split_top(inner) {
                let part = part.trim();
                if part.is_empty() {
                    continue;
                }
                let (inner_paths, _) = path_at(part);
                for p in inner_paths {
                    let mut full = prefix.clone();
                    full.extend(p);
                    out.push(full);
                }
            }
            return (out, at + end + 1);
        }
        return (vec![prefix], at);
    }
}

fn matching_brace(text: &str) -> Option<usize> {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

fn split_top(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

/// The module a path of `from` (a file whose module path is `from`, `mod.rs` or not) leads
/// to: the longest known module its segments begin with.
fn target(path: &[String], from: &[String], known: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    // The module `self` names: a `mod.rs` (or lib.rs) is its directory's module; any other
    // file is its own.
    let mut base: Vec<String> = from.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let mut full = base;
    full.extend(rest.iter().cloned());
    (0..=full.len())
        .rev()
        .map(|n| full[..n].to_vec())
        .find(|m| known.contains(m))
}

/// Every cycle among sibling modules of the crate whose sources are in `src`, as
/// `"dir: a -> b -> a"` (`dir` empty for the crate root), with the uses that make each
/// edge of it. Empty when the modules form layers.
pub fn cycles(src: &Path) -> Vec<String> {
    edges_and_cycles(src).1
}

/// Uses between sibling modules: `(directory, from, to)` to what uses what.
pub type Edges = BTreeMap<(Vec<String>, String, String), BTreeSet<String>>;

/// The uses between sibling modules, and the cycles among them.
pub fn edges_and_cycles(src: &Path) -> (Edges, Vec<String>) {
    let modules = modules(src);
    let known: BTreeSet<Vec<String>> = modules.keys().cloned().collect();
    let mut edges = Edges::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        // `super` in `engine/task.rs` is `engine`; in `engine/mod.rs` it is the crate root:
        // resolving from the file's own module does both (a `mod.rs` is its directory's).
        for path in paths(&code(&text)) {
            let Some(to) = target(&path, module, &known) else {
                continue;
            };
            // The deepest directory both live in, and the children of it they are in.
            let common = module.iter().zip(&to).take_while(|(a, b)| a == b).count();
            let (Some(a), Some(b)) = (module.get(common), to.get(common)) else {
                // One is the other's ancestor: a child using its parent, or a parent its
                // child.
                continue;
            };
            edges
                .entry((module[..common].to_vec(), a.clone(), b.clone()))
                .or_default()
                .insert(format!("{} uses {}", module.join("::"), path.join("::")));
        }
    }
    let mut found = Vec::new();
    let dirs: BTreeSet<Vec<String>> = edges.keys().map(|(d, _, _)| d.clone()).collect();
    for dir in dirs {
        let graph: BTreeMap<&str, BTreeSet<&str>> = edges
            .keys()
            .filter(|(d, _, _)| *d == dir)
            .fold(BTreeMap::new(), |mut g, (_, a, b)| {
                g.entry(a.as_str()).or_default().insert(b.as_str());
                g
            });
        for start in graph.keys() {
            if let Some(cycle) = cycle_from(&graph, start) {
                // Report each cycle once: from its smallest member.
                if cycle.iter().min() == Some(start) {
                    let why: Vec<String> = cycle
                        .windows(2)
                        .flat_map(|w| {
                            edges
                                .get(&(dir.clone(), w[0].to_string(), w[1].to_string()))
                                .into_iter()
                                .flatten()
                                .take(2)
                                .cloned()
                        })
                        .collect();
                    found.push(format!(
                        "{}: {} ({})",
                        dir.join("::"),
                        cycle.join(" -> "),
                        why.join("; ")
                    ));
                }
            }
        }
    }
    (edges, found)
}

/// A path from `start` back to itself, if there is one (`[start, .., start]`).
fn cycle_from<'a>(
    graph: &BTreeMap<&'a str, BTreeSet<&'a str>>,
    start: &'a str,
) -> Option<Vec<&'a str>> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<Vec<&str>> = vec![vec![start]];
    while let Some(path) = todo.pop() {
        let last = *path.last()?;
        for &next in graph.get(last).into_iter().flatten() {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(start);
                return Some(cycle);
            }
            if seen.insert(next) {
                let mut longer = path.clone();
                longer.push(next);
                todo.push(longer);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rel: &str, text: &str) {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn paths_are_read_with_their_groups_and_not_from_comments_or_strings() {
        let code = code(
            "use super::{ack::{AckSink, Ticket}, conn};\n\
             // crate::nope::x\n\
             /// [`super::docs_only`]\n\
             let s = \"crate::in_a_string\"; crate::engine::conn::Action::Wait;\n",
        );
        let got: Vec<String> = paths(&code).iter().map(|p| p.join("::")).collect();
        assert_eq!(
            got,
            [
                "super::ack::AckSink",
                "super::ack::Ticket",
                "super::conn",
                "crate::engine::conn::Action::Wait"
            ]
        );
    }

    #[test]
    fn a_cycle_between_siblings_is_found_and_parents_are_not_cycles() {
        let dir = std::env::temp_dir().join(format!("layering-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write(&dir, "lib.rs", "pub mod config; pub mod engine;");
        write(&dir, "config.rs", "use crate::engine::DEFAULT;");
        write(
            &dir,
            "engine/mod.rs",
            "pub mod conn; pub mod task; pub use task::serve; pub const DEFAULT: u8 = 0;",
        );
        write(
            &dir,
            "engine/conn.rs",
            "use crate::protocol_free::x; pub struct Conn;",
        );
        write(
            &dir,
            "engine/task.rs",
            "use super::conn::Conn; use super::Engine; use crate::engine::DEFAULT;",
        );
        write(&dir, "engine/conn/tests.rs", "use crate::engine::task::x;");
        assert!(cycles(&dir).is_empty(), "{:?}", cycles(&dir));
        write(&dir, "engine/conn.rs", "use super::task::serve;");
        let found = cycles(&dir);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("engine: conn -> task -> conn"),
            "{found:?}"
        );
        write(&dir, "engine/conn.rs", "");
        write(&dir, "engine/task.rs", "use crate::config::X;");
        let found = cycles(&dir);
        assert!(
            found[0].starts_with(": config -> engine -> config"),
            "{found:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
