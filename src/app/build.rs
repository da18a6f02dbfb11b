//! The runtime objects the settings describe: each function reads the
//! plain values of [`Settings`] and builds one object of the layer that
//! uses it (the store's, the listeners', the limiter's, telemetry's, the
//! xDS client's). `settings` stays data; this is where it meets the rest of
//! the crate.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::{Bounds, LimiterOptions};
use crate::limiter::SoftRatio;
use crate::server::{ConnLimits, GrpcLimits, ServeExtras, ServeOptions, TlsFiles};
use crate::settings::Settings;
use crate::store::{BreakerConfig, MemoryStoreConfig, RedisStoreConfig, RedisTls, RedisUrl};
use crate::telemetry::metrics::{Metrics, MetricsConfig};
use crate::telemetry::traces::OtlpExport;
use crate::telemetry::upstream::statsd::{Protocol, UpstreamStatsConfig};
use crate::xds::XdsConfig;

/// The xDS client's settings, when rules come from a management server.
pub fn xds(s: &Settings) -> Option<XdsConfig> {
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    Some(XdsConfig {
        xds_server: s.xds_server.clone()?,
        xds_node_id: s.xds_node_id.clone(),
        xds_node_metadata: s.xds_node_metadata.clone().unwrap_or_default(),
        xds_tls: s.xds_tls,
        xds_tls_cert: path(&s.xds_tls_cert),
        xds_tls_key: path(&s.xds_tls_key),
        xds_tls_ca_cert: path(&s.xds_tls_ca_cert),
        xds_tls_san: s.xds_tls_san.clone(),
        xds_backoff_initial_ms: s.xds_backoff_initial_ms,
        xds_backoff_max_ms: s.xds_backoff_max_ms,
        xds_backoff_random_factor: s.xds_backoff_random_factor,
        xds_backoff_jitter: s.xds_backoff_jitter,
        xds_max_message_bytes: s.xds_max_message_bytes,
        force_start_without_initial_config: s.force_start_without_initial_config,
    })
}

/// What responses carry besides the decision.
pub fn serve_extras(s: &Settings) -> ServeExtras {
    ServeExtras {
        dynamic_metadata: s.response_dynamic_metadata,
        problem_body: s.problem_json_body,
        admin_counters: s.admin_counters,
        upstream_headroom: s.upstream_headroom_headers,
        admin_token: s.admin_token.clone(),
        overrides_max_per_domain: s.overrides_max_per_domain.get(),
    }
}

/// TLS on the gRPC listener, when a certificate is set.
pub fn grpc_tls(s: &Settings) -> Option<TlsFiles> {
    Some(TlsFiles {
        cert: s.grpc_tls_cert.clone()?,
        key: s.grpc_tls_key.clone()?,
        ca: s.grpc_tls_ca_cert.clone(),
    })
}

/// Upstream-named stats, when a sink is set.
pub fn upstream_stats(s: &Settings) -> Option<UpstreamStatsConfig> {
    if s.statsd_addr.is_none() && s.upstream_prometheus_addr.is_none() {
        return None;
    }
    Some(UpstreamStatsConfig {
        statsd_addr: s.statsd_addr.clone(),
        statsd_protocol: if s.statsd_udp {
            Protocol::Udp
        } else {
            Protocol::Tcp
        },
        upstream_prometheus_addr: s.upstream_prometheus_addr,
        upstream_prometheus_path: s.upstream_prometheus_path.clone(),
        prometheus_mapper: s.prometheus_mapper.clone(),
        stats_flush_interval_ms: s.stats_flush_interval_ms.get(),
        // Six series per stats key, as many keys as Sluice's own
        // metrics label.
        max_names: s.metrics_max_descriptors.saturating_mul(6).max(1_000),
    })
}

/// Where traces go, when an OTLP endpoint is set.
pub fn otlp(s: &Settings) -> Option<OtlpExport> {
    s.otlp_endpoint.as_ref().map(|endpoint| OtlpExport {
        endpoint: endpoint.clone(),
        protocol: s.otlp_protocol,
        service_name: s.service_name.clone(),
        sampling_ratio: s.trace_sampling_ratio,
    })
}

/// The Redis store settings, when a Redis URL is set.
pub fn redis(s: &Settings) -> Option<RedisStoreConfig> {
    // `redis_password` keeps the password out of the URLs (a Secret).
    let with_password = |url: &RedisUrl| match &s.redis_password {
        Some(password) => url.with_password(password.expose()),
        None => url.clone(),
    };
    s.redis_url.as_ref().map(|url| RedisStoreConfig {
        url: with_password(url),
        per_second_url: s.redis_per_second_url.as_ref().map(with_password),
        tls: RedisTls {
            ca: s.redis_tls_ca_cert.clone(),
            client: s.redis_tls_cert.clone().zip(s.redis_tls_key.clone()),
            skip_hostname_verification: s.redis_tls_skip_hostname_verification,
        },
        pool_size: s.redis_pool_size.get(),
        timeout: Duration::from_millis(s.redis_timeout_ms.get()),
        key_prefix: s.redis_key_prefix.clone(),
        time: s.time_source,
        breaker: Some(breaker(s)),
        coalesce: s.redis_coalesce,
    })
}

/// The in-memory store's settings.
pub fn memory_store(s: &Settings) -> MemoryStoreConfig {
    MemoryStoreConfig {
        max_keys: s.memory_max_keys,
        max_bytes: s.memory_max_bytes,
        ..MemoryStoreConfig::default()
    }
}

/// How the listeners behave.
pub fn serve_options(s: &Settings) -> ServeOptions {
    let connections = |max_connections: NonZeroU32| ConnLimits {
        max_connections: max_connections.get(),
        handshake_timeout: Duration::from_millis(s.handshake_timeout_ms.get()),
        idle_timeout: Duration::from_millis(s.idle_timeout_ms.get()),
        max_age: None,
        max_age_grace: Duration::from_millis(s.max_connection_age_grace_ms),
    };
    ServeOptions {
        headers: s.response_headers,
        shutdown_delay: Duration::from_millis(s.shutdown_delay_ms),
        shutdown_grace: Duration::from_millis(s.shutdown_grace_ms),
        grpc: GrpcLimits {
            max_concurrent_streams: s.grpc_max_concurrent_streams.get(),
            max_request_bytes: s.grpc_max_request_bytes.get(),
            request_timeout: Duration::from_millis(s.request_timeout_ms.get()),
        },
        grpc_connections: ConnLimits {
            max_age: (s.max_connection_age_ms > 0)
                .then(|| Duration::from_millis(s.max_connection_age_ms)),
            ..connections(s.grpc_max_connections)
        },
        http_connections: connections(s.http_max_connections),
        debug_addr: s.debug_addr,
        healthy_with_config_loaded: s.healthy_with_config_loaded,
    }
}

/// The limiter's options, with a fresh metrics registry.
pub fn limiter_options(s: &Settings) -> LimiterOptions {
    let metrics = Metrics::new(MetricsConfig {
        near_limit_ratio: s.near_limit_ratio,
        max_descriptor_labels: s.metrics_max_descriptors,
    });
    LimiterOptions {
        bounds: bounds(s),
        on_store_error: s.on_store_error,
        metrics: Arc::new(metrics),
        // Only a remote store saves anything by answering locally.
        local_cache: if s.redis_url.is_some() {
            s.local_cache_size
        } else {
            0
        },
        clock: Arc::new(crate::limiter::SystemClock),
        counting: s.counting,
        shadow_mode: s.shadow_mode,
        quota_mode: s.quota_mode,
        // Checked when the settings were loaded.
        soft_ratio: s.soft_ratio.and_then(|r| SoftRatio::new(r).ok()),
    }
}

/// The circuit breaker's settings.
pub fn breaker(s: &Settings) -> BreakerConfig {
    BreakerConfig {
        failures: s.breaker_failures.get(),
        min_failing: Duration::from_millis(s.breaker_min_failing_ms),
        cooldown: Duration::from_millis(s.breaker_cooldown_ms),
    }
}

/// The request bounds.
pub fn bounds(s: &Settings) -> Bounds {
    Bounds {
        max_descriptors: s.max_descriptors,
        max_entries: s.max_entries,
        max_entry_bytes: s.max_entry_bytes,
        max_hits_addend: s.max_hits_addend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Counting, MAX_HITS};
    use crate::settings::tests::{env, load as settings_from};
    use crate::settings::{Secret, SettingsFlags};
    use std::net::SocketAddr;
    use std::path::Path;

    /// The listeners' defaults are the settings' defaults (each is written
    /// in its own layer), except the connection age, which only the
    /// settings bound by default.
    #[test]
    fn the_default_settings_build_the_default_listeners() {
        let built = serve_options(&Settings::default());
        let default = ServeOptions::default();
        assert_eq!(built.grpc, default.grpc);
        assert_eq!(
            built.grpc_connections,
            ConnLimits {
                max_age: Some(Duration::from_secs(1_800)),
                ..default.grpc_connections
            }
        );
        assert_eq!(built.http_connections, default.http_connections);
        assert_eq!(
            (built.headers, built.shutdown_delay, built.shutdown_grace),
            (
                default.headers,
                default.shutdown_delay,
                default.shutdown_grace
            )
        );
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

        let s = settings_from(
            None,
            &SettingsFlags::default(),
            env(&[
                ("SLUICE_MEMORY_MAX_KEYS", "1000"),
                ("SLUICE_MEMORY_MAX_BYTES", "1048576"),
            ]),
        )
        .unwrap();
        let config = memory_store(&s);
        assert_eq!((config.max_keys, config.max_bytes), (1_000, 1 << 20));
    }

    #[test]
    fn the_warnings_are_off_by_default_and_set_from_the_settings() {
        let s = Settings::default();
        assert_eq!(limiter_options(&s).soft_ratio, None);
        assert!(!serve_extras(&s).upstream_headroom);
        let s = settings_from(
            None,
            &SettingsFlags::default(),
            env(&[
                ("SLUICE_SOFT_RATIO", "0.75"),
                ("SLUICE_UPSTREAM_HEADROOM_HEADERS", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(
            limiter_options(&s).soft_ratio,
            Some(SoftRatio::new(0.75).unwrap())
        );
        assert!(serve_extras(&s).upstream_headroom);
    }

    #[test]
    fn a_redis_password_from_the_environment_goes_into_the_url_and_not_the_logs() {
        let s = settings_from(
            None,
            &SettingsFlags::default(),
            env(&[
                ("SLUICE_REDIS_URL", "redis-cluster://alice:@a:7000,b:7001"),
                ("SLUICE_REDIS_PASSWORD", "p@ss:w/rd"),
            ]),
        )
        .unwrap();
        let redis = redis(&s).expect("a Redis store");
        assert_eq!(
            redis.url.expose(),
            "redis-cluster://alice:p%40ss%3Aw%2Frd@a:7000,b:7001"
        );
        assert!(!format!("{s:?}").contains("p@ss"), "{s:?}");
    }

    #[test]
    fn a_redis_password_that_looks_like_a_number_arrives_as_it_is() {
        let load = |password: &str| {
            settings_from(
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
        assert_eq!(redis(&load("")).unwrap().url.expose(), "redis://h:1");
        // A flag still wins over the environment.
        let flags = SettingsFlags {
            redis_password: Some("from-flag".into()),
            ..Default::default()
        };
        let s = settings_from(None, &flags, env(&[("SLUICE_REDIS_PASSWORD", "007")])).unwrap();
        assert_eq!(
            s.redis_password.as_ref().map(Secret::expose),
            Some("from-flag")
        );
    }

    #[test]
    fn the_redis_password_never_shows_in_debug_output() {
        let s = settings_from(
            None,
            &SettingsFlags::default(),
            env(&[("SLUICE_REDIS_URL", "redis://app:hunter2@redis:6379")]),
        )
        .unwrap();
        let shown = format!("{s:?}");
        assert!(shown.contains("redis://app:***@redis:6379"), "{shown}");
        assert!(!shown.contains("hunter2"));
        assert_eq!(
            redis(&s).unwrap().url.expose(),
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
            let err = settings_from(None, &flags, env(&[])).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "invalid --max-hits-addend \"{value}\": above its maximum 9007199254740991 \
                     (2^53 - 1: weights beyond it are not exact in the Redis scripts' arithmetic)"
                )
            );
        }
        let err = settings_from(
            None,
            &SettingsFlags::default(),
            env(&[("SLUICE_MAX_HITS_ADDEND", "18446744073709551615")]),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid SLUICE_MAX_HITS_ADDEND=\"18446744073709551615\": above"),
            "{err}"
        );
        let flags = SettingsFlags {
            max_hits_addend: Some(MAX_HITS),
            ..SettingsFlags::default()
        };
        let s = settings_from(None, &flags, env(&[])).unwrap();
        assert_eq!(bounds(&s).max_hits_addend, MAX_HITS);
    }

    #[test]
    fn connection_settings_reach_the_listeners() {
        let s = settings_from(
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
        let options = serve_options(&s);
        assert_eq!(options.grpc_connections.max_connections, 7);
        assert_eq!(options.grpc_connections.max_age, None, "0 turns it off");
        assert_eq!(options.grpc.max_request_bytes, 1024);
        assert_eq!(
            options.http_connections.idle_timeout,
            Duration::from_secs(2)
        );
        assert_eq!(
            serve_options(&Settings::default()).grpc_connections.max_age,
            Some(Duration::from_secs(1_800))
        );
    }

    #[test]
    fn redis_tls_files_and_the_per_second_redis_reach_the_store() {
        let vars = [
            ("SLUICE_REDIS_URL", "rediss://r:6380"),
            ("SLUICE_REDIS_PASSWORD", "pw"),
            ("SLUICE_REDIS_PER_SECOND_URL", "rediss://ps:6380"),
            ("SLUICE_REDIS_TLS_CA_CERT", "/ca.pem"),
            ("SLUICE_REDIS_TLS_CERT", "/c.pem"),
            ("SLUICE_REDIS_TLS_KEY", "/k.pem"),
            ("SLUICE_REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ];
        let s = settings_from(None, &SettingsFlags::default(), env(&vars)).unwrap();
        let redis = redis(&s).expect("a Redis store");
        assert_eq!(
            redis.tls,
            crate::store::RedisTls {
                ca: Some("/ca.pem".into()),
                client: Some(("/c.pem".into(), "/k.pem".into())),
                skip_hostname_verification: true,
            }
        );
        // The password reaches both Redis servers.
        let per_second = redis.per_second_url.expect("a per-second Redis");
        assert_eq!(per_second.expose(), "rediss://:pw@ps:6380");
        assert_eq!(redis.url.expose(), "rediss://:pw@r:6380");
    }

    #[test]
    fn upstream_variables_are_a_layer_under_sluices_own() {
        let flags = SettingsFlags {
            settings_from: Some(crate::settings::upstream::SettingsFrom::EnvoyRatelimit),
            max_entries: Some(7),
            ..Default::default()
        };
        let s = settings_from(
            None,
            &flags,
            env(&[
                ("PORT", "9000"),
                ("GRPC_PORT", "9001"),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "redis:6379"),
                ("REDIS_AUTH", "007"),
                ("REDIS_TIMEOUT", "1m30s"),
                ("USE_STATSD", "false"),
                ("LOG_LEVEL", "INFO"),
                ("SHADOW_MODE", "true"),
                ("SLUICE_GRPC_ADDR", "127.0.0.1:2000"),
            ]),
        )
        .unwrap();
        assert_eq!(s.http_addr, SocketAddr::from(([0, 0, 0, 0], 9000)));
        assert_eq!(s.grpc_addr, SocketAddr::from(([127, 0, 0, 1], 2000)));
        assert_eq!(s.debug_addr, Some(SocketAddr::from(([0, 0, 0, 0], 6070))));
        assert_eq!(s.counting, Counting::Always);
        assert_eq!(s.redis_timeout_ms.get(), 90_000);
        assert_eq!(s.redis_pool_size.get(), 1);
        assert_eq!(s.log_level, "info");
        assert!(s.shadow_mode);
        assert_eq!(s.statsd_addr, None);
        assert_eq!(s.max_entries, 7);
        assert_eq!(
            s.rules.as_deref(),
            Some(Path::new("/srv/runtime_data/current/config"))
        );
        assert_eq!(redis(&s).unwrap().url.expose(), "redis://:007@redis:6379");
        // SLUICE_COUNTING still wins.
        let s = settings_from(None, &flags, env(&[("SLUICE_COUNTING", "admitted")])).unwrap();
        assert_eq!(s.counting, Counting::Admitted);
        // A bad upstream value fails loading, naming the variable.
        let err = settings_from(None, &flags, env(&[("PORT", "abc")])).unwrap_err();
        assert!(err.to_string().contains("PORT=\"abc\""), "{err}");
        // Without the mode, upstream's variables mean nothing.
        let s = settings_from(None, &SettingsFlags::default(), env(&[("PORT", "abc")])).unwrap();
        assert_eq!(s, Settings::default());
    }
}
