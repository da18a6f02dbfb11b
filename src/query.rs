//! `sluice query`: one `ShouldRateLimit` call, printed for people. Works
//! against any RLS v3 server, not only Sluice, in the clear, over TLS or
//! with mutual TLS (as Envoy Gateway serves its rate-limit port).

use std::time::Duration;

use tonic::transport::Endpoint;

use crate::proto as pb;
use crate::proto::rate_limit_descriptor::Entry;
use crate::request::DescriptorArg;
use crate::rules::parse_duration;

mod render;
mod tls;
pub use render::{render, window_text};
pub use tls::TlsArgs;
use tls::{probe, tls_hint};

/// `sluice query`.
#[derive(Debug, clap::Args)]
pub struct QueryArgs {
    /// Address of the RLS server (host:port, http://host:port, or https://host:port for TLS)
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub addr: String,
    /// Rate-limit domain
    #[arg(long)]
    pub domain: String,
    /// A descriptor as key=value[,key=value…]; repeat for several descriptors
    #[arg(long = "descriptor", value_name = "K=V[,K=V...]", required = true)]
    pub descriptors: Vec<DescriptorArg>,
    /// Request weight (hits_addend); 0 or absent means 1
    #[arg(long, conflicts_with = "peek")]
    pub hits: Option<u32>,
    /// Read the counters without charging them: every descriptor's own
    /// hits_addend is 0 (a request-level 0 would mean 1)
    #[arg(long)]
    pub peek: bool,
    /// Give up after this long (e.g. 500ms, 5s)
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: u64,
    /// TLS to the server.
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// Why a query got no answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The address is not a valid URI.
    #[error("invalid address '{0}': {1}")]
    Address(String, String),
    /// A TLS file cannot be read or holds no certificate or key.
    #[error("{0}: {1}")]
    TlsFile(String, String),
    /// The TLS options cannot be used with this address.
    #[error("{0}")]
    Tls(String),
    /// No connection could be made.
    #[error("cannot connect to {0}")]
    Connect(String, #[source] tonic::transport::Error),
    /// No connection could be made, said in one line: the whole chain of
    /// causes, and what it most likely means where that helps.
    #[error("cannot connect to {0}: {1}")]
    Unreachable(String, String),
    /// The server answered with an error status.
    #[error("server answered {}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
    /// The call failed below gRPC (the connection broke).
    #[error("no answer from {0}: {1}")]
    Broken(String, String),
}

/// `error` and each of its causes, as one line (`a: b: c`), without the
/// repetitions some layers add.
fn chain(error: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

impl QueryArgs {
    /// The request these arguments describe.
    pub fn request(&self) -> pb::RateLimitRequest {
        pb::RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: self
                .descriptors
                .iter()
                .map(|d| pb::RateLimitDescriptor {
                    entries: d
                        .0
                        .iter()
                        .map(|(k, v)| Entry {
                            key: k.clone(),
                            value: v.clone(),
                        })
                        .collect(),
                    hits_addend: self.peek.then_some(0),
                    ..Default::default()
                })
                .collect(),
            hits_addend: self.hits.unwrap_or(0),
        }
    }
}

/// The endpoint of an RLS server given as `host:port` or `http://host:port`,
/// with the URI it was made from (for errors). Shared with `sluice bench`.
pub fn endpoint(addr: &str) -> Result<(String, Endpoint), QueryError> {
    endpoint_with(addr, &TlsArgs::default())
}

/// As [`endpoint`], over TLS when `tls` asks for it or the address is
/// `https://…`.
pub fn endpoint_with(addr: &str, tls: &TlsArgs) -> Result<(String, Endpoint), QueryError> {
    let secure = tls.any() || addr.starts_with("https://");
    let uri = match addr.split_once("://") {
        Some(("http", _)) if secure => {
            return Err(QueryError::Tls(format!(
                "{addr} is a plaintext address, but TLS options are given: write https://… or host:port"
            )));
        }
        Some(_) => addr.to_owned(),
        None if secure => format!("https://{addr}"),
        None => format!("http://{addr}"),
    };
    let mut endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| QueryError::Address(addr.to_owned(), e.to_string()))?;
    if secure {
        endpoint = endpoint
            .tls_config(tls.config()?)
            .map_err(|e| QueryError::Tls(chain(&e)))?;
    }
    Ok((uri, endpoint))
}

/// Sends the request and returns the server's answer.
pub async fn query(args: &QueryArgs) -> Result<pb::RateLimitResponse, QueryError> {
    let timeout = Duration::from_millis(args.timeout);
    let (uri, endpoint) = endpoint_with(&args.addr, &args.tls)?;
    let connected = endpoint
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await;
    let channel = match connected {
        Ok(channel) => channel,
        Err(e) => {
            let mut why = tls_hint(&e);
            if why.is_none() && args.tls.any() {
                why = tokio::time::timeout(timeout, probe(&uri, &args.tls))
                    .await
                    .ok()
                    .flatten();
            }
            let why = why.unwrap_or_else(|| chain(&e));
            return Err(QueryError::Unreachable(uri, why));
        }
    };
    let mut client = pb::RateLimitServiceClient::new(channel);
    match client.should_rate_limit(args.request()).await {
        Ok(response) => Ok(response.into_inner()),
        // Under TLS 1.3 a server refuses a client certificate (or its
        // absence) after the handshake, with an alert the HTTP/2 client
        // drops: the call only fails. Ask the server once more, by hand,
        // to hear the alert and say what it means.
        Err(status) if std::error::Error::source(&status).is_some() && args.tls.any() => {
            let probe = tokio::time::timeout(timeout, probe(&uri, &args.tls)).await;
            match probe.ok().flatten().or_else(|| tls_hint(&status)) {
                Some(why) => Err(QueryError::Broken(uri, why)),
                None => Err(QueryError::Status(status)),
            }
        }
        Err(status) => Err(QueryError::Status(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_sets_every_descriptors_own_weight_to_zero() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            query: QueryArgs,
        }
        let cli = Cli::parse_from([
            "q",
            "--domain",
            "d",
            "--descriptor",
            "a=1",
            "--descriptor",
            "b=2",
            "--peek",
        ]);
        let request = cli.query.request();
        assert_eq!(request.hits_addend, 0);
        assert!(request.descriptors.iter().all(|d| d.hits_addend == Some(0)));
        let plain = Cli::parse_from(["q", "--domain", "d", "--descriptor", "a=1"]);
        assert_eq!(plain.query.request().descriptors[0].hits_addend, None);
        assert!(
            Cli::try_parse_from([
                "q",
                "--domain",
                "d",
                "--descriptor",
                "a=1",
                "--peek",
                "--hits",
                "3"
            ])
            .is_err(),
            "--peek and --hits contradict each other"
        );
    }
}
