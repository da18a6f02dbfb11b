//! Validation of rules files into domains. Every problem found is reported
//! (not only the first) with its file, line and rule path; a file with any
//! error yields no domain, so a bad file can never be half loaded.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::duration::{parse_duration, parse_unit};
use super::stats_key::{sanitize, stats_key};
use super::wildcard::Pattern;
use super::yaml::{self, Kind, Node as Yaml};
use super::{Annotations, ConfigError, Domain, KeyRules, Level, Limit, Node, Rule, RuleSet};
use crate::limiter::algorithm::{MAX_BUCKET_TICKS, MAX_LOG_ENTRIES};
use crate::limiter::{Algorithm, Counting, LimitSpec, Role, Unit, Window};

/// Buckets per window when `precision` is not given: the largest divisor of the
/// window up to 10. Ten buckets keep the interpolated bucket (the only source of
/// error) at a tenth of the window, while a counter stays at a dozen small
/// fields and a check touches one or two of them.
pub const DEFAULT_BUCKETS: u64 = 10;

/// Most buckets a sliding window may have, which bounds the work and memory of
/// one counter whatever the traffic.
pub const MAX_BUCKETS: u64 = 3_600;

/// Largest rules file read, in bytes. Far above any hand-written file (a
/// descriptor takes a few lines), and small enough that a file dropped into
/// the watched directory by mistake cannot exhaust memory while it is parsed.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Most bytes of descriptor paths one source may compile to. Every rule
/// keeps its path (for errors, `/rlconfig` and stats keys) and every error
/// copies one, so a long key or value above many descriptors is repeated in
/// each: unbounded, a 600 KB file (one 200 KB value over 5,000 limits) took
/// 3.4 GB. Ordinary files stay far below (40,000 rules: about 12 MB).
pub const MAX_PATH_BYTES: usize = 32 * 1024 * 1024;

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
const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "precision",
    "burst",
    "lease",
];

/// How long a concurrency slot is held when no release comes: long enough
/// for ordinary streams, short enough that a lost release frees its slot
/// soon. `lease:` in the rule overrides it.
pub const DEFAULT_LEASE_MS: u64 = 30_000;

/// Adds a compiled domain to the set being built, or an error when a domain
/// of that name came earlier (from the source labelled in `seen`). The one
/// rule for duplicates, whether the domains come from files or from xDS.
pub(crate) fn add_domain(
    domain: Domain,
    label: String,
    seen: &mut HashMap<String, String>,
    domains: &mut Vec<Domain>,
    errors: &mut Vec<ConfigError>,
) {
    match seen.get(&domain.name) {
        Some(first) => errors.push(ConfigError {
            file: label,
            line: domain.line,
            path: domain.name.clone(),
            message: format!(
                "duplicate domain '{}' (already defined in {first})",
                domain.name
            ),
        }),
        None => {
            seen.insert(domain.name.clone(), label);
            domains.push(domain);
        }
    }
}

pub(super) fn file_error(file: &str, message: String) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        line: 0,
        path: String::new(),
        message,
    }
}

/// Parses one rules file (one domain). `file` labels the errors.
pub fn parse_domain(file: &str, bytes: &[u8]) -> Result<Domain, Vec<ConfigError>> {
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(vec![file_error(
            file,
            format!("file is larger than {MAX_FILE_BYTES} bytes: a rules file holds one domain"),
        )]);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        vec![ConfigError {
            file: file.to_owned(),
            line,
            path: String::new(),
            message: "file is not valid UTF-8".into(),
        }]
    })?;
    // Editors on Windows may start a UTF-8 file with a byte-order mark, which
    // Go's YAML parser (and so envoyproxy/ratelimit) skips.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let docs = yaml::parse(text).map_err(|e| {
        vec![ConfigError {
            file: file.to_owned(),
            line: e.line,
            path: String::new(),
            message: format!("invalid YAML: {}", e.message),
        }]
    })?;
    compile_documents(file, &docs)
}

/// Compiles rules that arrive as trees rather than files, each with the
/// label its errors name: xDS resources, built from the protobuf by
/// `xds::convert`. The same checks, and the same rule for a duplicate
/// domain, as files.
pub fn compile_trees(
    trees: impl IntoIterator<Item = (String, Yaml)>,
) -> Result<RuleSet, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut domains = Vec::new();
    let mut seen = HashMap::new();
    for (label, tree) in trees {
        match compile_documents(&label, &[tree]) {
            Ok(domain) => add_domain(domain, label, &mut seen, &mut domains, &mut errors),
            Err(errs) => errors.extend(errs),
        }
    }
    if errors.is_empty() {
        Ok(RuleSet::from_domains(domains))
    } else {
        Err(errors)
    }
}

/// Compiles the documents of one rules source (exactly one is expected) into
/// its domain. Files reach it through [`parse_domain`]; xDS resources through
/// [`compile_trees`], as trees built from the protobuf, so both are validated
/// by the same code.
pub(crate) fn compile_documents(file: &str, docs: &[Yaml]) -> Result<Domain, Vec<ConfigError>> {
    let mut compiler = Compiler {
        file,
        errors: Vec::new(),
        path_bytes: 0,
        wildcard_paths: HashSet::new(),
    };
    let domain = match docs {
        [] => compiler.fail(
            0,
            "",
            "file is empty: expected a 'domain' and 'descriptors'",
        ),
        [doc] => compiler.domain(doc),
        [_, second, ..] => compiler.fail(
            second.line,
            "",
            "more than one YAML document: a rules file holds exactly one domain",
        ),
    };
    match domain {
        Some(domain) if compiler.errors.is_empty() => Ok(domain),
        _ => {
            // Found tree by tree; reported top to bottom.
            let mut errors = compiler.errors;
            errors.sort_by_key(|e| e.line);
            Err(errors)
        }
    }
}

struct Compiler<'f> {
    file: &'f str,
    errors: Vec<ConfigError>,
    /// Bytes of paths kept so far, against [`MAX_PATH_BYTES`].
    path_bytes: usize,
    /// The paths of the wildcard descriptors so far: a level keeps its
    /// wildcards in file order, and looking for a duplicate there was
    /// quadratic (140,000 wildcards: 20 s).
    wildcard_paths: HashSet<String>,
}

/// Per-descriptor flags that shape its rule or its matching.
#[derive(Default)]
struct Flags {
    shadow_mode: bool,
    quota_mode: bool,
    /// `counting`, when the descriptor sets it.
    counting: Option<Counting>,
    detailed_metric: bool,
    share_threshold: bool,
    /// Per depth, whether the runtime value may label metrics.
    value_levels: Vec<bool>,
    /// Upstream's stats key of this descriptor (`domain.k1_v1.k2…`).
    stats_key: String,
}

impl Compiler<'_> {
    /// Counts `bytes` more of kept paths; past [`MAX_PATH_BYTES`], one error
    /// (at `line`) and `false` from then on, so that compiling stops.
    fn keep_path(&mut self, bytes: usize, line: usize) -> bool {
        if self.path_bytes > MAX_PATH_BYTES {
            return false;
        }
        self.path_bytes = self.path_bytes.saturating_add(bytes);
        if self.path_bytes <= MAX_PATH_BYTES {
            return true;
        }
        self.errors.push(ConfigError {
            file: self.file.to_owned(),
            line,
            path: String::new(),
            message: format!(
                "descriptor paths (each descriptor's keys and values, repeated in every \
                 descriptor under it) would take more than {MAX_PATH_BYTES} bytes: shorten \
                 the long keys or values, or nest fewer descriptors under them"
            ),
        });
        false
    }

    fn error(&mut self, line: usize, path: &str, message: impl Into<String>) {
        if !self.keep_path(self.file.len() + path.len(), line) {
            return;
        }
        self.errors.push(ConfigError {
            file: self.file.to_owned(),
            line,
            path: path.to_owned(),
            message: message.into(),
        });
    }

    fn fail<T>(&mut self, line: usize, path: &str, message: impl Into<String>) -> Option<T> {
        self.error(line, path, message);
        None
    }

    /// The pairs of a map node whose keys are all in `allowed`.
    fn map<'y>(
        &mut self,
        node: &'y Yaml,
        path: &str,
        what: &str,
        allowed: &[&str],
    ) -> Option<HashMap<&'y str, &'y Yaml>> {
        let Kind::Map(pairs) = &node.kind else {
            return self.fail(
                node.line,
                path,
                format!("{what} must be a map, found {}", node.shape()),
            );
        };
        let mut out = HashMap::new();
        for (key, value) in pairs {
            let Kind::Scalar { text, .. } = &key.kind else {
                self.error(key.line, path, format!("keys of {what} must be strings"));
                continue;
            };
            if !allowed.contains(&text.as_str()) {
                self.error(
                    key.line,
                    path,
                    format!(
                        "unknown key '{text}' in {what} (allowed: {})",
                        allowed.join(", ")
                    ),
                );
            } else if out.insert(text.as_str(), value).is_some() {
                self.error(key.line, path, format!("duplicate key '{text}' in {what}"));
            }
        }
        Some(out)
    }

    fn string(&mut self, node: &Yaml, path: &str, what: &str) -> Option<String> {
        match &node.kind {
            _ if node.is_null() => Some(String::new()),
            Kind::Scalar { text, .. } => Some(text.clone()),
            _ => self.fail(
                node.line,
                path,
                format!("'{what}' must be a string, found {}", node.shape()),
            ),
        }
    }

    /// The string under `name` in a map node; empty when absent, null or not
    /// a string (the last reported).
    fn field(&mut self, node: &Yaml, path: &str, name: &str) -> String {
        let Kind::Map(pairs) = &node.kind else {
            return String::new();
        };
        pairs
            .iter()
            .find(|(k, _)| matches!(&k.kind, Kind::Scalar { text, .. } if text == name))
            .and_then(|(_, v)| self.string(v, path, name))
            .unwrap_or_default()
    }

    /// YAML booleans, including the YAML 1.1 words Go's parser accepts.
    fn boolean(&mut self, node: Option<&&Yaml>, path: &str, what: &str) -> bool {
        let Some(node) = node else { return false };
        if node.is_null() {
            return false;
        }
        if let Kind::Scalar {
            text,
            quoted: false,
        } = &node.kind
        {
            match text.to_ascii_lowercase().as_str() {
                "true" | "yes" | "y" | "on" => return true,
                "false" | "no" | "n" | "off" => return false,
                _ => {}
            }
        }
        self.error(node.line, path, format!("'{what}' must be true or false"));
        false
    }

    /// `counting: admitted | always`; absent or null leaves the global default.
    fn counting(&mut self, node: Option<&&Yaml>, path: &str) -> Option<Counting> {
        let node = node.filter(|node| !node.is_null())?;
        if let Kind::Scalar { text, .. } = &node.kind {
            match text.parse() {
                Ok(counting) => return Some(counting),
                Err(message) => {
                    self.error(node.line, path, format!("'counting': {message}"));
                    return None;
                }
            }
        }
        self.error(node.line, path, "'counting' must be admitted or always");
        None
    }

    fn integer(&mut self, node: &Yaml, path: &str, what: &str, max: u64) -> Option<u64> {
        if let Kind::Scalar {
            text,
            quoted: false,
        } = &node.kind
        {
            if let Ok(n) = text.parse::<u64>() {
                if n <= max {
                    return Some(n);
                }
                return self.fail(node.line, path, format!("'{what}' must be at most {max}"));
            }
            if text.starts_with('-') && text[1..].parse::<u64>().is_ok() {
                return self.fail(node.line, path, format!("'{what}' must not be negative"));
            }
        }
        self.fail(node.line, path, format!("'{what}' must be a whole number"))
    }

    fn list<'y>(&mut self, node: &'y Yaml, path: &str, what: &str) -> Option<&'y [Yaml]> {
        match &node.kind {
            _ if node.is_null() => Some(&[]),
            Kind::Seq(items) => Some(items),
            _ => self.fail(
                node.line,
                path,
                format!("'{what}' must be a list, found {}", node.shape()),
            ),
        }
    }

    fn domain(&mut self, doc: &Yaml) -> Option<Domain> {
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
        if !matches!(node.kind, Kind::Map(_)) {
            self.error(
                node.line,
                parent,
                format!("a descriptor must be a map, found {}", node.shape()),
            );
            return;
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
        if !self.keep_path(copies * path.len(), node.line) {
            return;
        }
        let Some(map) = self.map(node, &path, "a descriptor", DESCRIPTOR_KEYS) else {
            return;
        };
        if key.is_empty() {
            self.error(node.line, parent, "descriptor has empty key");
            return;
        }
        let mut value_levels = value_levels.to_vec();
        value_levels.push(self.boolean(map.get("value_to_metric"), &path, "value_to_metric"));
        let detailed_metric = self.boolean(map.get("detailed_metric"), &path, "detailed_metric");
        if detailed_metric {
            value_levels.iter_mut().for_each(|v| *v = true);
        }
        let flags = Flags {
            shadow_mode: self.boolean(map.get("shadow_mode"), &path, "shadow_mode"),
            quota_mode: self.boolean(map.get("quota_mode"), &path, "quota_mode"),
            counting: self.counting(map.get("counting"), &path),
            detailed_metric,
            share_threshold: self.boolean(map.get("share_threshold"), &path, "share_threshold"),
            value_levels,
            stats_key: stats_key(stats_parent, [(key.as_str(), Some(value.as_str()))]),
        };
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
        let rules: &mut KeyRules = level.keys.entry(key).or_default();
        let duplicate = if value.is_empty() {
            rules.any.replace(Box::new(compiled)).is_some()
        } else if Pattern::is_pattern(&value) {
            rules.wildcards.push((Pattern::new(&value), compiled));
            // The same key and value at this level is the same path.
            !self.wildcard_paths.insert(path.clone())
        } else {
            rules.values.insert(value, compiled).is_some()
        };
        if duplicate {
            self.error(
                node.line,
                &path,
                "duplicate descriptor: the same key and value already appear at this level",
            );
        }
    }

    fn rule(
        &mut self,
        map: &HashMap<&str, &Yaml>,
        line: usize,
        path: &str,
        flags: &Flags,
    ) -> Option<Rule> {
        // A null limit is no limit, as in envoyproxy/ratelimit: the
        // descriptor whitelists.
        let present = |name| map.get(name).filter(|node| !node.is_null());
        let blocks: Vec<&Yaml> = match (present("rate_limit"), present("rate_limits")) {
            (None, None) => return None,
            (Some(_), Some(_)) => {
                return self.fail(
                    line,
                    path,
                    "use either 'rate_limit' or 'rate_limits', not both",
                );
            }
            (Some(one), None) => vec![*one],
            (None, Some(many)) => {
                let items = self.list(many, path, "rate_limits")?;
                if items.is_empty() {
                    return self.fail(
                        many.line,
                        path,
                        "'rate_limits' must list at least one limit",
                    );
                }
                items.iter().collect()
            }
        };
        let mut limits = Vec::new();
        let mut unlimited = false;
        let mut failed = false;
        // Every block is checked, so that all their errors are reported.
        for block in &blocks {
            match self.rate_limit(block, path) {
                Some(Parsed::Unlimited) => unlimited = true,
                Some(Parsed::Limit(limit)) => limits.push(limit),
                None => failed = true,
            }
        }
        if failed {
            return None;
        }
        if unlimited && blocks.len() > 1 {
            return self.fail(
                line,
                path,
                "an unlimited rate limit cannot be combined with other limits",
            );
        }
        let role = if flags.shadow_mode {
            Role::Shadow
        } else if flags.quota_mode {
            Role::Quota
        } else {
            Role::Enforce
        };
        Some(Rule {
            path: path.to_owned(),
            limits,
            unlimited,
            role,
            counting: flags.counting,
            detailed_metric: flags.detailed_metric,
            metric_values: flags.value_levels.clone(),
            annotations: Arc::new(Annotations {
                path: path.to_owned(),
                metadata: present("metadata").map(|node| node.to_json()),
            }),
            stats_key: flags.stats_key.clone(),
        })
    }

    fn rate_limit(&mut self, node: &Yaml, path: &str) -> Option<Parsed> {
        let map = self.map(node, path, "a rate limit", RATE_LIMIT_KEYS)?;
        let unlimited = self.boolean(map.get("unlimited"), path, "unlimited");
        // `None` when the name is not a string (reported).
        let name = match map.get("name") {
            Some(n) => self
                .string(n, path, "name")
                .map(|n| Some(n).filter(|n| !n.is_empty())),
            None => Some(None),
        };
        let replaces = self.replaces(
            map.get("replaces").copied(),
            path,
            name.as_ref().and_then(Option::as_deref),
        );
        // The unit's text (`None` when not a string, reported) and line.
        let unit = map
            .get("unit")
            .map(|u| (self.string(u, path, "unit"), u.line));
        if unlimited {
            if let Some((Some(text), line)) = &unit
                && !text.is_empty()
            {
                return self.fail(
                    *line,
                    path,
                    "should not specify rate limit unit when unlimited",
                );
            }
            return Some(Parsed::Unlimited);
        }
        // Each part is checked even when another is wrong, so that every error
        // of the block is reported.
        let concurrency = map
            .get("algorithm")
            .is_some_and(|a| matches!(&a.kind, Kind::Scalar { text, .. } if text == "concurrency"));
        let window = if concurrency {
            // The window is the lease; a unit, optional, is only reported.
            let lease = self.lease(map.get("lease").copied(), path);
            let reported = match unit {
                Some((Some(text), line)) if !text.is_empty() => match parse_unit(&text) {
                    Ok((_, reported)) => Some(reported),
                    Err(e) => self.fail(line, path, e),
                },
                Some((None, _)) => None,
                _ => Some(Unit::Unknown),
            };
            lease.zip(reported)
        } else {
            if let Some(lease) = map.get("lease") {
                self.error(
                    lease.line,
                    path,
                    "'lease' applies only to algorithm concurrency",
                );
            }
            match unit {
                Some((Some(text), line)) if !text.is_empty() => match parse_unit(&text) {
                    Ok(parsed) => Some(parsed),
                    Err(e) => self.fail(line, path, e),
                },
                Some((None, _)) => None,
                _ => self.fail(
                    node.line,
                    path,
                    "invalid rate limit unit '': 'unit' is required unless 'unlimited: true'",
                ),
            }
        };
        let requests = match map.get("requests_per_unit") {
            Some(n) => self.integer(n, path, "requests_per_unit", u64::from(u32::MAX)),
            None => self.fail(node.line, path, "'requests_per_unit' is required"),
        };
        let algorithm = self.algorithm(&map, path, window.map(|(ms, _)| ms), requests);
        let (duration_ms, reported) = window?;
        let (requests, algorithm, name, replaces) = (requests?, algorithm?, name?, replaces?);
        Some(Parsed::Limit(Limit {
            spec: LimitSpec {
                requests,
                window: Window {
                    duration_ms,
                    algorithm,
                },
            },
            unit: reported,
            name: name.map(Arc::from),
            replaces,
        }))
    }

    /// `lease:` of a concurrency limit, in milliseconds (the default when absent).
    fn lease(&mut self, node: Option<&Yaml>, path: &str) -> Option<u64> {
        let Some(node) = node else {
            return Some(DEFAULT_LEASE_MS);
        };
        let text = self.string(node, path, "lease")?;
        match parse_duration(&text) {
            Ok(ms) => Some(ms.max(1)),
            Err(e) => self.fail(node.line, path, format!("invalid lease '{text}': {e}")),
        }
    }

    /// The algorithm of a rate limit whose window is `duration_ms` long
    /// (`None` when the unit is wrong: the precision is then checked alone).
    fn algorithm(
        &mut self,
        map: &HashMap<&str, &Yaml>,
        path: &str,
        duration_ms: Option<u64>,
        requests: Option<u64>,
    ) -> Option<Algorithm> {
        let (name, line) = match map.get("algorithm") {
            Some(a) => (self.string(a, path, "algorithm")?, a.line),
            None => (String::new(), 0),
        };
        if name != "token_bucket"
            && let Some(burst) = map.get("burst")
        {
            return self.fail(
                burst.line,
                path,
                "'burst' applies only to algorithm token_bucket",
            );
        }
        let precision = map.get("precision");
        match name.as_str() {
            "" | "sliding_window" => {
                let precision_ms = match precision {
                    None => default_precision(duration_ms?),
                    Some(node) => {
                        let text = self.string(node, path, "precision")?;
                        let p = match parse_duration(&text) {
                            Ok(p) => p,
                            Err(e) => return self.fail(node.line, path, format!("invalid precision '{text}': {e}")),
                        };
                        let duration_ms = duration_ms?;
                        if p > duration_ms {
                            return self.fail(node.line, path, format!("precision '{text}' is longer than the window ({duration_ms} ms)"));
                        }
                        if !duration_ms.is_multiple_of(p) {
                            return self.fail(node.line, path, format!("precision '{text}' must divide the window ({duration_ms} ms) into whole buckets"));
                        }
                        if duration_ms / p > MAX_BUCKETS {
                            return self.fail(node.line, path, format!("precision '{text}' makes {} buckets; at most {MAX_BUCKETS} are allowed", duration_ms / p));
                        }
                        p
                    }
                };
                Some(Algorithm::SlidingWindow { precision_ms })
            }
            "fixed_window" => match precision {
                Some(node) => self.fail(node.line, path, "'precision' applies only to algorithm sliding_window"),
                None => Some(Algorithm::FixedWindow),
            },
            "token_bucket" => {
                if let Some(node) = precision {
                    return self.fail(node.line, path, "'precision' applies only to algorithm sliding_window");
                }
                // The burst defaults to the limit: a full window's worth at once.
                let burst = match map.get("burst") {
                    Some(node) => match self.integer(node, path, "burst", u64::from(u32::MAX))? {
                        0 => return self.fail(node.line, path, "'burst' must be at least 1"),
                        burst => burst,
                    },
                    None => requests?,
                };
                let window = duration_ms?;
                if burst.saturating_mul(window) > MAX_BUCKET_TICKS {
                    return self.fail(
                        line.max(1),
                        path,
                        format!("token_bucket: burst × window ({burst} × {window} ms) must be at most 2^52; use a shorter window or a smaller burst"),
                    );
                }
                Some(Algorithm::TokenBucket { burst })
            }
            "sliding_log" => {
                if let Some(node) = precision {
                    return self.fail(node.line, path, "'precision' applies only to algorithm sliding_window");
                }
                if requests? > MAX_LOG_ENTRIES {
                    return self.fail(
                        line,
                        path,
                        format!("sliding_log keeps one entry per hit: requests_per_unit must be at most {MAX_LOG_ENTRIES} (use sliding_window for larger limits)"),
                    );
                }
                Some(Algorithm::SlidingLog)
            }
            "concurrency" => {
                if let Some(node) = precision {
                    return self.fail(node.line, path, "'precision' applies only to algorithm sliding_window");
                }
                if requests? > MAX_LOG_ENTRIES {
                    return self.fail(
                        line,
                        path,
                        format!("concurrency keeps one entry per slot: requests_per_unit must be at most {MAX_LOG_ENTRIES}"),
                    );
                }
                Some(Algorithm::Concurrency)
            }
            other => self.fail(
                line,
                path,
                format!("unknown algorithm '{other}' (expected sliding_window, fixed_window, token_bucket, sliding_log or concurrency)"),
            ),
        }
    }

    fn replaces(
        &mut self,
        node: Option<&Yaml>,
        path: &str,
        own: Option<&str>,
    ) -> Option<Vec<String>> {
        let Some(node) = node else {
            return Some(Vec::new());
        };
        let mut names = Vec::new();
        let mut ok = true;
        for item in self.list(node, path, "replaces")? {
            let Some(map) = self.map(item, path, "a replaces entry", &["name"]) else {
                ok = false;
                continue;
            };
            let name = match map.get("name") {
                Some(n) => self.string(n, path, "name").unwrap_or_default(),
                None => String::new(),
            };
            if name.is_empty() {
                self.error(item.line, path, "should not have an empty replaces entry");
                ok = false;
            } else if Some(name.as_str()) == own {
                self.error(
                    item.line,
                    path,
                    "replaces should not contain name of same descriptor",
                );
                ok = false;
            } else {
                names.push(name);
            }
        }
        let unique: HashSet<&String> = names.iter().collect();
        if unique.len() != names.len() {
            self.error(node.line, path, "replaces names the same limit twice");
            ok = false;
        }
        ok.then_some(names)
    }
}

enum Parsed {
    Unlimited,
    Limit(Limit),
}

/// `duration / n` for the largest `n ≤ DEFAULT_BUCKETS` that divides it exactly.
fn default_precision(duration_ms: u64) -> u64 {
    (1..=DEFAULT_BUCKETS)
        .rev()
        .find(|n| duration_ms.is_multiple_of(*n))
        .map_or(duration_ms, |n| duration_ms / n)
}
