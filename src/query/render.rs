//! A `ShouldRateLimit` answer as text for people: each descriptor's code,
//! its limit with the window it was given, what is left and when it
//! resets, and why a request was refused.
//!
//! RLS names a limit's window only as one unit (`MINUTE`); a limit over
//! another length (`5m`) comes back as `UNKNOWN`. Its length is then read
//! where the server also put it: Sluice's refusal explanation
//! (`dynamic_metadata.refused`) or the rate-limit headers' policies
//! (`w=` seconds), and said to be absent otherwise — never guessed.

use std::fmt::Write as _;

use prost_types::value::Kind;

use super::QueryArgs;
use crate::proto as pb;
use crate::proto::rate_limit_response::{Code, rate_limit::Unit};
use crate::rules::parse_duration;

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// The decision as readable text.
pub fn render(args: &QueryArgs, response: &pb::RateLimitResponse) -> String {
    let mut out = format!(
        "{}  (domain {})\n",
        code_name(response.overall_code),
        args.domain
    );
    let refusal = Refusal::of(response);
    let store_failed = refusal.as_ref().is_some_and(Refusal::is_store_error);
    let policies = policies(response);
    for (i, status) in response.statuses.iter().enumerate() {
        let entries = args
            .descriptors
            .get(i)
            .map(|d| {
                d.0.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let _ = write!(out, "  [{i}] {entries}  {}", code_name(status.code));
        let over = status.code == Code::OverLimit as i32;
        match &status.current_limit {
            Some(limit) => {
                let from_refusal = refusal
                    .as_ref()
                    .filter(|r| r.index() == Some(i))
                    .and_then(Refusal::window);
                let window = named_unit(limit.unit)
                    .or(from_refusal)
                    .or_else(|| policy_window(limit, &policies));
                match window {
                    Some(window) => {
                        let _ = write!(out, "  limit {} per {window}", limit.requests_per_unit);
                    }
                    None => {
                        let _ = write!(
                            out,
                            "  limit {} per window (a length the answer does not give)",
                            limit.requests_per_unit
                        );
                    }
                }
                if !limit.name.is_empty() {
                    let _ = write!(out, " ({})", limit.name);
                }
                let _ = write!(out, "  remaining {}", status.limit_remaining);
            }
            None if status.limit_remaining == u32::MAX => out.push_str("  unlimited"),
            // Under `on_store_error: deny` the server refuses what it could
            // not count, with no limit to show.
            None if over && store_failed => out.push_str("  not counted: the counter store failed"),
            None if over => out.push_str("  refused without a limit named"),
            None if store_failed => out.push_str("  no limit reported"),
            None => out.push_str("  no limit applies"),
        }
        if let Some(reset) = &status.duration_until_reset {
            let secs = reset.seconds as f64 + f64::from(reset.nanos) / 1e9;
            let _ = write!(out, "  resets in {secs:.3}s");
        }
        out.push('\n');
    }
    if let Some(why) = refusal.as_ref().map(Refusal::line) {
        let _ = writeln!(out, "  {why}");
    }
    for header in &response.response_headers_to_add {
        let _ = writeln!(out, "  header {}: {}", header.key, header.value);
    }
    for header in &response.request_headers_to_add {
        let _ = writeln!(out, "  upstream header {}: {}", header.key, header.value);
    }
    out
}

/// The unit's name (`minute`), when the server named one.
fn named_unit(unit: i32) -> Option<String> {
    match Unit::try_from(unit) {
        Ok(Unit::Unknown) | Err(_) => None,
        Ok(unit) => Some(unit.as_str_name().to_lowercase()),
    }
}

/// A window as rules files write it: the largest unit that divides it
/// exactly (`5m`, `90s`, `1500ms`).
pub fn window_text(ms: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (604_800_000, "w"),
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    UNITS
        .iter()
        .find(|(len, _)| ms >= *len && ms.is_multiple_of(*len))
        .map_or_else(
            || format!("{ms}ms"),
            |(len, unit)| format!("{}{unit}", ms / len),
        )
}

/// Sluice's explanation of a refusal (`dynamic_metadata.refused`).
struct Refusal<'a>(&'a prost_types::Struct);

impl<'a> Refusal<'a> {
    fn of(response: &'a pb::RateLimitResponse) -> Option<Self> {
        let value = response.dynamic_metadata.as_ref()?.fields.get("refused")?;
        match value.kind.as_ref()? {
            Kind::StructValue(refused) => Some(Refusal(refused)),
            _ => None,
        }
    }

    fn field(&self, name: &str) -> String {
        match self.0.fields.get(name).and_then(|v| v.kind.as_ref()) {
            Some(Kind::StringValue(s)) => s.clone(),
            Some(Kind::NumberValue(n)) => format!("{n}"),
            _ => "?".to_owned(),
        }
    }

    fn is_store_error(&self) -> bool {
        self.field("reason") == "store_error"
    }

    /// The refusing descriptor's index.
    fn index(&self) -> Option<usize> {
        match self.0.fields.get("index").and_then(|v| v.kind.as_ref()) {
            Some(Kind::NumberValue(n)) if *n >= 0.0 => Some(*n as usize),
            _ => None,
        }
    }

    /// The refusing limit's window (`5m`), when given.
    fn window(&self) -> Option<String> {
        parse_duration(&self.field("window")).ok().map(window_text)
    }

    /// `, penalty block=…` when the refusing limit has a penalty box.
    fn penalty(&self) -> String {
        match self.0.fields.get("penalty").and_then(|v| v.kind.as_ref()) {
            Some(Kind::StringValue(penalty)) => format!(", penalty {penalty}"),
            _ => String::new(),
        }
    }

    /// The refusal as one line.
    fn line(&self) -> String {
        if self.is_store_error() {
            return format!(
                "refused: the counter store failed and the server denies (on_store_error: deny) ([{}] {})",
                self.field("index"),
                self.field("descriptor")
            );
        }
        format!(
            "refused by {} ({} per {}, {}{}) on [{}] {}; retry in {} s",
            self.field("limit"),
            self.field("requests_per_unit"),
            self.window().unwrap_or_else(|| self.field("window")),
            self.field("algorithm"),
            self.penalty(),
            self.field("index"),
            self.field("descriptor"),
            self.field("retry_after_seconds")
        )
    }
}

/// One limit as a rate-limit header describes it.
#[derive(Debug, PartialEq)]
struct Policy {
    name: Option<String>,
    requests: u64,
    window_s: u64,
}

/// The policies of the response's rate-limit headers: draft 03's
/// `x-ratelimit-limit: 10, 10;w=60;name="n"` or the IETF fields'
/// `ratelimit-policy: "n";q=10;w=60`.
fn policies(response: &pb::RateLimitResponse) -> Vec<Policy> {
    let mut out = Vec::new();
    for header in &response.response_headers_to_add {
        let key = header.key.to_ascii_lowercase();
        let items = split_outside_quotes(&header.value, ',');
        match key.as_str() {
            // The first item is the tightest limit's count alone.
            "x-ratelimit-limit" => {
                out.extend(items.iter().skip(1).filter_map(|item| {
                    let mut parts = split_outside_quotes(item, ';').into_iter();
                    let requests = parts.next()?.trim().parse().ok()?;
                    let params: Vec<String> = parts.collect();
                    Some(Policy {
                        name: param(&params, "name").map(|n| unquote(&n)),
                        requests,
                        window_s: param(&params, "w")?.parse().ok()?,
                    })
                }));
            }
            "ratelimit-policy" => {
                out.extend(items.iter().filter_map(|item| {
                    let mut parts = split_outside_quotes(item, ';').into_iter();
                    let name = unquote(parts.next()?.trim());
                    let params: Vec<String> = parts.collect();
                    Some(Policy {
                        name: Some(name),
                        requests: param(&params, "q")?.parse().ok()?,
                        window_s: param(&params, "w")?.parse().ok()?,
                    })
                }));
            }
            _ => {}
        }
    }
    out
}

/// The window of the headers' policies that describe `limit` (same count,
/// same name), when they all agree on one.
fn policy_window(
    limit: &pb::rate_limit_response::RateLimit,
    policies: &[Policy],
) -> Option<String> {
    let requests = u64::from(limit.requests_per_unit);
    let mut windows = policies
        .iter()
        .filter(|p| p.requests == requests)
        .filter(|p| {
            match (&p.name, limit.name.is_empty()) {
                (Some(name), false) => *name == limit.name,
                // An unnamed limit: draft 03 gives no name; the IETF fields
                // name it by its numbers.
                (None, true) => true,
                (Some(name), true) => *name == format!("{}-per-{}s", p.requests, p.window_s),
                (None, false) => false,
            }
        });
    let first = windows.next()?.window_s;
    windows
        .all(|p| p.window_s == first)
        .then(|| window_text(first.saturating_mul(1_000)))
}

/// `text` split at `separator`, except inside double quotes.
fn split_outside_quotes(text: &str, separator: char) -> Vec<String> {
    let (mut out, mut current) = (Vec::new(), String::new());
    let (mut quoted, mut escaped) = (false, false);
    for c in text.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                out.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current);
    out
}

/// The value of parameter `name` among `key=value` parameters.
fn param(params: &[String], name: &str) -> Option<String> {
    params.iter().find_map(|p| {
        let (key, value) = p.trim().split_once('=')?;
        (key == name).then(|| value.to_owned())
    })
}

/// A structured-field string without its quotes and escapes.
fn unquote(text: &str) -> String {
    let inner = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    let mut out = String::with_capacity(inner.len());
    let mut escaped = false;
    for c in inner.chars() {
        if c == '\\' && !escaped {
            escaped = true;
            continue;
        }
        escaped = false;
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::rate_limit_response::{DescriptorStatus, RateLimit};

    fn args(descriptors: &[&str]) -> QueryArgs {
        QueryArgs {
            addr: String::new(),
            domain: "d".into(),
            descriptors: descriptors.iter().map(|d| d.parse().unwrap()).collect(),
            hits: None,
            peek: false,
            timeout: 1_000,
            tls: Default::default(),
        }
    }

    fn limited(requests: u32, unit: Unit, name: &str, over: bool) -> DescriptorStatus {
        DescriptorStatus {
            code: if over { Code::OverLimit } else { Code::Ok } as i32,
            current_limit: Some(RateLimit {
                name: name.into(),
                requests_per_unit: requests,
                unit: unit as i32,
            }),
            limit_remaining: if over { 0 } else { 19 },
            ..Default::default()
        }
    }

    fn header(key: &str, value: &str) -> pb::HeaderValue {
        pb::HeaderValue {
            key: key.into(),
            value: value.into(),
            raw_value: Vec::new(),
        }
    }

    fn refused(fields: &[(&str, Kind)]) -> Option<prost_types::Struct> {
        let refused = prost_types::Struct {
            fields: fields
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        prost_types::Value {
                            kind: Some(v.clone()),
                        },
                    )
                })
                .collect(),
        };
        Some(prost_types::Struct {
            fields: [(
                "refused".to_string(),
                prost_types::Value {
                    kind: Some(Kind::StructValue(refused)),
                },
            )]
            .into(),
        })
    }

    #[test]
    fn windows_read_as_rules_write_them() {
        assert_eq!(window_text(300_000), "5m");
        assert_eq!(window_text(90_000), "90s");
        assert_eq!(window_text(7_200_000), "2h");
        assert_eq!(window_text(1_500), "1500ms");
        assert_eq!(window_text(1_209_600_000), "2w");
    }

    #[test]
    fn headers_for_the_client_and_for_the_upstream_are_told_apart() {
        let response = pb::RateLimitResponse {
            statuses: vec![limited(10, Unit::Minute, "per-minute", false)],
            response_headers_to_add: vec![header("x-ratelimit-soft-breach", "1")],
            request_headers_to_add: vec![header("x-ratelimit-remaining", "1")],
            ..Default::default()
        };
        let text = render(&args(&["a=1"]), &response);
        assert!(
            text.contains("\n  header x-ratelimit-soft-breach: 1\n"),
            "{text}"
        );
        assert!(
            text.contains("\n  upstream header x-ratelimit-remaining: 1\n"),
            "{text}"
        );
    }

    #[test]
    fn a_named_unit_is_printed_as_such() {
        let response = pb::RateLimitResponse {
            statuses: vec![limited(10, Unit::Minute, "per-minute", false)],
            ..Default::default()
        };
        let text = render(&args(&["a=1"]), &response);
        assert!(
            text.contains("limit 10 per minute (per-minute)  remaining 19"),
            "{text}"
        );
    }

    #[test]
    fn a_five_minute_window_is_read_from_the_headers_or_the_refusal() {
        // Draft 03 headers, as Sluice writes them for 20 per 5m.
        let response = pb::RateLimitResponse {
            statuses: vec![limited(20, Unit::Unknown, "", false)],
            response_headers_to_add: vec![header("x-ratelimit-limit", "20, 20;w=300")],
            ..Default::default()
        };
        let text = render(&args(&["a=1"]), &response);
        assert!(text.contains("limit 20 per 5m  remaining 19"), "{text}");
        // The IETF fields, named and unnamed.
        let response = pb::RateLimitResponse {
            statuses: vec![
                limited(20, Unit::Unknown, "a,\"b", false),
                limited(20, Unit::Unknown, "", false),
            ],
            response_headers_to_add: vec![header(
                "ratelimit-policy",
                "\"a,\\\"b\";q=20;w=300, \"20-per-90s\";q=20;w=90",
            )],
            ..Default::default()
        };
        let text = render(&args(&["a=1", "b=2"]), &response);
        assert!(text.contains("limit 20 per 5m (a,\"b)"), "{text}");
        assert!(text.contains("limit 20 per 90s  remaining"), "{text}");
        // A refusal names its window.
        let response = pb::RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![limited(20, Unit::Unknown, "per-5m", true)],
            dynamic_metadata: refused(&[
                ("reason", Kind::StringValue("over_limit".into())),
                ("index", Kind::NumberValue(0.0)),
                ("limit", Kind::StringValue("per-5m".into())),
                ("requests_per_unit", Kind::NumberValue(20.0)),
                ("window", Kind::StringValue("300s".into())),
                ("algorithm", Kind::StringValue("sliding_window".into())),
                ("descriptor", Kind::StringValue("a=1".into())),
                ("retry_after_seconds", Kind::NumberValue(12.0)),
            ]),
            ..Default::default()
        };
        let text = render(&args(&["a=1"]), &response);
        assert!(
            text.contains("OVER_LIMIT  limit 20 per 5m (per-5m)"),
            "{text}"
        );
        assert!(
            text.contains(
                "refused by per-5m (20 per 5m, sliding_window) on [0] a=1; retry in 12 s"
            ),
            "{text}"
        );
        // Nowhere: said so, not guessed.
        let response = pb::RateLimitResponse {
            statuses: vec![limited(20, Unit::Unknown, "", false)],
            ..Default::default()
        };
        let text = render(&args(&["a=1"]), &response);
        assert!(
            text.contains("limit 20 per window (a length the answer does not give)"),
            "{text}"
        );
    }

    #[test]
    fn a_refusal_names_its_limits_penalty_box_with_the_algorithm() {
        let response = pb::RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![limited(5, Unit::Minute, "login", true)],
            dynamic_metadata: refused(&[
                ("reason", Kind::StringValue("over_limit".into())),
                ("index", Kind::NumberValue(0.0)),
                ("limit", Kind::StringValue("login".into())),
                ("requests_per_unit", Kind::NumberValue(5.0)),
                ("window", Kind::StringValue("60s".into())),
                ("algorithm", Kind::StringValue("sliding_window".into())),
                (
                    "penalty",
                    Kind::StringValue("block=15m escalate=2 max_block=4h forget_after=1d".into()),
                ),
                ("descriptor", Kind::StringValue("user=ann".into())),
                ("retry_after_seconds", Kind::NumberValue(900.0)),
            ]),
            ..Default::default()
        };
        let text = render(&args(&["user=ann"]), &response);
        assert!(
            text.contains(
                "refused by login (5 per 1m, sliding_window, penalty block=15m escalate=2 max_block=4h forget_after=1d) on [0] user=ann; retry in 900 s"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_store_failure_under_deny_is_said_as_such() {
        let no_limit = |code: Code| DescriptorStatus {
            code: code as i32,
            ..Default::default()
        };
        let response = pb::RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![no_limit(Code::OverLimit), no_limit(Code::Ok)],
            dynamic_metadata: refused(&[
                ("reason", Kind::StringValue("store_error".into())),
                ("index", Kind::NumberValue(0.0)),
                ("descriptor", Kind::StringValue("a=1".into())),
            ]),
            ..Default::default()
        };
        let text = render(&args(&["a=1", "b=2"]), &response);
        assert!(!text.contains("no limit applies"), "{text}");
        assert!(
            text.contains("[0] a=1  OVER_LIMIT  not counted: the counter store failed\n"),
            "{text}"
        );
        assert!(text.contains("[1] b=2  OK  no limit reported\n"), "{text}");
        assert!(
            text.contains("refused: the counter store failed and the server denies"),
            "{text}"
        );
        // Another server's refusal without a limit is not a store failure.
        let response = pb::RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![no_limit(Code::OverLimit)],
            ..Default::default()
        };
        let text = render(&args(&["a=1"]), &response);
        assert!(
            text.contains("OVER_LIMIT  refused without a limit named"),
            "{text}"
        );
    }
}
