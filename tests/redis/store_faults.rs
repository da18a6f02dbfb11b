//! The Redis store when Redis is slow or refuses us, against real
//! `redis-server` processes: a call that times out after its script ran is
//! reconciled so that counters hold exactly what callers were told (single
//! server and Cluster; debits that always count stand), a refund that fails
//! is counted where operators see it, the default timeout carries a 200-call
//! burst, and a wrong password is named as such (never echoed).

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use sluice::limiter::{Counting, ManualClock};
use sluice::settings::Settings;
use sluice::store::{
    Batch, BatchItem, BreakerConfig, CounterStore, RedisStore, RedisStoreConfig, RedisUrl,
    StoreError, TimeSource,
};
use sluice::telemetry::metrics::{Metrics, MetricsConfig};
use support::eventually::eventually_async;
use support::per_minute;
use support::redis::{RedisCluster, RedisServer, key_slot};

fn item(name: &str, hits: u64) -> BatchItem {
    support::enforcing("timeouts", name, per_minute(5), hits)
}

fn slot_of(prefix: &str, name: &str) -> u16 {
    key_slot(item(name, 0).identity.storage_key(prefix).as_bytes())
}

async fn open(url: &str, prefix: &str, timeout: Duration) -> Arc<RedisStore> {
    open_with(config(url, prefix, timeout)).await
}

/// The store's settings in these tests: two connections, Redis's clock,
/// no breaker, hot counters coalesced (the default).
fn config(url: &str, prefix: &str, timeout: Duration) -> RedisStoreConfig {
    RedisStoreConfig {
        tls: sluice::store::RedisTls::default(),
        per_second_url: None,
        coalesce: true,
        url: RedisUrl::new(url),
        pool_size: 2,
        timeout,
        key_prefix: prefix.to_owned(),
        time: TimeSource::Redis,
        breaker: None,
    }
}

async fn open_with(config: RedisStoreConfig) -> Arc<RedisStore> {
    let clock = Arc::new(ManualClock::new(support::T0));
    Arc::new(
        RedisStore::connect(&config, clock, Duration::from_secs(10))
            .await
            .expect("connect"),
    )
}

/// A store on `redis` that times calls out after 50 ms and sends each
/// request in a call of its own.
async fn uncoalesced(redis: &RedisServer, prefix: &str) -> Arc<RedisStore> {
    open_with(RedisStoreConfig {
        coalesce: false,
        ..config(&redis.url(), prefix, Duration::from_millis(50))
    })
    .await
}

/// Fires `n` copies of `batch` at once; `(admitted, over limit, errors)`.
async fn burst(store: &Arc<RedisStore>, n: usize, items: &[&str]) -> (usize, usize, Vec<String>) {
    let calls = (0..n).map(|_| {
        let store = store.clone();
        let batch = Batch {
            items: items.iter().map(|name| item(name, 1)).collect(),
        };
        tokio::spawn(async move { store.apply(&batch).await })
    });
    let (mut admitted, mut over, mut errors) = (0, 0, Vec::new());
    for call in join_all(calls).await {
        match call.expect("no panic") {
            Ok(outcome) if outcome.admitted => admitted += 1,
            Ok(_) => over += 1,
            Err(e) => errors.push(e.to_string()),
        }
    }
    (admitted, over, errors)
}

/// `EVALSHA` calls the server on `port` has run.
fn evalsha_calls(port: u16) -> u64 {
    support::redis::command_calls(port, "evalsha")
}

/// Polls until the server on `port` has run `n` `EVALSHA`s.
async fn wait_evalsha(port: u16, n: u64) {
    let what = format!("Redis to run the {n} scripts");
    eventually_async(&what, async || evalsha_calls(port) >= n).await;
}

/// Polls until `store` has no refund call in flight, then says that none of
/// its refund calls failed.
pub(crate) async fn expect_refunds_made(store: &RedisStore) {
    let refunds = eventually_async("the refunds to be answered", async || {
        let refunds = store.refunds();
        (refunds.in_flight == 0)
            .then_some(refunds)
            .ok_or(format!("{refunds:?}"))
    })
    .await;
    assert_eq!(refunds.failed, 0, "refund calls failed: {refunds:?}");
}

/// Polls until `name`'s counter holds `want`, read by `reader`; fails with
/// what it holds otherwise.
async fn expect_counter(reader: &RedisStore, name: &str, want: u64) {
    let what = format!("counter {name} to hold the {want} hits callers were told were admitted");
    eventually_async(&what, async || {
        let read = Batch {
            items: vec![item(name, 0)],
        };
        let used = reader.apply(&read).await.expect("a read answers").limits[0].used;
        (used == want)
            .then_some(())
            .ok_or(format!("it holds {used}"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_time_out_after_their_script_ran_are_refunded() {
    let redis = RedisServer::start();
    let prefix = support::unique_prefix();
    let store = uncoalesced(&redis, &prefix).await;
    let metrics = Metrics::new(MetricsConfig::default());
    store.count_reconciliations_in(metrics.reconcile_counters());
    let reader = open(&redis.url(), &prefix, Duration::from_secs(5)).await;
    let ran = evalsha_calls(redis.port());

    // Every call is written to the socket, then times out; on resume Redis
    // runs all 200 scripts and 5 of them count.
    redis.pause();
    let (admitted, _, errors) = burst(&store, 200, &["paused"]).await;
    redis.resume();
    assert_eq!((admitted, errors.len()), (0, 200), "{errors:?}");
    wait_evalsha(redis.port(), ran + 200).await;
    expect_counter(&reader, "paused", 0).await;
    expect_refunds_made(&store).await;
    // Each late reply is counted as it is reconciled.
    let answered = metrics.reconcile_counters().answered;
    eventually_async("200 calls reconciled", async || {
        let reconciled = answered.get();
        (reconciled >= 200)
            .then_some(())
            .ok_or(format!("{reconciled} reconciled"))
    })
    .await;
    let exposed = metrics.encode();
    for line in [
        r#"sluice_store_reconciliations_total{outcome="answered"} 200"#,
        r#"sluice_store_reconciliations_total{outcome="no_reply"} 0"#,
    ] {
        assert!(exposed.contains(line), "missing {line} in\n{exposed}");
    }
    // The store still decides exactly afterwards.
    let (admitted, over, errors) = burst(&reader, 200, &["after"]).await;
    assert_eq!((admitted, over), (5, 195), "{errors:?}");
    expect_counter(&reader, "after", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_call_refunds_what_was_admitted_but_not_what_always_counts() {
    let redis = RedisServer::start();
    let prefix = support::unique_prefix();
    let store = uncoalesced(&redis, &prefix).await;
    let reader = open(&redis.url(), &prefix, Duration::from_secs(5)).await;
    let ran = evalsha_calls(redis.port());
    let charge = BatchItem {
        counting: Counting::Always,
        ..item("charged", 2)
    };
    let batch = Batch {
        items: vec![item("admitted", 1), charge],
    };

    // The call is in Redis's socket when its caller gives up; on resume it
    // runs and admits the request.
    redis.pause();
    let outcome = store.apply(&batch).await;
    redis.resume();
    assert!(
        matches!(outcome, Err(StoreError::Timeout(_))),
        "{outcome:?}"
    );
    wait_evalsha(redis.port(), ran + 1).await;
    expect_refunds_made(&store).await;
    // The admitted debit is taken back; the usage charge stands, as it
    // would had the request been refused.
    expect_counter(&reader, "admitted", 0).await;
    expect_counter(&reader, "charged", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_calls_that_time_out_after_their_script_ran_are_refunded() {
    let redis = RedisServer::start();
    let prefix = support::unique_prefix();
    // One connection, so that a later call is run after every earlier one.
    let store = open_with(RedisStoreConfig {
        pool_size: 1,
        ..config(&redis.url(), &prefix, Duration::from_millis(50))
    })
    .await;
    let reader = open(&redis.url(), &prefix, Duration::from_secs(5)).await;

    // The first request's call is written to the socket; the others wait
    // for it and may go out on later calls before they time out. All are
    // told they timed out.
    redis.pause();
    let (admitted, _, errors) = burst(&store, 200, &["paused"]).await;
    redis.resume();
    assert_eq!((admitted, errors.len()), (0, 200), "{errors:?}");
    // A call on another counter after them: once it answers, every call
    // before it has run and counted (the first one at least 1 hit).
    let marker = Batch {
        items: vec![item("marker", 0)],
    };
    store.apply(&marker).await.expect("Redis answers again");
    expect_counter(&reader, "paused", 0).await;
    expect_refunds_made(&store).await;
    assert_eq!(store.coalescing().waiting, 0, "nobody is left waiting");
    let (admitted, over, errors) = burst(&store, 200, &["after"]).await;
    assert_eq!((admitted, over), (5, 195), "{errors:?}");
    expect_counter(&reader, "after", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_that_fails_is_counted_and_shown_in_the_metrics() {
    let redis = RedisServer::start();
    let prefix = support::unique_prefix();
    let store = uncoalesced(&redis, &prefix).await;
    let metrics = Metrics::new(MetricsConfig::default());
    store.count_refund_failures_in(metrics.store_refund_failures());
    let key = item("spoiled", 0).identity.storage_key(&prefix);

    let batch = Batch {
        items: vec![item("spoiled", 1)],
    };
    let outcome = redis.spoil_refund(&key, store.apply(&batch)).await;
    assert!(
        matches!(outcome, Err(StoreError::Timeout(_))),
        "{outcome:?}"
    );

    eventually_async("the refund to fail", async || store.refunds().failed != 0).await;
    assert_eq!(
        store.refunds(),
        sluice::store::Refunds {
            in_flight: 0,
            failed: 1
        }
    );
    let exposed = metrics.encode();
    assert!(
        exposed.contains("sluice_store_refund_failures_total 1\n"),
        "{exposed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_replies_do_not_close_the_breaker_their_timeouts_opened() {
    // Three timeouts open the breaker (the store's clock never moves, so it
    // stays open). The paused Redis then runs the three scripts and their
    // replies arrive late: they must neither close the breaker (a Redis that
    // slow is what it is for) nor be kept from their refunds by it. Each
    // request is sent alone (one after the other), coalesced or not.
    for coalesce in [false, true] {
        let redis = RedisServer::start();
        let prefix = support::unique_prefix();
        let store = open_with(RedisStoreConfig {
            coalesce,
            breaker: Some(BreakerConfig {
                failures: 3,
                min_failing: Duration::ZERO,
                cooldown: Duration::from_secs(3_600),
            }),
            ..config(&redis.url(), &prefix, Duration::from_millis(50))
        })
        .await;
        let reader = open(&redis.url(), &prefix, Duration::from_secs(5)).await;
        let before = evalsha_calls(redis.port());
        let batch = Batch {
            items: vec![item("late", 1)],
        };
        redis.pause();
        for _ in 0..3 {
            let timed_out = store.apply(&batch).await;
            assert!(
                matches!(timed_out, Err(StoreError::Timeout(_))),
                "coalesce {coalesce}: {timed_out:?}"
            );
        }
        redis.resume();
        wait_evalsha(redis.port(), before + 3).await;
        // Refunded: the late replies have been read.
        expect_counter(&reader, "late", 0).await;
        expect_refunds_made(&store).await;
        let refused = store.apply(&batch).await;
        assert!(
            matches!(refused, Err(StoreError::CircuitOpen(_))),
            "coalesce {coalesce}: the breaker closed on a late reply: {refused:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_slot_group_that_times_out_is_refunded_with_the_others() {
    let cluster = RedisCluster::start();
    let prefix = support::unique_prefix();
    let store = open(&cluster.url(), &prefix, Duration::from_millis(50)).await;
    let reader = open(&cluster.url(), &prefix, Duration::from_secs(5)).await;
    // Two counters on different masters: one that will hang, one that answers.
    let find = |stem: &str, want: &dyn Fn(u16) -> bool| {
        (0..)
            .map(|i| format!("{stem}{i}"))
            .find(|n| want(cluster.port_for_slot(slot_of(&prefix, n))))
            .expect("a name")
    };
    let slow = find("slow", &|_| true);
    let hung = cluster.port_for_slot(slot_of(&prefix, &slow));
    let fast = find("fast", &|port| port != hung);
    let node = &cluster.nodes()[cluster.ports().iter().position(|&p| p == hung).unwrap()];
    let ran = evalsha_calls(hung);

    node.pause();
    let (admitted, _, errors) = burst(&store, 200, &[&slow, &fast]).await;
    node.resume();
    assert_eq!((admitted, errors.len()), (0, 200), "{errors:?}");
    wait_evalsha(hung, ran + 200).await;
    expect_counter(&reader, &slow, 0).await;
    expect_counter(&reader, &fast, 0).await;
    expect_refunds_made(&store).await;
    // Across slots, a part counted and then refunded may make a concurrent
    // request see a full counter (even every one of the burst): never more
    // than the limit, and the counters hold exactly the admitted requests.
    let (admitted, _, errors) = burst(&reader, 200, &[&slow, &fast]).await;
    assert!(admitted <= 5 && errors.is_empty(), "{admitted} {errors:?}");
    expect_counter(&reader, &slow, admitted as u64).await;
    expect_counter(&reader, &fast, admitted as u64).await;
    expect_refunds_made(&reader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_call_burst_with_the_default_timeout_admits_exactly_the_limit() {
    let redis = RedisServer::start();
    let prefix = support::unique_prefix();
    let timeout = Duration::from_millis(Settings::default().redis_timeout_ms.get());
    let store = open(&redis.url(), &prefix, timeout).await;
    let (admitted, over, errors) = burst(&store, 200, &["burst"]).await;
    // Measured on the project's 2-core machine in a debug build: 10 ms
    // failed up to 191 of 200, 20 ms up to 23, 30 ms none (see docs/src/redis.md).
    assert_eq!((admitted, over), (5, 195), "{errors:?}");
    expect_counter(&store, "burst", 5).await;
}

#[tokio::test]
async fn a_wrong_password_is_named_and_never_shown() {
    let redis = RedisServer::start_with(&[
        "--requirepass",
        "the-right-one",
        "--user",
        "alice",
        "on",
        ">alices-secret",
        "~*",
        "&*",
        "+@all",
    ]);
    for url in [
        redis.url_with_auth("", "Wr0ng-Pa55"),
        redis.url_with_auth("alice", "Wr0ng-Pa55"),
    ] {
        let store = open(&url, &support::unique_prefix(), Duration::from_secs(1)).await;
        let error = store
            .apply(&Batch {
                items: vec![item("x", 1)],
            })
            .await
            .expect_err("refused");
        let text = error.to_string();
        assert!(
            matches!(error, StoreError::Unavailable(_)) && text.contains("authentication failed"),
            "{text}"
        );
        assert!(!text.contains("Wr0ng-Pa55"), "{text}");
        assert!(!store.is_ready());
    }
}
