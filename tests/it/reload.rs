//! Rules hot reload against real files and real inotify: in-place edits,
//! editors' write-then-rename, Kubernetes ConfigMap `..data` swaps, new files,
//! broken files, SIGHUP, and the debounce of event storms.
//!
//! No test sleeps for time: each waits for the next reload (bounded by
//! [`TIMEOUT`], which only matters when a reload never comes).
//!
//! SIGHUP is process-wide: once a test has called `watch`, a SIGHUP reaches
//! every watcher running in this binary. Only `sighup_reloads` sends one, and
//! only after its own `watch` has installed the handler (so the signal can
//! never kill the test process); the other tests tell such reloads apart by
//! their trigger or ignore them.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sluice::reload::{Reload, Trigger, watch};
use sluice::rules::{RuleSet, RulesSource};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a test waits for a reload before failing.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A rules file for `domain` limiting key `k` to `requests` per second.
fn rules(domain: &str, requests: u32) -> String {
    format!(
        "domain: {domain}\n\
         descriptors:\n  \
           - key: k\n    \
             rate_limit:\n      \
               unit: second\n      \
               requests_per_unit: {requests}\n"
    )
}

/// The limit of the only rule of `domain`, if the domain is loaded.
fn limit(rules: &RuleSet, domain: &str) -> Option<u64> {
    let domain = rules.domain(domain)?;
    Some(domain.rules().first()?.limits.first()?.spec.requests)
}

/// Whether `reload` loaded `domain` with a limit of `requests`.
fn loaded(reload: &Reload, domain: &str, requests: u64) -> bool {
    reload
        .result
        .as_ref()
        .is_ok_and(|r| limit(r, domain) == Some(requests))
}

/// A running watch whose outcomes arrive on a channel.
struct Watched {
    reloads: mpsc::UnboundedReceiver<Reload>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Watched {
    fn start(source: RulesSource) -> Self {
        let (tx, reloads) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let task = watch(
            source,
            move |reload| {
                let _ = tx.send(reload);
            },
            shutdown.clone(),
        )
        .expect("watch starts");
        Self {
            reloads,
            shutdown,
            task,
        }
    }

    fn paths(paths: &[&Path]) -> Self {
        Self::start(RulesSource::Paths(
            paths.iter().map(|p| p.to_path_buf()).collect(),
        ))
    }

    /// Reloads, in order, until one for which `wanted` holds; fails after
    /// [`TIMEOUT`], showing the last outcome seen.
    async fn until(&mut self, what: &str, mut wanted: impl FnMut(&Reload) -> bool) -> Reload {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let mut last = None;
        loop {
            match tokio::time::timeout_at(deadline, self.reloads.recv()).await {
                Ok(Some(reload)) if wanted(&reload) => return reload,
                Ok(Some(reload)) => last = Some(reload),
                Ok(None) => panic!("the watch stopped before {what}"),
                Err(_) => panic!("no reload with {what} within {TIMEOUT:?}; last: {last:#?}"),
            }
        }
    }

    /// Stops the watch and waits for its task to end.
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(TIMEOUT, self.task)
            .await
            .expect("the watch stops when shut down")
            .expect("the watch task does not panic");
    }
}

/// A temporary directory whose path is absolute.
fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// Each way of naming `file` as a rules source: the file itself, and its
/// directory.
fn sources(file: &Path) -> [PathBuf; 2] {
    [file.to_path_buf(), file.parent().unwrap().to_path_buf()]
}

#[tokio::test(flavor = "multi_thread")]
async fn editing_a_file_in_place_reloads_it() {
    for n in 0..2 {
        let tmp = tempdir();
        let file = tmp.path().join("x.yaml");
        fs::write(&file, rules("x", 1)).unwrap();
        let source = &sources(&file)[n];
        let mut watched = Watched::paths(&[source]);

        fs::write(&file, rules("x", 2)).unwrap();
        let reload = watched.until("x limited to 2", |r| loaded(r, "x", 2)).await;
        assert_eq!(reload.trigger, Trigger::FileChange, "{}", source.display());
        watched.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn replacing_a_file_by_rename_reloads_it() {
    for n in 0..2 {
        let tmp = tempdir();
        let file = tmp.path().join("x.yaml");
        fs::write(&file, rules("x", 1)).unwrap();
        let mut watched = Watched::paths(&[&sources(&file)[n]]);

        // What editors do on save: the new content never appears half written.
        let temp = tmp.path().join("x.yaml.tmp");
        fs::write(&temp, rules("x", 2)).unwrap();
        fs::rename(&temp, &file).unwrap();
        watched.until("x limited to 2", |r| loaded(r, "x", 2)).await;

        // And a second time: a watch on the replaced file itself would have
        // been lost with it.
        fs::write(&temp, rules("x", 3)).unwrap();
        fs::rename(&temp, &file).unwrap();
        watched.until("x limited to 3", |r| loaded(r, "x", 3)).await;
        watched.stop().await;
    }
}

/// A ConfigMap volume as the kubelet lays it out: the files live in a
/// timestamped directory, `..data` points at it, and each visible name is a
/// symlink through `..data`.
fn configmap(root: &Path, files: &[(&str, String)]) {
    fs::create_dir(root.join("..2026_a")).unwrap();
    for (name, text) in files {
        fs::write(root.join("..2026_a").join(name), text).unwrap();
        symlink(format!("..data/{name}"), root.join(name)).unwrap();
    }
    symlink("..2026_a", root.join("..data")).unwrap();
}

/// A ConfigMap update as the kubelet makes it: write a new timestamped
/// directory and re-point `..data` atomically by renaming a new symlink over
/// it. (The kubelet then removes the old directory: see [`remove_old`].)
fn update_configmap(root: &Path, files: &[(&str, String)]) {
    let new = root.join("..2026_b");
    fs::create_dir(&new).unwrap();
    for (name, text) in files {
        fs::write(new.join(name), text).unwrap();
    }
    symlink("..2026_b", root.join("..data_tmp")).unwrap();
    fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
}

/// The end of a ConfigMap update, done by the tests only once the reload is
/// seen, so that the swap alone must have caused it.
fn remove_old(root: &Path) {
    fs::remove_dir_all(root.join("..2026_a")).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_configmap_data_swap_reloads_the_new_content() {
    let tmp = tempdir();
    configmap(tmp.path(), &[("x.yaml", rules("x", 1))]);
    let mut watched = Watched::paths(&[tmp.path()]);
    // Served through the visible symlink, not twice through the hidden names.
    let first = RulesSource::Paths(vec![tmp.path().into()]).load().unwrap();
    assert_eq!(limit(&first, "x"), Some(1));

    update_configmap(tmp.path(), &[("x.yaml", rules("x", 2))]);
    let reload = watched.until("x limited to 2", |r| loaded(r, "x", 2)).await;
    assert_eq!(reload.trigger, Trigger::FileChange);
    remove_old(tmp.path());
    watched.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_configmap_data_swap_reloads_a_file_named_through_it() {
    let tmp = tempdir();
    configmap(tmp.path(), &[("x.yaml", rules("x", 1))]);
    let mut watched = Watched::paths(&[&tmp.path().join("x.yaml")]);

    update_configmap(tmp.path(), &[("x.yaml", rules("x", 2))]);
    watched.until("x limited to 2", |r| loaded(r, "x", 2)).await;
    remove_old(tmp.path());

    // The watches follow `..data` to its new target: an in-place edit there
    // (which the kubelet never makes, but an operator might) is seen too.
    fs::write(tmp.path().join("..2026_b/x.yaml"), rules("x", 3)).unwrap();
    watched.until("x limited to 3", |r| loaded(r, "x", 3)).await;
    watched.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broken_file_yields_its_errors_and_a_fix_yields_the_rules() {
    let tmp = tempdir();
    let file = tmp.path().join("x.yaml");
    fs::write(&file, rules("x", 1)).unwrap();
    let mut watched = Watched::paths(&[tmp.path()]);

    let broken = rules("x", 1).replace("unit: second", "unit: fortnight");
    fs::write(&file, &broken).unwrap();
    let reload = watched
        .until("an error about the unit", |r| {
            r.result
                .as_ref()
                .is_err_and(|errors| errors.iter().any(|e| e.message.contains("fortnight")))
        })
        .await;
    let errors = reload.result.unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let error = &errors[0];
    assert_eq!(error.file, file.display().to_string());
    assert_eq!(
        error.line,
        1 + broken
            .lines()
            .position(|l| l.contains("fortnight"))
            .unwrap()
    );
    assert_eq!(error.path, "x/k");
    assert!(
        error
            .to_string()
            .starts_with(&format!("{}:{}: x/k: ", file.display(), error.line)),
        "{error}"
    );

    fs::write(&file, rules("x", 4)).unwrap();
    watched
        .until("the fixed rules", |r| loaded(r, "x", 4))
        .await;
    watched.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_alias_bomb_or_a_nul_byte_dropped_in_is_refused_with_its_file_and_line() {
    let tmp = tempdir();
    fs::write(tmp.path().join("x.yaml"), rules("x", 1)).unwrap();
    let mut watched = Watched::paths(&[tmp.path()]);

    // Each level lists nine aliases of the one before: 9^9 scalars from a
    // few hundred bytes, were they expanded.
    let mut bomb = String::from("domain: bomb\na0: &a0 [l, l, l, l, l, l, l, l, l]\n");
    for level in 1..=9 {
        let aliases = vec![format!("*a{}", level - 1); 9].join(", ");
        bomb.push_str(&format!("a{level}: &a{level} [{aliases}]\n"));
    }
    bomb.push_str("descriptors: *a9\n");
    let bomb_file = tmp.path().join("bomb.yaml");
    fs::write(&bomb_file, &bomb).unwrap();
    let reload = watched
        .until("the bomb refused", |r| r.result.is_err())
        .await;
    let errors = reload.result.unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].file, bomb_file.display().to_string());
    assert!(
        errors[0]
            .message
            .contains("rules file expands YAML aliases beyond 16777216 bytes"),
        "{errors:#?}"
    );
    fs::remove_file(&bomb_file).unwrap();
    watched
        .until("the rules without the bomb", |r| loaded(r, "x", 1))
        .await;

    // A NUL would have ended the file before the limit of 3: refused whole.
    let cut = rules("x", 3).replace("  - key: k", "\0  - key: k");
    fs::write(tmp.path().join("x.yaml"), &cut).unwrap();
    let reload = watched
        .until("the NUL refused", |r| r.result.is_err())
        .await;
    let errors = reload.result.unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].line, 3, "{errors:#?}");
    assert!(errors[0].message.contains("U+0000"), "{errors:#?}");
    watched.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_file_in_a_watched_directory_adds_its_domain() {
    let tmp = tempdir();
    fs::write(tmp.path().join("a.yaml"), rules("a", 1)).unwrap();
    let mut watched = Watched::paths(&[tmp.path()]);

    fs::write(tmp.path().join("b.yaml"), rules("b", 2)).unwrap();
    watched
        .until("domains a and b", |r| {
            loaded(r, "a", 1) && loaded(r, "b", 2)
        })
        .await;

    // And in a new subdirectory, which the recursive watch picks up.
    fs::create_dir(tmp.path().join("team")).unwrap();
    fs::write(tmp.path().join("team/c.yaml"), rules("c", 3)).unwrap();
    watched
        .until("domains a, b and c", |r| {
            loaded(r, "a", 1) && loaded(r, "b", 2) && loaded(r, "c", 3)
        })
        .await;
    fs::write(tmp.path().join("team/c.yaml"), rules("c", 4)).unwrap();
    watched.until("c limited to 4", |r| loaded(r, "c", 4)).await;
    watched.stop().await;
}

/// SIGHUP reaches every watcher in this process; see the module docs.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads() {
    // Built-in rules: nothing is watched, yet SIGHUP reloads them.
    let mut watched = Watched::start(RulesSource::Builtin);
    // `watch` has installed the handler: the signal cannot kill the process.
    let status = Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let reload = watched
        .until("a SIGHUP reload", |r| r.trigger == Trigger::Signal)
        .await;
    assert!(
        reload
            .result
            .is_ok_and(|rules| rules.domain("example").is_some())
    );
    watched.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_storm_is_coalesced_into_few_reloads() {
    let tmp = tempdir();
    let file = tmp.path().join("x.yaml");
    let text = rules("x", 1);
    fs::write(&file, &text).unwrap();
    let mut watched = Watched::paths(&[tmp.path()]);

    const WRITES: usize = 200;
    let started = Instant::now();
    for _ in 0..WRITES {
        fs::write(&file, &text).unwrap();
    }
    // The marker ends the storm: every event before it has been seen once a
    // reload includes it.
    fs::write(tmp.path().join("marker.yaml"), rules("marker", 1)).unwrap();
    let storm = started.elapsed();

    let mut reloads = 0;
    watched
        .until("the marker", |r| {
            // SIGHUP reloads from `sighup_reloads` are not this storm's.
            if r.trigger == Trigger::FileChange {
                reloads += 1;
            }
            loaded(r, "marker", 1)
        })
        .await;
    // One reload when the storm fits in the quiet period, as it does on any
    // machine; one per `MAX_DELAY` or per stall longer than `QUIET` else.
    assert!(
        reloads <= 3,
        "{WRITES} writes in {storm:?} caused {reloads} reloads"
    );
    watched.stop().await;
}

#[test]
fn watching_a_file_in_a_missing_directory_is_an_error() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();
    let tmp = tempdir();
    let missing = tmp.path().join("nowhere/x.yaml");
    let error = watch(
        RulesSource::Paths(vec![missing]),
        |_| {},
        CancellationToken::new(),
    )
    .expect_err("the directory does not exist");
    assert!(
        error.to_string().contains("nowhere"),
        "the error names the path: {error}"
    );
}
