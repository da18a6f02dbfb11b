//! The `sluice` binary: parse the command line, then settings → logging →
//! rules → store → server, or one of the tool commands.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;
use sluice::cli::{CheckConfigArgs, Cli, Command, ServeArgs};
use sluice::decision::Limiter;
use sluice::limiter::SystemClock;
use sluice::rules::{RuleSet, RulesSource};
use sluice::server::{self, Listeners};
use sluice::settings::Settings;
use sluice::store::{CounterStore, MemoryStore, RedisStore};
use sluice::telemetry::upstream::UpstreamStats;
use tokio_util::sync::CancellationToken;

/// How often the memory store drops counters that have expired.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// How long start-up waits for Redis before serving anyway (requests then
/// fail UNAVAILABLE until Redis answers).
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// mimalloc: a decision allocates and frees many small buffers (HTTP/2
/// frames, protobuf messages) across threads, where glibc's allocator spent
/// about a tenth of the service's CPU in profiles.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse_from(sluice::cli::args());
    let result = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::CheckConfig(args) => Ok(check_config(&args)),
        Command::Query(args) => query(&args),
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench(&args),
        #[cfg(not(feature = "bench"))]
        Command::Bench(args) => Err(anyhow::anyhow!(args.error())),
    };
    result.unwrap_or_else(|e| {
        eprintln!("sluice: {e:#}");
        ExitCode::from(2)
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(args.config.as_deref(), &args.flags)?;
    // The OTLP exporter runs on the runtime: set telemetry up inside it, and
    // shut it down (flushing spans) before the runtime ends.
    let runtime = runtime()?;
    let telemetry = {
        let _inside = runtime.enter();
        sluice::telemetry::init(
            settings.log_format,
            &settings.log_level,
            settings.otlp_endpoint.as_deref(),
            &settings.service_name,
        )?
    };
    let source = match (settings.xds(), &settings.rules) {
        (Some(xds), _) => RulesFrom::Xds(Box::new(xds)),
        (None, Some(path)) => RulesFrom::Files(RulesSource::Paths(vec![path.clone()])),
        (None, None) => RulesFrom::Files(RulesSource::Builtin),
    };
    let rules = match &source {
        // Nothing until the management server sends a snapshot.
        RulesFrom::Xds(_) => RuleSet::default(),
        RulesFrom::Files(files) => files.load().map_err(|errors| {
            for e in &errors {
                tracing::error!("{e}");
            }
            anyhow::anyhow!("the rules have {} error(s); not starting", errors.len())
        })?,
    };
    let domains = rules.domains().count();

    let served = runtime.block_on(async {
        let mut listeners = Listeners::bind(settings.grpc_addr, settings.http_addr)
            .await
            .with_context(|| {
                format!("binding {} and {}", settings.grpc_addr, settings.http_addr)
            })?;
        if let Some(tls) = settings.grpc_tls() {
            listeners = listeners.with_grpc_tls(tls);
        }
        let shutdown = CancellationToken::new();
        stop_on_signal(shutdown.clone())?;
        let started = |store: &str| -> anyhow::Result<()> {
            tracing::info!(
                grpc = %listeners.grpc_addr()?,
                http = %listeners.http_addr()?,
                rules = ?source,
                domains,
                store,
                "sluice listening"
            );
            Ok(())
        };
        match settings.redis() {
            Some(redis) => {
                let store =
                    RedisStore::connect(&redis, Arc::new(SystemClock), REDIS_CONNECT_TIMEOUT)
                        .await?;
                started(&format!("redis {}", redis.url))?;
                // Each Redis node has its own breaker inside the store (one
                // per Cluster primary), so no breaker wraps the whole store.
                let limiter = serve_with(
                    store,
                    rules,
                    &source,
                    &settings,
                    listeners,
                    shutdown,
                    |_| {},
                )
                .await?;
                limiter.store().quit().await;
            }
            None => {
                let store = MemoryStore::new(&settings.memory_store(), Arc::new(SystemClock));
                started("memory")?;
                let sweeper_stop = shutdown.clone();
                let sweeper = move |limiter: &Arc<Limiter<MemoryStore>>| {
                    tokio::spawn(sweep(limiter.clone(), sweeper_stop));
                };
                serve_with(
                    store, rules, &source, &settings, listeners, shutdown, sweeper,
                )
                .await?;
            }
        }
        tracing::info!("sluice stopped");
        Ok(ExitCode::SUCCESS)
    });
    {
        let _inside = runtime.enter();
        if let Err(e) = telemetry.shutdown() {
            eprintln!("sluice: flushing traces: {e}");
        }
    }
    served
}

/// Puts `rules` in front of `store` and serves until shutdown: metrics,
/// hot reload, `started` (store-specific tasks), then the listeners. Returns
/// the limiter so the caller can close its store.
#[allow(clippy::too_many_arguments)]
async fn serve_with<S: CounterStore>(
    store: S,
    rules: RuleSet,
    source: &RulesFrom,
    settings: &Settings,
    mut listeners: Listeners,
    shutdown: CancellationToken,
    started: impl FnOnce(&Arc<Limiter<S>>),
) -> anyhow::Result<Arc<Limiter<S>>> {
    // Upstream-named stats: kept alive (and their sinks running) while
    // the service serves.
    let upstream = match settings.upstream_stats() {
        Some(config) => Some(
            UpstreamStats::start(config)
                .await
                .context("starting the upstream stats sink")?,
        ),
        None => None,
    };
    let limiter = Arc::new(
        Limiter::with_options(rules, store, settings.limiter_options())
            .with_upstream_stats(upstream.as_ref().map(|running| running.stats.clone())),
    );
    limiter.metrics().record_rules_loaded(unix_now());
    // Kept while serving: dropping it does not stop the client, but the
    // handle is what the gate and readiness read.
    let _xds = match source {
        RulesFrom::Files(files) => {
            watch_rules(files, &limiter, &shutdown)?;
            None
        }
        RulesFrom::Xds(config) => {
            let mut handle =
                sluice::xds::spawn((**config).clone(), reload_sink(&limiter), shutdown.clone())
                    .context("starting the xDS client")?;
            if config.force_start_without_initial_config {
                listeners = listeners.with_rules_gate(handle.loaded());
            } else {
                // Upstream's start: block until the first snapshot.
                tracing::info!(server = %config.xds_server, "waiting for the first rules from xDS");
                tokio::select! {
                    () = handle.first_config() => {}
                    () = shutdown.cancelled() => return Ok(limiter),
                }
            }
            Some(handle)
        }
    };
    started(&limiter);
    let mut options = settings.serve_options();
    if let Some(limit) = open_files_limit() {
        fit_connections(&mut options, limit, settings.redis_pool_size);
    }
    server::run_with(
        limiter.clone(),
        options,
        settings.serve_extras(),
        listeners,
        shutdown,
    )
    .await?;
    drop(upstream);
    Ok(limiter)
}

/// Reloads the rules on file changes and SIGHUP: a good set replaces the
/// rules in force, a bad one is logged and counted and changes nothing.
fn watch_rules<S: CounterStore>(
    source: &RulesSource,
    limiter: &Arc<Limiter<S>>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    sluice::reload::watch(source.clone(), reload_sink(limiter), shutdown.clone())
        .context("watching the rules for changes")?;
    Ok(())
}

/// Where rules come from.
#[derive(Debug)]
enum RulesFrom {
    /// Files (or the built-in examples), watched for changes.
    Files(RulesSource),
    /// An xDS management server.
    Xds(Box<sluice::xds::XdsConfig>),
}

/// What a reload (from files or xDS) does: a good set replaces the rules in
/// force, a bad one is logged and counted and changes nothing.
fn reload_sink<S: CounterStore>(
    limiter: &Arc<Limiter<S>>,
) -> impl FnMut(sluice::reload::Reload) + Send + 'static {
    let limiter = Arc::clone(limiter);
    move |reload| match reload.result {
        Ok(rules) => {
            limiter.replace_rules(rules);
            limiter.metrics().record_reload(true, unix_now());
        }
        Err(_) => {
            limiter.metrics().record_reload(false, unix_now());
            limiter.rules_refused();
        }
    }
}

/// File descriptors kept for everything but client connections: the
/// listening sockets, Redis, the rules watcher, logs, the runtime.
const RESERVED_FILES: u64 = 64;

/// The soft limit on open files (`ulimit -n`), from `/proc/self/limits`.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Lowers both connection caps, in proportion, when together they would
/// not fit in `limit` open files: past the limit every accept fails, and a
/// flood of connections on one port would also starve the other (the
/// kubelet's probes included). A cap refuses clearly; EMFILE does not.
fn fit_connections(options: &mut server::ServeOptions, limit: u64, redis_pool: usize) {
    let available = limit.saturating_sub(RESERVED_FILES + redis_pool as u64);
    let grpc = u64::from(options.grpc_connections.max_connections);
    let http = u64::from(options.http_connections.max_connections);
    if grpc + http <= available {
        return;
    }
    let share = |cap: u64| u32::try_from((cap * available / (grpc + http)).max(1)).unwrap_or(1);
    let (fitted_grpc, fitted_http) = (share(grpc), share(http));
    tracing::warn!(
        open_files_limit = limit,
        grpc_max_connections = fitted_grpc,
        http_max_connections = fitted_http,
        "the connection limits do not fit the open-file limit; lowered them (raise ulimit -n to keep them)"
    );
    options.grpc_connections.max_connections = fitted_grpc;
    options.http_connections.max_connections = fitted_http;
}

/// Seconds since the Unix epoch, for the rules-loaded metric.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Drops expired counters from the memory store every [`SWEEP_INTERVAL`].
async fn sweep(limiter: Arc<Limiter<MemoryStore>>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        tokio::select! {
            _ = tick.tick() => limiter.store().sweep_now(),
            () = shutdown.cancelled() => break,
        }
    }
}

/// Cancels `shutdown` on SIGTERM or SIGINT. The handlers are installed
/// before this returns, so a signal sent as soon as the service says it is
/// listening is never lost to the default action.
fn stop_on_signal(shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutting down");
        shutdown.cancel();
    });
    Ok(())
}

fn check_config(args: &CheckConfigArgs) -> ExitCode {
    match RulesSource::Paths(args.paths.clone()).load() {
        Ok(rules) => {
            for domain in rules.domains() {
                println!(
                    "ok: domain '{}' ({} rules) from {}",
                    domain.name(),
                    domain.rules().len(),
                    domain.source()
                );
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors {
                eprintln!("{e}");
            }
            eprintln!("{} error(s)", errors.len());
            ExitCode::FAILURE
        }
    }
}

fn query(args: &sluice::query::QueryArgs) -> anyhow::Result<ExitCode> {
    let response = runtime()?.block_on(sluice::query::query(args))?;
    print!("{}", sluice::query::render(args, &response));
    let over = response.overall_code == sluice::proto::rate_limit_response::Code::OverLimit as i32;
    Ok(if over {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(feature = "bench")]
fn bench(args: &sluice::bench::BenchArgs) -> anyhow::Result<ExitCode> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.threads {
        runtime.worker_threads(threads as usize);
    }
    let runtime = runtime
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(sluice::bench::run(args, !args.json))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    // A run that got no decision at all measured nothing: say so to scripts.
    Ok(if report.decisions == 0 {
        eprintln!("sluice bench: no request got a decision");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_caps_shrink_to_fit_the_open_file_limit() {
        let mut options = server::ServeOptions::default();
        fit_connections(&mut options, 256, 4);
        let (grpc, http) = (
            options.grpc_connections.max_connections,
            options.http_connections.max_connections,
        );
        assert!(u64::from(grpc + http) <= 256 - RESERVED_FILES - 4);
        assert!(grpc > http && http >= 1, "{grpc} {http}");

        let mut roomy = server::ServeOptions::default();
        fit_connections(&mut roomy, 1 << 20, 4);
        assert_eq!(roomy.grpc_connections.max_connections, 10_000);
    }
}
