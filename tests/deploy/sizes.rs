//! Small rooms: no file of `src/` over 600 lines and no function over 80
//! (CONTRIBUTING.md). Functions are measured from the line of `fn` to the
//! line of the brace that closes their body, with comments, strings and
//! character literals blanked first, so that a brace inside them counts for
//! nothing.

use super::*;

/// The longest a file of `src/` may be, in lines.
const MOST_FILE_LINES: usize = 600;
/// The longest a function may be, in lines, its signature included.
const MOST_FN_LINES: usize = 80;

/// Every file of `src/`, with its path relative to the repository.
fn source_files() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(&repo().join("src"), &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let name = path.strip_prefix(repo()).unwrap().display().to_string();
            (name, read(&path))
        })
        .collect()
}

/// `text` with the insides of comments, strings and character literals
/// replaced by spaces (newlines kept, so line numbers stay).
fn blank(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let keep = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            loop {
                match (chars.get(i), chars.get(i + 1)) {
                    (Some('/'), Some('*')) => depth += 1,
                    (Some('*'), Some('/')) => depth -= 1,
                    (None, _) => break,
                    _ => {}
                }
                out.push(keep(chars[i]));
                i += 1;
                if depth == 0 {
                    out.push(' ');
                    i += 1;
                    break;
                }
            }
        } else if c == 'r' && matches!(next, Some('"' | '#')) && !ident_before(&chars, i) {
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            i += 2 + hashes;
            out.push_str(&" ".repeat(2 + hashes));
            while i < chars.len() && !chars[i..].starts_with(&close) {
                out.push(keep(chars[i]));
                i += 1;
            }
            out.push_str(&" ".repeat(close.len()));
            i += close.len();
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                let n = if chars[i] == '\\' { 2 } else { 1 };
                for _ in 0..n.min(chars.len() - i) {
                    out.push(keep(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{7f}'), not a lifetime.
            let end = if next == Some('\\') {
                chars
                    .get(i + 3..)
                    .unwrap_or(&[])
                    .iter()
                    .position(|&c| c == '\'')
                    .map(|p| i + 3 + p)
            } else {
                (chars.get(i + 2) == Some(&'\'')).then_some(i + 2)
            };
            match end {
                Some(end) => {
                    out.push_str(&" ".repeat(end + 1 - i));
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// Every function with a body in `text`: its name, first line (from 1)
/// and length in lines.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = blank(text);
    let bytes = code.as_bytes();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(p) = code[from..].find("fn ") {
        let at = from + p;
        from = at + 3;
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        let name: String = code[at + 3..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue; // a function pointer type, `fn(u8) -> u8`
        }
        // The body's opening brace, outside the signature's brackets; a
        // `;` first means a declaration without a body.
        let (mut depth, mut open) = (0i32, None);
        for (j, b) in bytes.iter().enumerate().skip(at) {
            match b {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b';' if depth == 0 => break,
                b'{' if depth == 0 => {
                    open = Some(j);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let mut braces = 0;
        for (j, b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'{' => braces += 1,
                b'}' => braces -= 1,
                _ => {}
            }
            if braces == 0 {
                found.push((name, line_of(at), line_of(j) - line_of(at) + 1));
                break;
            }
        }
    }
    found
}

#[test]
fn no_file_in_src_is_over_600_lines() {
    let long: Vec<String> = source_files()
        .iter()
        .map(|(name, text)| (name, text.lines().count()))
        .filter(|(_, lines)| *lines > MOST_FILE_LINES)
        .map(|(name, lines)| format!("{name}: {lines} lines"))
        .collect();
    assert!(
        long.is_empty(),
        "files over {MOST_FILE_LINES} lines; split them along a seam:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_function_in_src_is_over_80_lines() {
    let mut long = Vec::new();
    for (name, text) in source_files() {
        if !name.ends_with(".rs") {
            continue;
        }
        for (function, line, lines) in functions(&text) {
            if lines > MOST_FN_LINES {
                long.push(format!("{name}:{line} {function}: {lines} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MOST_FN_LINES} lines; split them into steps a reader would name:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_length_counter_skips_comments_strings_and_declarations() {
    let text = r##"
trait T {
    fn declared(&self) -> [u8; 4];
}
fn short(x: [u8; 2]) -> char {
    // a brace in a comment: {
    let s = "a brace in a string: {";
    let r = r#"and a raw one: "{" "#;
    let c = '{';
    let f: fn(u8) -> u8 = |x| x;
    /* a block comment { /* nested { */ } */
    '}'
}
fn lifetimes<'a>(s: &'a str) -> &'a str {
    s
}
"##;
    let found = functions(text);
    assert_eq!(
        found,
        vec![
            ("short".to_string(), 5, 9),
            ("lifetimes".to_string(), 14, 3)
        ],
        "{found:?}"
    );
}
