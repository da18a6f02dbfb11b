//! protobuf's JSON mapping of `RateLimitRequest` and `RateLimitResponse`,
//! for the admin `/json` endpoint: the JSON is read into the same
//! `pb::RateLimitRequest` gRPC receives and converted by [`from_pb`], and the
//! response is written from the same `pb::RateLimitResponse` [`to_pb_with`]
//! builds, so both edges answer alike.
//!
//! Two fields are taken from [`explain`] instead of the protobuf message:
//! `dynamic_metadata`, because a protobuf `Struct` holds every number as a
//! double and would rewrite `5` as `5.0`, and the problem document, which
//! protobuf's JSON would give as base64 bytes; it is given as JSON, in a
//! `problem` field of its own.

use serde::{Deserialize, Serialize};

use super::{ResponseOptions, explain, from_pb, to_pb_with};
use crate::decision::{DecideError, Decision};
use crate::limiter::Unit;
use crate::proto as pb;
use crate::proto::rate_limit_descriptor::{Entry as PbEntry, RateLimitOverride};
use crate::proto::rate_limit_response::{Code, DescriptorStatus, rate_limit::Unit as PbUnit};
use crate::request::Request;

/// `RateLimitRequest` in protobuf's JSON mapping (lowerCamelCase names,
/// snake_case accepted too).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend")]
    #[serde(rename = "hitsAddend")]
    hits_addend: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, rename = "hitsAddend", alias = "hits_addend")]
    hits_addend: Option<JsonU64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(rename = "requestsPerUnit", alias = "requests_per_unit")]
    requests_per_unit: u32,
    unit: String,
}

/// protobuf's JSON writes 64-bit integers as strings; accept both.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonU64 {
    Number(u64),
    Text(String),
}

impl JsonRequest {
    /// The request as gRPC would have received it, converted as gRPC
    /// converts it.
    pub fn into_request(self) -> Result<Request, String> {
        from_pb(self.into_pb()?).map_err(|e| match e {
            DecideError::InvalidArgument(message) => message,
            other => other.to_string(),
        })
    }

    fn into_pb(self) -> Result<pb::RateLimitRequest, String> {
        let descriptors = self
            .descriptors
            .into_iter()
            .map(JsonDescriptor::into_pb)
            .collect::<Result<_, String>>()?;
        Ok(pb::RateLimitRequest {
            domain: self.domain,
            descriptors,
            hits_addend: self.hits_addend,
        })
    }
}

impl JsonDescriptor {
    fn into_pb(self) -> Result<pb::RateLimitDescriptor, String> {
        let limit = match self.limit {
            None => None,
            Some(l) => {
                // Unit names are matched without regard to case; the
                // override's enum has no WEEK, as over gRPC.
                let unit = Unit::from_proto_name(&l.unit)
                    .and_then(|u| pb::RateLimitUnit::from_str_name(u.proto_name()))
                    .ok_or_else(|| format!("invalid limit unit '{}'", l.unit))?;
                Some(RateLimitOverride {
                    requests_per_unit: l.requests_per_unit,
                    unit: unit as i32,
                })
            }
        };
        let hits_addend = match self.hits_addend {
            None => None,
            Some(JsonU64::Number(n)) => Some(n),
            Some(JsonU64::Text(t)) => {
                Some(t.parse().map_err(|_| format!("invalid hitsAddend '{t}'"))?)
            }
        };
        Ok(pb::RateLimitDescriptor {
            entries: self
                .entries
                .into_iter()
                .map(|e| PbEntry {
                    key: e.key,
                    value: e.value,
                })
                .collect(),
            limit,
            hits_addend,
            is_negative_hits: false,
        })
    }
}

/// `RateLimitResponse` in protobuf's JSON mapping.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonResponse {
    overall_code: &'static str,
    statuses: Vec<JsonStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    request_headers_to_add: Vec<JsonHeader>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dynamic_metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// protobuf's JSON writes bytes in base64; the problem document is
    /// text, so it is given as it is, in a field of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<serde_json::Value>,
}

/// One `DescriptorStatus` in protobuf's JSON mapping.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonStatus {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<JsonLimit>,
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonLimit {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    requests_per_unit: u32,
    unit: &'static str,
}

#[derive(Serialize)]
struct JsonHeader {
    key: String,
    value: String,
}

impl JsonResponse {
    /// The response to `request`, as gRPC would build it for `decision`.
    pub fn from_decision(request: &Request, decision: &Decision, options: ResponseOptions) -> Self {
        let response = to_pb_with(None, decision, options);
        let problem = options
            .problem_body
            .then(|| explain::problem_body(request, decision))
            .flatten()
            .and_then(|body| serde_json::from_str(&body).ok());
        Self {
            overall_code: code_name(response.overall_code),
            statuses: response
                .statuses
                .into_iter()
                .map(JsonStatus::from)
                .collect(),
            response_headers_to_add: json_headers(response.response_headers_to_add),
            request_headers_to_add: json_headers(response.request_headers_to_add),
            dynamic_metadata: explain::dynamic_metadata(
                request,
                decision,
                options.dynamic_metadata,
            ),
            problem,
        }
    }

    /// The first descriptor's status.
    pub fn into_first_status(self) -> Option<JsonStatus> {
        self.statuses.into_iter().next()
    }

    /// Whether the request was admitted (`OK`).
    pub fn is_ok(&self) -> bool {
        self.overall_code == Code::Ok.as_str_name()
    }
}

impl From<DescriptorStatus> for JsonStatus {
    fn from(status: DescriptorStatus) -> Self {
        Self {
            code: code_name(status.code),
            current_limit: status.current_limit.map(|l| JsonLimit {
                name: l.name,
                requests_per_unit: l.requests_per_unit,
                unit: PbUnit::try_from(l.unit)
                    .unwrap_or(PbUnit::Unknown)
                    .as_str_name(),
            }),
            limit_remaining: status.limit_remaining,
            duration_until_reset: status
                .duration_until_reset
                .map(|d| format!("{}.{:03}s", d.seconds, d.nanos / 1_000_000)),
        }
    }
}

fn json_headers(headers: Vec<pb::HeaderValue>) -> Vec<JsonHeader> {
    headers
        .into_iter()
        .map(|h| JsonHeader {
            key: h.key,
            value: h.value,
        })
        .collect()
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).unwrap_or(Code::Unknown).as_str_name()
}
