//! The envoyproxy/ratelimit variables Sluice does not honour, each with what
//! Sluice does instead: the one table from which both the start-up warning
//! (as `ratelimit`, one line per variable that is set) and the settings
//! reference's table are made, so neither can forget one.
//!
//! Every variable upstream reads is either read by [`super::upstream`] or
//! listed here, never both; a test holds the two to upstream's full list.

use config::Map;

/// One upstream variable Sluice does not honour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// Upstream's variable.
    pub name: &'static str,
    /// What Sluice does instead.
    pub instead: &'static str,
    /// Values (any case) under which upstream behaves as Sluice always
    /// does, so there is nothing to warn about.
    pub same_as: &'static [&'static str],
}

/// Go's `strconv.ParseBool` spellings of true.
const TRUE: &[&str] = &["true", "t", "1"];
/// ... and of false.
const FALSE: &[&str] = &["false", "f", "0"];

const fn entry(name: &'static str, instead: &'static str) -> Unsupported {
    Unsupported {
        name,
        instead,
        same_as: &[],
    }
}

const fn same_when(
    name: &'static str,
    same_as: &'static [&'static str],
    instead: &'static str,
) -> Unsupported {
    Unsupported {
        name,
        instead,
        same_as,
    }
}

const MEMCACHE: &str = "no memcached backend; counters go to Redis (redis_url) or memory";
const PIPELINE: &str = "each decision is one script call, pipelined with others on each \
                        connection; there is no client-side window or limit to set";
const STARTUP: &str = "Sluice starts without waiting for Redis and connects in the background; \
                       /readyz and /healthcheck fail until Redis answers";
const PER_SECOND: &str = "the per-second Redis (REDIS_PERSECOND_URL) uses the main Redis's \
                          settings (REDIS_AUTH, REDIS_TLS, REDIS_POOL_SIZE, REDIS_TIMEOUT)";

/// Every upstream variable Sluice does not honour, by upstream's name.
pub const UNSUPPORTED: &[Unsupported] = &[
    entry(
        "GRPC_UDS",
        "gRPC is served on TCP only (grpc_addr); there is no Unix-socket listener",
    ),
    entry(
        "GRPC_CLIENT_TLS_SAN",
        "client certificates are checked against the CA (GRPC_CLIENT_TLS_CACERT) only, whatever names they carry",
    ),
    entry(
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "the xDS stream carries no extra headers",
    ),
    entry(
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "reconnects to the xDS server back off as XDS_CLIENT_BACKOFF_* say",
    ),
    entry(
        "DESCRIPTOR_KEY_CONFIG",
        "the stats key of a limit override carries every entry's value, as upstream's does without the file",
    ),
    same_when(
        "RUNTIME_WATCH_ROOT",
        TRUE,
        "the rules directory is always watched, a swap of its symlinks included",
    ),
    same_when(
        "RUNTIME_IGNOREDOTFILES",
        TRUE,
        "files whose names start with '.' are always skipped",
    ),
    entry(
        "MERGE_DOMAIN_CONFIG",
        "two files with the same domain are an error",
    ),
    same_when(
        "BACKEND_TYPE",
        &["redis"],
        "counters go to Redis when REDIS_URL is set, to memory otherwise",
    ),
    entry("MEMCACHE_HOST_PORT", MEMCACHE),
    entry("MEMCACHE_SRV", MEMCACHE),
    entry("MEMCACHE_SRV_REFRESH", MEMCACHE),
    entry("MEMCACHE_MAX_IDLE_CONNS", MEMCACHE),
    entry("MEMCACHE_TLS", MEMCACHE),
    entry("MEMCACHE_TLS_CACERT", MEMCACHE),
    entry("MEMCACHE_TLS_CLIENT_CERT", MEMCACHE),
    entry("MEMCACHE_TLS_CLIENT_KEY", MEMCACHE),
    entry("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", MEMCACHE),
    entry(
        "EXPIRATION_JITTER_MAX_SECONDS",
        "counters expire at most half a window after their window ends; their TTLs move about once per half window, not on every hit",
    ),
    same_when(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        FALSE,
        "set SLUICE_COUNTING=admitted to count only admitted hits (atomically)",
    ),
    entry("REDIS_PIPELINE_WINDOW", PIPELINE),
    entry("REDIS_PIPELINE_LIMIT", PIPELINE),
    entry(
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "the calls of one decision to different Redis Cluster slots always run in parallel",
    ),
    entry(
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "each connection carries many calls at once, so a call never waits for a free one",
    ),
    entry("REDIS_STARTUP_INITIAL_INTERVAL", STARTUP),
    entry("REDIS_STARTUP_MAX_INTERVAL", STARTUP),
    entry("REDIS_STARTUP_MAX_ELAPSED_TIME", STARTUP),
    same_when(
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        TRUE,
        "always on: /readyz and /healthcheck fail while no Redis connection is up",
    ),
    entry(
        "REDIS_SENTINEL_AUTH",
        "the sentinels are reached with REDIS_AUTH's credentials",
    ),
    entry("REDIS_PERSECOND_AUTH", PER_SECOND),
    entry("REDIS_PERSECOND_TLS", PER_SECOND),
    entry("REDIS_PERSECOND_SENTINEL_AUTH", PER_SECOND),
    entry("REDIS_PERSECOND_POOL_SIZE", PER_SECOND),
    entry("REDIS_PERSECOND_TIMEOUT", PER_SECOND),
    entry("REDIS_PERSECOND_PIPELINE_WINDOW", PER_SECOND),
    entry("REDIS_PERSECOND_PIPELINE_LIMIT", PER_SECOND),
    entry("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", PER_SECOND),
    entry("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", PER_SECOND),
    entry(
        "LIMIT_LIMIT_HEADER",
        "the header names are fixed (x-ratelimit-limit, or RateLimit-Policy with response_headers ietf)",
    ),
    entry(
        "LIMIT_REMAINING_HEADER",
        "the header names are fixed (x-ratelimit-remaining)",
    ),
    entry(
        "LIMIT_RESET_HEADER",
        "the header names are fixed (x-ratelimit-reset)",
    ),
    entry(
        "USE_DOG_STATSD",
        "no DogStatsD sink; stats go to statsd or Prometheus",
    ),
    entry(
        "USE_DOG_STATSD_MOGRIFIERS",
        "no DogStatsD sink, so no mogrifiers",
    ),
    entry("EXTRA_TAGS", "stats carry no extra tags"),
    same_when(
        "DISABLE_STATS",
        FALSE,
        "stats cannot be turned off; set USE_STATSD=false for no statsd, and Sluice's own metrics are always on /metrics",
    ),
    entry(
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "the upstream-named response time is in seconds (ratelimit_service_response_time_seconds)",
    ),
    entry(
        "TRACING_SERVICE_NAMESPACE",
        "traces carry service.name only",
    ),
    entry(
        "TRACING_SERVICE_INSTANCE_ID",
        "traces carry service.name only",
    ),
];

/// The start-up warning for every upstream variable set in `env` (not
/// empty, and not to a value under which upstream behaves as Sluice does)
/// that Sluice does not honour, one line each, in the table's order:
/// `NAME is not supported: what Sluice does instead`. Variables upstream
/// never reads (Kubernetes' service links, anything else) are not named.
pub fn warnings(env: &Map<String, String>) -> Vec<String> {
    UNSUPPORTED
        .iter()
        .filter(|u| {
            env.get(u.name).map(|v| v.trim()).is_some_and(|v| {
                !v.is_empty() && !u.same_as.iter().any(|same| same.eq_ignore_ascii_case(v))
            })
        })
        .map(|u| format!("{} is not supported: {}", u.name, u.instead))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Map<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn each_variable_set_is_named_once_and_others_not() {
        let e = env(&[
            ("EXPIRATION_JITTER_MAX_SECONDS", "300"),
            ("BACKEND_TYPE", "redis"),
            ("REDIS_PIPELINE_WINDOW", "150us"),
            ("GRPC_UDS", "/tmp/rl.sock"),
            ("RUNTIME_WATCH_ROOT", "TRUE"),
            ("REDIS_STARTUP_MAX_INTERVAL", ""),
            ("RATELIMIT_PORT", "tcp://10.0.0.1:8081"),
            ("RATELIMIT_SERVICE_HOST", "10.0.0.1"),
            ("KUBERNETES_SERVICE_HOST", "10.0.0.2"),
            ("PATH", "/bin"),
            ("PORT", "8080"),
        ]);
        let lines = warnings(&e);
        assert_eq!(
            lines
                .iter()
                .map(|l| l.split(' ').next().unwrap())
                .collect::<Vec<_>>(),
            [
                "GRPC_UDS",
                "EXPIRATION_JITTER_MAX_SECONDS",
                "REDIS_PIPELINE_WINDOW"
            ],
            "{lines:?}"
        );
        assert!(lines[0].starts_with("GRPC_UDS is not supported: gRPC is served on TCP only"));
        assert_eq!(warnings(&env(&[("BACKEND_TYPE", "memcache")])).len(), 1);
        assert_eq!(warnings(&env(&[("RUNTIME_WATCH_ROOT", "false")])).len(), 1);
    }

    #[test]
    fn every_listed_variable_is_named_when_set() {
        for u in UNSUPPORTED {
            let lines = warnings(&env(&[(u.name, "set-by-a-test")]));
            assert_eq!(
                lines,
                [format!("{} is not supported: {}", u.name, u.instead)]
            );
        }
    }

    #[test]
    fn each_variable_is_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for u in UNSUPPORTED {
            assert!(seen.insert(u.name), "{} listed twice", u.name);
        }
    }
}
