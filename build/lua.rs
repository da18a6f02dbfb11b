//! The Redis scripts' records, named in the source and numbered in the
//! script Redis runs (build.rs calls [`expand`] on each assembled script).
//!
//! A record (a key, an item, a limit, an algorithm's state, a reply's values
//! per limit) is a Lua array, because an array costs a third of a hash table
//! to fill and to collect and the scripts make their records anew on every
//! call. The source names every slot instead of numbering it: a layout is
//! declared once, in a long comment,
//!
//! ```text
//! --[[ layout state:
//!   S_ALG      the algorithm's function
//!   S_KEY      the key record
//! ]]
//! --[[ layout sliding after state:
//!   SW_DURATION  D, in ms
//! ]]
//! ```
//!
//! one name a line (the rest of the line says what it holds), numbered from 1,
//! or after the last slot of the layout named by `after`. The code then reads
//! `st[S_KEY]` and makes a record with the names in order,
//! `{ [S_ALG] = f, [S_KEY] = k, … }`, optionally followed by unnamed values
//! (slots reserved beyond the layout). [`expand`] writes each name as its
//! number and such a constructor as the array it stands for (`{ f, k, … }`),
//! so that the script costs what positional code costs; each declaration
//! stays, with its numbers, as the generated script's comment. It refuses a
//! name declared twice, a constructor whose names are not its layout's slots
//! in order, and a name that is used but declared nowhere (any upper-case
//! identifier with an underscore that is not a `local` of the script).
//!
//! `build/lua_filter.rs` is the same code as a filter (stdin to stdout), for
//! benches/redis_instructions.sh; the tests below run in the `redis` test
//! binary (`cargo test --test redis lua_build`), and check the scripts this
//! build generated too.

use std::collections::HashMap;

/// One lexical piece of a Lua source, kept verbatim.
#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    /// Numbers, strings, operators: copied as they are.
    Other(String),
    /// Space and comments: copied as they are (declarations rewritten).
    Space(String),
}

fn lex(src: &str) -> Result<Vec<Token>, String> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    // The end of a long bracket `[==[ … ]==]` opening at `at`, if it is one.
    let long_end = |at: usize| -> Option<Option<usize>> {
        if b.get(at) != Some(&b'[') {
            return None;
        }
        let mut j = at + 1;
        while b.get(j) == Some(&b'=') {
            j += 1;
        }
        if b.get(j) != Some(&b'[') {
            return None;
        }
        let close = format!("]{}]", "=".repeat(j - at - 1));
        Some(src[j..].find(&close).map(|p| j + p + close.len()))
    };
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            out.push(Token::Space(src[start..i].to_owned()));
        } else if src[i..].starts_with("--") {
            i = match long_end(i + 2) {
                Some(end) => end.ok_or("unclosed long comment")?,
                None => src[i..].find('\n').map_or(b.len(), |p| i + p),
            };
            out.push(Token::Space(src[start..i].to_owned()));
        } else if c == b'_' || c.is_ascii_alphabetic() {
            while i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                i += 1;
            }
            out.push(Token::Ident(src[start..i].to_owned()));
        } else if c == b'\'' || c == b'"' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            if i >= b.len() {
                return Err(format!("unclosed string at byte {start}"));
            }
            i += 1;
            out.push(Token::Other(src[start..i].to_owned()));
        } else if let Some(end) = long_end(i) {
            i = end.ok_or("unclosed long string")?;
            out.push(Token::Other(src[start..i].to_owned()));
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
            out.push(Token::Other(src[start..i].to_owned()));
        } else {
            // Operators: one character each is enough for what is matched
            // here (brackets, `=`, `,`); `==` stays two tokens, copied alike.
            i += src[i..].chars().next().map_or(1, char::len_utf8);
            out.push(Token::Other(src[start..i].to_owned()));
        }
    }
    Ok(out)
}

/// The line (from 1) where token `at` starts.
fn line_at(tokens: &[Token], at: usize) -> usize {
    1 + tokens[..at]
        .iter()
        .map(|t| match t {
            Token::Ident(s) | Token::Other(s) | Token::Space(s) => s.matches('\n').count(),
        })
        .sum::<usize>()
}

/// Whether `word` is written like a layout's name: upper case, digits and
/// underscores, with at least one underscore.
fn looks_like_name(word: &str) -> bool {
    word.contains('_')
        && word.starts_with(|c: char| c.is_ascii_uppercase())
        && word
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// Every layout declared in `tokens`' comments: name → (layout, slot).
/// Rewrites each declaration to show the numbers.
fn declarations(tokens: &mut [Token]) -> Result<HashMap<String, (String, usize)>, String> {
    let mut names: HashMap<String, (String, usize)> = HashMap::new();
    let mut sizes: HashMap<String, usize> = HashMap::new();
    for token in tokens.iter_mut() {
        let Token::Space(text) = token else { continue };
        let Some(body) = text.strip_prefix("--[[ layout ") else {
            continue;
        };
        let (head, rest) = body
            .split_once(':')
            .ok_or_else(|| format!("layout without ':' in {text:?}"))?;
        let (layout, base) = match head.split_once(" after ") {
            Some((layout, base)) => (layout.trim(), Some(base.trim())),
            None => (head.trim(), None),
        };
        if sizes.contains_key(layout) {
            return Err(format!("layout {layout} declared twice"));
        }
        let mut slot = match base {
            Some(base) => *sizes
                .get(base)
                .ok_or_else(|| format!("layout {layout}: no layout {base} before it"))?,
            None => 0,
        };
        let mut rewritten = format!("--[[ layout {head}:");
        for line in rest.split_inclusive('\n') {
            let word = line.split_whitespace().next().unwrap_or("");
            if looks_like_name(word) {
                slot += 1;
                if let Some((other, _)) = names.get(word) {
                    return Err(format!(
                        "{word} declared twice (layouts {other} and {layout})"
                    ));
                }
                names.insert(word.to_owned(), (layout.to_owned(), slot));
                // `NAME` → `NAME = n`, keeping the description's column when
                // there is room.
                let at = line.find(word).unwrap_or(0) + word.len();
                let numbered = format!("{word} = {slot}");
                let pad = line[at..].len() - line[at..].trim_start().len();
                let keep = pad.saturating_sub(numbered.len() - word.len()).max(1);
                let tail = line[at..].trim_start();
                let space = if tail.is_empty() {
                    ""
                } else {
                    &" ".repeat(keep)[..]
                };
                rewritten.push_str(&format!(
                    "{}{numbered}{space}{tail}",
                    &line[..at - word.len()]
                ));
            } else {
                rewritten.push_str(line);
            }
        }
        sizes.insert(layout.to_owned(), slot);
        *text = rewritten;
    }
    Ok(names)
}

/// The script with every layout name written as its number and every named
/// constructor as an array; an error says what is wrong and where.
pub fn expand(source: &str) -> Result<String, String> {
    let mut tokens = lex(source)?;
    let names = declarations(&mut tokens)?;
    // Names the script declares as locals (MAX_HITS, …) are its own.
    let mut locals = vec!["KEYS".to_owned(), "ARGV".to_owned()];
    let significant: Vec<usize> = (0..tokens.len())
        .filter(|&i| !matches!(tokens[i], Token::Space(_)))
        .collect();
    let text = |i: usize| match &tokens[significant[i]] {
        Token::Ident(s) | Token::Other(s) | Token::Space(s) => s.as_str(),
    };
    for i in 0..significant.len() {
        if text(i) == "local" {
            let mut j = i + 1;
            while j < significant.len() && matches!(tokens[significant[j]], Token::Ident(_)) {
                locals.push(text(j).to_owned());
                if j + 1 < significant.len() && text(j + 1) == "," {
                    j += 2;
                } else {
                    break;
                }
            }
        }
    }

    // Constructors: a stack of open brackets; for a `{` opened with
    // `[NAME] =`, the slot its next value fills.
    let line_of = |i: usize| line_at(&tokens, significant[i]);
    let named_at = |i: usize| -> Option<&(String, usize)> {
        if i + 3 < significant.len() && text(i) == "[" && text(i + 2) == "]" && text(i + 3) == "=" {
            names.get(text(i + 1))
        } else {
            None
        }
    };
    let mut drop = vec![false; tokens.len()];
    let mut stack: Vec<Option<usize>> = Vec::new();
    let mut entry_start = false;
    let mut i = 0;
    while i < significant.len() {
        let t = text(i);
        if entry_start && let Some(Some(next)) = stack.last().copied() {
            entry_start = false;
            if let Some((layout, slot)) = named_at(i) {
                if *slot != next {
                    return Err(format!(
                        "line {}: [{}] is slot {slot} of layout {layout}, where the constructor's next value is slot {next}",
                        line_of(i),
                        text(i + 1)
                    ));
                }
                // `[NAME] =` and the space after it go.
                drop[significant[i]..significant[i + 4]].fill(true);
                i += 4;
                continue;
            }
            // Otherwise an unnamed value (a slot reserved beyond the
            // layout), or the `}` after a trailing comma.
        }
        match t {
            "{" => {
                stack.push(named_at(i + 1).map(|_| 1));
                entry_start = true;
            }
            "(" | "[" => stack.push(None),
            "}" | ")" | "]" => {
                stack.pop();
            }
            "," => {
                if let Some(Some(next)) = stack.last_mut() {
                    *next += 1;
                    entry_start = true;
                }
            }
            _ => {}
        }
        i += 1;
    }

    let mut out = String::with_capacity(source.len());
    for (j, token) in tokens.iter().enumerate() {
        if drop[j] {
            continue;
        }
        match token {
            Token::Ident(word) => match names.get(word) {
                Some((_, slot)) => out.push_str(&slot.to_string()),
                None if looks_like_name(word) && !locals.contains(word) => {
                    let line = line_at(&tokens, j);
                    return Err(format!("line {line}: {word} is declared in no layout"));
                }
                None => out.push_str(word),
            },
            Token::Other(s) | Token::Space(s) => out.push_str(s),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::expand;

    const LAYOUTS: &str = "--[[ layout state:\n  S_ALG   the function\n  S_KEY   the key\n]]\n\
        --[[ layout slide after state:\n  SW_D    duration\n]]\n";

    #[test]
    fn names_become_numbers_and_named_constructors_arrays() {
        let src = format!(
            "{LAYOUTS}local st = {{ [S_ALG] = f(1, {{}}), [S_KEY] = {{ 'a', 'b' }}, [SW_D] = x[S_KEY], false }}\nreturn st[SW_D]\n"
        );
        let out = expand(&src).unwrap();
        assert!(
            out.contains("local st = { f(1, {}), { 'a', 'b' }, x[2], false }"),
            "{out}"
        );
        assert!(out.contains("return st[3]"), "{out}");
        assert!(out.contains("S_ALG = 1"), "{out}");
        assert!(out.contains("SW_D = 3"), "{out}");
    }

    #[test]
    fn comments_and_strings_keep_their_words() {
        let src = format!("{LAYOUTS}-- S_KEY here\nlocal s = 'S_KEY' .. st[S_KEY]\n");
        let out = expand(&src).unwrap();
        assert!(
            out.contains("-- S_KEY here\nlocal s = 'S_KEY' .. st[2]"),
            "{out}"
        );
    }

    #[test]
    fn a_name_declared_nowhere_is_refused() {
        let err = expand(&format!("{LAYOUTS}return st[S_KYE]\n")).unwrap_err();
        assert!(err.contains("S_KYE is declared in no layout"), "{err}");
        // A local of the script is its own.
        expand(&format!("{LAYOUTS}local MAX_HITS = 1\nreturn MAX_HITS\n")).unwrap();
    }

    #[test]
    fn a_name_declared_twice_is_refused() {
        let src = format!("{LAYOUTS}--[[ layout other:\n  S_KEY   again\n]]\n");
        let err = expand(&src).unwrap_err();
        assert!(err.contains("S_KEY declared twice"), "{err}");
    }

    /// decide.lua and refund.lua as this build generated them: no name
    /// left, and every layout numbered 1, 2, … (or on from its base) with
    /// names of its own.
    #[test]
    fn the_generated_scripts_are_numbered() {
        let Some(out_dir) = option_env!("OUT_DIR") else {
            return; // built by rustc alone, not by cargo
        };
        for name in ["decide.lua", "refund.lua"] {
            let script = std::fs::read_to_string(format!("{out_dir}/{name}")).unwrap();
            let tokens = super::lex(&script).unwrap();
            let mut locals = ["KEYS", "ARGV", "MAX_HITS", "MAX_AHEAD"];
            locals.sort();
            for token in &tokens {
                if let super::Token::Ident(word) = token {
                    assert!(
                        !super::looks_like_name(word)
                            || locals.binary_search(&word.as_str()).is_ok(),
                        "{name}: {word} left unnumbered"
                    );
                }
            }
            let mut seen = std::collections::HashMap::new();
            let mut layouts = 0;
            for token in &tokens {
                let super::Token::Space(text) = token else {
                    continue;
                };
                if !text.starts_with("--[[ layout ") {
                    continue;
                }
                layouts += 1;
                let mut last = None;
                for line in text.lines().skip(1) {
                    let mut words = line.split_whitespace();
                    let (Some(word), Some("="), Some(n)) =
                        (words.next(), words.next(), words.next())
                    else {
                        continue;
                    };
                    if !super::looks_like_name(word) {
                        continue;
                    }
                    let n: usize = n.parse().unwrap();
                    assert!(
                        seen.insert(word.to_owned(), n).is_none(),
                        "{name}: {word} twice"
                    );
                    if let Some(last) = last {
                        assert_eq!(n, last + 1, "{name}: {word} after slot {last}");
                    }
                    last = Some(n);
                }
                assert!(last.is_some(), "{name}: an empty layout: {text}");
            }
            assert!(layouts >= 5, "{name}: {layouts} layouts");
        }
    }

    #[test]
    fn a_constructor_out_of_order_is_refused() {
        let err = expand(&format!("{LAYOUTS}return {{ [S_KEY] = 1, [S_ALG] = 2 }}\n")).unwrap_err();
        assert!(err.contains("slot 2 of layout state"), "{err}");
    }
}
