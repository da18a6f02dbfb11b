//! Helpers shared by the test binaries: a limiter over YAML rules with a
//! manual clock, request builders, and an in-process server on 127.0.0.1:0.

#![allow(dead_code)]

pub mod redis;

use std::net::SocketAddr;
use std::sync::Arc;

use sluice::decision::{Bounds, Limiter};
use sluice::headers::HeaderMode;
use sluice::limiter::ManualClock;
use sluice::proto as pb;
use sluice::proto::RateLimitService as _;
use sluice::rules::{RuleSet, load_paths};
use sluice::server::{self, Listeners};
use sluice::service::RateLimitService;
use sluice::store::{MemoryStore, MemoryStoreConfig};
use tokio_util::sync::CancellationToken;

/// An instant aligned to an hour, so fixed windows start at known times.
pub const T0: u64 = 1_699_999_200_000;

/// Rules from YAML text (written to a temp file so errors carry a name).
pub fn rules(yaml: &str) -> RuleSet {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, yaml).expect("write rules");
    load_paths(&[path]).unwrap_or_else(|errors| panic!("test rules invalid: {errors:?}"))
}

/// A service over a memory store whose clock the test moves.
pub struct Harness {
    pub clock: Arc<ManualClock>,
    pub limiter: Arc<Limiter<MemoryStore>>,
    pub service: RateLimitService<MemoryStore>,
}

impl Harness {
    pub fn new(yaml: &str) -> Self {
        Self::with(yaml, HeaderMode::Off, Bounds::default())
    }

    pub fn with(yaml: &str, headers: HeaderMode, bounds: Bounds) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
        let limiter = Arc::new(Limiter::new(rules(yaml), store, bounds));
        let service = RateLimitService::new(limiter.clone(), headers);
        Self {
            clock,
            limiter,
            service,
        }
    }

    pub async fn call(
        &self,
        request: pb::RateLimitRequest,
    ) -> Result<pb::RateLimitResponse, tonic::Status> {
        self.service
            .should_rate_limit(tonic::Request::new(request))
            .await
            .map(|r| r.into_inner())
    }

    /// Calls and expects an answer.
    pub async fn ok(&self, request: pb::RateLimitRequest) -> pb::RateLimitResponse {
        self.call(request).await.expect("the request is valid")
    }
}

/// A descriptor from `(key, value)` pairs.
pub fn descriptor(entries: &[(&str, &str)]) -> pb::RateLimitDescriptor {
    pb::RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| pb::rate_limit_descriptor::Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request with one descriptor per entry list.
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> pb::RateLimitRequest {
    pb::RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}

pub const OK: i32 = pb::rate_limit_response::Code::Ok as i32;
pub const OVER: i32 = pb::rate_limit_response::Code::OverLimit as i32;

/// A running in-process server and what is needed to reach and stop it.
pub struct Server {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub clock: Arc<ManualClock>,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), server::ServeError>>,
}

impl Server {
    /// Starts a server on loopback ports chosen by the OS.
    pub async fn start(yaml: &str, headers: HeaderMode) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
        let limiter = Arc::new(Limiter::new(rules(yaml), store, Bounds::default()));
        let listeners = Listeners::bind(([127, 0, 0, 1], 0).into(), ([127, 0, 0, 1], 0).into())
            .await
            .expect("bind loopback");
        let (grpc, http) = (
            listeners.grpc_addr().unwrap(),
            listeners.http_addr().unwrap(),
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server::run(limiter, headers, listeners, shutdown.clone()));
        Self {
            grpc,
            http,
            clock,
            shutdown,
            task,
        }
    }

    pub fn uri(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// Stops the server and waits for it to finish cleanly.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task
            .await
            .expect("server task")
            .expect("server stopped cleanly");
    }
}
