//! `penalty:` on a rate limit: the values a good one loads with, its
//! defaults, `/rlconfig`'s text, and the refusals that need loops over
//! values or the binary, with their file, line and key (the others are
//! fixtures: `tests/fixtures/invalid-rules/penalty_*.yaml`).

use sluice::limiter::Penalty;

use super::*;

const MIN: u64 = 60_000;
const HOUR: u64 = 60 * MIN;
const DAY: u64 = 24 * HOUR;

/// A limit of 5 a minute (`algorithm`, when given, added) with `penalty`
/// (indented by eight spaces) under it.
fn with_penalty(algorithm: &str, penalty: &str) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: login\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n{algorithm}      penalty:\n{penalty}"
    )
}

#[test]
fn a_penalty_loads_with_its_values_and_shows_in_rlconfig() {
    let limit = limit_of(
        "      unit: minute\n      requests_per_unit: 5\n      penalty:\n        block: 15m\n        escalate: 2\n        max_block: 4h\n        forget_after: 24h\n",
    );
    assert_eq!(
        limit.spec.penalty,
        Some(Penalty {
            block_ms: 15 * MIN,
            escalate: 2,
            max_block_ms: 4 * HOUR,
            forget_after_ms: DAY,
        })
    );
    assert!(
        limit
            .to_string()
            .ends_with(" penalty block=15m escalate=2 max_block=4h forget_after=1d"),
        "{limit}"
    );
}

#[test]
fn a_penalty_defaults_to_no_escalation_a_day_long_at_most_forgotten_after_a_day() {
    let penalty = |text: &str| limit_of(text).spec.penalty;
    assert_eq!(
        penalty("      unit: minute\n      requests_per_unit: 5\n      penalty: {block: 15m}\n"),
        Some(Penalty {
            block_ms: 15 * MIN,
            escalate: 1,
            max_block_ms: DAY,
            forget_after_ms: DAY,
        })
    );
    // The longest block is never shorter than the first.
    let long =
        penalty("      unit: hour\n      requests_per_unit: 5\n      penalty: {block: 2d}\n");
    assert_eq!(long.map(|p| p.max_block_ms), Some(2 * DAY));
    // Absent or null: none, and /rlconfig says nothing of it.
    for text in [
        "      unit: minute\n      requests_per_unit: 5\n",
        "      unit: minute\n      requests_per_unit: 5\n      penalty: ~\n",
    ] {
        let limit = limit_of(text);
        assert_eq!(limit.spec.penalty, None);
        assert!(!limit.to_string().contains("penalty"), "{limit}");
    }
}

#[test]
fn a_block_as_long_as_the_window_loads_on_each_rate_algorithm() {
    // A sliding window's count reaches one bucket past the window.
    for (algorithm, block, shortest) in [
        ("", "66s", 66_000),
        ("      algorithm: fixed_window\n", "1m", MIN),
        ("      algorithm: token_bucket\n", "1m", MIN),
        ("      algorithm: sliding_log\n", "1m", MIN),
        ("      precision: 1s\n", "61s", 61_000),
    ] {
        let domain = load(&with_penalty(
            algorithm,
            &format!("        block: {block}\n"),
        ));
        let rule = find(&domain, &[("login", "x")]).unwrap().rule;
        assert_eq!(
            rule.limits[0].spec.penalty.map(|p| p.block_ms),
            Some(shortest),
            "{algorithm}"
        );
    }
    // Each limit of `rate_limits` has its own.
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: k
            rate_limits:
              - {unit: second, requests_per_unit: 10, penalty: {block: 1m, escalate: 3}}
              - {unit: hour, requests_per_unit: 1000}
        ",
    ));
    let rule = find(&domain, &[("k", "v")]).unwrap().rule;
    let escalations: Vec<_> = rule
        .limits
        .iter()
        .map(|l| l.spec.penalty.map(|p| p.escalate))
        .collect();
    assert_eq!(escalations, [Some(3), None]);
}

#[test]
fn an_escalation_outside_1_to_1000_or_not_whole_is_refused() {
    for (value, found) in [
        ("0", "0"),
        ("1001", "1001"),
        ("1.5", "1.5"),
        ("-2", "-2"),
        ("\"2\"", "the string \"2\""),
        ("[2]", "a list"),
    ] {
        let text = with_penalty(
            "",
            &format!("        block: 15m\n        escalate: {value}\n"),
        );
        assert_only_error(
            &text,
            "escalate:",
            "d/login",
            &format!("'penalty.escalate' must be a whole number from 1 to 1000 (found {found})"),
        );
    }
}

#[test]
fn zero_negative_overlong_or_unitless_durations_are_refused_naming_their_key() {
    for key in ["block", "max_block", "forget_after"] {
        let others = |skip: &str| {
            ["block: 15m", "max_block: 1h", "forget_after: 1h"]
                .into_iter()
                .filter(|l| !l.starts_with(&format!("{skip}:")))
                .map(|l| format!("        {l}\n"))
                .collect::<String>()
        };
        for (value, fragment) in [
            ("0s", "a duration must be positive"),
            ("-5m", "a duration must be positive"),
            ("900", "needs a unit suffix"),
            ("367d", "must be at most 366 days"),
        ] {
            let text = with_penalty("", &format!("{}        {key}: {value}\n", others(key)));
            let error = only_error(&text);
            assert_error(
                &error,
                line_of(&text, &format!("{key}: {value}")),
                "d/login",
                &format!("'penalty.{key}'"),
            );
            assert!(error.message.contains(fragment), "{key}: {value}: {error}");
        }
    }
    // 366 days is the longest.
    let limit = limit_of(
        "      unit: minute\n      requests_per_unit: 5\n      penalty: {block: 366d, forget_after: 366d}\n",
    );
    assert_eq!(limit.spec.penalty.map(|p| p.block_ms), Some(366 * DAY));
}

#[test]
fn check_config_names_the_file_line_and_key_of_a_penalty_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("login.yaml");
    let text = with_penalty("", "        block: 15m\n        escalate: 0\n");
    fs::write(&file, &text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "{}:{}: d/login: 'penalty.escalate' must be a whole number",
        file.display(),
        line_of(&text, "escalate:")
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

/// The rules' penalty reaches the store: a limit of 2 a minute blocks its
/// third request for 15 minutes, then (a second offence of the streak)
/// for 30, and blocks only the identity it refused.
#[tokio::test]
async fn a_rules_penalty_blocks_through_the_service() {
    use crate::support::{Harness, OK, OVER, descriptor};
    use sluice::proto as pb;

    let harness = Harness::new(&yaml(
        r"
        domain: auth
        descriptors:
          - key: login
            rate_limit:
              unit: minute
              requests_per_unit: 2
              algorithm: fixed_window
              penalty: {block: 15m, escalate: 2, max_block: 1h}
        ",
    ));
    let login = |user: &str| pb::RateLimitRequest {
        domain: "auth".into(),
        descriptors: vec![descriptor(&[("login", user)])],
        hits_addend: 0,
    };
    let answer = |response: pb::RateLimitResponse| {
        let status = &response.statuses[0];
        let reset = status.duration_until_reset.expect("a reset");
        (status.code, reset.seconds)
    };
    for _ in 0..2 {
        assert_eq!(harness.ok(login("ann")).await.statuses[0].code, OK);
    }
    assert_eq!(answer(harness.ok(login("ann")).await), (OVER, 15 * 60));
    harness.clock.advance(10 * MIN);
    assert_eq!(
        answer(harness.ok(login("ann")).await),
        (OVER, 5 * 60),
        "blocked, not escalated, while the block lasts"
    );
    assert_eq!(harness.ok(login("bob")).await.statuses[0].code, OK);
    harness.clock.advance(5 * MIN);
    for _ in 0..2 {
        assert_eq!(harness.ok(login("ann")).await.statuses[0].code, OK);
    }
    assert_eq!(answer(harness.ok(login("ann")).await), (OVER, 30 * 60));
}
