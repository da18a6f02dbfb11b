//! Serving one admin HTTP/1.1 connection: the request head must arrive
//! within the handshake timeout, and each request within the request
//! timeout.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tonic::codegen::Service;

use super::conn::{Activity, CountedBody, Served, Tracked};

/// The HTTP/1.1 settings of every admin connection.
pub(crate) fn http1_builder(header_read_timeout: Duration) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(true);
    builder
}

/// One admin connection being served.
pub(crate) type HttpConnection = http1::Connection<TokioIo<Tracked<TcpStream>>, HttpRequests>;

impl Served for HttpConnection {
    fn shut_down_gracefully(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Serves `io` with `requests`.
pub(crate) fn serve(
    builder: &http1::Builder,
    io: Tracked<TcpStream>,
    requests: HttpRequests,
) -> HttpConnection {
    builder.serve_connection(TokioIo::new(io), requests)
}

/// The requests of one admin connection, answered by the admin router.
#[derive(Clone)]
pub(crate) struct HttpRequests {
    router: Router,
    timeout: Duration,
    activity: Arc<Activity>,
    /// The client's address, given to handlers as axum's `ConnectInfo`
    /// (the audit lines of `/overrides` name it).
    peer: Option<SocketAddr>,
}

impl HttpRequests {
    pub(crate) fn new(
        router: Router,
        timeout: Duration,
        activity: Arc<Activity>,
        peer: Option<SocketAddr>,
    ) -> Self {
        Self {
            router,
            timeout,
            activity,
            peer,
        }
    }

    async fn answer(mut self, mut request: Request<Incoming>) -> Response<Body> {
        if let Some(peer) = self.peer {
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
        }
        let router = &mut self.router;
        let call = async move {
            poll_fn(|cx| Service::<Request<Incoming>>::poll_ready(router, cx)).await?;
            router.call(request).await
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(response)) => response,
            Ok(Err(never)) => match never {},
            Err(_) => {
                let mut response = Response::new(Body::from("request timeout\n"));
                *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
                response.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
                response
            }
        }
    }
}

impl hyper::service::Service<Request<Incoming>> for HttpRequests {
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
