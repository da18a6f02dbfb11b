//! What a value of the right type can still get wrong, alone (a weight
//! beyond exact arithmetic, a share outside 0 to 1, metadata that is no
//! JSON object) or with another setting (a certificate without its key, two
//! stats sinks). Each error names where the value came from.

use super::origin::Sources;
use super::{Settings, SettingsError};
use crate::limiter::{MAX_HITS, SoftRatio};
use crate::telemetry::traces::OtlpProtocol;

impl Settings {
    /// Every check, in the order the settings are declared.
    pub(super) fn check(&self, sources: &Sources) -> Result<(), SettingsError> {
        self.check_values(sources)?;
        self.check_pairs(sources)
    }

    /// Values wrong on their own.
    fn check_values(&self, sources: &Sources) -> Result<(), SettingsError> {
        if self.max_hits_addend > MAX_HITS {
            return Err(invalid(
                sources,
                "max_hits_addend",
                format!(
                    "above its maximum {MAX_HITS} (2^53 - 1: weights beyond it are not exact \
                     in the Redis scripts' arithmetic)"
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.trace_sampling_ratio) {
            return Err(invalid(
                sources,
                "trace_sampling_ratio",
                "the share of traces to export goes from 0 (none) to 1 (all)".into(),
            ));
        }
        if let Some(ratio) = self.soft_ratio
            && let Err(why) = SoftRatio::new(ratio)
        {
            return Err(invalid(sources, "soft_ratio", why.into()));
        }
        if let Some(metadata) = &self.xds_node_metadata
            && !matches!(
                serde_json::from_str(metadata),
                Ok(serde_json::Value::Object(_))
            )
        {
            return Err(invalid(
                sources,
                "xds_node_metadata",
                "expected a JSON object, e.g. {\"zone\": \"a\"}".into(),
            ));
        }
        Ok(())
    }

    /// Values wrong together: a half of a pair, or two that exclude each
    /// other.
    fn check_pairs(&self, sources: &Sources) -> Result<(), SettingsError> {
        for (cert, key, [cert_name, key_name]) in [
            (
                &self.grpc_tls_cert,
                &self.grpc_tls_key,
                ["grpc_tls_cert", "grpc_tls_key"],
            ),
            (
                &self.xds_tls_cert,
                &self.xds_tls_key,
                ["xds_tls_cert", "xds_tls_key"],
            ),
            (
                &self.redis_tls_cert,
                &self.redis_tls_key,
                ["redis_tls_cert", "redis_tls_key"],
            ),
        ] {
            let (set, unset) = match (cert, key) {
                (Some(_), None) => (cert_name, key_name),
                (None, Some(_)) => (key_name, cert_name),
                _ => continue,
            };
            return Err(invalid(
                sources,
                set,
                format!("{cert_name} and {key_name} go together, and {unset} is not set"),
            ));
        }
        if self.otlp_protocol == OtlpProtocol::Http
            && self
                .otlp_endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("https:"))
        {
            return Err(SettingsError::Unsupported {
                what: format!(
                    "{} with {}",
                    sources.origin("otlp_protocol"),
                    sources.origin("otlp_endpoint")
                ),
                instead: "export over TLS with otlp_protocol grpc, or to an http:// endpoint",
            });
        }
        if self.statsd_addr.is_some() && self.upstream_prometheus_addr.is_some() {
            return Err(SettingsError::Unsupported {
                what: format!(
                    "{} together with {}",
                    sources.origin("statsd_addr"),
                    sources.origin("upstream_prometheus_addr")
                ),
                instead: "choose one upstream stats sink, as envoyproxy/ratelimit requires",
            });
        }
        Ok(())
    }
}

/// `setting`'s value, from where it came, is wrong: `why`.
fn invalid(sources: &Sources, setting: &str, why: String) -> SettingsError {
    SettingsError::Invalid {
        setting: setting.to_owned(),
        origin: sources.origin(setting),
        why,
    }
}
