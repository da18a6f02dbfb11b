//! The answer for one descriptor, and how it is chosen from the outcomes of
//! the descriptor's limits.

use std::sync::Arc;

use crate::limiter::Unit;
use crate::limiter::{Penalty, Role};
use crate::rules::Annotations;
use crate::store::LimitOutcome;

use super::plan::{Limited, PlannedLimit};

/// The answer for one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// `code` OVER_LIMIT (shadow-mode descriptors are never over limit here).
    pub over_limit: bool,
    /// The descriptor's tightest limit; `None` when no limit applied.
    pub limit: Option<Reported>,
    /// Requests left: after this one when admitted, headroom otherwise;
    /// never more than the reported limit's `requests`. `u32::MAX` for
    /// unlimited descriptors.
    pub remaining: u64,
    /// When the reported limit's headroom next grows. For a refused
    /// descriptor, whole seconds and at least one (see [`Status::of`]).
    pub reset_ms: Option<u64>,
    /// The matched rule's path and metadata; `None` without a rule (no
    /// limit, unlimited, or the request's own override).
    pub rule: Option<Arc<Annotations>>,
    /// Some limit of the descriptor is past its `soft_ratio`: more than
    /// that share of its capacity is used (this request included, when
    /// admitted). Never for a shadow-mode descriptor, which can never
    /// refuse and so has nothing to warn of.
    pub soft_breach: bool,
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
    /// How the limit counts (`sliding_window`, `token_bucket`, …).
    pub algorithm: &'static str,
    /// The limit's penalty box, if any: a refusal names it, so that a
    /// client blocked for 15 minutes by a limit of 5 a minute is explained.
    pub penalty: Option<Penalty>,
}

impl Status {
    /// A descriptor no limit applied to.
    pub const NO_LIMIT: Status = Status {
        over_limit: false,
        limit: None,
        remaining: 0,
        reset_ms: None,
        rule: None,
        soft_breach: false,
    };
    /// A descriptor whose rule is `unlimited`.
    pub const UNLIMITED: Status = Status {
        over_limit: false,
        limit: None,
        remaining: u32::MAX as u64,
        reset_ms: None,
        rule: None,
        soft_breach: false,
    };
}

impl Status {
    /// One descriptor's status from its limits' outcomes: the limit that
    /// rejected it, or else the one with the least headroom, is the one
    /// reported.
    ///
    /// Two adjustments keep what Envoy derives from the status true:
    ///
    /// - `remaining` never exceeds the reported `requests`: a token bucket
    ///   whose burst is above its rate (5/s, bursts of 20) would otherwise
    ///   tell a client "limit 5, remaining 8".
    /// - A refused descriptor's reset is rounded up to whole seconds, at
    ///   least one: Envoy's `x-ratelimit-reset` keeps only the seconds of
    ///   `duration_until_reset`, so a token bucket's next token 80 ms away
    ///   would reach the client as "reset 0" on a 429.
    pub(super) fn of(limited: &Limited<'_>, results: &[LimitOutcome]) -> Status {
        let limits = &limited.limits;
        let remaining = |(limit, result): &(&PlannedLimit<'_>, &LimitOutcome)| {
            limit.spec.capacity().saturating_sub(result.used)
        };
        let pairs = || limits.iter().zip(results);
        let Some(chosen) = pairs()
            .find(|(_, result)| result.over)
            .or_else(|| pairs().min_by_key(remaining))
        else {
            return Status::NO_LIMIT;
        };
        let (limit, result) = chosen;
        let over_limit = result.over && limited.role != Role::Shadow;
        // Every limit is looked at, not only the one reported: 90 of 100 a
        // minute warns even while 1 of 10 a second is the tighter now.
        let soft_breach = limited.role != Role::Shadow
            && pairs().any(|(limit, result)| {
                limit
                    .soft_ratio
                    .is_some_and(|ratio| ratio.breached(result.used, limit.spec.capacity()))
            });
        let reset_ms = if over_limit {
            result.reset_ms.div_ceil(1_000).max(1) * 1_000
        } else {
            result.reset_ms
        };
        Status {
            over_limit,
            limit: Some(Reported {
                requests: limit.spec.requests,
                unit: limit.unit,
                window_ms: limit.spec.window.duration_ms,
                name: limit.name.cloned(),
                algorithm: limit.spec.window.algorithm.name(),
                penalty: limit.spec.penalty,
            }),
            remaining: remaining(&chosen).min(limit.spec.requests),
            reset_ms: Some(reset_ms),
            rule: limited.rule.map(|rule| rule.annotations.clone()),
            soft_breach,
        }
    }

    /// The limit's name for people and logs: its `name`, else the rule's
    /// path, else `_override_` (a request-supplied limit).
    pub fn limit_label(&self) -> &str {
        match (&self.limit, &self.rule) {
            (
                Some(Reported {
                    name: Some(name), ..
                }),
                _,
            ) => name,
            (_, Some(rule)) => &rule.path,
            _ => "_override_",
        }
    }
}
