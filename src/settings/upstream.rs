//! envoyproxy/ratelimit's environment variables, with upstream's meanings
//! and defaults, as one more layer of the declared settings.
//!
//! Used when the binary runs as `ratelimit` or with `sluice serve
//! --settings-from envoy-ratelimit`. [`layer`] turns upstream's variables
//! into values of the settings declared in `settings!` (as strings, which
//! the same serde path then parses); nothing here is a second settings
//! struct. Upstream variables Sluice does not honour are listed in
//! [`super::unsupported`], which makes the warning logged once at start.

use config::{Map, Value, ValueKind};

/// Where `sluice serve` takes its settings from besides its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SettingsFrom {
    /// Only Sluice's own (`SLUICE_…`, the settings file, flags).
    Sluice,
    /// Also envoyproxy/ratelimit's environment variables, with its defaults.
    EnvoyRatelimit,
}

/// A bad value of an upstream variable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid {var}={value:?}: {why}")]
pub struct UpstreamError {
    /// The variable.
    pub var: String,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub why: String,
}

/// A `config` source holding the values upstream's variables give the
/// declared settings.
#[derive(Clone, Debug)]
pub struct Layer(Map<String, String>);

impl config::Source for Layer {
    fn clone_into_box(&self) -> Box<dyn config::Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<Map<String, Value>, config::ConfigError> {
        Ok(self
            .0
            .iter()
            .map(|(k, v)| {
                let origin = format!("envoyproxy/ratelimit variables ({k})");
                (
                    k.clone(),
                    Value::new(Some(&origin), ValueKind::String(v.clone())),
                )
            })
            .collect())
    }
}

impl Layer {
    /// The value given to `setting`, if any (tests).
    pub fn get(&self, setting: &str) -> Option<&str> {
        self.0.get(setting).map(String::as_str)
    }
}

/// Parses a Go duration (`10s`, `1m30s`, `24h`, `250ms`, `0`) into
/// milliseconds.
pub fn go_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(0);
    }
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or("a number needs a unit (ns, us, ms, s, m, h)")?;
        if number_len == 0 {
            return Err("expected a number".into());
        }
        let number: f64 = rest[..number_len]
            .parse()
            .map_err(|_| format!("bad number '{}'", &rest[..number_len]))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let millis = match &rest[..unit_len] {
            "ns" => 1e-6,
            "us" | "µs" => 1e-3,
            "ms" => 1.0,
            "s" => 1e3,
            "m" => 60e3,
            "h" => 3_600e3,
            unit => return Err(format!("unknown unit '{unit}' (ns, us, ms, s, m, h)")),
        };
        total += number * millis;
        rest = &rest[unit_len..];
    }
    if total > u64::MAX as f64 {
        return Err("too long".into());
    }
    Ok(total.round() as u64)
}

/// Bytes of local cache per entry, to turn `LOCAL_CACHE_SIZE_IN_BYTES` (a
/// freecache size upstream) into Sluice's entry count: an entry is a
/// counter key of some tens of bytes plus its expiry.
pub const LOCAL_CACHE_BYTES_PER_ENTRY: u64 = 128;

struct Reader<'a> {
    env: &'a Map<String, String>,
    /// Every variable looked at, set or not: what `layer` honours (tests
    /// hold it against upstream's full list and the unsupported table).
    #[cfg(test)]
    read: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

impl Reader<'_> {
    fn raw(&self, var: &str) -> Option<&str> {
        #[cfg(test)]
        self.read.borrow_mut().insert(var.to_owned());
        self.env
            .get(var)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    fn err(&self, var: &str, why: impl Into<String>) -> UpstreamError {
        UpstreamError {
            var: var.into(),
            value: self.env.get(var).cloned().unwrap_or_default(),
            why: why.into(),
        }
    }

    fn string<'s>(&'s self, var: &str, default: &'s str) -> &'s str {
        self.raw(var).unwrap_or(default)
    }

    /// Go's strconv.ParseBool.
    fn bool(&self, var: &str, default: bool) -> Result<bool, UpstreamError> {
        match self.raw(var) {
            None => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(_) => Err(self.err(var, "expected true or false")),
        }
    }

    fn port(&self, var: &str, default: u16) -> Result<u16, UpstreamError> {
        match self.raw(var) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| self.err(var, "expected a port number (0 to 65535)")),
        }
    }

    fn u64(&self, var: &str) -> Result<Option<u64>, UpstreamError> {
        self.raw(var)
            .map(|v| {
                v.parse()
                    .map_err(|_| self.err(var, "expected a whole number"))
            })
            .transpose()
    }

    fn f64(&self, var: &str) -> Result<Option<f64>, UpstreamError> {
        self.raw(var)
            .map(|v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .ok_or_else(|| self.err(var, "expected a number"))
            })
            .transpose()
    }

    fn duration_ms(&self, var: &str, default: u64) -> Result<u64, UpstreamError> {
        match self.raw(var) {
            None => Ok(default),
            Some(v) => go_duration_ms(v).map_err(|why| self.err(var, why)),
        }
    }

    /// `HOST` and `PORT` as a socket address; an empty host is every
    /// interface, as in Go.
    fn addr(
        &self,
        host_var: &str,
        port_var: &str,
        default_port: u16,
    ) -> Result<String, UpstreamError> {
        let host = self.string(host_var, "0.0.0.0");
        let port = self.port(port_var, default_port)?;
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let addr = format!("{host}:{port}");
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(self.err(host_var, "expected an IP address to listen on"));
        }
        Ok(addr)
    }

    /// A Redis URL in Sluice's form from upstream's `<prefix>_SOCKET_TYPE`,
    /// `<prefix>_TYPE`, `<prefix>_URL` (and `REDIS_TLS`, `REDIS_AUTH`'s user).
    fn redis_url(&self, prefix: &str, user: Option<&str>) -> Result<Option<String>, UpstreamError> {
        let url_var = format!("{prefix}_URL");
        let Some(url) = self.raw(&url_var) else {
            return Ok(None);
        };
        let socket_var = format!("{prefix}_SOCKET_TYPE");
        let type_var = format!("{prefix}_TYPE");
        let auth = user.map(|u| format!("{u}:@")).unwrap_or_default();
        // Upstream's default socket type is unix, with a path for a URL; a
        // host:port URL only works over TCP, so an unset socket type goes
        // by the URL's form.
        let unix = match self
            .raw(&socket_var)
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None => url.starts_with('/'),
            Some("tcp") => false,
            Some("unix") => true,
            Some(_) => return Err(self.err(&socket_var, "expected tcp or unix")),
        };
        if unix {
            if !url.starts_with('/') {
                return Err(self.err(&url_var, "a unix socket is reached by its absolute path"));
            }
            if !self
                .string(&type_var, "single")
                .eq_ignore_ascii_case("single")
            {
                return Err(self.err(&type_var, "a unix socket serves a single Redis"));
            }
            return Ok(Some(format!("redis+unix://{auth}{url}")));
        }
        if url.starts_with('/') {
            return Err(self.err(&socket_var, "a socket path needs the unix socket type"));
        }
        let tls = self.bool("REDIS_TLS", false)?;
        let s = if tls { "s" } else { "" };
        let hosts: Vec<&str> = url.split(',').map(str::trim).collect();
        let check_hosts = |hosts: &[&str]| {
            for h in hosts {
                let ok = h
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
                if !ok {
                    return Err(self.err(&url_var, format!("'{h}' is not host:port")));
                }
            }
            Ok(())
        };
        let out = match self
            .string(&type_var, "single")
            .to_ascii_lowercase()
            .as_str()
        {
            "single" => {
                if hosts.len() != 1 {
                    return Err(self.err(&url_var, "REDIS_TYPE=single takes one host:port"));
                }
                check_hosts(&hosts)?;
                format!("redis{s}://{auth}{}", hosts[0])
            }
            "cluster" => {
                check_hosts(&hosts)?;
                format!("redis{s}-cluster://{auth}{}", hosts.join(","))
            }
            "sentinel" => {
                // Upstream: the master's name, then the sentinels.
                let [master, sentinels @ ..] = hosts.as_slice() else {
                    unreachable!("split yields at least one item")
                };
                if sentinels.is_empty() {
                    return Err(self.err(
                        &url_var,
                        "REDIS_TYPE=sentinel takes the master's name then sentinels: name,host:port[,…]",
                    ));
                }
                check_hosts(sentinels)?;
                format!("redis{s}-sentinel://{auth}{}/{master}", sentinels.join(","))
            }
            _ => return Err(self.err(&type_var, "expected single, cluster or sentinel")),
        };
        Ok(Some(out))
    }
}

/// The values upstream's variables in `env` give the declared settings,
/// with upstream's defaults for those it does not set.
pub fn layer(env: &Map<String, String>) -> Result<Layer, UpstreamError> {
    layer_from(&Reader {
        env,
        #[cfg(test)]
        read: Default::default(),
    })
}

fn layer_from(r: &Reader<'_>) -> Result<Layer, UpstreamError> {
    let mut out: Map<String, String> = Map::new();
    let mut set = |k: &str, v: String| {
        out.insert(k.to_string(), v);
    };

    set("http_addr", r.addr("HOST", "PORT", 8080)?);
    set("grpc_addr", r.addr("GRPC_HOST", "GRPC_PORT", 8081)?);
    set("debug_addr", r.addr("DEBUG_HOST", "DEBUG_PORT", 6070)?);
    // Upstream counts every hit, admitted or not.
    set("counting", "always".into());

    // Rules.
    match r
        .string("CONFIG_TYPE", "FILE")
        .to_ascii_uppercase()
        .as_str()
    {
        "FILE" => {
            let root = r.string("RUNTIME_ROOT", "/srv/runtime_data/current");
            let mut path = std::path::PathBuf::from(root);
            path.push(r.string("RUNTIME_SUBDIRECTORY", ""));
            path.push(r.string("RUNTIME_APPDIRECTORY", "config"));
            set("rules", path.display().to_string());
        }
        "GRPC_XDS_SOTW" => {
            let server = r.raw("CONFIG_GRPC_XDS_SERVER_URL").ok_or_else(|| {
                r.err(
                    "CONFIG_GRPC_XDS_SERVER_URL",
                    "CONFIG_TYPE=GRPC_XDS_SOTW needs the xDS server's address",
                )
            })?;
            set("xds_server", server.into());
        }
        _ => return Err(r.err("CONFIG_TYPE", "expected FILE or GRPC_XDS_SOTW")),
    }
    if let Some(id) = r.raw("CONFIG_GRPC_XDS_NODE_ID") {
        set("xds_node_id", id.into());
    }
    if let Some(meta) = r.raw("CONFIG_GRPC_XDS_NODE_METADATA") {
        // Upstream's form is key:value,key:value; the setting is JSON.
        let mut object = serde_json::Map::new();
        for pair in meta.split(',') {
            let (k, v) = pair.split_once(':').ok_or_else(|| {
                r.err(
                    "CONFIG_GRPC_XDS_NODE_METADATA",
                    "expected key:value[,key:value…]",
                )
            })?;
            object.insert(k.trim().into(), serde_json::Value::String(v.trim().into()));
        }
        set(
            "xds_node_metadata",
            serde_json::Value::Object(object).to_string(),
        );
    }
    set(
        "xds_tls",
        r.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)?.to_string(),
    );
    for (var, setting) in [
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "xds_tls_cert"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "xds_tls_key"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "xds_tls_ca_cert"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds_tls_san"),
    ] {
        if let Some(v) = r.raw(var) {
            set(setting, v.into());
        }
    }
    set(
        "xds_backoff_initial_ms",
        r.duration_ms("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", 10_000)?
            .to_string(),
    );
    set(
        "xds_backoff_max_ms",
        r.duration_ms("XDS_CLIENT_BACKOFF_MAX_INTERVAL", 60_000)?
            .to_string(),
    );
    if let Some(f) = r.f64("XDS_CLIENT_BACKOFF_RANDOM_FACTOR")? {
        set("xds_backoff_random_factor", f.to_string());
    }
    set(
        "xds_backoff_jitter",
        r.bool("XDS_CLIENT_BACKOFF_JITTER", true)?.to_string(),
    );
    if let Some(n) = r.u64("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")? {
        set("xds_max_message_bytes", n.to_string());
    }
    set(
        "force_start_without_initial_config",
        r.bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?
            .to_string(),
    );
    set(
        "healthy_with_config_loaded",
        r.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?
            .to_string(),
    );

    // Redis.
    let (user, password) = match r.raw("REDIS_AUTH") {
        None => (None, None),
        Some(auth) => match auth.split_once(':') {
            Some((user, pass)) => (Some(user), Some(pass)),
            None => (None, Some(auth)),
        },
    };
    if let Some(url) = r.redis_url("REDIS", user)? {
        set("redis_url", url);
    }
    if let Some(password) = password {
        set("redis_password", password.into());
    }
    if r.bool("REDIS_PERSECOND", false)?
        && let Some(url) = r.redis_url("REDIS_PERSECOND", user)?
    {
        set("redis_per_second_url", url);
    }
    for (var, setting) in [
        ("REDIS_TLS_CLIENT_CERT", "redis_tls_cert"),
        ("REDIS_TLS_CLIENT_KEY", "redis_tls_key"),
        ("REDIS_TLS_CACERT", "redis_tls_ca_cert"),
    ] {
        if let Some(v) = r.raw(var) {
            set(setting, v.into());
        }
    }
    set(
        "redis_tls_skip_hostname_verification",
        r.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)?
            .to_string(),
    );
    // Upstream's 10 is its pool of connections one command at a time
    // each; Sluice's connections each carry many calls at once, and fewer
    // carry them cheaper (BENCHMARKS.md), so only a value set here counts.
    if let Some(size) = r.u64("REDIS_POOL_SIZE")? {
        set("redis_pool_size", size.max(1).to_string());
    }
    set(
        "redis_timeout_ms",
        r.duration_ms("REDIS_TIMEOUT", 10_000)?.to_string(),
    );
    if let Some(prefix) = r.raw("CACHE_KEY_PREFIX") {
        set("redis_key_prefix", prefix.into());
    }

    // Decisions.
    let cache_bytes = r.u64("LOCAL_CACHE_SIZE_IN_BYTES")?.unwrap_or(0);
    let entries = if cache_bytes == 0 {
        0
    } else {
        (cache_bytes / LOCAL_CACHE_BYTES_PER_ENTRY).max(1)
    };
    set("local_cache_size", entries.to_string());
    if let Some(ratio) = r.f64("NEAR_LIMIT_RATIO")? {
        set("near_limit_ratio", ratio.to_string());
    }
    set("shadow_mode", r.bool("SHADOW_MODE", false)?.to_string());
    set("quota_mode", r.bool("QUOTA_MODE", false)?.to_string());
    set(
        "response_dynamic_metadata",
        r.bool("RESPONSE_DYNAMIC_METADATA", false)?.to_string(),
    );
    let headers = r.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false)?;
    set(
        "response_headers",
        if headers { "draft03" } else { "off" }.into(),
    );

    // Logs and telemetry.
    let level = r.string("LOG_LEVEL", "WARN").to_ascii_lowercase();
    let filter = match level.as_str() {
        "trace" | "debug" | "info" | "error" => level.as_str(),
        "warn" | "warning" => "warn",
        "fatal" | "panic" => "error",
        _ => {
            return Err(r.err(
                "LOG_LEVEL",
                "expected TRACE, DEBUG, INFO, WARN, ERROR, FATAL or PANIC",
            ));
        }
    };
    set("log_level", filter.into());
    match r.string("LOG_FORMAT", "text").to_ascii_lowercase().as_str() {
        "text" => set("log_format", "human".into()),
        "json" => set("log_format", "json".into()),
        _ => return Err(r.err("LOG_FORMAT", "expected text or json")),
    }
    let statsd = r.bool("USE_STATSD", true)?;
    let prometheus = r.bool("USE_PROMETHEUS", false)?;
    if statsd && prometheus {
        return Err(r.err(
            "USE_PROMETHEUS",
            "only one stats sink at a time, and USE_STATSD is true (its default); set USE_STATSD=false",
        ));
    }
    if statsd {
        let host = r.string("STATSD_HOST", "localhost");
        let port = r.port("STATSD_PORT", 8125)?;
        set("statsd_addr", format!("{host}:{port}"));
        // gostats reads it itself: TCP unless told udp.
        let udp = match r
            .string("STATSD_PROTOCOL", "tcp")
            .to_ascii_lowercase()
            .as_str()
        {
            "tcp" => false,
            "udp" => true,
            _ => return Err(r.err("STATSD_PROTOCOL", "expected tcp or udp")),
        };
        set("statsd_udp", udp.to_string());
    }
    if prometheus {
        let addr = r.string("PROMETHEUS_ADDR", ":9090");
        let addr = match addr.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => addr.to_string(),
        };
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(r.err("PROMETHEUS_ADDR", "expected [ip]:port"));
        }
        set("upstream_prometheus_addr", addr);
        set(
            "upstream_prometheus_path",
            r.string("PROMETHEUS_PATH", "/metrics").into(),
        );
        if let Some(mapper) = r.raw("PROMETHEUS_MAPPER_YAML") {
            set("prometheus_mapper", mapper.into());
        }
    }
    set(
        "stats_flush_interval_ms",
        r.duration_ms("STATS_FLUSH_INTERVAL", 10_000)?.to_string(),
    );
    if r.bool("TRACING_ENABLED", false)? {
        // Upstream exports over OTLP/HTTP unless told grpc (Envoy Gateway
        // never says, and points at a collector's 4318).
        let grpc = match r
            .string("TRACING_EXPORTER_PROTOCOL", "http")
            .to_ascii_lowercase()
            .as_str()
        {
            "http" => false,
            "grpc" => true,
            _ => return Err(r.err("TRACING_EXPORTER_PROTOCOL", "expected http or grpc")),
        };
        set("otlp_protocol", if grpc { "grpc" } else { "http" }.into());
        // Its range (0 to 1) is checked with the setting's.
        if let Some(rate) = r.f64("TRACING_SAMPLING_RATE")? {
            set("trace_sampling_ratio", rate.to_string());
        }
        let default = if grpc {
            "http://localhost:4317"
        } else {
            "http://localhost:4318"
        };
        let endpoint = r.string("OTEL_EXPORTER_OTLP_ENDPOINT", default);
        let endpoint = if endpoint.contains("://") {
            endpoint.to_string()
        } else {
            format!("http://{endpoint}")
        };
        set("otlp_endpoint", endpoint);
    }
    set(
        "service_name",
        r.string("TRACING_SERVICE_NAME", "RateLimit").into(),
    );

    // gRPC server.
    set(
        "max_connection_age_ms",
        r.duration_ms("GRPC_MAX_CONNECTION_AGE", 24 * 3_600_000)?
            .to_string(),
    );
    set(
        "max_connection_age_grace_ms",
        r.duration_ms("GRPC_MAX_CONNECTION_AGE_GRACE", 3_600_000)?
            .to_string(),
    );
    if r.bool("GRPC_SERVER_USE_TLS", false)? {
        for (var, setting) in [
            ("GRPC_SERVER_TLS_CERT", "grpc_tls_cert"),
            ("GRPC_SERVER_TLS_KEY", "grpc_tls_key"),
        ] {
            let path = r
                .raw(var)
                .ok_or_else(|| r.err(var, "GRPC_SERVER_USE_TLS=true needs it"))?;
            set(setting, path.into());
        }
        if let Some(ca) = r
            .raw("GRPC_SERVER_TLS_CA_CERT")
            .or_else(|| r.raw("GRPC_CLIENT_TLS_CACERT"))
        {
            set("grpc_tls_ca_cert", ca.into());
        }
    }
    Ok(Layer(out))
}

/// Upstream's variables from the process environment (those that are
/// valid UTF-8).
pub fn process_env() -> Map<String, String> {
    std::env::vars().collect()
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

    /// The variables `layer` looks at for `env`.
    fn read_by_layer(pairs: &[(&str, &str)]) -> std::collections::BTreeSet<String> {
        let env = env(pairs);
        let reader = Reader {
            env: &env,
            read: Default::default(),
        };
        layer_from(&reader).expect("a valid environment");
        reader.read.into_inner()
    }

    #[test]
    fn every_upstream_variable_is_read_or_listed_as_unsupported_never_both() {
        use super::super::unsupported::UNSUPPORTED;
        // Environments that take every branch of `layer`: files or xDS,
        // statsd or Prometheus, tracing, TLS, a per-second Redis.
        let mut read = read_by_layer(&[]);
        read.extend(read_by_layer(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "eg:18001"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "a:1"),
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
        ]));
        let listed: Vec<&str> = UNSUPPORTED.iter().map(|u| u.name).collect();
        for var in UPSTREAM_VARIABLES {
            let (is_read, is_listed) = (read.contains(*var), listed.contains(var));
            assert!(
                is_read || is_listed,
                "{var} is neither read by `layer` nor listed in settings/unsupported.rs"
            );
            assert!(
                !(is_read && is_listed),
                "{var} is read by `layer` and also listed as unsupported"
            );
        }
        for var in &listed {
            assert!(
                UPSTREAM_VARIABLES.contains(var),
                "{var} is listed as unsupported but is no upstream variable"
            );
        }
    }
}
