//! Calendar periods with Redis's clock (`time_source: redis`, the default)
//! and replicas whose clocks name another period than Redis's: the period a
//! counter is in follows Redis's clock, and never goes back.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice::limiter::calendar::{Calendar, Period, Zone};
use sluice::limiter::{Algorithm, LimitSpec, ManualClock, Window};
use sluice::store::{Batch, BatchOutcome, CounterStore, RedisStore, TimeSource};
use support::redis::shared;

const DAY: u64 = 86_400_000;

fn paris_month(requests: u64) -> LimitSpec {
    LimitSpec {
        requests,
        window: Window {
            duration_ms: Period::Month.nominal_ms(),
            algorithm: Algorithm::Calendar(Calendar {
                period: Period::Month,
                zone: Zone::get("Europe/Paris").expect("Paris"),
            }),
        },
        penalty: None,
    }
}

/// A replica whose clock reads `now`, sharing `prefix` with the others.
async fn replica(prefix: &str, now: u64) -> RedisStore {
    let clock = Arc::new(ManualClock::new(now));
    support::redis_store_sharing(
        &shared().url(),
        clock,
        TimeSource::Redis,
        Duration::from_secs(5),
        prefix,
    )
    .await
}

async fn hit(store: &RedisStore, hits: u64) -> BatchOutcome {
    let item = support::enforcing("calendar", "tenant", paris_month(10), hits);
    store
        .apply(&Batch { items: vec![item] })
        .await
        .expect("Redis answers")
}

#[tokio::test]
async fn replicas_clocks_a_period_apart_count_in_the_period_of_redis_clock() {
    // Redis's clock is the real one: the month it is in, in Paris.
    let real = u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .expect("ms");
    let calendar = Calendar {
        period: Period::Month,
        zone: Zone::get("Europe/Paris").expect("Paris"),
    };
    let (start, end) = calendar.bounds(real);
    let prefix = support::unique_prefix();

    // A replica whose clock is in the month before: its period has ended by
    // Redis's clock, so it counts in the next one, Redis's.
    let behind = replica(&prefix, start - DAY).await;
    let o = hit(&behind, 2).await;
    assert!(o.admitted);
    assert_eq!(o.limits[0].used, 2);

    // A replica in step counts in the same period (the 2 hits are there),
    // and its reset is the real end of the month.
    let in_step = replica(&prefix, real).await;
    let o = hit(&in_step, 1).await;
    assert_eq!(o.limits[0].used, 3);
    let reset = o.limits[0].reset_ms;
    let expected = end - real;
    assert!(
        reset <= expected && expected - reset < 60_000,
        "reset {reset} ms, the month ends in {expected} ms"
    );

    // A replica whose clock is in the next month: Redis's month still runs,
    // so its hits go there too.
    let ahead = replica(&prefix, end + DAY).await;
    let o = hit(&ahead, 1).await;
    assert_eq!(o.limits[0].used, 4);
    let o = hit(&in_step, 0).await;
    assert_eq!(o.limits[0].used, 4, "one counter, in Redis's month");
    for store in [behind, in_step, ahead] {
        store.quit();
    }
}
