//! From a request to a decision: validate, match each descriptor to its
//! rule, drop replaced and unlimited limits, send one batch to the store, and
//! turn the store's outcome into one status per descriptor.
//!
//! Protobuf-free: `service.rs` converts in and out. Rules are swapped
//! atomically on reload; a request sees one rule set from start to end.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use parking_lot::RwLock;

use crate::limiter::{
    Algorithm, Clock, IdentityBuilder, LimitSpec, MAX_HITS, Millis, Role, SystemClock, Window,
    admits,
};
use crate::overlimit::OverLimitCache;
use crate::request::{Descriptor, Request};
use crate::rules::{DEFAULT_BUCKETS, Limit, Rule, RuleSet, Unit};
use crate::store::{Batch, BatchItem, CounterStore, LimitOutcome, StoreError};
use crate::telemetry::metrics::{LimitCounters, LimitEvent, LimitLabels, Metrics};

/// Limits on the size of one request, so no request can cost unbounded work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Most descriptors in one request.
    pub max_descriptors: usize,
    /// Most entries in one descriptor.
    pub max_entries: usize,
    /// Longest domain, entry key or entry value, in bytes.
    pub max_entry_bytes: usize,
    /// Largest weight (`hits_addend`) of a request or descriptor. Weights
    /// above [`MAX_HITS`] are refused whatever this says, and so is a request
    /// whose descriptors' weights add up to more than it.
    pub max_hits_addend: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_descriptors: 64,
            max_entries: 32,
            max_entry_bytes: 16_384,
            max_hits_addend: 1_000_000_000,
        }
    }
}

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

/// The answer for one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// `code` OVER_LIMIT (shadow-mode descriptors are never over limit here).
    pub over_limit: bool,
    /// The descriptor's tightest limit; `None` when no limit applied.
    pub limit: Option<Reported>,
    /// Requests left: after this one when admitted, headroom otherwise.
    /// `u32::MAX` for unlimited descriptors.
    pub remaining: u64,
    /// When the reported limit's headroom next grows.
    pub reset_ms: Option<u64>,
}

/// A limit as reported back to the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reported {
    /// Requests allowed per window.
    pub requests: u64,
    /// The unit reported in `current_limit.unit`.
    pub unit: Unit,
    /// The window length in milliseconds.
    pub window_ms: u64,
    /// `rate_limit.name`, if the rule gave one.
    pub name: Option<Arc<str>>,
}

impl Status {
    const NO_LIMIT: Status = Status {
        over_limit: false,
        limit: None,
        remaining: 0,
        reset_ms: None,
    };
    const UNLIMITED: Status = Status {
        over_limit: false,
        limit: None,
        remaining: u32::MAX as u64,
        reset_ms: None,
    };
}

/// What one descriptor turned into before the store is asked.
enum Plan<'r> {
    NoLimit,
    Unlimited,
    Limited {
        limits: Vec<PlannedLimit<'r>>,
        role: Role,
        /// The matched rule; `None` for a request-supplied override.
        rule: Option<&'r Rule>,
    },
}

/// A limit to check: from a rule, or from the request's override.
struct PlannedLimit<'r> {
    /// The rule's limit; `None` for an override.
    source: Option<&'r Limit>,
    spec: LimitSpec,
    unit: Unit,
    name: Option<&'r Arc<str>>,
    replaces: &'r [String],
}

impl<'r> From<&'r Limit> for PlannedLimit<'r> {
    fn from(limit: &'r Limit) -> Self {
        Self {
            source: Some(limit),
            spec: limit.spec,
            unit: limit.unit,
            name: limit.name.as_ref(),
            replaces: &limit.replaces,
        }
    }
}

/// What to answer when the counter store fails.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum StoreErrorPolicy {
    /// gRPC UNAVAILABLE, so Envoy's `failure_mode_deny` decides.
    #[default]
    Unavailable,
    /// Admit: every descriptor OK, without a limit.
    Allow,
    /// Reject: every limited descriptor OVER_LIMIT.
    Deny,
}

impl StoreErrorPolicy {
    /// The name in settings and metrics.
    pub fn name(self) -> &'static str {
        match self {
            StoreErrorPolicy::Unavailable => "unavailable",
            StoreErrorPolicy::Allow => "allow",
            StoreErrorPolicy::Deny => "deny",
        }
    }
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
}

impl Default for LimiterOptions {
    fn default() -> Self {
        Self {
            bounds: Bounds::default(),
            on_store_error: StoreErrorPolicy::default(),
            metrics: Arc::default(),
            local_cache: 0,
            clock: Arc::new(SystemClock),
        }
    }
}

/// The rules in force and the metric counters of their limits, swapped
/// together so a cached counter never outlives the limit it belongs to.
struct Loaded {
    rules: Arc<RuleSet>,
    /// Counters per rule limit, keyed by the limit's address (stable while
    /// `rules` lives) and made on first use: looking them up by labels would
    /// allocate and hash three strings per limit per request. Read-mostly,
    /// hence a read-write lock.
    counters: RwLock<HashMap<usize, LimitCounters, foldhash::fast::RandomState>>,
}

impl Loaded {
    fn new(rules: RuleSet) -> Self {
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
        Self {
            loaded: ArcSwap::from_pointee(Loaded::new(rules)),
            store,
            bounds: options.bounds,
            on_store_error: options.on_store_error,
            metrics: options.metrics,
            cache: OverLimitCache::new(options.local_cache),
            clock: options.clock,
        }
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
        self.loaded.store(Arc::new(Loaded::new(rules)));
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Decides `request`, counting it if admitted.
    pub async fn decide(&self, request: &Request) -> Result<Decision, DecideError> {
        self.bounds.check(request)?;
        let loaded = self.loaded.load();
        let Some(domain) = loaded.rules.domain(&request.domain) else {
            return Ok(Decision {
                admitted: true,
                statuses: vec![Status::NO_LIMIT; request.descriptors.len()],
            });
        };

        let mut batch = Batch::default();
        let mut plans = Vec::with_capacity(request.descriptors.len());
        for descriptor in &request.descriptors {
            let plan = match &descriptor.limit {
                Some(limit) => {
                    let mut identity = IdentityBuilder::new(&request.domain);
                    for entry in &descriptor.entries {
                        identity.value(&entry.key, &entry.value);
                    }
                    let spec = override_spec(limit.requests_per_unit, limit.unit)?;
                    batch
                        .items
                        .push(item(identity.build(), request, descriptor, Role::Enforce));
                    Plan::Limited {
                        limits: vec![PlannedLimit {
                            source: None,
                            spec,
                            unit: limit.unit,
                            name: None,
                            replaces: &[],
                        }],
                        role: Role::Enforce,
                        rule: None,
                    }
                }
                None => match domain.find(&descriptor.entries) {
                    None => Plan::NoLimit,
                    Some(found) if found.rule.unlimited => Plan::Unlimited,
                    Some(found) => {
                        batch.items.push(item(
                            found.identity,
                            request,
                            descriptor,
                            found.rule.role,
                        ));
                        Plan::Limited {
                            limits: found.rule.limits.iter().map(PlannedLimit::from).collect(),
                            role: found.rule.role,
                            rule: Some(found.rule),
                        }
                    }
                },
            };
            plans.push(plan);
        }

        // `replaces`: a limit named by any matched limit is neither checked
        // nor counted; a descriptor left without limits reports OK.
        let replaced: HashSet<&str> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Limited { limits, .. } => Some(limits),
                _ => None,
            })
            .flatten()
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        let mut items = batch.items.into_iter();
        batch.items = Vec::with_capacity(items.len());
        for plan in &mut plans {
            if let Plan::Limited { limits, .. } = plan {
                let mut item = items.next().expect("one batch item per limited plan");
                if !replaced.is_empty() {
                    limits.retain(|l| l.name.is_none_or(|n| !replaced.contains(&**n)));
                }
                if limits.is_empty() {
                    *plan = Plan::NoLimit;
                    continue;
                }
                item.limits = limits.iter().map(|l| l.spec).collect();
                batch.items.push(item);
            }
        }

        let now = self.clock.now();
        let (admitted, results) = match self.answer_from_cache(&batch, now) {
            Some(results) => {
                self.metrics.record_local_cache_hit();
                (false, results)
            }
            None if batch.items.is_empty() => (true, Vec::new()),
            None => {
                let started = Instant::now();
                let result = self.store.apply(&batch).await;
                let kind = result.as_ref().err().map(StoreError::kind);
                self.metrics.record_store(started.elapsed(), kind);
                match result {
                    Ok(outcome) => {
                        self.learn(&batch, &outcome.limits, now);
                        (outcome.admitted, outcome.limits)
                    }
                    Err(error) => return self.on_store_error(error, &plans),
                }
            }
        };
        // A cached answer goes through here exactly as a store answer does
        // (see `overlimit`): the same statuses, the same metrics.
        let mut offset = 0;
        let statuses = plans
            .iter()
            .zip(&request.descriptors)
            .map(|(plan, descriptor)| match plan {
                Plan::NoLimit => Status::NO_LIMIT,
                Plan::Unlimited => Status::UNLIMITED,
                Plan::Limited { limits, role, rule } => {
                    let mine = &results[offset..offset + limits.len()];
                    offset += limits.len();
                    let hits = weight(request, descriptor);
                    self.record(
                        &loaded,
                        &request.domain,
                        descriptor,
                        *rule,
                        limits,
                        mine,
                        *role,
                        admitted,
                        hits,
                    );
                    status(limits, mine, *role)
                }
            })
            .collect();
        Ok(Decision { admitted, statuses })
    }
}

impl<S> Limiter<S> {
    /// Counts what each limit of one descriptor did.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        loaded: &Loaded,
        domain: &str,
        descriptor: &Descriptor,
        rule: Option<&Rule>,
        limits: &[PlannedLimit<'_>],
        results: &[LimitOutcome],
        role: Role,
        admitted: bool,
        hits: u64,
    ) {
        let detail = rule
            .map(|r| r.metric_descriptor(&descriptor.entries))
            .unwrap_or_default();
        let descriptor = if detail.is_empty() {
            detail
        } else {
            self.metrics.descriptor_label(detail)
        };
        for (limit, result) in limits.iter().zip(results) {
            let event = LimitEvent {
                hits,
                admitted,
                over: result.over,
                shadow: role == Role::Shadow,
                used: result.used,
                capacity: limit.spec.capacity(),
            };
            self.count(loaded, domain, limit, rule, &descriptor, event);
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

    /// The store's per-limit outcomes for `batch`, known without calling
    /// it: only when every limit of the batch is a counter known full, every
    /// item has a weight, and the roles make that a rejection (see
    /// `overlimit` for why the answer is then the store's).
    fn answer_from_cache(&self, batch: &Batch, now: Millis) -> Option<Vec<LimitOutcome>> {
        let cache = self.cache.as_ref()?;
        if batch.items.is_empty()
            || batch.items.iter().any(|item| item.hits == 0)
            || admits(batch.items.iter().map(|item| (item.role, true)))
        {
            return None;
        }
        batch
            .items
            .iter()
            .flat_map(|item| item.limits.iter().map(move |limit| (item, limit)))
            .map(|(item, limit)| cache.outcome(&item.identity, limit, now))
            .collect()
    }

    /// Tells the cache what the store reported for every counter of `batch`.
    fn learn(&self, batch: &Batch, results: &[LimitOutcome], now: Millis) {
        let Some(cache) = &self.cache else { return };
        let limits = batch
            .items
            .iter()
            .flat_map(|item| item.limits.iter().map(move |l| (item, l)));
        for ((item, limit), result) in limits.zip(results) {
            cache.learn(&item.identity, limit, result, now);
        }
    }

    /// Answers a request whose store call failed, as the policy says.
    fn on_store_error(
        &self,
        error: StoreError,
        plans: &[Plan<'_>],
    ) -> Result<Decision, DecideError> {
        let policy = self.on_store_error;
        self.metrics.record_store_error_policy(policy.name());
        match policy {
            StoreErrorPolicy::Unavailable => Err(DecideError::Store(error)),
            StoreErrorPolicy::Allow | StoreErrorPolicy::Deny => {
                let deny = policy == StoreErrorPolicy::Deny;
                tracing::warn!(error = %error, policy = policy.name(), "counter store failed; answering by policy");
                let statuses = plans
                    .iter()
                    .map(|plan| match plan {
                        Plan::Limited { role, .. } => Status {
                            over_limit: deny && *role != Role::Shadow,
                            ..Status::NO_LIMIT
                        },
                        Plan::Unlimited => Status::UNLIMITED,
                        Plan::NoLimit => Status::NO_LIMIT,
                    })
                    .collect();
                Ok(Decision {
                    admitted: !deny,
                    statuses,
                })
            }
        }
    }
}

/// A limit's `limit` label: its name, else its rule's path.
fn metric_limit_name(limit: &PlannedLimit<'_>, rule: Option<&Rule>) -> String {
    match (limit.name, rule) {
        (Some(name), _) => name.to_string(),
        (None, Some(rule)) => rule.path.clone(),
        (None, None) => "_override_".to_owned(),
    }
}

fn item(
    identity: crate::limiter::Identity,
    request: &Request,
    descriptor: &Descriptor,
    role: Role,
) -> BatchItem {
    BatchItem {
        identity,
        limits: Vec::new(),
        hits: weight(request, descriptor),
        role,
    }
}

/// A descriptor's own `hits_addend` when set (0 means check only), else the
/// request's, where 0 means 1.
fn weight(request: &Request, descriptor: &Descriptor) -> u64 {
    descriptor
        .hits_addend
        .unwrap_or_else(|| u64::from(request.hits_addend.max(1)))
}

/// The counting of a request-supplied limit: the default sliding window.
fn override_spec(requests: u32, unit: Unit) -> Result<LimitSpec, DecideError> {
    let duration_ms = unit.millis().ok_or_else(|| {
        DecideError::InvalidArgument("descriptor limit override has no valid unit".into())
    })?;
    Ok(LimitSpec {
        requests: u64::from(requests),
        window: Window {
            duration_ms,
            algorithm: Algorithm::SlidingWindow {
                precision_ms: duration_ms / DEFAULT_BUCKETS,
            },
        },
    })
}

/// One descriptor's status from its limits' outcomes: the limit that rejected
/// it, or else the one with the least headroom, is the one reported.
fn status(limits: &[PlannedLimit<'_>], results: &[LimitOutcome], role: Role) -> Status {
    let remaining = |i: usize| limits[i].spec.capacity().saturating_sub(results[i].used);
    let chosen = results
        .iter()
        .position(|r| r.over)
        .unwrap_or_else(|| (0..limits.len()).min_by_key(|&i| remaining(i)).unwrap_or(0));
    let limit = &limits[chosen];
    Status {
        over_limit: results[chosen].over && role != Role::Shadow,
        limit: Some(Reported {
            requests: limit.spec.requests,
            unit: limit.unit,
            window_ms: limit.spec.window.duration_ms,
            name: limit.name.cloned(),
        }),
        remaining: remaining(chosen),
        reset_ms: Some(results[chosen].reset_ms),
    }
}

impl Bounds {
    /// Rejects requests that are empty or larger than the bounds.
    pub fn check(&self, request: &Request) -> Result<(), DecideError> {
        let invalid = |m: String| Err(DecideError::InvalidArgument(m));
        if request.domain.is_empty() {
            return invalid("rate limit domain must not be empty".into());
        }
        if request.domain.len() > self.max_entry_bytes {
            return invalid(format!(
                "domain is {} bytes (at most {})",
                request.domain.len(),
                self.max_entry_bytes
            ));
        }
        if request.descriptors.is_empty() {
            return invalid("rate limit descriptor list must not be empty".into());
        }
        if request.descriptors.len() > self.max_descriptors {
            return invalid(format!(
                "too many descriptors: {} (at most {})",
                request.descriptors.len(),
                self.max_descriptors
            ));
        }
        let max_hits = self.max_hits_addend.min(MAX_HITS);
        if u64::from(request.hits_addend) > max_hits {
            return invalid(format!(
                "hits_addend {} is larger than the maximum {max_hits}",
                request.hits_addend
            ));
        }
        // The weights of all descriptors together: what one counter named by
        // each of them would take. Checked, never wrapped, and bounded so the
        // stores' arithmetic (doubles in Redis) stays exact.
        let mut total: u64 = 0;
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            if descriptor.entries.len() > self.max_entries {
                return invalid(format!(
                    "descriptor {i} has {} entries (at most {})",
                    descriptor.entries.len(),
                    self.max_entries
                ));
            }
            for (j, entry) in descriptor.entries.iter().enumerate() {
                let longest = entry.key.len().max(entry.value.len());
                if longest > self.max_entry_bytes {
                    return invalid(format!(
                        "descriptor {i} entry {j}: key or value is {longest} bytes (at most {})",
                        self.max_entry_bytes
                    ));
                }
            }
            if let Some(hits) = descriptor.hits_addend.filter(|&h| h > max_hits) {
                return invalid(format!(
                    "descriptor {i}: hits_addend {hits} is larger than the maximum {max_hits}"
                ));
            }
            total = match total.checked_add(weight(request, descriptor)) {
                Some(total) if total <= MAX_HITS => total,
                _ => {
                    return invalid(format!(
                        "the descriptors' hits_addend add up to more than {MAX_HITS} (2^53 - 1)"
                    ));
                }
            };
        }
        Ok(())
    }
}
