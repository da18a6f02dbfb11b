//! How accurately each of Sluice's counting algorithms decides, measured
//! against an exact sliding log.
//!
//! Run: `cargo run --release --example accuracy [-- --seed N --out DIR]`
//! (defaults: seed 20261121, out `target/accuracy`). The results are a pure
//! function of the seed.
//!
//! The harness generates seeded request traces — steady Poisson traffic near
//! a global limit, bursty on/off traffic, bursts straddling fixed-window
//! boundaries (the fixed window's worst case), many clients each with a limit
//! of their own, and a realistic mix modelled on the setting of Cloudflare's
//! published figure (tens of thousands of sources with a limit each and
//! log-normally distributed rates, so that most never come near their limit)
//! — and replays every trace through every algorithm independently, with
//! Sluice's admission rule (a rejected request consumes nothing):
//!
//! ```text
//! used = state.used(&spec, t); admitted = state.fits(&spec, t, used, w);
//! if admitted { state.add(&spec, t, w) }
//! ```
//!
//! For every algorithm and trace it reports:
//! - *wrongly admitted* / *wrongly rejected*: requests the algorithm admitted
//!   and the oracle rejected, and the reverse. The oracle is an exact sliding
//!   log written here, deciding every request on its own state.
//! - *worst window*: the most the algorithm admitted in any real window
//!   `(t − d, t]` ending at one of its admissions, as a multiple of the limit.
//! - *errors against the algorithm's own definition*: disagreements with an
//!   independent model written here (exact log, epoch counter, exact GCRA in
//!   integers, bucketed interpolation), each run on its own state. Expect 0.
//! - *state per key*: the numbers a key's state holds, counted from its
//!   `Debug` form at every 1024th decision (peak); each is 8 bytes.
//!
//! And, to explain those figures: each decision against an exact log of the
//! algorithm's *own* admissions (the estimator's error without the drift of
//! two independent states); Cloudflare's method (every request counted,
//! admitted or not, so estimate and truth see the same requests); the sliding
//! windows' worst window against `1 + p/d` and against their documented bound;
//! the fixed window's admissions per epoch window against `min(limit,
//! demand)`; and the token bucket against exact GCRA under saturating load
//! for token intervals that are and are not whole microseconds.
//!
//! Output: a Markdown table on stdout and in `<out>/accuracy.md`, and
//! `<out>/boundary.png`, the admitted count in the trailing window (as a
//! multiple of the limit) over the first eight windows of the boundary trace,
//! one line per algorithm. The PNG has no text (no font libraries); the
//! colours are listed in `accuracy.md`.

use std::collections::VecDeque;
use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use clap::Parser;
use plotters::prelude::*;
use sluice::limiter::{Algorithm, LimitSpec, Millis, State, Window};

/// Window length `d` of every limit: one minute.
const WINDOW_MS: u64 = 60_000;
/// The one limit shared by every client of the global traces.
const GLOBAL_LIMIT: u64 = 1_000;
/// Each client's own limit in the per-client trace (a token every 857.142… ms,
/// so the token bucket's microsecond rounding is exercised too).
const CLIENT_LIMIT: u64 = 70;
/// Clients sharing the global limit.
const GLOBAL_CLIENTS: u32 = 500;
/// Clients with a limit each.
const OWN_LIMIT_CLIENTS: usize = 1_000;
/// Sources in the realistic mix, each with a limit of its own.
const MIX_SOURCES: usize = 30_000;
/// Each source's limit in the realistic mix: one a second (a token every
/// 1 000 000 µs, so no rounding in the token bucket).
const MIX_LIMIT: u64 = 60;
/// The realistic mix's source rates, as multiples of the limit, are
/// log-normal: this median, ...
const MIX_MEDIAN: f64 = 0.03;
/// ... this standard deviation of the logarithm, ...
const MIX_SIGMA: f64 = 1.5;
/// ... and capped at this multiple (so no single source dominates the trace).
const MIX_CAP: f64 = 20.0;
/// 2026-01-01T00:00:00Z, a whole number of windows after the epoch.
const START_MS: u64 = 1_767_225_600_000;
/// Requests per trace: steady, bursty, boundary, per-client, realistic mix.
const TRACE_REQUESTS: [usize; 5] = [15_000_000, 15_000_000, 5_000_000, 15_000_000, 10_000_000];
/// A state's size is measured at every this-many-th decision.
const SAMPLE_EVERY: usize = 1_024;
/// Windows of the boundary trace drawn in the PNG.
const PLOT_WINDOWS: u64 = 8;

#[derive(Parser)]
#[command(about = "Accuracy of Sluice's algorithms against an exact sliding log")]
struct Args {
    /// Seed of every trace.
    #[arg(long, default_value_t = 20_261_121)]
    seed: u64,
    /// Directory for accuracy.md and boundary.png.
    #[arg(long, default_value = "target/accuracy")]
    out: PathBuf,
}

// ---------------------------------------------------------------- randomness

/// SplitMix64: small, fast, and good enough to place arrivals.
struct Rng(u64);

impl Rng {
    /// An independent stream for `stream` under `seed`.
    fn new(seed: u64, stream: u64) -> Self {
        let mut rng = Rng(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        rng.next_u64();
        rng
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Exponentially distributed with the given mean.
    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let radius = (-2.0 * (1.0 - self.unit()).ln()).sqrt();
        radius * (std::f64::consts::TAU * self.unit()).cos()
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u32) -> u32 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u32
    }
}

// -------------------------------------------------------------------- traces

/// One request: when, from whom, how many hits.
#[derive(Clone, Copy)]
struct Request {
    t: Millis,
    client: u32,
    weight: u32,
}

impl Request {
    fn hits(&self) -> u64 {
        u64::from(self.weight)
    }
}

/// Whether all clients share one limited identity or each has its own.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    Global,
    PerClient,
}

/// A time-ordered list of requests and the limit they are checked against.
struct Trace {
    name: &'static str,
    about: String,
    scope: Scope,
    clients: usize,
    limit: u64,
    requests: Vec<Request>,
}

impl Trace {
    fn keys(&self) -> usize {
        match self.scope {
            Scope::Global => 1,
            Scope::PerClient => self.clients,
        }
    }

    fn key(&self, r: &Request) -> usize {
        match self.scope {
            Scope::Global => 0,
            Scope::PerClient => r.client as usize,
        }
    }

    fn span_windows(&self) -> f64 {
        let last = self.requests.last().map_or(START_MS, |r| r.t);
        (last - START_MS) as f64 / WINDOW_MS as f64
    }
}

/// Appends Poisson arrivals at `per_ms` over `[from, to)` (ms after
/// [`START_MS`]) from clients drawn uniformly.
fn poisson(rng: &mut Rng, from: f64, to: f64, per_ms: f64, out: &mut Vec<Request>) {
    let mut t = from;
    loop {
        t += rng.exponential(1.0 / per_ms);
        if t >= to {
            return;
        }
        out.push(Request {
            t: START_MS + t as u64,
            client: rng.below(GLOBAL_CLIENTS),
            weight: 1,
        });
    }
}

/// The limit's rate, in requests per millisecond.
fn limit_rate(limit: u64) -> f64 {
    limit as f64 / WINDOW_MS as f64
}

fn global_trace(name: &'static str, about: &str, requests: Vec<Request>) -> Trace {
    let mut trace = Trace {
        name,
        about: String::new(),
        scope: Scope::Global,
        clients: GLOBAL_CLIENTS as usize,
        limit: GLOBAL_LIMIT,
        requests,
    };
    trace.about = format!(
        "{about}; {} requests over {:.0} windows",
        trace.requests.len(),
        trace.span_windows()
    );
    trace
}

/// Poisson traffic whose rate drifts between 90% and 110% of the limit,
/// changing every 1–5 windows.
fn steady(seed: u64, target: usize) -> Trace {
    let mut rng = Rng::new(seed, 1);
    let (mut requests, mut t) = (Vec::with_capacity(target + 10_000), 0.0);
    while requests.len() < target {
        let end = t + rng.uniform(1.0, 5.0) * WINDOW_MS as f64;
        let rate = rng.uniform(0.9, 1.1) * limit_rate(GLOBAL_LIMIT);
        poisson(&mut rng, t, end, rate, &mut requests);
        t = end;
    }
    let about = format!(
        "{GLOBAL_CLIENTS} clients share one limit of {GLOBAL_LIMIT}/min; Poisson arrivals at \
         90–110% of the limit, the rate redrawn every 1–5 windows"
    );
    global_trace("steady", &about, requests)
}

/// Bursts of 2–20 s at 3–10× the limit's rate, then 10–120 s of silence.
fn bursty(seed: u64, target: usize) -> Trace {
    let mut rng = Rng::new(seed, 2);
    let (mut requests, mut t) = (Vec::with_capacity(target + 10_000), 0.0);
    while requests.len() < target {
        let end = t + rng.uniform(2_000.0, 20_000.0);
        let rate = rng.uniform(3.0, 10.0) * limit_rate(GLOBAL_LIMIT);
        poisson(&mut rng, t, end, rate, &mut requests);
        t = end + rng.uniform(10_000.0, 120_000.0);
    }
    let about = format!(
        "{GLOBAL_CLIENTS} clients share one limit of {GLOBAL_LIMIT}/min; on/off: 2–20 s at 3–10× \
         the limit's rate, then 10–120 s of silence"
    );
    global_trace("bursty", &about, requests)
}

/// Every second window boundary, a burst of 1–1.5× the limit in the 0.5–3 s
/// before it and another after it; silence otherwise. A fixed window admits
/// both (it sees an empty window each time): 2× the limit within seconds.
fn boundary(seed: u64, target: usize) -> Trace {
    let mut rng = Rng::new(seed, 3);
    let (mut requests, mut edge) = (Vec::with_capacity(target + 10_000), 0.0);
    while requests.len() < target {
        edge += 2.0 * WINDOW_MS as f64;
        for side in [-1.0, 1.0] {
            let width = rng.uniform(500.0, 3_000.0);
            let count = rng.uniform(1.0, 1.5) * GLOBAL_LIMIT as f64;
            let (from, to) = if side < 0.0 {
                (edge - width, edge)
            } else {
                (edge, edge + width)
            };
            poisson(&mut rng, from, to, count / width, &mut requests);
        }
    }
    let about = format!(
        "{GLOBAL_CLIENTS} clients share one limit of {GLOBAL_LIMIT}/min; at every second window \
         boundary a burst of 1–1.5× the limit in the 0.5–3 s before it and another after it"
    );
    global_trace("boundary", &about, requests)
}

/// Many clients, each with its own limit: 60% well under it (5–80%), 25%
/// near it (90–110%), 15% abusive (1.5–4×); Poisson arrivals.
fn per_client(seed: u64, target: usize) -> Trace {
    let mut rng = Rng::new(seed, 4);
    let mut cumulative = Vec::with_capacity(OWN_LIMIT_CLIENTS);
    let mut total = 0.0;
    for _ in 0..OWN_LIMIT_CLIENTS {
        let share = rng.unit();
        let factor = if share < 0.60 {
            rng.uniform(0.05, 0.8)
        } else if share < 0.85 {
            rng.uniform(0.9, 1.1)
        } else {
            rng.uniform(1.5, 4.0)
        };
        total += factor * limit_rate(CLIENT_LIMIT);
        cumulative.push(total);
    }
    let (mut requests, mut t) = (Vec::with_capacity(target), 0.0);
    while requests.len() < target {
        t += rng.exponential(1.0 / total);
        let pick = rng.unit() * total;
        let client = cumulative.partition_point(|&c| c <= pick) as u32;
        requests.push(Request {
            t: START_MS + t as u64,
            client,
            weight: 1,
        });
    }
    let mut trace = Trace {
        name: "per-client",
        about: String::new(),
        scope: Scope::PerClient,
        clients: OWN_LIMIT_CLIENTS,
        limit: CLIENT_LIMIT,
        requests,
    };
    trace.about = format!(
        "{OWN_LIMIT_CLIENTS} clients, each with its own limit of {CLIENT_LIMIT}/min: 60% at \
         5–80% of it, 25% at 90–110%, 15% at 1.5–4×; Poisson; {} requests over {:.0} windows",
        trace.requests.len(),
        trace.span_windows()
    );
    trace
}

/// The setting of Cloudflare's published figure (0.003% of 400 M requests
/// wrongly decided, over some 270 000 sources, most of them far below their
/// limit): [`MIX_SOURCES`] sources, each with its own limit of
/// [`MIX_LIMIT`]/min and a Poisson rate drawn log-normally (median
/// [`MIX_MEDIAN`]× the limit, σ = [`MIX_SIGMA`], capped at [`MIX_CAP`]×).
/// Most sources stay far below the limit, a minority hover near it and a few
/// exceed it several times over.
fn realistic_mix(seed: u64, target: usize) -> Trace {
    let mut rng = Rng::new(seed, 5);
    let factors: Vec<f64> = (0..MIX_SOURCES)
        .map(|_| (MIX_MEDIAN * (MIX_SIGMA * rng.normal()).exp()).min(MIX_CAP))
        .collect();
    let mut cumulative = Vec::with_capacity(MIX_SOURCES);
    let mut total = 0.0;
    for factor in &factors {
        total += factor * limit_rate(MIX_LIMIT);
        cumulative.push(total);
    }
    let (mut requests, mut t) = (Vec::with_capacity(target), 0.0);
    while requests.len() < target {
        t += rng.exponential(1.0 / total);
        let pick = rng.unit() * total;
        let client = cumulative.partition_point(|&c| c <= pick) as u32;
        requests.push(Request {
            t: START_MS + t as u64,
            client,
            weight: 1,
        });
    }
    let share = |keep: &dyn Fn(f64) -> bool| {
        let n = factors.iter().filter(|&&f| keep(f)).count();
        format!("{:.1}%", 100.0 * n as f64 / MIX_SOURCES as f64)
    };
    let mut trace = Trace {
        name: "realistic mix",
        about: String::new(),
        scope: Scope::PerClient,
        clients: MIX_SOURCES,
        limit: MIX_LIMIT,
        requests,
    };
    trace.about = format!(
        "{MIX_SOURCES} sources, each with its own limit of {MIX_LIMIT}/min, modelled on the \
         setting of Cloudflare's figure; each source's Poisson rate drawn log-normally (median \
         {MIX_MEDIAN}× the limit, σ of the log {MIX_SIGMA}, capped at {MIX_CAP}×): {} of the \
         sources below 0.5× the limit, {} at 0.5–0.9×, {} at 0.9–1.1×, {} at 1.1–3×, {} above \
         3×; {} requests over {:.0} windows",
        share(&|f| f < 0.5),
        share(&|f| (0.5..0.9).contains(&f)),
        share(&|f| (0.9..1.1).contains(&f)),
        share(&|f| (1.1..3.0).contains(&f)),
        share(&|f| f >= 3.0),
        trace.requests.len(),
        trace.span_windows()
    );
    trace
}

/// How many of `trace`'s keys exceed their limit at some point (keys whose
/// demand in some real window `(t − d, t]` is over the limit, which are
/// exactly those the oracle rejects at least once), and how many requests
/// those keys send.
fn keys_over_limit(trace: &Trace, oracle: &[bool]) -> (usize, usize) {
    let mut over = vec![false; trace.keys()];
    for (r, &admitted) in trace.requests.iter().zip(oracle) {
        over[trace.key(r)] |= !admitted;
    }
    let requests = trace.requests.iter().filter(|r| over[trace.key(r)]).count();
    (over.into_iter().filter(|&o| o).count(), requests)
}

// ---------------------------------------------------------------- algorithms

/// The algorithms under test, with the limit `limit` per window.
fn algorithms(limit: u64) -> Vec<(&'static str, LimitSpec)> {
    let spec = |algorithm| LimitSpec {
        requests: limit,
        window: Window {
            duration_ms: WINDOW_MS,
            algorithm,
        },
        penalty: None,
    };
    let sliding = |buckets| {
        spec(Algorithm::SlidingWindow {
            precision_ms: WINDOW_MS / buckets,
        })
    };
    vec![
        ("sliding_window p=d/1", sliding(1)),
        ("sliding_window p=d/10 (default)", sliding(10)),
        ("sliding_window p=d/60", sliding(60)),
        ("fixed_window", spec(Algorithm::FixedWindow)),
        (
            "token_bucket (burst = limit)",
            spec(Algorithm::TokenBucket { burst: limit }),
        ),
        ("sliding_log", spec(Algorithm::SlidingLog)),
    ]
}

/// The precision of a sliding window, `None` for other algorithms.
fn precision(spec: &LimitSpec) -> Option<u64> {
    match spec.window.algorithm {
        Algorithm::SlidingWindow { precision_ms } => Some(precision_ms),
        _ => None,
    }
}

// ------------------------------------------------- definitions (independent)

/// An algorithm's admission rule as its definition states it, written apart
/// from the crate's code.
trait Definition: Send {
    /// Decides a request of `w` hits at `t` on this model's own state.
    fn admit(&mut self, t: Millis, w: u64) -> bool;
}

/// The exact sliding log: admit iff the hits admitted in `(t − d, t]` plus
/// `w` fit the limit. Also the oracle.
struct ExactLog {
    limit: u64,
    log: VecDeque<(Millis, u64)>,
    total: u64,
}

impl ExactLog {
    fn new(limit: u64) -> Self {
        Self {
            limit,
            log: VecDeque::new(),
            total: 0,
        }
    }
}

impl Definition for ExactLog {
    fn admit(&mut self, t: Millis, w: u64) -> bool {
        while let Some(&(old, hits)) = self.log.front() {
            if old + WINDOW_MS > t {
                break;
            }
            self.log.pop_front();
            self.total -= hits;
        }
        let admitted = self.total + w <= self.limit;
        if admitted {
            self.log.push_back((t, w));
            self.total += w;
        }
        admitted
    }
}

/// Epoch-aligned fixed windows: admit iff the window `⌊t/d⌋` has room.
struct EpochCounter {
    limit: u64,
    epoch: u64,
    count: u64,
}

impl Definition for EpochCounter {
    fn admit(&mut self, t: Millis, w: u64) -> bool {
        if t / WINDOW_MS != self.epoch {
            self.epoch = t / WINDOW_MS;
            self.count = 0;
        }
        count_if_it_fits(&mut self.count, self.limit, w)
    }
}

/// Counts `w` in `count` when it fits `limit`; whether it did.
fn count_if_it_fits(count: &mut u64, limit: u64, w: u64) -> bool {
    let admitted = *count + w <= limit;
    if admitted {
        *count += w;
    }
    admitted
}

/// A calendar period's counter, by the civil date: the count starts again
/// when the local year, month, ISO week or day of `t` changes.
struct CivilCounter {
    limit: u64,
    calendar: sluice::limiter::calendar::Calendar,
    period: Option<(i16, i8, i8)>,
    count: u64,
}

impl Definition for CivilCounter {
    fn admit(&mut self, t: Millis, w: u64) -> bool {
        use sluice::limiter::calendar::Period;
        let zone = jiff::tz::TimeZone::get(self.calendar.zone.name()).expect("a known zone");
        let ms = i64::try_from(t).expect("a time after 1970");
        let date = jiff::Timestamp::from_millisecond(ms)
            .expect("a representable time")
            .to_zoned_datetime(zone)
            .date();
        let week = date.iso_week_date();
        let period = match self.calendar.period {
            Period::Day => (date.year(), date.month(), date.day()),
            Period::Week => (week.year(), week.week(), 0),
            Period::Month => (date.year(), date.month(), 0),
            Period::Year => (date.year(), 0, 0),
        };
        if self.period != Some(period) {
            self.period = Some(period);
            self.count = 0;
        }
        count_if_it_fits(&mut self.count, self.limit, w)
    }
}

/// GCRA in exact integers: time counted in units of `1/requests` ms, so the
/// emission interval `d/requests` ms is exactly `d` units.
struct ExactGcra {
    requests: u128,
    burst: u128,
    tat: u128,
}

impl Definition for ExactGcra {
    fn admit(&mut self, t: Millis, w: u64) -> bool {
        let (now, interval) = (u128::from(t) * self.requests, u128::from(WINDOW_MS));
        let tat = self.tat.max(now);
        let admitted = tat + u128::from(w) * interval - now <= self.burst * interval;
        if admitted {
            self.tat = tat + u128::from(w) * interval;
        }
        admitted
    }
}

/// The sliding window as DESIGN.md defines it, in integers: epoch-aligned
/// buckets of `p`; the live buckets count fully, the one straddling `t − d`
/// by the share of it still inside the window, rounded up.
struct BucketModel {
    limit: u64,
    precision: u64,
    buckets: VecDeque<(u64, u64)>,
}

impl Definition for BucketModel {
    fn admit(&mut self, t: Millis, w: u64) -> bool {
        let p = self.precision;
        let start = t - WINDOW_MS;
        let oldest = start / p;
        let inside = (oldest + 1) * p - start;
        while self.buckets.front().is_some_and(|&(i, _)| i < oldest) {
            self.buckets.pop_front();
        }
        let used: u64 = self
            .buckets
            .iter()
            .map(|&(i, h)| {
                if i == oldest {
                    (h * inside).div_ceil(p)
                } else {
                    h
                }
            })
            .sum();
        let admitted = used + w <= self.limit;
        if admitted {
            match self.buckets.back_mut() {
                Some((i, h)) if *i == t / p => *h += w,
                _ => self.buckets.push_back((t / p, w)),
            }
        }
        admitted
    }
}

/// The independent model of `spec`'s algorithm, and its name for the table.
fn definition(spec: &LimitSpec) -> (Box<dyn Definition>, &'static str) {
    let limit = spec.requests;
    match spec.window.algorithm {
        Algorithm::SlidingWindow { precision_ms } => (
            Box::new(BucketModel {
                limit,
                precision: precision_ms,
                buckets: VecDeque::new(),
            }),
            "bucket model",
        ),
        Algorithm::FixedWindow => (
            Box::new(EpochCounter {
                limit,
                epoch: u64::MAX,
                count: 0,
            }),
            "epoch counter",
        ),
        Algorithm::TokenBucket { burst } => (
            Box::new(ExactGcra {
                requests: u128::from(limit),
                burst: u128::from(burst),
                tat: 0,
            }),
            "exact GCRA",
        ),
        Algorithm::SlidingLog | Algorithm::Concurrency => {
            (Box::new(ExactLog::new(limit)), "exact log")
        }
        Algorithm::Calendar(calendar) => (
            Box::new(CivilCounter {
                limit,
                calendar,
                period: None,
                count: 0,
            }),
            "civil-date counter",
        ),
    }
}

/// The oracle's decision for every request of `trace`.
fn oracle(trace: &Trace) -> Vec<bool> {
    let mut logs: Vec<ExactLog> = (0..trace.keys())
        .map(|_| ExactLog::new(trace.limit))
        .collect();
    trace
        .requests
        .iter()
        .map(|r| logs[trace.key(r)].admit(r.t, r.hits()))
        .collect()
}

// ------------------------------------------------------------------- metrics

/// What one key admitted in the trailing window, to find the worst window.
#[derive(Default)]
struct Trailing {
    admitted: VecDeque<(Millis, u64)>,
    total: u64,
}

impl Trailing {
    /// The hits admitted in `(t − d, t]` so far.
    fn count(&mut self, t: Millis) -> u64 {
        while let Some(&(old, hits)) = self.admitted.front() {
            if old + WINDOW_MS > t {
                break;
            }
            self.admitted.pop_front();
            self.total -= hits;
        }
        self.total
    }

    /// Records an admission at `t` (after [`Trailing::count`] at `t`) and
    /// returns the hits admitted in `(t − d, t]`.
    fn admit(&mut self, t: Millis, w: u64) -> u64 {
        self.admitted.push_back((t, w));
        self.total += w;
        self.total
    }
}

/// What one key admitted per bucket of `p`, to check the sliding window's
/// documented bound: a real window holds at most the limit plus what was
/// admitted in the one bucket it cuts through.
#[derive(Default)]
struct BucketTally {
    buckets: VecDeque<(u64, u64)>,
}

impl BucketTally {
    /// Records an admission at `t`; returns the hits of the bucket that
    /// straddles `t − d`.
    fn admit(&mut self, p: u64, t: Millis, w: u64) -> u64 {
        let oldest = (t - WINDOW_MS) / p;
        while self.buckets.front().is_some_and(|&(i, _)| i < oldest) {
            self.buckets.pop_front();
        }
        match self.buckets.back_mut() {
            Some((i, h)) if *i == t / p => *h += w,
            _ => self.buckets.push_back((t / p, w)),
        }
        match self.buckets.front() {
            Some(&(i, h)) if i == oldest => h,
            _ => 0,
        }
    }
}

/// Per key, per epoch window: demand and admissions, to check that a fixed
/// window admits exactly `min(limit, demand)` in every window.
#[derive(Default)]
struct EpochTally {
    epoch: Option<u64>,
    demand: u64,
    admitted: u64,
}

impl EpochTally {
    /// Records a request; returns `Some(closed window was exact)` when `t`
    /// opens a new window.
    fn record(&mut self, limit: u64, t: Millis, w: u64, admitted: bool) -> Option<bool> {
        let epoch = t / WINDOW_MS;
        let mut closed = None;
        if self.epoch != Some(epoch) {
            closed = self.close(limit);
            *self = Self {
                epoch: Some(epoch),
                ..Self::default()
            };
        }
        self.demand += w;
        if admitted {
            self.admitted += w;
        }
        closed
    }

    /// Whether the current window admitted `min(limit, demand)`.
    fn close(&self, limit: u64) -> Option<bool> {
        self.epoch.map(|_| self.admitted == limit.min(self.demand))
    }
}

/// The numbers a state holds, counted from its `Debug` form (every field of
/// every state is an 8-byte integer or float).
fn stored_values(state: &State) -> usize {
    format!("{state:?}")
        .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        .filter(|token| token.parse::<f64>().is_ok())
        .count()
}

/// Everything measured for one algorithm over one trace.
#[derive(Default)]
struct Outcome {
    decisions: u64,
    admitted: u64,
    wrongly_admitted: u64,
    wrongly_rejected: u64,
    /// Admitted although the algorithm's own admissions already filled the
    /// real window (an exact log over the same history would reject).
    over_admitted: u64,
    /// Rejected although the algorithm's own admissions left room in the
    /// real window.
    under_admitted: u64,
    own_errors: u64,
    own_model: &'static str,
    worst_window: u64,
    /// Admissions after which a real window held more than the limit plus the
    /// cut bucket's hits (sliding windows only).
    bound_violations: u64,
    /// Epoch windows checked and those not admitting `min(limit, demand)`
    /// (fixed windows only).
    epoch_windows: u64,
    epoch_mismatches: u64,
    peak_values: usize,
    /// Cloudflare's method (every request counted, admitted or not, so the
    /// estimate and the exact count see the same history): requests the
    /// estimate let through over the limit, and held back under it. `None`
    /// for the token bucket, which estimates no window count.
    counting_all: Option<(u64, u64)>,
    /// Every decision, kept for the boundary trace's plot.
    decisions_made: Vec<bool>,
}

/// Replays `trace` through the algorithm of `spec`, comparing it with the
/// oracle's decisions and with its own definition.
fn replay(trace: &Trace, spec: &LimitSpec, oracle: &[bool], keep: bool) -> Outcome {
    let keys = trace.keys();
    let mut states: Vec<State> = (0..keys).map(|_| State::new(spec)).collect();
    let mut models: Vec<Box<dyn Definition>> = (0..keys).map(|_| definition(spec).0).collect();
    let mut trailing: Vec<Trailing> = (0..keys).map(|_| Trailing::default()).collect();
    let mut tallies: Vec<BucketTally> = (0..keys).map(|_| BucketTally::default()).collect();
    let mut epochs: Vec<EpochTally> = (0..keys).map(|_| EpochTally::default()).collect();
    let fixed = spec.window.algorithm == Algorithm::FixedWindow;
    let mut out = Outcome {
        own_model: definition(spec).1,
        ..Outcome::default()
    };
    for (i, (r, &oracle_admits)) in trace.requests.iter().zip(oracle).enumerate() {
        let (k, w) = (trace.key(r), r.hits());
        let state = &mut states[k];
        let used = state.used(spec, r.t);
        let admitted = state.fits(spec, r.t, used, w);
        if admitted {
            state.add(spec, r.t, w);
        }
        out.decisions += 1;
        out.wrongly_admitted += u64::from(admitted && !oracle_admits);
        out.wrongly_rejected += u64::from(!admitted && oracle_admits);
        out.own_errors += u64::from(models[k].admit(r.t, w) != admitted);
        let room = trailing[k].count(r.t) + w <= trace.limit;
        out.over_admitted += u64::from(admitted && !room);
        out.under_admitted += u64::from(!admitted && room);
        if admitted {
            out.admitted += 1;
            let in_window = trailing[k].admit(r.t, w);
            out.worst_window = out.worst_window.max(in_window);
            if let Some(p) = precision(spec) {
                let cut = tallies[k].admit(p, r.t, w);
                out.bound_violations += u64::from(in_window > trace.limit + cut);
            }
        }
        if fixed && let Some(exact) = epochs[k].record(trace.limit, r.t, w, admitted) {
            out.epoch_windows += 1;
            out.epoch_mismatches += u64::from(!exact);
        }
        if i % SAMPLE_EVERY == 0 {
            out.peak_values = out.peak_values.max(stored_values(state));
        }
        if keep {
            out.decisions_made.push(admitted);
        }
    }
    out.counting_all = counting_all(trace, spec);
    if fixed {
        for exact in epochs.iter().filter_map(|e| e.close(trace.limit)) {
            out.epoch_windows += 1;
            out.epoch_mismatches += u64::from(!exact);
        }
    }
    out
}

/// Cloudflare's measurement: every request is counted whether admitted or
/// not, and each check (`used + w ≤ limit`) is compared with the exact count
/// of the same requests in `(t − d, t]`. Returns `(wrongly admitted, wrongly
/// rejected)`.
fn counting_all(trace: &Trace, spec: &LimitSpec) -> Option<(u64, u64)> {
    if matches!(spec.window.algorithm, Algorithm::TokenBucket { .. }) {
        return None;
    }
    let keys = trace.keys();
    let mut states: Vec<State> = (0..keys).map(|_| State::new(spec)).collect();
    let mut exact: Vec<Trailing> = (0..keys).map(|_| Trailing::default()).collect();
    let (mut admitted_over, mut rejected_under) = (0, 0);
    for r in &trace.requests {
        let (k, w) = (trace.key(r), r.hits());
        let estimate = states[k].used(spec, r.t) + w <= trace.limit;
        let truth = exact[k].count(r.t) + w <= trace.limit;
        admitted_over += u64::from(estimate && !truth);
        rejected_under += u64::from(!estimate && truth);
        states[k].add(spec, r.t, w);
        exact[k].admit(r.t, w);
    }
    Some((admitted_over, rejected_under))
}

/// The token bucket against exact GCRA under saturating load (4 requests
/// every millisecond for ten minutes) for a limit of `limit` per window.
/// Returns `(admitted by the crate, admitted by exact GCRA, decisions that
/// differ)`.
fn gcra_rounding(limit: u64) -> (u64, u64, u64) {
    let spec = LimitSpec {
        requests: limit,
        window: Window {
            duration_ms: WINDOW_MS,
            algorithm: Algorithm::TokenBucket { burst: limit },
        },
        penalty: None,
    };
    let mut state = State::new(&spec);
    let (mut model, _) = definition(&spec);
    let (mut ours, mut exact, mut differ) = (0, 0, 0);
    for t in START_MS..START_MS + 10 * WINDOW_MS {
        for _ in 0..4 {
            let used = state.used(&spec, t);
            let admitted = state.fits(&spec, t, used, 1);
            if admitted {
                state.add(&spec, t, 1);
            }
            let model_admits = model.admit(t, 1);
            ours += u64::from(admitted);
            exact += u64::from(model_admits);
            differ += u64::from(admitted != model_admits);
        }
    }
    (ours, exact, differ)
}

/// Limits for [`gcra_rounding`]: token intervals of a whole second, of
/// 857 142.857… µs and of 333.333… µs.
const GCRA_LIMITS: [u64; 3] = [60, CLIENT_LIMIT, 180_000];

// ------------------------------------------------------------------- running

/// Runs `jobs` on every core, returning their results in order.
fn parallel<T: Send>(jobs: Vec<Box<dyn FnOnce() -> T + Send + '_>>) -> Vec<T> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = AtomicUsize::new(0);
    let jobs: Vec<Mutex<Option<_>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let results: Vec<Mutex<Option<T>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let job = job.lock().unwrap().take().expect("each job runs once");
                    *results[i].lock().unwrap() = Some(job());
                }
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.into_inner().unwrap().expect("every job ran"))
        .collect()
}

/// One row of the results: the trace, the algorithm and what was measured.
struct Row<'a> {
    trace: &'a Trace,
    algorithm: &'static str,
    spec: LimitSpec,
    outcome: Outcome,
}

fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse();
    let started = Instant::now();
    let mut traces = {
        let seed = args.seed;
        let jobs: Vec<Box<dyn FnOnce() -> Trace + Send>> = vec![
            Box::new(move || steady(seed, TRACE_REQUESTS[0])),
            Box::new(move || bursty(seed, TRACE_REQUESTS[1])),
            Box::new(move || boundary(seed, TRACE_REQUESTS[2])),
            Box::new(move || per_client(seed, TRACE_REQUESTS[3])),
            Box::new(move || realistic_mix(seed, TRACE_REQUESTS[4])),
        ];
        parallel(jobs)
    };
    let oracles = parallel(
        traces
            .iter()
            .map(|t| Box::new(move || oracle(t)) as Box<dyn FnOnce() -> Vec<bool> + Send>)
            .collect(),
    );
    eprintln!("traces and oracle: {:.1?}", started.elapsed());
    for (trace, oracle) in traces.iter_mut().zip(&oracles) {
        if trace.name == "realistic mix" {
            let (over, sent) = keys_over_limit(trace, oracle);
            let _ = write!(
                trace.about,
                "; {over} of the {} sources ({:.2}%) exceed their limit at some point (their \
                 demand in some real window is over the limit: the oracle rejects at least one \
                 of their requests), and they send {:.2}% of the requests",
                trace.clients,
                100.0 * over as f64 / trace.clients as f64,
                100.0 * sent as f64 / trace.requests.len() as f64
            );
        }
    }

    let mut cases = Vec::new();
    for (trace, oracle) in traces.iter().zip(&oracles) {
        for (algorithm, spec) in algorithms(trace.limit) {
            cases.push((trace, oracle, algorithm, spec));
        }
    }
    let outcomes = parallel(
        cases
            .iter()
            .map(|&(trace, oracle, _, spec)| {
                let keep = trace.name == "boundary";
                Box::new(move || replay(trace, &spec, oracle, keep))
                    as Box<dyn FnOnce() -> Outcome + Send>
            })
            .collect(),
    );
    let rows: Vec<Row> = cases
        .iter()
        .zip(outcomes)
        .map(|(&(trace, _, algorithm, spec), outcome)| Row {
            trace,
            algorithm,
            spec,
            outcome,
        })
        .collect();
    let gcra = parallel(
        GCRA_LIMITS
            .iter()
            .map(|&limit| Box::new(move || gcra_rounding(limit)) as Box<dyn FnOnce() -> _ + Send>)
            .collect(),
    );
    let decisions: u64 = rows.iter().map(|r| r.outcome.decisions).sum();
    eprintln!(
        "{decisions} decisions replayed in {:.1?}",
        started.elapsed()
    );

    let report = report(args.seed, &traces, &rows, &gcra);
    print!("{report}");
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("accuracy.md"), &report)?;
    let png = args.out.join("boundary.png");
    plot_boundary(&png, &rows)?;
    eprintln!(
        "wrote {} and {} in {:.1?}",
        args.out.join("accuracy.md").display(),
        png.display(),
        started.elapsed()
    );
    Ok(())
}

// -------------------------------------------------------------------- report

/// `n` of `total` as a percentage with four decimals, and the count.
fn percent(n: u64, total: u64) -> String {
    format!("{:.4}% ({n})", 100.0 * n as f64 / total.max(1) as f64)
}

fn state_size(values: usize) -> String {
    format!("{values} ({} B)", values * 8)
}

fn report(seed: u64, traces: &[Trace], rows: &[Row], gcra: &[(u64, u64, u64)]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### Accuracy against an exact sliding log (seed {seed})\n\n\
         Window d = 60 s for every limit. Traces:\n"
    );
    for trace in traces {
        let _ = writeln!(md, "- **{}**: {}.", trace.name, trace.about);
    }
    let _ = writeln!(
        md,
        "\n| trace | algorithm | requests | admitted | wrongly admitted | wrongly rejected | \
         wrong, total | worst window / limit | errors vs own definition | state per key, \
         values (bytes) |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for row in rows {
        let o = &row.outcome;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2}% | {} | {} | {} | {:.3}× | {} ({}) | {} |",
            row.trace.name,
            row.algorithm,
            o.decisions,
            100.0 * o.admitted as f64 / o.decisions as f64,
            percent(o.wrongly_admitted, o.decisions),
            percent(o.wrongly_rejected, o.decisions),
            percent(o.wrongly_admitted + o.wrongly_rejected, o.decisions),
            o.worst_window as f64 / row.trace.limit as f64,
            o.own_errors,
            o.own_model,
            state_size(o.peak_values),
        );
    }
    same_history(&mut md, rows);
    cloudflare_method(&mut md, rows);
    sliding_bounds(&mut md, rows);
    fixed_definition(&mut md, rows);
    gcra_table(&mut md, gcra);
    let _ = writeln!(
        md,
        "\nState per key: the numbers (8 bytes each) in the in-memory state, counted from its \
         `Debug` form at every {SAMPLE_EVERY}th decision, peak over the trace; container \
         overhead not included.\n\n\
         `boundary.png`: admitted hits in the trailing minute ÷ limit, every 100 ms over the \
         first {PLOT_WINDOWS} windows of the boundary trace. Colours: {}; lines that coincide are \
         drawn as nested stripes (black widest, then blue, then green); grey horizontal lines at \
         1× (the limit, darker) and 2×; light vertical lines at window boundaries; the y axis \
         runs from 0 to 2.2×.",
        PALETTE_NAMES.join(", ")
    );
    md
}

/// Each decision against the exact rule applied to the algorithm's own
/// admissions: the estimator's error without the drift between two
/// independently evolving states.
fn same_history(md: &mut String, rows: &[Row]) {
    let _ = writeln!(
        md,
        "\nOn the same history: each decision against an exact sliding log of the algorithm's \
         *own* admissions (\"over\": admitted although its own admissions already filled the \
         real window; \"under\": rejected although they left room).\n\n\
         | trace | algorithm | over-admitted | under-admitted | wrong, total |\n\
         |---|---|---|---|---|"
    );
    for row in rows {
        let o = &row.outcome;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            row.trace.name,
            row.algorithm,
            percent(o.over_admitted, o.decisions),
            percent(o.under_admitted, o.decisions),
            percent(o.over_admitted + o.under_admitted, o.decisions),
        );
    }
}

/// Cloudflare's method: every request counted, the estimate against the
/// exact count of the same requests.
fn cloudflare_method(md: &mut String, rows: &[Row]) {
    let _ = writeln!(
        md,
        "\nCloudflare's method (the 0.003% figure): every request is counted, admitted or not, \
         so the estimate and the exact count see the same requests; each check \
         `used + 1 ≤ limit` is compared with the exact count of the same requests in \
         `(t − d, t]`. Not Sluice's semantics (Sluice counts only what it admits); it isolates \
         the estimator. The token bucket estimates no window count and is left out.\n\n\
         | trace | algorithm | wrongly admitted | wrongly rejected | wrong, total |\n\
         |---|---|---|---|---|"
    );
    for row in rows {
        let Some((over, under)) = row.outcome.counting_all else {
            continue;
        };
        let n = row.outcome.decisions;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            row.trace.name,
            row.algorithm,
            percent(over, n),
            percent(under, n),
            percent(over + under, n),
        );
    }
}

/// The sliding windows' overshoot against the target `1 + p/d` and against
/// their documented bound.
fn sliding_bounds(md: &mut String, rows: &[Row]) {
    let _ = writeln!(
        md,
        "\nSliding windows: worst window against one bucket's share of the limit (`1 + p/d`), \
         and admissions after which a real window held more than the limit plus what was \
         admitted in the bucket it cuts (the documented guarantee; expect 0).\n\n\
         | trace | algorithm | worst window / limit | 1 + p/d | within | bound violations |\n\
         |---|---|---|---|---|---|"
    );
    for row in rows {
        let Some(p) = precision(&row.spec) else {
            continue;
        };
        let o = &row.outcome;
        let worst = o.worst_window as f64 / row.trace.limit as f64;
        let target = 1.0 + p as f64 / WINDOW_MS as f64;
        let _ = writeln!(
            md,
            "| {} | {} | {worst:.3}× | {target:.3}× | {} | {} |",
            row.trace.name,
            row.algorithm,
            if worst <= target { "yes" } else { "no" },
            o.bound_violations
        );
    }
}

/// The token bucket's rounding check.
fn gcra_table(md: &mut String, results: &[(u64, u64, u64)]) {
    let _ = writeln!(
        md,
        "\nToken bucket against exact GCRA under saturating load (4 requests every ms for 10 \
         windows, burst = limit), by token interval.\n\n\
         | limit / min | token interval | admitted | admitted by exact GCRA | decisions that \
         differ |\n|---|---|---|---|---|"
    );
    for (&limit, &(ours, exact, differ)) in GCRA_LIMITS.iter().zip(results) {
        let interval_us = WINDOW_MS as f64 * 1000.0 / limit as f64;
        let _ = writeln!(
            md,
            "| {limit} | {interval_us:.3} µs | {ours} | {exact} | {differ} |"
        );
    }
}

/// The fixed window against `min(limit, demand)` per epoch-aligned window.
fn fixed_definition(md: &mut String, rows: &[Row]) {
    let _ = writeln!(
        md,
        "\nFixed window: epoch-aligned windows whose admitted count is not `min(limit, demand)` \
         (expect 0).\n\n| trace | windows with requests | not min(limit, demand) |\n|---|---|---|"
    );
    for row in rows.iter().filter(|r| r.outcome.epoch_windows > 0) {
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            row.trace.name, row.outcome.epoch_windows, row.outcome.epoch_mismatches
        );
    }
}

// ---------------------------------------------------------------------- plot

/// One colour per algorithm, in the order of [`algorithms`].
const PALETTE: [RGBColor; 6] = [
    RGBColor(230, 140, 0),
    RGBColor(30, 90, 220),
    RGBColor(0, 160, 70),
    RGBColor(220, 30, 30),
    RGBColor(170, 0, 170),
    RGBColor(0, 0, 0),
];
/// Line widths, in the same order: the exact log widest.
const WIDTHS: [u32; 6] = [2, 6, 4, 2, 2, 9];
const PALETTE_NAMES: [&str; 6] = [
    "orange = sliding_window p=d/1",
    "blue = sliding_window p=d/10",
    "green = sliding_window p=d/60",
    "red = fixed_window",
    "magenta = token_bucket",
    "black = sliding_log",
];

/// Admitted hits in `(t − d, t]` ÷ limit, every 100 ms over the first
/// [`PLOT_WINDOWS`] windows, as `(t in windows, multiple of the limit)`.
fn trailing_series(trace: &Trace, decisions: &[bool]) -> Vec<(f64, f64)> {
    let admitted: Vec<Millis> = trace
        .requests
        .iter()
        .zip(decisions)
        .filter(|&(_, &a)| a)
        .map(|(r, _)| r.t)
        .collect();
    let (mut lo, mut hi) = (0, 0);
    (0..=PLOT_WINDOWS * WINDOW_MS / 100)
        .map(|step| {
            let t = START_MS + step * 100;
            while hi < admitted.len() && admitted[hi] <= t {
                hi += 1;
            }
            while lo < hi && admitted[lo] + WINDOW_MS <= t {
                lo += 1;
            }
            let x = (t - START_MS) as f64 / WINDOW_MS as f64;
            (x, (hi - lo) as f64 / trace.limit as f64)
        })
        .collect()
}

/// Draws the boundary trace's trailing-window admissions, one line per
/// algorithm, with no text.
fn plot_boundary(path: &Path, rows: &[Row]) -> Result<(), Box<dyn Error>> {
    let root = BitMapBackend::new(path, (1400, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .build_cartesian_2d(0.0..PLOT_WINDOWS as f64, 0.0..2.2)?;
    let grey = RGBColor(215, 215, 215);
    for w in 0..=PLOT_WINDOWS {
        let x = w as f64;
        chart.draw_series(LineSeries::new([(x, 0.0), (x, 2.2)], grey))?;
    }
    chart.draw_series(LineSeries::new(
        [(0.0, 2.0), (PLOT_WINDOWS as f64, 2.0)],
        RGBColor(160, 160, 160).stroke_width(2),
    ))?;
    chart.draw_series(LineSeries::new(
        [(0.0, 1.0), (PLOT_WINDOWS as f64, 1.0)],
        RGBColor(90, 90, 90).stroke_width(3),
    ))?;
    let boundary: Vec<&Row> = rows.iter().filter(|r| r.trace.name == "boundary").collect();
    // Widest first, so lines that coincide with the exact log stay visible
    // as nested stripes.
    let mut lines: Vec<_> = boundary.iter().zip(PALETTE).zip(WIDTHS).collect();
    lines.sort_by_key(|&(_, width)| std::cmp::Reverse(width));
    for ((row, colour), width) in lines {
        let series = trailing_series(row.trace, &row.outcome.decisions_made);
        chart.draw_series(LineSeries::new(series, colour.stroke_width(width)))?;
    }
    root.present()?;
    Ok(())
}
