//! Loading the settings: the sources merged in order of precedence
//! (upstream's variables, the settings file, `SLUICE_…` variables, flags),
//! then what a value of the right type can still get wrong. Every error
//! names the one place to change, with its value ([`Origin`]).

use std::path::Path;

use config::Source as _;

use super::origin::{self, Origin};
use super::{DECLARED, Secret, Settings, SettingsFlags, unsupported, upstream};

/// Why settings could not be read. Each names the one place to change —
/// the flag, the `SLUICE_…` variable, the settings-file key or upstream's
/// variable — with the value found there, and is one line: no error here
/// has a `source` that would repeat it.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The settings file is missing or is not TOML or YAML.
    #[error("settings file: {0}")]
    File(config::ConfigError),
    /// The settings file names a setting that does not exist (a typo would
    /// otherwise silently leave the default in force).
    #[error("{file}: unknown setting '{key}' (known: {known})")]
    UnknownKey {
        /// The settings file.
        file: String,
        /// The unknown key.
        key: String,
        /// Every valid key.
        known: String,
    },
    /// A value is malformed, of the wrong type, or beyond what the service
    /// can honour.
    #[error("invalid {origin}: {why}")]
    Invalid {
        /// The setting.
        setting: String,
        /// Where its value came from, with the value.
        origin: Origin,
        /// What is wrong with it.
        why: String,
    },
    /// Settings that could not be told apart (`config` named no key).
    #[error("invalid settings: {0}")]
    Unattributed(String),
    /// An envoyproxy/ratelimit variable has a bad value.
    #[error(transparent)]
    Upstream(#[from] upstream::UpstreamError),
    /// Settings Sluice declares but cannot honour, alone or together.
    #[error("invalid settings: {what} is not supported; {instead}")]
    Unsupported {
        /// The settings set, with where each came from.
        what: String,
        /// What to do instead.
        instead: &'static str,
    },
}

/// The keys of the settings file, failing on one that is not a setting.
fn file_keys(file: &Path) -> Result<config::Map<String, config::Value>, SettingsError> {
    let found = config::File::from(file)
        .required(true)
        .collect()
        .map_err(SettingsError::File)?;
    let known: Vec<&str> = DECLARED.iter().map(|d| d.name).collect();
    let mut keys: Vec<&String> = found.keys().collect();
    keys.sort();
    match keys.into_iter().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(SettingsError::UnknownKey {
            file: file.display().to_string(),
            key: key.clone(),
            known: known.join(", "),
        }),
        None => Ok(found),
    }
}

/// The values `name`'s flag accepts, when it takes one of a fixed set
/// (enums, booleans); empty otherwise.
pub fn accepted_values(name: &str) -> Vec<String> {
    use clap::Args as _;
    let command = SettingsFlags::augment_args(clap::Command::new("sluice"));
    let from_flag: Vec<String> = command
        .get_arguments()
        .find(|a| a.get_id() == name)
        .map(|a| {
            a.get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_owned())
                .collect()
        })
        .unwrap_or_default();
    if !from_flag.is_empty() {
        return from_flag;
    }
    // An enum whose flag parses through `FromStr` (types below `settings`
    // that do not depend on clap): serde lists its variants when given none
    // of them.
    let probe = serde_json::json!({ name: "\u{1}" });
    match serde_json::from_value::<Settings>(probe) {
        Err(e) if e.to_string().starts_with("unknown variant") => e
            .to_string()
            .split_once("expected ")
            .map(|(_, list)| {
                list.split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Settings as loaded, with what the caller should log once logging is set
/// up (loading comes first, so it cannot log itself).
#[derive(Debug)]
pub struct Loaded {
    /// The settings.
    pub settings: Settings,
    /// One line per envoyproxy/ratelimit variable that is set but not
    /// honoured, saying what Sluice does instead (see [`unsupported`]).
    pub warnings: Vec<String>,
}

impl Settings {
    /// Reads the settings from `file` (if any), the process environment and
    /// `flags`.
    pub fn load(file: Option<&Path>, flags: &SettingsFlags) -> Result<Loaded, SettingsError> {
        Self::load_from(file, flags, None)
    }

    /// As [`Settings::load`], but with `env` instead of the process
    /// environment when given (tests).
    pub fn load_from(
        file: Option<&Path>,
        flags: &SettingsFlags,
        env: Option<config::Map<String, String>>,
    ) -> Result<Loaded, SettingsError> {
        let mut builder = config::Config::builder();
        let mut layer = None;
        let mut warnings = Vec::new();
        if flags.settings_from == Some(upstream::SettingsFrom::EnvoyRatelimit) {
            let vars = env.clone().unwrap_or_else(upstream::process_env);
            let upstream = upstream::layer(&vars)?;
            builder = builder.add_source(upstream.clone());
            layer = Some(upstream);
            warnings = unsupported::warnings(&vars);
        }
        let file_keys = match file {
            Some(file) => {
                let keys = file_keys(file)?;
                builder = builder.add_source(config::File::from(file).required(true));
                Some((file, keys))
            }
            None => None,
        };
        // No deny-unknown here: Kubernetes injects `SLUICE_SERVICE_HOST`-style
        // variables for a Service named `sluice`, which must not break start-up.
        builder = builder.add_source(
            config::Environment::with_prefix("SLUICE")
                .try_parsing(true)
                .source(env.clone()),
        );
        let sources = origin::Sources::new(flags, env.clone(), file_keys, layer);
        let unattributed = |e: config::ConfigError| SettingsError::Unattributed(e.to_string());
        builder = builder.add_source(config::Config::try_from(flags).map_err(unattributed)?);
        let merged = builder.build().map_err(|e| match e {
            config::ConfigError::FileParse { .. } | config::ConfigError::NotFound(_) => {
                SettingsError::File(e)
            }
            other => unattributed(other),
        })?;
        let mut settings: Settings = merged.try_deserialize().map_err(|e| {
            match origin::refusal(&e) {
                Some((setting, why)) => {
                    let accepted = accepted_values(&setting);
                    // serde's "enum X does not have variant constructor y"
                    // says less than the list of what is accepted.
                    let why = if accepted.is_empty() || accepted == ["true", "false"] {
                        why
                    } else {
                        format!("expected one of {}", accepted.join(", "))
                    };
                    SettingsError::Invalid {
                        origin: sources.origin(&setting),
                        setting,
                        why,
                    }
                }
                None => unattributed(e),
            }
        })?;
        settings.take_password_as_it_is(flags, env.as_ref());
        settings.check(&sources)?;
        Ok(Loaded { settings, warnings })
    }

    /// The environment source parses values that look like numbers or
    /// booleans ("007" would become "7"); a password must arrive as it is.
    /// An empty password (an empty variable) means none: no AUTH "".
    fn take_password_as_it_is(
        &mut self,
        flags: &SettingsFlags,
        env: Option<&config::Map<String, String>>,
    ) {
        let raw = match env {
            Some(env) => env.get("SLUICE_REDIS_PASSWORD").cloned(),
            None => std::env::var("SLUICE_REDIS_PASSWORD").ok(),
        };
        if let (None, Some(raw)) = (&flags.redis_password, raw) {
            self.redis_password = Some(Secret(raw));
        }
        if self.redis_password.as_ref().is_some_and(|p| p.0.is_empty()) {
            self.redis_password = None;
        }
    }
}
