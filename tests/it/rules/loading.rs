//! Directory loading, the shipped examples and `sluice check-config`.

use super::*;

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
