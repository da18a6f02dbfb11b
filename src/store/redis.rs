//! The Redis store: one `EVALSHA` of `decide.lua` (assembled from
//! `redis/decide/`) per request (per slot group on Redis Cluster), or per
//! several requests of one hot counter (`redis/coalesce.rs`). The only
//! module (with `redis/`) that sees the Redis client (redis-rs;
//! `redis/dial.rs` says how connections are made, and BENCHMARKS.md why
//! this client).
//!
//! Single Redis (or every key of the request in one slot): the script checks
//! and counts the whole request atomically. Redis Cluster with keys in
//! several slots: one call per slot group, in parallel, each counting its part
//! only if none of its enforcing limits is over; when the request as a whole
//! is rejected, the parts already counted are refunded (`redis/refund.lua`).
//! A second Redis for per-second limits (`per_second_url`) is one more
//! place a part can go, handled the same way.
//! Between a part's count and its refund, a concurrent request may see those
//! hits and be rejected; it can never be admitted beyond the limit.
//!
//! **Never twice.** A script call is sent once and never resent: it may have
//! counted. Only answers Redis gives *before* running anything (Cluster
//! redirects, `NOSCRIPT`) send it again; see `redis/cluster.rs` for why
//! Cluster routing is done here and not by the client library.
//!
//! **Timeouts.** `timeout` bounds the caller's wait. A call that times out
//! may still run (it is in a socket or a Redis queue), so its future is not
//! dropped: a background task waits for the real answer (at most
//! [`RECONCILE_WAIT`]) and, if the script counted, refunds exactly those hits,
//! since the caller was told UNAVAILABLE. Answers and counters so agree; the
//! one gap is a reply that never comes (connection lost after sending), which
//! is logged.
//!
//! **Breakers.** With `breaker` set, each node (the one server, or each
//! Cluster primary) has its own: a dead shard fails only its slots fast, and
//! its slots recover as soon as the topology names a new primary (whose
//! breaker is closed).

mod call;
mod cluster;
mod coalesce;
mod dial;
#[cfg(feature = "bench")]
mod info;
mod node;
mod tls;
mod url;
mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};

use self::call::{Called, Owed, RefundCounts, Route, Shared, Target};
pub use self::coalesce::Coalescing;
use self::coalesce::{Coalescer, Lane, Request, Turn};
#[cfg(feature = "bench")]
pub use self::info::server_info;
use self::node::{Eval, Node, Script};
pub use self::tls::RedisTls;
pub use self::url::RedisUrl;
use self::wire::{ITEM_ARGS, ItemPart, LIMIT_ARGS, Packing, answer_len, answers, push_item};
use super::{Batch, BatchItem, BatchOutcome, BreakerConfig, CounterStore, StoreError};
use crate::limiter::{Clock, Identity, Window, admits};
use crate::telemetry::metrics::ReconcileCounters;

/// Assembled by build.rs from `redis/decide/` (see its `prelude.lua`).
const DECIDE: &str = include_str!(concat!(env!("OUT_DIR"), "/decide.lua"));
/// Assembled by build.rs from `redis/refund.lua` and decide.lua's parts.
const REFUND: &str = include_str!(concat!(env!("OUT_DIR"), "/refund.lua"));
/// Assembled by build.rs around `redis/decide/batch.lua`.
const BATCH: &str = include_str!(concat!(env!("OUT_DIR"), "/batch.lua"));
const RESET: &str = include_str!("redis/reset.lua");

/// Where the scripts take `now` from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TimeSource {
    /// Redis `TIME`: one clock for every replica.
    #[default]
    Redis,
    /// The service's clock, passed to the script.
    Local,
}

/// Settings of the Redis store.
#[derive(Clone, Debug)]
pub struct RedisStoreConfig {
    /// `redis://[user:pass@]host:port[/db]`, `rediss://…` (TLS),
    /// `redis-cluster://host:port[,host:port…]` (`rediss-cluster://` for TLS),
    /// `redis-sentinel://host:port[,host:port…]/service`, `redis+unix:///path`.
    pub url: RedisUrl,
    /// Connections per Redis node, used round-robin; each carries many
    /// calls at once.
    pub pool_size: usize,
    /// Longest wait for one decision; past it the request fails UNAVAILABLE
    /// (and what the call counted after all is refunded).
    pub timeout: Duration,
    /// Prepended to every key, so several services can share one Redis.
    pub key_prefix: String,
    /// Where `now` comes from.
    pub time: TimeSource,
    /// The circuit breaker of each node; `None`: no breaker.
    pub breaker: Option<BreakerConfig>,
    /// TLS files beyond what a `rediss://` URL implies (its CA, a client
    /// certificate, the host-name check); they need a `rediss` scheme.
    pub tls: RedisTls,
    /// A second Redis for per-second limits (envoyproxy/ratelimit's
    /// `REDIS_PERSECOND`): a descriptor whose limits are all one-second
    /// windows is counted there, every other one in `url`. `None`: one
    /// Redis for all.
    pub per_second_url: Option<RedisUrl>,
    /// Whether requests of one counter that arrive while a call for it is
    /// in flight share the next call (see `redis/coalesce.rs`).
    pub coalesce: bool,
}

/// The Redis counter store.
pub struct RedisStore {
    shared: Arc<Shared>,
    prefix: String,
    /// Hot counters' queues, when coalescing (see `redis/coalesce.rs`).
    coalesce: Option<Arc<Coalescer>>,
}

/// What [`RedisStore::refunds`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refunds {
    /// Refund calls sent and not yet answered (or timed out).
    pub in_flight: u64,
    /// Refund calls that failed so far (each is also logged).
    pub failed: u64,
}

/// A Lua script that another module keeps in the store's Redis (RLQS's
/// shared demand), run through [`ScriptRunner`]: loaded on first use, its
/// reply a list of integers.
pub struct LuaScript(Script);

impl LuaScript {
    /// The script with this source.
    pub fn new(lua: &'static str) -> Self {
        Self(Script::new(lua))
    }
}

/// Runs other modules' scripts over the store's own connections, routing
/// and breakers, so that no module but this one sees the Redis client.
#[derive(Clone)]
pub struct ScriptRunner {
    shared: Arc<Shared>,
    prefix: String,
}

impl ScriptRunner {
    /// The store's key prefix, for the caller's keys.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// Runs `script` once on the node that owns `key`, following Cluster
    /// redirects as decide.lua's calls do (never resent otherwise).
    pub async fn run(
        &self,
        script: &LuaScript,
        key: String,
        args: Vec<String>,
    ) -> Result<Vec<i64>, StoreError> {
        let slot = self.shared.slot(Target::Main, &key);
        let mut eval = Eval::new(&script.0, &[key], slot, args.len());
        eval.cmd.arg(args);
        self.shared
            .clone()
            .send(Target::Main, eval, call::Guard::Breaker)
            .await
    }
}

impl RedisStore {
    /// Connects (waiting at most `connect_timeout` for the first connection;
    /// if Redis is not there yet, requests fail UNAVAILABLE until it is) and
    /// loads the scripts. `clock` drives the breakers, and the scripts in
    /// local time mode.
    pub async fn connect(
        config: &RedisStoreConfig,
        clock: Arc<dyn Clock>,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let route =
            Route::connect(&config.url, config.pool_size, &config.tls, connect_timeout).await?;
        let per_second = match &config.per_second_url {
            Some(url) => {
                Some(Route::connect(url, config.pool_size, &config.tls, connect_timeout).await?)
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            route,
            per_second,
            decide: Script::new(DECIDE),
            batch: Script::with_packing(BATCH, Packing::Doubles),
            refund: Script::new(REFUND),
            breaker: config.breaker,
            clock,
            local_time: config.time == TimeSource::Local,
            timeout: config.timeout,
            refunds: RefundCounts::default(),
        });
        let nodes: Vec<Arc<Node>> = std::iter::once(&shared.route)
            .chain(&shared.per_second)
            .flat_map(Route::nodes)
            .collect();
        let deadline = tokio::time::Instant::now() + connect_timeout;
        for node in &nodes {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if !node.wait_connected(left).await {
                let e = node.down();
                tracing::warn!(error = %e, node = %node.name(), "Redis not reachable yet; requests fail UNAVAILABLE until it is");
                continue;
            }
            // Saves the first call a NOSCRIPT round trip; not required.
            for script in [&shared.decide, &shared.batch, &shared.refund] {
                let loaded: Result<redis::Value, _> = node.command(&script.load()).await;
                if let Err(e) = loaded {
                    tracing::warn!(error = %e, node = %node.name(), "could not load the Redis scripts yet");
                }
            }
        }
        let coalesce = config
            .coalesce
            .then(|| Arc::new(Coalescer::new(shared.clone())));
        Ok(Self {
            shared,
            prefix: config.key_prefix.clone(),
            coalesce,
        })
    }

    /// A connection of the one Redis (`None` on a Cluster, or while
    /// disconnected), for tools that need raw commands (the cost harness).
    #[cfg(feature = "bench")]
    pub fn connection(&self) -> Option<redis::aio::MultiplexedConnection> {
        match &self.shared.route {
            Route::Single(node) => node.connection().ok(),
            Route::Cluster(_) => None,
        }
    }

    /// What is being coalesced now (see `redis/coalesce.rs`).
    pub fn coalescing(&self) -> Coalescing {
        self.coalesce
            .as_ref()
            .map_or_else(Coalescing::default, |c| c.now())
    }

    /// Counts every refund call that fails in `counter` too (the metrics'
    /// `sluice_store_refund_failures_total`), those that failed so far
    /// included. Only the first counter given is kept.
    pub fn count_refund_failures_in(&self, counter: Counter) {
        let counts = &self.shared.refunds;
        if counts.failures_metric.set(counter.clone()).is_ok() {
            counter.inc_by(counts.failed.load(Ordering::SeqCst));
        }
    }

    /// Counts what becomes of every call that outlives its caller's
    /// timeout in `counters` (`sluice_store_reconciliations_total`). Only
    /// the first set given is kept.
    pub fn count_reconciliations_in(&self, counters: ReconcileCounters) {
        let _ = self.shared.refunds.reconciled_metric.set(counters);
    }

    /// Refund calls in flight, and those that failed so far.
    pub fn refunds(&self) -> Refunds {
        let counts = &self.shared.refunds;
        // `failed` is counted before `in_flight` is taken down: once none
        // is in flight, every failure shows.
        let in_flight = counts.in_flight.load(Ordering::SeqCst);
        Refunds {
            in_flight,
            failed: counts.failed.load(Ordering::SeqCst),
        }
    }

    /// Closes every connection and stops reconnecting; calls still in
    /// flight fail. Never waits: a connection stuck in reconnect back-off
    /// (Redis down, or refusing our password) must not hold the process at
    /// shutdown.
    pub fn quit(&self) {
        for route in std::iter::once(&self.shared.route).chain(&self.shared.per_second) {
            match route {
                Route::Single(node) => node.quit(),
                Route::Cluster(cluster) => cluster.quit(),
            }
        }
    }

    /// Runs decide.lua for `items` (indices into `batch.items`). Past the
    /// timeout the call is left to finish in the background and reconciled
    /// (see the module docs).
    async fn decide_part(
        &self,
        (target, slot): (Target, u16),
        batch: &Batch,
        items: &[usize],
        keys: &[impl AsRef<str>],
        whole: bool,
        now: Option<i64>,
    ) -> Result<Vec<i64>, StoreError> {
        let limit_count: usize = items.iter().map(|&i| batch.items[i].limits.len()).sum();
        let mut eval = self.shared.decide_eval(
            items.iter().map(|&i| keys[i].as_ref()),
            slot,
            (now, whole),
            ITEM_ARGS * items.len() + LIMIT_ARGS * limit_count,
        );
        for &i in items {
            push_item(&mut eval.cmd, &batch.items[i], self.shared.clock.now());
        }
        let expected = 1 + answer_len(whole) * limit_count;
        let started = self.shared.clock.now();
        let abandoned = Arc::new(AtomicBool::new(false));
        let reply = match self.shared.call(target, eval, abandoned.clone()).await {
            Called::Replied(reply) => reply?,
            Called::Late(late) => {
                // The script may still run: a task waits for its reply and
                // refunds what it counted (see the module docs).
                abandoned.store(true, Ordering::Relaxed);
                self.shared.timed_out(target, slot, started);
                // Every item has its answers in the reply; refunds and
                // always-counted debits stand whatever the request decides
                // (as when it is refused), so they are owed nothing.
                let owed = items
                    .iter()
                    .map(|&i| {
                        let item = &batch.items[i];
                        let mut owed = Owed::new(target, keys[i].as_ref(), item);
                        if item.stands() {
                            owed.hits = 0;
                        }
                        owed
                    })
                    .collect();
                late.reconcile(move |shared, reply| shared.reconcile(reply, owed, expected, whole));
                return Err(StoreError::Timeout(self.shared.timeout));
            }
        };
        if reply.len() != expected {
            return Err(StoreError::Unavailable(format!(
                "unexpected script reply of {} values",
                reply.len()
            )));
        }
        Ok(reply)
    }

    /// The decision of a request whose counters all live in one group
    /// (`items`: every item of `batch`): one call decides it.
    async fn decide_whole(
        &self,
        place: (Target, u16),
        batch: &Batch,
        items: &[usize],
        keys: &[impl AsRef<str>],
        now: Option<i64>,
    ) -> Result<BatchOutcome, StoreError> {
        let reply = self
            .decide_part(place, batch, items, keys, true, now)
            .await?;
        let admitted = reply[0] == 1;
        let limits = batch
            .items
            .iter()
            .flat_map(|item| item.limits.iter().map(move |_| item))
            .zip(answers(&reply, true))
            .map(|(item, answer)| answer.outcome(item, admitted))
            .collect();
        Ok(BatchOutcome { admitted, limits })
    }

    /// Where `item`'s counters live: its Redis, and its slot there.
    fn place(&self, item: &BatchItem, key: &str) -> (Target, u16) {
        let target = self.shared.target(item.limits.iter().map(|l| &l.window));
        (target, self.shared.slot(target, key))
    }

    /// Items of `batch` grouped by Redis and Cluster slot (`keys`: theirs);
    /// one group when every counter lives in one Redis that is not a
    /// Cluster.
    fn groups(&self, batch: &Batch, keys: &[String]) -> Vec<((Target, u16), Vec<usize>)> {
        let mut groups: Vec<((Target, u16), Vec<usize>)> = Vec::new();
        for (i, (item, key)) in batch.items.iter().zip(keys).enumerate() {
            let place = self.place(item, key);
            match groups.iter_mut().find(|(p, _)| *p == place) {
                Some((_, members)) => members.push(i),
                None => groups.push((place, vec![i])),
            }
        }
        groups
    }

    /// A request of one identity that can share a call (`request`, the one
    /// item of `batch`): decided alone when its lane is idle, by the lane's
    /// next call otherwise.
    async fn decide_shared(
        &self,
        coalescer: &Arc<Coalescer>,
        (target, slot): (Target, u16),
        request: Request,
        batch: &Batch,
        now: Option<i64>,
    ) -> Result<BatchOutcome, StoreError> {
        match coalescer.join(Lane { target, slot }, request) {
            Turn::First(hand_off, request) => {
                let keys = [request.key];
                let outcome = self
                    .decide_whole((target, slot), batch, &[0], &keys, now)
                    .await;
                drop(hand_off);
                outcome
            }
            Turn::Queued(queued) => coalescer.wait(queued, &batch.items[0]).await,
        }
    }

    /// A request whose counters live in several groups (Cluster slots, or
    /// the per-second Redis): one call per group, in parallel; what the
    /// groups counted is refunded when the request is not admitted.
    async fn decide_groups(
        &self,
        groups: &[((Target, u16), Vec<usize>)],
        batch: &Batch,
        keys: &[String],
        now: Option<i64>,
    ) -> Result<BatchOutcome, StoreError> {
        let replies = join_all(
            groups
                .iter()
                .map(|(place, items)| self.decide_part(*place, batch, items, keys, false, now)),
        )
        .await;
        // Each item's limit outcomes, and whether its group counted it. A
        // group that timed out is reconciled on its own (see `decide_part`).
        let mut per_item: Vec<Option<ItemPart>> = vec![None; batch.items.len()];
        let mut error = None;
        for ((_, items), reply) in groups.iter().zip(&replies) {
            match reply {
                Ok(reply) => {
                    let mut values = answers(reply, false);
                    for &i in items {
                        let limits = values.by_ref().take(batch.items[i].limits.len()).collect();
                        per_item[i] = Some((limits, reply[0] == 1));
                    }
                }
                Err(e) => error = Some(e.clone()),
            }
        }
        let admitted = error.is_none() && parts_admit(batch, &per_item);
        if !admitted {
            self.refund_parts(batch, keys, &per_item).await;
        }
        if let Some(e) = error {
            return Err(e);
        }
        let limits = batch
            .items
            .iter()
            .zip(per_item)
            .flat_map(|(item, outcome)| {
                let (limits, _) = outcome.expect("every group answered");
                // A refunded part reports the counter as it stands again.
                limits.into_iter().map(move |a| a.outcome(item, admitted))
            })
            .collect();
        Ok(BatchOutcome { admitted, limits })
    }

    /// Takes back what the groups of a request that was not admitted
    /// counted, in a task of its own: a caller that goes away must not cut
    /// a refund short.
    async fn refund_parts(&self, batch: &Batch, keys: &[String], per_item: &[Option<ItemPart>]) {
        let parts = per_item
            .iter()
            .zip(&batch.items)
            .zip(keys)
            .filter_map(|((outcome, item), key)| match outcome {
                // Refunds and always-counted debits stand whatever the
                // request decides.
                _ if item.stands() => None,
                Some((answers, true)) => {
                    let target = self.shared.target(item.limits.iter().map(|l| &l.window));
                    Some((Owed::new(target, key, item), answers.clone()))
                }
                _ => None,
            })
            .collect();
        let shared = self.shared.clone();
        let _ = tokio::spawn(async move { shared.refund(parts, shared.timeout).await }).await;
    }
}

impl CounterStore for RedisStore {
    fn script_runner(&self) -> Option<ScriptRunner> {
        Some(ScriptRunner {
            shared: self.shared.clone(),
            prefix: self.prefix.clone(),
        })
    }

    /// Ready while Redis can take calls: the one server connected (and its
    /// breaker closed); on a Cluster, any primary connected. A Cluster with
    /// a shard down still serves the other shards' slots, and taking this
    /// replica out of rotation would not bring the shard back.
    fn is_ready(&self) -> bool {
        std::iter::once(&self.shared.route)
            .chain(&self.shared.per_second)
            .all(|route| match route {
                Route::Single(node) => {
                    node.is_connected()
                        && (self.shared.breaker.is_none()
                            || !node.circuit.is_open(self.shared.clock.now()))
                }
                Route::Cluster(cluster) => cluster.is_ready(),
            })
    }

    /// One script call deleting the identity's HASH, on the node that owns
    /// it (the windows share that HASH).
    async fn reset(&self, identity: &Identity, windows: &[Window]) -> Result<(), StoreError> {
        let key = identity.storage_key(&self.prefix);
        let target = self.shared.target(windows.iter());
        let eval = Eval::new(
            &Script::new(RESET),
            &[&key],
            self.shared.slot(target, &key),
            0,
        );
        self.shared
            .clone()
            .send(target, eval, call::Guard::Breaker)
            .await
            .map(drop)
    }

    /// One of three strategies: a request of one identity with the
    /// default's shape shares its Redis's calls (`redis/coalesce.rs`); a
    /// request whose counters all live in one place is one call; otherwise
    /// one call per slot group.
    async fn apply(&self, batch: &Batch) -> Result<BatchOutcome, StoreError> {
        let now = self.shared.script_now();
        if let [item] = &batch.items[..] {
            let key = item.identity.storage_key(&self.prefix);
            let place = self.place(item, &key);
            return match self.coalesce.as_ref().zip(coalesce::shared_limit(item)) {
                Some((coalescer, limit)) => {
                    let request = Request {
                        key,
                        limit,
                        hits: item.hits,
                    };
                    self.decide_shared(coalescer, place, request, batch, now)
                        .await
                }
                None => self.decide_whole(place, batch, &[0], &[key], now).await,
            };
        }
        let keys: Vec<String> = batch
            .items
            .iter()
            .map(|i| i.identity.storage_key(&self.prefix))
            .collect();
        match &self.groups(batch, &keys)[..] {
            [] => {
                self.decide_whole((Target::Main, 0), batch, &[], &keys, now)
                    .await
            }
            [(place, items)] => self.decide_whole(*place, batch, items, &keys, now).await,
            groups => self.decide_groups(groups, batch, &keys, now).await,
        }
    }
}

/// Whether a request split over groups is admitted, from each item's
/// answers (`None`: its group failed).
fn parts_admit(batch: &Batch, per_item: &[Option<ItemPart>]) -> bool {
    admits(
        batch
            .items
            .iter()
            .zip(per_item)
            .filter(|(item, _)| !item.refund)
            .map(|(item, outcome)| {
                let over = outcome
                    .as_ref()
                    .is_some_and(|(limits, _)| limits.iter().any(|a| a.over));
                (item.role, over)
            }),
    )
}
