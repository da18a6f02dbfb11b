//! Run-time overrides (`/overrides/{domain}`) across two `sluice` binaries
//! sharing one `redis-server`: set on one replica, enforced by the other
//! within a second, kept when both restart, listed, deleted, bounded per
//! domain, and refused without the token.

use crate::support;

use std::net::SocketAddr;
use std::time::Instant;

use support::eventually::eventually;
use support::redis::shared;
use support::{Process, http, http_with_headers, start_binary_with_http, unique_prefix};

const RULES: &str = r#"
domain: billing
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

const TOKEN: &str = "s3cret-admin-token";

/// The override of `tenant=acme`: 4 a minute instead of the rule's 2.
const ACME_4: &str = r#"{"descriptor": [{"key": "tenant", "value": "acme"}], "requests_per_unit": 4, "unit": "minute"}"#;

/// The rules file and the token file of a test.
struct Files {
    _dir: tempfile::TempDir,
    rules: String,
    token: String,
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let token = dir.path().join("admin-token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    Files {
        rules: rules.display().to_string(),
        token: token.display().to_string(),
        _dir: dir,
    }
}

/// One replica over the shared Redis, under `prefix`.
fn replica(files: &Files, prefix: &str) -> (Process, SocketAddr) {
    let redis = shared().url();
    let (process, _, http) = start_binary_with_http(&[
        "--rules",
        &files.rules,
        "--redis-url",
        &redis,
        "--redis-key-prefix",
        prefix,
        "--admin-token",
        &files.token,
        "--overrides-max-per-domain",
        "2",
    ]);
    (process, http)
}

fn authorized(addr: SocketAddr, method: &str, body: &str) -> (u16, String) {
    let bearer = format!("Bearer {TOKEN}");
    http_with_headers(
        addr,
        method,
        "/overrides/billing",
        &[("Authorization", &bearer)],
        body,
    )
}

/// The limit `addr` applies to `tenant=value` now, from a peek (nothing
/// counted).
fn limit_of(addr: SocketAddr, value: &str) -> u64 {
    let request = format!(
        r#"{{"domain": "billing", "descriptors": [{{"entries": [{{"key": "tenant", "value": "{value}"}}]}}]}}"#
    );
    let (status, body) = http(addr, "POST", "/json?peek=true", &request);
    assert!(status == 200 || status == 429, "{status}: {body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    json["statuses"][0]["currentLimit"]["requestsPerUnit"]
        .as_u64()
        .unwrap_or_else(|| panic!("no current limit in {body}"))
}

/// One counted request for `tenant=value`: its HTTP status (200 or 429).
fn hit(addr: SocketAddr, value: &str) -> u16 {
    let request = format!(
        r#"{{"domain": "billing", "descriptors": [{{"entries": [{{"key": "tenant", "value": "{value}"}}]}}]}}"#
    );
    http(addr, "POST", "/json", &request).0
}

#[test]
fn an_override_set_on_one_replica_is_enforced_by_the_other_within_a_second() {
    let files = files();
    let prefix = unique_prefix();
    let (_a, a) = replica(&files, &prefix);
    let (_b, b) = replica(&files, &prefix);
    assert_eq!(
        limit_of(b, "acme"),
        2,
        "the rule's limit before any override"
    );

    let (status, body) = authorized(a, "PUT", ACME_4);
    assert_eq!(status, 200, "{body}");
    let written = Instant::now();
    eventually("replica B to apply the override set on A", || {
        limit_of(b, "acme") == 4
    });
    let took = written.elapsed();
    assert!(
        took.as_millis() < 1_000,
        "replica B applied the override {took:?} after it was written (at most 1 s promised)"
    );

    // Enforced with the counters Redis shares: 4 admitted, the 5th refused.
    let answers: Vec<u16> = (0..5).map(|_| hit(b, "acme")).collect();
    assert_eq!(answers, [200, 200, 200, 200, 429]);
    // Only that exact descriptor: another tenant keeps the rule's 2.
    assert_eq!(limit_of(a, "globex"), 2);
}

#[test]
fn overrides_survive_a_restart_of_every_replica_and_are_listed_and_deleted() {
    let files = files();
    let prefix = unique_prefix();
    {
        let (_a, a) = replica(&files, &prefix);
        let (status, body) = authorized(a, "PUT", ACME_4);
        assert_eq!(status, 200, "{body}");
    }
    // Both replicas stopped (dropped); two new ones over the same Redis.
    let (_a, a) = replica(&files, &prefix);
    let (_b, b) = replica(&files, &prefix);
    assert_eq!(
        limit_of(a, "acme"),
        4,
        "in force from the start after a restart"
    );
    assert_eq!(limit_of(b, "acme"), 4);

    let (status, listed) = http(b, "GET", "/overrides/billing", "");
    assert_eq!(status, 200, "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let overrides = listed["overrides"].as_array().unwrap();
    assert_eq!(overrides.len(), 1, "{listed}");
    assert_eq!(overrides[0]["requests_per_unit"], 4);
    assert_eq!(overrides[0]["descriptor"][0]["value"], "acme");

    let (status, body) = authorized(
        b,
        "DELETE",
        r#"{"descriptor": [{"key": "tenant", "value": "acme"}]}"#,
    );
    assert_eq!(status, 200, "{body}");
    eventually("replica A to drop the deleted override", || {
        limit_of(a, "acme") == 2
    });
    let (_, listed) = http(a, "GET", "/overrides/billing", "");
    assert!(listed.contains(r#""overrides":[]"#), "{listed}");
}

#[test]
fn writes_without_the_token_are_refused_and_the_cap_is_enforced_clearly() {
    let files = files();
    let prefix = unique_prefix();
    let (_a, a) = replica(&files, &prefix);

    let (status, body) = http(a, "PUT", "/overrides/billing", ACME_4);
    assert_eq!(status, 401, "no token: {body}");
    let (status, body) = http_with_headers(
        a,
        "PUT",
        "/overrides/billing",
        &[("Authorization", "Bearer not-the-token")],
        ACME_4,
    );
    assert_eq!(status, 401, "a wrong token: {body}");
    let (status, body) = http_with_headers(
        a,
        "DELETE",
        "/overrides/billing",
        &[("Authorization", "Bearer not-the-token")],
        r#"{"descriptor": [{"key": "tenant", "value": "acme"}]}"#,
    );
    assert_eq!(status, 401, "a delete with a wrong token: {body}");
    assert_eq!(limit_of(a, "acme"), 2, "nothing was set");

    // The cap (2 per domain): a third descriptor is refused, naming the
    // setting; replacing one already there is not.
    for tenant in ["one", "two"] {
        let body = ACME_4.replace("acme", tenant);
        assert_eq!(authorized(a, "PUT", &body).0, 200);
    }
    let (status, body) = authorized(a, "PUT", &ACME_4.replace("acme", "three"));
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("overrides_max_per_domain"), "{body}");
    let (status, body) = authorized(a, "PUT", &ACME_4.replace("acme", "two").replace('4', "7"));
    assert_eq!(status, 200, "replacing an override is not one more: {body}");
}

#[test]
fn on_a_cluster_an_override_set_on_one_replica_is_enforced_by_the_other() {
    let files = files();
    let prefix = unique_prefix();
    let url = support::redis::shared_cluster().url();
    let start = || {
        let (process, _, http) = start_binary_with_http(&[
            "--rules",
            &files.rules,
            "--redis-url",
            &url,
            "--redis-key-prefix",
            &prefix,
            "--admin-token",
            &files.token,
        ]);
        (process, http)
    };
    let (_a, a) = start();
    let (_b, b) = start();
    let (status, body) = authorized(a, "PUT", ACME_4);
    assert_eq!(status, 200, "{body}");
    eventually("replica B on the Cluster to apply the override", || {
        limit_of(b, "acme") == 4
    });
    let answers: Vec<u16> = (0..5).map(|_| hit(b, "acme")).collect();
    assert_eq!(answers, [200, 200, 200, 200, 429]);
}
