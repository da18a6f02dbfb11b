//! `sluice bench` against real servers: its counts are the server's answers
//! (so an exact limiter shows exactly the limit admitted), and its Redis
//! reading sees one script call per decision.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use sluice::bench::{BenchArgs, run};
use sluice::headers::HeaderMode;
use sluice::limiter::ManualClock;
use sluice::store::TimeSource;
use support::Server;
use support::redis::RedisServer;

const RULES: &str = r#"
domain: bench
descriptors:
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: roomy
    rate_limit: {unit: minute, requests_per_unit: 1000000}
"#;

#[tokio::test]
async fn one_hot_key_gets_exactly_its_limit_and_every_answer_is_counted() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let mut args = BenchArgs::new(server.uri(), 700);
    args.keys = 1;
    args.concurrency = 32;
    let report = run(&args, false).await.expect("bench run");
    assert_eq!(report.decisions, 700);
    assert_eq!(report.ok, 100, "{report:?}");
    assert_eq!(report.over_limit, 600, "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    assert!(report.latency_ms.p50 > 0.0 && report.latency_ms.max >= report.latency_ms.p999);
    server.stop().await;
}

#[tokio::test]
async fn keys_spread_requests_over_identities() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    // 5 keys × 100 per minute: at most 500 of 2,000 can be admitted, and
    // zipf or not every key fills up.
    let mut args = BenchArgs::new(server.uri(), 2_000);
    args.keys = 5;
    args.distribution = sluice::bench::Distribution::Zipf;
    let report = run(&args, false).await.expect("bench run");
    assert_eq!(report.ok, 500, "{report:?}");
    assert_eq!(report.over_limit, 1_500);
    server.stop().await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error() {
    let port = support::redis::free_port();
    let args = BenchArgs::new(format!("127.0.0.1:{port}"), 10);
    let error = run(&args, false).await.expect_err("nothing listens there");
    assert!(
        error.to_string().starts_with("cannot connect to"),
        "{error}"
    );
}

#[tokio::test]
async fn the_redis_reading_shows_one_script_call_per_decision() {
    let redis = RedisServer::start();
    let clock = Arc::new(ManualClock::new(support::T0));
    // A call per request, so that the reading can be checked against the
    // requests sent (coalescing and batching share calls between them).
    let store = support::redis_store_call_per_request(
        &redis.url(),
        clock.clone(),
        TimeSource::Redis,
        Duration::from_secs(5),
    )
    .await;
    let server = Server::start_with_store(RULES, HeaderMode::Off, store, clock).await;
    let mut args = BenchArgs::new(server.uri(), 1_000);
    args.descriptors = vec!["roomy={key}".parse().unwrap()];
    args.redis_urls = vec![redis.url()];
    let report = run(&args, false).await.expect("bench run");
    assert_eq!(report.ok, 1_000, "{report:?}");
    let cost = report.redis.expect("a Redis reading");
    assert_eq!(cost.script_calls_per_decision, 1.0, "{cost:?}");
    assert_eq!(cost.commands["evalsha"].calls, 1_000);
    // HMGET and HSET inside the script, besides EVALSHA (and TIME).
    assert!(cost.calls_per_decision >= 3.0, "{cost:?}");
    assert!(cost.usec_per_decision > 0.0 && cost.cpu_usec_per_decision > 0.0);
    server.stop().await;
}

/// A run, failing the test instead of hanging the suite if it never ends.
async fn bounded(args: &BenchArgs) -> sluice::bench::Report {
    tokio::time::timeout(Duration::from_secs(60), run(args, false))
        .await
        .expect("a bench run must end")
        .expect("bench run")
}

#[tokio::test]
async fn a_timed_run_with_a_warm_up_counts_only_the_measured_part() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    // One key with a limit of 100 and requests of 100 hits: the first
    // warm-up request decided fills it, whatever the machine's speed (each
    // worker sends its first measured request only after its warm-up one
    // is answered), so every measured answer is OVER_LIMIT; had the warm-up
    // been counted, one would be OK.
    let mut args = BenchArgs::new(server.uri(), 0);
    args.requests = None;
    args.duration = Some(1_000);
    args.warmup = 300;
    args.keys = 1;
    args.hits = Some(100);
    args.concurrency = 4;
    args.rate = Some(5_000.0);
    let report = bounded(&args).await;
    assert_eq!(report.ok, 0, "{report:?}");
    assert!(report.over_limit > 0, "{report:?}");
    assert_eq!(report.decisions, report.over_limit);
    assert!(report.errors.is_empty(), "{report:?}");
    server.stop().await;
}

#[tokio::test]
async fn a_paced_run_answers_every_request_and_ends() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let mut args = BenchArgs::new(server.uri(), 300);
    args.rate = Some(20_000.0);
    args.keys = 1;
    let report = bounded(&args).await;
    assert_eq!((report.ok, report.over_limit), (100, 200), "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    server.stop().await;
}
