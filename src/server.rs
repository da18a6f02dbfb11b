//! The listeners: gRPC (RLS, `grpc.health.v1`, reflection) and admin HTTP
//! (`admin`, its routes).
//! `run` serves both until `shutdown` is cancelled; callers bind the sockets
//! (tests bind `127.0.0.1:0`). Each listener owns its accept loop
//! (`conn`), which bounds connections; `grpc` and `http` serve one
//! connection of each kind, and `tls` loads and reloads the gRPC port's
//! certificates. gRPC health, `/readyz` and `/healthcheck` give the same
//! answer, [`health::readiness`].

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::decision::Limiter;
use crate::headers::HeaderMode;
use crate::store::CounterStore;

pub mod admin;
mod conn;
mod grpc;
pub mod health;
mod http;
mod overrides;
mod rls;
mod streams;
mod tls;

pub use conn::ConnLimits;
pub use grpc::GrpcLimits;
pub use tls::{TlsError, TlsFiles};

/// Both listening sockets.
pub struct Listeners {
    /// gRPC: RLS, health and reflection.
    pub grpc: TcpListener,
    /// Admin HTTP.
    pub http: TcpListener,
    /// When set, the gRPC listener serves TLS (mutual TLS with a CA file)
    /// instead of plaintext HTTP/2.
    pub grpc_tls: Option<TlsFiles>,
    /// When set, `ShouldRateLimit` fails as upstream's does ("no rate limit
    /// configuration loaded") while this says no rules arrived yet (xDS
    /// started without its first configuration).
    pub rules_gate: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Listeners {
    /// Binds both addresses.
    pub async fn bind(grpc: SocketAddr, http: SocketAddr) -> io::Result<Self> {
        Ok(Self {
            grpc: TcpListener::bind(grpc).await?,
            http: TcpListener::bind(http).await?,
            grpc_tls: None,
            rules_gate: None,
        })
    }

    /// Refuses decisions while `loaded` is false (see `rules_gate`).
    pub fn with_rules_gate(self, loaded: tokio::sync::watch::Receiver<bool>) -> Self {
        Self {
            rules_gate: Some(loaded),
            ..self
        }
    }

    /// Serves gRPC over TLS with `files`.
    pub fn with_grpc_tls(self, files: TlsFiles) -> Self {
        Self {
            grpc_tls: Some(files),
            ..self
        }
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

/// Why serving could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The reflection descriptors could not be loaded.
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The gRPC listener's TLS files could not be loaded.
    #[error("gRPC listener: {0}")]
    Tls(#[from] TlsError),
    /// The debug listener could not be bound.
    #[error("debug listener on {addr}: {error}")]
    Debug {
        /// Its address.
        addr: SocketAddr,
        /// Why.
        error: io::Error,
    },
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
    /// Streams, message size and request deadline of the gRPC listener.
    pub grpc: GrpcLimits,
    /// Connections of the gRPC listener.
    pub grpc_connections: ConnLimits,
    /// Connections of the admin HTTP listener.
    pub http_connections: ConnLimits,
    /// Serve `/rlconfig` on this address too (envoyproxy/ratelimit's debug
    /// port; setting `debug_addr`).
    pub debug_addr: Option<SocketAddr>,
    /// `/healthcheck` answers 200 only once rules are loaded (setting
    /// `healthy_with_config_loaded`).
    pub healthy_with_config_loaded: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            headers: HeaderMode::Off,
            shutdown_delay: Duration::ZERO,
            shutdown_grace: Duration::from_secs(10),
            grpc: GrpcLimits::default(),
            grpc_connections: ConnLimits::default(),
            http_connections: ConnLimits {
                max_connections: 1_024,
                max_age: None,
                ..ConnLimits::default()
            },
            debug_addr: None,
            healthy_with_config_loaded: false,
        }
    }
}

/// What the listeners offer beyond [`ServeOptions`], all off by default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeExtras {
    /// Fill `dynamic_metadata` as envoyproxy/ratelimit's
    /// `RESPONSE_DYNAMIC_METADATA` does (setting `response_dynamic_metadata`).
    pub dynamic_metadata: bool,
    /// A refusal carries an `application/problem+json` body (setting
    /// `problem_json_body`).
    pub problem_body: bool,
    /// Serve the admin `/counters` endpoint (setting `admin_counters`).
    pub admin_counters: bool,
    /// Tell the upstream its headroom in `request_headers_to_add` (setting
    /// `upstream_headroom_headers`).
    pub upstream_headroom: bool,
    /// The file of the bearer token that `/overrides` writes need (setting
    /// `admin_token`); without it they are refused.
    pub admin_token: Option<std::path::PathBuf>,
    /// Most run-time overrides per domain (setting
    /// `overrides_max_per_domain`).
    pub overrides_max_per_domain: usize,
}

impl Default for ServeExtras {
    fn default() -> Self {
        Self {
            dynamic_metadata: false,
            problem_body: false,
            admin_counters: false,
            upstream_headroom: false,
            admin_token: None,
            overrides_max_per_domain: 1_000,
        }
    }
}

impl ServeOptions {
    /// What responses carry besides the decision, on both listeners.
    fn response(&self, extras: &ServeExtras) -> crate::service::ResponseOptions {
        crate::service::ResponseOptions {
            headers: self.headers,
            dynamic_metadata: extras.dynamic_metadata,
            problem_body: extras.problem_body,
            upstream_headroom: extras.upstream_headroom,
        }
    }
}

/// Serves until `shutdown` is cancelled; then turns health and readiness
/// false, keeps serving for `options.shutdown_delay`, stops accepting, and
/// lets in-flight requests finish for at most `options.shutdown_grace`.
pub async fn run<S: CounterStore>(
    limiter: Arc<Limiter<S>>,
    options: ServeOptions,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    run_with(
        limiter,
        options,
        ServeExtras::default(),
        listeners,
        shutdown,
    )
    .await
}

/// [`run`], with the `extras` turned on.
pub async fn run_with<S: CounterStore>(
    limiter: Arc<Limiter<S>>,
    options: ServeOptions,
    extras: ServeExtras,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let health = health::service(limiter.clone(), shutdown.clone());
    let (routes, rls) = grpc::routes(
        limiter.clone(),
        options.response(&extras),
        health,
        options.grpc.max_request_bytes,
        listeners.rules_gate.clone(),
    )?;

    let metrics = limiter.metrics();
    let closing = CancellationToken::new();
    // Before anything is served, so that bad files stop the start.
    let tls = start_tls(listeners.grpc_tls, metrics, &closing)?;
    close_after_delay(&shutdown, &closing, options.shutdown_delay);

    // RLQS beside RLS on the same port; its own state, off the RLS path.
    let (rlqs, rlqs_admin) = crate::rlqs::serve(&limiter, closing.clone());
    let routes = routes.add_service(rlqs);
    let invalid = Arc::new(metrics.invalid_request_counters());
    let grpc = conn::accept(
        listeners.grpc,
        conn::Listener {
            name: "grpc",
            limits: options.grpc_connections,
            counters: metrics.connection_counters("grpc"),
            refusal: if tls.is_some() {
                b""
            } else {
                conn::GRPC_REFUSAL
            },
            // The HTTP/2 client preface.
            handshake_bytes: 24,
            shutdown_grace: options.shutdown_grace,
        },
        closing.clone(),
        |io, activity| {
            let requests = grpc::GrpcRequests::new(
                (routes.clone(), rls.clone()),
                &options.grpc,
                invalid.clone(),
                activity,
            );
            let acceptor = tls.as_ref().map(|tls| tls.acceptor());
            grpc::AnyGrpcConnection::new(acceptor, &options.grpc, io, requests)
        },
    );
    let debug = serve_debug(&limiter, &options, &shutdown, &closing).await?;
    let router = admin_router(&limiter, &options, extras, &shutdown).merge(rlqs_admin);
    let admin = serve_http(
        listeners.http,
        "http",
        options.http_connections,
        router,
        &options,
        metrics,
        &closing,
    );
    let debug = async {
        if let Some(debug) = debug {
            debug.await;
        }
    };
    within_grace(
        async {
            tokio::join!(grpc, admin, debug);
        },
        &closing,
        options.shutdown_grace,
    )
    .await;
    Ok(())
}

/// The admin port's routes over `limiter`.
fn admin_router<S: CounterStore>(
    limiter: &Arc<Limiter<S>>,
    options: &ServeOptions,
    extras: ServeExtras,
    shutdown: &CancellationToken,
) -> axum::Router {
    let admin_options = admin::AdminOptions {
        response: options.response(&extras),
        counters: extras.admin_counters,
        healthy_with_config_loaded: options.healthy_with_config_loaded,
        admin_token: extras.admin_token.clone(),
        overrides_max_per_domain: extras.overrides_max_per_domain,
    };
    admin::router_with(limiter.clone(), admin_options, shutdown.clone())
}

/// The gRPC port's certificate reloader, when it serves TLS.
fn start_tls(
    files: Option<TlsFiles>,
    metrics: &crate::telemetry::metrics::Metrics,
    closing: &CancellationToken,
) -> Result<Option<Arc<tls::Tls>>, ServeError> {
    let Some(files) = files else {
        return Ok(None);
    };
    let (ok, error) = metrics.tls_reload_counters();
    Ok(Some(tls::Tls::start(
        files,
        tls::ReloadCounters { ok, error },
        closing.clone(),
    )?))
}

/// Shutdown in stages: health and readiness turn false at once (on
/// `shutdown`), the listeners keep serving for `delay` (so load balancers
/// and Kubernetes remove the endpoint first), then `closing` stops them
/// accepting.
fn close_after_delay(shutdown: &CancellationToken, closing: &CancellationToken, delay: Duration) {
    let (draining, close) = (shutdown.clone(), closing.clone());
    tokio::spawn(async move {
        draining.cancelled().await;
        tokio::time::sleep(delay).await;
        close.cancel();
    });
}

/// envoyproxy/ratelimit's debug port, when `debug_addr` is set: the same
/// guards as the admin port (it is on by default in drop-in mode, often on
/// 0.0.0.0), with a cap of its own.
async fn serve_debug<S: CounterStore>(
    limiter: &Arc<Limiter<S>>,
    options: &ServeOptions,
    shutdown: &CancellationToken,
    closing: &CancellationToken,
) -> Result<Option<impl std::future::Future<Output = ()> + use<S>>, ServeError> {
    let Some(addr) = options.debug_addr else {
        return Ok(None);
    };
    let socket = TcpListener::bind(addr)
        .await
        .map_err(|error| ServeError::Debug { addr, error })?;
    let limits = ConnLimits {
        max_connections: DEBUG_MAX_CONNECTIONS,
        ..options.http_connections
    };
    let router = admin::debug_router(limiter.clone(), shutdown.clone());
    let metrics = limiter.metrics();
    Ok(Some(serve_http(
        socket, "debug", limits, router, options, metrics, closing,
    )))
}

/// Runs `serving` until it ends, or until `grace` after `closing`: long-lived
/// streams (a health Watch, say) must not hold shutdown open past the grace
/// period; Kubernetes would kill the pod mid-flight anyway.
async fn within_grace(
    serving: impl std::future::Future<Output = ()>,
    closing: &CancellationToken,
    grace: Duration,
) {
    let deadline = async {
        closing.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        () = serving => {}
        () = deadline => {
            tracing::warn!(grace = ?grace, "connections still open after the shutdown grace period; stopping anyway");
        }
    }
}

/// Most connections open at once on the debug port (`debug_addr`): it
/// serves `/rlconfig` to people, not to traffic.
pub const DEBUG_MAX_CONNECTIONS: u32 = 64;

/// Serves `router` over HTTP/1.1 on `socket` (the admin or debug port)
/// under `limits`, each request within the request deadline.
fn serve_http(
    socket: TcpListener,
    name: &'static str,
    limits: ConnLimits,
    router: axum::Router,
    options: &ServeOptions,
    metrics: &crate::telemetry::metrics::Metrics,
    closing: &CancellationToken,
) -> impl std::future::Future<Output = ()> + use<> {
    let http1 = http::http1_builder(limits.handshake_timeout);
    let timeout = options.grpc.request_timeout;
    conn::accept(
        socket,
        conn::Listener {
            name,
            limits,
            counters: metrics.connection_counters(name),
            refusal: conn::HTTP_REFUSAL,
            // Any part of a request head; hyper's header read timeout
            // (the same length) then wants the rest.
            handshake_bytes: 1,
            shutdown_grace: options.shutdown_grace,
        },
        closing.clone(),
        // One request deadline for every port (`request_timeout_ms`).
        move |io, activity| {
            let peer = io.peer_addr().ok();
            let requests = http::HttpRequests::new(router.clone(), timeout, activity.clone(), peer);
            http::serve(&http1, conn::Tracked::new(io, activity), requests)
        },
    )
}
