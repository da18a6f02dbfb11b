//! What a matched rule carries: its limits in file order, roles, units,
//! precision, algorithms, and the YAML forms (anchors, merge keys) that load.

use super::*;

#[test]
fn rate_limits_attach_every_limit_in_file_order() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: api_key
            rate_limits:
              - name: per-minute
                unit: minute
                requests_per_unit: 100
              - name: min-gap
                unit: 2s
                requests_per_unit: 1
                algorithm: fixed_window
        ",
    ));
    let rule = find(&domain, &[("api_key", "k")]).unwrap().rule;
    assert!(!rule.unlimited);
    let summary: Vec<_> = rule
        .limits
        .iter()
        .map(|l| {
            (
                l.name.as_deref(),
                l.spec.requests,
                l.spec.window.duration_ms,
                l.spec.window.algorithm,
                l.unit,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                Some("per-minute"),
                100,
                60_000,
                Algorithm::SlidingWindow {
                    precision_ms: 6_000
                },
                Unit::Minute
            ),
            (
                Some("min-gap"),
                1,
                2_000,
                Algorithm::FixedWindow,
                Unit::Unknown
            ),
        ]
    );
}

#[test]
fn unlimited_rule_is_found_and_has_no_limits() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: plan
            value: enterprise
            rate_limit:
              unlimited: true
          - key: plan
            value: gold
            rate_limit:
              unlimited: true
              requests_per_unit: 5
              name: gold
        ",
    ));
    for plan in ["enterprise", "gold"] {
        let rule = find(&domain, &[("plan", plan)]).unwrap().rule;
        assert!(rule.unlimited, "{plan}");
        assert!(rule.limits.is_empty(), "{plan}");
    }
}

#[test]
fn shadow_mode_and_quota_mode_set_the_role() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: enforce
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: shadow
            shadow_mode: true
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: quota
            quota_mode: true
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: off
            shadow_mode: false
            quota_mode: false
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: yaml11
            shadow_mode: yes
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    ));
    let role = |key: &str| find(&domain, &[(key, "v")]).unwrap().rule.role;
    assert_eq!(role("enforce"), Role::Enforce);
    assert_eq!(role("shadow"), Role::Shadow);
    assert_eq!(role("quota"), Role::Quota);
    assert_eq!(role("off"), Role::Enforce);
    assert_eq!(role("yaml11"), Role::Shadow);
}

#[test]
fn detailed_metric_is_carried_on_the_rule() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: a
            detailed_metric: true
            value_to_metric: true
            metadata: {owner: team-a, anything: [1, 2]}
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: b
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    ));
    assert!(find(&domain, &[("a", "v")]).unwrap().rule.detailed_metric);
    assert!(!find(&domain, &[("b", "v")]).unwrap().rule.detailed_metric);
}

#[test]
fn name_and_replaces_are_carried_on_the_limit() {
    let limit = limit_of(
        "      unit: minute\n      requests_per_unit: 5\n      name: specific\n      replaces:\n        - name: general\n        - name: other\n",
    );
    assert_eq!(limit.name.as_deref(), Some("specific"));
    assert_eq!(limit.replaces, ["general", "other"]);
    let plain = limit_of("      unit: minute\n      requests_per_unit: 5\n");
    assert_eq!(plain.name, None);
    assert!(plain.replaces.is_empty());
}

#[test]
fn soft_ratio_is_carried_on_the_limit_and_shown_in_rlconfig() {
    use sluice::limiter::SoftRatio;
    let limit =
        limit_of("      unit: minute\n      requests_per_unit: 100\n      soft_ratio: 0.8\n");
    assert_eq!(limit.soft_ratio, Some(SoftRatio::new(0.8).unwrap()));
    assert!(limit.to_string().ends_with(" soft_ratio=0.8"), "{limit}");
    // 1 is a share too (the whole limit); absent or null is none, and the
    // limiter's default then applies.
    let whole = limit_of("      unit: minute\n      requests_per_unit: 5\n      soft_ratio: 1\n");
    assert_eq!(whole.soft_ratio, Some(SoftRatio::new(1.0).unwrap()));
    for plain in [
        "      unit: minute\n      requests_per_unit: 5\n",
        "      unit: minute\n      requests_per_unit: 5\n      soft_ratio: ~\n",
    ] {
        let plain = limit_of(plain);
        assert_eq!(plain.soft_ratio, None);
        assert!(!plain.to_string().contains("soft_ratio"), "{plain}");
    }
    // Each limit of `rate_limits` has its own.
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: k
            rate_limits:
              - {unit: second, requests_per_unit: 10}
              - {unit: hour, requests_per_unit: 1000, soft_ratio: 0.9}
        ",
    ));
    let rule = find(&domain, &[("k", "v")]).unwrap().rule;
    let ratios: Vec<_> = rule.limits.iter().map(|l| l.soft_ratio).collect();
    assert_eq!(ratios, [None, Some(SoftRatio::new(0.9).unwrap())]);
}

#[test]
fn named_units_are_case_insensitive_and_month_and_year_are_fixed_lengths() {
    const DAY: u64 = 86_400_000;
    let cases = [
        ("second", 1_000, Unit::Second),
        ("SECOND", 1_000, Unit::Second),
        ("Minute", 60_000, Unit::Minute),
        ("hour", 3_600_000, Unit::Hour),
        ("DaY", DAY, Unit::Day),
        ("week", 7 * DAY, Unit::Week),
        ("month", 30 * DAY, Unit::Month),
        ("YEAR", 365 * DAY, Unit::Year),
    ];
    for (unit, ms, reported) in cases {
        let limit = limit_of(&format!("      unit: {unit}\n      requests_per_unit: 7\n"));
        assert_eq!(limit.spec.window.duration_ms, ms, "{unit}");
        assert_eq!(limit.unit, reported, "{unit}");
        assert_eq!(limit.spec.requests, 7);
    }
}

#[test]
fn duration_units_report_a_named_unit_only_when_the_window_is_exactly_one() {
    let cases = [
        ("90s", 90_000, Unit::Unknown),
        ("5m", 300_000, Unit::Unknown),
        ("1h30m", 5_400_000, Unit::Unknown),
        ("2s", 2_000, Unit::Unknown),
        ("250ms", 250, Unit::Unknown),
        ("1000ms", 1_000, Unit::Second),
        ("60s", 60_000, Unit::Minute),
        ("1m", 60_000, Unit::Minute),
        ("60m", 3_600_000, Unit::Hour),
        ("24h", 86_400_000, Unit::Day),
        ("7d", 604_800_000, Unit::Week),
        ("1w", 604_800_000, Unit::Week),
        ("30d", 2_592_000_000, Unit::Month),
        ("365d", 31_536_000_000, Unit::Year),
        ("2d", 172_800_000, Unit::Unknown),
    ];
    for (unit, ms, reported) in cases {
        let limit = limit_of(&format!("      unit: {unit}\n      requests_per_unit: 1\n"));
        assert_eq!(
            (limit.spec.window.duration_ms, limit.unit),
            (ms, reported),
            "{unit}"
        );
    }
}

#[test]
fn default_precision_is_a_tenth_of_the_window_when_it_divides() {
    let cases = [
        ("second", 100),
        ("minute", 6_000),
        ("hour", 360_000),
        ("2s", 200),
        ("90s", 9_000),
        // Not divisible by 10: the largest divisor up to 10 is used.
        ("9ms", 1),
        ("21ms", 3),
        ("7ms", 1),
        // A prime window above 10 ms has one bucket.
        ("11ms", 11),
    ];
    for (unit, precision_ms) in cases {
        let limit = limit_of(&format!("      unit: {unit}\n      requests_per_unit: 1\n"));
        assert_eq!(
            limit.spec.window.algorithm,
            Algorithm::SlidingWindow { precision_ms },
            "{unit}"
        );
    }
}

#[test]
fn explicit_precision_sets_the_bucket_size() {
    let limit = limit_of("      unit: 5m\n      requests_per_unit: 20\n      precision: 30s\n");
    assert_eq!(
        limit.spec.window.algorithm,
        Algorithm::SlidingWindow {
            precision_ms: 30_000
        }
    );
    let whole = limit_of("      unit: minute\n      requests_per_unit: 20\n      precision: 1m\n");
    assert_eq!(
        whole.spec.window.algorithm,
        Algorithm::SlidingWindow {
            precision_ms: 60_000
        }
    );
    let max = limit_of("      unit: hour\n      requests_per_unit: 20\n      precision: 1s\n");
    assert_eq!(
        max.spec.window.algorithm,
        Algorithm::SlidingWindow {
            precision_ms: 1_000
        }
    );
    let named = limit_of(
        "      unit: minute\n      requests_per_unit: 20\n      algorithm: sliding_window\n      precision: 15s\n",
    );
    assert_eq!(
        named.spec.window.algorithm,
        Algorithm::SlidingWindow {
            precision_ms: 15_000
        }
    );
}

#[test]
fn fixed_window_algorithm_is_selected_by_name() {
    let limit = limit_of(
        "      unit: hour\n      requests_per_unit: 1000\n      algorithm: fixed_window\n",
    );
    assert_eq!(limit.spec.window.algorithm, Algorithm::FixedWindow);
    assert_eq!(limit.spec.window.duration_ms, 3_600_000);
    assert_eq!(limit.unit, Unit::Hour);
}

#[test]
fn requests_per_unit_accepts_zero_and_the_largest_u32() {
    assert_eq!(
        limit_of("      unit: second\n      requests_per_unit: 0\n")
            .spec
            .requests,
        0
    );
    assert_eq!(
        limit_of("      unit: second\n      requests_per_unit: 4294967295\n")
            .spec
            .requests,
        u64::from(u32::MAX)
    );
}

#[test]
fn yaml_anchors_and_flow_style_are_accepted() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit: &standard
              unit: minute
              requests_per_unit: 42
          - {key: b, rate_limit: *standard}
        ",
    ));
    assert_eq!(requests(find(&domain, &[("a", "x")])), Some(42));
    assert_eq!(requests(find(&domain, &[("b", "x")])), Some(42));
}

#[test]
fn yaml_merge_keys_are_applied_and_explicit_keys_win() {
    // Go's yaml.v2 (and so envoyproxy/ratelimit) applies merge keys.
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit: &lim
              unit: minute
              requests_per_unit: 10
              name: a
          - key: b
            rate_limit: {<<: *lim, name: b}
          - key: c
            rate_limit:
              requests_per_unit: 30
              <<: *lim
          - key: e
            rate_limit:
              <<: [{unit: second, name: first}, *lim]
        ",
    );
    let domain = load(&text);
    let limit = |key| {
        let found = find(&domain, &[(key, "x")]).expect("the rule matches");
        let limit = &found.rule.limits[0];
        (
            limit.spec.requests,
            limit.unit,
            limit.name.as_deref().map(str::to_owned),
        )
    };
    assert_eq!(limit("b"), (10, Unit::Minute, Some("b".into())));
    // An explicit key wins even when written before the merge key.
    assert_eq!(limit("c"), (30, Unit::Minute, Some("a".into())));
    // In a list, earlier maps win over later ones.
    assert_eq!(limit("e"), (10, Unit::Second, Some("first".into())));
}

#[test]
fn yaml_merged_values_are_reported_at_their_own_line() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            value: x
            rate_limit: &lim
              unit: fortnight
              requests_per_unit: 1
          - key: b
            rate_limit: {<<: *lim, requests_per_unit: 2}
        ",
    );
    let errors = load_errors(&text);
    let at: Vec<(usize, &str)> = errors.iter().map(|e| (e.line, e.path.as_str())).collect();
    let line = line_of(&text, "fortnight");
    assert_eq!(at, [(line, "d/a=x"), (line, "d/b")], "{errors:#?}");
}

#[test]
fn null_rate_limit_is_no_limit_and_whitelists() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: a
            value: free
            rate_limit: ~
          - key: a
            value: also-free
            rate_limits: null
          - key: b
            rate_limit:
          - key: c
            rate_limit: ~
            rate_limits:
              - {unit: second, requests_per_unit: 3}
        ",
    ));
    assert_eq!(requests(find(&domain, &[("a", "other")])), Some(1));
    assert_eq!(requests(find(&domain, &[("a", "free")])), None);
    assert_eq!(requests(find(&domain, &[("a", "also-free")])), None);
    assert_eq!(requests(find(&domain, &[("b", "x")])), None);
    // A null `rate_limit` beside `rate_limits` is absent, not a conflict.
    assert_eq!(requests(find(&domain, &[("c", "x")])), Some(3));
}

#[test]
fn file_starting_with_a_byte_order_mark_loads() {
    let text = "\u{feff}domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let domain = load(text);
    assert_eq!(domain.name(), "d");
    assert_eq!(requests(find(&domain, &[("a", "x")])), Some(1));
}

#[test]
fn domain_lists_every_rule_and_its_source() {
    let domain = basic_config();
    assert_eq!(domain.name(), "test-domain");
    assert_eq!(domain.source(), FILE);
    let paths: Vec<&str> = domain.rules().iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "test-domain/key1=value1/subkey1=subvalue1",
            "test-domain/key1=value1/subkey1",
            "test-domain/key2=value2",
            "test-domain/key2",
            "test-domain/key3",
            "test-domain/key4",
        ]
    );
}

/// The limit spec that `a=x` matches.
fn first_spec(text: &str) -> sluice::limiter::LimitSpec {
    let domain = load(text);
    domain
        .find(&[Entry::new("a", "x")])
        .expect("a limit for a=x")
        .rule
        .limits[0]
        .spec
}

#[test]
fn token_bucket_burst_defaults_to_the_limit_and_can_be_set() {
    let base = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: minute\n      requests_per_unit: 60\n      algorithm: token_bucket\n";
    let spec = first_spec(base);
    assert_eq!(spec.window.algorithm, Algorithm::TokenBucket { burst: 60 });
    assert_eq!(spec.capacity(), 60);
    let spec = first_spec(&format!("{base}      burst: 5\n"));
    assert_eq!(spec.window.algorithm, Algorithm::TokenBucket { burst: 5 });
    assert_eq!((spec.requests, spec.capacity()), (60, 5));
}

#[test]
fn sliding_log_loads_and_is_capped_in_size() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: 2s\n      requests_per_unit: 1\n      algorithm: sliding_log\n";
    assert_eq!(first_spec(text).window.algorithm, Algorithm::SlidingLog);
    let big = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 10001\n      algorithm: sliding_log\n";
    assert_error(
        &only_error(big),
        7,
        "d/a",
        "requests_per_unit must be at most 10000",
    );
}

#[test]
fn token_bucket_and_sliding_log_take_no_precision_and_burst_is_positive() {
    for algorithm in ["token_bucket", "sliding_log"] {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: {algorithm}\n      precision: 100ms\n"
        );
        assert_error(
            &only_error(&text),
            8,
            "d/a",
            "'precision' applies only to algorithm sliding_window",
        );
    }
    let zero = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: token_bucket\n      burst: 0\n";
    assert_error(&only_error(zero), 8, "d/a", "'burst' must be at least 1");
}

#[test]
fn calendar_periods_load_with_their_zone_and_report_the_named_unit() {
    use sluice::limiter::calendar::{Calendar, Period, Zone};
    for (unit, period, zone) in [
        ("day", Period::Day, "UTC"),
        ("week", Period::Week, "America/New_York"),
        ("Month", Period::Month, "Europe/Paris"),
        ("year", Period::Year, "Asia/Tokyo"),
    ] {
        let limit = limit_of(&format!(
            "      unit: {unit}\n      requests_per_unit: 10000000\n      calendar: {zone}\n"
        ));
        let calendar = Calendar {
            period,
            zone: Zone::get(zone).expect("a zone"),
        };
        assert_eq!(limit.spec.window.algorithm, Algorithm::Calendar(calendar));
        // The counter is named by the unit's nominal length, as a fixed
        // window of that unit would be.
        assert_eq!(limit.spec.window.duration_ms, period.nominal_ms());
        assert_eq!(limit.unit.proto_name(), unit.to_uppercase());
    }
    // `algorithm: fixed_window` may be said.
    let limit = limit_of(
        "      unit: day\n      requests_per_unit: 5\n      algorithm: fixed_window\n      calendar: UTC\n",
    );
    assert!(matches!(
        limit.spec.window.algorithm,
        Algorithm::Calendar(_)
    ));
}
