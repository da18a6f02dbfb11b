//! Validation of rules files into domains. Every problem found is reported
//! (not only the first) with its file, line and rule path; a file with any
//! error yields no domain, so a bad file can never be half loaded.
//!
//! This file holds the entry points and the [`Compiler`]'s error list; its
//! files hold the rest of the compiler, one part of the format each:
//! `read.rs` (typed readers of YAML nodes), `tree.rs` (the domain and its
//! descriptor tree), `limit.rs` (a descriptor's rule and its rate limits),
//! `algorithm.rs` (a limit's algorithm and its parameters) and `penalty.rs`
//! (a limit's penalty box).

mod algorithm;
mod limit;
mod penalty;
mod read;
mod tree;

use std::collections::{HashMap, HashSet};

use super::yaml::{self, Node as Yaml};
use super::{ConfigError, Domain, RuleSet};

pub use algorithm::{DEFAULT_BUCKETS, MAX_BUCKETS};
pub use penalty::{DEFAULT_FORGET_AFTER_MS, DEFAULT_MAX_BLOCK_MS, penalty_fits, shortest_block_ms};

/// Largest rules file read, in bytes. Far above any hand-written file (a
/// descriptor takes a few lines), and small enough that a file dropped into
/// the watched directory by mistake cannot exhaust memory while it is parsed.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Most bytes of descriptor paths one source may compile to. Every rule
/// keeps its path (for errors, `/rlconfig` and stats keys) and every error
/// copies one, so a long key or value above many descriptors is repeated in
/// each: unbounded, a 600 KB file (one 200 KB value over 5,000 limits) took
/// 3.4 GB. Ordinary files stay far below (40,000 rules: about 12 MB).
pub const MAX_PATH_BYTES: usize = 32 * 1024 * 1024;

/// The rule set of compiled sources, each with the label its errors name,
/// after the `errors` found before compiling (unreadable files): every
/// error, or every domain. A domain whose name came earlier is an error
/// naming the source that had it first: the one rule for duplicates,
/// whether the domains come from files or from xDS.
pub(super) fn rule_set(
    sources: impl IntoIterator<Item = (String, Result<Domain, Vec<ConfigError>>)>,
    mut errors: Vec<ConfigError>,
) -> Result<RuleSet, Vec<ConfigError>> {
    let mut domains = Vec::new();
    let mut seen: HashMap<String, String> = HashMap::new();
    for (label, compiled) in sources {
        let domain = match compiled {
            Ok(domain) => domain,
            Err(errs) => {
                errors.extend(errs);
                continue;
            }
        };
        match seen.get(&domain.name) {
            Some(first) => errors.push(ConfigError {
                file: label,
                line: domain.line,
                path: domain.name.clone(),
                message: format!(
                    "duplicate domain '{}' (already defined in {first})",
                    domain.name
                ),
            }),
            None => {
                seen.insert(domain.name.clone(), label);
                domains.push(domain);
            }
        }
    }
    if errors.is_empty() {
        Ok(RuleSet::from_domains(domains))
    } else {
        Err(errors)
    }
}

pub(super) fn file_error(file: &str, message: String) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        line: 0,
        path: String::new(),
        message,
    }
}

/// Parses one rules file (one domain). `file` labels the errors.
pub fn parse_domain(file: &str, bytes: &[u8]) -> Result<Domain, Vec<ConfigError>> {
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(vec![file_error(
            file,
            format!("file is larger than {MAX_FILE_BYTES} bytes: a rules file holds one domain"),
        )]);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        vec![ConfigError {
            file: file.to_owned(),
            line,
            path: String::new(),
            message: "file is not valid UTF-8".into(),
        }]
    })?;
    // Editors on Windows may start a UTF-8 file with a byte-order mark, which
    // Go's YAML parser (and so envoyproxy/ratelimit) skips.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let docs = yaml::parse(text).map_err(|e| {
        vec![ConfigError {
            file: file.to_owned(),
            line: e.line,
            path: String::new(),
            message: format!("invalid YAML: {}", e.message),
        }]
    })?;
    compile_documents(file, &docs)
}

/// Compiles rules that arrive as trees rather than files, each with the
/// label its errors name: xDS resources, built from the protobuf by
/// `xds::convert`. The same checks, and the same rule for a duplicate
/// domain, as files.
pub fn compile_trees(
    trees: impl IntoIterator<Item = (String, Yaml)>,
) -> Result<RuleSet, Vec<ConfigError>> {
    let sources = trees.into_iter().map(|(label, tree)| {
        let compiled = compile_documents(&label, &[tree]);
        (label, compiled)
    });
    rule_set(sources, Vec::new())
}

/// Compiles the documents of one rules source (exactly one is expected) into
/// its domain. Files reach it through [`parse_domain`]; xDS resources through
/// [`compile_trees`], as trees built from the protobuf, so both are validated
/// by the same code.
pub(crate) fn compile_documents(file: &str, docs: &[Yaml]) -> Result<Domain, Vec<ConfigError>> {
    let mut compiler = Compiler {
        file,
        errors: Vec::new(),
        path_bytes: 0,
        wildcard_paths: HashSet::new(),
    };
    let domain = match docs {
        [] => compiler.fail(
            0,
            "",
            "file is empty: expected a 'domain' and 'descriptors'",
        ),
        [doc] => compiler.domain(doc),
        [_, second, ..] => compiler.fail(
            second.line,
            "",
            "more than one YAML document: a rules file holds exactly one domain",
        ),
    };
    match domain {
        Some(domain) if compiler.errors.is_empty() => Ok(domain),
        _ => {
            // Found tree by tree; reported top to bottom.
            let mut errors = compiler.errors;
            errors.sort_by_key(|e| e.line);
            Err(errors)
        }
    }
}

struct Compiler<'f> {
    file: &'f str,
    errors: Vec<ConfigError>,
    /// Bytes of paths kept so far, against [`MAX_PATH_BYTES`].
    path_bytes: usize,
    /// The paths of the wildcard descriptors so far: a level keeps its
    /// wildcards in file order, and looking for a duplicate there was
    /// quadratic (140,000 wildcards: 20 s).
    wildcard_paths: HashSet<String>,
}

impl Compiler<'_> {
    /// Counts `bytes` more of kept paths; past [`MAX_PATH_BYTES`], one error
    /// (at `line`) and `false` from then on, so that compiling stops.
    fn keep_path(&mut self, bytes: usize, line: usize) -> bool {
        if self.path_bytes > MAX_PATH_BYTES {
            return false;
        }
        self.path_bytes = self.path_bytes.saturating_add(bytes);
        if self.path_bytes <= MAX_PATH_BYTES {
            return true;
        }
        self.errors.push(ConfigError {
            file: self.file.to_owned(),
            line,
            path: String::new(),
            message: format!(
                "descriptor paths (each descriptor's keys and values, repeated in every \
                 descriptor under it) would take more than {MAX_PATH_BYTES} bytes: shorten \
                 the long keys or values, or nest fewer descriptors under them"
            ),
        });
        false
    }

    fn error(&mut self, line: usize, path: &str, message: impl Into<String>) {
        if !self.keep_path(self.file.len() + path.len(), line) {
            return;
        }
        self.errors.push(ConfigError {
            file: self.file.to_owned(),
            line,
            path: path.to_owned(),
            message: message.into(),
        });
    }

    fn fail<T>(&mut self, line: usize, path: &str, message: impl Into<String>) -> Option<T> {
        self.error(line, path, message);
        None
    }
}
