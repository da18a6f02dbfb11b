//! A YAML document as a tree of nodes that remember their line, so every
//! rules error can name where it is. Built from `yaml-rust2`'s marked events
//! (the parser the `config` crate already uses); anchors and aliases resolve
//! to copies of the anchored node.

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
                    Some(Open::Map(pairs, _, anchor, line)) => (
                        Node {
                            kind: Kind::Map(pairs),
                            line,
                        },
                        anchor,
                    ),
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
}
