//! Property tests of the batch evaluator (`sluice::limiter::batch`, which
//! the memory store runs and the Redis script's driver mirrors): one item
//! is the algorithm alone, a batch is a naive model of the driver's steps,
//! counting windows match an exact history of the hits, refunds never go
//! below empty. Time is explicit; nothing sleeps.

use std::collections::HashMap;

use proptest::prelude::*;

use sluice::limiter::batch::{self, Evaluation, Item, Limit, Report};
use sluice::limiter::{Algorithm, Block, Counting, LimitSpec, Penalty, Role, State, Window};

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// Every algorithm, over windows short enough that a few steps cross them.
fn any_window() -> impl Strategy<Value = Window> {
    prop_oneof![
        (1u64..=100, 1u64..=10).prop_map(|(precision_ms, n)| Window {
            duration_ms: precision_ms * n,
            algorithm: Algorithm::SlidingWindow { precision_ms },
        }),
        window_of(Algorithm::FixedWindow),
        (1u64..=1_000, 1u64..=20).prop_map(|(duration_ms, burst)| Window {
            duration_ms,
            algorithm: Algorithm::TokenBucket { burst },
        }),
        window_of(Algorithm::SlidingLog),
        window_of(Algorithm::Concurrency),
    ]
}

/// Windows of `algorithm` (one without parameters) up to a second long.
fn window_of(algorithm: Algorithm) -> impl Strategy<Value = Window> {
    (1u64..=1_000).prop_map(move |duration_ms| Window {
        duration_ms,
        algorithm,
    })
}

/// The windows whose use is an exact count of the hits in them.
fn exact_window() -> impl Strategy<Value = Window> {
    prop_oneof![
        window_of(Algorithm::FixedWindow),
        window_of(Algorithm::SlidingLog),
    ]
}

/// Any item: every role, both countings, refunds one time in five.
fn any_item() -> impl Strategy<Value = Item> {
    (
        0u64..=6,
        prop_oneof![Just(Role::Enforce), Just(Role::Shadow), Just(Role::Quota)],
        prop_oneof![Just(Counting::Admitted), Just(Counting::Always)],
        prop::bool::weighted(0.2),
    )
        .prop_map(|(hits, role, counting, refund)| Item {
            hits,
            role,
            counting,
            refund,
        })
}

/// Counters of the pool a batch draws from.
const COUNTERS: usize = 3;

/// One batch over the pool: per item, the item and its limits as (counter,
/// requests); a time step before it.
type Step = (u64, Vec<(Item, Vec<(usize, u64)>)>);

fn steps(
    item: BoxedStrategy<Item>,
    requests: BoxedStrategy<u64>,
) -> impl Strategy<Value = Vec<Step>> {
    let limits = prop::collection::vec((0..COUNTERS, requests), 1..=3);
    let batch = prop::collection::vec((item, limits), 1..=4);
    prop::collection::vec((0u64..=300, batch), 1..=30)
}

/// The batch as the evaluator takes it, over counters of `windows`.
fn flatten(items: &[(Item, Vec<(usize, u64)>)], windows: &[Window]) -> (Vec<Item>, Vec<Limit>) {
    let mut limits = Vec::new();
    for (i, (_, counters)) in items.iter().enumerate() {
        for &(counter, requests) in counters {
            limits.push(Limit {
                item: i,
                counter,
                spec: LimitSpec {
                    requests,
                    window: windows[counter],
                    penalty: None,
                },
            });
        }
    }
    (items.iter().map(|(item, _)| *item).collect(), limits)
}

/// Penalty boxes of blocks short enough that a few steps end them, forgotten
/// soon enough that streaks start over.
fn any_penalty() -> impl Strategy<Value = Penalty> {
    (1u64..=2_000, 1u64..=4, 1u64..=10, 0u64..=3_000).prop_map(
        |(block_ms, escalate, times, forget_after_ms)| Penalty {
            block_ms,
            escalate,
            max_block_ms: block_ms * times,
            forget_after_ms,
        },
    )
}

/// Gives each limit of an even `requests` its counter's penalty box, if it
/// has one: a counter may then be counted by limits with and without one.
fn boxed(limits: &mut [Limit], boxes: &[Option<Penalty>]) {
    for limit in limits {
        if limit.spec.requests % 2 == 0 {
            limit.spec.penalty = boxes[limit.counter];
        }
    }
}

fn empty_states(windows: &[Window]) -> Vec<State> {
    windows
        .iter()
        .map(|&window| {
            State::new(&LimitSpec {
                requests: 1,
                window,
                penalty: None,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The naive model: the driver's steps, spelled out over a map of counters
// ---------------------------------------------------------------------------

/// A counter's penalty state in the naive model: blocked until, offences of
/// the streak, forgotten from.
type NaiveBlock = (u64, u64, u64);

/// The block of the `offences`-th offence: `block × escalate^(offences − 1)`
/// in wide arithmetic, at most `max_block`.
fn naive_block_for(p: &Penalty, offences: u64) -> u64 {
    let power = u32::try_from(offences - 1).unwrap_or(u32::MAX);
    (p.escalate as u128)
        .checked_pow(power)
        .and_then(|f| f.checked_mul(p.block_ms as u128))
        .map_or(p.max_block_ms, |b| b.min(p.max_block_ms as u128) as u64)
}

fn naive(
    items: &[Item],
    limits: &[Limit],
    states: &mut HashMap<usize, State>,
    blocks: &mut HashMap<usize, NaiveBlock>,
    now: u64,
) -> Evaluation {
    // Pass 1: each limit sees the weight of the request's earlier limits on
    // its counter.
    let mut pending: HashMap<usize, u64> = HashMap::new();
    let mut reports = Vec::new();
    for limit in limits {
        let item = items[limit.item];
        let state = states
            .get_mut(&limit.counter)
            .expect("every counter has a state");
        let used = state.used(&limit.spec, now);
        let before = pending.get(&limit.counter).copied().unwrap_or(0);
        let (until, _, _) = blocks.get(&limit.counter).copied().unwrap_or_default();
        let blocked = !item.refund && limit.spec.penalty.is_some() && until > now;
        let mut over = false;
        if !item.refund {
            over = blocked || !state.fits(&limit.spec, now, used, before + item.hits);
            pending.insert(limit.counter, before + item.hits);
        }
        reports.push(Report {
            used,
            pending: before,
            over,
            blocked,
            ..Report::default()
        });
    }
    // Admission: no enforcing item over, and not every quota item over.
    let item_over = |i: usize| {
        limits
            .iter()
            .zip(&reports)
            .any(|(l, r)| l.item == i && r.over)
    };
    let debits = || items.iter().enumerate().filter(|(_, item)| !item.refund);
    let enforce_over = debits().any(|(i, item)| item.role == Role::Enforce && item_over(i));
    let quotas: Vec<bool> = debits()
        .filter(|(_, item)| item.role == Role::Quota)
        .map(|(i, _)| item_over(i))
        .collect();
    let every_quota_over = !quotas.is_empty() && quotas.iter().all(|&over| over);
    let applied = !enforce_over && !every_quota_over;
    // Pass 2: what stands first, then the rest, request order within each.
    for stands_phase in [true, false] {
        for (limit, report) in limits.iter().zip(reports.iter_mut()) {
            let item = items[limit.item];
            let stands = item.refund || item.counting == Counting::Always;
            if stands != stands_phase {
                continue;
            }
            let state = states
                .get_mut(&limit.counter)
                .expect("every counter has a state");
            if item.refund {
                state.refund(&limit.spec, now, item.hits);
                report.used = state.used(&limit.spec, now);
                report.pending = 0;
            } else if item.hits > 0
                && (applied || item.counting == Counting::Always)
                && !report.blocked
            {
                state.add(&limit.spec, now, item.hits);
                report.counted = true;
            }
            report.reset_ms = state.reset_ms(&limit.spec, now);
            report.full_for_ms = state.full_for(&limit.spec, now);
            let Some(p) = limit.spec.penalty.filter(|_| !item.refund) else {
                continue;
            };
            let block = blocks.entry(limit.counter).or_default();
            if report.over && !report.blocked {
                // An offence: the streak goes on unless forgotten.
                let offences = if now < block.2 { block.1 + 1 } else { 1 };
                let until = now + naive_block_for(&p, offences);
                *block = (until, offences, until + p.forget_after_ms);
                report.blocked = true;
            }
            if report.blocked {
                report.reset_ms = block.0 - now;
                report.full_for_ms = block.0 - now;
            }
        }
    }
    Evaluation {
        applied,
        limits: reports,
    }
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A batch of one item with one limit decides, counts and reports what
    /// the algorithm alone does: used and fits, then add (or refund), then
    /// reset and full; the role decides admission from that one verdict.
    #[test]
    fn one_item_with_one_limit_is_the_algorithm_alone(
        window in any_window(),
        requests in 0u64..=12,
        steps in prop::collection::vec((0u64..=300, any_item()), 1..=60),
    ) {
        let spec = LimitSpec { requests, window, penalty: None, };
        let mut states = vec![State::new(&spec)];
        let mut alone = State::new(&spec);
        let mut now = 0;
        for (delta, item) in steps {
            now += delta;
            let limits = [Limit { item: 0, counter: 0, spec }];
            let mut blocks = vec![Block::default(); states.len()];
            let out = batch::evaluate(&[item], &limits, &mut states, &mut blocks, now);

            let mut used = alone.used(&spec, now);
            let over = !item.refund && !alone.fits(&spec, now, used, item.hits);
            let applied = !(over && matches!(item.role, Role::Enforce | Role::Quota));
            let counted = !item.refund
                && item.hits > 0
                && (applied || item.counting == Counting::Always);
            if item.refund {
                alone.refund(&spec, now, item.hits);
                used = alone.used(&spec, now);
            } else if counted {
                alone.add(&spec, now, item.hits);
            }
            let expected = Report {
                used,
                pending: 0,
                over,
                reset_ms: alone.reset_ms(&spec, now),
                full_for_ms: alone.full_for(&spec, now),
                counted,
                blocked: false,
            };
            prop_assert_eq!(out.applied, applied, "{:?} at {}", item, now);
            prop_assert_eq!(out.limits, vec![expected], "{:?} at {}", item, now);
            prop_assert_eq!(&states[0], &alone, "state after {:?} at {}", item, now);
        }
    }

    /// Any batch (roles, countings, refunds, counters named twice, limits of
    /// different sizes on one counter) decides, counts and reports what a
    /// naive model of the driver's steps does, and leaves the same states.
    /// Penalty boxes on some counters too (see `boxed`): blocks, offences
    /// and their reports as the model spells them out.
    #[test]
    fn a_batch_is_the_naive_model_of_the_drivers_steps(
        windows in prop::collection::vec(any_window(), COUNTERS),
        boxes in prop::collection::vec(prop::option::weighted(0.5, any_penalty()), COUNTERS),
        steps in steps(any_item().boxed(), (0u64..=12).boxed()),
    ) {
        let mut states = empty_states(&windows);
        let mut blocks = vec![Block::default(); states.len()];
        let mut model: HashMap<usize, State> = states.iter().cloned().enumerate().collect();
        let mut model_blocks: HashMap<usize, NaiveBlock> = HashMap::new();
        let mut now = 0;
        for (delta, request) in steps {
            now += delta;
            let (items, mut limits) = flatten(&request, &windows);
            boxed(&mut limits, &boxes);
            let out = batch::evaluate(&items, &limits, &mut states, &mut blocks, now);
            let expected = naive(&items, &limits, &mut model, &mut model_blocks, now);
            prop_assert_eq!(&out, &expected, "{:?} at {}", request, now);
            for (c, state) in states.iter().enumerate() {
                prop_assert_eq!(state, &model[&c], "counter {} at {}", c, now);
                let b = model_blocks.get(&c).copied().unwrap_or_default();
                prop_assert_eq!((blocks[c].until, blocks[c].offences, blocks[c].forget_at), b, "block {} at {}", c, now);
            }
        }
    }

    /// Enforcing debits counted only when admitted, over windows whose use is
    /// an exact count (one limit size per counter): a request is admitted
    /// exactly when every limit's hits, with the earlier ones of the request
    /// on its counter, fit in the hits the window holds, and then every
    /// weight is counted; refused, nothing is. Reports match the history.
    #[test]
    fn all_or_nothing_against_an_exact_history(
        windows in prop::collection::vec(exact_window(), COUNTERS),
        sizes in prop::collection::vec(0u64..=12, COUNTERS),
        steps in steps(
            (0u64..=6).prop_map(|hits| Item {
                hits,
                role: Role::Enforce,
                counting: Counting::Admitted,
                refund: false,
            }).boxed(),
            Just(0u64).boxed(),
        ),
    ) {
        let mut states = empty_states(&windows);
        // Every counted (time, hits) per counter.
        let mut history: Vec<Vec<(u64, u64)>> = vec![Vec::new(); COUNTERS];
        let in_window = |c: usize, hits: &[(u64, u64)], now: u64| -> u64 {
            let d = windows[c].duration_ms;
            hits.iter()
                .filter(|&&(t, _)| match windows[c].algorithm {
                    Algorithm::FixedWindow => t / d == now / d,
                    _ => t + d > now,
                })
                .map(|&(_, h)| h)
                .sum()
        };
        let mut now = 0;
        for (delta, mut request) in steps {
            now += delta;
            for (_, limits) in &mut request {
                for (counter, requests) in limits {
                    *requests = sizes[*counter];
                }
            }
            let (items, limits) = flatten(&request, &windows);
            let mut blocks = vec![Block::default(); states.len()];
            let out = batch::evaluate(&items, &limits, &mut states, &mut blocks, now);

            let mut wanted = [0u64; COUNTERS];
            let mut fits = true;
            for (limit, report) in limits.iter().zip(&out.limits) {
                let c = limit.counter;
                let used = in_window(c, &history[c], now);
                prop_assert_eq!((report.used, report.pending), (used, wanted[c]), "limit on {} at {}", c, now);
                wanted[c] += items[limit.item].hits;
                let limit_fits = used + wanted[c] <= sizes[c];
                prop_assert_eq!(report.over, !limit_fits, "limit on {} at {}", c, now);
                fits &= limit_fits;
            }
            prop_assert_eq!(out.applied, fits, "at {}", now);
            if fits {
                for limit in &limits {
                    history[limit.counter].push((now, items[limit.item].hits));
                }
            }
            for c in 0..COUNTERS {
                let spec = LimitSpec { requests: sizes[c], window: windows[c], penalty: None, };
                prop_assert_eq!(states[c].used(&spec, now), in_window(c, &history[c], now), "counter {} at {}", c, now);
            }
        }
    }

    /// Refunds give back at most their weight and never take a counter
    /// below empty: exactly `used − weight` or empty on the exact windows,
    /// between the two elsewhere; a request of refunds only is admitted and
    /// never over.
    #[test]
    fn refunds_never_go_below_empty(
        windows in prop::collection::vec(any_window(), COUNTERS),
        sizes in prop::collection::vec(1u64..=12, COUNTERS),
        fill in prop::collection::vec((0u64..=300, 0..COUNTERS, 0u64..=15), 0..=20),
        refunds in prop::collection::vec((0..COUNTERS, 0u64..=15), 1..=5),
    ) {
        let mut states = empty_states(&windows);
        let spec = |c: usize| LimitSpec { requests: sizes[c], window: windows[c], penalty: None, };
        let mut now = 0;
        for (delta, c, hits) in fill {
            now += delta;
            // Counted always, so the counters may also be past their limit.
            let item = Item { hits, role: Role::Shadow, counting: Counting::Always, refund: false };
            let mut blocks = vec![Block::default(); states.len()];
            batch::evaluate(&[item], &[Limit { item: 0, counter: c, spec: spec(c) }], &mut states, &mut blocks, now);
        }
        let mut held: Vec<u64> = (0..COUNTERS).map(|c| states[c].clone().used(&spec(c), now)).collect();
        let items: Vec<Item> = refunds
            .iter()
            .map(|&(_, hits)| Item { hits, role: Role::Enforce, counting: Counting::Admitted, refund: true })
            .collect();
        let limits: Vec<Limit> = refunds
            .iter()
            .enumerate()
            .map(|(i, &(c, _))| Limit { item: i, counter: c, spec: spec(c) })
            .collect();
        let mut blocks = vec![Block::default(); states.len()];
        let out = batch::evaluate(&items, &limits, &mut states, &mut blocks, now);
        prop_assert!(out.applied);
        for (limit, report) in limits.iter().zip(&out.limits) {
            let (c, hits) = (limit.counter, items[limit.item].hits);
            prop_assert!(!report.over && !report.counted && report.pending == 0);
            let before = held[c];
            prop_assert!(report.used <= before, "{} → {}", before, report.used);
            prop_assert!(report.used >= before.saturating_sub(hits), "{} − {} → {}", before, hits, report.used);
            if matches!(windows[c].algorithm, Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::Concurrency) {
                prop_assert_eq!(report.used, before.saturating_sub(hits));
            }
            held[c] = report.used;
        }
    }
}
