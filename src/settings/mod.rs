//! The service's settings: one typed struct, filled from defaults, then a
//! settings file (`--config`, TOML or YAML), then `SLUICE_…` environment
//! variables, then command-line flags — each later source wins.

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
    "Requests of one counter that arrive while a Redis call for it is in flight share the next call (decided in turn, exactly as separate calls would): far less work per request on a hot counter"
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
    "Counters known to be full are answered locally until they can take a hit again, without calling Redis; this many at most, 0 turns it off"
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
    "Serve GET and DELETE /counters on the admin port (inspect and reset one counter)"
    admin_counters: bool = false, flag bool, "BOOL";
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
mod tests {
    use super::*;
    use std::path::Path;

    fn env(pairs: &[(&str, &str)]) -> Option<config::Map<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// The settings alone (the warnings are the upstream layer's tests').
    fn load(
        file: Option<&Path>,
        flags: &SettingsFlags,
        env: Option<config::Map<String, String>>,
    ) -> Result<Settings, SettingsError> {
        Settings::load_from(file, flags, env).map(|loaded| loaded.settings)
    }

    #[test]
    fn defaults_apply_when_nothing_is_set() {
        let s = load(None, &SettingsFlags::default(), env(&[])).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!(s.grpc_addr.port(), 8081);
        assert_eq!(s.http_addr.port(), 8080);
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
        let s = load(
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
        let err = load(Some(&file), &SettingsFlags::default(), env(&[])).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("unknown setting 'grpc_adr'") && text.contains("grpc_addr"),
            "{text}"
        );
    }

    #[test]
    fn kubernetes_service_variables_are_ignored() {
        let s = load(
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
    fn a_bad_value_is_one_line_naming_where_it_came_from_and_the_value() {
        let bad = |pairs: &[(&str, &str)]| {
            let err = load(None, &SettingsFlags::default(), env(pairs)).expect_err("a bad value");
            assert!(std::error::Error::source(&err).is_none(), "{err}");
            err.to_string()
        };
        assert_eq!(
            bad(&[("SLUICE_GRPC_ADDR", "abc")]),
            "invalid SLUICE_GRPC_ADDR=\"abc\": invalid socket address syntax"
        );
        assert_eq!(
            bad(&[("SLUICE_MAX_ENTRIES", "-3")]),
            "invalid SLUICE_MAX_ENTRIES=\"-3\": expected a whole number, 0 or more"
        );
        assert_eq!(
            bad(&[("SLUICE_LOG_FORMAT", "xml")]),
            "invalid SLUICE_LOG_FORMAT=\"xml\": expected one of human, json"
        );
        assert_eq!(
            bad(&[("SLUICE_SHADOW_MODE", "maybe")]),
            "invalid SLUICE_SHADOW_MODE=\"maybe\": expected true or false"
        );
        assert_eq!(
            bad(&[("SLUICE_TRACE_SAMPLING_RATIO", "2")]),
            "invalid SLUICE_TRACE_SAMPLING_RATIO=\"2\": the share of traces to export goes \
             from 0 (none) to 1 (all)"
        );
        assert_eq!(
            bad(&[("SLUICE_XDS_NODE_METADATA", "zone:a")]),
            "invalid SLUICE_XDS_NODE_METADATA=\"zone:a\": expected a JSON object, e.g. {\"zone\": \"a\"}"
        );
        // The settings file: its key, the value and the file.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sluice.toml");
        std::fs::write(&file, "grpc_addr = \"abc\"\n").unwrap();
        let err = load(Some(&file), &SettingsFlags::default(), env(&[]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "invalid grpc_addr = \"abc\" in {}: invalid socket address syntax",
                file.display()
            )
        );
        // A variable wins over the file, and so is the one named.
        let err = load(
            Some(&file),
            &SettingsFlags::default(),
            env(&[("SLUICE_GRPC_ADDR", "def")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("invalid SLUICE_GRPC_ADDR=\"def\""), "{err}");
        let err = load(
            Some(&dir.path().join("missing.toml")),
            &SettingsFlags::default(),
            env(&[]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("settings file: ") && err.contains("missing.toml"),
            "{err}"
        );
    }

    /// Every setting that must be positive (typed `NonZero…`).
    const POSITIVE: &[&str] = &[
        "redis_pool_size",
        "redis_timeout_ms",
        "breaker_failures",
        "grpc_max_connections",
        "http_max_connections",
        "handshake_timeout_ms",
        "idle_timeout_ms",
        "grpc_max_concurrent_streams",
        "grpc_max_request_bytes",
        "request_timeout_ms",
        "stats_flush_interval_ms",
    ];

    #[test]
    fn a_zero_where_it_must_be_positive_is_an_error_naming_the_setting() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            flags: SettingsFlags,
        }
        let dir = tempfile::tempdir().unwrap();
        for name in POSITIVE {
            let var = format!("SLUICE_{}", name.to_ascii_uppercase());
            let err = load(None, &SettingsFlags::default(), env(&[(&var, "0")])).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("invalid {var}=\"0\": expected a whole number, 1 or more")
            );
            let flag = format!("--{}", name.replace('_', "-"));
            let cli = Cli::parse_from(["x", &flag, "0"]);
            let err = load(None, &cli.flags, env(&[])).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("invalid {flag} \"0\": expected a whole number, 1 or more")
            );
            let file = dir.path().join("sluice.toml");
            std::fs::write(&file, format!("{name} = 0\n")).unwrap();
            let err = load(Some(&file), &SettingsFlags::default(), env(&[])).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "invalid {name} = \"0\" in {}: expected a whole number, 1 or more",
                    file.display()
                )
            );
            for (value, why) in [
                ("-1", "expected a whole number, 1 or more"),
                ("soon", "expected a whole number"),
            ] {
                let err = load(None, &SettingsFlags::default(), env(&[(&var, value)]));
                assert_eq!(
                    err.unwrap_err().to_string(),
                    format!("invalid {var}={value:?}: {why}")
                );
            }
            let one = load(None, &SettingsFlags::default(), env(&[(&var, "1")]));
            assert!(one.is_ok(), "{name}: {one:?}");
        }
    }

    #[test]
    fn a_zero_from_upstreams_variables_is_an_error_naming_the_variable() {
        let flags = SettingsFlags {
            settings_from: Some(upstream::SettingsFrom::EnvoyRatelimit),
            ..Default::default()
        };
        for (var, value, setting) in [
            ("REDIS_POOL_SIZE", "0", "redis_pool_size"),
            ("REDIS_TIMEOUT", "0s", "redis_timeout_ms"),
            ("STATS_FLUSH_INTERVAL", "0", "stats_flush_interval_ms"),
        ] {
            let err = load(None, &flags, env(&[(var, value)])).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("invalid {setting} = \"0\" from {var}: expected a whole number, 1 or more")
            );
        }
    }
}

#[cfg(test)]
mod declaration_tests {
    use super::*;
    use clap::CommandFactory as _;
    use std::path::Path;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        flags: SettingsFlags,
    }

    fn env(pairs: &[(&str, &str)]) -> Option<config::Map<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// The settings alone (the warnings are the upstream layer's tests').
    fn load(
        file: Option<&Path>,
        flags: &SettingsFlags,
        env: Option<config::Map<String, String>>,
    ) -> Result<Settings, SettingsError> {
        Settings::load_from(file, flags, env).map(|loaded| loaded.settings)
    }

    #[test]
    fn every_setting_is_declared_once_with_flag_env_and_doc() {
        let defaults = serde_json::to_value(Settings::default()).unwrap();
        let fields: Vec<&String> = defaults.as_object().unwrap().keys().collect();
        assert_eq!(fields.len(), DECLARED.len());
        let help = Cli::command().render_long_help().to_string();
        let mut seen = std::collections::HashSet::new();
        for d in DECLARED {
            assert!(seen.insert(d.name), "{} declared twice", d.name);
            assert!(fields.contains(&&d.name.to_string()), "{}", d.name);
            assert!(!d.doc.is_empty(), "{} has no doc", d.name);
            assert!(help.contains(&d.flag()), "{} has no flag", d.name);
            assert!(
                help.contains(&format!("[default: {}]", d.default_text())),
                "{}",
                d.name
            );
        }
    }

    #[test]
    fn a_new_setting_reads_from_env_and_the_flag_wins() {
        use clap::Parser as _;
        let cli = Cli::parse_from(["x", "--counting", "admitted", "--xds-backoff-max-ms", "5"]);
        let s = load(
            None,
            &cli.flags,
            env(&[
                ("SLUICE_COUNTING", "always"),
                ("SLUICE_SHADOW_MODE", "true"),
                ("SLUICE_XDS_SERVER", "eg:18001"),
                ("SLUICE_XDS_BACKOFF_MAX_MS", "9"),
                ("SLUICE_DEBUG_ADDR", "127.0.0.1:6070"),
                ("SLUICE_XDS_TLS", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(s.counting, Counting::Admitted);
        assert!(s.shadow_mode);
        assert_eq!(s.xds_server.as_deref(), Some("eg:18001"));
        assert_eq!(s.xds_backoff_max_ms, 5);
        assert_eq!(s.debug_addr, Some(SocketAddr::from(([127, 0, 0, 1], 6070))));
        assert!(s.xds_tls);
        assert_eq!(Settings::default().counting, Counting::Admitted);
    }

    #[test]
    fn both_upstream_stats_sinks_at_once_stop_start_up() {
        use clap::Parser as _;
        let cli = Cli::parse_from(["x"]);
        let vars = [
            ("SLUICE_STATSD_ADDR", "statsd:8125"),
            ("SLUICE_UPSTREAM_PROMETHEUS_ADDR", "0.0.0.0:19001"),
        ];
        let error = load(None, &cli.flags, env(&vars)).unwrap_err();
        assert!(
            matches!(error, SettingsError::Unsupported { .. }),
            "{error}"
        );
    }

    #[test]
    fn a_certificate_without_its_key_is_an_error() {
        for var in [
            "SLUICE_GRPC_TLS_CERT",
            "SLUICE_XDS_TLS_KEY",
            "SLUICE_REDIS_TLS_CERT",
        ] {
            let err = load(None, &SettingsFlags::default(), env(&[(var, "/x.pem")])).unwrap_err();
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("invalid {var}=\"/x.pem\": "))
                    && text.contains("go together"),
                "{text}"
            );
        }
    }
}
