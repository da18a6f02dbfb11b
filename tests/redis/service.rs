//! The service over real Redis processes started by the test harness:
//! replicas sharing one Redis or one Cluster admit exactly the limit, hostile
//! descriptor values never collide, a killed or hung Redis gives UNAVAILABLE
//! (never a hang) and recovery is clean, a refund that fails shows on the
//! metrics page, ACL auth works, and each request is one script call that
//! does not touch the TTL on every hit.

use crate::support;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::headers::HeaderMode;
use sluice::limiter::ManualClock;
use sluice::store::{RedisStore, RedisStoreConfig, RedisUrl, TimeSource};
use support::eventually::eventually_async;
use support::redis::{RedisServer, shared, shared_cluster};
use support::{Server, T0, start_binary};
use tonic::transport::Channel;

const RULES: &str = r#"
domain: redis
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: fixed
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: fixed_window}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: token_bucket}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_log}
  - key: calendar
    rate_limit: {unit: month, requests_per_unit: 5, calendar: Europe/Paris}
  - key: penalty
    rate_limit:
      unit: minute
      requests_per_unit: 5
      penalty: {block: 15m, escalate: 2}
  - key: a_b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: three
    rate_limits:
      - {unit: second, requests_per_unit: 100}
      - {unit: minute, requests_per_unit: 1000}
      - {unit: hour, requests_per_unit: 10000}
"#;

/// RULES written to a file, for the `sluice` binary's `--rules`.
fn rules_file() -> &'static str {
    static PATH: OnceLock<(tempfile::TempDir, String)> = OnceLock::new();
    &PATH
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("rules.yaml");
            std::fs::write(&path, RULES).unwrap();
            let text = path.display().to_string();
            (dir, text)
        })
        .1
}

/// A request in the `redis` domain of these tests.
fn request_redis(descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    support::envoy_request("redis", descriptors)
}

async fn connect(addr: &str) -> RateLimitServiceClient<Channel> {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    RateLimitServiceClient::connect(uri)
        .await
        .expect("connect to sluice")
}

/// A server over `url` in Redis-time mode, with its own key prefix.
async fn server_on(url: &str, timeout: Duration) -> Server {
    server_sharing(url, timeout, &support::unique_prefix()).await
}

/// A server over `url` using `prefix`: servers given one prefix share counters.
async fn server_sharing(url: &str, timeout: Duration, prefix: &str) -> Server {
    let clock = Arc::new(ManualClock::new(T0));
    let config = RedisStoreConfig {
        tls: sluice::store::RedisTls::default(),
        per_second_url: None,
        coalesce: true,
        url: RedisUrl::new(url),
        pool_size: 2,
        timeout,
        breaker: None,
        key_prefix: prefix.to_owned(),
        time: TimeSource::Redis,
    };
    let store = RedisStore::connect(&config, clock.clone(), Duration::from_secs(10))
        .await
        .expect("connect");
    Server::start_with_store(RULES, HeaderMode::Off, store, clock).await
}

/// Fires `n` copies of `request` at once, round-robin over `clients`, and
/// counts the admitted ones.
async fn concurrent_admitted(
    clients: &[RateLimitServiceClient<Channel>],
    n: usize,
    request: &RateLimitRequest,
) -> usize {
    let calls: Vec<_> = (0..n)
        .map(|i| {
            let mut c = clients[i % clients.len()].clone();
            let req = request.clone();
            tokio::spawn(async move {
                c.should_rate_limit(req)
                    .await
                    .expect("answer")
                    .into_inner()
                    .overall_code
            })
        })
        .collect();
    let mut admitted = 0;
    for call in calls {
        if call.await.unwrap() == Code::Ok as i32 {
            admitted += 1;
        }
    }
    admitted
}

/// Fires 200 concurrent calls for one value of descriptor `key`, alternating
/// between `addrs`, and counts the admitted ones.
async fn admitted_of_200(addrs: &[String], key: &str, value: &str) -> usize {
    let mut clients = Vec::new();
    for addr in addrs {
        clients.push(connect(addr).await);
    }
    concurrent_admitted(&clients, 200, &request_redis(&[&[(key, value)]])).await
}

/// Two `sluice` binaries on `url` with one key prefix; for every algorithm
/// (limit 5: `client` sliding window, `fixed`, `bucket` token bucket with a
/// burst of 5, `log` sliding log, `calendar` a month in Paris, `penalty` a
/// sliding window with a penalty box), rounds of 200 concurrent calls must
/// each admit exactly 5. The fixed window is a day and the bucket refills
/// one token in 12 minutes, so no window edge or refill falls inside a
/// round. The 195 refusals of a penalty box's round are one offence: the
/// block is the first one, 15 minutes, not a doubled one.
async fn two_replicas_admit_exactly_the_limit(url: &str) {
    let prefix = support::unique_prefix();
    let args = [
        "--rules",
        rules_file(),
        "--redis-url",
        url,
        "--redis-key-prefix",
        &prefix,
        "--redis-timeout-ms",
        "2000",
    ];
    let (_a, addr_a) = start_binary(&args);
    let (_b, addr_b) = start_binary(&args);
    let addrs = [addr_a, addr_b];
    for key in ["client", "fixed", "bucket", "log", "calendar", "penalty"] {
        for round in 0..2 {
            let admitted = admitted_of_200(&addrs, key, &format!("hot-{round}")).await;
            assert_eq!(admitted, 5, "{key}, round {round}");
        }
    }
    for addr in &addrs {
        let request = request_redis(&[&[("penalty", "hot-0")]]);
        let answer = connect(addr)
            .await
            .should_rate_limit(request)
            .await
            .expect("answer")
            .into_inner();
        let status = &answer.statuses[0];
        assert_eq!(status.code, Code::OverLimit as i32);
        let left = status
            .duration_until_reset
            .expect("the block's time")
            .seconds;
        assert!(
            (800..=900).contains(&left),
            "one offence, a 15-minute block: {left} s"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_one_redis_admit_exactly_the_limit() {
    two_replicas_admit_exactly_the_limit(&shared().url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_one_redis_cluster_admit_exactly_the_limit() {
    two_replicas_admit_exactly_the_limit(&shared_cluster().url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_spanning_cluster_slots_is_all_or_nothing_across_replicas() {
    let prefix = support::unique_prefix();
    let a = server_sharing(&shared_cluster().url(), Duration::from_secs(2), &prefix).await;
    let b = server_sharing(&shared_cluster().url(), Duration::from_secs(2), &prefix).await;
    let (mut ca, mut cb) = (connect(&a.uri()).await, connect(&b.uri()).await);
    // Ten clients spread over the slots, each also limited to 5.
    let clients: Vec<String> = (0..10).map(|i| format!("spread-{i}")).collect();
    let descriptors: Vec<Vec<(&str, &str)>> = clients
        .iter()
        .map(|c| vec![("client", c.as_str())])
        .collect();
    let slices: Vec<&[(&str, &str)]> = descriptors.iter().map(Vec::as_slice).collect();
    let admitted =
        concurrent_admitted(&[ca.clone(), cb.clone()], 60, &request_redis(&slices)).await;
    // Never beyond the limit. Concurrent requests may see hits that are about
    // to be refunded and be rejected (the documented transient: in a burst
    // like this one, even all of them), but every counter must hold exactly
    // the admitted requests once the refunds are in.
    assert!(admitted <= 5, "admitted {admitted}");
    for client in &clients {
        let mut check = request_redis(&[&[("client", client)]]);
        check.descriptors[0].hits_addend =
            Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
        let r = cb.should_rate_limit(check).await.unwrap().into_inner();
        assert_eq!(
            r.statuses[0].limit_remaining as usize,
            5 - admitted,
            "{client}"
        );
    }
    // Without contention the multi-slot path admits exactly up to the limit.
    for n in admitted..5 {
        let r = ca
            .should_rate_limit(request_redis(&slices))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32, "request {} of 5", n + 1);
    }
    let r = ca
        .should_rate_limit(request_redis(&slices))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn hostile_values_never_share_a_counter_or_choose_a_slot() {
    let server = server_on(&shared().url(), Duration::from_secs(2)).await;
    let mut c = connect(&server.uri()).await;
    // envoyproxy/ratelimit's `domain_key_value_` keys make these two collide.
    assert_eq!(
        c.should_rate_limit(request_redis(&[&[("a_b", "c")]]))
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        Code::Ok as i32
    );
    assert_eq!(
        c.should_rate_limit(request_redis(&[&[("a", "b_c")]]))
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        Code::Ok as i32
    );
    let long = "v".repeat(10_000);
    let longer = format!("{long}v");
    let values = [
        "{x}",
        "x}",
        "{",
        "}{",
        "{}",
        "a:b",
        "a:b:",
        ":",
        "a\nb",
        "a\r\nb",
        "a\0b",
        "a\0",
        "ü",
        "日本",
        "🦀",
        "",
        " ",
        "*",
        "%",
        long.as_str(),
        longer.as_str(),
    ];
    for v in values {
        let r = c
            .should_rate_limit(request_redis(&[&[("k", v)]]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.overall_code,
            Code::Ok as i32,
            "first hit of {:?} shared a counter",
            &v[..v.len().min(20)]
        );
    }
    for v in values {
        let r = c
            .should_rate_limit(request_redis(&[&[("k", v)]]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.overall_code,
            Code::OverLimit as i32,
            "second hit of {:?} was not counted",
            &v[..v.len().min(20)]
        );
    }
    let keys = shared().command(&["KEYS", "*"]);
    let ours: Vec<&str> = keys.lines().filter(|k| k.contains("test:")).collect();
    assert!(ours.len() >= values.len() + 2, "{keys}");
    for key in ours {
        assert_eq!(
            (key.matches('{').count(), key.matches('}').count()),
            (1, 1),
            "{key}"
        );
        assert!(key.len() < 200, "bounded key length: {} bytes", key.len());
    }
    server.stop().await;
}

/// Calls until the answer is OK (waits for a process to come back, not for
/// time to pass), returning the first OK response.
async fn until_ok(
    c: &mut RateLimitServiceClient<Channel>,
    req: &RateLimitRequest,
) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse {
    eventually_async("an OK answer (recovery)", async || {
        c.should_rate_limit(req.clone())
            .await
            .map(|r| r.into_inner())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_gives_unavailable_fast_and_recovery_is_clean() {
    let mut redis = RedisServer::start();
    let server = server_on(&redis.url(), Duration::from_millis(250)).await;
    let mut c = connect(&server.uri()).await;
    let req = request_redis(&[&[("client", "k")]]);
    assert_eq!(
        c.should_rate_limit(req.clone())
            .await
            .unwrap()
            .into_inner()
            .statuses[0]
            .limit_remaining,
        4
    );

    redis.stop();
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let start = Instant::now();
        // A guard against hangs, not a latency assertion.
        let answer = tokio::time::timeout(Duration::from_secs(5), c.should_rate_limit(req.clone()))
            .await
            .expect("a request must never hang while Redis is down");
        slowest = slowest.max(start.elapsed());
        assert_eq!(answer.unwrap_err().code(), tonic::Code::Unavailable);
    }
    eprintln!("slowest error while Redis was down: {slowest:?}");

    // The new Redis is empty and has no scripts cached (NOSCRIPT is handled).
    // A retry that timed out while Redis came back may still have run, so
    // this key's count is only known to have started again.
    redis.restart();
    let r = until_ok(&mut c, &req).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(r.statuses[0].limit_remaining <= 4, "{r:?}");
    // A key no request touched during the outage counts exactly.
    let fresh = request_redis(&[&[("client", "after")]]);
    for remaining in [4, 3] {
        let r = c
            .should_rate_limit(fresh.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.statuses[0].limit_remaining, remaining,
            "counting resumed exactly"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_times_out_as_unavailable_and_recovers() {
    let redis = RedisServer::start();
    let server = server_on(&redis.url(), Duration::from_millis(100)).await;
    let mut c = connect(&server.uri()).await;
    let req = request_redis(&[&[("client", "h")]]);
    assert_eq!(
        c.should_rate_limit(req.clone())
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        Code::Ok as i32
    );
    redis.pause();
    for _ in 0..5 {
        let answer = tokio::time::timeout(Duration::from_secs(5), c.should_rate_limit(req.clone()))
            .await
            .expect("a request must never hang while Redis is hung");
        assert_eq!(answer.unwrap_err().code(), tonic::Code::Unavailable);
    }
    redis.resume();
    // The timed-out calls had reached Redis's socket; it runs them when it
    // resumes, and they count (up to the limit) until the store, which told
    // their callers UNAVAILABLE, refunds them in the background. Watch with
    // check-only requests (weight 0: they count nothing) until every refund
    // is in: only the first request stays counted.
    let mut check = req.clone();
    check.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    eventually_async("the timed-out calls to be refunded", async || {
        let r = until_ok(&mut c, &check).await;
        (r.statuses[0].limit_remaining == 4)
            .then_some(())
            .ok_or(format!("{r:?}"))
    })
    .await;
    // The next request is the second one counted.
    let r = c.should_rate_limit(req.clone()).await.unwrap().into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    assert_eq!(r.statuses[0].limit_remaining, 3, "{r:?}");
    assert_eq!(answer(&mut c, "h2").await, (Code::Ok as i32, 4));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_that_fails_is_counted_on_the_metrics_page() {
    let redis = RedisServer::start();
    let url = redis.url();
    let (_sluice, grpc, http) = support::start_binary_with_http(&[
        "--rules",
        rules_file(),
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "50",
    ]);
    let mut c = connect(&grpc).await;
    let req = request_redis(&[&[("client", "spoiled")]]);
    // A first request makes the counter, so that its key can be named.
    let first = c.should_rate_limit(req.clone()).await.unwrap().into_inner();
    assert_eq!(first.overall_code, Code::Ok as i32, "{first:?}");
    let keys = redis.query(&["KEYS", "*"]);
    let [support::redis::Reply::Bulk(key)] = keys.items() else {
        panic!("one counter: {keys:?}")
    };
    let key = String::from_utf8_lossy(key).into_owned();

    let answer = redis.spoil_refund(&key, c.should_rate_limit(req)).await;
    assert_eq!(answer.unwrap_err().code(), tonic::Code::Unavailable);
    let metric = "sluice_store_refund_failures_total 1";
    eventually_async(&format!("`{metric}` on the metrics page"), async || {
        let (_, page) =
            tokio::task::spawn_blocking(move || support::http(http, "GET", "/metrics", ""))
                .await
                .unwrap();
        page.lines().any(|l| l == metric).then_some(()).ok_or(page)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_set_apart_from_the_url_authenticates() {
    // What the redis-cluster overlay does: the URL without credentials, the
    // password (with characters special in a URL) in its own setting.
    let password = "p@ss:w/rd %";
    let redis = RedisServer::start_with(&["--requirepass", password]);
    let (_sluice, addr) = start_binary(&[
        "--rules",
        rules_file(),
        "--redis-url",
        &redis.url(),
        "--redis-password",
        password,
    ]);
    let mut c = connect(&addr).await;
    assert_eq!(answer(&mut c, "apart").await, (Code::Ok as i32, 4));
}

#[tokio::test]
async fn acl_users_authenticate_and_wrong_passwords_fail_unavailable() {
    let redis = RedisServer::start_with(&[
        "--user",
        "default",
        "off",
        "--user",
        "alice",
        "on",
        ">s3cret:@/",
        "~*",
        "&*",
        "+@all",
    ]);
    let good = server_on(
        &redis.url_with_auth("alice", "s3cret:@/"),
        Duration::from_secs(2),
    )
    .await;
    let mut c = connect(&good.uri()).await;
    assert_eq!(answer(&mut c, "acl").await, (Code::Ok as i32, 4));
    good.stop().await;

    let clock = Arc::new(ManualClock::new(T0));
    let config = sluice::store::RedisStoreConfig {
        tls: sluice::store::RedisTls::default(),
        per_second_url: None,
        coalesce: true,
        url: sluice::store::RedisUrl::new(redis.url_with_auth("alice", "wrong")),
        pool_size: 1,
        timeout: Duration::from_millis(500),
        breaker: None,
        key_prefix: support::unique_prefix(),
        time: TimeSource::Redis,
    };
    let store = sluice::store::RedisStore::connect(&config, clock.clone(), Duration::from_secs(2))
        .await
        .unwrap();
    let bad = Server::start_with_store(RULES, HeaderMode::Off, store, clock).await;
    let mut c = connect(&bad.uri()).await;
    let err = c
        .should_rate_limit(request_redis(&[&[("client", "acl")]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    bad.stop().await;
}

/// `(overall_code, limit_remaining)` of one request for `client=<name>`.
async fn answer(c: &mut RateLimitServiceClient<Channel>, name: &str) -> (i32, u32) {
    let r = c
        .should_rate_limit(request_redis(&[&[("client", name)]]))
        .await
        .unwrap()
        .into_inner();
    (r.overall_code, r.statuses[0].limit_remaining)
}

/// `cmdstat_<name>` calls from `INFO commandstats`.
fn calls(redis: &RedisServer, command: &str) -> u64 {
    support::redis::command_calls(redis.port(), command)
}

#[tokio::test]
async fn each_request_is_one_script_call_that_moves_the_ttl_only_when_needed() {
    let redis = RedisServer::start();
    let server = server_on(&redis.url(), Duration::from_secs(2)).await;
    let mut c = connect(&server.uri()).await;
    c.should_rate_limit(request_redis(&[&[("three", "warm-up")]]))
        .await
        .unwrap();
    redis.command(&["CONFIG", "RESETSTAT"]);
    for i in 0..10 {
        let req = request_redis(&[
            &[("three", "t")],
            &[("client", "c")],
            &[("a", &format!("x{}", i % 2))],
        ]);
        c.should_rate_limit(req).await.unwrap();
    }
    assert_eq!(
        calls(&redis, "evalsha"),
        10,
        "one EVALSHA per request, with every descriptor"
    );
    assert_eq!(calls(&redis, "eval"), 0);
    // Ten hits within one bucket of each window: each of the four keys gets
    // its TTL set once, not on every hit (PEXPIREAT with Redis's clock,
    // PEXPIRE with the service's).
    let ttls = calls(&redis, "pexpire") + calls(&redis, "pexpireat");
    assert!((4..=4 + 2).contains(&ttls), "TTL calls: {ttls}");
    assert_eq!(calls(&redis, "expire"), 0);
    server.stop().await;
}

#[tokio::test]
async fn every_counter_expires_from_its_first_hit() {
    // One request the script's fast path takes (one descriptor) and one it
    // leaves to its general path (a descriptor named twice): every key they
    // create must carry a TTL at once, or an identity seen once would stay
    // in Redis forever.
    let redis = RedisServer::start();
    let server = server_on(&redis.url(), Duration::from_secs(2)).await;
    let mut c = connect(&server.uri()).await;
    c.should_rate_limit(request_redis(&[&[("client", "once")]]))
        .await
        .unwrap();
    c.should_rate_limit(request_redis(&[
        &[("three", "once")],
        &[("three", "once")],
        &[("a", "once")],
    ]))
    .await
    .unwrap();
    let keys = support::redis::query(redis.port(), &["KEYS", "*"]);
    assert_eq!(keys.items().len(), 3, "{keys:?}");
    for key in keys.items() {
        let support::redis::Reply::Bulk(name) = key else {
            panic!("{key:?}")
        };
        let name = String::from_utf8_lossy(name).into_owned();
        let ttl = support::redis::query(redis.port(), &["PTTL", &name]);
        assert!(
            matches!(ttl, support::redis::Reply::Integer(ms) if ms > 0),
            "{name} has PTTL {ttl:?}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_hot_over_limit_key_costs_redis_nothing_until_it_can_fit_again() {
    use sluice::decision::{Limiter, LimiterOptions};
    use sluice::limiter::Clock as _;
    let redis = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0 + 30_000)); // mid-minute
    let prefix = support::unique_prefix();
    let store = || {
        let config = RedisStoreConfig {
            tls: sluice::store::RedisTls::default(),
            per_second_url: None,
            coalesce: true,
            url: RedisUrl::new(redis.url()),
            pool_size: 1,
            timeout: Duration::from_secs(2),
            breaker: None,
            key_prefix: prefix.clone(),
            time: TimeSource::Local,
        };
        let clock = clock.clone();
        async move {
            RedisStore::connect(&config, clock, Duration::from_secs(10))
                .await
                .unwrap()
        }
    };
    let yaml = "domain: redis\ndescriptors:\n  - key: fixed\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}\n  - key: sliding\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let options = LimiterOptions {
        local_cache: 1_000,
        clock: clock.clone(),
        ..LimiterOptions::default()
    };
    let cached = Arc::new(Limiter::with_options(
        support::rules(yaml),
        store().await,
        options,
    ));
    // The same counters without a cache: a weight-0 request there is a
    // read-only look at what Redis holds.
    let direct = Arc::new(Limiter::new(
        support::rules(yaml),
        store().await,
        Default::default(),
    ));
    let server = Server::start_with_limiter(cached.clone(), HeaderMode::Off, clock.clone()).await;
    let probe = Server::start_with_limiter(direct, HeaderMode::Off, clock.clone()).await;
    let (mut c, mut p) = (connect(&server.uri()).await, connect(&probe.uri()).await);
    let ask = |key: &'static str| request_redis(&[&[(key, "hot")]]);
    let fits_in_redis = |p: &mut RateLimitServiceClient<Channel>, key: &'static str| {
        let mut look = ask(key);
        look.descriptors[0].hits_addend =
            Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
        let mut p = p.clone();
        async move {
            p.should_rate_limit(look)
                .await
                .unwrap()
                .into_inner()
                .statuses[0]
                .limit_remaining
                >= 1
        }
    };

    for key in ["fixed", "sliding"] {
        for _ in 0..5 {
            assert_eq!(
                c.should_rate_limit(ask(key))
                    .await
                    .unwrap()
                    .into_inner()
                    .overall_code,
                Code::Ok as i32
            );
        }
    }
    redis.command(&["CONFIG", "RESETSTAT"]);
    for _ in 0..100 {
        for key in ["fixed", "sliding"] {
            let r = c.should_rate_limit(ask(key)).await.unwrap().into_inner();
            assert_eq!(
                (r.overall_code, r.statuses[0].limit_remaining),
                (Code::OverLimit as i32, 0)
            );
        }
    }
    assert_eq!(
        calls(&redis, "evalsha"),
        0,
        "the hot keys were answered locally"
    );
    assert!(
        cached
            .metrics()
            .encode()
            .contains("sluice_local_cache_hits_total 200")
    );

    // Step through time: the cached answer must be exactly what Redis would
    // answer — never a rejection once a hit fits, never an admission before.
    // The fixed key reopens at the minute, approached a millisecond at a
    // time; the sliding key (filled at t0+30 s) then decays as its hits
    // leave the trailing minute. Both windows are a minute long: Redis
    // expires the HASHes in real seconds while this clock is manual, so a
    // second-long window could vanish under a slow run and make Redis's
    // answer differ from the cache's for a reason that is not the cache.
    for (key, from, step) in [("fixed", T0 + 59_990, 1), ("sliding", T0 + 60_000, 50)] {
        clock.set(from);
        loop {
            let fits = fits_in_redis(&mut p, key).await;
            let answer = c
                .should_rate_limit(ask(key))
                .await
                .unwrap()
                .into_inner()
                .overall_code;
            assert_eq!(
                answer == Code::Ok as i32,
                fits,
                "{key} at t0+{}",
                clock.now() - T0
            );
            if fits {
                break;
            }
            assert!(clock.now() < T0 + 120_000, "{key} never reopened");
            clock.advance(step);
        }
        if key == "fixed" {
            assert_eq!(
                clock.now(),
                T0 + 60_000,
                "the fixed window reopens exactly at the minute"
            );
        }
    }
    server.stop().await;
    probe.stop().await;
}

/// Issue 11, item 12, over Redis: weights [1, 2^64 − 1] on one limit-5
/// counter are refused (INVALID_ARGUMENT) and count nothing, whatever
/// `max_hits_addend` says.
#[tokio::test]
async fn weights_past_u64_are_invalid_and_count_nothing_in_redis() {
    use sluice::decision::{Bounds, DecideError, Limiter};
    use sluice::request::{Descriptor, Entry, Request};
    let clock = Arc::new(ManualClock::new(T0));
    let store = support::redis_store(
        &shared().url(),
        clock,
        TimeSource::Local,
        Duration::from_secs(5),
    )
    .await;
    let bounds = Bounds {
        max_hits_addend: u64::MAX,
        ..Bounds::default()
    };
    let limiter = Limiter::new(support::rules(RULES), store, bounds);
    let weighted = |weights: &[u64]| Request {
        domain: "redis".into(),
        descriptors: weights
            .iter()
            .map(|&w| Descriptor {
                entries: vec![Entry::new("client", "w")],
                limit: None,
                hits_addend: Some(w),
                is_negative_hits: false,
            })
            .collect(),
        hits_addend: 0,
    };
    assert!(matches!(
        limiter.decide(&weighted(&[1, u64::MAX])).await,
        Err(DecideError::InvalidArgument(_))
    ));
    for _ in 0..5 {
        assert!(limiter.decide(&weighted(&[1])).await.unwrap().admitted);
    }
    assert!(!limiter.decide(&weighted(&[1])).await.unwrap().admitted);
}
