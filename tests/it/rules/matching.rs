//! envoyproxy/ratelimit's matching semantics: exact values, wildcards,
//! key-only rules, nesting, and which identity each match counts under.

use super::*;

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
