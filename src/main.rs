//! The `sluice` binary: parse the command line, then settings → telemetry →
//! listeners → [`sluice::app::run`] (which builds and serves the service),
//! or one of the tool commands.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use sluice::cli::{CheckConfigArgs, Cli, Command, ServeArgs};
use sluice::rules::RulesSource;
use sluice::server::Listeners;
use sluice::settings::{Loaded, Settings};
use tokio_util::sync::CancellationToken;

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
        eprintln!("sluice: {}", one_line(&e));
        ExitCode::from(2)
    })
}

/// `error` and its causes as one line, `a: b: c`, leaving out a cause whose
/// text is already there: many errors print their source in their own
/// message and also return it as `source()`, which `{:#}` would repeat.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let Loaded { settings, warnings } = Settings::load(args.config.as_deref(), &args.flags)?;
    // The OTLP exporter runs on the runtime: set telemetry up inside it, and
    // shut it down (flushing spans) before the runtime ends.
    let runtime = runtime()?;
    let telemetry = {
        let _inside = runtime.enter();
        sluice::telemetry::init(
            settings.log_format,
            &settings.log_level,
            sluice::app::build::otlp(&settings).as_ref(),
        )?
    };
    // Logging is set up by now: name the upstream variables not honoured.
    for line in &warnings {
        tracing::warn!("{line}");
    }
    let served = runtime.block_on(async {
        let listeners = Listeners::bind(settings.grpc_addr, settings.http_addr)
            .await
            .with_context(|| {
                format!("binding {} and {}", settings.grpc_addr, settings.http_addr)
            })?;
        let shutdown = CancellationToken::new();
        stop_on_signal(shutdown.clone())?;
        sluice::app::run(&settings, listeners, shutdown).await?;
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
