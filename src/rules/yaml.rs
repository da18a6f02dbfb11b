//! A YAML document as a tree of nodes that remember their line, so every
//! rules error can name where it is. Built from `yaml-rust2`'s marked events
//! (the parser the `config` crate already uses); anchors and aliases resolve
//! to copies of the anchored node, and merge keys (`<<: *base`) are applied
//! as each mapping ends, as Go's yaml.v2 (and so envoyproxy/ratelimit) does.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// One YAML node and the line (1-based) it starts on.
#[derive(Clone, Debug)]
pub struct Node {
    pub kind: Kind,
    pub line: usize,
}

/// The shapes a node can take.
#[derive(Clone, Debug)]
pub enum Kind {
    /// A scalar's text; `quoted` is true for '…', "…", | and > scalars, which
    /// are always strings (a plain `true` or `10` may be a bool or a number).
    Scalar {
        text: String,
        quoted: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// Whether the node is YAML's null (`~`, `null` or nothing).
    pub fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar { text, quoted: false }
            if text.is_empty() || text == "~" || text.eq_ignore_ascii_case("null"))
    }

    /// A short name of the node's shape for error messages.
    pub fn shape(&self) -> &'static str {
        match self.kind {
            Kind::Scalar { .. } => "a scalar",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a map",
        }
    }
}

/// A YAML syntax error and where it is.
#[derive(Debug)]
pub struct SyntaxError {
    pub line: usize,
    pub message: String,
}

/// Parses `text` into its documents (an empty stream gives none).
pub fn parse(text: &str) -> Result<Vec<Node>, SyntaxError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, true).map_err(|e| SyntaxError {
        line: e.marker().line(),
        message: e.info().to_owned(),
    })?;
    match builder.error {
        Some(error) => Err(error),
        None => Ok(builder.documents),
    }
}

enum Open {
    Seq(Vec<Node>, usize, usize),
    Map(Vec<(Node, Node)>, Option<Node>, usize, usize),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Open>,
    documents: Vec<Node>,
    anchors: HashMap<usize, Node>,
    error: Option<SyntaxError>,
}

impl Builder {
    fn finish(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => self.documents.push(node),
            Some(Open::Seq(items, _, _)) => items.push(node),
            Some(Open::Map(pairs, pending, _, _)) => match pending.take() {
                None => *pending = Some(node),
                Some(key) => pairs.push((key, node)),
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        let line = mark.line();
        match event {
            Event::Scalar(text, style, anchor, _) => {
                let quoted = style != TScalarStyle::Plain;
                self.finish(
                    Node {
                        kind: Kind::Scalar { text, quoted },
                        line,
                    },
                    anchor,
                );
            }
            Event::SequenceStart(anchor, _) => self.stack.push(Open::Seq(Vec::new(), anchor, line)),
            Event::MappingStart(anchor, _) => {
                self.stack.push(Open::Map(Vec::new(), None, anchor, line));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor) = match self.stack.pop() {
                    Some(Open::Seq(items, anchor, line)) => (
                        Node {
                            kind: Kind::Seq(items),
                            line,
                        },
                        anchor,
                    ),
                    Some(Open::Map(pairs, _, anchor, line)) => {
                        let pairs = merge_keys(pairs).unwrap_or_else(|error| {
                            self.error.get_or_insert(error);
                            Vec::new()
                        });
                        (
                            Node {
                                kind: Kind::Map(pairs),
                                line,
                            },
                            anchor,
                        )
                    }
                    None => return,
                };
                self.finish(node, anchor);
            }
            Event::Alias(id) => match self.anchors.get(&id).cloned() {
                Some(node) => self.finish(Node { line, ..node }, 0),
                None => {
                    self.error.get_or_insert(SyntaxError {
                        line,
                        message: "alias refers to an unknown anchor".into(),
                    });
                }
            },
            _ => {}
        }
    }
}

/// Whether `node` is the merge key: a plain (unquoted) `<<`.
fn is_merge_key(node: &Node) -> bool {
    matches!(&node.kind, Kind::Scalar { text, quoted: false } if text == "<<")
}

/// Whether two mapping keys are the same key (scalars of the same text).
fn same_key(a: &Node, b: &Node) -> bool {
    match (&a.kind, &b.kind) {
        (Kind::Scalar { text: a, .. }, Kind::Scalar { text: b, .. }) => a == b,
        _ => false,
    }
}

/// Applies the merge keys of a mapping (<https://yaml.org/type/merge.html>):
/// each `<<` whose value is a map, or a list of maps, contributes the pairs
/// whose keys are not already present. The mapping's own keys win wherever
/// they are written; earlier maps (and earlier `<<` keys) win over later ones.
/// Merged nodes keep the lines they were written on.
fn merge_keys(pairs: Vec<(Node, Node)>) -> Result<Vec<(Node, Node)>, SyntaxError> {
    if !pairs.iter().any(|(key, _)| is_merge_key(key)) {
        return Ok(pairs);
    }
    let (merges, mut out): (Vec<_>, Vec<_>) =
        pairs.into_iter().partition(|(key, _)| is_merge_key(key));
    for (_, value) in merges {
        let sources = match value.kind {
            Kind::Map(pairs) => vec![pairs],
            Kind::Seq(items) => items
                .into_iter()
                .map(|item| match item.kind {
                    Kind::Map(pairs) => Ok(pairs),
                    _ => Err(merge_error(&item)),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(merge_error(&value)),
        };
        for (key, value) in sources.into_iter().flatten() {
            if !out.iter().any(|(present, _)| same_key(present, &key)) {
                out.push((key, value));
            }
        }
    }
    Ok(out)
}

fn merge_error(node: &Node) -> SyntaxError {
    SyntaxError {
        line: node.line,
        message: format!(
            "merge key '<<' needs a map or a list of maps, found {}",
            node.shape()
        ),
    }
}

#[cfg(test)]
mod tests {
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
}
