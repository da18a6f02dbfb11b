//! The metrics of run-time overrides: how many are in force per domain,
//! how many decisions one of them shaped, and the writes of the admin API
//! by outcome. `domain` is always a domain of the loaded rules (the API
//! refuses others, and only a matched rule can be overridden).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabels {
    domain: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    /// `put` or `delete`.
    op: String,
    /// `ok`, `refused` (token, cap, body) or `error` (the store).
    result: String,
}

/// The series of overrides.
#[derive(Clone, Debug, Default)]
pub(super) struct Overrides {
    in_force: Family<DomainLabels, Gauge>,
    applied: Family<DomainLabels, Counter>,
    writes: Family<WriteLabels, Counter>,
}

impl Overrides {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "sluice_overrides",
            "Run-time overrides in force (as this replica last loaded them), by domain",
            self.in_force.clone(),
        );
        registry.register(
            "sluice_override_decisions",
            "Descriptors whose limit came from a run-time override, by domain",
            self.applied.clone(),
        );
        registry.register(
            "sluice_override_writes",
            "Writes of the /overrides admin API, by operation and result",
            self.writes.clone(),
        );
    }
}

impl Metrics {
    /// The overrides in force now: `(domain, count)` for every domain that
    /// has any (the others read 0).
    pub fn set_overrides_in_force<'a>(&self, counts: impl IntoIterator<Item = (&'a str, i64)>) {
        let series = &self.overrides.in_force;
        series.clear();
        for (domain, count) in counts {
            series
                .get_or_create(&DomainLabels {
                    domain: domain.to_owned(),
                })
                .set(count);
        }
    }

    /// One descriptor of `domain` decided under an override.
    pub fn record_override_applied(&self, domain: &str) {
        self.overrides
            .applied
            .get_or_create(&DomainLabels {
                domain: domain.to_owned(),
            })
            .inc();
    }

    /// One write of the admin API: `op` is `put` or `delete`, `result`
    /// `ok`, `refused` or `error`.
    pub fn record_override_write(&self, op: &str, result: &str) {
        self.overrides
            .writes
            .get_or_create(&WriteLabels {
                op: op.to_owned(),
                result: result.to_owned(),
            })
            .inc();
    }
}
