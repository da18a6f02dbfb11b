//! A circuit breaker around any store: once the store has failed `failures`
//! times in a row over at least `min_failing` (no success in between), it
//! stops calling the store for `cooldown` and fails at once, so while Redis is
//! down no request waits for a timeout. The time span matters: with many
//! requests in flight, one short stall fails them all at once, and that must
//! not turn a 50 ms hiccup into a second of refusals. After the cooldown,
//! calls go through again; the first success closes the breaker, the first
//! failure opens it again.
//!
//! [`Circuit`] is the state; its scope is the caller's choice. The Redis store
//! keeps one per node (see `redis/node.rs`), so on a Cluster a dead shard
//! opens only its own breaker; [`Breaker`] wraps any store in a single one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::{Batch, BatchOutcome, CounterStore, StoreError};
use crate::limiter::Clock;

/// Settings of the breaker.
#[derive(Clone, Copy, Debug)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failures: u32,
    /// How long the failures must have lasted, at least.
    pub min_failing: Duration,
    /// How long it stays open.
    pub cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures: 5,
            min_failing: Duration::from_millis(500),
            cooldown: Duration::from_secs(1),
        }
    }
}

/// The state of one breaker: what fails together shares one. The Redis store
/// keeps one per Redis node (per primary on a Cluster, so one dead shard fails
/// only its own slots fast); [`Breaker`] puts one around a whole store.
#[derive(Debug, Default)]
pub struct Circuit {
    /// Atomics: every request reads them, without a lock.
    failures: AtomicU32,
    /// When the current run of failures began (0: none since the last success).
    failing_since: AtomicU64,
    open_until: AtomicU64,
}

impl Circuit {
    /// `Err(CircuitOpen)` while open at `now` (ms of the breaker's clock).
    pub fn check(&self, now: u64) -> Result<(), StoreError> {
        let until = self.open_until.load(Ordering::Relaxed);
        if now < until {
            return Err(StoreError::CircuitOpen(Duration::from_millis(until - now)));
        }
        Ok(())
    }

    /// Whether calls are being refused at `now`.
    pub fn is_open(&self, now: u64) -> bool {
        now < self.open_until.load(Ordering::Relaxed)
    }

    /// A call succeeded: closes the breaker and forgets the failures.
    pub fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.failing_since.store(0, Ordering::Relaxed);
        self.open_until.store(0, Ordering::Relaxed);
    }

    /// A call that began at `started` failed at `failed_at`.
    pub fn failed(&self, config: &BreakerConfig, started: u64, failed_at: u64) {
        let failed_at = failed_at.max(1);
        let _ = self.failing_since.compare_exchange(
            0,
            started.max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        let since = self.failing_since.load(Ordering::Relaxed);
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let span = failed_at.saturating_sub(since);
        if failures >= config.failures && u128::from(span) >= config.min_failing.as_millis() {
            let cooldown = u64::try_from(config.cooldown.as_millis()).unwrap_or(u64::MAX);
            self.open_until
                .store(failed_at.saturating_add(cooldown), Ordering::Relaxed);
        }
    }
}

/// A store that stops calling `inner` while it keeps failing (one breaker
/// for the whole store; the Redis store has per-node breakers of its own).
pub struct Breaker<S> {
    inner: S,
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    circuit: Circuit,
}

impl<S> Breaker<S> {
    /// `inner` behind a breaker reading time from `clock`.
    pub fn new(inner: S, config: BreakerConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner,
            config,
            clock,
            circuit: Circuit::default(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Whether calls are being refused now.
    pub fn is_open(&self) -> bool {
        self.circuit.is_open(self.clock.now())
    }
}

impl<S: CounterStore> CounterStore for Breaker<S> {
    fn is_ready(&self) -> bool {
        !self.is_open() && self.inner.is_ready()
    }

    fn script_runner(&self) -> Option<super::ScriptRunner> {
        self.inner.script_runner()
    }

    async fn apply(&self, batch: &Batch) -> Result<BatchOutcome, StoreError> {
        let now = self.clock.now();
        self.circuit.check(now)?;
        let result = self.inner.apply(batch).await;
        match &result {
            Ok(_) => self.circuit.succeeded(),
            Err(_) => self.circuit.failed(&self.config, now, self.clock.now()),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::limiter::ManualClock;

    /// A store that fails while told to, counting its calls.
    #[derive(Default)]
    struct Flaky {
        failing: AtomicBool,
        calls: AtomicU32,
    }

    impl CounterStore for Flaky {
        async fn apply(&self, _: &Batch) -> Result<BatchOutcome, StoreError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.failing.load(Ordering::Relaxed) {
                Err(StoreError::Unavailable("down".into()))
            } else {
                Ok(BatchOutcome {
                    admitted: true,
                    limits: Vec::new(),
                })
            }
        }
    }

    #[tokio::test]
    async fn opens_after_consecutive_failures_and_fails_fast_until_the_cooldown() {
        let clock = Arc::new(ManualClock::new(1_000));
        let config = BreakerConfig {
            failures: 3,
            min_failing: Duration::ZERO,
            cooldown: Duration::from_millis(500),
        };
        let breaker = Breaker::new(Flaky::default(), config, clock.clone());
        breaker.inner().failing.store(true, Ordering::Relaxed);
        for _ in 0..3 {
            assert!(matches!(
                breaker.apply(&Batch::default()).await,
                Err(StoreError::Unavailable(_))
            ));
        }
        assert!(breaker.is_open() && !breaker.is_ready());
        for _ in 0..10 {
            assert!(matches!(
                breaker.apply(&Batch::default()).await,
                Err(StoreError::CircuitOpen(_))
            ));
        }
        assert_eq!(
            breaker.inner().calls.load(Ordering::Relaxed),
            3,
            "no calls while open"
        );

        // After the cooldown one failed probe reopens it at once.
        clock.advance(500);
        assert!(matches!(
            breaker.apply(&Batch::default()).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(breaker.is_open());

        // A successful probe closes it.
        clock.advance(500);
        breaker.inner().failing.store(false, Ordering::Relaxed);
        assert!(breaker.apply(&Batch::default()).await.is_ok());
        assert!(!breaker.is_open() && breaker.is_ready());
    }

    #[tokio::test]
    async fn a_short_burst_of_failures_does_not_open_it() {
        let clock = Arc::new(ManualClock::new(1_000));
        let config = BreakerConfig {
            failures: 3,
            min_failing: Duration::from_millis(500),
            cooldown: Duration::from_secs(1),
        };
        let breaker = Breaker::new(Flaky::default(), config, clock.clone());
        breaker.inner().failing.store(true, Ordering::Relaxed);
        // Thirty requests in flight during one 50 ms stall all fail together.
        for _ in 0..30 {
            let _ = breaker.apply(&Batch::default()).await;
        }
        clock.advance(50);
        assert!(!breaker.is_open(), "a stall shorter than min_failing");
        // Failures that go on for the span open it.
        clock.advance(450);
        let _ = breaker.apply(&Batch::default()).await;
        assert!(breaker.is_open());
    }

    #[tokio::test]
    async fn a_success_resets_the_count() {
        let clock = Arc::new(ManualClock::new(0));
        let config = BreakerConfig {
            failures: 2,
            min_failing: Duration::ZERO,
            cooldown: Duration::from_secs(1),
        };
        let breaker = Breaker::new(Flaky::default(), config, clock);
        for _ in 0..5 {
            breaker.inner().failing.store(true, Ordering::Relaxed);
            let _ = breaker.apply(&Batch::default()).await;
            breaker.inner().failing.store(false, Ordering::Relaxed);
            assert!(breaker.apply(&Batch::default()).await.is_ok());
        }
        assert!(!breaker.is_open());
    }
}
