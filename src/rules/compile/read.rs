//! The compiler's readers of YAML nodes: a map with known keys, a string, a
//! boolean, a whole number, a list, `counting`. Each reports a node of the
//! wrong shape at its line and returns `None` (or a neutral value), so that
//! compiling goes on and every error of a file is found.

use std::collections::HashMap;

use super::Compiler;
use crate::limiter::Counting;
use crate::rules::yaml::{Kind, Node as Yaml};

impl Compiler<'_> {
    /// The pairs of a map node whose keys are all in `allowed`.
    pub(super) fn map<'y>(
        &mut self,
        node: &'y Yaml,
        path: &str,
        what: &str,
        allowed: &[&str],
    ) -> Option<HashMap<&'y str, &'y Yaml>> {
        let Kind::Map(pairs) = &node.kind else {
            return self.fail(
                node.line,
                path,
                format!("{what} must be a map, found {}", node.shape()),
            );
        };
        let mut out = HashMap::new();
        for (key, value) in pairs {
            let Kind::Scalar { text, .. } = &key.kind else {
                self.error(key.line, path, format!("keys of {what} must be strings"));
                continue;
            };
            if !allowed.contains(&text.as_str()) {
                self.error(
                    key.line,
                    path,
                    format!(
                        "unknown key '{text}' in {what} (allowed: {})",
                        allowed.join(", ")
                    ),
                );
            } else if out.insert(text.as_str(), value).is_some() {
                self.error(key.line, path, format!("duplicate key '{text}' in {what}"));
            }
        }
        Some(out)
    }

    pub(super) fn string(&mut self, node: &Yaml, path: &str, what: &str) -> Option<String> {
        match &node.kind {
            _ if node.is_null() => Some(String::new()),
            Kind::Scalar { text, .. } => Some(text.clone()),
            _ => self.fail(
                node.line,
                path,
                format!("'{what}' must be a string, found {}", node.shape()),
            ),
        }
    }

    /// The string under `name` in a map node; empty when absent, null or not
    /// a string (the last reported).
    pub(super) fn field(&mut self, node: &Yaml, path: &str, name: &str) -> String {
        let Kind::Map(pairs) = &node.kind else {
            return String::new();
        };
        pairs
            .iter()
            .find(|(k, _)| matches!(&k.kind, Kind::Scalar { text, .. } if text == name))
            .and_then(|(_, v)| self.string(v, path, name))
            .unwrap_or_default()
    }

    /// YAML booleans, including the YAML 1.1 words Go's parser accepts.
    pub(super) fn boolean(&mut self, node: Option<&&Yaml>, path: &str, what: &str) -> bool {
        let Some(node) = node else { return false };
        if node.is_null() {
            return false;
        }
        if let Kind::Scalar {
            text,
            quoted: false,
        } = &node.kind
        {
            match text.to_ascii_lowercase().as_str() {
                "true" | "yes" | "y" | "on" => return true,
                "false" | "no" | "n" | "off" => return false,
                _ => {}
            }
        }
        self.error(node.line, path, format!("'{what}' must be true or false"));
        false
    }

    /// `counting: admitted | always`; absent or null leaves the global default.
    pub(super) fn counting(&mut self, node: Option<&&Yaml>, path: &str) -> Option<Counting> {
        let node = node.filter(|node| !node.is_null())?;
        if let Kind::Scalar { text, .. } = &node.kind {
            match text.parse() {
                Ok(counting) => return Some(counting),
                Err(message) => {
                    self.error(node.line, path, format!("'counting': {message}"));
                    return None;
                }
            }
        }
        self.error(node.line, path, "'counting' must be admitted or always");
        None
    }

    pub(super) fn integer(&mut self, node: &Yaml, path: &str, what: &str, max: u64) -> Option<u64> {
        if let Kind::Scalar {
            text,
            quoted: false,
        } = &node.kind
        {
            if let Ok(n) = text.parse::<u64>() {
                if n <= max {
                    return Some(n);
                }
                return self.fail(node.line, path, format!("'{what}' must be at most {max}"));
            }
            if text.starts_with('-') && text[1..].parse::<u64>().is_ok() {
                return self.fail(node.line, path, format!("'{what}' must not be negative"));
            }
        }
        self.fail(node.line, path, format!("'{what}' must be a whole number"))
    }

    pub(super) fn list<'y>(
        &mut self,
        node: &'y Yaml,
        path: &str,
        what: &str,
    ) -> Option<&'y [Yaml]> {
        match &node.kind {
            _ if node.is_null() => Some(&[]),
            Kind::Seq(items) => Some(items),
            _ => self.fail(
                node.line,
                path,
                format!("'{what}' must be a list, found {}", node.shape()),
            ),
        }
    }
}
