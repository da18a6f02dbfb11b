//! The exact sliding log: one entry per admitted hit (hits at the same
//! millisecond share an entry), counted while `t > now − window`. Only
//! admitted hits are logged, so the log normally never holds more than the
//! limit; when shadow or quota mode admits beyond it, the oldest hits are
//! dropped at the next read to bring it back to the limit, so cost and
//! memory stay bounded. (At the read, not at the write: a Redis Cluster
//! refund must be able to take back exactly what a write added.)

use std::collections::VecDeque;

use super::{signed, unsigned};
use crate::limiter::{LimitSpec, MAX_HITS, Millis, Window};

/// Largest `requests_per_unit` a sliding log accepts: its cost and memory
/// grow with the limit.
pub const MAX_LOG_ENTRIES: u64 = 10_000;

/// The entries of one sliding-log counter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingLog {
    /// `(time ms, hits)`, oldest first.
    entries: VecDeque<(i64, u64)>,
    total: u64,
}

impl SlidingLog {
    /// Drops entries that left the window and the oldest hits beyond the
    /// limit, and returns the hits still in it.
    pub fn used(&mut self, spec: &LimitSpec, now: Millis) -> u64 {
        let start = signed(now) - signed(spec.window.duration_ms);
        while let Some(&(t, hits)) = self.entries.front() {
            if t > start {
                break;
            }
            self.entries.pop_front();
            self.total -= hits;
        }
        while self.total > spec.requests {
            let excess = self.total - spec.requests;
            let Some(front) = self.entries.front_mut() else {
                break;
            };
            if front.1 <= excess {
                self.total -= front.1;
                self.entries.pop_front();
            } else {
                front.1 -= excess;
                self.total -= excess;
            }
        }
        self.total
    }

    /// Hits in the log as of the last [`SlidingLog::used`].
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Logs `hits` at `now` (at the newest entry's time if the clock stepped
    /// back); the log never holds more than [`MAX_HITS`].
    pub fn add(&mut self, _spec: &LimitSpec, now: Millis, hits: u64) {
        let hits = hits.min(MAX_HITS.saturating_sub(self.total));
        if hits == 0 {
            return;
        }
        let now = signed(now);
        match self.entries.back_mut() {
            Some((t, count)) if *t >= now => *count += hits,
            _ => self.entries.push_back((now, hits)),
        }
        self.total += hits;
    }

    /// Gives back up to `hits`, newest entries first, never below empty.
    pub fn refund(&mut self, spec: &LimitSpec, now: Millis, hits: u64) {
        self.used(spec, now);
        self.total -= super::take_newest(&mut self.entries, hits);
    }

    /// Until the oldest entry leaves the window (for an empty log: until a
    /// hit made now would leave it).
    pub fn reset_ms(&self, spec: &LimitSpec, now: Millis) -> u64 {
        let oldest = self.entries.front().map_or(signed(now), |&(t, _)| t);
        unsigned(oldest + signed(spec.window.duration_ms) - signed(now))
    }

    /// Bytes held on the heap (the allocated capacity, which can exceed
    /// what is in use), for stores that bound their memory.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<(i64, u64)>()
    }

    /// When the newest entry leaves the window.
    pub fn expires_at(&self, window: &Window) -> Millis {
        self.entries
            .back()
            .map_or(0, |&(t, _)| unsigned(t + signed(window.duration_ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;

    fn spec(requests: u64, duration_ms: u64) -> LimitSpec {
        LimitSpec {
            requests,
            window: Window {
                duration_ms,
                algorithm: Algorithm::SlidingLog,
            },
            penalty: None,
        }
    }

    #[test]
    fn each_hit_counts_for_exactly_one_window() {
        let s = spec(3, 1_000);
        let mut log = SlidingLog::default();
        log.add(&s, 100, 1);
        log.add(&s, 600, 2);
        assert_eq!(log.used(&s, 1_099), 3);
        assert_eq!(log.reset_ms(&s, 1_099), 1);
        assert_eq!(log.used(&s, 1_100), 2);
        assert_eq!(log.used(&s, 1_600), 0);
    }

    #[test]
    fn the_log_never_holds_more_than_the_limit() {
        let s = spec(3, 1_000);
        let mut log = SlidingLog::default();
        log.add(&s, 1, 2);
        log.add(&s, 2, 2); // admitted beyond the limit (shadow mode)
        assert_eq!(log.used(&s, 2), 3);
        log.add(&s, 3, 5);
        assert_eq!(log.used(&s, 3), 3);
        assert_eq!(log.entries.len(), 1, "the newest hits are kept");
    }
}
