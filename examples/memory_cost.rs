//! What the in-memory store's counters cost in resident memory, against what
//! the store accounts for them (`MemoryStore::bytes`, the unit of
//! `memory_max_bytes`). The measurements behind BENCHMARKS.md's "Memory of the
//! in-memory store" and the manual's figures (docs/src/redis.md).
//!
//! ```sh
//! cargo run --release --example memory_cost -- SCENARIO [COUNTERS]
//! ```
//!
//! One scenario per process (freed memory is not returned to the system, so
//! a second scenario in the same process would measure the first's leftovers):
//!
//! - `small`: COUNTERS one-minute sliding windows (the default 6 s buckets),
//!   one hit each, under caps that never evict.
//! - `log`: COUNTERS sliding logs of 10,000 hits each (the largest allowed).
//! - `buckets`: COUNTERS one-hour sliding windows of 1 s buckets (3,600, the
//!   most allowed), a hit in every bucket.
//! - `default-small` / `default-log`: as `small` / `log`, under the default caps
//!   (`memory_max_keys`, `memory_max_bytes`), to show where they stop growth.
//!
//! Identities are built as the service builds them (domain `bench`, entry
//! `user_id=<n>`), and the allocator is the binary's (mimalloc).

use std::sync::Arc;

use sluice::limiter::{Algorithm, IdentityBuilder, LimitSpec, ManualClock, Role, Window};
use sluice::store::{Batch, BatchItem, MemoryStore, MemoryStoreConfig};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `VmRSS` of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

fn batch(n: usize, limit: LimitSpec, hits: u64) -> Batch {
    let mut identity = IdentityBuilder::new("bench");
    identity.value("user_id", &n.to_string());
    Batch {
        items: vec![BatchItem {
            identity: identity.build(),
            limits: vec![limit],
            hits,
            role: Role::Enforce,
            counting: sluice::limiter::Counting::Admitted,
            refund: false,
        }],
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let scenario = args.next().unwrap_or_else(|| "small".into());
    let counters: usize = args
        .next()
        .map_or(250_000, |n| n.parse().expect("COUNTERS"));
    let unbounded = MemoryStoreConfig {
        max_keys: usize::MAX,
        max_bytes: u64::MAX,
        ..MemoryStoreConfig::default()
    };
    let (config, shape) = match scenario.as_str() {
        "small" => (unbounded, "small"),
        "log" => (unbounded, "log"),
        "buckets" => (unbounded, "buckets"),
        "default-small" => (MemoryStoreConfig::default(), "small"),
        "default-log" => (MemoryStoreConfig::default(), "log"),
        other => panic!("unknown scenario {other}"),
    };
    let store = MemoryStore::new(&config, Arc::new(ManualClock::new(0)));
    let minute = |algorithm| LimitSpec {
        requests: 10_000,
        window: Window {
            duration_ms: 60_000,
            algorithm,
        },
        penalty: None,
    };
    let before = rss();
    for n in 0..counters {
        match shape {
            "small" => {
                let limit = minute(Algorithm::SlidingWindow {
                    precision_ms: 6_000,
                });
                store.apply_at(&batch(n, limit, 1), 1_000);
            }
            "log" => {
                let limit = minute(Algorithm::SlidingLog);
                for t in 0..10_000 {
                    store.apply_at(&batch(n, limit, 1), t);
                }
            }
            _ => {
                let limit = LimitSpec {
                    requests: 10_000,
                    window: Window {
                        duration_ms: 3_600_000,
                        algorithm: Algorithm::SlidingWindow {
                            precision_ms: 1_000,
                        },
                    },
                    penalty: None,
                };
                for t in 0..3_600 {
                    store.apply_at(&batch(n, limit, 1), t * 1_000);
                }
            }
        }
    }
    let grown = rss().saturating_sub(before);
    let kept = store.len().max(1);
    println!(
        "{scenario}: {counters} counters made, {} kept ({} evicted); RSS +{:.1} MiB = {} B per kept counter; accounted {:.1} MiB = {} B per counter",
        store.len(),
        store.evicted(),
        grown as f64 / 1048576.0,
        grown / kept as u64,
        store.bytes() as f64 / 1048576.0,
        store.bytes() / kept,
    );
}
