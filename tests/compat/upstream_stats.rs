//! Upstream's stats (envoyproxy/ratelimit names) after real decisions: the
//! statsd lines a UDP listener receives and the Prometheus page mapped by
//! Envoy Gateway's mapping file (issue 13, item 4).

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use sluice::decision::{Limiter, LimiterOptions};
use sluice::limiter::ManualClock;
use sluice::request::{Descriptor, Entry, Request};
use sluice::store::{MemoryStore, MemoryStoreConfig};
use sluice::telemetry::upstream::UpstreamStats;
use sluice::telemetry::upstream::statsd::{Protocol, UpstreamStatsConfig};
use support::T0;
use support::statsd::StatsdListener;

/// How long a test waits for a statsd line.
const DEADLINE: Duration = Duration::from_secs(10);

const RULES: &str = "
domain: gw
descriptors:
  - key: k1
    value: a
    descriptors:
      - key: k2
        rate_limit: { unit: minute, requests_per_unit: 2 }
";

fn request() -> Request {
    Request {
        domain: "gw".into(),
        descriptors: vec![Descriptor {
            entries: vec![
                Entry {
                    key: "k1".into(),
                    value: "a".into(),
                },
                Entry {
                    key: "k2".into(),
                    value: "10.0.0.1".into(),
                },
            ],
            ..Descriptor::default()
        }],
        ..Request::default()
    }
}

/// Five decisions against a limit of two: returns how many were over.
async fn decide_five(stats: Arc<UpstreamStats>) -> u64 {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
    let limiter = Limiter::with_options(
        support::rules(RULES),
        store,
        LimiterOptions {
            clock,
            ..LimiterOptions::default()
        },
    )
    .with_upstream_stats(Some(stats));
    let mut over = 0;
    for _ in 0..5 {
        let decision = limiter.decide(&request()).await.expect("decision");
        over += u64::from(decision.statuses[0].over_limit);
    }
    over
}

#[tokio::test]
async fn statsd_lines_reach_a_udp_listener() {
    let listener = StatsdListener::udp().await;
    let running = UpstreamStats::start(UpstreamStatsConfig {
        statsd_addr: Some(listener.addr.to_string()),
        statsd_protocol: Protocol::Udp,
        stats_flush_interval_ms: 20,
        ..UpstreamStatsConfig::default()
    })
    .await
    .unwrap();
    let over = decide_five(running.stats.clone()).await;
    assert_eq!(over, 3);
    let want = format!("ratelimit.service.rate_limit.gw.k1_a.k2.over_limit:{over}|c");
    let seen = listener.wait_for_line(&want, DEADLINE).await;
    assert!(
        seen.lines()
            .any(|l| l == "ratelimit.service.rate_limit.gw.k1_a.k2.total_hits:5|c"),
        "{seen}"
    );
    assert!(
        seen.lines()
            .any(|l| l == "ratelimit.service.rate_limit.gw.k1_a.k2.within_limit:2|c"),
        "{seen}"
    );
    assert!(
        seen.lines()
            .any(|l| l == "ratelimit.service.config_load_success:1|c"),
        "{seen}"
    );
}

#[tokio::test]
async fn prometheus_page_uses_eg_mapping() {
    let running = UpstreamStats::start(UpstreamStatsConfig {
        upstream_prometheus_addr: Some("127.0.0.1:0".parse().unwrap()),
        prometheus_mapper: Some(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/eg_statsd_mapping.yaml"),
        ),
        ..UpstreamStatsConfig::default()
    })
    .await
    .unwrap();
    let over = decide_five(running.stats.clone()).await;
    let addr = running.prometheus_addr.unwrap();
    let page = tokio::task::spawn_blocking(move || support::http(addr, "GET", "/metrics", ""))
        .await
        .unwrap();
    assert_eq!(page.0, 200);
    let want = format!(
        "ratelimit_service_rate_limit_over_limit{{domain=\"gw\",key1=\"k1_a\",key2=\"k2\"}} {over}"
    );
    assert!(page.1.contains(&want), "no `{want}` in:\n{}", page.1);
}

#[tokio::test]
async fn a_bad_mapping_file_is_a_start_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "mappings:\n - match: 'a(('\n   match_type: regex\n   name: x\n",
    )
    .unwrap();
    let err = UpstreamStats::start(UpstreamStatsConfig {
        upstream_prometheus_addr: Some("127.0.0.1:0".parse().unwrap()),
        prometheus_mapper: Some(path),
        ..UpstreamStatsConfig::default()
    })
    .await
    .unwrap_err();
    assert!(err.to_string().contains("bad match"), "{err}");
}

#[tokio::test]
async fn statsd_over_tcp_like_gostats() {
    let listener = StatsdListener::tcp().await;
    let running = UpstreamStats::start(UpstreamStatsConfig {
        statsd_addr: Some(listener.addr.to_string()),
        statsd_protocol: Protocol::Tcp,
        stats_flush_interval_ms: 20,
        ..UpstreamStatsConfig::default()
    })
    .await
    .unwrap();
    let over = decide_five(running.stats.clone()).await;
    let want = format!("ratelimit.service.rate_limit.gw.k1_a.k2.over_limit:{over}|c");
    listener.wait_for_line(&want, DEADLINE).await;
}
