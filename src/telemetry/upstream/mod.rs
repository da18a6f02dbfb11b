//! Upstream's stats (envoyproxy/ratelimit): the same names, counted in
//! memory and read by two optional sinks, statsd lines (`statsd`) and a
//! Prometheus page with names mapped by a statsd-exporter mapping file
//! (`mapper`). Off unless configured; the request path only bumps atomics.

pub mod mapper;
pub mod statsd;

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::rules::sanitize;

/// Prefix of every per-rule stat.
pub const RATE_LIMIT_PREFIX: &str = "ratelimit.service.rate_limit";

/// How one descriptor's hits split between upstream's per-rule counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleCounts {
    /// Every hit.
    pub total_hits: u64,
    /// Hits within the limit.
    pub within_limit: u64,
    /// Hits past the near-limit threshold (80%) but not over.
    pub near_limit: u64,
    /// Hits over the limit.
    pub over_limit: u64,
    /// Over-limit hits answered from the local cache.
    pub over_limit_with_local_cache: u64,
    /// Over-limit hits let through by shadow mode.
    pub shadow_mode: u64,
}

/// Upstream's near-limit ratio.
pub const NEAR_LIMIT_RATIO: f32 = 0.8;

impl RuleCounts {
    /// Upstream's accounting for a counter that went from `before` to
    /// `after` (= before + hits) against `limit` requests per unit.
    pub fn from_counter(limit: u64, before: u64, hits: u64, shadow: bool) -> Self {
        let after = before.saturating_add(hits);
        let near = ((limit as f32) * NEAR_LIMIT_RATIO).floor() as u64;
        let mut c = RuleCounts {
            total_hits: hits,
            ..Self::default()
        };
        if after > limit {
            if before >= limit {
                c.over_limit = hits;
            } else {
                c.over_limit = after - limit;
                c.near_limit = limit - near.max(before);
            }
            if shadow {
                c.shadow_mode = hits;
            }
        } else {
            if after > near {
                c.near_limit = if before >= near { hits } else { after - near };
            }
            c.within_limit = hits;
        }
        c
    }

    /// Over the limit answered from the local cache, without a store call.
    pub fn local_cache(hits: u64, shadow: bool) -> Self {
        RuleCounts {
            total_hits: hits,
            over_limit: hits,
            over_limit_with_local_cache: hits,
            shadow_mode: if shadow { hits } else { 0 },
            ..Self::default()
        }
    }
}

/// Kind of a stat, for the sinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Summed; statsd sends deltas.
    Counter,
    /// Last value.
    Gauge,
}

#[derive(Debug)]
struct Stat {
    kind: Kind,
    value: AtomicU64,
}

/// Milliseconds timer: samples since the last statsd flush (bounded), and
/// a cumulative histogram for Prometheus.
#[derive(Debug)]
pub struct Timer {
    pending: parking_lot::Mutex<Vec<f64>>,
    /// Cumulative counts per upper bound in seconds (`TIMER_BUCKETS`), then +Inf.
    buckets: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

/// Histogram bounds in seconds (statsd_exporter's defaults).
pub const TIMER_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const MAX_PENDING_SAMPLES: usize = 4096;

impl Timer {
    fn new() -> Self {
        Timer {
            pending: parking_lot::Mutex::new(Vec::new()),
            buckets: (0..=TIMER_BUCKETS.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    fn record(&self, ms: f64) {
        let secs = ms / 1000.0;
        let idx = TIMER_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(TIMER_BUCKETS.len());
        self.buckets[idx].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((ms * 1000.0) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut pending = self.pending.lock();
        if pending.len() < MAX_PENDING_SAMPLES {
            pending.push(ms);
        }
    }

    /// (per-bucket counts, not cumulative; sum in seconds; count).
    pub fn snapshot(&self) -> (Vec<u64>, f64, u64) {
        (
            self.buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            self.count.load(Ordering::Relaxed),
        )
    }

    fn take_pending(&self) -> Vec<f64> {
        std::mem::take(&mut *self.pending.lock())
    }
}

/// The in-memory stats, shared by the decision path, reload and the sinks.
#[derive(Debug)]
pub struct UpstreamStats {
    stats: RwLock<HashMap<Arc<str>, Arc<Stat>>>,
    timers: RwLock<HashMap<Arc<str>, Arc<Timer>>>,
    /// Most distinct names kept; later names are folded into nothing and
    /// counted in `dropped`, like Sluice's own `metrics_max_descriptors`.
    max_names: usize,
    dropped: AtomicU64,
    /// Counter values at the last statsd flush, for deltas.
    flushed: parking_lot::Mutex<HashMap<Arc<str>, u64>>,
}

/// Names with a grpc method, as upstream's server stats.
pub const SHOULD_RATE_LIMIT: &str = "ratelimit_server.ShouldRateLimit";

/// Which call error upstream counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// The counter store failed (upstream: `redis_error`).
    Store,
    /// Anything else (upstream: `service_error`).
    Service,
}

impl UpstreamStats {
    /// Empty stats keeping at most `max_names` distinct per-rule names.
    pub fn new(max_names: usize) -> Self {
        UpstreamStats {
            stats: RwLock::new(HashMap::new()),
            timers: RwLock::new(HashMap::new()),
            max_names: max_names.max(16),
            dropped: AtomicU64::new(0),
            flushed: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    fn stat(&self, name: &str, kind: Kind) -> Option<Arc<Stat>> {
        if let Some(s) = self.stats.read().get(name) {
            return Some(s.clone());
        }
        let mut map = self.stats.write();
        if let Some(s) = map.get(name) {
            return Some(s.clone());
        }
        if map.len() >= self.max_names {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let s = Arc::new(Stat {
            kind,
            value: AtomicU64::new(0),
        });
        map.insert(Arc::from(name), s.clone());
        Some(s)
    }

    /// Adds `by` to the counter `name`.
    pub fn add(&self, name: &str, by: u64) {
        if let Some(s) = self.stat(name, Kind::Counter) {
            s.value.fetch_add(by, Ordering::Relaxed);
        }
    }

    /// Sets the gauge `name`.
    pub fn set_gauge(&self, name: &str, value: u64) {
        if let Some(s) = self.stat(name, Kind::Gauge) {
            s.value.store(value, Ordering::Relaxed);
        }
    }

    /// Records one timer sample in milliseconds.
    pub fn time_ms(&self, name: &str, ms: f64) {
        let timer = {
            if let Some(t) = self.timers.read().get(name) {
                t.clone()
            } else {
                self.timers
                    .write()
                    .entry(Arc::from(name))
                    .or_insert_with(|| Arc::new(Timer::new()))
                    .clone()
            }
        };
        timer.record(ms);
    }

    /// A counter's value (0 when never touched).
    pub fn get(&self, name: &str) -> u64 {
        self.stats
            .read()
            .get(name)
            .map_or(0, |s| s.value.load(Ordering::Relaxed))
    }

    /// Names refused because of the bound.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// One descriptor's outcome under the rule whose stats key is `key`.
    /// Zero counts are still created, as upstream creates them all.
    pub fn rule(&self, key: &str, counts: RuleCounts) {
        let mut name = String::with_capacity(RATE_LIMIT_PREFIX.len() + key.len() + 32);
        for (stat, by) in [
            ("total_hits", counts.total_hits),
            ("within_limit", counts.within_limit),
            ("near_limit", counts.near_limit),
            ("over_limit", counts.over_limit),
            (
                "over_limit_with_local_cache",
                counts.over_limit_with_local_cache,
            ),
            ("shadow_mode", counts.shadow_mode),
        ] {
            name.clear();
            name.push_str(RATE_LIMIT_PREFIX);
            name.push('.');
            name.push_str(key);
            name.push('.');
            name.push_str(stat);
            self.add(&name, by);
        }
    }

    /// A request for a domain with no configuration.
    pub fn domain_not_found(&self, domain: &str) {
        self.add(
            &format!("{RATE_LIMIT_PREFIX}.{}.domain_not_found", sanitize(domain)),
            1,
        );
    }

    /// A ShouldRateLimit call that failed.
    pub fn call_error(&self, err: CallError) {
        let leaf = match err {
            CallError::Store => "redis_error",
            CallError::Service => "service_error",
        };
        self.add(
            &format!("ratelimit.service.call.should_rate_limit.{leaf}"),
            1,
        );
    }

    /// One ShouldRateLimit call and how long it took.
    pub fn request(&self, elapsed: std::time::Duration) {
        self.add(&format!("{SHOULD_RATE_LIMIT}.total_requests"), 1);
        self.time_ms(
            &format!("{SHOULD_RATE_LIMIT}.response_time"),
            elapsed.as_secs_f64() * 1000.0,
        );
    }

    /// A configuration load, good or refused.
    pub fn config_load(&self, ok: bool) {
        self.add(
            if ok {
                "ratelimit.service.config_load_success"
            } else {
                "ratelimit.service.config_load_error"
            },
            1,
        );
    }

    /// Whether global shadow mode is on (a gauge upstream).
    pub fn global_shadow_mode(&self, on: bool) {
        self.set_gauge("ratelimit.service.global_shadow_mode", u64::from(on));
    }

    /// Every stat with its kind and current value, sorted by name.
    pub fn snapshot(&self) -> Vec<(Arc<str>, Kind, u64)> {
        let mut out: Vec<_> = self
            .stats
            .read()
            .iter()
            .map(|(n, s)| (n.clone(), s.kind, s.value.load(Ordering::Relaxed)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Every timer, sorted by name.
    pub fn timers(&self) -> Vec<(Arc<str>, Arc<Timer>)> {
        let mut out: Vec<_> = self
            .timers
            .read()
            .iter()
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The statsd lines for one flush: counter deltas since the last flush
    /// (zero deltas skipped), gauges, and the pending timer samples.
    pub fn statsd_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut flushed = self.flushed.lock();
        for (name, kind, value) in self.snapshot() {
            match kind {
                Kind::Counter => {
                    let last = flushed.entry(name.clone()).or_insert(0);
                    let delta = value.wrapping_sub(*last);
                    *last = value;
                    if delta > 0 {
                        lines.push(format!("{name}:{delta}|c"));
                    }
                }
                Kind::Gauge => lines.push(format!("{name}:{value}|g")),
            }
        }
        drop(flushed);
        for (name, timer) in self.timers() {
            for ms in timer.take_pending() {
                lines.push(format!("{name}:{ms}|ms"));
            }
        }
        lines
    }
}

#[cfg(test)]
mod tests;
