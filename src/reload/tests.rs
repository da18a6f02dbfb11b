//! The reloader's tests: debouncing, which file events count, and what is watched.

use super::*;
use notify::event::{CreateKind, DataChange, ModifyKind, RemoveKind, RenameMode};

const MS: Duration = Duration::from_millis(1);

#[test]
fn a_burst_is_due_a_quiet_period_after_its_last_event() {
    let t0 = Instant::now();
    let mut d = Debounce::default();
    assert_eq!(d.due(), None);
    d.event(t0);
    assert_eq!(d.due(), Some(t0 + QUIET));
    d.event(t0 + 100 * MS);
    d.event(t0 + 200 * MS);
    assert_eq!(d.due(), Some(t0 + 200 * MS + QUIET));
    d.clear();
    assert_eq!(d.due(), None);
    d.event(t0 + 900 * MS);
    assert_eq!(d.due(), Some(t0 + 900 * MS + QUIET));
}

#[test]
fn a_burst_that_never_stops_is_due_after_the_max_delay() {
    let t0 = Instant::now();
    let mut d = Debounce::default();
    let mut t = t0;
    while t < t0 + 10 * MAX_DELAY {
        d.event(t);
        t += QUIET / 2;
    }
    assert_eq!(d.due(), Some(t0 + MAX_DELAY));
}

fn event(kind: EventKind, path: &str) -> Event {
    Event::new(kind).add_path(PathBuf::from(path))
}

fn modify(path: &str) -> Event {
    event(EventKind::Modify(ModifyKind::Data(DataChange::Any)), path)
}

fn tree() -> Vec<Scope> {
    vec![Scope::Tree("/etc/rules".into())]
}

#[test]
fn reads_never_count_and_closing_a_written_file_does() {
    let read = |mode| event(EventKind::Access(mode), "/etc/rules/x.yaml");
    assert!(!counts(&tree(), &read(AccessKind::Open(AccessMode::Any))));
    assert!(!counts(&tree(), &read(AccessKind::Close(AccessMode::Read))));
    assert!(!counts(&tree(), &read(AccessKind::Read)));
    assert!(counts(&tree(), &read(AccessKind::Close(AccessMode::Write))));
}

#[test]
fn in_a_tree_hidden_names_do_not_count_but_configmap_names_do() {
    for path in [
        "/etc/rules/x.yaml",
        "/etc/rules/team/x.yml",
        "/etc/rules/team",
        "/etc/rules/notes.txt",
        "/etc/rules/..data",
        "/etc/rules/..data_tmp",
        "/etc/rules/..2026_01_01_00_00_00.123/x.yaml",
        "/etc/rules",
    ] {
        assert!(counts(&tree(), &modify(path)), "{path}");
    }
    for path in [
        "/etc/rules/.x.yaml.swp",
        "/etc/rules/.git/config",
        "/etc/rules/team/.hidden/x.yaml",
        "/etc/other/x.yaml",
        "/etc/rules-old/x.yaml",
    ] {
        assert!(!counts(&tree(), &modify(path)), "{path}");
    }
}

#[test]
fn a_rename_counts_when_either_name_does() {
    let rename = Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Both)))
        .add_path("/etc/rules/x.yaml.tmp".into())
        .add_path("/etc/rules/x.yaml".into());
    let file = vec![Scope::Entries {
        dir: "/etc/rules".into(),
        names: vec!["x.yaml".into()],
    }];
    assert!(counts(&file, &rename));
}

#[test]
fn for_a_file_only_its_names_and_its_directory_count() {
    let file = vec![Scope::Entries {
        dir: "/etc/rules".into(),
        names: vec!["x.yaml".into(), "..data".into()],
    }];
    for path in ["/etc/rules/x.yaml", "/etc/rules/..data", "/etc/rules"] {
        assert!(counts(&file, &modify(path)), "{path}");
    }
    for path in [
        "/etc/rules/y.yaml",
        "/etc/rules/x.yaml.tmp",
        "/etc/rules/sub/x.yaml",
        "/etc/x.yaml",
    ] {
        assert!(!counts(&file, &modify(path)), "{path}");
    }
    let created = event(EventKind::Create(CreateKind::File), "/etc/rules/x.yaml");
    let removed = event(EventKind::Remove(RemoveKind::File), "/etc/rules/x.yaml");
    assert!(counts(&file, &created) && counts(&file, &removed));
}

#[test]
fn a_rescan_or_an_event_without_paths_counts() {
    let rescan = Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan);
    assert!(counts(&tree(), &rescan));
    assert!(counts(&tree(), &Event::new(EventKind::Any)));
}

#[test]
fn a_file_symlinked_into_a_configmap_also_watches_the_link_head_and_the_target() -> io::Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = std::path::absolute(tmp.path())?;
    std::fs::create_dir(root.join("..2026_a"))?;
    std::fs::write(root.join("..2026_a/x.yaml"), "domain: x\n")?;
    std::os::unix::fs::symlink("..2026_a", root.join("..data"))?;
    std::os::unix::fs::symlink("..data/x.yaml", root.join("x.yaml"))?;
    let real = std::fs::canonicalize(root.join("..2026_a"))?;
    assert_eq!(
        scopes(&[root.join("x.yaml"), root.clone()])?,
        [
            Scope::Entries {
                dir: root.clone(),
                names: vec!["x.yaml".into(), "..data".into()],
            },
            Scope::Entries {
                dir: real,
                names: vec!["x.yaml".into()],
            },
            Scope::Tree(root.clone()),
        ]
    );
    Ok(())
}

#[test]
fn each_directory_is_watched_once_and_recursively_when_any_scope_needs_it() {
    let entries = |dir: &str| Scope::Entries {
        dir: dir.into(),
        names: vec!["x.yaml".into()],
    };
    let dirs = dirs(&[
        entries("/etc/rules"),
        Scope::Tree("/etc/rules".into()),
        entries("/etc/rules/..2026_a"),
        Scope::Tree("/etc/rules/team".into()),
        entries("/etc/rules-old"),
        entries("/opt"),
        entries("/opt"),
    ]);
    assert_eq!(
        dirs.into_iter().collect::<Vec<_>>(),
        [
            ("/etc/rules".into(), RecursiveMode::Recursive),
            ("/etc/rules-old".into(), RecursiveMode::NonRecursive),
            ("/opt".into(), RecursiveMode::NonRecursive),
        ]
    );
}

#[test]
fn a_missing_file_is_watched_for_in_its_directory() -> io::Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = std::path::absolute(tmp.path())?;
    assert_eq!(
        scopes(&[root.join("later.yaml")])?,
        [Scope::Entries {
            dir: root,
            names: vec!["later.yaml".into()],
        }]
    );
    Ok(())
}
