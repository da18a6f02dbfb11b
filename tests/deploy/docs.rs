//! The documentation's code blocks: every fenced block of README.md and of
//! the manual (docs/src/) is either checked or marked, so nothing that looks
//! runnable is not.
//!
//! The convention (the manual's introduction states it for readers):
//! - ```` ```yaml ```` is a whole rules file, run through `sluice
//!   check-config`; or, after an `<!-- envoy-test: NAME -->` comment, an Envoy
//!   configuration that tests/envoy/rls.rs runs through a real Envoy (that file's
//!   own test checks every such name is used); ```` ```yaml excerpt ```` is a
//!   piece of a larger file, only read.
//! - ```` ```sh ```` and ```` ```console ```` hold commands a test runs, each
//!   listed in [`RUN_BY_TESTS`] with the test that runs it;
//!   ```` ```sh illustrative ```` marks commands no test runs (a cluster, a
//!   Redis of the reader's, a long benchmark).
//! - Every fence names its language, so a shell block cannot hide as an
//!   unlabelled one.

use super::*;

/// Shell commands the pages show unmarked, each with the file that runs it
/// and text of that file showing it does: the test function, or the
/// arguments it passes.
const RUN_BY_TESTS: &[(&str, &str, &str)] = &[
    // The quick start: the binary with no options serves the example rules.
    (
        "cargo run --release -- serve",
        "tests/it/wire_and_binary.rs",
        "fn the_binary_serves_the_example_rules_with_no_options_and_query_prints_the_decision",
    ),
    (
        "cargo run --release -- query --domain example --descriptor remote_address=192.0.2.7",
        "tests/it/wire_and_binary.rs",
        "query(\"remote_address=192.0.2.7\")",
    ),
    // The whole suite: CI's only command.
    ("tests/run", ".ci/run", "exec tests/run"),
];

const SHELLS: &[&str] = &["sh", "bash", "shell", "console"];

/// One fenced code block of a page.
#[derive(Debug)]
struct Block {
    /// The page, relative to the repository, and the fence's line.
    at: String,
    lang: String,
    marks: Vec<String>,
    text: String,
    /// The name of the `<!-- envoy-test: NAME -->` comment just before it.
    envoy_test: Option<String>,
}

/// README.md and every page of the manual.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![repo().join("README.md")];
    walk(&repo().join("docs/src"), &mut out);
    out
}

/// The fenced blocks of one page (```` ``` ```` fences, indented or not).
fn blocks(path: &Path) -> Vec<Block> {
    let text = read(path);
    let rel = path.strip_prefix(repo()).unwrap().display().to_string();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        // As CommonMark: a backtick fence's info string has no backtick
        // (so inline code such as ```` ```sh ```` opens nothing).
        let Some(info) = trimmed
            .strip_prefix("```")
            .filter(|info| !info.contains('`'))
        else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        let mut words = info.split_whitespace().map(str::to_owned);
        let lang = words.next().unwrap_or_default();
        let marks: Vec<String> = words.collect();
        let envoy_test = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().strip_prefix("<!-- envoy-test: "))
            .and_then(|l| l.strip_suffix(" -->"))
            .map(str::to_owned);
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && lines[i].trim() != "```" {
            body.push(lines[i].get(indent..).unwrap_or(lines[i].trim_start()));
            i += 1;
        }
        assert!(i < lines.len(), "{rel}:{}: the block never ends", start + 1);
        out.push(Block {
            at: format!("{rel}:{}", start + 1),
            lang,
            marks,
            text: body.join("\n") + "\n",
            envoy_test,
        });
        i += 1;
    }
    out
}

fn all_blocks() -> Vec<Block> {
    let blocks: Vec<Block> = pages().iter().flat_map(|p| blocks(p)).collect();
    assert!(blocks.len() >= 30, "found only {} blocks", blocks.len());
    blocks
}

/// The commands of a shell block: `$ ` lines of a console transcript, or
/// every non-comment line of a script with its `\` continuations joined.
fn commands(block: &Block) -> Vec<String> {
    if block.lang == "console" {
        return block
            .text
            .lines()
            .filter_map(|l| l.strip_prefix("$ "))
            .map(|c| c.trim().to_owned())
            .collect();
    }
    let mut out = Vec::new();
    let mut current = String::new();
    for line in block.text.lines() {
        let line = line.trim();
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                out.push(std::mem::take(&mut current).trim().to_owned());
            }
        }
    }
    out
}

#[test]
fn every_fence_names_its_language_and_only_known_marks() {
    for block in all_blocks() {
        assert!(
            !block.lang.is_empty(),
            "{}: a fence without a language",
            block.at
        );
        let allowed: &[&str] = match block.lang.as_str() {
            "yaml" | "yml" => &["excerpt"],
            l if SHELLS.contains(&l) => &["illustrative"],
            _ => &[],
        };
        for mark in &block.marks {
            assert!(
                allowed.contains(&mark.as_str()),
                "{}: ```{} does not take the mark {mark:?} (it takes {allowed:?})",
                block.at,
                block.lang
            );
        }
    }
}

#[test]
fn every_rules_block_passes_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for block in all_blocks() {
        if !matches!(block.lang.as_str(), "yaml" | "yml")
            || block.marks.iter().any(|m| m == "excerpt")
        {
            continue;
        }
        let is_envoy = block.text.contains("type.googleapis.com/envoy.");
        match &block.envoy_test {
            // Envoy's side of a recipe: run by tests/envoy/rls.rs.
            Some(name) if !name.ends_with("/rules") => continue,
            // The rules a recipe runs with are a rules file like any other.
            Some(_) => {}
            None => assert!(
                !is_envoy,
                "{}: an Envoy block must be run by tests/envoy/rls.rs: put \
                 <!-- envoy-test: NAME --> before it and use NAME there",
                block.at
            ),
        }
        let file = dir
            .path()
            .join(format!("{}.yaml", block.at.replace(['/', ':', '.'], "_")));
        std::fs::write(&file, &block.text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("check-config")
            .arg(&file)
            .output()
            .expect("run sluice check-config");
        assert!(
            out.status.success(),
            "{}: this rules block fails `sluice check-config`:\n{}{}\n\
             (a piece of a file is marked ```yaml excerpt; an Envoy \
             configuration follows <!-- envoy-test: NAME -->)",
            block.at,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    // The README's file, the reference's, the gap example and the recipes'.
    assert!(checked >= 6, "checked only {checked} rules blocks");
}

#[test]
fn every_shell_block_is_run_by_a_test_or_marked_illustrative() {
    let mut run = 0;
    for block in all_blocks() {
        if !SHELLS.contains(&block.lang.as_str()) || block.marks.iter().any(|m| m == "illustrative")
        {
            continue;
        }
        let commands = commands(&block);
        assert!(
            !commands.is_empty(),
            "{}: a shell block without a command",
            block.at
        );
        for command in commands {
            assert!(
                RUN_BY_TESTS.iter().any(|(known, _, _)| *known == command),
                "{}: no test runs `{command}`: run it in a test and list it in \
                 tests/deploy/docs.rs's RUN_BY_TESTS, or mark the block \
                 ```{} illustrative",
                block.at,
                block.lang
            );
            run += 1;
        }
    }
    assert!(run >= 3, "only {run} commands shown unmarked");
}

#[test]
fn the_tests_said_to_run_the_shown_commands_do() {
    for (command, file, evidence) in RUN_BY_TESTS {
        let text = read(&repo().join(file));
        assert!(
            text.contains(evidence),
            "{file} no longer shows that it runs `{command}` ({evidence:?} is gone)"
        );
    }
}

#[test]
fn the_readme_is_at_most_400_lines() {
    let lines = read(&repo().join("README.md")).lines().count();
    assert!(
        lines <= 400,
        "README.md has {lines} lines: move detail into docs/src/"
    );
}

#[test]
fn the_manual_lists_every_page_it_has() {
    let summary = read(&repo().join("docs/src/SUMMARY.md"));
    for page in pages().iter().skip(1) {
        let rel = page
            .strip_prefix(repo().join("docs/src"))
            .unwrap()
            .display()
            .to_string();
        if rel == "SUMMARY.md" {
            continue;
        }
        assert!(
            summary.contains(&format!("]({rel})")),
            "docs/src/SUMMARY.md does not list {rel}"
        );
    }
}
