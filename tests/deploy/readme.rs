//! Documentation: the facts an operator copies from the README and the
//! manual (docs/src/).

use super::*;

pub(crate) fn readme() -> String {
    read(&repo().join("README.md"))
}

/// A page of the manual, by its path under docs/src/.
fn page(name: &str) -> String {
    read(&repo().join("docs/src").join(name))
}

/// Every page of the manual, one after the other.
fn manual() -> String {
    let mut names: Vec<PathBuf> = std::fs::read_dir(repo().join("docs/src"))
        .expect("read docs/src")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    names.sort();
    names.iter().map(|p| read(p)).collect::<Vec<_>>().join("\n")
}

/// The settings reference (generated from the declaration) names every
/// setting with its variable and its flag, whatever the layout of its
/// tables.
#[test]
fn the_settings_reference_documents_every_setting_with_its_env_and_flag() {
    let reference = page("settings.md");
    for key in setting_names() {
        for name in [
            format!("`{key}`"),
            format!("`SLUICE_{}`", key.to_uppercase()),
            format!("`--{}`", key.replace('_', "-")),
        ] {
            assert!(
                reference.contains(&name),
                "docs/src/settings.md does not name {name}"
            );
        }
    }
}

/// The metric names registered in src/telemetry/metrics.rs,
/// metrics/operations.rs and metrics/overrides.rs, where every metric is
/// defined (families without samples yet do not show in `/metrics`, so the
/// source is the complete list).
pub(crate) fn registered_metrics() -> Vec<String> {
    let telemetry = repo().join("src/telemetry");
    let source = read(&telemetry.join("metrics.rs"))
        + &read(&telemetry.join("metrics/operations.rs"))
        + &read(&telemetry.join("metrics/overrides.rs"));
    source
        .split("registry.register(")
        .skip(1)
        .map(|call| {
            let name = call.split('"').nth(1).expect("a metric name");
            name.to_owned()
        })
        .collect()
}

/// The manual's tables of metrics (Operations, and any other page with a
/// row for a `sluice_` series) name every registered metric, and only those.
#[test]
fn the_manual_lists_every_metric_and_no_other() {
    let manual = manual();
    let registered = registered_metrics();
    assert!(registered.len() >= 10, "found only {registered:?}");
    // prometheus-client exposes counters with a `_total` suffix.
    let exposed = |name: &str| [format!("{name}_total"), name.to_owned()];
    for name in &registered {
        assert!(
            exposed(name)
                .iter()
                .any(|n| manual.contains(&format!("| `{n}` |"))),
            "no table of docs/src/ lists {name}"
        );
    }
    for line in manual.lines().filter(|l| l.starts_with("| `sluice_")) {
        let cell = line.split('`').nth(1).unwrap();
        assert!(
            registered
                .iter()
                .any(|name| exposed(name).iter().any(|n| n == cell)),
            "docs/src/ lists {cell}, which src/telemetry/metrics.rs does not define"
        );
    }
}

#[test]
fn getting_started_and_deploy_readme_name_every_overlay() {
    let guide = page("getting-started.md");
    let deploy_readme = read(&deploy("README.md"));
    for overlay in overlay_names() {
        let cell = format!("| `{overlay}` |");
        assert!(
            guide.contains(&cell),
            "docs/src/getting-started.md: no row for {overlay}"
        );
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
