//! The in-memory store's own tests: batches, bounds, eviction, sweeping.

use super::*;
use crate::limiter::{Algorithm, Counting, IdentityBuilder, LimitSpec, ManualClock, Role, Window};
use crate::store::BatchItem;

const MINUTE: Window = Window {
    duration_ms: 60_000,
    algorithm: Algorithm::FixedWindow,
};

fn hit(store: &MemoryStore, value: &str, now: Millis) -> BatchOutcome {
    let limit = LimitSpec {
        requests: 1,
        window: MINUTE,
        penalty: None,
    };
    hits(store, value, limit, 1, now)
}

/// `hits` on identity `k=value` limited by `limit`, at `now`.
fn hits(
    store: &MemoryStore,
    value: &str,
    limit: LimitSpec,
    hits: u64,
    now: Millis,
) -> BatchOutcome {
    let mut identity = IdentityBuilder::new("d");
    identity.value("k", value);
    let item = BatchItem {
        identity: identity.build(),
        limits: vec![limit],
        hits,
        role: Role::Enforce,
        counting: Counting::Admitted,
        refund: false,
    };
    store.apply_at(&Batch { items: vec![item] }, now)
}

fn store_of(max_keys: usize, max_bytes: u64, shards: usize) -> MemoryStore {
    MemoryStore::new(
        &MemoryStoreConfig {
            max_keys,
            max_bytes,
            shards,
        },
        Arc::new(ManualClock::new(0)),
    )
}

/// 100 victims fill a limit of 100 an hour; then `flood` new identities
/// make one hit each under the same limit, into a store of 10,000 keys.
/// Returns how many victims the flood freed (their next hit is admitted).
fn victims_freed_by_a_flood(algorithm: Algorithm, flood: usize) -> usize {
    let store = store_of(10_000, u64::MAX, 64);
    let limit = LimitSpec {
        requests: 100,
        window: Window {
            duration_ms: 3_600_000,
            algorithm,
        },
        penalty: None,
    };
    for v in 0..100 {
        assert!(hits(&store, &format!("victim{v}"), limit, 100, 0).admitted);
        assert!(!hits(&store, &format!("victim{v}"), limit, 1, 0).admitted);
    }
    for a in 0..flood {
        hits(&store, &format!("flood{a}"), limit, 1, 1_000);
    }
    (0..100)
        .filter(|v| hits(&store, &format!("victim{v}"), limit, 1, 2_000).admitted)
        .count()
}

#[test]
fn a_flood_of_new_identities_does_not_free_full_counters() {
    for algorithm in [
        Algorithm::SlidingWindow {
            precision_ms: 360_000,
        },
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket { burst: 100 },
    ] {
        let freed = victims_freed_by_a_flood(algorithm, 20_000);
        // The figure BENCHMARKS.md reports (`--nocapture`).
        println!(
            "{}: {freed} of 100 full victims freed by 20,000 new keys",
            algorithm.name()
        );
        assert_eq!(freed, 0, "{algorithm:?}");
    }
}

#[test]
fn the_least_used_counter_is_evicted_first() {
    let store = store(2, 1);
    let limit = LimitSpec {
        requests: 10,
        window: MINUTE,
        penalty: None,
    };
    assert!(hits(&store, "full", limit, 10, 0).admitted);
    assert!(hits(&store, "light", limit, 1, 0).admitted);
    assert!(hits(&store, "new", limit, 1, 0).admitted);
    assert_eq!(store.evicted(), 1);
    assert!(!hits(&store, "full", limit, 1, 0).admitted, "full was kept");
}

#[test]
fn counters_are_bounded_in_bytes_not_only_in_number() {
    // Sliding logs of 1,000 hits each hold about 16 KiB; 64 KiB fit four.
    let max_bytes = 64 * 1024;
    let store = store_of(1_000, max_bytes, 1);
    let limit = LimitSpec {
        requests: 10_000,
        window: Window {
            duration_ms: 60_000,
            algorithm: Algorithm::SlidingLog,
        },
        penalty: None,
    };
    for key in 0..20 {
        for t in 0..1_000 {
            assert!(hits(&store, &key.to_string(), limit, 1, t).admitted);
            assert!(store.bytes() as u64 <= max_bytes, "{} bytes", store.bytes());
        }
    }
    assert!(store.len() <= 4, "{} counters", store.len());
    assert!(store.evicted() >= 16);
    // The newest log is whole.
    assert!(!hits(&store, "19", limit, 9_001, 1_000).admitted);
    assert!(hits(&store, "19", limit, 9_000, 1_000).admitted);
}

/// The metrics show the caps, the occupancy as of the last sweep, and
/// each live eviction under the cap that forced it.
#[test]
fn caps_occupancy_and_evictions_by_cap_are_shown_in_the_metrics() {
    let metrics = crate::telemetry::metrics::Metrics::default();
    let by_keys = store(2, 1);
    by_keys.show_in(metrics.memory_store());
    let shown = metrics.memory_store();
    assert_eq!((shown.max_keys.get(), shown.keys.get()), (2, 0));
    for key in ["a", "b", "c"] {
        hit(&by_keys, key, 0);
    }
    by_keys.sweep(0);
    assert_eq!(shown.keys.get(), 2);
    assert_eq!(shown.bytes.get() as usize, by_keys.bytes());
    assert_eq!(shown.evicted_at_max_keys.get(), 1);
    assert_eq!(shown.evicted_at_max_bytes.get(), 0);

    let metrics = crate::telemetry::metrics::Metrics::default();
    let by_bytes = store_of(1_000, 2 * COUNTER_OVERHEAD_BYTES as u64 + 100, 1);
    by_bytes.show_in(metrics.memory_store());
    for key in ["a", "b", "c"] {
        hit(&by_bytes, key, 0);
    }
    let shown = metrics.memory_store();
    assert!(shown.evicted_at_max_bytes.get() >= 1);
    assert_eq!(shown.evicted_at_max_keys.get(), 0);
    let text = metrics.encode();
    assert!(
        text.contains(r#"sluice_memory_store_evictions_total{reason="max_bytes"} "#),
        "{text}"
    );
}

#[test]
fn bytes_follow_growth_and_are_returned_by_the_sweep() {
    let store = store(100, 4);
    let limit = LimitSpec {
        requests: 100,
        window: Window {
            duration_ms: 60_000,
            algorithm: Algorithm::SlidingLog,
        },
        penalty: None,
    };
    hits(&store, "a", limit, 1, 0);
    let one = store.bytes();
    assert!(one >= COUNTER_OVERHEAD_BYTES, "{one}");
    for t in 1..100 {
        hits(&store, "a", limit, 1, t);
    }
    assert!(store.bytes() >= one + 90 * 16, "{} bytes", store.bytes());
    store.sweep(60_099);
    assert_eq!((store.len(), store.bytes()), (0, 0));
}

fn store(max_keys: usize, shards: usize) -> MemoryStore {
    MemoryStore::new(
        &MemoryStoreConfig {
            max_keys,
            shards,
            ..MemoryStoreConfig::default()
        },
        Arc::new(ManualClock::new(0)),
    )
}

#[test]
fn a_flood_of_unique_values_never_grows_past_the_cap() {
    let store = store(40, 4);
    for i in 0..10_000 {
        assert!(hit(&store, &i.to_string(), 1_000).admitted);
        assert!(store.len() <= 40);
    }
    assert!(store.evicted() > 0, "live counters had to be evicted");
}

#[test]
fn expired_counters_are_evicted_before_live_ones() {
    let store = store(4, 1);
    for i in 0..4 {
        hit(&store, &format!("old{i}"), 0);
    }
    // A minute later the old counters count nothing: replacing them loses nothing.
    for i in 0..4 {
        hit(&store, &format!("new{i}"), 60_000);
    }
    assert_eq!(store.evicted(), 0);
}

#[test]
fn sweep_drops_only_expired_counters() {
    let store = store(100, 4);
    hit(&store, "a", 0);
    hit(&store, "b", 60_000);
    store.sweep(60_000);
    assert_eq!(store.len(), 1);
    assert!(
        !hit(&store, "b", 60_000).admitted,
        "b's counter survived the sweep"
    );
}

#[test]
fn a_rejected_request_creates_no_counter() {
    let store = store(100, 4);
    let mut identity = IdentityBuilder::new("d");
    identity.value("k", "v");
    let item = BatchItem {
        identity: identity.build(),
        limits: vec![LimitSpec {
            requests: 0,
            window: MINUTE,
            penalty: None,
        }],
        hits: 1,
        role: Role::Enforce,
        counting: Counting::Admitted,
        refund: false,
    };
    assert!(!store.apply_at(&Batch { items: vec![item] }, 0).admitted);
    assert!(store.is_empty());
}
