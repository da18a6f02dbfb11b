//! Every loader error with its file, line and rule path: the cases that are
//! a rules file alone are fixtures (`tests/fixtures/invalid-rules/`), each
//! carrying its expected errors; the rest need code (bytes, several files,
//! orderings, loops over values).

use super::*;

/// Rules files that must be refused, relative to the repository; each
/// starts with a `# error: line N, PATH: TEXT` comment per error it must
/// give, in order (`# error: line N: TEXT` when the path is empty), where
/// TEXT is part of the message.
const INVALID_RULES: &str = "tests/fixtures/invalid-rules";

/// The errors a fixture expects: `(line, path, fragment)` of each.
fn expected_errors(text: &str) -> Vec<(usize, String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# error: line "))
        .map(|l| {
            let (at, fragment) = l.split_once(": ").expect("`line N[, PATH]: TEXT`");
            let (line, path) = at.split_once(", ").unwrap_or((at, ""));
            (
                line.parse().expect("a line number"),
                path.into(),
                fragment.into(),
            )
        })
        .collect()
}

#[test]
fn every_invalid_rules_fixture_gives_its_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(INVALID_RULES);
    let mut fixtures: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    fixtures.sort();
    assert!(!fixtures.is_empty(), "no fixtures in {}", dir.display());
    for fixture in fixtures {
        let file = format!("{INVALID_RULES}/{}", fixture.file_name().unwrap().display());
        let text = fs::read_to_string(&fixture).unwrap();
        let expected = expected_errors(&text);
        assert!(!expected.is_empty(), "{file}: no `# error:` line");
        let errors = match parse_domain(&file, text.as_bytes()) {
            Ok(domain) => panic!("{file}: rules should be rejected, loaded {domain:?}"),
            Err(errors) => errors,
        };
        assert_eq!(errors.len(), expected.len(), "{file}: {errors:#?}");
        for (error, (line, path, fragment)) in errors.iter().zip(&expected) {
            assert_eq!(error.file, file, "{error:?}");
            assert_eq!(error.line, *line, "{file}: line of {error:?}");
            assert_eq!(error.path, *path, "{file}: path of {error:?}");
            assert!(
                error.message.contains(fragment.as_str()),
                "{file}: {:?} should contain {fragment:?}",
                error.message
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Config errors
// ---------------------------------------------------------------------------

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
fn empty_file_is_an_error() {
    for text in ["", "\n\n", "# only a comment\n"] {
        let error = only_error(text);
        assert_error(&error, 0, "", "file is empty");
    }
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
