//! Telemetry: logs (human or JSON), traces (OpenTelemetry OTLP) and
//! Prometheus metrics. Every metric name is defined once, in `metrics`.

mod logging;
pub mod metrics;
pub mod traces;
pub mod upstream;

pub use logging::{LogFormat, init};
pub use traces::{TelemetryError, TelemetryGuard};
