//! A rate limit's penalty box (`penalty:`): the first block, its
//! escalation, the longest block and when a streak is forgotten, and the
//! limits a penalty may sit on.
//!
//! A block must outlast the limit's window ([`shortest_block_ms`]): when it
//! ends, the counter has emptied, so the identity starts again from
//! nothing rather than from a counter that still refuses it.

use std::collections::HashMap;

use super::Compiler;
use crate::limiter::penalty::{MAX_BLOCK_MS, MAX_ESCALATE};
use crate::limiter::unit::DAY;
use crate::limiter::{Algorithm, Penalty, Window};
use crate::rules::duration::{duration_text, parse_duration};
use crate::rules::yaml::{Kind, Node as Yaml};

const PENALTY_KEYS: &[&str] = &["block", "escalate", "max_block", "forget_after"];

/// `max_block` when absent (unless `block` is longer).
pub const DEFAULT_MAX_BLOCK_MS: u64 = DAY;

/// `forget_after` when absent.
pub const DEFAULT_FORGET_AFTER_MS: u64 = DAY;

/// The shortest block a penalty on a limit counted in `window` may have:
/// the window, plus a bucket for a sliding window (its count reaches back
/// one bucket further). `None` where a penalty has no place: calendar
/// periods (a budget) and concurrency (slots in flight).
pub fn shortest_block_ms(window: &Window) -> Option<u64> {
    match window.algorithm {
        Algorithm::SlidingWindow { precision_ms } => {
            Some(window.duration_ms.saturating_add(precision_ms))
        }
        Algorithm::FixedWindow | Algorithm::TokenBucket { .. } | Algorithm::SlidingLog => {
            Some(window.duration_ms)
        }
        Algorithm::Calendar(_) | Algorithm::Concurrency => None,
    }
}

/// Whether `penalty` may sit on a limit counted in `window`.
pub fn penalty_fits(penalty: &Penalty, window: &Window) -> bool {
    shortest_block_ms(window).is_some_and(|shortest| penalty.block_ms >= shortest)
}

/// The window's length as the refusal says it: `1m`, or `1m plus a 6s
/// bucket` for a sliding window.
fn window_words(window: &Window) -> String {
    match window.algorithm {
        Algorithm::SlidingWindow { precision_ms } => format!(
            "{} plus a {} bucket",
            duration_text(window.duration_ms),
            duration_text(precision_ms)
        ),
        _ => duration_text(window.duration_ms),
    }
}

impl Compiler<'_> {
    /// `penalty:` of a rate limit counted in `window` (`None` when the
    /// window or the algorithm is wrong, reported: the penalty is then
    /// checked alone). `Some(None)` when absent or null, `None` when wrong
    /// (reported). `line` is the line of the `penalty` key.
    pub(super) fn penalty(
        &mut self,
        node: Option<&Yaml>,
        line: usize,
        path: &str,
        window: Option<Window>,
    ) -> Option<Option<Penalty>> {
        let Some(node) = node.filter(|node| !node.is_null()) else {
            return Some(None);
        };
        if !matches!(node.kind, Kind::Map(_)) {
            return self.fail(
                node.line,
                path,
                format!(
                    "'penalty' must be a map such as {{block: 15m, escalate: 2}}, found {}",
                    node.shape()
                ),
            );
        }
        let map = self.map(node, path, "a penalty", PENALTY_KEYS)?;
        let penalty = self.penalty_values(&map, line, path)?;
        let window = window?;
        let block_line = map.get("block").map_or(line, |node| node.line);
        self.penalty_on(penalty, &window, (line, block_line), path)
            .map(Some)
    }

    /// The values of a penalty's map, each checked (every error reported),
    /// with their defaults.
    fn penalty_values(
        &mut self,
        map: &HashMap<&str, &Yaml>,
        line: usize,
        path: &str,
    ) -> Option<Penalty> {
        let block = match map.get("block") {
            Some(node) => self.penalty_duration(node, path, "block"),
            None => self.fail(
                line,
                path,
                "'penalty' needs 'block', the first block's length (e.g. block: 15m)",
            ),
        };
        let escalate = match map.get("escalate") {
            Some(node) => self.escalate(node, path),
            None => Some(1),
        };
        let max_block = map
            .get("max_block")
            .map(|node| (self.penalty_duration(node, path, "max_block"), node.line));
        let forget_after_ms = match map.get("forget_after") {
            Some(node) => self.penalty_duration(node, path, "forget_after"),
            None => Some(DEFAULT_FORGET_AFTER_MS),
        };
        let block_ms = block?;
        let max_block_ms = match max_block {
            None => DEFAULT_MAX_BLOCK_MS.max(block_ms),
            Some((max, at)) => match max? {
                max if max < block_ms => {
                    return self.fail(
                        at,
                        path,
                        format!(
                            "'penalty.max_block' ({}) is shorter than 'penalty.block' ({}): the longest block must be at least the first; raise max_block or remove it (default: 1d, or block when longer)",
                            duration_text(max),
                            duration_text(block_ms)
                        ),
                    );
                }
                max => max,
            },
        };
        Some(Penalty {
            block_ms,
            escalate: escalate?,
            max_block_ms,
            forget_after_ms: forget_after_ms?,
        })
    }

    /// `penalty` if it may sit on a limit counted in `window`; refused (at
    /// the `penalty` key's line or at its `block`'s) otherwise.
    fn penalty_on(
        &mut self,
        penalty: Penalty,
        window: &Window,
        (line, block_line): (usize, usize),
        path: &str,
    ) -> Option<Penalty> {
        match shortest_block_ms(window) {
            None => self.fail(
                line,
                path,
                format!(
                    "'penalty' cannot be set on {}: a penalty box punishes a rate's offenders, not a budget or in-flight slots; remove 'penalty'",
                    match window.algorithm {
                        Algorithm::Calendar(_) => "a calendar period ('calendar')",
                        _ => "algorithm concurrency",
                    }
                ),
            ),
            Some(shortest) if penalty.block_ms < shortest => self.fail(
                block_line,
                path,
                format!(
                    "'penalty.block' ({}) is shorter than the limit's window ({}): a block must outlast the window, so the counter has emptied when the block ends; use a block of at least {}",
                    duration_text(penalty.block_ms),
                    window_words(window),
                    duration_text(shortest)
                ),
            ),
            Some(_) => Some(penalty),
        }
    }

    /// A duration of the penalty, `key` its key: positive and at most
    /// [`MAX_BLOCK_MS`].
    fn penalty_duration(&mut self, node: &Yaml, path: &str, key: &str) -> Option<u64> {
        let text = match &node.kind {
            Kind::Scalar { text, .. } => text.clone(),
            _ => {
                return self.fail(
                    node.line,
                    path,
                    format!(
                        "'penalty.{key}' must be a duration such as 15m, 4h or 1d, found {}",
                        node.shape()
                    ),
                );
            }
        };
        match parse_duration(&text) {
            Ok(ms) if ms <= MAX_BLOCK_MS => Some(ms),
            Ok(_) => self.fail(
                node.line,
                path,
                format!("'penalty.{key}' ({text}) must be at most 366 days (366d)"),
            ),
            Err(e) => self.fail(
                node.line,
                path,
                format!(
                    "invalid 'penalty.{key}' '{text}': {e} (write a duration such as 15m, 4h or 1d)"
                ),
            ),
        }
    }

    /// `escalate:`, a whole number from 1 to [`MAX_ESCALATE`].
    fn escalate(&mut self, node: &Yaml, path: &str) -> Option<u64> {
        if let Kind::Scalar {
            text,
            quoted: false,
        } = &node.kind
            && let Ok(n) = text.parse::<u64>()
            && (1..=MAX_ESCALATE).contains(&n)
        {
            return Some(n);
        }
        let found = node.found();
        self.fail(
            node.line,
            path,
            format!(
                "'penalty.escalate' must be a whole number from 1 to {MAX_ESCALATE} (found {found}): each further offence of a streak multiplies the block by it, 1 keeps it the same"
            ),
        )
    }
}

/// The line of `key`'s key in the map `node` (the map's own line when not
/// found).
pub(super) fn key_line(node: &Yaml, key: &str) -> usize {
    match &node.kind {
        Kind::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| matches!(&k.kind, Kind::Scalar { text, .. } if text == key))
            .map_or(node.line, |(k, _)| k.line),
        _ => node.line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_outlasts_the_window_and_a_sliding_windows_bucket() {
        let minute = |algorithm| Window {
            duration_ms: 60_000,
            algorithm,
        };
        let sliding = minute(Algorithm::SlidingWindow {
            precision_ms: 6_000,
        });
        assert_eq!(shortest_block_ms(&sliding), Some(66_000));
        assert_eq!(
            shortest_block_ms(&minute(Algorithm::FixedWindow)),
            Some(60_000)
        );
        assert_eq!(
            shortest_block_ms(&minute(Algorithm::TokenBucket { burst: 5 })),
            Some(60_000)
        );
        assert_eq!(shortest_block_ms(&minute(Algorithm::Concurrency)), None);
        let penalty = |block_ms| Penalty {
            block_ms,
            escalate: 1,
            max_block_ms: DAY,
            forget_after_ms: DAY,
        };
        assert!(penalty_fits(&penalty(66_000), &sliding));
        assert!(!penalty_fits(&penalty(65_999), &sliding));
    }
}
