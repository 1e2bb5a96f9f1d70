//! A budget of log lines per second for what clients can cause at will (authentication
//! refusals): the first few of each second are logged, the rest only counted, and the count
//! is logged with the next line that gets through.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// At most `per_window` lines per `window`.
pub(crate) struct LogBudget {
    per_window: u32,
    window: Duration,
    state: Mutex<State>,
}

struct State {
    started: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl LogBudget {
    pub(crate) const fn new(per_window: u32, window: Duration) -> LogBudget {
        LogBudget {
            per_window,
            window,
            state: Mutex::new(State {
                started: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether a line may be logged at `now`: `Some(n)` with the lines left out since the
    /// last one logged (to say so), `None` to leave this one out.
    pub(crate) fn admit(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock();
        let fresh = s
            .started
            .is_none_or(|t| now.saturating_duration_since(t) >= self.window);
        if fresh {
            s.started = Some(now);
            s.logged = 0;
        }
        if s.logged >= self.per_window {
            s.suppressed += 1;
            return None;
        }
        s.logged += 1;
        Some(std::mem::take(&mut s.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_lines_a_window_and_the_count_of_the_rest() {
        let b = LogBudget::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        let got: Vec<Option<u64>> = (0..6).map(|_| b.admit(t0)).collect();
        assert_eq!(got, [Some(0), Some(0), Some(0), None, None, None]);
        let t1 = t0 + Duration::from_millis(999);
        assert_eq!(b.admit(t1), None);
        let t2 = t0 + Duration::from_secs(1);
        assert_eq!(b.admit(t2), Some(4));
        assert_eq!(b.admit(t2), Some(0));
    }
}
