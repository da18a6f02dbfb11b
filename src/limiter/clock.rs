//! Time sources. Algorithms take `now` as an argument; stores get it from a
//! [`Clock`], which tests replace with a [`ManualClock`] so nothing sleeps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::Millis;

/// A source of the current time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Millis;
}

/// The wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to; shared between a test and a store.
#[derive(Debug, Default)]
pub struct ManualClock {
    /// Atomic so a test can move time while the store reads it from other tasks.
    now: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `now`.
    pub fn new(now: Millis) -> Self {
        Self {
            now: AtomicU64::new(now),
        }
    }

    /// Moves the clock to `now`.
    pub fn set(&self, now: Millis) {
        self.now.store(now, Ordering::SeqCst);
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        self.now.load(Ordering::SeqCst)
    }
}
