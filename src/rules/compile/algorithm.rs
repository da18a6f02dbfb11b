//! A rate limit's algorithm (`algorithm:`) and the parameters each takes:
//! a sliding window's `precision`, a token bucket's `burst`, and the bounds
//! that keep one counter's state small.

use std::collections::HashMap;

use super::Compiler;
use crate::limiter::algorithm::{MAX_BUCKET_TICKS, MAX_LOG_ENTRIES};
use crate::limiter::calendar::{Calendar, Period, Zone};
use crate::limiter::{Algorithm, Unit};
use crate::rules::duration::parse_duration;
use crate::rules::yaml::{Kind, Node as Yaml};

/// Buckets per window when `precision` is not given: the largest divisor of the
/// window up to 10. Ten buckets keep the interpolated bucket (the only source of
/// error) at a tenth of the window, while a counter stays at a dozen small
/// fields and a check touches one or two of them.
pub const DEFAULT_BUCKETS: u64 = 10;

/// Most buckets a sliding window may have, which bounds the work and memory of
/// one counter whatever the traffic.
pub const MAX_BUCKETS: u64 = 3_600;

impl Compiler<'_> {
    /// The algorithm of a rate limit whose window is `duration_ms` long and
    /// reported as `unit` (`None` when the unit is wrong: the precision is
    /// then checked alone).
    pub(super) fn algorithm(
        &mut self,
        map: &HashMap<&str, &Yaml>,
        path: &str,
        window: Option<(u64, Unit)>,
        requests: Option<u64>,
    ) -> Option<Algorithm> {
        let duration_ms = window.map(|(ms, _)| ms);
        let (name, line) = match map.get("algorithm") {
            Some(a) => (self.string(a, path, "algorithm")?, a.line),
            None => (String::new(), 0),
        };
        if let Some(zone) = map.get("calendar") {
            return self.calendar(map, zone, path, &name, line, window.map(|(_, unit)| unit));
        }
        if name != "token_bucket"
            && let Some(burst) = map.get("burst")
        {
            return self.fail(
                burst.line,
                path,
                "'burst' applies only to algorithm token_bucket",
            );
        }
        let precision = map.get("precision").copied();
        match name.as_str() {
            "" | "sliding_window" => {
                let precision_ms = match precision {
                    None => default_precision(duration_ms?),
                    Some(node) => self.precision(node, path, duration_ms)?,
                };
                Some(Algorithm::SlidingWindow { precision_ms })
            }
            "fixed_window" => self
                .no_precision(precision, path)
                .map(|()| Algorithm::FixedWindow),
            "token_bucket" => {
                self.no_precision(precision, path)?;
                self.token_bucket(map, path, line, duration_ms, requests)
            }
            "sliding_log" => {
                self.no_precision(precision, path)?;
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
                self.no_precision(precision, path)?;
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

    /// A sliding window's `precision:`, which must cut the window (when its
    /// unit is right) into at most [`MAX_BUCKETS`] whole buckets.
    fn precision(&mut self, node: &Yaml, path: &str, duration_ms: Option<u64>) -> Option<u64> {
        let text = self.string(node, path, "precision")?;
        let p = match parse_duration(&text) {
            Ok(p) => p,
            Err(e) => {
                return self.fail(node.line, path, format!("invalid precision '{text}': {e}"));
            }
        };
        let duration_ms = duration_ms?;
        if p > duration_ms {
            return self.fail(
                node.line,
                path,
                format!("precision '{text}' is longer than the window ({duration_ms} ms)"),
            );
        }
        if !duration_ms.is_multiple_of(p) {
            return self.fail(node.line, path, format!("precision '{text}' must divide the window ({duration_ms} ms) into whole buckets"));
        }
        if duration_ms / p > MAX_BUCKETS {
            return self.fail(
                node.line,
                path,
                format!(
                    "precision '{text}' makes {} buckets; at most {MAX_BUCKETS} are allowed",
                    duration_ms / p
                ),
            );
        }
        Some(p)
    }

    /// `precision:` on an algorithm other than the sliding window, which
    /// has no buckets: an error.
    fn no_precision(&mut self, precision: Option<&Yaml>, path: &str) -> Option<()> {
        match precision {
            Some(node) => self.fail(
                node.line,
                path,
                "'precision' applies only to algorithm sliding_window",
            ),
            None => Some(()),
        }
    }

    /// A calendar period (`calendar: <IANA zone>`), counted as a fixed
    /// window over the day, week, month or year its unit names. `line` is
    /// the algorithm's (0 when none is given); `unit` is `None` when the
    /// unit is wrong (reported).
    fn calendar(
        &mut self,
        map: &HashMap<&str, &Yaml>,
        zone: &Yaml,
        path: &str,
        name: &str,
        line: usize,
        unit: Option<Unit>,
    ) -> Option<Algorithm> {
        if !name.is_empty() && name != "fixed_window" {
            return self.fail(
                line,
                path,
                format!("'calendar' periods are counted as fixed windows: remove 'algorithm: {name}' or 'calendar'"),
            );
        }
        self.no_precision(map.get("precision").copied(), path)?;
        let (text, zone_line) = (self.string(zone, path, "calendar")?, zone.line);
        let zone = match Zone::get(&text) {
            Ok(zone) => zone,
            Err(e) => return self.fail(zone_line, path, format!("calendar: {e}")),
        };
        // Named, not a length that happens to match one (`30d` is not a
        // month).
        unit?;
        let unit = map.get("unit");
        let named = unit
            .and_then(|u| match &u.kind {
                Kind::Scalar { text, .. } => Unit::from_proto_name(text),
                _ => None,
            })
            .unwrap_or(Unit::Unknown);
        let period = match named {
            Unit::Day => Period::Day,
            Unit::Week => Period::Week,
            Unit::Month => Period::Month,
            Unit::Year => Period::Year,
            _ => {
                return self.fail(
                    unit.map_or(zone_line, |u| u.line),
                    path,
                    "'calendar' needs unit day, week, month or year (a calendar period)",
                );
            }
        };
        Some(Algorithm::Calendar(Calendar { period, zone }))
    }

    /// A token bucket and its `burst:`, whose state must stay exact: burst
    /// × window within [`MAX_BUCKET_TICKS`]. `line` is the algorithm's.
    fn token_bucket(
        &mut self,
        map: &HashMap<&str, &Yaml>,
        path: &str,
        line: usize,
        duration_ms: Option<u64>,
        requests: Option<u64>,
    ) -> Option<Algorithm> {
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
}

/// `duration / n` for the largest `n ≤ DEFAULT_BUCKETS` that divides it exactly.
fn default_precision(duration_ms: u64) -> u64 {
    (1..=DEFAULT_BUCKETS)
        .rev()
        .find(|n| duration_ms.is_multiple_of(*n))
        .map_or(duration_ms, |n| duration_ms / n)
}
