//! An xDS management server for the tests (`tests/it/xds.rs`,
//! `tests/envoy/envoy_gateway/`): a tonic `AggregatedDiscoveryService` speaking
//! the state-of-the-world protocol over loopback, in plaintext or with
//! mutual TLS as Envoy Gateway's server has it (TLS 1.3 at least, a client
//! certificate from its CA required). It records every request it receives
//! and every response it sends, so a test can wait for the answer to a
//! given response.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prost::Message;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sluice::proto::envoy::service::discovery::v3::{
    DiscoveryRequest, DiscoveryResponse,
    aggregated_discovery_service_server::{
        AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
    },
};
use sluice::proto::ratelimit::config::ratelimit::v3::RateLimitConfig;
use sluice::xds::TYPE_URL;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};

/// How long a test waits for an event before failing.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// What the management server serves: a version and its configs. Each
/// `send` on the watch is one response (with a new nonce), even if equal.
pub type Snapshot = Option<(String, Vec<RateLimitConfig>)>;

#[derive(Clone)]
struct Ads {
    snapshots: watch::Receiver<Snapshot>,
    requests: mpsc::UnboundedSender<DiscoveryRequest>,
    /// Every response sent: (version, nonce).
    sent: Arc<Mutex<Vec<(String, String)>>>,
    stop: CancellationToken,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let mut snapshots = self.snapshots.clone();
        snapshots.mark_changed();
        let ads = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = ads.stop.cancelled() => break,
                    changed = snapshots.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let Some((version, configs)) = snapshots.borrow_and_update().clone() else {
                            continue;
                        };
                        if tx.send(Ok(ads.response(version, &configs))).await.is_err() {
                            break;
                        }
                    }
                    message = inbound.message() => match message {
                        Ok(Some(request)) => {
                            let _ = ads.requests.send(request);
                        }
                        _ => break,
                    },
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

impl Ads {
    /// The response carrying `configs` as `version`, with a fresh nonce.
    fn response(&self, version: String, configs: &[RateLimitConfig]) -> DiscoveryResponse {
        let nonce = {
            let mut sent = self.sent.lock();
            let nonce = format!("nonce-{}", sent.len());
            sent.push((version.clone(), nonce.clone()));
            nonce
        };
        DiscoveryResponse {
            version_info: version,
            resources: configs
                .iter()
                .map(|c| prost_types::Any {
                    type_url: TYPE_URL.into(),
                    value: c.encode_to_vec(),
                })
                .collect(),
            type_url: TYPE_URL.into(),
            nonce,
            ..Default::default()
        }
    }
}

/// The server side of mutual TLS as Envoy Gateway's xDS server has it: TLS
/// 1.3 only, ALPN h2, and a client certificate that chains to `client_ca`
/// required.
pub fn mutual_tls(cert_pem: &str, key_pem: &str, client_ca_pem: &str) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// A management server that can be stopped and started again on its port.
pub struct Management {
    pub addr: SocketAddr,
    snapshots: watch::Sender<Snapshot>,
    requests: mpsc::UnboundedReceiver<DiscoveryRequest>,
    requests_tx: mpsc::UnboundedSender<DiscoveryRequest>,
    sent: Arc<Mutex<Vec<(String, String)>>>,
    tls: Option<Arc<ServerConfig>>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Management {
    /// A server on a free loopback port.
    pub async fn start(tls: Option<Arc<ServerConfig>>) -> Self {
        Self::start_at(([127, 0, 0, 1], 0).into(), tls).await
    }

    /// A server on `addr`, e.g. the port of one that was stopped.
    pub async fn start_at(addr: SocketAddr, tls: Option<Arc<ServerConfig>>) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap();
        let (snapshots, _) = watch::channel(None);
        let (requests_tx, requests) = mpsc::unbounded_channel();
        let mut server = Self {
            addr: listener.local_addr().unwrap(),
            snapshots,
            requests,
            requests_tx,
            sent: Arc::default(),
            tls,
            stop: CancellationToken::new(),
            tasks: Vec::new(),
        };
        server.serve(listener);
        server
    }

    fn serve(&mut self, listener: TcpListener) {
        let stop = CancellationToken::new();
        self.stop = stop.clone();
        let ads = Ads {
            snapshots: self.snapshots.subscribe(),
            requests: self.requests_tx.clone(),
            sent: self.sent.clone(),
            stop: stop.clone(),
        };
        let router = Server::builder().add_service(AggregatedDiscoveryServiceServer::new(ads));
        let shutdown = stop.clone().cancelled_owned();
        self.tasks = match self.tls.clone() {
            None => vec![tokio::spawn(async move {
                let incoming = TcpListenerStream::new(listener);
                let _ = router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await;
            })],
            Some(tls) => {
                let (accepted, incoming) = mpsc::channel(16);
                let acceptor = tokio::spawn(accept_tls(listener, tls, accepted, stop));
                let server = tokio::spawn(async move {
                    let incoming = ReceiverStream::new(incoming);
                    let _ = router
                        .serve_with_incoming_shutdown(incoming, shutdown)
                        .await;
                });
                vec![acceptor, server]
            }
        };
    }

    /// Stops serving and closes the port.
    pub async fn stop(&mut self) {
        self.stop.cancel();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }

    /// Serves again on the same port, with the same snapshots.
    pub async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    /// Serves `configs` as `version` (one response on every open stream).
    pub fn push(&self, version: &str, configs: Vec<RateLimitConfig>) {
        self.snapshots.send_replace(Some((version.into(), configs)));
    }

    /// The next request the server receives.
    pub async fn next(&mut self) -> DiscoveryRequest {
        self.next_within(TIMEOUT).await
    }

    /// The next request the server receives within `deadline` (a client
    /// reconnecting after upstream's backoff takes longer than [`TIMEOUT`]).
    pub async fn next_within(&mut self, deadline: Duration) -> DiscoveryRequest {
        tokio::time::timeout(deadline, self.requests.recv())
            .await
            .expect("a request within the deadline")
            .expect("the request channel is open")
    }

    /// Requests until one answers the response with `nonce`.
    pub async fn answer_to(&mut self, nonce: &str) -> DiscoveryRequest {
        loop {
            let request = self.next().await;
            if request.response_nonce == nonce {
                return request;
            }
        }
    }

    /// The nonce of the last response sent for `version`, once sent.
    pub async fn nonce_of(&self, version: &str) -> String {
        poll(|| {
            self.sent
                .lock()
                .iter()
                .rev()
                .find(|(v, _)| v == version)
                .map(|(_, n)| n.clone())
        })
        .await
    }

    /// How many responses were sent.
    pub fn sent_count(&self) -> usize {
        self.sent.lock().len()
    }

    /// The nonce of the `index`-th response, once sent.
    pub async fn nonce_at(&self, index: usize) -> String {
        poll(|| self.sent.lock().get(index).map(|(_, n)| n.clone())).await
    }
}

/// Accepts connections on `listener` and hands each one that completes the
/// TLS handshake to the gRPC server; refused handshakes are dropped.
async fn accept_tls(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    accepted: mpsc::Sender<std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>>,
    stop: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let tcp = tokio::select! {
            () = stop.cancelled() => return,
            tcp = listener.accept() => match tcp {
                Ok((tcp, _)) => tcp,
                Err(_) => continue,
            },
        };
        let (acceptor, accepted) = (acceptor.clone(), accepted.clone());
        tokio::spawn(async move {
            if let Ok(Ok(tls)) = tokio::time::timeout(TIMEOUT, acceptor.accept(tcp)).await {
                let _ = accepted.send(Ok(tls)).await;
            }
        });
    }
}

/// Polls `f` until it yields, bounded by [`TIMEOUT`].
pub async fn poll<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "event not seen in time"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
