//! Sluice: a global rate-limit decision service speaking Envoy's RLS v3 API.
//!
//! A map of the crate, from the wire inwards:
//!
//! - [`app`] is the composition root: it builds the whole service from
//!   [`settings`] (rules source, store, stats sinks, reloads) and serves it
//!   on bound listeners until shutdown; `main.rs` only adds the command
//!   line, telemetry and signals;
//! - [`server`] binds the gRPC and admin HTTP listeners and runs them,
//!   bounding connections, streams, message sizes and request time; its
//!   `admin` serves the admin HTTP routes (`/json`, `/rlconfig`,
//!   `/healthcheck`, `/counters`, metrics) and its `health` is readiness,
//!   the one answer of `/readyz`, `/healthcheck` and gRPC health;
//! - [`service`] is where RLS protobuf meets the domain: it converts a
//!   `RateLimitRequest` into a [`request::Request`] and a
//!   [`decision::Decision`] back into a `RateLimitResponse` (RLQS's stream
//!   and xDS's `RateLimitConfig` have their own adapters, `rlqs::service`
//!   and `xds::convert`);
//! - [`decision`] matches descriptors to [`rules`], builds one
//!   [`store::Batch`] per request, and shapes the statuses;
//! - [`store`] holds the counters; each request is checked and applied
//!   atomically (all-or-nothing) in one store call;
//! - [`overlimit`] lets [`decision`] answer a request whose counters are all
//!   known full without calling the store, exactly as the store would;
//! - [`limiter`] is the pure core: the algorithms as functions of explicit
//!   time, the clock, and the injective counter keys;
//! - [`rlqs`] is the Rate Limit Quota Service: Envoys report usage per
//!   bucket on a stream and get a demand-weighted share of the rule's
//!   budget to enforce locally; it reads the rules and stays off the RLS path;
//! - [`reload`] watches the rules files (and SIGHUP) and reloads them,
//!   keeping the rules in force when a reload fails;
//! - [`xds`] takes the rules from an xDS management server instead
//!   (`RateLimitConfig`, ACK/NACK), through the same compiler and the same
//!   reload sink as files;
//! - [`certs`] reads PEM certificates and keys for every TLS endpoint and
//!   holds the verifier that checks a chain but not a name;
//! - [`settings`] (one declaration per setting, and envoyproxy/ratelimit's
//!   variables as a layer over it), [`cli`], [`query`], [`bench`],
//!   [`telemetry`] (Sluice's metrics, and upstream's stat names with their
//!   statsd and Prometheus sinks) and [`headers`] serve the binary.
//!
//! The core (`limiter`, `request`, `rules`, `overlimit`, `decision`) imports
//! no tokio, tonic, protobuf, Redis client or clap; the layers, and who may
//! see protobuf and Redis, are tables in CONTRIBUTING.md, checked against
//! these modules' imports by `tests/deploy/layering.rs`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod app;
#[cfg(feature = "bench")]
pub mod bench;
pub mod certs;
pub mod cli;
pub mod decision;
pub mod headers;
#[allow(missing_docs)]
pub mod limiter;
pub mod overlimit;
#[allow(missing_docs)]
pub mod proto;
pub mod query;
pub mod reload;
pub mod request;
pub mod rlqs;
#[allow(missing_docs)]
pub mod rules;
pub mod server;
pub mod service;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod xds;
