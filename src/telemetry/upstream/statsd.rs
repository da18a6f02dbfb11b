//! The sinks' background tasks: statsd lines over UDP or TCP, flushed on an
//! interval, and the Prometheus page on its own listener. Neither touches the
//! request path; a dead statsd listener costs a warning, once.

use super::UpstreamStats;
use super::mapper::{Mapper, MapperError};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

/// Largest statsd payload per UDP datagram: below a 1500-byte Ethernet MTU
/// less IP and UDP headers.
pub const MAX_PACKET: usize = 1432;

/// How statsd lines travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// gostats' default (`STATSD_PROTOCOL=tcp`).
    #[default]
    Tcp,
    /// One datagram per packet.
    Udp,
}

/// The upstream-stats settings, under the settings' field names.
#[derive(Debug, Clone)]
pub struct UpstreamStatsConfig {
    /// `host:port` of a statsd listener; None = no statsd sink.
    pub statsd_addr: Option<String>,
    /// TCP (gostats' default) or UDP.
    pub statsd_protocol: Protocol,
    /// Where to serve the mapped Prometheus page; None = no page.
    pub upstream_prometheus_addr: Option<SocketAddr>,
    /// Path of the page, `/metrics` by default.
    pub upstream_prometheus_path: String,
    /// A statsd-exporter mapping file; None = upstream's default mapping.
    pub prometheus_mapper: Option<PathBuf>,
    /// How often statsd lines are sent.
    pub stats_flush_interval_ms: u64,
    /// Bound on distinct stat names (Sluice's `metrics_max_descriptors` × 6 fits).
    pub max_names: usize,
}

impl Default for UpstreamStatsConfig {
    fn default() -> Self {
        UpstreamStatsConfig {
            statsd_addr: None,
            statsd_protocol: Protocol::Tcp,
            upstream_prometheus_addr: None,
            upstream_prometheus_path: "/metrics".into(),
            prometheus_mapper: None,
            stats_flush_interval_ms: 10_000,
            max_names: 6_000,
        }
    }
}

/// Why the sinks could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The mapping file is unreadable or invalid.
    #[error(transparent)]
    Mapper(#[from] MapperError),
    /// The Prometheus address could not be bound.
    #[error("upstream prometheus listener {addr}: {source}")]
    Bind {
        /// The configured address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Joins lines into payloads of at most `max` bytes, newline-separated.
/// A single line longer than `max` goes alone.
pub fn packets(lines: &[String], max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in lines {
        if !cur.is_empty() && cur.len() + 1 + line.len() > max {
            out.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push('\n');
        }
        cur.push_str(line);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The running sinks; dropping it (or `stop`) ends their tasks.
#[derive(Debug)]
pub struct Running {
    /// The stats the decision path and reload feed.
    pub stats: Arc<UpstreamStats>,
    /// The bound Prometheus address, when serving.
    pub prometheus_addr: Option<SocketAddr>,
    stop: CancellationToken,
}

impl Running {
    /// Ends the sinks' tasks.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl UpstreamStats {
    /// Starts the configured sinks on the current Tokio runtime. A bad
    /// mapping file or an unbindable address is an error here, at start-up.
    pub async fn start(config: UpstreamStatsConfig) -> Result<Running, StartError> {
        let stats = Arc::new(UpstreamStats::new(config.max_names));
        let stop = CancellationToken::new();
        let mut prometheus_addr = None;
        if let Some(addr) = config.upstream_prometheus_addr {
            let mapper = match &config.prometheus_mapper {
                Some(path) => Mapper::from_file(path)?,
                None => Mapper::default_mapping(),
            };
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Bind { addr, source })?;
            prometheus_addr = listener.local_addr().ok();
            let page = Arc::new((mapper, stats.clone()));
            let path = if config.upstream_prometheus_path.starts_with('/') {
                config.upstream_prometheus_path.clone()
            } else {
                format!("/{}", config.upstream_prometheus_path)
            };
            let app = axum::Router::new().route(
                &path,
                axum::routing::get(move || {
                    let page = page.clone();
                    async move {
                        (
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "text/plain; version=0.0.4",
                            )],
                            page.0.render(&page.1),
                        )
                    }
                }),
            );
            let token = stop.clone();
            tokio::spawn(async move {
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { token.cancelled().await })
                    .await;
                if let Err(e) = served {
                    tracing::warn!(error = %e, "upstream prometheus listener stopped");
                }
            });
        }
        if let Some(target) = config.statsd_addr.clone() {
            let every = Duration::from_millis(config.stats_flush_interval_ms.max(1));
            tokio::spawn(flush_loop(
                stats.clone(),
                target,
                config.statsd_protocol,
                every,
                stop.clone(),
            ));
        }
        Ok(Running {
            stats,
            prometheus_addr,
            stop,
        })
    }
}

enum Conn {
    None,
    Udp(tokio::net::UdpSocket),
    Tcp(tokio::net::TcpStream),
}

async fn connect(target: &str, protocol: Protocol) -> std::io::Result<Conn> {
    match protocol {
        Protocol::Udp => {
            let sock = tokio::net::UdpSocket::bind(("0.0.0.0", 0)).await?;
            sock.connect(target).await?;
            Ok(Conn::Udp(sock))
        }
        Protocol::Tcp => {
            let stream = tokio::time::timeout(
                Duration::from_secs(2),
                tokio::net::TcpStream::connect(target),
            )
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
            })??;
            Ok(Conn::Tcp(stream))
        }
    }
}

async fn flush_loop(
    stats: Arc<UpstreamStats>,
    target: String,
    protocol: Protocol,
    every: Duration,
    stop: CancellationToken,
) {
    let mut conn = Conn::None;
    let mut warned = false;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let lines = stats.statsd_lines();
        if lines.is_empty() {
            continue;
        }
        if matches!(conn, Conn::None) {
            match connect(&target, protocol).await {
                Ok(c) => conn = c,
                Err(e) => {
                    if !warned {
                        tracing::warn!(target = %target, error = %e, "statsd sink unreachable; stats dropped until it answers");
                        warned = true;
                    }
                    continue;
                }
            }
        }
        let mut failed = None;
        for packet in packets(&lines, MAX_PACKET) {
            let sent = match &mut conn {
                Conn::Udp(sock) => sock.send(packet.as_bytes()).await.map(|_| ()),
                Conn::Tcp(stream) => {
                    let mut bytes = packet.into_bytes();
                    bytes.push(b'\n');
                    stream.write_all(&bytes).await
                }
                Conn::None => Ok(()),
            };
            if let Err(e) = sent {
                failed = Some(e);
                break;
            }
        }
        if let Some(e) = failed {
            if !warned {
                tracing::warn!(target = %target, error = %e, "statsd sink write failed; stats dropped until it answers");
                warned = true;
            }
            conn = Conn::None;
        }
    }
}
