//! `sluice query`: one `ShouldRateLimit` call, printed for people. Works
//! against any RLS v3 server, not only Sluice.

use std::fmt::Write as _;
use std::time::Duration;

use tonic::transport::Endpoint;

use crate::proto as pb;
use crate::proto::rate_limit_descriptor::Entry;
use crate::proto::rate_limit_response::{Code, rate_limit::Unit};
use crate::rules::parse_duration;

/// One descriptor given as `k=v[,k=v…]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorArg(pub Vec<(String, String)>);

impl std::str::FromStr for DescriptorArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.split(',')
            .map(|pair| {
                let (key, value) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("'{pair}' is not key=value"))?;
                if key.is_empty() {
                    return Err(format!("'{pair}' has an empty key"));
                }
                Ok((key.to_owned(), value.to_owned()))
            })
            .collect::<Result<_, _>>()
            .map(DescriptorArg)
    }
}

/// `sluice query`.
#[derive(Debug, clap::Args)]
pub struct QueryArgs {
    /// Address of the RLS server (host:port or http://host:port)
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
}

/// Why a query got no answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The address is not a valid URI.
    #[error("invalid address '{0}': {1}")]
    Address(String, String),
    /// No connection could be made.
    #[error("cannot connect to {0}")]
    Connect(String, #[source] tonic::transport::Error),
    /// The server answered with an error status.
    #[error("server answered {}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
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
    let uri = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    let endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| QueryError::Address(addr.to_owned(), e.to_string()))?;
    Ok((uri, endpoint))
}

/// Sends the request and returns the server's answer.
pub async fn query(args: &QueryArgs) -> Result<pb::RateLimitResponse, QueryError> {
    let timeout = Duration::from_millis(args.timeout);
    let (uri, endpoint) = endpoint(&args.addr)?;
    let channel = endpoint
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await
        .map_err(|e| QueryError::Connect(uri, e))?;
    let mut client = pb::RateLimitServiceClient::new(channel);
    let response = client
        .should_rate_limit(args.request())
        .await
        .map_err(QueryError::Status)?;
    Ok(response.into_inner())
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// The decision as readable text.
pub fn render(args: &QueryArgs, response: &pb::RateLimitResponse) -> String {
    let mut out = format!(
        "{}  (domain {})\n",
        code_name(response.overall_code),
        args.domain
    );
    for (i, status) in response.statuses.iter().enumerate() {
        let entries = args
            .descriptors
            .get(i)
            .map(|d| {
                d.0.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let _ = write!(out, "  [{i}] {entries}  {}", code_name(status.code));
        match &status.current_limit {
            Some(limit) => {
                match Unit::try_from(limit.unit) {
                    Ok(unit) if unit != Unit::Unknown => {
                        let unit = unit.as_str_name().to_lowercase();
                        let _ = write!(out, "  limit {} per {unit}", limit.requests_per_unit);
                    }
                    _ => {
                        let _ = write!(out, "  limit {} per window", limit.requests_per_unit);
                    }
                }
                if !limit.name.is_empty() {
                    let _ = write!(out, " ({})", limit.name);
                }
                let _ = write!(out, "  remaining {}", status.limit_remaining);
            }
            None if status.limit_remaining == u32::MAX => out.push_str("  unlimited"),
            None => out.push_str("  no limit applies"),
        }
        if let Some(reset) = &status.duration_until_reset {
            let secs = reset.seconds as f64 + f64::from(reset.nanos) / 1e9;
            let _ = write!(out, "  resets in {secs:.3}s");
        }
        out.push('\n');
    }
    if let Some(why) = refused(response) {
        let _ = writeln!(out, "  {why}");
    }
    for header in &response.response_headers_to_add {
        let _ = writeln!(out, "  header {}: {}", header.key, header.value);
    }
    out
}

/// Sluice's explanation of a refusal (`dynamic_metadata.refused`) as one
/// line, when the server gave one.
fn refused(response: &pb::RateLimitResponse) -> Option<String> {
    use prost_types::value::Kind;
    let Some(Kind::StructValue(refused)) = response
        .dynamic_metadata
        .as_ref()?
        .fields
        .get("refused")?
        .kind
        .as_ref()
    else {
        return None;
    };
    let field = |name: &str| match refused.fields.get(name).and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(s)) => s.clone(),
        Some(Kind::NumberValue(n)) => format!("{n}"),
        _ => "?".to_owned(),
    };
    Some(if field("reason") == "store_error" {
        format!(
            "refused: the counter store failed and the server denies ([{}] {})",
            field("index"),
            field("descriptor")
        )
    } else {
        format!(
            "refused by {} ({} per {}, {}) on [{}] {}; retry in {} s",
            field("limit"),
            field("requests_per_unit"),
            field("window"),
            field("algorithm"),
            field("index"),
            field("descriptor"),
            field("retry_after_seconds")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_args_parse_pairs() {
        let d: DescriptorArg = "a=1,b=x=y".parse().unwrap();
        assert_eq!(
            d.0,
            vec![("a".into(), "1".into()), ("b".into(), "x=y".into())]
        );
        assert!("novalue".parse::<DescriptorArg>().is_err());
        assert!("=v".parse::<DescriptorArg>().is_err());
    }

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
