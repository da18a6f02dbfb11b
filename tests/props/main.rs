//! Property tests: the counting algorithms against exact models, and one
//! conformance suite over the memory store, Redis and Redis Cluster.
//!
//! proptest keeps the seeds of past failures in
//! `tests/proptest-regressions/<module>.txt`: its default persistence,
//! `SourceParallel("proptest-regressions")`, goes up from the failing file
//! to the first directory with a `main.rs` (this one) and keeps them in a
//! `proptest-regressions` directory beside it.

#[path = "../support/mod.rs"]
mod support;

mod algorithms;
mod batch;
mod store_conformance;
