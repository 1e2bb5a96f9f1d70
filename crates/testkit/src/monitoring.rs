//! The charts' dashboards and alert rules (`charts/*/files/`) as the tests check them against
//! real daemons: every PromQL expression they hold, parsed by the `promql-parser` crate, and
//! the metric names it selects; the names a daemon serves; `/metrics` recorded while a test
//! drives a daemon ([`Recorder`]), turned into the input series of a `promtool test rules`
//! file ([`promtool_test`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use promql_parser::parser::{self, Expr};

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A chart's dashboard (`charts/CHART/files/grafana-dashboard.json`).
pub fn dashboard_path(chart: &str) -> PathBuf {
    repo().join(format!("charts/{chart}/files/grafana-dashboard.json"))
}

/// A chart's alert rules (`charts/CHART/files/prometheus-rules.yaml`).
pub fn rules_path(chart: &str) -> PathBuf {
    repo().join(format!("charts/{chart}/files/prometheus-rules.yaml"))
}

/// One PromQL expression and where it is.
#[derive(Debug, Clone)]
pub struct Expression {
    /// The file and the panel, variable or rule that holds it.
    pub place: String,
    /// The expression as written (Grafana's variables included).
    pub text: String,
}

/// Every expression of a chart's dashboard and rules.
pub fn chart_expressions(chart: &str) -> Vec<Expression> {
    let mut out = dashboard_expressions(&dashboard_path(chart));
    out.extend(rule_expressions(&rules_path(chart)));
    out
}

/// The queries of every panel (rows' panels included) and every query variable.
pub fn dashboard_expressions(path: &Path) -> Vec<Expression> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dash: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = path.display();
    let mut out = Vec::new();
    let mut panels: Vec<&serde_json::Value> = Vec::new();
    for p in dash["panels"].as_array().into_iter().flatten() {
        panels.push(p);
        panels.extend(p["panels"].as_array().into_iter().flatten());
    }
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push(Expression {
                    place: format!("{file}: panel {:?}, query {}", p["title"], t["refId"]),
                    text: expr.to_string(),
                });
            }
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        let query = v["query"]["query"].as_str().or(v["query"].as_str());
        if v["type"] == "query" {
            let query =
                query.unwrap_or_else(|| panic!("{file}: variable {} has no query", v["name"]));
            out.push(Expression {
                place: format!("{file}: variable {}", v["name"]),
                text: query.to_string(),
            });
        }
    }
    out
}

/// The `expr` of every rule of a Prometheus rule file.
pub fn rule_expressions(path: &Path) -> Vec<Expression> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    let mut last_key: Option<String> = None;
    let mut name = String::new();
    let mut depth_in_map = Vec::<bool>::new();
    for event in saphyr_parser::Parser::new_from_str(&text) {
        let (event, span) = event.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        use saphyr_parser::Event;
        match event {
            Event::MappingStart(..) => {
                depth_in_map.push(true);
                last_key = None;
            }
            Event::SequenceStart(..) => {
                depth_in_map.push(false);
                last_key = None;
            }
            Event::MappingEnd | Event::SequenceEnd => {
                depth_in_map.pop();
                last_key = None;
            }
            Event::Scalar(value, ..) if depth_in_map.last() == Some(&true) => match last_key.take()
            {
                None => last_key = Some(value.to_string()),
                Some(key) => {
                    if key == "alert" || key == "record" {
                        name = value.to_string();
                    } else if key == "expr" {
                        out.push(Expression {
                            place: format!("{}:{}: rule {name}", path.display(), span.start.line()),
                            text: value.to_string(),
                        });
                    }
                }
            },
            _ => last_key = None,
        }
    }
    out
}

/// Grafana's interval variables made concrete, so that the query parses as PromQL (label
/// variables sit inside quoted matcher values and parse as they are).
fn concrete(query: &str) -> String {
    ["$__rate_interval", "$__interval", "$__range"]
        .iter()
        .fold(query.to_string(), |q, v| q.replace(v, "5m"))
}

/// The metric names an expression selects (a Grafana `label_values(SELECTOR, label)` query: its
/// selector's). An error names what does not parse.
pub fn selected_metrics(query: &str) -> Result<BTreeSet<String>, String> {
    let query = concrete(query.trim());
    let promql = match query.strip_prefix("label_values(") {
        Some(rest) => {
            let inner = rest
                .strip_suffix(')')
                .ok_or("label_values( without its )")?;
            let (selector, _label) = inner
                .rsplit_once(',')
                .ok_or("label_values() without a label")?;
            selector.trim().to_string()
        }
        None => query,
    };
    let expr = parser::parse(&promql)?;
    let mut names = BTreeSet::new();
    collect(&expr, &mut names)?;
    Ok(names)
}

fn collect(expr: &Expr, names: &mut BTreeSet<String>) -> Result<(), String> {
    match expr {
        Expr::Aggregate(a) => {
            collect(&a.expr, names)?;
            if let Some(p) = &a.param {
                collect(p, names)?;
            }
        }
        Expr::Unary(u) => collect(&u.expr, names)?,
        Expr::Binary(b) => {
            collect(&b.lhs, names)?;
            collect(&b.rhs, names)?;
        }
        Expr::Paren(p) => collect(&p.expr, names)?,
        Expr::Subquery(s) => collect(&s.expr, names)?,
        Expr::VectorSelector(vs) => selector(vs, names)?,
        Expr::MatrixSelector(ms) => selector(&ms.vs, names)?,
        Expr::Call(c) => {
            for a in &c.args.args {
                collect(a, names)?;
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
    Ok(())
}

fn selector(
    vs: &promql_parser::parser::VectorSelector,
    names: &mut BTreeSet<String>,
) -> Result<(), String> {
    match &vs.name {
        Some(n) => {
            names.insert(n.clone());
            Ok(())
        }
        None => Err(format!("a selector without a metric name: {vs}")),
    }
}

/// The metric names a `/metrics` text serves: every sample's name, and for each declared
/// family (`# TYPE`) the names its samples take (`_total` of a counter; `_bucket`, `_sum`,
/// `_count` of a histogram), so that a family with no label set yet counts as served.
pub fn served_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let mut parts = decl.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            match kind {
                "counter" => {
                    names.insert(format!("{}_total", name.trim_end_matches("_total")));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    names.insert(name.to_string());
                }
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// Checks that every metric name the chart's dashboard and rules select is in `served`, except
/// recording rules' names (they hold a colon) and those `skip` leaves out; panics with every
/// missing name and where it is used. Returns how many names were checked.
pub fn assert_chart_served(
    chart: &str,
    served: &BTreeSet<String>,
    skip: impl Fn(&str) -> bool,
) -> usize {
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut checked = BTreeSet::new();
    for e in chart_expressions(chart) {
        let names = selected_metrics(&e.text).unwrap_or_else(|err| {
            panic!("{}: does not parse as PromQL: {err}\n{}", e.place, e.text)
        });
        for n in names {
            if n.contains(':') || skip(&n) {
                continue;
            }
            if !served.contains(&n) {
                missing.entry(n.clone()).or_default().push(e.place.clone());
            }
            checked.insert(n);
        }
    }
    assert!(
        missing.is_empty(),
        "{chart}: metric names used by its dashboard or rules that the daemon does not serve:\n{}",
        missing
            .iter()
            .map(|(n, places)| format!("  {n}: {}", places.join("; ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
    checked.len()
}

/// One scrape of one target.
#[derive(Debug, Clone)]
pub struct Scrape {
    /// Seconds since the recording started.
    pub at: f64,
    /// The target's `job` label.
    pub job: String,
    /// The target's `instance` label (its admin address).
    pub instance: String,
    /// The `/metrics` text.
    pub text: String,
}

/// What a [`Recorder`] scrapes: job, admin address.
pub type Targets = Arc<Mutex<Vec<(String, SocketAddr)>>>;

/// Scrapes every target's `/metrics` at a fixed interval on its own thread, like a Prometheus
/// server would; a target that does not answer is skipped for that round.
#[derive(Debug)]
pub struct Recorder {
    /// The targets: change them while it runs (a new process, one gone).
    pub targets: Targets,
    /// The wall-clock time the recording started, as Unix seconds.
    pub started_unix: f64,
    started: Instant,
    scrapes: Arc<Mutex<Vec<Scrape>>>,
    rounds: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recorder {
    /// Starts scraping every `every`.
    pub fn start(every: Duration) -> Recorder {
        let targets: Targets = Arc::default();
        let scrapes: Arc<Mutex<Vec<Scrape>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let rounds: Arc<AtomicUsize> = Arc::default();
        let started = Instant::now();
        let started_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let thread = {
            let (targets, scrapes, stop) = (targets.clone(), scrapes.clone(), stop.clone());
            let rounds = rounds.clone();
            std::thread::spawn(move || {
                let mut next = started;
                while !stop.load(Ordering::SeqCst) {
                    let round: Vec<(String, SocketAddr)> = targets.lock().clone();
                    let at = next.saturating_duration_since(started).as_secs_f64();
                    for (job, addr) in round {
                        if let Ok((200, text)) =
                            crate::http::try_http(addr, "GET", "/metrics", None)
                        {
                            scrapes.lock().push(Scrape {
                                at,
                                job,
                                instance: addr.to_string(),
                                text,
                            });
                        }
                    }
                    rounds.fetch_add(1, Ordering::SeqCst);
                    next += every;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        next = now;
                    }
                }
            })
        };
        Recorder {
            targets,
            started_unix,
            started,
            scrapes,
            rounds,
            stop,
            thread: Some(thread),
        }
    }

    /// Waits (up to `timeout`) until `n` more scrape rounds are done: what a Prometheus
    /// server sees after an event, e.g. a target gone. Whether they were.
    pub fn wait_rounds(&self, n: usize, timeout: Duration) -> bool {
        let target = self.rounds.load(Ordering::SeqCst) + n;
        let end = Instant::now() + timeout;
        while self.rounds.load(Ordering::SeqCst) < target {
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Seconds since the recording started.
    pub fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Adds a target.
    pub fn add(&self, job: &str, admin: SocketAddr) {
        self.targets.lock().push((job.to_string(), admin));
    }

    /// Removes a target (its process left).
    pub fn remove(&self, admin: SocketAddr) {
        self.targets.lock().retain(|(_, a)| *a != admin);
    }

    /// The scrapes so far.
    pub fn scrapes(&self) -> Vec<Scrape> {
        self.scrapes.lock().clone()
    }

    /// Stops scraping; returns every scrape.
    pub fn finish(mut self) -> Vec<Scrape> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.scrapes()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The names every scrape of `job` served.
pub fn served_by(scrapes: &[Scrape], job: &str) -> BTreeSet<String> {
    scrapes
        .iter()
        .filter(|s| s.job == job)
        .flat_map(|s| served_names(&s.text))
        .collect()
}

/// One sample line: `name{labels} value`, labels as written.
fn sample(line: &str) -> Option<(String, String, f64)> {
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let (series, rest) = match line.find('{') {
        Some(_) => {
            let close = line.rfind('}')?;
            (line.get(..=close)?, line.get(close + 1..)?)
        }
        None => line.split_at(line.find(' ')?),
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    let (name, labels) = match series.find('{') {
        Some(open) => (
            &series[..open],
            series[open + 1..series.len() - 1].to_string(),
        ),
        None => (series, String::new()),
    };
    Some((name.to_string(), labels, value))
}

/// The scrapes as a promtool test's `input_series` (YAML, indented for a test's list item):
/// one series per name and label set with `job` and `instance` added, one value per
/// `interval` from the first scrape on (the last scrape in each slot), `_` for a slot with no
/// scrape of that target, `stale` once the target was scraped for the last time (it left).
/// `*_timestamp_seconds` values are moved to the test's clock (which starts at 0 at the
/// recording's start, `started_unix`), so that `time()` in a rule means what it meant live.
pub fn promtool_input_series(scrapes: &[Scrape], interval: Duration, started_unix: f64) -> String {
    let step = interval.as_secs_f64();
    let slot = |at: f64| (at / step).round() as usize;
    let Some(last) = scrapes.iter().map(|s| slot(s.at)).max() else {
        return "    input_series: []\n".to_string();
    };
    // target -> slots scraped; series -> slot -> value
    let mut seen: BTreeMap<(String, String), BTreeSet<usize>> = BTreeMap::new();
    let mut series: BTreeMap<(String, String, String), BTreeMap<usize, f64>> = BTreeMap::new();
    for s in scrapes {
        let target = (s.job.clone(), s.instance.clone());
        seen.entry(target.clone()).or_default().insert(slot(s.at));
        for line in s.text.lines() {
            let Some((name, labels, mut value)) = sample(line) else {
                continue;
            };
            if name.ends_with("_timestamp_seconds") && value > 0.0 {
                value -= started_unix;
            }
            series
                .entry((
                    s.job.clone(),
                    s.instance.clone(),
                    format!("{name}\u{0}{labels}"),
                ))
                .or_default()
                .insert(slot(s.at), value);
        }
    }
    let mut out = String::from("    input_series:\n");
    for ((job, instance, key), values) in &series {
        let (name, labels) = key.split_once('\u{0}').unwrap_or((key, ""));
        let slots = &seen[&(job.clone(), instance.clone())];
        let first = *slots.first().unwrap_or(&0);
        let end = *slots.last().unwrap_or(&0);
        let mut vals = Vec::with_capacity(last + 1);
        for i in 0..=last.min(end + 1) {
            vals.push(if i > end {
                "stale".to_string()
            } else if i < first || !slots.contains(&i) {
                "_".to_string()
            } else {
                match values.get(&i) {
                    Some(v) => format!("{v}"),
                    None => "_".to_string(),
                }
            });
        }
        let mut all = format!("job=\"{job}\", instance=\"{instance}\"");
        if !labels.is_empty() {
            let _ = write!(all, ", {labels}");
        }
        let _ = writeln!(out, "      - series: '{name}{{{all}}}'");
        let _ = writeln!(out, "        values: '{}'", vals.join(" "));
    }
    out
}

/// Runs `promtool test rules` on a test of `rules` (a rule file) with `input` (from
/// [`promtool_input_series`]) and `cases` (the test's `alert_rule_test` and
/// `promql_expr_test` lists, YAML indented for the test's list item), evaluated every
/// `interval`. The file is written to `dir`; returns promtool's output, or it as the error.
pub fn promtool_test(
    rules: &Path,
    name: &str,
    interval: Duration,
    input: &str,
    cases: &str,
    dir: &Path,
) -> Result<String, String> {
    let ms = interval.as_millis();
    let rules = rules
        .canonicalize()
        .map_err(|e| format!("{}: {e}", rules.display()))?;
    let text = format!(
        "rule_files:\n  - {}\nevaluation_interval: {ms}ms\ntests:\n  - name: {name:?}\n    interval: {ms}ms\n{input}{cases}",
        rules.display()
    );
    let path = dir.join(format!(
        "{}.test.yaml",
        name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
    ));
    std::fs::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    let out = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&path)
        .output()
        .map_err(|e| format!("promtool (Debian's prometheus package, scripts/setup.sh): {e}"))?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(report)
    } else {
        Err(format!("promtool test rules {}:\n{report}", path.display()))
    }
}

/// The alert names of a rule file.
pub fn alert_names(rules: &Path) -> Vec<String> {
    let text =
        std::fs::read_to_string(rules).unwrap_or_else(|e| panic!("{}: {e}", rules.display()));
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|n| n.trim().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_expressions() {
        let n = selected_metrics(
            "sum by (le) (rate(a_bucket{job=~\"$job\"}[$__rate_interval])) / on() group_left b and absent(c == 0)",
        )
        .unwrap();
        assert_eq!(n.into_iter().collect::<Vec<_>>(), ["a_bucket", "b", "c"]);
        let n = selected_metrics("label_values(spoa_inflight{namespace=~\"$namespace\"}, job)")
            .unwrap();
        assert_eq!(n.into_iter().collect::<Vec<_>>(), ["spoa_inflight"]);
        assert!(selected_metrics("sum(rate(x[5m])").is_err());
        assert!(selected_metrics("{__name__=~\"a|b\"}").is_err());
    }

    #[test]
    fn names_served() {
        let text = "# TYPE spoa_requests counter\n# TYPE spoa_eval histogram\n\
                    # TYPE g gauge\nother_total{a=\"1\"} 3\n# EOF\n";
        let n = served_names(text);
        for name in [
            "spoa_requests_total",
            "spoa_eval_bucket",
            "spoa_eval_count",
            "g",
            "other_total",
        ] {
            assert!(n.contains(name), "{name}: {n:?}");
        }
        assert!(!n.contains("spoa_requests"));
    }

    #[test]
    fn input_series() {
        let s = |at: f64, text: &str| Scrape {
            at,
            job: "j".into(),
            instance: "i:1".into(),
            text: text.into(),
        };
        let scrapes = [
            s(0.0, "a 1\nb{x=\"y\"} 2\nt_timestamp_seconds 0\n"),
            s(1.0, "a 2\nt_timestamp_seconds 1000010\n"),
            s(3.0, "a 4\nb{x=\"y\"} 5\n"),
        ];
        let y = promtool_input_series(&scrapes, Duration::from_secs(1), 1_000_000.0);
        assert!(
            y.contains("series: 'a{job=\"j\", instance=\"i:1\"}'\n        values: '1 2 _ 4'"),
            "{y}"
        );
        assert!(
            y.contains(
                "series: 'b{job=\"j\", instance=\"i:1\", x=\"y\"}'\n        values: '2 _ _ 5'"
            ),
            "{y}"
        );
        assert!(y.contains("values: '0 10 _ _'"), "{y}");
    }
}
