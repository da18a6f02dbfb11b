//! Observation: what each limit of a decided request did, counted in the
//! metrics. Counters of rule limits are resolved once per rule set and
//! reused, so the common case allocates nothing.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::limiter::Role;
use crate::request::Descriptor;
use crate::rules::{Limit, Rule, RuleSet};
use crate::store::LimitOutcome;
use crate::telemetry::metrics::{ConfiguredLimit, LimitCounters, LimitEvent, LimitLabels};

use super::Limiter;
use super::plan::{Limited, PlannedLimit};

/// The rules in force and the metric counters of their limits, swapped
/// together so a cached counter never outlives the limit it belongs to.
pub(super) struct Loaded {
    pub rules: Arc<RuleSet>,
    /// Counters per rule limit, keyed by the limit's address (stable while
    /// `rules` lives) and made on first use: looking them up by labels would
    /// allocate and hash three strings per limit per request. Read-mostly,
    /// hence a read-write lock.
    counters: RwLock<HashMap<usize, LimitCounters, foldhash::fast::RandomState>>,
}

impl Loaded {
    pub fn new(rules: RuleSet) -> Self {
        Self {
            rules: Arc::new(rules),
            counters: RwLock::default(),
        }
    }

    /// Counts `event` on `limit`'s counters, made by `make` the first time.
    fn record(&self, limit: &Limit, event: LimitEvent, make: impl FnOnce() -> LimitCounters) {
        let key = std::ptr::from_ref(limit) as usize;
        if let Some(counters) = self.counters.read().get(&key) {
            counters.record(event);
            return;
        }
        self.counters
            .write()
            .entry(key)
            .or_insert_with(make)
            .record(event);
    }
}

/// One limited descriptor of a decided request.
pub(super) struct Observed<'a, 'r> {
    pub domain: &'a str,
    pub descriptor: &'a Descriptor,
    pub limited: &'a Limited<'r>,
    /// The outcomes of `limited.limits`, in order.
    pub results: &'a [LimitOutcome],
    /// Whether the whole request was admitted.
    pub admitted: bool,
    /// Whether the local over-limit cache answered, without the store.
    pub from_cache: bool,
}

impl<S> Limiter<S> {
    /// Counts what each limit of one descriptor did.
    pub(super) fn observe(&self, loaded: &Loaded, seen: Observed<'_, '_>) {
        let Observed {
            domain,
            descriptor,
            limited,
            results,
            admitted,
            from_cache,
        } = seen;
        if let Some(upstream) = &self.upstream {
            upstream_observe(
                upstream,
                domain,
                descriptor,
                limited,
                results,
                (admitted, from_cache),
            );
        }
        let detail = limited
            .rule
            .map(|r| r.metric_descriptor(&descriptor.entries))
            .unwrap_or_default();
        let descriptor = if detail.is_empty() {
            detail
        } else {
            self.metrics.descriptor_label(detail)
        };
        for (limit, result) in limited.limits.iter().zip(results) {
            let event = LimitEvent {
                hits: limited.hits,
                admitted,
                over: result.over,
                shadow: limited.role == Role::Shadow,
                used: result.used,
                capacity: limit.spec.capacity(),
            };
            self.count(loaded, domain, limit, limited.rule, &descriptor, event);
        }
    }

    /// Counts `event` for one limit: through the counters cached for a
    /// rule's limit when no runtime value labels it, else by label lookup.
    fn count(
        &self,
        loaded: &Loaded,
        domain: &str,
        limit: &PlannedLimit<'_>,
        rule: Option<&Rule>,
        descriptor: &str,
        event: LimitEvent,
    ) {
        let labels = || LimitLabels {
            domain: domain.to_owned(),
            limit: metric_limit_name(limit, rule),
            descriptor: descriptor.to_owned(),
        };
        match limit.source {
            Some(source) if descriptor.is_empty() => {
                loaded.record(source, event, || self.metrics.limit_counters(&labels()));
            }
            _ => self.metrics.record_limit(&labels(), event),
        }
    }
}

/// Every limit of `rules`, labelled as its counters are, for
/// `sluice_limit`.
pub(super) fn configured_limits(rules: &RuleSet) -> Vec<ConfiguredLimit> {
    let mut out = Vec::new();
    for domain in rules.domains() {
        for rule in domain.rules() {
            out.extend(rule.limits.iter().map(|limit| {
                ConfiguredLimit {
                    domain: domain.name().to_owned(),
                    limit: limit
                        .name
                        .as_deref()
                        .map_or_else(|| rule.path.clone(), str::to_owned),
                    window_ms: limit.spec.window.duration_ms,
                    requests: limit.spec.requests,
                }
            }));
        }
    }
    out
}

/// A limit's `limit` label: its name, else its rule's path.
fn metric_limit_name(limit: &PlannedLimit<'_>, rule: Option<&Rule>) -> String {
    match (limit.name, rule) {
        (Some(name), _) => name.to_string(),
        (None, Some(rule)) => rule.path.clone(),
        (None, None) => "_override_".to_owned(),
    }
}

/// Upstream's per-rule counters for one descriptor. Upstream has one limit
/// per descriptor; of several, the first over the limit (else the first)
/// stands for the descriptor, so each hit is counted once.
fn upstream_observe(
    upstream: &crate::telemetry::upstream::UpstreamStats,
    domain: &str,
    descriptor: &Descriptor,
    limited: &Limited<'_>,
    results: &[LimitOutcome],
    (admitted, from_cache): (bool, bool),
) {
    use crate::rules::detailed_stats_key;
    use crate::telemetry::upstream::RuleCounts;
    let Some(rule) = limited.rule else { return };
    let Some((limit, result)) = limited
        .limits
        .iter()
        .zip(results)
        .find(|(_, r)| r.over)
        .or_else(|| limited.limits.iter().zip(results).next())
    else {
        return;
    };
    let shadow = limited.role == Role::Shadow;
    let hits = limited.hits;
    // `used` is after this request when it was admitted, before otherwise.
    let before = if admitted {
        result.used.saturating_sub(hits)
    } else {
        result.used
    };
    let counts = if from_cache {
        RuleCounts::local_cache(hits, shadow)
    } else {
        RuleCounts::from_counter(limit.spec.capacity(), before, hits, shadow)
    };
    if rule.detailed_metric {
        let key = detailed_stats_key(
            domain,
            descriptor
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str())),
        );
        upstream.rule(&key, counts);
    } else {
        upstream.rule(&rule.stats_key, counts);
    }
}
