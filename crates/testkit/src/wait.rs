//! Waiting for a condition with a bound, never for a fixed time.

use std::time::{Duration, Instant};

/// Generous bound for anything a test waits for on a busy machine.
pub const WAIT: Duration = Duration::from_secs(30);

/// How often [`wait_until`] looks again.
const POLL: Duration = Duration::from_millis(20);

/// Calls `check` until it returns `Some`, every 20 ms, for at most `timeout`; returns the
/// value. Panics on timeout, naming `what` was awaited.
pub fn wait_until<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within {timeout:?}");
        std::thread::sleep(POLL);
    }
}

/// Like [`wait_until`] for a condition: waits until `check` returns `true`.
pub fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    wait_until(what, timeout, || check().then_some(()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_first_value() {
        let mut n = 0;
        let v = wait_until("three calls", WAIT, || {
            n += 1;
            (n == 3).then_some(n)
        });
        assert_eq!(v, 3);
    }

    #[test]
    #[should_panic(expected = "never: not within")]
    fn panics_at_the_bound() {
        wait_for("never", Duration::from_millis(50), || false);
    }
}
