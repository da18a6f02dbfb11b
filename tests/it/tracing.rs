//! Traces: the request span joins the caller's W3C trace, and spans reach an
//! OTLP collector. Spans are captured with the SDK's own in-memory exporter
//! behind the same `tracing` layer production uses, under a subscriber scoped
//! to each test; the OTLP test runs a collector built from the OTLP protos'
//! own generated server on 127.0.0.1:0.

use opentelemetry::Value;
use opentelemetry::trace::{SpanId, SpanKind, Status, TraceId};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use sluice::settings::LogFormat;
use sluice::telemetry::traces::{OtlpExport, OtlpProtocol};
use sluice::telemetry::{self, TelemetryError, traces};
use tokio::sync::mpsc;
use tonic::metadata::{MetadataMap, MetadataValue};
use tracing_subscriber::layer::SubscriberExt as _;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN_ID: &str = "00f067aa0ba902b7";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn metadata(traceparent: Option<&str>) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    if let Some(traceparent) = traceparent {
        metadata.insert(
            "traceparent",
            MetadataValue::try_from(traceparent).expect("ASCII"),
        );
    }
    metadata
}

/// Runs `body` under a subscriber holding only the OpenTelemetry layer, then
/// returns every span it finished, as exported.
fn capture(body: impl FnOnce()) -> Vec<SpanData> {
    traces::install_propagator();
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry().with(traces::layer(&provider));
    tracing::subscriber::with_default(subscriber, body);
    provider.force_flush().expect("flush to memory");
    let spans = exporter.get_finished_spans().expect("in-memory spans");
    provider.shutdown().expect("shutdown");
    spans
}

/// One request as `service.rs` handles it: span, remote parent, enter,
/// outcome recorded while the span is live.
fn handle_request(metadata: &MetadataMap, outcome: &'static str) {
    let span = traces::rate_limit_span("envoy", 2);
    traces::set_parent(&span, traces::parent_context(metadata));
    let _entered = span.enter();
    tracing::info!("deciding");
    span.record("outcome", outcome);
}

fn only(spans: Vec<SpanData>) -> SpanData {
    assert_eq!(spans.len(), 1, "expected one span, got {spans:#?}");
    spans.into_iter().next().expect("one span")
}

fn attribute(span: &SpanData, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

#[test]
fn the_request_span_joins_the_callers_trace() {
    let span = only(capture(|| {
        handle_request(&metadata(Some(TRACEPARENT)), "OVER_LIMIT")
    }));

    assert_eq!(span.name, "ShouldRateLimit");
    assert_eq!(span.span_kind, SpanKind::Server);
    assert_eq!(
        span.span_context.trace_id(),
        TraceId::from_hex(TRACE_ID).unwrap()
    );
    assert_eq!(
        span.parent_span_id,
        SpanId::from_hex(PARENT_SPAN_ID).unwrap()
    );
    assert!(span.parent_span_is_remote);
    assert!(span.span_context.is_sampled());
    assert_eq!(attribute(&span, "domain"), Some("envoy".into()));
    assert_eq!(attribute(&span, "descriptors"), Some(2_i64.into()));
    assert_eq!(attribute(&span, "outcome"), Some("OVER_LIMIT".into()));
    assert_eq!(span.status, Status::Unset);
    let events: Vec<_> = span.events.iter().map(|e| e.name.clone()).collect();
    assert_eq!(events, ["deciding"]);
}

#[test]
fn without_a_traceparent_a_new_trace_starts() {
    let span = only(capture(|| handle_request(&metadata(None), "OK")));

    assert!(span.span_context.is_valid());
    assert_ne!(
        span.span_context.trace_id(),
        TraceId::from_hex(TRACE_ID).unwrap()
    );
    assert_eq!(span.parent_span_id, SpanId::INVALID);
    assert_eq!(attribute(&span, "outcome"), Some("OK".into()));
}

#[test]
fn a_malformed_traceparent_is_ignored() {
    for traceparent in [
        "garbage",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ] {
        let span = only(capture(|| {
            handle_request(&metadata(Some(traceparent)), "OK")
        }));

        assert!(span.span_context.is_valid(), "{traceparent}");
        assert_ne!(
            span.span_context.trace_id(),
            TraceId::from_hex(TRACE_ID).unwrap(),
            "{traceparent}"
        );
        assert_eq!(span.parent_span_id, SpanId::INVALID, "{traceparent}");
    }
}

/// Quirk of the SDK's W3C propagator, pinned: it checks hex digits but not
/// field lengths, so a short trace id is taken as if left-padded with zeros.
#[test]
fn a_short_trace_id_is_padded_not_refused() {
    let short = "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01";
    let span = only(capture(|| handle_request(&metadata(Some(short)), "OK")));

    assert_eq!(
        span.span_context.trace_id(),
        TraceId::from_hex("004bf92f3577b34da6a3ce929d0e0e47").unwrap()
    );
    assert_eq!(
        span.parent_span_id,
        SpanId::from_hex(PARENT_SPAN_ID).unwrap()
    );
}

#[test]
fn an_unsampled_caller_is_not_traced() {
    let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let spans = capture(|| handle_request(&metadata(Some(unsampled)), "OK"));
    assert!(spans.is_empty(), "{spans:#?}");
}

#[test]
fn an_error_is_the_outcome_and_the_status() {
    let span = only(capture(|| {
        let span = traces::rate_limit_span("envoy", 1);
        let _entered = span.enter();
        traces::record_error(&span, tonic::Code::Unavailable);
    }));

    assert_eq!(attribute(&span, "outcome"), Some("Unavailable".into()));
    assert!(
        matches!(span.status, Status::Error { .. }),
        "{:?}",
        span.status
    );
}

#[test]
fn work_inside_the_request_is_a_child_span() {
    let spans = capture(|| {
        let request = traces::rate_limit_span("envoy", 1);
        traces::set_parent(
            &request,
            traces::parent_context(&metadata(Some(TRACEPARENT))),
        );
        request.in_scope(|| tracing::info_span!("store").in_scope(|| {}));
    });

    let request = spans.iter().find(|s| s.name == "ShouldRateLimit").unwrap();
    let store = spans.iter().find(|s| s.name == "store").unwrap();
    assert_eq!(
        store.span_context.trace_id(),
        request.span_context.trace_id()
    );
    assert_eq!(store.parent_span_id, request.span_context.span_id());
}

#[test]
fn the_exporters_own_stack_is_not_traced() {
    let spans = capture(|| {
        tracing::info_span!(target: "h2", "connection").in_scope(|| {});
        tracing::info_span!(target: "tonic::transport", "request").in_scope(|| {});
        tracing::debug_span!("too_fine").in_scope(|| {});
    });
    assert!(spans.is_empty(), "{spans:#?}");
}

#[test]
fn a_parent_is_harmless_without_trace_export() {
    // No OpenTelemetry layer, as when no OTLP endpoint is set.
    let subscriber = tracing_subscriber::registry();
    tracing::subscriber::with_default(subscriber, || {
        handle_request(&metadata(Some(TRACEPARENT)), "OK");
    });
}

#[test]
fn the_otlp_exporter_needs_a_runtime() {
    let export = OtlpExport::grpc("http://127.0.0.1:4317", "sluice");
    let error = traces::otlp_tracer_provider(&export).unwrap_err();
    assert!(matches!(error, TelemetryError::NoRuntime), "{error}");
}

#[tokio::test]
async fn a_bad_otlp_endpoint_is_refused() {
    let error = traces::otlp_tracer_provider(&OtlpExport::grpc("not a uri", "sluice")).unwrap_err();
    assert!(matches!(error, TelemetryError::Exporter { .. }), "{error}");
    assert!(error.to_string().contains("not a uri"), "{error}");
}

#[test]
fn init_installs_the_global_subscriber_once() {
    let guard = telemetry::init(LogFormat::Json, "warn", None).expect("first init");
    assert!(!guard.exports_traces());
    guard.shutdown().expect("nothing to flush");

    let again = telemetry::init(LogFormat::Human, "info", None);
    assert!(matches!(again, Err(TelemetryError::AlreadyInstalled(_))));
}

/// A collector that hands each export request to the test.
struct Collector(mpsc::UnboundedSender<ExportTraceServiceRequest>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn string_value(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> Option<&str> {
    match value?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

/// An OTLP/HTTP receiver on 127.0.0.1:0 that hands each protobuf body
/// POSTed to /v1/traces to the test; returns its base URL.
async fn http_receiver(sent: mpsc::UnboundedSender<ExportTraceServiceRequest>) -> String {
    use prost::Message as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let sent = sent.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP body");
                let _ = sent.send(request);
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// An OTLP/gRPC collector on 127.0.0.1:0 that hands each export to the
/// test; returns its URL.
async fn grpc_collector(sent: mpsc::UnboundedSender<ExportTraceServiceRequest>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(sent)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}

/// Exports one request span per traceparent of `callers` through `export`,
/// and returns the spans the receiver got (with their service names).
async fn exported(
    export: OtlpExport,
    callers: &[Option<&str>],
    received: &mut mpsc::UnboundedReceiver<ExportTraceServiceRequest>,
) -> Vec<(Option<String>, opentelemetry_proto::tonic::trace::v1::Span)> {
    traces::install_propagator();
    let provider = traces::otlp_tracer_provider(&export).expect("exporter");
    let subscriber = tracing_subscriber::registry().with(traces::layer(&provider));
    tracing::subscriber::with_default(subscriber, || {
        for caller in callers {
            handle_request(&metadata(*caller), "OVER_LIMIT");
        }
    });
    // Flushing blocks until the export is answered, which needs the runtime;
    // the receiver has every span once it returns.
    let flush = provider.clone();
    tokio::task::spawn_blocking(move || flush.force_flush())
        .await
        .unwrap()
        .expect("export to the collector");
    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap()
        .expect("shutdown");
    let mut spans = Vec::new();
    while let Ok(request) = received.try_recv() {
        for resource_spans in request.resource_spans {
            let service_name = resource_spans.resource.as_ref().and_then(|resource| {
                resource
                    .attributes
                    .iter()
                    .find(|kv| kv.key == "service.name")
                    .and_then(|kv| string_value(kv.value.as_ref()))
                    .map(str::to_owned)
            });
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service_name.clone(), s)));
            }
        }
    }
    spans
}

/// The one span exported for a sampled caller: named, joined to the
/// caller's trace, with its outcome and the service's name.
fn assert_one_request_span(
    spans: &[(Option<String>, opentelemetry_proto::tonic::trace::v1::Span)],
) {
    let [(service_name, span)] = spans else {
        panic!("one span: {spans:#?}");
    };
    assert_eq!(service_name.as_deref(), Some("sluice-test"));
    assert_eq!(span.name, "ShouldRateLimit");
    assert_eq!(
        span.trace_id,
        TraceId::from_hex(TRACE_ID).unwrap().to_bytes()
    );
    assert_eq!(
        span.parent_span_id,
        SpanId::from_hex(PARENT_SPAN_ID).unwrap().to_bytes()
    );
    let outcome = span
        .attributes
        .iter()
        .find(|kv| kv.key == "outcome")
        .and_then(|kv| string_value(kv.value.as_ref()));
    assert_eq!(outcome, Some("OVER_LIMIT"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_collector() {
    let (sent, mut received) = mpsc::unbounded_channel();
    let endpoint = grpc_collector(sent).await;
    let export = OtlpExport::grpc(&endpoint, "sluice-test");
    assert_one_request_span(&exported(export, &[Some(TRACEPARENT)], &mut received).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_http_receiver_at_v1_traces() {
    let (sent, mut received) = mpsc::unbounded_channel();
    let export = OtlpExport {
        protocol: OtlpProtocol::Http,
        ..OtlpExport::grpc(&http_receiver(sent).await, "sluice-test")
    };
    assert_one_request_span(&exported(export, &[Some(TRACEPARENT)], &mut received).await);
}

/// At ratio 0 no new trace is exported, but a caller that sampled its
/// trace still gets the request's span (the sampler follows the parent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sampling_ratio_applies_to_new_traces_only() {
    let (sent, mut received) = mpsc::unbounded_channel();
    let export = OtlpExport {
        protocol: OtlpProtocol::Http,
        sampling_ratio: 0.0,
        ..OtlpExport::grpc(&http_receiver(sent).await, "sluice-test")
    };
    let callers = [None, Some(TRACEPARENT), None];
    assert_one_request_span(&exported(export, &callers, &mut received).await);
}

#[test]
fn the_service_joins_the_callers_trace_from_grpc_metadata() {
    use std::sync::Arc;

    use sluice::proto::RateLimitService as _;

    let spans = capture(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let rules = sluice::rules::RulesSource::Builtin
                .load()
                .expect("the example rules");
            let clock = Arc::new(sluice::limiter::ManualClock::new(1_700_000_000_000));
            let store = sluice::store::MemoryStore::new(&Default::default(), clock);
            let limiter = Arc::new(sluice::decision::Limiter::new(
                rules,
                store,
                Default::default(),
            ));
            let service =
                sluice::service::RateLimitService::new(limiter, sluice::headers::HeaderMode::Off);
            let entry = sluice::proto::rate_limit_descriptor::Entry {
                key: "remote_address".into(),
                value: "192.0.2.7".into(),
            };
            let mut request = tonic::Request::new(sluice::proto::RateLimitRequest {
                domain: "example".into(),
                descriptors: vec![sluice::proto::RateLimitDescriptor {
                    entries: vec![entry],
                    ..Default::default()
                }],
                hits_addend: 0,
            });
            *request.metadata_mut() = metadata(Some(TRACEPARENT));
            service
                .should_rate_limit(request)
                .await
                .expect("a decision");
        });
    });
    let span = spans
        .into_iter()
        .find(|s| s.name == "ShouldRateLimit")
        .expect("the request span");
    assert_eq!(
        span.span_context.trace_id(),
        TraceId::from_hex(TRACE_ID).unwrap()
    );
    assert_eq!(
        span.parent_span_id,
        SpanId::from_hex(PARENT_SPAN_ID).unwrap()
    );
    assert_eq!(attribute(&span, "domain"), Some(Value::from("example")));
    assert_eq!(attribute(&span, "outcome"), Some(Value::from("OK")));
}
