//! The service in process (and the binary on port 0), one module per area:
//! the RLS semantics, the wire and the binary, the admin port, rules and
//! their reload, hostile rules and hostile clients, TLS, tracing, xDS, RLQS,
//! counting modes, the local cache, run-time overrides, and `sluice bench`
//! (feature "bench").
//! None needs anything but `redis-server` (started by `support::redis`).

#[path = "../support/mod.rs"]
mod support;

mod admin;
#[cfg(feature = "bench")]
mod bench;
mod connection_limits;
mod counting;
mod hostile_rules;
mod local_cache;
mod overrides;
mod reload;
mod rlqs;
mod rules;
mod service;
mod tls;
mod tracing;
mod wire_and_binary;
mod xds;
