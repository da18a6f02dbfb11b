//! Prometheus metrics: every metric name is defined here, once.
//!
//! Label cardinality is bounded by construction: `domain` and `limit` come
//! from the loaded rules (never from a request), and runtime descriptor values
//! appear only for rules that ask for them (`detailed_metric`,
//! `value_to_metric`), capped at `max_descriptor_labels` distinct values —
//! beyond the cap they are counted under `descriptor="_other_"`.

use std::collections::HashSet;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod limits;
mod operations;
mod overrides;

pub use limits::{LimitCounters, LimitEvent};
use limits::{Series, add_hits};

use operations::Operations;
pub use operations::{
    ConfiguredLimit, EVICTION_REASONS, MemoryStoreMetrics, ReconcileCounters, window_label,
};

/// Latency buckets in seconds, from 50 µs to 1 s.
const LATENCY_BUCKETS: [f64; 13] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The label value used once the descriptor-label cap is reached.
pub const OTHER: &str = "_other_";

/// Labels of the per-limit counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// A domain of the loaded rules.
    pub domain: String,
    /// The limit's `name`, or its rule path when it has none.
    pub limit: String,
    /// Runtime `key=value` pairs, only for rules that ask for them; else empty.
    pub descriptor: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedLabels {
    listener: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// The listeners, as the `listener` label names them.
const LISTENERS: [&str; 2] = ["grpc", "http"];

/// Why the server closed a connection itself (`reason` label).
const CLOSE_REASONS: [&str; 3] = ["handshake_timeout", "idle_timeout", "max_age"];

/// Why a gRPC request was refused before the handler saw it (`reason` label).
const INVALID_REASONS: [&str; 4] = ["decode", "content_type", "too_large", "timeout"];

/// The connection series of one listener, looked up once: cloning a
/// prometheus-client metric clones a handle, so the accept loop and the
/// connection tasks update them without any lookup.
#[derive(Clone, Debug)]
pub struct ConnectionCounters {
    /// Connections open now.
    pub open: Gauge,
    /// Connections refused because the listener was full.
    pub refused: Counter,
    /// Closed by the server: no handshake in time.
    pub handshake_timeout: Counter,
    /// Closed by the server: no request for the idle timeout.
    pub idle_timeout: Counter,
    /// Closed by the server: older than the maximum connection age.
    pub max_age: Counter,
}

/// The `sluice_requests_invalid_total` series, looked up once.
#[derive(Clone, Debug)]
pub struct InvalidRequestCounters {
    /// The message was not a valid protobuf message (garbage, truncated,
    /// invalid UTF-8 in a string).
    pub decode: Counter,
    /// The content-type was not gRPC.
    pub content_type: Counter,
    /// The message was larger than the cap.
    pub too_large: Counter,
    /// The request did not arrive (and get an answer) in time.
    pub timeout: Counter,
    /// `sluice_tls_handshake_failures_total{listener="grpc"}`: connections
    /// refused at the TLS handshake, before any request.
    pub tls_handshake_failures: Counter,
    /// `sluice_requests_total{code="INVALID_ARGUMENT"}`: a ShouldRateLimit
    /// call refused before the handler is still a call with that outcome.
    pub rls_invalid_argument: Counter,
}

/// Settings of the metrics.
#[derive(Clone, Copy, Debug)]
pub struct MetricsConfig {
    /// Share of a limit from which admitted hits also count as near the limit.
    pub near_limit_ratio: f64,
    /// Most distinct runtime descriptor label values.
    pub max_descriptor_labels: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            near_limit_ratio: 0.8,
            max_descriptor_labels: 1_000,
        }
    }
}

/// The outcome codes of a ShouldRateLimit call (see `decision::outcome_code`).
const REQUEST_CODES: [&str; 4] = ["OK", "OVER_LIMIT", "INVALID_ARGUMENT", "UNAVAILABLE"];

/// Every metric of the service.
pub struct Metrics {
    registry: Registry,
    config: MetricsConfig,
    hits: Family<LimitLabels, Counter>,
    admitted: Family<LimitLabels, Counter>,
    over_limit: Family<LimitLabels, Counter>,
    near_limit: Family<LimitLabels, Counter>,
    shadow_mode: Family<LimitLabels, Counter>,
    requests: Family<CodeLabels, Counter>,
    /// The `requests` counters of the known codes, looked up once.
    request_codes: [(&'static str, Counter); 4],
    request_seconds: Histogram,
    store_seconds: Histogram,
    store_errors: Family<KindLabels, Counter>,
    store_error_policy: Family<PolicyLabels, Counter>,
    local_cache_hits: Counter,
    store_refund_failures: Counter,
    reloads: Family<ResultLabels, Counter>,
    tls_reloads: Family<ResultLabels, Counter>,
    connections_open: Family<ListenerLabels, Gauge>,
    connections_refused: Family<ListenerLabels, Counter>,
    connections_closed: Family<ClosedLabels, Counter>,
    requests_invalid: Family<ReasonLabels, Counter>,
    rules_loaded: Gauge<f64, std::sync::atomic::AtomicU64>,
    rules_refused: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Limits, build, memory store, reconciliations, TLS handshakes.
    operations: Operations,
    /// Run-time overrides.
    overrides: overrides::Overrides,
    /// Runtime descriptor label values seen so far; a lock because any
    /// request may add one, and the set is what bounds the cardinality.
    descriptors: Mutex<HashSet<String>>,
}

impl Metrics {
    /// Every metric, registered and at zero.
    pub fn new(config: MetricsConfig) -> Self {
        let mut registry = Registry::default();
        let latency = || Histogram::new(LATENCY_BUCKETS);
        let metrics = Self {
            config,
            hits: Family::default(),
            admitted: Family::default(),
            over_limit: Family::default(),
            near_limit: Family::default(),
            shadow_mode: Family::default(),
            requests: Family::default(),
            request_codes: REQUEST_CODES.map(|code| (code, Counter::default())),
            request_seconds: latency(),
            store_seconds: latency(),
            store_errors: Family::default(),
            store_error_policy: Family::default(),
            local_cache_hits: Counter::default(),
            store_refund_failures: Counter::default(),
            reloads: Family::default(),
            tls_reloads: Family::default(),
            connections_open: Family::default(),
            connections_refused: Family::default(),
            connections_closed: Family::default(),
            requests_invalid: Family::default(),
            rules_loaded: Gauge::default(),
            rules_refused: Gauge::default(),
            operations: Operations::default(),
            overrides: overrides::Overrides::default(),
            descriptors: Mutex::new(HashSet::new()),
            registry: Registry::default(),
        };
        metrics.register_decisions(&mut registry);
        metrics.register_store(&mut registry);
        metrics.register_service(&mut registry);
        metrics.operations.register(&mut registry);
        metrics.overrides.register(&mut registry);
        let request_codes = metrics.known_series();
        Self {
            registry,
            request_codes,
            ..metrics
        }
    }

    /// The decisions: hits, admissions, requests and their latency.
    fn register_decisions(&self, registry: &mut Registry) {
        // prometheus-client appends `_total` to counters.
        registry.register(
            "sluice_hits",
            "Weighted hits checked against a limit",
            self.hits.clone(),
        );
        registry.register(
            "sluice_admitted",
            "Weighted hits admitted and counted",
            self.admitted.clone(),
        );
        registry.register(
            "sluice_over_limit",
            "Weighted hits that did not fit an enforced limit",
            self.over_limit.clone(),
        );
        registry.register(
            "sluice_near_limit",
            "Weighted hits admitted at or above the near-limit ratio of a limit",
            self.near_limit.clone(),
        );
        registry.register(
            "sluice_shadow_mode",
            "Weighted hits over a shadow-mode limit (not rejected)",
            self.shadow_mode.clone(),
        );
        registry.register(
            "sluice_requests",
            "ShouldRateLimit calls by outcome",
            self.requests.clone(),
        );
        registry.register(
            "sluice_request_duration_seconds",
            "ShouldRateLimit latency",
            self.request_seconds.clone(),
        );
    }

    /// The counter store: latency, errors and what answered them.
    fn register_store(&self, registry: &mut Registry) {
        registry.register(
            "sluice_store_duration_seconds",
            "Counter store call latency",
            self.store_seconds.clone(),
        );
        registry.register(
            "sluice_store_errors",
            "Counter store failures by kind",
            self.store_errors.clone(),
        );
        registry.register(
            "sluice_store_error_decisions",
            "Requests answered by the store-error policy",
            self.store_error_policy.clone(),
        );
        registry.register(
            "sluice_local_cache_hits",
            "Over-limit answers given from the local cache",
            self.local_cache_hits.clone(),
        );
        registry.register(
            "sluice_store_refund_failures",
            "Refund calls to Redis that failed: the hits they were to take back stay counted until their window passes",
            self.store_refund_failures.clone(),
        );
    }

    /// Reloads, rules, connections and refused requests.
    fn register_service(&self, registry: &mut Registry) {
        registry.register(
            "sluice_rules_reloads",
            "Rules reloads by result",
            self.reloads.clone(),
        );
        registry.register(
            "sluice_tls_reloads",
            "gRPC TLS certificate reloads by result",
            self.tls_reloads.clone(),
        );
        registry.register(
            "sluice_rules_loaded_timestamp_seconds",
            "When the rules in force were loaded (Unix time)",
            self.rules_loaded.clone(),
        );
        registry.register(
            "sluice_rules_reload_error_timestamp_seconds",
            "When a rules reload was last refused (Unix time; 0: never)",
            self.rules_refused.clone(),
        );
        registry.register(
            "sluice_connections_open",
            "Connections open now, by listener",
            self.connections_open.clone(),
        );
        registry.register(
            "sluice_connections_refused",
            "Connections refused because the listener had its maximum open",
            self.connections_refused.clone(),
        );
        registry.register(
            "sluice_connections_closed",
            "Connections the server closed itself, by listener and reason",
            self.connections_closed.clone(),
        );
        registry.register(
            "sluice_requests_invalid",
            "gRPC requests refused before reaching a handler, by reason",
            self.requests_invalid.clone(),
        );
    }

    /// Creates the known series at zero, so that alerts on their rate work
    /// before the first event; returns the request counters by code.
    fn known_series(&self) -> [(&'static str, Counter); 4] {
        for listener in LISTENERS {
            self.connection_counters(listener);
        }
        self.invalid_request_counters();
        for result in ["success", "error"] {
            self.reloads.get_or_create_owned(&ResultLabels {
                result: result.to_owned(),
            });
        }
        for policy in ["unavailable", "allow", "deny"] {
            self.store_error_policy.get_or_create_owned(&PolicyLabels {
                policy: policy.to_owned(),
            });
        }
        for kind in ["unavailable", "timeout", "circuit_open"] {
            self.store_errors.get_or_create_owned(&KindLabels {
                kind: kind.to_owned(),
            });
        }
        REQUEST_CODES.map(|code| {
            let counter = self.requests.get_or_create_owned(&CodeLabels {
                code: code.to_owned(),
            });
            (code, counter)
        })
    }

    /// The text exposition (OpenMetrics, which Prometheus scrapes).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// A runtime descriptor label value, or [`OTHER`] once the cap is reached.
    pub fn descriptor_label(&self, value: String) -> String {
        let mut seen = self.descriptors.lock();
        if seen.contains(&value) {
            return value;
        }
        if seen.len() >= self.config.max_descriptor_labels {
            return OTHER.to_owned();
        }
        seen.insert(value.clone());
        value
    }

    /// Counts what a limit did in a decision, creating only the series the
    /// event touches (the path of runtime-labelled limits, whose label sets
    /// are many).
    pub fn record_limit(&self, labels: &LimitLabels, event: LimitEvent) {
        event.series(self.config.near_limit_ratio, |series, hits| {
            let family = match series {
                Series::Hits => &self.hits,
                Series::Admitted => &self.admitted,
                Series::NearLimit => &self.near_limit,
                Series::OverLimit => &self.over_limit,
                Series::ShadowMode => &self.shadow_mode,
            };
            add_hits(&family.get_or_create(labels), hits);
        });
    }

    /// The counters of one label set, to keep and update without looking
    /// them up again: the decision path caches one per limit of the rules.
    pub fn limit_counters(&self, labels: &LimitLabels) -> LimitCounters {
        LimitCounters {
            hits: self.hits.get_or_create(labels).clone(),
            admitted: self.admitted.get_or_create(labels).clone(),
            over_limit: self.over_limit.get_or_create(labels).clone(),
            near_limit: self.near_limit.get_or_create(labels).clone(),
            shadow_mode: self.shadow_mode.get_or_create(labels).clone(),
            near_limit_ratio: self.config.near_limit_ratio,
        }
    }

    /// Counts a ShouldRateLimit call (by its outcome code) and its latency.
    pub fn record_request(&self, code: &str, elapsed: Duration) {
        match self.request_codes.iter().find(|(known, _)| *known == code) {
            Some((_, counter)) => {
                counter.inc();
            }
            None => {
                self.requests
                    .get_or_create(&CodeLabels {
                        code: code.to_owned(),
                    })
                    .inc();
            }
        }
        self.request_seconds.observe(elapsed.as_secs_f64());
    }

    /// Records a store call's latency, and its failure kind if it failed.
    pub fn record_store(&self, elapsed: Duration, error: Option<&str>) {
        self.store_seconds.observe(elapsed.as_secs_f64());
        if let Some(kind) = error {
            self.store_errors
                .get_or_create(&KindLabels {
                    kind: kind.to_owned(),
                })
                .inc();
        }
    }

    /// Counts a request answered by the store-error policy.
    pub fn record_store_error_policy(&self, policy: &str) {
        self.store_error_policy
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .inc();
    }

    /// Counts an answer given from the local over-limit cache.
    pub fn record_local_cache_hit(&self) {
        self.local_cache_hits.inc();
    }

    /// The counter of refund calls that failed, for the store that makes
    /// them.
    pub fn store_refund_failures(&self) -> Counter {
        self.store_refund_failures.clone()
    }

    /// Counts a rules reload, and records when the rules were loaded (on
    /// success) or last refused.
    pub fn record_reload(&self, ok: bool, unix_seconds: f64) {
        let result = if ok { "success" } else { "error" };
        self.reloads
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
        if ok {
            self.rules_loaded.set(unix_seconds);
        } else {
            self.rules_refused.set(unix_seconds);
        }
    }

    /// The gRPC listener's TLS reload counters: files that took effect,
    /// and files that changed but could not be used.
    pub fn tls_reload_counters(&self) -> (Counter, Counter) {
        let result = |result: &str| {
            self.tls_reloads.get_or_create_owned(&ResultLabels {
                result: result.to_owned(),
            })
        };
        (result("success"), result("error"))
    }

    /// The connection series of `listener` (`grpc` or `http`).
    pub fn connection_counters(&self, listener: &str) -> ConnectionCounters {
        let labels = ListenerLabels {
            listener: listener.to_owned(),
        };
        let closed = |reason: &str| {
            self.connections_closed.get_or_create_owned(&ClosedLabels {
                listener: listener.to_owned(),
                reason: reason.to_owned(),
            })
        };
        let [handshake_timeout, idle_timeout, max_age] = CLOSE_REASONS.map(closed);
        ConnectionCounters {
            open: self.connections_open.get_or_create_owned(&labels),
            refused: self.connections_refused.get_or_create_owned(&labels),
            handshake_timeout,
            idle_timeout,
            max_age,
        }
    }

    /// The series of gRPC requests refused before a handler.
    pub fn invalid_request_counters(&self) -> InvalidRequestCounters {
        let [decode, content_type, too_large, timeout] = INVALID_REASONS.map(|reason| {
            self.requests_invalid.get_or_create_owned(&ReasonLabels {
                reason: reason.to_owned(),
            })
        });
        InvalidRequestCounters {
            decode,
            content_type,
            too_large,
            timeout,
            tls_handshake_failures: self.tls_handshake_failures("grpc"),
            rls_invalid_argument: self.requests.get_or_create_owned(&CodeLabels {
                code: "INVALID_ARGUMENT".to_owned(),
            }),
        }
    }

    /// Records when the rules in force were loaded (at start).
    pub fn record_rules_loaded(&self, unix_seconds: f64) {
        self.rules_loaded.set(unix_seconds);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(MetricsConfig::default())
    }
}

#[cfg(test)]
mod tests;
