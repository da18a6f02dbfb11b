//! Fixed windows aligned to the Unix epoch: envoyproxy/ratelimit's counting.

use super::{signed, unsigned};
use crate::limiter::Millis;

/// One counter for the current window `[index·d, (index+1)·d)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    duration_ms: i64,
    index: i64,
    hits: u64,
}

impl FixedWindow {
    /// An empty counter for windows of `duration_ms` (> 0).
    pub fn new(duration_ms: u64) -> Self {
        Self {
            duration_ms: signed(duration_ms.max(1)),
            index: i64::MIN,
            hits: 0,
        }
    }

    fn roll(&mut self, now: Millis) {
        let index = signed(now).div_euclid(self.duration_ms);
        if index != self.index {
            self.index = index;
            self.hits = 0;
        }
    }

    /// Hits counted in the window containing `now`.
    pub fn used(&mut self, now: Millis) -> u64 {
        self.roll(now);
        self.hits
    }

    /// Counts `hits` in the window containing `now`.
    pub fn add(&mut self, now: Millis, hits: u64) {
        self.roll(now);
        self.hits = self.hits.saturating_add(hits);
    }

    /// Until the end of the window containing `now`.
    pub fn reset_ms(&self, now: Millis) -> u64 {
        let now = signed(now);
        unsigned((now.div_euclid(self.duration_ms) + 1) * self.duration_ms - now)
    }

    /// The end of the counted window.
    pub fn expires_at(&self) -> Millis {
        if self.hits == 0 {
            return 0;
        }
        unsigned(
            self.index
                .saturating_add(1)
                .saturating_mul(self.duration_ms),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_reset_at_epoch_aligned_boundaries() {
        let mut w = FixedWindow::new(60_000);
        w.add(59_000, 5);
        assert_eq!(w.used(59_999), 5);
        assert_eq!(w.reset_ms(59_000), 1_000);
        assert_eq!(w.used(60_000), 0);
        assert_eq!(w.reset_ms(60_000), 60_000);
    }

    #[test]
    fn expires_at_window_end_once_used() {
        let mut w = FixedWindow::new(1_000);
        assert_eq!(w.expires_at(), 0);
        w.add(2_500, 1);
        assert_eq!(w.expires_at(), 3_000);
    }
}
