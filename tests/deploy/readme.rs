//! Documentation: the facts an operator copies from the READMEs.

use super::*;

pub(crate) fn readme() -> String {
    read(&repo().join("README.md"))
}

#[test]
fn the_readme_documents_every_setting_with_its_env_and_flag() {
    let readme = readme();
    for key in setting_names() {
        let row = format!(
            "`{key}` / `SLUICE_{}` / `--{}`",
            key.to_uppercase(),
            key.replace('_', "-")
        );
        assert!(readme.contains(&row), "README.md does not document {row}");
    }
}

/// The metric names registered in src/telemetry/metrics.rs, where every
/// metric is defined (families without samples yet do not show in
/// `/metrics`, so the source is the complete list).
pub(crate) fn registered_metrics() -> Vec<String> {
    let source = read(&repo().join("src/telemetry/metrics.rs"));
    source
        .split("registry.register(")
        .skip(1)
        .map(|call| {
            let name = call.split('"').nth(1).expect("a metric name");
            name.to_owned()
        })
        .collect()
}

#[test]
fn the_readme_lists_every_metric_and_no_other() {
    let readme = readme();
    let registered = registered_metrics();
    assert!(registered.len() >= 10, "found only {registered:?}");
    // prometheus-client exposes counters with a `_total` suffix.
    let exposed = |name: &str| [format!("{name}_total"), name.to_owned()];
    for name in &registered {
        assert!(
            exposed(name)
                .iter()
                .any(|n| readme.contains(&format!("| `{n}` |"))),
            "README.md's metrics table lacks {name}"
        );
    }
    for line in readme.lines().filter(|l| l.starts_with("| `sluice_")) {
        let cell = line.split('`').nth(1).unwrap();
        assert!(
            registered
                .iter()
                .any(|name| exposed(name).iter().any(|n| n == cell)),
            "README.md lists {cell}, which src/telemetry/metrics.rs does not define"
        );
    }
}

#[test]
fn the_readme_and_deploy_readme_name_every_overlay() {
    let readme = readme();
    let deploy_readme = read(&deploy("README.md"));
    for overlay in overlay_names() {
        let cell = format!("| `{overlay}` |");
        assert!(readme.contains(&cell), "README.md: no row for {overlay}");
        assert!(
            deploy_readme.contains(&cell),
            "deploy/README.md: no row for {overlay}"
        );
    }
}

#[test]
fn the_readme_quick_start_is_two_commands() {
    let readme = readme();
    let start = readme
        .find("## Quick start")
        .expect("a Quick start section");
    let section = &readme[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let commands: Vec<&str> = section
        .split("```sh\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap().trim())
        .collect();
    assert_eq!(commands, ["cargo run --release -- serve", "tests/run"]);
}
