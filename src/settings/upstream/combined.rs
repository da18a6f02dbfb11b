//! The settings that upstream's variables give a value only together: a
//! host and a port, a switch and what it switches on, the parts of a Redis
//! URL. One row per setting: the variables, in the order the docs list
//! them, the setting (a [`Key`]), and the function that reads them. A test
//! holds each function to its row (it reads no other variable).

use super::UpstreamError;
use super::read::Reader;
use crate::settings::Key;

/// Upstream variables that together give one setting its value.
#[derive(Clone, Copy, Debug)]
pub struct Combined {
    /// Upstream's variables the value is made of.
    pub vars: &'static [&'static str],
    /// The setting.
    pub feeds: Key,
    /// The value, or none (the setting keeps its value from elsewhere).
    pub read: fn(&Reader<'_>) -> Result<Option<String>, UpstreamError>,
}

const fn combined(
    vars: &'static [&'static str],
    feeds: Key,
    read: fn(&Reader<'_>) -> Result<Option<String>, UpstreamError>,
) -> Combined {
    Combined { vars, feeds, read }
}

/// Every setting upstream's variables feed together, and `counting`, which
/// no variable sets: upstream counts every hit, admitted or not.
pub const COMBINED: &[Combined] = &[
    combined(&["HOST", "PORT"], Key::http_addr, |r| {
        r.addr("HOST", "PORT", 8080).map(Some)
    }),
    combined(&["GRPC_HOST", "GRPC_PORT"], Key::grpc_addr, |r| {
        r.addr("GRPC_HOST", "GRPC_PORT", 8081).map(Some)
    }),
    combined(&["DEBUG_HOST", "DEBUG_PORT"], Key::debug_addr, |r| {
        r.addr("DEBUG_HOST", "DEBUG_PORT", 6070).map(Some)
    }),
    combined(&[], Key::counting, |_| Ok(Some("always".into()))),
    combined(
        &[
            "CONFIG_TYPE",
            "RUNTIME_ROOT",
            "RUNTIME_SUBDIRECTORY",
            "RUNTIME_APPDIRECTORY",
        ],
        Key::rules,
        rules,
    ),
    combined(
        &["CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL"],
        Key::xds_server,
        xds_server,
    ),
    combined(
        &[
            "REDIS_URL",
            "REDIS_SOCKET_TYPE",
            "REDIS_TYPE",
            "REDIS_TLS",
            "REDIS_AUTH",
        ],
        Key::redis_url,
        |r| r.redis_url("REDIS", redis_auth(r).0),
    ),
    combined(&["REDIS_AUTH"], Key::redis_password, |r| {
        Ok(redis_auth(r).1.map(str::to_owned))
    }),
    combined(
        &[
            "REDIS_PERSECOND",
            "REDIS_PERSECOND_URL",
            "REDIS_PERSECOND_SOCKET_TYPE",
            "REDIS_PERSECOND_TYPE",
            "REDIS_TLS",
            "REDIS_AUTH",
        ],
        Key::redis_per_second_url,
        |r| match r.bool("REDIS_PERSECOND", false)? {
            true => r.redis_url("REDIS_PERSECOND", redis_auth(r).0),
            false => Ok(None),
        },
    ),
    combined(
        &["USE_STATSD", "STATSD_HOST", "STATSD_PORT"],
        Key::statsd_addr,
        statsd_addr,
    ),
    // gostats reads it itself: TCP unless told udp.
    combined(&["USE_STATSD", "STATSD_PROTOCOL"], Key::statsd_udp, |r| {
        if !r.bool("USE_STATSD", true)? {
            return Ok(None);
        }
        match r
            .string("STATSD_PROTOCOL", "tcp")
            .to_ascii_lowercase()
            .as_str()
        {
            "tcp" => Ok(Some("false".into())),
            "udp" => Ok(Some("true".into())),
            _ => Err(r.err("STATSD_PROTOCOL", "expected tcp or udp")),
        }
    }),
    combined(
        &["USE_PROMETHEUS", "USE_STATSD", "PROMETHEUS_ADDR"],
        Key::upstream_prometheus_addr,
        prometheus_addr,
    ),
    combined(
        &["USE_PROMETHEUS", "PROMETHEUS_PATH"],
        Key::upstream_prometheus_path,
        |r| prometheus(r, |r| Some(r.string("PROMETHEUS_PATH", "/metrics").into())),
    ),
    combined(
        &["USE_PROMETHEUS", "PROMETHEUS_MAPPER_YAML"],
        Key::prometheus_mapper,
        |r| prometheus(r, |r| r.raw("PROMETHEUS_MAPPER_YAML").map(str::to_owned)),
    ),
    combined(
        &["TRACING_ENABLED", "TRACING_EXPORTER_PROTOCOL"],
        Key::otlp_protocol,
        |r| Ok(tracing_over_grpc(r)?.map(|grpc| if grpc { "grpc" } else { "http" }.into())),
    ),
    // Its range (0 to 1) is checked with the setting's.
    combined(
        &["TRACING_ENABLED", "TRACING_SAMPLING_RATE"],
        Key::trace_sampling_ratio,
        |r| match r.bool("TRACING_ENABLED", false)? {
            true => Ok(r.f64("TRACING_SAMPLING_RATE")?.map(|f| f.to_string())),
            false => Ok(None),
        },
    ),
    combined(
        &[
            "TRACING_ENABLED",
            "TRACING_EXPORTER_PROTOCOL",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ],
        Key::otlp_endpoint,
        otlp_endpoint,
    ),
    combined(
        &["GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT"],
        Key::grpc_tls_cert,
        |r| grpc_tls_file(r, "GRPC_SERVER_TLS_CERT"),
    ),
    combined(
        &["GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_KEY"],
        Key::grpc_tls_key,
        |r| grpc_tls_file(r, "GRPC_SERVER_TLS_KEY"),
    ),
    // GRPC_SERVER_TLS_CA_CERT is no upstream variable, but Envoy Gateway
    // sets it (meaning mutual TLS); upstream's own is GRPC_CLIENT_TLS_CACERT.
    combined(
        &[
            "GRPC_SERVER_USE_TLS",
            "GRPC_SERVER_TLS_CA_CERT",
            "GRPC_CLIENT_TLS_CACERT",
        ],
        Key::grpc_tls_ca_cert,
        |r| match r.bool("GRPC_SERVER_USE_TLS", false)? {
            true => Ok(r
                .raw("GRPC_SERVER_TLS_CA_CERT")
                .or_else(|| r.raw("GRPC_CLIENT_TLS_CACERT"))
                .map(str::to_owned)),
            false => Ok(None),
        },
    ),
];

/// The rules directory, when rules come from files (upstream's runtime
/// directory: root, subdirectory, application directory).
fn rules(r: &Reader<'_>) -> Result<Option<String>, UpstreamError> {
    if !config_type_is_file(r)? {
        return Ok(None);
    }
    let mut path = std::path::PathBuf::from(r.string("RUNTIME_ROOT", "/srv/runtime_data/current"));
    path.push(r.string("RUNTIME_SUBDIRECTORY", ""));
    path.push(r.string("RUNTIME_APPDIRECTORY", "config"));
    Ok(Some(path.display().to_string()))
}

/// The xDS server, when rules come from one.
fn xds_server(r: &Reader<'_>) -> Result<Option<String>, UpstreamError> {
    if config_type_is_file(r)? {
        return Ok(None);
    }
    let server = r.raw("CONFIG_GRPC_XDS_SERVER_URL").ok_or_else(|| {
        r.err(
            "CONFIG_GRPC_XDS_SERVER_URL",
            "CONFIG_TYPE=GRPC_XDS_SOTW needs the xDS server's address",
        )
    })?;
    Ok(Some(server.into()))
}

/// Whether rules come from files (`CONFIG_TYPE=FILE`) or xDS.
fn config_type_is_file(r: &Reader<'_>) -> Result<bool, UpstreamError> {
    match r
        .string("CONFIG_TYPE", "FILE")
        .to_ascii_uppercase()
        .as_str()
    {
        "FILE" => Ok(true),
        "GRPC_XDS_SOTW" => Ok(false),
        _ => Err(r.err("CONFIG_TYPE", "expected FILE or GRPC_XDS_SOTW")),
    }
}

/// `REDIS_AUTH` as its user (if it names one) and password.
fn redis_auth<'r>(r: &'r Reader<'_>) -> (Option<&'r str>, Option<&'r str>) {
    match r.raw("REDIS_AUTH") {
        None => (None, None),
        Some(auth) => match auth.split_once(':') {
            Some((user, pass)) => (Some(user), Some(pass)),
            None => (None, Some(auth)),
        },
    }
}

fn statsd_addr(r: &Reader<'_>) -> Result<Option<String>, UpstreamError> {
    if !r.bool("USE_STATSD", true)? {
        return Ok(None);
    }
    let host = r.string("STATSD_HOST", "localhost");
    let port = r.port("STATSD_PORT", 8125)?;
    Ok(Some(format!("{host}:{port}")))
}

fn prometheus_addr(r: &Reader<'_>) -> Result<Option<String>, UpstreamError> {
    if !r.bool("USE_PROMETHEUS", false)? {
        return Ok(None);
    }
    if r.bool("USE_STATSD", true)? {
        return Err(r.err(
            "USE_PROMETHEUS",
            "only one stats sink at a time, and USE_STATSD is true (its default); set USE_STATSD=false",
        ));
    }
    let addr = r.string("PROMETHEUS_ADDR", ":9090");
    let addr = match addr.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => addr.to_string(),
    };
    if addr.parse::<std::net::SocketAddr>().is_err() {
        return Err(r.err("PROMETHEUS_ADDR", "expected [ip]:port"));
    }
    Ok(Some(addr))
}

/// `value`, when upstream's Prometheus sink is on.
fn prometheus(
    r: &Reader<'_>,
    value: impl FnOnce(&Reader<'_>) -> Option<String>,
) -> Result<Option<String>, UpstreamError> {
    Ok(r.bool("USE_PROMETHEUS", false)?.then(|| value(r)).flatten())
}

/// With tracing on, whether it is exported over gRPC: upstream exports
/// over OTLP/HTTP unless told grpc (Envoy Gateway never says, and points
/// at a collector's 4318).
fn tracing_over_grpc(r: &Reader<'_>) -> Result<Option<bool>, UpstreamError> {
    if !r.bool("TRACING_ENABLED", false)? {
        return Ok(None);
    }
    match r
        .string("TRACING_EXPORTER_PROTOCOL", "http")
        .to_ascii_lowercase()
        .as_str()
    {
        "http" => Ok(Some(false)),
        "grpc" => Ok(Some(true)),
        _ => Err(r.err("TRACING_EXPORTER_PROTOCOL", "expected http or grpc")),
    }
}

fn otlp_endpoint(r: &Reader<'_>) -> Result<Option<String>, UpstreamError> {
    let Some(grpc) = tracing_over_grpc(r)? else {
        return Ok(None);
    };
    let default = if grpc {
        "http://localhost:4317"
    } else {
        "http://localhost:4318"
    };
    let endpoint = r.string("OTEL_EXPORTER_OTLP_ENDPOINT", default);
    Ok(Some(if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }))
}

/// The certificate or key file, required when TLS is on.
fn grpc_tls_file(r: &Reader<'_>, var: &str) -> Result<Option<String>, UpstreamError> {
    if !r.bool("GRPC_SERVER_USE_TLS", false)? {
        return Ok(None);
    }
    let path = r
        .raw(var)
        .ok_or_else(|| r.err(var, "GRPC_SERVER_USE_TLS=true needs it"))?;
    Ok(Some(path.into()))
}
