//! The upstream variables that each give one Sluice setting its value, one
//! row each: upstream's name (written here only), how upstream reads it,
//! and the setting it feeds, named by a [`Key`] (a setting that does not
//! exist does not compile). Variables that only mean something together
//! are in [`super::combined`]; those Sluice does not honour, in
//! [`crate::settings::unsupported`].

use super::UpstreamError;
use super::read::{LOCAL_CACHE_BYTES_PER_ENTRY, Reader, go_duration_ms, parse_bool};
use crate::settings::Key;

/// How upstream reads a variable, and what it then gives the setting.
#[derive(Clone, Copy, Debug)]
pub enum Read {
    /// Text as it is, when set.
    Text,
    /// Text as it is; this (upstream's default) when unset.
    TextOr(&'static str),
    /// Go's `strconv.ParseBool`; this (upstream's default) when unset.
    Bool(bool),
    /// A Go duration (`1m30s`), as milliseconds; this many (upstream's
    /// default) when unset.
    DurationMs(u64),
    /// A whole number, when set.
    Count,
    /// A number, when set.
    Number,
    /// One of upstream's words, in any case, each to the setting's value;
    /// `default` (a word) when unset, `expected` in the error otherwise.
    OneOf {
        /// Upstream's default word.
        default: &'static str,
        /// Each word (lower case) and the setting's value for it.
        words: &'static [(&'static str, &'static str)],
        /// What the error says is expected.
        expected: &'static str,
    },
    /// Upstream's text through a conversion of its own; `unset` is the
    /// setting's value when the variable is not set.
    Convert {
        /// The setting's value when the variable is not set.
        unset: Option<&'static str>,
        /// Upstream's text to the setting's value, or why it cannot be.
        convert: fn(&str) -> Result<String, String>,
    },
}

/// One upstream variable that gives one setting its value.
#[derive(Clone, Copy, Debug)]
pub struct Variable {
    /// Upstream's name.
    pub name: &'static str,
    /// How upstream reads it.
    pub read: Read,
    /// The setting it gives a value to.
    pub feeds: Key,
}

const fn var(name: &'static str, read: Read, feeds: Key) -> Variable {
    Variable { name, read, feeds }
}

/// Every upstream variable that maps to one setting alone.
pub const VARIABLES: &[Variable] = &[
    // Rules from xDS.
    var("CONFIG_GRPC_XDS_NODE_ID", Read::Text, Key::xds_node_id),
    var(
        "CONFIG_GRPC_XDS_NODE_METADATA",
        Read::Convert {
            unset: None,
            convert: node_metadata_json,
        },
        Key::xds_node_metadata,
    ),
    var(
        "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        Read::Bool(false),
        Key::xds_tls,
    ),
    var(
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        Read::Text,
        Key::xds_tls_cert,
    ),
    var(
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        Read::Text,
        Key::xds_tls_key,
    ),
    var(
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        Read::Text,
        Key::xds_tls_ca_cert,
    ),
    var(
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        Read::Text,
        Key::xds_tls_san,
    ),
    var(
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        Read::DurationMs(10_000),
        Key::xds_backoff_initial_ms,
    ),
    var(
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        Read::DurationMs(60_000),
        Key::xds_backoff_max_ms,
    ),
    var(
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        Read::Number,
        Key::xds_backoff_random_factor,
    ),
    var(
        "XDS_CLIENT_BACKOFF_JITTER",
        Read::Bool(true),
        Key::xds_backoff_jitter,
    ),
    var(
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        Read::Count,
        Key::xds_max_message_bytes,
    ),
    var(
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        Read::Bool(false),
        Key::force_start_without_initial_config,
    ),
    var(
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        Read::Bool(false),
        Key::healthy_with_config_loaded,
    ),
    // Redis.
    var("REDIS_TLS_CLIENT_CERT", Read::Text, Key::redis_tls_cert),
    var("REDIS_TLS_CLIENT_KEY", Read::Text, Key::redis_tls_key),
    var("REDIS_TLS_CACERT", Read::Text, Key::redis_tls_ca_cert),
    var(
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        Read::Bool(false),
        Key::redis_tls_skip_hostname_verification,
    ),
    // Upstream's 10 is its pool of connections one command at a time each;
    // Sluice's connections each carry many calls at once, and fewer carry
    // them cheaper (BENCHMARKS.md), so only a value set here counts.
    var("REDIS_POOL_SIZE", Read::Count, Key::redis_pool_size),
    var(
        "REDIS_TIMEOUT",
        Read::DurationMs(10_000),
        Key::redis_timeout_ms,
    ),
    var("CACHE_KEY_PREFIX", Read::Text, Key::redis_key_prefix),
    // Decisions.
    var(
        "LOCAL_CACHE_SIZE_IN_BYTES",
        Read::Convert {
            unset: Some("0"),
            convert: cache_entries,
        },
        Key::local_cache_size,
    ),
    var("NEAR_LIMIT_RATIO", Read::Number, Key::near_limit_ratio),
    var("SHADOW_MODE", Read::Bool(false), Key::shadow_mode),
    var("QUOTA_MODE", Read::Bool(false), Key::quota_mode),
    var(
        "RESPONSE_DYNAMIC_METADATA",
        Read::Bool(false),
        Key::response_dynamic_metadata,
    ),
    var(
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        Read::Convert {
            unset: Some("off"),
            convert: header_mode,
        },
        Key::response_headers,
    ),
    // Logs and telemetry.
    var(
        "LOG_LEVEL",
        Read::OneOf {
            default: "warn",
            words: &[
                ("trace", "trace"),
                ("debug", "debug"),
                ("info", "info"),
                ("warn", "warn"),
                ("warning", "warn"),
                ("error", "error"),
                ("fatal", "error"),
                ("panic", "error"),
            ],
            expected: "expected TRACE, DEBUG, INFO, WARN, ERROR, FATAL or PANIC",
        },
        Key::log_level,
    ),
    var(
        "LOG_FORMAT",
        Read::OneOf {
            default: "text",
            words: &[("text", "human"), ("json", "json")],
            expected: "expected text or json",
        },
        Key::log_format,
    ),
    var(
        "STATS_FLUSH_INTERVAL",
        Read::DurationMs(10_000),
        Key::stats_flush_interval_ms,
    ),
    var(
        "TRACING_SERVICE_NAME",
        Read::TextOr("RateLimit"),
        Key::service_name,
    ),
    // The gRPC listener.
    var(
        "GRPC_MAX_CONNECTION_AGE",
        Read::DurationMs(24 * 3_600_000),
        Key::max_connection_age_ms,
    ),
    var(
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        Read::DurationMs(3_600_000),
        Key::max_connection_age_grace_ms,
    ),
];

impl Variable {
    /// The value this variable gives its setting in `r`'s environment, or
    /// none (the setting keeps its value from elsewhere).
    pub fn value(&self, r: &Reader<'_>) -> Result<Option<String>, UpstreamError> {
        let var = self.name;
        let raw = r.raw(var);
        let bad = |why: String| r.err(var, why);
        Ok(match (self.read, raw) {
            (Read::Text, v) => v.map(str::to_owned),
            (Read::TextOr(default), v) => Some(v.unwrap_or(default).to_owned()),
            (Read::Bool(default), None) => Some(default.to_string()),
            (Read::Bool(_), Some(v)) => Some(parse_bool(v).map_err(bad)?.to_string()),
            (Read::DurationMs(default), None) => Some(default.to_string()),
            (Read::DurationMs(_), Some(v)) => Some(go_duration_ms(v).map_err(bad)?.to_string()),
            (Read::Count, _) => r.u64(var)?.map(|n| n.to_string()),
            (Read::Number, _) => r.f64(var)?.map(|n| n.to_string()),
            (Read::OneOf { default, .. }, None) => Some(self.word(default).map_err(bad)?),
            (Read::OneOf { .. }, Some(v)) => Some(self.word(v).map_err(bad)?),
            (Read::Convert { unset, .. }, None) => unset.map(str::to_owned),
            (Read::Convert { convert, .. }, Some(v)) => Some(convert(v).map_err(bad)?),
        })
    }

    /// The setting's value for one of upstream's words.
    fn word(&self, word: &str) -> Result<String, String> {
        let Read::OneOf {
            words, expected, ..
        } = self.read
        else {
            unreachable!("only a OneOf has words")
        };
        let word = word.to_ascii_lowercase();
        words
            .iter()
            .find(|(w, _)| *w == word)
            .map(|(_, value)| (*value).to_owned())
            .ok_or_else(|| expected.to_owned())
    }
}

/// Upstream's node metadata, `key:value,key:value`, as the setting's JSON.
fn node_metadata_json(text: &str) -> Result<String, String> {
    let mut object = serde_json::Map::new();
    for pair in text.split(',') {
        let (k, v) = pair
            .split_once(':')
            .ok_or("expected key:value[,key:value…]")?;
        object.insert(k.trim().into(), serde_json::Value::String(v.trim().into()));
    }
    Ok(serde_json::Value::Object(object).to_string())
}

/// `LOCAL_CACHE_SIZE_IN_BYTES` (a freecache size upstream) as Sluice's
/// entry count: any cache at all holds at least one entry.
fn cache_entries(text: &str) -> Result<String, String> {
    let bytes: u64 = text.parse().map_err(|_| "expected a whole number")?;
    let entries = if bytes == 0 {
        0
    } else {
        (bytes / LOCAL_CACHE_BYTES_PER_ENTRY).max(1)
    };
    Ok(entries.to_string())
}

/// Upstream's headers switch as a header mode: its headers, or none.
fn header_mode(text: &str) -> Result<String, String> {
    Ok(if parse_bool(text)? { "draft03" } else { "off" }.into())
}
