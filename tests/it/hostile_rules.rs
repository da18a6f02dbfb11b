//! Rules files written to hurt: YAML alias bombs, NUL and other forbidden
//! characters, nesting deep enough to overflow a recursive parser (written
//! out, or through a chain of aliases), oversized files. Each is refused with its file and line, by `sluice check-config`
//! within a memory limit and by a running server, which keeps its old rules.
//! Ordinary anchors and merge keys still load.

use crate::support;

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sluice::rules::{ConfigError, MAX_FILE_BYTES, MAX_PATH_BYTES, parse_domain};

use support::http;

const FILE: &str = "rules/hostile.yaml";

/// Address space `check-config` gets in [`check_config_limited`]: ample for
/// any real rules file, a small fraction of what an alias bomb expands to.
const ADDRESS_SPACE: u64 = 512 * 1024 * 1024;

/// A "billion laughs" rules file: each anchor lists nine aliases of the one
/// before, so `levels` levels expand to 9^levels scalars from a few hundred
/// bytes.
fn alias_bomb(levels: usize) -> String {
    let mut text =
        String::from("domain: bomb\na0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for level in 1..=levels {
        let aliases = vec![format!("*a{}", level - 1); 9].join(", ");
        writeln!(text, "a{level}: &a{level} [{aliases}]").unwrap();
    }
    writeln!(text, "descriptors: *a{levels}").unwrap();
    text
}

/// A rules file that nests through aliases: each of `links` anchors holds
/// the one before inside 95 levels of lists, so no list is opened deeper
/// than 95 while the copies nest about 15,000 deep at 160 links; a comment
/// pads it to nearly the 4 MiB cap, which raises the alias budget enough
/// for every copy. Parsed without a depth check on aliases, it overflowed
/// the stack of the process that compiled (or dropped) it.
fn alias_chain(links: usize) -> String {
    let mut text = String::from(
        "domain: chain
",
    );
    let mut inner = String::from("x");
    for n in 0..links {
        writeln!(
            text,
            "a{n}: &a{n} {}{inner}{}",
            "[".repeat(95),
            "]".repeat(95)
        )
        .unwrap();
        inner = format!("*a{n}");
    }
    let pad = 4_000_000usize.saturating_sub(text.len());
    writeln!(text, "# {}", "x".repeat(pad)).unwrap();
    text
}

fn errors(text: &str) -> Vec<ConfigError> {
    match parse_domain(FILE, text.as_bytes()) {
        Ok(domain) => panic!("rules should be rejected, loaded {domain:?}"),
        Err(errors) => errors,
    }
}

fn only_error(text: &str) -> ConfigError {
    let mut errors = errors(text);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    errors.remove(0)
}

/// Runs `sluice check-config paths…` with its address space limited to
/// [`ADDRESS_SPACE`] (`prlimit --as`), so a parser that expanded the file
/// would fail to allocate instead of answering.
fn check_config_limited(paths: &[&Path]) -> Output {
    Command::new("prlimit")
        .arg(format!("--as={ADDRESS_SPACE}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .arg("check-config")
        .args(paths)
        .output()
        .expect("running prlimit (util-linux) and sluice")
}

// ---------------------------------------------------------------------------
// Long values repeated in every path below them
// ---------------------------------------------------------------------------

/// One descriptor whose value is `value_bytes` long, and under it
/// `children` limited descriptors (or, with `unknown`, that many unknown
/// keys on it instead, each an error that names its path).
fn long_value_over(value_bytes: usize, children: usize, unknown: bool) -> String {
    let mut text = format!(
        "domain: amp\ndescriptors:\n  - key: k\n    value: \"{}\"\n",
        "x".repeat(value_bytes)
    );
    if unknown {
        for n in 0..children {
            writeln!(text, "    unknown{n}: 1").unwrap();
        }
    } else {
        text.push_str("    descriptors:\n");
        for n in 0..children {
            writeln!(
                text,
                "      - {{key: c{n}, rate_limit: {{unit: second, requests_per_unit: 1}}}}"
            )
            .unwrap();
        }
    }
    text
}

#[test]
fn a_long_value_over_many_descriptors_is_refused_within_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    // Unbounded, the first took 3.4 GB (each of 5,000 rules kept the
    // 200 KB path three times), the second 1.17 GB (10,000 errors, each
    // with the 100 KB path).
    for (name, text) in [
        ("rules.yaml", long_value_over(200_000, 5_000, false)),
        ("errors.yaml", long_value_over(100_000, 10_000, true)),
    ] {
        let path = dir.path().join(name);
        fs::write(&path, text).unwrap();
        let output = check_config_limited(&[&path]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{name}: {output:?}");
        assert!(
            stderr.contains(&format!(
                "descriptor paths (each descriptor's keys and values, repeated in every descriptor under it) would take more than {MAX_PATH_BYTES} bytes"
            )),
            "{name}: {}",
            &stderr[stderr.len().saturating_sub(500)..]
        );
    }
    // Shorter values under as many descriptors still load.
    let path = dir.path().join("fine.yaml");
    fs::write(&path, long_value_over(100, 5_000, false)).unwrap();
    let output = check_config_limited(&[&path]);
    assert!(output.status.success(), "{output:?}");
}

// ---------------------------------------------------------------------------
// Alias bombs
// ---------------------------------------------------------------------------

#[test]
fn alias_bomb_is_rejected_at_the_alias_that_crosses_the_budget() {
    let text = alias_bomb(9);
    assert!(text.len() < 1024, "a bomb of {} bytes", text.len());
    let error = only_error(&text);
    assert_eq!(error.file, FILE);
    assert!(
        error
            .message
            .contains("rules file expands YAML aliases beyond 16777216 bytes"),
        "{error}"
    );
    // Each copy weighs 48 bytes per node plus its text: `a0` weighs 507
    // bytes, each level 9 times the last plus 48. Up to `a4` the aliases and
    // the anchors keep copy 7.6 MB; `a5` (line 7) copies 3.4 MB per alias
    // and its fourth crosses 16 MiB.
    assert_eq!(error.line, 7, "{error}");
}

#[test]
fn check_config_rejects_an_alias_bomb_within_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.yaml");
    fs::write(&bomb, alias_bomb(9)).unwrap();
    let output = check_config_limited(&[&bomb]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr.contains(&format!(
            "{}:7: invalid YAML: rules file expands YAML aliases beyond 16777216 bytes",
            bomb.display()
        )),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "nothing is ok: {output:?}");

    // The same limit leaves room for the shipped example rules.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rules.yaml");
    let output = check_config_limited(&[&example]);
    assert!(output.status.success(), "{output:?}");
}

#[test]
fn ordinary_anchors_and_merge_keys_still_load() {
    let mut text = String::from(
        "domain: merged\n\
         descriptors:\n\
         \x20 - key: base\n\
         \x20   rate_limit: &base {unit: minute, requests_per_unit: 5, algorithm: fixed_window}\n",
    );
    // Many descriptors sharing one anchored block, as generated files do.
    for i in 0..2_000 {
        write!(
            text,
            "  - key: k{i}\n    rate_limit:\n      <<: *base\n      requests_per_unit: {i}\n"
        )
        .unwrap();
    }
    let domain = parse_domain(FILE, text.as_bytes()).unwrap_or_else(|e| panic!("{e:#?}"));
    let rules = domain.rules();
    assert_eq!(rules.len(), 2_001);
    let k7 = rules.iter().find(|r| r.path == "merged/k7").unwrap();
    assert_eq!(k7.limits[0].spec.requests, 7, "the explicit key wins");
    assert_eq!(
        k7.limits[0].spec.window.duration_ms, 60_000,
        "merged from base"
    );
}

// ---------------------------------------------------------------------------
// Forbidden characters, nesting, size
// ---------------------------------------------------------------------------

const TWO_RULES: &str = "domain: d\n\
    descriptors:\n\
    \x20 - key: a\n\
    \x20   rate_limit: {unit: second, requests_per_unit: 1}\n\
    \x20 - key: b\n\
    \x20   rate_limit: {unit: second, requests_per_unit: 1}\n";

#[test]
fn a_nul_byte_is_rejected_with_its_line_instead_of_ending_the_file() {
    // Before line 5: without the check, everything from the NUL on was
    // dropped and the file loaded with one rule.
    let text = TWO_RULES.replacen("  - key: b", "\0  - key: b", 1);
    let error = only_error(&text);
    assert_eq!((error.file.as_str(), error.line), (FILE, 5), "{error}");
    assert!(
        error
            .message
            .contains("control character U+0000 is not allowed"),
        "{error}"
    );
}

#[test]
fn other_control_characters_are_rejected_with_their_line() {
    for (c, name) in [
        ('\u{1}', "U+0001"),
        ('\u{1b}', "U+001B"),
        ('\u{7f}', "U+007F"),
        ('\u{9b}', "U+009B"),
        ('\u{ffff}', "U+FFFF"),
    ] {
        // Inside a quoted value, where a parser might otherwise keep it.
        let text = TWO_RULES.replacen("key: b", &format!("key: \"b{c}\""), 1);
        let error = only_error(&text);
        assert_eq!(error.line, 5, "{name}: {error}");
        assert!(error.message.contains(name), "{error}");
    }
    // Tabs, line ends and ordinary Unicode are fine.
    let text = TWO_RULES
        .replacen("key: b", "key: \"b\tç€😀\"", 1)
        .replace('\n', "\r\n");
    parse_domain(FILE, text.as_bytes()).unwrap_or_else(|e| panic!("{e:#?}"));
}

#[test]
fn check_config_names_the_file_and_line_of_a_nul_byte() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nul.yaml");
    fs::write(&file, TWO_RULES.replacen("  - key: b", "\0  - key: b", 1)).unwrap();
    let output = check_config_limited(&[&file]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr.contains(&format!(
            "{}:5: invalid YAML: control character U+0000 is not allowed",
            file.display()
        )),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "nothing is ok: {output:?}");
}

#[test]
fn deep_block_nesting_is_an_error_not_a_stack_overflow() {
    let mut text = String::from("domain: d\ndescriptors:\n");
    for depth in 1..=1_000 {
        writeln!(text, "{}-", " ".repeat(depth)).unwrap();
    }
    let error = only_error(&text);
    assert!(
        error.message.contains("nested deeper than 100 levels"),
        "{error}"
    );
    // The file's map is the first level, `descriptors` (line 3) the second.
    assert_eq!(error.line, 102, "{error}");
}

#[test]
fn deep_flow_nesting_is_an_error_not_a_stack_overflow() {
    let depth = 1_000_000;
    let text = format!(
        "domain: d\ndescriptors: {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let error = only_error(&text);
    assert_eq!(error.line, 2, "{error}");
    assert!(error.message.starts_with("invalid YAML"), "{error}");
}

#[test]
fn deeply_nested_descriptors_within_the_limit_load() {
    // 40 levels of descriptors are 81 levels of YAML: under the limit.
    let mut text = String::from("domain: d\ndescriptors:\n");
    for depth in 0..40 {
        let pad = "  ".repeat(2 * depth + 1);
        writeln!(text, "{pad}- key: k{depth}\n{pad}  descriptors:").unwrap();
    }
    let domain = parse_domain(FILE, text.as_bytes()).unwrap_or_else(|e| panic!("{e:#?}"));
    assert!(domain.rules().is_empty());
}

#[test]
fn a_file_over_the_size_cap_is_rejected_unread() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("huge.yaml");
    let mut text = String::from(TWO_RULES);
    text.push_str(&"# padding\n".repeat(MAX_FILE_BYTES as usize / 10 + 1));
    fs::write(&file, &text).unwrap();
    let output = check_config_limited(&[&file]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr.contains(&format!(
            "{}: file is larger than {MAX_FILE_BYTES} bytes",
            file.display()
        )),
        "{stderr}"
    );
}

#[test]
fn many_descriptors_load() {
    let mut text = String::from("domain: wide\ndescriptors:\n");
    for i in 0..20_000 {
        write!(
            text,
            "  - key: k\n    value: v{i}\n    rate_limit: {{unit: second, requests_per_unit: {i}}}\n"
        )
        .unwrap();
    }
    let domain = parse_domain(FILE, text.as_bytes()).unwrap_or_else(|e| panic!("{e:#?}"));
    assert_eq!(domain.rules().len(), 20_000);
}

// ---------------------------------------------------------------------------
// A running server
// ---------------------------------------------------------------------------

/// `VmHWM` (peak resident memory) of process `pid`, in kB.
fn peak_rss_kb(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("the server is alive");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// The HTTP status of one hit of `key` in domain `d` through `POST /json`:
/// 200 when OK, 429 when over the limit.
fn json_status(http_addr: std::net::SocketAddr, key: &str) -> u16 {
    let body = format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"{key}","value":"v"}}]}}]}}"#
    );
    http(http_addr, "POST", "/json", &body).0
}

#[test]
fn a_server_keeps_its_rules_when_a_bomb_a_nul_or_an_alias_chain_is_dropped_in() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    fs::create_dir(&rules).unwrap();
    // One hit per hour: the second hit of `a` is over the limit, whatever the
    // time, as long as the rules stay.
    fs::write(
        rules.join("d.yaml"),
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    let path = rules.display().to_string();
    let (server, _grpc, http_addr) = support::start_binary_with_http(&["--rules", &path]);
    let pid = server.0.id();
    assert_eq!(json_status(http_addr, "a"), 200);
    assert_eq!(json_status(http_addr, "a"), 429);
    let before = peak_rss_kb(pid);

    let errors_counted = |n: u32| {
        let deadline = Instant::now() + Duration::from_secs(15);
        let wanted = format!(r#"sluice_rules_reloads_total{{result="error"}} {n}"#);
        loop {
            let (_, metrics) = http(http_addr, "GET", "/metrics", "");
            if metrics.contains(&wanted) {
                return;
            }
            assert!(Instant::now() < deadline, "no {wanted} in:\n{metrics}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };

    fs::write(rules.join("bomb.yaml"), alias_bomb(9)).unwrap();
    errors_counted(1);
    assert_eq!(
        json_status(http_addr, "a"),
        429,
        "the old rules are still enforced"
    );
    let after = peak_rss_kb(pid);
    assert!(
        after < before + 100 * 1024,
        "the bomb grew the server's peak memory from {before} kB to {after} kB"
    );
    fs::remove_file(rules.join("bomb.yaml")).unwrap();

    // A NUL byte cuts a file that would otherwise have loaded with one rule
    // fewer; it is refused whole.
    fs::write(
        rules.join("d.yaml"),
        "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1}\n\0  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
    )
    .unwrap();
    errors_counted(2);
    assert_eq!(
        json_status(http_addr, "a"),
        429,
        "the old rules are still enforced"
    );
    assert_eq!(
        json_status(http_addr, "b"),
        200,
        "b is not limited: no rule"
    );
    assert_eq!(
        json_status(http_addr, "b"),
        200,
        "b is not limited: no rule"
    );

    // Nesting through a chain of aliases is refused as deep nesting is;
    // the server lives on with its rules.
    fs::write(rules.join("chain.yaml"), alias_chain(160)).unwrap();
    errors_counted(3);
    assert_eq!(
        json_status(http_addr, "a"),
        429,
        "the old rules are still enforced"
    );
}
