//! Compatibility with envoyproxy/ratelimit: its environment variables and its
//! stats (statsd lines, statsd-exporter-mapped Prometheus names).

#[path = "../support/mod.rs"]
mod support;

mod upstream_env;
mod upstream_stats;
