//! The Redis store through Redis Cluster topology changes, on real clusters
//! started by the harness (one per test, since each test changes it): a slot
//! migration under load, a manual failover, a master killed and replaced by
//! its replica, a new master taking slots; and a hung master that must trip
//! only its own circuit breaker.
//!
//! Traffic runs all the time. During each event errors may only touch the
//! slots that move (or the failed master's slots, while it is down); after
//! it, every slot answers again within 2 s and 200 concurrent calls against
//! a limit of 5 admit exactly 5 and count exactly 5.

use crate::support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use sluice::limiter::{Clock, IdentityBuilder, LimitSpec, ManualClock, SystemClock};
use sluice::store::{
    Batch, BatchItem, BreakerConfig, CounterStore, RedisStore, RedisStoreConfig, RedisUrl,
    StoreError, TimeSource,
};
use support::per_minute;
use support::redis::{RedisCluster, key_slot};

/// A limit no traffic of these tests reaches.
const ROOMY: u64 = 1_000_000_000;
/// How long after an event every slot must answer again.
const RECOVERY: Duration = Duration::from_secs(2);

fn item(name: &str, limit: LimitSpec, hits: u64) -> BatchItem {
    support::enforcing("faults", name, limit, hits)
}

/// A store on `cluster` with its own prefix; calls may take a second (these
/// tests check routing, not latency), and a breaker only when given.
async fn store(
    url: String,
    breaker: Option<BreakerConfig>,
    clock: Arc<dyn Clock>,
) -> (Arc<RedisStore>, String) {
    let prefix = support::unique_prefix();
    let config = RedisStoreConfig {
        tls: sluice::store::RedisTls::default(),
        per_second_url: None,
        coalesce: true,
        url: RedisUrl::new(url),
        pool_size: 2,
        timeout: Duration::from_secs(1),
        key_prefix: prefix.clone(),
        time: TimeSource::Redis,
        breaker,
    };
    let store = RedisStore::connect(&config, clock, Duration::from_secs(10))
        .await
        .expect("connect to the cluster");
    (Arc::new(store), prefix)
}

/// The slot of `name`'s counter under `prefix`.
fn slot_of(prefix: &str, name: &str) -> u16 {
    let mut identity = IdentityBuilder::new("faults");
    identity.value("id", name);
    key_slot(identity.build().storage_key(prefix).as_bytes())
}

/// A fresh name (starting with `stem`) whose counter is in a slot that `want` accepts.
fn name_where(prefix: &str, stem: &str, want: impl Fn(u16) -> bool) -> String {
    (0..)
        .map(|i| format!("{stem}-{i}"))
        .find(|name| want(slot_of(prefix, name)))
        .expect("some name fits")
}

/// One probe name per master (two for the first), each in its own slot.
fn probes(cluster: &RedisCluster, prefix: &str) -> Vec<(String, u16)> {
    let mut names = Vec::new();
    for (i, master) in cluster.master_ports().into_iter().enumerate() {
        for j in 0..if i == 0 { 2 } else { 1 } {
            let name = name_where(prefix, &format!("probe{i}.{j}"), |slot| {
                cluster.port_for_slot(slot) == master
            });
            let slot = slot_of(prefix, &name);
            names.push((name, slot));
        }
    }
    names
}

/// The slots of `probes` that the master on `port` serves.
fn slots_on(cluster: &RedisCluster, probes: &[(String, u16)], port: u16) -> BTreeSet<u16> {
    probes
        .iter()
        .filter(|(_, s)| cluster.port_for_slot(*s) == port)
        .map(|(_, s)| *s)
        .collect()
}

/// The phases an error can fall in.
const BEFORE: u8 = 0;
const DURING: u8 = 1;
const AFTER: u8 = 2;

/// Calls on every probe, round after round, recording each failure with the
/// phase it happened in.
struct Traffic {
    phase: Arc<AtomicU8>,
    rounds: Arc<AtomicU64>,
    /// `(phase, slot, error)`.
    errors: Arc<Mutex<Vec<(u8, u16, String)>>>,
    /// Rounds in which every call succeeded, with the round number.
    clean: Arc<Mutex<Vec<u64>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(store: Arc<RedisStore>, probes: Vec<(String, u16)>) -> Traffic {
        let phase = Arc::new(AtomicU8::new(BEFORE));
        let rounds = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let clean = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (phase, rounds, errors, clean, stop) = (
                phase.clone(),
                rounds.clone(),
                errors.clone(),
                clean.clone(),
                stop.clone(),
            );
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let calls = probes.iter().map(|(name, slot)| {
                        let store = store.clone();
                        let batch = Batch {
                            items: vec![item(name, per_minute(ROOMY), 1)],
                        };
                        async move { (*slot, store.apply(&batch).await) }
                    });
                    let mut ok = true;
                    for (slot, result) in join_all(calls).await {
                        if let Err(e) = result {
                            ok = false;
                            // The phase when the call ended: one sent just
                            // before an event may fail because of it.
                            let now = phase.load(Ordering::Relaxed);
                            errors.lock().unwrap().push((now, slot, e.to_string()));
                        }
                    }
                    let round = rounds.fetch_add(1, Ordering::Relaxed) + 1;
                    if ok {
                        clean.lock().unwrap().push(round);
                    }
                    // Pacing, so the traffic leaves the two cores some room.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        });
        Traffic {
            phase,
            rounds,
            errors,
            clean,
            stop,
            task,
        }
    }

    fn set_phase(&self, phase: u8) {
        self.phase.store(phase, Ordering::Relaxed);
    }

    /// Waits until `n` more rounds have run.
    async fn run_rounds(&self, n: u64) {
        let target = self.rounds.load(Ordering::Relaxed) + n;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.rounds.load(Ordering::Relaxed) < target {
            assert!(Instant::now() < deadline, "traffic stalled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Errors recorded in `phase`: their slots, and a sample of messages.
    fn errors_in(&self, phase: u8) -> (BTreeSet<u16>, Vec<String>) {
        let errors = self.errors.lock().unwrap();
        let mine = errors.iter().filter(|(p, _, _)| *p == phase);
        let slots = mine.clone().map(|(_, s, _)| *s).collect();
        let mut sample: Vec<String> = mine.map(|(_, _, e)| e.clone()).collect();
        sample.dedup();
        sample.truncate(5);
        (slots, sample)
    }

    /// No error before the event.
    fn expect_none_before(&self) {
        let (before, sample) = self.errors_in(BEFORE);
        assert!(before.is_empty(), "errors before the event: {sample:?}");
    }

    /// During the event and after it, errors only on `slots`; `complaint`
    /// opens the failure message.
    fn expect_only_on(&self, slots: &BTreeSet<u16>, complaint: &str) {
        for phase in [DURING, AFTER] {
            let (failed, sample) = self.errors_in(phase);
            assert!(
                failed.is_subset(slots),
                "{complaint}: {failed:?} {sample:?}"
            );
        }
    }

    /// Marks the event over and waits (at most [`RECOVERY`]) for a round in
    /// which every slot answers; then 20 more rounds must all answer too.
    async fn expect_recovery(&self) {
        self.set_phase(AFTER);
        let from = self.rounds.load(Ordering::Relaxed);
        let deadline = Instant::now() + RECOVERY;
        let first = loop {
            let clean = self
                .clean
                .lock()
                .unwrap()
                .iter()
                .find(|&&r| r > from)
                .copied();
            if let Some(round) = clean {
                break round;
            }
            assert!(
                Instant::now() < deadline,
                "no round without errors within {RECOVERY:?} of the event's end: {:?}",
                self.errors_in(AFTER)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        self.run_rounds(21).await;
        let clean = self.clean.lock().unwrap();
        let later = clean.iter().filter(|&&r| r > first).count();
        let ran = self.rounds.load(Ordering::Relaxed) - first;
        assert_eq!(
            later as u64,
            ran,
            "after recovery every round must succeed; errors: {:?}",
            self.errors_in(AFTER)
        );
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
    }
}

/// 200 concurrent calls for the fresh counter `name` against a limit of 5:
/// exactly 5 admitted, and the counter holds exactly 5.
async fn exactly_five(store: &Arc<RedisStore>, name: String) {
    let calls = (0..200).map(|_| {
        let store = store.clone();
        let batch = Batch {
            items: vec![item(&name, per_minute(5), 1)],
        };
        tokio::spawn(async move { store.apply(&batch).await })
    });
    let mut admitted = 0;
    for call in join_all(calls).await {
        let outcome = call.expect("no panic").expect("every call answers");
        admitted += usize::from(outcome.admitted);
    }
    assert_eq!(admitted, 5, "200 concurrent calls against a limit of 5");
    let read = Batch {
        items: vec![item(&name, per_minute(5), 0)],
    };
    let used = store.apply(&read).await.expect("a read answers").limits[0].used;
    assert_eq!(used, 5, "the counter holds exactly the admitted hits");
}

/// Runs blocking cluster administration off the runtime's workers.
async fn admin<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("cluster admin")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_under_load_fails_nothing_but_the_moving_slot_and_recovers() {
    let cluster = Arc::new(RedisCluster::start());
    let (store, prefix) = store(cluster.url(), None, Arc::new(SystemClock)).await;
    let probes = probes(&cluster, &prefix);
    let (_, moving) = probes[0].clone();
    let to = cluster
        .master_ports()
        .into_iter()
        .find(|&p| p != cluster.port_for_slot(moving))
        .expect("another master");
    let traffic = Traffic::start(store.clone(), probes);
    traffic.run_rounds(20).await;

    traffic.set_phase(DURING);
    let c = cluster.clone();
    let slot_move = admin(move || c.begin_slot_move(moving, to)).await;
    traffic.run_rounds(20).await;
    let slot_move = admin(move || {
        slot_move.move_keys();
        slot_move
    })
    .await;
    // Keys on the target, slot still migrating: ASK redirects.
    traffic.run_rounds(20).await;
    let c = cluster.clone();
    admin(move || slot_move.finish(&c.master_ports())).await;
    traffic.run_rounds(5).await;
    traffic.expect_recovery().await;

    traffic.expect_none_before();
    let (during, sample) = traffic.errors_in(DURING);
    assert!(
        during.iter().all(|&s| s == moving),
        "errors on slots that did not move ({during:?} vs {moving}): {sample:?}"
    );
    let (after, sample) = traffic.errors_in(AFTER);
    assert!(
        after.iter().all(|&s| s == moving),
        "errors after the move on other slots: {sample:?}"
    );
    traffic.stop().await;
    assert_eq!(cluster.port_for_slot(moving), to, "the slot moved");
    exactly_five(&store, name_where(&prefix, "exact", |s| s == moving)).await;
    exactly_five(&store, name_where(&prefix, "exact", |s| s != moving)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_fails_only_the_promoted_shard_and_recovers() {
    let cluster = Arc::new(RedisCluster::start_with_replicas());
    let (store, prefix) = store(cluster.url(), None, Arc::new(SystemClock)).await;
    let probes = probes(&cluster, &prefix);
    let old = cluster.port_for_slot(probes[0].1);
    let replica = cluster.replica_of(old);
    let shard = slots_on(&cluster, &probes, old);
    let traffic = Traffic::start(store.clone(), probes);
    traffic.run_rounds(20).await;

    traffic.set_phase(DURING);
    let c = cluster.clone();
    admin(move || c.failover(replica)).await;
    traffic.run_rounds(5).await;
    traffic.expect_recovery().await;

    traffic.expect_none_before();
    traffic.expect_only_on(
        &shard,
        &format!("errors outside the failed-over shard {shard:?}"),
    );
    traffic.stop().await;
    assert_eq!(cluster.port_for_slot(*shard.first().unwrap()), replica);
    let name = name_where(&prefix, "exact", |s| cluster.port_for_slot(s) == replica);
    exactly_five(&store, name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_only_its_slots_until_its_replica_takes_over() {
    let cluster = Arc::new(Mutex::new(RedisCluster::start_with_replicas()));
    // A breaker that, once open, would stay open for good (the clock never
    // moves): the promoted replica's slots must not wait for it.
    let breaker = BreakerConfig {
        failures: 3,
        min_failing: Duration::ZERO,
        cooldown: Duration::from_secs(3600),
    };
    let url = cluster.lock().unwrap().url();
    let clock = Arc::new(ManualClock::new(support::T0));
    let (store, prefix) = store(url, Some(breaker), clock).await;
    let (probes, dead, replica) = {
        let c = cluster.lock().unwrap();
        let probes = probes(&c, &prefix);
        let dead = c.port_for_slot(probes[0].1);
        let replica = c.replica_of(dead);
        (probes, dead, replica)
    };
    let shard = slots_on(&cluster.lock().unwrap(), &probes, dead);
    let traffic = Traffic::start(store.clone(), probes);
    traffic.run_rounds(20).await;

    traffic.set_phase(DURING);
    let c = cluster.clone();
    admin(move || {
        let mut c = c.lock().unwrap();
        let index = c.index_of(dead);
        c.node_mut(index).stop();
        c.wait_master(replica);
    })
    .await;
    traffic.run_rounds(5).await;
    traffic.expect_recovery().await;

    traffic.expect_none_before();
    traffic.expect_only_on(
        &shard,
        &format!("errors outside the dead master's slots {shard:?}"),
    );
    let (during, _) = traffic.errors_in(DURING);
    assert!(
        !during.is_empty(),
        "the dead master's slots did fail for a while"
    );
    traffic.stop().await;
    let name = {
        let c = cluster.lock().unwrap();
        assert_eq!(c.port_for_slot(*shard.first().unwrap()), replica);
        name_where(&prefix, "exact", |s| c.port_for_slot(s) == replica)
    };
    exactly_five(&store, name).await;
    assert!(store.is_ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_master_takes_slots_under_load_with_errors_only_on_the_moving_ones() {
    let cluster = Arc::new(Mutex::new(RedisCluster::start()));
    let url = cluster.lock().unwrap().url();
    let (store, prefix) = store(url, None, Arc::new(SystemClock)).await;
    let probes = probes(&cluster.lock().unwrap(), &prefix);
    // One probed slot of each old master moves to the new one.
    let moving: Vec<u16> = {
        let c = cluster.lock().unwrap();
        let mut seen = BTreeSet::new();
        probes
            .iter()
            .map(|(_, s)| *s)
            .filter(|&s| seen.insert(c.port_for_slot(s)))
            .collect()
    };
    let traffic = Traffic::start(store.clone(), probes);
    traffic.run_rounds(20).await;

    traffic.set_phase(DURING);
    let c = cluster.clone();
    let new = admin(move || c.lock().unwrap().add_master()).await;
    traffic.run_rounds(10).await;
    for &slot in &moving {
        let c = cluster.clone();
        admin(move || c.lock().unwrap().move_slot(slot, new)).await;
        traffic.run_rounds(10).await;
    }
    traffic.expect_recovery().await;

    let moving_set: BTreeSet<u16> = moving.iter().copied().collect();
    traffic.expect_none_before();
    traffic.expect_only_on(&moving_set, "errors on slots that did not move");
    traffic.stop().await;
    let name = {
        let c = cluster.lock().unwrap();
        assert!(moving.iter().all(|&s| c.port_for_slot(s) == new));
        name_where(&prefix, "exact", |s| c.port_for_slot(s) == new)
    };
    exactly_five(&store, name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_opens_only_its_own_breaker() {
    let cluster = Arc::new(RedisCluster::start());
    let breaker = BreakerConfig {
        failures: 3,
        min_failing: Duration::ZERO,
        cooldown: Duration::from_secs(3600),
    };
    let clock = Arc::new(ManualClock::new(support::T0));
    let prefix = support::unique_prefix();
    let config = RedisStoreConfig {
        tls: sluice::store::RedisTls::default(),
        per_second_url: None,
        coalesce: true,
        url: RedisUrl::new(cluster.url()),
        pool_size: 1,
        timeout: Duration::from_millis(100),
        key_prefix: prefix.clone(),
        time: TimeSource::Redis,
        breaker: Some(breaker),
    };
    let store = RedisStore::connect(&config, clock, Duration::from_secs(10))
        .await
        .expect("connect");
    let probes = probes(&cluster, &prefix);
    let hung = cluster.port_for_slot(probes[0].1);
    // Read before the pause: a paused node would not answer the harness.
    let owners: Vec<u16> = probes
        .iter()
        .map(|(_, s)| cluster.port_for_slot(*s))
        .collect();
    let call = |name: &str| {
        let batch = Batch {
            items: vec![item(name, per_minute(ROOMY), 1)],
        };
        let store = &store;
        async move { store.apply(&batch).await }
    };
    let node = &cluster.nodes()[cluster.index_of(hung)];
    node.pause();
    for _ in 0..3 {
        let result = call(&probes[0].0).await;
        assert!(matches!(result, Err(StoreError::Timeout(_))), "{result:?}");
    }
    assert!(
        matches!(call(&probes[0].0).await, Err(StoreError::CircuitOpen(_))),
        "the hung master's breaker is open"
    );
    for ((name, slot), owner) in probes.iter().zip(owners) {
        let result = call(name).await;
        if owner == hung {
            assert!(
                matches!(result, Err(StoreError::CircuitOpen(_))),
                "{result:?}"
            );
        } else {
            assert!(
                result.is_ok(),
                "slot {slot} on a healthy master: {result:?}"
            );
        }
    }
    assert!(store.is_ready(), "two of three masters serve");
    node.resume();
}
