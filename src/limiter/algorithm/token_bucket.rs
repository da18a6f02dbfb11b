//! The token bucket, as GCRA (the generic cell rate algorithm): one number per
//! counter, the theoretical arrival time (TAT). Tokens refill at `requests`
//! per window, one every `T = window / requests`; the bucket holds at most
//! `burst` tokens. A request of `w` hits fits when `max(TAT, now) + w·T − now
//! ≤ burst·T`, evaluated as `(max(TAT, now) − now) + w·T ≤ burst·T` so no
//! rounding of large times can move the boundary. It also serves as the leaky-bucket meter (same conformance
//! test, seen from the other side).
//!
//! Time is in microseconds so fast rates (a token every 100 µs) keep their
//! precision. The TAT is kept as a whole number of microseconds, rounded half
//! to even after each update — exactly what the Lua script does, so both
//! stores agree to the microsecond.

use crate::limiter::{LimitSpec, Millis};

/// GCRA state of one counter.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenBucket {
    /// Theoretical arrival time, µs since the epoch; at or before now the
    /// bucket is full.
    tat_us: f64,
}

/// Microseconds per token; `None` when the limit admits nothing.
fn interval_us(spec: &LimitSpec) -> Option<f64> {
    (spec.requests > 0).then(|| (spec.window.duration_ms as f64 * 1000.0) / spec.requests as f64)
}

fn now_us(now: Millis) -> f64 {
    now as f64 * 1000.0
}

impl TokenBucket {
    /// Tokens in use (the burst minus the tokens available).
    pub fn used(&mut self, spec: &LimitSpec, now: Millis) -> u64 {
        let Some(t) = interval_us(spec) else { return 0 };
        let ahead = self.tat_us - now_us(now);
        if ahead <= 0.0 {
            0
        } else {
            ((ahead / t).ceil() as u64).min(spec.capacity())
        }
    }

    /// Whether `hits` more tokens are available at `now`.
    pub fn fits(&self, spec: &LimitSpec, now: Millis, hits: u64) -> bool {
        if hits == 0 {
            return true;
        }
        let Some(t) = interval_us(spec) else {
            return false;
        };
        // Relative to now: the difference of two whole-µs times is exact, while
        // adding a fractional interval to a 1.7e15 µs time would round.
        let now = now_us(now);
        let ahead = self.tat_us.max(now) - now;
        ahead + hits as f64 * t <= spec.capacity() as f64 * t
    }

    /// Takes `hits` tokens at `now`.
    pub fn add(&mut self, spec: &LimitSpec, now: Millis, hits: u64) {
        let Some(t) = interval_us(spec) else { return };
        if hits == 0 {
            return;
        }
        let tat = self.tat_us.max(now_us(now));
        self.tat_us = (tat + hits as f64 * t).round_ties_even();
    }

    /// Until one more token is available (0 when the bucket is full).
    pub fn reset_ms(&self, spec: &LimitSpec, now: Millis) -> u64 {
        let Some(t) = interval_us(spec) else { return 0 };
        let ahead = self.tat_us - now_us(now);
        if ahead <= 0.0 {
            return 0;
        }
        let until = ahead - ((ahead / t).ceil() - 1.0) * t;
        (until / 1000.0).ceil() as u64
    }

    /// When the bucket is full again.
    pub fn expires_at(&self) -> Millis {
        if self.tat_us <= 0.0 {
            0
        } else {
            (self.tat_us / 1000.0).ceil() as u64
        }
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
        assert!(b.fits(&s, 0, 10));
        assert!(!b.fits(&s, 0, 11));
        b.add(&s, 0, 7);
        assert_eq!(b.used(&s, 0), 7);
        assert!(b.fits(&s, 0, 0));
        assert!(!b.fits(&s, 0, 4));
        assert!(b.fits(&s, 1_000, 4), "one token back after a second");
    }

    #[test]
    fn fractional_intervals_keep_microsecond_precision() {
        let s = spec(7, 1_000, 1); // 142 857.14… µs per token
        let mut b = TokenBucket::default();
        b.add(&s, 0, 1);
        assert_eq!(b.tat_us, 142_857.0);
        assert!(!b.fits(&s, 142, 1));
        assert!(b.fits(&s, 143, 1));
    }

    #[test]
    fn a_zero_limit_admits_nothing() {
        let s = spec(0, 1_000, 0);
        let b = TokenBucket::default();
        assert!(!b.fits(&s, 0, 1));
        assert!(b.fits(&s, 0, 0));
    }
}
