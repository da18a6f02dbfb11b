//! Batching across identities against real `redis-server` processes and a
//! Redis Cluster with replicas: the requests of many identities that wait
//! while a call to their Redis (their slot, on a Cluster) is in flight share
//! the next call, and each identity is decided exactly as separate calls
//! would decide it. At the limit under 200 concurrent requests for every
//! algorithm (a sliding log and a concurrency limit are not batched and stay
//! exact beside the batches), per slot on a Cluster, with requests cancelled
//! before their call is sent and while it is in flight, and through a shared
//! call that times out.
//!
//! Calls are held in flight by stopping Redis (or pausing its writes, on a
//! Cluster, whose nodes must go on talking to each other); what waits is read
//! from the store's `coalescing()`, and whether a call has reached a stopped
//! Redis from its socket's receive queue.

use crate::coalescing::{decided_in_turn, open_store, wait_for};
use crate::store_faults::expect_refunds_made;
use crate::support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::future::join_all;
use sluice::limiter::{Algorithm, LimitSpec, Window};
use sluice::store::{Batch, BatchOutcome, Coalescing, CounterStore, RedisStore, StoreError};
use sluice::telemetry::metrics::{Metrics, MetricsConfig};
use support::eventually::eventually_async;
use support::redis::{RedisCluster, RedisServer, key_slot};

const DOMAIN: &str = "batching";
const HOUR: u64 = 3_600_000;
/// Every identity's limit: a multiple of each weight used (1, 2 and 3), so
/// that requests of one weight fill it to the hit.
const LIMIT: u64 = 6;
const REQUESTS: usize = 200;
/// Most requests one call carries (`MOST_PER_CALL` in coalesce.rs).
const MOST_PER_CALL: usize = 64;

/// Every algorithm the store has: batch.lua decides the first three; the
/// others are sent in calls of their own.
const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::SlidingWindow {
        precision_ms: 60_000,
    },
    Algorithm::FixedWindow,
    Algorithm::TokenBucket { burst: LIMIT },
    Algorithm::SlidingLog,
    Algorithm::Concurrency,
];

fn limit(algorithm: Algorithm) -> LimitSpec {
    LimitSpec {
        requests: LIMIT,
        window: Window {
            duration_ms: HOUR,
            algorithm,
        },
        penalty: None,
    }
}

fn is_batched(limit: &LimitSpec) -> bool {
    !matches!(
        limit.window.algorithm,
        Algorithm::SlidingLog | Algorithm::Concurrency
    )
}

fn batch(name: &str, limit: LimitSpec, hits: u64) -> Batch {
    Batch {
        items: vec![support::enforcing(DOMAIN, name, limit, hits)],
    }
}

/// The storage key of `name`'s counter under `prefix`.
fn key_of(prefix: &str, name: &str) -> String {
    let item = support::enforcing(DOMAIN, name, limit(ALGORITHMS[0]), 0);
    item.identity.storage_key(prefix)
}

/// A coalescing store on `url` under `prefix` (see coalescing's), with two
/// connections.
async fn open(url: &str, prefix: &str, timeout: Duration) -> Arc<RedisStore> {
    open_store(url, prefix, timeout, 2).await
}

fn evalsha_calls(port: u16) -> u64 {
    support::redis::command_calls(port, "evalsha")
}

/// One identity of a test: its name, its limit, the weights of its requests.
struct Counter {
    name: String,
    limit: LimitSpec,
    weight: Weight,
}

#[derive(Clone, Copy)]
enum Weight {
    /// Every request weighs this much.
    Each(u64),
    /// 1, 2, 3, 1, 2, …
    Cycling,
}

impl Weight {
    /// The weight of an identity's `k`-th request.
    fn of(self, k: usize) -> u64 {
        match self {
            Weight::Each(w) => w,
            Weight::Cycling => k as u64 % 3 + 1,
        }
    }
}

/// Checks what one identity's requests were told (weight and outcome, in
/// any order): decided one at a time as separate calls would, full to the
/// hit when all weigh the same; and that its counter holds what was
/// admitted.
async fn check_counter(store: &RedisStore, counter: &Counter, answers: &[(u64, BatchOutcome)]) {
    let what = format!("{} ({})", counter.name, counter.limit.window.algorithm);
    let admitted = decided_in_turn(&what, LIMIT, answers);
    if let Weight::Each(w) = counter.weight {
        assert_eq!(admitted, LIMIT, "{what}, weight {w}");
    }
    let read = store
        .apply(&batch(&counter.name, counter.limit, 0))
        .await
        .expect("read");
    assert_eq!(
        read.limits[0].used, admitted,
        "{what}: the counter holds what was told"
    );
}

/// A spawned request: its number, its weight and what it was told.
type Sent = tokio::task::JoinHandle<(usize, u64, Result<BatchOutcome, StoreError>)>;

/// Fires the requests `rs` (request `r` is the `r / n`-th of identity
/// `r % n`, of `n` counters) at once, each in a task of its own.
fn spawn_requests(
    store: &Arc<RedisStore>,
    counters: &[Counter],
    rs: impl Iterator<Item = usize>,
) -> Vec<Sent> {
    let n = counters.len();
    rs.map(|r| {
        let counter = &counters[r % n];
        let hits = counter.weight.of(r / n);
        let (store, batch) = (store.clone(), batch(&counter.name, counter.limit, hits));
        tokio::spawn(async move { (r, hits, store.apply(&batch).await) })
    })
    .collect()
}

/// What each of `n` identities was told (weight, outcome), from the joined
/// requests of [`spawn_requests`].
async fn answers_per_counter(n: usize, sent: Vec<Sent>) -> Vec<Vec<(u64, BatchOutcome)>> {
    let mut answers = vec![Vec::new(); n];
    for joined in join_all(sent).await {
        let (r, hits, outcome) = joined.expect("no panic");
        answers[r % n].push((hits, outcome.expect("Redis answers")));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_admits_each_identity_exactly_its_limit_when_requests_share_calls() {
    let redis = RedisServer::start();
    let store = open(
        &redis.url(),
        &support::unique_prefix(),
        Duration::from_secs(10),
    )
    .await;
    // 20 identities, 4 per algorithm: weights of 1, of 2, of 3, and mixed.
    let counters: Vec<Counter> = (0..20)
        .map(|j| Counter {
            name: format!("id{j}"),
            limit: limit(ALGORITHMS[j % ALGORITHMS.len()]),
            weight: [
                Weight::Each(1),
                Weight::Each(2),
                Weight::Each(3),
                Weight::Cycling,
            ][j / ALGORITHMS.len()],
        })
        .collect();
    let n = counters.len();
    let batched = (0..REQUESTS)
        .filter(|r| is_batched(&counters[r % n].limit))
        .count();
    let calls = evalsha_calls(redis.port());

    // The first request's call is in flight (Redis stopped), so every
    // batched request waits for it, whatever its identity; the others go
    // out at once, a call each.
    redis.pause();
    assert!(is_batched(&counters[0].limit));
    let mut sent = spawn_requests(&store, &counters, 0..1);
    let first = Coalescing {
        counters: 1,
        waiting: 0,
    };
    wait_for(&store, first).await;
    sent.extend(spawn_requests(&store, &counters, 1..REQUESTS));
    let all_queued = Coalescing {
        counters: 1,
        waiting: batched - 1,
    };
    wait_for(&store, all_queued).await;
    redis.resume();
    let answers = answers_per_counter(n, sent).await;

    // The first call, the batched others in calls of 64 at most (12
    // identities each), and one call per request of the rest.
    let unbatched = REQUESTS - batched;
    assert_eq!(
        evalsha_calls(redis.port()) - calls,
        (1 + (batched - 1).div_ceil(MOST_PER_CALL) + unbatched) as u64
    );
    for (counter, answers) in counters.iter().zip(&answers) {
        check_counter(&store, counter, answers).await;
    }
    wait_for(&store, Coalescing::default()).await;
}

/// Holds every script call on the masters on `ports` (`CLIENT PAUSE
/// WRITE`): unlike a stopped process, the Cluster's nodes go on talking to
/// each other, so no replica takes over.
fn hold_scripts(ports: &[u16]) {
    for &port in ports {
        let reply = support::redis::query(port, &["CLIENT", "PAUSE", "60000", "WRITE"]);
        assert!(!reply.is_error(), "{reply:?}");
    }
}

fn release_scripts(ports: &[u16]) {
    for &port in ports {
        let reply = support::redis::query(port, &["CLIENT", "UNPAUSE"]);
        assert!(!reply.is_error(), "{reply:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_slot_batches_its_identities_and_each_is_exact() {
    let cluster = RedisCluster::start_with_replicas();
    let prefix = support::unique_prefix();
    let store = open(&cluster.url(), &prefix, Duration::from_secs(10)).await;
    let slot_of = |name: &str| key_slot(key_of(&prefix, name).as_bytes());
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3);

    // Two slots on each master, three identities in each slot: a lane each.
    let mut lanes: Vec<(u16, u16)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (m, &port) in masters.iter().enumerate() {
        for g in 0..2 {
            let first = (0..)
                .map(|i| format!("m{m}.{g}-{i}"))
                .find(|name| {
                    let slot = slot_of(name);
                    lanes.iter().all(|&(_, s)| s != slot) && cluster.port_for_slot(slot) == port
                })
                .expect("a name on this master");
            let slot = slot_of(&first);
            let others = (0..)
                .map(|i| format!("m{m}.{g}+{i}"))
                .filter(|name| slot_of(name) == slot)
                .take(2);
            names.extend(std::iter::once(first).chain(others));
            lanes.push((port, slot));
        }
    }
    let counters: Vec<Counter> = names
        .into_iter()
        .enumerate()
        .map(|(j, name)| Counter {
            name,
            limit: limit(ALGORITHMS[j % 3]),
            weight: Weight::Each([1, 2, 3][(j + j / 3) % 3]),
        })
        .collect();
    let n = counters.len();
    // Identity j is in lane j / 3; request r is identity r % n's.
    let lane_of = |r: usize| (r % n) / 3;
    let firsts: Vec<usize> = (0..lanes.len()).map(|lane| 3 * lane).collect();
    let calls: Vec<u64> = masters.iter().map(|&p| evalsha_calls(p)).collect();

    // Each lane's first call is held in its master, so the lane's other
    // requests wait for it.
    hold_scripts(&masters);
    let mut sent = spawn_requests(&store, &counters, firsts.iter().copied());
    let lanes_busy = Coalescing {
        counters: lanes.len(),
        waiting: 0,
    };
    wait_for(&store, lanes_busy).await;
    let rest = (0..REQUESTS).filter(|r| !firsts.contains(r));
    sent.extend(spawn_requests(&store, &counters, rest));
    let all_queued = Coalescing {
        counters: lanes.len(),
        waiting: REQUESTS - lanes.len(),
    };
    wait_for(&store, all_queued).await;
    release_scripts(&masters);
    let answers = answers_per_counter(n, sent).await;

    // Per master, per lane of it: the first call, then the lane's others
    // in calls of 64 at most.
    for (m, &port) in masters.iter().enumerate() {
        let expected: usize = (0..lanes.len())
            .filter(|&lane| lanes[lane].0 == port)
            .map(|lane| {
                let requests = (0..REQUESTS).filter(|&r| lane_of(r) == lane).count();
                1 + (requests - 1).div_ceil(MOST_PER_CALL)
            })
            .sum();
        assert_eq!(
            evalsha_calls(port) - calls[m],
            expected as u64,
            "master on port {port}"
        );
    }
    for (counter, answers) in counters.iter().zip(&answers) {
        check_counter(&store, counter, answers).await;
    }
    wait_for(&store, Coalescing::default()).await;
}

/// Bytes sent to the server on `port` that it has not read yet: the receive
/// queues of its connections (`/proc/net/tcp`). With the server stopped,
/// what has reached it.
fn unread_bytes(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let established = fields.get(3) == Some(&"01");
            let ours = fields.get(1).is_some_and(|a| a.ends_with(&local));
            let rx = fields.get(4)?.split(':').nth(1)?;
            (established && ours).then(|| u64::from_str_radix(rx, 16).ok())?
        })
        .sum()
}

/// Polls until the stopped server on `port` has at least `bytes` unread
/// (a script call carrying given keys has reached it); returns how many.
async fn wait_unread(port: u16, bytes: u64, what: &str) -> u64 {
    eventually_async(what, async || {
        let unread = unread_bytes(port);
        (unread >= bytes)
            .then_some(unread)
            .ok_or(format!("{unread} of {bytes} bytes"))
    })
    .await
}

/// At least how many bytes a script call on these keys sends: the keys and
/// the script's SHA1.
fn call_size<'a>(keys: impl IntoIterator<Item = &'a String>) -> u64 {
    40 + keys.into_iter().map(|k| k.len() as u64).sum::<u64>()
}

/// A request under way, not spawned: dropping it cancels it.
type Pending<'a> = Pin<Box<dyn Future<Output = Result<BatchOutcome, StoreError>> + 'a>>;

/// Starts `batch` on `store`: polled once, the request joins its lane (or
/// sends its own call) and waits.
async fn start<'a>(store: &'a RedisStore, batch: &'a Batch) -> Pending<'a> {
    let mut pending: Pending<'a> = Box::pin(store.apply(batch));
    let polled = std::future::poll_fn(|cx| Poll::Ready(pending.as_mut().poll(cx))).await;
    assert!(polled.is_pending(), "answered by a stopped Redis");
    pending
}

/// Stops `redis`, starts `lead` (its call reaches the stopped server), then
/// starts `batches` in order behind it; returns the lead's request, the
/// bytes unread once its call arrived, and the queued requests.
async fn queue_behind<'a>(
    store: &'a RedisStore,
    redis: &RedisServer,
    prefix: &str,
    lead: &'a Batch,
    batches: &'a [Batch],
) -> (Pending<'a>, u64, Vec<Pending<'a>>) {
    let port = redis.port();
    let unread = unread_bytes(port);
    redis.pause();
    let first = start(store, lead).await;
    let lead_size = call_size([&key_of(prefix, "lead")]);
    let lead_sent = wait_unread(port, unread + lead_size, "the first call to reach Redis").await;
    let mut queued = Vec::new();
    for batch in batches {
        queued.push(start(store, batch).await);
    }
    (first, lead_sent, queued)
}

/// Polls until `name`'s counter, under `limit`, holds `want`.
async fn expect_counter(store: &RedisStore, name: &str, limit: LimitSpec, want: u64) {
    let what = format!("counter {name} to hold {want}");
    eventually_async(&what, async || {
        let read = batch(name, limit, 0);
        let used = store.apply(&read).await.expect("a read answers").limits[0].used;
        (used == want)
            .then_some(())
            .ok_or(format!("it holds {used}"))
    })
    .await;
}

/// What becomes of a queued request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Its caller goes away before its call is sent.
    DroppedBefore,
    /// Its caller goes away while its call is in flight.
    DroppedInFlight,
    /// Its caller waits for the answer.
    Waits,
}

/// An identity's name, its limit, and its requests (fate and weight) in the
/// order they queue.
type Plan = (&'static str, LimitSpec, Vec<(Fate, u64)>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_dropped_before_their_call_are_not_sent_and_those_dropped_in_flight_are_refunded()
{
    use Fate::{DroppedBefore as Before, DroppedInFlight as InFlight, Waits};
    let redis = RedisServer::start();
    let port = redis.port();
    let prefix = support::unique_prefix();
    let store = open(&redis.url(), &prefix, Duration::from_secs(10)).await;
    let [sliding, fixed, bucket, ..] = ALGORITHMS.map(limit);
    // Each identity's requests in the order they queue, with their weights.
    // Where requests dropped before the call come before those that wait,
    // those would be refused had the dropped ones been sent; where requests
    // dropped in flight come first, the later ones see their hits.
    let plans: Vec<Plan> = vec![
        (
            "a",
            sliding,
            [
                vec![(Before, 1); 2],
                vec![(InFlight, 1); 2],
                vec![(Waits, 1); 5],
            ]
            .concat(),
        ),
        (
            "b",
            fixed,
            vec![
                (InFlight, 3),
                (Before, 1),
                (Waits, 2),
                (Waits, 2),
                (Waits, 1),
            ],
        ),
        (
            "c",
            bucket,
            vec![
                (Waits, 1),
                (Waits, 1),
                (InFlight, 2),
                (Before, 2),
                (Waits, 1),
                (Waits, 1),
                (Waits, 1),
            ],
        ),
        ("e", sliding, vec![(Before, 1); 3]),
        ("g", fixed, vec![(InFlight, 2); 3]),
    ];
    // What deciding the requests sent, in their order, gives: per request
    // (admitted, the counter it reports), and per identity the hits of those
    // whose callers wait for them.
    let mut expected: Vec<Vec<Option<(bool, u64)>>> = Vec::new();
    let mut kept: Vec<u64> = Vec::new();
    for (_, _, plan) in &plans {
        let (mut counter, mut waited) = (0, 0);
        let decided = plan.iter().map(|&(fate, hits)| {
            if fate == Before {
                return None;
            }
            let admitted = counter + hits <= LIMIT;
            if admitted {
                counter += hits;
                if fate == Waits {
                    waited += hits;
                }
            }
            Some((admitted, counter))
        });
        expected.push(decided.collect());
        kept.push(waited);
    }
    // Interleaved: the first request of each identity, then the second, …
    let longest = plans.iter().map(|(_, _, p)| p.len()).max().unwrap_or(0);
    let order: Vec<(usize, usize)> = (0..longest)
        .flat_map(|k| (0..plans.len()).map(move |i| (i, k)))
        .filter(|&(i, k)| k < plans[i].2.len())
        .collect();
    let batches: Vec<Batch> = order
        .iter()
        .map(|&(i, k)| batch(plans[i].0, plans[i].1, plans[i].2[k].1))
        .collect();
    let lead = batch("lead", sliding, 1);

    // The first request's call reaches the stopped Redis; the others queue
    // behind it, in order.
    let (first, lead_sent, queued) = queue_behind(&store, &redis, &prefix, &lead, &batches).await;
    let mut queued: Vec<_> = order.iter().copied().zip(queued).collect();
    let all_queued = Coalescing {
        counters: 1,
        waiting: queued.len(),
    };
    wait_for(&store, all_queued).await;
    queued.retain(|&((i, k), _)| plans[i].2[k].0 != Before);
    // The first request's caller goes away while its call is in flight: the
    // lane's next call goes out at once, carrying the rest.
    drop(first);
    let in_flight = Coalescing {
        counters: 1,
        waiting: 0,
    };
    wait_for(&store, in_flight).await;
    let sent_keys: Vec<String> = plans
        .iter()
        .filter(|(_, _, plan)| plan.iter().any(|&(fate, _)| fate != Before))
        .map(|(name, _, _)| key_of(&prefix, name))
        .collect();
    let shared_sent = lead_sent + call_size(&sent_keys);
    wait_unread(port, shared_sent, "the shared call to reach Redis").await;
    queued.retain(|&((i, k), _)| plans[i].2[k].0 != InFlight);
    redis.resume();

    let (places, waiting): (Vec<_>, Vec<_>) = queued.into_iter().unzip();
    for ((i, k), outcome) in places.into_iter().zip(join_all(waiting).await) {
        let (name, hits) = (plans[i].0, plans[i].2[k].1);
        let outcome = outcome.expect("Redis answers");
        let (admitted, used) = expected[i][k].expect("sent");
        assert_eq!(
            (outcome.admitted, outcome.limits[0].used),
            (admitted, used),
            "{name}'s request {k} (weight {hits}): {outcome:?}"
        );
    }
    // Hits counted for callers that went away are taken back; what the
    // waiting ones were told stays.
    wait_for(&store, Coalescing::default()).await;
    for ((name, limit, _), &want) in plans.iter().zip(&kept) {
        expect_counter(&store, name, *limit, want).await;
    }
    // A first request is sent alone (call.rs): dropped in flight, its
    // script counts as one sent by a caller that went away, and is kept.
    expect_counter(&store, "lead", sliding, 1).await;
    assert_eq!(store.refunds().failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_call_that_times_out_fails_each_identity_and_refunds_what_it_counted() {
    let redis = RedisServer::start();
    let port = redis.port();
    let prefix = support::unique_prefix();
    // Long beside the few steps between a request queuing and its call
    // being sent; the test waits it out once.
    let store = open(&redis.url(), &prefix, Duration::from_secs(1)).await;
    let metrics = Metrics::new(MetricsConfig::default());
    store.count_reconciliations_in(metrics.reconcile_counters());
    let [sliding, fixed, bucket, ..] = ALGORITHMS.map(limit);
    let counters = vec![
        Counter {
            name: "p".into(),
            limit: sliding,
            weight: Weight::Each(1),
        },
        Counter {
            name: "q".into(),
            limit: fixed,
            weight: Weight::Each(2),
        },
        Counter {
            name: "r".into(),
            limit: bucket,
            weight: Weight::Each(3),
        },
        Counter {
            name: "s".into(),
            limit: sliding,
            weight: Weight::Cycling,
        },
    ];
    let n = counters.len();
    // Three requests each (r's third does not fit), all carried by one call.
    let batches: Vec<Batch> = (0..3 * n)
        .map(|r| {
            let counter = &counters[r % n];
            batch(&counter.name, counter.limit, counter.weight.of(r / n))
        })
        .collect();
    // A read first: whatever becomes of its call, it counts nothing.
    let lead = batch("lead", sliding, 0);

    let (first, lead_sent, queued) = queue_behind(&store, &redis, &prefix, &lead, &batches).await;
    let all_queued = Coalescing {
        counters: 1,
        waiting: queued.len(),
    };
    wait_for(&store, all_queued).await;
    // Its caller gone, the first call hands the lane on: one call carries
    // every identity's requests to the stopped Redis.
    drop(first);
    let keys: Vec<String> = counters.iter().map(|c| key_of(&prefix, &c.name)).collect();
    let shared_sent = lead_sent + call_size(&keys);
    wait_unread(port, shared_sent, "the shared call to reach Redis").await;
    for outcome in join_all(queued).await {
        assert!(
            matches!(outcome, Err(StoreError::Timeout(_))),
            "{outcome:?}"
        );
    }
    // The call itself outlives the timeout: left to finish in the
    // background, it frees the lane.
    wait_for(&store, Coalescing::default()).await;
    redis.resume();

    // Its late reply is read and everything it counted refunded: nobody
    // was told they were admitted.
    let answered = metrics.reconcile_counters().answered;
    eventually_async("the shared call reconciled", async || answered.get() == 1).await;
    for counter in &counters {
        expect_counter(&store, &counter.name, counter.limit, 0).await;
    }
    expect_refunds_made(&store).await;
    let exposed = metrics.encode();
    for line in [
        r#"sluice_store_reconciliations_total{outcome="answered"} 1"#,
        r#"sluice_store_reconciliations_total{outcome="failed"} 0"#,
        r#"sluice_store_reconciliations_total{outcome="no_reply"} 0"#,
    ] {
        assert!(exposed.contains(line), "missing {line} in\n{exposed}");
    }

    // A burst that follows is exact for every identity of the batch.
    let sent = spawn_requests(&store, &counters, 0..REQUESTS);
    let answers = answers_per_counter(n, sent).await;
    for (counter, answers) in counters.iter().zip(&answers) {
        check_counter(&store, counter, answers).await;
    }
}
