//! The service's settings: one typed struct, filled from defaults, then a
//! settings file (`--config`, TOML or YAML), then `SLUICE_…` environment
//! variables, then command-line flags — each later source wins.
//!
//! Here, the declaration (`settings!`: every setting once); `load.rs` merges
//! the sources, `check.rs` refuses what parses but is wrong, `origin.rs`
//! names where a bad value came from; `upstream/` reads envoyproxy/ratelimit's
//! variables as one more source, `unsupported.rs` lists those it does not
//! honour, `reference.rs` renders the docs page. Settings are data: they
//! import only value types, and `app/build.rs` turns them into the runtime
//! objects (store, listeners, limiter, telemetry, xDS client).

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::decision::Bounds;
use crate::headers::HeaderMode;
use crate::limiter::Counting;
use crate::store::{MemoryStoreConfig, RedisUrl, TimeSource};
pub use crate::telemetry::LogFormat;
use crate::telemetry::traces::OtlpProtocol;

mod check;
mod load;
mod origin;
pub mod reference;
pub mod unsupported;
pub mod upstream;

pub use load::{Loaded, SettingsError, accepted_values};
pub use origin::Origin;

/// Declares every setting exactly once — name, type, flag type and value
/// name, default and doc line — and generates from it [`Settings`], its
/// `Default`, the flags ([`SettingsFlags`], help text with the default in
/// it), [`DECLARED`], the table the docs are made from, and [`Key`], the
/// settings' names as values. Upstream's variables name the setting they
/// feed in `upstream/`. `SLUICE_<NAME>` environment variables
/// and settings-file keys are the serde field names of [`Settings`].
macro_rules! settings {
    ($(
        $doc:literal
        $name:ident : $ty:ty = $default:expr,
        flag $fty:ty, $value:literal;
    )*) => {
        /// Every setting of `sluice serve`.
        #[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
        #[serde(default)]
        pub struct Settings {
            $(
                #[doc = $doc]
                pub $name: $ty,
            )*
        }

        impl Default for Settings {
            fn default() -> Self {
                Self { $($name: $default,)* }
            }
        }

        /// Flags of `sluice serve` that override settings; unset flags
        /// leave the value from the file, the environment or the default.
        #[derive(Clone, Debug, Default, clap::Args, Serialize)]
        pub struct SettingsFlags {
            $(
                #[doc = $doc]
                #[arg(long, value_name = $value, help = flag_help($doc, stringify!($name)))]
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $name: Option<$fty>,
            )*
            /// Also read envoyproxy/ratelimit's environment variables, with
            /// its defaults, under SLUICE_… variables and flags (the default
            /// when the binary runs as `ratelimit`)
            #[arg(long, value_name = "FROM")]
            #[serde(skip)]
            pub settings_from: Option<upstream::SettingsFrom>,
        }

        /// Every setting, in declaration order.
        pub const DECLARED: &[Declared] = &[$(
            Declared {
                name: stringify!($name),
                ty: stringify!($ty),
                value: $value,
                doc: $doc,
            },
        )*];

        /// Every setting's name as a value, for code that gives a setting
        /// a value by name (the upstream layer): a name that is no setting
        /// does not compile.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Key {
            $(
                #[doc = $doc]
                $name,
            )*
        }

        impl Key {
            /// The setting's name (its settings-file key).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Key::$name => stringify!($name),)*
                }
            }
        }
    };
}

/// One declared setting, as the docs show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Declared {
    /// The field name (and settings-file key).
    pub name: &'static str,
    /// Its Rust type, as written in the declaration.
    pub ty: &'static str,
    /// What the flag's value is (`N`, `MS`, `ADDR`…).
    pub value: &'static str,
    /// The doc line.
    pub doc: &'static str,
}

impl Declared {
    /// Its command-line flag.
    pub fn flag(&self) -> String {
        format!("--{}", self.name.replace('_', "-"))
    }

    /// Its environment variable.
    pub fn env(&self) -> String {
        format!("SLUICE_{}", self.name.to_ascii_uppercase())
    }

    /// Its default, as the docs show it (`none` for an unset option).
    pub fn default_text(&self) -> String {
        let defaults = serde_json::to_value(Settings::default()).unwrap_or_default();
        match defaults.get(self.name) {
            None | Some(serde_json::Value::Null) => "none".into(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        }
    }
}

/// `n` as a setting that must be positive (its default).
fn nonzero<T: TryFrom<NonZeroU64>>(n: u64) -> T {
    NonZeroU64::new(n)
        .and_then(|n| T::try_from(n).ok())
        .expect("a positive default that fits its type")
}

fn flag_help(doc: &str, name: &str) -> String {
    let default = DECLARED
        .iter()
        .find(|d| d.name == name)
        .map(Declared::default_text)
        .unwrap_or_default();
    format!("{doc} [default: {default}]")
}

settings! {
    "Rules file, or directory of rules files; none serves the built-in example rules"
    rules: Option<PathBuf> = None, flag PathBuf, "PATH";
    "gRPC listen address (RLS, health, reflection)"
    grpc_addr: SocketAddr = SocketAddr::from(([0, 0, 0, 0], 8081)), flag SocketAddr, "ADDR";
    "Admin HTTP listen address"
    http_addr: SocketAddr = SocketAddr::from(([0, 0, 0, 0], 8080)), flag SocketAddr, "ADDR";
    "Rate-limit headers to add to responses"
    response_headers: HeaderMode = HeaderMode::Off, flag HeaderMode, "MODE";
    "Log format"
    log_format: LogFormat = LogFormat::Human, flag LogFormat, "FORMAT";
    "Log filter, in tracing env-filter syntax, e.g. info or sluice=debug"
    log_level: String = "info".into(), flag String, "FILTER";
    "Most counters the in-memory store keeps"
    memory_max_keys: usize = MemoryStoreConfig::default().max_keys, flag usize, "N";
    "Most bytes of counters the in-memory store keeps"
    memory_max_bytes: u64 = MemoryStoreConfig::default().max_bytes, flag u64, "BYTES";
    "Most descriptors in one request"
    max_descriptors: usize = Bounds::default().max_descriptors, flag usize, "N";
    "Most entries in one descriptor"
    max_entries: usize = Bounds::default().max_entries, flag usize, "N";
    "Longest descriptor key or value in bytes"
    max_entry_bytes: usize = Bounds::default().max_entry_bytes, flag usize, "BYTES";
    "Largest request or descriptor weight, at most 9007199254740991 (2^53 - 1)"
    max_hits_addend: u64 = Bounds::default().max_hits_addend, flag u64, "N";
    "Keep counters in Redis: redis://[user:pass@]host:port[/db], rediss://… (TLS), redis-cluster://host:port[,host:port…], redis-sentinel://host:port[,…]/service, redis+unix:///path; none keeps counters in memory"
    redis_url: Option<RedisUrl> = None, flag String, "URL";
    "Redis password (AUTH, or the password of the user named in the URL); replaces any password in the URL. Prefer SLUICE_REDIS_PASSWORD: a flag shows in the process list"
    redis_password: Option<Secret> = None, flag String, "PASSWORD";
    "Redis connections per node, used round-robin; each carries many calls at once"
    redis_pool_size: NonZeroUsize = nonzero(1), flag usize, "N";
    "Longest wait for Redis per decision, in milliseconds; past it the request fails UNAVAILABLE (what it counted after all is refunded)"
    redis_timeout_ms: NonZeroU64 = nonzero(40), flag u64, "MS";
    "Requests of one descriptor and one limit bound for one Redis (one Cluster slot) that arrive while a call to it is in flight share the next call, whatever their identities (decided in turn, exactly as separate calls would): far less work per request in Redis"
    redis_coalesce: bool = true, flag bool, "BOOL";
    "Prefix of every Redis key"
    redis_key_prefix: String = "sluice:".into(), flag String, "PREFIX";
    "Clock of the Redis scripts: redis (Redis TIME, one clock for all replicas) or local (this process's clock)"
    time_source: TimeSource = TimeSource::Redis, flag TimeSource, "SOURCE";
    "After SIGTERM, how long to keep serving while reporting not ready (so Kubernetes removes the endpoint first), in milliseconds"
    shutdown_delay_ms: u64 = 0, flag u64, "MS";
    "Then, how long in-flight requests and open streams may take before the process exits, in milliseconds"
    shutdown_grace_ms: u64 = 10_000, flag u64, "MS";
    "What to answer when the counter store fails: unavailable (gRPC UNAVAILABLE, Envoy's failure_mode_deny decides), allow, or deny"
    on_store_error: crate::decision::StoreErrorPolicy = crate::decision::StoreErrorPolicy::Unavailable, flag crate::decision::StoreErrorPolicy, "POLICY";
    "Consecutive store failures after which the store is not called for a while (circuit breaker)"
    breaker_failures: NonZeroU32 = nonzero(5), flag u32, "N";
    "... and only once they have lasted this long, in milliseconds, so one short stall failing every request in flight does not open it"
    breaker_min_failing_ms: u64 = 500, flag u64, "MS";
    "How long the open circuit breaker refuses store calls, in milliseconds"
    breaker_cooldown_ms: u64 = 1_000, flag u64, "MS";
    "Share of a limit from which admitted hits count as near the limit (metric sluice_near_limit_total)"
    near_limit_ratio: f64 = 0.8, flag f64, "RATIO";
    "Most distinct runtime descriptor values used as metric labels (for detailed_metric / value_to_metric rules); beyond it they count as _other_"
    metrics_max_descriptors: usize = 1_000, flag usize, "N";
    "Export traces over OTLP to this endpoint, e.g. http://otel-collector:4317 (grpc) or http://otel-collector:4318 (http); none exports no traces"
    otlp_endpoint: Option<String> = None, flag String, "URL";
    "OTLP transport: grpc, or http (protobuf POSTed to the endpoint's /v1/traces)"
    otlp_protocol: OtlpProtocol = OtlpProtocol::Grpc, flag OtlpProtocol, "PROTOCOL";
    "Share of new traces exported, 0 to 1; a caller's own sampling decision is always followed"
    trace_sampling_ratio: f64 = 1.0, flag f64, "RATIO";
    "service.name of the exported traces"
    service_name: String = "sluice".into(), flag String, "NAME";
    "Counters known to be full are answered locally until they can take a hit again (blocked ones of a penalty box until the block ends, asking again each minute), without calling Redis; this many at most, 0 turns it off"
    local_cache_size: usize = 100_000, flag usize, "N";
    "Most gRPC connections open at once; beyond it a new connection gets an HTTP/2 GOAWAY (REFUSED_STREAM) and is closed"
    grpc_max_connections: NonZeroU32 = nonzero(10_000), flag u32, "N";
    "Most admin HTTP connections open at once; beyond it a new connection gets a 503 and is closed"
    http_max_connections: NonZeroU32 = nonzero(1_024), flag u32, "N";
    "A new connection on either port that has not sent its handshake (the HTTP/2 preface, an HTTP request head) within this is closed, in milliseconds"
    handshake_timeout_ms: NonZeroU64 = nonzero(10_000), flag u64, "MS";
    "A connection on either port with no request in flight for this long is closed, in milliseconds"
    idle_timeout_ms: NonZeroU64 = nonzero(300_000), flag u64, "MS";
    "After this long (±10%) a gRPC connection gets a GOAWAY, so clients reconnect and spread over new replicas, in milliseconds; 0 never"
    max_connection_age_ms: u64 = 1_800_000, flag u64, "MS";
    "Then, how long its requests in flight may take before it is closed, in milliseconds"
    max_connection_age_grace_ms: u64 = 30_000, flag u64, "MS";
    "Most streams open at once on one gRPC connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS)"
    grpc_max_concurrent_streams: NonZeroU32 = nonzero(100), flag u32, "N";
    "Largest gRPC request message in bytes; larger ones are refused RESOURCE_EXHAUSTED"
    grpc_max_request_bytes: NonZeroUsize = nonzero(64 << 10), flag usize, "BYTES";
    "How long a request on either port may take to arrive and be answered; past it gRPC answers DEADLINE_EXCEEDED and HTTP 408, in milliseconds"
    request_timeout_ms: NonZeroU64 = nonzero(5_000), flag u64, "MS";
    "Which debits a limit counts unless its rule says: admitted (only hits of admitted requests) or always (every hit, upstream's behaviour)"
    counting: Counting = Counting::Admitted, flag Counting, "MODE";
    "Decide and count as usual but always answer OK (over-limit decisions only show in metrics and logs)"
    shadow_mode: bool = false, flag bool, "BOOL";
    "Treat every enforcing descriptor as a quota_mode one (upstream's global QUOTA_MODE)"
    quota_mode: bool = false, flag bool, "BOOL";
    "Fill the response's dynamic metadata as upstream's RESPONSE_DYNAMIC_METADATA does, with the rules' metadata"
    response_dynamic_metadata: bool = false, flag bool, "BOOL";
    "Give a refusal an application/problem+json raw_body that Envoy sends with its 429"
    problem_json_body: bool = false, flag bool, "BOOL";
    "Share of a limit (above 0, at most 1) past which an admitted request's response carries x-ratelimit-soft-breach: 1, for limits whose rule sets no soft_ratio; none warns only for those that do"
    soft_ratio: Option<f64> = None, flag f64, "RATIO";
    "Tell the upstream of an admitted request its headroom: x-ratelimit-remaining (requests left under the tightest limit) and x-ratelimit-name (that limit's name, else its rule path), in the response's request_headers_to_add"
    upstream_headroom_headers: bool = false, flag bool, "BOOL";
    "Serve GET and DELETE /counters on the admin port (inspect and reset one counter)"
    admin_counters: bool = false, flag bool, "BOOL";
    "File holding the bearer token that PUT and DELETE /overrides require (re-read when it changes); without it those writes are refused with 403"
    admin_token: Option<PathBuf> = None, flag PathBuf, "PATH";
    "Most run-time overrides one domain may hold; a PUT of one more is refused with 409"
    overrides_max_per_domain: NonZeroUsize = nonzero(1000), flag usize, "N";
    "Serve gRPC over TLS with this certificate (PEM); needs grpc_tls_key"
    grpc_tls_cert: Option<PathBuf> = None, flag PathBuf, "PATH";
    "Private key (PEM) of grpc_tls_cert"
    grpc_tls_key: Option<PathBuf> = None, flag PathBuf, "PATH";
    "Require gRPC clients to present a certificate signed by this CA (PEM)"
    grpc_tls_ca_cert: Option<PathBuf> = None, flag PathBuf, "PATH";
    "Take rules from this xDS server (host:port or URL) instead of files"
    xds_server: Option<String> = None, flag String, "ADDR";
    "Node id sent to the xDS server"
    xds_node_id: String = "default".into(), flag String, "ID";
    "Node metadata sent to the xDS server, a JSON object"
    xds_node_metadata: Option<String> = None, flag String, "JSON";
    "Connect to the xDS server over TLS"
    xds_tls: bool = false, flag bool, "BOOL";
    "Client certificate (PEM) for the xDS server; needs xds_tls_key"
    xds_tls_cert: Option<PathBuf> = None, flag PathBuf, "PATH";
    "Private key (PEM) of xds_tls_cert"
    xds_tls_key: Option<PathBuf> = None, flag PathBuf, "PATH";
    "CA (PEM) the xDS server's certificate must chain to"
    xds_tls_ca_cert: Option<PathBuf> = None, flag PathBuf, "PATH";
    "Name the xDS server's certificate must carry (SAN)"
    xds_tls_san: Option<String> = None, flag String, "NAME";
    "First wait before reconnecting to the xDS server, in milliseconds"
    xds_backoff_initial_ms: u64 = 10_000, flag u64, "MS";
    "Longest wait before reconnecting to the xDS server, in milliseconds"
    xds_backoff_max_ms: u64 = 60_000, flag u64, "MS";
    "Random share of each reconnect wait (0 to 1)"
    xds_backoff_random_factor: f64 = 0.5, flag f64, "RATIO";
    "Randomize reconnect waits"
    xds_backoff_jitter: bool = true, flag bool, "BOOL";
    "Largest xDS message accepted, in bytes"
    xds_max_message_bytes: usize = 4 << 20, flag usize, "BYTES";
    "Serve before the first rules arrive from xDS (with no rules: every request OK)"
    force_start_without_initial_config: bool = false, flag bool, "BOOL";
    "Send upstream-named stats to this statsd host:port"
    statsd_addr: Option<String> = None, flag String, "ADDR";
    "Serve upstream-named Prometheus metrics on this address"
    upstream_prometheus_addr: Option<SocketAddr> = None, flag SocketAddr, "ADDR";
    "Path of the upstream-named Prometheus metrics"
    upstream_prometheus_path: String = "/metrics".into(), flag String, "PATH";
    "statsd_exporter mapping file that renames the upstream-named metrics"
    prometheus_mapper: Option<PathBuf> = None, flag PathBuf, "PATH";
    "Send statsd lines over UDP instead of TCP (gostats' default)"
    statsd_udp: bool = false, flag bool, "BOOL";
    "How often stats are flushed to statsd, in milliseconds"
    stats_flush_interval_ms: NonZeroU64 = nonzero(10_000), flag u64, "MS";
    "Address of the debug listener (/rlconfig); none serves none. It has the admin port's handshake and idle timeouts and at most 64 connections"
    debug_addr: Option<SocketAddr> = None, flag SocketAddr, "ADDR";
    "Client certificate (PEM) for Redis over TLS; needs redis_tls_key"
    redis_tls_cert: Option<PathBuf> = None, flag PathBuf, "PATH";
    "Private key (PEM) of redis_tls_cert"
    redis_tls_key: Option<PathBuf> = None, flag PathBuf, "PATH";
    "CA (PEM) Redis's certificate must chain to"
    redis_tls_ca_cert: Option<PathBuf> = None, flag PathBuf, "PATH";
    "Accept a Redis certificate whose name does not match the host"
    redis_tls_skip_hostname_verification: bool = false, flag bool, "BOOL";
    "A second Redis for per-second limits (same URL forms as redis_url); none keeps them with the others"
    redis_per_second_url: Option<RedisUrl> = None, flag String, "URL";
    "/healthcheck answers 200 only once rules are loaded (otherwise from start-up, as soon as the store was reached)"
    healthy_with_config_loaded: bool = false, flag bool, "BOOL";
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

#[cfg(test)]
pub(crate) mod tests;
