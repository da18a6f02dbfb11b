//! Serving one gRPC connection: HTTP/2 with bounded streams and windows,
//! and in front of tonic's routes, what tonic leaves undone — a deadline
//! for each request, a refusal of what is not gRPC, and INVALID_ARGUMENT
//! (not INTERNAL) for a message that does not decode, all counted.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::service::Routes;

use super::conn::{Activity, CountedBody, Served, Tracked};
use super::rls::{self, RlsService};
use super::streams::{Running, Streams};
use crate::proto as pb;
use crate::telemetry::metrics::InvalidRequestCounters;

/// How the gRPC listener bounds requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcLimits {
    /// Most streams open at once on one connection (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS); the client must wait for more.
    pub max_concurrent_streams: u32,
    /// Largest request message, in bytes.
    pub max_request_bytes: usize,
    /// How long a request may take to arrive and be answered.
    pub request_timeout: Duration,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 100,
            max_request_bytes: 64 * 1024,
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// Flow-control window of one stream: a request of the default maximum
/// size fits, and the client cannot send further ahead of what is read.
const STREAM_WINDOW: u32 = 64 * 1024;
/// Flow-control window of a connection (all its streams together).
const CONNECTION_WINDOW: u32 = 1024 * 1024;
/// Largest header block: Envoy's rate-limit calls and trace context fit
/// many times over.
const MAX_HEADER_LIST: u32 = 16 * 1024;
/// HTTP/2 pings find dead peers (a Watch stream would otherwise keep a
/// vanished client's connection forever).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The path of ShouldRateLimit, whose refusals also count as its calls.
const RLS_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// tonic's messages (as `grpc-message` starts) for a request message it
/// could not read: all INTERNAL, all the client's fault.
const DECODE_ERRORS: [&[u8]; 4] = [
    b"failed to decode Protobuf message",
    b"Unexpected EOF decoding stream",
    b"protocol error: received message",
    b"Missing request message",
];
/// tonic's message for a message over the size cap (OUT_OF_RANGE).
const TOO_LARGE: &[u8] = b"Error, decoded message length too large";

/// The HTTP/2 settings of a gRPC connection whose streams `streams` runs.
fn http2_builder(limits: &GrpcLimits, streams: Streams) -> http2::Builder<Streams> {
    let mut builder = http2::Builder::new(streams);
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(MAX_HEADER_LIST)
        .keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT);
    builder
}

/// One gRPC connection being served over `T` (a TCP or TLS stream).
pub(crate) type GrpcConnection<T> = http2::Connection<TokioIo<Tracked<T>>, GrpcRequests, Streams>;

impl<T> Served for GrpcConnection<T>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    fn shut_down_gracefully(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Serves `io` with `requests`.
pub(crate) fn serve<T>(
    builder: &http2::Builder<Streams>,
    io: Tracked<T>,
    requests: GrpcRequests,
) -> GrpcConnection<T>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    builder.serve_connection(TokioIo::new(io), requests)
}

/// One gRPC connection over TLS: the TLS handshake, then HTTP/2 over the
/// decrypted stream. Both run inside the listener's deadlines.
pub(crate) struct TlsGrpcConnection {
    state: TlsState,
}

enum TlsState {
    Handshake {
        accept: Pin<Box<tokio_rustls::Accept<TcpStream>>>,
        builder: http2::Builder<Streams>,
        requests: GrpcRequests,
    },
    Serving(Pin<Box<GrpcConnection<tokio_rustls::server::TlsStream<TcpStream>>>>),
    Closed,
}

impl TlsGrpcConnection {
    /// Starts the TLS handshake on `tcp`, to serve `requests` after it.
    pub(crate) fn new(
        acceptor: &tokio_rustls::TlsAcceptor,
        builder: http2::Builder<Streams>,
        tcp: TcpStream,
        requests: GrpcRequests,
    ) -> Self {
        Self {
            state: TlsState::Handshake {
                accept: Box::pin(acceptor.accept(tcp)),
                builder,
                requests,
            },
        }
    }
}

impl Future for TlsGrpcConnection {
    type Output = Result<(), hyper::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match &mut self.state {
                TlsState::Handshake {
                    accept,
                    builder,
                    requests,
                } => {
                    let tls = match ready!(accept.as_mut().poll(cx)) {
                        Ok(tls) => tls,
                        Err(error) => {
                            // A client that does not speak TLS, or shows no
                            // certificate or one from another CA.
                            tracing::debug!(%error, "TLS handshake failed");
                            requests.invalid.tls_handshake_failures.inc();
                            self.state = TlsState::Closed;
                            return Poll::Ready(Ok(()));
                        }
                    };
                    let activity = requests.activity.clone();
                    let connection = serve(builder, Tracked::new(tls, activity), requests.clone());
                    self.state = TlsState::Serving(Box::pin(connection));
                }
                TlsState::Serving(connection) => return connection.as_mut().poll(cx),
                TlsState::Closed => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl Served for TlsGrpcConnection {
    fn shut_down_gracefully(mut self: Pin<&mut Self>) {
        match &mut self.state {
            // Nothing was asked yet: close at once.
            TlsState::Handshake { .. } => self.state = TlsState::Closed,
            TlsState::Serving(connection) => connection.as_mut().graceful_shutdown(),
            TlsState::Closed => {}
        }
    }
}

/// A gRPC connection of either kind (one listener serves one kind), and
/// its streams, which run in its task (see `streams.rs`).
pub(crate) struct AnyGrpcConnection {
    connection: Either,
    streams: Running,
}

enum Either {
    Plain(Pin<Box<GrpcConnection<TcpStream>>>),
    Tls(TlsGrpcConnection),
}

impl AnyGrpcConnection {
    /// Serves `tcp` under `limits`: over TLS when the listener has an
    /// acceptor.
    pub(crate) fn new(
        tls: Option<tokio_rustls::TlsAcceptor>,
        limits: &GrpcLimits,
        tcp: TcpStream,
        requests: GrpcRequests,
    ) -> Self {
        let streams = Running::default();
        let builder = http2_builder(limits, streams.executor());
        let connection = match tls {
            Some(acceptor) => {
                Either::Tls(TlsGrpcConnection::new(&acceptor, builder, tcp, requests))
            }
            None => {
                let io = Tracked::new(tcp, requests.activity.clone());
                Either::Plain(Box::pin(serve(&builder, io, requests)))
            }
        };
        Self {
            connection,
            streams,
        }
    }
}

impl Future for AnyGrpcConnection {
    type Output = Result<(), hyper::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Self {
            connection,
            streams,
        } = self.get_mut();
        streams.drive(cx, |cx| match connection {
            Either::Plain(connection) => connection.as_mut().poll(cx),
            Either::Tls(connection) => Pin::new(&mut *connection).poll(cx),
        })
    }
}

impl Served for AnyGrpcConnection {
    fn shut_down_gracefully(self: Pin<&mut Self>) {
        match &mut self.get_mut().connection {
            Either::Plain(connection) => connection.as_mut().graceful_shutdown(),
            Either::Tls(connection) => Pin::new(connection).shut_down_gracefully(),
        }
    }
}

/// The requests of one connection: `ShouldRateLimit` by [`rls`], the other
/// services by tonic's routes.
#[derive(Clone)]
pub(crate) struct GrpcRequests {
    routes: Routes,
    rls: RlsService,
    max_request_bytes: usize,
    timeout: Duration,
    invalid: Arc<InvalidRequestCounters>,
    activity: Arc<Activity>,
}

impl GrpcRequests {
    pub(crate) fn new(
        (routes, rls): (Routes, RlsService),
        limits: &GrpcLimits,
        invalid: Arc<InvalidRequestCounters>,
        activity: Arc<Activity>,
    ) -> Self {
        Self {
            routes,
            rls,
            max_request_bytes: limits.max_request_bytes,
            timeout: limits.request_timeout,
            invalid,
            activity,
        }
    }

    async fn answer(mut self, request: Request<Incoming>) -> Response<Body> {
        if !is_grpc(request.headers()) {
            self.invalid.content_type.inc();
            return not_grpc();
        }
        let rls = request.uri().path() == RLS_PATH;
        // The client's own deadline, when shorter, as tonic's server did.
        let timeout = grpc_timeout(request.headers()).map_or(self.timeout, |t| t.min(self.timeout));
        let (routes, invalid) = (&mut self.routes, &*self.invalid);
        let (service, max_request_bytes) = (&self.rls, self.max_request_bytes);
        let call = async move {
            if rls {
                return Ok(rls::answer(service, request, max_request_bytes, invalid).await);
            }
            let request = request.map(Body::new);
            poll_fn(|cx| Service::<Request<Body>>::poll_ready(routes, cx)).await?;
            routes.call(request).await
        };
        let response = match tokio::time::timeout(timeout, call).await {
            Ok(Ok(response)) => response,
            Ok(Err(never)) => match never {},
            Err(_) => {
                self.invalid.timeout.inc();
                return tonic::Status::deadline_exceeded(format!(
                    "the request did not arrive and get an answer within {timeout:?}"
                ))
                .into_http();
            }
        };
        self.classify(response, rls)
    }

    /// Gives a request that could not be read the status that blames the
    /// client, and counts it.
    fn classify(&self, mut response: Response<Body>, rls: bool) -> Response<Body> {
        // A handler's answer carries its status in trailers, not headers:
        // only refusals made before the handler get this far.
        if !response.headers().contains_key("grpc-status") {
            return response;
        }
        let Some(status) = tonic::Status::from_header_map(response.headers()) else {
            return response;
        };
        let message = status.message().as_bytes();
        let code = match status.code() {
            tonic::Code::Internal if DECODE_ERRORS.iter().any(|e| message.starts_with(e)) => {
                self.invalid.decode.inc();
                if rls {
                    self.invalid.rls_invalid_argument.inc();
                }
                tonic::Code::InvalidArgument
            }
            tonic::Code::OutOfRange if message.starts_with(TOO_LARGE) => {
                self.invalid.too_large.inc();
                tonic::Code::ResourceExhausted
            }
            _ => return response,
        };
        response
            .headers_mut()
            .insert("grpc-status", HeaderValue::from(code as i32));
        response
    }
}

impl hyper::service::Service<Request<Incoming>> for GrpcRequests {
    type Response = Response<CountedBody<Body>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let in_flight = self.activity.request();
        let requests = self.clone();
        Box::pin(async move {
            let response = requests.answer(request).await;
            Ok(response.map(|body| CountedBody::new(body, in_flight)))
        })
    }
}

/// The `grpc-timeout` header: at most 8 digits and a unit (`H`, `M`, `S`,
/// `m`, `u`, `n`); `None` when absent or malformed.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3_600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Whether the content-type is gRPC with protobuf messages, the only
/// encoding served.
fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(http::header::CONTENT_TYPE) else {
        return false;
    };
    let value = value.as_bytes();
    let essence = value
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    essence.eq_ignore_ascii_case(b"application/grpc")
        || essence.eq_ignore_ascii_case(b"application/grpc+proto")
}

/// 415, as the gRPC-over-HTTP/2 protocol asks for a content-type that is
/// not gRPC (so that a plain HTTP client does not take a gRPC error answered
/// with HTTP 200 for success), with a gRPC status for gRPC clients too.
fn not_grpc() -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(
        "grpc-status",
        HeaderValue::from(tonic::Code::InvalidArgument as i32),
    );
    headers.insert(
        "grpc-message",
        HeaderValue::from_static("content-type must be application/grpc or application/grpc+proto"),
    );
    response
}

/// tonic's routes for the health and reflection services, each taking
/// messages of at most `max_request_bytes`, and the RLS service that
/// [`rls`] serves beside them.
pub(crate) fn routes<S: crate::store::CounterStore>(
    limiter: Arc<crate::decision::Limiter<S>>,
    response: crate::service::ResponseOptions,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    max_request_bytes: usize,
    rules_gate: Option<tokio::sync::watch::Receiver<bool>>,
) -> Result<(Routes, RlsService), tonic_reflection::server::Error> {
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let routes = Routes::new(health.max_decoding_message_size(max_request_bytes))
        .add_service(
            reflection()
                .build_v1()?
                .max_decoding_message_size(max_request_bytes),
        )
        .add_service(
            reflection()
                .build_v1alpha()?
                .max_decoding_message_size(max_request_bytes),
        );
    let service = crate::service::RateLimitService::with_options(limiter, response);
    let rls: RlsService = match rules_gate {
        Some(loaded) => Arc::new(crate::xds::Gated::new(service, loaded)),
        None => Arc::new(service),
    };
    Ok((routes, rls))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content_type(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, value.parse().unwrap());
        headers
    }

    #[test]
    fn grpc_timeout_headers_are_read_or_ignored() {
        let timeout = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("grpc-timeout", value.parse().unwrap());
            grpc_timeout(&headers)
        };
        assert_eq!(timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(timeout("1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(timeout("5u"), Some(Duration::from_micros(5)));
        for bad in ["", "m", "20", "20x", "123456789S", "-1S"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }

    #[test]
    fn only_grpc_with_protobuf_is_grpc() {
        for ok in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC; charset=utf-8",
        ] {
            assert!(is_grpc(&content_type(ok)), "{ok}");
        }
        for bad in [
            "application/json",
            "application/grpc+json",
            "application/grpc-web",
            "text/plain",
        ] {
            assert!(!is_grpc(&content_type(bad)), "{bad}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }
}
