//! Helpers shared by the test binaries: a limiter over YAML rules with a
//! manual clock, request builders, and an in-process server on 127.0.0.1:0.

#![allow(dead_code)]

pub mod ads;
pub mod certs;
pub mod envoy;
pub mod eventually;
pub mod redis;
pub mod statsd;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use sluice::decision::{Bounds, Limiter};
use sluice::headers::HeaderMode;
use sluice::limiter::{Algorithm, Counting, IdentityBuilder, LimitSpec, ManualClock, Role, Window};
use sluice::proto as pb;
use sluice::proto::RateLimitService as _;
use sluice::rules::{RuleSet, load_paths};
use sluice::server::{self, Listeners};
use sluice::service::RateLimitService;
use sluice::store::{
    BatchItem, CounterStore, MemoryStore, MemoryStoreConfig, RedisStore, RedisStoreConfig,
    RedisUrl, TimeSource,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
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
    /// Starts a server over a memory store on loopback ports chosen by the OS.
    pub async fn start(yaml: &str, headers: HeaderMode) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let store = MemoryStore::new(&MemoryStoreConfig::default(), clock.clone());
        Self::start_with_store(yaml, headers, store, clock).await
    }

    /// Starts a server over `store`; `clock` is what the test moves.
    pub async fn start_with_store<S: CounterStore>(
        yaml: &str,
        headers: HeaderMode,
        store: S,
        clock: Arc<ManualClock>,
    ) -> Self {
        let limiter = Arc::new(Limiter::new(rules(yaml), store, Bounds::default()));
        Self::start_with_limiter(limiter, headers, clock).await
    }

    /// Starts a server over a ready-made limiter.
    pub async fn start_with_limiter<S: CounterStore>(
        limiter: Arc<Limiter<S>>,
        headers: HeaderMode,
        clock: Arc<ManualClock>,
    ) -> Self {
        let options = server::ServeOptions {
            headers,
            ..server::ServeOptions::default()
        };
        Self::start_with_options(limiter, options, clock).await
    }

    /// Starts a server over a ready-made limiter with `options`.
    pub async fn start_with_options<S: CounterStore>(
        limiter: Arc<Limiter<S>>,
        options: server::ServeOptions,
        clock: Arc<ManualClock>,
    ) -> Self {
        Self::start_with_extras(limiter, options, server::ServeExtras::default(), clock).await
    }

    /// Starts a server over a ready-made limiter with `options` and `extras`.
    pub async fn start_with_extras<S: CounterStore>(
        limiter: Arc<Limiter<S>>,
        options: server::ServeOptions,
        extras: server::ServeExtras,
        clock: Arc<ManualClock>,
    ) -> Self {
        let listeners = Listeners::bind(([127, 0, 0, 1], 0).into(), ([127, 0, 0, 1], 0).into())
            .await
            .expect("bind loopback");
        let (grpc, http) = (
            listeners.grpc_addr().unwrap(),
            listeners.http_addr().unwrap(),
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server::run_with(
            limiter,
            options,
            extras,
            listeners,
            shutdown.clone(),
        ));
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

    /// A gRPC channel to the server.
    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(self.uri())
            .unwrap()
            .connect()
            .await
            .expect("connect")
    }

    /// The names of the services the server lists through gRPC reflection.
    pub async fn reflected_services(&self) -> Vec<String> {
        use tokio_stream::StreamExt as _;
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
        use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

        let mut client = ServerReflectionClient::new(self.channel().await);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut replies = client
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .unwrap()
            .into_inner();
        let reply: ServerReflectionResponse = replies.next().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
            panic!("unexpected reply {reply:?}")
        };
        list.service.into_iter().map(|s| s.name).collect()
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

/// The `sluice` binary, killed when dropped so a failing test leaves nothing
/// behind.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `sluice serve` with `args` on loopback port 0 and returns it with
/// the gRPC address it logged.
pub fn start_binary(args: &[&str]) -> (Process, String) {
    let (process, grpc, _) = start_binary_with_http(args);
    (process, grpc)
}

/// As [`start_binary`], also returning the admin HTTP address.
pub fn start_binary_with_http(args: &[&str]) -> (Process, String, SocketAddr) {
    let mut child = serve_command(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sluice");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let process = Process(child);
    for line in lines.by_ref() {
        if let Some((grpc, http)) = listening(&line.expect("read log")) {
            // Keep draining the log so the server never blocks on a full pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return (process, grpc, http);
        }
    }
    panic!("sluice exited before listening");
}

/// `sluice serve` on free loopback ports with `args`, `RUST_LOG` unset.
pub fn serve_command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .args(args)
        .env_remove("RUST_LOG");
    command
}

/// The gRPC and admin HTTP addresses of the log line that announces them.
pub fn listening(line: &str) -> Option<(String, SocketAddr)> {
    let after = |key: &str| line.split(key).nth(1)?.split_whitespace().next();
    let grpc = after("grpc=")?.to_owned();
    let http = after("http=")
        .expect("the http address is logged with the grpc one")
        .parse()
        .expect("an address");
    Some((grpc, http))
}

/// A symlink named `ratelimit` in `dir` to the `sluice` binary: the image
/// ships `/bin/ratelimit` that way, and the name selects upstream's
/// settings.
pub fn ratelimit_binary(dir: &std::path::Path) -> std::path::PathBuf {
    let binary = dir.join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &binary).expect("symlink ratelimit");
    binary
}

/// Polls `path` on `addr` until it answers `status`; returns the body of
/// that answer.
pub fn wait_for_http(addr: SocketAddr, path: &str, status: u16) -> String {
    eventually::eventually(&format!("{addr}{path} to answer {status}"), || {
        // Not listening yet: try again.
        let (got, body) = if std::net::TcpStream::connect(addr).is_ok() {
            let (got, _, body) = http_exchange(addr, "GET", path, "");
            (got, body)
        } else {
            (0, String::new())
        };
        if got == status {
            Ok(body)
        } else {
            Err(format!("{got}: {body}"))
        }
    })
}

/// A key prefix no other test in this process uses, so tests can share one
/// Redis without flushing it.
pub fn unique_prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "test:{}:{}:",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A Redis store on `url` with its own key prefix.
pub async fn redis_store(
    url: &str,
    clock: Arc<ManualClock>,
    time: TimeSource,
    timeout: Duration,
) -> RedisStore {
    redis_store_sharing(url, clock, time, timeout, &unique_prefix()).await
}

/// A Redis store on `url` under `prefix`: stores given one prefix share
/// their keys, as replicas of one deployment do.
pub async fn redis_store_sharing(
    url: &str,
    clock: Arc<ManualClock>,
    time: TimeSource,
    timeout: Duration,
    prefix: &str,
) -> RedisStore {
    connect_redis_store(url, clock, time, timeout, prefix, true).await
}

/// A Redis store on `url` that gives every request a script call of its
/// own (`redis_coalesce` off: no coalescing, no batching).
pub async fn redis_store_call_per_request(
    url: &str,
    clock: Arc<ManualClock>,
    time: TimeSource,
    timeout: Duration,
) -> RedisStore {
    connect_redis_store(url, clock, time, timeout, &unique_prefix(), false).await
}

async fn connect_redis_store(
    url: &str,
    clock: Arc<ManualClock>,
    time: TimeSource,
    timeout: Duration,
    prefix: &str,
    coalesce: bool,
) -> RedisStore {
    let config = RedisStoreConfig {
        tls: sluice::store::RedisTls::default(),
        per_second_url: None,
        coalesce,
        url: RedisUrl::new(url),
        pool_size: 2,
        timeout,
        breaker: None,
        key_prefix: prefix.to_owned(),
        time,
    };
    RedisStore::connect(&config, clock, Duration::from_secs(10))
        .await
        .expect("connect to the test Redis")
}

/// One HTTP/1.1 exchange: `(status code, head, body)`, the head (status line
/// and headers) lowercased; status 0 when no status line came back.
pub fn http_exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String, String) {
    http_exchange_with(addr, method, path, &[], body)
}

/// [`http_exchange`] with `headers` besides the usual ones.
pub fn http_exchange_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the HTTP port");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_lowercase(), body.to_owned())
}

/// One HTTP/1.1 request to the admin port: `(status code, body)`.
pub fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let (status, _, body) = http_exchange(addr, method, path, body);
    assert_ne!(status, 0, "no status line from {addr}{path}");
    (status, body)
}

/// One HTTP/1.1 request carrying `headers` besides the usual ones (an
/// `Authorization`, say): `(status code, body)`.
pub fn http_with_headers(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let (status, _, body) = http_exchange_with(addr, method, path, headers, body);
    assert_ne!(status, 0, "no status line from {addr}{path}");
    (status, body)
}

/// The admin port's `/rlqs` page at `addr`, as JSON (fetched off the async
/// runtime).
pub async fn rlqs_page(addr: SocketAddr) -> serde_json::Value {
    let (status, body) = tokio::task::spawn_blocking(move || http(addr, "GET", "/rlqs", ""))
        .await
        .unwrap();
    assert_eq!(status, 200);
    serde_json::from_str(&body).expect("JSON")
}

/// A limit of `requests` a minute, counted in a sliding window of 1 s
/// buckets.
/// A store item: `hits` on the counter of `id=<name>` in `domain` under
/// `limit`, enforcing, counted only when admitted.
pub fn enforcing(domain: &str, name: &str, limit: LimitSpec, hits: u64) -> BatchItem {
    let mut identity = IdentityBuilder::new(domain);
    identity.value("id", name);
    BatchItem {
        identity: identity.build(),
        limits: vec![limit],
        hits,
        role: Role::Enforce,
        counting: Counting::Admitted,
        refund: false,
    }
}

/// `requests` per `duration_ms` counted by `algorithm`, without a penalty.
pub fn limit(requests: u64, duration_ms: u64, algorithm: Algorithm) -> LimitSpec {
    LimitSpec {
        requests,
        window: Window {
            duration_ms,
            algorithm,
        },
        penalty: None,
    }
}

/// A sliding window in buckets of `precision_ms`.
pub fn sliding(requests: u64, duration_ms: u64, precision_ms: u64) -> LimitSpec {
    limit(
        requests,
        duration_ms,
        Algorithm::SlidingWindow { precision_ms },
    )
}

pub fn fixed(requests: u64, duration_ms: u64) -> LimitSpec {
    limit(requests, duration_ms, Algorithm::FixedWindow)
}

/// A token bucket of `requests` tokens per `duration_ms` and a burst.
pub fn bucket(requests: u64, duration_ms: u64, burst: u64) -> LimitSpec {
    limit(requests, duration_ms, Algorithm::TokenBucket { burst })
}

pub fn per_minute(requests: u64) -> LimitSpec {
    sliding(requests, 60_000, 1_000)
}

/// A request built with Envoy's own published protos (`envoy-types`), so
/// tests check our `proto/` against the real wire contract.
pub fn envoy_request(
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor::Entry,
    };
    envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}
