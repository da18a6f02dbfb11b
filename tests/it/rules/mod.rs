//! The rules engine through its public API: envoyproxy/ratelimit's matching
//! semantics, Sluice's extensions, every loader error with its file, line and
//! rule path, directory loading, the shipped examples and `sluice check-config`.

mod errors;
mod limits;
mod loading;
mod matching;
mod penalty;

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
        soft_ratio: limit.soft_ratio,
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
