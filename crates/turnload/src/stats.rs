//! Latency histograms (1 µs buckets) and readers for `/proc/PID/stat` and `/proc/PID/status`.

use std::fs;

/// Largest latency with its own bucket; larger ones land in the last bucket.
pub const MAX_US: usize = 200_000;

/// A histogram of round-trip times in microseconds.
#[derive(Clone, Debug)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: vec![0; MAX_US + 1],
            count: 0,
            max: 0,
        }
    }
}

impl Histogram {
    /// Records one value.
    pub fn record(&mut self, us: u64) {
        let i = usize::try_from(us).unwrap_or(MAX_US).min(MAX_US);
        if let Some(b) = self.buckets.get_mut(i) {
            *b += 1;
        }
        self.count += 1;
        self.max = self.max.max(us);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Adds `other` into this one.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.max = self.max.max(other.max);
    }

    /// The `q` quantile (0..=1) in µs; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b;
            if seen >= rank {
                return Some(if i == MAX_US { self.max } else { i as u64 });
            }
        }
        Some(self.max)
    }

    /// Clears every bucket.
    pub fn reset(&mut self) {
        self.buckets.iter_mut().for_each(|b| *b = 0);
        self.count = 0;
        self.max = 0;
    }
}

/// utime + stime of a process in clock ticks (all its threads), from `/proc/PID/stat`.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    parse_stat_ticks(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses: start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut f = rest.split_whitespace();
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = f.nth(11)?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Resident memory of a process in KiB, from `VmRSS` in `/proc/PID/status`.
pub fn rss_kib(pid: u32) -> Option<u64> {
    parse_vmrss(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

fn parse_vmrss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), None);
        for us in 1..=100 {
            h.record(us);
        }
        assert_eq!(h.quantile(0.5), Some(50));
        assert_eq!(h.quantile(0.99), Some(99));
        assert_eq!(h.quantile(1.0), Some(100));
        h.record(10_000_000);
        assert_eq!(h.quantile(1.0), Some(10_000_000));
        let mut g = Histogram::default();
        g.merge(&h);
        assert_eq!(g.count(), 101);
        g.reset();
        assert_eq!(g.count(), 0);
    }

    #[test]
    fn proc_parsers() {
        let stat = "1234 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 37 0 0 20 0 4 0 100";
        assert_eq!(parse_stat_ticks(stat), Some(287));
        assert_eq!(parse_stat_ticks("garbage"), None);
        let status = "Name:\tx\nVmPeak:\t 100 kB\nVmRSS:\t    5120 kB\n";
        assert_eq!(parse_vmrss(status), Some(5120));
        let me = std::process::id();
        assert!(cpu_ticks(me).is_some());
        assert!(rss_kib(me).unwrap() > 0);
    }
}
