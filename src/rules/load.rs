//! The rules loader: which files a rules path names (a file, or every
//! rules file below a directory), reading each within its size bound, and
//! the domains they compile to. The compiler (`compile.rs`) sees bytes,
//! never the file system.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use super::compile::{MAX_FILE_BYTES, file_error, parse_domain, rule_set};
use super::{ConfigError, RuleSet};

/// Loads every file named, and every `*.yaml`/`*.yml` file anywhere below
/// every directory named (like envoyproxy/ratelimit's loader, which walks the
/// tree), skipping files and directories whose name starts with `.` and
/// following symlinks. A file reached twice (named twice, or through two
/// paths) is loaded once. A directory without any rules file is an error: an
/// operator pointing at the wrong mount must not start a limiter that limits
/// nothing. Domains must be unique across all the files.
pub fn load_paths(paths: &[PathBuf]) -> Result<RuleSet, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut files = Vec::new();
    for path in paths {
        files.extend(list_files(path, &mut errors));
    }
    let mut loaded = HashSet::new();
    // The same file named twice would otherwise be a duplicate of itself.
    let unique = files
        .into_iter()
        .filter(|file| loaded.insert(fs::canonicalize(file).unwrap_or_else(|_| file.clone())));
    let sources = unique.map(|file| {
        let label = file.display().to_string();
        let compiled = match read_capped(&file) {
            Ok(bytes) => parse_domain(&label, &bytes),
            Err(e) => Err(vec![file_error(&label, format!("cannot read: {e}"))]),
        };
        (label, compiled)
    });
    rule_set(sources, errors)
}

/// The file's bytes, reading no more than one byte past [`MAX_FILE_BYTES`]
/// (so that [`parse_domain`] can refuse a larger file without it being read).
fn read_capped(file: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    fs::File::open(file)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The rules files `path` names: itself when it is a file, else every rules
/// file below it in path order. Problems are added to `errors`.
fn list_files(path: &Path, errors: &mut Vec<ConfigError>) -> Vec<PathBuf> {
    let label = path.display().to_string();
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) => {
            errors.push(file_error(&label, format!("cannot read: {e}")));
            return Vec::new();
        }
    };
    if !meta.is_dir() {
        return vec![path.to_path_buf()];
    }
    let mut files = Vec::new();
    let failed = errors.len();
    walk(path, &mut HashSet::new(), &mut files, errors);
    if files.is_empty() && errors.len() == failed {
        errors.push(file_error(
            &label,
            format!("no rules files (*.yaml, *.yml) found in {label}"),
        ));
    }
    files.sort();
    files
}

/// Adds the rules files below `dir` to `files`, depth first in name order.
/// `visited` holds the canonical paths of the directories already walked, so
/// that a symlink back up the tree cannot loop.
fn walk(
    dir: &Path,
    visited: &mut HashSet<PathBuf>,
    files: &mut Vec<PathBuf>,
    errors: &mut Vec<ConfigError>,
) {
    if !visited.insert(fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())) {
        return;
    }
    let label = dir.display().to_string();
    let mut entries = match fs::read_dir(dir).and_then(Iterator::collect::<Result<Vec<_>, _>>) {
        Ok(entries) => entries,
        Err(e) => {
            errors.push(file_error(&label, format!("cannot list: {e}")));
            return;
        }
    };
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        // Hidden names are skipped. Kubernetes ConfigMap volumes keep the real
        // files under `..data` and `..<timestamp>`; the visible names are
        // symlinks into them, which `metadata` follows.
        if name.starts_with('.') {
            continue;
        }
        let is_yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        let path = entry.path();
        match fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => walk(&path, visited, files, errors),
            Ok(meta) if meta.is_file() && is_yaml => files.push(path),
            Ok(_) => {}
            // A dangling symlink names no file.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) if is_yaml => errors.push(file_error(
                &path.display().to_string(),
                format!("cannot read: {e}"),
            )),
            Err(_) => {}
        }
    }
}
