//! Calendar periods: the day, week, month or year that contains an instant
//! in a time zone of the IANA database, as billing counts them ("10 M
//! tokens a month, reset on the 1st at midnight, Paris time").
//!
//! A period starts at midnight local time (a week on Monday, a month on its
//! 1st, a year on January 1st) and ends where the next one starts, so its
//! length follows the calendar and the zone's rules: 23 or 25 hours on the
//! days clocks change, 28 to 31 days for a month. Zone data comes from
//! `jiff`'s copy of the IANA database, built into the binary (the same
//! answers on every host, a container image without `/usr/share/zoneinfo`
//! included).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, ZonedDateTime};

use crate::limiter::Millis;
use crate::limiter::unit::{DAY, MONTH, WEEK, YEAR};

/// Which calendar period a limit counts over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Period {
    Day = 0,
    Week = 1,
    Month = 2,
    Year = 3,
}

impl Period {
    /// The period a rule's `unit` names, if it names one.
    pub fn of_unit(unit: &str) -> Option<Period> {
        match unit.to_ascii_lowercase().as_str() {
            "day" => Some(Period::Day),
            "week" => Some(Period::Week),
            "month" => Some(Period::Month),
            "year" => Some(Period::Year),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
            Period::Year => "year",
        }
    }

    /// The unit's nominal length (a month 30 days, a year 365), which names
    /// the counter: a limit's counter stays the same from one period to the
    /// next whatever their lengths.
    pub fn nominal_ms(self) -> Millis {
        match self {
            Period::Day => DAY,
            Period::Week => WEEK,
            Period::Month => MONTH,
            Period::Year => YEAR,
        }
    }
}

/// A time zone, by its IANA name: loaded once per process and kept (a
/// rules file names a handful), so that a limit stays `Copy`.
#[derive(Clone, Copy)]
pub struct Zone(&'static Loaded);

struct Loaded {
    name: String,
    tz: TimeZone,
    /// The period of each unit last asked for (`(0, 0)`: none), so that a
    /// request in it costs a lock rather than a time zone conversion.
    recent: parking_lot::Mutex<[(Millis, Millis); 4]>,
}

impl Loaded {
    fn new(name: &str, tz: TimeZone) -> Self {
        Loaded {
            name: name.to_owned(),
            tz,
            recent: parking_lot::Mutex::new([(0, 0); 4]),
        }
    }
}

impl Zone {
    /// The zone named `name` (`Europe/Paris`, `UTC`, …), or why there is none.
    pub fn get(name: &str) -> Result<Zone, String> {
        static ZONES: OnceLock<Mutex<HashMap<String, &'static Loaded>>> = OnceLock::new();
        let mut zones = ZONES
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(loaded) = zones.get(name) {
            return Ok(Zone(loaded));
        }
        let tz = TimeZone::get(name).map_err(|_| {
            format!("unknown time zone '{name}' (an IANA name such as Europe/Paris, or UTC)")
        })?;
        let loaded: &'static Loaded = Box::leak(Box::new(Loaded::new(name, tz)));
        zones.insert(name.to_owned(), loaded);
        Ok(Zone(loaded))
    }

    /// UTC, which needs no database.
    pub fn utc() -> Zone {
        static UTC: OnceLock<Loaded> = OnceLock::new();
        Zone(UTC.get_or_init(|| Loaded::new("UTC", TimeZone::UTC)))
    }

    pub fn name(self) -> &'static str {
        &self.0.name
    }
}

impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Zone {}

impl std::hash::Hash for Zone {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl std::fmt::Debug for Zone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A calendar period in a zone: what a limit with `calendar:` counts over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Calendar {
    pub period: Period,
    pub zone: Zone,
}

impl Calendar {
    /// Days in UTC.
    pub fn utc_days() -> Calendar {
        Calendar {
            period: Period::Day,
            zone: Zone::utc(),
        }
    }

    /// The period containing `now`: its start and its end (the next one's
    /// start), in milliseconds since the Unix epoch; `start <= now < end`.
    pub fn bounds(self, now: Millis) -> (Millis, Millis) {
        let recent = &self.zone.0.recent;
        let unit = self.period as usize;
        let (start, end) = recent.lock()[unit];
        if start <= now && now < end {
            return (start, end);
        }
        let found = self.compute(now);
        recent.lock()[unit] = found;
        found
    }

    fn compute(self, now: Millis) -> (Millis, Millis) {
        let at = i64::try_from(now)
            .ok()
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            .unwrap_or(Timestamp::MAX);
        let local = at.to_zoned_datetime(self.zone.0.tz.clone());
        match self.period_at(&local) {
            Some((start, end)) => (millis(&start), millis(&end)),
            // Only past the last instant jiff represents (year 9999): one
            // period from now, never a panic.
            None => (now, now.saturating_add(self.period.nominal_ms())),
        }
    }

    fn period_at(self, local: &ZonedDateTime) -> Option<(ZonedDateTime, ZonedDateTime)> {
        let first_day = match self.period {
            Period::Day => local.clone(),
            Period::Week => {
                let back = i64::from(local.weekday().to_monday_zero_offset());
                local.checked_sub(back.days()).ok()?
            }
            Period::Month => local.first_of_month().ok()?,
            Period::Year => local.first_of_year().ok()?,
        };
        let start = first_day.start_of_day().ok()?;
        let next = match self.period {
            Period::Day => start.date().tomorrow().ok()?,
            Period::Week => start.date().checked_add(7.days()).ok()?,
            Period::Month => start.date().checked_add(1.month()).ok()?,
            Period::Year => start.date().checked_add(1.year()).ok()?,
        };
        let end = next
            .to_zoned_datetime(self.zone.0.tz.clone())
            .ok()?
            .start_of_day()
            .ok()?;
        Some((start, end))
    }
}

fn millis(t: &ZonedDateTime) -> Millis {
    u64::try_from(t.timestamp().as_millisecond()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Millis {
        let t: Timestamp = text.parse().expect("an RFC 3339 instant");
        u64::try_from(t.as_millisecond()).expect("after 1970")
    }

    fn bounds(period: Period, zone: &str, now: &str) -> (Millis, Millis) {
        let zone = Zone::get(zone).expect("a zone");
        Calendar { period, zone }.bounds(at(now))
    }

    #[test]
    fn a_month_runs_from_the_first_at_local_midnight_to_the_next_first() {
        // Paris is UTC+1 in January and February.
        assert_eq!(
            bounds(Period::Month, "Europe/Paris", "2026-01-31T22:59:59.999Z"),
            (at("2025-12-31T23:00:00Z"), at("2026-01-31T23:00:00Z"))
        );
        assert_eq!(
            bounds(Period::Month, "Europe/Paris", "2026-01-31T23:00:00Z"),
            (at("2026-01-31T23:00:00Z"), at("2026-02-28T23:00:00Z"))
        );
    }

    #[test]
    fn february_of_a_leap_year_has_29_days() {
        let (start, end) = bounds(Period::Month, "UTC", "2028-02-29T12:00:00Z");
        assert_eq!(
            (start, end),
            (at("2028-02-01T00:00:00Z"), at("2028-03-01T00:00:00Z"))
        );
        assert_eq!(end - start, 29 * DAY);
    }

    #[test]
    fn days_when_clocks_change_last_23_and_25_hours_in_two_zones() {
        // Europe: last Sunday of March and of October; New York: second
        // Sunday of March, first Sunday of November.
        for (zone, spring, autumn) in [
            (
                "Europe/Paris",
                "2026-03-29T12:00:00Z",
                "2026-10-25T12:00:00Z",
            ),
            (
                "America/New_York",
                "2026-03-08T12:00:00Z",
                "2026-11-01T12:00:00Z",
            ),
        ] {
            let (start, end) = bounds(Period::Day, zone, spring);
            assert_eq!(end - start, 23 * 3_600_000, "{zone} in spring");
            let (start, end) = bounds(Period::Day, zone, autumn);
            assert_eq!(end - start, 25 * 3_600_000, "{zone} in autumn");
        }
        // The day after is 24 hours again, from local midnight.
        assert_eq!(
            bounds(Period::Day, "America/New_York", "2026-03-09T12:00:00Z"),
            (at("2026-03-09T04:00:00Z"), at("2026-03-10T04:00:00Z"))
        );
    }

    #[test]
    fn a_week_starts_on_monday() {
        // 2026-11-28 is a Saturday.
        assert_eq!(
            bounds(Period::Week, "UTC", "2026-11-28T10:00:00Z"),
            (at("2026-11-23T00:00:00Z"), at("2026-11-30T00:00:00Z"))
        );
        // A Monday at midnight starts its own week.
        assert_eq!(
            bounds(Period::Week, "UTC", "2026-11-30T00:00:00Z").0,
            at("2026-11-30T00:00:00Z")
        );
    }

    #[test]
    fn a_year_starts_on_january_first_in_its_zone() {
        // Tokyo is UTC+9: its 2027 starts at 15:00 UTC on the last day of 2026.
        assert_eq!(
            bounds(Period::Year, "Asia/Tokyo", "2026-12-31T15:00:00Z"),
            (at("2026-12-31T15:00:00Z"), at("2027-12-31T15:00:00Z"))
        );
        let (start, end) = bounds(Period::Year, "UTC", "2028-06-01T00:00:00Z");
        assert_eq!(end - start, 366 * DAY);
    }

    #[test]
    fn unknown_zones_are_refused_and_names_kept() {
        assert!(
            Zone::get("Mars/Olympus")
                .unwrap_err()
                .contains("unknown time zone 'Mars/Olympus'")
        );
        let paris = Zone::get("Europe/Paris").expect("Paris");
        assert_eq!(paris, Zone::get("Europe/Paris").expect("Paris again"));
        assert_eq!(format!("{paris:?}"), "Europe/Paris");
    }
}
