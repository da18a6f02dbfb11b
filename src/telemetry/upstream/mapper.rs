//! A statsd-exporter mapping file (the subset Envoy Gateway and upstream's
//! default use) and the Prometheus page it shapes.
//!
//! ```yaml
//! mappings:
//!   - match: "ratelimit.service.rate_limit.*.*.over_limit"   # glob: `*` within one dot segment
//!     name: "ratelimit_service_rate_limit_over_limit"
//!     labels: { domain: "$1", key1: "$2" }
//!   - match: 'ratelimit\.service\.rate_limit\.([^.]*)\.([^.]*)\.([^.]*)(\..*)?\.over_limit'
//!     match_type: regex
//!     name: "ratelimit_service_rate_limit_over_limit"
//!     labels: { domain: "$1", key1: "$2", key2: "$3" }
//!   - match: "some.noise.*"
//!     action: drop
//! ```
//!
//! The first mapping that matches a name wins. `timer_type`/`observer_type`
//! are accepted; timers are always histograms in seconds. Unmapped names are
//! served with every character outside `[A-Za-z0-9_]` made `_`.

use super::{Kind, TIMER_BUCKETS, UpstreamStats};
use regex::Regex;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use yaml_rust2::{Yaml, YamlLoader};

/// Upstream's default mapping (same effect as its `default_mapper.yaml`).
pub const DEFAULT_MAPPING: &str = include_str!("default_mapping.yaml");

/// A mapping file that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("prometheus mapper: {0}")]
pub struct MapperError(String);

#[derive(Debug)]
struct Mapping {
    re: Regex,
    name: String,
    labels: Vec<(String, String)>,
    drop: bool,
}

/// Compiled mappings.
#[derive(Debug)]
pub struct Mapper {
    mappings: Vec<Mapping>,
}

/// Where one stat goes on the Prometheus page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapped {
    /// Not served.
    Drop,
    /// Served under this name and labels.
    Metric {
        /// Prometheus name.
        name: String,
        /// Label pairs, in file order.
        labels: Vec<(String, String)>,
    },
}

fn glob_to_regex(glob: &str) -> String {
    let mut re = String::from("^");
    for part in glob.split('*').enumerate() {
        if part.0 > 0 {
            re.push_str("([^.]*)");
        }
        re.push_str(&regex::escape(part.1));
    }
    re.push('$');
    re
}

fn field_str<'a>(y: &'a Yaml, field: &str, at: usize) -> Result<Option<&'a str>, MapperError> {
    match &y[field] {
        Yaml::BadValue | Yaml::Null => Ok(None),
        Yaml::String(s) => Ok(Some(s)),
        other => Err(MapperError(format!(
            "mapping {at}: `{field}` must be a string, got {other:?}"
        ))),
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':' || c == '$')
        && chars.all(|c| {
            c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '$' || c == '{' || c == '}'
        })
}

impl Mapper {
    /// Upstream's default mapping.
    pub fn default_mapping() -> Self {
        // The embedded file is tested; an error here is a build mistake.
        Self::parse(DEFAULT_MAPPING).unwrap_or(Mapper {
            mappings: Vec::new(),
        })
    }

    /// Reads and compiles a mapping file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, MapperError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| MapperError(format!("reading {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| MapperError(format!("{}: {}", path.display(), e.0)))
    }

    /// Compiles mapping-file text.
    pub fn parse(text: &str) -> Result<Self, MapperError> {
        let docs =
            YamlLoader::load_from_str(text).map_err(|e| MapperError(format!("YAML: {e}")))?;
        let doc = docs
            .first()
            .ok_or_else(|| MapperError("empty file".into()))?;
        let list = match &doc["mappings"] {
            Yaml::Array(list) => list,
            Yaml::BadValue | Yaml::Null => {
                return Ok(Mapper {
                    mappings: Vec::new(),
                });
            }
            _ => return Err(MapperError("`mappings` must be a list".into())),
        };
        let mappings = list
            .iter()
            .enumerate()
            .map(|(i, m)| Mapping::parse(m, i + 1))
            .collect::<Result<_, _>>()?;
        Ok(Mapper { mappings })
    }

    /// Where the statsd name `stat` goes.
    pub fn map(&self, stat: &str) -> Mapped {
        for m in &self.mappings {
            let Some(caps) = m.re.captures(stat) else {
                continue;
            };
            if m.drop {
                return Mapped::Drop;
            }
            let expand = |template: &str| {
                let mut out = String::new();
                caps.expand(template, &mut out);
                out
            };
            return Mapped::Metric {
                name: expand(&m.name),
                labels: m
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), expand(v)))
                    .collect(),
            };
        }
        Mapped::Metric {
            name: escape_name(stat),
            labels: Vec::new(),
        }
    }

    /// The Prometheus text page for `stats`.
    pub fn render(&self, stats: &UpstreamStats) -> String {
        // name -> (type, series: labels -> value)
        let mut families: BTreeMap<String, (&str, BTreeMap<String, f64>)> = BTreeMap::new();
        for (stat, kind, value) in stats.snapshot() {
            let Mapped::Metric { name, labels } = self.map(&stat) else {
                continue;
            };
            let ty = match kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
            };
            let fam = families.entry(name).or_insert((ty, BTreeMap::new()));
            if fam.0 != ty {
                continue;
            }
            // Two stats mapped onto one series add up.
            *fam.1.entry(label_text(&labels, None)).or_insert(0.0) += value as f64;
        }
        let mut out = String::new();
        for (name, (ty, series)) in &families {
            let _ = writeln!(out, "# TYPE {name} {ty}");
            for (labels, value) in series {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        }
        for (stat, timer) in stats.timers() {
            let Mapped::Metric { name, labels } = self.map(&stat) else {
                continue;
            };
            if families.contains_key(&name) {
                continue;
            }
            let (counts, sum, count) = timer.snapshot();
            let _ = writeln!(out, "# TYPE {name} histogram");
            let mut cumulative = 0;
            for (i, n) in counts.iter().enumerate() {
                cumulative += n;
                let le = TIMER_BUCKETS
                    .get(i)
                    .map_or("+Inf".to_string(), |b| b.to_string());
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {cumulative}",
                    label_text(&labels, Some(&le))
                );
            }
            let plain = label_text(&labels, None);
            let _ = writeln!(out, "{name}_sum{plain} {sum}");
            let _ = writeln!(out, "{name}_count{plain} {count}");
        }
        out
    }
}

impl Mapping {
    /// The `at`-th entry of `mappings` (counted from 1 in errors).
    fn parse(m: &Yaml, at: usize) -> Result<Self, MapperError> {
        if !matches!(m, Yaml::Hash(_)) {
            return Err(MapperError(format!("mapping {at}: must be a map")));
        }
        let pattern = field_str(m, "match", at)?
            .filter(|p| !p.is_empty())
            .ok_or_else(|| MapperError(format!("mapping {at}: `match` is required")))?;
        let source = match field_str(m, "match_type", at)?.unwrap_or("glob") {
            "glob" | "" => glob_to_regex(pattern),
            "regex" => format!("^(?:{pattern})$"),
            other => {
                return Err(MapperError(format!(
                    "mapping {at}: match_type `{other}` (glob or regex)"
                )));
            }
        };
        let re = Regex::new(&source)
            .map_err(|e| MapperError(format!("mapping {at}: bad match `{pattern}`: {e}")))?;
        let drop = match field_str(m, "action", at)?.unwrap_or("map") {
            "map" => false,
            "drop" => true,
            other => {
                return Err(MapperError(format!(
                    "mapping {at}: action `{other}` (map or drop)"
                )));
            }
        };
        for field in ["timer_type", "observer_type"] {
            let kind = field_str(m, field, at)?.unwrap_or("");
            if !matches!(kind, "histogram" | "summary" | "default" | "") {
                return Err(MapperError(format!("mapping {at}: {field} `{kind}`")));
            }
        }
        let name = field_str(m, "name", at)?.unwrap_or("").to_string();
        if !drop && !valid_name(&name) {
            return Err(MapperError(format!(
                "mapping {at}: bad or missing `name` `{name}`"
            )));
        }
        let mut labels = Vec::new();
        match &m["labels"] {
            Yaml::BadValue | Yaml::Null => {}
            Yaml::Hash(h) => {
                for (k, v) in h {
                    let (Some(k), Some(v)) = (k.as_str(), v.as_str()) else {
                        return Err(MapperError(format!("mapping {at}: labels must be strings")));
                    };
                    if !valid_name(k) || k.contains(['$', '{', '}', ':']) {
                        return Err(MapperError(format!("mapping {at}: bad label name `{k}`")));
                    }
                    labels.push((k.to_string(), v.to_string()));
                }
            }
            _ => return Err(MapperError(format!("mapping {at}: `labels` must be a map"))),
        }
        Ok(Mapping {
            re,
            name,
            labels,
            drop,
        })
    }
}

/// A statsd name as statsd-exporter serves an unmapped one.
pub fn escape_name(stat: &str) -> String {
    let mut out: String = stat
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

fn label_text(labels: &[(String, String)], le: Option<&str>) -> String {
    if labels.is_empty() && le.is_none() {
        return String::new();
    }
    let mut out = String::from("{");
    let mut first = true;
    let pairs = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(le.map(|l| ("le", l)));
    for (k, v) in pairs {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(k);
        out.push_str("=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
    out
}
