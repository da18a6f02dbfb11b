//! `sluice bench`: a gRPC load generator for any RLS v3 server (Sluice or
//! another), reporting decisions per second, latency percentiles and, with
//! `--redis-url`, what each decision cost Redis.
//!
//! Closed loop by default (`--concurrency` requests always in flight). With
//! `--rate` a pacer releases requests at that rate (every 100 µs) to
//! whichever workers are free; latency is measured from
//! the release, so when the server falls behind and released requests wait
//! for a worker, the wait counts (no coordinated omission).

mod pace;
mod report;
mod workload;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tonic::transport::Channel;

use pace::Pacer;
pub use report::{CommandCost, Latency, RedisCost, RedisSnapshot, Report};
pub use workload::{DescriptorTemplate, Distribution, Keys, Workload};

use crate::proto as pb;
use crate::proto::rate_limit_response::Code;
use crate::query::{QueryError, endpoint};
use crate::rules::parse_duration;
use crate::store::{RedisUrl, StoreError, server_info};

/// `sluice bench`.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// Address of the RLS server (host:port or http://host:port)
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub addr: String,
    /// Requests in flight
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: u32,
    /// HTTP/2 connections the requests share (default: min(concurrency, 4))
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub connections: Option<u32>,
    /// Stop after this many measured requests
    #[arg(long, conflicts_with = "duration")]
    pub requests: Option<u64>,
    /// Measure for this long (default 10s unless --requests is given)
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<u64>,
    /// Load before measuring, not counted (e.g. 2s, 0)
    #[arg(long, default_value = "2s", value_parser = duration_or_zero)]
    pub warmup: u64,
    /// Send at this many requests per second in total instead of as fast as answers come
    #[arg(long)]
    pub rate: Option<f64>,
    /// Rate-limit domain of every request
    #[arg(long, default_value = "bench")]
    pub domain: String,
    /// A descriptor as key=value[,key=value…], where {key} in a value is the
    /// request's key; repeat for several descriptors per request
    #[arg(
        long = "descriptor",
        value_name = "K=V[,K=V...]",
        default_value = "user_id={key}"
    )]
    pub descriptors: Vec<DescriptorTemplate>,
    /// Distinct keys (identities) the requests spread over: real traffic's
    /// shape is many, uniform or Zipf; 1 is a single hot identity
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// How keys are drawn
    #[arg(long, value_enum, default_value_t = Distribution::Uniform)]
    pub distribution: Distribution,
    /// Zipf exponent s (key k has weight 1/k^s)
    #[arg(long, default_value_t = 1.0)]
    pub zipf_exponent: f64,
    /// Request weight (hits_addend); absent means the server's default of 1
    #[arg(long)]
    pub hits: Option<u32>,
    /// Give up on one call after this long; counted as a TIMEOUT error
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: u64,
    /// Seed of the key draws (runs with one seed send the same keys)
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Redis behind the server (redis://, rediss://, redis-cluster://):
    /// report commands and server time per decision from INFO deltas
    #[arg(long = "redis-url", value_name = "URL")]
    pub redis_urls: Vec<String>,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
    /// Threads of the load generator (default: one per CPU). On a machine it
    /// shares with the server, fewer threads leave the server more CPU and
    /// fewer preemptions, which shows in the latency tail.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,
}

impl BenchArgs {
    /// The arguments of a run of `requests` against `addr` with no warm-up:
    /// a start for tests and examples that set the rest themselves.
    pub fn new(addr: impl Into<String>, requests: u64) -> Self {
        Self {
            addr: addr.into(),
            concurrency: 16,
            connections: None,
            requests: Some(requests),
            duration: None,
            warmup: 0,
            rate: None,
            domain: "bench".into(),
            descriptors: vec!["user_id={key}".parse().expect("a valid template")],
            keys: 10_000,
            distribution: Distribution::Uniform,
            zipf_exponent: 1.0,
            hits: None,
            timeout: 2_000,
            seed: 1,
            redis_urls: Vec::new(),
            json: false,
            threads: None,
        }
    }
}

/// A duration such as `500ms` or `2s`, or a bare `0`.
fn duration_or_zero(text: &str) -> Result<u64, String> {
    if text == "0" {
        return Ok(0);
    }
    parse_duration(text)
}

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// An argument is wrong.
    #[error("{0}")]
    Invalid(String),
    /// The address is invalid or the server could not be reached.
    #[error(transparent)]
    Connect(#[from] QueryError),
    /// Redis could not be read.
    #[error("cannot read INFO from Redis: {0}")]
    Redis(String),
}

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// State the workers share with the conductor.
struct Shared {
    /// WARMUP, MEASURE or STOP: one atomic flip starts and ends measuring.
    phase: AtomicU8,
    /// Measured requests still to send (`--requests`); unused otherwise.
    tickets: AtomicU64,
    /// Measured requests answered, for the progress bar.
    done: AtomicU64,
    /// Whether `tickets` bounds the run.
    counted: bool,
}

impl Shared {
    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }

    /// Takes one measured request; false when none are left.
    fn take_ticket(&self) -> bool {
        !self.counted
            || self
                .tickets
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(1))
                .is_ok()
    }
}

/// Ends the run (workers, pacer) when dropped.
struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.phase.store(STOP, Ordering::Release);
    }
}

/// What one worker saw while measuring.
struct Tally {
    latency_us: Histogram<u64>,
    ok: u64,
    over_limit: u64,
    errors: HashMap<String, u64>,
}

impl Tally {
    fn new() -> Self {
        Self {
            // 1 µs to 10 min, 3 significant digits.
            latency_us: Histogram::new_with_bounds(1, 600_000_000, 3)
                .expect("valid histogram bounds"),
            ok: 0,
            over_limit: 0,
            errors: HashMap::new(),
        }
    }

    fn merge(&mut self, other: Tally) {
        let _ = self.latency_us.add(&other.latency_us);
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        for (code, n) in other.errors {
            *self.errors.entry(code).or_default() += n;
        }
    }
}

async fn connect(addr: &str, timeout: Duration) -> Result<Channel, BenchError> {
    let (uri, endpoint) = endpoint(addr)?;
    Ok(endpoint
        .connect_timeout(timeout.max(Duration::from_secs(1)))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| QueryError::Connect(uri, e))?)
}

/// One reading of every Redis in `urls` (`None` when there are none); also
/// what the Redis cost harness reads.
pub async fn redis_snapshot(urls: &[RedisUrl]) -> Result<Option<RedisSnapshot>, BenchError> {
    if urls.is_empty() {
        return Ok(None);
    }
    let mut snapshot = RedisSnapshot::default();
    for url in urls {
        let texts = server_info(url).await.map_err(|e| {
            let why = match e {
                StoreError::Unavailable(why) => why,
                other => other.to_string(),
            };
            BenchError::Redis(format!("{url}: {why}"))
        })?;
        for text in texts {
            snapshot.add_info(&text);
        }
    }
    Ok(Some(snapshot))
}

/// Sends requests until the phase says stop (or the tickets run out).
async fn worker(
    mut client: pb::RateLimitServiceClient<Channel>,
    workload: Arc<Workload>,
    keys: Arc<Keys>,
    shared: Arc<Shared>,
    mut rng: SmallRng,
    pacer: Option<Arc<Pacer>>,
    timeout: Duration,
) -> Tally {
    let mut tally = Tally::new();
    loop {
        let measuring = match shared.phase() {
            STOP => break,
            MEASURE => {
                if !shared.take_ticket() {
                    break;
                }
                true
            }
            _ => false,
        };
        let sent = match &pacer {
            Some(pacer) => match pacer.next().await {
                Some(released) => released,
                None => break,
            },
            None => Instant::now(),
        };
        let request = workload.request(keys.sample(&mut rng));
        let result = tokio::time::timeout(timeout, client.should_rate_limit(request)).await;
        // In a timed run, answers that arrive after the end are not counted.
        if !measuring || (!shared.counted && shared.phase() != MEASURE) {
            continue;
        }
        let error = match result {
            Ok(Ok(response)) => {
                match Code::try_from(response.get_ref().overall_code) {
                    Ok(Code::OverLimit) => tally.over_limit += 1,
                    _ => tally.ok += 1,
                }
                let micros = sent.elapsed().as_micros().max(1) as u64;
                let _ = tally.latency_us.record(micros.min(600_000_000));
                None
            }
            Ok(Err(status)) => Some(format!("{:?}", status.code()).to_uppercase()),
            Err(_) => Some("TIMEOUT".to_owned()),
        };
        if let Some(code) = error {
            *tally.errors.entry(code).or_default() += 1;
        }
        shared.done.fetch_add(1, Ordering::Relaxed);
    }
    tally
}

/// Runs the benchmark `args` describe. `progress` shows a bar on stderr when
/// it is a terminal.
pub async fn run(args: &BenchArgs, progress: bool) -> Result<Report, BenchError> {
    let keys = Arc::new(
        Keys::new(args.keys, args.distribution, args.zipf_exponent).map_err(BenchError::Invalid)?,
    );
    validate(args)?;
    let redis_urls: Vec<RedisUrl> = args.redis_urls.iter().map(RedisUrl::new).collect();
    let concurrency = args.concurrency as usize;
    let connections = args
        .connections
        .map_or(concurrency.min(4), |c| c as usize)
        .min(concurrency);
    let timeout = Duration::from_millis(args.timeout.max(1));
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections {
        channels.push(connect(&args.addr, timeout).await?);
    }
    let workload = Arc::new(Workload {
        domain: args.domain.clone(),
        templates: args.descriptors.clone(),
        hits: args.hits.unwrap_or(0),
    });
    let measure_for = match (args.requests, args.duration) {
        (Some(_), _) => None,
        (None, Some(ms)) => Some(Duration::from_millis(ms)),
        (None, None) => Some(Duration::from_secs(10)),
    };
    let shared = Arc::new(Shared {
        phase: AtomicU8::new(if args.warmup == 0 { MEASURE } else { WARMUP }),
        tickets: AtomicU64::new(args.requests.unwrap_or(0)),
        done: AtomicU64::new(0),
        counted: args.requests.is_some(),
    });

    // Workers, pacer and progress stop whenever this function returns,
    // an error included.
    let _stop = StopOnDrop(shared.clone());
    // With no warm-up, measuring starts with the first request, so the
    // reading is taken before any is sent; else when the warm-up ends.
    let warmup = Duration::from_millis(args.warmup);
    let mut before = None;
    if warmup.is_zero() {
        before = redis_snapshot(&redis_urls).await?;
    }
    let pacer = args.rate.map(|rate| {
        let shared = shared.clone();
        Pacer::start(rate, move || shared.phase() == STOP)
    });
    let workers = spawn_workers(args, &channels, &workload, &keys, &shared, pacer.as_ref());

    let bar = progress.then(|| progress_bar(args, measure_for));
    if !warmup.is_zero() {
        tokio::time::sleep(warmup).await;
        before = redis_snapshot(&redis_urls).await?;
        shared.phase.store(MEASURE, Ordering::Release);
    }
    let measured_at = Instant::now();
    let ticker = bar
        .clone()
        .map(|bar| spawn_ticker(bar, shared.clone(), measured_at));

    let (tally, elapsed, after) =
        finish(measure_for, measured_at, workers, &shared, &redis_urls).await;
    if let Some(t) = ticker {
        t.abort();
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }

    Ok(report(
        args,
        (concurrency, connections),
        tally,
        elapsed,
        before,
        after,
    ))
}

/// Refuses arguments clap cannot check alone.
fn validate(args: &BenchArgs) -> Result<(), BenchError> {
    if args.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err(BenchError::Invalid(
            "--rate must be a positive number".into(),
        ));
    }
    if args.requests == Some(0) {
        return Err(BenchError::Invalid("--requests must be at least 1".into()));
    }
    Ok(())
}

/// One worker per request in flight, spread over the connections.
fn spawn_workers(
    args: &BenchArgs,
    channels: &[Channel],
    workload: &Arc<Workload>,
    keys: &Arc<Keys>,
    shared: &Arc<Shared>,
    pacer: Option<&Arc<Pacer>>,
) -> Vec<tokio::task::JoinHandle<Tally>> {
    let timeout = Duration::from_millis(args.timeout.max(1));
    (0..args.concurrency as usize)
        .map(|i| {
            tokio::spawn(worker(
                pb::RateLimitServiceClient::new(channels[i % channels.len()].clone()),
                workload.clone(),
                keys.clone(),
                shared.clone(),
                SmallRng::seed_from_u64(args.seed.wrapping_mul(1_000_003).wrapping_add(i as u64)),
                pacer.cloned(),
                timeout,
            ))
        })
        .collect()
}

/// Redraws the progress bar every 100 ms with the rate measured so far.
fn spawn_ticker(
    bar: indicatif::ProgressBar,
    shared: Arc<Shared>,
    measured_at: Instant,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let done = shared.done.load(Ordering::Relaxed);
            let secs = measured_at.elapsed().as_secs_f64();
            if shared.counted {
                bar.set_position(done);
            } else {
                bar.set_position(measured_at.elapsed().as_millis() as u64);
            }
            bar.set_message(format!("{:.0} decisions/s", done as f64 / secs.max(1e-3)));
        }
    })
}

/// Ends the measured run (after `measure_for`, or when the workers have
/// sent every request) and gathers the workers' tallies, the length of the
/// run and Redis's reading at its end.
async fn finish(
    measure_for: Option<Duration>,
    measured_at: Instant,
    workers: Vec<tokio::task::JoinHandle<Tally>>,
    shared: &Shared,
    redis_urls: &[RedisUrl],
) -> (Tally, Duration, Result<Option<RedisSnapshot>, BenchError>) {
    let mut tally = Tally::new();
    let (elapsed, after) = match measure_for {
        Some(length) => {
            tokio::time::sleep(length).await;
            shared.phase.store(STOP, Ordering::Release);
            // A failed reading must not throw the measured run away.
            let after = redis_snapshot(redis_urls).await;
            for w in workers {
                tally.merge(w.await.expect("a bench worker panicked"));
            }
            (length, after)
        }
        None => {
            for w in workers {
                tally.merge(w.await.expect("a bench worker panicked"));
            }
            let elapsed = measured_at.elapsed();
            shared.phase.store(STOP, Ordering::Release);
            let after = redis_snapshot(redis_urls).await;
            (elapsed, after)
        }
    };
    (tally, elapsed, after)
}

/// The report of a finished run.
fn report(
    args: &BenchArgs,
    (concurrency, connections): (usize, usize),
    tally: Tally,
    elapsed: Duration,
    before: Option<RedisSnapshot>,
    after: Result<Option<RedisSnapshot>, BenchError>,
) -> Report {
    let decisions = tally.ok + tally.over_limit;
    // A failed reading at the end must not throw the measured run away.
    let (redis, redis_error) = match (before, after) {
        (Some(b), Ok(Some(a))) => (Some(b.cost(&a, decisions)), None),
        (_, Err(e)) => (None, Some(e.to_string())),
        _ => (None, None),
    };
    Report {
        addr: args.addr.clone(),
        domain: args.domain.clone(),
        concurrency,
        connections,
        rate: args.rate,
        keys: args.keys,
        distribution: format!("{:?}", args.distribution).to_lowercase(),
        warmup_s: args.warmup as f64 / 1e3,
        elapsed_s: elapsed.as_secs_f64(),
        decisions,
        decisions_per_s: decisions as f64 / elapsed.as_secs_f64().max(1e-9),
        ok: tally.ok,
        over_limit: tally.over_limit,
        errors: tally.errors.into_iter().collect::<BTreeMap<_, _>>(),
        latency_ms: Latency::from_micros(&tally.latency_us),
        redis,
        redis_error,
    }
}

fn progress_bar(args: &BenchArgs, measure_for: Option<Duration>) -> indicatif::ProgressBar {
    let (length, template) = match (args.requests, measure_for) {
        (Some(n), _) => (n, "{bar:40} {pos}/{len} requests  {msg}"),
        (None, Some(d)) => (d.as_millis() as u64, "{bar:40} {elapsed} measured  {msg}"),
        (None, None) => (0, "{msg}"),
    };
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(length),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template(template).expect("a valid progress template"),
    );
    if args.warmup > 0 {
        bar.set_message(format!("warming up for {} ms", args.warmup));
    }
    bar
}
