//! The RLQS metrics, every name defined here once, in their own registry
//! (served at `/metrics/rlqs`, beside RLS's `/metrics`).
//!
//! Per-bucket gauges carry the bucket id as a label; a bucket's series is
//! removed when the bucket goes, and at most [`MAX_BUCKET_SERIES`] buckets
//! are labelled at once, so cardinality stays bounded.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::alloc::Budget;
use super::types::{Assignment, BucketKey};

/// Most buckets with their own demand and budget series.
pub const MAX_BUCKET_SERIES: usize = 1_000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BucketLabels {
    domain: String,
    bucket: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// Counters and gauges of the RLQS service.
pub struct RlqsMetrics {
    registry: Registry,
    /// Streams open now.
    pub streams: Gauge,
    /// Streams refused (cap reached).
    pub streams_refused: Counter,
    /// Streams opened (accepted) so far: their rate beside `streams` shows
    /// clients reconnecting.
    pub streams_opened: Counter,
    /// Buckets reported by at least one stream.
    pub buckets: Gauge,
    /// Usage reports received.
    pub reports: Counter,
    /// Abandon actions sent.
    pub abandons: Counter,
    assignments: Family<KindLabels, Counter>,
    demand: Family<BucketLabels, Gauge<f64, AtomicU64>>,
    budget: Family<BucketLabels, Gauge<f64, AtomicU64>>,
    /// The buckets that have series, to keep them under the cap.
    labelled: Mutex<HashSet<BucketLabels>>,
}

impl Default for RlqsMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let metrics = Self {
            registry: Registry::default(),
            streams: Gauge::default(),
            streams_refused: Counter::default(),
            streams_opened: Counter::default(),
            buckets: Gauge::default(),
            reports: Counter::default(),
            abandons: Counter::default(),
            assignments: Family::default(),
            demand: Family::default(),
            budget: Family::default(),
            labelled: Mutex::new(HashSet::new()),
        };
        registry.register(
            "sluice_rlqs_streams",
            "RLQS streams open",
            metrics.streams.clone(),
        );
        registry.register(
            "sluice_rlqs_streams_refused",
            "RLQS streams refused because the stream cap was reached",
            metrics.streams_refused.clone(),
        );
        registry.register(
            "sluice_rlqs_streams_opened",
            "RLQS streams accepted since the start",
            metrics.streams_opened.clone(),
        );
        registry.register(
            "sluice_rlqs_buckets",
            "RLQS buckets reported by at least one stream",
            metrics.buckets.clone(),
        );
        registry.register(
            "sluice_rlqs_reports",
            "RLQS usage reports received",
            metrics.reports.clone(),
        );
        registry.register(
            "sluice_rlqs_abandons",
            "RLQS abandon actions sent for idle buckets",
            metrics.abandons.clone(),
        );
        registry.register(
            "sluice_rlqs_assignments",
            "RLQS assignments changed, by kind (token_bucket, allow_all, deny_all)",
            metrics.assignments.clone(),
        );
        registry.register(
            "sluice_rlqs_bucket_demand_per_second",
            "Smoothed requests per second offered to a bucket by every stream (other replicas' too, with Redis)",
            metrics.demand.clone(),
        );
        registry.register(
            "sluice_rlqs_bucket_budget_per_second",
            "The global budget of a bucket in requests per second (absent: allow-all)",
            metrics.budget.clone(),
        );
        // At zero from the start, so a panel or an alert on their rate has
        // data before the first assignment.
        for kind in ["token_bucket", "allow_all", "deny_all"] {
            metrics.assignments.get_or_create_owned(&KindLabels {
                kind: kind.to_owned(),
            });
        }
        Self {
            registry,
            ..metrics
        }
    }
}

impl RlqsMetrics {
    /// The Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// One changed assignment.
    pub fn record_assignment(&self, assignment: &Assignment) {
        let kind = match assignment {
            Assignment::AllowAll => "allow_all",
            Assignment::DenyAll => "deny_all",
            Assignment::TokenBucket { .. } => "token_bucket",
        };
        self.assignments
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// A bucket's demand (micro-requests per second) and budget after a split.
    pub fn record_bucket(&self, key: &BucketKey, demand: u64, budget: Option<&Budget>) {
        let labels = labels(key);
        {
            let mut labelled = self.labelled.lock();
            if !labelled.contains(&labels) {
                if labelled.len() >= MAX_BUCKET_SERIES {
                    return;
                }
                labelled.insert(labels.clone());
            }
        }
        self.demand.get_or_create(&labels).set(demand as f64 / 1e6);
        match budget {
            Some(b) => {
                self.budget
                    .get_or_create(&labels)
                    .set(b.tokens as f64 / b.fill_secs as f64);
            }
            None => {
                self.budget.remove(&labels);
            }
        }
    }

    /// A bucket is gone: its series too.
    pub fn forget_bucket(&self, key: &BucketKey) {
        let labels = labels(key);
        if self.labelled.lock().remove(&labels) {
            self.demand.remove(&labels);
            self.budget.remove(&labels);
        }
    }
}

fn labels(key: &BucketKey) -> BucketLabels {
    BucketLabels {
        domain: key.domain.clone(),
        bucket: key.label(),
    }
}
