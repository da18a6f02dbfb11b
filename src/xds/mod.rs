//! Rules over xDS: an ADS state-of-the-world client for envoyproxy/ratelimit's
//! `RateLimitConfig` resources, as Envoy Gateway serves them.
//!
//! Each response is the whole rule state. It is compiled by the same compiler
//! as rules files ([`convert`]); a snapshot that compiles is handed
//! to the sink and ACKed, one that does not is NACKed with the compile errors
//! and the last good version, and the rules in force stay. Every response is
//! answered, re-sends of a rejected version included: the management server
//! sends nothing new until the last response is answered. When the stream is
//! lost the client keeps the rules and reconnects for ever, with exponential
//! backoff.
//!
//! TLS and mutual TLS to the management server use tonic's rustls transport:
//! the CA (or the system roots) verifies the server under `xds_tls_san` (or
//! the host of `xds_server`), and a client certificate is sent when one is set.

pub mod convert;

use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::proto::envoy::config::core::v3::Node;
use crate::proto::envoy::service::discovery::v3::{
    DiscoveryRequest, DiscoveryResponse,
    aggregated_discovery_service_client::AggregatedDiscoveryServiceClient,
};
use crate::proto::google::rpc::Status;
use crate::proto::ratelimit::config::ratelimit::v3::RateLimitConfig;
use crate::reload::{Reload, Trigger};
use crate::rules::ConfigError;
use convert::{compile_snapshot, source_label};

/// The resource type Sluice subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// gRPC's INVALID_ARGUMENT, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// Every knob of the xDS client; the names are the settings'.
#[derive(Clone, Debug)]
pub struct XdsConfig {
    /// The management server, `host:port` or a URI (`http://host:port`).
    pub xds_server: String,
    /// `Node.id`; Envoy Gateway serves its snapshot to `envoy-ratelimit`.
    pub xds_node_id: String,
    /// `Node.metadata`, a JSON object as upstream's
    /// `CONFIG_GRPC_XDS_NODE_METADATA`; empty for none.
    pub xds_node_metadata: String,
    /// Connect over TLS.
    pub xds_tls: bool,
    /// Client certificate (PEM path) for mutual TLS.
    pub xds_tls_cert: Option<String>,
    /// Client key (PEM path) for mutual TLS.
    pub xds_tls_key: Option<String>,
    /// CA (PEM path) that verifies the server; the system roots when unset.
    pub xds_tls_ca_cert: Option<String>,
    /// Name the server's certificate must carry.
    pub xds_tls_san: Option<String>,
    /// First reconnection delay.
    pub xds_backoff_initial_ms: u64,
    /// Longest reconnection delay.
    pub xds_backoff_max_ms: u64,
    /// The delay is drawn from `[d·(1−f), d·(1+f)]` when jitter is on.
    pub xds_backoff_random_factor: f64,
    /// Randomize the delays.
    pub xds_backoff_jitter: bool,
    /// The largest response accepted.
    pub xds_max_message_bytes: usize,
    /// Serve before the first config arrives (requests then fail with
    /// "no rate limit configuration loaded"); otherwise the caller waits on
    /// [`XdsHandle::first_config`] before becoming ready.
    pub force_start_without_initial_config: bool,
}

impl Default for XdsConfig {
    /// Upstream's defaults (XDS_CLIENT_BACKOFF_*: 10 s, 60 s, 0.5, jitter on).
    fn default() -> Self {
        Self {
            xds_server: String::new(),
            xds_node_id: "envoy-ratelimit".into(),
            xds_node_metadata: String::new(),
            xds_tls: false,
            xds_tls_cert: None,
            xds_tls_key: None,
            xds_tls_ca_cert: None,
            xds_tls_san: None,
            xds_backoff_initial_ms: 10_000,
            xds_backoff_max_ms: 60_000,
            xds_backoff_random_factor: 0.5,
            xds_backoff_jitter: true,
            xds_max_message_bytes: 4 * 1024 * 1024,
            force_start_without_initial_config: false,
        }
    }
}

/// A configuration the client cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    /// `xds_node_metadata` is not a JSON object.
    #[error("xds_node_metadata is not a JSON object: {0}")]
    Metadata(String),
    /// `xds_server` is not an address.
    #[error("xds_server '{0}' is not a valid address: {1}")]
    Server(String, String),
    /// The TLS material cannot be read or does not go together.
    #[error("xds TLS: {0}")]
    Tls(String),
}

/// The running client.
pub struct XdsHandle {
    /// The client task; it ends when the shutdown token is cancelled.
    pub task: JoinHandle<()>,
    loaded: watch::Receiver<bool>,
    errors: watch::Receiver<Option<String>>,
    force_start: bool,
}

impl XdsHandle {
    /// Whether the service may report ready: a snapshot was accepted, or
    /// `force_start_without_initial_config` is set.
    pub fn ready(&self) -> bool {
        self.force_start || self.has_config()
    }

    /// Wraps the decision service so that, until a first snapshot is
    /// accepted, `ShouldRateLimit` fails as upstream's does (UNKNOWN, "no rate
    /// limit configuration loaded") instead of answering from no rules.
    pub fn gate<S>(&self, inner: S) -> Gated<S> {
        Gated::new(inner, self.loaded())
    }

    /// Whether a first snapshot was accepted, as a watch (for
    /// [`crate::server::Listeners::with_rules_gate`]).
    pub fn loaded(&self) -> watch::Receiver<bool> {
        self.loaded.clone()
    }

    /// Resolves once a first snapshot has been accepted (at once if one was).
    pub async fn first_config(&mut self) {
        let _ = self.loaded.wait_for(|loaded| *loaded).await;
    }

    /// Why the last stream failed or ended, if one did (cleared when a
    /// response arrives); for status pages and tests.
    pub fn last_error(&self) -> watch::Receiver<Option<String>> {
        self.errors.clone()
    }

    /// Whether a snapshot has been accepted.
    pub fn has_config(&self) -> bool {
        *self.loaded.borrow()
    }
}

/// Starts the client; `sink` gets each snapshot's outcome, in order, as a
/// [`Reload`] with trigger [`Trigger::Xds`] (so the file reload's sink serves
/// as is): `Ok` with the whole rule state before it is ACKed, `Err` with the
/// errors before it is NACKed. Runs until `shutdown` is cancelled. Must be called within a
/// Tokio runtime.
///
/// # Errors
///
/// The node metadata is not a JSON object, the server address is invalid, or
/// the TLS files cannot be read.
pub fn spawn<F>(
    config: XdsConfig,
    sink: F,
    shutdown: CancellationToken,
) -> Result<XdsHandle, XdsError>
where
    F: FnMut(Reload) + Send + 'static,
{
    let node = Node {
        id: config.xds_node_id.clone(),
        metadata: metadata(&config.xds_node_metadata)?,
        user_agent_name: "sluice".into(),
        user_agent_version_type: Some(
            crate::proto::envoy::config::core::v3::node::UserAgentVersionType::UserAgentVersion(
                env!("CARGO_PKG_VERSION").into(),
            ),
        ),
        ..Default::default()
    };
    let uri = if config.xds_server.contains("://") {
        config.xds_server.clone()
    } else if config.xds_tls {
        format!("https://{}", config.xds_server)
    } else {
        format!("http://{}", config.xds_server)
    };
    let mut endpoint = Endpoint::from_shared(uri)
        .map_err(|e| XdsError::Server(config.xds_server.clone(), e.to_string()))?;
    if config.xds_tls {
        endpoint = endpoint
            .tls_config(tls(&config)?)
            .map_err(|e| XdsError::Tls(e.to_string()))?;
    }
    let (loaded_tx, loaded) = watch::channel(false);
    let force_start = config.force_start_without_initial_config;
    let (errors_tx, errors) = watch::channel(None);
    let client = Client {
        config,
        node,
        endpoint,
        sink,
        loaded: loaded_tx,
        errors: errors_tx,
        acked: String::new(),
        nonce: String::new(),
    };
    let task = tokio::spawn(async move {
        tokio::select! {
            () = client.run() => {}
            () = shutdown.cancelled() => {}
        }
    });
    Ok(XdsHandle {
        task,
        loaded,
        errors,
        force_start,
    })
}

/// The client side of TLS to the management server.
fn tls(config: &XdsConfig) -> Result<ClientTlsConfig, XdsError> {
    let read = |what: &str, path: &str| {
        std::fs::read(path).map_err(|e| XdsError::Tls(format!("cannot read {what} '{path}': {e}")))
    };
    let mut tls = ClientTlsConfig::new();
    tls = match &config.xds_tls_ca_cert {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(read("xds_tls_ca_cert", ca)?)),
        None => tls.with_native_roots(),
    };
    if let Some(san) = config.xds_tls_san.as_deref().filter(|s| !s.is_empty()) {
        tls = tls.domain_name(san);
    }
    match (&config.xds_tls_cert, &config.xds_tls_key) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(
                read("xds_tls_cert", cert)?,
                read("xds_tls_key", key)?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(XdsError::Tls(
                "xds_tls_cert and xds_tls_key go together".into(),
            ));
        }
    }
    Ok(tls)
}

/// A decision service that refuses requests until xDS delivered rules; see
/// [`XdsHandle::gate`].
pub struct Gated<S> {
    inner: S,
    loaded: watch::Receiver<bool>,
}

impl<S> Gated<S> {
    /// `inner`, refusing while `loaded` is false.
    pub fn new(inner: S, loaded: watch::Receiver<bool>) -> Self {
        Self { inner, loaded }
    }
}

/// Upstream's message when no configuration was loaded yet.
pub const NO_CONFIG: &str = "no rate limit configuration loaded";

#[tonic::async_trait]
impl<S: crate::proto::RateLimitService> crate::proto::RateLimitService for Gated<S> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<crate::proto::RateLimitRequest>,
    ) -> Result<tonic::Response<crate::proto::RateLimitResponse>, tonic::Status> {
        if !*self.loaded.borrow() {
            // Upstream returns a plain Go error here, which gRPC sends as UNKNOWN.
            return Err(tonic::Status::unknown(NO_CONFIG));
        }
        self.inner.should_rate_limit(request).await
    }
}

/// `Node.metadata` from a JSON object string.
fn metadata(json: &str) -> Result<Option<prost_types::Struct>, XdsError> {
    if json.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(map)) => Ok(Some(to_struct(map))),
        Ok(other) => Err(XdsError::Metadata(format!("got {other}"))),
        Err(e) => Err(XdsError::Metadata(e.to_string())),
    }
}

fn to_struct(map: serde_json::Map<String, serde_json::Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: map.into_iter().map(|(k, v)| (k, to_value(v))).collect(),
    }
}

fn to_value(v: serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s),
        serde_json::Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.into_iter().map(to_value).collect(),
        }),
        serde_json::Value::Object(m) => Kind::StructValue(to_struct(m)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// The `attempt`-th reconnection delay (0-based): `initial·2^attempt`, at most
/// `max`, randomized by the factor when jitter is on.
pub fn backoff(config: &XdsConfig, attempt: u32) -> Duration {
    let base = config
        .xds_backoff_initial_ms
        .saturating_mul(1u64.checked_shl(attempt.min(32)).unwrap_or(u64::MAX))
        .min(config.xds_backoff_max_ms.max(config.xds_backoff_initial_ms));
    let factor = config.xds_backoff_random_factor.clamp(0.0, 1.0);
    if !config.xds_backoff_jitter || factor == 0.0 {
        return Duration::from_millis(base);
    }
    let spread = 1.0 - factor + 2.0 * factor * rand::random::<f64>();
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    Duration::from_millis((base as f64 * spread) as u64)
}

struct Client<F> {
    config: XdsConfig,
    node: Node,
    endpoint: Endpoint,
    sink: F,
    loaded: watch::Sender<bool>,
    errors: watch::Sender<Option<String>>,
    /// The last version accepted; empty before the first.
    acked: String,
    /// The nonce of the last response received.
    nonce: String,
}

impl<F: FnMut(Reload)> Client<F> {
    async fn run(mut self) {
        let mut attempt = 0;
        loop {
            match self.stream().await {
                Ok(answered) => {
                    if answered {
                        attempt = 0;
                    }
                    tracing::warn!(server = %self.config.xds_server, "xDS stream ended; keeping the rules in force");
                    let _ = self.errors.send(Some("stream ended".into()));
                }
                Err(e) => {
                    tracing::warn!(server = %self.config.xds_server, error = %e, "xDS stream failed; keeping the rules in force");
                    let _ = self.errors.send(Some(e));
                }
            }
            tokio::time::sleep(backoff(&self.config, attempt)).await;
            attempt = attempt.saturating_add(1);
        }
    }

    /// One stream, until it ends. `Ok(true)` when at least one response came.
    async fn stream(&mut self) -> Result<bool, String> {
        let channel = self.endpoint.connect().await.map_err(|e| chain(&e))?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.config.xds_max_message_bytes);
        let (tx, rx) = mpsc::channel(4);
        // The first request names the last good version, so a server that
        // remembers need not resend it; nonces belong to one stream, so none.
        self.nonce.clear();
        let _ = tx.send(self.request(None)).await;
        let mut inbound = client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .map_err(|e| chain(&e))?
            .into_inner();
        let mut answered = false;
        while let Some(response) = inbound.message().await.map_err(|e| chain(&e))? {
            if !answered {
                let _ = self.errors.send(None);
            }
            answered = true;
            let reply = self.answer(response);
            if tx.send(reply).await.is_err() {
                break;
            }
        }
        Ok(answered)
    }

    /// Applies or rejects one response, and the request that says so.
    fn answer(&mut self, response: DiscoveryResponse) -> DiscoveryRequest {
        self.nonce = response.nonce.clone();
        match decode(&response)
            .and_then(|configs| compile_snapshot(&response.version_info, &configs))
        {
            Ok(rules) => {
                tracing::info!(version = %response.version_info, "xDS rules accepted");
                (self.sink)(Reload {
                    result: Ok(rules),
                    trigger: Trigger::Xds,
                });
                self.acked = response.version_info;
                let _ = self.loaded.send(true);
                self.request(None)
            }
            Err(errors) => {
                let message = describe(&errors);
                (self.sink)(Reload {
                    result: Err(errors),
                    trigger: Trigger::Xds,
                });
                tracing::error!(version = %response.version_info, error = %message, "xDS rules rejected; keeping the rules in force");
                self.request(Some(message))
            }
        }
    }

    fn request(&self, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: self.acked.clone(),
            node: Some(self.node.clone()),
            resource_names: Vec::new(),
            type_url: TYPE_URL.into(),
            response_nonce: self.nonce.clone(),
            error_detail: error.map(|message| Status {
                code: INVALID_ARGUMENT,
                message,
                details: Vec::new(),
            }),
        }
    }
}

/// The snapshot's configs, or why they cannot be read.
fn decode(response: &DiscoveryResponse) -> Result<Vec<RateLimitConfig>, Vec<ConfigError>> {
    let error = |message: String| {
        vec![ConfigError {
            file: source_label(&response.version_info),
            line: 0,
            path: String::new(),
            message,
        }]
    };
    response
        .resources
        .iter()
        .enumerate()
        .map(|(i, any)| {
            if any.type_url != TYPE_URL {
                return Err(error(format!(
                    "resource {i} has type '{}', expected '{TYPE_URL}'",
                    any.type_url
                )));
            }
            RateLimitConfig::decode(any.value.as_slice())
                .map_err(|e| error(format!("resource {i} is not a RateLimitConfig: {e}")))
        })
        .collect()
}

/// An error and its causes, so a TLS failure says what failed.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn describe(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs(jitter: bool) -> XdsConfig {
        XdsConfig {
            xds_backoff_initial_ms: 100,
            xds_backoff_max_ms: 1_000,
            xds_backoff_random_factor: 0.5,
            xds_backoff_jitter: jitter,
            ..XdsConfig::default()
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_max() {
        let config = knobs(false);
        let delays: Vec<u64> = (0..6)
            .map(|a| u64::try_from(backoff(&config, a).as_millis()).unwrap())
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(backoff(&config, u32::MAX), Duration::from_millis(1_000));
    }

    #[test]
    fn jitter_stays_within_the_random_factor() {
        let config = knobs(true);
        for attempt in 0..8 {
            let base = backoff(&knobs(false), attempt).as_millis();
            for _ in 0..50 {
                let d = backoff(&config, attempt).as_millis();
                assert!(d >= base / 2 && d <= base * 3 / 2, "{d} vs {base}");
            }
        }
    }

    #[test]
    fn upstream_backoff_defaults() {
        let d = XdsConfig::default();
        assert_eq!(
            (d.xds_backoff_initial_ms, d.xds_backoff_max_ms),
            (10_000, 60_000)
        );
        assert!((d.xds_backoff_random_factor - 0.5).abs() < f64::EPSILON);
        assert!(d.xds_backoff_jitter);
    }

    #[test]
    fn node_metadata_must_be_a_json_object() {
        let meta = metadata(r#"{"a": {"b": [1, "x", true, null]}}"#)
            .unwrap()
            .unwrap();
        assert!(meta.fields.contains_key("a"));
        assert!(metadata("").unwrap().is_none());
        assert!(matches!(metadata("[1]"), Err(XdsError::Metadata(_))));
        assert!(matches!(metadata("{"), Err(XdsError::Metadata(_))));
    }
}
