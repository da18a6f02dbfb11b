//! The multi-precision sliding window.
//!
//! Hits are counted in buckets of `precision` aligned to the epoch. At `now`
//! the window is `(now − duration, now]`; every bucket wholly inside it counts
//! fully, and the one bucket straddling `now − duration` counts in proportion
//! to the part of it still inside (rounded up, so the estimate never falls
//! below the true interpolation). With `precision = duration` this is the
//! classic two-window sliding counter.
//!
//! Guarantee: in every window of `duration` aligned to bucket boundaries the
//! admitted weight never exceeds the limit, because each admission saw every
//! bucket of such a window at full weight. A window placed anywhere else can
//! additionally hold what was admitted in the one bucket it cuts through.
//!
//! The interpolation is done in `f64` exactly as the Redis script does it in
//! Lua (IEEE doubles in both), so the two stores agree to the hit.

use std::collections::VecDeque;

use super::{Algorithm, signed, unsigned};
use crate::limiter::{LimitSpec, MAX_HITS, Millis, Window};

/// Buckets of one sliding-window counter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Non-empty buckets, oldest first, as `(time / precision, hits)`.
    buckets: VecDeque<(i64, u64)>,
    /// Sum of the hits in `buckets`, kept so a check does not walk them.
    total: u64,
}

/// `(duration, precision)` of `window` in milliseconds, precision in
/// `1..=duration`.
fn shape(window: &Window) -> (i64, i64) {
    let duration = window.duration_ms.max(1);
    let precision = match window.algorithm {
        Algorithm::SlidingWindow { precision_ms } => precision_ms.clamp(1, duration),
        _ => duration,
    };
    (signed(duration), signed(precision))
}

impl SlidingWindow {
    /// The counter a Redis HASH's markers describe (its oldest bucket and
    /// hits, its newest bucket and hits, the hits of all its buckets: see
    /// `sliding_window.lua`), as a decision at `now` reads it: the buckets
    /// between, never read by one, stand as one bucket after the oldest. A
    /// `total` of 0 is an empty counter, whatever the rest says (a refund
    /// emptied it). `None` unless every bucket is still in the window and
    /// none is past `now`'s (what batch.lua's quick path answers), or when
    /// the buckets hold more than the total: markers no script wrote.
    pub fn from_markers(
        spec: &LimitSpec,
        now: Millis,
        total: u64,
        oldest: (i64, u64),
        newest: (i64, u64),
    ) -> Option<Self> {
        if total == 0 {
            return Some(Self::default());
        }
        let (d, p) = shape(&spec.window);
        let in_window = (signed(now) - d).div_euclid(p)..=signed(now).div_euclid(p);
        if !(in_window.contains(&oldest.0) && in_window.contains(&newest.0)) {
            return None;
        }
        let mut buckets = VecDeque::with_capacity(3);
        buckets.push_back(oldest);
        let mut between = total.checked_sub(oldest.1)?;
        if newest.0 > oldest.0 {
            between = between.checked_sub(newest.1)?;
            if between > 0 && newest.0 > oldest.0 + 1 {
                buckets.push_back((oldest.0 + 1, between));
            }
            buckets.push_back(newest);
        }
        Some(Self { buckets, total })
    }

    /// The newest bucket holding hits, if any: where [`Self::add`] counted
    /// what it last counted, unless the clock moved on since.
    pub fn newest(&self) -> Option<i64> {
        self.buckets.back().map(|&(index, _)| index)
    }

    /// Drops buckets that left the window and returns the interpolated count.
    pub fn used(&mut self, spec: &LimitSpec, now: Millis) -> u64 {
        let (d, p) = shape(&spec.window);
        // The bucket straddling `now − d`, and how many of its milliseconds
        // are still inside the window (in `1..=p`).
        let start = signed(now) - d;
        let oldest = start.div_euclid(p);
        let inside = (oldest + 1) * p - start;
        while let Some(&(index, hits)) = self.buckets.front() {
            if index >= oldest {
                break;
            }
            self.buckets.pop_front();
            self.total -= hits;
        }
        match self.buckets.front() {
            Some(&(index, hits)) if index == oldest => {
                self.total - hits + interpolate(hits, inside, p)
            }
            _ => self.total,
        }
    }

    /// Counts `hits` in the bucket of `now`. A clock that stepped back adds to
    /// the newest bucket instead, so buckets stay ordered. The total never
    /// passes [`MAX_HITS`]: what would is not counted.
    pub fn add(&mut self, spec: &LimitSpec, now: Millis, hits: u64) {
        let hits = hits.min(MAX_HITS.saturating_sub(self.total));
        if hits == 0 {
            return;
        }
        let index = signed(now).div_euclid(shape(&spec.window).1);
        match self.buckets.back_mut() {
            Some((newest, count)) if *newest >= index => *count = count.saturating_add(hits),
            _ => self.buckets.push_back((index, hits)),
        }
        self.total = self.total.saturating_add(hits);
    }

    /// Gives back up to `hits`, newest buckets first (what is refunded is
    /// usually what was charged last), never below empty. Buckets left empty
    /// are dropped.
    pub fn refund(&mut self, spec: &LimitSpec, now: Millis, hits: u64) {
        self.used(spec, now);
        self.total -= super::take_newest(&mut self.buckets, hits);
    }

    /// Until the oldest counted bucket leaves the window (for an empty counter:
    /// until a hit made now would leave it).
    pub fn reset_ms(&self, spec: &LimitSpec, now: Millis) -> u64 {
        let (d, p) = shape(&spec.window);
        let index = self
            .buckets
            .front()
            .map_or_else(|| signed(now).div_euclid(p), |&(i, _)| i);
        unsigned((index + 1) * p + d - signed(now))
    }

    /// For how long no hit can fit (see [`super::State::full_for`]); call
    /// after `used`. The straddling bucket's share falls as the window
    /// slides; `ceil(c·x/p) ≤ k` exactly when `x ≤ ⌊k·p/c⌋`, solved in
    /// integers. Beyond the straddling bucket this stops early: conservative.
    /// Never past the oldest bucket's expiry, so the reset reported stays the
    /// same instant meanwhile; at a limit of 0 (nothing ever fits) that is
    /// all that bounds it, and an empty counter's reset moves with each new
    /// bucket.
    pub fn full_for(&self, spec: &LimitSpec, now: Millis) -> u64 {
        let (d, p) = shape(&spec.window);
        let limit = spec.requests;
        if limit == 0 {
            return match self.buckets.front() {
                Some(&(index, _)) => unsigned((index + 1) * p + d - signed(now)),
                None => unsigned((signed(now).div_euclid(p) + 1) * p - signed(now)),
            };
        }
        let start = signed(now) - d;
        let oldest = start.div_euclid(p);
        let inside = (oldest + 1) * p - start;
        match self.buckets.front() {
            None => 0,
            // The oldest bucket straddles the window's start and decays.
            Some(&(index, hits)) if index == oldest && inside < p => {
                let others = self.total - hits;
                if others >= limit {
                    return unsigned(inside);
                }
                let spare = limit - 1 - others; // hits that may remain of the straddler
                let allowed = (spare as u128 * p as u128 / hits as u128) as i64;
                unsigned(inside - allowed.min(inside))
            }
            // Every bucket counts fully until the oldest starts to straddle.
            Some(&(index, _)) if self.total >= limit => {
                unsigned((index * p + d - signed(now)).max(0))
            }
            Some(_) => 0,
        }
    }

    /// Bytes held on the heap (the allocated capacity, which can exceed
    /// what is in use), for stores that bound their memory.
    pub fn heap_bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<(i64, u64)>()
    }

    /// When the newest bucket leaves the window.
    pub fn expires_at(&self, window: &Window) -> Millis {
        let (d, p) = shape(window);
        self.buckets
            .back()
            .map_or(0, |&(index, _)| unsigned((index + 1) * p + d))
    }
}

/// The share of a bucket's `hits` for the `inside` of its `precision`
/// milliseconds still in the window, rounded up.
fn interpolate(hits: u64, inside: i64, precision: i64) -> u64 {
    if inside >= precision {
        return hits;
    }
    // Same operation order as the Lua script, so the doubles round identically.
    (hits as f64 * inside as f64 / precision as f64).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(duration_ms: u64, precision_ms: u64) -> LimitSpec {
        LimitSpec {
            requests: 100,
            window: Window {
                duration_ms,
                algorithm: Algorithm::SlidingWindow { precision_ms },
            },
            penalty: None,
        }
    }

    #[test]
    fn buckets_inside_the_window_count_fully() {
        let s = spec(10_000, 1_000);
        let mut w = SlidingWindow::default();
        w.add(&s, 10_000, 3);
        w.add(&s, 15_500, 4);
        assert_eq!(w.used(&s, 19_999), 7);
    }

    #[test]
    fn straddling_bucket_is_interpolated_and_rounded_up() {
        let s = spec(10_000, 1_000);
        let mut w = SlidingWindow::default();
        w.add(&s, 10_000, 10); // bucket [10 000, 11 000)
        // At 20 250 the window starts at 10 250: 750 ms of the bucket are inside.
        assert_eq!(w.used(&s, 20_250), 8); // ceil(10 × 0.75)
        // At 20 999 one millisecond is inside.
        assert_eq!(w.used(&s, 20_999), 1);
        // At 21 000 the bucket has left the window.
        assert_eq!(w.expires_at(&s.window), 21_000);
        assert_eq!(w.used(&s, 21_000), 0);
        assert_eq!(w.expires_at(&s.window), 0);
    }

    #[test]
    fn precision_equal_to_duration_is_the_two_window_counter() {
        let s = spec(60_000, 60_000);
        let mut w = SlidingWindow::default();
        w.add(&s, 0, 60); // previous minute
        w.add(&s, 60_000, 10); // current minute
        // 15 s into the current minute, 45 s of the previous one are inside.
        assert_eq!(w.used(&s, 75_000), 10 + 45);
    }

    #[test]
    fn reset_is_when_the_oldest_bucket_leaves() {
        let s = spec(10_000, 1_000);
        let mut w = SlidingWindow::default();
        assert_eq!(w.reset_ms(&s, 5_300), 10_700);
        w.add(&s, 5_300, 1);
        w.add(&s, 8_000, 1);
        assert_eq!(w.reset_ms(&s, 9_000), 6_000 + 10_000 - 9_000);
    }

    /// Its markers, as sliding_window.lua keeps them: the total, the
    /// oldest and the newest bucket with their hits.
    fn markers(w: &SlidingWindow) -> (u64, (i64, u64), (i64, u64)) {
        let (first, last) = (w.buckets.front(), w.buckets.back());
        (w.total, *first.unwrap_or(&(0, 0)), *last.unwrap_or(&(0, 0)))
    }

    #[test]
    fn a_counter_read_from_its_markers_decides_as_the_counter() {
        let mut s = spec(10_000, 1_000);
        // Hits at 0 .. 7 s in 1 s buckets: up to eight buckets, so that
        // one, two and many lie between the oldest and the newest.
        for spread in [1, 2, 3, 8] {
            let mut w = SlidingWindow::default();
            for b in 0..spread {
                w.add(&s, b * 1_000 + 500, b + 1);
            }
            // Whenever the oldest bucket is still in the window (to 10,999),
            // at the newest bucket or after it, near or at the limit.
            for (now, requests) in [(7_999, 100), (10_400, 36), (10_999, 30), (10_000, 0)] {
                s.requests = requests;
                let (total, oldest, newest) = markers(&w);
                let mut read = SlidingWindow::from_markers(&s, now, total, oldest, newest)
                    .expect("markers of a counter in the window");
                let mut whole = w.clone();
                assert_eq!(read.used(&s, now), whole.used(&s, now), "{spread} at {now}");
                read.add(&s, now, 3);
                whole.add(&s, now, 3);
                assert_eq!(read.used(&s, now), whole.used(&s, now), "{spread} at {now}");
                assert_eq!(read.reset_ms(&s, now), whole.reset_ms(&s, now));
                assert_eq!(read.full_for(&s, now), whole.full_for(&s, now));
                assert_eq!(read.newest(), whole.newest());
            }
        }
        let read =
            |total, oldest, newest| SlidingWindow::from_markers(&s, 10_000, total, oldest, newest);
        assert_eq!(
            read(0, (3, 9), (5, 2)),
            Some(SlidingWindow::default()),
            "a total of 0 is empty"
        );
        // Buckets out of the window (0..=10 at 10 s), or holding more than
        // the total: no counter the script answers with.
        for (oldest, newest) in [
            ((-1, 1), (5, 1)),
            ((3, 1), (11, 1)),
            ((i64::MIN, 1), (i64::MAX, 1)),
        ] {
            assert_eq!(read(4, oldest, newest), None, "{oldest:?} {newest:?}");
        }
        assert_eq!(read(4, (3, 5), (5, 1)), None);
        assert_eq!(read(4, (3, 2), (5, 3)), None);
        assert!(read(5, (3, 2), (5, 3)).is_some());
    }

    #[test]
    fn a_clock_stepping_back_adds_to_the_newest_bucket() {
        let s = spec(10_000, 1_000);
        let mut w = SlidingWindow::default();
        w.add(&s, 5_000, 1);
        w.add(&s, 4_000, 1);
        assert_eq!(w.used(&s, 5_000), 2);
        assert_eq!(w.expires_at(&s.window), 16_000);
    }
}
