//! Run-time overrides on the admin port of one `sluice` binary over the
//! memory store: writes off without `admin_token`, bodies checked strictly,
//! an override in force at once on the replica that took it (keeping the
//! rule's counter when the window is the same), shown in `/rlconfig` and
//! counted in the metrics. Replicas sharing Redis are in `tests/redis/`.

use crate::support;

use std::net::SocketAddr;

use support::{Process, http, http_with_headers, start_binary_with_http};

const RULES: &str = r#"
domain: billing
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

const TOKEN: &str = "memory-token";

const ACME: &str = r#"{"descriptor": [{"key": "tenant", "value": "acme"}], "requests_per_unit": 4, "unit": "minute"}"#;

/// A binary over RULES; with the token file when `token`.
fn sluice(token: bool) -> (Process, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let (rules, token_file) = (
        rules.display().to_string(),
        token_file.display().to_string(),
    );
    let mut args = vec!["--rules", &rules];
    if token {
        args.extend(["--admin-token", &token_file]);
    }
    let (process, _, http) = start_binary_with_http(&args);
    (process, http, dir)
}

/// ACME with one more field.
fn with_field(field: &str) -> String {
    format!("{}, {field}}}", &ACME[..ACME.len() - 1])
}

fn write(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let bearer = format!("Bearer {TOKEN}");
    http_with_headers(addr, method, path, &[("Authorization", &bearer)], body)
}

fn hit(addr: SocketAddr, tenant: &str) -> u16 {
    let request = format!(
        r#"{{"domain": "billing", "descriptors": [{{"entries": [{{"key": "tenant", "value": "{tenant}"}}]}}]}}"#
    );
    http(addr, "POST", "/json", &request).0
}

#[test]
fn without_an_admin_token_writes_answer_403_naming_the_setting() {
    let (_process, addr, _dir) = sluice(false);
    for method in ["PUT", "DELETE"] {
        let (status, body) = write(addr, method, "/overrides/billing", ACME);
        assert_eq!(status, 403, "{method}: {body}");
        assert!(body.contains("admin_token"), "{method}: {body}");
    }
    let (status, body) = http(addr, "GET", "/overrides/billing", "");
    assert_eq!(status, 200, "reads need no token: {body}");
    assert_eq!(hit(addr, "acme"), 200);
}

#[test]
fn bad_bodies_unknown_domains_and_unmatched_descriptors_are_refused_with_the_reason() {
    let (_process, addr, _dir) = sluice(true);
    let refused = [
        (ACME.replace("minute", "fortnight"), 400, "unit must be"),
        (
            ACME.replace("4,", "4294967296,"),
            400,
            "requests_per_unit must be",
        ),
        (
            r#"{"descriptor": [], "requests_per_unit": 4, "unit": "minute"}"#.to_owned(),
            400,
            "descriptor must be",
        ),
        (ACME.replace("\"unit\"", "\"units\""), 400, "unknown field"),
        (with_field(r#""expires_at": "tomorrow""#), 400, "RFC 3339"),
        (
            with_field(r#""expires_at": "2001-01-01T00:00:00Z""#),
            400,
            "has passed",
        ),
        (ACME.replace("tenant", "region"), 404, "no rule of domain"),
    ];
    for (body, status, says) in refused {
        let (got, answer) = write(addr, "PUT", "/overrides/billing", &body);
        assert_eq!(got, status, "{body}: {answer}");
        assert!(answer.contains(says), "{body}: {answer}");
    }
    let (got, answer) = write(addr, "PUT", "/overrides/nowhere", ACME);
    assert_eq!(got, 404, "{answer}");
    assert!(answer.contains("no domain nowhere"), "{answer}");
    let (got, answer) = write(addr, "DELETE", "/overrides/billing", ACME);
    assert_eq!(got, 400, "DELETE takes only the descriptor: {answer}");
    let (got, answer) = write(
        addr,
        "DELETE",
        "/overrides/billing",
        r#"{"descriptor": [{"key": "tenant", "value": "acme"}]}"#,
    );
    assert_eq!(got, 404, "nothing to delete: {answer}");
}

#[test]
fn an_override_applies_at_once_keeps_the_counter_and_shows_in_rlconfig_and_metrics() {
    let (_process, addr, _dir) = sluice(true);
    // The rule's 2 a minute, used up.
    assert_eq!(
        [hit(addr, "acme"), hit(addr, "acme"), hit(addr, "acme")],
        [200, 200, 429]
    );

    let (status, body) = write(addr, "PUT", "/overrides/billing", ACME);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""before":"rule 2/minute""#), "{body}");
    // Same window: the counter (2 used) is kept, so 2 more fit, not 4.
    assert_eq!(
        [hit(addr, "acme"), hit(addr, "acme"), hit(addr, "acme")],
        [200, 200, 429]
    );
    // Only that exact descriptor.
    assert_eq!(
        [
            hit(addr, "globex"),
            hit(addr, "globex"),
            hit(addr, "globex")
        ],
        [200, 200, 429]
    );

    let (_, config) = http(addr, "GET", "/rlconfig", "");
    assert!(
        config.contains("# override billing tenant=acme: 4/minute"),
        "{config}"
    );
    let (_, metrics) = http(addr, "GET", "/metrics", "");
    for series in [
        r#"sluice_overrides{domain="billing"} 1"#,
        r#"sluice_override_writes_total{op="put",result="ok"} 1"#,
        r#"sluice_override_decisions_total{domain="billing"} 3"#,
    ] {
        assert!(metrics.contains(series), "{series} in:\n{metrics}");
    }

    let (status, body) = write(
        addr,
        "DELETE",
        "/overrides/billing",
        r#"{"descriptor": [{"key": "tenant", "value": "acme"}]}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (_, config) = http(addr, "GET", "/rlconfig", "");
    assert!(!config.contains("# override"), "{config}");
}

/// A binary whose log goes to a file, for the audit lines: the process,
/// its admin address and the log's path.
fn logged_sluice(
    dir: &std::path::Path,
    token_file: &str,
) -> (Process, SocketAddr, std::path::PathBuf) {
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let log = dir.join("sluice.log");
    let rules = rules.display().to_string();
    let child = support::serve_command(&["--rules", &rules, "--admin-token", token_file])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("run sluice");
    let process = Process(child);
    let http = support::eventually::eventually("sluice to log its admin address", || {
        // Whole lines only: the server may be writing the last one.
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.split_inclusive('\n')
            .filter(|line| line.ends_with('\n'))
            .find_map(support::listening)
            .map(|(_, http)| http)
    });
    (process, http, log)
}

#[test]
fn a_rotated_token_file_takes_over_and_every_write_is_an_audit_line_without_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let (_process, addr, log) = logged_sluice(dir.path(), &token_file.display().to_string());

    let (status, body) = write(addr, "PUT", "/overrides/billing", ACME);
    assert_eq!(status, 200, "{body}");
    let audit = std::fs::read_to_string(&log).unwrap();
    let line = audit
        .lines()
        .find(|l| l.contains("override set"))
        .unwrap_or_else(|| panic!("no audit line in:\n{audit}"));
    for part in [
        "caller=127.0.0.1:",
        "token:",
        "domain=billing",
        "descriptor=tenant=acme",
        "before=rule 2/minute",
        "after=4/minute",
    ] {
        assert!(line.contains(part), "{part} in {line}");
    }
    assert!(
        !audit.contains(TOKEN),
        "the token itself is never logged:\n{audit}"
    );

    // The Secret is rotated: the new token is taken within the reload
    // interval, and the old one is refused from then on.
    std::fs::write(&token_file, "rotated-token\n").unwrap();
    let delete = r#"{"descriptor": [{"key": "tenant", "value": "acme"}]}"#;
    support::eventually::eventually("the rotated token to be accepted", || {
        let (status, body) = http_with_headers(
            addr,
            "DELETE",
            "/overrides/billing",
            &[("Authorization", "Bearer rotated-token")],
            delete,
        );
        (status == 200)
            .then_some(())
            .ok_or(format!("{status}: {body}"))
    });
    let (status, _) = write(addr, "PUT", "/overrides/billing", ACME);
    assert_eq!(status, 401, "the old token after the rotation");
    let audit = std::fs::read_to_string(&log).unwrap();
    assert!(audit.contains("override deleted"), "{audit}");
}

/// The limit the limiter reports for `tenant=acme` (a weight-0 check).
async fn reported(
    limiter: &sluice::decision::Limiter<sluice::store::MemoryStore>,
) -> (u64, String) {
    let (limit, _) = decided(limiter, 0).await;
    limit
}

/// The limit reported for `tenant=acme` with weight `hits`, and whether it
/// was admitted.
async fn decided(
    limiter: &sluice::decision::Limiter<sluice::store::MemoryStore>,
    hits: u64,
) -> ((u64, String), bool) {
    use sluice::request::{Descriptor, Entry, Request};
    let request = Request {
        domain: "billing".into(),
        descriptors: vec![Descriptor {
            entries: vec![Entry {
                key: "tenant".into(),
                value: "acme".into(),
            }],
            hits_addend: Some(hits),
            ..Descriptor::default()
        }],
        hits_addend: 0,
    };
    let decision = limiter.decide(&request).await.unwrap();
    let limit = decision.statuses[0].limit.clone().expect("a limit");
    let reported = (limit.requests, limit.unit.proto_name().to_owned());
    (reported, decision.admitted)
}

#[tokio::test]
async fn an_override_in_another_unit_counts_apart_and_stops_applying_at_expires_at() {
    use sluice::decision::{Limiter, LimiterOptions};
    use sluice::limiter::ManualClock;
    use sluice::store::{CounterStore, MemoryStore, Override, OverrideEntry};
    use std::sync::Arc;

    let clock = Arc::new(ManualClock::new(support::T0));
    let store = MemoryStore::new(&Default::default(), clock.clone());
    let options = LimiterOptions {
        clock: clock.clone(),
        ..LimiterOptions::default()
    };
    let limiter = Limiter::with_options(support::rules(RULES), store, options);
    assert_eq!(reported(&limiter).await, (2, "MINUTE".to_owned()));
    // The rule's minute counter, full.
    for _ in 0..2 {
        assert!(decided(&limiter, 1).await.1);
    }
    assert!(!decided(&limiter, 1).await.1);

    let hourly = Override {
        domain: "billing".into(),
        descriptor: vec![OverrideEntry {
            key: "tenant".into(),
            value: "acme".into(),
        }],
        requests_per_unit: 1,
        unit: "hour".into(),
        expires_at_ms: Some(support::T0 + 60_000),
        set_by: "test".into(),
        set_at_ms: support::T0,
    };
    limiter.store().put_override(hourly, 10).await.unwrap();
    assert!(limiter.refresh_overrides().await.unwrap(), "a new version");
    assert!(
        !limiter.refresh_overrides().await.unwrap(),
        "nothing changed since"
    );
    // Another window: a counter of its own, empty (the minute's 2 do not
    // count against it): one admitted, the next refused.
    assert_eq!(decided(&limiter, 1).await, ((1, "HOUR".to_owned()), true));
    assert_eq!(decided(&limiter, 1).await, ((1, "HOUR".to_owned()), false));

    clock.set(support::T0 + 59_999);
    assert_eq!(reported(&limiter).await, (1, "HOUR".to_owned()));
    clock.set(support::T0 + 60_000);
    assert_eq!(
        reported(&limiter).await,
        (2, "MINUTE".to_owned()),
        "expired at expires_at: the rule's limit again"
    );
}
