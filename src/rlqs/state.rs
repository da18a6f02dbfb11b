//! RLQS state: which streams report which buckets, their smoothed demand,
//! what each was assigned; reports and stream closes in, the actions to send
//! to each stream out.
//!
//! Protobuf-free and clock-free: the service converts the wire messages and
//! passes `now` (milliseconds on any monotonic scale), so tests drive time
//! by hand. Rules are read through a closure, so this module does not care
//! which store the RLS limiter uses.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use indexmap::IndexSet;
use parking_lot::Mutex;
use serde::Serialize;

use super::alloc::{self, Budget};
use super::metrics::RlqsMetrics;
use super::types::{
    Action, Assignment, BucketKey, IDLE_REPORTS, MAX_BUCKETS_PER_STREAM, MAX_STREAMS, Outbox,
    Published, Remote, StreamId, Usage,
};
use crate::limiter::Role;
use crate::request::Entry;
use crate::rules::RuleSet;

/// What a report or a stream close leaves to do once the other replicas'
/// demand is known: the buckets to re-split.
#[derive(Debug)]
pub struct Pending {
    stream: StreamId,
    /// Buckets whose split must be recomputed, each once (a set: a report
    /// may name a thousand buckets), in the order first touched.
    touched: IndexSet<BucketKey>,
    /// Streams that left a bucket (abandoned or closed).
    gone: Vec<(BucketKey, StreamId)>,
    /// Actions for `stream` decided already (abandons).
    own: Vec<Action>,
}

/// A stream was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("too many RLQS streams open (the cap is {MAX_STREAMS})")]
pub struct TooManyStreams;

/// Reads the rules in force.
type RulesFn = dyn Fn() -> Arc<RuleSet> + Send + Sync;

/// The RLQS state of this replica.
pub struct Rlqs {
    /// One lock for everything: reports come every 5 s per Envoy, and a
    /// recomputation must see every stream of a bucket at once.
    inner: Mutex<Inner>,
    rules: Box<RulesFn>,
    metrics: RlqsMetrics,
}

#[derive(Default)]
struct Inner {
    next_stream: StreamId,
    /// Per open stream, the buckets it reports.
    streams: HashMap<StreamId, HashSet<BucketKey>>,
    buckets: HashMap<BucketKey, Bucket>,
}

/// One bucket, across the streams reporting it.
#[derive(Default)]
struct Bucket {
    /// Ordered so every recomputation sees the streams in the same order.
    streams: BTreeMap<StreamId, StreamBucket>,
    /// The budget of the last recomputation (`None`: allow-all).
    budget: Option<Budget>,
    /// Demands of the streams other replicas hold (empty in memory mode).
    remote: Vec<u64>,
    /// Assignments changed since the bucket appeared: each hands an Envoy
    /// a full bucket, a term of the over-admission bound.
    changes: u64,
}

/// One bucket as one stream reports it.
#[derive(Default)]
struct StreamBucket {
    /// Smoothed offered rate, micro-requests per second.
    demand: Option<u64>,
    last_report_ms: Option<u64>,
    idle_reports: u32,
    assigned: Option<Assignment>,
}

/// How a bucket's rule applies.
enum Policy {
    AllowAll,
    Budget(Budget),
}

impl Rlqs {
    /// Empty state; `rules` returns the rules in force at each call.
    pub fn new(rules: impl Fn() -> Arc<RuleSet> + Send + Sync + 'static) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            rules: Box::new(rules),
            metrics: RlqsMetrics::default(),
        }
    }

    /// The RLQS metrics.
    pub fn metrics(&self) -> &RlqsMetrics {
        &self.metrics
    }

    /// Registers a new stream, unless the cap is reached.
    pub fn open(&self) -> Result<StreamId, TooManyStreams> {
        let mut inner = self.inner.lock();
        if inner.streams.len() >= MAX_STREAMS {
            self.metrics.streams_refused.inc();
            return Err(TooManyStreams);
        }
        let id = inner.next_stream;
        inner.next_stream += 1;
        inner.streams.insert(id, HashSet::new());
        self.metrics.streams_opened.inc();
        self.metrics.streams.set(inner.streams.len() as i64);
        Ok(id)
    }

    /// Takes one report of `stream` at `now_ms` (memory mode: this
    /// replica's view only): [`Rlqs::record`] then [`Rlqs::finish`].
    pub fn report(
        &self,
        stream: StreamId,
        domain: &str,
        usages: Vec<Usage>,
        now_ms: u64,
    ) -> Outbox {
        let pending = self.record(stream, domain, usages, now_ms);
        self.finish(pending, &Remote::new())
    }

    /// Drops a closed stream and re-splits its buckets between the others
    /// (memory mode): [`Rlqs::leave`] then [`Rlqs::finish`].
    pub fn close(&self, stream: StreamId) -> Outbox {
        let pending = self.leave(stream);
        self.finish(pending, &Remote::new())
    }

    /// The first half of a report: updates each bucket's demand for
    /// `stream` and abandons buckets idle for [`IDLE_REPORTS`] reports.
    pub fn record(
        &self,
        stream: StreamId,
        domain: &str,
        usages: Vec<Usage>,
        now_ms: u64,
    ) -> Pending {
        self.metrics.reports.inc();
        let mut pending = Pending {
            stream,
            touched: IndexSet::new(),
            gone: Vec::new(),
            own: Vec::new(),
        };
        let mut inner = self.inner.lock();
        let Inner {
            streams, buckets, ..
        } = &mut *inner;
        let Some(mine) = streams.get_mut(&stream) else {
            return pending;
        };
        for usage in usages {
            let key = BucketKey::new(domain, usage.entries);
            if !mine.contains(&key) {
                if mine.len() >= MAX_BUCKETS_PER_STREAM {
                    tracing::debug!(stream, bucket = %key.label(), "RLQS bucket over the per-stream cap; not assigned");
                    continue;
                }
                mine.insert(key.clone());
            }
            let bucket = buckets.entry(key.clone()).or_default();
            let entry = bucket.streams.entry(stream).or_default();
            let requests = usage.allowed.saturating_add(usage.denied);
            let elapsed = entry
                .last_report_ms
                .map_or(alloc::REPORT_INTERVAL_MS, |last| {
                    now_ms.saturating_sub(last)
                });
            entry.demand = Some(alloc::smooth(
                entry.demand,
                alloc::sample(requests, elapsed),
            ));
            entry.last_report_ms = Some(now_ms);
            entry.idle_reports = if requests == 0 {
                entry.idle_reports + 1
            } else {
                0
            };
            if entry.idle_reports >= IDLE_REPORTS {
                bucket.streams.remove(&stream);
                mine.remove(&key);
                self.metrics.abandons.inc();
                pending.own.push(Action::Abandon(key.clone()));
                pending.gone.push((key.clone(), stream));
            }
            pending.touched.insert(key);
        }
        pending
    }

    /// The first half of a stream's close: forgets the stream.
    pub fn leave(&self, stream: StreamId) -> Pending {
        let mut inner = self.inner.lock();
        let Inner {
            streams, buckets, ..
        } = &mut *inner;
        let keys: Vec<BucketKey> = streams
            .remove(&stream)
            .map(|keys| keys.into_iter().collect())
            .unwrap_or_default();
        for key in &keys {
            if let Some(bucket) = buckets.get_mut(key) {
                bucket.streams.remove(&stream);
            }
        }
        self.metrics.streams.set(streams.len() as i64);
        Pending {
            stream,
            gone: keys.iter().map(|k| (k.clone(), stream)).collect(),
            touched: keys.into_iter().collect(),
            own: Vec::new(),
        }
    }

    /// What this replica shares with the others for the buckets `pending`
    /// touches: each local stream's demand, and the streams that left.
    pub fn published(&self, pending: &Pending) -> Vec<Published> {
        let inner = self.inner.lock();
        pending
            .touched
            .iter()
            .map(|key| Published {
                key: key.clone(),
                demands: inner.buckets.get(key).map_or_else(Vec::new, |b| {
                    b.streams
                        .iter()
                        .map(|(id, s)| (*id, s.demand.unwrap_or(0)))
                        .collect()
                }),
                gone: pending
                    .gone
                    .iter()
                    .filter(|(k, _)| k == key)
                    .map(|(_, id)| *id)
                    .collect(),
            })
            .collect()
    }

    /// The second half: re-splits every touched bucket, counting `remote`
    /// streams too, and returns what to send — to the reporting stream (if
    /// still open) an assignment for every bucket it reported, which
    /// refreshes the TTL, and to the other local streams any changed share.
    pub fn finish(&self, pending: Pending, remote: &Remote) -> Outbox {
        let rules = (self.rules)();
        let mut inner = self.inner.lock();
        let Inner {
            streams, buckets, ..
        } = &mut *inner;
        let Pending {
            stream,
            touched,
            mut own,
            ..
        } = pending;
        let open = streams.contains_key(&stream);
        let mut out: HashMap<StreamId, Vec<Action>> = HashMap::new();
        for key in &touched {
            if let (Some(bucket), Some(demands)) = (buckets.get_mut(key), remote.get(key)) {
                bucket.remote.clone_from(demands);
            }
            let changed = self.resplit(&rules, key, buckets);
            for (id, assignment) in changed {
                if id != stream {
                    out.entry(id)
                        .or_default()
                        .push(Action::Assign(key.clone(), assignment));
                }
            }
            if let Some(assigned) = buckets
                .get(key)
                .and_then(|b| b.streams.get(&stream))
                .and_then(|s| s.assigned)
            {
                own.push(Action::Assign(key.clone(), assigned));
            }
        }
        self.metrics.buckets.set(buckets.len() as i64);
        let mut outbox: Outbox = out.into_iter().collect();
        outbox.sort_by_key(|(id, _)| *id);
        if open && !own.is_empty() {
            outbox.push((stream, own));
        }
        outbox
    }

    /// Recomputes the shares of one bucket; returns the streams whose
    /// assignment changed. Drops the bucket when no stream reports it.
    fn resplit(
        &self,
        rules: &RuleSet,
        key: &BucketKey,
        buckets: &mut HashMap<BucketKey, Bucket>,
    ) -> Vec<(StreamId, Assignment)> {
        let Some(bucket) = buckets.get_mut(key) else {
            return Vec::new();
        };
        if bucket.streams.is_empty() {
            buckets.remove(key);
            self.metrics.forget_bucket(key);
            return Vec::new();
        }
        let new: Vec<Assignment> = match policy(rules, key) {
            Policy::AllowAll => {
                bucket.budget = None;
                vec![Assignment::AllowAll; bucket.streams.len()]
            }
            Policy::Budget(budget) => {
                bucket.budget = Some(budget);
                split(&budget, bucket.streams.values(), &bucket.remote)
            }
        };
        let mut changed = Vec::new();
        for ((id, entry), assignment) in bucket.streams.iter_mut().zip(new) {
            if entry.assigned != Some(assignment) {
                entry.assigned = Some(assignment);
                bucket.changes += 1;
                self.metrics.record_assignment(&assignment);
                changed.push((*id, assignment));
            }
        }
        let demand: u64 = bucket
            .streams
            .values()
            .map(|s| s.demand.unwrap_or(0))
            .chain(bucket.remote.iter().copied())
            .fold(0, u64::saturating_add);
        self.metrics
            .record_bucket(key, demand, bucket.budget.as_ref());
        changed
    }

    /// Every bucket with its budget and per-stream demand and assignment,
    /// in a stable order, for the admin page.
    pub fn snapshot(&self) -> Vec<BucketView> {
        let inner = self.inner.lock();
        let mut views: Vec<BucketView> = inner
            .buckets
            .iter()
            .map(|(key, bucket)| BucketView {
                domain: key.domain.clone(),
                bucket: key.entries.iter().cloned().collect(),
                budget: bucket.budget.map(|b| BudgetView {
                    tokens_per_fill: b.tokens,
                    fill_interval_secs: b.fill_secs,
                }),
                streams: bucket
                    .streams
                    .iter()
                    .map(|(id, s)| StreamView {
                        stream: *id,
                        demand_per_second: s.demand.unwrap_or(0) as f64 / 1e6,
                        assignment: s.assigned,
                    })
                    .collect(),
                assignments_changed: bucket.changes,
                other_replicas: OtherReplicas {
                    streams: bucket.remote.len(),
                    demand_per_second: bucket.remote.iter().map(|d| *d as f64).sum::<f64>() / 1e6,
                },
            })
            .collect();
        views.sort_by(|a, b| (&a.domain, &a.bucket).cmp(&(&b.domain, &b.bucket)));
        views
    }
}

/// The split of `budget` between these local streams and the `remote`
/// ones (their demands), by demand, damped. Local streams share at most
/// their targets plus their part of what rounding left over, so the
/// replicas' splits together stay within the budget.
fn split<'a>(
    budget: &Budget,
    streams: impl Iterator<Item = &'a StreamBucket>,
    remote: &[u64],
) -> Vec<Assignment> {
    let (mut demands, current): (Vec<u64>, Vec<Option<u64>>) = streams
        .map(|s| {
            let current = match s.assigned {
                Some(Assignment::DenyAll) => Some(0),
                Some(Assignment::TokenBucket {
                    tokens_per_fill,
                    fill_secs,
                }) if fill_secs == budget.fill_secs => Some(u64::from(tokens_per_fill)),
                _ => None,
            };
            (budget.tokens_of(s.demand.unwrap_or(0)), current)
        })
        .unzip();
    let local = demands.len();
    demands.extend(remote.iter().map(|d| budget.tokens_of(*d)));
    let targets = alloc::targets(budget.tokens, &demands);
    let cap = alloc::local_cap(budget.tokens, &targets, local);
    alloc::damp(cap, budget.dead_band(), &current, &targets[..local])
        .into_iter()
        .map(|share| match u32::try_from(share) {
            Ok(0) => Assignment::DenyAll,
            Ok(tokens_per_fill) => Assignment::TokenBucket {
                tokens_per_fill,
                fill_secs: budget.fill_secs,
            },
            // A budget fits u32 (Budget::of_limit), so a share does too.
            Err(_) => Assignment::AllowAll,
        })
        .collect()
}

/// How the rules in force treat a bucket: matched like an RLS descriptor.
fn policy(rules: &RuleSet, key: &BucketKey) -> Policy {
    let Some(domain) = rules.domain(&key.domain) else {
        return Policy::AllowAll;
    };
    let entries: Vec<Entry> = key
        .entries
        .iter()
        .map(|(k, v)| Entry::new(k.as_str(), v.as_str()))
        .collect();
    let Some(found) = domain.find(&entries) else {
        return Policy::AllowAll;
    };
    if found.rule.unlimited || found.rule.role == Role::Shadow {
        return Policy::AllowAll;
    }
    found
        .rule
        .limits
        .iter()
        .filter_map(|l| Budget::of_limit(l.spec.requests, l.spec.window.duration_ms))
        .reduce(|a, b| if b.is_tighter_than(&a) { b } else { a })
        .map_or(Policy::AllowAll, Policy::Budget)
}

/// One bucket on the admin page.
#[derive(Debug, Serialize)]
pub struct BucketView {
    /// The domain.
    pub domain: String,
    /// The bucket id.
    pub bucket: BTreeMap<String, String>,
    /// The global budget; absent when the bucket is allow-all.
    pub budget: Option<BudgetView>,
    /// Every stream of this replica reporting the bucket.
    pub streams: Vec<StreamView>,
    /// Assignments this replica changed for the bucket since it appeared.
    pub assignments_changed: u64,
    /// The streams other replicas hold (Redis mode), as last heard.
    pub other_replicas: OtherReplicas,
}

/// Other replicas' streams of a bucket on the admin page.
#[derive(Debug, Serialize)]
pub struct OtherReplicas {
    /// How many.
    pub streams: usize,
    /// Their smoothed demand together.
    pub demand_per_second: f64,
}

/// A budget on the admin page.
#[derive(Debug, Serialize)]
pub struct BudgetView {
    /// Tokens per fill interval, for all streams together.
    pub tokens_per_fill: u64,
    /// The fill interval.
    pub fill_interval_secs: u64,
}

/// One stream's view of a bucket on the admin page.
#[derive(Debug, Serialize)]
pub struct StreamView {
    /// The stream, numbered from 0 since start.
    pub stream: StreamId,
    /// Smoothed offered rate.
    pub demand_per_second: f64,
    /// What it was last assigned.
    pub assignment: Option<Assignment>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rlqs() -> Rlqs {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rules.yaml");
        std::fs::write(
            &path,
            "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 120}\n",
        )
        .expect("write rules");
        let rules = Arc::new(crate::rules::load_paths(&[path]).expect("valid rules"));
        Rlqs::new(move || rules.clone())
    }

    fn usage(tenant: &str, allowed: u64) -> Usage {
        Usage {
            entries: vec![("tenant".into(), tenant.into())],
            allowed,
            denied: 0,
        }
    }

    #[test]
    fn streams_past_the_cap_are_refused_until_one_closes() {
        let rlqs = rlqs();
        let ids: Vec<StreamId> = (0..MAX_STREAMS)
            .map(|_| rlqs.open().expect("under the cap"))
            .collect();
        assert_eq!(rlqs.open(), Err(TooManyStreams));
        rlqs.close(ids[0]);
        assert!(rlqs.open().is_ok());
    }

    #[test]
    fn envoys_coming_and_going_leave_no_state_behind() {
        let rlqs = rlqs();
        for round in 0..100u64 {
            let (a, b) = (rlqs.open().unwrap(), rlqs.open().unwrap());
            let tenant = format!("t{round}");
            rlqs.report(a, "d", vec![usage(&tenant, 3)], round * 5_000);
            rlqs.report(
                b,
                "d",
                vec![usage(&tenant, 1), usage("shared", 1)],
                round * 5_000,
            );
            rlqs.close(a);
            rlqs.close(b);
        }
        assert!(rlqs.snapshot().is_empty());
        assert!(rlqs.inner.lock().streams.is_empty());
    }

    #[test]
    fn the_reporting_stream_is_answered_and_others_get_only_changes() {
        let rlqs = rlqs();
        let (a, b) = (rlqs.open().unwrap(), rlqs.open().unwrap());
        let out = rlqs.report(a, "d", vec![usage("x", 1)], 0);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, a);
        // B joins: A is cut (pushed), B answered.
        let out = rlqs.report(b, "d", vec![usage("x", 1)], 0);
        let streams: Vec<StreamId> = out.iter().map(|(id, _)| *id).collect();
        assert_eq!(streams, vec![a, b]);
        // B reports the same again: only B is answered (A's share holds).
        let out = rlqs.report(b, "d", vec![usage("x", 1)], 5_000);
        let streams: Vec<StreamId> = out.iter().map(|(id, _)| *id).collect();
        assert_eq!(streams, vec![b]);
    }
}
