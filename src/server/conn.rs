//! Accepting and bounding connections, for both listeners: a cap on open
//! connections (refused clearly beyond it), a deadline for the handshake,
//! an idle timeout, and a maximum age after which a connection is asked to
//! go away so that clients rebalance onto other replicas.
//!
//! Everything here waits on the socket or on timers and never polls: a
//! silent connection costs one sleeping task, its socket and a permit.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::telemetry::metrics::ConnectionCounters;

/// How one listener bounds its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most connections open at once; beyond it new ones are refused.
    pub max_connections: u32,
    /// How long a new connection may take to send its first request bytes
    /// (the HTTP/2 preface, or an HTTP/1 request head).
    pub handshake_timeout: Duration,
    /// How long a connection may stay open without a request in flight.
    pub idle_timeout: Duration,
    /// After this long a connection is asked to go away (HTTP/2 GOAWAY, or
    /// `Connection: close`); `None` lets connections live forever.
    pub max_age: Option<Duration>,
    /// Then, how long its requests in flight may take before it is closed.
    pub max_age_grace: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_age: None,
            max_age_grace: Duration::from_secs(30),
        }
    }
}

/// A connection being served (hyper's HTTP/1 or HTTP/2 connection).
pub(crate) trait Served: Future<Output = Result<(), hyper::Error>> + Send {
    /// Stop taking requests, finish those in flight, then close.
    fn shut_down_gracefully(self: Pin<&mut Self>);
}

/// One listener's rules: its limits, its metrics, what it answers to a
/// connection over the cap, and how many bytes make a handshake.
pub(crate) struct Listener {
    /// `grpc` or `http`, for logs.
    pub name: &'static str,
    pub limits: ConnLimits,
    pub counters: ConnectionCounters,
    /// Written (best effort, never waited for) to a connection refused
    /// because the listener is full, before closing it; empty for a TLS
    /// listener, whose clients expect a TLS record first.
    pub refusal: &'static [u8],
    /// Bytes a client must have sent by the handshake deadline.
    pub handshake_bytes: u64,
    /// After shutdown starts, how long connections may take to finish.
    pub shutdown_grace: Duration,
}

/// Accepts on `socket` until `closing` is cancelled, serving each
/// connection with `serve` in its own task (which must read through
/// [`Tracked`], so that the handshake deadline sees the bytes); then waits until every
/// connection has closed (each is told to finish at once, and is closed
/// after `shutdown_grace` at the latest).
pub(crate) async fn accept<C, F>(
    socket: TcpListener,
    listener: Listener,
    closing: CancellationToken,
    serve: F,
) where
    C: Served + 'static,
    F: Fn(TcpStream, Arc<Activity>) -> C,
{
    let listener = Arc::new(listener);
    let permits = Arc::new(Semaphore::new(listener.limits.max_connections as usize));
    loop {
        let stream = tokio::select! {
            () = closing.cancelled() => break,
            accepted = socket.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(listener.name, &e).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            listener.counters.refused.inc();
            // Never wait on a refused client: one write attempt, then close.
            if !listener.refusal.is_empty() {
                let _ = stream.try_write(listener.refusal);
            }
            continue;
        };
        // Decisions are small and latency-bound: never let Nagle hold a
        // reply back.
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let connection = serve(stream, activity.clone());
        let (listener, closing) = (listener.clone(), closing.clone());
        tokio::spawn(async move {
            // Taken down when the task ends, even by a panic (which would
            // also release the permit, as it drops it).
            let _open = Open::count(&listener.counters.open);
            drive(connection, &activity, &listener, &closing).await;
            drop(permit);
        });
    }
    // Stop listening at once: new clients are refused by the kernel rather
    // than left waiting in the backlog.
    drop(socket);
    let _ = permits
        .acquire_many(listener.limits.max_connections)
        .await
        .map(drop);
}

/// One connection counted in its listener's open gauge while this lives.
struct Open<'a>(&'a Gauge);

impl<'a> Open<'a> {
    fn count(gauge: &'a Gauge) -> Self {
        gauge.inc();
        Open(gauge)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// After a failed accept: per-connection errors (the client already left)
/// are ignored; running out of file descriptors or memory would fail again
/// at once, so wait a little instead of spinning on a full core.
async fn accept_failed(listener: &str, error: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted, WouldBlock};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
    ) {
        return;
    }
    tracing::warn!(listener, %error, "accepting a connection failed; retrying in 100 ms");
    sleep(Duration::from_millis(100)).await;
}

/// Serves one connection to its end, closing it when it misses the
/// handshake deadline, asking it to go away when idle, too old or at
/// shutdown, and closing it if it has not gone after the grace period.
async fn drive<C: Served>(
    connection: C,
    activity: &Activity,
    listener: &Listener,
    closing: &CancellationToken,
) {
    let limits = &listener.limits;
    let mut connection = pin!(connection);
    let mut handshake = pin!(sleep(limits.handshake_timeout));
    let mut handshake_checked = false;
    let mut age = pin!(async {
        match limits.max_age {
            // ±10%, so connections opened together (a fleet of Envoys
            // restarted at once) do not all reconnect at once.
            Some(age) => sleep(age.mul_f64(rand::random_range(0.9..1.1))).await,
            None => std::future::pending().await,
        }
    });
    let mut force = pin!(sleep(Duration::ZERO));
    let mut draining = false;
    loop {
        let grace = tokio::select! {
            result = &mut connection => {
                if let Err(e) = result {
                    // hyper's own header read timeout, as long as ours,
                    // may close a silent HTTP/1 connection first.
                    if e.is_timeout() && !handshake_checked {
                        listener.counters.handshake_timeout.inc();
                    }
                    tracing::debug!(listener = listener.name, error = %e, "connection ended with an error");
                }
                return;
            }
            () = &mut handshake, if !handshake_checked => {
                handshake_checked = true;
                if activity.bytes_read() < listener.handshake_bytes {
                    listener.counters.handshake_timeout.inc();
                    tracing::debug!(listener = listener.name, "closing a connection that sent no handshake in time");
                    return;
                }
                continue;
            }
            () = activity.idle(limits.idle_timeout), if !draining => {
                listener.counters.idle_timeout.inc();
                limits.max_age_grace
            }
            () = &mut age, if !draining => {
                listener.counters.max_age.inc();
                limits.max_age_grace
            }
            () = closing.cancelled(), if !draining => listener.shutdown_grace,
            () = &mut force, if draining => {
                tracing::debug!(listener = listener.name, "closing a connection still busy after its grace period");
                return;
            }
        };
        draining = true;
        connection.as_mut().shut_down_gracefully();
        force.as_mut().reset(Instant::now() + grace);
    }
}

/// What a connection is doing, shared by its IO, its requests and its
/// driver. Atomics and a short lock: requests on many threads update it.
pub(crate) struct Activity {
    /// Bytes received so far, for the handshake deadline.
    read: AtomicU64,
    /// Requests in flight (a response body still streaming counts).
    open: AtomicUsize,
    /// When the last request in flight finished (or the connection opened).
    idle_since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Self {
            read: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }
    }

    fn bytes_read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// Marks a request in flight until the guard is dropped.
    pub(crate) fn request(self: &Arc<Self>) -> InFlight {
        self.open.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// Completes once no request has been in flight for `timeout`. Sleeps
    /// in between: a busy connection is looked at once per `timeout`.
    async fn idle(&self, timeout: Duration) {
        loop {
            let wake = if self.open.load(Ordering::Acquire) == 0 {
                *self.idle_since.lock() + timeout
            } else {
                Instant::now() + timeout
            };
            if wake <= Instant::now() && self.open.load(Ordering::Acquire) == 0 {
                return;
            }
            sleep_until(wake).await;
        }
    }
}

/// A request in flight on a connection.
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.0.idle_since.lock() = Instant::now();
        }
    }
}

/// A socket that counts the bytes it receives. Over TLS it wraps the
/// decrypted stream, so a client must finish the TLS handshake and send
/// its HTTP/2 preface within the handshake deadline.
pub(crate) struct Tracked<T> {
    io: T,
    activity: Arc<Activity>,
}

impl<T> Tracked<T> {
    pub(crate) fn new(io: T, activity: Arc<Activity>) -> Self {
        Self { io, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        if read > 0 {
            self.activity.read.fetch_add(read, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A response body that keeps its request counted as in flight until it
/// has been sent (or dropped): a health Watch stream is not idle.
pub(crate) struct CountedBody<B> {
    inner: B,
    _in_flight: InFlight,
}

impl<B> CountedBody<B> {
    pub(crate) fn new(inner: B, in_flight: InFlight) -> Self {
        Self {
            inner,
            _in_flight: in_flight,
        }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// What a full gRPC listener writes before closing: the server's HTTP/2
/// SETTINGS, then GOAWAY (last stream 0: nothing was processed, a retry is
/// safe) with REFUSED_STREAM and a reason gRPC clients log.
pub(crate) const GRPC_REFUSAL: &[u8] = &{
    const REASON: &[u8] = b"sluice: connection limit reached";
    const LEN: usize = 9 + 9 + 8 + REASON.len();
    let mut frame = [0u8; LEN];
    // SETTINGS, empty: length 0, type 4, flags 0, stream 0.
    frame[3] = 0x4;
    // GOAWAY: length, type 7, flags 0, stream 0.
    let len = 8 + REASON.len();
    frame[9 + 2] = len as u8;
    frame[9 + 3] = 0x7;
    // Last stream id 0 (bytes 18..22), error code REFUSED_STREAM (0x7).
    frame[25] = 0x7;
    let mut i = 0;
    while i < REASON.len() {
        frame[26 + i] = REASON[i];
        i += 1;
    }
    frame
};

/// What a full admin listener writes before closing.
pub(crate) const HTTP_REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: text/plain\r\ncontent-length: 33\r\nconnection: close\r\n\r\n\
sluice: connection limit reached\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_http_refusal_declares_its_length() {
        let text = std::str::from_utf8(HTTP_REFUSAL).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        assert_eq!(body.len(), 33);
    }

    #[test]
    fn the_grpc_refusal_is_settings_then_goaway() {
        let (settings, goaway) = GRPC_REFUSAL.split_at(9);
        assert_eq!(settings, [0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let len = u32::from_be_bytes([0, goaway[0], goaway[1], goaway[2]]) as usize;
        assert_eq!((goaway[3], len, goaway.len() - 9), (7, len, len));
        assert_eq!(&goaway[9..13], [0, 0, 0, 0], "last stream id");
        assert_eq!(&goaway[13..17], [0, 0, 0, 7], "REFUSED_STREAM");
        assert_eq!(&goaway[17..], b"sluice: connection limit reached");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_without_requests_in_flight() {
        let activity = Arc::new(Activity::new());
        let request = activity.request();
        let idle = activity.idle(Duration::from_secs(60));
        tokio::pin!(idle);
        // Paused time jumps ahead whenever everything waits: a request in
        // flight keeps the connection busy however long it takes.
        tokio::select! {
            () = &mut idle => panic!("idle with a request in flight"),
            () = sleep(Duration::from_secs(600)) => {}
        }
        drop(request);
        let finished = Instant::now();
        idle.await;
        assert_eq!(Instant::now() - finished, Duration::from_secs(60));
    }
}
