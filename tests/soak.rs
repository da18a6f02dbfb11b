//! Soak test (ignored by default): the `sluice` binary over a real
//! `redis-server`, under load from concurrent gRPC clients for
//! `SLUICE_SOAK_SECS` seconds (default 600), while Redis is killed and
//! restarted twice and the rules are swapped once (Kubernetes ConfigMap
//! style). It reports decisions, errors by gRPC code and by phase, latency,
//! outage behaviour, recovery time, the reload and the server's RSS.
//!
//! ```text
//! cargo test --release --test soak -- --ignored --nocapture
//! SLUICE_SOAK_SECS=60 cargo test --release --test soak -- --ignored --nocapture
//! ```
//!
//! `SLUICE_SOAK_CONCURRENCY` (default 32) sets the number of client tasks;
//! each sends its next request as soon as the last is answered, so the rate
//! is bounded only by the server.
//!
//! Speed is measured, never asserted. Asserted are only invariants that hold
//! on any machine: the server is still running at the end; after each Redis
//! restart requests succeed again within [`RECOVERY_DEADLINE`]; the reloaded
//! rules take effect; the only error is UNAVAILABLE, and only while Redis is
//! down or within [`GRACE`] of the first decision that needed Redis after
//! its restart.

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::proto::{RateLimitRequest, RateLimitServiceClient, rate_limit_response::Code};
use support::redis::RedisServer;
use support::{http, request, start_binary_with_http};
use tonic::transport::{Channel, Endpoint};

/// How long Redis stays down in each outage.
const OUTAGE: Duration = Duration::from_secs(5);
/// How long after a Redis restart requests may take to succeed again.
const RECOVERY_DEADLINE: Duration = Duration::from_secs(30);
/// Errors still tolerated after the first Redis-backed decision following a
/// restart (the breaker's cooldown, pooled connections reconnecting on their
/// own back-off).
const GRACE: Duration = Duration::from_secs(3);
/// How long a reload may take to show in /rlconfig and in decisions.
const RELOAD_DEADLINE: Duration = Duration::from_secs(20);
/// A guard against hangs: a call without an answer by then is an error.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the server's RSS is sampled.
const RSS_EVERY: Duration = Duration::from_secs(2);
/// gRPC connections the client tasks share.
const CONNECTIONS: usize = 4;

/// The phases of the run; each sample is counted in the phase current when
/// its answer arrives.
const PHASES: [&str; 9] = [
    "warm-up",
    "steady-1",
    "redis-down-1",
    "recovery-1",
    "steady-2",
    "reloaded",
    "redis-down-2",
    "recovery-2",
    "steady-3",
];
const WARM_UP: usize = 0;
const STEADY_1: usize = 1;
const DOWN_1: usize = 2;
const RELOADED: usize = 5;
const DOWN_2: usize = 6;

/// Whether errors are expected in `phase` (Redis down or just back).
fn errors_allowed(phase: usize) -> bool {
    matches!(phase, DOWN_1 | 3 | DOWN_2 | 7)
}

const API_V1: &str = "\
domain: soak-api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100, name: per-user}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 20, algorithm: fixed_window, name: per-ip}
";

/// The reloaded version: a higher per-user limit and a new `plan` rule.
const API_V2: &str = "\
domain: soak-api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 150, name: per-user}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 20, algorithm: fixed_window, name: per-ip}
  - key: plan
    rate_limit: {unit: minute, requests_per_unit: 7, name: per-plan}
";

const TENANT: &str = "\
domain: soak-tenant
descriptors:
  - key: tenant
    rate_limits:
      - {unit: second, requests_per_unit: 50, algorithm: token_bucket, burst: 100, name: tenant-rate}
      - {unit: hour, requests_per_unit: 100000, name: tenant-hourly}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 600, algorithm: fixed_window, name: tenant-path}
";

/// What /rlconfig shows once the reload is in force.
const RELOADED_RULES: [&str; 2] = [
    "soak-api/user: requests_per_unit=150 ",
    "soak-api/plan: requests_per_unit=7 ",
];

// ---------------------------------------------------------------------------
// Measurements
// ---------------------------------------------------------------------------

/// A log-linear latency histogram in microseconds: exact below 64 µs, then
/// 32 buckets per power of two (at most ~3% error).
#[derive(Clone)]
struct Histogram {
    counts: Vec<u64>,
    n: u64,
    max_us: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; 64 + 58 * 32],
            n: 0,
            max_us: 0,
        }
    }
}

impl Histogram {
    fn index(us: u64) -> usize {
        if us < 64 {
            return us as usize;
        }
        let e = u64::from(63 - us.leading_zeros());
        let m = us >> (e - 5);
        (64 + (e - 6) * 32 + (m - 32)) as usize
    }

    /// The smallest value counted in bucket `index`.
    fn lower(index: usize) -> u64 {
        if index < 64 {
            return index as u64;
        }
        let i = (index - 64) as u64;
        let (e, m) = (i / 32 + 6, i % 32 + 32);
        m << (e - 5)
    }

    fn record(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.counts[Self::index(us)] += 1;
        self.n += 1;
        self.max_us = self.max_us.max(us);
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.n += other.n;
        self.max_us = self.max_us.max(other.max_us);
    }

    /// The `q` quantile (upper edge of its bucket, at most the maximum).
    fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let upper = if i + 1 < self.counts.len() {
                    Self::lower(i + 1)
                } else {
                    u64::MAX
                };
                return upper.min(self.max_us);
            }
        }
        self.max_us
    }

    fn summary(&self) -> String {
        if self.n == 0 {
            return "-".into();
        }
        format!(
            "p50 {} p99 {} max {}",
            ms(self.quantile(0.5)),
            ms(self.quantile(0.99)),
            ms(self.max_us)
        )
    }
}

/// Microseconds as milliseconds for the report.
fn ms(us: u64) -> String {
    format!("{:.2}ms", us as f64 / 1000.0)
}

/// What one phase saw.
#[derive(Clone, Default)]
struct Stats {
    ok: u64,
    over: u64,
    /// Error kind → (count, first message).
    errors: BTreeMap<String, (u64, String)>,
    latency: Histogram,
    error_latency: Histogram,
    /// Milliseconds since the start of the run.
    first_error_ms: Option<u64>,
    last_error_ms: Option<u64>,
    first_ms: Option<u64>,
    last_ms: Option<u64>,
}

impl Stats {
    fn answered(&mut self, at_ms: u64, latency: Duration) {
        self.latency.record(latency);
        self.first_ms.get_or_insert(at_ms);
        self.last_ms = Some(at_ms);
    }

    fn error(&mut self, kind: String, message: String, at_ms: u64, latency: Duration) {
        self.answered(at_ms, latency);
        self.error_latency.record(latency);
        self.errors.entry(kind).or_insert((0, message)).0 += 1;
        self.first_error_ms.get_or_insert(at_ms);
        self.last_error_ms = Some(at_ms);
    }

    fn error_count(&self) -> u64 {
        self.errors.values().map(|(n, _)| n).sum()
    }

    fn total(&self) -> u64 {
        self.ok + self.over + self.error_count()
    }

    fn merge(&mut self, other: &Stats) {
        self.ok += other.ok;
        self.over += other.over;
        for (kind, (n, message)) in &other.errors {
            self.errors
                .entry(kind.clone())
                .or_insert((0, message.clone()))
                .0 += n;
        }
        self.latency.merge(&other.latency);
        self.error_latency.merge(&other.error_latency);
        self.first_error_ms = min_opt(self.first_error_ms, other.first_error_ms);
        self.last_error_ms = self.last_error_ms.max(other.last_error_ms);
        self.first_ms = min_opt(self.first_ms, other.first_ms);
        self.last_ms = self.last_ms.max(other.last_ms);
    }
}

fn min_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// State shared by the controller (the test thread) and the client tasks.
struct Shared {
    start: Instant,
    phase: AtomicUsize,
    stop: AtomicBool,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn enter(&self, phase: usize) {
        self.phase.store(phase, Ordering::SeqCst);
        log(self, &format!("phase {}", PHASES[phase]));
    }
}

fn log(shared: &Shared, what: &str) {
    eprintln!(
        "[soak {:7.1}s] {what}",
        shared.start.elapsed().as_secs_f64()
    );
}

/// xorshift64*: a deterministic, dependency-free generator for the mix.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }

    /// A value from `hot` hot identities 20% of the time, otherwise from
    /// `cold` others (so each limit sees both verdicts at any throughput).
    fn identity(&mut self, hot: u64, cold: u64) -> String {
        if self.below(5) == 0 {
            format!("hot-{}", self.below(hot))
        } else {
            format!("c-{}", self.below(cold))
        }
    }
}

/// The next request of the mix: two descriptors on `soak-api` (sliding and
/// fixed window), one or a nested one on `soak-tenant` (token bucket plus a
/// sliding hour, fixed window below), or the rule the reload adds.
fn next_request(rng: &mut Rng) -> RateLimitRequest {
    match rng.below(20) {
        0..=10 => {
            let user = rng.identity(10, 50_000);
            let ip = rng.identity(10, 20_000);
            request("soak-api", &[&[("user", &user)], &[("ip", &ip)]])
        }
        11..=14 => {
            let tenant = rng.identity(5, 500);
            request("soak-tenant", &[&[("tenant", &tenant)]])
        }
        15..=18 => {
            let tenant = rng.identity(5, 500);
            let path = format!("/p{}", rng.below(20));
            request("soak-tenant", &[&[("tenant", &tenant), ("path", &path)]])
        }
        _ => {
            let plan = rng.identity(3, 1_000);
            request("soak-api", &[&[("plan", &plan)]])
        }
    }
}

/// One client task: calls until told to stop, counting by phase.
async fn drive(
    id: u64,
    mut client: RateLimitServiceClient<Channel>,
    shared: Arc<Shared>,
) -> Vec<Stats> {
    let mut stats = vec![Stats::default(); PHASES.len()];
    let mut rng = Rng((id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    while !shared.stop.load(Ordering::Relaxed) {
        let req = next_request(&mut rng);
        let sent = Instant::now();
        let result = tokio::time::timeout(CALL_TIMEOUT, client.should_rate_limit(req)).await;
        let latency = sent.elapsed();
        let at = shared.now_ms();
        let phase = &mut stats[shared.phase.load(Ordering::SeqCst)];
        match result {
            Ok(Ok(response)) => {
                let code = response.into_inner().overall_code;
                if code == Code::Ok as i32 {
                    phase.ok += 1;
                } else if code == Code::OverLimit as i32 {
                    phase.over += 1;
                } else {
                    let kind = format!("overall_code={code}");
                    phase.error(kind.clone(), kind, at, latency);
                    continue;
                }
                phase.answered(at, latency);
            }
            Ok(Err(status)) => phase.error(
                format!("{:?}", status.code()),
                status.message().to_owned(),
                at,
                latency,
            ),
            Err(_) => phase.error(
                "client timeout".into(),
                format!("no answer within {CALL_TIMEOUT:?}"),
                at,
                latency,
            ),
        }
    }
    stats
}

/// The resident set of process `pid` in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

// ---------------------------------------------------------------------------
// The rules directory (ConfigMap layout)
// ---------------------------------------------------------------------------

/// Writes version `name` (both files) into `root`.
fn write_version(root: &Path, name: &str, api: &str) {
    std::fs::create_dir(root.join(name)).unwrap();
    std::fs::write(root.join(name).join("api.yaml"), api).unwrap();
    std::fs::write(root.join(name).join("tenant.yaml"), TENANT).unwrap();
}

/// Points `..data` at version `name` atomically, as the kubelet does.
fn swap_to(root: &Path, name: &str) {
    symlink(name, root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
}

// ---------------------------------------------------------------------------
// The controller's steps
// ---------------------------------------------------------------------------

struct Outage {
    /// Redis killed, restarted (answering PING), and the first decision
    /// that needed Redis after that, in ms since the start.
    stopped_ms: u64,
    restarted_ms: u64,
    first_success_ms: Option<u64>,
}

/// Kills Redis, keeps it down for [`OUTAGE`], restarts it and waits for the
/// first decision that needs Redis, then leaves [`GRACE`] before the next
/// phase.
fn outage(
    shared: &Shared,
    redis: &mut RedisServer,
    down: usize,
    rt: &tokio::runtime::Runtime,
    probe: &RateLimitServiceClient<Channel>,
) -> Outage {
    shared.enter(down);
    let stopped_ms = shared.now_ms();
    redis.stop();
    log(shared, "redis-server killed");
    std::thread::sleep(OUTAGE);
    redis.restart();
    let restarted_ms = shared.now_ms();
    shared.enter(down + 1);
    log(shared, "redis-server restarted (answers PING)");
    let first_success_ms = rt.block_on(first_store_success(probe.clone(), shared, down));
    match first_success_ms {
        Some(at) => log(
            shared,
            &format!(
                "first Redis-backed decision {} ms after restart",
                at - restarted_ms
            ),
        ),
        None => log(shared, "no Redis-backed decision after restart"),
    }
    std::thread::sleep(GRACE);
    shared.enter(down + 2);
    Outage {
        stopped_ms,
        restarted_ms,
        first_success_ms,
    }
}

/// Probes until a decision succeeds that only Redis can make (a never-seen
/// user, so neither the over-limit cache nor a limitless descriptor can
/// answer it) and returns when, or `None` after [`RECOVERY_DEADLINE`].
async fn first_store_success(
    mut client: RateLimitServiceClient<Channel>,
    shared: &Shared,
    tag: usize,
) -> Option<u64> {
    let deadline = Instant::now() + RECOVERY_DEADLINE;
    for attempt in 0u64.. {
        let user = format!("probe-{tag}-{attempt}");
        let call = client.should_rate_limit(request("soak-api", &[&[("user", &user)]]));
        if let Ok(Ok(answer)) = tokio::time::timeout(CALL_TIMEOUT, call).await
            && answer.into_inner().overall_code == Code::Ok as i32
        {
            return Some(shared.now_ms());
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

struct ReloadOutcome {
    swapped_ms: u64,
    /// Since the swap, until /rlconfig showed the new rules.
    rlconfig_after: Option<Duration>,
    /// Since the swap, until a decision used the new `plan` rule.
    decision_after: Option<Duration>,
}

/// Swaps in the v2 rules and waits until /rlconfig and a decision show them.
fn reload(
    shared: &Shared,
    root: &Path,
    admin: std::net::SocketAddr,
    rt: &tokio::runtime::Runtime,
    grpc: &str,
) -> ReloadOutcome {
    shared.enter(RELOADED);
    write_version(root, "..v2", API_V2);
    let swapped = Instant::now();
    let swapped_ms = shared.now_ms();
    swap_to(root, "..v2");
    log(shared, "rules swapped to v2");
    let mut rlconfig_after = None;
    while swapped.elapsed() < RELOAD_DEADLINE {
        let (status, text) = http(admin, "GET", "/rlconfig", "");
        if status == 200 && RELOADED_RULES.iter().all(|rule| text.contains(rule)) {
            rlconfig_after = Some(swapped.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    log(shared, &format!("/rlconfig shows v2: {rlconfig_after:?}"));
    let decision_after = rt.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
            .await
            .expect("connect to sluice");
        while swapped.elapsed() < RELOAD_DEADLINE {
            let answer = client
                .should_rate_limit(request("soak-api", &[&[("plan", "reload-check")]]))
                .await;
            let limit = answer.ok().and_then(|r| {
                let status = r.into_inner().statuses.into_iter().next()?;
                Some(status.current_limit?.requests_per_unit)
            });
            if limit == Some(7) {
                return Some(swapped.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    });
    log(shared, &format!("decisions use v2: {decision_after:?}"));
    ReloadOutcome {
        swapped_ms,
        rlconfig_after,
        decision_after,
    }
}

/// Sleeps until `at` into the run (not at all if that is past).
fn sleep_until(shared: &Shared, at: Duration) {
    if let Some(left) = at.checked_sub(shared.start.elapsed()) {
        std::thread::sleep(left);
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number"))
    })
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

#[test]
#[ignore = "soak: runs for SLUICE_SOAK_SECS (default 600) seconds; run with `cargo test --release --test soak -- --ignored --nocapture`"]
fn soak_under_load_with_redis_restarts_and_reloads() {
    let secs = env_number("SLUICE_SOAK_SECS", 600);
    assert!(
        secs >= 20,
        "SLUICE_SOAK_SECS={secs}: at least 20 s are needed for two outages and a reload"
    );
    let duration = Duration::from_secs(secs);
    let concurrency = env_number("SLUICE_SOAK_CONCURRENCY", 32).max(1);

    let mut redis = RedisServer::start();
    let rules_dir = tempfile::tempdir().unwrap();
    let root = rules_dir.path();
    write_version(root, "..v1", API_V1);
    symlink("..v1", root.join("..data")).unwrap();
    for file in ["api.yaml", "tenant.yaml"] {
        symlink(format!("..data/{file}"), root.join(file)).unwrap();
    }
    let rules = root.display().to_string();
    let url = redis.url();
    let (mut process, grpc, admin) = start_binary_with_http(&[
        "--rules",
        &rules,
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "50",
    ]);
    let pid = process.0.id();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let shared = Arc::new(Shared {
        start: Instant::now(),
        phase: AtomicUsize::new(WARM_UP),
        stop: AtomicBool::new(false),
    });
    log(
        &shared,
        &format!(
            "sluice pid {pid} grpc {grpc} admin {admin}, redis {url}; \
             {concurrency} tasks over {CONNECTIONS} connections for {secs} s"
        ),
    );

    // RSS sampler.
    let samples: Arc<Mutex<Vec<(Duration, u64)>>> = Arc::default();
    let sampler = {
        let (shared, samples) = (shared.clone(), samples.clone());
        std::thread::spawn(move || {
            while !shared.stop.load(Ordering::Relaxed) {
                if let Some(kib) = rss_kib(pid) {
                    samples.lock().unwrap().push((shared.start.elapsed(), kib));
                }
                std::thread::sleep(RSS_EVERY);
            }
            if let Some(kib) = rss_kib(pid) {
                samples.lock().unwrap().push((shared.start.elapsed(), kib));
            }
        })
    };

    // Load.
    let clients: Vec<RateLimitServiceClient<Channel>> = rt.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..CONNECTIONS {
            let channel = Endpoint::from_shared(format!("http://{grpc}"))
                .unwrap()
                .connect()
                .await
                .expect("connect to sluice");
            clients.push(RateLimitServiceClient::new(channel));
        }
        clients
    });
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let client = clients[i as usize % CONNECTIONS].clone();
            rt.spawn(drive(i, client, shared.clone()))
        })
        .collect();

    // The scenario.
    let warm_up = duration / 10;
    sleep_until(&shared, warm_up);
    shared.enter(STEADY_1);
    sleep_until(&shared, duration / 3);
    let first = outage(&shared, &mut redis, DOWN_1, &rt, &clients[0]);
    sleep_until(&shared, duration / 2);
    let reloaded = reload(&shared, root, admin, &rt, &grpc);
    sleep_until(&shared, duration * 2 / 3);
    let second = outage(&shared, &mut redis, DOWN_2, &rt, &clients[0]);
    sleep_until(&shared, duration);
    shared.stop.store(true, Ordering::SeqCst);
    let elapsed = shared.start.elapsed();
    log(&shared, "stopping the load");

    let mut phases = vec![Stats::default(); PHASES.len()];
    for task in tasks {
        let stats = rt.block_on(task).expect("a client task panicked");
        for (total, part) in phases.iter_mut().zip(&stats) {
            total.merge(part);
        }
    }
    sampler.join().unwrap();
    let alive = matches!(process.0.try_wait(), Ok(None));
    let (_, metrics) = if alive {
        http(admin, "GET", "/metrics", "")
    } else {
        (0, String::new())
    };
    let dbsize = redis.command(&["DBSIZE"]);

    // ---------------------------------------------------------------- report
    let mut all = Stats::default();
    for phase in &phases {
        all.merge(phase);
    }
    let mut r = String::new();
    let _ = writeln!(r, "\n===== sluice soak report =====");
    let _ = writeln!(
        r,
        "ran {:.1} s (asked {secs} s), {concurrency} client tasks over {CONNECTIONS} \
         connections, --redis-timeout-ms 50, server alive at the end: {alive}",
        elapsed.as_secs_f64()
    );
    let _ = writeln!(
        r,
        "total {} requests ({:.0}/s): OK {}, OVER_LIMIT {}, errors {}",
        all.total(),
        all.total() as f64 / elapsed.as_secs_f64(),
        all.ok,
        all.over,
        all.error_count()
    );
    for (kind, (n, message)) in &all.errors {
        let _ = writeln!(r, "  error {kind}: {n} (e.g. {message:?})");
    }
    let _ = writeln!(
        r,
        "\nby phase (span, rate, verdicts, errors, latency of all answers):"
    );
    for (i, (name, s)) in PHASES.iter().zip(&phases).enumerate() {
        let span = match (s.first_ms, s.last_ms) {
            (Some(a), Some(b)) => format!("{:6.1}-{:6.1}s", a as f64 / 1e3, b as f64 / 1e3),
            _ => "     (empty)    ".into(),
        };
        let rate = match (s.first_ms, s.last_ms) {
            (Some(a), Some(b)) if b > a => s.total() as f64 * 1e3 / (b - a) as f64,
            _ => 0.0,
        };
        let errors: Vec<String> = s
            .errors
            .iter()
            .map(|(kind, (n, _))| format!("{kind}={n}"))
            .collect();
        let _ = writeln!(
            r,
            "  {name:<13} {span} {rate:8.0}/s  ok {:>9} over {:>9} errors {:>8} [{}]{}  {}",
            s.ok,
            s.over,
            s.error_count(),
            errors.join(" "),
            if errors_allowed(i) { " (allowed)" } else { "" },
            s.latency.summary()
        );
    }
    for (n, outage, down) in [(1, &first, DOWN_1), (2, &second, DOWN_2)] {
        let (d, rec) = (&phases[down], &phases[down + 1]);
        let _ = writeln!(r, "\nRedis outage {n}:");
        let _ = writeln!(
            r,
            "  killed at {:.1} s, restarted (PING) at {:.1} s",
            outage.stopped_ms as f64 / 1e3,
            outage.restarted_ms as f64 / 1e3
        );
        let _ = writeln!(
            r,
            "  while down: {} errors; {} OK/OVER answered without Redis (limitless \
             descriptors, the over-limit cache, calls done before the kill); error latency {}",
            d.error_count(),
            d.ok + d.over,
            d.error_latency.summary()
        );
        match outage.first_success_ms {
            Some(at) => {
                let _ = writeln!(
                    r,
                    "  first Redis-backed decision {} ms after the restart",
                    at - outage.restarted_ms
                );
                match rec.last_error_ms {
                    Some(last) => {
                        let _ = writeln!(
                            r,
                            "  after the restart: {} errors, the last {} ms after the restart \
                             ({:+} ms from the first Redis-backed decision); error latency {}",
                            rec.error_count(),
                            last.saturating_sub(outage.restarted_ms),
                            last as i64 - at as i64,
                            rec.error_latency.summary()
                        );
                    }
                    None => {
                        let _ = writeln!(r, "  after the restart: no errors");
                    }
                }
            }
            None => {
                let _ = writeln!(
                    r,
                    "  NO success within {RECOVERY_DEADLINE:?} of the restart"
                );
            }
        }
    }
    let _ = writeln!(r, "\nrules reload (ConfigMap ..data swap):");
    let _ = writeln!(
        r,
        "  swapped at {:.1} s; /rlconfig showed it after {:?}; decisions used it after {:?}",
        reloaded.swapped_ms as f64 / 1e3,
        reloaded.rlconfig_after,
        reloaded.decision_after
    );
    let samples = samples.lock().unwrap().clone();
    if let (Some(&(_, start)), Some(&(_, end))) = (samples.first(), samples.last()) {
        let max = samples.iter().map(|&(_, k)| k).max().unwrap_or(0);
        let warm = samples
            .iter()
            .find(|&&(t, _)| t >= warm_up)
            .map_or(start, |&(_, k)| k);
        let growth = end as i64 - warm as i64;
        let _ = writeln!(
            r,
            "\nsluice RSS ({} samples every {RSS_EVERY:?}):",
            samples.len()
        );
        let _ = writeln!(
            r,
            "  start {}, end of warm-up {}, max {}, end {}; growth after warm-up {:+.1} MiB \
             ({:+.1}%)",
            mib(start),
            mib(warm),
            mib(max),
            mib(end),
            growth as f64 / 1024.0,
            growth as f64 * 100.0 / warm.max(1) as f64
        );
        let every = (samples.len() / 12).max(1);
        let trace: Vec<String> = samples
            .iter()
            .step_by(every)
            .map(|&(t, k)| format!("{:.0}s:{:.1}", t.as_secs_f64(), k as f64 / 1024.0))
            .collect();
        let _ = writeln!(r, "  trace (s:MiB): {}", trace.join(" "));
    }
    let _ = writeln!(r, "\nserver metrics at the end:");
    for line in metrics.lines().filter(|l| {
        l.starts_with("sluice_store_errors_total")
            || l.starts_with("sluice_store_refund_failures_total")
            || l.starts_with("sluice_rules_reloads_total")
            || l.starts_with("sluice_requests_total")
            || l.starts_with("sluice_local_cache_hits")
    }) {
        let _ = writeln!(r, "  {line}");
    }
    let _ = writeln!(
        r,
        "Redis keys at the end (since the last restart): {}",
        dbsize.trim()
    );
    println!("{r}");

    // ------------------------------------------------------------ invariants
    assert!(alive, "the sluice process exited during the soak");
    for (n, outage) in [(1, &first), (2, &second)] {
        assert!(
            outage.first_success_ms.is_some(),
            "no request succeeded within {RECOVERY_DEADLINE:?} of Redis restart {n}"
        );
    }
    assert!(
        reloaded.rlconfig_after.is_some(),
        "/rlconfig did not show the reloaded rules within {RELOAD_DEADLINE:?}"
    );
    assert!(
        reloaded.decision_after.is_some(),
        "decisions did not use the reloaded rules within {RELOAD_DEADLINE:?}"
    );
    let unexpected: Vec<&String> = all.errors.keys().filter(|k| *k != "Unavailable").collect();
    assert!(
        unexpected.is_empty(),
        "errors other than UNAVAILABLE: {unexpected:?} ({:?})",
        all.errors
    );
    let outside: Vec<String> = phases
        .iter()
        .enumerate()
        .filter(|(i, s)| !errors_allowed(*i) && s.error_count() > 0)
        .map(|(i, s)| format!("{}: {:?}", PHASES[i], s.errors))
        .collect();
    assert!(
        outside.is_empty(),
        "errors outside the Redis outages (and {GRACE:?} after recovery): {outside:?}"
    );
    drop(process);
}
