//! The per-limit counters: what one limit did in one decision, and the
//! series it adds to.

use std::sync::atomic::Ordering;

use prometheus_client::metrics::counter::Counter;

/// What one descriptor's limit did in one decision, for the counters.
#[derive(Clone, Copy, Debug)]
pub struct LimitEvent {
    /// The descriptor's weight.
    pub hits: u64,
    /// The request was admitted (and so counted).
    pub admitted: bool,
    /// This limit did not fit the hits.
    pub over: bool,
    /// The limit is in shadow mode.
    pub shadow: bool,
    /// Usage after the decision and the limit's capacity.
    pub used: u64,
    /// The limit's capacity.
    pub capacity: u64,
}

/// The per-limit counters of one label set. The counters are shared with the
/// registry (cloning one clones a handle), so updating them needs no label
/// hashing or lookup.
#[derive(Clone, Debug)]
pub struct LimitCounters {
    pub(super) hits: Counter,
    pub(super) admitted: Counter,
    pub(super) over_limit: Counter,
    pub(super) near_limit: Counter,
    pub(super) shadow_mode: Counter,
    pub(super) near_limit_ratio: f64,
}

/// The per-limit series.
#[derive(Clone, Copy)]
pub(super) enum Series {
    Hits,
    Admitted,
    NearLimit,
    OverLimit,
    ShadowMode,
}

impl LimitEvent {
    /// The series this event adds to, and how much: every series the whole
    /// weight, except near-limit, which counts only the hits that took the
    /// counter above the near-limit threshold, `floor(capacity × ratio)`
    /// (envoyproxy/ratelimit's accounting: with a limit of 2 and the
    /// default 0.8 the threshold is 1, so the first hit is not near and the
    /// second is; a weight of 7 taking a limit of 20 from 10 to 17 has one
    /// hit above 16).
    pub(super) fn series(self, near_limit_ratio: f64, mut add: impl FnMut(Series, u64)) {
        add(Series::Hits, self.hits);
        if self.admitted {
            add(Series::Admitted, self.hits);
            let near = (near_limit_ratio * self.capacity as f64).floor() as u64;
            if !self.over && self.hits > 0 && self.used > near {
                add(Series::NearLimit, self.hits.min(self.used - near));
            }
        }
        if self.over {
            let series = if self.shadow {
                Series::ShadowMode
            } else {
                Series::OverLimit
            };
            add(series, self.hits);
        }
    }
}

impl LimitCounters {
    /// Counts what the limit did in one decision.
    pub fn record(&self, event: LimitEvent) {
        event.series(self.near_limit_ratio, |series, hits| {
            let counter = match series {
                Series::Hits => &self.hits,
                Series::Admitted => &self.admitted,
                Series::NearLimit => &self.near_limit,
                Series::OverLimit => &self.over_limit,
                Series::ShadowMode => &self.shadow_mode,
            };
            add_hits(counter, hits);
        });
    }
}

/// Adds weighted hits to a counter, saturating: a `u64` wraps after 2048
/// requests of the largest weight, and a wrapped counter reads as a reset.
pub(super) fn add_hits(counter: &Counter, hits: u64) {
    let _ = counter
        .inner()
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            Some(n.saturating_add(hits))
        });
}
