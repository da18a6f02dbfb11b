//! The local over-limit cache answers exactly what the store would: random
//! rules, traffic and time steps over the memory store, Redis and Redis
//! Cluster, each cached answer compared field for field (statuses, wire
//! response with headers, per-limit metrics) with the answer of a limiter
//! without cache over the same counters at the same instant; and one
//! regression test per way the cache used to differ (issue 11, item 6).

use crate::support;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice::decision::{Decision, Limiter, LimiterOptions};
use sluice::headers::HeaderMode;
use sluice::limiter::ManualClock;
use sluice::request::{Descriptor, Entry, Request};
use sluice::service::to_pb;
use sluice::store::{
    Batch, BatchOutcome, CounterStore, MemoryStore, MemoryStoreConfig, StoreError, TimeSource,
};
use support::T0;
use support::redis::{shared, shared_cluster};

/// One store behind two limiters, so both see the same counters.
struct Shared<S>(Arc<S>);

impl<S: CounterStore> CounterStore for Shared<S> {
    fn apply(
        &self,
        batch: &Batch,
    ) -> impl Future<Output = Result<BatchOutcome, StoreError>> + Send {
        self.0.apply(batch)
    }
}

/// A limiter with the cache and one without, over one store and one clock.
struct Pair<S> {
    cached: Limiter<Shared<S>>,
    direct: Limiter<Shared<S>>,
}

impl<S: CounterStore> Pair<S> {
    fn new(yaml: &str, store: S, clock: Arc<ManualClock>) -> Self {
        let store = Arc::new(store);
        let options = LimiterOptions {
            local_cache: 1_000,
            clock: clock.clone(),
            ..LimiterOptions::default()
        };
        let cached = Limiter::with_options(support::rules(yaml), Shared(store.clone()), options);
        let direct = Limiter::with_options(
            support::rules(yaml),
            Shared(store),
            LimiterOptions {
                clock,
                ..LimiterOptions::default()
            },
        );
        Self { cached, direct }
    }

    /// Asks the cached limiter; if the cache answered, asks the store too
    /// (through the other limiter: a rejected request changes no counter)
    /// and returns both answers with both limiters' per-limit metric changes.
    async fn compare(&self, request: &Request) -> Option<Compared> {
        let before = (limit_metrics(&self.cached), limit_metrics(&self.direct));
        let hits = cache_hits(&self.cached);
        let cached = self.cached.decide(request).await;
        if cache_hits(&self.cached) == hits {
            return None;
        }
        let direct = self.direct.decide(request).await;
        let (cached, direct) = match (cached, direct) {
            (Ok(c), Ok(d)) => (c, d),
            other => panic!("a cached answer must be a decision: {other:?}"),
        };
        Some(Compared {
            cached_metrics: delta(&before.0, &limit_metrics(&self.cached)),
            direct_metrics: delta(&before.1, &limit_metrics(&self.direct)),
            cached,
            direct,
        })
    }
}

struct Compared {
    cached: Decision,
    direct: Decision,
    cached_metrics: BTreeMap<String, f64>,
    direct_metrics: BTreeMap<String, f64>,
}

impl Compared {
    /// Field for field: the decision, the wire response in every header
    /// mode, and the per-limit metrics.
    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(&self.cached, &self.direct);
        for mode in [HeaderMode::Off, HeaderMode::Draft03, HeaderMode::Ietf] {
            prop_assert_eq!(to_pb(&self.cached, mode), to_pb(&self.direct, mode));
        }
        prop_assert_eq!(&self.cached_metrics, &self.direct_metrics);
        Ok(())
    }
}

fn cache_hits<S: CounterStore>(limiter: &Limiter<S>) -> u64 {
    metric_lines(limiter)
        .get("sluice_local_cache_hits_total")
        .map_or(0, |v| *v as u64)
}

fn metric_lines<S: CounterStore>(limiter: &Limiter<S>) -> BTreeMap<String, f64> {
    limiter
        .metrics()
        .encode()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(name, value)| Some((name.to_owned(), value.parse().ok()?)))
        .collect()
}

/// The per-limit series (those labelled with a limit).
fn limit_metrics<S: CounterStore>(limiter: &Limiter<S>) -> BTreeMap<String, f64> {
    metric_lines(limiter)
        .into_iter()
        .filter(|(name, _)| name.contains("limit=\""))
        .collect()
}

fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d != 0.0)
        .collect()
}

fn request(domain: &str, descriptors: &[(&str, &str, Option<u64>)], hits_addend: u32) -> Request {
    Request {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|(k, v, hits)| Descriptor {
                entries: vec![Entry::new(*k, *v)],
                limit: None,
                hits_addend: *hits,
                is_negative_hits: false,
            })
            .collect(),
        hits_addend,
    }
}

// ---------------------------------------------------------------------------
// Random states.

#[derive(Clone, Debug)]
struct LimitGen {
    algorithm: u8,
    window: usize,
    buckets: u64,
    requests: u64,
    burst: u64,
}

#[derive(Clone, Debug)]
struct RuleGen {
    limits: Vec<LimitGen>,
    role: u8,
    detailed: bool,
}

#[derive(Clone, Debug)]
struct Step {
    advance_ms: u64,
    descriptors: Vec<(usize, usize, Option<u64>)>,
    hits_addend: u32,
}

#[derive(Clone, Debug)]
struct Case {
    rules: Vec<RuleGen>,
    steps: Vec<Step>,
}

const WINDOWS: [u64; 4] = [600, 1_200, 1_800, 3_000];
/// Descriptor keys: three with generated rules, one unlimited, one unknown.
const KEYS: [&str; 5] = ["k0", "k1", "k2", "free", "none"];

fn limit_gen() -> impl Strategy<Value = LimitGen> {
    (0..4u8, 0..WINDOWS.len(), 1..=6u64, 0..=3u64, 1..=3u64).prop_map(
        |(algorithm, window, buckets, requests, burst)| LimitGen {
            algorithm,
            window,
            buckets,
            requests,
            burst,
        },
    )
}

fn rule_gen() -> impl Strategy<Value = RuleGen> {
    (
        prop::collection::vec(limit_gen(), 1..=2),
        prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
        any::<bool>(),
    )
        .prop_map(|(mut limits, role, detailed)| {
            // Two limits of one rule on distinct windows (distinct counters).
            if limits.len() == 2 && limits[0].window == limits[1].window {
                limits[1].window = (limits[0].window + 1) % WINDOWS.len();
            }
            RuleGen {
                limits,
                role,
                detailed,
            }
        })
}

fn step() -> impl Strategy<Value = Step> {
    // Mostly few descriptors, one value, light weights and short steps, so
    // counters fill and the cache gets to answer often.
    let descriptor = (
        prop_oneof![8 => 0..3usize, 1 => Just(3usize), 1 => Just(4usize)],
        prop_oneof![4 => Just(0usize), 1 => Just(1usize)],
        prop_oneof![3 => Just(None), 3 => (1..=3u64).prop_map(Some), 1 => Just(Some(0))],
    );
    (
        prop_oneof![2 => Just(0u64), 3 => 0..60u64, 2 => 0..400u64, 1 => 0..2_500u64],
        prop_oneof![3 => prop::collection::vec(descriptor.clone(), 1..=1), 1 => prop::collection::vec(descriptor, 2..=3)],
        0..=2u32,
    )
        .prop_map(|(advance_ms, descriptors, hits_addend)| Step {
            advance_ms,
            descriptors,
            hits_addend,
        })
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(rule_gen(), 3),
        prop::collection::vec(step(), 10..60),
    )
        .prop_map(|(rules, steps)| Case { rules, steps })
}

fn yaml(rules: &[RuleGen]) -> String {
    let mut out =
        String::from("domain: c\ndescriptors:\n  - key: free\n    rate_limit: {unlimited: true}\n");
    for (i, rule) in rules.iter().enumerate() {
        out.push_str(&format!("  - key: k{i}\n"));
        match rule.role {
            1 => out.push_str("    shadow_mode: true\n"),
            2 => out.push_str("    quota_mode: true\n"),
            _ => {}
        }
        if rule.detailed {
            out.push_str("    detailed_metric: true\n");
        }
        out.push_str("    rate_limits:\n");
        for (j, l) in rule.limits.iter().enumerate() {
            let window = WINDOWS[l.window];
            let algorithm = match l.algorithm {
                0 => format!("sliding_window, precision: {}ms", window / l.buckets.min(6)),
                1 => "fixed_window".to_owned(),
                2 => format!("token_bucket, burst: {}", l.burst),
                _ => "sliding_log".to_owned(),
            };
            out.push_str(&format!(
                "      - {{unit: {window}ms, requests_per_unit: {}, algorithm: {algorithm}, name: k{i}l{j}}}\n",
                l.requests
            ));
        }
    }
    out
}

fn step_request(step: &Step) -> Request {
    let values = ["a", "b"];
    let descriptors: Vec<(&str, &str, Option<u64>)> = step
        .descriptors
        .iter()
        .map(|&(k, v, hits)| (KEYS[k], values[v], hits))
        .collect();
    request("c", &descriptors, step.hits_addend)
}

/// Runs `case` over `pair`, checking every cached answer; returns how many
/// there were.
async fn run_case<S: CounterStore>(
    pair: &Pair<S>,
    clock: &ManualClock,
    case: &Case,
) -> Result<u64, TestCaseError> {
    let mut compared = 0;
    for (i, step) in case.steps.iter().enumerate() {
        clock.advance(step.advance_ms);
        if let Some(answers) = pair.compare(&step_request(step)).await {
            answers
                .check()
                .map_err(|e| TestCaseError::fail(format!("step {i}: {e}")))?;
            compared += 1;
        }
    }
    Ok(compared)
}

/// Runs the property over `cases` random cases with stores from `store`,
/// and checks that the cache did answer in a good share of them.
fn property<S, F, Fut>(cases: u32, store: F)
where
    S: CounterStore,
    F: Fn(Arc<ManualClock>) -> Fut,
    Fut: Future<Output = S>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let compared = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case(), |case| {
        runtime.block_on(async {
            // Off the hour by a little, so windows do not all start together.
            let clock = Arc::new(ManualClock::new(T0 + 37));
            let pair = Pair::new(
                &yaml(&case.rules),
                store(clock.clone()).await,
                clock.clone(),
            );
            let n = run_case(&pair, &clock, &case).await?;
            compared.fetch_add(n, Ordering::Relaxed);
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let compared = compared.into_inner();
    eprintln!("the cache answered {compared} times in {cases} cases");
    // About two per case on average; a quarter of that is far below what
    // any seed gives, and far above a property that stopped running.
    assert!(
        compared >= u64::from(cases) / 4,
        "the cache answered only {compared} times in {cases} cases: the property barely ran"
    );
}

#[test]
fn cached_answers_equal_the_memory_stores() {
    property(256, |clock| async move {
        MemoryStore::new(&MemoryStoreConfig::default(), clock)
    });
}

#[test]
fn cached_answers_equal_redis_answers() {
    property(64, |clock| async move {
        support::redis_store(
            &shared().url(),
            clock,
            TimeSource::Local,
            Duration::from_secs(5),
        )
        .await
    });
}

#[test]
fn cached_answers_equal_redis_cluster_answers() {
    // Multi-slot requests: rejected parts are refunded, and the cache must
    // still match what the cluster reports afterwards.
    property(32, |clock| async move {
        support::redis_store(
            &shared_cluster().url(),
            clock,
            TimeSource::Local,
            Duration::from_secs(5),
        )
        .await
    });
}

// ---------------------------------------------------------------------------
// Regressions, over Redis.

const RULES: &str = r#"
domain: r
descriptors:
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5, name: per-client}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 5, name: per-route}
  - key: roomy
    rate_limit: {unit: minute, requests_per_unit: 1000, name: roomy}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 5, precision: 6s, name: sliding}
"#;

async fn redis_pair(clock: Arc<ManualClock>) -> Pair<sluice::store::RedisStore> {
    let store = support::redis_store(
        &shared().url(),
        clock.clone(),
        TimeSource::Local,
        Duration::from_secs(5),
    )
    .await;
    Pair::new(RULES, store, clock)
}

/// Fills the counters of `descriptors` (5 hits each) through the cached
/// limiter, so it learns they are full.
async fn fill<S: CounterStore>(pair: &Pair<S>, descriptors: &[(&str, &str, Option<u64>)]) {
    for _ in 0..5 {
        let d = pair
            .cached
            .decide(&request("r", descriptors, 0))
            .await
            .unwrap();
        assert!(d.admitted);
    }
}

#[tokio::test]
async fn two_full_descriptors_are_both_over_limit_from_the_cache() {
    let clock = Arc::new(ManualClock::new(T0 + 30_000));
    let pair = redis_pair(clock.clone()).await;
    let both = [("client", "x", None), ("route", "y", None)];
    fill(&pair, &both).await;
    let answers = pair
        .compare(&request("r", &both, 0))
        .await
        .expect("both counters are known full: the cache answers");
    assert!(answers.cached.statuses.iter().all(|s| s.over_limit));
    answers.check().unwrap();
}

#[tokio::test]
async fn the_cache_reports_the_scripts_sliding_window_reset() {
    // 1-minute window, 6 s buckets, filled 5.8 s into the bucket at T0: the
    // oldest counted bucket leaves the window at T0 + 66 s.
    let clock = Arc::new(ManualClock::new(T0 + 5_800));
    let pair = redis_pair(clock.clone()).await;
    fill(&pair, &[("sliding", "x", None)]).await;
    // Within the second the cache trusts an entry.
    clock.advance(500);
    let answers = pair
        .compare(&request("r", &[("sliding", "x", None)], 0))
        .await
        .expect("the counter is known full: the cache answers");
    // 59.7 s, reported as a refusal reports it: whole seconds, rounded up.
    assert_eq!(answers.cached.statuses[0].reset_ms, Some(60_000));
    answers.check().unwrap();
}

#[tokio::test]
async fn a_descriptor_the_cache_does_not_know_sends_the_request_to_the_store() {
    let clock = Arc::new(ManualClock::new(T0 + 30_000));
    let pair = redis_pair(clock.clone()).await;
    fill(&pair, &[("client", "x", None)]).await;
    let mixed = request(
        "r",
        &[
            ("client", "x", None),
            ("roomy", "y", None),
            ("free", "z", None),
        ],
        0,
    );
    assert!(
        pair.compare(&mixed).await.is_none(),
        "roomy's state is not known locally"
    );
    let answer = pair.cached.decide(&mixed).await.unwrap();
    assert!(!answer.admitted);
    let roomy = &answer.statuses[1];
    assert_eq!(
        (roomy.over_limit, roomy.remaining),
        (false, 1_000),
        "roomy's own status, from the store"
    );
    assert_eq!(roomy.limit.as_ref().unwrap().name.as_deref(), Some("roomy"));
    assert_eq!(answer, pair.direct.decide(&mixed).await.unwrap());
}

#[tokio::test]
async fn cached_rejections_keep_their_detailed_metric_label() {
    let clock = Arc::new(ManualClock::new(T0 + 30_000));
    let pair = redis_pair(clock.clone()).await;
    fill(&pair, &[("client", "hot", None)]).await;
    let answers = pair
        .compare(&request("r", &[("client", "hot", None)], 0))
        .await
        .expect("the counter is known full: the cache answers");
    let over = r#"sluice_over_limit_total{domain="r",limit="per-client",descriptor="client=hot"}"#;
    assert_eq!(
        answers.cached_metrics.get(over),
        Some(&1.0),
        "{:?}",
        answers.cached_metrics
    );
    answers.check().unwrap();
}

/// A refund that reopens a counter the cache holds full clears the cache's
/// entry at once: the next request reaches the store and is admitted. A
/// refund larger than the count leaves the counter empty, not negative.
async fn refund_reopens<S: CounterStore>(name: &str, pair: Pair<S>) {
    let one = [("client", "refunded", None)];
    fill(&pair, &one).await;
    let hits = cache_hits(&pair.cached);
    let full = pair.cached.decide(&request("r", &one, 0)).await.unwrap();
    assert!(!full.admitted, "{name}");
    assert_eq!(
        cache_hits(&pair.cached),
        hits + 1,
        "{name}: answered from the cache"
    );

    let mut refund = request("r", &[("client", "refunded", Some(100))], 0);
    refund.descriptors[0].is_negative_hits = true;
    assert!(
        pair.cached.decide(&refund).await.unwrap().admitted,
        "{name}"
    );
    // Reopened, and empty rather than below: exactly 5 fit again.
    for i in 0..5 {
        let d = pair.cached.decide(&request("r", &one, 0)).await.unwrap();
        assert!(d.admitted, "{name}: request {i} after the refund");
    }
    let d = pair.cached.decide(&request("r", &one, 0)).await.unwrap();
    assert!(!d.admitted, "{name}");
}

#[tokio::test]
async fn a_refund_reopens_a_counter_the_cache_holds_full() {
    let clock = Arc::new(ManualClock::new(T0 + 30_000));
    let memory = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
    refund_reopens("memory", Pair::new(RULES, memory, clock)).await;
    let clock = Arc::new(ManualClock::new(T0 + 30_000));
    refund_reopens("redis", redis_pair(clock).await).await;
}
