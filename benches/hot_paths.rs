//! Criterion benchmarks of the hot paths of one decision, each alone:
//! rules matching, the algorithm core, the in-memory store (alone and under
//! contention from several threads), the protobuf ⇄ domain conversion, and
//! the whole in-memory decision.
//!
//! Run: `cargo bench --bench hot_paths` (add a filter such as `-- store` to
//! run one group). Figures and the machine are in BENCHMARKS.md.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sluice::decision::{Bounds, Limiter};
use sluice::headers::HeaderMode;
use sluice::limiter::algorithm::SlidingWindow;
use sluice::limiter::{
    Algorithm, Counting, IdentityBuilder, LimitSpec, ManualClock, Role, SystemClock, Window,
};
use sluice::proto as pb;
use sluice::request::Entry;
use sluice::rules::{EXAMPLE_RULES, RuleSet, load_paths, parse_domain};
use sluice::service::{from_pb, to_pb};
use sluice::store::{Batch, BatchItem, CounterStore, MemoryStore, MemoryStoreConfig};

fn bench_rules() -> RuleSet {
    load_paths(&[PathBuf::from("examples/bench.yaml")]).expect("examples/bench.yaml is valid")
}

fn sliding(requests: u64, duration_ms: u64, precision_ms: u64) -> LimitSpec {
    LimitSpec {
        requests,
        window: Window {
            duration_ms,
            algorithm: Algorithm::SlidingWindow { precision_ms },
        },
        penalty: None,
    }
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

fn rules_matching(c: &mut Criterion) {
    let domain = parse_domain("examples/rules.yaml", EXAMPLE_RULES.as_bytes()).expect("valid");
    let mut group = c.benchmark_group("rules/find");
    for (name, pairs) in [
        ("key_only", vec![("remote_address", "192.0.2.7")]),
        ("exact_value", vec![("remote_address", "10.0.0.1")]),
        ("nested", vec![("user", "alice"), ("path", "/api/orders")]),
        ("no_match", vec![("unknown", "x")]),
    ] {
        let request = entries(&pairs);
        group.bench_function(name, |b| b.iter(|| domain.find(black_box(&request))));
    }
    group.finish();
}

fn algorithm_core(c: &mut Criterion) {
    let spec = sliding(1_000_000, 60_000, 6_000);
    c.bench_function("algorithm/sliding_window_used_and_add", |b| {
        let mut state = SlidingWindow::default();
        let mut now = 1_700_000_000_000u64;
        b.iter(|| {
            // 1 ms per hit: a new bucket every 6,000 hits, old ones leaving.
            now += 1;
            let used = state.used(&spec, now);
            state.add(&spec, now, 1);
            black_box(used)
        })
    });
}

fn item(i: u64, spec: LimitSpec) -> BatchItem {
    let mut identity = IdentityBuilder::new("bench");
    identity.value("user_id", &i.to_string());
    BatchItem {
        identity: identity.build(),
        limits: vec![spec],
        hits: 1,
        role: Role::Enforce,
        counting: Counting::Admitted,
        refund: false,
    }
}

fn memory_store(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let spec = sliding(1_000_000_000, 60_000, 6_000);
    let batches: Vec<Batch> = (0..10_000)
        .map(|i| Batch {
            items: vec![item(i, spec)],
        })
        .collect();
    let mut group = c.benchmark_group("memory_store");
    let store = MemoryStore::new(&MemoryStoreConfig::default(), Arc::new(SystemClock));
    let mut next = 0;
    group.bench_function("apply_one_thread", |b| {
        b.iter(|| {
            next = (next + 1) % batches.len();
            runtime
                .block_on(store.apply(&batches[next]))
                .expect("memory store")
        })
    });
    // Several threads at once: over 10,000 keys (shards rarely shared) and
    // all on one key (every call on one shard lock).
    for (name, keys) in [("10k_keys", batches.len()), ("one_key", 1)] {
        for threads in [2usize, 4] {
            let id = BenchmarkId::new(format!("apply_contended_{name}"), threads);
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let per_thread = iters / threads as u64;
                    let start = Instant::now();
                    std::thread::scope(|scope| {
                        for t in 0..threads {
                            let (store, batches) = (&store, &batches);
                            scope.spawn(move || {
                                let rt = tokio::runtime::Builder::new_current_thread()
                                    .build()
                                    .expect("runtime");
                                for n in 0..per_thread as usize {
                                    let batch = &batches[(n * threads + t) % keys];
                                    rt.block_on(store.apply(batch)).expect("memory store");
                                }
                            });
                        }
                    });
                    // Wall time for all the calls: per call, the inverse of
                    // the throughput the threads reach together.
                    start.elapsed()
                })
            });
        }
    }
    group.finish();
}

fn wire_request() -> pb::RateLimitRequest {
    pb::RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![pb::RateLimitDescriptor {
            entries: vec![pb::rate_limit_descriptor::Entry {
                key: "user_id".into(),
                value: "12345".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

fn conversion_and_decision(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock);
    let limiter = Limiter::new(bench_rules(), store, Bounds::default());
    let request = from_pb(wire_request()).expect("valid request");
    let decision = runtime
        .block_on(limiter.decide(&request))
        .expect("a decision");

    let mut group = c.benchmark_group("conversion");
    group.bench_function("request_from_pb", |b| {
        b.iter_batched(
            wire_request,
            |wire| from_pb(wire).expect("valid"),
            criterion::BatchSize::SmallInput,
        )
    });
    for (name, mode) in [
        ("response_to_pb", HeaderMode::Off),
        ("response_to_pb_ietf_headers", HeaderMode::Ietf),
    ] {
        group.bench_function(name, |b| b.iter(|| to_pb(black_box(&decision), mode)));
    }
    group.finish();

    // The whole in-memory decision: bounds, match, batch, store, statuses,
    // metrics (the limit is out of reach, so every call is admitted).
    c.bench_function("decide/memory", |b| {
        b.to_async(&runtime).iter(|| limiter.decide(&request))
    });
}

criterion_group! {
    name = hot_paths;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = rules_matching, algorithm_core, memory_store, conversion_and_decision
}
criterion_main!(hot_paths);
