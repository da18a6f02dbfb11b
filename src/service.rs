//! The gRPC face of the limiter and the only module that converts between
//! protobuf and the crate's own types: `pb::RateLimitRequest` → [`Request`],
//! [`Decision`] → `pb::RateLimitResponse`, [`DecideError`] → `tonic::Status`.

use std::sync::Arc;
use std::time::Instant;

use tonic::{Request as GrpcRequest, Response, Status as GrpcStatus};
use tracing::Instrument as _;

use crate::decision::{DecideError, Decision, Limiter, outcome_code};
use crate::headers::{self, HeaderMode};
use crate::limiter::Unit;
use crate::proto as pb;
use crate::proto::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as PbUnit,
};
use crate::request::{Descriptor, Entry, Override, Request};
use crate::store::CounterStore;
use crate::telemetry::traces;
use crate::telemetry::upstream::CallError;

pub mod explain;
pub mod json;

/// `envoy.service.ratelimit.v3.RateLimitService` over a [`Limiter`].
pub struct RateLimitService<S> {
    limiter: Arc<Limiter<S>>,
    options: ResponseOptions,
}

/// What a response carries besides the decision itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseOptions {
    /// Rate-limit headers added to responses.
    pub headers: HeaderMode,
    /// `dynamic_metadata` as envoyproxy/ratelimit's
    /// `RESPONSE_DYNAMIC_METADATA` fills it: the domain, the descriptors,
    /// the request's `hitsAddend`, and the merged `metadata` of the rules of
    /// the descriptors that were not over limit. (Why a request was refused
    /// is always there, under `refused`.)
    pub dynamic_metadata: bool,
    /// On a refusal, a `raw_body` in `application/problem+json` (RFC 9457)
    /// saying which limit refused and when to retry; Envoy sends it as the
    /// 429's body.
    pub problem_body: bool,
    /// Tell the upstream of an admitted request its headroom, in
    /// `request_headers_to_add` (see [`headers::headroom`]).
    pub upstream_headroom: bool,
}

impl<S> RateLimitService<S> {
    /// A service answering from `limiter`, adding `headers` to responses.
    pub fn new(limiter: Arc<Limiter<S>>, headers: HeaderMode) -> Self {
        Self::with_options(
            limiter,
            ResponseOptions {
                headers,
                ..ResponseOptions::default()
            },
        )
    }

    /// A service answering from `limiter`, its responses shaped by `options`.
    pub fn with_options(limiter: Arc<Limiter<S>>, options: ResponseOptions) -> Self {
        Self { limiter, options }
    }
}

#[tonic::async_trait]
impl<S: CounterStore> pb::RateLimitService for RateLimitService<S> {
    async fn should_rate_limit(
        &self,
        request: GrpcRequest<pb::RateLimitRequest>,
    ) -> Result<Response<pb::RateLimitResponse>, GrpcStatus> {
        let started = Instant::now();
        let span = traces::request_span(
            &request.get_ref().domain,
            request.get_ref().descriptors.len(),
            request.metadata(),
        );
        let (request, result) = match from_pb(request.into_inner()) {
            Ok(request) => {
                let result = self.limiter.decide(&request).instrument(span.clone()).await;
                (Some(request), result)
            }
            Err(e) => (None, Err(e)),
        };
        let code = outcome_code(&result);
        self.limiter
            .metrics()
            .record_request(code, started.elapsed());
        if let Some(upstream) = self.limiter.upstream_stats() {
            upstream.request(started.elapsed());
            if let Err(e) = &result {
                upstream.call_error(match e {
                    DecideError::Store(_) => CallError::Store,
                    DecideError::InvalidArgument(_) => CallError::Service,
                });
            }
        }
        match result {
            Ok(decision) => {
                span.record("outcome", code);
                let response = to_pb_with(request.as_ref(), &decision, self.options);
                Ok(Response::new(response))
            }
            Err(e) => {
                let status = to_grpc_status(e);
                traces::record_error(&span, status.code());
                Err(status)
            }
        }
    }
}

/// Maps a decision error to the gRPC status Envoy acts on.
pub fn to_grpc_status(error: DecideError) -> GrpcStatus {
    match error {
        DecideError::InvalidArgument(message) => GrpcStatus::invalid_argument(message),
        // UNAVAILABLE, not UNKNOWN: Envoy's `failure_mode_deny` then decides
        // whether traffic flows while the store is down.
        DecideError::Store(e) => GrpcStatus::unavailable(e.to_string()),
    }
}

/// Converts the wire request, moving its strings.
pub fn from_pb(request: pb::RateLimitRequest) -> Result<Request, DecideError> {
    let descriptors = request
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let limit = match d.limit {
                None => None,
                Some(l) => Some(Override {
                    requests_per_unit: l.requests_per_unit,
                    unit: override_unit(l.unit, i)?,
                }),
            };
            Ok::<_, DecideError>(Descriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                limit,
                hits_addend: d.hits_addend,
                is_negative_hits: d.is_negative_hits,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Request {
        domain: request.domain,
        descriptors,
        hits_addend: request.hits_addend,
    })
}

fn override_unit(unit: i32, descriptor: usize) -> Result<Unit, DecideError> {
    pb::RateLimitUnit::try_from(unit)
        .ok()
        .and_then(|u| Unit::from_proto_name(u.as_str_name()))
        .ok_or_else(|| {
            DecideError::InvalidArgument(format!(
                "descriptor {descriptor}: limit override has unknown unit {unit}"
            ))
        })
}

fn unit_to_pb(unit: Unit) -> PbUnit {
    PbUnit::from_str_name(unit.proto_name()).unwrap_or(PbUnit::Unknown)
}

/// Builds the wire response for `decision`, with the headers of `mode`.
pub fn to_pb(decision: &Decision, mode: HeaderMode) -> pb::RateLimitResponse {
    let options = ResponseOptions {
        headers: mode,
        ..ResponseOptions::default()
    };
    to_pb_with(None, decision, options)
}

/// Builds the wire response for `decision` on `request`, shaped by
/// `options`: with the request, a refusal is explained in
/// `dynamic_metadata` (and in `raw_body` when asked).
pub fn to_pb_with(
    request: Option<&Request>,
    decision: &Decision,
    options: ResponseOptions,
) -> pb::RateLimitResponse {
    let code = |over: bool| if over { Code::OverLimit } else { Code::Ok } as i32;
    let statuses = decision
        .statuses
        .iter()
        .map(|s| DescriptorStatus {
            code: code(s.over_limit),
            current_limit: s.limit.as_ref().map(|l| RateLimit {
                name: l.name.as_deref().unwrap_or_default().to_owned(),
                requests_per_unit: u32::try_from(l.requests).unwrap_or(u32::MAX),
                unit: unit_to_pb(l.unit) as i32,
            }),
            limit_remaining: u32::try_from(s.remaining).unwrap_or(u32::MAX),
            duration_until_reset: s.reset_ms.map(|ms| prost_types::Duration {
                seconds: (ms / 1_000) as i64,
                nanos: ((ms % 1_000) * 1_000_000) as i32,
            }),
            quota: None,
        })
        .collect();
    let header = |(key, value): (&str, String)| pb::HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    };
    let mut response_headers_to_add: Vec<pb::HeaderValue> =
        headers::headers(options.headers, decision)
            .into_iter()
            .chain(headers::soft_breach(decision))
            .map(header)
            .collect();
    let request_headers_to_add = if options.upstream_headroom {
        headers::headroom(decision)
            .into_iter()
            .map(header)
            .collect()
    } else {
        Vec::new()
    };
    let mut raw_body = Vec::new();
    let mut dynamic_metadata = None;
    if let Some(request) = request {
        if options.problem_body
            && let Some(body) = explain::problem_body(request, decision)
        {
            // Envoy lets the service's content-type replace the text/plain
            // of its local reply.
            response_headers_to_add.push(pb::HeaderValue {
                key: "content-type".to_owned(),
                value: explain::PROBLEM_JSON.to_owned(),
                raw_value: Vec::new(),
            });
            raw_body = body.into_bytes();
        }
        dynamic_metadata =
            explain::dynamic_metadata(request, decision, options.dynamic_metadata).map(to_struct);
    }
    pb::RateLimitResponse {
        overall_code: code(!decision.admitted),
        statuses,
        response_headers_to_add,
        request_headers_to_add,
        raw_body,
        dynamic_metadata,
        ..Default::default()
    }
}

/// A JSON object as a protobuf `Struct`.
fn to_struct(fields: serde_json::Map<String, serde_json::Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: fields
            .into_iter()
            .map(|(key, value)| (key, to_value(value)))
            .collect(),
    }
}

fn to_value(value: serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    use serde_json::Value;
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.into_iter().map(to_value).collect(),
        }),
        Value::Object(fields) => Kind::StructValue(to_struct(fields)),
    };
    prost_types::Value { kind: Some(kind) }
}
