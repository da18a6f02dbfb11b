//! The domain of a rules source and its tree of descriptors: each
//! descriptor's path, flags and rule, its children, and the duplicates
//! found at one level.

use std::collections::HashMap;
use std::sync::Arc;

use super::Compiler;
use crate::limiter::Counting;
use crate::rules::stats_key::{sanitize, stats_key};
use crate::rules::wildcard::Pattern;
use crate::rules::yaml::{Kind, Node as Yaml};
use crate::rules::{Domain, KeyRules, Level, Node};

const TOP_KEYS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "counting",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// Per-descriptor flags that shape its rule or its matching.
#[derive(Default)]
pub(super) struct Flags {
    pub(super) shadow_mode: bool,
    pub(super) quota_mode: bool,
    /// `counting`, when the descriptor sets it.
    pub(super) counting: Option<Counting>,
    pub(super) detailed_metric: bool,
    pub(super) share_threshold: bool,
    /// Per depth, whether the runtime value may label metrics.
    pub(super) value_levels: Vec<bool>,
    /// Upstream's stats key of this descriptor (`domain.k1_v1.k2…`).
    pub(super) stats_key: String,
}

impl Compiler<'_> {
    /// The domain of a rules source: its name and its tree of descriptors.
    pub(super) fn domain(&mut self, doc: &Yaml) -> Option<Domain> {
        let map = self.map(doc, "", "the file", TOP_KEYS)?;
        let (name, line) = match map.get("domain") {
            Some(node) => (self.string(node, "", "domain"), node.line),
            None => (Some(String::new()), doc.line),
        };
        if name.as_deref() == Some("") {
            self.error(line, "", "config file cannot have empty domain");
        }
        // The descriptors are checked even without a domain, so that every
        // error of the file is reported at once.
        let mut root = Level::default();
        let mut listed = true;
        if let Some(node) = map.get("descriptors") {
            // `?` stands for a missing domain in the paths of the rules.
            let parent = name.clone().filter(|n| !n.is_empty());
            let parent = parent.as_deref().unwrap_or("?");
            match self.list(node, parent, "descriptors") {
                Some(items) => {
                    for item in items {
                        self.descriptor(item, parent, &sanitize(parent), &mut root, &[]);
                    }
                }
                None => listed = false,
            }
        }
        let name = name.filter(|n| !n.is_empty() && listed)?;
        Some(Domain {
            name,
            line,
            source: self.file.to_owned(),
            root,
        })
    }

    /// Compiles one descriptor into `level`. `value_levels` says, for each
    /// ancestor, whether its runtime value may label metrics.
    fn descriptor(
        &mut self,
        node: &Yaml,
        parent: &str,
        stats_parent: &str,
        level: &mut Level,
        value_levels: &[bool],
    ) {
        let Some((key, value, path)) = self.descriptor_path(node, parent) else {
            return;
        };
        let Some(map) = self.map(node, &path, "a descriptor", DESCRIPTOR_KEYS) else {
            return;
        };
        if key.is_empty() {
            self.error(node.line, parent, "descriptor has empty key");
            return;
        }
        let stats_key = stats_key(stats_parent, [(key.as_str(), Some(value.as_str()))]);
        let flags = self.flags(&map, &path, value_levels, stats_key);
        if flags.share_threshold && !Pattern::is_pattern(&value) {
            self.error(
                node.line,
                &path,
                "share_threshold can only be set on a value with a '*' wildcard",
            );
        }

        let rule = self.rule(&map, node.line, &path, &flags);
        let mut children = Level::default();
        if let Some(items) = map
            .get("descriptors")
            .and_then(|l| self.list(l, &path, "descriptors"))
        {
            for item in items {
                self.descriptor(
                    item,
                    &path,
                    &flags.stats_key,
                    &mut children,
                    &flags.value_levels,
                );
            }
        }
        let compiled = Node {
            rule: rule.map(Arc::new),
            children,
            share_threshold: flags.share_threshold,
        };
        if self.insert(level, key, value, compiled, &path) {
            self.error(
                node.line,
                &path,
                "duplicate descriptor: the same key and value already appear at this level",
            );
        }
    }

    /// A descriptor's key, value and path (`parent/key=value`); `None`,
    /// reported, when it is not a map or its path would go over the budget.
    fn descriptor_path(&mut self, node: &Yaml, parent: &str) -> Option<(String, String, String)> {
        if !matches!(node.kind, Kind::Map(_)) {
            return self.fail(
                node.line,
                parent,
                format!("a descriptor must be a map, found {}", node.shape()),
            );
        }
        // Key and value first, so that every other error names this descriptor.
        let key = self.field(node, parent, "key");
        let value = self.field(node, parent, "value");
        // A descriptor without a key has no path of its own.
        let path = if key.is_empty() {
            parent.to_owned()
        } else if value.is_empty() {
            format!("{parent}/{key}")
        } else {
            format!("{parent}/{key}={value}")
        };
        // Its rule keeps the path twice and a stats key of about its length;
        // a wildcard's path is also kept to find duplicates.
        let copies = if Pattern::is_pattern(&value) { 4 } else { 3 };
        self.keep_path(copies * path.len(), node.line)
            .then_some((key, value, path))
    }

    /// The flags of a descriptor (the map of its keys), whose ancestors'
    /// values may label metrics as `value_levels` says.
    fn flags(
        &mut self,
        map: &HashMap<&str, &Yaml>,
        path: &str,
        value_levels: &[bool],
        stats_key: String,
    ) -> Flags {
        let mut value_levels = value_levels.to_vec();
        value_levels.push(self.boolean(map.get("value_to_metric"), path, "value_to_metric"));
        let detailed_metric = self.boolean(map.get("detailed_metric"), path, "detailed_metric");
        if detailed_metric {
            value_levels.iter_mut().for_each(|v| *v = true);
        }
        Flags {
            shadow_mode: self.boolean(map.get("shadow_mode"), path, "shadow_mode"),
            quota_mode: self.boolean(map.get("quota_mode"), path, "quota_mode"),
            counting: self.counting(map.get("counting"), path),
            detailed_metric,
            share_threshold: self.boolean(map.get("share_threshold"), path, "share_threshold"),
            value_levels,
            stats_key,
        }
    }

    /// Puts a compiled descriptor in its place at `level`: the key's
    /// catch-all, one of its wildcards, or one of its values. True when
    /// that place was taken (the same key and value twice at one level).
    fn insert(
        &mut self,
        level: &mut Level,
        key: String,
        value: String,
        compiled: Node,
        path: &str,
    ) -> bool {
        let rules: &mut KeyRules = level.keys.entry(key).or_default();
        if value.is_empty() {
            rules.any.replace(Box::new(compiled)).is_some()
        } else if Pattern::is_pattern(&value) {
            rules.wildcards.push((Pattern::new(&value), compiled));
            // The same key and value at this level is the same path.
            !self.wildcard_paths.insert(path.to_owned())
        } else {
            rules.values.insert(value, compiled).is_some()
        }
    }
}
