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

mod cluster;
mod coalesce;
mod dial;
#[cfg(feature = "bench")]
mod info;
mod node;
mod tls;
mod url;
mod wire;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::join_all;
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};

use self::cluster::Cluster;
pub use self::coalesce::Coalescing;
use self::coalesce::{Lane, Lanes, Turn};
use self::dial::{Dialer, Place};
#[cfg(feature = "bench")]
pub use self::info::server_info;
use self::node::{Eval, Node, Redirect, Script, Sent};
pub use self::tls::RedisTls;
pub use self::url::RedisUrl;
use self::url::{Servers, parse_url};
use self::wire::{Answer, ItemPart, LIMIT_ARGS, answer_len, answers, hits, limit_args};
use super::{Batch, BatchItem, BatchOutcome, BreakerConfig, CounterStore, StoreError};
use crate::limiter::{Clock, Counting, Identity, LimitSpec, Role, Window, admits};
use crate::telemetry::metrics::ReconcileCounters;

/// Assembled by build.rs from `redis/decide/` (see its `prelude.lua`).
const DECIDE: &str = include_str!(concat!(env!("OUT_DIR"), "/decide.lua"));
const REFUND: &str = include_str!("redis/refund.lua");
const RESET: &str = include_str!("redis/reset.lua");

/// How long a call that timed out is still awaited, to refund what it
/// counted.
const RECONCILE_WAIT: Duration = Duration::from_secs(5);
/// Redirects one call follows at most (a slot migrating twice in a row is
/// already rare).
const MAX_REDIRECTS: usize = 5;
/// Pause before resending after `TRYAGAIN` (a migration moving the keys).
const TRYAGAIN_PAUSE: Duration = Duration::from_millis(5);
/// How long a call waits for a node it just learned of to connect.
const NEW_NODE_GRACE: Duration = Duration::from_secs(1);

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
    coalesce: bool,
}

/// What a call needs, shared with the background tasks that finish calls
/// their callers stopped waiting for.
struct Shared {
    route: Route,
    /// Where one-second limits go, when a Redis of their own is set.
    per_second: Option<Route>,
    decide: Script,
    refund: Script,
    breaker: Option<BreakerConfig>,
    /// The breakers' clock, and the scripts' in local time mode.
    clock: Arc<dyn Clock>,
    /// In local time mode, `now` is sent to the script.
    local_time: bool,
    /// Longest wait for one decision (`RedisStoreConfig::timeout`).
    timeout: Duration,
    /// Hot counters' queues (see `redis/coalesce.rs`).
    lanes: Lanes,
    /// Refund calls sent and not yet answered, and those that failed.
    refunds: RefundCounts,
}

/// Refund calls: how many are in flight, how many failed (their hits stay
/// counted until their window passes).
#[derive(Default)]
struct RefundCounts {
    in_flight: AtomicU64,
    failed: AtomicU64,
    /// Where failures are also counted for the metrics, once told.
    failures_metric: OnceLock<Counter>,
    /// What became of calls that outlived their caller, once told.
    reconciled_metric: OnceLock<ReconcileCounters>,
}

/// What [`RedisStore::refunds`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refunds {
    /// Refund calls sent and not yet answered (or timed out).
    pub in_flight: u64,
    /// Refund calls that failed so far (each is also logged).
    pub failed: u64,
}

/// Which Redis a call goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Target {
    /// `url`: every counter but those that go to `PerSecond`.
    Main,
    /// `per_second_url`, when set.
    PerSecond,
}

/// Where calls go.
enum Route {
    /// One server, or the primary a Sentinel names (followed on every
    /// reconnect).
    Single(Arc<Node>),
    /// Redis Cluster, routed by slot here.
    Cluster(Arc<Cluster>),
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
            .send(Target::Main, eval, Guard::Breaker)
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
        let route = Route::connect(&config.url, config, connect_timeout).await?;
        let per_second = match &config.per_second_url {
            Some(url) => Some(Route::connect(url, config, connect_timeout).await?),
            None => None,
        };
        let shared = Arc::new(Shared {
            route,
            per_second,
            decide: Script::new(DECIDE),
            refund: Script::new(REFUND),
            breaker: config.breaker,
            clock,
            local_time: config.time == TimeSource::Local,
            timeout: config.timeout,
            lanes: Lanes::default(),
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
            for script in [&shared.decide, &shared.refund] {
                let loaded: Result<redis::Value, _> = node.command(&script.load()).await;
                if let Err(e) = loaded {
                    tracing::warn!(error = %e, node = %node.name(), "could not load the Redis scripts yet");
                }
            }
        }
        Ok(Self {
            shared,
            prefix: config.key_prefix.clone(),
            coalesce: config.coalesce,
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
        self.shared.lanes.now()
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
        // Per item its role, hits and number of limits, and each limit's
        // arguments.
        let mut eval = self.shared.decide_eval(
            items.iter().map(|&i| keys[i].as_ref()),
            slot,
            (now, whole),
            3 * items.len() + LIMIT_ARGS * limit_count,
        );
        let args = &mut eval.cmd;
        for &i in items {
            let item = &batch.items[i];
            let role = match item.role {
                _ if item.refund => 3,
                Role::Enforce => 0,
                Role::Shadow => 1,
                Role::Quota => 2,
            } + if item.counting == Counting::Always && !item.refund {
                4
            } else {
                0
            };
            args.arg(role).arg(hits(item.hits)).arg(item.limits.len());
            for limit in &item.limits {
                args.arg(&limit_args(limit)[..]);
            }
        }
        let expected = 1 + answer_len(whole) * limit_count;
        let started = self.shared.clock.now();
        let abandoned = Arc::new(AtomicBool::new(false));
        // Run in the caller's task; boxed, so that it can move to a task of
        // its own past the timeout. (A caller that goes away, its gRPC
        // request cancelled, drops the call: sent or not, the script counts
        // or not as one, and nobody was told anything.)
        let mut sent = Box::pin(self.shared.clone().send(
            target,
            eval,
            Guard::Abandonable(abandoned.clone()),
        ));
        let reply = match tokio::time::timeout(self.shared.timeout, &mut sent).await {
            Ok(reply) => reply?,
            Err(_) => {
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
                let shared = self.shared.clone();
                tokio::spawn(async move {
                    let late = tokio::time::timeout(RECONCILE_WAIT, sent).await;
                    shared.reconcile(late, owed, expected, whole).await;
                });
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
}

impl Route {
    /// Connects to `url` with `config`'s pool, TLS and timeout.
    async fn connect(
        url: &RedisUrl,
        config: &RedisStoreConfig,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let invalid = |e: String| StoreError::Unavailable(format!("invalid Redis URL {url}: {e}"));
        let endpoint = parse_url(url).map_err(invalid)?;
        if !config.tls.is_default() && !endpoint.tls {
            return Err(invalid(
                "TLS files are set but the URL is not rediss:// (REDIS_TLS=true)".into(),
            ));
        }
        let tls = match endpoint.tls {
            true => Some(
                config
                    .tls
                    .client_config()
                    .map_err(StoreError::Unavailable)?,
            ),
            false => None,
        };
        let dialer = Arc::new(Dialer::new(&endpoint, tls, connect_timeout));
        let size = config.pool_size.max(1);
        let name = || url.to_string().into();
        Ok(match endpoint.servers {
            Servers::Cluster(seeds) => {
                Route::Cluster(Cluster::connect(dialer, seeds, size, connect_timeout).await)
            }
            Servers::Single(address) => Route::Single(Arc::new(Node::new(
                name(),
                dialer,
                Place::At(address),
                size,
            ))),
            Servers::Sentinel { sentinels, service } => {
                let place = Place::Primary { sentinels, service };
                Route::Single(Arc::new(Node::new(name(), dialer, place, size)))
            }
        })
    }

    /// The nodes known now.
    fn nodes(&self) -> Vec<Arc<Node>> {
        match self {
            Route::Single(node) => vec![node.clone()],
            Route::Cluster(cluster) => cluster.nodes(),
        }
    }
}

impl Shared {
    /// Where counters of `windows` live: the per-second Redis when there is
    /// one and every window is one second long, the main one otherwise.
    fn target<'a>(&self, windows: impl Iterator<Item = &'a Window>) -> Target {
        let mut windows = windows.peekable();
        let all_seconds = windows.peek().is_some() && windows.all(|w| w.duration_ms == 1_000);
        if self.per_second.is_some() && all_seconds {
            Target::PerSecond
        } else {
            Target::Main
        }
    }

    /// The Cluster slot of `key` in `target`'s Redis; 0 where that is not
    /// a Cluster (nothing routes by it there).
    fn slot(&self, target: Target, key: &str) -> u16 {
        match self.route(target) {
            Route::Cluster(_) => cluster::slot(key.as_bytes()),
            Route::Single(_) => 0,
        }
    }

    /// The `now` a decision sends to the script: `None` reads Redis's clock.
    fn script_now(&self) -> Option<i64> {
        self.local_time
            .then(|| i64::try_from(self.clock.now()).unwrap_or(i64::MAX))
    }

    /// A decide.lua call on `keys` (in `slot`) with its first arguments,
    /// `now` and whether it is the whole request, and room for `args` more.
    fn decide_eval<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k str, IntoIter: ExactSizeIterator + Clone>,
        slot: u16,
        (now, whole): (Option<i64>, bool),
        args: usize,
    ) -> Eval {
        let mut eval = Eval::new(&self.decide, keys, slot, 2 + args);
        match now {
            Some(now) => eval.cmd.arg(now),
            None => eval.cmd.arg(""),
        };
        eval.cmd.arg(if whole { "all" } else { "part" });
        eval
    }

    fn route(&self, target: Target) -> &Route {
        match (target, &self.per_second) {
            (Target::PerSecond, Some(route)) => route,
            _ => &self.route,
        }
    }
}

impl Shared {
    /// Runs a script once on the node owning `keys`, following Cluster
    /// redirects (answers given before anything ran), never resending after
    /// anything else.
    async fn send(
        self: Arc<Self>,
        target: Target,
        eval: Eval,
        guard: Guard,
    ) -> Result<Vec<i64>, StoreError> {
        let eval = &eval;
        let guard = &guard;
        let cluster = match self.route(target) {
            Route::Single(node) => {
                return match self.run_on(node, eval, false, guard).await {
                    Sent::Reply(reply) => Ok(reply),
                    Sent::Failed(e) => Err(e),
                    Sent::Redirect(r) => Err(StoreError::Unavailable(format!(
                        "a Cluster redirect ({r:?}) from a Redis not configured as a Cluster; use redis-cluster://"
                    ))),
                };
            }
            Route::Cluster(cluster) => cluster,
        };
        let slot = eval.slot;
        let mut next: Option<(Arc<Node>, bool)> = None;
        for _ in 0..=MAX_REDIRECTS {
            let (node, asking) = match next.take() {
                Some(target) => target,
                None => (cluster.node_for(slot)?, false),
            };
            if !node.is_connected() && node.age() < NEW_NODE_GRACE {
                // Nothing sent yet: waiting for a new node is safe.
                node.wait_connected(NEW_NODE_GRACE).await;
            }
            match self.run_on(&node, eval, asking, guard).await {
                Sent::Reply(reply) => return Ok(reply),
                Sent::Failed(e) => {
                    cluster.refresh_soon();
                    return Err(e);
                }
                Sent::Redirect(Redirect::Moved { slot, address }) => {
                    next = Some((cluster.moved(slot, &address)?, false));
                }
                Sent::Redirect(Redirect::Ask { address }) => {
                    next = Some((cluster.node_at(&address)?, true));
                }
                Sent::Redirect(Redirect::TryAgain) => tokio::time::sleep(TRYAGAIN_PAUSE).await,
                Sent::Redirect(Redirect::Down(why)) => {
                    cluster.refresh_soon();
                    return Err(StoreError::Unavailable(format!(
                        "Redis Cluster cannot serve slot {slot}: {why}"
                    )));
                }
            }
        }
        Err(StoreError::Unavailable(format!(
            "Redis Cluster slot {slot}: more than {MAX_REDIRECTS} redirects in one call"
        )))
    }

    /// One attempt on `node`, through its breaker as `guard` says.
    async fn run_on(&self, node: &Node, eval: &Eval, asking: bool, guard: &Guard) -> Sent {
        let started = self.clock.now();
        if self.breaker.is_some()
            && !matches!(guard, Guard::Bypass)
            && let Err(e) = node.circuit.check(started)
        {
            return Sent::Failed(e);
        }
        let sent = node.run(eval, asking).await;
        let counts = match guard {
            Guard::Breaker => true,
            Guard::Abandonable(waiting) => !waiting.abandoned(),
            Guard::Bypass => false,
        };
        if let Some(config) = self.breaker.as_ref().filter(|_| counts) {
            match &sent {
                Sent::Reply(_) => node.circuit.succeeded(),
                Sent::Failed(_) => node.circuit.failed(config, started, self.clock.now()),
                Sent::Redirect(_) => {}
            }
        }
        sent
    }

    /// The caller of a call on `slot` stopped waiting: counts against the
    /// breaker of the node that serves it.
    fn timed_out(&self, target: Target, slot: u16, started: u64) {
        let Some(config) = &self.breaker else {
            return;
        };
        let node = match self.route(target) {
            Route::Single(node) => node.clone(),
            Route::Cluster(cluster) => match cluster.node_for(slot) {
                Ok(node) => node,
                Err(_) => return,
            },
        };
        node.circuit.failed(config, started, self.clock.now());
    }

    /// Takes back the hits of `parts` (counted by decide.lua): one call per
    /// slot, since a script may only touch keys of one slot. Each call waits
    /// at most `timeout`; a refund that fails is logged (its hits stay
    /// counted until their window passes).
    async fn refund(self: &Arc<Self>, parts: Vec<(Owed, Vec<Answer>)>, timeout: Duration) {
        // Where each refund call goes (a Redis and a slot): its keys and
        // arguments.
        type Place = (Target, u16);
        let mut by_slot: Vec<(Place, Vec<String>, Vec<i64>)> = Vec::new();
        for (owed, answers) in parts {
            let place = (owed.target, self.slot(owed.target, &owed.key));
            let group = match by_slot.iter().position(|(p, _, _)| *p == place) {
                Some(g) => g,
                None => {
                    by_slot.push((place, Vec::new(), Vec::new()));
                    by_slot.len() - 1
                }
            };
            let (_, group_keys, args) = &mut by_slot[group];
            group_keys.push(owed.key);
            args.push(answers.len() as i64);
            for (limit, answer) in owed.limits.iter().zip(&answers) {
                args.extend(limit_args(limit));
                args.extend([answer.slot, hits(owed.hits)]);
            }
        }
        let counts = &self.refunds;
        let mut in_flight = InFlight::new(&counts.in_flight, by_slot.len() as u64);
        let calls = by_slot.into_iter().map(|((target, slot), keys, args)| {
            let mut eval = Eval::new(&self.refund, &keys, slot, args.len());
            eval.cmd.arg(args);
            tokio::time::timeout(timeout, self.clone().send(target, eval, Guard::Bypass))
        });
        for result in join_all(calls).await {
            let error = match result {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some(StoreError::Timeout(timeout)),
            };
            if let Some(error) = error {
                counts.failed.fetch_add(1, Ordering::SeqCst);
                if let Some(metric) = counts.failures_metric.get() {
                    metric.inc();
                }
                tracing::error!(error = %error, "could not refund hits counted for a request that was not admitted; they stay counted until their window passes");
            }
            in_flight.answered();
        }
    }
}

/// Calls counted in flight until each is answered, or until this is
/// dropped (a task dropped mid-call, at shutdown).
struct InFlight<'a> {
    count: &'a AtomicU64,
    left: u64,
}

impl<'a> InFlight<'a> {
    fn new(count: &'a AtomicU64, calls: u64) -> Self {
        count.fetch_add(calls, Ordering::SeqCst);
        Self { count, left: calls }
    }

    /// One call was answered (or failed).
    fn answered(&mut self) {
        self.left -= 1;
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(self.left, Ordering::SeqCst);
    }
}

/// What one item of a call counted, should it have to be taken back.
struct Owed {
    target: Target,
    key: String,
    limits: Vec<LimitSpec>,
    hits: u64,
}

impl Owed {
    /// What `item`, counted at `key` in `target`'s Redis, would give back.
    fn new(target: Target, key: &str, item: &BatchItem) -> Owed {
        Owed {
            target,
            key: key.to_owned(),
            limits: item.limits.clone(),
            hits: item.hits,
        }
    }
}

/// Whoever waits for a call's reply.
trait Waiting: Send + Sync {
    /// Whether nobody does any more.
    fn abandoned(&self) -> bool;
}

/// Set when the one caller stops waiting.
impl Waiting for AtomicBool {
    fn abandoned(&self) -> bool {
        self.load(Ordering::Relaxed)
    }
}

/// How a call meets its node's breaker.
enum Guard {
    /// Refused while the breaker is open; its outcome moves the breaker.
    Breaker,
    /// The same until nobody waits for the reply any more: its callers
    /// stopped waiting (which already counted against the breaker), so a
    /// late reply must not close a breaker that a slow Redis should open.
    Abandonable(Arc<dyn Waiting>),
    /// Neither refused nor counted: refunds, which keep counters true and
    /// go to a Redis that has just answered.
    Bypass,
}

impl Shared {
    /// Refunds what a call counted after its caller was told `Timeout`.
    async fn reconcile(
        self: Arc<Self>,
        late: Result<Result<Vec<i64>, StoreError>, tokio::time::error::Elapsed>,
        owed: Vec<Owed>,
        expected: usize,
        whole: bool,
    ) {
        let Some(reply) = late_reply(&self.refunds, late) else {
            return;
        };
        if reply.len() != expected || reply[0] != 1 {
            // Not counted (rejected), or not a reply we can read.
            return;
        }
        let mut values = answers(&reply, whole);
        let parts: Vec<(Owed, Vec<Answer>)> = owed
            .into_iter()
            .map(|o| {
                let answers = values.by_ref().take(o.limits.len()).collect();
                (o, answers)
            })
            .filter(|(o, _)| o.hits > 0)
            .collect();
        if parts.is_empty() {
            return;
        }
        tracing::info!(
            items = parts.len(),
            "refunding a decision that ran after its caller's timeout"
        );
        self.refund(parts, RECONCILE_WAIT).await;
    }
}

/// The reply of a call that outlived its caller's timeout, awaited at most
/// [`RECONCILE_WAIT`]; `None` (logged) when there is none to reconcile.
fn late_reply(
    counts: &RefundCounts,
    late: Result<Result<Vec<i64>, StoreError>, tokio::time::error::Elapsed>,
) -> Option<Vec<i64>> {
    if let Some(metric) = counts.reconciled_metric.get() {
        match &late {
            Ok(Ok(_)) => metric.answered.inc(),
            Ok(Err(_)) => metric.failed.inc(),
            Err(_) => metric.no_reply.inc(),
        };
    }
    match late {
        Ok(Ok(reply)) => Some(reply),
        // Not run (refused, not sent), or the connection went down after
        // sending: nothing to take back that we can know of.
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "a Redis call that timed out then failed");
            None
        }
        Err(_) => {
            tracing::warn!(wait = ?RECONCILE_WAIT, "a Redis call that timed out gave no answer; if it ran, its hits stay counted until their window passes");
            None
        }
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
            .send(target, eval, Guard::Breaker)
            .await
            .map(drop)
    }

    async fn apply(&self, batch: &Batch) -> Result<BatchOutcome, StoreError> {
        let now = self.shared.script_now();
        if let [item] = &batch.items[..] {
            // One descriptor (the usual request): one call, nothing to group.
            let key = item.identity.storage_key(&self.prefix);
            let target = self.shared.target(item.limits.iter().map(|l| &l.window));
            let place = (target, self.shared.slot(target, &key));
            if self.coalesce
                && let Some(limit) = coalesce::shared_limit(item)
            {
                let (target, slot) = place;
                let lane = Lane {
                    target,
                    slot,
                    key,
                    limit,
                };
                return match self.shared.join(lane, item.hits) {
                    Turn::First(next) => {
                        let keys = [next.lane.key.as_str()];
                        self.decide_whole(place, batch, &[0], &keys, now).await
                    }
                    Turn::Queued(queued) => self.shared.wait(queued, item).await,
                };
            }
            return self.decide_whole(place, batch, &[0], &[key], now).await;
        }
        let keys: Vec<String> = batch
            .items
            .iter()
            .map(|i| i.identity.storage_key(&self.prefix))
            .collect();
        // Which Redis each item's counters live in.
        let targets: Vec<Target> = batch
            .items
            .iter()
            .map(|item| self.shared.target(item.limits.iter().map(|l| &l.window)))
            .collect();
        // Group items by Redis and cluster slot; one group when every
        // counter lives in one Redis that is not a cluster.
        let mut groups: Vec<((Target, u16), Vec<usize>)> = Vec::new();
        for (i, (key, &target)) in keys.iter().zip(&targets).enumerate() {
            let slot = self.shared.slot(target, key);
            match groups.iter_mut().find(|(p, _)| *p == (target, slot)) {
                Some((_, members)) => members.push(i),
                None => groups.push(((target, slot), vec![i])),
            }
        }
        if groups.len() <= 1 {
            let place = groups.first().map_or((Target::Main, 0), |(p, _)| *p);
            let all: Vec<usize> = (0..batch.items.len()).collect();
            return self.decide_whole(place, batch, &all, &keys, now).await;
        }

        let replies = join_all(
            groups
                .iter()
                .map(|(place, items)| self.decide_part(*place, batch, items, &keys, false, now)),
        )
        .await;
        // Each item's limit outcomes and the slots its hits went to, and
        // whether its group counted it. A group that timed out is
        // reconciled on its own (see `decide_part`).
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
        let admitted = error.is_none()
            && admits(
                batch
                    .items
                    .iter()
                    .zip(&per_item)
                    .filter(|(item, _)| !item.refund)
                    .map(|(item, outcome)| {
                        let over = outcome
                            .as_ref()
                            .is_some_and(|(limits, _)| limits.iter().any(|a| a.over));
                        (item.role, over)
                    }),
            );
        if !admitted {
            let parts = per_item
                .iter()
                .enumerate()
                .filter_map(|(i, outcome)| match outcome {
                    // Refunds and always-counted debits stand whatever the
                    // request decides.
                    _ if batch.items[i].stands() => None,
                    Some((answers, true)) => Some((
                        Owed::new(targets[i], &keys[i], &batch.items[i]),
                        answers.clone(),
                    )),
                    _ => None,
                })
                .collect();
            // In a task of its own: a caller that goes away must not cut a
            // refund short.
            let shared = self.shared.clone();
            let _ = tokio::spawn(async move { shared.refund(parts, shared.timeout).await }).await;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_in_flight_are_taken_down_when_answered_or_dropped_unanswered() {
        let count = AtomicU64::new(0);
        let mut first = InFlight::new(&count, 3);
        let second = InFlight::new(&count, 2);
        assert_eq!(count.load(Ordering::SeqCst), 5);
        first.answered();
        assert_eq!(count.load(Ordering::SeqCst), 4);
        drop(second);
        assert_eq!(count.load(Ordering::SeqCst), 2);
        first.answered();
        first.answered();
        drop(first);
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }
}
