//! The counting algorithms, as pure state machines over explicit time.
//!
//! A [`State`] holds only what changes with traffic; the limit it is checked
//! against ([`LimitSpec`]) is passed to every call, so a reload that changes
//! `requests_per_unit` never leaves stale parameters inside a counter. Each
//! state answers four questions at `now`: how much of the limit is in use
//! (`used`), what a hit does (`add`), when headroom next grows (`reset_ms`),
//! and when the state has decayed to nothing (`expires_at`, so stores can drop
//! it). The Redis script implements the same arithmetic (IEEE doubles on both
//! sides); the store conformance suite keeps the two identical.

mod calendar_window;
mod fixed_window;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use calendar_window::CalendarWindow;
pub use fixed_window::FixedWindow;
pub use sliding_log::{MAX_LOG_ENTRIES, SlidingLog};
pub use sliding_window::SlidingWindow;
pub use token_bucket::{MAX_BUCKET_TICKS, TokenBucket};

use super::calendar::Calendar;
use super::{LimitSpec, Millis, Window};

/// Takes up to `hits` off the newest `(time, count)` entries of a log or
/// bucket list, dropping those left empty; returns how many were taken
/// (fewer than `hits` only when the list ran empty). What a refund gives
/// back is usually what was charged last.
fn take_newest(entries: &mut std::collections::VecDeque<(i64, u64)>, hits: u64) -> u64 {
    let mut left = hits;
    while left > 0 {
        let Some(back) = entries.back_mut() else {
            break;
        };
        let take = back.1.min(left);
        back.1 -= take;
        left -= take;
        if back.1 == 0 {
            entries.pop_back();
        }
    }
    hits - left
}

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
    /// A fixed window that is the calendar period (day, week, month, year)
    /// containing now in a time zone; the window's `duration_ms` is the
    /// unit's nominal length, which names the counter.
    Calendar(Calendar),
    /// GCRA: tokens refill at `requests` per window, up to `burst`.
    TokenBucket {
        /// Most tokens held, i.e. the largest burst admitted at once.
        burst: u64,
    },
    /// Exact: one entry per admitted hit within the window.
    SlidingLog,
    /// At most `requests` in flight: each hit takes a slot held for the
    /// window's length (the lease) unless a refund (`is_negative_hits`)
    /// releases it first. Counted as a sliding log whose window is the lease,
    /// so a lost release frees its slot when the lease ends.
    Concurrency,
}

impl Algorithm {
    /// The name used in rules files.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::Calendar(_) => "calendar",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::Concurrency => "concurrency",
        }
    }
}

/// The name used in rules files, then the parameter the variant carries:
/// `sliding_window precision=1000ms`, `token_bucket burst=5`, `fixed_window`.
impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())?;
        match self {
            Algorithm::SlidingWindow { precision_ms } => write!(f, " precision={precision_ms}ms"),
            Algorithm::TokenBucket { burst } => write!(f, " burst={burst}"),
            Algorithm::Calendar(c) => write!(f, " {} in {}", c.period.name(), c.zone.name()),
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::Concurrency => Ok(()),
        }
    }
}

impl LimitSpec {
    /// The most that can be in use at once: the burst of a token bucket, the
    /// number of requests per window otherwise. `remaining = capacity − used`.
    pub fn capacity(&self) -> u64 {
        match self.window.algorithm {
            Algorithm::TokenBucket { burst } => burst,
            _ => self.requests,
        }
    }
}

/// The counting state of one counter.
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    /// See [`SlidingWindow`].
    Sliding(SlidingWindow),
    /// See [`FixedWindow`].
    Fixed(FixedWindow),
    /// See [`CalendarWindow`].
    Calendar(CalendarWindow),
    /// See [`TokenBucket`].
    Bucket(TokenBucket),
    /// See [`SlidingLog`].
    Log(SlidingLog),
}

impl State {
    /// An empty state for limits counted like `spec`.
    pub fn new(spec: &LimitSpec) -> Self {
        match spec.window.algorithm {
            Algorithm::SlidingWindow { .. } => State::Sliding(SlidingWindow::default()),
            Algorithm::FixedWindow => State::Fixed(FixedWindow::default()),
            Algorithm::Calendar(_) => State::Calendar(CalendarWindow::default()),
            Algorithm::TokenBucket { .. } => State::Bucket(TokenBucket::default()),
            Algorithm::SlidingLog | Algorithm::Concurrency => State::Log(SlidingLog::default()),
        }
    }

    /// Forgets what no longer counts at `now` and returns how much of the
    /// capacity is in use.
    pub fn used(&mut self, spec: &LimitSpec, now: Millis) -> u64 {
        match self {
            State::Sliding(s) => s.used(spec, now),
            State::Fixed(s) => s.hits_now(spec, now),
            State::Calendar(s) => s.used(calendar(spec), now),
            State::Bucket(s) => s.used(spec, now),
            State::Log(s) => s.used(spec, now),
        }
    }

    /// Whether `hits` more fit at `now` (after [`State::used`] returned `used`).
    /// A sum past `u64` fits nothing: checked, never wrapped.
    pub fn fits(&self, spec: &LimitSpec, now: Millis, used: u64, hits: u64) -> bool {
        match self {
            State::Bucket(s) => s.fits(spec, now, hits),
            _ => used.checked_add(hits).is_some_and(|n| n <= spec.requests),
        }
    }

    /// Counts `hits` at `now`; a counter never holds more than
    /// [`MAX_HITS`](crate::limiter::MAX_HITS) (the rest is not counted).
    pub fn add(&mut self, spec: &LimitSpec, now: Millis, hits: u64) {
        match self {
            State::Sliding(s) => s.add(spec, now, hits),
            State::Fixed(s) => s.add(spec, now, hits),
            State::Calendar(s) => s.add(calendar(spec), now, hits),
            State::Bucket(s) => s.add(spec, now, hits),
            State::Log(s) => s.add(spec, now, hits),
        }
    }

    /// Gives back up to `hits` at `now`, never below empty (a refund: an
    /// Envoy `is_negative_hits` descriptor). Windows and logs take back
    /// their newest hits first; a token bucket gets the tokens back.
    pub fn refund(&mut self, spec: &LimitSpec, now: Millis, hits: u64) {
        match self {
            State::Sliding(s) => s.refund(spec, now, hits),
            State::Fixed(s) => s.refund(spec, now, hits),
            State::Calendar(s) => s.refund(calendar(spec), now, hits),
            State::Bucket(s) => s.refund(spec, now, hits),
            State::Log(s) => s.refund(spec, now, hits),
        }
    }

    /// Milliseconds from `now` until headroom next grows.
    pub fn reset_ms(&self, spec: &LimitSpec, now: Millis) -> u64 {
        match self {
            State::Sliding(s) => s.reset_ms(spec, now),
            State::Fixed(s) => s.reset_ms(spec, now),
            State::Calendar(s) => s.reset_ms(calendar(spec), now),
            State::Bucket(s) => s.reset_ms(spec, now),
            State::Log(s) => s.reset_ms(spec, now),
        }
    }

    /// For how many milliseconds from `now` no hit at all can fit (0 when
    /// one can now). Exact or shorter, never longer: a local cache may reject
    /// for this long without asking the store. Also never longer than the
    /// instant [`State::reset_ms`] reports stays the same, so that cache can
    /// report the store's reset. Call after [`State::used`].
    pub fn full_for(&self, spec: &LimitSpec, now: Millis) -> u64 {
        match self {
            State::Sliding(s) => s.full_for(spec, now),
            State::Fixed(s) if s.hits_now(spec, now) >= spec.requests => s.reset_ms(spec, now),
            State::Calendar(s) => s.full_for(spec, calendar(spec), now),
            State::Bucket(s) if !s.fits(spec, now, 1) => s.reset_ms(spec, now),
            // Exactly full: beyond the limit the next read trims the oldest
            // hits, which moves the reset; empty, the reset moves with `now`.
            State::Log(s) if s.total() == spec.requests && s.total() > 0 => s.reset_ms(spec, now),
            _ => 0,
        }
    }

    /// Bytes the state holds on the heap beyond its own size: the buckets of
    /// a sliding window or the entries of a sliding log, none otherwise.
    pub fn heap_bytes(&self) -> usize {
        match self {
            State::Sliding(s) => s.heap_bytes(),
            State::Log(s) => s.heap_bytes(),
            State::Fixed(_) | State::Calendar(_) | State::Bucket(_) => 0,
        }
    }

    /// The instant from which this state counts nothing; a store may drop it then.
    pub fn expires_at(&self, window: &Window) -> Millis {
        match self {
            State::Sliding(s) => s.expires_at(window),
            State::Fixed(s) => s.expires_at(window),
            State::Calendar(s) => s.expires_at(),
            State::Bucket(s) => s.expires_at(),
            State::Log(s) => s.expires_at(window),
        }
    }
}

/// The calendar of a limit counted by a [`CalendarWindow`]. A state is made
/// for its limit's algorithm (see [`State::new`]), so any other is a bug
/// upstream; UTC days then stand in rather than a panic.
fn calendar(spec: &LimitSpec) -> Calendar {
    match spec.window.algorithm {
        Algorithm::Calendar(c) => c,
        _ => {
            debug_assert!(false, "a calendar state for {}", spec.window.algorithm);
            Calendar::utc_days()
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
