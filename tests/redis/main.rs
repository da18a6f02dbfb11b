//! The Redis store against real `redis-server` processes and Redis Clusters
//! started by the harness (`support::redis`): the service over Redis, faults
//! of a single server and of a Cluster, coalescing, the ways to connect (TLS,
//! unix socket, Sentinel), and the harness itself.

#[path = "../support/mod.rs"]
mod support;

mod cluster_faults;
mod coalescing;
mod connections;
mod harness;
mod service;
mod store_faults;
