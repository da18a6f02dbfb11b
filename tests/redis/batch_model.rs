//! batch.lua against the memory store, to the field: requests of many
//! identities that share calls to a real `redis-server` are each told what
//! the memory store tells them (used, over, reset, full), step by step while
//! the clock moves on, steps back, and refunds empty counters. The sliding
//! window takes batch.lua's quick path for the usual run and the
//! algorithm's general one when buckets have left its window or the clock
//! is behind its newest bucket; the steps below reach both. The fixed
//! window and the token bucket, which share the calls, take the general
//! path.
//!
//! The HASH's expiry beside them: a sliding window's markers keep until when
//! the HASH lives, so that the quick path reads "x" only when a new bucket
//! needs more; the last test holds it to the HASH's TTL, which a short window
//! must never bring below what a long one of the same identity needs.
//!
//! A step's requests are held while the call of a first request is in
//! flight (Redis stopped), so that they share the next call; each names a
//! different counter (identity and window: limits of one window count on
//! one counter), so that its answer does not depend on the order the
//! shared call lists them in.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use sluice::limiter::{Clock, LimitSpec, ManualClock};
use sluice::store::{
    Batch, BatchItem, BatchOutcome, Coalescing, CounterStore, MemoryStore, MemoryStoreConfig,
    RedisStore,
};

use crate::coalescing::{open_store_on, wait_for};
use crate::support;
use support::redis::RedisServer;
use support::{bucket, fixed, sliding};

const DOMAIN: &str = "batch-model";

/// The limits the requests choose from: sliding windows of ten buckets, of
/// one bucket (precision = duration), of twelve, and of no requests at all
/// (on the first one's counter); a fixed window and a token bucket.
fn limits() -> [LimitSpec; 6] {
    [
        sliding(6, 1_000, 100),
        sliding(3, 600, 600),
        sliding(20, 3_000, 250),
        sliding(0, 1_000, 100),
        fixed(5, 500),
        bucket(5, 1_000, 3),
    ]
}

/// A request: its identity, its limit (in [`limits`]) and its weight.
type Request = (usize, usize, u64);

#[derive(Clone, Debug)]
struct Step {
    /// How far the clock moves (ms): forward, or back when negative.
    clock_ms: i64,
    /// Refunds sent alone before the shared call.
    refunds: Vec<Request>,
    /// Requests sharing one call, one per counter (identity and window).
    shared: Vec<Request>,
}

fn item(request: Request) -> BatchItem {
    let (who, which, hits) = request;
    support::enforcing(DOMAIN, &format!("id{who}"), limits()[which], hits)
}

fn batch(item: BatchItem) -> Batch {
    Batch { items: vec![item] }
}

fn step() -> impl Strategy<Value = Step> {
    let request = (0..4usize, 0..limits().len(), 0..=4u64);
    let clock = prop_oneof![
        3 => 0..200i64,
        2 => 200..1_500i64,
        1 => -800..0i64,
    ];
    (
        clock,
        prop::collection::vec(request.clone(), 0..=1),
        prop::collection::vec(request, 1..=8),
    )
        .prop_map(|(clock_ms, refunds, mut shared)| {
            // One request per counter: limits of one window share it.
            let windows = limits().map(|l| l.window);
            let mut seen = Vec::new();
            shared.retain(|&(who, which, _)| {
                let counter = (who, windows[which]);
                let new = !seen.contains(&counter);
                seen.push(counter);
                new
            });
            Step {
                clock_ms,
                refunds,
                shared,
            }
        })
}

/// What Redis answers `requests` when each waits for the call of
/// `first`: they share the call that follows it.
async fn shared_call(
    redis: &RedisServer,
    store: &Arc<RedisStore>,
    first: BatchItem,
    requests: Vec<BatchItem>,
) -> (BatchOutcome, Vec<BatchOutcome>) {
    let send = |item: BatchItem| {
        let store = store.clone();
        tokio::spawn(async move { store.apply(&batch(item)).await.expect("Redis answers") })
    };
    redis.pause();
    let first = send(first);
    let in_flight = Coalescing {
        counters: 1,
        waiting: 0,
    };
    wait_for(store, in_flight).await;
    let waiting = requests.len();
    let sent: Vec<_> = requests.into_iter().map(send).collect();
    let queued = Coalescing {
        counters: 1,
        waiting,
    };
    wait_for(store, queued).await;
    redis.resume();
    let first = first.await.expect("no panic");
    let mut answers = Vec::new();
    for answer in sent {
        answers.push(answer.await.expect("no panic"));
    }
    (first, answers)
}

/// What each test here runs on: a `redis-server` of its own and a
/// coalescing store on it under a fresh prefix, on a manual clock.
struct Setup {
    redis: RedisServer,
    clock: Arc<ManualClock>,
    prefix: String,
    store: Arc<RedisStore>,
}

/// Runs `test` on a new [`Setup`], in a runtime of two worker threads.
fn on_redis<T>(test: impl AsyncFnOnce(&Setup) -> T) -> T {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let redis = RedisServer::start();
        let clock = Arc::new(ManualClock::new(support::T0 + 60_037));
        let prefix = support::unique_prefix();
        let timeout = Duration::from_secs(10);
        let store = open_store_on(&redis.url(), &prefix, timeout, 1, clock.clone()).await;
        test(&Setup {
            redis,
            clock,
            prefix,
            store,
        })
        .await
    })
}

/// The request whose call the others of a step wait for.
fn first() -> BatchItem {
    support::enforcing(DOMAIN, "first", limits()[0], 1)
}

fn run(steps: &[Step]) -> Result<(), TestCaseError> {
    on_redis(async |setup: &Setup| {
        let Setup {
            redis,
            clock,
            store,
            ..
        } = setup;
        let memory = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
        for (i, step) in steps.iter().enumerate() {
            let now = clock.now().saturating_add_signed(step.clock_ms);
            clock.set(now);
            let at = format!("step {i} at t0+{}", now - support::T0);
            for &refund in &step.refunds {
                let refund = batch(BatchItem {
                    refund: true,
                    ..item(refund)
                });
                let expected = memory.apply(&refund).await.unwrap();
                let actual = store.apply(&refund).await.unwrap();
                prop_assert_eq!(actual, expected, "refund {:?}, {}", refund, at);
            }
            let calls = support::redis::command_calls(redis.port(), "evalsha");
            let shared = step.shared.iter().map(|&r| item(r)).collect();
            let (actual_first, actual) = shared_call(redis, store, first(), shared).await;
            let calls = support::redis::command_calls(redis.port(), "evalsha") - calls;
            prop_assert_eq!(
                calls,
                2,
                "the first call and the one the others shared, {}",
                at
            );
            prop_assert_eq!(actual_first, memory.apply(&batch(first())).await.unwrap());
            for (&request, actual) in step.shared.iter().zip(actual) {
                let expected = memory.apply(&batch(item(request))).await.unwrap();
                prop_assert_eq!(actual, expected, "request {:?}, {}", request, at);
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn requests_sharing_calls_are_told_what_the_memory_store_tells(
        steps in prop::collection::vec(step(), 1..30),
    ) {
        run(&steps)?;
    }
}

#[test]
fn a_short_window_never_brings_the_expiry_a_long_one_needs_closer() {
    // An hour in minutes and a second in tenths on each identity's HASH (the
    // limits of an identity share it), the short one decided by batch.lua
    // (sharing a call), the long one alone. "long first": the short window's
    // quick path finds "x" far enough once, and then trusts its markers.
    // "short first": its markers hold its own short expiry when the long
    // window moves "x" on, so at its next bucket its quick path must read
    // "x" again. "short first, then gone": the same when its next call takes
    // the general path (every bucket has left its window).
    let (long, short) = (sliding(100, 3_600_000, 60_000), sliding(100, 1_000, 100));
    on_redis(async |setup: &Setup| {
        let Setup {
            redis,
            clock,
            prefix,
            store,
        } = setup;
        let alone = async |who: &str| {
            let item = support::enforcing(DOMAIN, who, long, 1);
            assert!(store.apply(&batch(item)).await.unwrap().admitted);
        };
        // The short window's decision, batched: how often its call read
        // "x" (HGETs besides the one of its markers).
        let shared = async |who: &str| {
            let item = support::enforcing(DOMAIN, who, short, 1);
            let hgets = support::redis::command_calls(redis.port(), "hget");
            let (_, answers) = shared_call(redis, store, first(), vec![item]).await;
            assert!(answers[0].admitted);
            support::redis::command_calls(redis.port(), "hget") - hgets - 1
        };
        // The HASH of `who` lives an hour and a half more, as `long` asks
        // (an hour and its last minute, then half as far again), by its
        // TTL and by its "x".
        let lives_on = |who: &str, at: &str| {
            let key = support::enforcing(DOMAIN, who, long, 1)
                .identity
                .storage_key(prefix);
            let ttl = support::redis::query(redis.port(), &["PTTL", &key]);
            let ttl = match ttl {
                support::redis::Reply::Integer(ms) => ms,
                other => panic!("{who} {at}: PTTL {other:?}"),
            };
            assert!(ttl > 5_000_000, "{who} {at}: PTTL {ttl}");
            let x = support::redis::command(redis.port(), &["HGET", &key, "x"]);
            let x: u64 = x.trim_matches('"').parse().expect("x is a time");
            assert!(x > clock.now() + 5_000_000, "{who} {at}: x {x}");
        };
        let step = |ms: u64| clock.set(clock.now() + ms);

        alone("long first").await;
        assert_eq!(
            shared("long first").await,
            1,
            "its markers are new: x is read"
        );
        lives_on("long first", "after the short window's first call");
        step(300);
        assert_eq!(
            shared("long first").await,
            0,
            "its markers say x is far enough"
        );
        lives_on("long first", "at the short window's next bucket");

        assert_eq!(shared("short first").await, 1, "a new HASH: x is read");
        alone("short first").await;
        lives_on("short first", "after the long window moved x");
        // Past what its own expiry covered (half as far again, rounded up
        // to a whole second).
        step(700);
        assert_eq!(
            shared("short first").await,
            1,
            "its markers fall short: x is read"
        );
        lives_on("short first", "at the short window's next bucket");
        step(300);
        assert_eq!(
            shared("short first").await,
            0,
            "its markers now say x is far enough"
        );

        assert_eq!(shared("gone").await, 1, "a new HASH: x is read");
        alone("gone").await;
        step(2_000);
        assert_eq!(shared("gone").await, 1, "its markers fall short: x is read");
        lives_on("gone", "after the general path");
        step(300);
        assert_eq!(
            shared("gone").await,
            0,
            "the markers the general path wrote say x is far enough"
        );
    });
}
