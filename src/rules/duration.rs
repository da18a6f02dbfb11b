//! Window lengths in rules files: envoyproxy/ratelimit's unit names, or
//! Sluice's durations such as `90s`, `5m` or `1h30m`.

use crate::limiter::unit::{DAY, HOUR, MAX_DURATION_MS, MINUTE, SECOND, Unit, WEEK};

/// Parses a `unit` value: a unit name (any case) or a duration. Returns the
/// window in milliseconds and the unit to report.
pub fn parse_unit(text: &str) -> Result<(u64, Unit), String> {
    if let Some(unit) = Unit::from_proto_name(text)
        && let Some(ms) = unit.millis()
    {
        return Ok((ms, unit));
    }
    let ms = parse_duration(text).map_err(|e| {
        format!("invalid rate limit unit '{text}': {e} (use second, minute, hour, day, week, month, year, or a duration such as 90s or 5m)")
    })?;
    Ok((ms, Unit::of_window(ms)))
}

/// Parses a duration such as `250ms`, `90s`, `5m`, `1h30m`, `2d` or `1w` into
/// milliseconds; it must be positive.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    if text.starts_with('-') {
        return Err("a duration must be positive".into());
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("expected a number at '{rest}'"));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| "number too large".to_string())?;
        rest = &rest[digits..];
        let suffix = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..suffix] {
            "ms" => 1,
            "s" => SECOND,
            "m" => MINUTE,
            "h" => HOUR,
            "d" => DAY,
            "w" => WEEK,
            "" => return Err(format!("'{text}' needs a unit suffix (ms, s, m, h, d, w)")),
            other => return Err(format!("unknown duration suffix '{other}'")),
        };
        rest = &rest[suffix..];
        total = number
            .checked_mul(scale)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| "duration too large".to_string())?;
    }
    if total == 0 {
        return Err("a duration must be positive".into());
    }
    if total > MAX_DURATION_MS {
        return Err(format!(
            "a duration may be at most 100 years ({MAX_DURATION_MS}ms)"
        ));
    }
    Ok(total)
}

/// A duration as rules files write one: the largest of `d`, `h`, `m`, `s`
/// that divides it exactly (`1d`, `90m`, `66s`), else milliseconds.
pub fn duration_text(ms: u64) -> String {
    [(DAY, "d"), (HOUR, "h"), (MINUTE, "m"), (SECOND, "s")]
        .iter()
        .find(|(len, _)| ms >= *len && ms.is_multiple_of(*len))
        .map_or_else(
            || format!("{ms}ms"),
            |(len, unit)| format!("{}{unit}", ms / len),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names_are_case_insensitive_and_fixed_length() {
        assert_eq!(parse_unit("MINUTE"), Ok((60_000, Unit::Minute)));
        assert_eq!(parse_unit("month"), Ok((30 * 86_400_000, Unit::Month)));
        assert_eq!(parse_unit("Year"), Ok((365 * 86_400_000, Unit::Year)));
    }

    #[test]
    fn durations_report_a_named_unit_only_when_exact() {
        assert_eq!(parse_unit("60s"), Ok((60_000, Unit::Minute)));
        assert_eq!(parse_unit("5m"), Ok((300_000, Unit::Unknown)));
        assert_eq!(parse_unit("1h30m"), Ok((5_400_000, Unit::Unknown)));
        assert_eq!(parse_unit("250ms"), Ok((250, Unit::Unknown)));
    }

    #[test]
    fn the_longest_duration_is_100_years() {
        assert_eq!(parse_duration("5214w"), Ok(5214 * WEEK));
        assert_eq!(parse_duration("3153600000000ms"), Ok(MAX_DURATION_MS));
        let err = parse_duration("3153600000001ms").unwrap_err();
        assert!(err.contains("at most 100 years"), "{err}");
    }

    #[test]
    fn durations_are_written_in_their_largest_exact_unit() {
        let written: Vec<_> = [DAY, 4 * HOUR, 90 * MINUTE, 66 * SECOND, 1_500, 0]
            .into_iter()
            .map(duration_text)
            .collect();
        assert_eq!(written, ["1d", "4h", "90m", "66s", "1500ms", "0ms"]);
        assert_eq!(parse_duration(&duration_text(90 * MINUTE)), Ok(90 * MINUTE));
    }

    #[test]
    fn bad_durations_are_rejected() {
        for bad in [
            "",
            "0s",
            "-5s",
            "5",
            "5x",
            "foo",
            "s",
            "99999999999999999999s",
            "9223372036854775807ms",
            "5215w",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(
            parse_unit("fortnight")
                .unwrap_err()
                .contains("invalid rate limit unit")
        );
    }
}
