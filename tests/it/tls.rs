//! TLS and mutual TLS on the gRPC listener, as Envoy Gateway deploys it,
//! with the certificates and hand-made rustls clients of `support::certs`
//! (a test sees which certificate the server showed and how many
//! connections a channel opened); and `sluice query` speaking TLS and mutual
//! TLS to it, with a clear error for a wrong CA or a missing certificate.

use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rustls::ClientConfig;
use rustls_pki_types::CertificateDer;
use sluice::decision::{Bounds, Limiter};
use sluice::limiter::ManualClock;
use sluice::server::{self, ConnLimits, Listeners, ServeOptions, TlsFiles};
use sluice::store::{MemoryStore, MemoryStoreConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

use support::certs::{Ca, Leaf, channel, client_config, handshake};
use support::{OK, request, rules};

const RULES: &str = r#"
domain: tls
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

/// How long a rotation may take to be seen (the server looks every 2 s).
const ROTATION_DEADLINE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------- files

/// A directory of TLS files laid out as a Kubernetes Secret volume:
/// `tls.crt` → `..data/tls.crt`, `..data` → a timestamped directory.
struct SecretVolume {
    dir: tempfile::TempDir,
    generation: usize,
}

impl SecretVolume {
    fn new(leaf: &Leaf, ca: Option<&Ca>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut volume = Self { dir, generation: 0 };
        volume.swap(leaf, ca);
        for name in ["tls.crt", "tls.key", "ca.crt"] {
            std::os::unix::fs::symlink(Path::new("..data").join(name), volume.path(name)).unwrap();
        }
        volume
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn files(&self, mutual: bool) -> TlsFiles {
        TlsFiles {
            cert: self.path("tls.crt"),
            key: self.path("tls.key"),
            ca: mutual.then(|| self.path("ca.crt")),
        }
    }

    /// Writes a new generation and points `..data` at it with one rename.
    fn swap(&mut self, leaf: &Leaf, ca: Option<&Ca>) {
        self.generation += 1;
        let generation = format!("..{}", self.generation);
        let target = self.path(&generation);
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("tls.crt"), &leaf.cert_pem).unwrap();
        std::fs::write(target.join("tls.key"), &leaf.key_pem).unwrap();
        let ca = ca.map(Ca::pem).unwrap_or_default();
        std::fs::write(target.join("ca.crt"), ca).unwrap();
        let link = self.path("..data_tmp");
        std::os::unix::fs::symlink(&generation, &link).unwrap();
        std::fs::rename(&link, self.path("..data")).unwrap();
    }
}

/// Plain files: `tls.crt` and `tls.key`.
fn plain_files(dir: &Path, leaf: &Leaf) -> TlsFiles {
    std::fs::write(dir.join("tls.crt"), &leaf.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &leaf.key_pem).unwrap();
    TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        ca: None,
    }
}

/// Replaces `path` with `contents` by an atomic rename, as a careful
/// deployment tool does.
fn replace(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

// ---------------------------------------------------------------- server

struct Running {
    grpc: SocketAddr,
    http: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), server::ServeError>>,
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().expect("server stopped cleanly");
    }

    /// The value of a metric series on `/metrics`, or 0 when absent.
    async fn metric(&self, series: &str) -> u64 {
        let http = self.http;
        let (_, body) =
            tokio::task::spawn_blocking(move || support::http(http, "GET", "/metrics", ""))
                .await
                .unwrap();
        body.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0)
    }
}

fn options() -> ServeOptions {
    ServeOptions::default()
}

async fn serve(files: TlsFiles, options: ServeOptions) -> Running {
    let clock = Arc::new(ManualClock::new(support::T0));
    let store = MemoryStore::new(&MemoryStoreConfig::default(), clock);
    let limiter = Arc::new(Limiter::new(rules(RULES), store, Bounds::default()));
    let listeners = Listeners::bind(([127, 0, 0, 1], 0).into(), ([127, 0, 0, 1], 0).into())
        .await
        .unwrap()
        .with_grpc_tls(files);
    let (grpc, http) = (
        listeners.grpc_addr().unwrap(),
        listeners.http_addr().unwrap(),
    );
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server::run(limiter, options, listeners, shutdown.clone()));
    Running {
        grpc,
        http,
        shutdown,
        task,
    }
}

// ---------------------------------------------------------------- clients

/// The certificate the server at `addr` shows to a new connection.
async fn shown_certificate(addr: SocketAddr, config: Arc<ClientConfig>) -> CertificateDer<'static> {
    let tls = handshake(addr, config).await.expect("TLS handshake");
    let (_, session) = tls.get_ref();
    session.peer_certificates().unwrap()[0].clone().into_owned()
}

/// One ShouldRateLimit call.
async fn should_rate_limit(channel: &Channel) -> Result<i32, tonic::Status> {
    use sluice::proto::RateLimitServiceClient;
    let mut client = RateLimitServiceClient::new(channel.clone());
    let reply = client
        .should_rate_limit(request("tls", &[&[("client", "a")]]))
        .await?;
    Ok(reply.into_inner().overall_code)
}

/// Whether a client with `config` gets a ShouldRateLimit answer.
async fn answered(addr: SocketAddr, config: Arc<ClientConfig>) -> bool {
    match channel(addr, config).await {
        Ok((channel, _)) => should_rate_limit(&channel).await.is_ok(),
        Err(_) => false,
    }
}

/// Polls new connections until the server shows `expected`.
async fn await_certificate(addr: SocketAddr, config: Arc<ClientConfig>, expected: &Leaf) {
    let deadline = tokio::time::Instant::now() + ROTATION_DEADLINE;
    loop {
        // A client trusting only a new CA refuses the old certificate.
        if let Ok(tls) = handshake(addr, config.clone()).await
            && tls.get_ref().1.peer_certificates().unwrap()[0] == expected.der
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server still shows the old certificate"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn tls_serves_should_rate_limit_health_and_reflection() {
    let ca = Ca::new("test-ca");
    let leaf = ca.leaf();
    let dir = tempfile::tempdir().unwrap();
    let server = serve(plain_files(dir.path(), &leaf), options()).await;
    let config = client_config(&ca, None);

    assert_eq!(
        shown_certificate(server.grpc, config.clone()).await,
        leaf.der
    );
    let tls = handshake(server.grpc, config.clone()).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    drop(tls);

    let (channel, _) = channel(server.grpc, config).await.unwrap();
    assert_eq!(should_rate_limit(&channel).await.unwrap(), OK);

    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);

    use tokio_stream::StreamExt as _;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let list = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let reply = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter([list]))
        .await
        .unwrap()
        .into_inner()
        .next()
        .await
        .unwrap()
        .unwrap();
    let Some(MessageResponse::ListServicesResponse(services)) = reply.message_response else {
        panic!("unexpected reflection reply {reply:?}");
    };
    assert!(
        services
            .service
            .iter()
            .any(|s| s.name == "envoy.service.ratelimit.v3.RateLimitService"),
        "{services:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_plaintext_client_gets_no_answer() {
    let ca = Ca::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let server = serve(plain_files(dir.path(), &ca.leaf()), options()).await;
    let plaintext = async {
        let channel = Endpoint::from_shared(format!("http://{}", server.grpc))
            .unwrap()
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        should_rate_limit(&channel).await
    };
    assert!(plaintext.await.is_err());
    // The listener still serves TLS clients afterwards.
    assert!(answered(server.grpc, client_config(&ca, None)).await);
    server.stop().await;
}

#[tokio::test]
async fn pkcs1_and_pkcs8_rsa_keys_and_sec1_ec_keys_all_load() {
    let ca = Ca::new("test-ca");
    for (kind, leaf) in [
        ("PKCS#1 RSA", ca.rsa_leaf(true)),
        ("PKCS#8 RSA", ca.rsa_leaf(false)),
        ("SEC1 EC", ca.sec1_leaf()),
        ("PKCS#8 EC", ca.leaf()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let server = serve(plain_files(dir.path(), &leaf), options()).await;
        let config = client_config(&ca, None);
        assert_eq!(
            shown_certificate(server.grpc, config.clone()).await,
            leaf.der,
            "{kind}"
        );
        assert!(answered(server.grpc, config).await, "{kind}");
        server.stop().await;
    }
}

#[tokio::test]
async fn bad_files_at_start_are_an_error_naming_the_file() {
    let ca = Ca::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let good = plain_files(dir.path(), &ca.leaf());
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a PEM file").unwrap();
    let other_key = dir.path().join("other.key");
    std::fs::write(&other_key, ca.leaf().key_pem).unwrap();
    let missing = dir.path().join("missing.pem");
    let cases = [
        (
            TlsFiles {
                key: garbage.clone(),
                ..good.clone()
            },
            &garbage,
        ),
        (
            TlsFiles {
                cert: garbage.clone(),
                ..good.clone()
            },
            &garbage,
        ),
        (
            TlsFiles {
                cert: missing.clone(),
                ..good.clone()
            },
            &missing,
        ),
        (
            TlsFiles {
                ca: Some(garbage.clone()),
                ..good.clone()
            },
            &garbage,
        ),
        (
            TlsFiles {
                key: other_key.clone(),
                ..good.clone()
            },
            &other_key,
        ),
    ];
    for (files, named) in cases {
        let server = serve(files.clone(), options()).await;
        let error = server
            .task
            .await
            .unwrap()
            .expect_err("the server must not start");
        let message = error.to_string();
        assert!(
            message.contains(&named.display().to_string()),
            "{files:?}: {message}"
        );
    }
}

/// The series of refused TLS handshakes on the gRPC port.
const HANDSHAKE_FAILURES: &str = r#"sluice_tls_handshake_failures_total{listener="grpc"}"#;

/// Waits until `server` has counted a refused handshake (the client may see
/// the refusal before the server's task counts it).
async fn await_handshake_failure(server: &Running) {
    let deadline = tokio::time::Instant::now() + ROTATION_DEADLINE;
    while server.metric(HANDSHAKE_FAILURES).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refused handshake was not counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server with mutual TLS against `ca`, its CA and volume.
async fn mutual(ca: &Ca) -> (Running, SecretVolume) {
    let volume = SecretVolume::new(&ca.leaf(), Some(ca));
    let server = serve(volume.files(true), options()).await;
    (server, volume)
}

#[tokio::test]
async fn with_a_ca_a_client_certificate_from_it_is_accepted() {
    let ca = Ca::new("envoy-gateway");
    let (server, _volume) = mutual(&ca).await;
    // Envoy's certificate as Envoy Gateway makes it: RSA, PKCS#1, no
    // extended key usage, and a one-label wildcard for its namespace.
    let envoy = ca.rsa_leaf_for("*.envoy-gateway-system", true);
    assert!(answered(server.grpc, client_config(&ca, Some(&envoy))).await);
    assert_eq!(server.metric(HANDSHAKE_FAILURES).await, 0);
    server.stop().await;
}

#[tokio::test]
async fn with_a_ca_a_client_without_a_certificate_is_refused() {
    let ca = Ca::new("envoy-gateway");
    let (server, _volume) = mutual(&ca).await;
    assert!(!answered(server.grpc, client_config(&ca, None)).await);
    await_handshake_failure(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn with_a_ca_a_client_certificate_from_another_ca_is_refused() {
    let ca = Ca::new("envoy-gateway");
    let (server, _volume) = mutual(&ca).await;
    let stranger = Ca::new("someone-else").leaf();
    assert!(!answered(server.grpc, client_config(&ca, Some(&stranger))).await);
    await_handshake_failure(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn an_atomic_rename_rotates_the_certificate_for_new_connections_only() {
    let ca = Ca::new("test-ca");
    let (old, new) = (ca.leaf(), ca.leaf());
    let dir = tempfile::tempdir().unwrap();
    let files = plain_files(dir.path(), &old);
    let server = serve(files.clone(), options()).await;
    let config = client_config(&ca, None);
    let (open, opened) = channel(server.grpc, config.clone()).await.unwrap();
    assert_eq!(should_rate_limit(&open).await.unwrap(), OK);

    // Key first, then certificate: in between the pair does not match, which
    // must not break anything either.
    replace(&files.key, &new.key_pem);
    replace(&files.cert, &new.cert_pem);
    await_certificate(server.grpc, config, &new).await;

    assert_eq!(should_rate_limit(&open).await.unwrap(), OK);
    assert_eq!(
        opened.load(Ordering::SeqCst),
        1,
        "the open connection was kept"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_secret_volume_symlink_swap_rotates_certificate_and_ca() {
    let (ca, next_ca) = (Ca::new("ca-1"), Ca::new("ca-2"));
    let mut volume = SecretVolume::new(&ca.leaf(), Some(&ca));
    let server = serve(volume.files(true), options()).await;
    let old_client = client_config(&ca, Some(&ca.leaf()));
    let (open, opened) = channel(server.grpc, old_client.clone()).await.unwrap();
    assert_eq!(should_rate_limit(&open).await.unwrap(), OK);

    let new = next_ca.leaf();
    volume.swap(&new, Some(&next_ca));
    let new_client = client_config(&next_ca, Some(&next_ca.leaf()));
    await_certificate(server.grpc, new_client.clone(), &new).await;

    assert!(answered(server.grpc, new_client).await);
    assert!(
        !answered(server.grpc, old_client).await,
        "new handshakes check client certificates against the new CA"
    );
    assert_eq!(should_rate_limit(&open).await.unwrap(), OK);
    assert_eq!(
        opened.load(Ordering::SeqCst),
        1,
        "the open connection was kept"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_broken_replacement_keeps_the_certificate_in_force() {
    let ca = Ca::new("test-ca");
    let old = ca.leaf();
    let dir = tempfile::tempdir().unwrap();
    let files = plain_files(dir.path(), &old);
    let server = serve(files.clone(), options()).await;
    let errors = r#"sluice_tls_reloads_total{result="error"}"#;
    assert_eq!(server.metric(errors).await, 0);

    replace(
        &files.key,
        "-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n",
    );
    let deadline = tokio::time::Instant::now() + ROTATION_DEADLINE;
    while server.metric(errors).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the broken key was never noticed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let config = client_config(&ca, None);
    assert_eq!(
        shown_certificate(server.grpc, config.clone()).await,
        old.der
    );
    assert!(answered(server.grpc, config.clone()).await);

    // A good pair afterwards is taken.
    let new = ca.leaf();
    replace(&files.key, &new.key_pem);
    replace(&files.cert, &new.cert_pem);
    await_certificate(server.grpc, config, &new).await;
    assert!(
        server
            .metric(r#"sluice_tls_reloads_total{result="success"}"#)
            .await
            >= 1
    );
    server.stop().await;
}

#[tokio::test]
async fn the_tls_handshake_and_preface_count_inside_the_handshake_deadline() {
    let ca = Ca::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let mut options = options();
    options.grpc_connections = ConnLimits {
        handshake_timeout: Duration::from_millis(200),
        ..options.grpc_connections
    };
    let server = serve(plain_files(dir.path(), &ca.leaf()), options).await;
    // Hundreds of bytes of TLS handshake, then silence: no HTTP/2 preface.
    let mut tls = handshake(server.grpc, client_config(&ca, None))
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the silent TLS connection was not closed");
    let closed_by_deadline =
        r#"sluice_connections_closed_total{listener="grpc",reason="handshake_timeout"}"#;
    assert_eq!(server.metric(closed_by_deadline).await, 1);
    let _ = tls.shutdown().await;
    server.stop().await;
}

#[tokio::test]
async fn a_full_tls_listener_closes_new_connections_without_a_plaintext_refusal() {
    let ca = Ca::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let mut options = options();
    options.grpc_connections.max_connections = 1;
    let server = serve(plain_files(dir.path(), &ca.leaf()), options).await;
    let (open, _) = channel(server.grpc, client_config(&ca, None))
        .await
        .unwrap();
    assert_eq!(should_rate_limit(&open).await.unwrap(), OK);

    let mut refused = TcpStream::connect(server.grpc).await.unwrap();
    let mut received = Vec::new();
    // Closed at once; a reset instead of an orderly close also ends it.
    let _ = tokio::time::timeout(Duration::from_secs(30), refused.read_to_end(&mut received))
        .await
        .expect("the refused connection was closed");
    assert!(
        received.is_empty(),
        "a TLS client must not be sent HTTP/2 frames in the clear: {received:?}"
    );
    let refusals = r#"sluice_connections_refused_total{listener="grpc"}"#;
    assert_eq!(server.metric(refusals).await, 1);
    assert_eq!(should_rate_limit(&open).await.unwrap(), OK);
    server.stop().await;
}

// ------------------------------------------------------- sluice query

/// `sluice query --addr ADDR … ARGS` against the `tls` domain, run as the
/// binary: its exit code, stdout and stderr.
async fn sluice_query(addr: String, args: Vec<String>) -> (Option<i32>, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["query", "--addr", &addr, "--domain", "tls"])
            .args(["--descriptor", "client=q", "--timeout", "10s"])
            .args(&args)
            .output()
            .expect("run sluice query");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// Writes `pem` to `name` in `dir` and returns the path as an argument.
fn pem_file(dir: &Path, name: &str, pem: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap();
    path.display().to_string()
}

/// Asserts that a query failed as a person should see it: exit code 2, one
/// line on stderr saying `what`, no panic.
fn failed_clearly(result: &(Option<i32>, String, String), what: &str) {
    let (code, stdout, stderr) = result;
    assert_eq!(*code, Some(2), "stdout: {stdout}\nstderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("sluice: "), "{stderr}");
    assert!(stderr.contains(what), "expected {what:?} in {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_query_speaks_tls_with_the_right_ca_and_refuses_another() {
    let ca = Ca::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let server = serve(plain_files(dir.path(), &ca.leaf()), options()).await;
    let ca_file = pem_file(dir.path(), "ca.pem", &ca.pem());
    let port = server.grpc.port();

    // By IP, with the name the certificate carries.
    let (code, stdout, stderr) = sluice_query(
        server.grpc.to_string(),
        vec![
            "--tls-ca".into(),
            ca_file.clone(),
            "--tls-server-name".into(),
            "localhost".into(),
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with("OK"), "{stdout}");
    assert!(stdout.contains("limit 100 per minute"), "{stdout}");
    // By the name itself, as an https:// address.
    let by_name = sluice_query(
        format!("https://localhost:{port}"),
        vec!["--tls-ca".into(), ca_file.clone()],
    )
    .await;
    assert_eq!(by_name.0, Some(0), "{by_name:?}");

    // An IP the certificate does not name.
    let wrong_name = sluice_query(server.grpc.to_string(), vec!["--tls-ca".into(), ca_file]).await;
    failed_clearly(&wrong_name, "does not name this host");
    // A CA that did not sign the server's certificate.
    let stranger = pem_file(dir.path(), "other-ca.pem", &Ca::new("other").pem());
    let wrong_ca = sluice_query(
        server.grpc.to_string(),
        vec![
            "--tls-ca".into(),
            stranger,
            "--tls-server-name".into(),
            "localhost".into(),
        ],
    )
    .await;
    failed_clearly(&wrong_ca, "not signed by the CA trusted");
    // A file that holds no certificate is named before connecting.
    let garbage = pem_file(dir.path(), "garbage.pem", "not a PEM file");
    let bad_file = sluice_query(
        server.grpc.to_string(),
        vec!["--tls-ca".into(), garbage.clone()],
    )
    .await;
    failed_clearly(&bad_file, &format!("{garbage}: no certificate"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_query_speaks_mutual_tls_with_a_client_certificate_and_says_when_one_is_missing() {
    let ca = Ca::new("envoy-gateway");
    let (server, volume) = mutual(&ca).await;
    let dir = volume.dir.path();
    let ca_file = pem_file(dir, "query-ca.pem", &ca.pem());
    let client = ca.rsa_leaf_for("*.envoy-gateway-system", true);
    let cert = pem_file(dir, "client.crt", &client.cert_pem);
    let key = pem_file(dir, "client.key", &client.key_pem);
    let base = || {
        vec![
            "--tls-ca".to_string(),
            ca_file.clone(),
            "--tls-server-name".into(),
            "localhost".into(),
        ]
    };

    let mut with_cert = base();
    with_cert.extend(["--tls-cert".into(), cert, "--tls-key".into(), key]);
    let (code, stdout, stderr) = sluice_query(server.grpc.to_string(), with_cert).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with("OK"), "{stdout}");

    let without = sluice_query(server.grpc.to_string(), base()).await;
    failed_clearly(&without, "requires a client certificate");

    let stranger = Ca::new("someone-else").leaf();
    let mut wrong_cert = base();
    wrong_cert.extend([
        "--tls-cert".into(),
        pem_file(dir, "stranger.crt", &stranger.cert_pem),
        "--tls-key".into(),
        pem_file(dir, "stranger.key", &stranger.key_pem),
    ]);
    let refused = sluice_query(server.grpc.to_string(), wrong_cert).await;
    failed_clearly(&refused, "refused the client certificate");
    server.stop().await;
}
