//! Rate-limit response headers, computed from a decision: the draft-03
//! `X-RateLimit-*` trio, or the IETF `RateLimit-Policy` / `RateLimit` fields
//! (draft-ietf-httpapi-ratelimit-headers, structured fields).
//!
//! Both describe the descriptor closest to its limit: the first one over
//! limit, otherwise the one with the least remaining.
//!
//! Two warnings of an admitted request ride along, whatever the mode: to
//! the client, `x-ratelimit-soft-breach: 1` once a limit is past its
//! `soft_ratio`; to the upstream (Envoy's `request_headers_to_add`, when
//! asked), the headroom left and which limit it is.

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, Reported, Status};

/// Which headers to add to responses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HeaderMode {
    /// None.
    #[default]
    Off,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    Draft03,
    /// `RateLimit-Policy` and `RateLimit`.
    Ietf,
}

/// Added to an admitted response when some limit is past its soft ratio.
pub const SOFT_BREACH: &str = "x-ratelimit-soft-breach";
/// Told the upstream: requests left under the tightest limit.
pub const HEADROOM_REMAINING: &str = "x-ratelimit-remaining";
/// Told the upstream: that limit's name, else its rule's path.
pub const HEADROOM_NAME: &str = "x-ratelimit-name";

/// `x-ratelimit-soft-breach: 1` when `decision` admits the request and
/// some descriptor is past a soft ratio. A refusal says more than a
/// warning could, so it never carries one.
pub fn soft_breach(decision: &Decision) -> Option<(&'static str, String)> {
    (decision.admitted && decision.statuses.iter().any(|s| s.soft_breach))
        .then(|| (SOFT_BREACH, "1".to_owned()))
}

/// What the upstream of an admitted request is told about its headroom:
/// the remaining count of the descriptor with the least (the first of
/// equals; the one `x-ratelimit-remaining` describes to the client), and
/// that limit's name. Nothing when no limit applied or nothing goes
/// upstream (a refusal).
pub fn headroom(decision: &Decision) -> Vec<(&'static str, String)> {
    if !decision.admitted {
        return Vec::new();
    }
    let Some(tightest) = decision
        .statuses
        .iter()
        .filter(|s| s.limit.is_some())
        .min_by_key(|s| s.remaining)
    else {
        return Vec::new();
    };
    vec![
        (HEADROOM_REMAINING, tightest.remaining.to_string()),
        (HEADROOM_NAME, header_text(tightest.limit_label())),
    ]
}

/// `text` as a header value: printable ASCII kept, anything else (a
/// control character, a byte beyond ASCII in a rule path) as `?`.
fn header_text(text: &str) -> String {
    text.chars()
        .map(|c| if matches!(c, ' '..='~') { c } else { '?' })
        .collect()
}

/// The headers for `decision` in `mode`, as (name, value) pairs.
pub fn headers(mode: HeaderMode, decision: &Decision) -> Vec<(&'static str, String)> {
    let limited: Vec<(&Status, &Reported)> = decision
        .statuses
        .iter()
        .filter_map(|s| s.limit.as_ref().map(|l| (s, l)))
        .collect();
    let Some(&(status, limit)) = limited
        .iter()
        .find(|(s, _)| s.over_limit)
        .or_else(|| limited.iter().min_by_key(|(s, _)| s.remaining))
    else {
        return Vec::new();
    };
    let reset = status.reset_ms.unwrap_or(0).div_ceil(1_000);
    let mut policies: Vec<&Reported> = Vec::new();
    for (_, l) in &limited {
        if !policies.contains(l) {
            policies.push(l);
        }
    }
    match mode {
        HeaderMode::Off => Vec::new(),
        HeaderMode::Draft03 => {
            let mut value = limit.requests.to_string();
            for p in &policies {
                value.push_str(&format!(", {};w={}", p.requests, window_seconds(p)));
                if let Some(name) = &p.name {
                    value.push_str(&format!(";name=\"{}\"", sf_string(name)));
                }
            }
            vec![
                ("x-ratelimit-limit", value),
                ("x-ratelimit-remaining", status.remaining.to_string()),
                ("x-ratelimit-reset", reset.to_string()),
            ]
        }
        HeaderMode::Ietf => {
            let policy = policies
                .iter()
                .map(|p| {
                    format!(
                        "\"{}\";q={};w={}",
                        policy_name(p),
                        p.requests,
                        window_seconds(p)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            vec![
                ("ratelimit-policy", policy),
                (
                    "ratelimit",
                    format!(
                        "\"{}\";r={};t={}",
                        policy_name(limit),
                        status.remaining,
                        reset
                    ),
                ),
            ]
        }
    }
}

/// Window in whole seconds, at least 1 (header fields carry seconds).
fn window_seconds(limit: &Reported) -> u64 {
    limit.window_ms.div_ceil(1_000).max(1)
}

/// The limit's name, or a stable one made from its numbers.
fn policy_name(limit: &Reported) -> String {
    match &limit.name {
        Some(name) => sf_string(name),
        None => format!("{}-per-{}s", limit.requests, window_seconds(limit)),
    }
}

/// Escapes text for a structured-field string: printable ASCII only, with
/// `"` and `\` escaped.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::limiter::Unit;

    fn limited(
        requests: u64,
        window_ms: u64,
        name: Option<&str>,
        remaining: u64,
        over: bool,
    ) -> Status {
        Status {
            over_limit: over,
            limit: Some(Reported {
                requests,
                unit: Unit::Unknown,
                window_ms,
                name: name.map(Arc::from),
                algorithm: "sliding_window",
                penalty: None,
            }),
            remaining,
            reset_ms: Some(57_200),
            rule: None,
            soft_breach: false,
        }
    }

    #[test]
    fn draft03_describes_the_tightest_descriptor_and_lists_policies() {
        let d = Decision {
            admitted: true,
            statuses: vec![
                limited(100, 60_000, None, 40, false),
                limited(10, 1_000, Some("burst"), 3, false),
            ],
        };
        assert_eq!(
            headers(HeaderMode::Draft03, &d),
            vec![
                (
                    "x-ratelimit-limit",
                    "10, 100;w=60, 10;w=1;name=\"burst\"".to_string()
                ),
                ("x-ratelimit-remaining", "3".to_string()),
                ("x-ratelimit-reset", "58".to_string()),
            ]
        );
    }

    #[test]
    fn ietf_fields_name_the_policy_of_the_rejecting_descriptor() {
        let d = Decision {
            admitted: false,
            statuses: vec![
                limited(100, 60_000, Some("a\"b"), 0, true),
                limited(5, 1_000, None, 0, false),
            ],
        };
        assert_eq!(
            headers(HeaderMode::Ietf, &d),
            vec![
                (
                    "ratelimit-policy",
                    "\"a\\\"b\";q=100;w=60, \"5-per-1s\";q=5;w=1".to_string()
                ),
                ("ratelimit", "\"a\\\"b\";r=0;t=58".to_string()),
            ]
        );
    }

    #[test]
    fn no_headers_without_a_limit_or_when_off() {
        let none = Decision {
            admitted: true,
            statuses: vec![],
        };
        assert!(headers(HeaderMode::Draft03, &none).is_empty());
        let d = Decision {
            admitted: true,
            statuses: vec![limited(1, 1_000, None, 0, false)],
        };
        assert!(headers(HeaderMode::Off, &d).is_empty());
    }

    #[test]
    fn soft_breach_is_said_only_on_an_admitted_request() {
        let warned = Status {
            soft_breach: true,
            ..limited(100, 60_000, None, 15, false)
        };
        let quiet = limited(10, 1_000, None, 3, false);
        let mut d = Decision {
            admitted: true,
            statuses: vec![quiet.clone(), warned.clone()],
        };
        assert_eq!(
            soft_breach(&d),
            Some(("x-ratelimit-soft-breach", "1".into()))
        );
        d.statuses = vec![quiet.clone()];
        assert_eq!(soft_breach(&d), None, "no limit past its ratio");
        d.statuses = vec![
            warned,
            Status {
                over_limit: true,
                ..quiet
            },
        ];
        d.admitted = false;
        assert_eq!(soft_breach(&d), None, "a refusal needs no warning");
    }

    #[test]
    fn headroom_names_the_limit_with_the_least_remaining() {
        let rule = |path: &str| {
            Some(Arc::new(crate::rules::Annotations {
                path: path.into(),
                metadata: None,
            }))
        };
        let d = Decision {
            admitted: true,
            statuses: vec![
                Status::NO_LIMIT,
                Status {
                    rule: rule("api/user"),
                    ..limited(100, 60_000, Some("per-user"), 40, false)
                },
                Status {
                    rule: rule("api/tenant=caf\u{e9}\n"),
                    ..limited(1_000, 3_600_000, None, 7, false)
                },
                Status {
                    rule: rule("api/path"),
                    ..limited(10, 1_000, None, 7, false)
                },
            ],
        };
        assert_eq!(
            headroom(&d),
            vec![
                ("x-ratelimit-remaining", "7".to_string()),
                // No name: the rule's path, made a safe header value; the
                // first of two equals.
                ("x-ratelimit-name", "api/tenant=caf??".to_string()),
            ]
        );
    }

    #[test]
    fn no_headroom_without_a_limit_or_for_a_refusal() {
        let unlimited = Decision {
            admitted: true,
            statuses: vec![Status::NO_LIMIT, Status::UNLIMITED],
        };
        assert!(headroom(&unlimited).is_empty());
        let refused = Decision {
            admitted: false,
            statuses: vec![limited(5, 1_000, Some("n"), 0, true)],
        };
        assert!(headroom(&refused).is_empty());
    }
}
