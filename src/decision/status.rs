//! The answer for one descriptor, and how it is chosen from the outcomes of
//! the descriptor's limits.

use std::sync::Arc;

use crate::limiter::Role;
use crate::rules::Unit;
use crate::store::LimitOutcome;

use super::plan::PlannedLimit;

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
    pub(super) const NO_LIMIT: Status = Status {
        over_limit: false,
        limit: None,
        remaining: 0,
        reset_ms: None,
    };
    pub(super) const UNLIMITED: Status = Status {
        over_limit: false,
        limit: None,
        remaining: u32::MAX as u64,
        reset_ms: None,
    };
}

impl Status {
    /// One descriptor's status from its limits' outcomes: the limit that
    /// rejected it, or else the one with the least headroom, is the one
    /// reported.
    pub(super) fn of(limits: &[PlannedLimit<'_>], results: &[LimitOutcome], role: Role) -> Status {
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
        Status {
            over_limit: result.over && role != Role::Shadow,
            limit: Some(Reported {
                requests: limit.spec.requests,
                unit: limit.unit,
                window_ms: limit.spec.window.duration_ms,
                name: limit.name.cloned(),
            }),
            remaining: remaining(&chosen),
            reset_ms: Some(result.reset_ms),
        }
    }
}
