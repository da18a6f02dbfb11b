//! What one EVALSHA costs the client, fred against redis-rs: the process's
//! own CPU (user + system, from /proc/self/stat) per call, with 128 calls in
//! flight over one pipelined connection each (fred's client, redis-rs's
//! multiplexed connection), rounds alternating. The script does almost
//! nothing (it returns ten integers, the shape of a one-limit decide.lua
//! reply when the client was chosen; it is seven now) so that the client's
//! encoding, routing, task wake-ups and reply parsing are what is measured;
//! each call carries one key and nine arguments, as Sluice's calls do.
//!
//! ```sh
//! redis-server --port 7790 --save '' --appendonly no &
//! cargo run --release --example redis_clients -- redis://127.0.0.1:7790 [CALLS]
//! ```
//!
//! Results and the choice they support are in BENCHMARKS.md.

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use fred::interfaces::{ClientLike as _, LuaInterface as _};

/// Ten integers back, like a decision of one limit at the time (see above).
const SCRIPT: &str = "return {1, 0, 5, 0, 1, 0, 0, 0, 0, 0}";
const IN_FLIGHT: usize = 128;
const ROUNDS: usize = 3;

/// The arguments of a one-limit call: now, mode, role, hits, limits, then
/// requests, duration, algorithm and precision.
fn args() -> Vec<String> {
    ["", "all", "0", "1", "1", "1000000", "60000", "0", "1000"]
        .map(String::from)
        .to_vec()
}

/// The process's CPU time so far, in microseconds.
fn cpu_micros() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which is in parentheses).
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // Linux's USER_HZ is 100 on every platform Sluice runs on.
    ticks * 10_000
}

/// Runs `calls` calls of `call`, `IN_FLIGHT` at a time; prints the client
/// CPU per call and the calls per second.
async fn measure<F, Fut>(name: &str, calls: usize, call: F)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let call = Arc::new(call);
    let (cpu, wall) = (cpu_micros(), Instant::now());
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|t| {
            let call = call.clone();
            tokio::spawn(async move {
                for i in (t..calls).step_by(IN_FLIGHT) {
                    call(i).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a call task");
    }
    let (cpu, wall) = (cpu_micros() - cpu, wall.elapsed());
    println!(
        "{name:<9} {:>8.0} calls/s {:>7.2} µs client CPU per call",
        calls as f64 / wall.as_secs_f64(),
        cpu as f64 / calls as f64
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut argv = std::env::args().skip(1);
    let url = argv
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let calls: usize = argv.next().map_or(Ok(200_000), |n| n.parse())?;

    let redis_rs = redis::Client::open(url.as_str())?;
    let multiplexed = redis_rs.get_multiplexed_async_connection().await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT)
        .query_async(&mut multiplexed.clone())
        .await?;

    let fred =
        fred::prelude::Builder::from_config(fred::prelude::Config::from_url(&url)?).build()?;
    fred.init().await?;

    for _ in 0..ROUNDS {
        let (client, hash) = (fred.clone(), sha.clone());
        measure("fred", calls, move |i| {
            let (client, hash) = (client.clone(), hash.clone());
            async move {
                let reply: Vec<i64> = client
                    .evalsha(hash, format!("bench:{{{}}}", i % 1000), args())
                    .await
                    .expect("fred EVALSHA");
                assert_eq!(reply.len(), 10);
            }
        })
        .await;
        let (connection, hash) = (multiplexed.clone(), sha.clone());
        measure("redis-rs", calls, move |i| {
            let (mut connection, hash) = (connection.clone(), hash.clone());
            async move {
                let reply: Vec<i64> = redis::cmd("EVALSHA")
                    .arg(&hash)
                    .arg(1)
                    .arg(format!("bench:{{{}}}", i % 1000))
                    .arg(args())
                    .query_async(&mut connection)
                    .await
                    .expect("redis-rs EVALSHA");
                assert_eq!(reply.len(), 10);
            }
        })
        .await;
    }
    fred.quit().await?;
    Ok(())
}
