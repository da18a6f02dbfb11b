//! Demand shared between replicas through Redis, so that each replica
//! splits a bucket's budget over every Envoy's stream, not only its own.
//!
//! Per bucket one hash (`share.lua` documents it): a field per stream of
//! every replica, holding its smoothed demand and an expiry three report
//! intervals ahead. At each report a replica writes its streams' demand
//! for the bucket and reads everyone's back in the same script call. The
//! call goes through the RLS store's own connections and Cluster routing
//! ([`ScriptRunner`]), under its key prefix; a failed call leaves the
//! replica with what it last heard, logged, and never fails the stream.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::alloc::REPORT_INTERVAL_MS;
use super::types::{BucketKey, Published, Remote};
use crate::store::{LuaScript, ScriptRunner, StoreError};

/// A stream's field lives this long without a refresh: three reports.
pub const FIELD_TTL_MS: u64 = 3 * REPORT_INTERVAL_MS;

/// The longest wait for one exchange; past it the replica goes on alone.
const TIMEOUT: Duration = Duration::from_secs(1);

/// Key prefix of the RLQS hashes, after the store's own.
const PREFIX: &str = "rlqs:";

/// This replica's side of the shared demand.
pub struct RedisBoard {
    runner: ScriptRunner,
    share: LuaScript,
    /// Random per process: a restarted replica's streams are new streams.
    replica: String,
}

impl RedisBoard {
    /// A board over the store's `runner`, with a fresh replica id.
    pub fn new(runner: ScriptRunner) -> Self {
        Self {
            runner,
            share: LuaScript::new(include_str!("share.lua")),
            replica: format!("{:016x}", rand::random::<u64>()),
        }
    }

    /// Writes this replica's demand for each bucket and returns the other
    /// replicas' streams' demand; buckets whose call failed are left out.
    pub async fn exchange(&self, published: Vec<Published>) -> Remote {
        let calls = published.into_iter().map(|p| async move {
            let result = tokio::time::timeout(TIMEOUT, self.share(&p)).await;
            match result {
                Ok(Ok(remote)) => Some((p.key, remote)),
                Ok(Err(error)) => {
                    tracing::warn!(bucket = %p.key.label(), %error, "RLQS: sharing demand through Redis failed; this replica's view only");
                    None
                }
                Err(_) => {
                    tracing::warn!(bucket = %p.key.label(), "RLQS: sharing demand through Redis timed out; this replica's view only");
                    None
                }
            }
        });
        futures_util::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect::<HashMap<_, _>>()
    }

    async fn share(&self, published: &Published) -> Result<Vec<u64>, StoreError> {
        let mut args = vec![
            FIELD_TTL_MS.to_string(),
            format!("{}:", self.replica),
            published.demands.len().to_string(),
        ];
        for (stream, demand) in &published.demands {
            args.push(self.field(*stream));
            args.push(demand.to_string());
        }
        args.extend(published.gone.iter().map(|s| self.field(*s)));
        let key = key(self.runner.key_prefix(), &published.key);
        let reply = self.runner.run(&self.share, key, args).await?;
        // The script answers only other replicas' demands, all ≥ 0.
        Ok(reply
            .into_iter()
            .map(|d| u64::try_from(d).unwrap_or(0))
            .collect())
    }

    fn field(&self, stream: u64) -> String {
        format!("{}:{stream}", self.replica)
    }
}

/// The bucket's hash: a digest of the JSON array `[domain, [[k, v], …]]`,
/// an injective encoding, so no two buckets share a key whatever their
/// strings contain, and the key's length is bounded.
fn key(store_prefix: &str, bucket: &BucketKey) -> String {
    let encoded = serde_json::json!([bucket.domain, bucket.entries]).to_string();
    let digest = Sha256::digest(encoded.as_bytes());
    let mut key = String::with_capacity(store_prefix.len() + PREFIX.len() + 64);
    key.push_str(store_prefix);
    key.push_str(PREFIX);
    for byte in digest {
        let _ = write!(key, "{byte:02x}");
    }
    key
}
