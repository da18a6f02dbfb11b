//! The listeners: gRPC (RLS, `grpc.health.v1`, reflection) and admin HTTP.
//! `run` serves both until `shutdown` is cancelled; callers bind the sockets
//! (tests bind `127.0.0.1:0`).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;

use crate::decision::Limiter;
use crate::headers::HeaderMode;
use crate::proto as pb;
use crate::service::RateLimitService;
use crate::store::CounterStore;

/// Both listening sockets.
pub struct Listeners {
    /// gRPC: RLS, health and reflection.
    pub grpc: TcpListener,
    /// Admin HTTP.
    pub http: TcpListener,
}

impl Listeners {
    /// Binds both addresses.
    pub async fn bind(grpc: SocketAddr, http: SocketAddr) -> io::Result<Self> {
        Ok(Self {
            grpc: TcpListener::bind(grpc).await?,
            http: TcpListener::bind(http).await?,
        })
    }

    /// The bound gRPC address (useful with port 0).
    pub fn grpc_addr(&self) -> io::Result<SocketAddr> {
        self.grpc.local_addr()
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> io::Result<SocketAddr> {
        self.http.local_addr()
    }
}

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The reflection descriptors could not be loaded.
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The admin HTTP server failed.
    #[error("admin HTTP server: {0}")]
    Http(#[from] io::Error),
}

/// How the listeners behave.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Rate-limit headers added to responses.
    pub headers: HeaderMode,
    /// After shutdown is requested, how long to keep serving while reporting
    /// not ready, so the endpoint is removed before the listeners close.
    pub shutdown_delay: Duration,
    /// Then, how long in-flight requests and open streams may take before
    /// the server stops anyway.
    pub shutdown_grace: Duration,
}

/// Health service names reported SERVING: the standard empty name, the RLS
/// service's full name, and `ratelimit`, the name envoyproxy/ratelimit uses.
const HEALTH_NAMES: [&str; 3] = ["", pb::SERVICE_NAME, "ratelimit"];

/// Serves until `shutdown` is cancelled; then turns health and readiness
/// false, keeps serving for `options.shutdown_delay`, stops accepting, and
/// lets in-flight requests finish for at most `options.shutdown_grace`.
pub async fn run<S: CounterStore>(
    limiter: Arc<Limiter<S>>,
    options: ServeOptions,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in HEALTH_NAMES {
        reporter
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };

    // Shutdown in stages: health and readiness turn false at once, the
    // listeners keep serving for `shutdown_delay` (so load balancers and
    // Kubernetes remove the endpoint first), then stop accepting.
    let closing = CancellationToken::new();
    let (draining, close) = (shutdown.clone(), closing.clone());
    let delay = options.shutdown_delay;
    tokio::spawn(async move {
        draining.cancelled().await;
        for name in HEALTH_NAMES {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        tokio::time::sleep(delay).await;
        close.cancel();
    });

    // Decisions are small and latency-bound: never let Nagle hold a reply back.
    let incoming = TcpListenerStream::new(listeners.grpc).map(|stream| {
        stream.inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    });
    let (rlqs, rlqs_admin) = crate::rlqs::serve(&limiter, closing.clone());
    let grpc = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .add_service(pb::RateLimitServiceServer::new(RateLimitService::new(
            limiter.clone(),
            options.headers,
        )))
        .add_service(rlqs)
        .serve_with_incoming_shutdown(incoming, closing.clone().cancelled_owned());
    let admin = axum::serve(
        listeners.http,
        crate::admin::router(limiter, options.headers, shutdown.clone()).merge(rlqs_admin),
    )
    .with_graceful_shutdown(closing.clone().cancelled_owned());
    let serving = async {
        tokio::try_join!(async { grpc.await.map_err(ServeError::from) }, async {
            admin.await.map_err(ServeError::from)
        })
    };
    // Long-lived streams (a health Watch, say) must not hold shutdown open
    // past the grace period: Kubernetes would kill the pod mid-flight anyway.
    let deadline = async {
        closing.cancelled().await;
        tokio::time::sleep(options.shutdown_grace).await;
    };
    tokio::select! {
        result = serving => { result?; }
        () = deadline => {
            tracing::warn!(grace = ?options.shutdown_grace, "connections still open after the shutdown grace period; stopping anyway");
        }
    }
    Ok(())
}
