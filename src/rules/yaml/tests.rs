//! The YAML reader's tests: anchors, aliases, merge keys and what is refused.

use super::*;

#[test]
fn nodes_carry_their_lines() {
    let docs = parse("domain: d\ndescriptors:\n  - key: a\n    value: b\n").unwrap();
    let Kind::Map(pairs) = &docs[0].kind else {
        panic!("map expected")
    };
    let Kind::Seq(items) = &pairs[1].1.kind else {
        panic!("seq expected")
    };
    assert_eq!(items[0].line, 3);
    let Kind::Map(entry) = &items[0].kind else {
        panic!("map expected")
    };
    assert_eq!(entry[1].0.line, 4);
}

#[test]
fn syntax_errors_have_a_line() {
    let err = parse("domain: d\ndescriptors: [\n").unwrap_err();
    assert!(err.line >= 2, "{err:?}");
}

#[test]
fn aliases_copy_the_anchored_node() {
    let docs = parse("a: &x {k: 1}\nb: *x\n").unwrap();
    let Kind::Map(pairs) = &docs[0].kind else {
        panic!("map expected")
    };
    assert!(matches!(pairs[1].1.kind, Kind::Map(_)));
    assert_eq!(pairs[1].1.line, 2);
}

#[test]
fn copies_by_anchors_and_aliases_are_counted_against_the_budget() {
    // One list of 9 one-byte scalars, anchored (copied once) and aliased
    // `n` times: each copy weighs the list's node and its 9 scalars.
    let copy = NODE_BYTES + 9 * (NODE_BYTES + 1);
    let fits = MIN_ALIAS_BYTES / copy - 1;
    let text = |n: usize| {
        format!(
            "a: &x [1, 2, 3, 4, 5, 6, 7, 8, 9]\nb: [{}]\n",
            vec!["*x"; n].join(", ")
        )
    };
    assert!(parse(&text(fits)).is_ok());
    let err = parse(&text(fits + 1)).unwrap_err();
    assert_eq!(err.line, 2);
    assert_eq!(
        err.message,
        format!("rules file expands YAML aliases beyond {MIN_ALIAS_BYTES} bytes")
    );
    // The budget grows with the file: 32 bytes per byte of text.
    assert_eq!(alias_budget(10), MIN_ALIAS_BYTES);
    assert_eq!(alias_budget(4_000_000), 128_000_000);
}

#[test]
fn one_long_string_aliased_many_times_is_weighed_by_its_length() {
    // 200 KB of text, copied by 100 aliases: 20 MB, past the floor,
    // though it is only 101 nodes.
    let text = format!(
        "a: &x \"{}\"\nb: [{}]\n",
        "y".repeat(200_000),
        vec!["*x"; 100].join(", ")
    );
    let err = parse(&text).unwrap_err();
    assert!(err.message.contains("expands YAML aliases"), "{err:?}");
}

#[test]
fn nesting_is_limited_before_anything_recurses() {
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(parse(&ok).is_ok());
    let mut deep = String::new();
    for depth in 0..=MAX_DEPTH {
        deep.push_str(&" ".repeat(depth));
        deep.push_str("-\n");
    }
    let err = parse(&deep).unwrap_err();
    assert_eq!(err.line, MAX_DEPTH + 1);
    assert!(
        err.message.contains("nested deeper than 100 levels"),
        "{err:?}"
    );
}

#[test]
fn nesting_through_a_chain_of_aliases_is_limited_too() {
    // Each anchor nests the one before in 30 more levels: no list is
    // ever opened deeper than 30, but the copies nest 30 per link.
    let link = |n: usize, inner: &str| {
        format!("a{n}: &a{n} {}{inner}{}\n", "[".repeat(30), "]".repeat(30))
    };
    let chain = |links: usize| {
        let mut text = link(0, "x");
        for n in 1..links {
            text.push_str(&link(n, &format!("*a{}", n - 1)));
        }
        text
    };
    // 3 links: 90 levels under the top map, 91 in all.
    assert!(parse(&chain(3)).is_ok());
    // 4 links: 121; the fourth anchor's alias is refused where it is.
    let err = parse(&chain(4)).unwrap_err();
    assert_eq!(err.line, 4);
    assert!(
        err.message.contains("nested deeper than 100 levels"),
        "{err:?}"
    );
}

#[test]
fn forbidden_characters_are_found_with_their_line() {
    let err = parse("a: 1\nb: \"x\u{7}\"\n").unwrap_err();
    assert_eq!(
        (err.line, err.message.as_str()),
        (2, "control character U+0007 is not allowed in a YAML file")
    );
    assert!(
        parse("a: \"\u{85}\u{a0}\t\"\r\n").is_ok(),
        "NEL, NBSP, tab and CR are allowed"
    );
}

/// The value under `key` in a map node.
fn entry<'a>(map: &'a Node, key: &str) -> &'a Node {
    let Kind::Map(pairs) = &map.kind else {
        panic!("map expected")
    };
    pairs
        .iter()
        .find(|(k, _)| matches!(&k.kind, Kind::Scalar { text, .. } if text == key))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no key {key}"))
}

/// `(key, value, line of the value)` of each pair of a map of scalars.
fn scalars(map: &Node) -> Vec<(&str, &str, usize)> {
    let Kind::Map(pairs) = &map.kind else {
        panic!("map expected")
    };
    pairs
        .iter()
        .map(|(k, v)| match (&k.kind, &v.kind) {
            (Kind::Scalar { text: k, .. }, Kind::Scalar { text: t, .. }) => {
                (k.as_str(), t.as_str(), v.line)
            }
            _ => panic!("scalars expected"),
        })
        .collect()
}

#[test]
fn merge_keys_add_missing_pairs_and_explicit_keys_win() {
    let docs = parse("a: &x {k: 1, n: a}\nb:\n  n: b\n  <<: *x\n").unwrap();
    // `n` is written before `<<` and still wins; `k` keeps its line.
    assert_eq!(
        scalars(entry(&docs[0], "b")),
        [("n", "b", 3), ("k", "1", 1)]
    );
}

#[test]
fn merge_key_lists_prefer_earlier_maps() {
    let docs = parse("a: &x {k: 1}\nb: &y {k: 2, m: 3}\nc: {<<: [*x, *y]}\n").unwrap();
    assert_eq!(
        scalars(entry(&docs[0], "c")),
        [("k", "1", 1), ("m", "3", 2)]
    );
}

#[test]
fn merge_keys_apply_inside_anchored_maps() {
    let docs = parse("a: &x {k: 1}\nb: &y {<<: *x, m: 2}\nc: {<<: *y}\n").unwrap();
    assert_eq!(
        scalars(entry(&docs[0], "c")),
        [("m", "2", 2), ("k", "1", 1)]
    );
}

#[test]
fn merge_key_of_a_scalar_is_a_syntax_error() {
    let err = parse("a: 1\nb:\n  <<: 5\n").unwrap_err();
    assert_eq!(err.line, 3);
    assert!(err.message.contains("merge key '<<'"), "{err:?}");
    let err = parse("a: &x [1]\nb: {<<: [*x]}\n").unwrap_err();
    assert!(err.message.contains("found a list"), "{err:?}");
    // A quoted "<<" is an ordinary key.
    let docs = parse("b: {\"<<\": 5}\n").unwrap();
    assert_eq!(scalars(entry(&docs[0], "b")), [("<<", "5", 1)]);
}
