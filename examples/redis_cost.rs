//! Redis server cost per decision of Sluice's script, read from Redis's own
//! `INFO commandstats` (server-side microseconds, not client latency).
//!
//! Run: `cargo run --release --example redis_cost [-- REDIS_URL]`
//!
//! With no URL it starts a private `redis-server` on a free loopback port
//! (and stops it at the end). For each scenario it drives decisions through
//! `RedisStore` (exactly what `sluice serve --redis-url` runs) over a set of
//! identities, then reports EVALSHA calls, server µs per decision, Redis
//! commands per decision (the script's inner commands included) and
//! `MEMORY USAGE` per identity.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};
use sluice::limiter::{Algorithm, IdentityBuilder, LimitSpec, Role, SystemClock, Window};
use sluice::store::{
    Batch, BatchItem, CounterStore, RedisStore, RedisStoreConfig, RedisUrl, TimeSource,
};

const DECISIONS: usize = 50_000;
const IDENTITIES: usize = 1_000;
const CONCURRENCY: usize = 32;

fn sliding(requests: u64, duration_ms: u64) -> LimitSpec {
    LimitSpec {
        requests,
        window: Window {
            duration_ms,
            algorithm: Algorithm::SlidingWindow {
                precision_ms: duration_ms / 10,
            },
        },
    }
}

fn fixed(requests: u64, duration_ms: u64) -> LimitSpec {
    LimitSpec {
        requests,
        window: Window {
            duration_ms,
            algorithm: Algorithm::FixedWindow,
        },
    }
}

struct Scenario {
    name: &'static str,
    limits: Vec<LimitSpec>,
}

async fn command(store: &RedisStore, args: &[&str]) -> Value {
    let values: Vec<Value> = args[1..].iter().map(|a| Value::from(*a)).collect();
    store
        .pool()
        .next()
        .custom(
            CustomCommand::new(args[0].to_string(), ClusterHash::Random, false),
            values,
        )
        .await
        .expect("redis command")
}

/// `(calls, usec)` of each command in `INFO commandstats`.
async fn commandstats(store: &RedisStore) -> Vec<(String, u64, u64)> {
    let Value::String(text) = command(store, &["INFO", "commandstats"]).await else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(key))
                    .and_then(|v| v.parse::<u64>().ok())
            };
            Some((name.to_string(), field("calls=")?, field("usec=")?))
        })
        .collect()
}

/// Identity `i` of a scenario; scenarios do not share identities, so each
/// HASH holds one scenario's fields.
fn identity(scenario: usize, i: usize) -> sluice::limiter::Identity {
    let mut b = IdentityBuilder::new(&format!("cost{scenario}"));
    b.value("remote_address", &format!("10.0.{}.{}", i / 256, i % 256));
    b.build()
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
        url: RedisUrl::new(url.clone()),
        pool_size: 4,
        timeout: Duration::from_secs(2),
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
            name: "sliding_window, 1 limit (1 min, 6 s buckets)",
            limits: vec![sliding(1_000_000, 60_000)],
        },
        Scenario {
            name: "sliding_window, 3 limits (1 s, 1 min, 1 h)",
            limits: vec![
                sliding(1_000_000, 1_000),
                sliding(1_000_000, 60_000),
                sliding(1_000_000, 3_600_000),
            ],
        },
        Scenario {
            name: "fixed_window, 1 limit (1 min)",
            limits: vec![fixed(1_000_000, 60_000)],
        },
    ];
    println!(
        "Redis: {url}; {DECISIONS} decisions per scenario over {IDENTITIES} identities, {CONCURRENCY} in flight\n"
    );
    println!(
        "| scenario | EVALSHA calls | server µs / decision | Redis commands / decision | bytes / identity | decisions/s (client) |"
    );
    println!("|---|---|---|---|---|---|");
    for (index, scenario) in scenarios.iter().enumerate() {
        command(&store, &["CONFIG", "RESETSTAT"]).await;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for worker in 0..CONCURRENCY {
            let store = store.clone();
            let limits = scenario.limits.clone();
            tasks.push(tokio::spawn(async move {
                for n in (worker..DECISIONS).step_by(CONCURRENCY) {
                    let item = BatchItem {
                        identity: identity(index, n % IDENTITIES),
                        limits: limits.clone(),
                        hits: 1,
                        role: Role::Enforce,
                    };
                    store
                        .apply(&Batch { items: vec![item] })
                        .await
                        .expect("decision");
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let elapsed = started.elapsed();
        let stats = commandstats(&store).await;
        let (calls, usec) = stats
            .iter()
            .find(|(n, _, _)| n == "evalsha")
            .map_or((0, 0), |s| (s.1, s.2));
        // Inner commands are counted too; EVALSHA's usec already includes them.
        let inner: u64 = stats
            .iter()
            .filter(|(n, _, _)| !["evalsha", "info", "config"].contains(&n.as_str()))
            .map(|s| s.1)
            .sum();
        let key = identity(index, 7).storage_key(&config.key_prefix);
        let bytes = match command(&store, &["MEMORY", "USAGE", &key]).await {
            Value::Integer(n) => n,
            _ => 0,
        };
        println!(
            "| {} | {} | {:.2} | {:.2} | {} | {:.0} |",
            scenario.name,
            calls,
            usec as f64 / calls.max(1) as f64,
            (calls + inner) as f64 / calls.max(1) as f64,
            bytes,
            DECISIONS as f64 / elapsed.as_secs_f64()
        );
    }
    store.quit().await;
}
