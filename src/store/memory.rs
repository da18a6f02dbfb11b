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

mod shard;

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

use shard::{Cap, Shard};

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
        let mut locked = self.lock(&counters);
        let (checked, admitted) = check(batch, &counters, &mut locked, now);
        let limits = self.count(batch, &counters, &mut locked, &checked, admitted, now);
        // Counting may have grown a sliding window or log past the shard's
        // share of the bytes: make room, keeping this request's counters.
        if batch.items.iter().any(|item| item.counted(admitted)) {
            for shard in &mut locked.guards {
                while shard.bytes > self.per_shard_bytes
                    && shard.evict_one(&counters, now, self, Cap::Bytes)
                {}
            }
        }
        BatchOutcome { admitted, limits }
    }

    /// Locks the shards of `counters` in ascending order (no deadlock).
    fn lock(&self, counters: &[(CounterKey, usize)]) -> Locked<'_> {
        let mut order: Vec<usize> = counters.iter().map(|(_, s)| *s).collect();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&i| self.shards[i].lock()).collect();
        Locked { order, guards }
    }

    /// Pass 2, in two phases (request order within each, as decide.lua
    /// counts): the debits that stand whatever the request decides
    /// (always-counted ones) and the refunds, then the debits counted only
    /// with an admitted request, everything or nothing.
    fn count(
        &self,
        batch: &Batch,
        counters: &[(CounterKey, usize)],
        locked: &mut Locked<'_>,
        checked: &[(u64, u64, bool)],
        admitted: bool,
        now: Millis,
    ) -> Vec<LimitOutcome> {
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
                    let shard = locked.shard(*shard);
                    let (before, pending, over) = checked[index];
                    let counted = item.counted(admitted);
                    let mut refunded = None;
                    let (reset_ms, full_for_ms) = if counted {
                        shard.count(key, limit, item.hits, counters, now, self)
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
        limits
    }
}

/// The shards of one batch's counters, locked: one critical section.
struct Locked<'a> {
    /// Shard indexes, ascending.
    order: Vec<usize>,
    /// One guard per entry of `order`.
    guards: Vec<MutexGuard<'a, Shard>>,
}

impl Locked<'_> {
    /// The locked shard `shard`.
    fn shard(&mut self, shard: usize) -> &mut Shard {
        let i = self
            .order
            .binary_search(&shard)
            .expect("every counter's shard is locked");
        &mut self.guards[i]
    }
}

/// Pass 1: checks every limit as if every earlier limit of this request had
/// been counted (a request may name one counter twice). Per limit: the use
/// before, the hits pending from earlier limits, and whether it is over;
/// then whether the request is admitted.
fn check(
    batch: &Batch,
    counters: &[(CounterKey, usize)],
    locked: &mut Locked<'_>,
    now: Millis,
) -> (Vec<(u64, u64, bool)>, bool) {
    let mut checked: Vec<(u64, u64, bool)> = Vec::with_capacity(counters.len());
    let mut verdicts = Vec::with_capacity(batch.items.len());
    let mut index = 0;
    for item in &batch.items {
        let mut item_over = false;
        for limit in &item.limits {
            let (key, shard) = &counters[index];
            let shard = locked.shard(*shard);
            let pending: u64 = batch_hits_before(batch, counters, index, key);
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
    (checked, admits(verdicts))
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
mod tests;
