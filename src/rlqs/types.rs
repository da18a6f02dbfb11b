//! RLQS's values: buckets, streams, what a stream is told, what it reports
//! and what replicas share. `state` (which keeps them), `metrics` (which
//! counts them), `redis` and `service` all import them from here.

use std::collections::HashMap;

use serde::Serialize;

/// Identifies one open stream (Envoy sends no instance identity).
pub type StreamId = u64;

/// Most streams open at once; more are refused.
pub const MAX_STREAMS: usize = 10_000;

/// Most buckets tracked per stream; more get no assignment.
pub const MAX_BUCKETS_PER_STREAM: usize = 1_000;

/// Reports in a row without a request after which a bucket is abandoned.
pub const IDLE_REPORTS: u32 = 6;

/// Time to live of every assignment, in seconds: longer than a restart.
pub const ASSIGNMENT_TTL_SECS: u64 = 60;

/// A bucket: the stream's domain and the bucket id's entries sorted by key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey {
    /// The domain of the rules that apply.
    pub domain: String,
    /// `(key, value)` pairs in key order: the descriptor matched.
    pub entries: Vec<(String, String)>,
}

impl BucketKey {
    /// The key of a bucket id reported in `domain`, entries in any order.
    pub fn new(domain: &str, entries: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut entries: Vec<_> = entries.into_iter().collect();
        entries.sort();
        Self {
            domain: domain.to_owned(),
            entries,
        }
    }

    /// `k=v,k=v`, for logs, metrics and the admin page.
    pub fn label(&self) -> String {
        let pairs: Vec<String> = self
            .entries
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        pairs.join(",")
    }
}

/// What a stream is told to do with one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Assignment {
    /// Admit everything.
    AllowAll,
    /// Admit nothing (a share of zero).
    DenyAll,
    /// A token bucket: `tokens_per_fill` every `fill_secs`, up to
    /// [`super::alloc::MAX_TOKENS`].
    TokenBucket {
        /// Tokens added per fill interval.
        tokens_per_fill: u32,
        /// The fill interval in whole seconds.
        fill_secs: u64,
    },
}

/// One action for one bucket of one stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Enforce this (with a TTL of [`ASSIGNMENT_TTL_SECS`]).
    Assign(BucketKey, Assignment),
    /// Forget the bucket and stop reporting it.
    Abandon(BucketKey),
}

/// One bucket's usage in a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    /// The bucket id's entries, in any order.
    pub entries: Vec<(String, String)>,
    /// Requests admitted since the previous report.
    pub allowed: u64,
    /// Requests denied since the previous report.
    pub denied: u64,
}

/// The actions to send, per stream.
pub type Outbox = Vec<(StreamId, Vec<Action>)>;

/// One bucket's demand on this replica, as shared with the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// The bucket.
    pub key: BucketKey,
    /// Each local stream's smoothed demand, micro-requests per second.
    pub demands: Vec<(StreamId, u64)>,
    /// Local streams that no longer report the bucket.
    pub gone: Vec<StreamId>,
}

/// The demand other replicas' streams put on each bucket (micro-requests
/// per second, one entry per stream); a bucket absent from the map keeps
/// what was last heard.
pub type Remote = HashMap<BucketKey, Vec<u64>>;
