//! Coalescing: the requests bound for one Redis, decided together.
//!
//! Most of what a decision costs Redis is the call's own overhead
//! (`EVALSHA`, reading the clock, running the chunk, each `redis.call`)
//! rather than the decision: callgrind counts about 28% fewer instructions
//! per decision when 8 requests of different identities share a call, and
//! far fewer when they share a counter (one read and one write for all). So
//! requests that can share a call (one identity, one enforcing limit,
//! counted only when admitted: the default's shape, see [`shared_limit`])
//! queue per *lane*: one Redis (per slot on a Cluster, since a script may
//! only touch keys of one slot). While a call of that lane is in flight,
//! the next requests wait, and the call that follows carries them all (up
//! to [`MOST_PER_CALL`]), each with its own key, weight and limit.
//! batch.lua decides them in runs, one per counter (requests of one key and
//! limit together, in their order), each request in turn as if every
//! earlier admitted one were counted: exactly what separate calls in that
//! order would decide. Coalescing adds no wait to a quiet Redis; on a busy
//! one it trades up to one Redis round trip of latency for far less work
//! per request, in Redis and here.
//!
//! A request that finds its lane idle is decided by its own task, as any
//! other request, with decide.lua (see [`Turn::First`]); the only cost is
//! marking the lane busy. When it is done (answered, timed out or
//! cancelled), the requests that queued meanwhile are handed to a task of
//! their own, the *flusher*, which makes one call at a time for whoever
//! waits, until nobody does: a caller that goes away must not take the
//! others' call with it.
//!
//! **Answers and counters agree.** A request is sent only while its caller
//! still waits and its timeout (counted from when it joined its lane) has
//! not run out; the flusher tells one whose timeout ran out while it
//! waited, so a waiting request needs no timer of its own (each one cost a
//! registration in Tokio's timer wheel and its removal). A caller that
//! stops waiting after its request was sent (cancelled) is not told
//! anything, so what its request counted is refunded. A shared call waits
//! at most what is left of its members' earliest timeout; one that
//! outlives it is left to the call layer (`call.rs`) as any call: every
//! request on it is told `Timeout`, a task waits for the late reply, and
//! refunds whatever it counted.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::call::{Called, Owed, RECONCILE_WAIT, Shared, Target, Waiting};
use super::node::Eval;
use super::wire::{
    Answer, PackedRuns, RunReply, batch_algorithms, batch_args, batch_limits, push_head,
    push_limits, runs,
};
use crate::limiter::{Algorithm, Counting, LimitSpec, Role, admits};
use crate::store::{BatchItem, BatchOutcome, StoreError};

/// Most requests one call carries (each adds one argument and one reply
/// value, a run of its own five more; the rest wait for the next call).
pub(super) const MOST_PER_CALL: usize = 64;

/// Requests that can share a call: one Redis, and one slot of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Lane {
    pub(super) target: Target,
    pub(super) slot: u16,
}

/// A request that can share a call: its counter, its one limit, its weight.
pub(super) struct Request {
    pub(super) key: String,
    pub(super) limit: LimitSpec,
    pub(super) hits: u64,
}

/// The one limit of `item`, the one item of its request, when the request
/// can share a call; `None` when it cannot: more than one limit, a role
/// other than enforcing, a weight counted even when refused, a refund, a
/// penalty box, or an algorithm whose hits are not one number (a sliding
/// log keeps each request's time; a concurrency lease is released one by
/// one).
pub(super) fn shared_limit(item: &BatchItem) -> Option<LimitSpec> {
    let [limit] = item.limits[..] else {
        return None;
    };
    let shareable = item.role == Role::Enforce
        && item.counting == Counting::Admitted
        && !item.refund
        // A penalty box's block is decided by the whole script (driver.lua).
        && limit.penalty.is_none()
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
    /// Lanes (a Redis, or a slot of a Cluster) with a call in flight (or
    /// about to be).
    pub counters: usize,
    /// Requests waiting for their lane's call to end, to share the next.
    pub waiting: usize,
}

/// One request waiting in its lane.
struct Waiter {
    request: Request,
    /// Taken when the request is answered (or told it timed out).
    tell: Option<oneshot::Sender<Result<Verdict, StoreError>>>,
    /// When its timeout, counted from when it joined, runs out.
    deadline: Instant,
}

impl Waiter {
    fn counter(&self) -> (&str, &LimitSpec) {
        (&self.request.key, &self.request.limit)
    }
}

/// What a shared call decided for one request.
#[derive(Debug)]
struct Verdict {
    admitted: bool,
    /// The counter before this request, and this limit's answer.
    answer: Answer,
}

/// The lanes with a call in flight (or about to be), and who waits in
/// each.
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
    /// The lane was idle: the request (given back) is decided alone, by its
    /// caller; the lane is handed on when the [`HandOff`] is dropped
    /// (answered, timed out or cancelled alike).
    First(HandOff, Request),
    /// A call is in flight: the request waits for the next one.
    Queued(Queued),
}

/// A request waiting in a lane (see [`Coalescer::wait`]).
pub(super) struct Queued {
    answer: oneshot::Receiver<Result<Verdict, StoreError>>,
    lane: Lane,
    started: u64,
}

/// Hands a lane on when its first request is done: to a flusher when
/// requests wait there, or back to idle.
pub(super) struct HandOff {
    coalescer: Arc<Coalescer>,
    lane: Lane,
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
                runtime.spawn(coalescer.flush(self.lane));
            }
            Err(_) => self.coalescer.lanes.abandon(&self.lane),
        }
    }
}

impl Coalescer {
    /// Joins `lane` with `request`.
    pub(super) fn join(self: &Arc<Self>, lane: Lane, request: Request) -> Turn {
        match self.lanes.lock().entry(lane) {
            Entry::Occupied(mut queue) => {
                let (tell, answer) = oneshot::channel();
                queue.get_mut().push(Waiter {
                    request,
                    tell: Some(tell),
                    deadline: deadline_after(self.calls.timeout),
                });
                Turn::Queued(Queued {
                    answer,
                    lane,
                    started: self.calls.clock.now(),
                })
            }
            Entry::Vacant(idle) => {
                idle.insert(Vec::new());
                let hand_off = HandOff {
                    coalescer: self.clone(),
                    lane,
                };
                Turn::First(hand_off, request)
            }
        }
    }

    /// Waits for what a shared call decided for `item`, the one item of its
    /// request. It is told within the store's timeout, counted from when it
    /// joined, without a timer of its own: the call in flight when it
    /// joined ends (answered or timed out) before that, and the flusher
    /// then tells it it timed out, or sends it on a call that waits at most
    /// what is left of its members' earliest timeout (see `flush`).
    pub(super) async fn wait(
        &self,
        queued: Queued,
        item: &BatchItem,
    ) -> Result<BatchOutcome, StoreError> {
        let told = queued.answer.await.map_err(|_| dropped());
        let result = told.and_then(|verdict| {
            verdict.map(|v| BatchOutcome {
                admitted: v.admitted,
                limits: vec![v.answer.outcome(item, v.admitted)],
            })
        });
        // Each request that times out counts against the breaker, as it
        // does alone.
        if let Err(StoreError::Timeout(_)) = result {
            let Lane { target, slot } = queued.lane;
            self.calls.timed_out(target, slot, queued.started);
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
            lane: Some(lane),
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
                    // As many are likely to queue for the next call: room
                    // for them now rather than growing as they come.
                    let room = Vec::with_capacity(queue.len());
                    std::mem::replace(queue, room)
                } else {
                    queue.drain(..MOST_PER_CALL).collect()
                }
            };
            let within = due(&mut members, Instant::now(), self.calls.timeout);
            if !members.is_empty() {
                self.call(lane, members, within).await;
            }
        }
    }

    /// One call deciding `members` (at least one) in runs; past `within`
    /// (what is left of the earliest member's timeout) it is left to finish
    /// in the background and reconciled.
    async fn call(&self, lane: Lane, members: Vec<Waiter>, within: Duration) {
        let calls = &self.calls;
        let (members, lens) = in_runs(members);
        let eval = batch_eval(calls, lane.slot, &members, &lens);
        // Shared with the breaker's guard: a late reply, when every member
        // stopped waiting, must not close a breaker their timeouts opened.
        let members = Arc::new(Members(Mutex::new(members)));
        let reply = match calls
            .call_within(lane.target, eval, members.clone(), within)
            .await
        {
            Called::Replied(reply) => reply,
            Called::Late(late) => {
                let timeout = calls.timeout;
                for member in members.lock().iter_mut() {
                    if let Some(tell) = member.tell.take() {
                        let _ = tell.send(Err(StoreError::Timeout(timeout)));
                    }
                }
                late.reconcile(move |shared, reply| async move {
                    let members = members.take();
                    tracing::info!(
                        requests = members.len(),
                        "refunding coalesced decisions that ran after their callers' timeout"
                    );
                    answer(&shared, lane.target, members, &lens, &reply);
                });
                return;
            }
        };
        let members = members.take();
        match reply {
            Ok(reply) => answer(calls, lane.target, members, &lens, &reply),
            Err(e) => fail(members, &e),
        }
    }
}

/// When a timeout of `timeout` from now runs out. One too long to add to
/// the clock (the setting has no upper bound) runs out in a century.
fn deadline_after(timeout: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
    let now = Instant::now();
    now.checked_add(timeout).unwrap_or(now + CENTURY)
}

/// Keeps those of `members` to send at `now`: not who stopped waiting, nor
/// who has waited out its timeout (told so here, as `Timeout(timeout)`).
/// How long their call may wait: what is left of the earliest of their
/// timeouts (zero when none is kept).
fn due(members: &mut Vec<Waiter>, now: Instant, timeout: Duration) -> Duration {
    let mut within: Option<Duration> = None;
    members.retain_mut(|m| {
        if m.tell.as_ref().is_none_or(oneshot::Sender::is_closed) {
            return false;
        }
        if m.deadline <= now {
            if let Some(tell) = m.tell.take() {
                let _ = tell.send(Err(StoreError::Timeout(timeout)));
            }
            return false;
        }
        let left = m.deadline - now;
        within = Some(within.map_or(left, |w| w.min(left)));
        true
    });
    within.unwrap_or_default()
}

/// `members` in runs, one per counter (key and limit) in the order each
/// first appears, each run's members in their order; and each run's length.
fn in_runs(members: Vec<Waiter>) -> (Vec<Waiter>, Vec<usize>) {
    let mut lens: Vec<usize> = Vec::new();
    let run_of: Vec<usize> = {
        // Each key's first run, found by the key alone (hashing the limit
        // too cost more than the rest of the bookkeeping); a key seen
        // before under another limit (rare: rules reloaded) is looked for
        // among every run.
        let mut firsts: Vec<&Waiter> = Vec::new();
        let mut first = HashMap::with_capacity_and_hasher(
            members.len(),
            foldhash::fast::RandomState::default(),
        );
        members
            .iter()
            .map(|m| {
                let seen = *first.entry(m.request.key.as_str()).or_insert(firsts.len());
                let run = if seen == firsts.len() || firsts[seen].counter() == m.counter() {
                    seen
                } else {
                    firsts
                        .iter()
                        .position(|f| f.counter() == m.counter())
                        .unwrap_or(firsts.len())
                };
                if run == firsts.len() {
                    firsts.push(m);
                    lens.push(0);
                }
                run
            })
            .collect()
    };
    for &run in &run_of {
        lens[run] += 1;
    }
    if lens.len() == 1 || lens.len() == members.len() {
        return (members, lens);
    }
    let mut ordered: Vec<(usize, Waiter)> = run_of.into_iter().zip(members).collect();
    ordered.sort_by_key(|(run, _)| *run); // stable: each run keeps its order
    (ordered.into_iter().map(|(_, m)| m).collect(), lens)
}

/// The batch.lua call deciding `members`, in runs of `lens`.
fn batch_eval(calls: &Shared, slot: u16, members: &[Waiter], lens: &[usize]) -> Eval {
    let firsts = || {
        lens.iter().scan(0, |at, &n| {
            let first = &members[*at];
            *at += n;
            Some(first)
        })
    };
    let keys = firsts().map(|m| m.request.key.as_str());
    let (limits, limit_of) = batch_limits(firsts().map(|m| &m.request.limit), calls.clock.now());
    let algorithms = batch_algorithms(&limits);
    let args = 2 + batch_args(limits.len());
    let mut eval = Eval::new(&calls.batch, keys.collect::<Vec<_>>(), slot, args);
    push_head(&mut eval.cmd, calls.script_now(), algorithms);
    push_limits(&mut eval.cmd, &limits);
    let mut runs = PackedRuns::with_capacity(lens.len(), members.len());
    let mut rest = members;
    for (&n, limit) in lens.iter().zip(limit_of) {
        let (run, next) = rest.split_at(n);
        rest = next;
        runs.push(limit, run.iter().map(|m| m.request.hits));
    }
    runs.push_to(&mut eval.cmd);
    eval
}

/// Tells each member what `reply` decided for it, and refunds what was
/// counted for members no longer waiting (in a task of its own, so the
/// lane's next call does not wait for it).
fn answer(
    shared: &Arc<Shared>,
    target: Target,
    members: Vec<Waiter>,
    lens: &[usize],
    reply: &[i64],
) {
    let shapes = lens.iter().scan(0, |at, &n| {
        let run = &members[*at..*at + n];
        *at += n;
        Some((&run[0].request.limit, run.iter().map(|m| m.request.hits)))
    });
    let Some(runs) = runs(reply, shapes) else {
        let e = format!("unexpected script reply of {} values", reply.len());
        fail(members, &StoreError::Unavailable(e));
        return;
    };
    let mut members = members.into_iter();
    let owed: Vec<(Owed, Vec<Answer>)> = runs
        .into_iter()
        .zip(lens)
        .filter_map(|(run, &n)| {
            let run_members = members.by_ref().take(n);
            tell_run(target, run, run_members)
        })
        .collect();
    if !owed.is_empty() {
        let shared = shared.clone();
        tokio::spawn(async move { shared.refund(owed, RECONCILE_WAIT).await });
    }
}

/// Tells the members of one run what it decided for each; what it counted
/// for members no longer waiting, if any.
fn tell_run(
    target: Target,
    run: RunReply<'_>,
    members: impl Iterator<Item = Waiter>,
) -> Option<(Owed, Vec<Answer>)> {
    let (mut counted, mut unclaimed) = (0u64, 0u64);
    let mut counter = None;
    for (i, member) in members.enumerate() {
        let hits = member.request.hits;
        let over = run
            .overs
            .over(i, run.answer.before, counted, hits)
            .unwrap_or(true);
        let admitted = admits([(Role::Enforce, over)]);
        let answer = Answer {
            before: run.answer.before.saturating_add(counted),
            over,
            ..run.answer
        };
        if admitted {
            counted = counted.saturating_add(hits);
        }
        let told = member
            .tell
            .is_some_and(|tell| tell.send(Ok(Verdict { admitted, answer })).is_ok());
        if admitted && !told {
            unclaimed = unclaimed.saturating_add(hits);
        }
        counter = Some(member.request);
    }
    let Request { key, limit, .. } = counter.filter(|_| unclaimed > 0)?;
    let owed = Owed {
        target,
        key,
        limits: vec![limit],
        hits: unclaimed,
    };
    Some((owed, vec![run.answer]))
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
    lane: Option<Lane>,
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        if let Some(lane) = &self.lane {
            self.lanes.abandon(lane);
        }
    }
}

#[cfg(test)]
mod tests;
