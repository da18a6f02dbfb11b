//! A YAML document as a tree of nodes that remember their line, so every
//! rules error can name where it is. Built from `yaml-rust2`'s marked events
//! (the parser the `config` crate already uses); anchors and aliases resolve
//! to copies of the anchored node, and merge keys (`<<: *base`) are applied
//! as each mapping ends, as Go's yaml.v2 (and so envoyproxy/ratelimit) does.
//!
//! Hostile input is refused before it can cost much: characters YAML forbids
//! (a NUL would otherwise end the file silently), nesting deeper than
//! [`MAX_DEPTH`] (the tree is dropped and compiled recursively; an alias
//! counts the levels of what it copies, so a chain of aliases cannot nest
//! past it either), and aliases that copy more than [`alias_budget`] bytes
//! (a "billion laughs" file of a few hundred bytes would otherwise expand to
//! gigabytes). Copies are weighed in bytes, not nodes, so one long anchored
//! string aliased many times is refused as surely as many nested short ones.
//! The events are pulled one at a time, so parsing stops at the first such
//! error.

use std::collections::{HashMap, HashSet};

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// Deepest nesting of lists and maps accepted. A descriptor takes two levels
/// (the list and the map), so this leaves room for descriptors nested far
/// deeper than any request can have entries.
pub const MAX_DEPTH: usize = 100;

/// What one node weighs against the alias budget, besides a scalar's text:
/// about what a node of the tree costs in memory.
pub const NODE_BYTES: usize = 48;

/// Fewest bytes aliases may copy, whatever the file's size.
pub const MIN_ALIAS_BYTES: usize = 16 << 20;

/// The most bytes the anchors and aliases of a `len`-byte text may copy
/// ([`NODE_BYTES`] per node plus each scalar's text): [`MIN_ALIAS_BYTES`],
/// or 32 bytes per byte of text for larger files (at most 128 MiB, as a
/// rules file is at most 4 MiB). Ordinary files (a `<<: *base` of a dozen
/// nodes per descriptor) stay far below it; a file whose aliases multiply
/// is refused at the alias that crosses it, long before its expansion could
/// fill memory.
pub fn alias_budget(len: usize) -> usize {
    MIN_ALIAS_BYTES.max(len.saturating_mul(32))
}

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

    /// The node as JSON: maps become objects (keys as their text), lists
    /// arrays, quoted scalars strings, and plain scalars booleans, integers,
    /// null or strings as YAML reads them (`true`, `10`, `~`, anything else).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match &self.kind {
            Kind::Scalar { text, quoted: true } => Value::String(text.clone()),
            Kind::Scalar { .. } if self.is_null() => Value::Null,
            Kind::Scalar { text, .. } => match text.as_str() {
                "true" | "True" | "TRUE" => Value::Bool(true),
                "false" | "False" | "FALSE" => Value::Bool(false),
                _ => text
                    .parse::<i64>()
                    .map(Value::from)
                    .unwrap_or_else(|_| Value::String(text.clone())),
            },
            Kind::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            Kind::Map(pairs) => Value::Object(
                pairs
                    .iter()
                    .map(|(key, value)| {
                        let key = match &key.kind {
                            Kind::Scalar { text, .. } => text.clone(),
                            _ => key.to_json().to_string(),
                        };
                        (key, value.to_json())
                    })
                    .collect(),
            ),
        }
    }

    /// A short name of the node's shape for error messages.
    pub fn shape(&self) -> &'static str {
        match self.kind {
            Kind::Scalar { .. } => "a scalar",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a map",
        }
    }

    /// What a refusal says it found here: a plain scalar as written, a
    /// quoted one as `the string "…"`, else its shape.
    pub fn found(&self) -> String {
        match &self.kind {
            Kind::Scalar {
                text,
                quoted: false,
            } => text.clone(),
            Kind::Scalar { text, .. } => format!("the string \"{text}\""),
            _ => self.shape().to_owned(),
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
    forbidden_characters(text)?;
    let mut builder = Builder {
        budget: alias_budget(text.len()),
        ..Builder::default()
    };
    let mut parser = Parser::new_from_str(text);
    // Pulled one event at a time rather than through `Parser::load`, which
    // recurses once per level of nesting (a deep file would overflow the
    // stack) and could not stop at our first error.
    loop {
        let (event, mark) = parser.next_token().map_err(|e| SyntaxError {
            line: e.marker().line(),
            message: e.info().to_owned(),
        })?;
        if event == Event::StreamEnd {
            break;
        }
        builder.on_event(event, mark);
        if let Some(error) = builder.error.take() {
            return Err(error);
        }
    }
    Ok(builder.documents)
}

/// Refuses the characters YAML does not allow in a stream: the C0 controls
/// other than tab, line feed and carriage return, DEL, the C1 controls other
/// than NEL, and the non-characters U+FFFE and U+FFFF. The YAML parser takes a
/// NUL for the end of the text, so without this check everything after one
/// would be dropped without a word.
fn forbidden_characters(text: &str) -> Result<(), SyntaxError> {
    let forbidden = |c: char| {
        matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{84}'
            | '\u{86}'..='\u{9f}' | '\u{fffe}' | '\u{ffff}')
    };
    match text.char_indices().find(|&(_, c)| forbidden(c)) {
        None => Ok(()),
        Some((at, c)) => Err(SyntaxError {
            line: 1 + text[..at].bytes().filter(|&b| b == b'\n').count(),
            message: format!(
                "control character U+{:04X} is not allowed in a YAML file",
                u32::from(c)
            ),
        }),
    }
}

enum Open {
    Seq(Vec<Node>, usize, usize),
    Map(Vec<(Node, Node)>, Option<Node>, usize, usize),
}

/// An anchored node, the weight of its subtree, and how many lists and
/// maps deep it goes.
struct Anchored {
    node: Node,
    size: usize,
    height: usize,
}

#[derive(Default)]
struct Builder {
    /// The open lists and maps, innermost last, each with the size of its
    /// subtree so far and the height of its tallest item.
    stack: Vec<(Open, usize, usize)>,
    documents: Vec<Node>,
    /// Anchored nodes by anchor id, with their weights.
    anchors: HashMap<usize, Anchored>,
    /// Bytes copied so far by anchors and aliases.
    copied: usize,
    /// The most bytes anchors and aliases may copy.
    budget: usize,
    error: Option<SyntaxError>,
}

impl Builder {
    /// Counts `size` more copied bytes; an error (at `line`) past the budget.
    fn copy(&mut self, size: usize, line: usize) -> bool {
        self.copied = self.copied.saturating_add(size);
        if self.copied > self.budget {
            self.error.get_or_insert(SyntaxError {
                line,
                message: format!(
                    "rules file expands YAML aliases beyond {} bytes",
                    self.budget
                ),
            });
            return false;
        }
        true
    }

    /// Places `node` (of `size` bytes and `height` levels of lists and
    /// maps) in the list or map being built, keeping it under `anchor`.
    fn finish(&mut self, node: Node, size: usize, height: usize, anchor: usize) {
        if anchor > 0 {
            // Keeping the anchored node is a copy too: nested anchors would
            // otherwise copy a subtree once per level.
            if !self.copy(size, node.line) {
                return;
            }
            self.anchors.insert(
                anchor,
                Anchored {
                    node: node.clone(),
                    size,
                    height,
                },
            );
        }
        match self.stack.last_mut() {
            None => self.documents.push(node),
            Some((open, total, tallest)) => {
                *total = total.saturating_add(size);
                *tallest = (*tallest).max(height);
                match open {
                    Open::Seq(items, _, _) => items.push(node),
                    Open::Map(pairs, pending, _, _) => match pending.take() {
                        None => *pending = Some(node),
                        Some(key) => pairs.push((key, node)),
                    },
                }
            }
        }
    }

    fn open(&mut self, open: Open, line: usize) {
        if self.too_deep(1, line) {
            return;
        }
        self.stack.push((open, NODE_BYTES, 0));
    }

    /// Whether `height` more levels of lists and maps, here, would pass
    /// [`MAX_DEPTH`] (then an error at `line`). An alias counts the levels
    /// of what it copies: a chain of aliases nests without opening any.
    fn too_deep(&mut self, height: usize, line: usize) -> bool {
        if self.stack.len().saturating_add(height) <= MAX_DEPTH {
            return false;
        }
        self.error.get_or_insert(SyntaxError {
            line,
            message: format!("lists and maps nested deeper than {MAX_DEPTH} levels"),
        });
        true
    }

    fn on_event(&mut self, event: Event, mark: Marker) {
        let line = mark.line();
        match event {
            Event::Scalar(text, style, anchor, _) => {
                let quoted = style != TScalarStyle::Plain;
                let weight = NODE_BYTES.saturating_add(text.len());
                self.finish(
                    Node {
                        kind: Kind::Scalar { text, quoted },
                        line,
                    },
                    weight,
                    0,
                    anchor,
                );
            }
            Event::SequenceStart(anchor, _) => self.open(Open::Seq(Vec::new(), anchor, line), line),
            Event::MappingStart(anchor, _) => {
                self.open(Open::Map(Vec::new(), None, anchor, line), line);
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor, size, tallest) = match self.stack.pop() {
                    Some((Open::Seq(items, anchor, line), size, tallest)) => (
                        Node {
                            kind: Kind::Seq(items),
                            line,
                        },
                        anchor,
                        size,
                        tallest,
                    ),
                    Some((Open::Map(pairs, _, anchor, line), size, tallest)) => {
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
                            size,
                            tallest,
                        )
                    }
                    None => return,
                };
                self.finish(node, size, tallest + 1, anchor);
            }
            Event::Alias(id) => {
                let Some((size, height)) = self.anchors.get(&id).map(|a| (a.size, a.height)) else {
                    self.error.get_or_insert(SyntaxError {
                        line,
                        message: "alias refers to an unknown anchor".into(),
                    });
                    return;
                };
                if !self.too_deep(height, line)
                    && self.copy(size, line)
                    && let Some(anchored) = self.anchors.get(&id)
                {
                    let node = Node {
                        line,
                        ..anchored.node.clone()
                    };
                    self.finish(node, size, height, 0);
                }
            }
            _ => {}
        }
    }
}

/// Whether `node` is the merge key: a plain (unquoted) `<<`.
fn is_merge_key(node: &Node) -> bool {
    matches!(&node.kind, Kind::Scalar { text, quoted: false } if text == "<<")
}

/// The text of a scalar key: two keys are the same key when both are
/// scalars of the same text (lists and maps as keys never are).
fn scalar_text(node: &Node) -> Option<String> {
    match &node.kind {
        Kind::Scalar { text, .. } => Some(text.clone()),
        _ => None,
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
    // The scalar keys present (only scalars can be the same key): a set, so
    // that a merge of many keys is not quadratic (300,000 merged keys took
    // 84 s compared pair by pair).
    let mut present: HashSet<String> = out.iter().filter_map(|(key, _)| scalar_text(key)).collect();
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
            let fresh = scalar_text(&key).is_none_or(|text| present.insert(text));
            if fresh {
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
mod tests;
