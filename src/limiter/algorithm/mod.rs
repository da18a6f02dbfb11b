//! The counting algorithms, as pure state machines over explicit time.
//!
//! Each state answers three questions at `now`: how many weighted hits are in
//! the window (`used`), when headroom next grows (`reset_ms`), and when the
//! state has decayed to nothing (`expires_at`, so stores can drop it). The
//! Redis script implements the same arithmetic; the store conformance suite
//! keeps the two identical.

mod fixed_window;
mod sliding_window;

pub use fixed_window::FixedWindow;
pub use sliding_window::SlidingWindow;

use super::{Millis, Window};

/// How hits are counted over a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Buckets of `precision_ms` over the window; the oldest, partly expired
    /// bucket counts in proportion to the part of it still inside the window.
    SlidingWindow {
        /// Bucket length in milliseconds; divides the window length.
        precision_ms: u64,
    },
    /// Windows aligned to the Unix epoch, as envoyproxy/ratelimit counts.
    FixedWindow,
}

impl Algorithm {
    /// The name used in rules files.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
        }
    }
}

/// The counting state of one counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// See [`SlidingWindow`].
    Sliding(SlidingWindow),
    /// See [`FixedWindow`].
    Fixed(FixedWindow),
}

impl State {
    /// An empty state for `window`.
    pub fn new(window: Window) -> Self {
        match window.algorithm {
            Algorithm::SlidingWindow { precision_ms } => {
                State::Sliding(SlidingWindow::new(window.duration_ms, precision_ms))
            }
            Algorithm::FixedWindow => State::Fixed(FixedWindow::new(window.duration_ms)),
        }
    }

    /// Forgets what has left the window at `now` and returns the weighted
    /// hits still counted in it.
    pub fn used(&mut self, now: Millis) -> u64 {
        match self {
            State::Sliding(s) => s.used(now),
            State::Fixed(f) => f.used(now),
        }
    }

    /// Counts `hits` at `now`.
    pub fn add(&mut self, now: Millis, hits: u64) {
        match self {
            State::Sliding(s) => s.add(now, hits),
            State::Fixed(f) => f.add(now, hits),
        }
    }

    /// Milliseconds from `now` until headroom next grows.
    pub fn reset_ms(&self, now: Millis) -> u64 {
        match self {
            State::Sliding(s) => s.reset_ms(now),
            State::Fixed(f) => f.reset_ms(now),
        }
    }

    /// The instant from which this state counts nothing; a store may drop it then.
    pub fn expires_at(&self) -> Millis {
        match self {
            State::Sliding(s) => s.expires_at(),
            State::Fixed(f) => f.expires_at(),
        }
    }
}

/// Times are `u64` milliseconds on the outside; bucket arithmetic needs signed
/// values because `now - duration` is negative near the epoch (manual clocks).
fn signed(t: u64) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

/// Converts a non-negative signed duration back; negative results cannot occur
/// by construction but are clamped rather than wrapped.
fn unsigned(t: i64) -> u64 {
    u64::try_from(t).unwrap_or(0)
}
