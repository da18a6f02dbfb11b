//! The admin HTTP port and the failure policy, over loopback: metrics after
//! known traffic, bounded label cardinality, the rules as loaded, the JSON
//! API and its status codes, readiness, and what happens when the store
//! fails (policy, circuit breaker).

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use sluice::decision::{LimiterOptions, StoreErrorPolicy};
use sluice::headers::HeaderMode;
use sluice::limiter::ManualClock;
use sluice::store::{
    BreakerConfig, MemoryStore, MemoryStoreConfig, RedisStore, RedisStoreConfig, RedisUrl,
    TimeSource,
};
use sluice::telemetry::metrics::{Metrics, MetricsConfig};
use support::eventually::eventually_async;
use support::redis::RedisServer;
use support::{Server, T0, http, redis_store, rules};

const RULES: &str = r#"
domain: admin
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 5, name: per-client}
  - key: ip
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: login
    rate_limit:
      unit: minute
      requests_per_unit: 2
      penalty: {block: 15m}
"#;

async fn memory_server(options: LimiterOptions) -> Server {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
    let limiter = Arc::new(sluice::decision::Limiter::with_options(
        rules(RULES),
        store,
        options,
    ));
    Server::start_with_limiter(limiter, HeaderMode::Off, clock).await
}

fn json(domain: &str, key: &str, value: &str) -> String {
    format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    )
}

/// A store on `redis` whose calls time out after 200 ms, and its clock.
async fn store_on(redis: &RedisServer) -> (RedisStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let store = redis_store(
        &redis.url(),
        clock.clone(),
        TimeSource::Redis,
        Duration::from_millis(200),
    )
    .await;
    (store, clock)
}

/// A server over [`store_on`] `redis`.
async fn redis_server(redis: &RedisServer) -> Server {
    let (store, clock) = store_on(redis).await;
    let limiter = Arc::new(sluice::decision::Limiter::new(
        rules(RULES),
        store,
        Default::default(),
    ));
    Server::start_with_limiter(limiter, HeaderMode::Off, clock).await
}

/// Runs blocking HTTP calls off the async runtime.
async fn call(
    server: &Server,
    method: &'static str,
    path: &'static str,
    body: String,
) -> (u16, String) {
    let addr = server.http;
    tokio::task::spawn_blocking(move || http(addr, method, path, &body))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_api_answers_200_then_429_and_400_for_bad_input() {
    let server = memory_server(LimiterOptions::default()).await;
    for remaining in (0..5).rev() {
        let (status, body) = call(&server, "POST", "/json", json("admin", "client", "a")).await;
        assert_eq!(status, 200, "{body}");
        assert!(
            body.contains(&format!(r#""limitRemaining":{remaining}"#)),
            "{body}"
        );
        assert!(
            body.contains(
                r#""currentLimit":{"name":"per-client","requestsPerUnit":5,"unit":"MINUTE"}"#
            ),
            "{body}"
        );
    }
    let (status, body) = call(&server, "POST", "/json", json("admin", "client", "a")).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains(r#""overallCode":"OVER_LIMIT""#), "{body}");
    // snake_case and a string hits_addend (protobuf JSON's 64-bit form) are accepted.
    let snake = r#"{"domain":"admin","hits_addend":2,"descriptors":[{"entries":[{"key":"client","value":"b"}],"hits_addend":"0"}]}"#;
    let (status, body) = call(&server, "POST", "/json", snake.to_owned()).await;
    assert_eq!(
        (status, body.contains(r#""limitRemaining":5"#)),
        (200, true),
        "{body}"
    );
    for bad in [
        "not json",
        r#"{"domain":"","descriptors":[]}"#,
        r#"{"domain":"admin","descriptors":[],"extra":1}"#,
    ] {
        let (status, body) = call(&server, "POST", "/json", bad.to_owned()).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, _) = call(&server, "POST", "/json", json("elsewhere", "client", "a")).await;
    assert_eq!(status, 200, "an unknown domain is OK");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_known_traffic_by_domain_and_limit() {
    let server = memory_server(LimiterOptions::default()).await;
    for _ in 0..7 {
        call(&server, "POST", "/json", json("admin", "client", "m")).await;
    }
    call(&server, "POST", "/json", json("admin", "trial", "t")).await;
    call(&server, "POST", "/json", json("admin", "trial", "t")).await;
    let (status, text) = call(&server, "GET", "/metrics", String::new()).await;
    assert_eq!(status, 200);
    for line in [
        r#"sluice_hits_total{domain="admin",limit="per-client",descriptor=""} 7"#,
        r#"sluice_admitted_total{domain="admin",limit="per-client",descriptor=""} 5"#,
        r#"sluice_over_limit_total{domain="admin",limit="per-client",descriptor=""} 2"#,
        // Threshold floor(5 × 0.8) = 4: only the hit that took it to 5.
        r#"sluice_near_limit_total{domain="admin",limit="per-client",descriptor=""} 1"#,
        r#"sluice_shadow_mode_total{domain="admin",limit="admin/trial",descriptor=""} 1"#,
        r#"sluice_requests_total{code="OK"} 7"#,
        r#"sluice_requests_total{code="OVER_LIMIT"} 2"#,
        "sluice_store_duration_seconds_count 9",
        "sluice_request_duration_seconds_count 9",
        "# TYPE sluice_rules_reloads counter",
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
    server.stop().await;
}

/// `sluice_limit` shows every limit of the rules in force, labelled as its
/// counters are, and follows reloads: a limit that is gone loses its series.
#[test]
fn configured_limits_are_shown_and_follow_reloads() {
    let metrics = Arc::new(Metrics::default());
    let clock = Arc::new(ManualClock::new(T0));
    let limiter = sluice::decision::Limiter::with_options(
        rules(RULES),
        MemoryStore::new(&MemoryStoreConfig::default(), clock),
        LimiterOptions {
            metrics: metrics.clone(),
            ..LimiterOptions::default()
        },
    );
    let text = metrics.encode();
    for line in [
        r#"sluice_limit{domain="admin",limit="per-client",window="1m"} 5"#,
        r#"sluice_limit{domain="admin",limit="admin/ip",window="1m"} 100"#,
        r#"sluice_limit{domain="admin",limit="admin/trial",window="1m"} 1"#,
        r#"sluice_limit_window_seconds{domain="admin",limit="per-client",window="1m"} 60.0"#,
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
    limiter.replace_rules(rules(
        "domain: admin\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 3, name: per-client}\n",
    ));
    let text = metrics.encode();
    assert!(
        text.contains(r#"sluice_limit{domain="admin",limit="per-client",window="1s"} 3"#),
        "{text}"
    );
    for gone in [r#"window="1m""#, "admin/ip", "admin/trial"] {
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("sluice_limit") && l.contains(gone)),
            "{gone} still shown after the reload:\n{text}"
        );
    }
}

/// `sluice_build_info` names the version and a revision, and the reconcile
/// and TLS-handshake series exist from the start (at zero), so alerts on
/// their rate have data before the first event.
#[test]
fn build_info_and_operations_series_exist_from_the_start() {
    let text = Metrics::default().encode();
    let build = text
        .lines()
        .find(|l| l.starts_with("sluice_build_info{"))
        .unwrap_or_else(|| panic!("no sluice_build_info in\n{text}"));
    assert!(
        build.starts_with(&format!(
            r#"sluice_build_info{{version="{}",revision=""#,
            env!("CARGO_PKG_VERSION")
        )) && build.ends_with("} 1"),
        "{build}"
    );
    assert!(!build.contains(r#"revision="""#), "{build}");
    for line in [
        r#"sluice_store_reconciliations_total{outcome="answered"} 0"#,
        r#"sluice_store_reconciliations_total{outcome="no_reply"} 0"#,
        r#"sluice_tls_handshake_failures_total{listener="grpc"} 0"#,
        "sluice_memory_store_keys 0",
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unique_values_keeps_metric_labels_bounded() {
    let metrics = Arc::new(Metrics::new(MetricsConfig {
        max_descriptor_labels: 50,
        ..MetricsConfig::default()
    }));
    let server = memory_server(LimiterOptions {
        metrics: metrics.clone(),
        ..LimiterOptions::default()
    })
    .await;
    let mut client = sluice::proto::RateLimitServiceClient::new(server.channel().await);
    for i in 0..2_000 {
        client
            .should_rate_limit(support::request(
                "admin",
                &[&[("ip", &format!("10.0.{}.{}", i / 256, i % 256))]],
            ))
            .await
            .unwrap();
        client
            .should_rate_limit(support::request(
                "admin",
                &[&[("client", &format!("c{i}"))]],
            ))
            .await
            .unwrap();
    }
    let text = metrics.encode();
    let ip_series = text
        .lines()
        .filter(|l| l.starts_with("sluice_hits_total{") && l.contains("admin/ip"))
        .count();
    assert_eq!(ip_series, 50 + 1, "50 values and _other_");
    assert!(
        text.contains(
            r#"sluice_hits_total{domain="admin",limit="admin/ip",descriptor="_other_"} 1950"#
        ),
        "{text}"
    );
    let client_series = text
        .lines()
        .filter(|l| l.starts_with("sluice_hits_total{") && l.contains("per-client"))
        .count();
    assert_eq!(
        client_series, 1,
        "values of ordinary rules never become labels"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlconfig_shows_the_rules_as_loaded() {
    let server = memory_server(LimiterOptions::default()).await;
    let (status, text) = call(&server, "GET", "/rlconfig", String::new()).await;
    assert_eq!(status, 200);
    assert!(text.contains("admin/client: requests_per_unit=5 window=60000ms unit=Minute algorithm=sliding_window precision=6000ms name=per-client; role=Enforce"), "{text}");
    assert!(
        text.contains("admin/trial: ") && text.contains("role=Shadow"),
        "{text}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_redis_connection() {
    let mut redis = RedisServer::start();
    let server = redis_server(&redis).await;
    assert_eq!(call(&server, "GET", "/readyz", String::new()).await.0, 200);
    redis.stop();
    // Wait for the client to notice (an event, bounded by a deadline).
    eventually_async("not ready with Redis down", async || {
        call(&server, "GET", "/readyz", String::new()).await.0 == 503
    })
    .await;
    assert_eq!(
        call(&server, "GET", "/healthz", String::new()).await.0,
        200,
        "alive though not ready"
    );
    redis.restart();
    eventually_async("ready after Redis returned", async || {
        call(&server, "GET", "/readyz", String::new()).await.0 == 200
    })
    .await;
    server.stop().await;
}

/// gRPC health (`Check` for every name, and `Watch`) and `/readyz` say the
/// same thing: Envoy's gRPC health check must see a Redis outage too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_turns_not_serving_with_redis_down_and_back() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let mut redis = RedisServer::start();
    let server = redis_server(&redis).await;
    let mut health = HealthClient::new(server.channel().await);
    let request = |name: &str| HealthCheckRequest {
        service: name.into(),
    };
    let mut watch = health
        .watch(request("envoy.service.ratelimit.v3.RateLimitService"))
        .await
        .expect("watch")
        .into_inner();
    let mut next_watched = async || {
        let message = tokio::time::timeout(Duration::from_secs(20), watch.message())
            .await
            .expect("a health change within 20 s")
            .expect("the watch stream stays open")
            .expect("a message");
        ServingStatus::try_from(message.status).unwrap()
    };
    assert_eq!(next_watched().await, ServingStatus::Serving);

    // Every name (and `/readyz`) until each says `want`, or a deadline.
    let all_become =
        async |want: ServingStatus, health: &mut HealthClient<tonic::transport::Channel>| {
            for name in [
                "",
                "envoy.service.ratelimit.v3.RateLimitService",
                "ratelimit",
            ] {
                eventually_async(&format!("health of {name:?} to be {want:?}"), async || {
                    let status = health.check(request(name)).await.expect("check");
                    status.into_inner().status == want as i32
                })
                .await;
            }
            let readyz = call(&server, "GET", "/readyz", String::new()).await.0;
            assert_eq!(
                readyz == 200,
                want == ServingStatus::Serving,
                "/readyz agrees"
            );
        };

    redis.stop();
    all_become(ServingStatus::NotServing, &mut health).await;
    assert_eq!(next_watched().await, ServingStatus::NotServing);
    redis.restart();
    all_become(ServingStatus::Serving, &mut health).await;
    assert_eq!(next_watched().await, ServingStatus::Serving);
    server.stop().await;
}

/// A server over a Redis that is already stopped, with `policy`.
async fn server_with_redis_down(
    policy: StoreErrorPolicy,
    breaker: BreakerConfig,
) -> (Server, Arc<Metrics>) {
    let mut redis = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let config = RedisStoreConfig {
        tls: sluice::store::RedisTls::default(),
        per_second_url: None,
        coalesce: true,
        url: RedisUrl::new(redis.url()),
        pool_size: 2,
        timeout: Duration::from_millis(200),
        key_prefix: support::unique_prefix(),
        time: TimeSource::Redis,
        breaker: Some(breaker),
    };
    let store = RedisStore::connect(&config, clock.clone(), Duration::from_secs(10))
        .await
        .expect("connect to the test Redis");
    redis.stop();
    let metrics = Arc::new(Metrics::default());
    let options = LimiterOptions {
        on_store_error: policy,
        metrics: metrics.clone(),
        ..LimiterOptions::default()
    };
    let limiter = Arc::new(sluice::decision::Limiter::with_options(
        rules(RULES),
        store,
        options,
    ));
    (
        Server::start_with_limiter(limiter, HeaderMode::Off, clock).await,
        metrics,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_error_policy_decides_what_to_answer() {
    let breaker = BreakerConfig {
        failures: 1_000,
        min_failing: Duration::ZERO,
        cooldown: Duration::from_secs(1),
    };
    for (policy, status, fragment) in [
        (StoreErrorPolicy::Unavailable, 503, "counter store"),
        (StoreErrorPolicy::Allow, 200, r#""overallCode":"OK""#),
        (StoreErrorPolicy::Deny, 429, r#""overallCode":"OVER_LIMIT""#),
    ] {
        let (server, metrics) = server_with_redis_down(policy, breaker).await;
        let (got, body) = call(&server, "POST", "/json", json("admin", "client", "p")).await;
        assert_eq!(got, status, "{policy:?}: {body}");
        assert!(body.contains(fragment), "{policy:?}: {body}");
        let counted = format!(
            r#"sluice_store_error_decisions_total{{policy="{}"}} 1"#,
            policy.name()
        );
        assert!(metrics.encode().contains(&counted), "{policy:?}");
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_fails_fast_without_calling_the_store() {
    let breaker = BreakerConfig {
        failures: 3,
        min_failing: Duration::ZERO,
        cooldown: Duration::from_secs(3_600),
    };
    let (server, metrics) = server_with_redis_down(StoreErrorPolicy::Unavailable, breaker).await;
    for _ in 0..20 {
        assert_eq!(
            call(&server, "POST", "/json", json("admin", "client", "b"))
                .await
                .0,
            503
        );
    }
    let text = metrics.encode();
    assert!(
        text.contains(r#"sluice_store_errors_total{kind="circuit_open"} 17"#),
        "{text}"
    );
    assert_eq!(
        call(&server, "GET", "/readyz", String::new()).await.0,
        503,
        "not ready while open"
    );
    server.stop().await;
}

/// The admitted verdict of one query through the binary's gRPC port.
async fn admitted(addr: &str, domain: &str, key: &str) -> Option<bool> {
    let mut client = sluice::proto::RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .ok()?;
    let r = client
        .should_rate_limit(support::request(domain, &[&[(key, "v")]]))
        .await
        .ok()?
        .into_inner();
    Some(r.statuses[0].current_limit.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_swap_reloads_and_a_broken_file_keeps_the_old_rules() {
    use std::os::unix::fs::symlink;
    // The layout Kubernetes mounts: real files in a timestamped directory,
    // `..data` pointing at it, visible names pointing into `..data`.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let version = |name: &str, yaml: &str| {
        std::fs::create_dir(root.join(name)).unwrap();
        std::fs::write(root.join(name).join("rules.yaml"), yaml).unwrap();
    };
    version(
        "..v1",
        "domain: cm\ndescriptors:\n  - key: old\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
    );
    symlink("..v1", root.join("..data")).unwrap();
    symlink("..data/rules.yaml", root.join("rules.yaml")).unwrap();
    let swap = |name: &str| {
        symlink(name, root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    };
    let rules = root.display().to_string();
    let (_server, grpc, http_addr) = support::start_binary_with_http(&["--rules", &rules]);
    assert_eq!(admitted(&grpc, "cm", "old").await, Some(true));

    // A broken version: the old rules stay in force and the error is counted.
    version(
        "..v2",
        "domain: cm\ndescriptors:\n  - key: new\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n",
    );
    swap("..v2");
    let metrics = move || {
        let (_, text) = http(http_addr, "GET", "/metrics", "");
        text
    };
    eventually_async("the broken reload to be counted", async || {
        tokio::task::spawn_blocking(metrics)
            .await
            .unwrap()
            .contains(r#"sluice_rules_reloads_total{result="error"} 1"#)
    })
    .await;
    assert_eq!(
        admitted(&grpc, "cm", "old").await,
        Some(true),
        "old rules still in force"
    );
    assert_eq!(admitted(&grpc, "cm", "new").await, Some(false));

    // A good version takes effect.
    version(
        "..v3",
        "domain: cm\ndescriptors:\n  - key: new\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
    );
    swap("..v3");
    eventually_async("the good swap to take effect", async || {
        admitted(&grpc, "cm", "new").await == Some(true)
    })
    .await;
    assert_eq!(
        admitted(&grpc, "cm", "old").await,
        Some(false),
        "the old rule is gone"
    );
    assert!(
        tokio::task::spawn_blocking(metrics)
            .await
            .unwrap()
            .contains(r#"sluice_rules_reloads_total{result="success"} 1"#)
    );
}

// ---------------------------------------------------------------------------
// Peeks and the counters endpoint (issue 12, item 4)
// ---------------------------------------------------------------------------

/// A blocking HTTP call with an owned path, off the runtime.
async fn exchange(
    server: &Server,
    method: &'static str,
    path: String,
    body: String,
) -> (u16, String) {
    let addr = server.http;
    tokio::task::spawn_blocking(move || http(addr, method, &path, &body))
        .await
        .unwrap()
}

/// A server over `store` with the `/counters` endpoint on or off.
async fn counters_server<S: sluice::store::CounterStore>(
    store: S,
    clock: Arc<ManualClock>,
    on: bool,
) -> Server {
    let limiter = Arc::new(sluice::decision::Limiter::new(
        rules(RULES),
        store,
        Default::default(),
    ));
    let extras = sluice::server::ServeExtras {
        admin_counters: on,
        ..Default::default()
    };
    Server::start_with_extras(limiter, Default::default(), extras, clock).await
}

fn remaining_in(body: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["statuses"][0]["limitRemaining"]
        .as_u64()
        .or_else(|| v["status"]["limitRemaining"].as_u64())
        .unwrap_or_else(|| panic!("no limitRemaining in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_peek_reads_the_counters_without_charging_them() {
    let server = memory_server(LimiterOptions::default()).await;
    let (status, body) = call(&server, "POST", "/json", json("admin", "client", "p")).await;
    assert_eq!((status, remaining_in(&body)), (200, 4), "{body}");
    for peek in ["/json?peek=true", "/json?peek", "/json?peek=1"] {
        let (status, body) =
            exchange(&server, "POST", peek.into(), json("admin", "client", "p")).await;
        assert_eq!((status, remaining_in(&body)), (200, 4), "{peek}: {body}");
    }
    // A request-level hitsAddend of 0 still means 1; the peek wins over it.
    let zero = r#"{"domain":"admin","hitsAddend":0,"descriptors":[{"entries":[{"key":"client","value":"p"}]}]}"#;
    let (_, body) = exchange(&server, "POST", "/json?peek=true".into(), zero.into()).await;
    assert_eq!(remaining_in(&body), 4, "{body}");
    let (_, body) = exchange(&server, "POST", "/json".into(), zero.into()).await;
    assert_eq!(remaining_in(&body), 3, "{body}");
    let (status, body) = exchange(
        &server,
        "POST",
        "/json?peek=maybe".into(),
        json("admin", "client", "p"),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    server.stop().await;
}

/// A blocked identity is answered from the local over-limit cache; the
/// reset lifts the block in the store and in this replica's cache at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_counters_lifts_a_penalty_block_at_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
    let options = LimiterOptions {
        local_cache: 100,
        clock: clock.clone(),
        ..Default::default()
    };
    let limiter = Arc::new(sluice::decision::Limiter::with_options(
        rules(RULES),
        store,
        options,
    ));
    let extras = sluice::server::ServeExtras {
        admin_counters: true,
        ..Default::default()
    };
    let server = Server::start_with_extras(limiter, Default::default(), extras, clock).await;
    let login = || json("admin", "login", "mallory");
    for expected in [200, 200, 429, 429] {
        let (status, body) = call(&server, "POST", "/json", login()).await;
        assert_eq!(status, expected, "{body}");
    }
    let (_, metrics) = exchange(&server, "GET", "/metrics".into(), String::new()).await;
    assert!(
        metrics.contains("sluice_local_cache_hits_total 1"),
        "the blocked request was answered from the cache: {metrics}"
    );
    let path = "/counters?domain=admin&descriptor=login=mallory";
    let (status, body) = exchange(&server, "DELETE", path.into(), String::new()).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&server, "POST", "/json", login()).await;
    assert_eq!(status, 200, "unblocked at once: {body}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counters_endpoint_is_off_unless_asked_for() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
    let server = counters_server(store, clock, false).await;
    for method in ["GET", "DELETE"] {
        let (status, body) = exchange(
            &server,
            method,
            "/counters?domain=admin&descriptor=client=a".into(),
            String::new(),
        )
        .await;
        assert_eq!(status, 404, "{method}: {body}");
        assert!(body.contains("admin_counters"), "{body}");
    }
    server.stop().await;
}

/// Spends `client=who`'s budget of 5 over /json, checks `/counters` sees it
/// without charging, resets it, and checks the budget is whole again.
async fn inspect_and_reset(server: &Server, who: &str) {
    for _ in 0..5 {
        call(server, "POST", "/json", json("admin", "client", who)).await;
    }
    let (status, _) = call(server, "POST", "/json", json("admin", "client", who)).await;
    assert_eq!(status, 429);
    let path = format!("/counters?domain=admin&descriptor=client={who}");
    for _ in 0..2 {
        let (status, body) = exchange(server, "GET", path.clone(), String::new()).await;
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["rule"], "admin/client", "{body}");
        assert_eq!(
            v["full"], false,
            "a peek at a full counter still fits 0: {body}"
        );
        assert_eq!(v["status"]["limitRemaining"], 0, "{body}");
        assert_eq!(v["status"]["currentLimit"]["name"], "per-client", "{body}");
    }
    let (status, body) = exchange(server, "DELETE", path.clone(), String::new()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""reset":true"#), "{body}");
    let (_, body) = exchange(server, "GET", path, String::new()).await;
    assert_eq!(remaining_in(&body), 5, "{body}");
    let (status, body) = call(server, "POST", "/json", json("admin", "client", who)).await;
    assert_eq!((status, remaining_in(&body)), (200, 4), "{body}");

    // Bad and unknown descriptors.
    for (path, want) in [
        ("/counters?domain=admin", 400),
        ("/counters?descriptor=client=a", 400),
        ("/counters?domain=admin&descriptor=novalue", 400),
    ] {
        let (status, body) = exchange(server, "GET", path.into(), String::new()).await;
        assert_eq!(status, want, "{path}: {body}");
    }
    let (status, body) = exchange(
        server,
        "DELETE",
        "/counters?domain=admin&descriptor=nobody=x".into(),
        String::new(),
    )
    .await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_are_inspected_and_reset_in_memory() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
    let server = counters_server(store, clock, true).await;
    inspect_and_reset(&server, "m").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_are_inspected_and_reset_in_redis() {
    let redis = RedisServer::start();
    let (store, clock) = store_on(&redis).await;
    let server = counters_server(store, clock, true).await;
    inspect_and_reset(&server, "r").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_are_inspected_and_reset_in_a_redis_cluster() {
    let cluster = support::redis::RedisCluster::start();
    let clock = Arc::new(ManualClock::new(T0));
    let store = redis_store(
        &cluster.url(),
        clock.clone(),
        TimeSource::Redis,
        Duration::from_secs(2),
    )
    .await;
    let server = counters_server(store, clock, true).await;
    // Several identities, so their HASHes land in different slots and nodes.
    for who in ["c1", "c2", "c3", "c4"] {
        inspect_and_reset(&server, who).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_carries_the_soft_breach_and_the_upstream_headroom_as_grpc_does() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
    let options = LimiterOptions {
        soft_ratio: Some(sluice::limiter::SoftRatio::new(0.5).unwrap()),
        ..LimiterOptions::default()
    };
    let limiter = Arc::new(sluice::decision::Limiter::with_options(
        rules(RULES),
        store,
        options,
    ));
    let extras = sluice::server::ServeExtras {
        upstream_headroom: true,
        ..Default::default()
    };
    let server = Server::start_with_extras(limiter, Default::default(), extras, clock).await;
    let answer = async || {
        let (status, body) = call(&server, "POST", "/json", json("admin", "client", "j")).await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    // 5 a minute, warned past the default half: not on the 2nd, on the 3rd.
    answer().await;
    let second = answer().await;
    assert!(second.get("responseHeadersToAdd").is_none(), "{second}");
    let third = answer().await;
    assert_eq!(
        third["responseHeadersToAdd"],
        serde_json::json!([{"key": "x-ratelimit-soft-breach", "value": "1"}]),
        "{third}"
    );
    assert_eq!(
        third["requestHeadersToAdd"],
        serde_json::json!([
            {"key": "x-ratelimit-remaining", "value": "2"},
            {"key": "x-ratelimit-name", "value": "per-client"},
        ]),
        "{third}"
    );
    server.stop().await;
}
