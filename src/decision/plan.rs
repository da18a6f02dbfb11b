//! The per-request plan: each descriptor matched to its limits (a rule's, or
//! the request's own override), `replaces` applied, and the batch the store
//! is asked, in the same order as the limited descriptors.

use std::collections::HashSet;

use crate::limiter::Unit;
use crate::limiter::{
    Algorithm, Counting, Identity, IdentityBuilder, LimitSpec, Role, SoftRatio, Window,
};
use crate::request::{Descriptor, Request};
use crate::rules::{DEFAULT_BUCKETS, Domain, Limit, Rule, penalty_fits};
use crate::store::{Batch, BatchItem, Override, OverrideSet};

use super::DecideError;

/// What one descriptor turned into before the store is asked.
pub(super) enum Plan<'r> {
    /// No rule matched: OK, nothing counted.
    NoLimit,
    /// The matched rule is `unlimited`.
    Unlimited,
    /// Counted against these limits.
    Limited(Limited<'r>),
}

/// A descriptor with limits to check.
pub(super) struct Limited<'r> {
    /// Never empty: a descriptor whose limits were all replaced is `NoLimit`.
    pub limits: Vec<PlannedLimit<'r>>,
    pub role: Role,
    /// The matched rule; `None` for a request-supplied override.
    pub rule: Option<&'r Rule>,
    /// The descriptor's weight.
    pub hits: u64,
    /// Whether the weight is counted only with its request or always.
    pub counting: Counting,
    /// The weight is given back (`is_negative_hits`), not counted.
    pub refund: bool,
    /// A run-time override replaced the rule's limits.
    pub overridden: bool,
}

/// What the limiter's options decide for rules that leave it open.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Defaults {
    /// `counting` of rules that do not set it.
    pub counting: Counting,
    /// Global `quota_mode`: every enforcing descriptor counts as a quota one.
    pub quota_mode: bool,
    /// `soft_ratio` of limits that do not set it (request overrides too).
    pub soft_ratio: Option<SoftRatio>,
}

/// A limit to check: from a rule, or from the request's override.
pub(super) struct PlannedLimit<'r> {
    /// The rule's limit; `None` for an override.
    pub source: Option<&'r Limit>,
    pub spec: LimitSpec,
    pub unit: Unit,
    pub name: Option<&'r std::sync::Arc<str>>,
    pub replaces: &'r [String],
    /// The limit's `soft_ratio`, else the default one.
    pub soft_ratio: Option<SoftRatio>,
}

impl<'r> PlannedLimit<'r> {
    /// A rule's limit, its `soft_ratio` defaulted from `defaults`.
    fn of_rule(limit: &'r Limit, defaults: Defaults) -> Self {
        Self {
            source: Some(limit),
            spec: limit.spec,
            unit: limit.unit,
            name: limit.name.as_ref(),
            replaces: &limit.replaces,
            soft_ratio: limit.soft_ratio.or(defaults.soft_ratio),
        }
    }
}

/// The run-time overrides in force, and the time to judge their expiry by.
#[derive(Clone, Copy)]
pub(super) struct Overrides<'o> {
    pub set: &'o OverrideSet,
    pub now_ms: u64,
}

/// A request's plans, one per descriptor in order, and the store batch: one
/// item per `Limited` plan, in the same order.
pub(super) struct Planned<'r> {
    pub plans: Vec<Plan<'r>>,
    pub batch: Batch,
}

/// Plans `request` against `domain`'s rules.
pub(super) fn plan<'r>(
    domain: &'r Domain,
    request: &Request,
    defaults: Defaults,
    overrides: Overrides<'_>,
) -> Result<Planned<'r>, DecideError> {
    // Each limited plan travels with the identity of its counters until the
    // replaced limits are known.
    let matched: Vec<(Plan<'r>, Option<Identity>)> = request
        .descriptors
        .iter()
        .map(|descriptor| match_descriptor(domain, request, descriptor, (defaults, overrides)))
        .collect::<Result<_, _>>()?;

    // `replaces`: a limit named by any matched limit is neither checked nor
    // counted; a descriptor left without limits reports OK.
    let replaced: HashSet<&'r str> = matched
        .iter()
        .filter_map(|(plan, _)| match plan {
            Plan::Limited(limited) => Some(&limited.limits),
            _ => None,
        })
        .flatten()
        .flat_map(|limit| {
            let names: &'r [String] = limit.replaces;
            names.iter().map(String::as_str)
        })
        .collect();

    let mut batch = Batch::default();
    let plans = matched
        .into_iter()
        .map(|(plan, identity)| match (plan, identity) {
            (Plan::Limited(mut limited), Some(identity)) => {
                if !replaced.is_empty() {
                    limited
                        .limits
                        .retain(|l| l.name.is_none_or(|n| !replaced.contains(&**n)));
                }
                if limited.limits.is_empty() {
                    return Plan::NoLimit;
                }
                batch.items.push(BatchItem {
                    identity,
                    limits: limited.limits.iter().map(|l| l.spec).collect(),
                    hits: limited.hits,
                    role: limited.role,
                    counting: limited.counting,
                    refund: limited.refund,
                });
                Plan::Limited(limited)
            }
            (plan, _) => plan,
        })
        .collect();
    Ok(Planned { plans, batch })
}

/// One descriptor's plan and, when limited, the identity of its counters.
fn match_descriptor<'r>(
    domain: &'r Domain,
    request: &Request,
    descriptor: &Descriptor,
    (defaults, overrides): (Defaults, Overrides<'_>),
) -> Result<(Plan<'r>, Option<Identity>), DecideError> {
    let hits = weight(request, descriptor);
    let refund = descriptor.is_negative_hits;
    let role = |role: Role| match role {
        Role::Enforce if defaults.quota_mode => Role::Quota,
        role => role,
    };
    if let Some(limit) = &descriptor.limit {
        let mut identity = IdentityBuilder::new(&request.domain);
        for entry in &descriptor.entries {
            identity.value(&entry.key, &entry.value);
        }
        let planned = PlannedLimit {
            source: None,
            spec: override_spec(limit.requests_per_unit, limit.unit)?,
            unit: limit.unit,
            name: None,
            replaces: &[],
            soft_ratio: defaults.soft_ratio,
        };
        let limited = Limited {
            limits: vec![planned],
            role: role(Role::Enforce),
            rule: None,
            hits,
            counting: defaults.counting,
            refund,
            overridden: false,
        };
        return Ok((Plan::Limited(limited), Some(identity.build())));
    }
    let Some(found) = domain.find(&descriptor.entries) else {
        return Ok((Plan::NoLimit, None));
    };
    let entries = descriptor
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()));
    let replaced = overrides
        .set
        .find(&request.domain, entries, overrides.now_ms)
        .and_then(|o| override_limit(found.rule, o, defaults));
    let overridden = replaced.is_some();
    let limits = match replaced {
        Some(limit) => vec![limit],
        None if found.rule.unlimited => return Ok((Plan::Unlimited, None)),
        None => found
            .rule
            .limits
            .iter()
            .map(|limit| PlannedLimit::of_rule(limit, defaults))
            .collect(),
    };
    let limited = Limited {
        limits,
        role: role(found.rule.role),
        rule: Some(found.rule),
        hits,
        counting: found.rule.counting.unwrap_or(defaults.counting),
        refund,
        overridden,
    };
    Ok((Plan::Limited(limited), Some(found.identity)))
}

/// The one limit a run-time override puts in place of `rule`'s limits.
/// The counters keep the rule's identity. When a limit of the rule has the
/// override's window length, the override takes its algorithm and name and
/// so its counter: only the number of requests changes, nothing already
/// counted is forgotten. Otherwise it counts in the default sliding window
/// of its unit, a counter of its own that starts empty.
///
/// The override keeps the rule's penalty box: the penalty of the limit
/// whose counter it takes, else the first penalty among the rule's limits.
/// A penalty's block must outlast the window (see
/// [`crate::rules::shortest_block_ms`]), which the rule's checks ensured
/// for the rule's windows only: in a window of its own the override keeps
/// the penalty only when its block still outlasts that window, and has
/// none otherwise (a block is never lengthened behind the rule's back).
fn override_limit<'r>(
    rule: &'r Rule,
    o: &Override,
    defaults: Defaults,
) -> Option<PlannedLimit<'r>> {
    let unit = o.unit()?;
    let window_ms = unit.millis()?;
    let planned = match rule
        .limits
        .iter()
        .find(|l| l.spec.window.duration_ms == window_ms)
    {
        Some(same) => PlannedLimit {
            spec: LimitSpec {
                requests: o.requests_per_unit,
                window: same.spec.window,
                penalty: same.spec.penalty,
            },
            unit,
            ..PlannedLimit::of_rule(same, defaults)
        },
        None => PlannedLimit {
            source: None,
            spec: {
                let mut spec =
                    override_spec(u32::try_from(o.requests_per_unit).ok()?, unit).ok()?;
                spec.penalty = rule
                    .limits
                    .iter()
                    .find_map(|l| l.spec.penalty)
                    .filter(|penalty| penalty_fits(penalty, &spec.window));
                spec
            },
            unit,
            name: rule.limits.first().and_then(|l| l.name.as_ref()),
            replaces: &[],
            soft_ratio: defaults.soft_ratio,
        },
    };
    Some(planned)
}

/// A descriptor's own `hits_addend` when set (0 means check only), else the
/// request's, where 0 means 1.
pub(super) fn weight(request: &Request, descriptor: &Descriptor) -> u64 {
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
        penalty: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::parse_domain;

    fn rule_of(domain: &Domain) -> &Rule {
        let entries = [crate::request::Entry::new("login", "ann")];
        domain.find(&entries).expect("the rule matches").rule
    }

    fn set_to(requests_per_unit: u64, unit: &str) -> Override {
        Override {
            domain: "d".into(),
            descriptor: Vec::new(),
            requests_per_unit,
            unit: unit.into(),
            expires_at_ms: None,
            set_by: "test".into(),
            set_at_ms: 0,
        }
    }

    /// The penalty of the limit an override of `unit` puts in place of
    /// `limits` (a `rate_limits` list).
    fn penalty_of(limits: &str, unit: &str) -> Option<u64> {
        let text = format!("domain: d\ndescriptors:\n  - key: login\n    rate_limits: {limits}\n");
        let domain = parse_domain("test.yaml", text.as_bytes()).expect("rules load");
        override_limit(rule_of(&domain), &set_to(3, unit), Defaults::default())
            .expect("the override applies")
            .spec
            .penalty
            .map(|p| p.block_ms)
    }

    #[test]
    fn an_override_keeps_the_penalty_of_the_limit_whose_counter_it_takes() {
        let limits = "[{unit: second, requests_per_unit: 9}, \
             {unit: minute, requests_per_unit: 5, algorithm: fixed_window, penalty: {block: 2m}}]";
        assert_eq!(penalty_of(limits, "minute"), Some(120_000));
        assert_eq!(penalty_of(limits, "second"), None, "that limit has none");
    }

    #[test]
    fn in_a_window_of_its_own_an_override_keeps_a_penalty_only_if_the_block_outlasts_it() {
        let limits = "[{unit: second, requests_per_unit: 9, penalty: {block: 15m}}]";
        // A minute's sliding window ends within 66 s: the 15 minutes outlast it.
        assert_eq!(penalty_of(limits, "minute"), Some(900_000));
        // An hour's does not end within 15 minutes: no penalty rather than
        // a block that ends while the counter still refuses.
        assert_eq!(penalty_of(limits, "hour"), None);
    }
}
