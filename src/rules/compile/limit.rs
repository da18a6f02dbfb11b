//! A descriptor's rule: its rate limits (`rate_limit` or `rate_limits`),
//! each with its unit or lease, request count, name and `replaces`, and the
//! role its flags give it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::Compiler;
use super::penalty::key_line;
use super::tree::Flags;
use crate::limiter::calendar::Calendar;
use crate::limiter::{Algorithm, LimitSpec, Role, SoftRatio, Unit, Window};
use crate::rules::duration::{parse_duration, parse_unit};
use crate::rules::yaml::{Kind, Node as Yaml};
use crate::rules::{Annotations, Limit, Rule};

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
    "calendar",
    "soft_ratio",
    "penalty",
];

/// How long a concurrency slot is held when no release comes: long enough
/// for ordinary streams, short enough that a lost release frees its slot
/// soon. `lease:` in the rule overrides it.
pub const DEFAULT_LEASE_MS: u64 = 30_000;

impl Compiler<'_> {
    pub(super) fn rule(
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
        self.one_zone_per_calendar_unit(&limits, line, path)?;
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

    /// Calendar limits of one unit on one descriptor name one zone: an
    /// identity's counters share a HASH in Redis, where a calendar period's
    /// fields are named by its unit alone.
    fn one_zone_per_calendar_unit(
        &mut self,
        limits: &[Limit],
        line: usize,
        path: &str,
    ) -> Option<()> {
        let calendars: Vec<Calendar> = limits
            .iter()
            .filter_map(|l| match l.spec.window.algorithm {
                Algorithm::Calendar(c) => Some(c),
                _ => None,
            })
            .collect();
        for (i, a) in calendars.iter().enumerate() {
            if let Some(b) = calendars[..i]
                .iter()
                .find(|b| b.period == a.period && b.zone != a.zone)
            {
                return self.fail(
                    line,
                    path,
                    format!(
                        "two calendar limits per {} in different zones ('{}' and '{}'): one descriptor counts a period in one zone",
                        a.period.name(),
                        b.zone.name(),
                        a.zone.name()
                    ),
                );
            }
        }
        Some(())
    }

    /// One block of `rate_limit(s)`: unlimited, or a limit.
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
            return self.unlimited(node, &map, unit.as_ref(), path);
        }
        // Each part is checked even when another is wrong, so that every error
        // of the block is reported.
        let window = self.window(&map, unit, path, node.line);
        let requests = match map.get("requests_per_unit") {
            Some(n) => self.integer(n, path, "requests_per_unit", u64::from(u32::MAX)),
            None => self.fail(node.line, path, "'requests_per_unit' is required"),
        };
        let algorithm = self.algorithm(&map, path, window, requests);
        let soft_ratio = self.soft_ratio(map.get("soft_ratio").copied(), path);
        let counted = window
            .zip(algorithm)
            .map(|((duration_ms, _), algorithm)| Window {
                duration_ms,
                algorithm,
            });
        let penalty = self.penalty(
            map.get("penalty").copied(),
            key_line(node, "penalty"),
            path,
            counted,
        );
        let (_, reported) = window?;
        let (requests, window, name, replaces) = (requests?, counted?, name?, replaces?);
        let (soft_ratio, penalty) = (soft_ratio?, penalty?);
        Some(Parsed::Limit(Limit {
            spec: LimitSpec {
                requests,
                window,
                penalty,
            },
            unit: reported,
            name: name.map(Arc::from),
            replaces,
            soft_ratio,
        }))
    }

    /// An `unlimited: true` block, refused when it also says what only a
    /// limit means: a unit, a `soft_ratio`, a `penalty`.
    fn unlimited(
        &mut self,
        node: &Yaml,
        map: &HashMap<&str, &Yaml>,
        unit: Option<&(Option<String>, usize)>,
        path: &str,
    ) -> Option<Parsed> {
        if let Some((Some(text), line)) = unit
            && !text.is_empty()
        {
            return self.fail(
                *line,
                path,
                "should not specify rate limit unit when unlimited",
            );
        }
        if let Some(node) = map.get("soft_ratio").filter(|node| !node.is_null()) {
            return self.fail(
                node.line,
                path,
                "'soft_ratio' has no meaning when unlimited: nothing is counted",
            );
        }
        if map.get("penalty").is_some_and(|node| !node.is_null()) {
            return self.fail(
                key_line(node, "penalty"),
                path,
                "'penalty' has no meaning when unlimited: nothing is refused, so nobody offends; remove 'penalty' or 'unlimited'",
            );
        }
        Some(Parsed::Unlimited)
    }

    /// A limit's window in milliseconds, and the unit reported to Envoy: a
    /// concurrency limit's lease (with its unit, if any), else its unit.
    /// `unit` is the unit's text (`None` when not a string, reported) and
    /// line; `line` is the limit's.
    fn window(
        &mut self,
        map: &HashMap<&str, &Yaml>,
        unit: Option<(Option<String>, usize)>,
        path: &str,
        line: usize,
    ) -> Option<(u64, Unit)> {
        let concurrency = map
            .get("algorithm")
            .is_some_and(|a| matches!(&a.kind, Kind::Scalar { text, .. } if text == "concurrency"));
        if concurrency {
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
                    line,
                    path,
                    "invalid rate limit unit '': 'unit' is required unless 'unlimited: true'",
                ),
            }
        }
    }

    /// `soft_ratio:`, the share of the limit past which admitted requests
    /// are warned; `Some(None)` when absent or null, `None` when wrong
    /// (reported).
    fn soft_ratio(&mut self, node: Option<&Yaml>, path: &str) -> Option<Option<SoftRatio>> {
        let Some(node) = node.filter(|node| !node.is_null()) else {
            return Some(None);
        };
        if let Kind::Scalar {
            text,
            quoted: false,
        } = &node.kind
            && let Ok(ratio) = text.parse::<f64>().map_err(|_| "").and_then(SoftRatio::new)
        {
            return Some(Some(ratio));
        }
        let found = node.found();
        self.fail(
            node.line,
            path,
            format!(
                "'soft_ratio' must be a number above 0 and at most 1, e.g. 0.8 (found {found})"
            ),
        )
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
