//! The metrics an operator watches the service itself with, beside the
//! decisions: the configured limits, the build, the memory store's
//! occupancy and evictions, the Redis store's reconciliations and refused
//! TLS handshakes. Registered with the others (see `Operations::register`).

use std::collections::HashSet;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{ListenerLabels, Metrics, ReasonLabels};

/// Labels of the configured-limit gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConfiguredLabels {
    domain: String,
    /// As the per-limit counters name it: the limit's `name`, else its
    /// rule's path.
    limit: String,
    /// The window as the rules would write it: `1s`, `1m`, `90s`, `1h`.
    window: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    revision: String,
    rustc: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// One limit of the rules in force, as `sluice_limit` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfiguredLimit {
    /// The domain of its rule.
    pub domain: String,
    /// The `limit` label of the per-limit counters.
    pub limit: String,
    /// The window's length.
    pub window_ms: u64,
    /// Weighted hits allowed per window.
    pub requests: u64,
}

/// Why the memory store evicted a live counter (`reason` label): the
/// setting whose cap it was at.
pub const EVICTION_REASONS: [&str; 2] = ["max_keys", "max_bytes"];

/// The memory store's series, for the store to keep and update.
#[derive(Clone, Debug, Default)]
pub struct MemoryStoreMetrics {
    /// Counters held now.
    pub keys: Gauge,
    /// Bytes of counters held now, as the store accounts them.
    pub bytes: Gauge,
    /// The caps the store evicts at (`memory_max_keys`, `memory_max_bytes`).
    pub max_keys: Gauge,
    /// See `max_keys`.
    pub max_bytes: Gauge,
    /// Live counters evicted at the key cap.
    pub evicted_at_max_keys: Counter,
    /// Live counters evicted at the byte cap.
    pub evicted_at_max_bytes: Counter,
}

/// What became of a Redis call its caller stopped waiting for (`outcome`
/// label of `sluice_store_reconciliations_total`).
#[derive(Clone, Debug, Default)]
pub struct ReconcileCounters {
    /// Its reply came: what it counted, if anything, was refunded.
    pub answered: Counter,
    /// It failed: it did not run, or its connection went down after it
    /// was sent (what it counted, if it ran, cannot be known).
    pub failed: Counter,
    /// No reply within the wait: if it ran, its hits stay counted.
    pub no_reply: Counter,
}

/// The families of this module, fields of [`Metrics`].
#[derive(Default)]
pub(super) struct Operations {
    limit: Family<ConfiguredLabels, Gauge>,
    limit_window: Family<ConfiguredLabels, Gauge<f64, AtomicU64>>,
    /// The label sets of the rules in force, to remove those a reload drops.
    limits_shown: Mutex<HashSet<ConfiguredLabels>>,
    build_info: Family<BuildLabels, Gauge>,
    memory_keys: Gauge,
    memory_bytes: Gauge,
    memory_max_keys: Gauge,
    memory_max_bytes: Gauge,
    evictions: Family<ReasonLabels, Counter>,
    reconciliations: Family<OutcomeLabels, Counter>,
    tls_handshake_failures: Family<ListenerLabels, Counter>,
    /// The memory store's handles, made once.
    memory: OnceLock<MemoryStoreMetrics>,
}

impl Operations {
    /// Registers every family in `registry` and makes the series that exist
    /// from the start.
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "sluice_limit",
            "Configured limit of each rule in force, in weighted hits per window",
            self.limit.clone(),
        );
        registry.register(
            "sluice_limit_window_seconds",
            "Window of each configured limit, in seconds (sluice_limit / sluice_limit_window_seconds: the limit per second)",
            self.limit_window.clone(),
        );
        registry.register(
            "sluice_build_info",
            "Always 1; the labels say which build is running",
            self.build_info.clone(),
        );
        registry.register(
            "sluice_memory_store_keys",
            "Counters held by the memory store",
            self.memory_keys.clone(),
        );
        registry.register(
            "sluice_memory_store_bytes",
            "Bytes of counters held by the memory store, as it accounts them",
            self.memory_bytes.clone(),
        );
        registry.register(
            "sluice_memory_store_max_keys",
            "Most counters the memory store keeps before evicting",
            self.memory_max_keys.clone(),
        );
        registry.register(
            "sluice_memory_store_max_bytes",
            "Most bytes of counters the memory store keeps before evicting",
            self.memory_max_bytes.clone(),
        );
        registry.register(
            "sluice_memory_store_evictions",
            "Live counters the memory store evicted to stay under a cap, by reason",
            self.evictions.clone(),
        );
        registry.register(
            "sluice_store_reconciliations",
            "Redis calls that outlived their caller's timeout, by what became of them",
            self.reconciliations.clone(),
        );
        registry.register(
            "sluice_tls_handshake_failures",
            "Connections whose TLS handshake failed (no TLS, no or a wrong client certificate), by listener",
            self.tls_handshake_failures.clone(),
        );
        self.build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                revision: env!("SLUICE_REVISION").to_owned(),
                rustc: env!("SLUICE_RUSTC").to_owned(),
            })
            .set(1);
        self.reconcile_counters();
        self.tls_handshake_failures("grpc");
        for reason in EVICTION_REASONS {
            self.evictions.get_or_create_owned(&ReasonLabels {
                reason: reason.to_owned(),
            });
        }
    }
}

impl Metrics {
    /// Shows the limits of the rules in force in `sluice_limit` and
    /// `sluice_limit_window_seconds`, removing the series of limits that
    /// are gone. Several limits with one label set show the lowest.
    pub fn set_limits(&self, limits: impl IntoIterator<Item = ConfiguredLimit>) {
        let ops = &self.operations;
        let mut shown = ops.limits_shown.lock();
        let mut now = HashSet::new();
        for limit in limits {
            let labels = ConfiguredLabels {
                domain: limit.domain,
                limit: limit.limit,
                window: window_label(limit.window_ms),
            };
            let requests = i64::try_from(limit.requests).unwrap_or(i64::MAX);
            let gauge = ops.limit.get_or_create_owned(&labels);
            if now.contains(&labels) {
                gauge.set(gauge.get().min(requests));
            } else {
                gauge.set(requests);
            }
            ops.limit_window
                .get_or_create(&labels)
                .set(limit.window_ms as f64 / 1000.0);
            now.insert(labels);
        }
        for gone in shown.difference(&now) {
            ops.limit.remove(gone);
            ops.limit_window.remove(gone);
        }
        *shown = now;
    }

    /// The memory store's series, the same handles on every call.
    pub fn memory_store(&self) -> MemoryStoreMetrics {
        let ops = &self.operations;
        ops.memory
            .get_or_init(|| {
                let [evicted_at_max_keys, evicted_at_max_bytes] = EVICTION_REASONS.map(|reason| {
                    ops.evictions.get_or_create_owned(&ReasonLabels {
                        reason: reason.to_owned(),
                    })
                });
                MemoryStoreMetrics {
                    keys: ops.memory_keys.clone(),
                    bytes: ops.memory_bytes.clone(),
                    max_keys: ops.memory_max_keys.clone(),
                    max_bytes: ops.memory_max_bytes.clone(),
                    evicted_at_max_keys,
                    evicted_at_max_bytes,
                }
            })
            .clone()
    }

    /// The counters of reconciled Redis calls, for the Redis store.
    pub fn reconcile_counters(&self) -> ReconcileCounters {
        self.operations.reconcile_counters()
    }

    /// The counter of failed TLS handshakes on `listener`.
    pub fn tls_handshake_failures(&self, listener: &str) -> Counter {
        self.operations.tls_handshake_failures(listener)
    }
}

impl Operations {
    fn reconcile_counters(&self) -> ReconcileCounters {
        let outcome = |outcome: &str| {
            self.reconciliations.get_or_create_owned(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
        };
        ReconcileCounters {
            answered: outcome("answered"),
            failed: outcome("failed"),
            no_reply: outcome("no_reply"),
        }
    }

    fn tls_handshake_failures(&self, listener: &str) -> Counter {
        self.tls_handshake_failures
            .get_or_create_owned(&ListenerLabels {
                listener: listener.to_owned(),
            })
    }
}

/// A window as the rules write one: the largest unit that divides it
/// (`1d`, `2h`, `1m`, `90s`, `1500ms`).
pub fn window_label(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    for (size, unit) in UNITS {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}
