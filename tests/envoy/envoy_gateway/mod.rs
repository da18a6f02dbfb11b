//! Issue 13's acceptance test: Envoy Gateway's default rate-limit Deployment
//! (`tests/fixtures/eg_ratelimit_deployment.yaml`) run as EG renders it, with
//! only the image changed (a symlink `ratelimit` to this build) and the
//! addresses moved to loopback: free ports through HOST/PORT/GRPC_*/DEBUG_*
//! and PROMETHEUS_ADDR, the xDS URL and REDIS_URL pointed at servers this
//! test starts, and the two mounts (`/certs`, `/etc/statsd-exporter`)
//! replaced by temporary directories, by path prefix. Every other variable
//! reaches the binary as EG wrote it.
//!
//! Around it: a management server speaking ADS over mutual TLS as EG's does
//! (`support::ads`), serving EG-shaped `RateLimitConfig` resources with
//! EG's decimal versions; a Redis (`support::redis`); certificates shaped
//! as EG's certgen makes them (`support::certs`); a statsd listener for EG
//! v1.1's variant of the Deployment; and a real Envoy 1.40 calling over
//! mutual TLS. No test sleeps for time: each polls for an event with a
//! deadline.

use crate::support;

mod deployment;
mod envoy;
mod pod;
mod rules;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use sluice::proto::envoy::service::discovery::v3::DiscoveryRequest;
use sluice::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tonic::transport::Channel;
use yaml_rust2::{Yaml, YamlLoader};

use deployment::{Deployment, Render, fixture, set};
use pod::{PKI, Pod};
use rules::{eg_config, eg_config_in, entries, exactly, hit, hits};
use support::Process;
use support::ads::{Management, mutual_tls};
use support::certs::{Ca, Leaf, chain_only_client_config, channel};
use support::envoy::{Envoy, application};
use support::redis::{RedisServer, free_port};
use support::statsd::StatsdListener;

/// How long a client that lost its management server may take to come back:
/// upstream's first backoff is 10 s ± 50 %.
const RECONNECT: Duration = Duration::from_secs(60);

/// How long a statsd line may take: upstream flushes every 10 s.
const STATSD: Duration = Duration::from_secs(40);

/// EG's namespace, and the rate-limit domain of a Gateway listener,
/// `<namespace>/<gateway>/<listener>`.
const NAMESPACE: &str = "envoy-gateway-system";
const DOMAIN: &str = "default/eg/http";

// ------------------------------------------------------------ the tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_is_healthy_before_the_first_snapshot_and_after() {
    let mut pod = Pod::start(Render::Default).await;
    assert_eq!(pod.probe(200).await, "OK");
    // No snapshot yet: FORCE_START_WITHOUT_INITIAL_CONFIG serves, and
    // decisions fail as upstream's do until rules arrive.
    let channel = pod.envoy_channel().await;
    let error = hit(&channel, 0).await.expect_err("no rules yet");
    assert_eq!(error.code(), tonic::Code::Unknown, "{error:?}");
    pod.apply("1", vec![eg_config(&[(0, 5)])]).await;
    assert_eq!(pod.probe(200).await, "OK");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_port_requires_a_client_certificate_from_egs_ca() {
    let mut pod = Pod::start(Render::Default).await;
    pod.probe(200).await;
    pod.apply("1", vec![eg_config(&[(0, 100)])]).await;
    let pki = &*PKI;
    let answered = |config| async move {
        match channel(pod.grpc, config).await {
            Ok((channel, _)) => hit(&channel, 0).await.is_ok(),
            Err(_) => false,
        }
    };
    assert!(
        !answered(chain_only_client_config(&pki.ca, None)).await,
        "a client without a certificate"
    );
    let stranger = Ca::rsa("envoy-gateway").eg_leaf("envoy", &["*.envoy-gateway-system"]);
    assert!(
        !answered(chain_only_client_config(&pki.ca, Some(&stranger))).await,
        "a client with a certificate from another CA"
    );
    assert!(
        answered(chain_only_client_config(&pki.ca, Some(&pki.envoy))).await,
        "EG's Envoy certificate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_limits_are_enforced_exactly() {
    let (_pod, channel) = Pod::serving(Render::Default, eg_config(&[(0, 5), (1, 1)])).await;
    assert_eq!(hits(&channel, 0, 6).await, exactly(5));
    assert_eq!(hits(&channel, 1, 2).await, exactly(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_is_applied_and_acked() {
    let (mut pod, channel) = Pod::serving(Render::Default, eg_config(&[(0, 2)])).await;
    assert_eq!(hits(&channel, 0, 3).await, exactly(2));

    // Version 2 replaces rule 0 by rule 1: the whole state, not a merge.
    pod.apply("2", vec![eg_config(&[(1, 3)])]).await;
    assert_eq!(hits(&channel, 1, 4).await, exactly(3));
    assert_eq!(hits(&channel, 0, 1).await, [Code::Ok], "rule 0 is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_version_is_nacked_and_the_old_limits_stay() {
    let mut pod = Pod::start(Render::Default).await;
    pod.probe(200).await;
    pod.apply("1", vec![eg_config(&[(0, 3)])]).await;

    // A limit without a unit: upstream's loader refuses it.
    let bad = eg_config_in(&[(0, 100)], RateLimitUnit::Unknown);
    let nack = pod.serve("2", vec![bad]).await;
    assert_eq!(nack.version_info, "1", "a NACK names the last good version");
    let detail = nack.error_detail.expect("a NACK carries error_detail");
    assert!(detail.message.contains("unit"), "{}", detail.message);

    let channel = pod.envoy_channel().await;
    assert_eq!(hits(&channel, 0, 4).await, exactly(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_management_server_keeps_the_rules_and_its_snapshot_applies() {
    let (mut pod, channel) = Pod::serving(Render::Default, eg_config(&[(0, 2)])).await;
    assert_eq!(hits(&channel, 0, 3).await, exactly(2));

    // EG goes away: the rules in force stay.
    pod.management.stop().await;
    assert_eq!(hits(&channel, 0, 1).await, [Code::OverLimit]);

    // A new EG on the same port starts its versions at "1" again.
    pod.management = Management::start_at(pod.management.addr, Some(PKI.xds_server_tls())).await;
    pod.management.push("1", vec![eg_config(&[(1, 4)])]);
    let first = pod.management.next_within(RECONNECT).await;
    assert_eq!(
        first.version_info, "1",
        "the reconnecting pod names its rules"
    );
    let nonce = pod.management.nonce_of("1").await;
    let ack = pod.management.answer_to(&nonce).await;
    assert_eq!(ack.version_info, "1");
    assert!(ack.error_detail.is_none(), "{ack:?}");
    assert_eq!(hits(&channel, 1, 5).await, exactly(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_serves_upstream_names_mapped_by_egs_file() {
    let (pod, channel) = Pod::serving(Render::Default, eg_config(&[(0, 2)])).await;
    assert_eq!(hits(&channel, 0, 3).await, exactly(2));

    let [(k1, v1), (k2, v2)] = entries(0);
    let labels = format!("domain=\"{DOMAIN}\",key1=\"{k1}_{v1}\",key2=\"{k2}_{v2}\"");
    let prometheus = pod.prometheus;
    let (status, page) =
        tokio::task::spawn_blocking(move || support::http(prometheus, "GET", "/metrics", ""))
            .await
            .unwrap();
    assert_eq!(status, 200);
    for want in [
        format!("ratelimit_service_rate_limit_over_limit{{{labels}}} 1"),
        format!("ratelimit_service_rate_limit_within_limit{{{labels}}} 2"),
        format!("ratelimit_service_rate_limit_total_hits{{{labels}}} 3"),
    ] {
        assert!(page.lines().any(|l| l == want), "no `{want}` in:\n{page}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eg_v1_1s_statsd_render_sends_upstream_named_lines() {
    let (pod, channel) = Pod::serving(Render::V1_1Statsd, eg_config(&[(0, 2)])).await;
    assert_eq!(hits(&channel, 0, 3).await, exactly(2));

    let [(k1, v1), (k2, v2)] = entries(0);
    let stat = format!("ratelimit.service.rate_limit.{DOMAIN}.{k1}_{v1}.{k2}_{v2}");
    let statsd = pod.statsd.as_ref().unwrap();
    let seen = statsd
        .wait_for_line(&format!("{stat}.over_limit:1|c"), STATSD)
        .await;
    for want in [
        format!("{stat}.within_limit:2|c"),
        format!("{stat}.total_hits:3|c"),
    ] {
        assert!(seen.lines().any(|l| l == want), "no `{want}` in:\n{seen}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_stats_sinks_at_once_are_refused_as_upstream_does() {
    // EG's override-env render: USE_STATSD=true from the user on top of
    // EG's Prometheus variables. Upstream exits at start; so must Sluice.
    let mut pod = Pod::start(Render::BothSinks).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = pod.process.0.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "it kept running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "{status:?}");
    let log = std::fs::read_to_string(pod.dir.path().join("ratelimit.log")).unwrap();
    assert!(log.contains("USE_PROMETHEUS"), "{log}");
}
