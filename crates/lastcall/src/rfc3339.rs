//! RFC 3339 timestamps in UTC, with no time-zone database: the drain status's times (to the
//! millisecond) and lastcall-spoa's coraza-spoa log lines (to the second, as zerolog writes
//! them).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The last second RFC 3339's four-digit year can write.
const MAX_SECS: u64 = 253_402_300_799; // 9999-12-31T23:59:59Z

/// `2026-11-29T17:50:54.123Z`.
pub fn millis(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    format!("{}.{:03}Z", date_time(d.as_secs()), d.subsec_millis())
}

/// `2026-12-01T11:56:52Z`: Go's `time.RFC3339` in UTC.
pub fn seconds(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{}Z", date_time(secs))
}

/// `YYYY-MM-DDTHH:MM:SS` of `secs` since the epoch (capped at the year 9999).
fn date_time(secs: u64) -> String {
    let secs = secs.min(MAX_SECS);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's method).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_the_millisecond() {
        assert_eq!(millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_974_654_123);
        assert_eq!(millis(t), "2026-11-29T17:50:54.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(millis(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn to_the_second() {
        let at = |s: u64| seconds(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_796_125_012), "2026-12-01T11:36:52Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59Z");
        assert_eq!(at(300_000_000_000), "9999-12-31T23:59:59Z");
    }
}
