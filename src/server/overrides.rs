//! The admin `/overrides/{domain}` API: limits set at run time for one
//! exact descriptor, kept in the counter store (see `store::overrides`).
//!
//! `GET` lists the domain's overrides in force; `PUT` sets one (body
//! `{"descriptor": [{"key": …, "value": …}], "requests_per_unit": N,
//! "unit": "minute", "expires_at": RFC 3339}`, the last optional);
//! `DELETE` removes one (body `{"descriptor": […]}`). Writes need
//! `Authorization: Bearer <token>` equal to the contents of the
//! `admin_token` file (re-read when it changes, as the TLS files are);
//! with no file set they answer 403. Every write is logged at info as an
//! audit line: the caller (its address and a fingerprint of its token,
//! never the token), the descriptor, the limit before and after.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::Extensions;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::decision::Limiter;
use crate::limiter::Unit;
use crate::request::Entry;
use crate::store::{CounterStore, Override, OverrideEntry, OverrideError, OverrideSet};

/// How often the token file is looked at for a change.
const TOKEN_RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// The bearer token writes need, as last read from its file.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// No `admin_token` set: writes are off.
    Off,
    /// The file could not be read, or is empty: writes are refused.
    Unusable(String),
    /// The token.
    Set(String),
}

impl Token {
    fn read(path: Option<&PathBuf>) -> Token {
        let Some(path) = path else {
            return Token::Off;
        };
        match std::fs::read_to_string(path) {
            Ok(text) if text.trim().is_empty() => {
                Token::Unusable(format!("admin_token file {} is empty", path.display()))
            }
            Ok(text) => Token::Set(text.trim().to_owned()),
            Err(e) => Token::Unusable(format!("admin_token file {}: {e}", path.display())),
        }
    }
}

/// The token in force, re-read from its file until shutdown.
pub struct AdminToken {
    current: ArcSwap<Token>,
}

impl AdminToken {
    /// Reads `path` now and every [`TOKEN_RELOAD_INTERVAL`] until `closing`
    /// (a rotated Kubernetes Secret takes effect without a restart).
    pub fn start(path: Option<PathBuf>, closing: CancellationToken) -> Arc<Self> {
        let first = Token::read(path.as_ref());
        if let Token::Unusable(why) = &first {
            tracing::error!("{why}; /overrides writes are refused until it is fixed");
        }
        let token = Arc::new(Self {
            current: ArcSwap::from_pointee(first),
        });
        if path.is_some() {
            tokio::spawn(watch(token.clone(), path, closing));
        }
        token
    }

    /// Whether `headers` carry the token; the refusal otherwise.
    fn check(&self, headers: &HeaderMap) -> Result<String, Refusal> {
        let expected = match &**self.current.load() {
            Token::Set(token) => token.clone(),
            Token::Off => return Err(refuse(StatusCode::FORBIDDEN, WRITES_OFF)),
            Token::Unusable(why) => {
                return Err(refuse(
                    StatusCode::FORBIDDEN,
                    &format!("/overrides writes are refused: {why}\n"),
                ));
            }
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        match given {
            Some(given) if same(given.as_bytes(), expected.as_bytes()) => Ok(fingerprint(given)),
            Some(_) => Err(unauthorized("the bearer token is not the admin_token")),
            None => Err(unauthorized("give Authorization: Bearer <admin_token>")),
        }
    }
}

async fn watch(token: Arc<AdminToken>, path: Option<PathBuf>, closing: CancellationToken) {
    loop {
        tokio::select! {
            () = closing.cancelled() => return,
            () = tokio::time::sleep(TOKEN_RELOAD_INTERVAL) => {}
        }
        let reading = path.clone();
        let Ok(read) = tokio::task::spawn_blocking(move || Token::read(reading.as_ref())).await
        else {
            continue;
        };
        if **token.current.load() != read {
            match &read {
                Token::Unusable(why) => tracing::error!("{why}; /overrides writes are refused"),
                _ => tracing::info!("admin_token reloaded"),
            }
            token.current.store(Arc::new(read));
        }
    }
}

const WRITES_OFF: &str = "/overrides writes are off: set admin_token (SLUICE_ADMIN_TOKEN, --admin-token) to a file holding a bearer token, and send Authorization: Bearer <token>\n";

/// Equal bytes, compared in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What the audit line says of a token: the first 8 bytes of its SHA-256,
/// in hex (enough to tell tokens apart, nothing to log in with).
fn fingerprint(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// A request refused: its status and the message that says why.
struct Refusal {
    status: StatusCode,
    message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        if self.status == StatusCode::UNAUTHORIZED {
            let challenge = [(header::WWW_AUTHENTICATE, "Bearer")];
            return (self.status, challenge, self.message).into_response();
        }
        (self.status, self.message).into_response()
    }
}

fn refuse(status: StatusCode, message: &str) -> Refusal {
    Refusal {
        status,
        message: message.to_owned(),
    }
}

fn unauthorized(why: &str) -> Refusal {
    refuse(StatusCode::UNAUTHORIZED, &format!("unauthorized: {why}\n"))
}

/// What the handlers share.
struct Api<S> {
    limiter: Arc<Limiter<S>>,
    token: Arc<AdminToken>,
    max_per_domain: usize,
}

/// The `/overrides/{domain}` routes over `limiter`.
pub fn router<S: CounterStore>(
    limiter: Arc<Limiter<S>>,
    token: Arc<AdminToken>,
    max_per_domain: usize,
) -> Router {
    let api = Arc::new(Api {
        limiter,
        token,
        max_per_domain,
    });
    Router::new()
        .route(
            "/overrides/{domain}",
            get(list::<S>).put(put::<S>).delete(delete::<S>),
        )
        .with_state(api)
}

/// `PUT`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutBody {
    descriptor: Vec<OverrideEntry>,
    requests_per_unit: u64,
    unit: String,
    #[serde(default)]
    expires_at: Option<String>,
}

/// `DELETE`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteBody {
    descriptor: Vec<OverrideEntry>,
}

fn bad_request(why: impl std::fmt::Display) -> Refusal {
    refuse(StatusCode::BAD_REQUEST, &format!("bad request: {why}\n"))
}

/// The caller as the audit line names it.
fn caller(extensions: &Extensions, fingerprint: &str) -> String {
    let peer = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_owned(), |p| p.0.to_string());
    format!("{peer} token:{fingerprint}")
}

/// The wall clock in Unix milliseconds (when an override was set, and
/// whether it has expired).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The request entries of an override's descriptor.
fn entries(descriptor: &[OverrideEntry]) -> Vec<Entry> {
    descriptor
        .iter()
        .map(|e| Entry {
            key: e.key.clone(),
            value: e.value.clone(),
        })
        .collect()
}

/// The descriptor as `k=v,k=v`, for log lines.
fn described(descriptor: &[OverrideEntry]) -> String {
    descriptor
        .iter()
        .map(|e| format!("{}={}", e.key, e.value))
        .collect::<Vec<_>>()
        .join(",")
}

/// Checks that `domain` is loaded and that a rule matches `descriptor`;
/// the rule's limits as text (what an override replaces).
fn rule_limit<S: CounterStore>(
    api: &Api<S>,
    domain: &str,
    descriptor: &[OverrideEntry],
) -> Result<String, Refusal> {
    let rules = api.limiter.rules();
    let Some(loaded) = rules.domain(domain) else {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            &format!("no domain {domain} in the rules in force\n"),
        ));
    };
    if descriptor.is_empty() || descriptor.iter().any(|e| e.key.is_empty()) {
        return Err(bad_request(
            "descriptor must be a non-empty list of {\"key\": …, \"value\": …} with non-empty keys",
        ));
    }
    let Some(found) = loaded.find(&entries(descriptor)) else {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            &format!(
                "no rule of domain {domain} matches {}; an override replaces a matched rule's limit\n",
                described(descriptor)
            ),
        ));
    };
    Ok(rule_text(found.rule))
}

/// A rule's limits as the audit line shows them: `rule 100/minute`, one
/// per limit, or `rule unlimited`.
fn rule_text(rule: &crate::rules::Rule) -> String {
    if rule.unlimited || rule.limits.is_empty() {
        return "rule unlimited".to_owned();
    }
    let limits: Vec<String> = rule
        .limits
        .iter()
        .map(|l| match l.unit {
            Unit::Unknown => format!("{}/{}ms", l.spec.requests, l.spec.window.duration_ms),
            unit => format!("{}/{}", l.spec.requests, unit.proto_name().to_lowercase()),
        })
        .collect();
    format!("rule {}", limits.join(" + "))
}

/// An override's limit as text: `5000/minute`.
fn limit_text(o: &Override) -> String {
    format!("{}/{}", o.requests_per_unit, o.unit)
}

/// The body of a `PUT`, checked; the override it asks for.
fn parse_put(domain: &str, body: &str, set_by: String, now: u64) -> Result<Override, Refusal> {
    let body: PutBody = serde_json::from_str(body).map_err(bad_request)?;
    Unit::from_proto_name(&body.unit).ok_or_else(|| {
        bad_request(format!(
            "unit must be second, minute, hour, day, week, month or year, not '{}'",
            body.unit
        ))
    })?;
    if body.requests_per_unit > u64::from(u32::MAX) {
        return Err(bad_request(format!(
            "requests_per_unit must be between 0 and {}",
            u32::MAX
        )));
    }
    let expires_at_ms = match &body.expires_at {
        None => None,
        Some(text) => {
            let at: jiff::Timestamp = text
                .parse()
                .map_err(|e| bad_request(format!("expires_at must be an RFC 3339 instant: {e}")))?;
            let ms = u64::try_from(at.as_millisecond()).unwrap_or(0);
            if ms <= now {
                return Err(bad_request(format!("expires_at {text} has passed")));
            }
            Some(ms)
        }
    };
    Ok(Override {
        domain: domain.to_owned(),
        descriptor: body.descriptor,
        requests_per_unit: body.requests_per_unit,
        unit: body.unit.to_ascii_lowercase(),
        expires_at_ms,
        set_by,
        set_at_ms: now,
    })
}

/// One write (`op`: put or delete) as the metrics count it: refused,
/// failed in the store, or done.
struct Write<'m> {
    metrics: &'m crate::telemetry::metrics::Metrics,
    op: &'static str,
}

impl<'m> Write<'m> {
    /// The write, and the fingerprint of the caller's token; or its
    /// refusal, counted, when the token does not match.
    fn authorized<S: CounterStore>(
        api: &'m Api<S>,
        op: &'static str,
        headers: &HeaderMap,
    ) -> Result<(Self, String), Refusal> {
        let write = Self {
            metrics: api.limiter.metrics(),
            op,
        };
        let fingerprint = api.token.check(headers).inspect_err(|_| {
            write.metrics.record_override_write(op, "refused");
        })?;
        Ok((write, fingerprint))
    }

    fn refused(&self, refusal: Refusal) -> Response {
        self.metrics.record_override_write(self.op, "refused");
        refusal.into_response()
    }

    fn failed(&self, e: impl std::fmt::Display) -> Response {
        self.metrics.record_override_write(self.op, "error");
        (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response()
    }

    fn done(&self) {
        self.metrics.record_override_write(self.op, "ok");
    }
}

async fn put<S: CounterStore>(
    State(api): State<Arc<Api<S>>>,
    Path(domain): Path<String>,
    extensions: Extensions,
    headers: HeaderMap,
    body: String,
) -> Response {
    let (write, fingerprint) = match Write::authorized(&api, "put", &headers) {
        Ok(authorized) => authorized,
        Err(refusal) => return refusal.into_response(),
    };
    let refused = |refusal| write.refused(refusal);
    let now = now_ms();
    let who = caller(&extensions, &fingerprint);
    let new = match parse_put(&domain, &body, who.clone(), now) {
        Ok(new) => new,
        Err(refusal) => return refused(refusal),
    };
    let rule = match rule_limit(&api, &domain, &new.descriptor) {
        Ok(rule) => rule,
        Err(refusal) => return refused(refusal),
    };
    let before = match api
        .limiter
        .store()
        .put_override(new.clone(), api.max_per_domain)
        .await
    {
        Ok(before) => before.filter(|b| b.live_at(now)),
        Err(e @ OverrideError::Full(_)) => {
            return refused(refuse(StatusCode::CONFLICT, &format!("{e}\n")));
        }
        Err(OverrideError::Store(e)) => return write.failed(e),
    };
    let before = before.as_ref().map_or(rule, limit_text);
    tracing::info!(
        caller = %who,
        domain = %domain,
        descriptor = %described(&new.descriptor),
        before = %before,
        after = %limit_text(&new),
        expires_at = new.expires_at_ms.map(rfc3339).unwrap_or_default(),
        "override set"
    );
    write.done();
    applied_here(&api).await;
    axum::Json(serde_json::json!({
        "domain": domain,
        "before": before,
        "override": shown(&new),
    }))
    .into_response()
}

async fn delete<S: CounterStore>(
    State(api): State<Arc<Api<S>>>,
    Path(domain): Path<String>,
    extensions: Extensions,
    headers: HeaderMap,
    body: String,
) -> Response {
    let (write, fingerprint) = match Write::authorized(&api, "delete", &headers) {
        Ok(authorized) => authorized,
        Err(refusal) => return refusal.into_response(),
    };
    let refused = |refusal| write.refused(refusal);
    let body: DeleteBody = match serde_json::from_str(&body) {
        Ok(body) => body,
        Err(e) => return refused(bad_request(e)),
    };
    let rule = match rule_limit(&api, &domain, &body.descriptor) {
        Ok(rule) => rule,
        Err(refusal) => return refused(refusal),
    };
    let removed = match api
        .limiter
        .store()
        .delete_override(&domain, &body.descriptor)
        .await
    {
        Ok(Some(removed)) => removed,
        Ok(None) => {
            return refused(refuse(
                StatusCode::NOT_FOUND,
                &format!(
                    "no override of {} in domain {domain}\n",
                    described(&body.descriptor)
                ),
            ));
        }
        Err(e) => return write.failed(e),
    };
    tracing::info!(
        caller = %caller(&extensions, &fingerprint),
        domain = %domain,
        descriptor = %described(&body.descriptor),
        before = %limit_text(&removed),
        after = %rule,
        "override deleted"
    );
    write.done();
    applied_here(&api).await;
    axum::Json(serde_json::json!({
        "domain": domain,
        "deleted": shown(&removed),
        "after": rule,
    }))
    .into_response()
}

/// Puts a write in force on this replica at once (the others follow
/// within their polling interval); a failure is left to the next poll.
async fn applied_here<S: CounterStore>(api: &Api<S>) {
    if let Err(e) = api.limiter.refresh_overrides().await {
        tracing::warn!(error = %e, "overrides written but not reloaded; the next poll will");
    }
}

/// `GET`: the domain's overrides in force, from the store.
async fn list<S: CounterStore>(
    State(api): State<Arc<Api<S>>>,
    Path(domain): Path<String>,
) -> Response {
    if api.limiter.rules().domain(&domain).is_none() {
        return refuse(
            StatusCode::NOT_FOUND,
            &format!("no domain {domain} in the rules in force\n"),
        )
        .into_response();
    }
    let set = match api.limiter.store().load_overrides().await {
        Ok(set) => set,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    };
    let listed: Vec<_> = set
        .of_domain(&domain, now_ms())
        .into_iter()
        .map(shown)
        .collect();
    axum::Json(serde_json::json!({
        "domain": domain,
        "max": api.max_per_domain,
        "overrides": listed,
    }))
    .into_response()
}

/// One override as the API shows it.
fn shown(o: &Override) -> serde_json::Value {
    serde_json::json!({
        "descriptor": o.descriptor,
        "requests_per_unit": o.requests_per_unit,
        "unit": o.unit,
        "expires_at": o.expires_at_ms.map(rfc3339),
        "set_by": o.set_by,
        "set_at": rfc3339(o.set_at_ms),
    })
}

fn rfc3339(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The overrides in force as `/rlconfig` shows them, after the rules: one
/// line each, `# override domain descriptor: limit (until …, set by …)`.
pub fn describe(set: &OverrideSet, now_ms: u64) -> String {
    let mut domains: Vec<&str> = set.by_field.values().map(|o| o.domain.as_str()).collect();
    domains.sort_unstable();
    domains.dedup();
    let mut out = String::new();
    for domain in domains {
        for o in set.of_domain(domain, now_ms) {
            let until = o
                .expires_at_ms
                .map(|at| format!(" until {}", rfc3339(at)))
                .unwrap_or_default();
            out.push_str(&format!(
                "# override {domain} {}: {}{until} (set by {} at {})\n",
                described(&o.descriptor),
                limit_text(o),
                o.set_by,
                rfc3339(o.set_at_ms),
            ));
        }
    }
    out
}
