//! The embedded in-memory store: the same algorithms as Redis, on one node.
//!
//! Counters live in shards (a mutex and an `IndexMap` each) chosen by key
//! hash, so the cores work in parallel. A request locks the shards of all its
//! counters in ascending order (no deadlock), checks, applies, and unlocks:
//! one critical section, so concurrent requests can never over-admit.
//!
//! Memory is bounded twice: at most `max_keys` counters, and at most
//! `max_bytes` of counter memory as [`counter_bytes`] accounts it (a sliding
//! log of 10,000 hits holds about 256 KiB, a one-minute counter a few hundred
//! bytes, so a count alone bounds nothing). Each shard holds its share of both.
//! When a shard is over either, it evicts the least valuable of a few sampled
//! counters: one that counts nothing any more first (which loses nothing),
//! then the one whose limit is least used, then the one that expires soonest;
//! never a counter of the request being applied. Forgetting a live counter
//! can only admit more, never reject more, and forgetting the least used
//! admits the least: a flood of new identities, each counted once, evicts
//! other new identities, not the full counters of the clients it wants to
//! free (BENCHMARKS.md measures it). A periodic [`MemoryStore::sweep`] drops
//! expired counters so idle memory is returned.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use foldhash::fast::RandomState;
use indexmap::IndexMap;
use parking_lot::{Mutex, MutexGuard};

use super::{Batch, BatchOutcome, CounterStore, LimitOutcome, StoreError, counted_used};
use crate::limiter::{Clock, CounterKey, Identity, LimitSpec, Millis, State, Window, admits};
use crate::telemetry::metrics::MemoryStoreMetrics;

/// Counters sampled when a full shard must make room.
const EVICTION_SAMPLES: usize = 8;

/// The default of `memory_max_keys`: the most counters kept.
pub const DEFAULT_MAX_KEYS: usize = 250_000;

/// The default of `memory_max_bytes`: 128 MiB of counters.
pub const DEFAULT_MAX_BYTES: u64 = 128 * 1024 * 1024;

/// What a counter costs besides its identity's bytes and its state's heap:
/// its map entry (hash, key, state), its slot in the index table and the
/// allocators' rounding, as measured (BENCHMARKS.md, "Memory of the
/// in-memory store").
pub const COUNTER_OVERHEAD_BYTES: usize = 300;

/// The bytes `key` and `state` are accounted for.
pub fn counter_bytes(key: &CounterKey, state: &State) -> usize {
    COUNTER_OVERHEAD_BYTES + key.identity.as_bytes().len() + state.heap_bytes()
}

/// Settings of the memory store.
#[derive(Clone, Debug)]
pub struct MemoryStoreConfig {
    /// Most counters kept; at the cap the least valuable are evicted.
    pub max_keys: usize,
    /// Most bytes of counters kept, as [`counter_bytes`] accounts them.
    pub max_bytes: u64,
    /// Number of independently locked shards (rounded up to a power of two).
    pub shards: usize,
}

impl Default for MemoryStoreConfig {
    fn default() -> Self {
        Self {
            max_keys: DEFAULT_MAX_KEYS,
            max_bytes: DEFAULT_MAX_BYTES,
            shards: 64,
        }
    }
}

/// The in-memory counter store.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// Shared with tests (a manual clock) or the system clock.
    clock: Arc<dyn Clock>,
    hasher: RandomState,
    per_shard: usize,
    per_shard_bytes: usize,
    /// Live counters evicted to stay under the caps, for metrics; atomic
    /// because shards are locked independently.
    evicted: AtomicU64,
    /// Where occupancy and evictions are also shown, once told.
    metrics: OnceLock<MemoryStoreMetrics>,
}

/// Which cap made a shard evict a counter.
#[derive(Clone, Copy)]
enum Cap {
    Keys,
    Bytes,
}

/// One counter's state and what eviction needs to rank it.
struct Counter {
    state: State,
    /// The limit's `requests` when the counter was last counted: with the
    /// key's window, the limit to measure how full the counter is.
    requests: u64,
    /// What [`counter_bytes`] gave when the state last grew.
    bytes: usize,
}

struct Shard {
    /// foldhash, randomly seeded per process: several times cheaper than
    /// SipHash on these short keys, and still not predictable by a client.
    counters: IndexMap<CounterKey, Counter, RandomState>,
    /// Sum of the counters' `bytes`.
    bytes: usize,
    /// xorshift state for eviction sampling; per shard so it needs no extra lock.
    rng: u64,
}

impl MemoryStore {
    /// A store reading time from `clock`.
    pub fn new(config: &MemoryStoreConfig, clock: Arc<dyn Clock>) -> Self {
        let shards = config.shards.max(1).next_power_of_two();
        let per_shard = config.max_keys.div_ceil(shards).max(1);
        let per_shard_bytes =
            usize::try_from(config.max_bytes / shards as u64).unwrap_or(usize::MAX);
        Self {
            shards: (0..shards)
                .map(|i| {
                    Mutex::new(Shard {
                        counters: IndexMap::default(),
                        bytes: 0,
                        rng: 0x9E37_79B9_7F4A_7C15 ^ i as u64,
                    })
                })
                .collect(),
            clock,
            hasher: RandomState::default(),
            per_shard,
            per_shard_bytes: per_shard_bytes.max(1),
            evicted: AtomicU64::new(0),
            metrics: OnceLock::new(),
        }
    }

    /// Shows the store's caps, occupancy (as of the last [`sweep`]) and
    /// evictions in `metrics`. Only the first set given is kept.
    ///
    /// [`sweep`]: MemoryStore::sweep
    pub fn show_in(&self, metrics: MemoryStoreMetrics) {
        let shards = self.shards.len();
        let total = |per_shard: usize| i64::try_from(per_shard * shards).unwrap_or(i64::MAX);
        metrics.max_keys.set(total(self.per_shard));
        metrics.max_bytes.set(total(self.per_shard_bytes));
        let _ = self.metrics.set(metrics);
        self.show_occupancy();
    }

    fn show_occupancy(&self) {
        if let Some(metrics) = self.metrics.get() {
            let (mut keys, mut bytes) = (0, 0);
            for shard in &*self.shards {
                let shard = shard.lock();
                keys += shard.counters.len();
                bytes += shard.bytes;
            }
            metrics.keys.set(i64::try_from(keys).unwrap_or(i64::MAX));
            metrics.bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// Counters currently held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().counters.len()).sum()
    }

    /// Whether no counter is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the counters currently held, as [`counter_bytes`] accounts them.
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().bytes).sum()
    }

    /// Live counters evicted so far because the store was full.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Drops every counter that counts nothing any more at `now`.
    pub fn sweep(&self, now: Millis) {
        for shard in &*self.shards {
            let shard = &mut *shard.lock();
            let mut freed = 0;
            shard.counters.retain(|key, counter| {
                let live = counter.state.expires_at(&key.window) > now;
                if !live {
                    freed += counter.bytes;
                }
                live
            });
            shard.bytes -= freed;
        }
        self.show_occupancy();
    }

    /// Drops expired counters at the store clock's current time.
    pub fn sweep_now(&self) {
        self.sweep(self.clock.now());
    }

    fn shard_of(&self, key: &CounterKey) -> usize {
        (self.hasher.hash_one(key) as usize) & (self.shards.len() - 1)
    }

    /// Checks and applies `batch` at `now` in one critical section.
    pub fn apply_at(&self, batch: &Batch, now: Millis) -> BatchOutcome {
        let counters: Vec<(CounterKey, usize)> = batch
            .items
            .iter()
            .flat_map(|item| {
                item.limits.iter().map(|l| CounterKey {
                    identity: item.identity.clone(),
                    window: l.window,
                })
            })
            .map(|key| {
                let shard = self.shard_of(&key);
                (key, shard)
            })
            .collect();
        let mut order: Vec<usize> = counters.iter().map(|(_, s)| *s).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            order.iter().map(|&i| self.shards[i].lock()).collect();
        let guard = |shard: usize| {
            order
                .binary_search(&shard)
                .expect("every counter's shard is locked")
        };

        // Pass 1: check every limit as if every earlier limit of this request
        // had been counted (a request may name one counter twice).
        let mut checked: Vec<(u64, u64, bool)> = Vec::with_capacity(counters.len());
        let mut verdicts = Vec::with_capacity(batch.items.len());
        let mut index = 0;
        for item in &batch.items {
            let mut item_over = false;
            for limit in &item.limits {
                let (key, shard) = &counters[index];
                let shard = &mut guards[guard(*shard)];
                let pending: u64 = batch_hits_before(batch, &counters, index, key);
                // Saturated, a sum past u64 fits no limit: never wrapped. A
                // refund always fits (it only gives back).
                let wanted = if item.refund {
                    0
                } else {
                    pending.saturating_add(item.hits)
                };
                let (used, fits) = match shard.counters.get_mut(key) {
                    Some(counter) => {
                        let used = counter.state.used(limit, now);
                        (used, counter.state.fits(limit, now, used, wanted))
                    }
                    None => (0, State::new(limit).fits(limit, now, 0, wanted)),
                };
                // A refund only gives back: never over.
                let over = !fits && !item.refund;
                item_over |= over;
                checked.push((used, pending, over));
                index += 1;
            }
            if !item.refund {
                verdicts.push((item.role, item_over));
            }
        }
        let admitted = admits(verdicts);

        // Pass 2, in two phases (request order within each, as decide.lua
        // counts): the debits that stand whatever the request decides
        // (always-counted ones) and the refunds, then the debits counted
        // only with an admitted request, everything or nothing.
        let mut limits = vec![
            LimitOutcome {
                used: 0,
                over: false,
                reset_ms: 0,
                full_for_ms: 0,
            };
            counters.len()
        ];
        for phase in [true, false] {
            let mut index = 0;
            for item in &batch.items {
                if item.stands() != phase {
                    index += item.limits.len();
                    continue;
                }
                for limit in &item.limits {
                    let (key, shard) = &counters[index];
                    let shard = &mut *guards[guard(*shard)];
                    let (before, pending, over) = checked[index];
                    let counted = item.counted(admitted);
                    let mut refunded = None;
                    let (reset_ms, full_for_ms) = if counted {
                        shard.count(key, limit, item.hits, &counters, now, self)
                    } else if item.refund {
                        let (used, reset, full) = shard.refund(key, limit, item.hits, now);
                        refunded = Some(used);
                        (reset, full)
                    } else {
                        let fresh;
                        let state = match shard.counters.get(key) {
                            Some(counter) => &counter.state,
                            None => {
                                fresh = State::new(limit);
                                &fresh
                            }
                        };
                        (state.reset_ms(limit, now), state.full_for(limit, now))
                    };
                    let used = refunded.unwrap_or_else(|| {
                        counted_used(item.reports_counted(admitted), before, pending, item.hits)
                    });
                    limits[index] = LimitOutcome {
                        used,
                        over,
                        reset_ms,
                        full_for_ms,
                    };
                    index += 1;
                }
            }
        }
        // Counting may have grown a sliding window or log past the shard's
        // share of the bytes: make room, keeping this request's counters.
        if batch.items.iter().any(|item| item.counted(admitted)) {
            for shard in &mut guards {
                while shard.bytes > self.per_shard_bytes
                    && shard.evict_one(&counters, now, self, Cap::Bytes)
                {}
            }
        }
        BatchOutcome { admitted, limits }
    }
}

/// Hits that earlier limits of the same batch add to the same counter.
fn batch_hits_before(
    batch: &Batch,
    counters: &[(CounterKey, usize)],
    index: usize,
    key: &CounterKey,
) -> u64 {
    let mut sum = 0;
    let mut i = 0;
    for item in &batch.items {
        for _ in &item.limits {
            if i >= index {
                return sum;
            }
            if counters[i].0 == *key && !item.refund {
                sum = sum.saturating_add(item.hits);
            }
            i += 1;
        }
    }
    sum
}

impl Shard {
    /// Counts `hits` on `key` (created if missing, after making room when the
    /// shard holds its share of counters) and returns its `reset_ms` and
    /// `full_for` after the hits.
    fn count(
        &mut self,
        key: &CounterKey,
        limit: &LimitSpec,
        hits: u64,
        batch: &[(CounterKey, usize)],
        now: Millis,
        store: &MemoryStore,
    ) -> (u64, u64) {
        if !self.counters.contains_key(key) {
            if self.counters.len() >= store.per_shard {
                self.evict_one(batch, now, store, Cap::Keys);
            }
            let state = State::new(limit);
            let bytes = counter_bytes(key, &state);
            self.bytes += bytes;
            self.counters.insert(
                key.clone(),
                Counter {
                    state,
                    requests: limit.requests,
                    bytes,
                },
            );
        }
        let Some(counter) = self.counters.get_mut(key) else {
            return (0, 0);
        };
        counter.requests = limit.requests;
        counter.state.add(limit, now, hits);
        let bytes = counter_bytes(key, &counter.state);
        let before = std::mem::replace(&mut counter.bytes, bytes);
        let answer = (
            counter.state.reset_ms(limit, now),
            counter.state.full_for(limit, now),
        );
        self.bytes = self.bytes - before + bytes;
        answer
    }

    /// Gives `hits` back to `key` (never below empty; a missing counter has
    /// nothing to give back) and returns its `used`, `reset_ms` and
    /// `full_for` after.
    fn refund(
        &mut self,
        key: &CounterKey,
        limit: &LimitSpec,
        hits: u64,
        now: Millis,
    ) -> (u64, u64, u64) {
        let Some(counter) = self.counters.get_mut(key) else {
            let fresh = State::new(limit);
            return (0, fresh.reset_ms(limit, now), fresh.full_for(limit, now));
        };
        counter.state.refund(limit, now, hits);
        let used = counter.state.used(limit, now);
        let bytes = counter_bytes(key, &counter.state);
        let before = std::mem::replace(&mut counter.bytes, bytes);
        self.bytes = self.bytes - before + bytes;
        (
            used,
            counter.state.reset_ms(limit, now),
            counter.state.full_for(limit, now),
        )
    }

    /// Removes the least valuable of a few sampled counters, never one of
    /// `batch`: a counter that counts nothing at `now` first, then the one
    /// whose limit is least used, then the one that expires soonest. Returns
    /// whether one was removed.
    fn evict_one(
        &mut self,
        batch: &[(CounterKey, usize)],
        now: Millis,
        store: &MemoryStore,
        cap: Cap,
    ) -> bool {
        let len = self.counters.len();
        // (index, share of the limit in use, expiry)
        let mut victim: Option<(usize, f64, Millis)> = None;
        for _ in 0..EVICTION_SAMPLES.min(len) {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let i = (self.rng % len as u64) as usize;
            let Some((key, counter)) = self.counters.get_index_mut(i) else {
                continue;
            };
            if batch.iter().any(|(k, _)| k == key) {
                continue;
            }
            let expires = counter.state.expires_at(&key.window);
            let share = if expires <= now {
                0.0
            } else {
                let spec = LimitSpec {
                    requests: counter.requests,
                    window: key.window,
                };
                // A limit of 0 counts nothing: nothing is lost by forgetting it.
                let capacity = spec.capacity().max(1);
                counter.state.used(&spec, now) as f64 / capacity as f64
            };
            if victim.is_none_or(|(_, s, e)| (share, expires) < (s, e)) {
                victim = Some((i, share, expires));
            }
        }
        let Some((i, _, expires)) = victim else {
            return false;
        };
        if let Some((_, counter)) = self.counters.swap_remove_index(i) {
            self.bytes -= counter.bytes;
        }
        if expires > now {
            store.evicted.fetch_add(1, Ordering::Relaxed);
            if let Some(metrics) = store.metrics.get() {
                match cap {
                    Cap::Keys => metrics.evicted_at_max_keys.inc(),
                    Cap::Bytes => metrics.evicted_at_max_bytes.inc(),
                };
            }
        }
        true
    }
}

impl CounterStore for MemoryStore {
    async fn apply(&self, batch: &Batch) -> Result<BatchOutcome, StoreError> {
        Ok(self.apply_at(batch, self.clock.now()))
    }

    async fn reset(&self, identity: &Identity, windows: &[Window]) -> Result<(), StoreError> {
        self.forget(identity, windows);
        Ok(())
    }
}

impl MemoryStore {
    /// Drops the counters of `identity` under `windows`.
    pub fn forget(&self, identity: &Identity, windows: &[Window]) {
        for window in windows {
            let key = CounterKey {
                identity: identity.clone(),
                window: *window,
            };
            let mut shard = self.shards[self.shard_of(&key)].lock();
            if let Some(counter) = shard.counters.swap_remove(&key) {
                shard.bytes -= counter.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{
        Algorithm, Counting, IdentityBuilder, LimitSpec, ManualClock, Role, Window,
    };
    use crate::store::BatchItem;

    const MINUTE: Window = Window {
        duration_ms: 60_000,
        algorithm: Algorithm::FixedWindow,
    };

    fn hit(store: &MemoryStore, value: &str, now: Millis) -> BatchOutcome {
        let limit = LimitSpec {
            requests: 1,
            window: MINUTE,
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
            }],
            hits: 1,
            role: Role::Enforce,
            counting: Counting::Admitted,
            refund: false,
        };
        assert!(!store.apply_at(&Batch { items: vec![item] }, 0).admitted);
        assert!(store.is_empty());
    }
}
