//! The global `tracing` subscriber: log output to stderr (human-readable by
//! default, JSON on request) and, when an OTLP endpoint is set, the
//! OpenTelemetry layer from `traces`.
//!
//! The log filter applies to the logs only; traces have their own filter (see
//! `traces::layer`), so `warn` logs still export every request's span.

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use super::traces::{self, TelemetryError, TelemetryGuard};

/// Log output format.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber and the W3C Trace Context propagator.
///
/// - Logs go to stderr in `format`, with ANSI colours only on a terminal.
///   `filter` uses the env-filter syntax; an invalid one falls back to `info`
///   with a warning.
/// - With `otlp`, spans are also exported over OTLP as it says (see
///   [`traces::otlp_tracer_provider`]). This must then be
///   called inside a Tokio runtime (e.g. under `runtime.enter()`), and the
///   returned guard kept until shutdown, while the runtime still runs.
///
/// ```no_run
/// # use sluice::telemetry::LogFormat;
/// # use sluice::telemetry::traces::OtlpExport;
/// # fn main() -> anyhow::Result<()> {
/// let runtime = tokio::runtime::Runtime::new()?;
/// let export = OtlpExport::grpc("http://localhost:4317", "sluice");
/// let telemetry = {
///     let _entered = runtime.enter();
///     sluice::telemetry::init(LogFormat::Human, "info", Some(&export))?
/// };
/// runtime.block_on(async { /* serve */ });
/// telemetry.shutdown()?; // flush the last spans
/// # Ok(())
/// # }
/// ```
pub fn init(
    format: LogFormat,
    filter: &str,
    otlp: Option<&traces::OtlpExport>,
) -> Result<TelemetryGuard, TelemetryError> {
    let provider = otlp.map(traces::otlp_tracer_provider).transpose()?;
    let (filter, bad) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let logs = match format {
        LogFormat::Human => logs.with_filter(filter).boxed(),
        LogFormat::Json => logs.json().with_filter(filter).boxed(),
    };
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![logs];
    if let Some(provider) = &provider {
        layers.push(traces::layer(provider).boxed());
    }
    tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .map_err(TelemetryError::AlreadyInstalled)?;
    traces::install_propagator();
    if let Some(e) = bad {
        tracing::warn!(error = %e, "invalid log filter; using info");
    }
    Ok(TelemetryGuard::new(provider))
}
