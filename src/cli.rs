//! The command line of the `sluice` binary.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::bench::BenchArgs;
use crate::query::QueryArgs;
use crate::settings::SettingsFlags;

/// Sluice: a global rate-limit decision service (Envoy RLS v3).
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about, propagate_version = true)]
pub struct Cli {
    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service (in memory, with the example rules, when given no options).
    Serve(Box<ServeArgs>),
    /// Validate rules files or directories; print every error and exit non-zero if any.
    CheckConfig(CheckConfigArgs),
    /// Send one ShouldRateLimit request and print the decision.
    Query(QueryArgs),
    /// Load-test any RLS server: decisions/s, latency percentiles, Redis cost per decision.
    Bench(Box<BenchArgs>),
}

/// `sluice serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Settings file (TOML or YAML); environment variables SLUICE_* and flags override it
    #[arg(long, value_name = "PATH", env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Settings given as flags.
    #[command(flatten)]
    pub flags: SettingsFlags,
}

/// `sluice check-config`.
#[derive(Debug, clap::Args)]
pub struct CheckConfigArgs {
    /// Rules files or directories to validate
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}
