//! Latency histograms with 1 µs buckets.

/// Largest latency with its own bucket; larger ones land in the last bucket.
pub(crate) const MAX_US: usize = 200_000;

/// A histogram of round-trip times in microseconds.
#[derive(Clone, Debug)]
pub(crate) struct Histogram {
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
    pub(crate) fn record(&mut self, us: u64) {
        let i = usize::try_from(us).unwrap_or(MAX_US).min(MAX_US);
        if let Some(b) = self.buckets.get_mut(i) {
            *b += 1;
        }
        self.count += 1;
        self.max = self.max.max(us);
    }

    /// Values recorded.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// The `q` quantile (0..=1) in µs; `None` when empty.
    pub(crate) fn quantile(&self, q: f64) -> Option<u64> {
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
        assert_eq!(h.count(), 101);
    }
}
