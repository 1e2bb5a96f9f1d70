//! The one Prometheus scraper of the tests: a daemon's `/metrics` text and the value of one
//! series in it.

use std::net::ToSocketAddrs;
use std::time::Duration;

use crate::http::http_get;
use crate::wait::wait_until;

/// The `/metrics` text of the admin listener at `admin`. Panics unless it answers 200.
pub fn scrape(admin: impl ToSocketAddrs) -> String {
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200, "GET /metrics: {body}");
    body
}

/// The value of series `series` (`name` or `name{labels}`, exactly as exported) in the
/// exposition `text`, if present.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// [`value`], 0 when the series is absent (a counter not incremented yet).
pub fn metric_value(text: &str, series: &str) -> f64 {
    value(text, series).unwrap_or(0.0)
}

/// The value of `series` scraped from `admin` now, if present.
pub fn metric(admin: impl ToSocketAddrs, series: &str) -> Option<f64> {
    value(&scrape(admin), series)
}

/// Waits (up to `timeout`) until `series` at `admin` is at least `min`; returns its value.
pub fn wait_at_least(
    admin: impl ToSocketAddrs + Copy,
    series: &str,
    min: f64,
    timeout: Duration,
) -> f64 {
    wait_until(&format!("{series} >= {min}"), timeout, || {
        metric(admin, series).filter(|v| *v >= min)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_exact_series() {
        let text = "# TYPE spoa_requests_total counter\n\
                    spoa_requests_total{verdict=\"allow\"} 7\n\
                    spoa_requests_total{verdict=\"allow_more\"} 9\n\
                    spoa_inflight 0\n\
                    turn_total_allocations{type=\"UDP\"} 2 1700000000000\n";
        assert_eq!(
            value(text, "spoa_requests_total{verdict=\"allow\"}"),
            Some(7.0)
        );
        assert_eq!(value(text, "spoa_inflight"), Some(0.0));
        assert_eq!(
            value(text, "turn_total_allocations{type=\"UDP\"}"),
            Some(2.0)
        );
        assert_eq!(value(text, "spoa_requests"), None);
        assert_eq!(metric_value(text, "spoa_absent"), 0.0);
    }
}
