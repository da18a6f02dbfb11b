//! RLQS over loopback: the server started in process on 127.0.0.1:0 and
//! driven with the RLQS client generated from Envoy's own published protos
//! (`envoy-types`), speaking the protocol as Envoy 1.40 does (a `0s` first
//! report, then periodic reports of every bucket).

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use sluice::headers::HeaderMode;
use sluice::limiter::ManualClock;
use sluice::store::TimeSource;
use support::redis::RedisServer;
use support::{Server, http};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const RULES: &str = r#"
domain: quota
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 120}
  - key: tenant
    value: free
    rate_limit: {unlimited: true}
  - key: tenant
    value: vip
"#;

/// What a reply should arrive within; only a guard against a hang.
const GUARD: Duration = Duration::from_secs(10);

/// One Envoy's stream: reports go in, actions come out.
struct Envoy {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    actions: tonic::Streaming<RateLimitQuotaResponse>,
}

impl Envoy {
    async fn connect(server: &Server) -> Self {
        let mut client = RateLimitQuotaServiceClient::connect(server.uri())
            .await
            .expect("connect");
        let (reports, rx) = mpsc::channel(16);
        let actions = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await
            .expect("stream accepted")
            .into_inner();
        Self { reports, actions }
    }

    /// Sends one report: `(tenant, allowed, denied)` per bucket.
    async fn report(&self, elapsed_secs: i64, buckets: &[(&str, u64, u64)]) {
        let usages = buckets
            .iter()
            .map(|(tenant, allowed, denied)| BucketQuotaUsage {
                bucket_id: Some(bucket(tenant)),
                time_elapsed: Some(PbDuration {
                    seconds: elapsed_secs,
                    nanos: 0,
                }),
                num_requests_allowed: *allowed,
                num_requests_denied: *denied,
            })
            .collect();
        self.reports
            .send(RateLimitQuotaUsageReports {
                domain: "quota".into(),
                bucket_quota_usages: usages,
            })
            .await
            .expect("stream open");
    }

    /// Messages until one names `marker` (a bucket only this Envoy reports,
    /// so the message is the answer to its own report, not a push).
    async fn answer(&mut self, marker: &str) -> HashMap<String, Action> {
        loop {
            let message = self.next().await;
            if message.contains_key(marker) {
                return message;
            }
        }
    }

    /// The next message, as `tenant → action`.
    async fn next(&mut self) -> HashMap<String, Action> {
        let message = tokio::time::timeout(GUARD, self.actions.message())
            .await
            .expect("an answer before the guard")
            .expect("stream healthy")
            .expect("stream open");
        message
            .bucket_action
            .into_iter()
            .map(|a| {
                let tenant = a.bucket_id.expect("bucket id").bucket["tenant"].clone();
                (tenant, Action::of(a.bucket_action.expect("an action")))
            })
            .collect()
    }
}

fn bucket(tenant: &str) -> BucketId {
    BucketId {
        bucket: [("tenant".to_string(), tenant.to_string())].into(),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    /// tokens per fill, fill seconds, max tokens, TTL seconds
    Bucket(u32, i64, u32, i64),
    Allow,
    Deny,
    Abandon,
}

impl Action {
    fn of(kind: Kind) -> Self {
        match kind {
            Kind::AbandonAction(_) => Action::Abandon,
            Kind::QuotaAssignmentAction(q) => {
                let ttl = q.assignment_time_to_live.expect("a TTL, always").seconds;
                assert!(ttl > 5, "Envoy 1.40 needs a TTL above 5 s");
                match q.rate_limit_strategy.and_then(|s| s.strategy) {
                    Some(Strategy::TokenBucket(b)) => Action::Bucket(
                        b.tokens_per_fill.expect("tokens per fill").value,
                        b.fill_interval.expect("fill interval").seconds,
                        b.max_tokens,
                        ttl,
                    ),
                    Some(Strategy::BlanketRule(r)) if r == BlanketRule::AllowAll as i32 => {
                        Action::Allow
                    }
                    Some(Strategy::BlanketRule(_)) => Action::Deny,
                    other => panic!("unexpected strategy {other:?}"),
                }
            }
        }
    }

    fn tokens(&self) -> u32 {
        match self {
            Action::Bucket(tokens, ..) => *tokens,
            other => panic!("not a token bucket: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_first_report_with_zero_elapsed_is_answered_with_the_whole_budget() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let mut envoy = Envoy::connect(&server).await;
    envoy.report(0, &[("hot", 1, 0)]).await;
    let actions = envoy.next().await;
    // Alone on the bucket: all 120 per minute, in whole seconds, a 60 s TTL.
    assert_eq!(actions["hot"], Action::Bucket(120, 60, 3, 60));
    // Shutdown ends the stream with UNAVAILABLE (Envoy reconnects) instead
    // of waiting out the grace period for a stream that never ends.
    server.stop().await;
    let ended = tokio::time::timeout(GUARD, envoy.actions.message())
        .await
        .expect("the stream ends");
    assert_eq!(
        ended.expect_err("ended by the server").code(),
        tonic::Code::Unavailable
    );
}

#[tokio::test]
async fn unlimited_whitelisted_and_unmatched_buckets_are_allow_all() {
    let rules = format!("{RULES}\n");
    let server = Server::start(&rules, HeaderMode::Off).await;
    let mut envoy = Envoy::connect(&server).await;
    envoy.report(0, &[("free", 1, 0)]).await;
    assert_eq!(envoy.next().await["free"], Action::Allow);
    envoy.report(0, &[("vip", 1, 0)]).await;
    assert_eq!(envoy.next().await["vip"], Action::Allow);

    // A bucket id whose key has no rule at all.
    let usage = BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [
                ("tenant".to_string(), "x".to_string()),
                ("path".to_string(), "/a".to_string()),
            ]
            .into(),
        }),
        time_elapsed: Some(PbDuration::default()),
        num_requests_allowed: 1,
        num_requests_denied: 0,
    };
    envoy
        .reports
        .send(RateLimitQuotaUsageReports {
            domain: "quota".into(),
            bucket_quota_usages: vec![usage],
        })
        .await
        .unwrap();
    assert_eq!(envoy.next().await["x"], Action::Allow);
    server.stop().await;
}

#[tokio::test]
async fn a_second_envoy_gets_a_share_and_the_first_is_cut_at_once() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let mut a = Envoy::connect(&server).await;
    let mut b = Envoy::connect(&server).await;
    a.report(0, &[("hot", 1, 0)]).await;
    assert_eq!(a.next().await["hot"].tokens(), 120);
    // A is busy: 3/s offered (15 in 5 s), it admitted 10 of them.
    a.report(5, &[("hot", 10, 5)]).await;
    assert_eq!(a.next().await["hot"].tokens(), 120);

    // B subscribes with a first report: it is answered, and A, which sent
    // nothing, is pushed its cut share so the two never sum above 120.
    b.report(0, &[("hot", 1, 0)]).await;
    let share_b = b.next().await["hot"].tokens();
    let share_a = a.next().await["hot"].tokens();
    assert!(share_a + share_b <= 120, "{share_a} + {share_b}");
    assert!(share_a > share_b, "the busy Envoy keeps the larger share");
    assert!(share_b >= 6, "the floor: a tenth of an equal share");

    // B grows to 6/s offered, A stays at 3/s: B's share overtakes A's, and
    // what the server has assigned never sums above the budget.
    for _ in 0..4 {
        b.report(5, &[("hot", 20, 10), ("mark-b", 1, 0)]).await;
        b.answer("mark-b").await;
        assert!(assigned(&server, "hot").await.iter().sum::<u64>() <= 120);
        a.report(5, &[("hot", 10, 5), ("mark-a", 1, 0)]).await;
        a.answer("mark-a").await;
        assert!(assigned(&server, "hot").await.iter().sum::<u64>() <= 120);
    }
    let shares = assigned(&server, "hot").await;
    // Streams are numbered in order of opening: A, then B.
    assert!(
        shares[1] > shares[0],
        "the split follows demand: {shares:?}"
    );
    assert!(
        shares.iter().sum::<u64>() >= 114,
        "the budget is used: {shares:?}"
    );
    server.stop().await;
}

/// The token-bucket shares of a bucket on the admin page, by stream.
async fn assigned(server: &Server, tenant: &str) -> Vec<u64> {
    let page = admin_page(server).await;
    let bucket = page["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bucket"]["tenant"] == tenant)
        .expect("the bucket is listed");
    bucket["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["assignment"]["token_bucket"]["tokens_per_fill"]
                .as_u64()
                .unwrap_or(0)
        })
        .collect()
}

#[tokio::test]
async fn a_closed_stream_gives_its_share_back() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let mut a = Envoy::connect(&server).await;
    let mut b = Envoy::connect(&server).await;
    a.report(0, &[("hot", 1, 0)]).await;
    a.next().await;
    b.report(0, &[("hot", 1, 0)]).await;
    let share_b = b.next().await["hot"].tokens();
    assert!(share_b < 120);
    a.next().await; // A's cut
    drop(a);
    // B did nothing; the server pushes it the whole budget back.
    assert_eq!(b.next().await["hot"].tokens(), 120);
    server.stop().await;
}

#[tokio::test]
async fn a_bucket_idle_for_six_reports_is_abandoned() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let mut envoy = Envoy::connect(&server).await;
    envoy.report(0, &[("calm", 1, 0), ("hot", 1, 0)]).await;
    envoy.next().await;
    for report in 1..=6 {
        envoy.report(5, &[("calm", 0, 0), ("hot", 2, 0)]).await;
        let actions = envoy.next().await;
        assert!(matches!(actions["hot"], Action::Bucket(..)));
        if report < 6 {
            assert!(
                matches!(actions["calm"], Action::Bucket(..)),
                "report {report}"
            );
        } else {
            assert_eq!(actions["calm"], Action::Abandon);
        }
    }
    // Reporting it again subscribes again.
    envoy.report(0, &[("calm", 1, 0)]).await;
    assert!(matches!(envoy.next().await["calm"], Action::Bucket(..)));
    server.stop().await;
}

#[tokio::test]
async fn the_admin_page_shows_assignments_per_bucket() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let mut envoy = Envoy::connect(&server).await;
    envoy.report(0, &[("hot", 1, 0)]).await;
    envoy.next().await;
    let page = admin_page(&server).await;
    let bucket = &page["buckets"][0];
    assert_eq!(bucket["domain"], "quota");
    assert_eq!(bucket["bucket"]["tenant"], "hot");
    assert_eq!(bucket["budget"]["tokens_per_fill"], 120);
    assert_eq!(bucket["budget"]["fill_interval_secs"], 60);
    assert_eq!(
        bucket["streams"][0]["assignment"]["token_bucket"]["tokens_per_fill"],
        120
    );
    let addr = server.http;
    let (status, metrics) =
        tokio::task::spawn_blocking(move || http(addr, "GET", "/metrics/rlqs", ""))
            .await
            .unwrap();
    assert_eq!(status, 200);
    assert!(metrics.contains("sluice_rlqs_streams 1"), "{metrics}");
    assert!(
        metrics.contains(
            r#"sluice_rlqs_bucket_budget_per_second{domain="quota",bucket="tenant=hot"} 2.0"#
        ),
        "{metrics}"
    );
    drop(envoy);
    server.stop().await;
}

async fn redis_replica(redis: &RedisServer, prefix: &str) -> Server {
    replica_on(&redis.url(), prefix).await
}

/// A replica on `url`; replicas given one key prefix are one deployment.
async fn replica_on(url: &str, prefix: &str) -> Server {
    let clock = Arc::new(ManualClock::new(support::T0));
    let store = support::redis_store_sharing(
        url,
        clock.clone(),
        TimeSource::Redis,
        Duration::from_secs(1),
        prefix,
    )
    .await;
    Server::start_with_store(RULES, HeaderMode::Off, store, clock).await
}

#[tokio::test]
async fn replicas_sharing_redis_split_one_budget_between_their_streams() {
    let redis = RedisServer::start();
    replicas_split_one_budget(&redis.url()).await;
    // Every stream closed: their fields were deleted and the hash with its
    // last field, so Envoys coming and going leave nothing in Redis. (The
    // closes run on the streams' own tasks: polled, with a deadline.)
    let port = redis.port();
    let deadline = std::time::Instant::now() + GUARD;
    loop {
        let keys = support::redis::query(port, &["KEYS", "*rlqs:*"]);
        if keys.items().is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "RLQS hashes left in Redis: {keys}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn replicas_sharing_redis_cluster_split_one_budget_between_their_streams() {
    replicas_split_one_budget(&support::redis::shared_cluster().url()).await;
}

async fn replicas_split_one_budget(url: &str) {
    let prefix = support::unique_prefix();
    let (one, two) = (
        replica_on(url, &prefix).await,
        replica_on(url, &prefix).await,
    );
    let mut a = Envoy::connect(&one).await;
    let mut b = Envoy::connect(&two).await;
    // Steady demands from the first report on: A offers 3/s, B 0.2/s.
    a.report(0, &[("hot", 15, 0)]).await;
    assert_eq!(a.next().await["hot"].tokens(), 120);

    // B lands on the other replica, which hears of A's demand through
    // Redis: B does not get a whole budget of its own, only its part.
    b.report(0, &[("hot", 1, 0)]).await;
    let share_b = b.next().await["hot"].tokens();
    assert!(share_b < 20, "B's replica saw A's demand: {share_b}");

    // A's next report brings B's demand to A's replica: once both have
    // heard each other, the two replicas' shares fit in the one budget.
    a.report(5, &[("hot", 10, 5)]).await;
    let share_a = a.next().await["hot"].tokens();
    assert!(share_a < 120, "A's replica saw B: {share_a}");
    assert!(share_a + share_b <= 120, "{share_a} + {share_b}");
    assert!(share_a + share_b >= 114, "{share_a} + {share_b}");
    let page = admin_page(&one).await;
    assert_eq!(page["buckets"][0]["other_replicas"]["streams"], 1);

    // B goes: its replica deletes its field, and A's answers return to the
    // whole budget (polled: B's close is handled by its own task).
    drop(b);
    two.stop().await;
    let mut whole = false;
    for _ in 0..100 {
        a.report(5, &[("hot", 10, 5)]).await;
        if a.next().await["hot"].tokens() == 120 {
            whole = true;
            break;
        }
    }
    assert!(whole, "A never got B's part back");
    drop(a);
    one.stop().await;
}

async fn admin_page(server: &Server) -> serde_json::Value {
    support::rlqs_page(server.http).await
}

#[tokio::test]
async fn reflection_lists_the_quota_service_beside_rls() {
    let server = Server::start(RULES, HeaderMode::Off).await;
    let names = server.reflected_services().await;
    for name in [
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        assert!(names.contains(&name.to_string()), "{names:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn with_redis_down_a_replica_answers_from_what_it_last_heard() {
    let mut redis = RedisServer::start();
    let prefix = support::unique_prefix();
    let (one, two) = (
        redis_replica(&redis, &prefix).await,
        redis_replica(&redis, &prefix).await,
    );
    let mut a = Envoy::connect(&one).await;
    let mut b = Envoy::connect(&two).await;
    a.report(0, &[("hot", 15, 0)]).await;
    a.next().await;
    b.report(0, &[("hot", 1, 0)]).await;
    let share_b = b.next().await["hot"].tokens();
    assert!(share_b < 20, "{share_b}");

    // Redis gone: B's reports are still answered (the stream never fails
    // for it), and B keeps counting A's last known demand, so it does not
    // grab the whole budget.
    redis.stop();
    for _ in 0..2 {
        b.report(5, &[("hot", 1, 0)]).await;
        let share = b.next().await["hot"].tokens();
        assert!(share < 20, "B forgot A while Redis was down: {share}");
    }
    drop((a, b));
    one.stop().await;
    two.stop().await;
}
