//! Rules received over xDS: envoyproxy/ratelimit's `RateLimitConfig` protobuf,
//! turned into the same tree a rules file parses to and compiled by the same
//! compiler, so a domain means the same thing whichever way it arrives and is
//! refused for the same reasons (as upstream's `config_xds.go` feeds its YAML
//! loader).
//!
//! The protobuf has no field for Sluice's extensions (`algorithm`, `precision`,
//! `burst`, `rate_limits` lists, duration units) nor for upstream's
//! `value_to_metric` and `share_threshold`: rules that need them must come
//! from files.

use crate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use crate::rules::yaml::{Kind, Node as Yaml};
use crate::rules::{ConfigError, RuleSet, compile_trees};

/// The source label of the domains of snapshot `version`: `xds:<version>`.
pub fn source_label(version: &str) -> String {
    format!("xds:{version}")
}

/// Compiles one xDS snapshot, the whole rule state, into a [`RuleSet`]. Every
/// error names `xds:<version>/<resource name>`, the rule path and what is wrong;
/// one bad resource rejects the snapshot, as one bad file rejects a reload.
pub fn compile_snapshot(
    version: &str,
    configs: &[RateLimitConfig],
) -> Result<RuleSet, Vec<ConfigError>> {
    compile_trees(configs.iter().enumerate().map(|(index, config)| {
        let name = if config.name.is_empty() {
            format!("#{index}")
        } else {
            config.name.clone()
        };
        let label = format!("{}/{name}", source_label(version));
        (label, document(config))
    }))
}

/// The rules-file tree of one `RateLimitConfig`. Proto3 cannot tell a field
/// set to its default from one left out, so defaults are left out, except
/// where the compiler must see them to refuse them (an empty domain or key,
/// the unit UNKNOWN on a limited policy).
fn document(config: &RateLimitConfig) -> Yaml {
    map(vec![
        ("domain", string(&config.domain)),
        ("descriptors", descriptors(&config.descriptors)),
    ])
}

fn descriptors(list: &[RateLimitDescriptor]) -> Yaml {
    node(Kind::Seq(list.iter().map(descriptor).collect()))
}

fn descriptor(d: &RateLimitDescriptor) -> Yaml {
    let mut entries = vec![("key", string(&d.key))];
    if !d.value.is_empty() {
        entries.push(("value", string(&d.value)));
    }
    if let Some(policy) = &d.rate_limit {
        entries.push(("rate_limit", rate_limit(policy)));
    }
    if !d.descriptors.is_empty() {
        entries.push(("descriptors", descriptors(&d.descriptors)));
    }
    for (flag, set) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if set {
            entries.push((flag, plain("true")));
        }
    }
    map(entries)
}

fn rate_limit(p: &RateLimitPolicy) -> Yaml {
    let mut entries = Vec::new();
    // UNKNOWN is left out of an unlimited policy (it is the proto default),
    // and kept in a limited one, where the compiler refuses it.
    if p.unit != RateLimitUnit::Unknown as i32 || !p.unlimited {
        entries.push(("unit", string(&unit_name(p.unit))));
    }
    if !p.unlimited || p.requests_per_unit != 0 {
        entries.push(("requests_per_unit", plain(&p.requests_per_unit.to_string())));
    }
    if p.unlimited {
        entries.push(("unlimited", plain("true")));
    }
    if !p.name.is_empty() {
        entries.push(("name", string(&p.name)));
    }
    if !p.replaces.is_empty() {
        let list = p
            .replaces
            .iter()
            .map(|r| map(vec![("name", string(&r.name))]))
            .collect();
        entries.push(("replaces", node(Kind::Seq(list))));
    }
    map(entries)
}

/// The enum's name (`SECOND`, …; the compiler reads names case-insensitively),
/// or a text no unit parser accepts for a number the enum does not define.
fn unit_name(unit: i32) -> String {
    match RateLimitUnit::try_from(unit) {
        Ok(known) => known.as_str_name().to_owned(),
        Err(_) => format!("RateLimitUnit({unit})"),
    }
}

fn node(kind: Kind) -> Yaml {
    // There are no lines in a protobuf; errors name the rule path instead.
    Yaml { kind, line: 0 }
}

fn string(text: &str) -> Yaml {
    node(Kind::Scalar {
        text: text.to_owned(),
        quoted: true,
    })
}

fn plain(text: &str) -> Yaml {
    node(Kind::Scalar {
        text: text.to_owned(),
        quoted: false,
    })
}

fn map(entries: Vec<(&str, Yaml)>) -> Yaml {
    node(Kind::Map(
        entries.into_iter().map(|(k, v)| (string(k), v)).collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ratelimit::config::ratelimit::v3::RateLimitReplace;

    fn limit(unit: RateLimitUnit, requests: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: requests,
            ..Default::default()
        })
    }

    fn config(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
        RateLimitConfig {
            name: domain.to_owned(),
            domain: domain.to_owned(),
            descriptors,
        }
    }

    fn desc(key: &str, value: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.to_owned(),
            value: value.to_owned(),
            rate_limit,
            ..Default::default()
        }
    }

    fn errors(configs: &[RateLimitConfig]) -> String {
        match compile_snapshot("7", configs) {
            Ok(_) => panic!("snapshot accepted"),
            Err(errs) => errs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    #[test]
    fn a_snapshot_compiles_like_the_same_rules_file() {
        let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n  - key: path\n    value: /login\n    rate_limit:\n      unlimited: true\n";
        let from_file = crate::rules::parse_domain("api.yaml", yaml.as_bytes()).unwrap();
        let unlimited = Some(RateLimitPolicy {
            unlimited: true,
            ..Default::default()
        });
        let set = compile_snapshot(
            "1",
            &[config(
                "api",
                vec![
                    desc("user", "", limit(RateLimitUnit::Minute, 2)),
                    desc("path", "/login", unlimited),
                ],
            )],
        )
        .unwrap();
        let from_xds = set.domain("api").unwrap();
        assert_eq!(from_file.rules(), from_xds.rules());
        assert_eq!(from_xds.source(), "xds:1/api");
    }

    #[test]
    fn upstream_refusals_are_refused_with_domain_and_path() {
        let unknown = errors(&[config(
            "a",
            vec![desc("k", "", limit(RateLimitUnit::Unknown, 1))],
        )]);
        assert!(
            unknown.contains("xds:7/a") && unknown.contains("UNKNOWN"),
            "{unknown}"
        );

        let undefined = Some(RateLimitPolicy {
            unit: 42,
            requests_per_unit: 1,
            ..Default::default()
        });
        let bad = errors(&[config("a", vec![desc("k", "", undefined)])]);
        assert!(bad.contains("RateLimitUnit(42)"), "{bad}");

        let empty = errors(&[config("", vec![])]);
        assert!(empty.contains("empty domain"), "{empty}");

        let dup = errors(&[config("a", vec![]), config("a", vec![])]);
        assert!(dup.contains("duplicate domain 'a'"), "{dup}");

        let key = errors(&[config("a", vec![desc("", "", None)])]);
        assert!(key.contains("empty key"), "{key}");

        let twice = errors(&[config(
            "a",
            vec![desc("k", "v", None), desc("k", "v", None)],
        )]);
        assert!(
            twice.contains("duplicate descriptor") && twice.contains("k=v"),
            "{twice}"
        );

        let both = Some(RateLimitPolicy {
            unit: RateLimitUnit::Second as i32,
            unlimited: true,
            ..Default::default()
        });
        let unl = errors(&[config("a", vec![desc("k", "", both)])]);
        assert!(unl.contains("unlimited"), "{unl}");

        let replaces = Some(RateLimitPolicy {
            unit: RateLimitUnit::Second as i32,
            requests_per_unit: 1,
            replaces: vec![RateLimitReplace::default()],
            ..Default::default()
        });
        let rep = errors(&[config("a", vec![desc("k", "", replaces)])]);
        assert!(rep.contains("replaces"), "{rep}");
    }
}
