//! Counting modes, refunds and concurrency limits through the whole decision
//! path (rules file, request, limiter, store): the agreed rule syntax, the
//! global defaults of `LimiterOptions`, and exactness under 200 concurrent
//! calls from two limiter replicas sharing one Redis, and on a Redis Cluster.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use sluice::decision::{Limiter, LimiterOptions};
use sluice::limiter::{Counting, ManualClock};
use sluice::request::{Descriptor, Entry, Request};
use sluice::store::{CounterStore, MemoryStore, MemoryStoreConfig, TimeSource};
use support::T0;
use support::redis::{shared, shared_cluster};

const RULES: &str = r#"
domain: ai
descriptors:
  - key: tokens
    counting: always
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: inflight
    rate_limit: {algorithm: concurrency, requests_per_unit: 3, lease: 30s}
  - key: inflight_default
    rate_limit: {algorithm: concurrency, requests_per_unit: 1}
  - key: small
    counting: always
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: refunded
    rate_limit: {unit: minute, requests_per_unit: 250}
"#;

/// One descriptor `key=value` weighing `hits`, a refund when `negative`.
fn request(key: &str, value: &str, hits: u64, negative: bool) -> Request {
    Request {
        domain: "ai".into(),
        descriptors: vec![Descriptor {
            entries: vec![Entry::new(key, value)],
            limit: None,
            hits_addend: Some(hits),
            is_negative_hits: negative,
        }],
        hits_addend: 0,
    }
}

fn memory_limiter(options: LimiterOptions) -> (Limiter<MemoryStore>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
    let options = LimiterOptions {
        clock: clock.clone(),
        ..options
    };
    (
        Limiter::with_options(support::rules(RULES), store, options),
        clock,
    )
}

async fn admitted<S: CounterStore>(limiter: &Limiter<S>, request: &Request) -> bool {
    limiter.decide(request).await.expect("a decision").admitted
}

#[tokio::test]
async fn a_usage_charge_that_does_not_fit_counts_and_closes_the_budget() {
    let (limiter, _) = memory_limiter(LimiterOptions::default());
    assert!(admitted(&limiter, &request("tokens", "u", 900, false)).await);
    let charge = limiter
        .decide(&request("tokens", "u", 500, false))
        .await
        .unwrap();
    assert!(
        charge.statuses[0].over_limit,
        "the overflowing debit says OVER_LIMIT"
    );
    assert!(!admitted(&limiter, &request("tokens", "u", 0, false)).await);
    // Refunding 401 tokens brings 1400 back to 999: open again.
    assert!(admitted(&limiter, &request("tokens", "u", 401, true)).await);
    assert!(admitted(&limiter, &request("tokens", "u", 0, false)).await);
}

#[tokio::test]
async fn the_global_counting_default_applies_to_rules_that_do_not_set_it() {
    // token-quota.sh on `plain` (2/min): check with 0, charge 1 afterwards.
    for (counting, expected) in [
        (Counting::Admitted, [true, true, true, true]),
        (Counting::Always, [true, true, true, false]),
    ] {
        let (limiter, _) = memory_limiter(LimiterOptions {
            counting,
            ..LimiterOptions::default()
        });
        let mut passed = Vec::new();
        for _ in 0..4 {
            let ok = admitted(&limiter, &request("plain", "u", 0, false)).await;
            passed.push(ok);
            if ok {
                limiter
                    .decide(&request("plain", "u", 1, false))
                    .await
                    .unwrap();
            }
        }
        assert_eq!(passed, expected, "{counting:?}");
    }
}

#[tokio::test]
async fn concurrency_rules_take_release_and_lease_slots() {
    let (limiter, clock) = memory_limiter(LimiterOptions::default());
    for _ in 0..3 {
        assert!(admitted(&limiter, &request("inflight", "u", 1, false)).await);
    }
    assert!(!admitted(&limiter, &request("inflight", "u", 1, false)).await);
    assert!(admitted(&limiter, &request("inflight", "u", 1, true)).await);
    assert!(admitted(&limiter, &request("inflight", "u", 1, false)).await);
    // The default lease is 30 s.
    assert!(admitted(&limiter, &request("inflight_default", "u", 1, false)).await);
    clock.advance(29_999);
    assert!(!admitted(&limiter, &request("inflight_default", "u", 1, false)).await);
    clock.advance(1);
    assert!(admitted(&limiter, &request("inflight_default", "u", 1, false)).await);
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_and_still_counts() {
    let (limiter, _) = memory_limiter(LimiterOptions {
        shadow_mode: true,
        ..LimiterOptions::default()
    });
    for _ in 0..3 {
        limiter
            .decide(&request("plain", "s", 1, false))
            .await
            .unwrap();
    }
    let third = limiter
        .decide(&request("plain", "s", 1, false))
        .await
        .unwrap();
    assert!(third.admitted, "overall OK in shadow mode");
    assert!(
        third.statuses[0].over_limit,
        "the descriptor status is kept"
    );
}

#[tokio::test]
async fn global_quota_mode_refuses_only_when_every_descriptor_is_over() {
    let (limiter, _) = memory_limiter(LimiterOptions {
        quota_mode: true,
        ..LimiterOptions::default()
    });
    let two = |a: &str, b: &str| Request {
        domain: "ai".into(),
        descriptors: vec![
            Descriptor::of([("plain", a)]),
            Descriptor::of([("plain", b)]),
        ],
        hits_addend: 0,
    };
    for _ in 0..2 {
        assert!(admitted(&limiter, &request("plain", "full", 1, false)).await);
    }
    assert!(
        admitted(&limiter, &two("full", "open")).await,
        "one is still under"
    );
    for _ in 0..2 {
        limiter
            .decide(&request("plain", "open2", 1, false))
            .await
            .unwrap();
    }
    assert!(
        !admitted(&limiter, &two("full", "open2")).await,
        "both over"
    );
}

/// Two limiter replicas over one Redis (or Cluster) under one key prefix.
async fn replicas(url: &str) -> [Limiter<sluice::store::RedisStore>; 2] {
    let clock = Arc::new(ManualClock::new(T0));
    let prefix = support::unique_prefix();
    let mut out = Vec::new();
    for _ in 0..2 {
        let store = support::redis_store_sharing(
            url,
            clock.clone(),
            TimeSource::Local,
            Duration::from_secs(10),
            &prefix,
        )
        .await;
        out.push(Limiter::with_options(
            support::rules(RULES),
            store,
            LimiterOptions {
                clock: clock.clone(),
                ..LimiterOptions::default()
            },
        ));
    }
    out.try_into().ok().expect("two replicas")
}

/// 200 calls of `request`, alternating replicas, all at once: how many were
/// admitted.
async fn storm(limiters: &[Limiter<sluice::store::RedisStore>; 2], request: &Request) -> usize {
    let calls = (0..200).map(|i| limiters[i % 2].decide(request));
    join_all(calls)
        .await
        .into_iter()
        .filter(|d| d.as_ref().expect("a decision").admitted)
        .count()
}

async fn every_mode_is_exact_under_concurrency(url: &str) {
    let limiters = replicas(url).await;
    let first = &limiters[0];

    // always, 50/min: exactly 50 admitted, all 200 counted.
    assert_eq!(storm(&limiters, &request("small", "x", 1, false)).await, 50);
    first
        .decide(&request("small", "x", 150, true))
        .await
        .unwrap();
    assert!(admitted(first, &request("small", "x", 0, false)).await);
    assert!(
        !admitted(first, &request("small", "x", 1, false)).await,
        "200 were counted"
    );

    // refunds, 250/min filled to 200: 200 refunds of 1 end at exactly 0.
    first
        .decide(&request("refunded", "x", 200, false))
        .await
        .unwrap();
    assert_eq!(
        storm(&limiters, &request("refunded", "x", 1, true)).await,
        200
    );
    assert!(admitted(first, &request("refunded", "x", 250, false)).await);
    assert!(!admitted(first, &request("refunded", "x", 1, false)).await);
    // And never below empty: 200 more refunds of 1 on a counter at 0... after
    // a refund of everything, the limit fits exactly once more.
    first
        .decide(&request("refunded", "x", 1_000, true))
        .await
        .unwrap();
    assert_eq!(
        storm(&limiters, &request("refunded", "x", 1, true)).await,
        200
    );
    assert!(admitted(first, &request("refunded", "x", 250, false)).await);
    assert!(!admitted(first, &request("refunded", "x", 1, false)).await);

    // concurrency, 3 slots: exactly 3 taken; 200 releases free them all.
    assert_eq!(
        storm(&limiters, &request("inflight", "x", 1, false)).await,
        3
    );
    assert_eq!(
        storm(&limiters, &request("inflight", "x", 1, true)).await,
        200
    );
    assert_eq!(
        storm(&limiters, &request("inflight", "x", 1, false)).await,
        3
    );

    for limiter in limiters {
        limiter.store().quit();
    }
}

#[tokio::test]
async fn two_replicas_on_one_redis_count_every_mode_exactly() {
    every_mode_is_exact_under_concurrency(&shared().url()).await;
}

#[tokio::test]
async fn two_replicas_on_a_redis_cluster_count_every_mode_exactly() {
    every_mode_is_exact_under_concurrency(&shared_cluster().url()).await;
}

mod rules {
    use sluice::limiter::Unit;
    use sluice::limiter::{Algorithm, Counting};
    use sluice::request::Entry;
    use sluice::rules::{Domain, parse_domain};

    fn load(text: &str) -> Result<Domain, String> {
        parse_domain("rules/counting.yaml", text.as_bytes()).map_err(|errors| format!("{errors:?}"))
    }

    fn rule<'d>(domain: &'d Domain, key: &str) -> &'d sluice::rules::Rule {
        domain
            .find(&[Entry::new(key, "v")])
            .expect("a rule matches")
            .rule
    }

    #[test]
    fn the_agreed_syntax_compiles() {
        let domain = load(super::RULES).expect("the agreed rules load");
        assert_eq!(rule(&domain, "tokens").counting, Some(Counting::Always));
        assert_eq!(rule(&domain, "plain").counting, None, "the global default");
        let inflight = &rule(&domain, "inflight").limits[0];
        assert_eq!(inflight.spec.window.algorithm, Algorithm::Concurrency);
        assert_eq!(inflight.spec.window.duration_ms, 30_000, "the lease");
        assert_eq!((inflight.spec.requests, inflight.unit), (3, Unit::Unknown));
        let default = &rule(&domain, "inflight_default").limits[0];
        assert_eq!(default.spec.window.duration_ms, 30_000, "the default lease");
        let text = "domain: d\ndescriptors:\n  - key: c\n    counting: admitted\n    rate_limit: {algorithm: concurrency, unit: second, requests_per_unit: 2, lease: 5m}\n";
        let domain = load(text).unwrap();
        let c = rule(&domain, "c");
        assert_eq!(c.counting, Some(Counting::Admitted));
        assert_eq!(c.limits[0].spec.window.duration_ms, 300_000);
        assert_eq!(c.limits[0].unit, Unit::Second, "a unit is only reported");
    }

    #[test]
    fn wrong_counting_and_lease_settings_are_refused_clearly() {
        for (body, expected) in [
            (
                "counting: sometimes\n    rate_limit: {unit: minute, requests_per_unit: 1}",
                "unknown counting mode `sometimes`",
            ),
            (
                "rate_limit: {unit: minute, requests_per_unit: 1, lease: 5s}",
                "'lease' applies only to algorithm concurrency",
            ),
            (
                "rate_limit: {algorithm: concurrency, requests_per_unit: 1, lease: 0s}",
                "invalid lease '0s'",
            ),
            (
                "rate_limit: {algorithm: concurrency, requests_per_unit: 1, lease: soon}",
                "invalid lease 'soon'",
            ),
            (
                "rate_limit: {algorithm: concurrency, requests_per_unit: 1, precision: 1s}",
                "'precision' applies only",
            ),
        ] {
            let text = format!("domain: d\ndescriptors:\n  - key: k\n    {body}\n");
            let error = load(&text).expect_err(&text);
            assert!(error.contains(expected), "{expected:?} in {error}");
        }
    }
}
