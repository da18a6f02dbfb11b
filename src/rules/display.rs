//! The rules as text, as `/rlconfig` shows them: per domain where it came
//! from (`# domain NAME from SOURCE`: a file path, or `xds:VERSION/RESOURCE`),
//! then one line per rule, `domain/key=value/key: limits; flags`.

use std::fmt;

use super::duration::duration_text;
use super::{Domain, Limit, Rule, RuleSet};
use crate::limiter::Penalty;

impl fmt::Display for RuleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.domains().try_for_each(|domain| write!(f, "{domain}"))
    }
}

/// The header line, then one line per rule.
impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# domain {} from {}", self.name(), self.source())?;
        self.rules()
            .into_iter()
            .try_for_each(|rule| writeln!(f, "{rule}"))
    }
}

/// `path: limit | limit; role=… detailed_metric=…` (`unlimited` for the
/// limits of an unlimited rule), without a line end.
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.path)?;
        if self.unlimited {
            f.write_str("unlimited")?;
        }
        for (i, limit) in self.limits.iter().enumerate() {
            if i > 0 {
                f.write_str(" | ")?;
            }
            write!(f, "{limit}")?;
        }
        write!(
            f,
            "; role={:?} detailed_metric={}",
            self.role, self.detailed_metric
        )
    }
}

/// `requests_per_unit=N window=Nms unit=U algorithm=A [name=…] [replaces=…]
/// [soft_ratio=R] [penalty block=D escalate=N max_block=D forget_after=D]`.
impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = &self.spec;
        write!(
            f,
            "requests_per_unit={} window={}ms unit={:?} algorithm={}",
            spec.requests, spec.window.duration_ms, self.unit, spec.window.algorithm
        )?;
        if let Some(name) = &self.name {
            write!(f, " name={name}")?;
        }
        if !self.replaces.is_empty() {
            write!(f, " replaces={}", self.replaces.join(","))?;
        }
        if let Some(ratio) = self.soft_ratio {
            write!(f, " soft_ratio={ratio}")?;
        }
        if let Some(penalty) = &spec.penalty {
            write!(f, " penalty {}", penalty_text(penalty))?;
        }
        Ok(())
    }
}

/// A penalty box as `/rlconfig` and refusals show it, in the rules' words:
/// `block=15m escalate=2 max_block=4h forget_after=1d`.
pub fn penalty_text(penalty: &Penalty) -> String {
    format!(
        "block={} escalate={} max_block={} forget_after={}",
        duration_text(penalty.block_ms),
        penalty.escalate,
        duration_text(penalty.max_block_ms),
        duration_text(penalty.forget_after_ms)
    )
}
