//! `lastcall-turn`: a TURN/STUN relay for Kubernetes that reads coturn's configuration and
//! drains without cutting a call.
//!
//! The protocol lives in `lastcall-turn-proto` (sans-IO); this crate owns the sockets (UDP,
//! TCP and TLS client listeners, UDP relay ports), the coturn-compatible configuration,
//! the metrics, and the wiring to the `lastcall` termination lifecycle.
//!
//! Layers, each module using only those above it: the configuration (`options`, `sources`,
//! `config`)
//! and the leaves (`sockets`, `mmsg`, `mailbox`, `metrics`, `ratelog`, `tls`); the relay
//! sockets (`relay`); routing what the core returns (`route`); the core behind its lock
//! (`shared`); its drivers (`udp`, `stream`, `timers`, `drain`); the listeners (`listen`);
//! and `server`, which starts them all. Apart: `nodeip`, the chart's init container's lookup of
//! the node's ExternalIP (`lastcall-turn node-external-ip`), and `privileged`, which raises
//! CAP_NET_BIND_SERVICE for a port below 1024 (or drops it) before any thread starts.
#![forbid(unsafe_code)]

pub mod config;
mod drain;
mod kernel;
pub mod listen;
mod mailbox;
pub mod metrics;
mod mmsg;
pub mod nodeip;
mod options;
pub mod privileged;
mod ratelog;
mod relay;
mod route;
pub mod server;
mod shared;
mod sockets;
mod sources;
mod stream;
mod timers;
pub mod tls;
mod udp;
pub mod userdb;

#[cfg(test)]
mod layering {
    //! The modules form layers: no module uses one that (directly or not) uses it.

    use std::collections::{BTreeMap, BTreeSet};

    /// The text of a module: its file, or every file of its directory (`config/`).
    fn module_text(path: &std::path::Path) -> String {
        if !path.is_dir() {
            return std::fs::read_to_string(path).unwrap_or_default();
        }
        let mut text = String::new();
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            text.push_str(&module_text(&entry.path()));
        }
        text
    }

    /// `crate::x` names used by each module of `src/`.
    fn uses() -> BTreeMap<String, BTreeSet<String>> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut graph = BTreeMap::new();
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if matches!(name, "lib" | "main") {
                continue;
            }
            let text = module_text(&path);
            let used = text
                .match_indices("crate::")
                .filter_map(|(at, _)| {
                    let rest = text.get(at + 7..)?;
                    let end = rest.find(|c: char| !(c.is_ascii_lowercase() || c == '_'))?;
                    Some(rest.get(..end)?.to_string())
                })
                .filter(|m| !m.is_empty() && m != name)
                .collect();
            graph.insert(name.to_string(), used);
        }
        graph
    }

    #[test]
    fn no_module_depends_on_itself() {
        let graph = uses();
        assert!(graph.len() > 10, "read the modules: {graph:?}");
        assert!(
            graph.get("config").is_some_and(|u| u.contains("options")),
            "config/ read as one module: {graph:?}"
        );
        for start in graph.keys() {
            let mut seen = BTreeSet::new();
            let mut todo: Vec<&String> = graph[start].iter().collect();
            while let Some(m) = todo.pop() {
                assert_ne!(m, start, "{start} uses itself through {seen:?}");
                if seen.insert(m.clone()) {
                    todo.extend(graph.get(m).into_iter().flatten());
                }
            }
        }
    }
}
