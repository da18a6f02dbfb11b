//! The RLQS gRPC service: the only part of `rlqs` that sees protobuf.
//!
//! One task per stream reads reports, hands them to [`Rlqs`], and sends the
//! resulting actions through each target stream's channel — its own answers
//! and the cuts and raises a re-split gives other streams. The first report
//! of a bucket (`time_elapsed: 0s`, which Envoy 1.40 sends although its
//! proto forbids it) is accepted and answered at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::alloc::MAX_TOKENS;
use super::redis::RedisBoard;
use super::state::{Pending, Rlqs};
use super::types::{ASSIGNMENT_TTL_SECS, Action, Assignment, Outbox, Remote, StreamId, Usage};
use crate::proto::rlqs as pb;
use pb::rate_limit_quota_response::{BucketAction, bucket_action};

/// Messages queued per stream before pushes to it are dropped (a stream
/// that does not read for that long is stuck; its next report resyncs it).
const QUEUE: usize = 64;

/// Most entries in one bucket id, and most bytes in one key or value:
/// bigger ids are ignored, so no report can cost unbounded memory.
const MAX_ENTRIES: usize = 16;
const MAX_TEXT: usize = 1_024;

type Reply = Result<pb::RateLimitQuotaResponse, Status>;

/// `StreamRateLimitQuotas` over an [`Rlqs`] state.
#[derive(Clone)]
pub struct RateLimitQuotaService {
    rlqs: Arc<Rlqs>,
    /// Where to push actions for each open stream; a stream's entry goes
    /// when it closes.
    senders: Arc<Mutex<HashMap<StreamId, mpsc::Sender<Reply>>>>,
    /// The origin of the `now` passed to the state (tokio time, so tests
    /// can pause it).
    epoch: Instant,
    /// Cancelled when the server stops accepting: every stream then ends
    /// with `UNAVAILABLE`, so Envoy reconnects elsewhere and shutdown does
    /// not wait for streams that never end by themselves.
    closing: CancellationToken,
    /// Where demand is shared with other replicas; `None` in memory mode.
    board: Option<Arc<RedisBoard>>,
}

/// The largest usage report taken: room for several thousand buckets
/// (a bucket's usage is well under 100 bytes), while a connection's
/// buffered requests stay bounded.
pub const MAX_REPORT_BYTES: usize = 512 * 1024;

impl RateLimitQuotaService {
    /// A service over `rlqs`.
    pub fn new(rlqs: Arc<Rlqs>, closing: CancellationToken) -> Self {
        Self {
            rlqs,
            senders: Arc::default(),
            epoch: Instant::now(),
            closing,
            board: None,
        }
    }

    /// Shares demand with other replicas through `board`.
    pub fn with_board(mut self, board: Arc<RedisBoard>) -> Self {
        self.board = Some(board);
        self
    }

    /// Completes a report or a close: shares demand (Redis mode), then
    /// re-splits and sends.
    async fn settle(&self, pending: Pending) {
        let remote = match &self.board {
            Some(board) => board.exchange(self.rlqs.published(&pending)).await,
            None => Remote::new(),
        };
        let outbox = self.rlqs.finish(pending, &remote);
        self.dispatch(outbox);
    }

    /// The tonic server for the router.
    /// The tonic service. A report lists every bucket one Envoy knows, so
    /// its messages may be larger than an RLS request: they get their own
    /// cap, [`MAX_REPORT_BYTES`].
    pub fn into_server(
        self,
    ) -> pb::rate_limit_quota_service_server::RateLimitQuotaServiceServer<Self> {
        pb::rate_limit_quota_service_server::RateLimitQuotaServiceServer::new(self)
            .max_decoding_message_size(MAX_REPORT_BYTES)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn dispatch(&self, outbox: Outbox) {
        let senders = self.senders.lock();
        for (stream, actions) in outbox {
            let Some(sender) = senders.get(&stream) else {
                continue;
            };
            let message = pb::RateLimitQuotaResponse {
                bucket_action: actions.into_iter().map(to_wire).collect(),
            };
            if sender.try_send(Ok(message)).is_err() {
                tracing::warn!(stream, "RLQS stream not reading; actions for it dropped");
            }
        }
    }

    /// Ends a stream with `status` after what is already queued for it.
    fn end(&self, stream: StreamId, status: Status) {
        if let Some(sender) = self.senders.lock().get(&stream) {
            let _ = sender.try_send(Err(status));
        }
    }

    async fn serve_stream(
        self,
        stream: StreamId,
        peer: Option<SocketAddr>,
        mut inbound: Streaming<pb::RateLimitQuotaUsageReports>,
    ) {
        let mut domain = String::new();
        loop {
            let message = tokio::select! {
                message = inbound.message() => message,
                () = self.closing.cancelled() => {
                    self.end(stream, Status::unavailable("Sluice is shutting down"));
                    break;
                }
            };
            let reports = match message {
                Ok(Some(reports)) => reports,
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(stream, %status, "RLQS stream read failed");
                    break;
                }
            };
            if !reports.domain.is_empty() && reports.domain != domain {
                domain = reports.domain;
            }
            if domain.is_empty() {
                self.end(
                    stream,
                    Status::invalid_argument("RLQS: the first report must name a domain"),
                );
                break;
            }
            let usages = reports
                .bucket_quota_usages
                .into_iter()
                .filter_map(from_wire)
                .collect();
            let pending = self.rlqs.record(stream, &domain, usages, self.now_ms());
            self.settle(pending).await;
        }
        self.senders.lock().remove(&stream);
        let pending = self.rlqs.leave(stream);
        self.settle(pending).await;
        tracing::info!(stream, peer = ?peer, domain, "RLQS stream closed");
    }
}

#[tonic::async_trait]
impl pb::rate_limit_quota_service_server::RateLimitQuotaService for RateLimitQuotaService {
    type StreamRateLimitQuotasStream = ReceiverStream<Reply>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<pb::RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let peer = request.remote_addr();
        let stream = match self.rlqs.open() {
            Ok(stream) => stream,
            Err(refused) => {
                tracing::info!(peer = ?peer, "RLQS stream refused: {refused}");
                return Err(Status::resource_exhausted(refused.to_string()));
            }
        };
        tracing::info!(stream, peer = ?peer, "RLQS stream opened");
        let (sender, receiver) = mpsc::channel(QUEUE);
        self.senders.lock().insert(stream, sender);
        tokio::spawn(
            self.clone()
                .serve_stream(stream, peer, request.into_inner()),
        );
        Ok(Response::new(ReceiverStream::new(receiver)))
    }
}

/// A reported bucket in domain terms; `None` for an id that is missing,
/// empty or too big (ignored: it gets no assignment).
fn from_wire(usage: pb::rate_limit_quota_usage_reports::BucketQuotaUsage) -> Option<Usage> {
    let bucket = usage.bucket_id?.bucket;
    let valid = !bucket.is_empty()
        && bucket.len() <= MAX_ENTRIES
        && bucket
            .iter()
            .all(|(k, v)| !k.is_empty() && k.len() <= MAX_TEXT && v.len() <= MAX_TEXT);
    if !valid {
        tracing::debug!("RLQS report with an empty or oversized bucket id ignored");
        return None;
    }
    Some(Usage {
        entries: bucket.into_iter().collect(),
        allowed: usage.num_requests_allowed,
        denied: usage.num_requests_denied,
    })
}

fn to_wire(action: Action) -> BucketAction {
    let (key, action) = match action {
        Action::Abandon(key) => (
            key,
            bucket_action::BucketAction::AbandonAction(bucket_action::AbandonAction {}),
        ),
        Action::Assign(key, assignment) => (
            key,
            bucket_action::BucketAction::QuotaAssignmentAction(
                bucket_action::QuotaAssignmentAction {
                    assignment_time_to_live: Some(seconds(ASSIGNMENT_TTL_SECS)),
                    rate_limit_strategy: Some(strategy(assignment)),
                },
            ),
        ),
    };
    BucketAction {
        bucket_id: Some(pb::BucketId {
            bucket: key.entries.into_iter().collect(),
        }),
        bucket_action: Some(action),
    }
}

fn strategy(assignment: Assignment) -> pb::RateLimitStrategy {
    use pb::rate_limit_strategy::{BlanketRule, Strategy};
    let strategy = match assignment {
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assignment::TokenBucket {
            tokens_per_fill,
            fill_secs,
        } => Strategy::TokenBucket(pb::TokenBucket {
            max_tokens: MAX_TOKENS,
            tokens_per_fill: Some(tokens_per_fill),
            fill_interval: Some(seconds(fill_secs)),
        }),
    };
    pb::RateLimitStrategy {
        strategy: Some(strategy),
    }
}

fn seconds(secs: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        nanos: 0,
    }
}
