//! Reading the crate's import graph from its source: every `src/**/*.rs`
//! file is a module (`src/store/redis.rs` is `store::redis`), and every path
//! it names — `use` trees, `crate::…`, `super::…`, `self::…`, a child
//! module's name, or an external crate's — is resolved to the module or
//! crate it points into. Comments and string literals are skipped; inline
//! modules (`mod tests { … }`) count as part of their file's module, with
//! their `super::` resolved from where they sit.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path, `store::redis`; the crate root is empty.
pub type ModPath = Vec<String>;

/// One reference from a module to another module or to an external crate.
#[derive(Clone, Debug)]
pub struct Import {
    /// The file that names it, relative to the repository.
    pub file: String,
    /// Its line.
    pub line: usize,
    /// The module of that file.
    pub from: ModPath,
    /// Where it points.
    pub to: Target,
    /// The path as written, for messages.
    pub text: String,
    /// Whether it is a `pub use` (a re-export).
    pub reexport: bool,
}

/// What an import points into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A module of this crate (the file module the path lands in).
    Module(ModPath),
    /// An external crate, by its name in code (`tokio`, `redis`).
    Crate(String),
}

/// Every module of the crate and every import between them.
pub struct Graph {
    /// Each file module, with its file.
    pub modules: BTreeMap<ModPath, String>,
    /// Every import of every module.
    pub imports: Vec<Import>,
}

/// Reads `src/` (the library; `main.rs` is the binary, another crate) and
/// the external crates `Cargo.toml` names.
pub fn read_crate(repo: &Path) -> Graph {
    let src = repo.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules = BTreeMap::new();
    for file in &files {
        if let Some(path) = module_of(&src, file) {
            modules.insert(path, relative(repo, file));
        }
    }
    let crates = external_crates(&std::fs::read_to_string(repo.join("Cargo.toml")).unwrap());
    let known: BTreeSet<ModPath> = modules.keys().cloned().collect();
    let mut imports = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        let file = relative(repo, file);
        let found = paths(&tokens(&text));
        // A name a `use` brought in (`use crate::store::redis;`) stands for
        // its path wherever the file writes it (`redis::RedisStore`).
        let aliases: BTreeMap<&str, &Found> = found
            .iter()
            .filter_map(|f| Some((f.alias.as_deref()?, f)))
            .collect();
        for f in &found {
            let (inline, path) = match aliases.get(f.path[0].as_str()) {
                Some(used) if f.alias.is_none() && f.path.len() > 1 => {
                    let mut path = used.path.clone();
                    path.extend(f.path[1..].iter().cloned());
                    (&used.inline, path)
                }
                _ => (&f.inline, f.path.clone()),
            };
            let mut here = module.clone();
            here.extend(inline.iter().cloned());
            if let Some(to) = resolve(&known, &crates, &here, &path) {
                imports.push(Import {
                    file: file.clone(),
                    line: f.line,
                    from: module.clone(),
                    to,
                    text: f.path.join("::"),
                    reexport: f.reexport,
                });
            }
        }
    }
    Graph { modules, imports }
}

/// The paths a piece of source names, as written, in order.
pub fn paths_in(text: &str) -> Vec<String> {
    paths(&tokens(text))
        .into_iter()
        .map(|f| f.path.join("::"))
        .collect()
}

fn relative(repo: &Path, file: &Path) -> String {
    file.strip_prefix(repo).unwrap().display().to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `src/lib.rs` is the root;
/// `src/main.rs` (the binary) is none.
fn module_of(src: &Path, file: &Path) -> Option<ModPath> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: ModPath = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    match last.as_str() {
        "main.rs" if parts.is_empty() => None,
        "lib.rs" if parts.is_empty() => Some(parts),
        "mod.rs" => Some(parts),
        _ => {
            parts.push(last.trim_end_matches(".rs").to_string());
            Some(parts)
        }
    }
}

/// The names of `[dependencies]` and `[dev-dependencies]`, as code spells
/// them (`tokio-util` is `tokio_util`).
fn external_crates(manifest: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = matches!(line, "[dependencies]" | "[dev-dependencies]");
        } else if inside && let Some((name, _)) = line.split_once('=') {
            let name = name.trim();
            if !name.is_empty() && !name.starts_with('#') {
                out.insert(name.replace('-', "_"));
            }
        }
    }
    out
}

/// Where `path`, written in module `here` (a file module and the inline
/// modules around the path),
/// points: a module of the crate, an external crate, or nothing worth
/// recording (std, a local item, a type's associated item).
fn resolve(
    known: &BTreeSet<ModPath>,
    crates: &BTreeSet<String>,
    here: &ModPath,
    path: &[String],
) -> Option<Target> {
    let first = path.first()?.as_str();
    let absolute: ModPath = match first {
        "crate" => path[1..].to_vec(),
        "super" | "self" => {
            let mut base = here.clone();
            let mut rest = path;
            while let Some(seg) = rest.first() {
                match seg.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            base
        }
        _ => {
            let mut child = here.clone();
            child.push(first.to_string());
            if known.contains(&child) {
                let mut base = here.clone();
                base.extend(path.iter().cloned());
                base
            } else if crates.contains(first) {
                return Some(Target::Crate(first.to_string()));
            } else {
                return None;
            }
        }
    };
    let absolute: ModPath = absolute.into_iter().filter(|s| s != "self").collect();
    // The longest file module the path lands in.
    let mut prefix = absolute;
    while !known.contains(&prefix) {
        prefix.pop()?;
    }
    Some(Target::Module(prefix))
}

// ---------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other,
}

/// The tokens that matter for paths, each with its line; comments, strings
/// and character literals are dropped.
fn tokens(text: &str) -> Vec<(usize, Tok)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if let Some(end) = skipped(&chars, i) {
            let end = end.min(chars.len());
            line += chars[i..end].iter().filter(|&&c| c == '\n').count();
            i = end;
        } else if c == '\'' {
            // A lifetime or a label: its name is not a path.
            out.push((line, Tok::Other));
            i = ident_end(&chars, i + 1);
        } else if c == 'r' && at(i + 1) == '#' && (at(i + 2).is_alphabetic() || at(i + 2) == '_') {
            let end = ident_end(&chars, i + 2);
            out.push((line, Tok::Ident(chars[i + 2..end].iter().collect())));
            i = end;
        } else if c.is_alphabetic() || c == '_' {
            let end = ident_end(&chars, i);
            out.push((line, Tok::Ident(chars[i..end].iter().collect())));
            i = end;
        } else if c.is_ascii_digit() {
            i = ident_end(&chars, i);
        } else if c == '$' && chars[i + 1..].starts_with(&['c', 'r', 'a', 't', 'e']) {
            i += 1;
        } else {
            let tok = match c {
                ':' if at(i + 1) == ':' => {
                    i += 1;
                    Tok::Sep
                }
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                ';' => Tok::Semi,
                '*' => Tok::Star,
                _ => Tok::Other,
            };
            if c == '\n' {
                line += 1;
            } else if !c.is_whitespace() {
                out.push((line, tok));
            }
            i += 1;
        }
    }
    out
}

/// Where a comment, string or character literal starting at `i` ends, if
/// one starts there.
fn skipped(chars: &[char], i: usize) -> Option<usize> {
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let c = chars[i];
    if c == '/' && at(i + 1) == '/' {
        return Some(
            (i..chars.len())
                .find(|&j| chars[j] == '\n')
                .unwrap_or(chars.len()),
        );
    }
    if c == '/' && at(i + 1) == '*' {
        let (mut j, mut depth) = (i + 2, 1);
        while j < chars.len() && depth > 0 {
            if chars[j] == '/' && at(j + 1) == '*' {
                depth += 1;
                j += 2;
            } else if chars[j] == '*' && at(j + 1) == '/' {
                depth -= 1;
                j += 2;
            } else {
                j += 1;
            }
        }
        return Some(j);
    }
    if let Some(end) = raw_string_end(chars, i) {
        return Some(end);
    }
    if c == '"' || (c == 'b' && at(i + 1) == '"') {
        let mut j = if c == 'b' { i + 2 } else { i + 1 };
        while j < chars.len() && chars[j] != '"' {
            j += if chars[j] == '\\' { 2 } else { 1 };
        }
        return Some(j + 1);
    }
    let q = if c == 'b' && at(i + 1) == '\'' {
        i + 1
    } else {
        i
    };
    if chars[q] != '\'' {
        return None;
    }
    if at(q + 1) == '\\' {
        (q + 2..chars.len())
            .find(|&j| chars[j] == '\'')
            .map(|end| end + 1)
    } else if at(q + 2) == '\'' {
        Some(q + 3)
    } else {
        None
    }
}

fn ident_end(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
        i += 1;
    }
    i
}

/// The end of a raw string (`r"…"`, `r#"…"#`, `br#"…"#`) starting at `i`.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
    j += hashes;
    if chars.get(j) != Some(&'"') {
        return None;
    }
    let closing: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    (j + 1..chars.len())
        .find(|&k| chars[k..].starts_with(&closing))
        .map(|k| k + closing.len())
}

// ---------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------

/// One path of a file.
struct Found {
    line: usize,
    /// The inline modules it sits in, outermost first.
    inline: ModPath,
    path: Vec<String>,
    /// For a `use`, the name it brings into scope.
    alias: Option<String>,
    /// Whether it is a `pub use`.
    reexport: bool,
}

/// Every path of the file: `use` trees expanded, and every `a::b…` in code,
/// each with its line and the inline modules it sits in.
fn paths(toks: &[(usize, Tok)]) -> Vec<Found> {
    let mut out = Vec::new();
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    let ident = |i: usize| match toks.get(i) {
        Some((_, Tok::Ident(s))) => Some(s.as_str()),
        _ => None,
    };
    let tok = |i: usize| toks.get(i).map(|(_, t)| t);
    while i < toks.len() {
        let here: ModPath = inline.iter().map(|(n, _)| n.clone()).collect();
        let line = toks[i].0;
        match &toks[i].1 {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth -= 1;
                inline.retain(|(_, d)| *d <= depth);
            }
            Tok::Ident(word) if word == "mod" && tok(i + 2) == Some(&Tok::Open) => {
                if let Some(name) = ident(i + 1) {
                    inline.push((name.to_string(), depth + 1));
                }
            }
            Tok::Ident(word) if word == "use" && !after_sep(toks, i) => {
                let reexport = is_pub(toks, i);
                i += 1;
                let mut found = Vec::new();
                use_tree(toks, &mut i, Vec::new(), &mut found);
                out.extend(found.into_iter().map(|(path, alias)| Found {
                    line,
                    inline: here.clone(),
                    path,
                    alias: Some(alias).filter(|a| a != "_"),
                    reexport,
                }));
                continue;
            }
            Tok::Ident(first) if tok(i + 1) == Some(&Tok::Sep) && !after_sep(toks, i) => {
                let mut path = vec![first.clone()];
                let mut j = i + 1;
                while tok(j) == Some(&Tok::Sep)
                    && let Some(next) = ident(j + 1)
                {
                    path.push(next.to_string());
                    j += 2;
                }
                out.push(Found {
                    line,
                    inline: here,
                    path,
                    alias: None,
                    reexport: false,
                });
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Whether the item at `i` is `pub` or `pub(…)`.
fn is_pub(toks: &[(usize, Tok)], i: usize) -> bool {
    let word = |k: usize| match toks.get(k) {
        Some((_, Tok::Ident(w))) => Some(w.as_str()),
        _ => None,
    };
    i >= 1 && word(i - 1) == Some("pub")
        || (i >= 3 && toks[i - 1].1 == Tok::Other && word(i - 3) == Some("pub"))
        || (i >= 5 && word(i - 3) == Some("in") && word(i - 5) == Some("pub"))
}

fn after_sep(toks: &[(usize, Tok)], i: usize) -> bool {
    i > 0 && toks[i - 1].1 == Tok::Sep
}

/// One `use` tree from `*i`, expanded into whole paths, each with the name
/// it brings into scope (`*` for a glob); `*i` ends past it.
fn use_tree(
    toks: &[(usize, Tok)],
    i: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) {
    let mut path = prefix;
    while let Some((_, t)) = toks.get(*i) {
        match t {
            Tok::Sep => *i += 1,
            Tok::Ident(seg) => {
                path.push(seg.clone());
                *i += 1;
                if toks.get(*i).map(|t| &t.1) != Some(&Tok::Sep) {
                    let mut alias = seg.clone();
                    if matches!(toks.get(*i), Some((_, Tok::Ident(w))) if w == "as") {
                        if let Some((_, Tok::Ident(name))) = toks.get(*i + 1) {
                            alias = name.clone();
                        }
                        *i += 2;
                    }
                    if alias == "self" && path.len() > 1 {
                        alias = path[path.len() - 2].clone();
                    }
                    out.push((path, alias));
                    return;
                }
            }
            Tok::Star => {
                *i += 1;
                out.push((path, "*".to_string()));
                return;
            }
            Tok::Open => {
                *i += 1;
                while let Some((_, t)) = toks.get(*i) {
                    match t {
                        Tok::Close => {
                            *i += 1;
                            break;
                        }
                        Tok::Comma => *i += 1,
                        _ => use_tree(toks, i, path.clone(), out),
                    }
                }
                return;
            }
            _ => {
                *i += 1;
                return;
            }
        }
    }
}
