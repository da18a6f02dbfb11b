//! The composition root: builds the whole service from [`Settings`] (where
//! the rules come from, the counter store, upstream's stats sinks, the
//! limiter, reloads from files or xDS) and serves it on listeners the caller
//! bound, until `shutdown` is cancelled. `main.rs` only parses the command
//! line, sets up telemetry, binds and turns signals into `shutdown`; tests
//! start the very same service in-process with [`run`].

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::decision::Limiter;
use crate::limiter::SystemClock;
use crate::reload::Reload;
use crate::rules::{ConfigError, RuleSet, RulesSource};
use crate::server::{self, Listeners, ServeError};
use crate::settings::Settings;
use crate::store::{CounterStore, MemoryStore, RedisStore, StoreError};
use crate::telemetry::upstream::UpstreamStats;
use crate::xds::{XdsConfig, XdsError};

pub mod build;

/// How often the memory store drops counters that have expired.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// How often every replica asks the store whether the run-time overrides
/// changed (one cheap read; they are loaded only on a change): a write on
/// any replica is in force everywhere within this, well inside a second.
const OVERRIDES_POLL: Duration = Duration::from_millis(500);

/// How long start-up waits for Redis before serving anyway (requests then
/// fail UNAVAILABLE until Redis answers).
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// File descriptors kept for everything but client connections: the
/// listening sockets, Redis, the rules watcher, logs, the runtime.
const RESERVED_FILES: u64 = 64;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The rules files have errors (each one is logged).
    #[error("the rules have {} error(s); not starting", .0.len())]
    Rules(Vec<ConfigError>),
    /// The Redis store could not be set up.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Upstream's stats sinks could not start.
    #[error("starting the upstream stats sink: {0}")]
    UpstreamStats(#[from] crate::telemetry::upstream::statsd::StartError),
    /// The rules files cannot be watched.
    #[error("watching the rules for changes: {0}")]
    Watch(std::io::Error),
    /// The xDS client cannot start.
    #[error("starting the xDS client: {0}")]
    Xds(#[from] XdsError),
    /// The listeners could not serve.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// A listening socket has no address.
    #[error("the listening sockets: {0}")]
    Listeners(#[from] std::io::Error),
}

/// Where rules come from.
#[derive(Debug)]
enum RulesFrom {
    /// Files (or the built-in examples), watched for changes.
    Files(RulesSource),
    /// An xDS management server.
    Xds(Box<XdsConfig>),
}

impl RulesFrom {
    fn of(settings: &Settings) -> Self {
        match (build::xds(settings), &settings.rules) {
            (Some(xds), _) => RulesFrom::Xds(Box::new(xds)),
            (None, Some(path)) => RulesFrom::Files(RulesSource::Paths(vec![path.clone()])),
            (None, None) => RulesFrom::Files(RulesSource::Builtin),
        }
    }

    /// The rules to start with: the files' (every error logged), or none
    /// until the management server sends a snapshot.
    fn initial(&self) -> Result<RuleSet, StartError> {
        match self {
            RulesFrom::Xds(_) => Ok(RuleSet::default()),
            RulesFrom::Files(files) => files.load().map_err(|errors| {
                for e in &errors {
                    tracing::error!("{e}");
                }
                StartError::Rules(errors)
            }),
        }
    }
}

/// Builds the service `settings` describe and serves it on `listeners`
/// until `shutdown` is cancelled, then closes the store.
///
/// # Errors
///
/// Bad rules files, a bad Redis URL, sinks or listeners that cannot start:
/// each before anything is served.
pub async fn run(
    settings: &Settings,
    mut listeners: Listeners,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let source = RulesFrom::of(settings);
    let rules = source.initial()?;
    if let Some(tls) = build::grpc_tls(settings) {
        listeners = listeners.with_grpc_tls(tls);
    }
    let (grpc, http) = (listeners.grpc_addr()?, listeners.http_addr()?);
    let started = |store: &str| {
        tracing::info!(
            %grpc,
            %http,
            rules = ?source,
            domains = rules.domains().count(),
            store,
            "sluice listening"
        );
    };
    match build::redis(settings) {
        Some(redis) => {
            let store =
                RedisStore::connect(&redis, Arc::new(SystemClock), REDIS_CONNECT_TIMEOUT).await?;
            started(&format!("redis {}", redis.url));
            // Each Redis node has its own breaker inside the store (one per
            // Cluster primary), so no breaker wraps the whole store.
            let count_refund_failures = |limiter: &Arc<Limiter<RedisStore>>| {
                let failures = limiter.metrics().store_refund_failures();
                limiter.store().count_refund_failures_in(failures);
                limiter
                    .store()
                    .count_reconciliations_in(limiter.metrics().reconcile_counters());
            };
            let limiter = serve(
                store,
                rules,
                &source,
                settings,
                listeners,
                shutdown,
                count_refund_failures,
            )
            .await?;
            limiter.store().quit();
        }
        None => {
            let store = MemoryStore::new(&build::memory_store(settings), Arc::new(SystemClock));
            started("memory");
            let sweeper_stop = shutdown.clone();
            let sweeper = move |limiter: &Arc<Limiter<MemoryStore>>| {
                limiter.store().show_in(limiter.metrics().memory_store());
                tokio::spawn(sweep(limiter.clone(), sweeper_stop));
            };
            serve(
                store, rules, &source, settings, listeners, shutdown, sweeper,
            )
            .await?;
        }
    }
    tracing::info!("sluice stopped");
    Ok(())
}

/// Puts `rules` in front of `store` and serves until shutdown: upstream
/// stats, the limiter, reloads from files or xDS, `started` (store-specific
/// tasks), then the listeners. Returns the limiter so that the caller can
/// close its store.
async fn serve<S: CounterStore>(
    store: S,
    rules: RuleSet,
    source: &RulesFrom,
    settings: &Settings,
    mut listeners: Listeners,
    shutdown: CancellationToken,
    started: impl FnOnce(&Arc<Limiter<S>>),
) -> Result<Arc<Limiter<S>>, StartError> {
    // Upstream-named stats: kept alive (and their sinks running) while the
    // service serves.
    let upstream = match build::upstream_stats(settings) {
        Some(config) => Some(UpstreamStats::start(config).await?),
        None => None,
    };
    let limiter = Arc::new(
        Limiter::with_options(rules, store, build::limiter_options(settings))
            .with_upstream_stats(upstream.as_ref().map(|running| running.stats.clone())),
    );
    limiter.metrics().record_rules_loaded(unix_now());
    // The overrides kept in the store (across restarts, in Redis) are in
    // force before the first request is served.
    if let Err(error) = limiter.refresh_overrides().await {
        tracing::warn!(%error, "run-time overrides not loaded yet; retrying in the background");
    }
    tokio::spawn(poll_overrides(limiter.clone(), shutdown.clone()));
    // Kept while serving: the handle is what the gate and readiness read.
    let _xds = match source {
        RulesFrom::Files(files) => {
            crate::reload::watch(files.clone(), reload_sink(&limiter), shutdown.clone())
                .map_err(StartError::Watch)?;
            None
        }
        RulesFrom::Xds(config) => {
            let mut handle =
                crate::xds::spawn((**config).clone(), reload_sink(&limiter), shutdown.clone())?;
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
    let mut options = build::serve_options(settings);
    if let Some(limit) = open_files_limit() {
        fit_connections(&mut options, limit, settings.redis_pool_size.get());
    }
    server::run_with(
        limiter.clone(),
        options,
        build::serve_extras(settings),
        listeners,
        shutdown,
    )
    .await?;
    drop(upstream);
    Ok(limiter)
}

/// What a reload (from files or xDS) does: a good set replaces the rules in
/// force, a bad one is logged and counted and changes nothing.
fn reload_sink<S: CounterStore>(limiter: &Arc<Limiter<S>>) -> impl FnMut(Reload) + Send + 'static {
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
/// not fit in `limit` open files (beside the debug port's, when it is on):
/// past the limit every accept fails, and a flood of connections on one
/// port would also starve the other (the kubelet's probes included). A cap
/// refuses clearly; EMFILE does not.
fn fit_connections(options: &mut server::ServeOptions, limit: u64, redis_pool: usize) {
    let debug = options
        .debug_addr
        .map_or(0, |_| u64::from(server::DEBUG_MAX_CONNECTIONS));
    let available = limit.saturating_sub(RESERVED_FILES + redis_pool as u64 + debug);
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

/// Reloads the run-time overrides whenever the store's version of them
/// changes, every [`OVERRIDES_POLL`] until shutdown. A failure keeps the
/// overrides in force and is logged once until the store answers again.
async fn poll_overrides<S: CounterStore>(limiter: Arc<Limiter<S>>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(OVERRIDES_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => break,
        }
        match limiter.refresh_overrides().await {
            Ok(changed) => {
                if changed {
                    tracing::debug!("run-time overrides reloaded");
                }
                failing = false;
            }
            Err(error) if !failing => {
                tracing::warn!(%error, "run-time overrides could not be reloaded; keeping those in force");
                failing = true;
            }
            Err(_) => {}
        }
    }
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
