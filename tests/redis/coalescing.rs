//! Coalescing against a real `redis-server`: the requests of one hot
//! counter that wait while a call for it is in flight share the next call,
//! and decide.lua decides them in turn, variable weights and all, exactly
//! as separate calls would have.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use sluice::limiter::{Algorithm, LimitSpec, ManualClock, Window};
use sluice::store::{
    Batch, BatchOutcome, Coalescing, CounterStore, RedisStore, RedisStoreConfig, RedisUrl,
    TimeSource,
};
use support::eventually::eventually_async;
use support::redis::RedisServer;

const LIMIT: u64 = 100;
const REQUESTS: usize = 200;

fn batch(name: &str, limit: LimitSpec, hits: u64) -> Batch {
    Batch {
        items: vec![support::enforcing("coalescing", name, limit, hits)],
    }
}

async fn open(url: &str) -> Arc<RedisStore> {
    open_store(url, &support::unique_prefix(), Duration::from_secs(10), 1).await
}

/// A coalescing store on `url` under `prefix` with `pool_size` connections,
/// its script clock standing still (every call sees the same now), without
/// a breaker.
pub(crate) async fn open_store(
    url: &str,
    prefix: &str,
    timeout: Duration,
    pool_size: usize,
) -> Arc<RedisStore> {
    let clock = Arc::new(ManualClock::new(support::T0));
    open_store_on(url, prefix, timeout, pool_size, clock).await
}

/// [`open_store`] on the clock `clock`.
pub(crate) async fn open_store_on(
    url: &str,
    prefix: &str,
    timeout: Duration,
    pool_size: usize,
    clock: Arc<ManualClock>,
) -> Arc<RedisStore> {
    let config = RedisStoreConfig {
        url: RedisUrl::new(url),
        per_second_url: None,
        tls: sluice::store::RedisTls::default(),
        pool_size,
        timeout,
        key_prefix: prefix.to_owned(),
        time: TimeSource::Local,
        breaker: None,
        coalesce: true,
    };
    Arc::new(
        RedisStore::connect(&config, clock, Duration::from_secs(10))
            .await
            .expect("connect"),
    )
}

fn evalsha_calls(redis: &RedisServer) -> u64 {
    support::redis::command_calls(redis.port(), "evalsha")
}

/// Polls until one counter has a call in flight and `waiting` requests
/// wait for it.
async fn wait_for_one_call(store: &RedisStore, waiting: usize) {
    wait_for(
        store,
        Coalescing {
            counters: 1,
            waiting,
        },
    )
    .await;
}

/// Polls until the store coalesces `want`.
pub(crate) async fn wait_for(store: &RedisStore, want: Coalescing) {
    eventually_async(&format!("coalescing {want:?}"), async || {
        let now = store.coalescing();
        (now == want).then_some(()).ok_or(format!("{now:?}"))
    })
    .await;
}

/// Checks that `answers` (weight, outcome) of counter `name` are what
/// deciding the requests one at a time in some order gives: the admitted ones' counters chain
/// from empty, each seeing the one before it, none past `limit`, and each
/// refused one saw a counter its weight did not fit. Returns the hits
/// admitted.
pub(crate) fn decided_in_turn(name: &str, limit: u64, answers: &[(u64, BatchOutcome)]) -> u64 {
    let mut chain: Vec<(u64, u64)> = answers
        .iter()
        .filter(|(_, o)| o.admitted)
        .map(|(hits, o)| (o.limits[0].used - hits, o.limits[0].used))
        .collect();
    chain.sort_unstable();
    let mut counter = 0;
    for (before, after) in chain {
        assert_eq!(
            before, counter,
            "{name}: an admitted request saw a counter no earlier one left"
        );
        counter = after;
    }
    assert!(
        counter <= limit,
        "{name}: {counter} hits admitted over a limit of {limit}"
    );
    for (hits, outcome) in answers.iter().filter(|(_, o)| !o.admitted) {
        let used = outcome.limits[0].used;
        assert!(
            outcome.limits[0].over,
            "{name}: refused but not over: {outcome:?}"
        );
        assert!(
            used <= counter && used + hits > limit,
            "{name}: a weight of {hits} refused at {used} of {limit}"
        );
    }
    counter
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_counter_shares_calls_and_decides_each_request_in_turn() {
    let redis = RedisServer::start();
    let store = open(&redis.url()).await;
    let hour = 3_600_000;
    let algorithms = [
        Algorithm::SlidingWindow {
            precision_ms: 60_000,
        },
        Algorithm::FixedWindow,
        Algorithm::TokenBucket { burst: LIMIT },
    ];
    for algorithm in algorithms {
        let limit = LimitSpec {
            requests: LIMIT,
            window: Window {
                duration_ms: hour,
                algorithm,
            },
            penalty: None,
        };
        let name = format!("{algorithm:?}");
        let calls = evalsha_calls(&redis);
        // The first request's call is in flight (Redis stopped), so every
        // other request waits for it.
        redis.pause();
        let apply = |hits: u64| {
            let (store, batch) = (store.clone(), batch(&name, limit, hits));
            tokio::spawn(async move { (hits, store.apply(&batch).await) })
        };
        let mut sent = vec![apply(1)];
        wait_for_one_call(&store, 0).await;
        sent.extend((1..REQUESTS as u64).map(|i| apply(i % 3 + 1)));
        let queued = REQUESTS - 1;
        wait_for_one_call(&store, queued).await;
        redis.resume();

        let answers: Vec<(u64, BatchOutcome)> = join_all(sent)
            .await
            .into_iter()
            .map(|joined| {
                let (hits, outcome) = joined.expect("no panic");
                (hits, outcome.expect("Redis answers"))
            })
            .collect();
        // The first call, then the others in calls of 64 at most.
        assert_eq!(
            evalsha_calls(&redis) - calls,
            1 + queued.div_ceil(64) as u64,
            "{name}"
        );
        // Weights of 1 keep coming until the limit is full to the hit.
        let admitted = decided_in_turn(&name, LIMIT, &answers);
        assert_eq!(admitted, LIMIT, "{name}");
        let read = store.apply(&batch(&name, limit, 0)).await.expect("read");
        assert_eq!(
            read.limits[0].used, admitted,
            "{name}: the counter holds what was told"
        );
        wait_for(&store, Coalescing::default()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_first_request_hands_its_followers_on() {
    let redis = RedisServer::start();
    let store = open(&redis.url()).await;
    let limit = support::per_minute(LIMIT);
    redis.pause();
    let first = {
        let (store, batch) = (store.clone(), batch("cancelled", limit, 1));
        tokio::spawn(async move { store.apply(&batch).await })
    };
    wait_for_one_call(&store, 0).await;
    let followers: Vec<_> = (0..10)
        .map(|_| {
            let (store, batch) = (store.clone(), batch("cancelled", limit, 1));
            tokio::spawn(async move { store.apply(&batch).await })
        })
        .collect();
    wait_for_one_call(&store, 10).await;
    // Its gRPC request reset: the first request's future is dropped while
    // its call is in flight.
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    redis.resume();
    for follower in join_all(followers).await {
        let outcome = follower.expect("no panic").expect("answered");
        assert!(outcome.admitted, "{outcome:?}");
    }
    wait_for(&store, Coalescing::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_of_many_identities_share_calls_and_each_counter_decides_in_turn() {
    let redis = RedisServer::start();
    let store = open(&redis.url()).await;
    let hour = 3_600_000;
    let limits = [
        Algorithm::SlidingWindow {
            precision_ms: 60_000,
        },
        Algorithm::FixedWindow,
        Algorithm::TokenBucket { burst: LIMIT },
    ]
    .map(|algorithm| LimitSpec {
        requests: LIMIT,
        window: Window {
            duration_ms: hour,
            algorithm,
        },
        penalty: None,
    });
    let calls = evalsha_calls(&redis);
    redis.pause();
    let apply = |i: u64| {
        let limit = limits[(i % 3) as usize];
        let (store, batch) = (
            store.clone(),
            batch(&format!("id{}", i % 6), limit, i % 2 + 1),
        );
        tokio::spawn(async move { (i, store.apply(&batch).await) })
    };
    let mut sent = vec![apply(0)];
    wait_for_one_call(&store, 0).await;
    sent.extend((1..REQUESTS as u64).map(apply));
    wait_for_one_call(&store, REQUESTS - 1).await;
    redis.resume();
    let mut per_counter: Vec<Vec<(u64, BatchOutcome)>> = vec![Vec::new(); 6];
    for joined in join_all(sent).await {
        let (i, outcome) = joined.expect("no panic");
        per_counter[(i % 6) as usize].push((i % 2 + 1, outcome.expect("Redis answers")));
    }
    // Six identities (each with one algorithm) in one lane: the first call,
    // then the others in calls of 64 at most.
    assert_eq!(
        evalsha_calls(&redis) - calls,
        1 + (REQUESTS as u64 - 1).div_ceil(64)
    );
    for (c, answers) in per_counter.iter().enumerate() {
        let admitted = decided_in_turn(&format!("id{c}"), LIMIT, answers);
        let limit = limits[c % 3];
        let read = store
            .apply(&batch(&format!("id{c}"), limit, 0))
            .await
            .expect("read");
        assert_eq!(
            read.limits[0].used, admitted,
            "counter {c} holds what was told"
        );
    }
    wait_for(&store, Coalescing::default()).await;
}
