//! One shard of the in-memory store: its counters, its share of the bounds,
//! and the eviction that keeps it within them.

use foldhash::fast::RandomState;
use indexmap::IndexMap;

use super::*;

/// Which cap made a shard evict a counter.
#[derive(Clone, Copy)]
pub(super) enum Cap {
    Keys,
    Bytes,
}

/// One counter's state, its penalty block, and what eviction needs to rank
/// it.
pub(super) struct Counter {
    pub(super) state: State,
    /// All zero unless a limit with a penalty box blocked it.
    pub(super) block: Block,
    /// The limit's `requests` when the counter was last counted: with the
    /// key's window, the limit to measure how full the counter is.
    pub(super) requests: u64,
    /// What [`counter_bytes`] gave when the state last grew.
    pub(super) bytes: usize,
}

pub(super) struct Shard {
    /// foldhash, randomly seeded per process: several times cheaper than
    /// SipHash on these short keys, and still not predictable by a client.
    pub(super) counters: IndexMap<CounterKey, Counter, RandomState>,
    /// Sum of the counters' `bytes`.
    pub(super) bytes: usize,
    /// xorshift state for eviction sampling; per shard so it needs no extra lock.
    pub(super) rng: u64,
}

impl Counter {
    /// The instant from which it counts nothing and remembers no block.
    pub(super) fn expires_at(&self, window: &Window) -> Millis {
        self.state.expires_at(window).max(self.block.forget_at)
    }
}

impl Shard {
    /// Puts back the state of the counter at `index` (where it was taken
    /// from); when it was counted or refunded, also what it now weighs and,
    /// when counted, the `requests` of the limit it was last counted for.
    pub(super) fn put_back(
        &mut self,
        index: usize,
        key: &CounterKey,
        (state, block): (State, Block),
        refunded_or_counted: bool,
        requests: Option<u64>,
    ) {
        let Some((_, counter)) = self.counters.get_index_mut(index) else {
            return;
        };
        counter.state = state;
        counter.block = block;
        if let Some(requests) = requests {
            counter.requests = requests;
        }
        if refunded_or_counted {
            let bytes = counter_bytes(key, &counter.state);
            let before = std::mem::replace(&mut counter.bytes, bytes);
            self.bytes = self.bytes - before + bytes;
        }
    }

    /// Adds a counter that was not there and has now been counted or
    /// blocked, after making room when the shard holds its share of counters
    /// (never evicting one of `batch`).
    pub(super) fn insert(
        &mut self,
        key: &CounterKey,
        (state, block): (State, Block),
        requests: u64,
        batch: &[(CounterKey, usize)],
        now: Millis,
        store: &MemoryStore,
    ) {
        if self.counters.len() >= store.per_shard {
            self.evict_one(batch, now, store, Cap::Keys);
        }
        let bytes = counter_bytes(key, &state);
        self.bytes += bytes;
        self.counters.insert(
            key.clone(),
            Counter {
                state,
                block,
                requests,
                bytes,
            },
        );
    }

    /// Removes the least valuable of a few sampled counters, never one of
    /// `batch`: a counter that counts nothing at `now` first, then the one
    /// whose limit is least used, then the one that expires soonest. Returns
    /// whether one was removed.
    pub(super) fn evict_one(
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
            let expires = counter.expires_at(&key.window);
            let share = if expires <= now {
                0.0
            } else if counter.block.blocked_for(now) > 0 {
                // Forgetting a block would admit what it refuses: kept
                // before any counter that is not full.
                f64::MAX
            } else {
                let spec = LimitSpec {
                    requests: counter.requests,
                    window: key.window,
                    penalty: None,
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
