//! The token bucket, as GCRA (the generic cell rate algorithm): one time per
//! counter, the theoretical arrival time (TAT). Tokens refill at `requests`
//! per window, one every `T = window / requests`; the bucket holds at most
//! `burst` tokens. A request of `w` hits fits when `(max(TAT, now) − now) +
//! w·T ≤ burst·T`. It also serves as the leaky-bucket meter (the same
//! conformance test, seen from the other side).
//!
//! The arithmetic is exact integer arithmetic: the TAT is kept as whole
//! milliseconds plus a remainder in ticks of `1/requests` ms, so one token is
//! exactly `window_ms` ticks and no rounding accumulates, however the
//! interval divides. The Lua script does the same integer steps; rules keep
//! `burst × window_ms` below 2^52 so Lua's doubles stay exact.

use crate::limiter::{LimitSpec, Millis};

/// Largest `burst × window_ms` a token bucket accepts (2^52), so every
/// intermediate value is an integer a double represents exactly.
pub const MAX_BUCKET_TICKS: u64 = 1 << 52;

/// GCRA state of one counter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenBucket {
    /// Whole milliseconds of the TAT; 0 for a counter never used.
    base_ms: u64,
    /// The TAT's remainder, in ticks of `1/requests` ms (below `requests`).
    ticks: u64,
}

impl TokenBucket {
    /// How far the TAT is ahead of `now`, in ticks (0 when the bucket is full).
    fn ahead(&self, requests: u64, now: Millis) -> u64 {
        if self.base_ms > now || (self.base_ms == now && self.ticks > 0) {
            ((self.base_ms - now).saturating_mul(requests)).saturating_add(self.ticks)
        } else {
            0
        }
    }

    /// Tokens in use (the burst minus the tokens available).
    pub fn used(&mut self, spec: &LimitSpec, now: Millis) -> u64 {
        let interval = spec.window.duration_ms;
        if spec.requests == 0 || interval == 0 {
            return 0;
        }
        self.ahead(spec.requests, now)
            .div_ceil(interval)
            .min(spec.capacity())
    }

    /// Whether `hits` more tokens are available at `now`.
    pub fn fits(&self, spec: &LimitSpec, now: Millis, hits: u64) -> bool {
        let (interval, burst) = (spec.window.duration_ms, spec.capacity());
        if hits == 0 {
            // A check: refused only while the bucket is in debt past its
            // burst (an always-counted or shadow debit that did not fit).
            return spec.requests == 0
                || self.ahead(spec.requests, now) <= burst.saturating_mul(interval);
        }
        if spec.requests == 0 || hits > burst {
            return false;
        }
        // hits ≤ burst here, so hits × interval ≤ burst × interval ≤ 2^52.
        self.ahead(spec.requests, now)
            .saturating_add(hits * interval)
            <= burst * interval
    }

    /// Takes `hits` tokens at `now`. Beyond the burst (shadow or quota mode
    /// counts what does not fit) the debt stops at [`MAX_BUCKET_TICKS`] ahead
    /// of `now`: the tokens beyond are not taken, so every value stays exact
    /// in the Lua script's doubles.
    pub fn add(&mut self, spec: &LimitSpec, now: Millis, hits: u64) {
        let (requests, interval) = (spec.requests, spec.window.duration_ms);
        if requests == 0 || hits == 0 {
            return;
        }
        let ahead = self.ahead(requests, now);
        if ahead == 0 {
            (self.base_ms, self.ticks) = (now, 0);
        }
        let room = MAX_BUCKET_TICKS.saturating_sub(ahead).checked_div(interval);
        let hits = room.map_or(hits, |room| hits.min(room));
        if hits == 0 {
            return;
        }
        let ticks = self.ticks + hits * interval;
        self.base_ms += ticks / requests;
        self.ticks = ticks % requests;
    }

    /// Until one more token is available (0 when the bucket is full).
    /// Gives back up to `hits` tokens: the arrival time moves back by
    /// `hits` intervals, never before `now` (a full bucket stays full).
    pub fn refund(&mut self, spec: &LimitSpec, now: Millis, hits: u64) {
        let (requests, interval) = (spec.requests, spec.window.duration_ms);
        if requests == 0 || hits == 0 {
            return;
        }
        let ahead = self.ahead(requests, now);
        if ahead == 0 {
            return; // a full bucket: nothing to give back, nothing changes
        }
        let back = hits.saturating_mul(interval);
        if back >= ahead {
            (self.base_ms, self.ticks) = (now, 0);
            return;
        }
        let left = ahead - back;
        self.base_ms = now + left / requests;
        self.ticks = left % requests;
    }

    pub fn reset_ms(&self, spec: &LimitSpec, now: Millis) -> u64 {
        let interval = spec.window.duration_ms;
        let ahead = if spec.requests == 0 {
            0
        } else {
            self.ahead(spec.requests, now)
        };
        if ahead == 0 || interval == 0 {
            return 0;
        }
        let tokens = ahead.div_ceil(interval);
        (ahead - (tokens - 1) * interval).div_ceil(spec.requests)
    }

    /// When the bucket is full again.
    pub fn expires_at(&self) -> Millis {
        self.base_ms + u64::from(self.ticks > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Window};

    fn spec(requests: u64, duration_ms: u64, burst: u64) -> LimitSpec {
        LimitSpec {
            requests,
            window: Window {
                duration_ms,
                algorithm: Algorithm::TokenBucket { burst },
            },
            penalty: None,
        }
    }

    #[test]
    fn a_full_bucket_admits_the_burst_then_one_per_interval() {
        let s = spec(10, 1_000, 3); // a token every 100 ms, 3 at most
        let mut b = TokenBucket::default();
        for used in 1..=3 {
            assert!(b.fits(&s, 5_000, 1));
            b.add(&s, 5_000, 1);
            assert_eq!(b.used(&s, 5_000), used);
        }
        assert!(!b.fits(&s, 5_000, 1));
        assert_eq!(b.reset_ms(&s, 5_000), 100);
        assert!(!b.fits(&s, 5_099, 1));
        assert!(b.fits(&s, 5_100, 1));
        assert_eq!(b.expires_at(), 5_300);
        assert_eq!(b.used(&s, 5_300), 0);
    }

    #[test]
    fn weights_take_several_tokens_and_zero_only_checks() {
        let s = spec(60, 60_000, 10);
        let mut b = TokenBucket::default();
        assert!(b.fits(&s, 1, 10));
        assert!(!b.fits(&s, 1, 11));
        b.add(&s, 1, 7);
        assert_eq!(b.used(&s, 1), 7);
        assert!(b.fits(&s, 1, 0));
        assert!(!b.fits(&s, 1, 4));
        assert!(b.fits(&s, 1_001, 4), "one token back after a second");
    }

    #[test]
    fn fractional_intervals_never_drift() {
        // 3 000 per second: a token every 333.33… µs. Sustained demand must
        // get exactly 3 000 per second, not a rounded rate.
        let s = spec(3_000, 1_000, 3);
        let mut b = TokenBucket::default();
        let mut admitted = 0;
        for now in 1..=10_000u64 {
            while b.fits(&s, now, 1) {
                b.add(&s, now, 1);
                admitted += 1;
            }
        }
        // The burst of 3 in the first millisecond, then the 3 that refill in
        // each following one: exactly 30 000 in 10 s.
        assert_eq!(admitted, 30_000);
    }

    #[test]
    fn a_zero_limit_admits_nothing() {
        let s = spec(0, 1_000, 0);
        let b = TokenBucket::default();
        assert!(!b.fits(&s, 0, 1));
        assert!(b.fits(&s, 0, 0));
    }
}
