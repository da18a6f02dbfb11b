//! Calendar periods counted as fixed windows: the window is the day, week,
//! month or year containing now in the limit's zone (see
//! [`crate::limiter::calendar`]).

use crate::limiter::calendar::Calendar;
use crate::limiter::{LimitSpec, MAX_HITS, Millis};

/// One counter for the period `[start, end)` it last counted in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CalendarWindow {
    start: Millis,
    end: Millis,
    hits: u64,
}

impl CalendarWindow {
    /// Moves to the period containing `now` when that is a later one. A
    /// counter never goes back to an earlier period: a clock that stepped
    /// back keeps counting in the period it had reached, as another
    /// replica's clock a little behind does at a period's start.
    fn roll(&mut self, calendar: Calendar, now: Millis) {
        if now >= self.end {
            let (start, end) = calendar.bounds(now);
            *self = CalendarWindow {
                start,
                end,
                hits: 0,
            };
        }
    }

    pub fn used(&mut self, calendar: Calendar, now: Millis) -> u64 {
        self.roll(calendar, now);
        self.hits
    }

    /// Hits counted in the period containing `now`, without changing state.
    pub fn hits_now(&self, now: Millis) -> u64 {
        if now < self.end { self.hits } else { 0 }
    }

    pub fn add(&mut self, calendar: Calendar, now: Millis, hits: u64) {
        self.roll(calendar, now);
        self.hits = self.hits.saturating_add(hits).min(MAX_HITS);
    }

    /// Gives back up to `hits` of the current period's count.
    pub fn refund(&mut self, calendar: Calendar, now: Millis, hits: u64) {
        self.roll(calendar, now);
        self.hits = self.hits.saturating_sub(hits);
    }

    /// Until the next period starts.
    pub fn reset_ms(&self, calendar: Calendar, now: Millis) -> u64 {
        let end = if now < self.end {
            self.end
        } else {
            calendar.bounds(now).1
        };
        end - now
    }

    /// For how long no hit fits: until the period ends when it is full.
    pub fn full_for(&self, spec: &LimitSpec, calendar: Calendar, now: Millis) -> u64 {
        if self.hits_now(now) >= spec.requests {
            self.reset_ms(calendar, now)
        } else {
            0
        }
    }

    /// The end of the counted period.
    pub fn expires_at(&self) -> Millis {
        if self.hits == 0 { 0 } else { self.end }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::calendar::{Period, Zone};

    fn at(text: &str) -> Millis {
        let t: jiff::Timestamp = text.parse().expect("an RFC 3339 instant");
        u64::try_from(t.as_millisecond()).expect("after 1970")
    }

    fn paris_month() -> Calendar {
        Calendar {
            period: Period::Month,
            zone: Zone::get("Europe/Paris").expect("Paris"),
        }
    }

    #[test]
    fn the_count_starts_again_with_the_next_month_in_the_zone() {
        let (cal, mut w) = (paris_month(), CalendarWindow::default());
        w.add(cal, at("2026-01-31T22:59:00Z"), 7);
        assert_eq!(w.used(cal, at("2026-01-31T22:59:59.999Z")), 7);
        assert_eq!(w.reset_ms(cal, at("2026-01-31T22:59:00Z")), 60_000);
        // Midnight in Paris on February 1st.
        assert_eq!(w.used(cal, at("2026-01-31T23:00:00Z")), 0);
        assert_eq!(
            w.reset_ms(cal, at("2026-01-31T23:00:00Z")),
            at("2026-02-28T23:00:00Z") - at("2026-01-31T23:00:00Z")
        );
    }

    #[test]
    fn a_clock_that_steps_back_keeps_the_later_period() {
        let (cal, mut w) = (paris_month(), CalendarWindow::default());
        w.add(cal, at("2026-02-01T00:00:00Z"), 3);
        // 2 s earlier is January in Paris: still counted in February.
        w.add(cal, at("2026-01-31T22:59:58Z"), 1);
        assert_eq!(w.used(cal, at("2026-02-01T00:00:00Z")), 4);
        assert_eq!(w.expires_at(), at("2026-02-28T23:00:00Z"));
    }

    #[test]
    fn full_until_the_period_ends_and_refunds_give_back() {
        let cal = paris_month();
        let spec = LimitSpec {
            requests: 5,
            window: crate::limiter::Window {
                duration_ms: Period::Month.nominal_ms(),
                algorithm: crate::limiter::Algorithm::Calendar(cal),
            },
            penalty: None,
        };
        let mut w = CalendarWindow::default();
        let now = at("2026-03-31T12:00:00Z");
        w.add(cal, now, 5);
        // April starts at 22:00 UTC (Paris is UTC+2 from March 29th).
        assert_eq!(w.full_for(&spec, cal, now), 10 * 3_600_000);
        w.refund(cal, now, 2);
        assert_eq!(w.used(cal, now), 3);
        assert_eq!(w.full_for(&spec, cal, now), 0);
    }
}
