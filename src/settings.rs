//! The service's settings: one typed struct, filled from defaults, then a
//! settings file (`--config`, TOML or YAML), then `SLUICE_…` environment
//! variables, then command-line flags — each later source wins.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::Source as _;
use serde::{Deserialize, Serialize};

use crate::decision::Bounds;
use crate::headers::HeaderMode;
use crate::limiter::MAX_HITS;
use crate::store::{MemoryStoreConfig, RedisUrl, TimeSource};

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// Every setting of `sluice serve`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Settings {
    /// Rules file or directory; `None` serves the built-in example rules.
    pub rules: Option<PathBuf>,
    /// gRPC listen address (RLS, health, reflection).
    pub grpc_addr: SocketAddr,
    /// Admin HTTP listen address.
    pub http_addr: SocketAddr,
    /// Rate-limit headers added to responses.
    pub response_headers: HeaderMode,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter, in `tracing` env-filter syntax (e.g. `info`, `sluice=debug`).
    pub log_level: String,
    /// Most counters the in-memory store keeps.
    pub memory_max_keys: usize,
    /// Most bytes of counters the in-memory store keeps.
    pub memory_max_bytes: u64,
    /// Most descriptors in one request.
    pub max_descriptors: usize,
    /// Most entries in one descriptor.
    pub max_entries: usize,
    /// Longest descriptor key or value, in bytes.
    pub max_entry_bytes: usize,
    /// Largest request or descriptor weight; at most [`MAX_HITS`].
    pub max_hits_addend: u64,
    /// Redis to keep counters in; `None` keeps them in memory.
    pub redis_url: Option<RedisUrl>,
    /// Redis password, kept apart from the URL (e.g. from a Kubernetes
    /// Secret); replaces any password in `redis_url`.
    pub redis_password: Option<Secret>,
    /// Redis connections, used round-robin.
    pub redis_pool_size: usize,
    /// Longest wait for Redis per decision, in milliseconds.
    pub redis_timeout_ms: u64,
    /// Prefix of every Redis key.
    pub redis_key_prefix: String,
    /// Where the Redis scripts take the time from.
    pub time_source: TimeSource,
    /// After SIGTERM, how long to keep serving while not ready, in ms.
    pub shutdown_delay_ms: u64,
    /// Then, how long in-flight requests may take, in milliseconds.
    pub shutdown_grace_ms: u64,
    /// What to answer when the counter store fails.
    pub on_store_error: crate::decision::StoreErrorPolicy,
    /// Consecutive store failures that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long those failures must have lasted, in milliseconds.
    pub breaker_min_failing_ms: u64,
    /// How long the open breaker refuses store calls, in milliseconds.
    pub breaker_cooldown_ms: u64,
    /// Share of a limit from which admitted hits count as near the limit.
    pub near_limit_ratio: f64,
    /// Most distinct runtime descriptor values used as metric labels.
    pub metrics_max_descriptors: usize,
    /// OTLP gRPC endpoint for traces (e.g. `http://otel-collector:4317`);
    /// `None` exports no traces.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported traces.
    pub service_name: String,
    /// Entries of the local over-limit cache (Redis only); 0 turns it off.
    pub local_cache_size: usize,
    /// Most gRPC connections open at once; more are refused.
    pub grpc_max_connections: u32,
    /// Most admin HTTP connections open at once; more are refused.
    pub http_max_connections: u32,
    /// How long a new connection (either port) may take to send its
    /// handshake, in milliseconds.
    pub handshake_timeout_ms: u64,
    /// How long a connection (either port) may stay open with no request in
    /// flight, in milliseconds.
    pub idle_timeout_ms: u64,
    /// After this long a gRPC connection is asked to go away (GOAWAY) so
    /// clients rebalance, in milliseconds; 0 never.
    pub max_connection_age_ms: u64,
    /// Then, how long its requests in flight may take, in milliseconds.
    pub max_connection_age_grace_ms: u64,
    /// Most streams open at once on one gRPC connection.
    pub grpc_max_concurrent_streams: u32,
    /// Largest gRPC request message, in bytes.
    pub grpc_max_request_bytes: usize,
    /// How long a request (either port) may take to arrive and be answered,
    /// in milliseconds.
    pub request_timeout_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        let bounds = Bounds::default();
        let serve = crate::server::ServeOptions::default();
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self {
            rules: None,
            grpc_addr: SocketAddr::from(([0, 0, 0, 0], 8081)),
            http_addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
            response_headers: HeaderMode::Off,
            log_format: LogFormat::Human,
            log_level: "info".into(),
            memory_max_keys: MemoryStoreConfig::default().max_keys,
            memory_max_bytes: MemoryStoreConfig::default().max_bytes,
            max_descriptors: bounds.max_descriptors,
            max_entries: bounds.max_entries,
            max_entry_bytes: bounds.max_entry_bytes,
            max_hits_addend: bounds.max_hits_addend,
            redis_url: None,
            redis_password: None,
            redis_pool_size: 4,
            redis_timeout_ms: 40,
            redis_key_prefix: "sluice:".into(),
            time_source: TimeSource::Redis,
            shutdown_delay_ms: 0,
            shutdown_grace_ms: 10_000,
            on_store_error: crate::decision::StoreErrorPolicy::Unavailable,
            breaker_failures: 5,
            breaker_min_failing_ms: 500,
            breaker_cooldown_ms: 1_000,
            near_limit_ratio: 0.8,
            metrics_max_descriptors: 1_000,
            otlp_endpoint: None,
            service_name: "sluice".into(),
            local_cache_size: 100_000,
            grpc_max_connections: serve.grpc_connections.max_connections,
            http_max_connections: serve.http_connections.max_connections,
            handshake_timeout_ms: millis(serve.grpc_connections.handshake_timeout),
            idle_timeout_ms: millis(serve.grpc_connections.idle_timeout),
            max_connection_age_ms: 1_800_000,
            max_connection_age_grace_ms: millis(serve.grpc_connections.max_age_grace),
            grpc_max_concurrent_streams: serve.grpc.max_concurrent_streams,
            grpc_max_request_bytes: serve.grpc.max_request_bytes,
            request_timeout_ms: millis(serve.grpc.request_timeout),
        }
    }
}

/// Flags of `sluice serve` that override settings; unset flags leave the
/// value from the file, the environment or the default.
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
pub struct SettingsFlags {
    /// Rules file, or directory of rules files [default: the built-in example rules]
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<PathBuf>,
    /// gRPC listen address [default: 0.0.0.0:8081]
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_addr: Option<SocketAddr>,
    /// Admin HTTP listen address [default: 0.0.0.0:8080]
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_addr: Option<SocketAddr>,
    /// Rate-limit headers to add to responses [default: off]
    #[arg(long, value_enum, value_name = "MODE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderMode>,
    /// Log format [default: human]
    #[arg(long, value_enum, value_name = "FORMAT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
    /// Log filter, e.g. info or sluice=debug [default: info]
    #[arg(long, value_name = "FILTER")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    /// Most counters the in-memory store keeps
    #[arg(long, value_name = "N", help = format!(
        "Most counters the in-memory store keeps [default: {}]",
        MemoryStoreConfig::default().max_keys
    ))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_max_keys: Option<usize>,
    /// Most bytes of counters the in-memory store keeps
    #[arg(long, value_name = "BYTES", help = format!(
        "Most bytes of counters the in-memory store keeps [default: {}]",
        MemoryStoreConfig::default().max_bytes
    ))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_max_bytes: Option<u64>,
    /// Most descriptors in one request [default: 64]
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_descriptors: Option<usize>,
    /// Most entries in one descriptor [default: 32]
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<usize>,
    /// Longest descriptor key or value in bytes [default: 16384]
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_entry_bytes: Option<usize>,
    /// Largest request or descriptor weight, at most 9007199254740991 (2^53 - 1) [default: 1000000000]
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_hits_addend: Option<u64>,
    /// Keep counters in Redis: redis://[user:pass@]host:port[/db], rediss://… (TLS),
    /// redis-cluster://host:port[,host:port…], redis-sentinel://host:port[,…]/service
    /// [default: none, counters in memory]
    #[arg(long, value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
    /// Redis password (AUTH, or the password of the user named in the URL);
    /// replaces any password in the URL. Prefer SLUICE_REDIS_PASSWORD: a
    /// flag shows in the process list [default: none]
    #[arg(long, value_name = "PASSWORD")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_password: Option<String>,
    /// Redis connections, used round-robin [default: 4]
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_pool_size: Option<usize>,
    /// Longest wait for Redis per decision, in milliseconds; past it the request
    /// fails UNAVAILABLE (what it counted after all is refunded) [default: 40]
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_timeout_ms: Option<u64>,
    /// Prefix of every Redis key [default: sluice:]
    #[arg(long, value_name = "PREFIX")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_key_prefix: Option<String>,
    /// Clock of the Redis scripts: redis (Redis TIME, one clock for all replicas)
    /// or local (this process's clock) [default: redis]
    #[arg(long, value_enum, value_name = "SOURCE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_source: Option<TimeSource>,
    /// After SIGTERM, how long to keep serving while reporting not ready (so
    /// Kubernetes removes the endpoint first), in milliseconds [default: 0]
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_delay_ms: Option<u64>,
    /// Then, how long in-flight requests and open streams may take before
    /// the process exits, in milliseconds [default: 10000]
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_ms: Option<u64>,
    /// What to answer when the counter store fails: unavailable (gRPC
    /// UNAVAILABLE, Envoy's failure_mode_deny decides), allow, or deny
    /// [default: unavailable]
    #[arg(long, value_enum, value_name = "POLICY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_store_error: Option<crate::decision::StoreErrorPolicy>,
    /// Consecutive store failures after which the store is not called for a
    /// while (circuit breaker) [default: 5]
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker_failures: Option<u32>,
    /// ... and only once they have lasted this long, in milliseconds, so one
    /// short stall failing every request in flight does not open it
    /// [default: 500]
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker_min_failing_ms: Option<u64>,
    /// How long the open circuit breaker refuses store calls, in
    /// milliseconds [default: 1000]
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker_cooldown_ms: Option<u64>,
    /// Share of a limit from which admitted hits count as near the limit
    /// (metric sluice_near_limit_total) [default: 0.8]
    #[arg(long, value_name = "RATIO")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub near_limit_ratio: Option<f64>,
    /// Most distinct runtime descriptor values used as metric labels (for
    /// detailed_metric / value_to_metric rules); beyond it they count as
    /// _other_ [default: 1000]
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_max_descriptors: Option<usize>,
    /// Export traces over OTLP/gRPC to this endpoint, e.g.
    /// http://otel-collector:4317 [default: none, no export]
    #[arg(long, value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// service.name of the exported traces [default: sluice]
    #[arg(long, value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Counters known to be full are answered locally until they can take a
    /// hit again, without calling Redis; this many at most, 0 turns it off
    /// [default: 100000]
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_cache_size: Option<usize>,
    /// Most gRPC connections open at once; beyond it a new connection gets
    /// an HTTP/2 GOAWAY (REFUSED_STREAM) and is closed [default: 10000]
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_max_connections: Option<u32>,
    /// Most admin HTTP connections open at once; beyond it a new connection
    /// gets a 503 and is closed [default: 1024]
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_max_connections: Option<u32>,
    /// A new connection on either port that has not sent its handshake
    /// (the HTTP/2 preface, an HTTP request head) within this is closed, in
    /// milliseconds [default: 10000]
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handshake_timeout_ms: Option<u64>,
    /// A connection on either port with no request in flight for this long
    /// is closed, in milliseconds [default: 300000]
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// After this long (±10%) a gRPC connection gets a GOAWAY, so clients
    /// reconnect and spread over new replicas, in milliseconds; 0 never
    /// [default: 1800000]
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connection_age_ms: Option<u64>,
    /// Then, how long its requests in flight may take before it is closed,
    /// in milliseconds [default: 30000]
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connection_age_grace_ms: Option<u64>,
    /// Most streams open at once on one gRPC connection (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS) [default: 100]
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_max_concurrent_streams: Option<u32>,
    /// Largest gRPC request message in bytes; larger ones are refused
    /// RESOURCE_EXHAUSTED [default: 65536]
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_max_request_bytes: Option<usize>,
    /// How long a request on either port may take to arrive and be
    /// answered; past it gRPC answers DEADLINE_EXCEEDED and HTTP 408, in
    /// milliseconds [default: 5000]
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
}

/// A secret setting: its value never appears in `Debug` output (logs).
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The secret itself (to use it, never to log it).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// Why settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A value is missing its file, malformed or of the wrong type.
    #[error("invalid settings: {0}")]
    Invalid(#[from] config::ConfigError),
    /// The settings file names a setting that does not exist (a typo would
    /// otherwise silently leave the default in force).
    #[error("{file}: unknown setting '{key}' (known: {known})")]
    UnknownKey {
        /// The settings file.
        file: String,
        /// The unknown key.
        key: String,
        /// Every valid key.
        known: String,
    },
    /// A value is beyond what the service can honour.
    #[error("invalid settings: {setting} is {value}, above its maximum {max} ({why})")]
    OutOfRange {
        /// The setting's name.
        setting: &'static str,
        /// The value given.
        value: u64,
        /// The largest value accepted.
        max: u64,
        /// Why there is a maximum.
        why: &'static str,
    },
}

/// Fails on a key of the settings file that is not a setting.
fn check_keys(file: &Path) -> Result<(), SettingsError> {
    let found = config::Config::builder()
        .add_source(config::File::from(file).required(true))
        .build()?
        .collect()?;
    let defaults = serde_json::to_value(Settings::default()).expect("settings serialize");
    let known: Vec<&String> = defaults
        .as_object()
        .expect("settings are a map")
        .keys()
        .collect();
    let mut keys: Vec<&String> = found.keys().collect();
    keys.sort();
    match keys.into_iter().find(|k| !known.contains(k)) {
        Some(key) => Err(SettingsError::UnknownKey {
            file: file.display().to_string(),
            key: key.clone(),
            known: known
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
        None => Ok(()),
    }
}

impl Settings {
    /// Reads the settings from `file` (if any), the process environment and
    /// `flags`.
    pub fn load(file: Option<&Path>, flags: &SettingsFlags) -> Result<Self, SettingsError> {
        Self::load_from(file, flags, None)
    }

    /// As [`Settings::load`], but with `env` instead of the process
    /// environment when given (tests).
    pub fn load_from(
        file: Option<&Path>,
        flags: &SettingsFlags,
        env: Option<config::Map<String, String>>,
    ) -> Result<Self, SettingsError> {
        let mut builder = config::Config::builder();
        if let Some(file) = file {
            check_keys(file)?;
            builder = builder.add_source(config::File::from(file).required(true));
        }
        // No deny-unknown here: Kubernetes injects `SLUICE_SERVICE_HOST`-style
        // variables for a Service named `sluice`, which must not break start-up.
        builder = builder.add_source(
            config::Environment::with_prefix("SLUICE")
                .try_parsing(true)
                .source(env.clone()),
        );
        builder = builder.add_source(config::Config::try_from(flags)?);
        let mut settings: Settings = builder.build()?.try_deserialize()?;
        // The environment source parses values that look like numbers or
        // booleans ("007" would become "7"); a password must arrive as it is.
        let raw = match &env {
            Some(env) => env.get("SLUICE_REDIS_PASSWORD").cloned(),
            None => std::env::var("SLUICE_REDIS_PASSWORD").ok(),
        };
        if let (None, Some(raw)) = (&flags.redis_password, raw) {
            settings.redis_password = Some(Secret(raw));
        }
        // An empty password (an empty variable) means none: no AUTH "".
        if settings
            .redis_password
            .as_ref()
            .is_some_and(|p| p.0.is_empty())
        {
            settings.redis_password = None;
        }
        if settings.max_hits_addend > MAX_HITS {
            return Err(SettingsError::OutOfRange {
                setting: "max_hits_addend",
                value: settings.max_hits_addend,
                max: MAX_HITS,
                why: "2^53 - 1: weights beyond it are not exact in the Redis scripts' arithmetic",
            });
        }
        Ok(settings)
    }

    /// The Redis store settings, when a Redis URL is set.
    pub fn redis(&self) -> Option<crate::store::RedisStoreConfig> {
        self.redis_url
            .as_ref()
            .map(|url| crate::store::RedisStoreConfig {
                url: match &self.redis_password {
                    Some(password) => url.with_password(password.expose()),
                    None => url.clone(),
                },
                pool_size: self.redis_pool_size,
                timeout: std::time::Duration::from_millis(self.redis_timeout_ms.max(1)),
                key_prefix: self.redis_key_prefix.clone(),
                time: self.time_source,
                breaker: Some(self.breaker()),
            })
    }

    /// The in-memory store's settings.
    pub fn memory_store(&self) -> MemoryStoreConfig {
        MemoryStoreConfig {
            max_keys: self.memory_max_keys,
            max_bytes: self.memory_max_bytes,
            ..MemoryStoreConfig::default()
        }
    }

    /// How the listeners behave.
    pub fn serve_options(&self) -> crate::server::ServeOptions {
        use crate::server::{ConnLimits, GrpcLimits};
        let connections = |max_connections: u32| ConnLimits {
            // A listener that takes no connection at all serves nothing.
            max_connections: max_connections.max(1),
            handshake_timeout: Duration::from_millis(self.handshake_timeout_ms.max(1)),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms.max(1)),
            max_age: None,
            max_age_grace: Duration::from_millis(self.max_connection_age_grace_ms),
        };
        crate::server::ServeOptions {
            headers: self.response_headers,
            shutdown_delay: Duration::from_millis(self.shutdown_delay_ms),
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
            grpc: GrpcLimits {
                max_concurrent_streams: self.grpc_max_concurrent_streams.max(1),
                max_request_bytes: self.grpc_max_request_bytes.max(1),
                request_timeout: Duration::from_millis(self.request_timeout_ms.max(1)),
            },
            grpc_connections: ConnLimits {
                max_age: (self.max_connection_age_ms > 0)
                    .then(|| Duration::from_millis(self.max_connection_age_ms)),
                ..connections(self.grpc_max_connections)
            },
            http_connections: connections(self.http_max_connections),
        }
    }

    /// The limiter's options, with a fresh metrics registry.
    pub fn limiter_options(&self) -> crate::decision::LimiterOptions {
        let metrics =
            crate::telemetry::metrics::Metrics::new(crate::telemetry::metrics::MetricsConfig {
                near_limit_ratio: self.near_limit_ratio,
                max_descriptor_labels: self.metrics_max_descriptors,
            });
        crate::decision::LimiterOptions {
            bounds: self.bounds(),
            on_store_error: self.on_store_error,
            metrics: std::sync::Arc::new(metrics),
            // Only a remote store saves anything by answering locally.
            local_cache: if self.redis_url.is_some() {
                self.local_cache_size
            } else {
                0
            },
            clock: std::sync::Arc::new(crate::limiter::SystemClock),
            // counting, shadow_mode, quota_mode: wired by the lead.
            ..crate::decision::LimiterOptions::default()
        }
    }

    /// The circuit breaker's settings.
    pub fn breaker(&self) -> crate::store::BreakerConfig {
        crate::store::BreakerConfig {
            failures: self.breaker_failures.max(1),
            min_failing: std::time::Duration::from_millis(self.breaker_min_failing_ms),
            cooldown: std::time::Duration::from_millis(self.breaker_cooldown_ms),
        }
    }

    /// The request bounds.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            max_descriptors: self.max_descriptors,
            max_entries: self.max_entries,
            max_entry_bytes: self.max_entry_bytes,
            max_hits_addend: self.max_hits_addend,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Option<config::Map<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn defaults_apply_when_nothing_is_set() {
        let s = Settings::load_from(None, &SettingsFlags::default(), env(&[])).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!(s.grpc_addr.port(), 8081);
        assert_eq!(s.http_addr.port(), 8080);
    }

    #[test]
    fn the_memory_store_defaults_are_the_stores_own_and_can_be_set() {
        use clap::CommandFactory as _;
        let s = Settings::default();
        let store = MemoryStoreConfig::default();
        assert_eq!(
            (s.memory_max_keys, s.memory_max_bytes),
            (250_000, 128 << 20)
        );
        assert_eq!(
            (s.memory_max_keys, s.memory_max_bytes),
            (store.max_keys, store.max_bytes)
        );
        // The flags' help states the same numbers.
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            flags: SettingsFlags,
        }
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("[default: 250000]"), "{help}");
        assert!(help.contains("[default: 134217728]"), "{help}");

        let s = Settings::load_from(
            None,
            &SettingsFlags::default(),
            env(&[
                ("SLUICE_MEMORY_MAX_KEYS", "1000"),
                ("SLUICE_MEMORY_MAX_BYTES", "1048576"),
            ]),
        )
        .unwrap();
        let config = s.memory_store();
        assert_eq!((config.max_keys, config.max_bytes), (1_000, 1 << 20));
    }

    #[test]
    fn file_then_env_then_flags_each_win() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sluice.toml");
        std::fs::write(
            &file,
            "grpc_addr = \"127.0.0.1:1000\"\nmax_entries = 3\nlog_level = \"debug\"\n",
        )
        .unwrap();
        let flags = SettingsFlags {
            max_entries: Some(5),
            ..Default::default()
        };
        let s = Settings::load_from(
            Some(&file),
            &flags,
            env(&[
                ("SLUICE_GRPC_ADDR", "127.0.0.1:2000"),
                ("SLUICE_RESPONSE_HEADERS", "ietf"),
            ]),
        )
        .unwrap();
        assert_eq!(s.grpc_addr.port(), 2000);
        assert_eq!(s.max_entries, 5);
        assert_eq!(s.log_level, "debug");
        assert_eq!(s.response_headers, HeaderMode::Ietf);
    }

    #[test]
    fn a_typo_in_the_settings_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sluice.toml");
        std::fs::write(&file, "grpc_adr = \"127.0.0.1:1000\"\n").unwrap();
        let err =
            Settings::load_from(Some(&file), &SettingsFlags::default(), env(&[])).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("unknown setting 'grpc_adr'") && text.contains("grpc_addr"),
            "{text}"
        );
    }

    #[test]
    fn a_redis_password_from_the_environment_goes_into_the_url_and_not_the_logs() {
        let s = Settings::load_from(
            None,
            &SettingsFlags::default(),
            env(&[
                ("SLUICE_REDIS_URL", "redis-cluster://alice:@a:7000,b:7001"),
                ("SLUICE_REDIS_PASSWORD", "p@ss:w/rd"),
            ]),
        )
        .unwrap();
        let redis = s.redis().expect("a Redis store");
        assert_eq!(
            redis.url.expose(),
            "redis-cluster://alice:p%40ss%3Aw%2Frd@a:7000,b:7001"
        );
        assert!(!format!("{s:?}").contains("p@ss"), "{s:?}");
    }

    #[test]
    fn a_redis_password_that_looks_like_a_number_arrives_as_it_is() {
        let load = |password: &str| {
            Settings::load_from(
                None,
                &SettingsFlags::default(),
                env(&[
                    ("SLUICE_REDIS_URL", "redis://h:1"),
                    ("SLUICE_REDIS_PASSWORD", password),
                ]),
            )
            .unwrap()
        };
        for password in ["007", "TRUE", "1e3", " 42"] {
            let s = load(password);
            assert_eq!(
                s.redis_password.as_ref().map(Secret::expose),
                Some(password)
            );
        }
        // An empty variable is no password at all (no AUTH "").
        assert_eq!(load("").redis_password, None);
        assert_eq!(load("").redis().unwrap().url.expose(), "redis://h:1");
        // A flag still wins over the environment.
        let flags = SettingsFlags {
            redis_password: Some("from-flag".into()),
            ..Default::default()
        };
        let s =
            Settings::load_from(None, &flags, env(&[("SLUICE_REDIS_PASSWORD", "007")])).unwrap();
        assert_eq!(
            s.redis_password.as_ref().map(Secret::expose),
            Some("from-flag")
        );
    }

    #[test]
    fn kubernetes_service_variables_are_ignored() {
        let s = Settings::load_from(
            None,
            &SettingsFlags::default(),
            env(&[
                ("SLUICE_SERVICE_HOST", "10.0.0.1"),
                ("SLUICE_PORT", "tcp://10.0.0.1:8081"),
            ]),
        )
        .unwrap();
        assert_eq!(s, Settings::default());
    }

    #[test]
    fn the_redis_password_never_shows_in_debug_output() {
        let s = Settings::load_from(
            None,
            &SettingsFlags::default(),
            env(&[("SLUICE_REDIS_URL", "redis://app:hunter2@redis:6379")]),
        )
        .unwrap();
        let shown = format!("{s:?}");
        assert!(shown.contains("redis://app:***@redis:6379"), "{shown}");
        assert!(!shown.contains("hunter2"));
        assert_eq!(
            s.redis().unwrap().url.expose(),
            "redis://app:hunter2@redis:6379"
        );
    }

    #[test]
    fn a_max_hits_addend_beyond_exact_arithmetic_is_refused() {
        for value in [u64::MAX, MAX_HITS + 1] {
            let flags = SettingsFlags {
                max_hits_addend: Some(value),
                ..SettingsFlags::default()
            };
            let err = Settings::load_from(None, &flags, env(&[])).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "invalid settings: max_hits_addend is {value}, above its maximum 9007199254740991 \
                     (2^53 - 1: weights beyond it are not exact in the Redis scripts' arithmetic)"
                )
            );
        }
        let err = Settings::load_from(
            None,
            &SettingsFlags::default(),
            env(&[("SLUICE_MAX_HITS_ADDEND", "18446744073709551615")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("max_hits_addend"), "{err}");
        let flags = SettingsFlags {
            max_hits_addend: Some(MAX_HITS),
            ..SettingsFlags::default()
        };
        let s = Settings::load_from(None, &flags, env(&[])).unwrap();
        assert_eq!(s.bounds().max_hits_addend, MAX_HITS);
    }

    #[test]
    fn connection_settings_reach_the_listeners() {
        let s = Settings::load_from(
            None,
            &SettingsFlags::default(),
            env(&[
                ("SLUICE_GRPC_MAX_CONNECTIONS", "7"),
                ("SLUICE_MAX_CONNECTION_AGE_MS", "0"),
                ("SLUICE_GRPC_MAX_REQUEST_BYTES", "1024"),
                ("SLUICE_IDLE_TIMEOUT_MS", "2000"),
            ]),
        )
        .unwrap();
        let options = s.serve_options();
        assert_eq!(options.grpc_connections.max_connections, 7);
        assert_eq!(options.grpc_connections.max_age, None, "0 turns it off");
        assert_eq!(options.grpc.max_request_bytes, 1024);
        assert_eq!(
            options.http_connections.idle_timeout,
            Duration::from_secs(2)
        );
        assert_eq!(
            Settings::default().serve_options().grpc_connections.max_age,
            Some(Duration::from_secs(1_800))
        );
    }

    #[test]
    fn bad_values_are_errors() {
        let err = Settings::load_from(
            None,
            &SettingsFlags::default(),
            env(&[("SLUICE_GRPC_ADDR", "nope")]),
        );
        assert!(err.is_err());
    }
}
