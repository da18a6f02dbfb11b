//! End to end over loopback sockets: the server started in process on
//! 127.0.0.1:0 and called with a client generated from Envoy's own published
//! protos (the `envoy-types` crate), so our trimmed `proto/` is checked
//! against the real wire contract. Also health, reflection, the admin HTTP
//! port, concurrency, and the binary as the README starts it.

use crate::support;

use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice::headers::HeaderMode;
use support::eventually::eventually;
use support::{Server, envoy_request, start_binary};

const RULES: &str = r#"
domain: e2e
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 5, name: per-client}
  - key: tenant
    value: big
    rate_limit: {unlimited: true}
"#;

async fn client(server: &Server) -> RateLimitServiceClient<tonic::transport::Channel> {
    RateLimitServiceClient::connect(server.uri())
        .await
        .expect("connect")
}

async fn call(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .expect("answer")
        .into_inner()
}

#[tokio::test]
async fn envoy_client_gets_codes_limits_remaining_and_reset() {
    let server = Server::start(RULES, HeaderMode::Draft03).await;
    let mut c = client(&server).await;
    let r = call(
        &mut c,
        envoy_request("e2e", &[&[("client", "a")], &[("tenant", "big")]]),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let s = &r.statuses[0];
    let limit = s.current_limit.as_ref().expect("current limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit, limit.name.as_str()),
        (5, Unit::Minute as i32, "per-client")
    );
    assert_eq!(s.limit_remaining, 4);
    let reset = s.duration_until_reset.expect("reset");
    assert!(reset.seconds > 0 && reset.seconds <= 66, "{reset:?}");
    assert_eq!(r.statuses[1].limit_remaining, u32::MAX);
    let names: Vec<&str> = r
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset"
        ]
    );
    for _ in 0..4 {
        call(&mut c, envoy_request("e2e", &[&[("client", "a")]])).await;
    }
    let r = call(&mut c, envoy_request("e2e", &[&[("client", "a")]])).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].code),
        (Code::OverLimit as i32, Code::OverLimit as i32)
    );
    server.stop().await;
}

#[tokio::test]
async fn descriptor_hits_addend_travels_as_a_wrapper_message() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let mut c = client(&server).await;
    let mut req = envoy_request("e2e", &[&[("client", "w")]]);
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 4 });
    assert_eq!(
        call(&mut c, req.clone()).await.statuses[0].limit_remaining,
        1
    );
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    let r = call(&mut c, req).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 1),
        "check only"
    );
    server.stop().await;
}

#[tokio::test]
async fn invalid_requests_get_invalid_argument_over_the_wire() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let mut c = client(&server).await;
    let err = c
        .should_rate_limit(envoy_request("", &[&[("client", "a")]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = c
        .should_rate_limit(envoy_request("e2e", &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_calls_against_a_limit_of_five_admit_exactly_five() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let channel = server.channel().await;
    let calls = (0..200).map(|_| {
        let mut c = RateLimitServiceClient::new(channel.clone());
        tokio::spawn(async move {
            c.should_rate_limit(envoy_request("e2e", &[&[("client", "hot")]]))
                .await
                .unwrap()
                .into_inner()
        })
    });
    let mut admitted = 0;
    for call in calls.collect::<Vec<_>>() {
        if call.await.unwrap().overall_code == Code::Ok as i32 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5);
    server.stop().await;
}

#[tokio::test]
async fn grpc_health_reports_serving_for_every_service_name() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let server = Server::start(RULES, HeaderMode::Off).await;
    let mut health = HealthClient::new(server.channel().await);
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "ratelimit",
    ] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn reflection_lists_the_rate_limit_service() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let names = server.reflected_services().await;
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_http_answers_healthz_on_its_own_port() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let http = server.http;
    let (status, body) =
        tokio::task::spawn_blocking(move || support::http(http, "GET", "/healthz", ""))
            .await
            .unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    server.stop().await;
}

#[test]
fn the_binary_serves_the_example_rules_with_no_options_and_query_prints_the_decision() {
    let (server, addr) = start_binary(&[]);
    let query = |descriptor: &str| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([
                "query",
                "--addr",
                &addr,
                "--domain",
                "example",
                "--descriptor",
                descriptor,
            ])
            .output()
            .expect("run query")
    };
    let out = query("remote_address=192.0.2.7");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.starts_with("OK"), "{text}");
    assert!(
        text.contains("limit 10 per minute (per-address)  remaining 9"),
        "{text}"
    );
    for _ in 0..9 {
        assert_eq!(query("remote_address=192.0.2.7").status.code(), Some(0));
    }
    let out = query("remote_address=192.0.2.7");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "over limit exits 1: {text}");
    assert!(text.starts_with("OVER_LIMIT"), "{text}");
    drop(server);
}

#[test]
fn the_binary_stops_cleanly_on_sigterm() {
    let (mut server, _) = start_binary(&[]);
    let pid = server.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = server.0.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn the_binary_refuses_to_start_on_broken_rules() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    let path = path.display().to_string();
    let out = support::serve_command(&["--rules", &path])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.yaml:4: x/a: invalid rate limit unit 'fortnight'"),
        "{stderr}"
    );
}

#[test]
fn sigterm_does_not_wait_forever_for_an_open_stream() {
    let (mut server, addr) = start_binary(&["--shutdown-grace-ms", "300"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // A health Watch stays open until the server ends it.
    let _stream = runtime.block_on(async {
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_client::HealthClient;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel);
        health
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
    });
    let pid = server.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // A guard against a hang, far above the 300 ms grace.
    let status = eventually("sluice to exit after SIGTERM", || {
        server.0.try_wait().unwrap()
    });
    assert!(status.success(), "{status:?}");
}

// ---------------------------------------------------------------------------
// Explained refusals, peeks and what Envoy derives from a status (issue 12)
// ---------------------------------------------------------------------------

const EXPLAINED: &str = r#"
domain: why
descriptors:
  - key: api_key
    metadata: {service: {name: billing, tier: 2}}
    rate_limits:
      - {name: per-minute, unit: minute, requests_per_unit: 100}
      - {name: min-gap, unit: 2s, requests_per_unit: 1, algorithm: sliding_log}
  - key: plan
    metadata: {service: {name: other, region: eu}, owner: team-b}
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 20}
"#;

async fn explained_server(extras: sluice::server::ServeExtras) -> Server {
    use std::sync::Arc;
    let clock = Arc::new(sluice::limiter::ManualClock::new(support::T0));
    let store = sluice::store::MemoryStore::new(
        &sluice::store::MemoryStoreConfig::default(),
        clock.clone(),
    );
    let limiter = Arc::new(sluice::decision::Limiter::new(
        support::rules(EXPLAINED),
        store,
        Default::default(),
    ));
    Server::start_with_extras(limiter, Default::default(), extras, clock).await
}

/// A protobuf `Struct` from Envoy's protos as JSON, to compare whole.
fn struct_json(s: &envoy_types::pb::google::protobuf::Struct) -> serde_json::Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    fn value(v: &envoy_types::pb::google::protobuf::Value) -> serde_json::Value {
        match &v.kind {
            Some(Kind::NullValue(_)) | None => serde_json::Value::Null,
            Some(Kind::BoolValue(b)) => serde_json::json!(b),
            Some(Kind::NumberValue(n)) => serde_json::json!(n),
            Some(Kind::StringValue(s)) => serde_json::json!(s),
            Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
            Some(Kind::StructValue(s)) => struct_json(s),
        }
    }
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[tokio::test]
async fn a_refusal_names_the_descriptor_and_limit_in_dynamic_metadata() {
    let server = explained_server(Default::default()).await;
    let mut c = client(&server).await;
    let request = || envoy_request("why", &[&[("plan", "free")], &[("api_key", "k1")]]);
    let first = call(&mut c, request()).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(
        first.dynamic_metadata, None,
        "nothing to explain when admitted"
    );
    assert!(first.raw_body.is_empty());

    // 1 per 2 s on api_key: the second call is refused by `min-gap`.
    let second = call(&mut c, request()).await;
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    let metadata = struct_json(second.dynamic_metadata.as_ref().expect("dynamic_metadata"));
    assert_eq!(
        metadata,
        serde_json::json!({"refused": {
            "index": 1.0,
            "descriptor": "api_key=k1",
            "reason": "over_limit",
            "limit": "min-gap",
            "rule": "why/api_key",
            "requests_per_unit": 1.0,
            "window": "2s",
            "algorithm": "sliding_log",
            "retry_after_seconds": 2.0,
        }}),
    );
    assert!(second.raw_body.is_empty(), "no body unless asked");
    server.stop().await;
}

#[tokio::test]
async fn upstream_dynamic_metadata_and_a_problem_body_when_asked() {
    let server = explained_server(sluice::server::ServeExtras {
        dynamic_metadata: true,
        problem_body: true,
        ..Default::default()
    })
    .await;
    let mut c = client(&server).await;
    let mut request = envoy_request("why", &[&[("plan", "free")], &[("api_key", "k1")]]);
    request.hits_addend = 1;
    request.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
    let first = call(&mut c, request.clone()).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    // envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA: the rules' metadata
    // merged (structs recursively, the first descriptor's value winning).
    assert_eq!(
        struct_json(first.dynamic_metadata.as_ref().expect("dynamic_metadata")),
        serde_json::json!({
            "domain": "why",
            "descriptors": [
                {"entries": ["plan=free"], "hitsAddend": 1.0},
                {"entries": ["api_key=k1"]},
            ],
            "hitsAddend": 1.0,
            "metadata": {
                "service": {"name": "other", "region": "eu", "tier": 2.0},
                "owner": "team-b",
            },
        })
    );
    assert!(first.raw_body.is_empty());

    let second = call(&mut c, request).await;
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    let metadata = struct_json(second.dynamic_metadata.as_ref().unwrap());
    assert_eq!(
        metadata["metadata"],
        serde_json::json!({"service": {"name": "other", "region": "eu"}, "owner": "team-b"}),
        "only the descriptors that were not over limit lend their metadata"
    );
    assert_eq!(metadata["refused"]["limit"], "min-gap");
    let body: serde_json::Value = serde_json::from_slice(&second.raw_body).expect("JSON body");
    assert_eq!(body["status"], 429);
    assert_eq!(body["title"], "Too Many Requests");
    assert_eq!(body["limit"], "min-gap");
    assert_eq!(body["retry_after_seconds"], 2);
    assert_eq!(body["descriptor"], "api_key=k1");
    let content_type: Vec<&str> = second
        .response_headers_to_add
        .iter()
        .filter(|h| h.key == "content-type")
        .map(|h| h.value.as_str())
        .collect();
    assert_eq!(content_type, ["application/problem+json"]);
    assert!(
        !first
            .response_headers_to_add
            .iter()
            .any(|h| h.key == "content-type"),
        "an admitted request's response keeps the application's content-type"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_token_bucket_never_reports_more_than_its_limit_or_a_zero_reset_when_refusing() {
    let server = Server::start(EXPLAINED, HeaderMode::Draft03).await;
    let mut c = client(&server).await;
    let request = || envoy_request("why", &[&[("tenant", "acme")]]);
    // 5 per second, bursts of 20: 20 tokens at first, reported as at most 5.
    for i in 0..20 {
        let r = call(&mut c, request()).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "request {i}");
        let remaining = r.statuses[0].limit_remaining;
        assert_eq!(remaining, (19 - i).min(5), "request {i}");
        let header = |name: &str| {
            r.response_headers_to_add
                .iter()
                .find(|h| h.key == name)
                .map(|h| h.value.clone())
                .unwrap()
        };
        assert_eq!(header("x-ratelimit-remaining"), remaining.to_string());
    }
    // Refused: the next token is 200 ms away, reported as 1 s, never 0
    // (Envoy keeps only the seconds of duration_until_reset).
    let r = call(&mut c, request()).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let reset = r.statuses[0].duration_until_reset.expect("reset");
    assert_eq!((reset.seconds, reset.nanos), (1, 0));
    server.stop().await;
}

#[tokio::test]
async fn query_peek_reads_the_counters_without_charging_them() {
    use sluice::query::{QueryArgs, query};
    let server = explained_server(Default::default()).await;
    let args = |peek: bool| QueryArgs {
        addr: server.grpc.to_string(),
        domain: "why".into(),
        descriptors: vec!["plan=free".parse().unwrap()],
        hits: None,
        peek,
        timeout: 5_000,
        tls: Default::default(),
    };
    for _ in 0..3 {
        let r = query(&args(true)).await.expect("answer");
        assert_eq!(r.statuses[0].limit_remaining, 10, "a peek charges nothing");
    }
    let r = query(&args(false)).await.expect("answer");
    assert_eq!(r.statuses[0].limit_remaining, 9);
    let r = query(&args(true)).await.expect("answer");
    assert_eq!(r.statuses[0].limit_remaining, 9);

    // A refusal is printed with the limit that refused it.
    let gap = QueryArgs {
        descriptors: vec!["api_key=k9".parse().unwrap()],
        ..args(false)
    };
    query(&gap).await.expect("answer");
    let r = query(&gap).await.expect("answer");
    let text = sluice::query::render(&gap, &r);
    assert!(
        text.contains("refused by min-gap (1 per 2s, sliding_log) on [0] api_key=k9; retry in 2 s"),
        "{text}"
    );
    server.stop().await;
}

/// `sluice::app::run` builds the service a set of settings describes (here:
/// a rules file, the memory store) on listeners the caller bound, serves
/// until the token is cancelled, and then returns.
#[tokio::test]
async fn app_run_serves_what_the_settings_describe_until_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let env: config::Map<String, String> =
        [("SLUICE_RULES".to_owned(), rules.display().to_string())].into();
    let settings = sluice::settings::Settings::load_from(
        None,
        &sluice::settings::SettingsFlags::default(),
        Some(env),
    )
    .expect("settings")
    .settings;
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let listeners = sluice::server::Listeners::bind(loopback, loopback)
        .await
        .unwrap();
    let grpc = listeners.grpc_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let served = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { sluice::app::run(&settings, listeners, shutdown).await }
    });

    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    let codes: Vec<i32> = {
        let mut codes = Vec::new();
        for _ in 0..6 {
            let response = client
                .should_rate_limit(envoy_request("e2e", &[&[("client", "a")]]))
                .await
                .expect("a decision")
                .into_inner();
            codes.push(response.overall_code);
        }
        codes
    };
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, [ok, ok, ok, ok, ok, over], "the file's 5/minute");

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), served)
        .await
        .expect("run returns after shutdown")
        .expect("no panic")
        .expect("no error");
}

/// `sluice query` against the binary, as a person runs it: exit code and
/// stdout.
fn run_query(addr: &str, domain: &str, descriptors: &[&str]) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command.args(["query", "--addr", addr, "--domain", domain]);
    for d in descriptors {
        command.args(["--descriptor", d]);
    }
    let out = command.output().expect("run query");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn query_prints_a_five_minute_window_as_the_server_gives_it() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("five.yaml");
    std::fs::write(
        &rules,
        "domain: five\ndescriptors:\n  - key: client\n    rate_limit: {unit: 5m, requests_per_unit: 2}\n",
    )
    .unwrap();
    let rules = rules.display().to_string();
    // With rate-limit headers the window is in every answer.
    let (server, addr) = start_binary(&["--rules", &rules, "--response-headers", "draft03"]);
    let (code, text) = run_query(&addr, "five", &["client=a"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("OK  limit 2 per 5m  remaining 1"), "{text}");
    drop(server);
    // Without them, only a refusal says it; an admitted answer says that
    // it does not.
    let (server, addr) = start_binary(&["--rules", &rules]);
    let (_, text) = run_query(&addr, "five", &["client=a"]);
    assert!(
        text.contains("limit 2 per window (a length the answer does not give)  remaining 1"),
        "{text}"
    );
    run_query(&addr, "five", &["client=a"]);
    let (code, text) = run_query(&addr, "five", &["client=a"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("OVER_LIMIT  limit 2 per 5m  remaining 0"),
        "{text}"
    );
    assert!(
        text.contains("refused by five/client (2 per 5m, sliding_window)"),
        "{text}"
    );
    drop(server);
}

#[test]
fn query_under_on_store_error_deny_says_the_store_failed() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("five.yaml");
    std::fs::write(
        &rules,
        "domain: five\ndescriptors:\n  - key: client\n    rate_limit: {unit: 5m, requests_per_unit: 2}\n",
    )
    .unwrap();
    // A Redis nobody listens on.
    let dead = format!("redis://127.0.0.1:{}", support::redis::free_port());
    let (server, addr) = start_binary(&[
        "--rules",
        &rules.display().to_string(),
        "--redis-url",
        &dead,
        "--on-store-error",
        "deny",
    ]);
    let (code, text) = run_query(&addr, "five", &["client=a", "other=b"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(!text.contains("no limit applies"), "{text}");
    assert!(
        text.contains("[0] client=a  OVER_LIMIT  not counted: the counter store failed\n"),
        "{text}"
    );
    assert!(
        text.contains("[1] other=b  OK  no limit reported\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "refused: the counter store failed and the server denies (on_store_error: deny)"
        ),
        "{text}"
    );
    drop(server);
}
