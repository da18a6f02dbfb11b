//! Where each setting's value came from — a flag, a `SLUICE_…` variable, a
//! key of the settings file, envoyproxy/ratelimit's variables or the
//! default — so that an error about a bad value names the one place a
//! person must change, with the value found there, once.
//!
//! The `config` crate merges the sources before anything is checked and
//! keeps no trace of which one won; the sources are kept here and asked
//! again, in the same order of precedence, when a value is refused.

use std::path::{Path, PathBuf};

use config::Map;

use super::{DECLARED, SettingsFlags, upstream};

/// The sources a [`super::Settings`] was loaded from, by precedence.
pub(super) struct Sources {
    /// The flags that were given, as JSON (unset flags are absent).
    flags: serde_json::Map<String, serde_json::Value>,
    /// The environment the `SLUICE_…` variables were read from; `None` is
    /// the process environment.
    env: Option<Map<String, String>>,
    /// The settings file and its keys.
    file: Option<(PathBuf, Map<String, config::Value>)>,
    /// What envoyproxy/ratelimit's variables gave, in that mode.
    upstream: Option<upstream::Layer>,
}

/// One place a value came from, with the value, as a person would write
/// it: `--flag "value"`, `SLUICE_NAME="value"`, `key = "value" in FILE`,
/// `setting = "value" from UPSTREAM_VAR`, or `setting (its default)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin(String);

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Sources {
    pub(super) fn new(
        flags: &SettingsFlags,
        env: Option<Map<String, String>>,
        file: Option<(&Path, Map<String, config::Value>)>,
        upstream: Option<upstream::Layer>,
    ) -> Self {
        let flags = match serde_json::to_value(flags) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        Self {
            flags,
            env,
            file: file.map(|(path, keys)| (path.to_path_buf(), keys)),
            upstream,
        }
    }

    /// Where `setting`'s value came from: the source of highest precedence
    /// that sets it (flags, then `SLUICE_…`, then the file, then upstream's
    /// variables).
    pub(super) fn origin(&self, setting: &str) -> Origin {
        if let Some(value) = self.flags.get(setting) {
            let value = match value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            return Origin(format!("--{} {value:?}", setting.replace('_', "-")));
        }
        let var = format!("SLUICE_{}", setting.to_ascii_uppercase());
        let from_env = match &self.env {
            Some(env) => env.get(&var).cloned(),
            None => std::env::var(&var).ok(),
        };
        if let Some(value) = from_env {
            return Origin(format!("{var}={value:?}"));
        }
        if let Some((path, keys)) = &self.file
            && let Some(value) = keys.get(setting)
        {
            return Origin(format!(
                "{setting} = {:?} in {}",
                value.to_string(),
                path.display()
            ));
        }
        if let Some(value) = self.upstream.as_ref().and_then(|l| l.get(setting)) {
            let vars = upstream::feeding(setting).join(", ");
            return Origin(if vars.is_empty() {
                format!("{setting} = {value:?} (envoyproxy/ratelimit's default as `ratelimit`)")
            } else {
                format!("{setting} = {value:?} from {vars}")
            });
        }
        Origin(format!("{setting} (its default)"))
    }
}

/// Why `config` refused a value, without the key and origin it appends
/// (the caller names those once), and the setting it was for.
pub(super) fn refusal(error: &config::ConfigError) -> Option<(String, String)> {
    use config::ConfigError;
    match error {
        ConfigError::Type {
            expected,
            key: Some(key),
            ..
        } => Some((key.clone(), expected_text(expected, positive(key)))),
        ConfigError::At {
            error,
            key: Some(key),
            ..
        } => Some((key.clone(), refused_text(&error.to_string()))),
        _ => None,
    }
}

/// Whether `setting` must be positive (it is typed `NonZero…`).
fn positive(setting: &str) -> bool {
    DECLARED
        .iter()
        .any(|d| d.name == setting && d.ty.starts_with("NonZero"))
}

/// serde's words for a refused value, as a person would say what is
/// expected: a `NonZero…` setting says it takes 1 or more.
fn refused_text(error: &str) -> String {
    if error.contains("expected a nonzero") {
        "expected a whole number, 1 or more".to_owned()
    } else {
        error.to_owned()
    }
}

/// serde's words for a type, as a person would say what is expected.
fn expected_text(expected: &str, positive: bool) -> String {
    if expected.contains("nonzero") || (positive && expected.contains("unsigned")) {
        "expected a whole number, 1 or more".to_owned()
    } else if expected.contains("unsigned") {
        "expected a whole number, 0 or more".to_owned()
    } else if expected.contains("integer") {
        "expected a whole number".to_owned()
    } else if expected.contains("boolean") {
        "expected true or false".to_owned()
    } else if expected.contains("float") {
        "expected a number".to_owned()
    } else {
        format!("expected {expected}")
    }
}
