//! Coalescing: the requests of one hot counter, decided together.
//!
//! A counter that many requests hit at once (a tenant's limit, a global
//! one) would cost Redis one script call per request, most of it the
//! call's own overhead (reading and writing the HASH, running the chunk)
//! rather than the decision. So requests that can share a call (one
//! identity, one enforcing limit, counted only when admitted: the default's
//! shape, see [`shared_limit`]) queue per counter: while a call for that counter
//! is in flight, the next requests wait, and the call that follows carries
//! them all (up to [`MOST_PER_CALL`]). decide.lua decides them in turn, each
//! as if every earlier admitted one were counted: exactly what separate
//! calls in that order would decide. Coalescing adds no wait to a quiet
//! counter; on a busy one it trades up to one Redis round trip of latency
//! for far less work per request, in Redis and here.
//!
//! A request that finds its counter idle is decided by its own task, as
//! any other request (see [`Turn::First`]); the only cost is marking the
//! counter busy. When it is done (answered, timed out or cancelled), the
//! requests that queued meanwhile are handed to a task of their own, the
//! *flusher*, which makes one call at a time for whoever waits, until
//! nobody does: a caller that goes away must not take the others' call
//! with it.
//!
//! **Answers and counters agree.** A request is sent only while its caller
//! still waits. A caller that stops waiting after its request was sent (it
//! timed out, or was cancelled) is not told anything, so what its request
//! counted is refunded. A shared call that outlives the timeout is treated
//! as `decide_part` treats one: every request on it is told `Timeout`, a
//! task waits for the late reply, and refunds whatever it counted.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use super::call::{Called, Owed, RECONCILE_WAIT, Shared, Target, Waiting};
use super::wire::{Answer, ENFORCE, LIMIT_ARGS, answer_len, answers, hits, limit_args};
use crate::limiter::{Algorithm, Counting, LimitSpec, Role, admits};
use crate::store::{BatchItem, BatchOutcome, StoreError};

/// Most requests one call carries (each adds one argument and one reply
/// value; the rest wait for the next call).
pub(super) const MOST_PER_CALL: usize = 64;

/// Requests that can share a call: one counter and one limit, in one place.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Lane {
    pub(super) target: Target,
    pub(super) slot: u16,
    pub(super) key: String,
    pub(super) limit: LimitSpec,
}

/// The one limit of `item`, the one item of its request, when the request
/// can share a call; `None` when it cannot: more than one limit, a role
/// other than enforcing, a weight counted even when refused, a refund, or
/// an algorithm whose hits are not one number (a sliding log keeps each
/// request's time; a concurrency lease is released one by one).
pub(super) fn shared_limit(item: &BatchItem) -> Option<LimitSpec> {
    let [limit] = item.limits[..] else {
        return None;
    };
    let shareable = item.role == Role::Enforce
        && item.counting == Counting::Admitted
        && !item.refund
        && matches!(
            limit.window.algorithm,
            Algorithm::SlidingWindow { .. }
                | Algorithm::FixedWindow
                | Algorithm::TokenBucket { .. }
        );
    shareable.then_some(limit)
}

/// What the store is coalescing now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coalescing {
    /// Counters with a call in flight (or about to be).
    pub counters: usize,
    /// Requests waiting for their counter's call to end, to share the next.
    pub waiting: usize,
}

/// One request waiting in its lane.
struct Waiter {
    hits: u64,
    /// Taken when the request is answered (or told it timed out).
    tell: Option<oneshot::Sender<Result<Verdict, StoreError>>>,
}

/// What a shared call decided for one request.
#[derive(Debug)]
struct Verdict {
    admitted: bool,
    /// The counter before this request, and this limit's answer.
    answer: Answer,
}

/// The lanes with a call in flight (or about to be), and who waits in
/// each. Hashed with foldhash, randomly seeded per process (as the memory
/// store's shards): each request hashes its key twice.
#[derive(Default)]
pub(super) struct Lanes(Mutex<LaneMap>);

type LaneMap = HashMap<Lane, Vec<Waiter>, foldhash::fast::RandomState>;

impl Lanes {
    /// How many lanes are busy, and how many requests wait in them.
    pub(super) fn now(&self) -> Coalescing {
        let lanes = self.lock();
        Coalescing {
            counters: lanes.len(),
            waiting: lanes.values().map(Vec::len).sum(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LaneMap> {
        // Nothing panics while holding it; a poisoned map is still whole.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Frees `lane` when nobody can flush it any more, failing whoever
    /// waits there.
    fn abandon(&self, lane: &Lane) {
        if let Some(waiting) = self.lock().remove(lane) {
            fail(waiting, &dropped());
        }
    }
}

/// Coalesced calls: the lanes, over the call layer.
pub(super) struct Coalescer {
    calls: Arc<Shared>,
    lanes: Lanes,
}

impl Coalescer {
    /// Coalesces calls sent through `calls`.
    pub(super) fn new(calls: Arc<Shared>) -> Self {
        Self {
            calls,
            lanes: Lanes::default(),
        }
    }

    /// How many lanes are busy, and how many requests wait in them.
    pub(super) fn now(&self) -> Coalescing {
        self.lanes.now()
    }
}

/// A request's place in its lane.
pub(super) enum Turn {
    /// The lane was idle: the request is decided alone, by its caller; the
    /// lane is handed on when this is dropped (answered, timed out or
    /// cancelled alike).
    First(HandOff),
    /// A call is in flight: the request waits for the next one.
    Queued(Queued),
}

/// A request waiting in a lane (see [`Coalescer::wait`]).
pub(super) struct Queued {
    answer: oneshot::Receiver<Result<Verdict, StoreError>>,
    target: Target,
    slot: u16,
    started: u64,
}

/// Hands a lane on when its first request is done: to a flusher when
/// requests wait there, or back to idle.
pub(super) struct HandOff {
    coalescer: Arc<Coalescer>,
    pub(super) lane: Lane,
}

impl Drop for HandOff {
    fn drop(&mut self) {
        let mut lanes = self.coalescer.lanes.lock();
        if lanes.get(&self.lane).is_none_or(Vec::is_empty) {
            lanes.remove(&self.lane);
            return;
        }
        drop(lanes);
        // Dropped outside a runtime only when it is shutting down.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let coalescer = self.coalescer.clone();
                runtime.spawn(coalescer.flush(self.lane.clone()));
            }
            Err(_) => self.coalescer.lanes.abandon(&self.lane),
        }
    }
}

impl Coalescer {
    /// Joins `lane` with a request of weight `hits`.
    pub(super) fn join(self: &Arc<Self>, lane: Lane, hits: u64) -> Turn {
        match self.lanes.lock().entry(lane) {
            Entry::Occupied(mut queue) => {
                let (tell, answer) = oneshot::channel();
                queue.get_mut().push(Waiter {
                    hits,
                    tell: Some(tell),
                });
                Turn::Queued(Queued {
                    answer,
                    target: queue.key().target,
                    slot: queue.key().slot,
                    started: self.calls.clock.now(),
                })
            }
            Entry::Vacant(idle) => {
                let lane = idle.key().clone();
                idle.insert(Vec::new());
                Turn::First(HandOff {
                    coalescer: self.clone(),
                    lane,
                })
            }
        }
    }

    /// Waits (at most the store's timeout) for what a shared call decided
    /// for `item`, the one item of its request.
    pub(super) async fn wait(
        &self,
        queued: Queued,
        item: &BatchItem,
    ) -> Result<BatchOutcome, StoreError> {
        let timeout = self.calls.timeout;
        let mut answer = queued.answer;
        let told = match tokio::time::timeout(timeout, &mut answer).await {
            Ok(told) => told.map_err(|_| dropped()),
            Err(_) => {
                // Closed before a last look: a verdict sent from now on is
                // refused, so its flusher refunds what this request
                // counted; one sent since the timer fired is taken, not
                // lost behind a Timeout answer while its hits stay counted.
                answer.close();
                answer.try_recv().map_err(|_| StoreError::Timeout(timeout))
            }
        };
        let result = told.and_then(|verdict| {
            verdict.map(|v| BatchOutcome {
                admitted: v.admitted,
                limits: vec![v.answer.outcome(item, v.admitted)],
            })
        });
        // Told by its own timer or by the flusher's: each request that times
        // out counts against the breaker, as it does alone.
        if let Err(StoreError::Timeout(_)) = result {
            self.calls
                .timed_out(queued.target, queued.slot, queued.started);
        }
        result
    }

    /// The flusher of `lane`: one call at a time for whoever waits there,
    /// until nobody does.
    async fn flush(self: Arc<Self>, lane: Lane) {
        // Should this task end early (a panic), the lane must not stay
        // marked busy with nobody to flush it.
        let mut leaving = Leaving {
            lanes: &self.lanes,
            lane: Some(&lane),
        };
        loop {
            let mut members = {
                let mut lanes = self.lanes.lock();
                let Some(queue) = lanes.get_mut(&lane).filter(|q| !q.is_empty()) else {
                    lanes.remove(&lane);
                    leaving.lane = None;
                    return;
                };
                if queue.len() <= MOST_PER_CALL {
                    std::mem::take(queue)
                } else {
                    queue.drain(..MOST_PER_CALL).collect()
                }
            };
            // Who stopped waiting before anything was sent is not sent.
            members.retain(|m| m.tell.as_ref().is_some_and(|t| !t.is_closed()));
            if !members.is_empty() {
                self.call(&lane, members).await;
            }
        }
    }

    /// One call deciding `members` (at least one), in their order; past
    /// the timeout it is left to finish in the background and reconciled.
    async fn call(&self, lane: &Lane, members: Vec<Waiter>) {
        let calls = &self.calls;
        // As decide.lua takes them, after now and mode: the first request's
        // role (0, enforcing), weight and number of limits, the limit, then
        // the others' weights.
        let mut eval = calls.decide_eval(
            [lane.key.as_str()],
            lane.slot,
            (calls.script_now(), true),
            2 + LIMIT_ARGS + members.len(),
        );
        let args = &mut eval.cmd;
        args.arg(ENFORCE).arg(hits(members[0].hits)).arg(1);
        args.arg(&limit_args(&lane.limit)[..]);
        for member in &members[1..] {
            args.arg(hits(member.hits));
        }
        // Shared with the breaker's guard: a late reply, when every member
        // stopped waiting, must not close a breaker their timeouts opened.
        let members = Arc::new(Members(Mutex::new(members)));
        let reply = match calls.call(lane.target, eval, members.clone()).await {
            Called::Replied(reply) => reply,
            Called::Late(late) => {
                let timeout = calls.timeout;
                for member in members.lock().iter_mut() {
                    if let Some(tell) = member.tell.take() {
                        let _ = tell.send(Err(StoreError::Timeout(timeout)));
                    }
                }
                let lane = lane.clone();
                late.reconcile(move |shared, reply| async move {
                    let members = members.take();
                    tracing::info!(
                        requests = members.len(),
                        "refunding coalesced decisions that ran after their callers' timeout"
                    );
                    answer(&shared, &lane, members, &reply);
                });
                return;
            }
        };
        let members = members.take();
        match reply {
            Ok(reply) => answer(calls, lane, members, &reply),
            Err(e) => fail(members, &e),
        }
    }
}

/// Tells each member what `reply` decided for it, and refunds what was
/// counted for members no longer waiting (in a task of its own, so the
/// lane's next call does not wait for it).
fn answer(shared: &Arc<Shared>, lane: &Lane, members: Vec<Waiter>, reply: &[i64]) {
    // `applied` and the first request's answer, then one value for each
    // other request.
    let whole = answer_len(true);
    let Some(first) = (reply.len() == whole + members.len())
        .then(|| answers(&reply[..1 + whole], true).next())
        .flatten()
    else {
        let e = format!("unexpected script reply of {} values", reply.len());
        fail(members, &StoreError::Unavailable(e));
        return;
    };
    let (mut counted, mut unclaimed) = (0u64, 0u64);
    for (i, member) in members.into_iter().enumerate() {
        let over = if i == 0 {
            first.over
        } else {
            reply[whole + i] == 1
        };
        let admitted = admits([(Role::Enforce, over)]);
        let answer = Answer {
            before: first.before.saturating_add(counted),
            pending: 0,
            over,
            ..first
        };
        if admitted {
            counted = counted.saturating_add(member.hits);
        }
        let told = member
            .tell
            .is_some_and(|tell| tell.send(Ok(Verdict { admitted, answer })).is_ok());
        if admitted && !told {
            unclaimed = unclaimed.saturating_add(member.hits);
        }
    }
    if unclaimed > 0 {
        let owed = Owed {
            target: lane.target,
            key: lane.key.clone(),
            limits: vec![lane.limit],
            hits: unclaimed,
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            shared
                .refund(vec![(owed, vec![first])], RECONCILE_WAIT)
                .await;
        });
    }
}

/// Tells every member still waiting that its request failed with `e`.
fn fail(members: Vec<Waiter>, e: &StoreError) {
    for tell in members.into_iter().filter_map(|m| m.tell) {
        let _ = tell.send(Err(e.clone()));
    }
}

/// What a request is told when nobody is left to make its call.
fn dropped() -> StoreError {
    StoreError::Unavailable("the call carrying this request was dropped".into())
}

/// The members of one call, until they are answered.
struct Members(Mutex<Vec<Waiter>>);

impl Members {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self) -> Vec<Waiter> {
        std::mem::take(&mut *self.lock())
    }
}

impl Waiting for Members {
    fn abandoned(&self) -> bool {
        self.lock()
            .iter()
            .all(|m| m.tell.as_ref().is_none_or(|t| t.is_closed()))
    }
}

/// Frees a flusher's lane if the flusher ends without freeing it itself
/// (a panic), failing whoever waits there.
struct Leaving<'a> {
    lanes: &'a Lanes,
    lane: Option<&'a Lane>,
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        if let Some(lane) = self.lane {
            self.lanes.abandon(lane);
        }
    }
}
