//! The crate's import graph, read from `src/` (`scan`), against the layering
//! CONTRIBUTING.md writes down: no cycle between modules, each top-level
//! module importing only lower layers, the generated protobuf and the Redis
//! client seen only where they belong, and a pure core. The tables below are
//! the rules; CONTRIBUTING.md must carry them word for word.

use super::*;

mod scan;

use scan::{Graph, Import, ModPath, Target};

/// The top-level modules, lowest layer first; a module imports only modules
/// of lower layers (never one of its own layer).
const LAYERS: &[(&[&str], &str)] = &[
    (
        &["limiter", "proto", "certs"],
        "the pure core, the generated protobuf, PEM files: nothing of the crate",
    ),
    (&["request"], "the domain request"),
    (&["rules"], "rules: parsed, compiled, matched"),
    (
        &["telemetry"],
        "logs, traces, metrics, upstream's stats: recorded from every layer above",
    ),
    (&["store", "reload"], "counters; rules reloads"),
    (&["overlimit"], "the local over-limit cache"),
    (
        &["decision"],
        "a request's decision: rules, one store batch, statuses",
    ),
    (&["headers"], "rate-limit response headers"),
    (
        &["service", "rlqs", "xds", "query"],
        "the protocol adapters and the query client",
    ),
    (&["server", "bench"], "the listeners; the load generator"),
    (&["settings"], "every setting, and upstream's variables"),
    (&["app", "cli"], "the composition root; the command line"),
];

/// What only some modules may see: crates, or modules of this crate
/// (`crate::…`), and the modules (with what is below them) that may.
const ONLY: &[(&str, &[&str], &[&str])] = &[
    (
        "the generated protobuf",
        &["crate::proto", "prost", "prost_types"],
        &[
            "service",
            "server",
            "rlqs::service",
            "xds",
            "query",
            "bench",
        ],
    ),
    ("the Redis client", &["redis"], &["store::redis"]),
];

/// The core: functions of their arguments, no IO runtime, no wire format,
/// no command line.
const CORE: &[&str] = &["limiter", "request", "rules", "overlimit", "decision"];
const CORE_NEVER: &[&str] = &[
    "tokio",
    "tokio_util",
    "tokio_stream",
    "tonic",
    "prost",
    "prost_types",
    "crate::proto",
    "redis",
    "axum",
    "hyper",
    "clap",
    "notify",
];

/// Parents whose own file holds the vocabulary their files share (errors,
/// the `Limiter`, the algorithms' arithmetic, setting keys, metric labels)
/// and that call those files: the files import the parent and the parent
/// imports them, inside one module.
const SHARED_PARENTS: &[&str] = &[
    "decision",
    "limiter::algorithm",
    "query",
    "settings",
    "settings::upstream",
    "store::memory",
    "telemetry::metrics",
];

/// Imports the checks let through for now, each with why: `(from, to, why)`,
/// matching every import from a module under `from` to one under `to`.
const EXCEPTIONS: &[(&str, &str, &str)] = &[];

fn name(path: &[String]) -> String {
    if path.is_empty() {
        "crate".to_string()
    } else {
        path.join("::")
    }
}

fn under(path: &[String], prefix: &str) -> bool {
    let prefix: Vec<&str> = prefix.split("::").collect();
    path.len() >= prefix.len() && path.iter().zip(&prefix).all(|(a, b)| a == b)
}

fn excepted(import: &Import) -> bool {
    let Target::Module(to) = &import.to else {
        return false;
    };
    EXCEPTIONS
        .iter()
        .any(|(from, target, _)| under(&import.from, from) && under(to, target))
}

fn at(import: &Import) -> String {
    format!("{}:{} `{}`", import.file, import.line, import.text)
}

// ---------------------------------------------------------------------------
// Cycles
// ---------------------------------------------------------------------------

/// Edges between the children of each module (the top-level modules are
/// the crate root's children): an import from `a::x::…` to `a::y::…` is an
/// edge `a::x` → `a::y` under `a`.
type Edges<'g> = BTreeMap<ModPath, BTreeMap<(ModPath, ModPath), &'g Import>>;

fn sibling_edges(graph: &Graph) -> Edges<'_> {
    let mut out: Edges = BTreeMap::new();
    for import in graph.imports.iter().filter(|i| !excepted(i)) {
        let Target::Module(to) = &import.to else {
            continue;
        };
        let common = import
            .from
            .iter()
            .zip(to)
            .take_while(|(a, b)| a == b)
            .count();
        if import.from.len() > common && to.len() > common {
            out.entry(import.from[..common].to_vec())
                .or_default()
                .entry((import.from[..=common].to_vec(), to[..=common].to_vec()))
                .or_insert(import);
        }
    }
    out
}

/// One cycle through `start`, if any, as the imports along it.
fn cycle_from<'g>(
    edges: &BTreeMap<(ModPath, ModPath), &'g Import>,
    start: &ModPath,
) -> Option<Vec<(ModPath, &'g Import)>> {
    // Breadth first, so the cycle printed is a shortest one.
    let mut came: BTreeMap<ModPath, (ModPath, &Import)> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.clone()]);
    while let Some(node) = queue.pop_front() {
        for ((from, to), import) in edges.range((node.clone(), Vec::new())..) {
            if *from != node {
                break;
            }
            if to == start {
                let mut path = vec![(to.clone(), *import)];
                let mut at = node.clone();
                while at != *start {
                    let (prev, import) = came[&at].clone();
                    path.push((at, import));
                    at = prev;
                }
                path.reverse();
                return Some(path);
            }
            if !came.contains_key(to) {
                came.insert(to.clone(), (node.clone(), *import));
                queue.push_back(to.clone());
            }
        }
    }
    None
}

/// Every cycle between the top-level modules, and between the files of any
/// one module, once each (by its set of modules).
fn cycles(graph: &Graph) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for edges in sibling_edges(graph).values() {
        let nodes: BTreeSet<&ModPath> = edges.keys().map(|(from, _)| from).collect();
        for node in nodes {
            let Some(cycle) = cycle_from(edges, node) else {
                continue;
            };
            let members: BTreeSet<ModPath> = cycle.iter().map(|(m, _)| m.clone()).collect();
            if !seen.insert(members) {
                continue;
            }
            let mut text = format!("cycle: {}", name(node));
            for (to, import) in &cycle {
                text += &format!("\n    -> {}  ({})", name(to), at(import));
            }
            out.push(text);
        }
    }
    out
}

/// A module and one of its own files importing each other, outside
/// [`SHARED_PARENTS`]. `pub use` of a file by its parent is the parent's
/// interface, not a use.
fn parent_child_cycles(graph: &Graph) -> Vec<String> {
    let mut up: BTreeMap<(ModPath, ModPath), &Import> = BTreeMap::new();
    let mut down: BTreeMap<(ModPath, ModPath), &Import> = BTreeMap::new();
    for import in graph.imports.iter().filter(|i| !excepted(i)) {
        let Target::Module(to) = &import.to else {
            continue;
        };
        let from = &import.from;
        if from.len() > to.len() && from.starts_with(to) {
            let child = from[..=to.len()].to_vec();
            up.entry((to.clone(), child)).or_insert(import);
        } else if to.len() > from.len() && to.starts_with(from) && !import.reexport {
            let child = to[..=from.len()].to_vec();
            down.entry((from.clone(), child)).or_insert(import);
        }
    }
    down.iter()
        .filter(|((parent, _), _)| !SHARED_PARENTS.contains(&name(parent).as_str()))
        .filter_map(|(pair, d)| {
            let u = up.get(pair)?;
            Some(format!(
                "cycle: {} <-> {}\n    down: {}\n    up:   {}",
                name(&pair.0),
                name(&pair.1),
                at(d),
                at(u)
            ))
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Layers and walls
// ---------------------------------------------------------------------------

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(mods, _)| mods.contains(&module))
}

/// What an import names, as the tables write it: `tokio`, `crate::proto`.
fn written(to: &Target) -> String {
    match to {
        Target::Crate(krate) => krate.clone(),
        Target::Module(path) => format!("crate::{}", path.join("::")),
    }
}

fn names(to: &Target, entry: &str) -> bool {
    match (to, entry.strip_prefix("crate::")) {
        (Target::Module(path), Some(module)) => under(path, module),
        (Target::Crate(krate), None) => krate == entry,
        _ => false,
    }
}

fn layering_violations(graph: &Graph) -> Vec<String> {
    // One line per breach, at its first import.
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for module in graph.modules.keys().filter(|m| m.len() == 1) {
        if layer_of(&module[0]).is_none() {
            out.insert(
                format!("{} is in no layer", module[0]),
                "add it to LAYERS (and to CONTRIBUTING.md)".into(),
            );
        }
    }
    for import in graph.imports.iter().filter(|i| !excepted(i)) {
        let Some(top) = import.from.first() else {
            continue;
        };
        if let Target::Module(to) = &import.to
            && let Some(target) = to.first()
            && target != top
            && let (Some(a), Some(b)) = (layer_of(top), layer_of(target))
            && a <= b
        {
            out.entry(format!("{top} (layer {a}) imports {target} (layer {b})"))
                .or_insert_with(|| at(import));
        }
        for (what, entries, users) in ONLY {
            let own = matches!(&import.to, Target::Module(to) if to.first() == Some(top));
            if entries.iter().any(|e| names(&import.to, e))
                && !own
                && !users.iter().any(|u| under(&import.from, u))
            {
                out.entry(format!(
                    "{} uses {what} ({}), which only {} may",
                    name(&import.from),
                    written(&import.to),
                    users.join(", "),
                ))
                .or_insert_with(|| at(import));
            }
        }
        if CORE.iter().any(|c| **c == **top) && CORE_NEVER.iter().any(|e| names(&import.to, e)) {
            out.entry(format!(
                "{} is core and imports {}",
                name(&import.from),
                written(&import.to),
            ))
            .or_insert_with(|| at(import));
        }
    }
    out.into_iter()
        .map(|(what, at)| format!("{what}: {at}"))
        .collect()
}

// ---------------------------------------------------------------------------
// The tables as CONTRIBUTING.md writes them
// ---------------------------------------------------------------------------

fn code(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("`{i}`")).collect();
    quoted.join(", ")
}

/// The three tables, in Markdown.
fn tables() -> Vec<String> {
    let mut layers = String::from("| Layer | Modules | What they are |\n|---|---|---|\n");
    for (index, (mods, what)) in LAYERS.iter().enumerate().rev() {
        layers += &format!("| {index} | {} | {what} |\n", code(mods));
    }
    let mut only = String::from("| What | Used only in |\n|---|---|\n");
    for (what, entries, users) in ONLY {
        only += &format!("| {what}: {} | {} |\n", code(entries), code(users));
    }
    let core = format!(
        "| Modules | Never import |\n|---|---|\n| {} | {} |\n",
        code(CORE),
        code(CORE_NEVER)
    );
    vec![layers, only, core]
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

fn crate_graph() -> Graph {
    scan::read_crate(repo())
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = crate_graph();
    let mut found = cycles(&graph);
    found.extend(parent_child_cycles(&graph));
    assert!(
        found.is_empty(),
        "import cycles in src/ (break them, or list one in EXCEPTIONS of \
         tests/deploy/layering.rs with why):\n\n{}",
        found.join("\n\n")
    );
}

#[test]
fn every_import_keeps_the_written_layering() {
    let found = layering_violations(&crate_graph());
    assert!(
        found.is_empty(),
        "imports that break the layering of CONTRIBUTING.md:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn contributing_writes_down_the_layering_the_test_enforces() {
    let contributing = read(&repo().join("CONTRIBUTING.md"));
    for table in tables() {
        assert!(
            contributing.contains(&table),
            "CONTRIBUTING.md must carry this table as tests/deploy/layering.rs \
             enforces it:\n\n{table}"
        );
    }
}

/// The reader itself: it must see the imports the checks rely on, or they
/// would pass on an empty graph.
#[test]
fn the_import_reader_sees_paths_and_skips_comments_and_strings() {
    let graph = crate_graph();
    let edge = |from: &str, to: &Target| {
        graph
            .imports
            .iter()
            .any(|i| name(&i.from) == from && i.to == *to)
    };
    let module = |path: &str| Target::Module(path.split("::").map(String::from).collect());
    assert!(edge("rules", &module("limiter")), "rules -> limiter");
    assert!(edge("decision::plan", &module("decision")), "super::");
    assert!(
        edge("store::redis", &Target::Crate("redis".into())),
        "the redis crate beside the store::redis module"
    );
    assert!(
        graph
            .modules
            .contains_key(&vec!["store".to_string(), "redis".to_string()])
    );
    // What sits in comments, strings and character literals is not a path.
    let source = r##"
        // crate::in_line_comment
        /* crate::in_block /* nested */ crate::still_in_block */
        let s = "crate::in_string \" crate::still_in_string";
        let r = r#"crate::in_raw_string"#;
        let c = '"';
        fn f<'a>(x: &'a str) -> crate::real::Type { crate::other::call(x) }
        use crate::{a::{b, c as d}, e::*};
    "##;
    assert_eq!(
        scan::paths_in(source),
        [
            "crate::real::Type",
            "crate::other::call",
            "crate::a::b",
            "crate::a::c",
            "crate::e"
        ]
    );
    for (module, _) in LAYERS
        .iter()
        .flat_map(|(m, w)| m.iter().map(move |m| (m, w)))
    {
        assert!(
            graph.modules.contains_key(&vec![module.to_string()]),
            "LAYERS names {module}, which src/ does not have"
        );
    }
}
