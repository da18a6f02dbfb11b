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
use sluice::rules::RulesSource;
use sluice::server::{self, Listeners};
use sluice::settings::Settings;
use sluice::store::{MemoryStore, MemoryStoreConfig, RedisStore};
use tokio_util::sync::CancellationToken;

/// How often the memory store drops counters that have expired.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// How long start-up waits for Redis before serving anyway (requests then
/// fail UNAVAILABLE until Redis answers).
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::CheckConfig(args) => Ok(check_config(&args)),
        Command::Query(args) => query(&args),
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
    sluice::telemetry::init_logging(settings.log_format, &settings.log_level);
    let source = match &settings.rules {
        Some(path) => RulesSource::Paths(vec![path.clone()]),
        None => RulesSource::Builtin,
    };
    let rules = source.load().map_err(|errors| {
        for e in &errors {
            tracing::error!("{e}");
        }
        anyhow::anyhow!("the rules have {} error(s); not starting", errors.len())
    })?;
    let domains = rules.domains().count();

    runtime()?.block_on(async {
        let listeners = Listeners::bind(settings.grpc_addr, settings.http_addr)
            .await
            .with_context(|| {
                format!("binding {} and {}", settings.grpc_addr, settings.http_addr)
            })?;
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
                let limiter = Arc::new(Limiter::new(rules, store, settings.bounds()));
                server::run(
                    limiter.clone(),
                    settings.serve_options(),
                    listeners,
                    shutdown,
                )
                .await?;
                limiter.store().quit().await;
            }
            None => {
                let store = MemoryStore::new(
                    &MemoryStoreConfig {
                        max_keys: settings.memory_max_keys,
                        ..Default::default()
                    },
                    Arc::new(SystemClock),
                );
                started("memory")?;
                let limiter = Arc::new(Limiter::new(rules, store, settings.bounds()));
                tokio::spawn(sweep(limiter.clone(), shutdown.clone()));
                server::run(limiter, settings.serve_options(), listeners, shutdown).await?;
            }
        }
        tracing::info!("sluice stopped");
        Ok(ExitCode::SUCCESS)
    })
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
