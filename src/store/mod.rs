//! Counter stores. The unit of work is one request's whole batch, checked and
//! applied atomically: every limit of every descriptor is checked first, and
//! only if the request is admitted is every one of them incremented. A store
//! never offers get-then-set primitives, so no caller can race itself.

mod breaker;
mod memory;
mod overrides;
mod redis;

pub use breaker::{BreakerConfig, Circuit};
pub use memory::{MemoryStore, MemoryStoreConfig};
pub use overrides::{DomainFull, Override, OverrideBook, OverrideEntry, OverrideSet};
#[cfg(feature = "bench")]
pub use redis::server_info;
pub use redis::{
    Coalescing, LuaScript, RedisStore, RedisStoreConfig, RedisTls, RedisUrl, Refunds, ScriptRunner,
    TimeSource,
};

use std::future::Future;
use std::time::Duration;

use crate::limiter::{Counting, Identity, LimitSpec, MAX_HITS, Role, Window};

/// Everything one request asks of the store.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// One item per descriptor that has limits to check.
    pub items: Vec<BatchItem>,
}

/// One descriptor's counters.
#[derive(Clone, Debug)]
pub struct BatchItem {
    /// Whose counters.
    pub identity: Identity,
    /// The limits to check and count; one counter each.
    pub limits: Vec<LimitSpec>,
    /// Weight added to each limit when the request is admitted; 0 only checks.
    pub hits: u64,
    /// How this descriptor's verdict takes part in the request's.
    pub role: Role,
    /// Whether the weight is counted only when the request is admitted, or
    /// always (even when it does not fit).
    pub counting: Counting,
    /// A refund (Envoy's `is_negative_hits`): `hits` are given back to every
    /// limit, never below empty, whatever the rest of the request decides.
    /// A refund is never over limit and takes no part in admission.
    pub refund: bool,
}

impl BatchItem {
    /// Whether this item's weight is counted, given whether the request was
    /// admitted: an admitted-counting debit only with its request, an
    /// always-counting one whatever the request decides. Refunds are not
    /// counted (they are given back).
    pub fn counted(&self, admitted: bool) -> bool {
        self.hits > 0 && self.reports_counted(admitted)
    }

    /// Whether this item's weight stands whatever the request decides: a
    /// refund, or an always-counting debit.
    pub fn stands(&self) -> bool {
        self.refund || self.counting == Counting::Always
    }

    /// Whether the `used` reported for this item includes its weight (and
    /// the earlier weights of the request on the same counter): when its
    /// weight was (or, being 0, would have been) counted.
    pub(crate) fn reports_counted(&self, admitted: bool) -> bool {
        !self.refund && (admitted || self.counting == Counting::Always)
    }
}

/// What the store decided for one limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOutcome {
    /// Weighted hits in the window: after this request when it was admitted,
    /// before it otherwise.
    pub used: u64,
    /// Whether this request's hits did not fit under this limit.
    pub over: bool,
    /// Milliseconds until headroom next grows.
    pub reset_ms: u64,
    /// For how long from now no hit at all can fit this limit (0 when one
    /// can): what a local cache may answer without the store.
    pub full_for_ms: u64,
    /// Whether its counter is in the limit's penalty box: over whatever the
    /// weight, for `full_for_ms` (the block's remaining time, also
    /// `reset_ms`).
    pub blocked: bool,
}

/// The `used` a store reports for one limit: after this request (and the
/// earlier limits of the request on the same counter) when it was admitted,
/// the counter as it stands when it was not. Both stores use this, so a
/// counter named twice in one request reports consistently. A counter holds
/// at most [`MAX_HITS`]; so does this.
pub(crate) fn counted_used(admitted: bool, before: u64, pending: u64, hits: u64) -> u64 {
    if admitted {
        before
            .saturating_add(pending)
            .saturating_add(hits)
            .min(MAX_HITS)
    } else {
        before
    }
}

/// What the store decided for a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Whether the request was admitted (and so counted).
    pub admitted: bool,
    /// One outcome per limit, in item order and then limit order.
    pub limits: Vec<LimitOutcome>,
}

/// A store failure. Over limit is never an error; it is an outcome.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or refused the call.
    #[error("counter store unavailable: {0}")]
    Unavailable(String),
    /// The store did not answer in time.
    #[error("counter store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store failed repeatedly; calls are refused for this long.
    #[error("counter store failing; not called for another {0:?}")]
    CircuitOpen(Duration),
}

impl StoreError {
    /// Whether retrying later may succeed (every current variant may).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::Timeout(_) | StoreError::CircuitOpen(_)
        )
    }

    /// A short name for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Timeout(_) => "timeout",
            StoreError::CircuitOpen(_) => "circuit_open",
        }
    }
}

/// Why an override could not be set.
#[derive(Clone, Debug, thiserror::Error)]
pub enum OverrideError {
    /// The domain has its maximum count of overrides already.
    #[error(transparent)]
    Full(#[from] DomainFull),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn no_overrides() -> StoreError {
    StoreError::Unavailable("this counter store cannot keep overrides".into())
}

/// A place where counters live.
pub trait CounterStore: Send + Sync + 'static {
    /// Checks every limit of the batch and, if the request is admitted,
    /// counts every one of them, atomically.
    fn apply(&self, batch: &Batch)
    -> impl Future<Output = Result<BatchOutcome, StoreError>> + Send;

    /// Forgets the counters of `identity` under `windows` (the admin
    /// `DELETE /counters`): its next request starts from empty. Outside the
    /// request path; a store that cannot do it says so.
    fn reset(
        &self,
        identity: &Identity,
        windows: &[Window],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (identity, windows);
        async {
            Err(StoreError::Unavailable(
                "this counter store cannot reset counters".into(),
            ))
        }
    }

    /// Sets `new` (see `overrides`), replacing the override of the same
    /// descriptor, which is returned; refused when its domain has
    /// `max_per_domain` live overrides already. Outside the request path.
    /// By default through the store's [`ScriptRunner`] (Redis keeps them,
    /// shared by every replica); a store without one cannot keep them.
    fn put_override(
        &self,
        new: Override,
        max_per_domain: usize,
    ) -> impl Future<Output = Result<Option<Override>, OverrideError>> + Send {
        let runner = self.script_runner();
        async move {
            match runner {
                Some(runner) => runner.put_override(new, max_per_domain).await,
                None => Err(no_overrides().into()),
            }
        }
    }

    /// Deletes the override of `descriptor` in `domain`, returning it.
    fn delete_override(
        &self,
        domain: &str,
        descriptor: &[OverrideEntry],
    ) -> impl Future<Output = Result<Option<Override>, StoreError>> + Send {
        let runner = self.script_runner();
        async move {
            match runner {
                Some(runner) => runner.delete_override(domain, descriptor).await,
                None => Err(no_overrides()),
            }
        }
    }

    /// The version of the overrides: it changes on every set and delete,
    /// so that a replica polls this cheaply and loads them only then.
    fn overrides_version(&self) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let runner = self.script_runner();
        async move {
            match runner {
                Some(runner) => runner.overrides_version().await,
                None => Err(no_overrides()),
            }
        }
    }

    /// Every override, with the version they are at.
    fn load_overrides(&self) -> impl Future<Output = Result<OverrideSet, StoreError>> + Send {
        let runner = self.script_runner();
        async move {
            match runner {
                Some(runner) => runner.load_overrides().await,
                None => Err(no_overrides()),
            }
        }
    }

    /// Whether the store can take requests now (for readiness probes).
    fn is_ready(&self) -> bool {
        true
    }

    /// For a store that lives in Redis, a way for other modules (RLQS) to
    /// keep shared state there too; `None` for a store that is local.
    fn script_runner(&self) -> Option<ScriptRunner> {
        None
    }
}
