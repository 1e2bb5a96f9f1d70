//! Durations as operators write them: `30s`, `5m`, `1h30m`, `250ms`, or bare seconds (`30`).
//!
//! Units are `ms`, `s`, `m`, `h` and `d`; components may be chained from the largest to the
//! smallest (`1h30m`, `1m30s`, `2s500ms`). Whole numbers only. [`format()`] writes the same
//! syntax back, so `parse(&format(d)) == Ok(d)` for whole milliseconds.

use std::time::Duration;

/// Why a duration could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing was given.
    #[error("empty duration")]
    Empty,
    /// A unit without a number in front, or a character that is neither digit nor unit.
    #[error("expected a number at `{0}` (write e.g. 30s, 5m, 1h30m, 250ms or 30)")]
    ExpectedNumber(String),
    /// A number followed by an unknown unit.
    #[error("unknown unit `{0}` (use ms, s, m, h or d)")]
    UnknownUnit(String),
    /// A number without a unit that is not the only component (`1h30`).
    #[error("missing unit after `{0}` (a bare number is only allowed alone, meaning seconds)")]
    MissingUnit(String),
    /// Units out of order or repeated (`30s1m`).
    #[error("units must go from the largest to the smallest, each at most once")]
    Order,
    /// Too large to represent.
    #[error("duration too large")]
    Overflow,
}

/// Parses `30s`, `5m`, `1h30m`, `250ms`, `1d`, or a bare number of seconds.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = text.parse().map_err(|_| DurationError::Overflow)?;
        return Ok(Duration::from_secs(secs));
    }
    let mut total_ms: u64 = 0;
    let mut last_rank = usize::MAX;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(DurationError::ExpectedNumber(rest.to_string()));
        }
        let (number, after) = rest.split_at(digits);
        let value: u64 = number.parse().map_err(|_| DurationError::Overflow)?;
        let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        if unit_len == 0 {
            return Err(DurationError::MissingUnit(number.to_string()));
        }
        let (unit, after) = after.split_at(unit_len);
        let (rank, ms_per_unit) = unit_scale(unit)?;
        if rank >= last_rank {
            return Err(DurationError::Order);
        }
        last_rank = rank;
        let ms = value
            .checked_mul(ms_per_unit)
            .ok_or(DurationError::Overflow)?;
        total_ms = total_ms.checked_add(ms).ok_or(DurationError::Overflow)?;
        rest = after;
    }
    Ok(Duration::from_millis(total_ms))
}

/// Rank (larger unit = larger rank) and milliseconds per unit.
fn unit_scale(unit: &str) -> Result<(usize, u64), DurationError> {
    match unit {
        "ms" => Ok((0, 1)),
        "s" => Ok((1, 1_000)),
        "m" => Ok((2, 60_000)),
        "h" => Ok((3, 3_600_000)),
        "d" => Ok((4, 86_400_000)),
        other => Err(DurationError::UnknownUnit(other.to_string())),
    }
}

/// Formats a duration in the syntax [`parse`] accepts: `0s`, `250ms`, `30s`, `1h30m`,
/// `2s500ms`. Sub-millisecond parts are dropped.
pub fn format(duration: Duration) -> String {
    let mut ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    for (unit, per) in [
        ("d", 86_400_000u64),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        let n = ms / per;
        if n > 0 {
            out.push_str(&n.to_string());
            out.push_str(unit);
            ms %= per;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse(" 2s500ms "), Ok(Duration::from_millis(2500)));
        assert_eq!(parse("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse("1h1m1s1ms"), Ok(Duration::from_millis(3_661_001)));
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        assert_eq!(parse(""), Err(DurationError::Empty));
        assert_eq!(parse("   "), Err(DurationError::Empty));
        assert!(matches!(parse("s"), Err(DurationError::ExpectedNumber(_))));
        assert!(matches!(
            parse("-5s"),
            Err(DurationError::ExpectedNumber(_))
        ));
        assert!(matches!(parse("1.5s"), Err(DurationError::MissingUnit(_))));
        assert!(matches!(parse("5x"), Err(DurationError::UnknownUnit(u)) if u == "x"));
        assert!(matches!(parse("5sec"), Err(DurationError::UnknownUnit(_))));
        assert!(matches!(parse("1h30"), Err(DurationError::MissingUnit(_))));
        assert_eq!(parse("30s1m"), Err(DurationError::Order));
        assert_eq!(parse("1s1s"), Err(DurationError::Order));
        assert_eq!(parse("99999999999999999999"), Err(DurationError::Overflow));
        assert_eq!(parse("999999999999999d"), Err(DurationError::Overflow));
    }

    #[test]
    fn format_round_trips() {
        for text in [
            "0s",
            "250ms",
            "30s",
            "5m",
            "1h30m",
            "2s500ms",
            "1d",
            "1h1m1s1ms",
        ] {
            let d = parse(text).unwrap();
            assert_eq!(format(d), text);
            assert_eq!(parse(&format(d)), Ok(d));
        }
        assert_eq!(format(Duration::from_secs(90)), "1m30s");
        assert_eq!(format(Duration::from_micros(1500)), "1ms");
    }
}
