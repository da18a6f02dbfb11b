//! What one decision costs Redis, on a real `redis-server`: Sluice's script
//! for each algorithm, beside two baselines implemented only here —
//! envoyproxy/ratelimit's fixed window (`INCRBY` + `EXPIRE`, pipelined) and a
//! sorted-set sliding log (`ZREMRANGEBYSCORE` + `ZCARD` + `ZADD` + `EXPIRE`,
//! pipelined) holding 1,000 hits per window.
//!
//! Run: `cargo run --release --example redis_cost [-- REDIS_URL]`
//!
//! With no URL it starts a private `redis-server` on a free loopback port
//! and stops it at the end. Each scenario warms its identities up (so the
//! measured calls see steady state), resets the statistics, makes
//! `DECISIONS` decisions with `CONCURRENCY` in flight, and reads
//! `INFO commandstats` and `INFO cpu` (the same reading as
//! `sluice bench --redis-url`):
//! - server µs: commandstats time per decision — the scripts' time for
//!   Sluice (it includes the commands they call), every command's for the
//!   baselines;
//! - CPU µs: the Redis main thread's CPU per decision — commands, protocol
//!   parsing and network I/O together, which a pipeline of several commands
//!   pays per command;
//! - bytes: `MEMORY USAGE` of one identity's key after the run.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::bench::{RedisSnapshot, redis_snapshot};
use sluice::limiter::{Algorithm, IdentityBuilder, LimitSpec, Role, SystemClock, Window};
use sluice::store::{
    Batch, BatchItem, CounterStore, RedisStore, RedisStoreConfig, RedisUrl, TimeSource,
};

const DECISIONS: usize = 50_000;
const IDENTITIES: usize = 50;
const CONCURRENCY: usize = 32;
/// Hits per identity per window in the sorted-set baseline.
const LOG_HITS: usize = 1_000;

fn spec(requests: u64, duration_ms: u64, algorithm: Algorithm) -> LimitSpec {
    LimitSpec {
        requests,
        window: Window {
            duration_ms,
            algorithm,
        },
        penalty: None,
    }
}

/// Sluice's default: a sliding window with 10 buckets (1 minute → 6 s).
fn sliding(duration_ms: u64) -> LimitSpec {
    spec(
        1_000_000_000,
        duration_ms,
        Algorithm::SlidingWindow {
            precision_ms: duration_ms / 10,
        },
    )
}

enum Kind {
    /// Sluice's script with these limits on each identity.
    Script(Vec<LimitSpec>),
    /// Sluice's script for two descriptors per request (two identities),
    /// each with these limits.
    TwoDescriptors(Vec<LimitSpec>),
    /// `INCRBY` + `EXPIRE` per decision, pipelined.
    FixedBaseline,
    /// `ZREMRANGEBYSCORE` + `ZCARD` + `ZADD` + `EXPIRE` per decision,
    /// pipelined; each identity's clock moves one tick per hit and the window
    /// is `LOG_HITS` ticks, so the set holds 1,000 entries.
    LogBaseline,
}

struct Scenario {
    name: &'static str,
    kind: Kind,
}

async fn command(store: &RedisStore, args: &[String]) -> redis::Value {
    let mut conn = store.connection().expect("a connected single Redis");
    redis::cmd(&args[0])
        .arg(&args[1..])
        .query_async(&mut conn)
        .await
        .expect("redis command")
}

/// Sends a baseline's commands on `key` as one pipeline, with the minute's
/// TTL both baselines give their key last; the replies are ignored.
async fn pipeline(store: &RedisStore, mut pipe: redis::Pipeline, key: &str) {
    pipe.cmd("EXPIRE").arg(key).arg(60).ignore();
    let mut conn = store.connection().expect("a connected single Redis");
    let _: () = pipe.query_async(&mut conn).await.expect("pipeline");
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| (*p).to_owned()).collect()
}

fn identity(scenario: usize, i: usize) -> sluice::limiter::Identity {
    let mut b = IdentityBuilder::new(&format!("cost{scenario}"));
    b.value("remote_address", &format!("10.0.{}.{}", i / 256, i % 256));
    b.build()
}

fn baseline_key(scenario: usize, i: usize) -> String {
    format!("baseline{scenario}:{i}")
}

/// One decision `n` of `scenario` (index `s`).
async fn decide(store: &RedisStore, s: usize, scenario: &Scenario, n: usize) {
    let who = n % IDENTITIES;
    match &scenario.kind {
        Kind::Script(limits) | Kind::TwoDescriptors(limits) => {
            let descriptors = match scenario.kind {
                Kind::TwoDescriptors(_) => 2,
                _ => 1,
            };
            let items = (0..descriptors)
                .map(|d| BatchItem {
                    identity: identity(s, who + d * IDENTITIES),
                    limits: limits.clone(),
                    hits: 1,
                    role: Role::Enforce,
                    counting: sluice::limiter::Counting::Admitted,
                    refund: false,
                })
                .collect();
            store.apply(&Batch { items }).await.expect("decision");
        }
        Kind::FixedBaseline => {
            let key = baseline_key(s, who);
            let mut pipe = redis::pipe();
            pipe.cmd("INCRBY").arg(&key).arg(1).ignore();
            pipeline(store, pipe, &key).await;
        }
        Kind::LogBaseline => {
            let key = baseline_key(s, who);
            // This identity's n-th hit happens at tick n / IDENTITIES.
            let tick = (n / IDENTITIES) as i64;
            let mut pipe = redis::pipe();
            pipe.cmd("ZREMRANGEBYSCORE")
                .arg(&key)
                .arg("-inf")
                .arg(tick - LOG_HITS as i64)
                .ignore()
                .cmd("ZCARD")
                .arg(&key)
                .ignore()
                .cmd("ZADD")
                .arg(&key)
                .arg(tick)
                .arg(format!("{tick}-{n}"))
                .ignore();
            pipeline(store, pipe, &key).await;
        }
    }
}

/// `range` decisions of `scenario`, `CONCURRENCY` at a time.
async fn drive(
    store: &Arc<RedisStore>,
    s: usize,
    scenario: &Arc<Scenario>,
    range: std::ops::Range<usize>,
) {
    let mut tasks = Vec::new();
    for worker in 0..CONCURRENCY {
        let (store, scenario, range) = (store.clone(), scenario.clone(), range.clone());
        tasks.push(tokio::spawn(async move {
            for n in range.skip(worker).step_by(CONCURRENCY) {
                decide(&store, s, &scenario, n).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
}

struct Private(Child);

impl Drop for Private {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> (Private, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("sluice-cost-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on PATH (apt-get install redis-server)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    (Private(child), format!("redis://127.0.0.1:{port}"))
}

async fn snapshot(url: &RedisUrl) -> RedisSnapshot {
    redis_snapshot(std::slice::from_ref(url))
        .await
        .expect("INFO")
        .expect("one URL, one reading")
}

#[tokio::main]
async fn main() {
    let (_private, url) = match std::env::args().nth(1) {
        Some(url) => (None, url),
        None => {
            let (p, url) = start_redis();
            (Some(p), url)
        }
    };
    let config = RedisStoreConfig {
        tls: sluice::store::RedisTls::default(),
        per_second_url: None,
        coalesce: true,
        url: RedisUrl::new(url.clone()),
        pool_size: 4,
        timeout: Duration::from_secs(2),
        breaker: None,
        key_prefix: format!("cost:{}:", std::process::id()),
        time: TimeSource::Redis,
    };
    let store = Arc::new(
        RedisStore::connect(&config, Arc::new(SystemClock), Duration::from_secs(5))
            .await
            .unwrap(),
    );
    let scenarios = [
        Scenario {
            name: "Sluice sliding_window, 1 limit (1 min, 6 s buckets)",
            kind: Kind::Script(vec![sliding(60_000)]),
        },
        Scenario {
            name: "Sluice sliding_window, 3 limits (1 s, 1 min, 1 h)",
            kind: Kind::Script(vec![sliding(1_000), sliding(60_000), sliding(3_600_000)]),
        },
        Scenario {
            name: "Sluice sliding_window, 2 descriptors of 1 limit each",
            kind: Kind::TwoDescriptors(vec![sliding(60_000)]),
        },
        Scenario {
            name: "Sluice fixed_window, 1 limit (1 min)",
            kind: Kind::Script(vec![spec(1_000_000_000, 60_000, Algorithm::FixedWindow)]),
        },
        Scenario {
            name: "Sluice token_bucket, 1 limit (burst 1,000)",
            kind: Kind::Script(vec![spec(
                1_000_000_000,
                60_000,
                Algorithm::TokenBucket { burst: 1_000 },
            )]),
        },
        Scenario {
            name: "Sluice sliding_log, 1 limit (100 per 10 s)",
            kind: Kind::Script(vec![spec(100, 10_000, Algorithm::SlidingLog)]),
        },
        Scenario {
            name: "baseline: envoyproxy/ratelimit fixed window (INCRBY + EXPIRE)",
            kind: Kind::FixedBaseline,
        },
        Scenario {
            name: "baseline: sorted-set log, 1,000 hits per window (ZREMRANGEBYSCORE + ZCARD + ZADD + EXPIRE)",
            kind: Kind::LogBaseline,
        },
    ];
    println!(
        "Redis {url}: per scenario {DECISIONS} decisions over {IDENTITIES} identities after a warm-up of {} per identity, {CONCURRENCY} in flight\n",
        LOG_HITS
    );
    println!(
        "| scenario | server µs / decision | CPU µs / decision | commands / decision | bytes / identity | decisions/s (client) |"
    );
    println!("|---|---|---|---|---|---|");
    for (s, scenario) in scenarios.into_iter().enumerate() {
        let scenario = Arc::new(scenario);
        // Warm-up: every identity reaches steady state (1,000 entries in
        // the sorted-set log); not measured.
        drive(&store, s, &scenario, 0..IDENTITIES * LOG_HITS).await;
        let before = snapshot(&config.url).await;
        let started = Instant::now();
        let first = IDENTITIES * LOG_HITS;
        drive(&store, s, &scenario, first..first + DECISIONS).await;
        let elapsed = started.elapsed();
        let cost = before.cost(&snapshot(&config.url).await, DECISIONS as u64);
        let key = match scenario.kind {
            Kind::Script(_) | Kind::TwoDescriptors(_) => {
                identity(s, 7).storage_key(&config.key_prefix)
            }
            _ => baseline_key(s, 7),
        };
        let bytes = match command(&store, &args(&["MEMORY", "USAGE", &key])).await {
            redis::Value::Int(n) => n,
            _ => 0,
        };
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {} | {:.0} |",
            scenario.name,
            cost.usec_per_decision,
            cost.cpu_usec_per_decision,
            cost.calls_per_decision,
            bytes,
            DECISIONS as f64 / elapsed.as_secs_f64()
        );
    }
    store.quit();
}
