//! Log output: human-readable by default, JSON on request.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::settings::LogFormat;

/// Installs the global log subscriber, writing to stderr. `filter` uses the
/// env-filter syntax; an invalid one falls back to `info` with a warning.
pub fn init_logging(format: LogFormat, filter: &str) {
    let (filter, bad) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if let Some(e) = bad {
        tracing::warn!(error = %e, "invalid log filter; using info");
    }
}
