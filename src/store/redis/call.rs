//! The call layer: sending one script call to the node that owns its keys
//! (following Cluster redirects, through the node's breaker), the caller's
//! deadline, and what becomes of a call that outlives it (waited for in a
//! task of its own, reconciled, what it counted refunded). The direct path
//! (`redis.rs`) and coalesced calls (`coalesce.rs`) both go through here.
//!
//! **Never twice.** A script call is sent once and never resent: it may have
//! counted. Only answers Redis gives *before* running anything (Cluster
//! redirects, `NOSCRIPT`) send it again.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::join_all;
use prometheus_client::metrics::counter::Counter;

use super::cluster::{self, Cluster};
use super::dial::{Dialer, Place};
use super::node::{Eval, Node, Redirect, Script, Sent};
use super::tls::RedisTls;
use super::url::{RedisUrl, Servers, parse_url};
use super::wire::{Answer, answers, push_head, push_refund};
use crate::limiter::{Clock, LimitSpec, Window};
use crate::store::{BatchItem, BreakerConfig, StoreError};
use crate::telemetry::metrics::ReconcileCounters;

/// How long a call that timed out is still awaited, to refund what it
/// counted.
pub(super) const RECONCILE_WAIT: Duration = Duration::from_secs(5);
/// Redirects one call follows at most (a slot migrating twice in a row is
/// already rare).
const MAX_REDIRECTS: usize = 5;
/// Pause before resending after `TRYAGAIN` (a migration moving the keys).
const TRYAGAIN_PAUSE: Duration = Duration::from_millis(5);
/// How long a call waits for a node it just learned of to connect.
const NEW_NODE_GRACE: Duration = Duration::from_secs(1);

/// What a call needs, shared with the background tasks that finish calls
/// their callers stopped waiting for.
pub(super) struct Shared {
    pub(super) route: Route,
    /// Where one-second limits go, when a Redis of their own is set.
    pub(super) per_second: Option<Route>,
    pub(super) decide: Script,
    /// Decides many requests of one shape at once (see `coalesce.rs`).
    pub(super) batch: Script,
    pub(super) refund: Script,
    pub(super) breaker: Option<BreakerConfig>,
    /// The breakers' clock, and the scripts' in local time mode.
    pub(super) clock: Arc<dyn Clock>,
    /// In local time mode, `now` is sent to the script.
    pub(super) local_time: bool,
    /// Longest wait for one decision (`RedisStoreConfig::timeout`).
    pub(super) timeout: Duration,
    /// Refund calls sent and not yet answered, and those that failed.
    pub(super) refunds: RefundCounts,
}

/// Refund calls: how many are in flight, how many failed (their hits stay
/// counted until their window passes).
#[derive(Default)]
pub(super) struct RefundCounts {
    pub(super) in_flight: AtomicU64,
    pub(super) failed: AtomicU64,
    /// Where failures are also counted for the metrics, once told.
    pub(super) failures_metric: OnceLock<Counter>,
    /// What became of calls that outlived their caller, once told.
    pub(super) reconciled_metric: OnceLock<ReconcileCounters>,
}

/// Which Redis a call goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Target {
    /// `url`: every counter but those that go to `PerSecond`.
    Main,
    /// `per_second_url`, when set.
    PerSecond,
}

/// Where calls go.
pub(super) enum Route {
    /// One server, or the primary a Sentinel names (followed on every
    /// reconnect).
    Single(Arc<Node>),
    /// Redis Cluster, routed by slot here.
    Cluster(Arc<Cluster>),
}

impl Route {
    /// Connects to `url` with `config`'s pool, TLS and timeout.
    pub(super) async fn connect(
        url: &RedisUrl,
        pool_size: usize,
        tls: &RedisTls,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let invalid = |e: String| StoreError::Unavailable(format!("invalid Redis URL {url}: {e}"));
        let endpoint = parse_url(url).map_err(invalid)?;
        if !tls.is_default() && !endpoint.tls {
            return Err(invalid(
                "TLS files are set but the URL is not rediss:// (REDIS_TLS=true)".into(),
            ));
        }
        let tls = match endpoint.tls {
            true => Some(tls.client_config().map_err(StoreError::Unavailable)?),
            false => None,
        };
        let dialer = Arc::new(Dialer::new(&endpoint, tls, connect_timeout));
        let size = pool_size.max(1);
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
    pub(super) fn nodes(&self) -> Vec<Arc<Node>> {
        match self {
            Route::Single(node) => vec![node.clone()],
            Route::Cluster(cluster) => cluster.nodes(),
        }
    }
}

impl Shared {
    /// Where counters of `windows` live: the per-second Redis when there is
    /// one and every window is one second long, the main one otherwise.
    pub(super) fn target<'a>(&self, windows: impl Iterator<Item = &'a Window>) -> Target {
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
    pub(super) fn slot(&self, target: Target, key: &str) -> u16 {
        match self.route(target) {
            Route::Cluster(_) => cluster::slot(key.as_bytes()),
            Route::Single(_) => 0,
        }
    }

    /// The `now` a decision sends to the script: `None` reads Redis's clock.
    pub(super) fn script_now(&self) -> Option<i64> {
        self.local_time
            .then(|| i64::try_from(self.clock.now()).unwrap_or(i64::MAX))
    }

    /// A decide.lua call on `keys` (in `slot`) with its first arguments,
    /// `now` and whether it is the whole request, and room for `args` more.
    pub(super) fn decide_eval<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k str, IntoIter: ExactSizeIterator + Clone>,
        slot: u16,
        (now, whole): (Option<i64>, bool),
        args: usize,
    ) -> Eval {
        let mut eval = Eval::new(&self.decide, keys, slot, 2 + args);
        push_head(&mut eval.cmd, now, if whole { "all" } else { "part" });
        eval
    }

    pub(super) fn route(&self, target: Target) -> &Route {
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
    pub(super) async fn send(
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
    pub(super) fn timed_out(&self, target: Target, slot: u16, started: u64) {
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
    pub(super) async fn refund(
        self: &Arc<Self>,
        parts: Vec<(Owed, Vec<Answer>)>,
        timeout: Duration,
    ) {
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
            push_refund(args, &owed.limits, &answers, owed.hits, self.clock.now());
            group_keys.push(owed.key);
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
pub(super) struct InFlight<'a> {
    count: &'a AtomicU64,
    left: u64,
}

impl<'a> InFlight<'a> {
    pub(super) fn new(count: &'a AtomicU64, calls: u64) -> Self {
        count.fetch_add(calls, Ordering::SeqCst);
        Self { count, left: calls }
    }

    /// One call was answered (or failed).
    pub(super) fn answered(&mut self) {
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
pub(super) struct Owed {
    pub(super) target: Target,
    pub(super) key: String,
    pub(super) limits: Vec<LimitSpec>,
    pub(super) hits: u64,
}

impl Owed {
    /// What `item`, counted at `key` in `target`'s Redis, would give back.
    pub(super) fn new(target: Target, key: &str, item: &BatchItem) -> Owed {
        Owed {
            target,
            key: key.to_owned(),
            limits: item.limits.clone(),
            hits: item.hits,
        }
    }
}

/// Whoever waits for a call's reply.
pub(super) trait Waiting: Send + Sync {
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
pub(super) enum Guard {
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
    /// Refunds what a call counted (`reply`, the whole reply of decide.lua
    /// for `owed`) after its caller was told `Timeout`.
    pub(super) async fn reconcile(
        self: Arc<Self>,
        reply: Vec<i64>,
        owed: Vec<Owed>,
        expected: usize,
        whole: bool,
    ) {
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

/// A call's reply still to come, boxed so that it can move to a task of its
/// own.
type Sending = Pin<Box<dyn Future<Output = Result<Vec<i64>, StoreError>> + Send>>;

/// What became of a call within its caller's deadline.
pub(super) enum Called {
    /// Its reply (or why there is none) came in time.
    Replied(Result<Vec<i64>, StoreError>),
    /// The deadline passed first: the script may still run.
    Late(Late),
}

/// A call that outlived its caller's deadline, still in flight.
pub(super) struct Late {
    sent: Sending,
    shared: Arc<Shared>,
}

impl Late {
    /// Leaves the call to finish in a task of its own, which waits for its
    /// reply (at most [`RECONCILE_WAIT`], counted in the reconciliation
    /// metrics) and hands it to `settle` to take back what it counted.
    pub(super) fn reconcile<F, Fut>(self, settle: F)
    where
        F: FnOnce(Arc<Shared>, Vec<i64>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Late { sent, shared } = self;
        tokio::spawn(async move {
            let late = tokio::time::timeout(RECONCILE_WAIT, sent).await;
            if let Some(reply) = late_reply(&shared.refunds, late) {
                settle(shared, reply).await;
            }
        });
    }
}

impl Shared {
    /// Sends `eval` to `target`'s Redis and waits for its reply at most the
    /// store's timeout, in the caller's task. (A caller that goes away, its
    /// gRPC request cancelled, drops the call: sent or not, the script
    /// counts or not as one, and nobody was told anything.) `waiting` says
    /// whether anyone still waits for the reply, for the node's breaker.
    pub(super) async fn call(
        self: &Arc<Self>,
        target: Target,
        eval: Eval,
        waiting: Arc<dyn Waiting>,
    ) -> Called {
        self.call_within(target, eval, waiting, self.timeout).await
    }

    /// [`Shared::call`], waiting at most `within` (a shared call: what is
    /// left of its members' earliest timeout).
    pub(super) async fn call_within(
        self: &Arc<Self>,
        target: Target,
        eval: Eval,
        waiting: Arc<dyn Waiting>,
        within: Duration,
    ) -> Called {
        let guard = Guard::Abandonable(waiting);
        let mut sent: Sending = Box::pin(self.clone().send(target, eval, guard));
        match tokio::time::timeout(within, &mut sent).await {
            Ok(reply) => Called::Replied(reply),
            Err(_) => Called::Late(Late {
                sent,
                shared: self.clone(),
            }),
        }
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
