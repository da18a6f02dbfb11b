//! Sluice behind a real Envoy 1.40 (`SLUICE_TEST_ENVOY`, set by `tests/run`):
//! RLS with the example front proxy and the documentation's snippets, RLQS,
//! and Envoy Gateway's rendered rate-limit Deployment.

#[path = "../support/mod.rs"]
mod support;

mod envoy_gateway;
mod rlqs;
mod rls;
