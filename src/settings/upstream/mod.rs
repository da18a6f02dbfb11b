//! envoyproxy/ratelimit's environment variables, with upstream's meanings
//! and defaults, as one more layer of the declared settings.
//!
//! Used when the binary runs as `ratelimit` or with `sluice serve
//! --settings-from envoy-ratelimit`. [`layer`] turns upstream's variables
//! into values of the settings declared in `settings!` (as strings, which
//! the same serde path then parses); nothing here is a second settings
//! struct. Each variable is declared once: in [`VARIABLES`] when it gives
//! one setting its value alone (`table.rs`), in [`COMBINED`] when it only
//! means something with others (`combined.rs`); `read.rs` reads them as
//! upstream does. Upstream variables Sluice does not honour are listed in
//! [`super::unsupported`], which makes the warning logged once at start.

use config::{Map, Value, ValueKind};

mod combined;
mod read;
mod table;

pub use combined::{COMBINED, Combined};
use read::Reader;
pub use read::{LOCAL_CACHE_BYTES_PER_ENTRY, go_duration_ms};
pub use table::{Read, VARIABLES, Variable};

/// Where `sluice serve` takes its settings from besides its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SettingsFrom {
    /// Only Sluice's own (`SLUICE_…`, the settings file, flags).
    Sluice,
    /// Also envoyproxy/ratelimit's environment variables, with its defaults.
    EnvoyRatelimit,
}

/// A bad value of an upstream variable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid {var}={value:?}: {why}")]
pub struct UpstreamError {
    /// The variable.
    pub var: String,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub why: String,
}

/// A `config` source holding the values upstream's variables give the
/// declared settings.
#[derive(Clone, Debug)]
pub struct Layer(Map<String, String>);

impl config::Source for Layer {
    fn clone_into_box(&self) -> Box<dyn config::Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<Map<String, Value>, config::ConfigError> {
        Ok(self
            .0
            .iter()
            .map(|(k, v)| {
                let origin = format!("envoyproxy/ratelimit variables ({k})");
                (
                    k.clone(),
                    Value::new(Some(&origin), ValueKind::String(v.clone())),
                )
            })
            .collect())
    }
}

impl Layer {
    /// The value given to `setting`, if any (tests).
    pub fn get(&self, setting: &str) -> Option<&str> {
        self.0.get(setting).map(String::as_str)
    }
}

/// The values upstream's variables in `env` give the declared settings,
/// with upstream's defaults for those it does not set.
pub fn layer(env: &Map<String, String>) -> Result<Layer, UpstreamError> {
    let r = &Reader {
        env,
        #[cfg(test)]
        read: Default::default(),
    };
    let mut out = Map::new();
    for v in VARIABLES {
        if let Some(value) = v.value(r)? {
            out.insert(v.feeds.name().to_owned(), value);
        }
    }
    for c in COMBINED {
        if let Some(value) = (c.read)(r)? {
            out.insert(c.feeds.name().to_owned(), value);
        }
    }
    Ok(Layer(out))
}

/// Upstream's variables that feed `setting`, in the docs' order.
pub fn feeding(setting: &str) -> Vec<&'static str> {
    let single = VARIABLES
        .iter()
        .filter(|v| v.feeds.name() == setting)
        .map(|v| v.name);
    let combined = COMBINED
        .iter()
        .filter(|c| c.feeds.name() == setting)
        .flat_map(|c| c.vars.iter().copied());
    single.chain(combined).collect()
}

/// Upstream's variables from the process environment (those that are
/// valid UTF-8).
pub fn process_env() -> Map<String, String> {
    std::env::vars().collect()
}

#[cfg(test)]
mod tests;
