//! Fixed windows aligned to the Unix epoch: envoyproxy/ratelimit's counting.

use super::{signed, unsigned};
use crate::limiter::{LimitSpec, MAX_HITS, Millis, Window};

/// One counter for the current window `[index·d, (index+1)·d)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    index: i64,
    hits: u64,
}

impl Default for FixedWindow {
    fn default() -> Self {
        Self {
            index: i64::MIN,
            hits: 0,
        }
    }
}

fn duration(window: &Window) -> i64 {
    signed(window.duration_ms.max(1))
}

impl FixedWindow {
    fn roll(&mut self, spec: &LimitSpec, now: Millis) {
        let index = signed(now).div_euclid(duration(&spec.window));
        if index != self.index {
            self.index = index;
            self.hits = 0;
        }
    }

    /// Hits counted in the window containing `now`. A read changes nothing:
    /// a clock stepping back into the stored window after a read in a later
    /// one still finds its hits, as the Redis script (which writes nothing
    /// on a read) does.
    pub fn hits_now(&self, spec: &LimitSpec, now: Millis) -> u64 {
        if signed(now).div_euclid(duration(&spec.window)) == self.index {
            self.hits
        } else {
            0
        }
    }

    /// Counts `hits` in the window containing `now`, up to [`MAX_HITS`].
    pub fn add(&mut self, spec: &LimitSpec, now: Millis, hits: u64) {
        self.roll(spec, now);
        self.hits = self.hits.saturating_add(hits).min(MAX_HITS);
    }

    /// Until the end of the window containing `now`.
    /// Gives back up to `hits` of the current window's count (never below
    /// empty); hits of an earlier window are gone already.
    pub fn refund(&mut self, spec: &LimitSpec, now: Millis, hits: u64) {
        self.roll(spec, now);
        self.hits = self.hits.saturating_sub(hits);
    }

    pub fn reset_ms(&self, spec: &LimitSpec, now: Millis) -> u64 {
        let (now, d) = (signed(now), duration(&spec.window));
        unsigned((now.div_euclid(d) + 1) * d - now)
    }

    /// The end of the counted window.
    pub fn expires_at(&self, window: &Window) -> Millis {
        if self.hits == 0 {
            return 0;
        }
        unsigned(
            self.index
                .saturating_add(1)
                .saturating_mul(duration(window)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;

    const MINUTE: LimitSpec = LimitSpec {
        requests: 10,
        window: Window {
            duration_ms: 60_000,
            algorithm: Algorithm::FixedWindow,
        },
        penalty: None,
    };

    #[test]
    fn counts_reset_at_epoch_aligned_boundaries() {
        let mut w = FixedWindow::default();
        w.add(&MINUTE, 59_000, 5);
        assert_eq!(w.hits_now(&MINUTE, 59_999), 5);
        assert_eq!(w.reset_ms(&MINUTE, 59_000), 1_000);
        assert_eq!(w.hits_now(&MINUTE, 60_000), 0);
        assert_eq!(w.reset_ms(&MINUTE, 60_000), 60_000);
        assert_eq!(w.hits_now(&MINUTE, 59_999), 5, "a read forgets nothing");
    }

    #[test]
    fn expires_at_window_end_once_used() {
        let mut w = FixedWindow::default();
        assert_eq!(w.expires_at(&MINUTE.window), 0);
        w.add(&MINUTE, 62_500, 1);
        assert_eq!(w.expires_at(&MINUTE.window), 120_000);
    }
}
