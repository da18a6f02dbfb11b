//! The upstream layer against upstream's defaults and meanings, and the
//! tables against upstream's full list of variables.

use super::*;
use crate::settings::unsupported::UNSUPPORTED;
use std::collections::BTreeSet;

fn env(pairs: &[(&str, &str)]) -> Map<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn get(pairs: &[(&str, &str)], setting: &str) -> Option<String> {
    layer(&env(pairs)).unwrap().get(setting).map(String::from)
}

#[test]
fn go_durations() {
    assert_eq!(go_duration_ms("24h"), Ok(86_400_000));
    assert_eq!(go_duration_ms("1m30s"), Ok(90_000));
    assert_eq!(go_duration_ms("250ms"), Ok(250));
    assert_eq!(go_duration_ms("1.5s"), Ok(1_500));
    assert_eq!(go_duration_ms("0"), Ok(0));
    assert!(go_duration_ms("10").is_err());
    assert!(go_duration_ms("10x").is_err());
    assert!(go_duration_ms("").is_err());
}

#[test]
fn defaults_are_upstreams() {
    let l = layer(&env(&[])).unwrap();
    assert_eq!(l.get("http_addr"), Some("0.0.0.0:8080"));
    assert_eq!(l.get("grpc_addr"), Some("0.0.0.0:8081"));
    assert_eq!(l.get("debug_addr"), Some("0.0.0.0:6070"));
    assert_eq!(l.get("rules"), Some("/srv/runtime_data/current/config"));
    assert_eq!(l.get("counting"), Some("always"));
    assert_eq!(l.get("statsd_addr"), Some("localhost:8125"));
    assert_eq!(l.get("log_level"), Some("warn"));
    assert_eq!(l.get("redis_pool_size"), None, "Sluice's own default");
    assert_eq!(l.get("redis_timeout_ms"), Some("10000"));
    assert_eq!(l.get("local_cache_size"), Some("0"));
    assert_eq!(l.get("max_connection_age_ms"), Some("86400000"));
    assert_eq!(l.get("redis_url"), None);
    assert_eq!(l.get("service_name"), Some("RateLimit"));
}

#[test]
fn listeners_and_rules_directory() {
    let pairs = [
        ("HOST", "127.0.0.1"),
        ("PORT", "9000"),
        ("GRPC_PORT", "9001"),
        ("DEBUG_HOST", "::1"),
        ("DEBUG_PORT", "9002"),
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ];
    assert_eq!(get(&pairs, "http_addr").unwrap(), "127.0.0.1:9000");
    assert_eq!(get(&pairs, "grpc_addr").unwrap(), "0.0.0.0:9001");
    assert_eq!(get(&pairs, "debug_addr").unwrap(), "[::1]:9002");
    assert_eq!(get(&pairs, "rules").unwrap(), "/data/ratelimit/config");
    let pairs = [("RUNTIME_ROOT", "/d"), ("RUNTIME_APPDIRECTORY", "rl")];
    assert_eq!(get(&pairs, "rules").unwrap(), "/d/rl");
}

#[test]
fn a_bad_value_names_its_variable() {
    for (var, value) in [
        ("PORT", "abc"),
        ("GRPC_PORT", "70000"),
        ("SHADOW_MODE", "yes please"),
        ("REDIS_TIMEOUT", "10"),
        ("LOG_LEVEL", "loud"),
        ("CONFIG_TYPE", "DELTA"),
        ("REDIS_POOL_SIZE", "-1"),
    ] {
        let err = layer(&env(&[(var, value)])).unwrap_err();
        assert_eq!(err.var, var);
        assert!(
            err.to_string().starts_with(&format!("invalid {var}=")),
            "{err}"
        );
    }
}

#[test]
fn xds_settings() {
    let pairs = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "eg:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "n1"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "a:1,b:2"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c.pem"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/k.pem"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca.pem"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "eg.local"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1m30s"),
        ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.25"),
        ("XDS_CLIENT_BACKOFF_JITTER", "false"),
        ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1000"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ];
    let l = layer(&env(&pairs)).unwrap();
    assert_eq!(l.get("rules"), None);
    assert_eq!(l.get("xds_server"), Some("eg:18001"));
    assert_eq!(l.get("xds_node_id"), Some("n1"));
    let meta: serde_json::Value =
        serde_json::from_str(l.get("xds_node_metadata").unwrap()).unwrap();
    assert_eq!(meta, serde_json::json!({"a": "1", "b": "2"}));
    assert_eq!(l.get("xds_tls"), Some("true"));
    assert_eq!(l.get("xds_tls_cert"), Some("/c.pem"));
    assert_eq!(l.get("xds_tls_key"), Some("/k.pem"));
    assert_eq!(l.get("xds_tls_ca_cert"), Some("/ca.pem"));
    assert_eq!(l.get("xds_tls_san"), Some("eg.local"));
    assert_eq!(l.get("xds_backoff_initial_ms"), Some("1000"));
    assert_eq!(l.get("xds_backoff_max_ms"), Some("90000"));
    assert_eq!(l.get("xds_backoff_random_factor"), Some("0.25"));
    assert_eq!(l.get("xds_backoff_jitter"), Some("false"));
    assert_eq!(l.get("xds_max_message_bytes"), Some("1000"));
    assert_eq!(l.get("force_start_without_initial_config"), Some("true"));
    let err = layer(&env(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")])).unwrap_err();
    assert_eq!(err.var, "CONFIG_GRPC_XDS_SERVER_URL");
}

#[test]
fn redis_urls_auth_and_tls() {
    let tcp = [("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis:6379")];
    assert_eq!(get(&tcp, "redis_url").unwrap(), "redis://redis:6379");
    let cluster = [
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "CLUSTER"),
        ("REDIS_URL", "a:7000, b:7001"),
        ("REDIS_TLS", "true"),
    ];
    assert_eq!(
        get(&cluster, "redis_url").unwrap(),
        "rediss-cluster://a:7000,b:7001"
    );
    let sentinel = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ("REDIS_AUTH", "app:se:cret"),
    ];
    let l = layer(&env(&sentinel)).unwrap();
    assert_eq!(
        l.get("redis_url"),
        Some("redis-sentinel://app:@s1:26379,s2:26379/mymaster")
    );
    assert_eq!(l.get("redis_password"), Some("se:cret"));
    let pass_only = [("REDIS_URL", "r:6379"), ("REDIS_AUTH", "hunter2")];
    let l = layer(&env(&pass_only)).unwrap();
    assert_eq!(l.get("redis_url"), Some("redis://r:6379"));
    assert_eq!(l.get("redis_password"), Some("hunter2"));
    // Unix sockets: a path, with the socket type said or left to
    // upstream's default (unix).
    let unix = [
        ("REDIS_SOCKET_TYPE", "unix"),
        ("REDIS_URL", "/var/run/redis.sock"),
        ("REDIS_AUTH", "alice:pw"),
    ];
    let l = layer(&env(&unix)).unwrap();
    assert_eq!(
        l.get("redis_url"),
        Some("redis+unix://alice:@/var/run/redis.sock")
    );
    let path = [("REDIS_URL", "/var/run/redis.sock")];
    assert_eq!(
        layer(&env(&path)).unwrap().get("redis_url"),
        Some("redis+unix:///var/run/redis.sock")
    );
    let not_a_path = [("REDIS_SOCKET_TYPE", "unix"), ("REDIS_URL", "r:6379")];
    assert_eq!(layer(&env(&not_a_path)).unwrap_err().var, "REDIS_URL");
    let path_over_tcp = [("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "/r.sock")];
    assert_eq!(
        layer(&env(&path_over_tcp)).unwrap_err().var,
        "REDIS_SOCKET_TYPE"
    );
    let cluster = [("REDIS_TYPE", "cluster"), ("REDIS_URL", "/r.sock")];
    assert_eq!(layer(&env(&cluster)).unwrap_err().var, "REDIS_TYPE");
    let two = [("REDIS_URL", "a:1,b:2")];
    assert_eq!(layer(&env(&two)).unwrap_err().var, "REDIS_URL");
    let tls = [
        ("REDIS_TLS_CLIENT_CERT", "/c"),
        ("REDIS_TLS_CLIENT_KEY", "/k"),
        ("REDIS_TLS_CACERT", "/ca"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ("REDIS_POOL_SIZE", "3"),
        ("REDIS_TIMEOUT", "1m30s"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_URL", "ps:6380"),
    ];
    let l = layer(&env(&tls)).unwrap();
    assert_eq!(l.get("redis_tls_cert"), Some("/c"));
    assert_eq!(l.get("redis_tls_key"), Some("/k"));
    assert_eq!(l.get("redis_tls_ca_cert"), Some("/ca"));
    assert_eq!(l.get("redis_tls_skip_hostname_verification"), Some("true"));
    assert_eq!(l.get("redis_pool_size"), Some("3"));
    assert_eq!(l.get("redis_timeout_ms"), Some("90000"));
    assert_eq!(l.get("redis_per_second_url"), Some("redis://ps:6380"));
}

#[test]
fn decisions_logs_and_sinks() {
    let pairs = [
        ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
        ("NEAR_LIMIT_RATIO", "0.9"),
        ("SHADOW_MODE", "true"),
        ("QUOTA_MODE", "1"),
        ("RESPONSE_DYNAMIC_METADATA", "true"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LOG_LEVEL", "DEBUG"),
        ("LOG_FORMAT", "json"),
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":19001"),
        ("PROMETHEUS_PATH", "/m"),
        ("PROMETHEUS_MAPPER_YAML", "/map.yaml"),
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "otel:4317"),
        ("TRACING_SERVICE_NAME", "rl"),
        ("GRPC_MAX_CONNECTION_AGE", "1m30s"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "10s"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/s.crt"),
        ("GRPC_SERVER_TLS_KEY", "/s.key"),
        ("GRPC_CLIENT_TLS_CACERT", "/ca.crt"),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
    ];
    let l = layer(&env(&pairs)).unwrap();
    let expect = [
        ("local_cache_size", "8192"),
        ("near_limit_ratio", "0.9"),
        ("shadow_mode", "true"),
        ("quota_mode", "true"),
        ("response_dynamic_metadata", "true"),
        ("response_headers", "draft03"),
        ("log_level", "debug"),
        ("log_format", "json"),
        ("upstream_prometheus_addr", "0.0.0.0:19001"),
        ("upstream_prometheus_path", "/m"),
        ("prometheus_mapper", "/map.yaml"),
        ("otlp_endpoint", "http://otel:4317"),
        ("otlp_protocol", "http"),
        ("service_name", "rl"),
        ("max_connection_age_ms", "90000"),
        ("max_connection_age_grace_ms", "10000"),
        ("grpc_tls_cert", "/s.crt"),
        ("grpc_tls_key", "/s.key"),
        ("grpc_tls_ca_cert", "/ca.crt"),
        ("healthy_with_config_loaded", "true"),
    ];
    for (setting, value) in expect {
        assert_eq!(l.get(setting), Some(value), "{setting}");
    }
    assert_eq!(l.get("statsd_addr"), None);
    let statsd = [("STATSD_HOST", "sd"), ("STATSD_PORT", "9125")];
    assert_eq!(get(&statsd, "statsd_addr").unwrap(), "sd:9125");
    assert_eq!(get(&statsd, "statsd_udp").unwrap(), "false");
    let udp = [("STATSD_PROTOCOL", "UDP")];
    assert_eq!(get(&udp, "statsd_udp").unwrap(), "true");
    let bad = [("STATSD_PROTOCOL", "quic")];
    assert_eq!(layer(&env(&bad)).unwrap_err().var, "STATSD_PROTOCOL");
}

#[test]
fn tracing_as_envoy_gateway_sets_it_goes_over_http_with_its_sampling_rate() {
    let eg = [
        ("TRACING_ENABLED", "true"),
        ("TRACING_SAMPLING_RATE", "0.6"),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://trace-collector.envoy-gateway-system.svc.cluster.local:4317",
        ),
    ];
    let l = layer(&env(&eg)).unwrap();
    assert_eq!(l.get("otlp_protocol"), Some("http"));
    assert_eq!(l.get("trace_sampling_ratio"), Some("0.6"));
    let grpc = [
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "GRPC"),
    ];
    let l = layer(&env(&grpc)).unwrap();
    assert_eq!(l.get("otlp_protocol"), Some("grpc"));
    assert_eq!(l.get("otlp_endpoint"), Some("http://localhost:4317"));
    let http = [("TRACING_ENABLED", "true")];
    assert_eq!(
        layer(&env(&http)).unwrap().get("otlp_endpoint"),
        Some("http://localhost:4318")
    );
    let bad = [
        ("TRACING_ENABLED", "true"),
        ("TRACING_SAMPLING_RATE", "most"),
    ];
    assert_eq!(layer(&env(&bad)).unwrap_err().var, "TRACING_SAMPLING_RATE");
}

#[test]
fn both_sinks_are_a_start_up_error() {
    let err = layer(&env(&[("USE_PROMETHEUS", "true")])).unwrap_err();
    assert!(err.to_string().contains("only one stats sink"), "{err}");
    let err = layer(&env(&[("USE_STATSD", "true"), ("USE_PROMETHEUS", "true")])).unwrap_err();
    assert_eq!(err.var, "USE_PROMETHEUS");
}

/// Every variable envoyproxy/ratelimit reads, as its
/// `src/settings/settings.go` declares them at f2fb157 (2026-07-05),
/// plus `DESCRIPTOR_KEY_CONFIG` (an open pull request there).
const UPSTREAM_VARIABLES: &[&str] = &[
    "BACKEND_TYPE",
    "CACHE_KEY_PREFIX",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_TYPE",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "DESCRIPTOR_KEY_CONFIG",
    "DISABLE_STATS",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "EXTRA_TAGS",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "GRPC_HOST",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_PORT",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_SERVER_USE_TLS",
    "GRPC_UDS",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "HOST",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "MERGE_DOMAIN_CONFIG",
    "NEAR_LIMIT_RATIO",
    "PORT",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_PATH",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    "QUOTA_MODE",
    "REDIS_AUTH",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_POOL_SIZE",
    "REDIS_SENTINEL_AUTH",
    "REDIS_SOCKET_TYPE",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_TIMEOUT",
    "REDIS_TLS",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_TYPE",
    "REDIS_URL",
    "RESPONSE_DYNAMIC_METADATA",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_WATCH_ROOT",
    "SHADOW_MODE",
    "STATSD_HOST",
    "STATSD_PORT",
    "STATS_FLUSH_INTERVAL",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "TRACING_ENABLED",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_PROMETHEUS",
    "USE_STATSD",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
];

/// Variables Sluice reads that are not in upstream's `settings.go`: gostats
/// reads `STATSD_PROTOCOL` itself, the OpenTelemetry SDK
/// `OTEL_EXPORTER_OTLP_ENDPOINT`, and Envoy Gateway sets
/// `GRPC_SERVER_TLS_CA_CERT` (see `combined.rs`).
const ALSO_READ: &[&str] = &[
    "STATSD_PROTOCOL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "GRPC_SERVER_TLS_CA_CERT",
];

/// Every variable the tables declare.
fn declared() -> BTreeSet<&'static str> {
    let single = VARIABLES.iter().map(|v| v.name);
    let combined = COMBINED.iter().flat_map(|c| c.vars.iter().copied());
    single.chain(combined).collect()
}

#[test]
fn every_upstream_variable_is_mapped_or_listed_as_unsupported_never_both() {
    let mapped = declared();
    let listed: BTreeSet<&str> = UNSUPPORTED.iter().map(|u| u.name).collect();
    let both: Vec<_> = mapped.intersection(&listed).collect();
    assert!(
        both.is_empty(),
        "mapped and also listed as unsupported: {both:?}"
    );
    let union: BTreeSet<&str> = mapped.union(&listed).copied().collect();
    let upstream: BTreeSet<&str> = UPSTREAM_VARIABLES
        .iter()
        .chain(ALSO_READ)
        .copied()
        .collect();
    assert_eq!(
        union.difference(&upstream).collect::<Vec<_>>(),
        Vec::<&&str>::new(),
        "declared in settings/upstream or settings/unsupported.rs, but no upstream variable"
    );
    assert_eq!(
        upstream.difference(&union).collect::<Vec<_>>(),
        Vec::<&&str>::new(),
        "neither mapped in settings/upstream nor listed in settings/unsupported.rs"
    );
}

#[test]
fn each_setting_is_fed_by_one_row() {
    let mut seen = BTreeSet::new();
    let feeds = VARIABLES
        .iter()
        .map(|v| v.feeds)
        .chain(COMBINED.iter().map(|c| c.feeds));
    for key in feeds {
        assert!(seen.insert(key), "{} is fed by two rows", key.name());
    }
}

/// Environments that take every branch of the combined settings: files or
/// xDS, statsd or Prometheus, tracing, TLS, a per-second Redis.
const BRANCHES: &[&[(&str, &str)]] = &[
    &[],
    &[
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "eg:18001"),
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("TRACING_ENABLED", "true"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/c"),
        ("GRPC_SERVER_TLS_KEY", "/k"),
        ("REDIS_AUTH", "u:p"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "r:1"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
        ("REDIS_PERSECOND_URL", "ps:1"),
    ],
];

#[test]
fn each_combined_setting_reads_the_variables_of_its_row_and_no_other() {
    for c in COMBINED {
        let mut read = BTreeSet::new();
        for pairs in BRANCHES {
            let env = env(pairs);
            let reader = Reader {
                env: &env,
                read: Default::default(),
            };
            (c.read)(&reader).expect("a valid environment");
            read.extend(reader.read.into_inner());
        }
        let row: BTreeSet<String> = c.vars.iter().map(|v| v.to_string()).collect();
        assert_eq!(read, row, "{}", c.feeds.name());
    }
}

#[test]
fn a_single_variable_reads_itself_only() {
    for v in VARIABLES {
        let env = env(&[]);
        let reader = Reader {
            env: &env,
            read: Default::default(),
        };
        v.value(&reader).expect("upstream's default");
        assert_eq!(
            reader.read.into_inner(),
            BTreeSet::from([v.name.to_owned()])
        );
    }
}
