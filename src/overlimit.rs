//! The local over-limit cache: counters the store reported full (no hit at
//! all can fit) until time T are answered here until T (for at most
//! [`MAX_TRUST_MS`] at a time), without calling the store, so a hot abusive
//! key costs Redis almost nothing.
//!
//! It answers only when its answer is the store's, field for field, and
//! otherwise calls the store. Why the two are equal:
//!
//! - It answers only a request in which every limit of every limited
//!   descriptor is a counter it knows to be full, every such descriptor has
//!   a weight above 0, and the roles make the request a rejection (an
//!   enforcing descriptor, or quota descriptors only over). The store would
//!   then find every limit over (a full counter fits no hit), admit nothing
//!   and count nothing; so the cache need not know any count.
//! - The decision then builds the statuses and metrics from per-limit
//!   outcomes by the same code as for a store answer. What that code reads
//!   of an outcome is `over` (true for both), the headroom (0 for both: a
//!   full counter holds at least its capacity) and `reset_ms`.
//! - The reset is the store's own: the cache keeps the instant the store
//!   reported (`now + reset_ms`), and the algorithms keep `full_for` no
//!   longer than that instant stays the same (a sliding window's oldest
//!   bucket, a fixed window's end, a token bucket's next token, a sliding
//!   log's oldest entry; see `State::full_for`). So at any `now'` before T
//!   the store would report `reset_at − now'`, which is what the cache says.
//!
//! Every store answer refreshes what the cache holds for the counters it
//! reported (remembered when full, forgotten when not), so this replica's
//! own traffic never leaves a stale entry. Another replica cannot make a
//! full counter admit (nothing fits), but its shadow or quota traffic can
//! change a counter's state; that is seen at the next store answer. Times
//! are the limiter's clock read before the store call: exact when the store
//! uses the same clock (memory, or Redis in local time mode); with Redis
//! `TIME` the cache's times lead the store's by at most the call latency, so
//! it stops answering early rather than late.
//!
//! A counter in its limit's penalty box (`LimitOutcome::blocked`) is over
//! whatever the weight until the block ends, and nothing is counted on it:
//! such an entry also answers items of weight 0 and always-counted debits
//! (and it alone answers for a limit with a penalty box: a full counter's
//! refusal there is an offence, which only the store records),
//! and is trusted for [`MAX_BLOCK_TRUST_MS`] (a block is never taken back by
//! a refund; only `DELETE /counters` lifts one early, which another replica
//! then sees within that time).
//!
//! Entries are keyed by the whole limit, so a reload that changes a limit is
//! never answered from the old one. Bounded: a full shard first drops
//! expired entries and then stops taking new ones.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::limiter::{Identity, LimitSpec, Millis};
use crate::store::LimitOutcome;

const SHARDS: usize = 16;

/// The longest an entry is trusted, however long the store said the counter
/// stays full. Redis counters can hold hits that are about to be taken back
/// (a Cluster request rejected by another slot group, a decision that ran
/// after its caller's timeout); a request that saw them full would
/// otherwise keep refusing until the window's end (a day, for a daily
/// limit) after the refund reopened it. A second still spares Redis all
/// but one call per second per hot counter and replica.
pub const MAX_TRUST_MS: Millis = 1_000;

/// The longest a penalty block is trusted: a blocked identity costs Redis
/// one call a minute per replica, and a block lifted by `DELETE /counters`
/// is seen by every replica within a minute.
pub const MAX_BLOCK_TRUST_MS: Millis = 60_000;

/// What the store said of one full counter.
#[derive(Clone, Copy, Debug)]
struct Full {
    /// When the store said it (limiter clock); not answered before it, in
    /// case the clock steps back.
    since: Millis,
    /// No hit fits before this instant.
    until: Millis,
    /// The instant the store reported as the reset; it stays the same until
    /// `until` (see the module header).
    reset_at: Millis,
    /// A penalty block: over whatever the weight.
    blocked: bool,
}

type Shard = HashMap<(Identity, LimitSpec), Full>;

/// Counters known to be full, until when, and the reset the store reported.
pub struct OverLimitCache {
    /// Sharded so concurrent requests rarely meet on a lock.
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    /// Entries over all shards, changed under their locks and read without
    /// one: while nothing is full (the usual case) a decision neither
    /// hashes its counters nor takes a lock here. A stale read only sends
    /// one request to the store, or leaves an entry to expire.
    entries: AtomicUsize,
}

impl OverLimitCache {
    /// A cache of at most `capacity` entries; `None` when `capacity` is 0.
    pub fn new(capacity: usize) -> Option<Self> {
        (capacity > 0).then(|| Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: RandomState::new(),
            entries: AtomicUsize::new(0),
        })
    }

    fn shard(&self, key: &(Identity, LimitSpec)) -> &Mutex<Shard> {
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    /// The outcome the store would report at `now` for a request that it
    /// rejects, if the counter is known full at `now`: of weight at least 1
    /// counted only when admitted, or (`blocks_only`) any weight or counting
    /// when the counter is blocked.
    pub fn outcome(
        &self,
        identity: &Identity,
        limit: &LimitSpec,
        blocks_only: bool,
        now: Millis,
    ) -> Option<LimitOutcome> {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let key = (identity.clone(), *limit);
        let mut shard = self.shard(&key).lock();
        match shard.get(&key) {
            Some(full) if full.since <= now && now < full.until => {
                (full.blocked || !blocks_only).then(|| LimitOutcome {
                    // At least the capacity is in use: no headroom. (Only
                    // the headroom is read from `used` for a rejected
                    // request.)
                    used: limit.capacity(),
                    over: true,
                    reset_ms: full.reset_at.saturating_sub(now),
                    full_for_ms: if full.blocked {
                        full.reset_at - now
                    } else {
                        full.until - now
                    },
                    blocked: full.blocked,
                })
            }
            Some(full) if full.until <= now => {
                shard.remove(&key);
                self.entries.fetch_sub(1, Ordering::Relaxed);
                None
            }
            _ => None,
        }
    }

    /// Takes in what the store reported at `now` for one counter: remembered
    /// while it is full, forgotten once it is not.
    pub fn learn(
        &self,
        identity: &Identity,
        limit: &LimitSpec,
        outcome: &LimitOutcome,
        now: Millis,
    ) {
        if outcome.full_for_ms == 0 && self.entries.load(Ordering::Relaxed) == 0 {
            return;
        }
        let key = (identity.clone(), *limit);
        let mut shard = self.shard(&key).lock();
        if outcome.full_for_ms == 0 {
            if shard.remove(&key).is_some() {
                self.entries.fetch_sub(1, Ordering::Relaxed);
            }
            return;
        }
        if shard.len() >= self.per_shard && !shard.contains_key(&key) {
            let held = shard.len();
            shard.retain(|_, full| full.until > now);
            self.entries
                .fetch_sub(held - shard.len(), Ordering::Relaxed);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        let trust = if outcome.blocked {
            MAX_BLOCK_TRUST_MS
        } else {
            MAX_TRUST_MS
        };
        let full = Full {
            since: now,
            until: now.saturating_add(outcome.full_for_ms.min(trust)),
            reset_at: now.saturating_add(outcome.reset_ms),
            blocked: outcome.blocked,
        };
        if shard.insert(key, full).is_none() {
            self.entries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forgets what it knows of `identity`'s counters, whatever their limit
    /// (a rule's, an override's, one a reload replaced): they were reset,
    /// the store answers next. Looks through every shard; an admin
    /// operation, not a request's.
    pub fn forget(&self, identity: &Identity) {
        for shard in &*self.shards {
            let mut shard = shard.lock();
            let held = shard.len();
            shard.retain(|(id, _), _| id != identity);
            self.entries
                .fetch_sub(held - shard.len(), Ordering::Relaxed);
        }
    }

    /// Entries held (expired ones included until touched).
    pub fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, IdentityBuilder, Window};

    fn id(v: &str) -> Identity {
        let mut b = IdentityBuilder::new("d");
        b.value("k", v);
        b.build()
    }

    const LIMIT: LimitSpec = LimitSpec {
        requests: 1,
        window: Window {
            duration_ms: 1_000,
            algorithm: Algorithm::FixedWindow,
        },
        penalty: None,
    };

    fn full(full_for_ms: u64, reset_ms: u64) -> LimitOutcome {
        LimitOutcome {
            used: 1,
            over: true,
            reset_ms,
            full_for_ms,
            blocked: false,
        }
    }

    #[test]
    fn answers_until_the_time_and_not_after() {
        let cache = OverLimitCache::new(10).unwrap();
        cache.learn(&id("a"), &LIMIT, &full(500, 500), 1_000);
        let known = cache.outcome(&id("a"), &LIMIT, false, 1_499).unwrap();
        assert_eq!((known.over, known.reset_ms, known.used), (true, 1, 1));
        assert_eq!(cache.outcome(&id("a"), &LIMIT, false, 1_500), None);
        assert!(cache.is_empty(), "expired entries are dropped when read");
    }

    #[test]
    fn an_entry_is_trusted_for_a_second_at_most() {
        // A daily window reported full for 20 hours: hits about to be
        // refunded may be in that count, so the store is asked again after
        // MAX_TRUST_MS, not at the window's end.
        let cache = OverLimitCache::new(10).unwrap();
        let hours = 20 * 3_600_000;
        cache.learn(&id("a"), &LIMIT, &full(hours, hours), 1_000);
        let known = cache.outcome(&id("a"), &LIMIT, false, 1_000 + MAX_TRUST_MS - 1);
        assert_eq!(known.map(|k| k.reset_ms), Some(hours - MAX_TRUST_MS + 1));
        assert_eq!(
            cache.outcome(&id("a"), &LIMIT, false, 1_000 + MAX_TRUST_MS),
            None
        );
    }

    #[test]
    fn reports_the_stores_reset_not_the_end_of_fullness() {
        let cache = OverLimitCache::new(10).unwrap();
        cache.learn(&id("a"), &LIMIT, &full(300, 900), 1_000);
        assert_eq!(
            cache
                .outcome(&id("a"), &LIMIT, false, 1_100)
                .unwrap()
                .reset_ms,
            800
        );
    }

    #[test]
    fn a_counter_reported_not_full_is_forgotten() {
        let cache = OverLimitCache::new(10).unwrap();
        cache.learn(&id("a"), &LIMIT, &full(500, 500), 1_000);
        cache.learn(&id("a"), &LIMIT, &full(0, 500), 1_001);
        assert_eq!(cache.outcome(&id("a"), &LIMIT, false, 1_002), None);
    }

    #[test]
    fn a_clock_stepping_back_is_not_answered() {
        let cache = OverLimitCache::new(10).unwrap();
        cache.learn(&id("a"), &LIMIT, &full(500, 500), 1_000);
        assert_eq!(cache.outcome(&id("a"), &LIMIT, false, 999), None);
    }

    #[test]
    fn a_changed_limit_is_not_answered_from_the_old_one() {
        let cache = OverLimitCache::new(10).unwrap();
        cache.learn(&id("a"), &LIMIT, &full(1_000, 1_000), 1_000);
        let raised = LimitSpec {
            requests: 2,
            ..LIMIT
        };
        assert_eq!(cache.outcome(&id("a"), &raised, false, 1_000), None);
    }

    #[test]
    fn it_never_grows_past_its_capacity() {
        let cache = OverLimitCache::new(32).unwrap();
        for i in 0..10_000 {
            cache.learn(&id(&i.to_string()), &LIMIT, &full(4_000, 4_000), 1_000);
        }
        assert!(cache.len() <= 32);
        assert!(OverLimitCache::new(0).is_none());
    }

    #[test]
    fn the_entry_count_follows_every_change() {
        // The count is what lets a decision skip the cache while it is
        // empty: it must not drift from what the shards hold.
        let held = |c: &OverLimitCache| c.shards.iter().map(|s| s.lock().len()).sum::<usize>();
        let cache = OverLimitCache::new(16).unwrap();
        for i in 0..40 {
            cache.learn(&id(&i.to_string()), &LIMIT, &full(100 + i, 500), 1_000);
            cache.learn(&id(&i.to_string()), &LIMIT, &full(100 + i, 500), 1_000);
        }
        assert_eq!(cache.len(), held(&cache));
        assert!(cache.len() > 1);
        // Some expire and are dropped when read, some are reported not full.
        for i in 0..40 {
            let _ = cache.outcome(&id(&i.to_string()), &LIMIT, false, 1_120);
            if i % 3 == 0 {
                cache.learn(&id(&i.to_string()), &LIMIT, &full(0, 500), 1_120);
            }
            assert_eq!(cache.len(), held(&cache));
        }
        // A full shard drops its expired entries to take a new one.
        for i in 40..80 {
            cache.learn(&id(&i.to_string()), &LIMIT, &full(50, 500), 1_130);
            assert_eq!(cache.len(), held(&cache));
        }
        assert!(!cache.is_empty());
    }

    #[test]
    fn a_block_answers_any_weight_for_up_to_a_minute_and_a_full_counter_does_not() {
        // Room for both entries whatever shards they fall in.
        let cache = OverLimitCache::new(2 * SHARDS).unwrap();
        let block = LimitOutcome {
            blocked: true,
            ..full(900_000, 900_000)
        };
        cache.learn(&id("a"), &LIMIT, &block, 1_000);
        cache.learn(&id("b"), &LIMIT, &full(900_000, 900_000), 1_000);
        let known = cache.outcome(&id("a"), &LIMIT, true, 31_000).unwrap();
        assert!(known.blocked);
        assert_eq!((known.reset_ms, known.full_for_ms), (870_000, 870_000));
        let end = 1_000 + MAX_BLOCK_TRUST_MS;
        assert_eq!(cache.outcome(&id("a"), &LIMIT, true, end), None);
        assert_eq!(cache.outcome(&id("b"), &LIMIT, true, 1_001), None);
        assert!(cache.outcome(&id("b"), &LIMIT, false, 1_001).is_some());
    }

    #[test]
    fn forgetting_an_identity_forgets_it_under_every_limit_and_nobody_else() {
        let cache = OverLimitCache::new(4 * SHARDS).unwrap();
        let raised = LimitSpec {
            requests: 2,
            ..LIMIT
        };
        for (who, limit) in [("a", LIMIT), ("a", raised), ("b", LIMIT)] {
            cache.learn(&id(who), &limit, &full(500, 500), 1_000);
        }
        cache.forget(&id("a"));
        assert_eq!(cache.outcome(&id("a"), &LIMIT, false, 1_001), None);
        assert_eq!(cache.outcome(&id("a"), &raised, false, 1_001), None);
        assert!(cache.outcome(&id("b"), &LIMIT, false, 1_001).is_some());
        assert_eq!(cache.len(), 1, "the count follows");
    }
}
