//! What to answer when the counter store fails: an error for Envoy's
//! `failure_mode_deny` to judge, or a decision by policy.

use crate::limiter::Role;
use crate::store::StoreError;

use super::plan::Plan;
use super::{DecideError, Decision, Limiter, Status};

/// What to answer when the counter store fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
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
    /// Every policy, in the order the command line lists them.
    pub const ALL: [StoreErrorPolicy; 3] = [
        StoreErrorPolicy::Unavailable,
        StoreErrorPolicy::Allow,
        StoreErrorPolicy::Deny,
    ];

    /// The name in settings and metrics.
    pub fn name(self) -> &'static str {
        match self {
            StoreErrorPolicy::Unavailable => "unavailable",
            StoreErrorPolicy::Allow => "allow",
            StoreErrorPolicy::Deny => "deny",
        }
    }
}

impl<S> Limiter<S> {
    /// Answers a request whose store call failed, as the policy says.
    pub(super) fn on_store_error(
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
                        Plan::Limited(limited) => Status {
                            over_limit: deny && limited.role != Role::Shadow,
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
