//! From a request to a decision: validate, match each descriptor to its
//! rule, drop replaced and unlimited limits, send one batch to the store, and
//! turn the store's outcome into one status per descriptor.
//!
//! Protobuf-free: `service.rs` converts in and out. Rules are swapped
//! atomically on reload; a request sees one rule set from start to end.
//!
//! The steps live one concept per file: `bounds` (what a request may ask),
//! `plan` (descriptors matched to limits, and the store batch), `status`
//! (the answer per descriptor), `store_error` (the policy when the store
//! fails), `cache` (answers from the local over-limit cache) and `observe`
//! (metrics). This file holds the types and `decide`, which ties them.

mod bounds;
mod cache;
mod observe;
mod plan;
mod status;
mod store_error;

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::limiter::{Clock, Counting, Identity, SoftRatio, SystemClock};
use crate::overlimit::OverLimitCache;
use crate::request::Request;
use crate::rules::RuleSet;
use crate::store::{CounterStore, LimitOutcome, OverrideSet, StoreError};
use crate::telemetry::metrics::Metrics;

pub use bounds::Bounds;
pub use status::{Reported, Status};
pub use store_error::StoreErrorPolicy;

use observe::{Loaded, Observed};
use plan::{Plan, Planned};

/// Why a request got no decision.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The request itself is wrong; the message says how.
    #[error("{0}")]
    InvalidArgument(String),
    /// The counters could not be reached.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The outcome of a decision as a short code, for metrics and logs: `OK`,
/// `OVER_LIMIT`, or the gRPC status it maps to.
pub fn outcome_code(result: &Result<Decision, DecideError>) -> &'static str {
    match result {
        Ok(decision) if decision.admitted => "OK",
        Ok(_) => "OVER_LIMIT",
        Err(DecideError::InvalidArgument(_)) => "INVALID_ARGUMENT",
        Err(DecideError::Store(_)) => "UNAVAILABLE",
    }
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed (`overall_code` OK).
    pub admitted: bool,
    /// One status per request descriptor, in order.
    pub statuses: Vec<Status>,
}

/// How a [`Limiter`] behaves beyond its rules and store.
#[derive(Clone)]
pub struct LimiterOptions {
    /// Request size bounds.
    pub bounds: Bounds,
    /// What to answer when the store fails.
    pub on_store_error: StoreErrorPolicy,
    /// Where decisions are counted.
    pub metrics: Arc<Metrics>,
    /// Entries of the local over-limit cache; 0 turns it off.
    pub local_cache: usize,
    /// The clock of the local cache.
    pub clock: Arc<dyn Clock>,
    /// `counting` of rules that do not set it (`--counting`).
    pub counting: Counting,
    /// Global shadow mode (envoyproxy/ratelimit's `SHADOW_MODE`): the
    /// overall answer is OK even when a descriptor is over its limit; the
    /// descriptor statuses, counting and metrics are unchanged.
    pub shadow_mode: bool,
    /// Global quota mode: every descriptor that would enforce its limit acts
    /// as a `quota_mode` one (the request is refused only when all of them
    /// are over their limits).
    pub quota_mode: bool,
    /// `soft_ratio` of limits that do not set it (`--soft-ratio`); `None`:
    /// only limits with their own warn.
    pub soft_ratio: Option<SoftRatio>,
}

impl Default for LimiterOptions {
    fn default() -> Self {
        Self {
            bounds: Bounds::default(),
            on_store_error: StoreErrorPolicy::default(),
            metrics: Arc::default(),
            local_cache: 0,
            clock: Arc::new(SystemClock),
            counting: Counting::default(),
            shadow_mode: false,
            quota_mode: false,
            soft_ratio: None,
        }
    }
}

/// Rules plus a store: the decision maker behind every interface.
pub struct Limiter<S> {
    /// Swapped whole on reload; readers never block and never see a mix.
    loaded: ArcSwap<Loaded>,
    store: S,
    bounds: Bounds,
    on_store_error: StoreErrorPolicy,
    metrics: Arc<Metrics>,
    /// Counters known to be full; `None` when turned off.
    cache: Option<OverLimitCache>,
    clock: Arc<dyn Clock>,
    defaults: plan::Defaults,
    shadow_mode: bool,
    /// Upstream's stats (envoyproxy/ratelimit names); `None` when off.
    upstream: Option<Arc<crate::telemetry::upstream::UpstreamStats>>,
    /// The run-time overrides as last loaded from the store, swapped whole
    /// (see [`Limiter::refresh_overrides`]).
    overrides: ArcSwap<OverrideSet>,
}

impl<S: CounterStore> Limiter<S> {
    /// A limiter over `rules` and `store`.
    pub fn new(rules: RuleSet, store: S, bounds: Bounds) -> Self {
        Self::with_options(
            rules,
            store,
            LimiterOptions {
                bounds,
                ..LimiterOptions::default()
            },
        )
    }

    /// A limiter with every option.
    pub fn with_options(rules: RuleSet, store: S, options: LimiterOptions) -> Self {
        options
            .metrics
            .set_limits(observe::configured_limits(&rules));
        Self {
            loaded: ArcSwap::from_pointee(Loaded::new(rules)),
            store,
            bounds: options.bounds,
            on_store_error: options.on_store_error,
            metrics: options.metrics,
            cache: OverLimitCache::new(options.local_cache),
            clock: options.clock,
            defaults: plan::Defaults {
                counting: options.counting,
                quota_mode: options.quota_mode,
                soft_ratio: options.soft_ratio,
            },
            shadow_mode: options.shadow_mode,
            upstream: None,
            overrides: ArcSwap::default(),
        }
    }

    /// Also counts upstream's stats into `stats` (set before sharing the
    /// limiter; a builder so `LimiterOptions` literals stay unchanged).
    #[must_use]
    pub fn with_upstream_stats(
        mut self,
        stats: Option<Arc<crate::telemetry::upstream::UpstreamStats>>,
    ) -> Self {
        // The rules given at construction were a load, as upstream counts it.
        if let Some(stats) = &stats {
            stats.config_load(true);
        }
        self.upstream = stats;
        self
    }

    /// Upstream's stats, when on.
    pub fn upstream_stats(&self) -> Option<&Arc<crate::telemetry::upstream::UpstreamStats>> {
        self.upstream.as_ref()
    }

    /// Where decisions are counted.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.loaded.load().rules.clone()
    }

    /// Puts `rules` in force for every later request.
    pub fn replace_rules(&self, rules: RuleSet) {
        self.metrics.set_limits(observe::configured_limits(&rules));
        self.loaded.store(Arc::new(Loaded::new(rules)));
        if let Some(upstream) = &self.upstream {
            upstream.config_load(true);
        }
    }

    /// A reload that was refused (the rules in force stay): counted in
    /// upstream's `config_load_error` when its stats are on.
    pub fn rules_refused(&self) {
        if let Some(upstream) = &self.upstream {
            upstream.config_load(false);
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Forgets what the local over-limit cache knows of `identity`'s
    /// counters, which were just reset in the store.
    pub fn forget_cached(&self, identity: &Identity) {
        if let Some(cache) = &self.cache {
            cache.forget(identity);
        }
    }

    /// The run-time overrides in force.
    pub fn overrides(&self) -> Arc<OverrideSet> {
        self.overrides.load_full()
    }

    /// Asks the store for the version of its overrides and, when it is not
    /// the version in force, loads them all and puts them in force; whether
    /// it did. Called every few hundred milliseconds on every replica (a
    /// cheap read), and at once after a write through this replica.
    ///
    /// # Errors
    ///
    /// The store failed; the overrides in force stay.
    pub async fn refresh_overrides(&self) -> Result<bool, StoreError> {
        let version = self.store.overrides_version().await?;
        if version == self.overrides.load().version {
            return Ok(false);
        }
        let set = self.store.load_overrides().await?;
        let mut counts: std::collections::BTreeMap<&str, i64> = Default::default();
        let now = self.clock.now();
        for o in set.by_field.values().filter(|o| o.live_at(now)) {
            *counts.entry(o.domain.as_str()).or_default() += 1;
        }
        self.metrics.set_overrides_in_force(counts);
        self.overrides.store(Arc::new(set));
        Ok(true)
    }

    /// Decides `request`, counting it if admitted.
    pub async fn decide(&self, request: &Request) -> Result<Decision, DecideError> {
        self.bounds.check(request)?;
        // Owned, not guards: both are held across the store's await, and
        // a thread holding more guards than arc-swap's few fast slots (many
        // requests waiting on Redis) takes its slow path for every load.
        let loaded = self.loaded.load_full();
        let Some(domain) = loaded.rules.domain(&request.domain) else {
            return Ok(Decision {
                admitted: true,
                statuses: vec![Status::NO_LIMIT; request.descriptors.len()],
            });
        };
        let now = self.clock.now();
        let overrides = self.overrides.load_full();
        let in_force = plan::Overrides {
            set: &overrides,
            now_ms: now,
        };
        let Planned { plans, batch } = plan::plan(domain, request, self.defaults, in_force)?;
        for plan in &plans {
            if matches!(plan, Plan::Limited(limited) if limited.overridden) {
                self.metrics.record_override_applied(&request.domain);
            }
        }

        let mut from_cache = false;
        let (admitted, results) = if let Some(results) = self.answer_from_cache(&batch, now) {
            self.metrics.record_local_cache_hit();
            from_cache = true;
            (false, results)
        } else if batch.items.is_empty() {
            (true, Vec::new())
        } else {
            let started = Instant::now();
            let result = self.store.apply(&batch).await;
            self.metrics.record_store(
                started.elapsed(),
                result.as_ref().err().map(StoreError::kind),
            );
            match result {
                Ok(outcome) => {
                    self.learn(&batch, &outcome.limits, now);
                    (outcome.admitted, outcome.limits)
                }
                Err(error) => return self.on_store_error(error, &plans),
            }
        };
        // A cached answer goes through here exactly as a store answer does
        // (see `overlimit`): the same statuses, the same metrics.
        let mut statuses =
            self.conclude(&loaded, request, &plans, (admitted, from_cache), &results);
        if self.shadow_mode {
            // Nothing is ever refused, so there is nothing to warn of.
            statuses.iter_mut().for_each(|s| s.soft_breach = false);
        }
        Ok(Decision {
            admitted: admitted || self.shadow_mode,
            statuses,
        })
    }

    /// One status per descriptor from the outcomes of the batch (in plan
    /// order), each limited descriptor observed in the metrics.
    fn conclude(
        &self,
        loaded: &Loaded,
        request: &Request,
        plans: &[Plan<'_>],
        (admitted, from_cache): (bool, bool),
        results: &[LimitOutcome],
    ) -> Vec<Status> {
        let mut rest = results;
        plans
            .iter()
            .zip(&request.descriptors)
            .map(|(plan, descriptor)| match plan {
                Plan::NoLimit => Status::NO_LIMIT,
                Plan::Unlimited => Status::UNLIMITED,
                Plan::Limited(limited) => {
                    let (mine, others) = rest.split_at(limited.limits.len().min(rest.len()));
                    rest = others;
                    self.observe(
                        loaded,
                        Observed {
                            domain: &request.domain,
                            descriptor,
                            limited,
                            results: mine,
                            admitted,
                            from_cache,
                        },
                    );
                    Status::of(limited, mine)
                }
            })
            .collect()
    }
}
