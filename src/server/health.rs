//! Readiness, the one answer of `/readyz`, `/healthcheck` and
//! `grpc.health.v1.Health` ([`readiness`]). gRPC health asks it as the admin
//! routes do: `Check` asks it at the moment of the call, and
//! `Watch` streams its changes, which a task looks for every
//! `READINESS_POLL` and at once on shutdown.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::{Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::decision::Limiter;
use crate::proto as pb;
use crate::store::CounterStore;

/// Whether the service should take traffic; if not, why. The one answer
/// behind `/readyz`, `/healthcheck` and gRPC health.
pub fn readiness<S: CounterStore>(
    limiter: &Limiter<S>,
    shutdown: &CancellationToken,
) -> Result<(), &'static str> {
    if shutdown.is_cancelled() {
        Err("shutting down")
    } else if !limiter.store().is_ready() {
        Err("counter store unreachable")
    } else {
        Ok(())
    }
}

/// Health service names: the standard empty name, the RLS service's full
/// name, and `ratelimit`, the name envoyproxy/ratelimit uses.
const HEALTH_NAMES: [&str; 3] = ["", pb::SERVICE_NAME, "ratelimit"];

/// How often `Watch` looks at readiness. A store outage shows within this,
/// and looking is cheap (no call to the store).
const READINESS_POLL: Duration = Duration::from_millis(250);

/// The health service over `limiter`, and the task that feeds `Watch`
/// (which ends at shutdown, after reporting it).
pub(crate) fn service<S: CounterStore>(
    limiter: Arc<Limiter<S>>,
    shutdown: CancellationToken,
) -> HealthServer<ReadinessHealth<S>> {
    let (changes, watched) = watch::channel(readiness(&limiter, &shutdown).is_ok());
    tokio::spawn(follow(limiter.clone(), shutdown.clone(), changes));
    HealthServer::new(ReadinessHealth {
        limiter,
        shutdown,
        watched,
    })
}

/// Publishes readiness changes to `changes` until shutdown.
async fn follow<S: CounterStore>(
    limiter: Arc<Limiter<S>>,
    shutdown: CancellationToken,
    changes: watch::Sender<bool>,
) {
    let mut tick = tokio::time::interval(READINESS_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ready = readiness(&limiter, &shutdown);
        changes.send_if_modified(|serving| {
            let changed = *serving != ready.is_ok();
            match ready {
                Ok(()) if changed => tracing::info!("ready again: health is SERVING"),
                Err(why) if changed => tracing::warn!(why, "not ready: health is NOT_SERVING"),
                _ => {}
            }
            *serving = ready.is_ok();
            changed
        });
        if shutdown.is_cancelled() {
            return;
        }
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => {}
        }
    }
}

/// `grpc.health.v1.Health` from readiness.
pub(crate) struct ReadinessHealth<S> {
    limiter: Arc<Limiter<S>>,
    shutdown: CancellationToken,
    watched: watch::Receiver<bool>,
}

fn response(serving: bool) -> HealthCheckResponse {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    HealthCheckResponse {
        status: status as i32,
    }
}

#[tonic::async_trait]
impl<S: CounterStore> Health for ReadinessHealth<S> {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        if !HEALTH_NAMES.contains(&request.get_ref().service.as_str()) {
            return Err(Status::not_found("service not registered"));
        }
        let ready = readiness(&self.limiter, &self.shutdown);
        Ok(Response::new(response(ready.is_ok())))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        if !HEALTH_NAMES.contains(&request.get_ref().service.as_str()) {
            // As the protocol asks: say so, and keep the call open.
            let unknown = HealthCheckResponse {
                status: ServingStatus::ServiceUnknown as i32,
            };
            let stream = tokio_stream::once(Ok(unknown)).chain(tokio_stream::pending());
            return Ok(Response::new(Box::pin(stream)));
        }
        let stream = WatchStream::new(self.watched.clone()).map(|serving| Ok(response(serving)));
        Ok(Response::new(Box::pin(stream)))
    }
}
