//! The local over-limit cache: a counter the store reported full (no hit at
//! all can fit) until time T is answered here until T, without calling the
//! store — a hot abusive key then costs Redis nothing.
//!
//! It can only reject, never admit, and only for as long as the store said
//! the counter stays full (measured from before the store call, so never
//! longer): it never rejects what the store would admit. Entries are keyed
//! by the whole limit, so a reload that changes a limit is never answered
//! from the old one. Bounded: a full shard first drops expired entries and
//! then stops taking new ones.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use parking_lot::Mutex;

use crate::limiter::{Identity, LimitSpec, Millis};

const SHARDS: usize = 16;

type Shard = HashMap<(Identity, LimitSpec), Millis>;

/// Counters known to be full, and until when.
pub struct OverLimitCache {
    /// Sharded so concurrent requests rarely meet on a lock.
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
}

impl OverLimitCache {
    /// A cache of at most `capacity` entries; `None` when `capacity` is 0.
    pub fn new(capacity: usize) -> Option<Self> {
        (capacity > 0).then(|| Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: RandomState::new(),
        })
    }

    fn shard(&self, key: &(Identity, LimitSpec)) -> &Mutex<Shard> {
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    /// Until when the counter is known to be full, if it is at `now`.
    pub fn full_until(
        &self,
        identity: &Identity,
        limit: &LimitSpec,
        now: Millis,
    ) -> Option<Millis> {
        let key = (identity.clone(), *limit);
        let mut shard = self.shard(&key).lock();
        match shard.get(&key) {
            Some(&until) if until > now => Some(until),
            Some(_) => {
                shard.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Remembers that the counter is full until `until`.
    pub fn remember(&self, identity: &Identity, limit: &LimitSpec, until: Millis, now: Millis) {
        let key = (identity.clone(), *limit);
        let mut shard = self.shard(&key).lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&key) {
            shard.retain(|_, &mut t| t > now);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        shard.insert(key, until);
    }

    /// Entries held (expired ones included until touched).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
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
    };

    #[test]
    fn answers_until_the_time_and_not_after() {
        let cache = OverLimitCache::new(10).unwrap();
        cache.remember(&id("a"), &LIMIT, 1_500, 1_000);
        assert_eq!(cache.full_until(&id("a"), &LIMIT, 1_499), Some(1_500));
        assert_eq!(cache.full_until(&id("a"), &LIMIT, 1_500), None);
        assert!(cache.is_empty(), "expired entries are dropped when read");
    }

    #[test]
    fn a_changed_limit_is_not_answered_from_the_old_one() {
        let cache = OverLimitCache::new(10).unwrap();
        cache.remember(&id("a"), &LIMIT, 2_000, 1_000);
        let raised = LimitSpec {
            requests: 2,
            ..LIMIT
        };
        assert_eq!(cache.full_until(&id("a"), &raised, 1_000), None);
    }

    #[test]
    fn it_never_grows_past_its_capacity() {
        let cache = OverLimitCache::new(32).unwrap();
        for i in 0..10_000 {
            cache.remember(&id(&i.to_string()), &LIMIT, 5_000, 1_000);
        }
        assert!(cache.len() <= 32);
        assert!(OverLimitCache::new(0).is_none());
    }
}
