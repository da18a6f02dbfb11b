//! The embedded in-memory store: the same algorithms as Redis, on one node.
//!
//! Counters live in shards (a mutex and an `IndexMap` each) chosen by key
//! hash, so the cores work in parallel. A request locks the shards of all its
//! counters in ascending order (no deadlock), checks, applies, and unlocks:
//! one critical section, so concurrent requests can never over-admit.
//!
//! Memory is bounded: at most `max_keys` counters. When a shard is full, a new
//! counter evicts the sampled counter that expires soonest (an expired one when
//! there is one, which loses nothing). Forgetting a live counter can only admit
//! more, never reject more. A periodic [`MemoryStore::sweep`] drops expired
//! counters so idle memory is returned.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use foldhash::fast::RandomState;
use indexmap::IndexMap;
use parking_lot::{Mutex, MutexGuard};

use super::{Batch, BatchOutcome, CounterStore, LimitOutcome, StoreError, counted_used};
use crate::limiter::{Clock, CounterKey, LimitSpec, Millis, State, admits};

/// Counters sampled when a full shard must make room.
const EVICTION_SAMPLES: usize = 8;

/// Settings of the memory store.
#[derive(Clone, Debug)]
pub struct MemoryStoreConfig {
    /// Most counters kept; at the cap the soonest-expiring are evicted.
    pub max_keys: usize,
    /// Number of independently locked shards (rounded up to a power of two).
    pub shards: usize,
}

impl Default for MemoryStoreConfig {
    fn default() -> Self {
        Self {
            max_keys: 1_000_000,
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
    /// Live counters evicted to stay under the cap, for metrics; atomic because
    /// shards are locked independently.
    evicted: AtomicU64,
}

struct Shard {
    /// foldhash, randomly seeded per process: several times cheaper than
    /// SipHash on these short keys, and still not predictable by a client.
    counters: IndexMap<CounterKey, State, RandomState>,
    /// xorshift state for eviction sampling; per shard so it needs no extra lock.
    rng: u64,
}

impl MemoryStore {
    /// A store reading time from `clock`.
    pub fn new(config: &MemoryStoreConfig, clock: Arc<dyn Clock>) -> Self {
        let shards = config.shards.max(1).next_power_of_two();
        let per_shard = config.max_keys.div_ceil(shards).max(1);
        Self {
            shards: (0..shards)
                .map(|i| {
                    Mutex::new(Shard {
                        counters: IndexMap::default(),
                        rng: 0x9E37_79B9_7F4A_7C15 ^ i as u64,
                    })
                })
                .collect(),
            clock,
            hasher: RandomState::default(),
            per_shard,
            evicted: AtomicU64::new(0),
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

    /// Live counters evicted so far because the store was full.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Drops every counter that counts nothing any more at `now`.
    pub fn sweep(&self, now: Millis) {
        for shard in &*self.shards {
            shard
                .lock()
                .counters
                .retain(|key, state| state.expires_at(&key.window) > now);
        }
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
                // Saturated, a sum past u64 fits no limit: never wrapped.
                let wanted = pending.saturating_add(item.hits);
                let (used, fits) = match shard.counters.get_mut(key) {
                    Some(state) => {
                        let used = state.used(limit, now);
                        (used, state.fits(limit, now, used, wanted))
                    }
                    None => (0, State::new(limit).fits(limit, now, 0, wanted)),
                };
                let over = !fits;
                item_over |= over;
                checked.push((used, pending, over));
                index += 1;
            }
            verdicts.push((item.role, item_over));
        }
        let admitted = admits(verdicts);

        // Pass 2: count everything, or nothing.
        let mut limits = Vec::with_capacity(counters.len());
        let mut index = 0;
        for item in &batch.items {
            for limit in &item.limits {
                let (key, shard) = &counters[index];
                let shard = &mut *guards[guard(*shard)];
                let (before, pending, over) = checked[index];
                let (reset_ms, full_for_ms) = if admitted && item.hits > 0 {
                    let state = shard.entry(key, limit, &counters, now, self);
                    state.add(limit, now, item.hits);
                    (state.reset_ms(limit, now), state.full_for(limit, now))
                } else {
                    let fresh;
                    let state = match shard.counters.get(key) {
                        Some(state) => state,
                        None => {
                            fresh = State::new(limit);
                            &fresh
                        }
                    };
                    (state.reset_ms(limit, now), state.full_for(limit, now))
                };
                let used = counted_used(admitted, before, pending, item.hits);
                limits.push(LimitOutcome {
                    used,
                    over,
                    reset_ms,
                    full_for_ms,
                });
                index += 1;
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
            if counters[i].0 == *key {
                sum = sum.saturating_add(item.hits);
            }
            i += 1;
        }
    }
    sum
}

impl Shard {
    /// The state of `key`, created if missing; a full shard first evicts the
    /// sampled counter that expires soonest, never one of this batch's.
    fn entry(
        &mut self,
        key: &CounterKey,
        limit: &LimitSpec,
        batch: &[(CounterKey, usize)],
        now: Millis,
        store: &MemoryStore,
    ) -> &mut State {
        if !self.counters.contains_key(key) && self.counters.len() >= store.per_shard {
            self.evict_one(batch, now, store);
        }
        self.counters
            .entry(key.clone())
            .or_insert_with(|| State::new(limit))
    }

    fn evict_one(&mut self, batch: &[(CounterKey, usize)], now: Millis, store: &MemoryStore) {
        let len = self.counters.len();
        let mut victim: Option<(usize, Millis)> = None;
        for _ in 0..EVICTION_SAMPLES.min(len) {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let i = (self.rng % len as u64) as usize;
            let (key, state) = self.counters.get_index(i).expect("index below len");
            if batch.iter().any(|(k, _)| k == key) {
                continue;
            }
            let expires = state.expires_at(&key.window);
            if victim.is_none_or(|(_, best)| expires < best) {
                victim = Some((i, expires));
            }
        }
        if let Some((i, expires)) = victim {
            self.counters.swap_remove_index(i);
            if expires > now {
                store.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl CounterStore for MemoryStore {
    async fn apply(&self, batch: &Batch) -> Result<BatchOutcome, StoreError> {
        Ok(self.apply_at(batch, self.clock.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, IdentityBuilder, LimitSpec, ManualClock, Role, Window};
    use crate::store::BatchItem;

    const MINUTE: Window = Window {
        duration_ms: 60_000,
        algorithm: Algorithm::FixedWindow,
    };

    fn hit(store: &MemoryStore, value: &str, now: Millis) -> BatchOutcome {
        let mut identity = IdentityBuilder::new("d");
        identity.value("k", value);
        let item = BatchItem {
            identity: identity.build(),
            limits: vec![LimitSpec {
                requests: 1,
                window: MINUTE,
            }],
            hits: 1,
            role: Role::Enforce,
        };
        store.apply_at(&Batch { items: vec![item] }, now)
    }

    fn store(max_keys: usize, shards: usize) -> MemoryStore {
        MemoryStore::new(
            &MemoryStoreConfig { max_keys, shards },
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
        };
        assert!(!store.apply_at(&Batch { items: vec![item] }, 0).admitted);
        assert!(store.is_empty());
    }
}
