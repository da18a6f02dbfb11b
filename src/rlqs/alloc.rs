//! The arithmetic of RLQS, pure: a limit as a budget of whole tokens, demand
//! samples and their smoothing, and the split of a budget between streams.
//!
//! Integers only, so the shares provably never sum above the budget. No IO,
//! no clock, no tokio or tonic (see the module header of `rlqs` for why each
//! formula is what it is).

/// Capacity of every assigned token bucket: each new assignment lets this
/// many requests through at once. Envoy 1.40 under-admits with 1.
pub const MAX_TOKENS: u32 = 3;

/// One report interval of Envoy 1.40 (hard-coded there), in milliseconds.
pub const REPORT_INTERVAL_MS: u64 = 5_000;

/// The shortest fill interval Sluice assigns, in milliseconds.
const MIN_FILL_MS: u64 = 60_000;

/// The fewest tokens a budget is cut into, so it can be split finely.
const MIN_BUDGET_TOKENS: u64 = 100;

/// Demand is kept in micro-requests per second.
const MICROS: u128 = 1_000_000;

/// A bucket's global budget: `tokens` per `fill_secs` seconds, the rate of
/// the rule's limit exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Tokens per fill interval (`B`); fits a `u32`, as Envoy needs.
    pub tokens: u64,
    /// The fill interval in whole seconds (`F`), at least 60.
    pub fill_secs: u64,
}

impl Budget {
    /// The budget of `requests` per `window_ms`: `requests × k` tokens per
    /// `window × k`, with `k` the smallest factor making the interval whole
    /// seconds, at least 60 s, and the budget at least 100 tokens. `None`
    /// when the window is zero or the budget does not fit Envoy's `u32`
    /// (more than about 70 million per minute: no limit worth enforcing).
    pub fn of_limit(requests: u64, window_ms: u64) -> Option<Self> {
        if window_ms == 0 {
            return None;
        }
        let (requests, window_ms) = (u128::from(requests), u128::from(window_ms));
        // window_ms × base is a multiple of 1000.
        let base = 1000 / gcd(window_ms, 1000);
        let step_ms = window_ms * base;
        let mut times = u128::from(MIN_FILL_MS).div_ceil(step_ms).max(1);
        if requests > 0 {
            times = times.max(u128::from(MIN_BUDGET_TOKENS).div_ceil(requests * base));
        }
        let k = base * times;
        let tokens = u64::try_from(requests * k)
            .ok()
            .filter(|t| *t <= u64::from(u32::MAX))?;
        let fill_secs = u64::try_from(window_ms * k / 1000)
            .ok()
            .filter(|s| i64::try_from(*s).is_ok())?;
        Some(Self { tokens, fill_secs })
    }

    /// Whether this budget's rate is lower than `other`'s (exactly).
    pub fn is_tighter_than(&self, other: &Self) -> bool {
        u128::from(self.tokens) * u128::from(other.fill_secs)
            < u128::from(other.tokens) * u128::from(self.fill_secs)
    }

    /// A rate in micro-requests per second as tokens per fill interval,
    /// rounded up so that any demand at all counts.
    pub fn tokens_of(&self, micro_rps: u64) -> u64 {
        let tokens = (u128::from(micro_rps) * u128::from(self.fill_secs)).div_ceil(MICROS);
        u64::try_from(tokens).unwrap_or(u64::MAX)
    }

    /// The smallest change of a share that is passed on to Envoy: 5 % of
    /// the budget, at least one token.
    pub fn dead_band(&self) -> u64 {
        (self.tokens / 20).max(1)
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The rate of `requests` counted over `elapsed_ms`, in micro-requests per
/// second. The interval is taken as at least one report interval, so the
/// short gap after a bucket's first report cannot make a spike.
pub fn sample(requests: u64, elapsed_ms: u64) -> u64 {
    let elapsed = u128::from(elapsed_ms.max(REPORT_INTERVAL_MS));
    let rate = u128::from(requests) * MICROS * 1000 / elapsed;
    u64::try_from(rate).unwrap_or(u64::MAX)
}

/// The smoothed demand after one more sample: the mean of the previous
/// demand and the sample (EWMA, α = ½); the first sample stands alone.
pub fn smooth(previous: Option<u64>, sample: u64) -> u64 {
    match previous {
        None => sample,
        Some(d) => ((u128::from(d) + u128::from(sample)) / 2) as u64,
    }
}

/// Every stream's guaranteed share of `tokens` split `streams` ways: a
/// tenth of an equal share, or one token when that rounds to zero and
/// there are enough tokens. `streams × floor ≤ tokens` always.
pub fn floor(tokens: u64, streams: usize) -> u64 {
    let n = streams.max(1) as u64;
    (tokens / (10 * n)).max(u64::from(tokens >= n))
}

/// The target share of each stream, given each one's demand in tokens per
/// fill interval: demands are raised to the floor; if they fit, each gets
/// its demand plus an equal part of the rest, else the floor plus the rest
/// in proportion to demand above the floor. The sum never exceeds `tokens`.
pub fn targets(tokens: u64, demands: &[u64]) -> Vec<u64> {
    let n = demands.len();
    if n == 0 {
        return Vec::new();
    }
    let m = floor(tokens, n);
    let raised: Vec<u128> = demands.iter().map(|d| u128::from((*d).max(m))).collect();
    let total: u128 = raised.iter().sum();
    let (budget, m, n) = (u128::from(tokens), u128::from(m), n as u128);
    let shares = raised.into_iter().map(|t| {
        if total <= budget {
            t + (budget - total) / n
        } else {
            // total > budget ≥ n·m, so the divisor is positive.
            m + (budget - n * m) * (t - m) / (total - n * m)
        }
    });
    // Each share is at most `tokens`, so it fits.
    shares.map(|s| s as u64).collect()
}

/// The most the first `local` streams of `targets` may hold together: their
/// targets plus their part (by count) of what rounding left of `tokens`.
/// Summed over disjoint sets of streams sharing one `targets`, the caps
/// never exceed `tokens`; with every stream local, the cap is `tokens`.
pub fn local_cap(tokens: u64, targets: &[u64], local: usize) -> u64 {
    let all: u128 = targets.iter().map(|t| u128::from(*t)).sum();
    let mine: u128 = targets[..local].iter().map(|t| u128::from(*t)).sum();
    let left = u128::from(tokens).saturating_sub(all);
    let cap = if local == targets.len() {
        mine + left
    } else {
        mine + left * local as u128 / targets.len().max(1) as u128
    };
    u64::try_from(cap).unwrap_or(u64::MAX)
}

/// The shares to assign, from the current ones and the new targets: a share
/// stays where it is unless its target moved by more than `band`; if what
/// is kept would sum above `tokens`, every share above its target is cut to
/// it. `targets` must sum to at most `tokens`; so do the shares returned.
pub fn damp(tokens: u64, band: u64, current: &[Option<u64>], targets: &[u64]) -> Vec<u64> {
    let mut shares: Vec<u64> = current
        .iter()
        .zip(targets)
        .map(|(current, target)| match current {
            Some(c) if c.abs_diff(*target) <= band => *c,
            _ => *target,
        })
        .collect();
    let total: u128 = shares.iter().map(|s| u128::from(*s)).sum();
    if total > u128::from(tokens) {
        for (share, target) in shares.iter_mut().zip(targets) {
            *share = (*share).min(*target);
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_per_minute_limit_keeps_its_own_interval() {
        assert_eq!(
            Budget::of_limit(120, 60_000),
            Some(Budget {
                tokens: 120,
                fill_secs: 60
            })
        );
    }

    #[test]
    fn short_and_odd_windows_become_whole_seconds_of_at_least_a_minute() {
        // 10/s: 600 per 60 s.
        assert_eq!(
            Budget::of_limit(10, 1_000),
            Some(Budget {
                tokens: 600,
                fill_secs: 60
            })
        );
        // 3 per 1.5 s: 1.5 s × 2 = 3 s, then × 20 = 60 s, 120 tokens.
        assert_eq!(
            Budget::of_limit(3, 1_500),
            Some(Budget {
                tokens: 120,
                fill_secs: 60
            })
        );
        // 5 per hour: at least 100 tokens, so 20 hours.
        assert_eq!(
            Budget::of_limit(5, 3_600_000),
            Some(Budget {
                tokens: 100,
                fill_secs: 72_000
            })
        );
    }

    #[test]
    fn budgets_beyond_u32_are_not_budgets() {
        assert_eq!(Budget::of_limit(u64::from(u32::MAX), 1_000), None);
        assert_eq!(Budget::of_limit(10, 0), None);
    }

    #[test]
    fn tighter_compares_rates_exactly() {
        let per_min = Budget::of_limit(120, 60_000).expect("fits");
        let per_sec = Budget::of_limit(3, 1_000).expect("fits");
        assert!(per_min.is_tighter_than(&per_sec));
        assert!(!per_sec.is_tighter_than(&per_min));
    }

    #[test]
    fn samples_are_rates_over_at_least_one_report_interval() {
        // 10 requests in 5 s: 2/s.
        assert_eq!(sample(10, 5_000), 2_000_000);
        // A first report 1 s after subscribing counts as 5 s.
        assert_eq!(sample(1, 1_000), 200_000);
        assert_eq!(smooth(None, 8), 8);
        assert_eq!(smooth(Some(8), 0), 4);
        let b = Budget::of_limit(120, 60_000).expect("fits");
        assert_eq!(b.tokens_of(2_000_000), 120);
        assert_eq!(b.tokens_of(1), 1);
    }

    #[test]
    fn under_budget_everyone_gets_demand_plus_headroom() {
        // 120 tokens, demands 30 and 10 (floor 6): 40 used, 40 each extra.
        assert_eq!(targets(120, &[30, 10]), vec![70, 50]);
    }

    #[test]
    fn over_budget_the_split_follows_demand_above_the_floor() {
        // Floor 6 each; 108 split 294:0 → the quiet stream keeps the floor.
        assert_eq!(targets(120, &[300, 0]), vec![114, 6]);
        // 300 and 100: 108 × 294/388 and 108 × 94/388.
        assert_eq!(targets(120, &[300, 100]), vec![6 + 81, 6 + 26]);
    }

    #[test]
    fn more_streams_than_tokens_leaves_some_at_zero() {
        assert_eq!(floor(3, 5), 0);
        let shares = targets(3, &[5, 5, 5, 5, 5]);
        assert!(shares.iter().sum::<u64>() <= 3);
    }

    #[test]
    fn damping_keeps_small_moves_and_cuts_when_the_total_would_pass() {
        // Band 6: 70 → 74 kept, 50 → 40 applied.
        assert_eq!(damp(120, 6, &[Some(70), Some(50)], &[74, 40]), vec![70, 40]);
        // Keeping 70 and raising the other to 55 would make 125: cut to 65.
        assert_eq!(damp(120, 6, &[Some(70), None], &[65, 55]), vec![65, 55]);
    }

    #[test]
    fn local_caps_share_the_rounding_left_over() {
        // 120 split 3 ways with demands 0: 40 each, nothing left.
        assert_eq!(local_cap(120, &[40, 40, 40], 3), 120);
        // Targets summing to 118: all local gets 120; 1 of 3 gets 39 + 0.
        assert_eq!(local_cap(120, &[40, 39, 39], 3), 120);
        assert_eq!(local_cap(120, &[40, 39, 39], 1), 40);
    }

    proptest! {
        #[test]
        fn local_caps_of_disjoint_replicas_stay_within_the_budget(
            tokens in 0u64..100_000,
            demands in proptest::collection::vec(0u64..1_000_000, 2..20),
            cut in 1usize..19,
        ) {
            let targets = targets(tokens, &demands);
            let cut = cut.min(targets.len() - 1);
            // Two replicas: the first `cut` streams, and the rest (reordered
            // so they come first, as each replica lists its own first).
            let mut other = targets[cut..].to_vec();
            other.extend_from_slice(&targets[..cut]);
            let caps = local_cap(tokens, &targets, cut) + local_cap(tokens, &other, targets.len() - cut);
            prop_assert!(caps <= tokens);
        }

        #[test]
        fn shares_never_exceed_the_budget_and_respect_the_floor(
            tokens in 0u64..100_000,
            demands in proptest::collection::vec(0u64..1_000_000, 1..20),
        ) {
            let shares = targets(tokens, &demands);
            prop_assert!(shares.iter().sum::<u64>() <= tokens);
            let m = floor(tokens, demands.len());
            prop_assert!(shares.iter().all(|s| *s >= m));
        }

        #[test]
        fn under_budget_no_stream_gets_less_than_its_demand(
            tokens in 1u64..100_000,
            demands in proptest::collection::vec(0u64..10_000, 1..20),
        ) {
            let m = floor(tokens, demands.len());
            let raised: u64 = demands.iter().map(|d| (*d).max(m)).sum();
            prop_assume!(raised <= tokens);
            let shares = targets(tokens, &demands);
            for (share, demand) in shares.iter().zip(&demands) {
                prop_assert!(share >= demand);
            }
        }

        #[test]
        fn shares_follow_demand(
            tokens in 0u64..100_000,
            demands in proptest::collection::vec(0u64..1_000_000, 2..20),
        ) {
            let shares = targets(tokens, &demands);
            for i in 0..demands.len() {
                for j in 0..demands.len() {
                    if demands[i] >= demands[j] {
                        prop_assert!(shares[i] >= shares[j]);
                    }
                }
            }
        }

        #[test]
        fn damped_shares_never_exceed_the_budget(
            tokens in 0u64..100_000,
            demands in proptest::collection::vec(0u64..1_000_000, 1..20),
            current in proptest::collection::vec(proptest::option::of(0u64..100_000), 20),
        ) {
            let targets = targets(tokens, &demands);
            let band = (tokens / 20).max(1);
            let shares = damp(tokens, band, &current[..targets.len()], &targets);
            prop_assert!(shares.iter().sum::<u64>() <= tokens);
        }
    }
}
