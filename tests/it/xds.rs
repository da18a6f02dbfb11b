//! Rules over xDS against the management server of `support::ads`: a tonic
//! `AggregatedDiscoveryService` speaking the state-of-the-world protocol over
//! loopback (plaintext, or mutual TLS with certificates from
//! `support::certs`). The client under test feeds a real `Limiter`, whose
//! decisions the tests check.
//!
//! No test sleeps for time: each waits for the next request the server sees,
//! or polls for an event, bounded by [`TIMEOUT`].

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use prost::Message;
use sluice::decision::{Bounds, Limiter};
use sluice::headers::HeaderMode;
use sluice::limiter::ManualClock;
use sluice::proto as pb;
use sluice::proto::RateLimitService as _;
use sluice::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use sluice::reload::{Reload, Trigger};
use sluice::rules::RuleSet;
use sluice::service::RateLimitService;
use sluice::store::{MemoryStore, MemoryStoreConfig};
use sluice::xds::{self, NO_CONFIG, TYPE_URL, XdsConfig, XdsHandle};
use tokio_util::sync::CancellationToken;
use tonic::Code;

use support::ads::{Management, TIMEOUT, mutual_tls, poll};
use support::certs::Ca;
use support::{OK, OVER, T0, descriptor, request};

// ------------------------------------------------------------- the rules

/// A config for `domain` limiting key `k` to `requests` per `unit`.
fn config(domain: &str, requests: u32, unit: RateLimitUnit) -> RateLimitConfig {
    RateLimitConfig {
        name: domain.into(),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: "k".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: requests,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

fn per_minute(domain: &str, requests: u32) -> RateLimitConfig {
    config(domain, requests, RateLimitUnit::Minute)
}

// ------------------------------------------------------------- the client

/// A limiter fed by the xDS client, and the service over it.
struct Fed {
    clock: Arc<ManualClock>,
    limiter: Arc<Limiter<MemoryStore>>,
    handle: XdsHandle,
    shutdown: CancellationToken,
    /// Refused snapshots the sink was told of.
    failures: Arc<AtomicUsize>,
}

impl Drop for Fed {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn client_config(addr: SocketAddr) -> XdsConfig {
    XdsConfig {
        xds_server: addr.to_string(),
        xds_node_id: "test-node".into(),
        xds_node_metadata: r#"{"zone": "a", "n": 1}"#.into(),
        xds_backoff_initial_ms: 20,
        xds_backoff_max_ms: 100,
        xds_backoff_jitter: false,
        ..XdsConfig::default()
    }
}

impl Fed {
    fn start(config: XdsConfig) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
        let limiter = Arc::new(Limiter::new(RuleSet::default(), store, Bounds::default()));
        let sink_limiter = limiter.clone();
        let failures = Arc::new(AtomicUsize::new(0));
        let sink_failures = failures.clone();
        let shutdown = CancellationToken::new();
        let handle = xds::spawn(
            config,
            move |reload: Reload| {
                assert_eq!(reload.trigger, Trigger::Xds);
                match reload.result {
                    Ok(rules) => sink_limiter.replace_rules(rules),
                    Err(_) => {
                        sink_failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            },
            shutdown.clone(),
        )
        .expect("the client starts");
        Self {
            clock,
            limiter,
            handle,
            shutdown,
            failures,
        }
    }

    fn service(&self) -> RateLimitService<MemoryStore> {
        RateLimitService::new(self.limiter.clone(), HeaderMode::Off)
    }

    /// The overall code for one hit on `domain`, key `k`.
    async fn hit(&self, domain: &str) -> i32 {
        self.service()
            .should_rate_limit(tonic::Request::new(request(domain, &[&[("k", "v")]])))
            .await
            .expect("a decision")
            .into_inner()
            .overall_code
    }

    /// The limit of `domain`'s only rule, if loaded.
    fn limit(&self, domain: &str) -> Option<u64> {
        let rules = self.limiter.rules();
        let domain = rules.domain(domain)?;
        Some(domain.rules().first()?.limits.first()?.spec.requests)
    }
}

// ------------------------------------------------------------------ tests

#[tokio::test]
async fn initial_config_is_enforced_and_acked_with_version_and_nonce() {
    let mut server = Management::start(None).await;
    server.push("v1", vec![per_minute("xds", 2)]);
    let fed = Fed::start(client_config(server.addr));

    let first = server.next().await;
    assert_eq!(first.type_url, TYPE_URL);
    assert!(first.resource_names.is_empty(), "a wildcard subscription");
    let node = first.node.expect("the node is sent");
    assert_eq!(node.id, "test-node");
    let metadata = node.metadata.expect("metadata from the JSON object");
    assert!(metadata.fields.contains_key("zone"));

    let nonce = server.nonce_of("v1").await;
    let ack = server.answer_to(&nonce).await;
    assert_eq!(ack.version_info, "v1");
    assert!(ack.error_detail.is_none(), "an ACK, not a NACK");

    assert!(fed.handle.has_config());
    assert_eq!(fed.hit("xds").await, OK);
    assert_eq!(fed.hit("xds").await, OK);
    assert_eq!(fed.hit("xds").await, OVER);
    // Two minutes on, the (sliding) minute window admits again.
    fed.clock.advance(120_000);
    assert_eq!(fed.hit("xds").await, OK);
}

#[tokio::test]
async fn a_new_version_replaces_the_whole_rule_state_and_is_acked() {
    let mut server = Management::start(None).await;
    server.push("v1", vec![per_minute("old", 2), per_minute("kept", 5)]);
    let fed = Fed::start(client_config(server.addr));
    let nonce = server.nonce_of("v1").await;
    assert_eq!(server.answer_to(&nonce).await.version_info, "v1");
    assert_eq!(fed.limit("old"), Some(2));

    server.push("v2", vec![per_minute("kept", 7), per_minute("new", 1)]);
    let nonce = server.nonce_of("v2").await;
    let ack = server.answer_to(&nonce).await;
    assert_eq!(ack.version_info, "v2");
    assert!(ack.error_detail.is_none());
    assert_eq!(fed.limit("kept"), Some(7));
    assert_eq!(fed.limit("new"), Some(1));
    assert_eq!(fed.limit("old"), None, "a snapshot replaces, never merges");
    let shown = sluice::server::admin::describe_rules(&fed.limiter.rules());
    assert!(shown.contains("# domain kept from xds:v2/kept"), "{shown}");
    assert_eq!(fed.hit("new").await, OK);
    assert_eq!(fed.hit("new").await, OVER);
}

#[tokio::test]
async fn a_bad_version_is_nacked_every_time_and_the_old_limits_stay() {
    let mut server = Management::start(None).await;
    server.push("v1", vec![per_minute("xds", 2)]);
    let fed = Fed::start(client_config(server.addr));
    let nonce = server.nonce_of("v1").await;
    server.answer_to(&nonce).await;

    // A limited policy with no unit: upstream's loader refuses it.
    let bad = vec![config("xds", 9, RateLimitUnit::Unknown)];
    server.push("v2", bad.clone());
    let nonce = server.nonce_of("v2").await;
    let nack = server.answer_to(&nonce).await;
    assert_eq!(
        nack.version_info, "v1",
        "a NACK names the last good version"
    );
    let detail = nack.error_detail.expect("a NACK carries the error");
    assert_eq!(detail.code, Code::InvalidArgument as i32);
    assert!(detail.message.contains("xds:v2"), "{}", detail.message);
    assert!(detail.message.contains("unit"), "{}", detail.message);

    assert_eq!(fed.limit("xds"), Some(2));
    assert_eq!(fed.hit("xds").await, OK);
    assert_eq!(fed.hit("xds").await, OK);
    assert_eq!(fed.hit("xds").await, OVER);

    // The same bad version again: answered again, NACKed again.
    let before = server.sent_count();
    server.push("v2", bad);
    let nonce = server.nonce_at(before).await;
    let again = server.answer_to(&nonce).await;
    assert_eq!(again.version_info, "v1");
    assert!(again.error_detail.is_some(), "the re-send is NACKed too");
    assert_eq!(
        fed.failures.load(Ordering::Relaxed),
        2,
        "each refusal reaches the sink"
    );

    // Duplicate domains are refused the same way.
    server.push("v3", vec![per_minute("a", 1), per_minute("a", 2)]);
    let nonce = server.nonce_of("v3").await;
    let dup = server.answer_to(&nonce).await;
    let detail = dup.error_detail.expect("duplicate domain NACKed").message;
    assert!(detail.contains("a"), "{detail}");

    // A good version after bad ones is taken.
    server.push("v4", vec![per_minute("xds", 3)]);
    let nonce = server.nonce_of("v4").await;
    let ack = server.answer_to(&nonce).await;
    assert_eq!(ack.version_info, "v4");
    assert!(ack.error_detail.is_none());
    assert_eq!(fed.limit("xds"), Some(3));
}

#[tokio::test]
async fn rules_survive_the_server_going_away_and_updates_resume() {
    let mut server = Management::start(None).await;
    server.push("v1", vec![per_minute("xds", 2)]);
    let fed = Fed::start(client_config(server.addr));
    let nonce = server.nonce_of("v1").await;
    server.answer_to(&nonce).await;

    server.stop().await;
    let mut errors = fed.handle.last_error();
    let _ = tokio::time::timeout(TIMEOUT, errors.wait_for(Option::is_some))
        .await
        .expect("the client sees the stream go");
    assert_eq!(fed.limit("xds"), Some(2), "rules kept while disconnected");
    assert_eq!(fed.hit("xds").await, OK);
    assert_eq!(fed.hit("xds").await, OK);
    assert_eq!(fed.hit("xds").await, OVER);

    server.push("v2", vec![per_minute("xds", 5)]);
    server.restart().await;
    let first = server.next().await;
    assert_eq!(
        first.version_info, "v1",
        "the new stream names the rules in force"
    );
    assert!(
        first.response_nonce.is_empty(),
        "nonces do not cross streams"
    );
    let nonce = server.nonce_of("v2").await;
    let ack = server.answer_to(&nonce).await;
    assert_eq!(ack.version_info, "v2");
    assert_eq!(fed.limit("xds"), Some(5));
}

#[tokio::test]
async fn force_start_serves_before_config_with_upstreams_error() {
    let server = Management::start(None).await;
    // Nothing pushed yet.
    let waiting = Fed::start(client_config(server.addr));
    assert!(!waiting.handle.ready(), "not ready before the first config");

    let forced = Fed::start(XdsConfig {
        force_start_without_initial_config: true,
        ..client_config(server.addr)
    });
    assert!(forced.handle.ready(), "force-start is ready at once");
    let gated = forced.handle.gate(forced.service());
    let error = gated
        .should_rate_limit(tonic::Request::new(request("xds", &[&[("k", "v")]])))
        .await
        .expect_err("no rules yet");
    assert_eq!(error.code(), Code::Unknown);
    assert_eq!(error.message(), NO_CONFIG);

    server.push("v1", vec![per_minute("xds", 2)]);
    poll(|| (forced.handle.has_config() && waiting.handle.has_config()).then_some(())).await;
    assert!(waiting.handle.ready());
    let answer = gated
        .should_rate_limit(tonic::Request::new(request("xds", &[&[("k", "v")]])))
        .await
        .expect("rules loaded");
    assert_eq!(answer.into_inner().overall_code, OK);
}

#[tokio::test]
async fn yaml_and_xds_rules_give_identical_answers() {
    const YAML: &str = r#"
domain: same
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: hour, requests_per_unit: 2}
      - key: path
        rate_limit: {unlimited: true}
"#;
    let xds_config = RateLimitConfig {
        name: "same".into(),
        domain: "same".into(),
        descriptors: vec![
            RateLimitDescriptor {
                key: "k".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Minute as i32,
                    requests_per_unit: 3,
                    ..Default::default()
                }),
                ..Default::default()
            },
            RateLimitDescriptor {
                key: "user".into(),
                descriptors: vec![
                    RateLimitDescriptor {
                        key: "path".into(),
                        value: "/login".into(),
                        rate_limit: Some(RateLimitPolicy {
                            unit: RateLimitUnit::Hour as i32,
                            requests_per_unit: 2,
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    RateLimitDescriptor {
                        key: "path".into(),
                        rate_limit: Some(RateLimitPolicy {
                            unlimited: true,
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
        ],
    };
    let file = support::Harness::new(YAML);
    let mut server = Management::start(None).await;
    server.push("v1", vec![xds_config]);
    let fed = Fed::start(client_config(server.addr));
    let nonce = server.nonce_of("v1").await;
    server.answer_to(&nonce).await;

    let file_rules = file.limiter.rules();
    let xds_rules = fed.limiter.rules();
    let shape = |rules: &RuleSet| {
        let domain = rules.domain("same").expect("domain loaded");
        domain
            .rules()
            .iter()
            .map(|r| format!("{:?}", r.limits.iter().map(|l| l.spec).collect::<Vec<_>>()))
            .collect::<Vec<_>>()
    };
    assert_eq!(shape(&file_rules), shape(&xds_rules));
    let from_file = sluice::server::admin::describe_rules(&file_rules);
    assert!(from_file.contains("# domain same from /"), "{from_file}");
    assert!(from_file.contains("rules.yaml"), "{from_file}");
    let from_xds = sluice::server::admin::describe_rules(&xds_rules);
    assert!(
        from_xds.contains("# domain same from xds:v1/same"),
        "{from_xds}"
    );

    let requests: Vec<pb::RateLimitRequest> = vec![
        request("same", &[&[("k", "v")]]),
        request("same", &[&[("user", "u"), ("path", "/login")]]),
        request("same", &[&[("user", "u"), ("path", "/other")]]),
        pb::RateLimitRequest {
            domain: "same".into(),
            descriptors: vec![descriptor(&[("k", "x")]), descriptor(&[("user", "a")])],
            hits_addend: 2,
        },
    ];
    for _ in 0..4 {
        for r in &requests {
            let a = file.ok(r.clone()).await;
            let b = fed
                .service()
                .should_rate_limit(tonic::Request::new(r.clone()))
                .await
                .expect("a decision")
                .into_inner();
            assert_eq!(a, b, "same answer for {r:?}");
        }
    }
}

#[tokio::test]
async fn a_response_over_the_size_cap_is_refused() {
    let server = Management::start(None).await;
    let big: Vec<RateLimitConfig> = (0..50).map(|i| per_minute(&format!("d{i}"), 1)).collect();
    assert!(big.iter().map(Message::encoded_len).sum::<usize>() > 512);
    server.push("v1", big);
    let fed = Fed::start(XdsConfig {
        xds_max_message_bytes: 512,
        ..client_config(server.addr)
    });
    let mut errors = fed.handle.last_error();
    let error = tokio::time::timeout(TIMEOUT, errors.wait_for(Option::is_some))
        .await
        .expect("the stream fails")
        .unwrap()
        .clone()
        .unwrap();
    assert!(error.contains("message length too large"), "{error}");
    assert!(!fed.handle.has_config());
}

// ----------------------------------------------------------------- mTLS

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> Option<String> {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    Some(path.to_string_lossy().into_owned())
}

#[tokio::test]
async fn mutual_tls_to_the_management_server() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (server_ca, client_ca) = (Ca::new("server-ca"), Ca::new("client-ca"));
    let server_leaf = server_ca.leaf_for("xds.test");
    let client_leaf = client_ca.leaf_for("xds.test");
    let tls = mutual_tls(
        &server_leaf.cert_pem,
        &server_leaf.key_pem,
        &client_ca.pem(),
    );
    let mut server = Management::start(Some(tls)).await;
    server.push("v1", vec![per_minute("xds", 2)]);

    let dir = tempfile::tempdir().unwrap();
    let good = XdsConfig {
        xds_tls: true,
        xds_tls_ca_cert: write(&dir, "ca.pem", &server_ca.pem()),
        xds_tls_san: Some("xds.test".into()),
        xds_tls_cert: write(&dir, "client.pem", &client_leaf.cert_pem),
        xds_tls_key: write(&dir, "client.key", &client_leaf.key_pem),
        ..client_config(server.addr)
    };

    // The wrong CA: the server is not trusted.
    let wrong = Fed::start(XdsConfig {
        xds_tls_ca_cert: write(&dir, "other.pem", &client_ca.pem()),
        ..good.clone()
    });
    let mut errors = wrong.handle.last_error();
    let error = tokio::time::timeout(TIMEOUT, errors.wait_for(Option::is_some))
        .await
        .expect("the handshake fails")
        .unwrap()
        .clone()
        .unwrap();
    assert!(
        error.to_lowercase().contains("certificate"),
        "a certificate error: {error}"
    );
    assert!(!wrong.handle.has_config());
    drop(wrong);

    // No client certificate: the server refuses.
    let anonymous = Fed::start(XdsConfig {
        xds_tls_cert: None,
        xds_tls_key: None,
        ..good.clone()
    });
    let mut errors = anonymous.handle.last_error();
    let _ = tokio::time::timeout(TIMEOUT, errors.wait_for(Option::is_some))
        .await
        .expect("the server refuses a client without a certificate");
    assert!(!anonymous.handle.has_config());
    drop(anonymous);

    let fed = Fed::start(good);
    let nonce = server.nonce_of("v1").await;
    let ack = server.answer_to(&nonce).await;
    assert_eq!(ack.version_info, "v1");
    assert_eq!(fed.hit("xds").await, OK);
    assert_eq!(fed.hit("xds").await, OK);
    assert_eq!(fed.hit("xds").await, OVER);
}
