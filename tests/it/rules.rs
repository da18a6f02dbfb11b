//! The rules engine through its public API: envoyproxy/ratelimit's matching
//! semantics, Sluice's extensions, every loader error with its file, line and
//! rule path, directory loading, the shipped examples and `sluice check-config`.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use sluice::limiter::{Algorithm, Role, Unit};
use sluice::request::Entry;
use sluice::rules::{
    ConfigError, Domain, Found, Limit, RuleSet, RulesSource, load_paths, parse_domain,
};

const FILE: &str = "rules/test.yaml";

/// `text` without the indentation common to its lines and without its first
/// line break, so that rules can be written indented inside a test and line 1
/// is the first line of the YAML.
fn yaml(text: &str) -> String {
    let text = text.strip_prefix('\n').unwrap_or(text);
    let indent = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    text.lines()
        .map(|l| l.get(indent..).unwrap_or("").trim_end())
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The 1-based line of the only line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    let found: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(found.len(), 1, "{needle:?} must be on exactly one line");
    found[0]
}

fn load(text: &str) -> Domain {
    parse_domain(FILE, text.as_bytes()).unwrap_or_else(|errors| {
        panic!("rules should load, got: {errors:#?}\n{text}");
    })
}

fn load_errors(text: &str) -> Vec<ConfigError> {
    match parse_domain(FILE, text.as_bytes()) {
        Ok(domain) => panic!("rules should be rejected, loaded {domain:?}\n{text}"),
        Err(errors) => errors,
    }
}

/// The only error of `text`.
fn only_error(text: &str) -> ConfigError {
    let mut errors = load_errors(text);
    assert_eq!(errors.len(), 1, "exactly one error expected: {errors:#?}");
    errors.remove(0)
}

#[track_caller]
fn assert_error(error: &ConfigError, line: usize, path: &str, fragment: &str) {
    assert_eq!(error.file, FILE, "{error:?}");
    assert_eq!(error.line, line, "line of {error:?}");
    assert_eq!(error.path, path, "path of {error:?}");
    assert!(
        error.message.contains(fragment),
        "{:?} should contain {fragment:?}",
        error.message
    );
}

/// The error of `text`, which must be one, at the line containing `at`.
#[track_caller]
fn assert_only_error(text: &str, at: &str, path: &str, fragment: &str) {
    assert_error(&only_error(text), line_of(text, at), path, fragment);
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

fn find<'a>(domain: &'a Domain, pairs: &[(&str, &str)]) -> Option<Found<'a>> {
    domain.find(&entries(pairs))
}

/// The path of the rule matching `pairs`, if any.
fn matched(domain: &Domain, pairs: &[(&str, &str)]) -> Option<String> {
    find(domain, pairs).map(|found| found.rule.path.clone())
}

/// The only limit of the only rule of a file whose `rate_limit` block is
/// `block` (indented by six spaces).
fn limit_of(block: &str) -> Limit {
    let text = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{block}");
    let domain = load(&text);
    let found = find(&domain, &[("k", "v")]).expect("the rule matches");
    let [limit] = found.rule.limits.as_slice() else {
        panic!("one limit expected: {:?}", found.rule);
    };
    Limit {
        spec: limit.spec,
        unit: limit.unit,
        name: limit.name.clone(),
        replaces: limit.replaces.clone(),
    }
}

/// envoyproxy/ratelimit's `test/config/basic_config.yaml`, the workhorse of
/// its matching tests.
fn basic_config() -> Domain {
    load(&yaml(
        r"
        domain: test-domain
        descriptors:
          # Top level key/value with no default rate limit.
          - key: key1
            value: value1
            descriptors:
              # 2nd level key only with default rate limit.
              - key: subkey1
                rate_limit:
                  unit: second
                  requests_per_unit: 5
              # 2nd level key/value with limit. Specific override at 2nd level.
              - key: subkey1
                value: subvalue1
                rate_limit:
                  unit: second
                  requests_per_unit: 10
              # 2nd level key/value with no rate limit. Explicit whitelist.
              - key: subkey1
                value: subvalue2
          # Top level key only default rate limit.
          - key: key2
            rate_limit:
              unit: minute
              requests_per_unit: 20
          # Top level key/value with limit. Specific override at 1st level.
          - key: key2
            value: value2
            rate_limit:
              unit: minute
              requests_per_unit: 30
          # Top level key/value with no limit. Explicit whitelist.
          - key: key2
            value: value3
          - key: key3
            rate_limit:
              unit: hour
              requests_per_unit: 1
          - key: key4
            rate_limit:
              unit: day
              requests_per_unit: 1
        ",
    ))
}

fn requests(found: Option<Found<'_>>) -> Option<u64> {
    let found = found?;
    assert_eq!(found.rule.limits.len(), 1);
    Some(found.rule.limits[0].spec.requests)
}

// ---------------------------------------------------------------------------
// Matching semantics
// ---------------------------------------------------------------------------

#[test]
fn exact_value_beats_wildcard_beats_key_only() {
    // The key-only rule is written first and the exact one last: precedence
    // does not depend on file order.
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: path
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: path
            value: /api/*
            rate_limit: {unit: second, requests_per_unit: 2}
          - key: path
            value: /api/health
            rate_limit: {unit: second, requests_per_unit: 3}
        ",
    ));
    assert_eq!(
        matched(&domain, &[("path", "/api/health")]).as_deref(),
        Some("d/path=/api/health")
    );
    assert_eq!(
        matched(&domain, &[("path", "/api/users")]).as_deref(),
        Some("d/path=/api/*")
    );
    assert_eq!(
        matched(&domain, &[("path", "/web")]).as_deref(),
        Some("d/path")
    );
    assert_eq!(requests(find(&domain, &[("path", "/api/health")])), Some(3));
    assert_eq!(requests(find(&domain, &[("path", "/api/users")])), Some(2));
    assert_eq!(requests(find(&domain, &[("path", "/web")])), Some(1));
}

#[test]
fn key_only_rule_matches_any_value_including_empty() {
    let domain = basic_config();
    for value in ["", "x", "anything at all", "value1"] {
        assert_eq!(
            matched(&domain, &[("key3", value)]).as_deref(),
            Some("test-domain/key3"),
            "value {value:?}"
        );
    }
}

#[test]
fn wildcards_are_tried_in_file_order() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: path
            value: /api/v1/*
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: path
            value: /api/*
            rate_limit: {unit: second, requests_per_unit: 2}
          - key: path
            value: /api/v1/users*
            rate_limit: {unit: second, requests_per_unit: 3}
        ",
    ));
    // Both the first and the third match; the first written wins even though
    // the third is more specific.
    assert_eq!(
        matched(&domain, &[("path", "/api/v1/users/7")]).as_deref(),
        Some("d/path=/api/v1/*")
    );
    assert_eq!(
        matched(&domain, &[("path", "/api/v2/x")]).as_deref(),
        Some("d/path=/api/*")
    );

    let reversed = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: path
            value: /api/*
            rate_limit: {unit: second, requests_per_unit: 2}
          - key: path
            value: /api/v1/*
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    ));
    assert_eq!(
        matched(&reversed, &[("path", "/api/v1/users/7")]).as_deref(),
        Some("d/path=/api/*")
    );
}

#[test]
fn wildcard_star_matches_prefix_suffix_middle_and_several() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: suffix
            value: foo*
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: prefix
            value: '*.example.com'
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: middle
            value: /api/*/users
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: several
            value: '*/v*/items/*'
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: any
            value: '*'
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    ));
    let cases: &[(&str, &str, bool)] = &[
        ("suffix", "foo", true),
        ("suffix", "foobar", true),
        ("suffix", "fo", false),
        ("suffix", "xfoo", false),
        ("prefix", "www.example.com", true),
        ("prefix", ".example.com", true),
        ("prefix", "example.com", false),
        ("prefix", "www.example.com.evil", false),
        ("middle", "/api/v1/users", true),
        ("middle", "/api//users", true),
        ("middle", "/api/a/b/users", true),
        ("middle", "/api/v1/users/7", false),
        ("middle", "/api/v1/groups", false),
        ("several", "shop/v2/items/42", true),
        ("several", "/v/items/", true),
        ("several", "shop/x2/items/42", false),
        ("several", "shop/v2/item/42", false),
        ("any", "", true),
        ("any", "whatever", true),
    ];
    for (key, value, expected) in cases {
        assert_eq!(
            find(&domain, &[(key, value)]).is_some(),
            *expected,
            "{key}={value:?}"
        );
    }
}

#[test]
fn limit_applies_only_at_the_depth_of_the_request() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit: {unit: second, requests_per_unit: 1}
            descriptors:
              - key: b
                descriptors:
                  - key: c
                    rate_limit: {unit: second, requests_per_unit: 3}
        ",
    ));
    assert_eq!(matched(&domain, &[("a", "1")]).as_deref(), Some("d/a"));
    assert_eq!(
        matched(&domain, &[("a", "1"), ("b", "2"), ("c", "3")]).as_deref(),
        Some("d/a/b/c")
    );
    // Shallower request against a deeper rule, no limit at that level.
    assert_eq!(matched(&domain, &[("a", "1"), ("b", "2")]), None);
    // Deeper request than any rule: the shallower limits do not apply.
    assert_eq!(
        matched(&domain, &[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]),
        None
    );
    assert_eq!(matched(&domain, &[("a", "1"), ("x", "2")]), None);
    // No entries, no rule.
    assert_eq!(matched(&domain, &[]), None);

    let basic = basic_config();
    assert_eq!(
        requests(find(&basic, &[("key2", "x"), ("subkey", "y")])),
        None
    );
    assert_eq!(requests(find(&basic, &[("key1", "value1")])), None);
}

#[test]
fn value_without_rate_limit_whitelists_even_with_a_key_only_sibling() {
    let domain = basic_config();
    assert_eq!(requests(find(&domain, &[("key2", "value3")])), None);
    assert_eq!(requests(find(&domain, &[("key2", "value2")])), Some(30));
    assert_eq!(requests(find(&domain, &[("key2", "value4")])), Some(20));
    // The same at the second level.
    assert_eq!(
        requests(find(
            &domain,
            &[("key1", "value1"), ("subkey1", "subvalue2")]
        )),
        None
    );
}

#[test]
fn unknown_key_or_domain_matches_nothing() {
    let domain = basic_config();
    assert!(find(&domain, &[("key5", "value1")]).is_none());
    assert!(
        find(&domain, &[("KEY3", "x")]).is_none(),
        "keys are case sensitive"
    );
    let set = RulesSource::Builtin.load().unwrap();
    assert!(set.domain("no-such-domain").is_none());
    assert!(RuleSet::default().domain("example").is_none());
}

#[test]
fn nested_descriptors_match_level_by_level() {
    let domain = basic_config();
    let both = [("key1", "value1"), ("subkey1", "subvalue1")];
    assert_eq!(
        matched(&domain, &both).as_deref(),
        Some("test-domain/key1=value1/subkey1=subvalue1")
    );
    assert_eq!(requests(find(&domain, &both)), Some(10));
    let key_only = [("key1", "value1"), ("subkey1", "other")];
    assert_eq!(
        matched(&domain, &key_only).as_deref(),
        Some("test-domain/key1=value1/subkey1")
    );
    assert_eq!(requests(find(&domain, &key_only)), Some(5));
    // The first level must match too: key1 has no key-only rule.
    assert_eq!(
        requests(find(
            &domain,
            &[("key1", "value2"), ("subkey1", "subvalue1")]
        )),
        None
    );
    // Order of entries matters.
    assert_eq!(
        requests(find(
            &domain,
            &[("subkey1", "subvalue1"), ("key1", "value1")]
        )),
        None
    );
}

#[test]
fn share_threshold_gives_every_matching_value_one_identity() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: files
            value: files/*
            share_threshold: true
            rate_limit: {unit: minute, requests_per_unit: 10}
        ",
    ));
    let a = find(&domain, &[("files", "files/a.pdf")]).unwrap();
    let b = find(&domain, &[("files", "files/b.csv")]).unwrap();
    assert_eq!(a.identity, b.identity);
    assert!(std::ptr::eq(a.rule, b.rule));
}

#[test]
fn wildcard_without_share_threshold_counts_each_value_apart() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: files
            value: files/*
            rate_limit: {unit: minute, requests_per_unit: 10}
        ",
    ));
    let a = find(&domain, &[("files", "files/a.pdf")]).unwrap();
    let b = find(&domain, &[("files", "files/b.csv")]).unwrap();
    assert!(std::ptr::eq(a.rule, b.rule));
    assert_ne!(a.identity, b.identity);
    let a_again = find(&domain, &[("files", "files/a.pdf")]).unwrap();
    assert_eq!(a.identity, a_again.identity);
}

#[test]
fn shared_wildcard_identity_still_separates_deeper_values() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: files
            value: files/*
            share_threshold: true
            descriptors:
              - key: user
                rate_limit: {unit: minute, requests_per_unit: 10}
        ",
    ));
    let id = |file: &str, user: &str| {
        find(&domain, &[("files", file), ("user", user)])
            .unwrap()
            .identity
    };
    assert_eq!(id("files/a", "alice"), id("files/b", "alice"));
    assert_ne!(id("files/a", "alice"), id("files/a", "bob"));
}

#[test]
fn key_only_match_gives_each_value_its_own_identity() {
    let domain = basic_config();
    let a = find(&domain, &[("key3", "a")]).unwrap();
    let b = find(&domain, &[("key3", "b")]).unwrap();
    assert!(std::ptr::eq(a.rule, b.rule));
    assert_ne!(a.identity, b.identity);
    // Identities include the key and the domain, so equal values of different
    // keys or domains never share a counter.
    let c = find(&domain, &[("key4", "a")]).unwrap();
    assert_ne!(a.identity, c.identity);
    let other = load(
        "domain: other\ndescriptors:\n  - key: key3\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    );
    assert_ne!(a.identity, find(&other, &[("key3", "a")]).unwrap().identity);
}

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
fn yaml_merge_key_of_a_scalar_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit: {<<: minute, requests_per_unit: 1}
        ",
    );
    assert_only_error(
        &text,
        "<<",
        "",
        "invalid YAML: merge key '<<' needs a map or a list of maps",
    );
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

// ---------------------------------------------------------------------------
// Config errors
// ---------------------------------------------------------------------------

#[test]
fn unknown_top_level_key_is_an_error() {
    let text = yaml(
        r"
        domain: d
        ratelimit: {}
        descriptors: []
        ",
    );
    assert_only_error(&text, "ratelimit", "", "unknown key 'ratelimit'");
}

#[test]
fn unknown_descriptor_key_is_an_error_naming_the_descriptor() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            value: b
            ratelimit:
              unit: second
        ",
    );
    assert_only_error(&text, "ratelimit", "d/a=b", "unknown key 'ratelimit'");
}

#[test]
fn unknown_rate_limit_key_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            descriptors:
              - key: b
                rate_limit:
                  unit: second
                  requestsperunit: 5
        ",
    );
    let errors = load_errors(&text);
    // The missing requests_per_unit is reported too, at the block's first
    // line, so before the misspelt key.
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_error(
        &errors[0],
        line_of(&text, "unit: second"),
        "d/a/b",
        "'requests_per_unit' is required",
    );
    assert_error(
        &errors[1],
        line_of(&text, "requestsperunit"),
        "d/a/b",
        "unknown key 'requestsperunit'",
    );
}

#[test]
fn bad_unit_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: foo
              requests_per_unit: 5
        ",
    );
    assert_only_error(&text, "unit: foo", "d/a", "invalid rate limit unit 'foo'");
}

#[test]
fn zero_duration_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              requests_per_unit: 5
              unit: 0s
        ",
    );
    assert_only_error(&text, "unit: 0s", "d/a", "must be positive");
}

#[test]
fn negative_duration_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              requests_per_unit: 5
              unit: -5s
        ",
    );
    assert_only_error(&text, "unit: -5s", "d/a", "must be positive");
}

#[test]
fn precision_that_does_not_divide_the_window_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: minute
              requests_per_unit: 5
              precision: 7s
        ",
    );
    assert_only_error(&text, "precision", "d/a", "must divide the window");
}

#[test]
fn precision_longer_than_the_window_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: minute
              requests_per_unit: 5
              precision: 2m
        ",
    );
    assert_only_error(&text, "precision", "d/a", "longer than the window");
}

#[test]
fn zero_precision_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: minute
              requests_per_unit: 5
              precision: 0s
        ",
    );
    assert_only_error(&text, "precision", "d/a", "invalid precision '0s'");
}

#[test]
fn precision_with_fixed_window_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: minute
              requests_per_unit: 5
              algorithm: fixed_window
              precision: 1s
        ",
    );
    assert_only_error(
        &text,
        "precision",
        "d/a",
        "'precision' applies only to algorithm sliding_window",
    );
}

#[test]
fn too_many_buckets_is_an_error() {
    // 3600 buckets are allowed (see explicit_precision_sets_the_bucket_size);
    // 86400 are not.
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: day
              requests_per_unit: 5
              precision: 1s
        ",
    );
    assert_only_error(
        &text,
        "precision",
        "d/a",
        "makes 86400 buckets; at most 3600",
    );
}

#[test]
fn duplicate_domains_across_files_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("a.yaml"),
        "domain: shared\ndescriptors: []\n",
    )
    .unwrap();
    fs::write(
        dir.path().join("b.yaml"),
        "# the same domain again\ndomain: shared\ndescriptors: []\n",
    )
    .unwrap();
    fs::write(
        dir.path().join("c.yaml"),
        "domain: other\ndescriptors: []\n",
    )
    .unwrap();
    let errors = load_paths(&[dir.path().to_path_buf()]).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let error = &errors[0];
    assert_eq!(error.file, dir.path().join("b.yaml").display().to_string());
    assert_eq!(error.line, 2);
    assert_eq!(error.path, "shared");
    assert!(
        error.message.contains("duplicate domain 'shared'"),
        "{error}"
    );
    assert!(
        error.message.contains("a.yaml"),
        "names the first file: {error}"
    );
}

#[test]
fn duplicate_descriptor_at_one_level_is_an_error() {
    let text = yaml(
        r"
        domain: test-domain
        descriptors:
          - key: key1
            value: value1
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: key1
            value: value2
          - key: key1 # again
            value: value1
            rate_limit: {unit: minute, requests_per_unit: 2}
        ",
    );
    assert_only_error(
        &text,
        "# again",
        "test-domain/key1=value1",
        "duplicate descriptor",
    );
}

#[test]
fn duplicate_key_only_and_wildcard_descriptors_are_errors() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
          - key: b
            value: x*
          - key: a # again
          - key: b # again
            value: x*
        ",
    );
    let errors = load_errors(&text);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_error(
        &errors[0],
        line_of(&text, "key: a # again"),
        "d/a",
        "duplicate descriptor",
    );
    assert_error(
        &errors[1],
        line_of(&text, "key: b # again"),
        "d/b=x*",
        "duplicate descriptor",
    );
}

#[test]
fn same_key_and_value_at_different_levels_is_not_a_duplicate() {
    let domain = load(&yaml(
        r"
        domain: d
        descriptors:
          - key: a
            value: x
            rate_limit: {unit: second, requests_per_unit: 1}
            descriptors:
              - key: a
                value: x
                rate_limit: {unit: second, requests_per_unit: 2}
        ",
    ));
    assert_eq!(requests(find(&domain, &[("a", "x"), ("a", "x")])), Some(2));
}

#[test]
fn replaces_naming_itself_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              name: mine
              unit: second
              requests_per_unit: 5
              replaces:
                - name: other
                - name: mine
        ",
    );
    assert_only_error(
        &text,
        "- name: mine",
        "d/a",
        "replaces should not contain name of same descriptor",
    );
}

#[test]
fn empty_replaces_name_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: second
              requests_per_unit: 5
              replaces:
                - name: ''
        ",
    );
    assert_only_error(
        &text,
        "- name: ''",
        "d/a",
        "should not have an empty replaces entry",
    );
}

#[test]
fn unlimited_with_a_unit_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            value: b
            rate_limit:
              unlimited: true
              unit: second
        ",
    );
    assert_only_error(
        &text,
        "unit: second",
        "d/a=b",
        "should not specify rate limit unit when unlimited",
    );
}

#[test]
fn empty_domain_is_an_error() {
    let text = yaml(
        r"
        # the domain is not on the first line of the map
        descriptors: []
        domain: ''
        ",
    );
    assert_only_error(
        &text,
        "domain: ''",
        "",
        "config file cannot have empty domain",
    );
    let missing = yaml(
        r"
        # no domain at all
        descriptors: []
        ",
    );
    assert_only_error(
        &missing,
        "descriptors",
        "",
        "config file cannot have empty domain",
    );
}

#[test]
fn empty_key_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            descriptors:
              - key: ''
                rate_limit: {unit: second, requests_per_unit: 1}
              - value: no-key
        ",
    );
    let errors = load_errors(&text);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_error(
        &errors[0],
        line_of(&text, "key: ''"),
        "d/a",
        "descriptor has empty key",
    );
    assert_error(
        &errors[1],
        line_of(&text, "value: no-key"),
        "d/a",
        "descriptor has empty key",
    );
}

#[test]
fn missing_requests_per_unit_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: second
        ",
    );
    assert_only_error(
        &text,
        "unit: second",
        "d/a",
        "'requests_per_unit' is required",
    );
}

#[test]
fn missing_unit_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              requests_per_unit: 5
        ",
    );
    assert_only_error(
        &text,
        "requests_per_unit",
        "d/a",
        "invalid rate limit unit ''",
    );
}

#[test]
fn bad_requests_per_unit_is_an_error() {
    for (value, fragment) in [
        ("-1", "must not be negative"),
        ("1.5", "must be a whole number"),
        ("ten", "must be a whole number"),
        ("'10'", "must be a whole number"),
        ("[10]", "must be a whole number"),
        ("4294967296", "must be at most 4294967295"),
        ("99999999999999999999999", "must be a whole number"),
    ] {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: {value}\n"
        );
        let error = only_error(&text);
        assert_error(&error, 6, "d/a", fragment);
    }
}

#[test]
fn share_threshold_on_a_value_without_a_wildcard_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            value: exact
            share_threshold: true
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    assert_only_error(
        &text,
        "key: a",
        "d/a=exact",
        "share_threshold can only be set on a value with a '*'",
    );
    let key_only = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            share_threshold: true
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    assert_only_error(&key_only, "key: a", "d/a", "share_threshold");
}

#[test]
fn rate_limit_and_rate_limits_together_are_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit: {unit: second, requests_per_unit: 1}
            rate_limits:
              - {unit: minute, requests_per_unit: 10}
        ",
    );
    assert_only_error(
        &text,
        "key: a",
        "d/a",
        "either 'rate_limit' or 'rate_limits'",
    );
}

#[test]
fn empty_rate_limits_and_unlimited_among_limits_are_errors() {
    let empty = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limits: []
        ",
    );
    assert_only_error(&empty, "rate_limits", "d/a", "at least one limit");
    let mixed = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limits:
              - unlimited: true
              - {unit: minute, requests_per_unit: 10}
        ",
    );
    assert_only_error(
        &mixed,
        "key: a",
        "d/a",
        "unlimited rate limit cannot be combined",
    );
}

#[test]
fn non_utf8_bytes_are_an_error_at_their_line() {
    let mut bytes = b"domain: d\ndescriptors:\n  - key: a\n    value: caf".to_vec();
    bytes.extend_from_slice(&[0xE9, b'\n']); // Latin-1 "é"
    bytes.extend_from_slice(b"    rate_limit: {unit: second, requests_per_unit: 1}\n");
    let errors = parse_domain(FILE, &bytes).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_error(&errors[0], 4, "", "not valid UTF-8");
}

#[test]
fn invalid_yaml_is_an_error_at_its_line() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
           value: b
        ",
    );
    assert_only_error(&text, "value: b", "", "invalid YAML");
    let unclosed = "domain: d\ndescriptors: [\n";
    let error = only_error(unclosed);
    assert!(error.message.contains("invalid YAML"), "{error}");
    assert!((2..=3).contains(&error.line), "{error:?}");
    // envoyproxy/ratelimit's bad_yaml.yaml.
    assert_error(&only_error("'''\n"), 1, "", "invalid YAML");
}

#[test]
fn list_that_is_not_a_list_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          key: a
        ",
    );
    assert_only_error(
        &text,
        "key: a",
        "d",
        "'descriptors' must be a list, found a map",
    );
    let nested = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            descriptors: b
        ",
    );
    assert_only_error(
        &nested,
        "descriptors: b",
        "d/a",
        "'descriptors' must be a list, found a scalar",
    );
    let limits = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limits:
              unit: second
              requests_per_unit: 1
        ",
    );
    assert_only_error(
        &limits,
        "unit: second",
        "d/a",
        "'rate_limits' must be a list, found a map",
    );
    let replaces = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: second
              requests_per_unit: 1
              replaces: other
        ",
    );
    assert_only_error(&replaces, "replaces", "d/a", "'replaces' must be a list");
}

#[test]
fn list_element_that_is_not_a_map_is_an_error() {
    // envoyproxy/ratelimit's non_map_list.yaml.
    let text = yaml(
        r"
        domain: d
        descriptors:
          - a
          - key: b
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    assert_only_error(
        &text,
        "- a",
        "d",
        "a descriptor must be a map, found a scalar",
    );
}

#[test]
fn several_documents_are_an_error() {
    let text = yaml(
        r"
        domain: first
        descriptors: []
        ---
        domain: second
        descriptors: []
        ",
    );
    assert_only_error(&text, "domain: second", "", "more than one YAML document");
}

#[test]
fn empty_file_is_an_error() {
    for text in ["", "\n\n", "# only a comment\n"] {
        let error = only_error(text);
        assert_error(&error, 0, "", "file is empty");
    }
}

#[test]
fn unknown_algorithm_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: second
              requests_per_unit: 1
              algorithm: leaky_bucket
        ",
    );
    assert_only_error(
        &text,
        "algorithm",
        "d/a",
        "unknown algorithm 'leaky_bucket'",
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
fn burst_without_token_bucket_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: second
              requests_per_unit: 1
              burst: 5
        ",
    );
    assert_only_error(
        &text,
        "burst",
        "d/a",
        "'burst' applies only to algorithm token_bucket",
    );
}

#[test]
fn non_boolean_flag_is_an_error() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            shadow_mode: 'true'
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    assert_only_error(
        &text,
        "shadow_mode",
        "d/a",
        "'shadow_mode' must be true or false",
    );
}

#[test]
fn every_error_of_a_file_is_reported() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: fortnight
              requests_per_unit: -3
              algorithm: fixed_window
              precision: 1s
          - key: b
            bogus: 1
            rate_limits:
              - {unit: second, requests_per_unit: 1.5}
              - {unit: 0s, requests_per_unit: 1}
          - key: c
            descriptors:
              - key: d
                value: e
                rate_limit: {unit: 5m, requests_per_unit: 1, precision: 7s}
        ",
    );
    let errors = load_errors(&text);
    let summary: Vec<(usize, &str)> = errors.iter().map(|e| (e.line, e.path.as_str())).collect();
    assert_eq!(
        summary,
        [
            (line_of(&text, "fortnight"), "d/a"),
            (line_of(&text, "-3"), "d/a"),
            (line_of(&text, "precision: 1s"), "d/a"),
            (line_of(&text, "bogus"), "d/b"),
            (line_of(&text, "1.5"), "d/b"),
            (line_of(&text, "0s"), "d/b"),
            (line_of(&text, "7s"), "d/c/d=e"),
        ],
        "{errors:#?}"
    );
}

#[test]
fn errors_are_reported_in_line_order() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: a
            descriptors:
              - key: b
                rate_limit: {unit: nope, requests_per_unit: 1}
          - key: c
            value: plain
            shadow_mode: maybe
            share_threshold: true
            rate_limit: {unit: second, requests_per_unit: 1}
            rate_limits: [{unit: second, requests_per_unit: 2}]
        ",
    );
    // Found in the order 8, 5, 11, 9, 9: children before their parent's
    // duplicate check, flags before the descriptor-wide checks.
    let errors = load_errors(&text);
    let at: Vec<(usize, &str)> = errors.iter().map(|e| (e.line, e.path.as_str())).collect();
    assert_eq!(
        at,
        [
            (5, "d/a"),
            (8, "d/a/b"),
            (9, "d/c=plain"),
            (9, "d/c=plain"),
            (11, "d/c=plain")
        ],
        "{errors:#?}"
    );
    assert!(errors[0].message.contains("duplicate descriptor"));
    assert!(errors[2].message.contains("share_threshold"));
    assert!(errors[3].message.contains("not both"));
    assert!(
        errors[4]
            .message
            .contains("'shadow_mode' must be true or false")
    );
}

#[test]
fn empty_domain_rule_paths_start_with_a_question_mark() {
    let text = yaml(
        r"
        domain: ''
        descriptors:
          - key: s
            value: plain
            rate_limit: {unit: fortnight, requests_per_unit: 1}
          - 7
          - value: no-key
        ",
    );
    let errors = load_errors(&text);
    assert_eq!(errors.len(), 4, "{errors:#?}");
    assert_error(&errors[0], 1, "", "config file cannot have empty domain");
    assert_error(
        &errors[1],
        line_of(&text, "fortnight"),
        "?/s=plain",
        "invalid rate limit unit",
    );
    assert_error(&errors[2], line_of(&text, "- 7"), "?", "must be a map");
    assert_error(
        &errors[3],
        line_of(&text, "no-key"),
        "?",
        "descriptor has empty key",
    );
}

#[test]
fn empty_key_errors_name_the_parent_path() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - value: top
          - key: a
            value: b
            descriptors:
              - value: no-key
                bogus: 1
        ",
    );
    let errors = load_errors(&text);
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert_error(
        &errors[0],
        line_of(&text, "value: top"),
        "d",
        "descriptor has empty key",
    );
    // Keys of a descriptor without a key are reported at its parent too.
    assert_error(
        &errors[1],
        line_of(&text, "value: no-key"),
        "d/a=b",
        "descriptor has empty key",
    );
    assert_error(
        &errors[2],
        line_of(&text, "bogus"),
        "d/a=b",
        "unknown key 'bogus'",
    );
}

#[test]
fn non_map_descriptor_items_name_the_parent_path() {
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            value: b
            descriptors:
              - key: c
                descriptors:
                  - [not, a, map]
        ",
    );
    assert_only_error(
        &text,
        "[not, a, map]",
        "d/a=b/c",
        "a descriptor must be a map, found a list",
    );
}

#[test]
fn every_error_is_reported_even_without_a_domain() {
    let text = yaml(
        r"
        descriptors:
          - key: a
            rate_limit: {unit: fortnight, requests_per_unit: 1}
        ",
    );
    let errors = load_errors(&text);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(errors[0].message.contains("empty domain"));
    assert_eq!(errors[1].line, line_of(&text, "fortnight"));
    assert!(
        errors[1]
            .message
            .contains("invalid rate limit unit 'fortnight'")
    );
}

#[test]
fn file_with_errors_yields_no_domain() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("good.yaml"),
        "domain: good\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    // One good rule and one bad one: the whole file is rejected.
    fs::write(
        dir.path().join("bad.yaml"),
        "domain: bad\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: nope, requests_per_unit: 1}\n",
    )
    .unwrap();
    let errors = load_paths(&[dir.path().to_path_buf()]).unwrap_err();
    let bad = dir.path().join("bad.yaml").display().to_string();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        (
            errors[0].file.as_str(),
            errors[0].line,
            errors[0].path.as_str()
        ),
        (bad.as_str(), 6, "bad/b")
    );
    // The good file alone loads.
    let set = load_paths(&[dir.path().join("good.yaml")]).unwrap();
    assert_eq!(
        set.domains().map(Domain::name).collect::<Vec<_>>(),
        ["good"]
    );
}

#[test]
fn error_display_is_file_line_path_message() {
    let error = ConfigError {
        file: "r.yaml".into(),
        line: 7,
        path: "d/a=b".into(),
        message: "oops".into(),
    };
    assert_eq!(error.to_string(), "r.yaml:7: d/a=b: oops");
    let whole_file = ConfigError {
        file: "r.yaml".into(),
        line: 0,
        path: String::new(),
        message: "file is empty".into(),
    };
    assert_eq!(whole_file.to_string(), "r.yaml: file is empty");
}

// ---------------------------------------------------------------------------
// Directory loading
// ---------------------------------------------------------------------------

fn rules_file(domain: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
    )
}

fn domain_names(set: &RuleSet) -> Vec<&str> {
    set.domains().map(Domain::name).collect()
}

#[test]
fn directory_loads_only_visible_yaml_and_yml_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    fs::write(p.join("a.yaml"), rules_file("alpha")).unwrap();
    fs::write(p.join("b.yml"), rules_file("beta")).unwrap();
    // Not rules: other extensions, dotfiles, editor leftovers.
    fs::write(p.join("c.json"), rules_file("gamma")).unwrap();
    fs::write(p.join("README"), "not yaml: [").unwrap();
    fs::write(p.join(".hidden.yaml"), rules_file("hidden")).unwrap();
    fs::write(p.join("d.yaml.bak"), "broken: [").unwrap();
    fs::write(p.join("d.yaml~"), "broken: [").unwrap();
    let set = load_paths(&[p.to_path_buf()]).unwrap();
    assert_eq!(domain_names(&set), ["alpha", "beta"]);
    assert_eq!(
        set.domain("alpha").unwrap().source(),
        p.join("a.yaml").display().to_string()
    );
}

#[test]
fn files_and_directories_can_be_mixed() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    fs::create_dir(&rules).unwrap();
    fs::write(rules.join("a.yaml"), rules_file("alpha")).unwrap();
    // A file named explicitly is loaded whatever its name.
    let extra = dir.path().join(".extra.conf");
    fs::write(&extra, rules_file("extra")).unwrap();
    let set = load_paths(&[rules, extra]).unwrap();
    assert_eq!(domain_names(&set), ["alpha", "extra"]);
}

#[test]
fn subdirectories_are_loaded_recursively_except_hidden_ones() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    fs::write(p.join("top.yaml"), rules_file("top")).unwrap();
    // A directory is walked whatever its name.
    fs::create_dir_all(p.join("team").join("deep.yaml")).unwrap();
    fs::write(p.join("team").join("a.yml"), rules_file("team-a")).unwrap();
    fs::write(p.join("team").join("notes.txt"), "not yaml: [").unwrap();
    fs::write(
        p.join("team").join("deep.yaml").join("b.yaml"),
        rules_file("team-b"),
    )
    .unwrap();
    // Hidden directories and files are skipped at any depth.
    fs::create_dir_all(p.join(".git")).unwrap();
    fs::write(p.join(".git").join("x.yaml"), "broken: [").unwrap();
    fs::create_dir_all(p.join("team").join(".cache")).unwrap();
    fs::write(p.join("team").join(".cache").join("y.yaml"), "broken: [").unwrap();
    fs::write(p.join("team").join(".z.yaml"), "broken: [").unwrap();

    let set = load_paths(&[p.to_path_buf()]).unwrap_or_else(|e| panic!("{e:#?}"));
    assert_eq!(domain_names(&set), ["team-a", "team-b", "top"]);
    assert_eq!(
        set.domain("team-b").unwrap().source(),
        p.join("team/deep.yaml/b.yaml").display().to_string()
    );
}

#[test]
fn subdirectory_files_are_loaded_in_path_order() {
    // The first file of a duplicated domain, in path order, is the one kept.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    fs::create_dir_all(p.join("a")).unwrap();
    fs::write(p.join("a").join("z.yaml"), rules_file("shared")).unwrap();
    fs::write(p.join("b.yaml"), rules_file("shared")).unwrap();
    let errors = load_paths(&[p.to_path_buf()]).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].file, p.join("b.yaml").display().to_string());
    assert!(errors[0].message.contains("a/z.yaml"), "{}", errors[0]);
}

#[test]
fn symlinked_directories_are_followed_without_looping() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    let shared = dir.path().join("elsewhere");
    fs::create_dir(&shared).unwrap();
    fs::write(shared.join("s.yaml"), rules_file("linked")).unwrap();
    let rules = p.join("rules");
    fs::create_dir_all(rules.join("sub")).unwrap();
    fs::write(rules.join("sub").join("r.yaml"), rules_file("real")).unwrap();
    symlink(&shared, rules.join("link")).unwrap();
    // Loops back up the tree, and a second way to the same files.
    symlink("..", rules.join("sub").join("up")).unwrap();
    symlink("../link", rules.join("sub").join("again")).unwrap();

    let set = load_paths(std::slice::from_ref(&rules)).unwrap_or_else(|e| panic!("{e:#?}"));
    assert_eq!(domain_names(&set), ["linked", "real"]);
    assert_eq!(
        set.domain("linked").unwrap().source(),
        rules.join("link/s.yaml").display().to_string()
    );
}

#[test]
fn file_named_twice_is_loaded_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    fs::write(p.join("one.yaml"), rules_file("one")).unwrap();
    fs::write(p.join("two.yaml"), rules_file("two")).unwrap();
    symlink("one.yaml", p.join("alias.yaml")).unwrap();
    let one = p.join("one.yaml");
    let set = load_paths(&[one.clone(), p.to_path_buf(), one.clone()])
        .unwrap_or_else(|e| panic!("{e:#?}"));
    assert_eq!(domain_names(&set), ["one", "two"]);
    // Labelled by the first name it was reached by.
    assert_eq!(
        set.domain("one").unwrap().source(),
        one.display().to_string()
    );

    let output = check_config(&[&one, p]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout.matches("ok: domain 'one'").count(), 1, "{stdout}");
}

#[test]
fn directory_without_rules_files_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    // Only things that are not rules files: still nothing to load.
    let other = dir.path().join("other");
    fs::create_dir_all(other.join("sub")).unwrap();
    fs::create_dir_all(other.join(".hidden")).unwrap();
    fs::write(other.join(".hidden").join("a.yaml"), rules_file("a")).unwrap();
    fs::write(other.join("rules.json"), rules_file("b")).unwrap();
    symlink("gone.yaml", other.join("dangling.yaml")).unwrap();
    for path in [&empty, &other] {
        let errors = load_paths(std::slice::from_ref(path)).unwrap_err();
        let label = path.display().to_string();
        assert_eq!(
            errors,
            [ConfigError {
                file: label.clone(),
                line: 0,
                path: String::new(),
                message: format!("no rules files (*.yaml, *.yml) found in {label}"),
            }]
        );
    }
    // Even beside a directory that has rules.
    let good = dir.path().join("good");
    fs::create_dir(&good).unwrap();
    fs::write(good.join("g.yaml"), rules_file("g")).unwrap();
    let errors = load_paths(&[good, empty.clone()]).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].file, empty.display().to_string());

    let output = check_config(&[&empty]);
    assert!(!output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no rules files"), "{stderr}");
}

#[test]
fn missing_path_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml");
    let errors = load_paths(std::slice::from_ref(&missing)).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].file, missing.display().to_string());
    assert_eq!(errors[0].line, 0);
    assert!(errors[0].message.contains("cannot read"), "{}", errors[0]);
}

#[test]
fn kubernetes_configmap_layout_loads_each_file_once() {
    // What the kubelet writes for a ConfigMap volume: the real files under a
    // timestamped directory, `..data` pointing at it, and visible symlinks.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    let real = p.join("..2026_01_01_00_00_00.000000000");
    fs::create_dir(&real).unwrap();
    fs::write(real.join("alpha.yaml"), rules_file("alpha")).unwrap();
    fs::write(real.join("beta.yml"), rules_file("beta")).unwrap();
    symlink(real.file_name().unwrap(), p.join("..data")).unwrap();
    symlink("..data/alpha.yaml", p.join("alpha.yaml")).unwrap();
    symlink("..data/beta.yml", p.join("beta.yml")).unwrap();
    // A dangling symlink is skipped, not an error.
    symlink("..data/gone.yaml", p.join("gone.yaml")).unwrap();

    let set = load_paths(&[p.to_path_buf()]).unwrap();
    assert_eq!(domain_names(&set), ["alpha", "beta"]);
    assert_eq!(
        set.domain("alpha").unwrap().source(),
        p.join("alpha.yaml").display().to_string()
    );
    assert!(
        set.domain("alpha")
            .unwrap()
            .find(&[Entry::new("k", "v")])
            .is_some()
    );
}

// ---------------------------------------------------------------------------
// Shipped examples
// ---------------------------------------------------------------------------

fn manifest_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

#[test]
fn builtin_example_rules_load() {
    let set = RulesSource::Builtin
        .load()
        .unwrap_or_else(|e| panic!("{e:#?}"));
    let example = set.domain("example").expect("the example domain");
    // The example's own comment: `--descriptor remote_address=192.0.2.7`.
    let found = example
        .find(&[Entry::new("remote_address", "192.0.2.7")])
        .unwrap();
    assert_eq!(found.rule.limits[0].name.as_deref(), Some("per-address"));
    assert!(
        example
            .find(&[Entry::new("remote_address", "10.0.0.1")])
            .is_none()
    );
}

#[test]
fn example_rules_file_loads_and_matches_the_builtin_copy() {
    let set =
        load_paths(&[manifest_path("examples/rules.yaml")]).unwrap_or_else(|e| panic!("{e:#?}"));
    let builtin = RulesSource::Builtin.load().unwrap();
    let from_file = set.domain("example").unwrap();
    assert_eq!(
        from_file.rules(),
        builtin.domain("example").unwrap().rules()
    );
    let source = RulesSource::Paths(vec![manifest_path("examples/rules.yaml")]);
    assert_eq!(domain_names(&source.load().unwrap()), ["example"]);
}

// ---------------------------------------------------------------------------
// `sluice check-config`
// ---------------------------------------------------------------------------

fn check_config(paths: &[&Path]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check-config")
        .args(paths)
        .output()
        .expect("running sluice")
}

#[test]
fn check_config_accepts_valid_rules() {
    let output = check_config(&[&manifest_path("examples/rules.yaml")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout.contains("ok: domain 'example'"), "{stdout}");
}

#[test]
fn check_config_reports_every_error_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    let text = yaml(
        r"
        domain: d
        descriptors:
          - key: a
            rate_limit:
              unit: fortnight
              requests_per_unit: 1
          - key: b
            value: c
            rate_limit:
              unit: second
              requests_per_unit: -1
        ",
    );
    fs::write(&bad, &text).unwrap();
    let output = check_config(&[&bad]);
    assert!(!output.status.success(), "{output:?}");
    assert_ne!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let file = bad.display();
    for expected in [
        format!(
            "{file}:{}: d/a: invalid rate limit unit 'fortnight'",
            line_of(&text, "fortnight")
        ),
        format!(
            "{file}:{}: d/b=c: 'requests_per_unit' must not be negative",
            line_of(&text, "-1")
        ),
    ] {
        assert!(stderr.contains(&expected), "{expected:?} not in:\n{stderr}");
    }
    assert!(stderr.contains("2 error(s)"), "{stderr}");
    assert!(output.stdout.is_empty(), "no domain is ok: {output:?}");
}

#[test]
fn check_config_fails_on_a_missing_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let output = check_config(&[&missing]);
    assert!(!output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{}: cannot read", missing.display())),
        "{stderr}"
    );
}
