//! A circuit breaker: once a store has failed `failures` times in a row over
//! at least `min_failing` (no success in between), it stops calling the store
//! for `cooldown` and fails at once, so while Redis is
//! down no request waits for a timeout. The time span matters: with many
//! requests in flight, one short stall fails them all at once, and that must
//! not turn a 50 ms hiccup into a second of refusals. After the cooldown,
//! calls go through again; the first success closes the breaker, the first
//! failure opens it again.
//!
//! [`Circuit`] is the state; its scope is the caller's choice. The Redis store
//! keeps one per node (see `redis/node.rs`), so on a Cluster a dead shard
//! opens only its own breaker. (The memory store cannot fail, so it has none.)

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::StoreError;

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
/// only its own slots fast).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn is_circuit_open(result: Result<(), StoreError>) -> bool {
        matches!(result, Err(StoreError::CircuitOpen(_)))
    }

    #[test]
    fn opens_after_consecutive_failures_and_fails_fast_until_the_cooldown() {
        let circuit = Circuit::default();
        let config = BreakerConfig {
            failures: 3,
            min_failing: Duration::ZERO,
            cooldown: Duration::from_millis(500),
        };
        for _ in 0..2 {
            circuit.failed(&config, 1_000, 1_000);
        }
        assert!(circuit.check(1_000).is_ok(), "two failures of three");
        circuit.failed(&config, 1_000, 1_000);
        assert!(circuit.is_open(1_000) && is_circuit_open(circuit.check(1_499)));

        // After the cooldown one failed probe reopens it at once.
        assert!(circuit.check(1_500).is_ok());
        circuit.failed(&config, 1_500, 1_500);
        assert!(circuit.is_open(1_500));

        // A successful probe closes it.
        assert!(circuit.check(2_000).is_ok());
        circuit.succeeded();
        assert!(!circuit.is_open(2_000));
    }

    #[test]
    fn a_short_burst_of_failures_does_not_open_it() {
        let circuit = Circuit::default();
        let config = BreakerConfig {
            failures: 3,
            min_failing: Duration::from_millis(500),
            cooldown: Duration::from_secs(1),
        };
        // Thirty requests in flight during one 50 ms stall all fail together.
        for _ in 0..30 {
            circuit.failed(&config, 1_000, 1_050);
        }
        assert!(!circuit.is_open(1_050), "a stall shorter than min_failing");
        // Failures that go on for the span open it.
        circuit.failed(&config, 1_500, 1_500);
        assert!(circuit.is_open(1_500));
    }

    #[test]
    fn a_success_resets_the_count() {
        let circuit = Circuit::default();
        let config = BreakerConfig {
            failures: 2,
            min_failing: Duration::ZERO,
            cooldown: Duration::from_secs(1),
        };
        for t in 0..5 {
            circuit.failed(&config, t, t);
            circuit.succeeded();
        }
        assert!(!circuit.is_open(5));
    }
}
