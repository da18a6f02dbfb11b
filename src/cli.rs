//! The command line of the `sluice` binary.

use std::path::PathBuf;

use clap::builder::PossibleValue;
use clap::{Parser, Subcommand};

#[cfg(feature = "bench")]
use crate::bench::BenchArgs;
use crate::decision::StoreErrorPolicy;
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

/// The process's arguments, to parse. Invoked as `ratelimit` (the
/// envoyproxy/ratelimit image's `/bin/ratelimit`), the binary serves with
/// upstream's environment variables: `ratelimit [FLAGS]` is `sluice serve
/// --settings-from envoy-ratelimit [FLAGS]`. Given a subcommand
/// (`ratelimit serve …`, `ratelimit check-config …`), it is Sluice's own
/// command line, as under any other name.
pub fn args() -> Vec<std::ffi::OsString> {
    rewrite_args(std::env::args_os().collect())
}

/// As [`args`], from `args` (argv[0] first).
pub fn rewrite_args(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let as_upstream = args
        .first()
        .and_then(|argv0| std::path::Path::new(argv0).file_name())
        .is_some_and(|name| name == "ratelimit");
    let subcommand = args
        .get(1)
        .is_some_and(|arg| !arg.to_string_lossy().starts_with('-'));
    if as_upstream && !subcommand {
        args.splice(
            1..1,
            ["serve", "--settings-from", "envoy-ratelimit"].map(Into::into),
        );
    }
    args
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
    #[cfg(feature = "bench")]
    Bench(Box<BenchArgs>),
    /// The load generator, absent from this build (built without the `bench` feature).
    #[cfg(not(feature = "bench"))]
    Bench(BenchUnavailable),
}

/// `sluice bench` in a binary built without the load generator: whatever
/// its arguments, the command says so instead of clap's "unrecognized
/// subcommand".
#[cfg(not(feature = "bench"))]
#[derive(Debug, clap::Args)]
pub struct BenchUnavailable {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    _args: Vec<String>,
}

#[cfg(not(feature = "bench"))]
impl BenchUnavailable {
    /// Why `sluice bench` cannot run here, and how to get a binary that can.
    pub fn error(&self) -> String {
        "this sluice binary was built without the `bench` feature (the load generator); \
         build one with it: cargo build --release (the default features include it)"
            .to_owned()
    }
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

/// `--on-store-error`'s values: the policy is the decision's, its spelling
/// and help on the command line are the CLI's.
impl clap::ValueEnum for StoreErrorPolicy {
    fn value_variants<'a>() -> &'a [Self] {
        &StoreErrorPolicy::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            StoreErrorPolicy::Unavailable => {
                "gRPC UNAVAILABLE, so Envoy's `failure_mode_deny` decides"
            }
            StoreErrorPolicy::Allow => "Admit: every descriptor OK, without a limit",
            StoreErrorPolicy::Deny => "Reject: every limited descriptor OVER_LIMIT",
        };
        Some(PossibleValue::new(self.name()).help(help))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::upstream::SettingsFrom;

    fn settings_from(args: &[&str]) -> Option<SettingsFrom> {
        let cli = Cli::parse_from(rewrite_args(args.iter().map(Into::into).collect()));
        match cli.command {
            Command::Serve(args) => args.flags.settings_from,
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn invoked_as_ratelimit_it_serves_with_upstreams_settings() {
        assert_eq!(
            settings_from(&["/bin/ratelimit"]),
            Some(SettingsFrom::EnvoyRatelimit)
        );
        assert_eq!(
            settings_from(&["ratelimit", "--shadow-mode", "true"]),
            Some(SettingsFrom::EnvoyRatelimit)
        );
        assert_eq!(settings_from(&["/bin/sluice", "serve"]), None);
        // A subcommand given explicitly is Sluice's command line.
        assert_eq!(settings_from(&["/bin/ratelimit", "serve"]), None);
        assert_eq!(
            settings_from(&["sluice", "serve", "--settings-from", "envoy-ratelimit"]),
            Some(SettingsFrom::EnvoyRatelimit)
        );
    }
}
