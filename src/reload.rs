//! Rules hot reload: watches the rules files and reloads the whole
//! [`RulesSource`] when they change, or on SIGHUP, and hands each outcome to
//! the caller.
//!
//! The contract: **a failed load never affects the rules in force.** This
//! module only reports outcomes; the caller puts an `Ok` in force (with
//! [`Limiter::replace_rules`](crate::decision::Limiter::replace_rules)) and
//! drops an `Err`, which is logged here error by error. A reload always loads
//! the whole source, never one file, so the rules in force are always one
//! consistent, fully validated set.
//!
//! What is watched, with `notify` (inotify on Linux):
//! - a directory: recursively, following symlinks, so new subdirectories are
//!   watched as they appear;
//! - a file: its parent directory, non-recursively (watching the file itself
//!   would lose it when an editor or kubelet replaces it by a rename); only
//!   events on the file's own name, on the first component of its symlink
//!   target (the ConfigMap `..data` link), or on the directory itself count.
//!   When the file is a symlink into another directory, that directory is
//!   watched too, for in-place edits of the target.
//!
//! After every reload the watches are worked out again from the source
//! paths, so a directory removed and created anew, or a symlink re-pointed,
//! is watched from then on (at the latest after the reload a SIGHUP causes).
//!
//! Which events count: every event except reads (open, close without
//! writing: the loader's own reads must not trigger a reload) and, inside a
//! watched directory, events under a name starting with a single `.`, which
//! the loader skips (editor swap files such as `.x.yaml.swp`). Names starting
//! with `..` count: they are Kubernetes' `..data` and `..<timestamp>`, and
//! re-pointing `..data` is how a ConfigMap update lands. Any other name
//! counts, even one that is not a rules file: it may be a directory or a
//! symlink the loader follows, and a needless reload is harmless.
//!
//! Bursts are coalesced (see [`QUIET`] and [`MAX_DELAY`]); SIGHUP reloads at
//! once. Reloads never overlap, and a change made during a reload triggers
//! another, so no change is missed. This module owns the tokio and notify
//! side of reloading: `rules` itself stays free of both.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use parking_lot::RwLock;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::rules::{ConfigError, RuleSet, RulesSource};

/// How long the watched files must stay quiet before a reload: an editor's
/// save or a kubelet update is a burst of events within a few milliseconds,
/// and one reload after the burst sees its end state.
pub const QUIET: Duration = Duration::from_millis(250);

/// The longest a reload waits after the first event of a burst, so that files
/// that never stay quiet (a log written into the rules directory) cannot
/// postpone it forever.
pub const MAX_DELAY: Duration = Duration::from_secs(2);

/// The outcome of one reload.
#[derive(Debug)]
pub struct Reload {
    /// Every domain of the source, loaded again, or every error found in it.
    /// On `Err` the caller keeps the rules in force.
    pub result: Result<RuleSet, Vec<ConfigError>>,
    /// What caused the reload.
    pub trigger: Trigger,
}

/// What caused a reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// A change to the watched files.
    FileChange,
    /// SIGHUP.
    Signal,
    /// A snapshot from the xDS management server ([`crate::xds`]).
    Xds,
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Trigger::FileChange => "file change",
            Trigger::Signal => "SIGHUP",
            Trigger::Xds => "xDS",
        })
    }
}

/// Reloads `source` whenever its files change or the process gets SIGHUP,
/// and calls `on_reload` with each outcome, until `shutdown` is cancelled
/// (the returned task then ends).
///
/// The SIGHUP handler and the file watches are in place when this returns,
/// so a signal or a change made right after is never lost. For
/// [`RulesSource::Builtin`] nothing is watched; SIGHUP still reloads (and
/// yields the same rules). Must be called within a Tokio runtime with IO and
/// time enabled.
///
/// `on_reload` runs on the watch task, one call at a time, in order; it
/// should only put `Ok` rules in force (see the module docs) and return.
///
/// # Errors
///
/// Installing the SIGHUP handler or a watch failed, e.g. a file's directory
/// does not exist. A missing file in an existing directory is watched for.
pub fn watch<F>(
    source: RulesSource,
    on_reload: F,
    shutdown: CancellationToken,
) -> io::Result<JoinHandle<()>>
where
    F: FnMut(Reload) + Send + 'static,
{
    let hangup = signal(SignalKind::hangup())
        .map_err(|e| io::Error::new(e.kind(), format!("installing the SIGHUP handler: {e}")))?;
    let changed = Arc::new(Notify::new());
    let watches = match &source {
        RulesSource::Paths(paths) => Some(Watches::start(scopes(paths)?, Arc::clone(&changed))?),
        RulesSource::Builtin => None,
    };
    Ok(tokio::spawn(run(
        Arc::new(source),
        watches,
        changed,
        hangup,
        on_reload,
        shutdown,
    )))
}

async fn run<F>(
    source: Arc<RulesSource>,
    mut watches: Option<Watches>,
    changed: Arc<Notify>,
    mut hangup: Signal,
    mut on_reload: F,
    shutdown: CancellationToken,
) where
    F: FnMut(Reload) + Send + 'static,
{
    let mut debounce = Debounce::default();
    loop {
        let due = debounce.due();
        let trigger = tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            Some(()) = hangup.recv() => Trigger::Signal,
            () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                Trigger::FileChange
            }
            () = changed.notified() => {
                debounce.event(Instant::now());
                continue;
            }
        };
        // The load reads everything as it is now, so it covers every event
        // seen so far; events arriving from here on start a new burst.
        debounce.clear();
        let load = tokio::task::spawn_blocking({
            let source = Arc::clone(&source);
            move || source.load()
        });
        let result = tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            joined = load => joined.unwrap_or_else(|e| Err(vec![ConfigError {
                file: "(reload)".into(),
                line: 0,
                path: String::new(),
                message: format!("the rules loader panicked: {e}"),
            }])),
        };
        match &result {
            Ok(rules) => {
                tracing::info!(domains = rules.domains().count(), %trigger, "rules reloaded");
            }
            Err(errors) => {
                for error in errors {
                    tracing::error!(%error, %trigger, "rules reload failed; keeping the rules in force");
                }
            }
        }
        if let (Some(watches), RulesSource::Paths(paths)) = (&mut watches, &*source) {
            watches.follow(paths);
        }
        on_reload(Reload { result, trigger });
    }
}

/// The live watches, and the scopes their events are filtered by.
struct Watches {
    watcher: RecommendedWatcher,
    /// Shared with the event handler, which runs on notify's thread; replaced
    /// when the watches follow the source (see [`Watches::follow`]).
    scopes: Arc<RwLock<Vec<Scope>>>,
    /// What `watcher` watches.
    dirs: BTreeMap<PathBuf, RecursiveMode>,
}

impl Watches {
    /// Watches what `scopes` need; every event that counts wakes `changed`.
    fn start(scopes: Vec<Scope>, changed: Arc<Notify>) -> io::Result<Self> {
        let dirs = dirs(&scopes);
        let scopes = Arc::new(RwLock::new(scopes));
        let filter = Arc::clone(&scopes);
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<Event>| {
            match event {
                Ok(event) if !counts(&filter.read(), &event) => {}
                Ok(event) => {
                    tracing::debug!(?event, "rules change");
                    changed.notify_one();
                }
                // The watcher may have lost track of something: reloading
                // costs little and cannot put bad rules in force.
                Err(e) => {
                    tracing::warn!(error = %e, "rules watch error; reloading");
                    changed.notify_one();
                }
            }
        })
        .map_err(|e| io::Error::other(format!("starting the rules watcher: {e}")))?;
        for (dir, mode) in &dirs {
            watcher.watch(dir, *mode).map_err(|e| watch_error(dir, e))?;
        }
        Ok(Self {
            watcher,
            scopes,
            dirs,
        })
    }

    /// Watches what `paths` need now. A directory removed and created anew
    /// (which ends its watch) is watched again, and a file symlinked into a
    /// ConfigMap follows the link to its new target. Runs after every reload,
    /// so at the latest the one a SIGHUP causes. Watching a watched directory
    /// changes nothing. A few system calls per rules directory: cheap enough
    /// to run on the watch task.
    fn follow(&mut self, paths: &[PathBuf]) {
        let scopes = match scopes(paths) {
            Ok(scopes) => scopes,
            Err(e) => {
                tracing::warn!(error = %e, "cannot resolve the rules paths to watch");
                return;
            }
        };
        let dirs = dirs(&scopes);
        // Before watching anything new, so that no event of it is dropped.
        *self.scopes.write() = scopes;
        for dir in self.dirs.keys().filter(|d| !dirs.contains_key(*d)) {
            // Usually gone already, which ended the watch.
            let _ = self.watcher.unwatch(dir);
        }
        for (dir, mode) in &dirs {
            if let Err(e) = self.watcher.watch(dir, *mode) {
                // A missing directory is already an error of the load.
                tracing::debug!(dir = %dir.display(), error = %e, "cannot watch rules directory");
            }
        }
        self.dirs = dirs;
    }
}

/// Each directory `scopes` need, once: recursive when any scope needs it,
/// and left out when a recursive watch of an ancestor covers it.
fn dirs(scopes: &[Scope]) -> BTreeMap<PathBuf, RecursiveMode> {
    let mut dirs = BTreeMap::new();
    for scope in scopes {
        let (dir, mode) = match scope {
            Scope::Tree(root) => (root, RecursiveMode::Recursive),
            Scope::Entries { dir, .. } => (dir, RecursiveMode::NonRecursive),
        };
        let entry = dirs.entry(dir.clone()).or_insert(mode);
        if mode == RecursiveMode::Recursive {
            *entry = mode;
        }
    }
    let trees: Vec<PathBuf> = dirs
        .iter()
        .filter(|(_, mode)| **mode == RecursiveMode::Recursive)
        .map(|(dir, _)| dir.clone())
        .collect();
    dirs.retain(|dir, _| !trees.iter().any(|t| dir != t && dir.starts_with(t)));
    dirs
}

fn watch_error(path: &Path, e: notify::Error) -> io::Error {
    let kind = match &e.kind {
        notify::ErrorKind::Io(io) => io.kind(),
        notify::ErrorKind::PathNotFound => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, format!("watching {}: {e}", path.display()))
}

/// One watched place and the events in it that count.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Scope {
    /// A directory of rules, watched recursively.
    Tree(PathBuf),
    /// Some entries of `dir`, watched non-recursively.
    Entries { dir: PathBuf, names: Vec<OsString> },
}

/// The scopes to watch for these source paths (made absolute, as notify
/// reports them).
fn scopes(paths: &[PathBuf]) -> io::Result<Vec<Scope>> {
    let mut scopes = Vec::new();
    for path in paths {
        let path = std::path::absolute(path)?;
        if path.is_dir() {
            scopes.push(Scope::Tree(path));
            continue;
        }
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            scopes.push(Scope::Tree(path));
            continue;
        };
        let mut names = vec![name.to_owned()];
        let link = std::fs::read_link(&path);
        if let Ok(target) = &link {
            // `x.yaml -> ..data/x.yaml`: re-pointing `..data` changes x.yaml.
            let within = if target.is_absolute() {
                target.strip_prefix(dir).ok()
            } else {
                Some(target.as_path())
            };
            if let Some(Component::Normal(head)) = within.and_then(|t| t.components().next())
                && head != name
            {
                names.push(head.to_owned());
            }
        }
        scopes.push(Scope::Entries {
            dir: dir.to_owned(),
            names,
        });
        // A symlink's target edited in place changes nothing in `dir`.
        if link.is_ok()
            && let Ok(real) = std::fs::canonicalize(&path)
            && let (Some(real_dir), Some(real_name)) = (real.parent(), real.file_name())
            && std::fs::canonicalize(dir).is_ok_and(|d| d != real_dir)
        {
            scopes.push(Scope::Entries {
                dir: real_dir.to_owned(),
                names: vec![real_name.to_owned()],
            });
        }
    }
    Ok(scopes)
}

/// Whether `event` can change what the loader reads from `scopes`.
fn counts(scopes: &[Scope], event: &Event) -> bool {
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => {}
        // Reads, including the loader's own.
        EventKind::Access(_) => return false,
        _ => {}
    }
    if event.need_rescan() || event.paths.is_empty() {
        return true;
    }
    event
        .paths
        .iter()
        .any(|path| scopes.iter().any(|scope| scope.contains(path)))
}

impl Scope {
    /// Whether a change at `path` can change what the loader reads here.
    fn contains(&self, path: &Path) -> bool {
        match self {
            Scope::Tree(root) => path.strip_prefix(root).is_ok_and(|rel| {
                rel.components().all(|c| match c {
                    Component::Normal(name) => {
                        let name = name.as_encoded_bytes();
                        !name.starts_with(b".") || name.starts_with(b"..")
                    }
                    _ => true,
                })
            }),
            Scope::Entries { dir, names } => {
                path == dir
                    || (path.parent() == Some(dir)
                        && path
                            .file_name()
                            .is_some_and(|n| names.iter().any(|m| m == n)))
            }
        }
    }
}

/// Coalesces a burst of events into one reload: due [`QUIET`] after the last
/// event, and at most [`MAX_DELAY`] after the first. Time is passed in.
#[derive(Debug, Default)]
struct Debounce {
    /// The first and the last event of the pending burst.
    burst: Option<(Instant, Instant)>,
}

impl Debounce {
    /// Notes an event at `now`.
    fn event(&mut self, now: Instant) {
        let first = self.burst.map_or(now, |(first, _)| first);
        self.burst = Some((first, now));
    }

    /// When the pending burst should be reloaded; `None` when none is pending.
    fn due(&self) -> Option<Instant> {
        self.burst
            .map(|(first, last)| (last + QUIET).min(first + MAX_DELAY))
    }

    /// Forgets the pending burst: a reload is starting.
    fn clear(&mut self) {
        self.burst = None;
    }
}

#[cfg(test)]
mod tests;
