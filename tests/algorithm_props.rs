//! Property tests of the counting algorithms and of the memory store built on
//! them. Time is always explicit (a `now` argument or a manual clock); nothing
//! sleeps.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::sample::subsequence;

use sluice::limiter::{
    Algorithm, Identity, IdentityBuilder, LimitSpec, ManualClock, Role, State, Window,
};
use sluice::store::{Batch, BatchItem, BatchOutcome, LimitOutcome, MemoryStore, MemoryStoreConfig};

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// A sliding window with `precision` dividing `duration` (duration = precision·n).
fn sliding_window() -> impl Strategy<Value = Window> {
    (1u64..=1000, 1u64..=20).prop_map(|(precision_ms, n)| Window {
        duration_ms: precision_ms * n,
        algorithm: Algorithm::SlidingWindow { precision_ms },
    })
}

fn fixed_window() -> impl Strategy<Value = Window> {
    (1u64..=20_000).prop_map(|duration_ms| Window {
        duration_ms,
        algorithm: Algorithm::FixedWindow,
    })
}

fn any_window() -> impl Strategy<Value = Window> {
    prop_oneof![sliding_window(), fixed_window()]
}

/// The bucket length of a window: the scale on which its count changes.
fn granularity(window: &Window) -> u64 {
    match window.algorithm {
        Algorithm::SlidingWindow { precision_ms } => precision_ms,
        Algorithm::FixedWindow => window.duration_ms,
    }
}

/// A first instant: at the epoch (so `now − duration` is negative), shortly
/// after it, or at a realistic wall-clock time.
fn start_time(duration_ms: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        2 => 0..=3 * duration_ms,
        2 => 1_600_000_000_000u64..=1_800_000_000_000,
    ]
}

/// Time steps scaled to the window: many requests at the same instant, many
/// within a bucket, some jumping over whole windows.
fn time_delta(window: &Window) -> impl Strategy<Value = u64> + use<> {
    let p = granularity(window);
    let d = window.duration_ms;
    prop_oneof![
        3 => Just(0u64),
        6 => 0..=p,
        2 => 0..=2 * d,
    ]
}

/// A window, a first instant and `(time delta, weight)` requests.
#[derive(Clone, Debug)]
struct Timeline {
    limit: u64,
    window: Window,
    start: u64,
    requests: Vec<(u64, u64)>,
}

impl Timeline {
    /// `(now, weight)` with `now` monotone non-decreasing.
    fn instants(&self) -> Vec<(u64, u64)> {
        let mut now = self.start;
        self.requests
            .iter()
            .map(|&(delta, weight)| {
                now += delta;
                (now, weight)
            })
            .collect()
    }
}

fn timeline(
    windows: impl Strategy<Value = Window>,
    weights: impl Strategy<Value = u64> + Clone + 'static,
    max_requests: usize,
) -> impl Strategy<Value = Timeline> {
    (1u64..=50, windows).prop_flat_map(move |(limit, window)| {
        (
            Just(limit),
            Just(window),
            start_time(window.duration_ms),
            prop::collection::vec((time_delta(&window), weights.clone()), 1..=max_requests),
        )
            .prop_map(|(limit, window, start, requests)| Timeline {
                limit,
                window,
                start,
                requests,
            })
    })
}

// ---------------------------------------------------------------------------
// Pure driver and models
// ---------------------------------------------------------------------------

/// One request as the pure algorithm decided it.
#[derive(Clone, Copy, Debug)]
struct Step {
    now: u64,
    weight: u64,
    used_before: u64,
    admitted: bool,
}

/// Drives a bare `State` with the stores' admission rule.
fn drive(state: &mut State, limit: u64, instants: &[(u64, u64)]) -> Vec<Step> {
    instants
        .iter()
        .map(|&(now, weight)| {
            let used_before = state.used(now);
            let admitted = used_before + weight <= limit;
            if admitted {
                state.add(now, weight);
            }
            Step {
                now,
                weight,
                used_before,
                admitted,
            }
        })
        .collect()
}

fn admitted(steps: &[Step]) -> Vec<(i64, u64)> {
    steps
        .iter()
        .filter(|s| s.admitted)
        .map(|s| (s.now as i64, s.weight))
        .collect()
}

fn precision_of(window: &Window) -> i64 {
    match window.algorithm {
        Algorithm::SlidingWindow { precision_ms } => precision_ms as i64,
        Algorithm::FixedWindow => panic!("not a sliding window"),
    }
}

/// Admitted weight per bucket index.
fn per_bucket(hits: &[(i64, u64)], p: i64) -> BTreeMap<i64, u64> {
    let mut buckets = BTreeMap::new();
    for &(t, w) in hits {
        *buckets.entry(t.div_euclid(p)).or_insert(0) += w;
    }
    buckets
}

/// The sliding-window estimate at `now`, computed from the admitted hits alone.
fn model_used(hits: &[(i64, u64)], now: i64, p: i64, d: i64) -> u64 {
    let start = now - d;
    let oldest = start.div_euclid(p);
    let newest = now.div_euclid(p);
    let inside = (oldest + 1) * p - start;
    let (mut full, mut oldest_hits) = (0u64, 0u64);
    for &(t, w) in hits {
        let index = t.div_euclid(p);
        if index > oldest && index <= newest {
            full += w;
        } else if index == oldest {
            oldest_hits += w;
        }
    }
    full + (oldest_hits as f64 * inside as f64 / p as f64).ceil() as u64
}

/// When the sliding window's headroom next grows, as documented: when the
/// oldest bucket still holding hits leaves the window, or for an empty counter
/// when a hit made now would leave it.
fn model_reset(hits: &[(i64, u64)], now: i64, p: i64, d: i64) -> u64 {
    let oldest = (now - d).div_euclid(p);
    let front = hits
        .iter()
        .filter(|&&(_, w)| w > 0)
        .map(|&(t, _)| t.div_euclid(p))
        .filter(|&index| index >= oldest)
        .min()
        .unwrap_or(now.div_euclid(p));
    ((front + 1) * p + d - now) as u64
}

// ---------------------------------------------------------------------------
// Store helpers
// ---------------------------------------------------------------------------

fn identity(name: &str) -> Identity {
    let mut builder = IdentityBuilder::new("d");
    builder.value("k", name);
    builder.build()
}

fn store() -> (MemoryStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
    (store, clock)
}

fn item(identity: &Identity, limits: Vec<LimitSpec>, hits: u64) -> BatchItem {
    BatchItem {
        identity: identity.clone(),
        limits,
        hits,
        role: Role::Enforce,
    }
}

/// The same batch with every weight set to zero: observes without counting.
fn check_only(batch: &Batch) -> Batch {
    Batch {
        items: batch
            .items
            .iter()
            .map(|i| BatchItem {
                hits: 0,
                ..i.clone()
            })
            .collect(),
    }
}

fn used_of(outcome: &BatchOutcome) -> Vec<u64> {
    outcome.limits.iter().map(|l| l.used).collect()
}

/// A pool of counters for the batch properties.
const IDENTITIES: usize = 4;

#[derive(Clone, Debug)]
struct BatchPlan {
    delta: u64,
    /// Distinct identity indexes, 2..=4 of them.
    who: Vec<usize>,
    /// Per item: which of the two windows it limits (bit mask 1..=3) and its weight.
    items: Vec<(u8, u64)>,
}

#[derive(Clone, Debug)]
struct BatchCase {
    windows: [Window; 2],
    /// Limit of counter (identity, window index).
    limits: [[u64; 2]; IDENTITIES],
    start: u64,
    batches: Vec<BatchPlan>,
}

fn batch_case() -> impl Strategy<Value = BatchCase> {
    (any_window(), any_window()).prop_flat_map(|(w0, w1)| {
        let scale = finer(w0, w1);
        let plan = (
            time_delta(&scale),
            subsequence((0..IDENTITIES).collect::<Vec<_>>(), 2..=IDENTITIES).prop_shuffle(),
            prop::collection::vec((1u8..=3, 0u64..=5), IDENTITIES),
        )
            .prop_map(|(delta, who, items)| BatchPlan { delta, who, items });
        (
            Just([w0, w1]),
            prop::array::uniform4(prop::array::uniform2(1u64..=20)),
            start_time(scale.duration_ms),
            prop::collection::vec(plan, 1..=40),
        )
            .prop_map(|(windows, limits, start, batches)| BatchCase {
                windows,
                limits,
                start,
                batches,
            })
    })
}

/// The window with the finer buckets, which sets the pace of the time steps.
fn finer(a: Window, b: Window) -> Window {
    if granularity(&a) <= granularity(&b) {
        a
    } else {
        b
    }
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// DESIGN.md: "in every window of `duration` aligned to bucket boundaries
    /// the admitted weight never exceeds the limit".
    #[test]
    fn sliding_window_never_admits_more_than_the_limit_in_any_aligned_window(
        case in timeline(sliding_window(), 0u64..=5, 200),
    ) {
        let p = precision_of(&case.window);
        let n = case.window.duration_ms as i64 / p;
        let mut state = State::new(case.window);
        let steps = drive(&mut state, case.limit, &case.instants());
        let buckets = per_bucket(&admitted(&steps), p);
        // Only windows holding at least one admitted bucket can be over.
        for &b in buckets.keys() {
            for k in (b - n + 1)..=b {
                let sum: u64 = buckets.range(k..k + n).map(|(_, w)| w).sum();
                prop_assert!(
                    sum <= case.limit,
                    "aligned window [{}, {}) holds {} > limit {}",
                    k * p, (k + n) * p, sum, case.limit
                );
            }
        }
    }

    /// A window at an arbitrary position holds at most the limit plus what
    /// was admitted in the one bucket its start cuts through.
    #[test]
    fn sliding_window_overshoot_in_any_window_is_bounded_by_one_bucket(
        case in timeline(sliding_window(), 0u64..=5, 200),
    ) {
        let p = precision_of(&case.window);
        let d = case.window.duration_ms as i64;
        let mut state = State::new(case.window);
        let steps = drive(&mut state, case.limit, &case.instants());
        let hits = admitted(&steps);
        let buckets = per_bucket(&hits, p);
        for &(t, _) in &hits {
            let start = t - d;
            let in_window: u64 = hits
                .iter()
                .filter(|&&(s, _)| s > start && s <= t)
                .map(|&(_, w)| w)
                .sum();
            let cut = buckets.get(&start.div_euclid(p)).copied().unwrap_or(0);
            prop_assert!(
                in_window <= case.limit + cut,
                "window ({}, {}] holds {} > limit {} + straddled bucket {}",
                start, t, in_window, case.limit, cut
            );
        }
    }

    /// `used` is exactly the documented interpolation over the admitted hits (and
    /// `reset_ms` the documented instant the oldest live bucket leaves),
    /// before and after every request, and at later probe instants.
    #[test]
    fn sliding_window_estimate_matches_exact_interpolation(
        case in timeline(sliding_window(), 0u64..=5, 200),
        probes in prop::collection::vec(0u64..=3, 1..=8),
    ) {
        let p = precision_of(&case.window);
        let d = case.window.duration_ms as i64;
        let limit = case.limit;
        let mut state = State::new(case.window);
        let mut hits: Vec<(i64, u64)> = Vec::new();
        for (now, weight) in case.instants() {
            let used = state.used(now);
            prop_assert_eq!(used, model_used(&hits, now as i64, p, d), "before request at {}", now);
            prop_assert_eq!(state.reset_ms(now), model_reset(&hits, now as i64, p, d), "reset at {}", now);
            if used + weight <= limit {
                state.add(now, weight);
                hits.push((now as i64, weight));
                prop_assert_eq!(
                    state.clone().used(now),
                    model_used(&hits, now as i64, p, d),
                    "after request at {}", now
                );
            }
        }
        // Probe the decay after the last request, in steps of a third of a bucket.
        let mut now = case.instants().last().map_or(case.start, |&(t, _)| t);
        for step in probes {
            now += step * (p as u64).div_ceil(3);
            prop_assert_eq!(state.used(now), model_used(&hits, now as i64, p, d), "probe at {}", now);
            prop_assert_eq!(state.reset_ms(now), model_reset(&hits, now as i64, p, d), "reset at {}", now);
        }
    }

    /// envoyproxy/ratelimit semantics: every epoch-aligned window admits up to
    /// the limit and no more.
    #[test]
    fn fixed_window_admits_exactly_the_limit_per_window(
        unit in timeline(fixed_window(), Just(1u64), 200),
        weighted in timeline(fixed_window(), 0u64..=5, 200),
    ) {
        // Unit weights: admitted == min(limit, attempts) in every window.
        let d = unit.window.duration_ms;
        let mut state = State::new(unit.window);
        let steps = drive(&mut state, unit.limit, &unit.instants());
        let mut per_window: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for s in &steps {
            let e = per_window.entry(s.now / d).or_default();
            e.0 += 1;
            e.1 += u64::from(s.admitted);
        }
        for (w, (attempts, admitted)) in per_window {
            prop_assert_eq!(admitted, attempts.min(unit.limit), "window {}", w);
        }

        // Arbitrary weights: per window at most the limit, and a request is
        // rejected only when it does not fit in what the window has left.
        let d = weighted.window.duration_ms;
        let mut state = State::new(weighted.window);
        let steps = drive(&mut state, weighted.limit, &weighted.instants());
        let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
        for s in &steps {
            let sum = per_window.entry(s.now / d).or_default();
            prop_assert_eq!(s.used_before, *sum, "used at {}", s.now);
            prop_assert_eq!(s.admitted, *sum + s.weight <= weighted.limit);
            prop_assert_eq!(state.reset_ms(s.now), (s.now / d + 1) * d - s.now);
            if s.admitted {
                *sum += s.weight;
            }
            prop_assert!(*sum <= weighted.limit);
        }
    }

    /// The memory store decides a single-limit request exactly as the bare
    /// algorithm does, and reports used and reset as the algorithm sees them.
    #[test]
    fn memory_store_matches_the_pure_algorithm(
        case in timeline(any_window(), 0u64..=5, 120),
    ) {
        let (store, clock) = store();
        let who = identity("v");
        let spec = LimitSpec { requests: case.limit, window: case.window };
        let mut state = State::new(case.window);
        for (now, weight) in case.instants() {
            clock.set(now);
            let outcome = store.apply_at(&Batch { items: vec![item(&who, vec![spec], weight)] }, now);

            let used_before = state.used(now);
            let admitted = used_before + weight <= case.limit;
            if admitted {
                state.add(now, weight);
            }
            let expected = LimitOutcome {
                used: if admitted { state.used(now) } else { used_before },
                over: !admitted,
                reset_ms: state.reset_ms(now),
            };
            prop_assert_eq!(outcome.admitted, admitted, "at {} weight {}", now, weight);
            prop_assert_eq!(outcome.limits, vec![expected], "at {} weight {}", now, weight);
        }
    }

    /// A request with several counters is counted everywhere or nowhere.
    #[test]
    fn memory_store_all_or_nothing(case in batch_case()) {
        let (store, clock) = store();
        let ids: Vec<Identity> = (0..IDENTITIES).map(|i| identity(&format!("u{i}"))).collect();
        let distinct = case.windows[0] != case.windows[1];
        let mut model: HashMap<(usize, usize), State> = HashMap::new();
        let mut now = case.start;
        for plan in &case.batches {
            now += plan.delta;
            clock.set(now);
            // (identity, window) of every limit, in outcome order, and its weight.
            let mut counters: Vec<((usize, usize), u64)> = Vec::new();
            let items: Vec<BatchItem> = plan
                .who
                .iter()
                .zip(&plan.items)
                .map(|(&who, &(mask, hits))| {
                    let mask = if distinct { mask } else { 1 };
                    let limits = (0..2)
                        .filter(|w| mask & (1 << w) != 0)
                        .map(|w| {
                            counters.push(((who, w), hits));
                            LimitSpec { requests: case.limits[who][w], window: case.windows[w] }
                        })
                        .collect();
                    item(&ids[who], limits, hits)
                })
                .collect();
            let batch = Batch { items };

            let before = used_of(&store.apply_at(&check_only(&batch), now));
            let outcome = store.apply_at(&batch, now);
            let after = used_of(&store.apply_at(&check_only(&batch), now));

            // The pure model: admitted iff every counter has room for its weight.
            let mut fits = true;
            for (i, &((who, w), hits)) in counters.iter().enumerate() {
                let state = model.entry((who, w)).or_insert_with(|| State::new(case.windows[w]));
                let used = state.used(now);
                prop_assert_eq!(before[i], used, "counter {:?} at {}", (who, w), now);
                fits &= used + hits <= case.limits[who][w];
            }
            prop_assert_eq!(outcome.admitted, fits, "batch at {}", now);

            for (i, &((who, w), hits)) in counters.iter().enumerate() {
                if outcome.admitted {
                    prop_assert_eq!(after[i], before[i] + hits, "counter {:?} at {}", (who, w), now);
                    prop_assert_eq!(outcome.limits[i].used, before[i] + hits);
                    model.get_mut(&(who, w)).expect("created above").add(now, hits);
                } else {
                    prop_assert_eq!(after[i], before[i], "counter {:?} at {}", (who, w), now);
                    prop_assert_eq!(outcome.limits[i].used, before[i]);
                }
            }
        }
    }

    /// Naming one counter twice in a request counts both weights, for the
    /// check as well as for the count.
    #[test]
    fn memory_store_duplicate_counter_in_one_request_counts_both(
        case in timeline(any_window(), 0u64..=5, 40),
        a in 0u64..=10,
        b in 0u64..=10,
        same_item in any::<bool>(),
    ) {
        let (store, clock) = store();
        let who = identity("v");
        let spec = LimitSpec { requests: case.limit, window: case.window };
        let single = |hits| Batch { items: vec![item(&who, vec![spec], hits)] };
        let mut now = 0;
        for (t, weight) in case.instants() {
            now = t;
            clock.set(now);
            store.apply_at(&single(weight), now);
        }
        let used = store.apply_at(&single(0), now).limits[0].used;

        // Either two items with weights a and b, or one item listing the limit
        // twice (then both weights are a).
        let (batch, total) = if same_item {
            (Batch { items: vec![item(&who, vec![spec, spec], a)] }, 2 * a)
        } else {
            (single_pair(&who, spec, a, b), a + b)
        };
        let outcome = store.apply_at(&batch, now);
        prop_assert_eq!(outcome.admitted, used + total <= case.limit,
            "used {} + {} vs limit {}", used, total, case.limit);
        let after = store.apply_at(&single(0), now).limits[0].used;
        prop_assert_eq!(after, if outcome.admitted { used + total } else { used });
        if outcome.admitted {
            prop_assert_eq!(outcome.limits[1].used, used + total);
        }
    }
}

fn single_pair(who: &Identity, spec: LimitSpec, a: u64, b: u64) -> Batch {
    Batch {
        items: vec![item(who, vec![spec], a), item(who, vec![spec], b)],
    }
}
