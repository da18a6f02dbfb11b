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
use smallvec::{SmallVec, smallvec};

use super::{
    Batch, BatchOutcome, CounterStore, LimitOutcome, Override, OverrideBook, OverrideEntry,
    OverrideError, OverrideSet, StoreError, counted_used,
};
use crate::limiter::algorithm::FixedWindow;
use crate::limiter::{Block, Clock, CounterKey, Identity, LimitSpec, Millis, State, Window, batch};
use crate::telemetry::metrics::MemoryStoreMetrics;

mod shard;

/// One request's items, limits, counters, states or locked shards, inline up
/// to a request of four limits (a heap allocation beyond): the store keeps
/// them only while it applies the request, and a request's usual size costs
/// no allocation.
type Few<T> = SmallVec<[T; 4]>;

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
    /// Limits set at run time (this replica's only).
    overrides: OverrideBook,
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
            overrides: OverrideBook::default(),
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
                let live = counter.expires_at(&key.window) > now;
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

    /// Checks and applies `batch` at `now` in one critical section: the
    /// counters' states are taken out of their locked shards, evaluated by
    /// [`batch::evaluate_into`] (the decision the Redis script mirrors) and
    /// put back. Up to four limits, only the outcome is allocated.
    pub fn apply_at(&self, batch: &Batch, now: Millis) -> BatchOutcome {
        let plan = Plan::new(self, batch);
        let mut locked = self.lock(&plan.counters);
        let mut taken = locked.take(&plan.counters);
        let mut reports: Few<batch::Report> =
            smallvec![batch::Report::default(); plan.limits.len()];
        let admitted = batch::evaluate_into(
            &plan.items,
            &plan.limits,
            &mut taken.states,
            &mut taken.blocks,
            &mut reports,
            now,
        );
        self.store(&plan, &mut locked, taken, &reports, now);
        // Counting may have grown a sliding window or log past the shard's
        // share of the bytes: make room, keeping this request's counters.
        if batch.items.iter().any(|item| item.counted(admitted)) {
            for shard in &mut locked.guards {
                while shard.bytes > self.per_shard_bytes
                    && shard.evict_one(&plan.counters, now, self, Cap::Bytes)
                {}
            }
        }
        let limits = reports
            .iter()
            .zip(&plan.limits)
            .map(|(report, limit)| {
                let item = &batch.items[limit.item];
                let used = if item.refund {
                    report.used
                } else {
                    let counted = item.reports_counted(admitted);
                    counted_used(counted, report.used, report.pending, item.hits)
                };
                LimitOutcome {
                    used,
                    over: report.over,
                    reset_ms: report.reset_ms,
                    full_for_ms: report.full_for_ms,
                    blocked: report.blocked,
                }
            })
            .collect();
        BatchOutcome { admitted, limits }
    }

    /// Locks the shards of `counters` in ascending order (no deadlock).
    fn lock(&self, counters: &[(CounterKey, usize)]) -> Locked<'_> {
        let mut order: Few<usize> = counters.iter().map(|(_, s)| *s).collect();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&i| self.shards[i].lock()).collect();
        Locked { order, guards }
    }

    /// Puts the evaluated states and blocks back: the counters that were
    /// there at their place (their bytes and limit updated when counted,
    /// refunded or blocked), then the new ones that were counted or blocked
    /// (an offence), in the order they were first counted (making room first
    /// when their shard holds its share of counters). A counter that was not
    /// there and was only checked or refunded stays out.
    fn store(
        &self,
        plan: &Plan,
        locked: &mut Locked<'_>,
        taken: Taken,
        reports: &[batch::Report],
        now: Millis,
    ) {
        let Taken {
            found,
            states,
            blocks,
        } = taken;
        // Per counter: whether refunded or counted, and the `requests` of the
        // limit it was last counted for (what eviction measures it against).
        let mut touched: Few<(bool, Option<u64>)> = smallvec![(false, None); states.len()];
        let order = batch::counting_order(&plan.items, &plan.limits);
        for j in order {
            let limit = &plan.limits[j];
            let touch = &mut touched[limit.counter];
            if reports[j].counted || reports[j].blocked {
                *touch = (true, Some(limit.spec.requests));
            } else if plan.items[limit.item].refund {
                touch.0 = true;
            }
        }
        let mut fresh: Few<Option<State>> = Few::new();
        for (c, state) in states.into_iter().enumerate() {
            let (key, shard) = &plan.counters[c];
            match found[c] {
                Some(index) => {
                    let (refunded_or_counted, requests) = touched[c];
                    let counter = (state, blocks[c]);
                    locked.shard(*shard).put_back(
                        index,
                        key,
                        counter,
                        refunded_or_counted,
                        requests,
                    );
                }
                None => {
                    if fresh.is_empty() {
                        fresh.resize_with(plan.counters.len(), || None);
                    }
                    fresh[c] = Some(state);
                }
            }
        }
        if fresh.is_empty() {
            return;
        }
        for j in batch::counting_order(&plan.items, &plan.limits) {
            let c = plan.limits[j].counter;
            if !(reports[j].counted || reports[j].blocked) {
                continue;
            }
            if let (Some(state), (_, Some(requests))) = (fresh[c].take(), touched[c]) {
                let (key, shard) = &plan.counters[c];
                let shard = locked.shard(*shard);
                let counter = (state, blocks[c]);
                shard.insert(key, counter, requests, &plan.counters, now, self);
            }
        }
    }
}

/// One batch as [`batch::evaluate_into`] takes it, with the counters it names.
struct Plan {
    items: Few<batch::Item>,
    limits: Few<batch::Limit>,
    /// The distinct counters, with their shard, in the order they are first
    /// named (a counter named twice is one state: the script's plan of its
    /// reads).
    counters: Few<(CounterKey, usize)>,
}

impl Plan {
    fn new(store: &MemoryStore, batch: &Batch) -> Self {
        let items = batch
            .items
            .iter()
            .map(|item| batch::Item {
                hits: item.hits,
                role: item.role,
                counting: item.counting,
                refund: item.refund,
            })
            .collect();
        let mut limits = Few::with_capacity(batch.items.iter().map(|i| i.limits.len()).sum());
        let mut counters: Few<(CounterKey, usize)> = Few::with_capacity(limits.capacity());
        for (i, item) in batch.items.iter().enumerate() {
            for spec in &item.limits {
                let named = |(key, _): &(CounterKey, usize)| {
                    key.window == spec.window && key.identity == item.identity
                };
                let counter = counters.iter().position(named).unwrap_or_else(|| {
                    let key = CounterKey {
                        identity: item.identity.clone(),
                        window: spec.window,
                    };
                    let shard = store.shard_of(&key);
                    counters.push((key, shard));
                    counters.len() - 1
                });
                limits.push(batch::Limit {
                    item: i,
                    counter,
                    spec: *spec,
                });
            }
        }
        Self {
            items,
            limits,
            counters,
        }
    }
}

/// What [`Locked::take`] took out of the shards, per counter of a batch:
/// where it was found (`None`: absent), its state and its block.
struct Taken {
    found: Few<Option<usize>>,
    states: Few<State>,
    blocks: Few<Block>,
}

/// The shards of one batch's counters, locked: one critical section.
struct Locked<'a> {
    /// Shard indexes, ascending.
    order: Few<usize>,
    /// One guard per entry of `order`.
    guards: Few<MutexGuard<'a, Shard>>,
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

    /// Takes the state and block of every counter out of its shard (the
    /// script's read), leaving a placeholder that nothing reads before it is
    /// put back (eviction never looks at the batch's counters); an absent
    /// counter reads as empty. Returns where each one was found.
    fn take(&mut self, counters: &[(CounterKey, usize)]) -> Taken {
        let mut found = Few::with_capacity(counters.len());
        let mut states = Few::with_capacity(counters.len());
        let mut blocks = Few::with_capacity(counters.len());
        for (key, shard) in counters {
            let (index, state, block) = match self.shard(*shard).counters.get_full_mut(key) {
                Some((index, _, counter)) => {
                    let placeholder = State::Fixed(FixedWindow::default());
                    (
                        Some(index),
                        std::mem::replace(&mut counter.state, placeholder),
                        counter.block,
                    )
                }
                None => {
                    let spec = LimitSpec {
                        requests: 0,
                        window: key.window,
                        penalty: None,
                    };
                    (None, State::new(&spec), Block::default())
                }
            };
            found.push(index);
            states.push(state);
            blocks.push(block);
        }
        Taken {
            found,
            states,
            blocks,
        }
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

    /// In process: one replica's, forgotten at exit.
    async fn put_override(
        &self,
        new: Override,
        max_per_domain: usize,
    ) -> Result<Option<Override>, OverrideError> {
        Ok(self.overrides.put(new, max_per_domain, self.clock.now())?)
    }

    async fn delete_override(
        &self,
        domain: &str,
        descriptor: &[OverrideEntry],
    ) -> Result<Option<Override>, StoreError> {
        Ok(self.overrides.delete(domain, descriptor))
    }

    async fn overrides_version(&self) -> Result<u64, StoreError> {
        Ok(self.overrides.version())
    }

    async fn load_overrides(&self) -> Result<OverrideSet, StoreError> {
        Ok(self.overrides.load())
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
