//! RLQS through real Envoy 1.40 processes (`SLUICE_TEST_ENVOY`, set by
//! `tests/run`), configured from `deploy/envoy/rlqs.yaml` with only its
//! ports and domain changed, in front of a tiny upstream, with Sluice in
//! process. Load is paced by the test; what is checked is how many requests
//! Envoy admitted per window of the test's own clock, against the bound the
//! README states: `R·W + R·5 s + 3 × (assignments changed)`.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use sluice::decision::{Bounds, Limiter};
use sluice::limiter::ManualClock;
use sluice::server::{self, Listeners};
use sluice::store::{CounterStore, MemoryStore, MemoryStoreConfig, TimeSource};
use support::redis::RedisServer;
use tokio_util::sync::CancellationToken;

/// An HTTP upstream answering 200 to everything, one thread per connection.
fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            thread::spawn(move || serve_upstream(conn));
        }
    });
    addr
}

fn serve_upstream(mut conn: TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        // Answer each request head on the connection (Envoy reuses them).
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        buf.drain(..end);
        if conn
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .is_err()
        {
            return;
        }
    }
}

/// A running Envoy, killed when dropped, and its listener.
struct Envoy {
    _proxy: support::envoy::Envoy,
    front: SocketAddr,
}

impl Envoy {
    /// `deploy/envoy/rlqs.yaml` with its ports moved and domain `quota`.
    fn start(sluice: SocketAddr, app: SocketAddr) -> Self {
        let listen = support::redis::free_port();
        let admin = support::redis::free_port();
        let example = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/envoy/rlqs.yaml"),
        )
        .expect("read deploy/envoy/rlqs.yaml");
        let config = example
            .replace("port_value: 10000", &format!("port_value: {listen}"))
            .replace("port_value: 9901", &format!("port_value: {admin}"))
            .replace(
                "port_value: 8081",
                &format!("port_value: {}", sluice.port()),
            )
            .replace("port_value: 8000", &format!("port_value: {}", app.port()))
            .replace("0.0.0.0", "127.0.0.1")
            .replace("domain: example", "domain: quota");
        let front: SocketAddr = ([127, 0, 0, 1], listen).into();
        let admin: SocketAddr = ([127, 0, 0, 1], admin).into();
        Envoy {
            _proxy: support::envoy::Envoy::start_yaml(&config, front, admin),
            front,
        }
    }
}

/// One request for `tenant`; whether Envoy admitted it (200) or denied it
/// (429, the example's deny status).
fn request(front: SocketAddr, tenant: &str) -> bool {
    let mut conn = TcpStream::connect(front).expect("connect to Envoy");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        conn,
        "GET / HTTP/1.1\r\nhost: test\r\nx-tenant: {tenant}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    // Read the head only: Envoy delays its close, waiting for ours.
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    let response = String::from_utf8_lossy(&head);
    match response.get(9..12) {
        Some("200") => true,
        Some("429") => {
            assert!(response.contains("x-rlqs: denied"), "{response}");
            false
        }
        _ => panic!("unexpected answer from Envoy: {response:?}"),
    }
}

/// One request's time (from the test's start) and whether it was admitted.
type Log = Vec<(Duration, bool)>;

/// Sends `per_second` requests a second for `tenant` to `front` until
/// `until` after `start`, evenly paced, on a thread.
fn drive(
    front: SocketAddr,
    tenant: &'static str,
    per_second: f64,
    start: Instant,
    until: Duration,
) -> thread::JoinHandle<Log> {
    thread::spawn(move || {
        let gap = Duration::from_secs_f64(1.0 / per_second);
        let mut log = Vec::new();
        let mut next = Instant::now();
        while next.duration_since(start) < until {
            let now = Instant::now();
            if next > now {
                thread::sleep(next - now);
            }
            log.push((start.elapsed(), request(front, tenant)));
            next += gap;
        }
        log
    })
}

/// Admitted requests of `logs` sent in `[from, from + len)`.
fn admitted(logs: &[&Log], from: Duration, len: Duration) -> u64 {
    logs.iter()
        .flat_map(|l| l.iter())
        .filter(|(t, ok)| *ok && *t >= from && *t < from + len)
        .count() as u64
}

/// The two-Envoy load. hot: 120/min shared; A offers 4/s, B 0.5/s (a fixed
/// half would admit only 60 + 30 a minute). calm: 60/min, offered 0.25/s by
/// each Envoy. The logs come back in that order: hot A, hot B, calm A, calm B.
fn drive_uneven(
    a: SocketAddr,
    b: SocketAddr,
    start: Instant,
    run: Duration,
) -> Vec<thread::JoinHandle<Log>> {
    vec![
        drive(a, "hot", 4.0, start, run),
        drive(b, "hot", 0.5, start, run),
        drive(a, "calm", 0.25, start, run),
        drive(b, "calm", 0.25, start, run),
    ]
}

/// The drivers' logs, in order, once they have all finished.
async fn logs_of(drivers: Vec<thread::JoinHandle<Log>>) -> Vec<Log> {
    tokio::task::spawn_blocking(move || {
        drivers
            .into_iter()
            .map(|d| d.join().unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap()
}

/// The logs of [`drive_uneven`] over `run`: every 60 s window, sliding by
/// 5 s, within the bound, and, once the split has settled (from 10 s on),
/// using most of the budget; the quiet tenant never denied.
fn assert_one_budget(logs: &[Log], run: Duration, changes: u64) {
    let (hot_a, hot_b, calm_a, calm_b) = (&logs[0], &logs[1], &logs[2], &logs[3]);
    let w = Duration::from_secs(60);
    let upper = 120 + 10 + 3 * changes;
    let mut from = Duration::ZERO;
    while from + w <= run {
        let got = admitted(&[hot_a, hot_b], from, w);
        let (by_a, by_b) = (admitted(&[hot_a], from, w), admitted(&[hot_b], from, w));
        eprintln!("window {from:?}+60s: admitted {got} (A {by_a}, B {by_b}); bound {upper}");
        assert!(got <= upper, "window at {from:?}: {got} > {upper}");
        if from >= Duration::from_secs(10) {
            assert!(got >= 102, "window at {from:?}: only {got} of 120 used");
        }
        from += Duration::from_secs(5);
    }
    for (name, calm) in [("A", calm_a), ("B", calm_b)] {
        let denied = calm.iter().filter(|(_, ok)| !ok).count();
        assert_eq!(denied, 0, "the quiet tenant was denied on Envoy {name}");
    }
}

/// Sluice in process, on a given gRPC port (so it can restart on it).
struct Sluice {
    grpc: SocketAddr,
    http: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), server::ServeError>>,
}

impl Sluice {
    async fn start(rules: &str, grpc: SocketAddr) -> Self {
        let clock = Arc::new(ManualClock::new(support::T0));
        let store = MemoryStore::new(&MemoryStoreConfig::default(), clock);
        Self::start_with_store(rules, grpc, store).await
    }

    /// A replica over Redis at `url` under key `prefix` (RLQS then shares
    /// demand through it with the replicas of the same prefix).
    async fn start_on_redis(rules: &str, url: &str, prefix: &str) -> Self {
        let clock = Arc::new(ManualClock::new(support::T0));
        let timeout = Duration::from_secs(1);
        let store =
            support::redis_store_sharing(url, clock, TimeSource::Redis, timeout, prefix).await;
        Self::start_with_store(rules, ([127, 0, 0, 1], 0).into(), store).await
    }

    async fn start_with_store<S: CounterStore>(rules: &str, grpc: SocketAddr, store: S) -> Self {
        let limiter = Arc::new(Limiter::new(
            support::rules(rules),
            store,
            Bounds::default(),
        ));
        let listeners = Listeners::bind(grpc, ([127, 0, 0, 1], 0).into())
            .await
            .expect("bind Sluice");
        let (grpc, http) = (
            listeners.grpc_addr().unwrap(),
            listeners.http_addr().unwrap(),
        );
        let shutdown = CancellationToken::new();
        let options = server::ServeOptions {
            headers: sluice::headers::HeaderMode::Off,
            shutdown_delay: Duration::ZERO,
            shutdown_grace: Duration::from_secs(5),
            ..server::ServeOptions::default()
        };
        let task = tokio::spawn(server::run(limiter, options, listeners, shutdown.clone()));
        Self {
            grpc,
            http,
            shutdown,
            task,
        }
    }

    /// Assignments this instance changed for `tenant`'s bucket, from the
    /// admin page (each hands an Envoy a full bucket of 3).
    async fn assignments_changed(&self, tenant: &str) -> u64 {
        let page = support::rlqs_page(self.http).await;
        page["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["bucket"]["tenant"] == tenant)
            .map_or(0, |b| b["assignments_changed"].as_u64().unwrap())
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task
            .await
            .expect("server task")
            .expect("server stopped cleanly");
    }
}

const ONE_ENVOY_RULES: &str = r#"
domain: quota
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 60}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_envoy_enforces_the_assigned_rate_and_a_quiet_tenant_passes() {
    let sluice = Sluice::start(ONE_ENVOY_RULES, ([127, 0, 0, 1], 0).into()).await;
    let envoy = Envoy::start(sluice.grpc, upstream());
    let run = Duration::from_secs(25);
    let start = Instant::now();
    // hot offers 4/s against 1/s; calm offers 1 every 2 s against 1/s.
    let hot = drive(envoy.front, "hot", 4.0, start, run);
    let calm = drive(envoy.front, "calm", 0.5, start, run);
    let (hot, calm) =
        tokio::task::spawn_blocking(move || (hot.join().unwrap(), calm.join().unwrap()))
            .await
            .unwrap();
    let changes = sluice.assignments_changed("hot").await;

    let window = hot.last().unwrap().0;
    let got = admitted(&[&hot], Duration::ZERO, run);
    // R = 1/s: at most R·W + R·5 s + 3 per change; at least R·(W − 5 s), so
    // the assigned rate — not allow-all, not deny-all — is what Envoy ran.
    let w = window.as_secs_f64();
    let upper = (w + 5.0).ceil() as u64 + 3 * changes;
    let lower = (w - 5.0).floor() as u64;
    eprintln!(
        "hot admitted {got} of {} in {w:.1} s; changes {changes}",
        hot.len()
    );
    assert!(got <= upper, "over the bound: {got} > {upper}");
    assert!(got >= lower, "under the assigned rate: {got} < {lower}");
    let denied = calm.iter().filter(|(_, ok)| !ok).count();
    assert_eq!(denied, 0, "the quiet tenant was denied");
    drop(envoy);
    sluice.stop().await;
}

const TWO_ENVOY_RULES: &str = r#"
domain: quota
descriptors:
  - key: tenant
    value: hot
    rate_limit: {unit: minute, requests_per_unit: 120}
  - key: tenant
    value: calm
    rate_limit: {unit: minute, requests_per_unit: 60}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_with_uneven_demand_hold_the_global_budget_across_a_restart() {
    let sluice = Sluice::start(TWO_ENVOY_RULES, ([127, 0, 0, 1], 0).into()).await;
    let grpc = sluice.grpc;
    let app = upstream();
    let (a, b) = (Envoy::start(grpc, app), Envoy::start(grpc, app));
    let run = Duration::from_secs(80);
    let start = Instant::now();
    let drivers = drive_uneven(a.front, b.front, start, run);

    // Halfway, Sluice restarts on the same port: the Envoys keep their
    // assignments (TTL 60 s) and reconnect at their next report.
    let restart_at = Duration::from_secs(35);
    tokio::time::sleep_until((start + restart_at).into()).await;
    let mut changes = sluice.assignments_changed("hot").await;
    sluice.stop().await;
    let sluice = Sluice::start(TWO_ENVOY_RULES, grpc).await;

    let logs = logs_of(drivers).await;
    let after_restart = sluice.assignments_changed("hot").await;
    assert!(
        after_restart >= 2,
        "both Envoys resubscribed on the new Sluice"
    );
    changes += after_restart;
    assert_one_budget(&logs, run, changes);
    drop((a, b));
    sluice.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_on_two_replicas_sharing_redis_hold_one_budget() {
    let redis = RedisServer::start();
    let prefix = support::unique_prefix();
    let one = Sluice::start_on_redis(TWO_ENVOY_RULES, &redis.url(), &prefix).await;
    let two = Sluice::start_on_redis(TWO_ENVOY_RULES, &redis.url(), &prefix).await;
    let app = upstream();
    // Each Envoy's stream lands on its own replica.
    let (a, b) = (Envoy::start(one.grpc, app), Envoy::start(two.grpc, app));
    let run = Duration::from_secs(75);
    let start = Instant::now();
    let drivers = drive_uneven(a.front, b.front, start, run);
    let logs = logs_of(drivers).await;
    let changes = one.assignments_changed("hot").await + two.assignments_changed("hot").await;
    // Without sharing, each replica would hand its Envoy the whole 120.
    assert_one_budget(&logs, run, changes);
    drop((a, b));
    one.stop().await;
    two.stop().await;
}
