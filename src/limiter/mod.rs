//! The rate-limiting domain: what a limit is, the algorithms as pure functions
//! over explicit time, the clock abstraction and the counter keys.
//!
//! Nothing here does IO or reads a clock by itself, and nothing here imports
//! tokio, tonic or Redis client: the stores call into this module with `now` in hand.

pub mod algorithm;
pub mod batch;
pub mod calendar;
pub mod clock;
pub mod key;
pub mod penalty;
pub mod soft;
pub mod unit;

pub use algorithm::{Algorithm, State};
pub use clock::{Clock, ManualClock, SystemClock};
pub use key::{CounterKey, Identity, IdentityBuilder};
pub use penalty::{Block, Penalty};
pub use soft::SoftRatio;
pub use unit::Unit;

/// Milliseconds since the Unix epoch: the one time unit of every algorithm.
pub type Millis = u64;

/// The most weight one request may carry (all its descriptors together), and
/// the most hits one counter holds: 2^53 − 1, below which IEEE doubles (the
/// Redis scripts' Lua numbers) represent every integer, so the Lua and the
/// Rust arithmetic stay exact and identical. A count that would pass it is
/// not counted beyond it.
pub const MAX_HITS: u64 = (1 << 53) - 1;

/// How a limit counts: the algorithm and the length of its window.
///
/// Together with an [`Identity`] this names a counter. `requests` is not part
/// of it, so a reload that only changes the number keeps the counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// Length of the window in milliseconds; never zero.
    pub duration_ms: u64,
    /// How hits are counted over that window.
    pub algorithm: Algorithm,
}

/// One limit as the stores see it: how many weighted hits fit in a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LimitSpec {
    /// Requests (weighted hits) allowed per window.
    pub requests: u64,
    /// The window and algorithm.
    pub window: Window,
    /// The penalty box an identity it refuses goes into, if any.
    pub penalty: Option<Penalty>,
}

/// Which debits a limit counts.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Counting {
    /// Only debits of admitted requests, all or nothing across the request.
    #[default]
    Admitted,
    /// Every debit, even one that does not fit (after-the-fact usage
    /// charges; envoyproxy/ratelimit's behaviour). Checks are refused while
    /// the counter plus the weight exceeds the limit.
    Always,
}

impl Counting {
    /// The name in rules files, settings and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Counting::Admitted => "admitted",
            Counting::Always => "always",
        }
    }
}

impl std::str::FromStr for Counting {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "admitted" => Ok(Counting::Admitted),
            "always" => Ok(Counting::Always),
            other => Err(format!(
                "unknown counting mode `{other}` (admitted or always)"
            )),
        }
    }
}

/// How a descriptor's verdict takes part in the request's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Over limit rejects the request.
    Enforce,
    /// Never rejects; counted and reported only (`shadow_mode`).
    Shadow,
    /// Rejects only when every quota descriptor of the request is over limit
    /// (`quota_mode`, as envoyproxy/ratelimit defines it).
    Quota,
}

/// Whether a request whose descriptors have these roles and verdicts is
/// admitted: no enforcing descriptor over its limit, and not every quota
/// descriptor over its limit. The stores call this between their check pass
/// and their apply pass, so the rule is written once.
pub fn admits(verdicts: impl IntoIterator<Item = (Role, bool)>) -> bool {
    let (mut quota_seen, mut quota_all_over) = (false, true);
    for (role, over) in verdicts {
        match role {
            Role::Enforce if over => return false,
            Role::Quota => {
                quota_seen = true;
                quota_all_over &= over;
            }
            _ => {}
        }
    }
    !(quota_seen && quota_all_over)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_follows_enforce_shadow_and_quota_rules() {
        assert!(admits([]));
        assert!(admits([(Role::Enforce, false), (Role::Shadow, true)]));
        assert!(!admits([(Role::Enforce, true), (Role::Shadow, false)]));
        assert!(admits([(Role::Quota, true), (Role::Quota, false)]));
        assert!(!admits([(Role::Quota, true), (Role::Quota, true)]));
        assert!(!admits([(Role::Quota, true)]));
        assert!(admits([
            (Role::Quota, true),
            (Role::Shadow, true),
            (Role::Quota, false)
        ]));
    }
}
