//! Telemetry: logs (human or JSON), traces (OpenTelemetry OTLP) and
//! Prometheus metrics. Every metric name is defined once, in `metrics`.

mod logging;

pub use logging::init_logging;
