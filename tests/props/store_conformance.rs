//! One store conformance suite, run against the memory store, a single real
//! Redis and a real 3-master Redis Cluster with identical expected results.
//! This is what keeps `decide.lua` and the Rust algorithms the same. Redis
//! runs in local time mode with the test's manual clock, so nothing sleeps.
//! Every test uses its own key prefix, so tests share the servers safely.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use sluice::limiter::calendar::{Calendar, Period, Zone};
use sluice::limiter::{
    Algorithm, Clock, Counting, IdentityBuilder, LimitSpec, MAX_HITS, ManualClock, Role, Window,
};
use sluice::store::{
    Batch, BatchItem, BatchOutcome, CounterStore, MemoryStore, MemoryStoreConfig, RedisStore,
    TimeSource,
};
use support::redis::{shared, shared_cluster};

/// Aligned to an hour, so windows and buckets start at known instants.
const T0: u64 = 1_699_999_200_000;

/// A Redis store in local time mode, so the manual clock drives it. The
/// timeout is generous: this suite checks results, not latency, on a busy box.
async fn redis_store(url: String, clock: Arc<ManualClock>) -> RedisStore {
    support::redis_store(&url, clock, TimeSource::Local, Duration::from_secs(5)).await
}

pub use support::{bucket, fixed, sliding};

pub fn log(requests: u64, duration_ms: u64) -> LimitSpec {
    LimitSpec {
        requests,
        window: Window {
            duration_ms,
            algorithm: Algorithm::SlidingLog,
        },
        penalty: None,
    }
}

/// `requests` per calendar `period` in `zone`.
pub fn calendar(requests: u64, period: Period, zone: &str) -> LimitSpec {
    LimitSpec {
        requests,
        window: Window {
            duration_ms: period.nominal_ms(),
            algorithm: Algorithm::Calendar(Calendar {
                period,
                zone: Zone::get(zone).expect("a zone"),
            }),
        },
        penalty: None,
    }
}

/// An RFC 3339 instant in ms since the Unix epoch.
fn at(text: &str) -> u64 {
    let t: jiff::Timestamp = text.parse().expect("an RFC 3339 instant");
    u64::try_from(t.as_millisecond()).expect("after 1970")
}

/// At most `slots` in flight, each slot leased for `lease_ms`.
pub fn concurrency(slots: u64, lease_ms: u64) -> LimitSpec {
    LimitSpec {
        requests: slots,
        window: Window {
            duration_ms: lease_ms,
            algorithm: Algorithm::Concurrency,
        },
        penalty: None,
    }
}

pub fn item(name: &str, limits: &[LimitSpec], hits: u64, role: Role) -> BatchItem {
    let mut identity = IdentityBuilder::new("conformance");
    identity.value("id", name);
    BatchItem {
        identity: identity.build(),
        limits: limits.to_vec(),
        hits,
        role,
        counting: Counting::Admitted,
        refund: false,
    }
}

pub async fn apply<S: CounterStore>(store: &S, items: Vec<BatchItem>) -> BatchOutcome {
    store
        .apply(&Batch { items })
        .await
        .expect("the store answers")
}

/// `(used, over, reset_ms)` of every limit, for compact assertions.
fn summary(outcome: &BatchOutcome) -> Vec<(u64, bool, u64)> {
    outcome
        .limits
        .iter()
        .map(|l| (l.used, l.over, l.reset_ms))
        .collect()
}

/// `item` counted always (even when it does not fit).
pub fn always(name: &str, limits: &[LimitSpec], hits: u64, role: Role) -> BatchItem {
    BatchItem {
        counting: Counting::Always,
        ..item(name, limits, hits, role)
    }
}

/// A refund (`is_negative_hits`) of `hits` to `limits`.
pub fn refund(name: &str, limits: &[LimitSpec], hits: u64) -> BatchItem {
    BatchItem {
        refund: true,
        ..item(name, limits, hits, Role::Enforce)
    }
}

/// Weighted hits counted now, read with a check-only batch.
async fn used<S: CounterStore>(store: &S, name: &str, limit: LimitSpec) -> u64 {
    apply(store, vec![item(name, &[limit], 0, Role::Enforce)])
        .await
        .limits[0]
        .used
}

mod penalty;

mod cases {
    pub use super::penalty::*;
    use super::*;
    use Role::{Enforce, Quota, Shadow};

    /// envoyproxy/ratelimit's `token-quota.sh`: 2 per minute, a check with
    /// weight 0 when the request arrives and a charge of 1 when its stream
    /// ends. Counted always, requests 1–3 pass and the 4th is refused; the
    /// third charge reports OVER_LIMIT yet counts.
    pub async fn token_quota_refuses_the_fourth_request_when_counting_always<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        for (name, l) in [
            ("tq-fixed", fixed(2, 60_000)),
            ("tq-sliding", sliding(2, 60_000, 1_000)),
            ("tq-bucket", bucket(2, 60_000, 2)),
        ] {
            let mut passed = Vec::new();
            for _ in 0..4 {
                let check = apply(s, vec![always(name, &[l], 0, Enforce)]).await;
                passed.push(check.admitted);
                if check.admitted {
                    apply(s, vec![always(name, &[l], 1, Enforce)]).await;
                }
            }
            assert_eq!(passed, [true, true, true, false], "{name}");
        }
        // The third charge: over the limit, and counted all the same.
        let l = fixed(2, 60_000);
        apply(s, vec![always("tq-third", &[l], 2, Enforce)]).await;
        let o = apply(s, vec![always("tq-third", &[l], 1, Enforce)]).await;
        assert_eq!(
            (o.admitted, o.limits[0].over, o.limits[0].used),
            (false, true, 3)
        );
        assert_eq!(used(s, "tq-third", l).await, 3);
    }

    /// The same script under `admitted`: the third charge does not fit and
    /// counts nothing, so the 4th check passes (today's behaviour).
    pub async fn token_quota_under_admitted_counting_lets_the_fourth_through<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        let l = fixed(2, 60_000);
        let mut passed = Vec::new();
        for _ in 0..4 {
            let check = apply(s, vec![item("tq-adm", &[l], 0, Enforce)]).await;
            passed.push(check.admitted);
            apply(s, vec![item("tq-adm", &[l], 1, Enforce)]).await;
        }
        assert_eq!(passed, [true, true, true, true]);
        assert_eq!(used(s, "tq-adm", l).await, 2);
    }

    /// The issue's example: a 1000/min budget, 900 used, a 500-token charge.
    pub async fn an_overflowing_charge_counts_and_closes_the_budget<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        let l = fixed(1_000, 60_000);
        assert!(
            apply(s, vec![always("budget", &[l], 900, Enforce)])
                .await
                .admitted
        );
        let o = apply(s, vec![always("budget", &[l], 500, Enforce)]).await;
        assert_eq!(
            (o.admitted, o.limits[0].over, o.limits[0].used),
            (false, true, 1_400)
        );
        let check = apply(s, vec![always("budget", &[l], 0, Enforce)]).await;
        assert!(!check.admitted && check.limits[0].over);
    }

    /// Mixed requests: an always item counts whatever the others decide;
    /// admitted items keep all-or-nothing.
    pub async fn always_items_count_in_a_rejected_request_admitted_ones_do_not<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        let full = fixed(1, 60_000);
        let open = fixed(10, 60_000);
        apply(s, vec![item("mix-full", &[full], 1, Enforce)]).await;
        let o = apply(
            s,
            vec![
                item("mix-full", &[full], 1, Enforce),
                always("mix-always", &[open], 3, Enforce),
                item("mix-admitted", &[open], 2, Enforce),
            ],
        )
        .await;
        assert!(!o.admitted);
        assert_eq!(
            o.limits
                .iter()
                .map(|l| (l.used, l.over))
                .collect::<Vec<_>>(),
            [(1, true), (3, false), (0, false)]
        );
        assert_eq!(used(s, "mix-always", open).await, 3);
        assert_eq!(used(s, "mix-admitted", open).await, 0);
    }

    /// A month in Paris runs from local midnight on the 1st (23:00 UTC the
    /// day before in winter) to the next; full, a request is refused until
    /// then, and `reset` says how long. A leap February has 29 days.
    pub async fn calendar_months_end_at_local_midnight_and_leap_februaries_have_29_days<
        S: CounterStore,
    >(
        s: &S,
        c: &ManualClock,
    ) {
        let l = calendar(3, Period::Month, "Europe/Paris");
        c.set(at("2026-01-31T22:59:57Z"));
        for _ in 0..3 {
            assert!(
                apply(s, vec![item("cal-month", &[l], 1, Enforce)])
                    .await
                    .admitted
            );
        }
        c.set(at("2026-01-31T22:59:59.999Z"));
        let o = apply(s, vec![item("cal-month", &[l], 1, Enforce)]).await;
        assert_eq!(
            summary(&o),
            [(3, true, 1)],
            "the last ms of January in Paris"
        );
        c.set(at("2026-01-31T23:00:00Z"));
        let o = apply(s, vec![item("cal-month", &[l], 1, Enforce)]).await;
        let february = at("2026-02-28T23:00:00Z") - at("2026-01-31T23:00:00Z");
        assert_eq!(summary(&o), [(1, false, february)], "February 1st in Paris");
        assert_eq!(used(s, "cal-month", l).await, 1);

        let l = calendar(2, Period::Month, "UTC");
        c.set(at("2028-02-29T12:00:00Z"));
        assert!(
            apply(s, vec![item("cal-leap", &[l], 2, Enforce)])
                .await
                .admitted
        );
        let o = apply(s, vec![item("cal-leap", &[l], 1, Enforce)]).await;
        assert_eq!(summary(&o), [(2, true, 12 * 3_600_000)], "until March 1st");
        c.set(at("2028-03-01T00:00:00Z"));
        assert!(
            apply(s, vec![item("cal-leap", &[l], 1, Enforce)])
                .await
                .admitted
        );
    }

    /// The days clocks change last 23 and 25 hours, in Paris and in New
    /// York; a week starts on Monday; a refund gives back within the period.
    pub async fn calendar_days_follow_daylight_saving_in_two_zones_and_weeks_start_on_monday<
        S: CounterStore,
    >(
        s: &S,
        c: &ManualClock,
    ) {
        const HOUR: u64 = 3_600_000;
        for (name, zone, midnight, hours) in [
            (
                "cal-paris-spring",
                "Europe/Paris",
                "2026-03-28T23:00:00Z",
                23,
            ),
            (
                "cal-paris-autumn",
                "Europe/Paris",
                "2026-10-24T22:00:00Z",
                25,
            ),
            (
                "cal-ny-spring",
                "America/New_York",
                "2026-03-08T05:00:00Z",
                23,
            ),
            (
                "cal-ny-autumn",
                "America/New_York",
                "2026-11-01T04:00:00Z",
                25,
            ),
        ] {
            let l = calendar(1, Period::Day, zone);
            c.set(at(midnight) - 1);
            assert!(
                apply(s, vec![item(name, &[l], 1, Enforce)]).await.admitted,
                "{name}"
            );
            c.set(at(midnight));
            let o = apply(s, vec![item(name, &[l], 1, Enforce)]).await;
            assert_eq!(
                summary(&o),
                [(1, false, hours * HOUR)],
                "{name}: a day of {hours} h"
            );
            c.set(at(midnight) + hours * HOUR - 1);
            let o = apply(s, vec![item(name, &[l], 1, Enforce)]).await;
            assert_eq!(summary(&o), [(1, true, 1)], "{name}: its last ms");
            c.set(at(midnight) + hours * HOUR);
            assert!(
                apply(s, vec![item(name, &[l], 1, Enforce)]).await.admitted,
                "{name}: the next day"
            );
        }

        // Saturday 2026-11-28; the week ends at Monday's midnight in Tokyo
        // (15:00 UTC on Sunday).
        let l = calendar(5, Period::Week, "Asia/Tokyo");
        c.set(at("2026-11-28T10:00:00Z"));
        apply(s, vec![item("cal-week", &[l], 5, Enforce)]).await;
        let o = apply(s, vec![refund("cal-week", &[l], 2)]).await;
        assert_eq!(o.limits[0].used, 3, "a refund gives back");
        let o = apply(s, vec![item("cal-week", &[l], 3, Enforce)]).await;
        assert_eq!(
            summary(&o),
            [(3, true, 29 * HOUR)],
            "full until Monday in Tokyo"
        );
        c.set(at("2026-11-29T15:00:00Z"));
        assert!(
            apply(s, vec![item("cal-week", &[l], 5, Enforce)])
                .await
                .admitted
        );
    }

    /// A refund gives back at once, never below empty, for every algorithm,
    /// and is never over limit.
    pub async fn refunds_give_back_and_never_go_below_empty<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        for (name, l) in [
            ("rf-fixed", fixed(10, 60_000)),
            ("rf-sliding", sliding(10, 60_000, 1_000)),
            ("rf-bucket", bucket(10, 60_000, 10)),
            ("rf-log", log(10, 60_000)),
        ] {
            apply(s, vec![item(name, &[l], 4, Enforce)]).await;
            c.advance(2_000);
            apply(s, vec![item(name, &[l], 6, Enforce)]).await;
            let full = apply(s, vec![item(name, &[l], 1, Enforce)]).await;
            assert!(!full.admitted, "{name} is full");
            let o = apply(s, vec![refund(name, &[l], 5)]).await;
            assert!(o.admitted && !o.limits[0].over, "{name}");
            assert_eq!(o.limits[0].used, 5, "{name} after the refund");
            assert!(
                apply(s, vec![item(name, &[l], 5, Enforce)]).await.admitted,
                "{name}"
            );
            let o = apply(s, vec![refund(name, &[l], 1_000)]).await;
            assert_eq!(o.limits[0].used, 0, "{name} never below empty");
            assert!(
                apply(s, vec![item(name, &[l], 10, Enforce)]).await.admitted,
                "{name}"
            );
            assert!(
                !apply(s, vec![item(name, &[l], 1, Enforce)]).await.admitted,
                "{name}"
            );
            c.advance(1_000);
        }
        // A refund to a counter never used creates nothing and reports empty.
        let o = apply(s, vec![refund("rf-none", &[fixed(3, 1_000)], 2)]).await;
        assert_eq!(o.limits[0].used, 0);
    }

    /// Concurrency: each request takes a slot, the N+1-th is refused, a
    /// release frees one, and a slot whose release was lost frees itself
    /// when its lease ends.
    pub async fn concurrency_slots_are_taken_released_and_leased<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = concurrency(3, 30_000);
        for n in 1..=3 {
            let o = apply(s, vec![item("cc", &[l], 1, Enforce)]).await;
            assert_eq!((o.admitted, o.limits[0].used), (true, n));
            c.advance(1_000);
        }
        let o = apply(s, vec![item("cc", &[l], 1, Enforce)]).await;
        assert!(!o.admitted && o.limits[0].over, "the 4th is refused");
        // A release frees a slot at once.
        let o = apply(s, vec![refund("cc", &[l], 1)]).await;
        assert_eq!(o.limits[0].used, 2);
        assert!(apply(s, vec![item("cc", &[l], 1, Enforce)]).await.admitted);
        assert!(!apply(s, vec![item("cc", &[l], 1, Enforce)]).await.admitted);
        // Nobody releases: the first slot's lease (taken at 0) ends at 30 s.
        c.set(T0 + 29_999);
        assert!(!apply(s, vec![item("cc", &[l], 1, Enforce)]).await.admitted);
        c.set(T0 + 30_000);
        assert!(apply(s, vec![item("cc", &[l], 1, Enforce)]).await.admitted);
        // Releases never go below empty, and a sliding log of the same
        // length and identity is a different counter.
        apply(s, vec![refund("cc", &[l], 100)]).await;
        assert_eq!(used(s, "cc", l).await, 0);
        apply(s, vec![item("cc", &[log(3, 30_000)], 3, Enforce)]).await;
        assert_eq!(used(s, "cc", l).await, 0);
    }

    /// A refund and a debit in one request: the refund never decides it, and
    /// is applied even when the debit is refused.
    pub async fn a_refund_stands_when_its_request_is_refused<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        let l = fixed(5, 60_000);
        let other = fixed(1, 60_000);
        apply(s, vec![item("rr-a", &[l], 5, Enforce)]).await;
        apply(s, vec![item("rr-b", &[other], 1, Enforce)]).await;
        let o = apply(
            s,
            vec![refund("rr-a", &[l], 2), item("rr-b", &[other], 1, Enforce)],
        )
        .await;
        assert!(!o.admitted);
        assert_eq!(used(s, "rr-a", l).await, 3);
    }

    pub async fn exactly_the_limit_then_rejection<S: CounterStore>(s: &S, _: &ManualClock) {
        let l = sliding(3, 1_000, 100);
        for n in 1..=3 {
            let o = apply(s, vec![item("a", &[l], 1, Enforce)]).await;
            assert!(o.admitted);
            assert_eq!((o.limits[0].used, o.limits[0].over), (n, false));
        }
        let o = apply(s, vec![item("a", &[l], 1, Enforce)]).await;
        assert!(!o.admitted);
        assert_eq!((o.limits[0].used, o.limits[0].over), (3, true));
    }

    pub async fn the_straddling_bucket_is_interpolated_and_rounded_up<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = sliding(100, 10_000, 1_000);
        apply(s, vec![item("a", &[l], 10, Enforce)]).await;
        c.set(T0 + 10_250);
        assert_eq!(used(s, "a", l).await, 8);
        c.set(T0 + 10_999);
        assert_eq!(used(s, "a", l).await, 1);
        c.set(T0 + 11_000);
        assert_eq!(used(s, "a", l).await, 0);
    }

    pub async fn reset_is_the_expiry_of_the_oldest_counted_bucket<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = sliding(5, 60_000, 6_000);
        c.set(T0 + 7_000);
        let o = apply(s, vec![item("a", &[l], 1, Enforce)]).await;
        assert_eq!(o.limits[0].reset_ms, 12_000 + 60_000 - 7_000);
        c.set(T0 + 20_000);
        let o = apply(s, vec![item("a", &[l], 1, Enforce)]).await;
        assert_eq!(
            o.limits[0].reset_ms,
            12_000 + 60_000 - 20_000,
            "still the first bucket"
        );
        // An empty counter reports when a hit made now would leave.
        let o = apply(s, vec![item("fresh", &[l], 0, Enforce)]).await;
        assert_eq!(o.limits[0].reset_ms, 24_000 + 60_000 - 20_000);
    }

    pub async fn fixed_window_counts_per_epoch_aligned_window<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = fixed(2, 60_000);
        c.set(T0 + 59_000);
        assert_eq!(
            summary(&apply(s, vec![item("a", &[l], 1, Enforce)]).await),
            [(1, false, 1_000)]
        );
        assert_eq!(
            summary(&apply(s, vec![item("a", &[l], 1, Enforce)]).await),
            [(2, false, 1_000)]
        );
        let o = apply(s, vec![item("a", &[l], 1, Enforce)]).await;
        assert_eq!((o.admitted, summary(&o)), (false, vec![(2, true, 1_000)]));
        c.set(T0 + 60_000);
        assert_eq!(
            summary(&apply(s, vec![item("a", &[l], 1, Enforce)]).await),
            [(1, false, 60_000)]
        );
    }

    pub async fn a_rejected_request_counts_nothing_anywhere<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        let (wide, narrow) = (sliding(5, 60_000, 6_000), fixed(1, 60_000));
        let both = || {
            vec![
                item("a", &[wide], 1, Enforce),
                item("b", &[narrow], 1, Enforce),
            ]
        };
        assert!(apply(s, both()).await.admitted);
        let o = apply(s, both()).await;
        assert!(!o.admitted);
        assert_eq!(
            (o.limits[0].used, o.limits[0].over),
            (1, false),
            "a passed, reports what it saw"
        );
        assert_eq!((o.limits[1].used, o.limits[1].over), (1, true));
        assert_eq!(used(s, "a", wide).await, 1);
        assert_eq!(used(s, "b", narrow).await, 1);
    }

    pub async fn a_counter_named_twice_in_one_request_counts_both<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        let l = sliding(3, 1_000, 100);
        let o = apply(
            s,
            vec![item("x", &[l], 2, Enforce), item("x", &[l], 2, Enforce)],
        )
        .await;
        assert!(!o.admitted);
        // The second sees the first's hits (so it is over), but a rejected
        // request reports the counter as it stands: the same for both.
        assert_eq!(
            summary(&o).iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(),
            [(0, false), (0, true)]
        );
        let o = apply(
            s,
            vec![item("x", &[l], 1, Enforce), item("x", &[l], 2, Enforce)],
        )
        .await;
        assert!(o.admitted);
        assert_eq!((o.limits[0].used, o.limits[1].used), (1, 3));
        assert_eq!(used(s, "x", l).await, 3);
    }

    pub async fn shadow_never_rejects_and_quota_rejects_only_when_all_are_over<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        let one = fixed(1, 60_000);
        apply(
            s,
            vec![item("s", &[one], 1, Shadow), item("q1", &[one], 1, Quota)],
        )
        .await;
        let o = apply(
            s,
            vec![item("s", &[one], 1, Shadow), item("e", &[one], 1, Enforce)],
        )
        .await;
        assert!(o.admitted, "shadow over limit");
        assert_eq!(used(s, "s", one).await, 2, "shadow keeps counting");
        let o = apply(
            s,
            vec![item("q1", &[one], 1, Quota), item("q2", &[one], 1, Quota)],
        )
        .await;
        assert!(o.admitted, "q2 still had room");
        let o = apply(
            s,
            vec![item("q1", &[one], 1, Quota), item("q2", &[one], 1, Quota)],
        )
        .await;
        assert!(!o.admitted, "every quota descriptor over");
        assert_eq!((used(s, "q1", one).await, used(s, "q2", one).await), (2, 1));
    }

    pub async fn check_only_counts_nothing_and_passes_at_the_limit<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        let l = sliding(2, 1_000, 100);
        apply(s, vec![item("a", &[l], 2, Enforce)]).await;
        for _ in 0..3 {
            let o = apply(s, vec![item("a", &[l], 0, Enforce)]).await;
            assert!(o.admitted);
            assert_eq!(summary(&o)[0].0, 2);
        }
        assert!(!apply(s, vec![item("a", &[l], 1, Enforce)]).await.admitted);
    }

    pub async fn weights_count_whole_and_report_headroom<S: CounterStore>(s: &S, _: &ManualClock) {
        let l = sliding(10, 60_000, 6_000);
        assert_eq!(
            apply(s, vec![item("w", &[l], 4, Enforce)]).await.limits[0].used,
            4
        );
        assert_eq!(
            apply(s, vec![item("w", &[l], 4, Enforce)]).await.limits[0].used,
            8
        );
        let o = apply(s, vec![item("w", &[l], 4, Enforce)]).await;
        assert_eq!((o.admitted, o.limits[0].used), (false, 8));
        assert!(apply(s, vec![item("w", &[l], 2, Enforce)]).await.admitted);
    }

    pub async fn every_limit_of_an_item_is_checked_and_counted<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let (minute, gap) = (sliding(10, 60_000, 6_000), sliding(1, 2_000, 200));
        let o = apply(s, vec![item("g", &[minute, gap], 1, Enforce)]).await;
        assert_eq!(
            (o.admitted, o.limits[0].used, o.limits[1].used),
            (true, 1, 1)
        );
        c.set(T0 + 1_000);
        let o = apply(s, vec![item("g", &[minute, gap], 1, Enforce)]).await;
        assert!(!o.admitted);
        assert_eq!(
            summary(&o).iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(),
            [(1, false), (1, true)]
        );
        c.set(T0 + 2_200);
        assert!(
            apply(s, vec![item("g", &[minute, gap], 1, Enforce)])
                .await
                .admitted
        );
        assert_eq!(used(s, "g", minute).await, 2);
    }

    pub async fn a_clock_stepping_back_adds_to_the_newest_bucket<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = sliding(5, 1_000, 100);
        c.set(T0 + 500);
        apply(s, vec![item("b", &[l], 1, Enforce)]).await;
        c.set(T0 + 300);
        apply(s, vec![item("b", &[l], 1, Enforce)]).await;
        c.set(T0 + 500);
        assert_eq!(used(s, "b", l).await, 2);
        c.set(T0 + 1_550);
        assert_eq!(
            used(s, "b", l).await,
            1,
            "half of the newest bucket is left"
        );
        c.set(T0 + 1_600);
        assert_eq!(used(s, "b", l).await, 0);
    }

    /// `first` hits on `name` in bucket 0 of a sliding window of 9 a second
    /// in 100 ms buckets, two in bucket 2, then bucket 2 refunded: the
    /// bucket below the newest is left the newest. Returns the limit.
    async fn newest_bucket_refunded<S: CounterStore>(
        s: &S,
        c: &ManualClock,
        name: &str,
        first: u64,
    ) -> LimitSpec {
        let l = sliding(9, 1_000, 100);
        c.set(T0 + 50);
        apply(s, vec![item(name, &[l], first, Enforce)]).await;
        c.set(T0 + 250);
        apply(s, vec![item(name, &[l], 2, Enforce)]).await;
        apply(s, vec![refund(name, &[l], 2)]).await;
        l
    }

    /// A refund that empties the newest bucket leaves the bucket below it
    /// the newest: a clock behind the emptied one (but past the one left)
    /// adds to a bucket of its own, whose hits leave the window with it.
    pub async fn a_clock_behind_a_refunded_bucket_adds_to_a_bucket_of_its_own<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = newest_bucket_refunded(s, c, "r", 1).await;
        c.set(T0 + 150);
        apply(s, vec![item("r", &[l], 3, Enforce)]).await; // bucket 1
        c.set(T0 + 1_150);
        assert_eq!(
            used(s, "r", l).await,
            2,
            "bucket 0 has left, half of bucket 1's three hits (rounded up) is in"
        );
        c.set(T0 + 1_200);
        assert_eq!(used(s, "r", l).await, 0, "bucket 1 has left");
    }

    /// A refund that empties the newest bucket leaves the one below it the
    /// newest, with its hits: a later refund takes from it, and a clock back
    /// in it adds to it.
    pub async fn after_the_newest_bucket_is_refunded_the_one_below_keeps_its_hits<
        S: CounterStore,
    >(
        s: &S,
        c: &ManualClock,
    ) {
        let l = newest_bucket_refunded(s, c, "q", 3).await;
        let o = apply(s, vec![refund("q", &[l], 1)]).await;
        assert_eq!(o.limits[0].used, 2, "the second refund takes from bucket 0");
        c.set(T0 + 60);
        apply(s, vec![item("q", &[l], 1, Enforce)]).await;
        c.set(T0 + 1_050);
        assert_eq!(
            used(s, "q", l).await,
            2,
            "bucket 0 holds three again, half of it (rounded up) still in"
        );
    }

    /// A read in a later fixed window writes nothing (Redis writes nothing
    /// on a read): a clock stepping back into the counted window finds its
    /// hits.
    pub async fn a_fixed_window_read_later_forgets_nothing_when_the_clock_steps_back<
        S: CounterStore,
    >(
        s: &S,
        c: &ManualClock,
    ) {
        let l = fixed(5, 500);
        c.set(T0 + 100);
        apply(s, vec![item("f", &[l], 2, Enforce)]).await;
        c.set(T0 + 600);
        assert_eq!(used(s, "f", l).await, 0, "a new window");
        c.set(T0 + 200);
        assert_eq!(used(s, "f", l).await, 2, "the first window again");
    }

    /// A refund to a full token bucket gives nothing back and changes
    /// nothing: a clock stepping back afterwards finds no debt.
    pub async fn a_refund_to_a_full_token_bucket_changes_nothing<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = bucket(5, 1_000, 3);
        c.set(T0 + 500);
        apply(s, vec![refund("tb", &[l], 1)]).await;
        c.set(T0 + 372);
        let o = apply(s, vec![item("tb", &[l], 0, Enforce)]).await;
        assert_eq!((o.limits[0].used, o.limits[0].reset_ms), (0, 0));
    }

    pub async fn a_long_idle_counter_is_forgotten<S: CounterStore>(s: &S, c: &ManualClock) {
        let l = sliding(3, 1_000, 1);
        for t in 0..3 {
            c.set(T0 + t);
            apply(s, vec![item("idle", &[l], 1, Enforce)]).await;
        }
        assert!(
            !apply(s, vec![item("idle", &[l], 1, Enforce)])
                .await
                .admitted
        );
        c.set(T0 + 86_400_000);
        let o = apply(s, vec![item("idle", &[l], 1, Enforce)]).await;
        assert_eq!((o.admitted, o.limits[0].used), (true, 1));
    }

    pub async fn many_identities_one_of_them_full_counts_nothing<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        // Spread over cluster slots: the rejected request must be refunded
        // everywhere it was counted.
        let l = sliding(5, 60_000, 6_000);
        let names: Vec<String> = (0..8).map(|i| format!("spread-{i}")).collect();
        let batch = |full: &str| {
            let mut items: Vec<BatchItem> =
                names.iter().map(|n| item(n, &[l], 1, Enforce)).collect();
            items.push(item(full, &[fixed(0, 60_000)], 1, Enforce));
            items
        };
        let o = apply(s, batch("blocked")).await;
        assert!(!o.admitted);
        assert!(
            o.limits[..8].iter().all(|x| x.used == 0 && !x.over),
            "{:?}",
            o.limits
        );
        for n in &names {
            assert_eq!(used(s, n, l).await, 0, "{n} was refunded");
        }
        let items: Vec<BatchItem> = names.iter().map(|n| item(n, &[l], 1, Enforce)).collect();
        let o = apply(s, items).await;
        assert!(o.admitted);
        assert!(o.limits.iter().all(|x| x.used == 1));
    }

    /// A rejected request's part counted on other cluster slots is taken
    /// back from buckets that keep hits of their own: what is left of the
    /// oldest bucket still counts in proportion as it leaves the window.
    pub async fn a_refund_that_leaves_hits_in_a_bucket_keeps_them_straddling<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = sliding(9, 1_000, 100);
        let names: Vec<String> = (0..8).map(|i| format!("kept-{i}")).collect();
        c.set(T0 + 50);
        let three: Vec<BatchItem> = names.iter().map(|n| item(n, &[l], 3, Enforce)).collect();
        assert!(apply(s, three).await.admitted);
        let mut more: Vec<BatchItem> = names.iter().map(|n| item(n, &[l], 1, Enforce)).collect();
        more.push(item("kept-blocked", &[fixed(0, 60_000)], 1, Enforce));
        assert!(!apply(s, more).await.admitted);
        c.set(T0 + 1_050);
        for n in &names {
            assert_eq!(
                used(s, n, l).await,
                2,
                "{n}: half of its three (rounded up) is still in"
            );
        }
    }

    pub async fn token_bucket_admits_the_burst_then_one_per_interval<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = bucket(10, 1_000, 3); // a token every 100 ms, at most 3
        for n in 1..=3 {
            let o = apply(s, vec![item("tb", &[l], 1, Enforce)]).await;
            assert_eq!((o.admitted, o.limits[0].used), (true, n));
        }
        let o = apply(s, vec![item("tb", &[l], 1, Enforce)]).await;
        assert_eq!(summary(&o), [(3, true, 100)]);
        assert!(!o.admitted);
        c.set(T0 + 99);
        assert!(!apply(s, vec![item("tb", &[l], 1, Enforce)]).await.admitted);
        c.set(T0 + 100);
        assert!(apply(s, vec![item("tb", &[l], 1, Enforce)]).await.admitted);
        c.set(T0 + 400);
        assert_eq!(used(s, "tb", l).await, 0, "full again");
        let o = apply(s, vec![item("tb", &[l], 3, Enforce)]).await;
        assert_eq!(
            (o.admitted, o.limits[0].used),
            (true, 3),
            "a weight takes several tokens"
        );
    }

    pub async fn token_bucket_keeps_fractional_intervals_exact<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = bucket(7, 1_000, 1); // a token every 142.857… ms
        // The arrival time as whole ms plus ticks of 1/7 ms: a token is
        // exactly 1 000 ticks. A request fits from that time on.
        let (mut base, mut ticks) = (T0, 0u64);
        for k in 0..30 {
            let due = base + u64::from(ticks > 0);
            if k > 0 {
                c.set(due - 1);
                let early = apply(s, vec![item("frac", &[l], 1, Enforce)]).await;
                assert!(!early.admitted, "token {k} admitted a millisecond early");
            }
            c.set(due);
            assert!(
                apply(s, vec![item("frac", &[l], 1, Enforce)])
                    .await
                    .admitted,
                "token {k} on time"
            );
            if base < due || (base == due && ticks == 0) {
                (base, ticks) = (due, 0);
            }
            let total = ticks + 1_000;
            (base, ticks) = (base + total / 7, total % 7);
        }
    }

    pub async fn sliding_log_counts_each_hit_for_exactly_one_window<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = log(3, 1_000);
        c.set(T0 + 100);
        apply(s, vec![item("log", &[l], 1, Enforce)]).await;
        c.set(T0 + 600);
        apply(s, vec![item("log", &[l], 2, Enforce)]).await;
        c.set(T0 + 1_099);
        let o = apply(s, vec![item("log", &[l], 1, Enforce)]).await;
        assert_eq!(summary(&o), [(3, true, 1)]);
        c.set(T0 + 1_100);
        let o = apply(s, vec![item("log", &[l], 1, Enforce)]).await;
        assert_eq!(summary(&o), [(3, false, 500)]);
        c.set(T0 + 1_600);
        assert_eq!(used(s, "log", l).await, 1);
    }

    pub async fn sliding_log_never_holds_more_than_the_limit<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let l = log(3, 1_000);
        for t in 0..10 {
            c.set(T0 + t);
            // Shadow mode admits beyond the limit; the log keeps the newest 3.
            assert!(
                apply(s, vec![item("shadowed", &[l], 1, Shadow)])
                    .await
                    .admitted
            );
        }
        assert_eq!(used(s, "shadowed", l).await, 3);
        c.set(T0 + 1_007);
        assert_eq!(
            used(s, "shadowed", l).await,
            2,
            "the oldest kept hit was from t0+7"
        );
    }

    pub async fn a_sliding_log_enforces_an_exact_minimum_gap<S: CounterStore>(
        s: &S,
        c: &ManualClock,
    ) {
        let limits = [sliding(10, 60_000, 6_000), log(1, 2_000)];
        assert!(
            apply(s, vec![item("gap", &limits, 1, Enforce)])
                .await
                .admitted
        );
        c.set(T0 + 1_999);
        assert!(
            !apply(s, vec![item("gap", &limits, 1, Enforce)])
                .await
                .admitted
        );
        c.set(T0 + 2_000);
        assert!(
            apply(s, vec![item("gap", &limits, 1, Enforce)])
                .await
                .admitted
        );
    }

    pub async fn quota_items_in_different_slots_are_refunded_together<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        let one = fixed(1, 60_000);
        let names: Vec<String> = (0..4).map(|i| format!("quota-{i}")).collect();
        let all = || {
            names
                .iter()
                .map(|n| item(n, &[one], 1, Quota))
                .collect::<Vec<_>>()
        };
        assert!(apply(s, all()).await.admitted);
        assert!(
            !apply(s, all()).await.admitted,
            "every quota descriptor over"
        );
        for n in &names {
            assert_eq!(used(s, n, one).await, 1, "{n} counted once");
        }
    }

    /// A request refused by one item counts nothing on its calendar items,
    /// whatever slot they are in (on a Cluster, the parts counted elsewhere
    /// are refunded by refund.lua's calendar undo).
    pub async fn a_refused_request_leaves_its_calendar_counters_as_they_were<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        let month = calendar(5, Period::Month, "Europe/Paris");
        let full = fixed(1, 60_000);
        let names: Vec<String> = (0..4).map(|i| format!("cal-refused-{i}")).collect();
        let items = |hits| {
            let mut items: Vec<BatchItem> = names
                .iter()
                .map(|n| item(n, &[month], hits, Enforce))
                .collect();
            items.push(item("cal-refused-full", &[full], 1, Enforce));
            items
        };
        assert!(apply(s, items(2)).await.admitted);
        assert!(
            !apply(s, items(1)).await.admitted,
            "the fixed window is full"
        );
        for n in &names {
            assert_eq!(used(s, n, month).await, 2, "{n}: only the admitted request");
        }
    }

    /// Weights whose sum passes u64 (the 2^64 − 1 of issue 11) fit nothing:
    /// never wrapped into a small number, nothing counted, and the counter
    /// keeps counting right afterwards.
    pub async fn weights_summing_past_u64_are_never_admitted<S: CounterStore>(
        s: &S,
        _: &ManualClock,
    ) {
        for (name, l) in [
            ("s", sliding(5, 60_000, 6_000)),
            ("f", fixed(5, 60_000)),
            ("b", bucket(5, 60_000, 5)),
            ("l", log(5, 60_000)),
        ] {
            let o = apply(
                s,
                vec![
                    item(name, &[l], 1, Enforce),
                    item(name, &[l], u64::MAX, Enforce),
                ],
            )
            .await;
            assert!(!o.admitted, "{name}");
            assert!(o.limits[1].over, "{name}");
            assert_eq!(used(s, name, l).await, 0, "{name}: nothing counted");
            for _ in 0..5 {
                assert!(apply(s, vec![item(name, &[l], 1, Enforce)]).await.admitted);
            }
            assert!(
                !apply(s, vec![item(name, &[l], 1, Enforce)]).await.admitted,
                "{name}"
            );
        }
    }

    /// What shadow mode counts beyond the limit stops at MAX_HITS (2^53 − 1,
    /// exact in Lua's doubles), in both stores alike, and the full counter
    /// keeps rejecting.
    pub async fn a_counter_never_holds_more_than_max_hits<S: CounterStore>(s: &S, _: &ManualClock) {
        for (name, l) in [
            ("s", sliding(5, 60_000, 6_000)),
            ("f", fixed(5, 60_000)),
            ("l", log(5, 60_000)),
        ] {
            for _ in 0..2 {
                let o = apply(s, vec![item(name, &[l], u64::MAX, Shadow)]).await;
                assert!(o.admitted, "{name}: shadow never rejects");
                assert_eq!(o.limits[0].used, MAX_HITS, "{name}");
            }
            // A log trims what is beyond the limit at its next read.
            let kept = if name == "l" { 5 } else { MAX_HITS };
            let o = apply(s, vec![item(name, &[l], 1, Enforce)]).await;
            assert_eq!((o.admitted, o.limits[0].used), (false, kept), "{name}");
        }
        let b = bucket(5, 60_000, 5);
        let o = apply(s, vec![item("b", &[b], u64::MAX, Shadow)]).await;
        assert!(o.admitted);
        let o = apply(s, vec![item("b", &[b], 1, Enforce)]).await;
        assert_eq!((o.admitted, o.limits[0].used), (false, 5));
    }

    /// At the cap the arithmetic is exact: a limit of 2^53 − 1 admits
    /// exactly that many hits, and not one more.
    pub async fn weights_at_max_hits_count_exactly<S: CounterStore>(s: &S, _: &ManualClock) {
        for (name, l) in [
            ("s", sliding(MAX_HITS, 60_000, 6_000)),
            ("f", fixed(MAX_HITS, 60_000)),
        ] {
            let o = apply(s, vec![item(name, &[l], MAX_HITS - 1, Enforce)]).await;
            assert_eq!(
                (o.admitted, o.limits[0].used),
                (true, MAX_HITS - 1),
                "{name}"
            );
            let o = apply(s, vec![item(name, &[l], 2, Enforce)]).await;
            assert_eq!(
                (o.admitted, o.limits[0].used),
                (false, MAX_HITS - 1),
                "{name}"
            );
            let o = apply(s, vec![item(name, &[l], 1, Enforce)]).await;
            assert_eq!((o.admitted, o.limits[0].used), (true, MAX_HITS), "{name}");
            let o = apply(s, vec![item(name, &[l], 1, Enforce)]).await;
            assert_eq!((o.admitted, o.limits[0].used), (false, MAX_HITS), "{name}");
        }
    }
}

/// Stamps every case over the three stores.
macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let clock = Arc::new(ManualClock::new(T0));
                    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
                    cases::$case(&store, &clock).await;
                }
            )*
        }
        mod redis {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let clock = Arc::new(ManualClock::new(T0));
                    let store = redis_store(shared().url(), clock.clone()).await;
                    cases::$case(&store, &clock).await;
                    store.quit();
                }
            )*
        }
        mod redis_cluster {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let clock = Arc::new(ManualClock::new(T0));
                    let store = redis_store(shared_cluster().url(), clock.clone()).await;
                    cases::$case(&store, &clock).await;
                    store.quit();
                }
            )*
        }
    };
}

suite!(
    a_penalty_box_blocks_escalates_and_forgets,
    a_block_refuses_the_whole_request,
    a_shadow_limit_is_blocked_without_refusing,
    token_quota_refuses_the_fourth_request_when_counting_always,
    token_quota_under_admitted_counting_lets_the_fourth_through,
    an_overflowing_charge_counts_and_closes_the_budget,
    always_items_count_in_a_rejected_request_admitted_ones_do_not,
    refunds_give_back_and_never_go_below_empty,
    a_refund_stands_when_its_request_is_refused,
    concurrency_slots_are_taken_released_and_leased,
    exactly_the_limit_then_rejection,
    the_straddling_bucket_is_interpolated_and_rounded_up,
    reset_is_the_expiry_of_the_oldest_counted_bucket,
    fixed_window_counts_per_epoch_aligned_window,
    a_rejected_request_counts_nothing_anywhere,
    a_counter_named_twice_in_one_request_counts_both,
    shadow_never_rejects_and_quota_rejects_only_when_all_are_over,
    check_only_counts_nothing_and_passes_at_the_limit,
    weights_count_whole_and_report_headroom,
    every_limit_of_an_item_is_checked_and_counted,
    a_clock_stepping_back_adds_to_the_newest_bucket,
    a_clock_behind_a_refunded_bucket_adds_to_a_bucket_of_its_own,
    after_the_newest_bucket_is_refunded_the_one_below_keeps_its_hits,
    a_fixed_window_read_later_forgets_nothing_when_the_clock_steps_back,
    a_refund_to_a_full_token_bucket_changes_nothing,
    a_long_idle_counter_is_forgotten,
    many_identities_one_of_them_full_counts_nothing,
    a_refund_that_leaves_hits_in_a_bucket_keeps_them_straddling,
    quota_items_in_different_slots_are_refunded_together,
    token_bucket_admits_the_burst_then_one_per_interval,
    token_bucket_keeps_fractional_intervals_exact,
    sliding_log_counts_each_hit_for_exactly_one_window,
    sliding_log_never_holds_more_than_the_limit,
    a_sliding_log_enforces_an_exact_minimum_gap,
    weights_summing_past_u64_are_never_admitted,
    a_counter_never_holds_more_than_max_hits,
    weights_at_max_hits_count_exactly,
    calendar_months_end_at_local_midnight_and_leap_februaries_have_29_days,
    calendar_days_follow_daylight_saving_in_two_zones_and_weeks_start_on_monday,
    a_refused_request_leaves_its_calendar_counters_as_they_were,
);

/// Random request sequences give identical outcomes in memory and in Redis.
mod equivalence {
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    struct Step {
        advance_ms: u64,
        /// Who, which limits, weight, role, and 0 admitted / 1 always / 2 refund.
        items: Vec<(usize, Vec<usize>, u64, Role, u8)>,
    }

    fn limits() -> Vec<LimitSpec> {
        vec![
            sliding(7, 1_000, 100),
            sliding(3, 600, 600),
            fixed(5, 500),
            sliding(20, 3_000, 250),
            bucket(5, 1_000, 3),
            bucket(3, 700, 1),
            log(4, 700),
            log(2, 300),
            concurrency(2, 400),
            calendar(4, Period::Day, "Europe/Paris"),
            // Penalty boxes, one on the counter of fixed(5, 500) above.
            boxed(fixed(2, 500)),
            boxed(sliding(3, 600, 100)),
            boxed(bucket(2, 700, 2)),
        ]
    }

    /// A second's block, doubled up to four, forgotten three seconds after.
    fn boxed(limit: LimitSpec) -> LimitSpec {
        let penalty = sluice::limiter::Penalty {
            block_ms: 1_000,
            escalate: 2,
            max_block_ms: 4_000,
            forget_after_ms: 3_000,
        };
        LimitSpec {
            penalty: Some(penalty),
            ..limit
        }
    }

    fn step() -> impl Strategy<Value = Step> {
        let role =
            prop_oneof![6 => Just(Role::Enforce), 1 => Just(Role::Shadow), 1 => Just(Role::Quota)];
        let one = (
            0..4usize,
            prop::collection::vec(0..13usize, 1..=3),
            0..=4u64,
            role,
            prop_oneof![5 => Just(0u8), 2 => Just(1u8), 2 => Just(2u8)],
        );
        (
            prop_oneof![Just(0u64), 0..150u64, 0..1_500u64],
            prop::collection::vec(one, 1..=3),
        )
            .prop_map(|(advance_ms, items)| Step { advance_ms, items })
    }

    fn batch(step: &Step) -> Batch {
        let specs = limits();
        Batch {
            items: step
                .items
                .iter()
                .map(|(who, which, hits, role, mode)| {
                    let chosen: Vec<LimitSpec> = which.iter().map(|&i| specs[i]).collect();
                    let name = format!("p{who}");
                    match mode {
                        0 => item(&name, &chosen, *hits, *role),
                        1 => always(&name, &chosen, *hits, *role),
                        _ => refund(&name, &chosen, *hits),
                    }
                })
                .collect(),
        }
    }

    fn run(url: fn() -> String, steps: Vec<Step>) -> Result<(), TestCaseError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let clock = Arc::new(ManualClock::new(T0 + 37));
            let memory = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
            let redis = redis_store(url(), clock.clone()).await;
            for (i, step) in steps.iter().enumerate() {
                clock.advance(step.advance_ms);
                let batch = batch(step);
                let expected = memory.apply(&batch).await.unwrap();
                let actual = redis.apply(&batch).await.unwrap();
                prop_assert_eq!(&actual, &expected, "step {} at t0+{}", i, clock.now() - T0);
            }
            redis.quit();
            Ok(())
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn memory_and_redis_decide_identically(steps in prop::collection::vec(step(), 1..40)) {
            run(|| shared().url(), steps)?;
        }

        #[test]
        fn memory_and_redis_cluster_decide_identically(steps in prop::collection::vec(step(), 1..40)) {
            run(|| shared_cluster().url(), steps)?;
        }
    }
}
