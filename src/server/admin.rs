//! The admin HTTP server: liveness, readiness, Prometheus metrics, the
//! effective rules, and the rate-limit API as JSON.
//!
//! `POST /json` takes a `RateLimitRequest` in protobuf's JSON mapping
//! (lowerCamelCase, snake_case also accepted) and answers the response the
//! same way: 200 when OK, 429 when over limit (as envoyproxy/ratelimit), 400
//! for a bad request, 503 when the counter store is unavailable. With
//! `?peek=true` every descriptor weighs 0: the counters are read, not
//! charged.
//!
//! `GET /counters?domain=D&descriptor=k=v,k=v` shows one descriptor's
//! counters (a weight-0 decision) and `DELETE` the same resets them. Off
//! unless `admin_counters` is set: anyone who reaches the admin port could
//! otherwise refill any client's budget.
//!
//! `/overrides/{domain}` (run-time limits per descriptor, writes behind the
//! `admin_token`) is merged in from `server::overrides`.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::collections::HashMap;
use tokio_util::sync::CancellationToken;

use crate::decision::{DecideError, Limiter, outcome_code};
use crate::headers::HeaderMode;
use crate::request::{Descriptor, DescriptorArg, Entry, Request};
use crate::rules::RuleSet;
use crate::service::ResponseOptions;
use crate::service::json::{JsonRequest, JsonResponse};
use crate::store::CounterStore;

/// What the admin handlers share.
struct Admin<S> {
    limiter: Arc<Limiter<S>>,
    options: AdminOptions,
    /// Cancelled at shutdown: readiness turns false first.
    shutdown: CancellationToken,
}

/// How the admin server behaves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdminOptions {
    /// What `/json` responses carry besides the decision (as gRPC's).
    pub response: ResponseOptions,
    /// Serve `GET`/`DELETE /counters` (setting `admin_counters`).
    pub counters: bool,
    /// `/healthcheck` answers 200 only once rules are loaded (setting
    /// `healthy_with_config_loaded`).
    pub healthy_with_config_loaded: bool,
    /// The file of the bearer token `/overrides` writes need (setting
    /// `admin_token`); writes are refused without one.
    pub admin_token: Option<std::path::PathBuf>,
    /// Most overrides per domain (setting `overrides_max_per_domain`).
    pub overrides_max_per_domain: usize,
}

/// The admin routes over `limiter`.
pub fn router<S: CounterStore>(
    limiter: Arc<Limiter<S>>,
    headers: HeaderMode,
    shutdown: CancellationToken,
) -> Router {
    let options = AdminOptions {
        response: ResponseOptions {
            headers,
            ..ResponseOptions::default()
        },
        ..AdminOptions::default()
    };
    router_with(limiter, options, shutdown)
}

/// The admin routes over `limiter`, shaped by `options`.
pub fn router_with<S: CounterStore>(
    limiter: Arc<Limiter<S>>,
    options: AdminOptions,
    shutdown: CancellationToken,
) -> Router {
    let token = super::overrides::AdminToken::start(options.admin_token.clone(), shutdown.clone());
    let overrides = super::overrides::router(
        limiter.clone(),
        token,
        options.overrides_max_per_domain.max(1),
    );
    let state = Arc::new(Admin {
        limiter,
        options,
        shutdown,
    });
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz::<S>))
        .route("/healthcheck", get(healthcheck::<S>))
        .route("/metrics", get(metrics::<S>))
        .route("/rlconfig", get(rlconfig::<S>))
        .route("/json", post(json::<S>))
        .route(
            "/counters",
            get(counters_get::<S>).delete(counters_delete::<S>),
        )
        .with_state(state)
        .merge(overrides)
}

async fn readyz<S: CounterStore>(State(admin): State<Arc<Admin<S>>>) -> Response {
    match super::health::readiness(&admin.limiter, &admin.shutdown) {
        Ok(()) => "ready\n".into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

/// envoyproxy/ratelimit's health check: 200 while the process is up, the
/// store was reached and no SIGTERM has arrived, even before any rules are
/// loaded unless `healthy_with_config_loaded`; 500 otherwise.
async fn healthcheck<S: CounterStore>(State(admin): State<Arc<Admin<S>>>) -> Response {
    let healthy = super::health::readiness(&admin.limiter, &admin.shutdown).and_then(|()| {
        if admin.options.healthy_with_config_loaded && admin.limiter.rules().domains().count() == 0
        {
            Err("no rules loaded")
        } else {
            Ok(())
        }
    });
    match healthy {
        Ok(()) => "OK".into_response(),
        Err(why) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unhealthy: {why}\n"),
        )
            .into_response(),
    }
}

/// The debug listener's routes (envoyproxy/ratelimit's debug port):
/// `/rlconfig`, as on the admin port.
pub fn debug_router<S: CounterStore>(
    limiter: Arc<Limiter<S>>,
    shutdown: CancellationToken,
) -> Router {
    let state = Arc::new(Admin {
        limiter,
        options: AdminOptions::default(),
        shutdown,
    });
    Router::new()
        .route("/rlconfig", get(rlconfig::<S>))
        .with_state(state)
}

async fn metrics<S: CounterStore>(State(admin): State<Arc<Admin<S>>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        admin.limiter.metrics().encode(),
    )
        .into_response()
}

/// The rules, then the run-time overrides in force.
async fn rlconfig<S: CounterStore>(State(admin): State<Arc<Admin<S>>>) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    describe_rules(&admin.limiter.rules())
        + &super::overrides::describe(&admin.limiter.overrides(), now)
}

/// The rules as `/rlconfig` shows them: [`RuleSet`]'s `Display`.
pub fn describe_rules(rules: &RuleSet) -> String {
    rules.to_string()
}

/// Whether a query asks for a peek: `peek`, `peek=true` or `peek=1`.
fn peek_asked(query: &HashMap<String, String>) -> Result<bool, String> {
    match query.get("peek").map(String::as_str) {
        None | Some("false" | "0") => Ok(false),
        Some("" | "true" | "1") => Ok(true),
        Some(other) => Err(format!("peek must be true or false, not '{other}'")),
    }
}

fn bad_request(e: impl std::fmt::Display) -> Response {
    (StatusCode::BAD_REQUEST, format!("bad request: {e}\n")).into_response()
}

async fn json<S: CounterStore>(
    State(admin): State<Arc<Admin<S>>>,
    Query(query): Query<HashMap<String, String>>,
    body: String,
) -> Response {
    let peek = match peek_asked(&query) {
        Ok(peek) => peek,
        Err(e) => return bad_request(e),
    };
    let request: JsonRequest = match serde_json::from_str(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(e),
    };
    let mut request = match request.into_request() {
        Ok(request) => request,
        Err(e) => return bad_request(e),
    };
    if peek {
        // Per descriptor: a request-level 0 would mean 1.
        for descriptor in &mut request.descriptors {
            descriptor.hits_addend = Some(0);
        }
    }
    let started = Instant::now();
    let result = admin.limiter.decide(&request).await;
    admin
        .limiter
        .metrics()
        .record_request(outcome_code(&result), started.elapsed());
    match result {
        Ok(decision) => {
            let response = JsonResponse::from_decision(&request, &decision, admin.options.response);
            let status = if response.is_ok() {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            (status, axum::Json(response)).into_response()
        }
        Err(e) => decide_error(e),
    }
}

/// A failed decision as HTTP: 400 for a bad request, 503 when the store is
/// unavailable.
fn decide_error(error: DecideError) -> Response {
    match error {
        DecideError::InvalidArgument(e) => bad_request(e),
        e @ DecideError::Store(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response()
        }
    }
}

/// The query of `/counters`: one domain and one descriptor.
fn counter_request(query: &HashMap<String, String>) -> Result<Request, String> {
    let domain = query
        .get("domain")
        .filter(|d| !d.is_empty())
        .ok_or("give domain=…")?;
    let descriptor: DescriptorArg = query
        .get("descriptor")
        .ok_or("give descriptor=key=value[,key=value…]")?
        .parse()?;
    Ok(Request {
        domain: domain.clone(),
        descriptors: vec![Descriptor {
            entries: descriptor
                .0
                .into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect(),
            // A peek: the counters are read, not charged.
            hits_addend: Some(0),
            ..Descriptor::default()
        }],
        hits_addend: 0,
    })
}

const COUNTERS_OFF: &str = "the /counters endpoint is off; set admin_counters to serve it (and keep the admin port private)\n";

/// What both `/counters` methods check first: that the endpoint is on
/// (404 otherwise) and that the query names one descriptor (400 otherwise).
fn counters_preamble<S>(
    admin: &Admin<S>,
    query: &HashMap<String, String>,
) -> Result<Request, (StatusCode, String)> {
    if !admin.options.counters {
        return Err((StatusCode::NOT_FOUND, COUNTERS_OFF.to_owned()));
    }
    counter_request(query).map_err(|e| (StatusCode::BAD_REQUEST, format!("bad request: {e}\n")))
}

/// `GET /counters`: the descriptor's rule and its status from a weight-0
/// decision (nothing is counted).
async fn counters_get<S: CounterStore>(
    State(admin): State<Arc<Admin<S>>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let request = match counters_preamble(&admin, &query) {
        Ok(request) => request,
        Err(refusal) => return refusal.into_response(),
    };
    let decision = match admin.limiter.decide(&request).await {
        Ok(decision) => decision,
        Err(e) => return decide_error(e),
    };
    let status = JsonResponse::from_decision(&request, &decision, ResponseOptions::default())
        .into_first_status();
    let rule = decision
        .statuses
        .first()
        .and_then(|s| s.rule.as_ref())
        .map(|r| r.path.clone());
    axum::Json(serde_json::json!({
        "domain": request.domain,
        "descriptor": query.get("descriptor"),
        "rule": rule,
        "full": !decision.admitted,
        "status": status,
    }))
    .into_response()
}

/// `DELETE /counters`: forgets every counter of the descriptor's rule, so
/// its next request starts from an empty budget.
async fn counters_delete<S: CounterStore>(
    State(admin): State<Arc<Admin<S>>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let request = match counters_preamble(&admin, &query) {
        Ok(request) => request,
        Err(refusal) => return refusal.into_response(),
    };
    let rules = admin.limiter.rules();
    let found = rules
        .domain(&request.domain)
        .and_then(|domain| domain.find(&request.descriptors[0].entries));
    let Some(found) = found.filter(|f| !f.rule.limits.is_empty()) else {
        return (
            StatusCode::NOT_FOUND,
            "no rule limits this descriptor; it has no counters\n",
        )
            .into_response();
    };
    let windows: Vec<_> = found.rule.limits.iter().map(|l| l.spec.window).collect();
    match admin.limiter.store().reset(&found.identity, &windows).await {
        Ok(()) => {
            admin.limiter.forget_cached(&found.identity);
            tracing::info!(domain = %request.domain, rule = %found.rule.path, "counters reset by the admin endpoint");
            axum::Json(serde_json::json!({
                "domain": request.domain,
                "descriptor": query.get("descriptor"),
                "rule": found.rule.path,
                "reset": true,
            }))
            .into_response()
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}
