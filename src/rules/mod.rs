//! Rules: the envoyproxy/ratelimit YAML format (plus Sluice's extensions),
//! validated into a [`RuleSet`], and the matching of request descriptors.
//!
//! Matching follows envoyproxy/ratelimit exactly: at each level try the exact
//! `key=value` rule, then the wildcard rules of that key in file order, then
//! the key-only rule; a limit applies only at the depth equal to the number of
//! entries; a value rule without a limit whitelists. This module does no IO
//! beyond reading rules files and imports no tokio, tonic or Redis client.

mod compile;
mod display;
mod duration;
mod load;
mod stats_key;
mod wildcard;
pub mod yaml;

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

pub use compile::{
    DEFAULT_BUCKETS, DEFAULT_FORGET_AFTER_MS, DEFAULT_MAX_BLOCK_MS, MAX_BUCKETS, MAX_FILE_BYTES,
    MAX_PATH_BYTES, compile_trees, parse_domain, penalty_fits, shortest_block_ms,
};
pub use display::penalty_text;
pub use duration::{duration_text, parse_duration, parse_unit};
pub use load::load_paths;
pub use stats_key::{detailed_stats_key, sanitize, stats_key};
pub use wildcard::Pattern;

use crate::limiter::{Counting, Identity, IdentityBuilder, LimitSpec, Role, SoftRatio, Unit};
use crate::request::Entry;

/// Every loaded domain.
#[derive(Debug, Default)]
pub struct RuleSet {
    domains: HashMap<String, Domain>,
}

impl RuleSet {
    /// A rule set of these domains; the caller has checked names are unique.
    fn from_domains(domains: impl IntoIterator<Item = Domain>) -> Self {
        Self {
            domains: domains.into_iter().map(|d| (d.name.clone(), d)).collect(),
        }
    }

    /// The domain called `name`.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Domains in name order.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        let mut all: Vec<&Domain> = self.domains.values().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all.into_iter()
    }
}

/// The rules of one domain.
#[derive(Debug)]
pub struct Domain {
    name: String,
    /// The line of the `domain` entry in `source`.
    line: usize,
    source: String,
    root: Level,
}

/// The rules at one depth of the tree, grouped by entry key.
#[derive(Debug, Default)]
struct Level {
    keys: HashMap<String, KeyRules>,
}

/// The rules of one entry key at one level.
#[derive(Debug, Default)]
struct KeyRules {
    /// `key` + exact `value`.
    values: HashMap<String, Node>,
    /// `key` + a value with `*`, in file order.
    wildcards: Vec<(Pattern, Node)>,
    /// `key` without a value: any value.
    any: Option<Box<Node>>,
}

/// One descriptor of the rules tree.
#[derive(Debug, Default)]
struct Node {
    rule: Option<Arc<Rule>>,
    children: Level,
    /// Count every value matching this wildcard as one identity.
    share_threshold: bool,
}

/// The limits attached to one descriptor of the rules tree.
#[derive(Debug, PartialEq)]
pub struct Rule {
    /// `domain/key=value/key…`, for errors, logs and metrics.
    pub path: String,
    /// The limits, all checked and counted together. Empty when `unlimited`.
    pub limits: Vec<Limit>,
    /// Always OK, never counted; remaining is reported as `u32::MAX`.
    pub unlimited: bool,
    /// How this descriptor's verdict takes part in the request's.
    pub role: Role,
    /// `counting` as the rule sets it; `None` takes the limiter's default
    /// (`LimiterOptions::counting`).
    pub counting: Option<Counting>,
    /// Metrics may carry the runtime values of this descriptor.
    pub detailed_metric: bool,
    /// Per entry depth, whether its runtime value labels metrics
    /// (`value_to_metric` at that level, or `detailed_metric` for all).
    pub metric_values: Vec<bool>,
    /// What a decision reports about the rule; shared, so a status can carry
    /// it for the price of a reference count.
    pub annotations: Arc<Annotations>,
    /// Upstream's stats key, `domain.k1_v1.k2…` from the config (see
    /// [`stats_key()`]), built once here.
    pub stats_key: String,
}

/// What a rule tells callers beyond its limits: where it is, and the
/// `metadata` of the rules file (passed through to Envoy, never
/// interpreted).
#[derive(Debug, PartialEq, Eq)]
pub struct Annotations {
    /// The rule's path, `domain/key=value/key…`.
    pub path: String,
    /// The rule's `metadata` as JSON (YAML scalars typed as YAML 1.1 plain
    /// scalars are: `true`, `10`, `~`); `None` without one.
    pub metadata: Option<serde_json::Value>,
}

impl Rule {
    /// The runtime `key=value` pairs that may label this rule's metrics, or
    /// an empty string when none may.
    pub fn metric_descriptor(&self, entries: &[Entry]) -> String {
        let mut out = String::new();
        for (entry, _) in entries
            .iter()
            .zip(&self.metric_values)
            .filter(|(_, show)| **show)
        {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(&entry.key);
            out.push('=');
            out.push_str(&entry.value);
        }
        out
    }
}

/// One limit of a rule.
#[derive(Debug, PartialEq)]
pub struct Limit {
    /// What the stores count.
    pub spec: LimitSpec,
    /// The unit reported to Envoy.
    pub unit: Unit,
    /// `rate_limit.name`, reported in `current_limit.name`.
    pub name: Option<Arc<str>>,
    /// Names of limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `rate_limit.soft_ratio`: past this share of the limit an admitted
    /// request is warned (`x-ratelimit-soft-breach`); `None` takes the
    /// limiter's default (`LimiterOptions::soft_ratio`).
    pub soft_ratio: Option<SoftRatio>,
}

/// A matched rule and the identity its counters belong to.
#[derive(Debug)]
pub struct Found<'a> {
    pub rule: &'a Rule,
    pub identity: Identity,
}

impl Domain {
    /// The domain's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file the domain was loaded from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The rule for a descriptor with these entries, if any.
    pub fn find(&self, entries: &[Entry]) -> Option<Found<'_>> {
        let mut level = &self.root;
        let mut identity = IdentityBuilder::new(&self.name);
        for (depth, entry) in entries.iter().enumerate() {
            let rules = level.keys.get(&entry.key)?;
            let node = if let Some(node) = rules.values.get(&entry.value) {
                identity.value(&entry.key, &entry.value);
                node
            } else if let Some((pattern, node)) = rules
                .wildcards
                .iter()
                .find(|(p, _)| p.matches(&entry.value))
            {
                if node.share_threshold {
                    identity.pattern(&entry.key, pattern.as_str());
                } else {
                    identity.value(&entry.key, &entry.value);
                }
                node
            } else {
                identity.value(&entry.key, &entry.value);
                rules.any.as_deref()?
            };
            if depth + 1 == entries.len() {
                let rule = node.rule.as_deref()?;
                return Some(Found {
                    rule,
                    identity: identity.build(),
                });
            }
            level = &node.children;
        }
        None
    }

    /// Every rule of the domain, depth first in an order stable across loads.
    pub fn rules(&self) -> Vec<&Rule> {
        fn walk<'a>(level: &'a Level, out: &mut Vec<&'a Rule>) {
            let mut keys: Vec<_> = level.keys.iter().collect();
            keys.sort_by(|a, b| a.0.cmp(b.0));
            for (_, rules) in keys {
                let mut values: Vec<_> = rules.values.iter().collect();
                values.sort_by(|a, b| a.0.cmp(b.0));
                let nodes = values
                    .into_iter()
                    .map(|(_, n)| n)
                    .chain(rules.wildcards.iter().map(|(_, n)| n))
                    .chain(rules.any.as_deref());
                for node in nodes {
                    out.extend(node.rule.as_deref());
                    walk(&node.children, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.root, &mut out);
        out
    }
}

/// A rules error: the file, the line, the rule path and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub file: String,
    /// 1-based; 0 when the error is about the file as a whole.
    pub line: usize,
    /// `domain/key=value/…`; empty when the error is above any rule.
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Where rules come from: files, directories of files, or built-in text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RulesSource {
    /// Files and directories (every `*.yaml`/`*.yml` below, recursively,
    /// skipping names that start with `.`).
    Paths(Vec<PathBuf>),
    /// The example rules compiled into the binary.
    Builtin,
}

/// The example rules shipped in `examples/rules.yaml`, served when no rules
/// path is configured.
pub const EXAMPLE_RULES: &str = include_str!("../../examples/rules.yaml");

impl RulesSource {
    /// Loads and validates every domain of the source.
    pub fn load(&self) -> Result<RuleSet, Vec<ConfigError>> {
        match self {
            RulesSource::Paths(paths) => load_paths(paths),
            RulesSource::Builtin => {
                parse_domain("examples/rules.yaml (built in)", EXAMPLE_RULES.as_bytes())
                    .map(|d| RuleSet::from_domains([d]))
            }
        }
    }
}
