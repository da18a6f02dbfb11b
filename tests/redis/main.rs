//! The Redis store against real `redis-server` processes and Redis Clusters
//! started by the harness (`support::redis`): the service over Redis, faults
//! of a single server and of a Cluster, coalescing, batching across
//! identities (and batch.lua's answers against the memory store's), the ways to connect (TLS, unix socket, Sentinel), the harness
//! itself, run-time overrides shared by replicas (`overrides`), the
//! numbering of the scripts' records (`lua_build`), and the soft-breach and
//! headroom warnings agreeing with the memory store's.

#[path = "../support/mod.rs"]
mod support;

mod batch_model;
mod batching;
mod calendar;
mod cluster_faults;
mod coalescing;
mod connections;
mod harness;
/// The scripts' named records (build/lua.rs, which build.rs runs).
#[path = "../../build/lua.rs"]
mod lua_build;
mod overrides;
mod service;
mod store_faults;
mod warnings;
