//! Traces: the OpenTelemetry OTLP pipeline behind `tracing` spans, the W3C
//! trace context carried in incoming gRPC metadata, and the one span each
//! `ShouldRateLimit` call runs in.
//!
//! Spans are written with `tracing` everywhere; this module only turns them
//! into OpenTelemetry spans ([`layer`]) and ships them over OTLP, gRPC or
//! HTTP ([`otlp_tracer_provider`]). `logging::init` installs both. Nothing outside
//! `telemetry` needs to know OpenTelemetry exists except `service.rs`, which
//! joins each request's span to the caller's trace:
//!
//! ```no_run
//! use sluice::telemetry::traces;
//! # fn handle(metadata: &tonic::metadata::MetadataMap) {
//! // In the handler, before the span is first entered:
//! let span = traces::rate_limit_span("envoy", 2);
//! traces::set_parent(&span, traces::parent_context(metadata));
//! let _entered = span.enter(); // or `.instrument(span.clone())` for async work
//! // … decide …
//! span.record("outcome", "OVER_LIMIT");
//! # }
//! ```
//!
//! Must not import: `rules`, `limiter`, `store` or the protobuf types.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::Context;
use opentelemetry::propagation::Extractor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{ExporterBuildError, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkError;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tonic::metadata::{KeyRef, MetadataMap};
use tracing::Subscriber;
use tracing::level_filters::LevelFilter;
use tracing_opentelemetry::{OpenTelemetrySpanExt as _, SetParentError};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::TryInitError;

/// Crates whose spans must never reach the OpenTelemetry layer: the OTLP
/// exporter talks gRPC through them, so exporting their spans would make
/// every export produce more spans to export (telemetry-induced telemetry).
/// They still reach the log output, under the log filter.
const EXPORTER_STACK: [&str; 10] = [
    "h2",
    "hyper",
    "hyper_util",
    "tonic",
    "tower",
    "tower_http",
    "opentelemetry",
    "opentelemetry_sdk",
    "opentelemetry_otlp",
    "reqwest",
];

/// Why telemetry could not start, or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The gRPC exporter's channel is driven by Tokio, so it must be built
    /// inside a runtime.
    #[error(
        "the OTLP exporter must be built inside a Tokio runtime (enter the runtime before telemetry::init)"
    )]
    NoRuntime,
    /// The OTLP endpoint or exporter settings were rejected.
    #[error("OTLP endpoint {endpoint:?}: {source}")]
    Exporter {
        /// The endpoint as configured.
        endpoint: String,
        /// What the exporter said.
        #[source]
        source: ExporterBuildError,
    },
    /// Something installed a global `tracing` subscriber first.
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled(#[source] TryInitError),
    /// Flushing the last spans at shutdown failed (e.g. the collector is
    /// unreachable); those spans are lost.
    #[error("flushing traces at shutdown: {0}")]
    Shutdown(#[source] OTelSdkError),
}

/// Keeps the OTLP pipeline alive; returned by `telemetry::init`.
///
/// Dropping it, or calling [`TelemetryGuard::shutdown`], flushes the spans
/// still queued and stops the exporter. The exporter's gRPC channel runs on
/// the Tokio runtime, so shut down while the runtime is still running (e.g.
/// at the end of the `block_on` future or just after it returns, before the
/// runtime is dropped); afterwards the flush can only fail. Without an OTLP
/// endpoint the guard holds nothing and dropping it does nothing.
#[derive(Debug)]
#[must_use = "dropping the guard stops trace export"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    pub(crate) fn new(provider: Option<SdkTracerProvider>) -> Self {
        Self { provider }
    }

    /// Whether spans are exported over OTLP.
    pub fn exports_traces(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes queued spans and stops the exporter, reporting a failed flush.
    /// Blocks the calling thread until the export finishes or times out.
    pub fn shutdown(mut self) -> Result<(), TelemetryError> {
        match self.provider.take() {
            Some(provider) => provider.shutdown().map_err(TelemetryError::Shutdown),
            None => Ok(()),
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            tracing::warn!(error = %e, "flushing traces at shutdown failed");
        }
    }
}

/// How spans travel to the collector.
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
pub enum OtlpProtocol {
    /// OTLP/gRPC (a collector's port 4317).
    #[default]
    Grpc,
    /// OTLP/HTTP with protobuf bodies, POSTed to `<endpoint>/v1/traces` (a
    /// collector's port 4318; envoyproxy/ratelimit's default).
    Http,
}

/// Where and how spans are exported.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpExport {
    /// The collector: `http://host:4317` (gRPC; `https://` for TLS with the
    /// system roots) or the base URL of an OTLP/HTTP receiver.
    pub endpoint: String,
    /// gRPC or HTTP.
    pub protocol: OtlpProtocol,
    /// `service.name` of every span.
    pub service_name: String,
    /// The share of new traces sampled, 0 to 1; a caller's sampling
    /// decision (its `traceparent` flag) is followed whatever this says.
    pub sampling_ratio: f64,
}

impl OtlpExport {
    /// OTLP/gRPC to `endpoint`, every trace sampled.
    pub fn grpc(endpoint: &str, service_name: &str) -> Self {
        Self {
            endpoint: endpoint.to_owned(),
            protocol: OtlpProtocol::Grpc,
            service_name: service_name.to_owned(),
            sampling_ratio: 1.0,
        }
    }
}

/// Builds a tracer provider that exports spans in batches over OTLP as
/// `export` says, sampling new traces at its ratio and following the
/// caller's decision otherwise. The standard `OTEL_EXPORTER_OTLP_*`
/// variables tune the rest (headers, timeout, compression).
///
/// Spans are batched on a background thread; call inside a Tokio runtime,
/// which drives the gRPC channel.
pub fn otlp_tracer_provider(export: &OtlpExport) -> Result<SdkTracerProvider, TelemetryError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(TelemetryError::NoRuntime);
    }
    let exporter = match export.protocol {
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(&export.endpoint)
            .build(),
        // The endpoint is the receiver's base, as OTEL_EXPORTER_OTLP_ENDPOINT
        // is: traces go to its /v1/traces.
        OtlpProtocol::Http => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(format!(
                "{}/v1/traces",
                export.endpoint.trim_end_matches('/')
            ))
            .build(),
    }
    .map_err(|source| TelemetryError::Exporter {
        endpoint: export.endpoint.clone(),
        source,
    })?;
    let resource = Resource::builder()
        .with_service_name(export.service_name.clone())
        .build();
    let ratio = export.sampling_ratio.clamp(0.0, 1.0);
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            ratio,
        ))))
        .with_resource(resource)
        .build())
}

/// Set once an OpenTelemetry layer exists (see [`request_span`]).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The span of one `ShouldRateLimit` call joined to the caller's trace, when
/// something consumes it: an OpenTelemetry layer exists, or the service logs
/// at debug level. Otherwise a disabled span: building one per request (and
/// extracting the caller's context) costs a few percent of a decision's CPU
/// for nothing.
pub fn request_span(domain: &str, descriptors: usize, metadata: &MetadataMap) -> tracing::Span {
    if !EXPORTING.load(Ordering::Relaxed) && !tracing::enabled!(tracing::Level::DEBUG) {
        return tracing::Span::none();
    }
    let span = rate_limit_span(domain, descriptors);
    set_parent(&span, parent_context(metadata));
    span
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of
/// `provider`. It sees spans at `INFO` and above from every crate but the
/// exporter's own stack, independently of the log filter: quieting the logs
/// does not drop traces.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + 'static
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    EXPORTING.store(true, Ordering::Relaxed);
    let tracer = provider.tracer(env!("CARGO_PKG_NAME"));
    let filter = Targets::new()
        .with_default(LevelFilter::INFO)
        .with_targets(EXPORTER_STACK.map(|target| (target, LevelFilter::OFF)));
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(filter)
}

/// Sets the process-wide propagator to W3C Trace Context (`traceparent`,
/// `tracestate`), which [`parent_context`] uses. Idempotent.
pub fn install_propagator() {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
}

/// The caller's trace context, read from incoming gRPC metadata with the
/// global propagator (see [`install_propagator`]). A missing or malformed
/// `traceparent` gives an empty context, so the request starts a new trace.
pub fn parent_context(metadata: &MetadataMap) -> Context {
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&MetadataExtractor(metadata))
    })
}

/// Makes `parent` (from [`parent_context`]) the parent of `span`. Call it
/// before the span is first entered: an OpenTelemetry span's parent is fixed
/// when it starts.
///
/// Doing nothing is the right outcome when traces are not exported (no
/// OpenTelemetry layer) or the span is filtered out, so those are ignored.
pub fn set_parent(span: &tracing::Span, parent: Context) {
    match span.set_parent(parent) {
        Ok(()) | Err(SetParentError::LayerNotFound | SetParentError::SpanDisabled) => {}
        Err(e) => tracing::debug!(error = %e, "remote trace parent not set"),
    }
}

/// The span one `ShouldRateLimit` call runs in: a server span with the
/// request's `domain` and number of `descriptors`. Record how it ended with
/// `span.record("outcome", "OK" | "OVER_LIMIT")`, or [`record_error`].
pub fn rate_limit_span(domain: &str, descriptors: usize) -> tracing::Span {
    // tracing-opentelemetry exports unsigned integers as strings; signed ones
    // as integers.
    let descriptors = i64::try_from(descriptors).unwrap_or(i64::MAX);
    tracing::info_span!(
        "ShouldRateLimit",
        otel.kind = "server",
        domain,
        descriptors,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// Records on a [`rate_limit_span`] that the call failed with `code`: the
/// `outcome` becomes the code's name and the span's status an error.
pub fn record_error(span: &tracing::Span, code: tonic::Code) {
    span.record("outcome", tracing::field::debug(code));
    span.record("otel.status_code", "ERROR");
}

/// Reads W3C trace context headers out of gRPC metadata.
struct MetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                KeyRef::Ascii(key) => Some(key.as_str()),
                KeyRef::Binary(_) => None,
            })
            .collect()
    }
}
