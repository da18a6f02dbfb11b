//! Warnings before the wall, in both stores: the same requests through the
//! memory store and a real Redis give the same `x-ratelimit-soft-breach`
//! and the same headroom for the upstream, request by request, for every
//! algorithm, a rule's own `soft_ratio` and the limiter's default, a
//! descriptor with two limits, a shadow-mode rule and a request's own
//! limit. Both are computed from what the stores report (`used` per limit),
//! so this is what keeps them identical.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use sluice::decision::{Limiter, LimiterOptions};
use sluice::limiter::{ManualClock, SoftRatio};
use sluice::proto as pb;
use sluice::service::{ResponseOptions, from_pb, to_pb_with};
use sluice::store::{CounterStore, MemoryStore, MemoryStoreConfig, TimeSource};
use support::redis::RedisServer;
use support::{OK, OVER, T0};

const RULES: &str = r"
domain: warn
descriptors:
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 4, soft_ratio: 0.5}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 4, soft_ratio: 0.5, algorithm: fixed_window}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 4, soft_ratio: 0.5, algorithm: token_bucket}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 4, soft_ratio: 0.5, algorithm: sliding_log}
  - key: slots
    rate_limit: {algorithm: concurrency, requests_per_unit: 4, soft_ratio: 0.5}
  - key: defaulted
    rate_limit: {unit: minute, requests_per_unit: 4, name: four}
  - key: two
    rate_limits:
      - {unit: second, requests_per_unit: 3}
      - {unit: hour, requests_per_unit: 5, soft_ratio: 0.5, name: hourly}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 4, soft_ratio: 0.5}
  - key: override
";

/// What a client and an upstream learn from one answer: the overall code,
/// whether the soft-breach header is there, and the headroom headers.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    code: i32,
    soft: bool,
    headroom: Vec<(String, String)>,
}

/// The limiter's default `soft_ratio` in these tests.
fn default_ratio() -> SoftRatio {
    SoftRatio::new(0.75).unwrap()
}

fn limiter<S: CounterStore>(store: S, clock: &Arc<ManualClock>) -> Limiter<S> {
    let options = LimiterOptions {
        clock: clock.clone(),
        soft_ratio: Some(default_ratio()),
        ..LimiterOptions::default()
    };
    Limiter::with_options(support::rules(RULES), store, options)
}

async fn seen<S: CounterStore>(limiter: &Limiter<S>, request: &pb::RateLimitRequest) -> Seen {
    let request = from_pb(request.clone()).unwrap();
    let decision = limiter.decide(&request).await.unwrap();
    let options = ResponseOptions {
        upstream_headroom: true,
        ..ResponseOptions::default()
    };
    let response = to_pb_with(Some(&request), &decision, options);
    let pairs = |headers: Vec<pb::HeaderValue>| -> Vec<(String, String)> {
        headers.into_iter().map(|h| (h.key, h.value)).collect()
    };
    let soft = pairs(response.response_headers_to_add);
    assert!(
        soft.iter()
            .all(|h| *h == ("x-ratelimit-soft-breach".into(), "1".into())),
        "only the soft-breach header (rate-limit headers are off): {soft:?}"
    );
    Seen {
        code: response.overall_code,
        soft: !soft.is_empty(),
        headroom: pairs(response.request_headers_to_add),
    }
}

/// The memory store and a Redis store, both on `clock`.
struct Both {
    memory: Limiter<MemoryStore>,
    redis: Limiter<sluice::store::RedisStore>,
}

impl Both {
    async fn start(redis: &RedisServer, clock: &Arc<ManualClock>) -> Self {
        let memory = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
        // Local time: the scripts take the test's clock, as the memory
        // store does.
        let store = support::redis_store(
            &redis.url(),
            clock.clone(),
            TimeSource::Local,
            Duration::from_secs(5),
        )
        .await;
        Self {
            memory: limiter(memory, clock),
            redis: limiter(store, clock),
        }
    }

    /// What `request` gives, the same in both stores.
    async fn ask(&self, request: &pb::RateLimitRequest) -> Seen {
        let memory = seen(&self.memory, request).await;
        let redis = seen(&self.redis, request).await;
        assert_eq!(memory, redis, "memory and Redis disagree on {request:?}");
        memory
    }
}

fn headroom(remaining: u64, name: &str) -> Vec<(String, String)> {
    vec![
        ("x-ratelimit-remaining".into(), remaining.to_string()),
        ("x-ratelimit-name".into(), name.into()),
    ]
}

fn ok(soft: bool, remaining: u64, name: &str) -> Seen {
    Seen {
        code: OK,
        soft,
        headroom: headroom(remaining, name),
    }
}

const REFUSED: Seen = Seen {
    code: OVER,
    soft: false,
    headroom: Vec::new(),
};

#[tokio::test]
async fn every_algorithm_warns_past_its_soft_ratio_alike_in_memory_and_redis() {
    let redis = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0 + 1_000));
    let both = Both::start(&redis, &clock).await;
    for key in ["sliding", "fixed", "bucket", "log", "slots"] {
        let request = support::request("warn", &[&[(key, "a")]]);
        let path = format!("warn/{key}");
        // 4 a minute, warned past half: the 3rd and 4th; the 5th is
        // refused, and a refusal carries no warning and nothing upstream.
        let got = [
            both.ask(&request).await,
            both.ask(&request).await,
            both.ask(&request).await,
            both.ask(&request).await,
            both.ask(&request).await,
        ];
        let expected = [
            ok(false, 3, &path),
            ok(false, 2, &path),
            ok(true, 1, &path),
            ok(true, 0, &path),
            REFUSED,
        ];
        assert_eq!(got, expected, "{key}");
    }
}

#[tokio::test]
async fn the_default_ratio_two_limits_shadow_mode_and_overrides_alike_in_memory_and_redis() {
    let redis = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0 + 1_000));
    let both = Both::start(&redis, &clock).await;

    // No ratio of its own: the limiter's 0.75 of 4, past 3.
    let request = support::request("warn", &[&[("defaulted", "a")]]);
    for (i, (soft, remaining)) in [(false, 3), (false, 2), (false, 1), (true, 0)]
        .into_iter()
        .enumerate()
    {
        assert_eq!(
            both.ask(&request).await,
            ok(soft, remaining, "four"),
            "request {i}"
        );
    }

    // 3 a second and 5 an hour, the hourly one warned past 2.5. The
    // per-second limit is the tighter one reported, yet the hourly one
    // warns.
    let request = support::request("warn", &[&[("two", "a")]]);
    assert_eq!(both.ask(&request).await, ok(false, 2, "warn/two"));
    assert_eq!(both.ask(&request).await, ok(false, 1, "warn/two"));
    assert_eq!(both.ask(&request).await, ok(true, 0, "warn/two"));
    assert_eq!(both.ask(&request).await, REFUSED);
    // Past the second (and its last bucket): the hourly limit is the
    // tighter now.
    clock.advance(1_100);
    assert_eq!(both.ask(&request).await, ok(true, 1, "hourly"));

    // A shadow-mode rule never refuses, so never warns; its headroom is
    // still told (it is what x-ratelimit-remaining shows).
    let request = support::request("warn", &[&[("trial", "a")]]);
    for remaining in [3, 2, 1, 0, 0] {
        assert_eq!(both.ask(&request).await, ok(false, remaining, "warn/trial"));
    }

    // Two descriptors: one warning is enough, and the upstream hears of the
    // tighter one.
    let request = support::request("warn", &[&[("sliding", "b")], &[("log", "b")]]);
    assert_eq!(both.ask(&request).await, ok(false, 3, "warn/sliding"));
    assert_eq!(both.ask(&request).await, ok(false, 2, "warn/sliding"));
    assert_eq!(both.ask(&request).await, ok(true, 1, "warn/sliding"));

    // A request's own limit takes the default ratio.
    let mut request = support::request("warn", &[&[("override", "a")]]);
    request.descriptors[0].limit = Some(pb::rate_limit_descriptor::RateLimitOverride {
        requests_per_unit: 4,
        unit: pb::RateLimitUnit::Minute as i32,
    });
    for (soft, remaining) in [(false, 3), (false, 2), (false, 1), (true, 0)] {
        assert_eq!(both.ask(&request).await, ok(soft, remaining, "_override_"));
    }
}

#[tokio::test]
async fn global_shadow_mode_warns_of_nothing_and_a_limit_without_a_ratio_never_warns() {
    let clock = Arc::new(ManualClock::new(T0 + 1_000));
    let memory = || MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
    let shadow = Limiter::with_options(
        support::rules(RULES),
        memory(),
        LimiterOptions {
            clock: clock.clone(),
            shadow_mode: true,
            soft_ratio: Some(default_ratio()),
            ..LimiterOptions::default()
        },
    );
    let request = support::request("warn", &[&[("sliding", "a")]]);
    for remaining in [3, 2, 1, 0, 0] {
        let path = "warn/sliding";
        assert_eq!(seen(&shadow, &request).await, ok(false, remaining, path));
    }
    // No default: `defaulted` has no ratio at all.
    let plain = Limiter::with_options(
        support::rules(RULES),
        memory(),
        LimiterOptions {
            clock: clock.clone(),
            ..LimiterOptions::default()
        },
    );
    let request = support::request("warn", &[&[("defaulted", "a")]]);
    for remaining in [3, 2, 1, 0] {
        assert_eq!(seen(&plain, &request).await, ok(false, remaining, "four"));
    }
}
