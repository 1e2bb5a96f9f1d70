//! The two text formats `/metrics` can be written in: OpenMetrics 1.0 (prometheus-client's,
//! the default) and Prometheus's text format 0.0.4 (what coturn's exporter serves, and the
//! only one in which a counter may be named without `_total`: coturn's `turn_traffic_rcvp`
//! and `stun_binding_request` are counters by those very names).
//!
//! [`to_prometheus_text`] rewrites prometheus-client's OpenMetrics text into 0.0.4: a counter
//! family `x` (samples `x_total`) becomes the family `x_total`, an info family `x` the gauge
//! `x_info`, `unknown` is `untyped`, a stateset a gauge; `# UNIT`, `# EOF`, `_created`
//! samples and exemplars, which 0.0.4 has not, are left out. The samples' names, labels and
//! values are unchanged, so a query finds the same series in either format.

/// The content type of Prometheus's text format 0.0.4 (coturn's).
pub(crate) const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// prometheus-client's OpenMetrics text as Prometheus text 0.0.4.
pub(crate) fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // The family's HELP waits for its TYPE, which decides the name both lines carry.
    let mut help: Option<(&str, String)> = None;
    let mut family: Option<(String, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text.replace("\\\"", "\"")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (exposed, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "stateset" => (name.to_string(), "gauge"),
                "gaugehistogram" => (name.to_string(), "histogram"),
                "unknown" => (name.to_string(), "untyped"),
                other => (name.to_string(), other),
            };
            if let Some((h, text)) = help.take() {
                if h == name {
                    out.push_str(&format!("# HELP {exposed} {text}\n"));
                }
            }
            out.push_str(&format!("# TYPE {exposed} {kind}\n"));
            family = Some((name.to_string(), kind));
        } else if line.starts_with("# ") {
            // `# UNIT`, `# EOF`: not in 0.0.4.
        } else if !line.is_empty() {
            let sample = line.split(" # ").next().unwrap_or(line);
            let created = family.as_ref().is_some_and(|(name, kind)| {
                *kind == "counter"
                    && sample
                        .strip_prefix(name.as_str())
                        .is_some_and(|r| r.starts_with("_created"))
            });
            if !created {
                out.push_str(sample);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_families_become_their_prometheus_text_names() {
        let om = "\
# HELP requests Requests \\\"served\\\".
# TYPE requests counter
requests_total{path=\"/\"} 3
requests_created{path=\"/\"} 1700000000.0
# HELP phase Phase.
# TYPE phase gauge
phase 2
# HELP drain_duration_seconds Time.
# TYPE drain_duration_seconds gauge
# UNIT drain_duration_seconds seconds
drain_duration_seconds 0.5
# HELP build Build.
# TYPE build info
build_info{version=\"1\"} 1
# HELP latency Latency.
# TYPE latency histogram
latency_bucket{le=\"0.1\"} 1 # {trace_id=\"x\"} 0.05
latency_bucket{le=\"+Inf\"} 2
latency_sum 0.3
latency_count 2
# TYPE odd unknown
odd 1
# EOF
";
        let want = "\
# HELP requests_total Requests \"served\".
# TYPE requests_total counter
requests_total{path=\"/\"} 3
# HELP phase Phase.
# TYPE phase gauge
phase 2
# HELP drain_duration_seconds Time.
# TYPE drain_duration_seconds gauge
drain_duration_seconds 0.5
# HELP build_info Build.
# TYPE build_info gauge
build_info{version=\"1\"} 1
# HELP latency Latency.
# TYPE latency histogram
latency_bucket{le=\"0.1\"} 1
latency_bucket{le=\"+Inf\"} 2
latency_sum 0.3
latency_count 2
# TYPE odd untyped
odd 1
";
        assert_eq!(to_prometheus_text(om), want);
    }

    #[test]
    fn what_prometheus_client_writes_converts() {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::gauge::Gauge;
        let mut reg = prometheus_client::registry::Registry::default();
        let c: Counter = Counter::default();
        c.inc_by(7);
        reg.register("lastcall_reloads", "Reloads", c);
        let g: Gauge = Gauge::default();
        g.set(3);
        reg.register("lastcall_sessions", "Sessions", g);
        let mut om = String::new();
        prometheus_client::encoding::text::encode(&mut om, &reg).unwrap();
        let text = to_prometheus_text(&om);
        assert!(
            text.contains("# TYPE lastcall_reloads_total counter\nlastcall_reloads_total 7\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE lastcall_sessions gauge\nlastcall_sessions 3\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
    }
}
