//! The Rate Limit Quota Service (RLQS): Envoy decides locally, Sluice splits
//! each bucket's global budget between the Envoys by their demand.
//!
//! RLS costs a round trip per request; with RLQS
//! (`envoy.service.rate_limit_quota.v3.RateLimitQuotaService`) every Envoy
//! keeps one bidirectional stream per domain open, reports per bucket how
//! many requests it admitted and denied (every 5 s in Envoy 1.40, whatever
//! its configuration says), and Sluice answers with a token bucket that
//! Envoy enforces by itself. Nothing here runs on the RLS request path: the
//! module reads the rules in force (`Limiter::rules`, `Domain::find`) and
//! owns its own state.
//!
//! # Parts
//!
//! - [`alloc`]: the pure arithmetic — a rule's limit as a budget of whole
//!   tokens per whole-second fill interval, and the split of a budget between
//!   streams. No tokio, no tonic, no clock: everything is an argument.
//! - [`state`]: per stream and per bucket, the smoothed demand, the current
//!   assignment and the idle count; a report in, the actions for every stream
//!   out. Time is an argument (`now`), so tests drive it by hand.
//! - [`redis`]: demand shared between replicas through Redis (`share.lua`);
//!   run through the RLS store's connections and Cluster routing
//!   (`store::ScriptRunner`), so only `store/redis` sees the Redis client.
//! - [`metrics`]: the RLQS metrics, in their own registry.
//! - [`service`]: the tonic service, the only part that sees protobuf: one
//!   task per stream, a channel per stream for pushed actions, refusal past
//!   the stream cap, and state dropped when a stream closes.
//!
//! # Buckets and rules
//!
//! A bucket id is a map of strings. Its entries, **sorted by key** (byte
//! order), become one descriptor's entries, and the descriptor is matched in
//! the stream's domain exactly as RLS matches it (`Domain::find`, the same
//! code). So `{tenant: hot}` matches the rule `key: tenant, value: hot`, and
//! `{path: /a, tenant: hot}` matches `path=/a` then the nested `tenant=hot`.
//! The result:
//!
//! - a rule with limits: a token-bucket share of the tightest of its limits
//!   (the one with the lowest rate) — the rule's limit is the global budget
//!   of the bucket, shared by every Envoy reporting it (only the rate
//!   carries over: not the algorithm, `burst` or window alignment;
//!   `quota_mode` is enforced like any rule);
//! - `unlimited`, a whitelisted value (a value rule without a limit), a
//!   `shadow_mode` rule, no matching rule, or an unknown domain: `ALLOW_ALL`.
//!   This is RLS's answer for the same descriptor (OK), so a descriptor means
//!   the same thing over both APIs; to deny by default, give the catch-all
//!   key a limit in the rules.
//!
//! # The budget as tokens
//!
//! Envoy 1.40 enforces only `token_bucket` (it ignores
//! `requests_per_time_unit`), reads `fill_interval` in whole seconds
//! (less than a second means unlimited) and does not notice a change of
//! `fill_interval` alone. So a limit of `requests` per `window` becomes a
//! budget of `B = requests × k` tokens per fill interval `F = window × k`,
//! with `k` the smallest factor that makes `F` whole seconds, at least 60 s,
//! and `B` at least 100 tokens — enough grain to split. `F` depends only on
//! the rule, so a share changes through `tokens_per_fill` alone. The rate is
//! exactly the rule's; only integers are involved.
//!
//! # The split
//!
//! Each stream's demand for a bucket is its offered rate, allowed plus
//! denied (denied requests are demand too: counting only admitted ones would
//! freeze the split where it is). Each report gives a sample over the time
//! since that stream's previous report of the bucket (by Sluice's clock, at
//! least 5 s, so the short gap after a first report cannot spike it), and
//! the demand is smoothed: `d ← (d + sample) / 2` (EWMA, α = ½: a step is
//! followed half-way per report).
//!
//! With `n` streams, budget `B`, and a floor `m = max(B / 10n, 1 if B ≥ n)`,
//! each demand is first raised to the floor, `t_i = max(d_i, m)`, `T = Σ t_i`:
//!
//! - `T ≤ B` (under budget): `share_i = t_i + (B − T) / n` — every stream
//!   gets at least its demand and an equal part of the headroom, so a bucket
//!   under budget is not denied anywhere, and a stream whose traffic grows
//!   has room before its next report;
//! - `T > B` (over budget): `share_i = m + (B − n·m) × (t_i − m) / (T − n·m)`
//!   — the floor for everyone, the rest in proportion to demand above the
//!   floor, so a quiet Envoy can still admit and a busy one gets what a
//!   single global limiter would give it. Both formulas agree at `T = B`.
//!
//! Integer division rounds down, so `Σ share_i ≤ B` always.
//!
//! **Damping.** Every changed parameter hands Envoy a new, full bucket, so
//! shares must not flap. A recomputed share replaces the current one only if
//! it moved by more than a dead band of `B / 20` tokens; if keeping the old
//! shares would put the total above `B` (with Redis: above this replica's
//! cap, see below), every stream above its new share is cut to it; changed
//! shares of other streams are pushed to them at once. `max_tokens` is 3:
//! `1` under-admits with discrete arrivals, and each change costs at most
//! `max_tokens` extra requests. A share of 0 (more streams than tokens) is
//! `DENY_ALL`.
//!
//! **Assignments.** Every report is answered with the assignment of every
//! bucket in it (unchanged parameters carry over in Envoy, and the TTL is
//! refreshed). The TTL is 60 s: longer than a restart of Sluice, so Envoys
//! keep enforcing their last shares while it is away; Envoy 1.40 expires an
//! unset TTL at once and flaps with a TTL under its 5 s report interval. A
//! first report (`time_elapsed: 0s`, accepted) is answered at once. A
//! recomputation that changes another stream's share is pushed to that
//! stream's channel immediately.
//!
//! **Abandon.** A bucket a stream reported with no requests for 6 reports
//! in a row (30 s) gets an `abandon_action`: Envoy forgets it and stops
//! reporting it, and its next request for it subscribes again.
//!
//! # The bound
//!
//! Over any window of `W` seconds, the requests admitted for one bucket
//! across all Envoys are at most
//!
//! `R·W` + `R·5 s` + `max_tokens × (assignments changed in W)`
//!
//! where `R = B / F` is the rule's rate. The shares never sum above `R`; but
//! Sluice only learns of a stream's demand — and, after a restart, of the
//! stream at all — through its reports, one every 5 s, so a stream can go on
//! using a share that Sluice has already given to others for at most one
//! report interval (after a restart: Sluice splits the budget between the
//! streams that have reconnected while the others still hold their old,
//! unexpired shares). Each new assignment starts full, hence the last term;
//! the dead band keeps it to the first assignment of each stream in steady
//! state.
//!
//! # State, bounds and replicas
//!
//! All RLQS state sits behind one mutex: reports arrive every 5 s per Envoy,
//! so contention is nil, and one lock makes a recomputation see every stream
//! of the bucket at once. A bucket exists while a stream reports it; a
//! stream's buckets vanish when it closes or they are abandoned. Streams are
//! capped (refused with `RESOURCE_EXHAUSTED`), and so are buckets per stream
//! (past the cap a bucket gets no assignment, so Envoy applies its
//! `no_assignment_behavior`).
//!
//! With several replicas, each stream lands on one replica, so a global
//! split needs every stream's demand. In memory mode a replica splits the
//! budget between the streams *it* holds (one replica's view: `r` replicas
//! may assign up to `r × B`). When the RLS store is Redis, the replicas
//! share demand through it ([`redis`], `share.lua`): per bucket one hash,
//! one field per stream of every replica holding its smoothed demand and an
//! expiry three report intervals ahead (by Redis's clock). At each report a
//! replica writes its streams' demand for the bucket and reads every live
//! field back in the same script call, dropping expired ones; the split is
//! computed over all of them, and each replica assigns its own streams their
//! targets, capped at their targets plus their part of the rounding left
//! over, so the caps of all replicas sum to at most `B`. A replica hears of
//! another's change at its own streams' next report, within one report
//! interval — the `R·5 s` term of the bound again. A closed or abandoned
//! stream's field is deleted; a dead replica's fields expire in 15 s; the
//! hash expires with its last field. If Redis fails, the replica keeps what
//! it last heard and says so in a warning; streams are never failed for it.
//! The hashes are `<key_prefix>rlqs:<sha-256 of [domain, entries]>`, under
//! the RLS store's `redis_key_prefix` (default `sluice:`), so deployments
//! that share a Redis with their own prefixes keep their demand apart.

pub mod alloc;
pub mod metrics;
pub mod redis;
pub mod service;
pub mod state;
pub mod types;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use tokio_util::sync::CancellationToken;

use crate::decision::Limiter;
use crate::proto::rlqs::rate_limit_quota_service_server as proto_server;
use crate::store::CounterStore;

pub use service::RateLimitQuotaService;
pub use state::Rlqs;

/// The RLQS gRPC service and its admin routes over the rules of `limiter`:
/// `server.rs` adds the first to the gRPC router and merges the second into
/// the admin router. Streams end with `UNAVAILABLE` when `closing` is
/// cancelled (the listeners stop accepting).
pub fn serve<S: CounterStore>(
    limiter: &Arc<Limiter<S>>,
    closing: CancellationToken,
) -> (
    proto_server::RateLimitQuotaServiceServer<RateLimitQuotaService>,
    Router,
) {
    let rules = limiter.clone();
    let rlqs = Arc::new(Rlqs::new(move || rules.rules()));
    let mut service = RateLimitQuotaService::new(rlqs.clone(), closing);
    if let Some(runner) = limiter.store().script_runner() {
        service = service.with_board(Arc::new(redis::RedisBoard::new(runner)));
    }
    (service.into_server(), admin_router(rlqs))
}

/// `GET /rlqs`: every bucket, its budget, and each stream's demand and
/// assignment, as JSON. `GET /metrics/rlqs`: the RLQS metrics.
pub fn admin_router(rlqs: Arc<Rlqs>) -> Router {
    Router::new()
        .route(
            "/rlqs",
            get(|State(rlqs): State<Arc<Rlqs>>| async move {
                axum::Json(serde_json::json!({ "buckets": rlqs.snapshot() }))
            }),
        )
        .route(
            "/metrics/rlqs",
            get(|State(rlqs): State<Arc<Rlqs>>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    rlqs.metrics().encode(),
                )
                    .into_response()
            }),
        )
        .with_state(rlqs)
}
