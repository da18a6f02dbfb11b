//! What a response says about a decision beyond its statuses, as JSON
//! (protobuf-free; `service.rs` converts it to a `Struct`, `/json` prints
//! it as it is):
//!
//! - `refused`, on every refusal: which descriptor, and which limit (name,
//!   window, algorithm, penalty box) refused the request, so that Envoy's access logs and
//!   Lua filters can show it (`%DYNAMIC_METADATA(envoy.filters.http.ratelimit:refused:limit)%`);
//! - with `response_dynamic_metadata`, what envoyproxy/ratelimit's
//!   `RESPONSE_DYNAMIC_METADATA` puts there: `domain`, `descriptors`,
//!   `hitsAddend` and the merged rule `metadata`;
//! - with `problem_json_body`, an RFC 9457 problem document for the 429.

use serde_json::{Map, Value, json};

use crate::decision::{Decision, Status};
use crate::request::{Descriptor, Request};
use crate::rules::penalty_text;

/// The media type of [`problem_body`].
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The first refusing descriptor's index and status.
fn refusing(decision: &Decision) -> Option<(usize, &Status)> {
    if decision.admitted {
        return None;
    }
    decision
        .statuses
        .iter()
        .enumerate()
        .find(|(_, status)| status.over_limit)
}

/// `k=v,k=v`: a descriptor's entries as one string.
fn entries(descriptor: &Descriptor) -> String {
    let mut out = String::new();
    for (i, entry) in descriptor.entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&entry.key);
        out.push('=');
        out.push_str(&entry.value);
    }
    out
}

/// A window as text: whole seconds (`60s`, `300s`) or milliseconds.
fn window_text(ms: u64) -> String {
    if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

/// Seconds until a refused client may retry: the reset rounded up, at least 1.
fn retry_after(status: &Status) -> u64 {
    status.reset_ms.unwrap_or(0).div_ceil(1_000).max(1)
}

/// Why the request was refused, or `None` when it was admitted.
pub fn refused(request: &Request, decision: &Decision) -> Option<Value> {
    let (index, status) = refusing(decision)?;
    let mut out = Map::new();
    out.insert("index".into(), json!(index));
    if let Some(descriptor) = request.descriptors.get(index) {
        out.insert("descriptor".into(), json!(entries(descriptor)));
    }
    match &status.limit {
        Some(limit) => {
            out.insert("reason".into(), json!("over_limit"));
            out.insert("limit".into(), json!(status.limit_label()));
            if let Some(rule) = &status.rule {
                out.insert("rule".into(), json!(rule.path));
            }
            out.insert("requests_per_unit".into(), json!(limit.requests));
            out.insert("window".into(), json!(window_text(limit.window_ms)));
            out.insert("algorithm".into(), json!(limit.algorithm));
            if let Some(penalty) = &limit.penalty {
                out.insert("penalty".into(), json!(penalty_text(penalty)));
            }
            out.insert("retry_after_seconds".into(), json!(retry_after(status)));
        }
        // Refused without a limit: the counter store failed and the
        // `on_store_error: deny` policy answered.
        None => {
            out.insert("reason".into(), json!("store_error"));
        }
    }
    Some(Value::Object(out))
}

/// The fields of the response's `dynamic_metadata`, or `None` when there
/// is nothing to say. `upstream` adds envoyproxy/ratelimit's fields.
pub fn dynamic_metadata(
    request: &Request,
    decision: &Decision,
    upstream: bool,
) -> Option<Map<String, Value>> {
    let mut out = Map::new();
    if upstream {
        out.insert("domain".into(), json!(request.domain));
        let descriptors = request
            .descriptors
            .iter()
            .map(|d| {
                let mut one = Map::new();
                let list: Vec<String> = d
                    .entries
                    .iter()
                    .map(|e| format!("{}={}", e.key, e.value))
                    .collect();
                one.insert("entries".into(), json!(list));
                if let Some(limit) = &d.limit {
                    one.insert(
                        "limit".into(),
                        json!({
                            "requestsPerUnit": limit.requests_per_unit,
                            "unit": limit.unit.proto_name(),
                        }),
                    );
                }
                if let Some(hits) = d.hits_addend {
                    one.insert("hitsAddend".into(), json!(hits));
                }
                Value::Object(one)
            })
            .collect();
        out.insert("descriptors".into(), Value::Array(descriptors));
        if request.hits_addend != 0 {
            out.insert("hitsAddend".into(), json!(request.hits_addend));
        }
        let mut metadata = Map::new();
        for status in &decision.statuses {
            if status.over_limit {
                continue;
            }
            if let Some(Value::Object(fields)) =
                status.rule.as_ref().and_then(|r| r.metadata.as_ref())
            {
                merge(&mut metadata, fields);
            }
        }
        if !metadata.is_empty() {
            out.insert("metadata".into(), Value::Object(metadata));
        }
    }
    if let Some(refused) = refused(request, decision) {
        out.insert("refused".into(), refused);
    }
    (!out.is_empty()).then_some(out)
}

/// Merges `from` into `into`: objects recursively, otherwise the value
/// already there wins (the first descriptor's, as upstream merges).
fn merge(into: &mut Map<String, Value>, from: &Map<String, Value>) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(Value::Object(mine)), Value::Object(theirs)) => merge(mine, theirs),
            (Some(_), _) => {}
            (None, _) => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

/// An RFC 9457 problem document for a refused request, or `None` when it
/// was admitted.
pub fn problem_body(request: &Request, decision: &Decision) -> Option<String> {
    let (index, status) = refusing(decision)?;
    let descriptor = request
        .descriptors
        .get(index)
        .map(entries)
        .unwrap_or_default();
    let mut body = Map::new();
    body.insert("type".into(), json!("about:blank"));
    body.insert("title".into(), json!("Too Many Requests"));
    body.insert("status".into(), json!(429));
    match &status.limit {
        Some(limit) => {
            let retry = retry_after(status);
            body.insert(
                "detail".into(),
                json!(format!(
                    "{descriptor} is over the limit {} ({} per {}, {}); retry in {retry} s",
                    status.limit_label(),
                    limit.requests,
                    window_text(limit.window_ms),
                    limit.algorithm
                )),
            );
            body.insert("limit".into(), json!(status.limit_label()));
            body.insert("requests_per_unit".into(), json!(limit.requests));
            body.insert("window".into(), json!(window_text(limit.window_ms)));
            body.insert("algorithm".into(), json!(limit.algorithm));
            body.insert("retry_after_seconds".into(), json!(retry));
        }
        None => {
            body.insert(
                "detail".into(),
                json!("the rate limiter could not count this request and refuses it"),
            );
        }
    }
    body.insert("descriptor".into(), json!(descriptor));
    Some(Value::Object(body).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_is_recursive_and_the_first_value_wins() {
        let mut into = json!({"a": {"x": 1}, "b": 1}).as_object().unwrap().clone();
        let from = json!({"a": {"y": 2, "x": 9}, "b": 2, "c": 3});
        merge(&mut into, from.as_object().unwrap());
        assert_eq!(
            Value::Object(into),
            json!({"a": {"x": 1, "y": 2}, "b": 1, "c": 3})
        );
    }

    #[test]
    fn a_refusal_names_the_limits_penalty_box() {
        use crate::decision::Reported;
        use crate::limiter::{Penalty, Unit};
        let request = Request {
            domain: "auth".into(),
            descriptors: vec![Descriptor {
                entries: vec![crate::request::Entry::new("login", "ann")],
                ..Descriptor::default()
            }],
            hits_addend: 0,
        };
        let refused_by = |penalty| Decision {
            admitted: false,
            statuses: vec![Status {
                over_limit: true,
                limit: Some(Reported {
                    requests: 5,
                    unit: Unit::Minute,
                    window_ms: 60_000,
                    name: Some("login".into()),
                    algorithm: "sliding_window",
                    penalty,
                }),
                reset_ms: Some(900_000),
                ..Status::NO_LIMIT
            }],
        };
        let penalty = Penalty {
            block_ms: 900_000,
            escalate: 2,
            max_block_ms: 4 * 3_600_000,
            forget_after_ms: 86_400_000,
        };
        let why = refused(&request, &refused_by(Some(penalty))).unwrap();
        assert_eq!(
            why["penalty"],
            "block=15m escalate=2 max_block=4h forget_after=1d"
        );
        assert_eq!(why["retry_after_seconds"], 900);
        let why = refused(&request, &refused_by(None)).unwrap();
        assert!(why.get("penalty").is_none(), "{why}");
    }

    #[test]
    fn windows_read_as_seconds_or_milliseconds() {
        assert_eq!(window_text(60_000), "60s");
        assert_eq!(window_text(1_500), "1500ms");
    }
}
