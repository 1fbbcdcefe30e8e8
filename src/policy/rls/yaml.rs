//! A YAML document as a tree whose every node knows its line, built from
//! yaml-rust2's events: envoyproxy/ratelimit's errors can then name the
//! line of the field they are about.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// One node of the document.
#[derive(Debug, Clone)]
pub(super) enum Node {
    /// A scalar: its text, and whether it was written plain (unquoted),
    /// which decides whether `true` or `5` are a boolean or a number.
    Scalar {
        text: String,
        plain: bool,
        line: usize,
    },
    /// A sequence.
    Seq { items: Vec<Node>, line: usize },
    /// A mapping, in document order.
    Map {
        entries: Vec<(Node, Node)>,
        line: usize,
    },
}

impl Node {
    /// The 1-based line the node starts on.
    pub(super) fn line(&self) -> usize {
        match self {
            Node::Scalar { line, .. } | Node::Seq { line, .. } | Node::Map { line, .. } => *line,
        }
    }

    /// Whether the node is YAML's null (`~`, `null` or nothing).
    pub(super) fn is_null(&self) -> bool {
        matches!(self, Node::Scalar { text, plain: true, .. }
            if text.is_empty() || text == "~" || text.eq_ignore_ascii_case("null"))
    }

    /// What kind of node this is, for messages.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            _ if self.is_null() => "nothing",
            Node::Scalar { .. } => "a scalar",
            Node::Seq { .. } => "a list",
            Node::Map { .. } => "a mapping",
        }
    }
}

/// A syntax error: the line and what the parser said.
pub(super) struct SyntaxError {
    pub(super) line: usize,
    pub(super) message: String,
}

/// The most nodes a document may expand to: a few per line of the
/// largest file read, so only aliases repeating anchors over and over (a
/// "billion laughs") can reach it.
const MAX_NODES: usize = 4_000_000;

/// Parses one YAML document (an empty text is `None`).
pub(super) fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, false).map_err(|e| SyntaxError {
        line: e.marker().line(),
        message: e.info().to_owned(),
    })?;
    if let Some(message) = builder.error {
        return Err(message);
    }
    Ok(builder.done)
}

/// Builds the tree from the parser's events.
#[derive(Default)]
struct Builder {
    /// Open sequences and mappings, with the anchor each was given and
    /// how many nodes they hold so far.
    stack: Vec<(Node, usize, usize)>,
    /// A mapping's key waiting for its value, per open mapping.
    keys: Vec<Option<Node>>,
    /// Anchored nodes, with how many nodes each holds.
    anchors: HashMap<usize, (Node, usize)>,
    /// Nodes built so far, aliases expanded.
    nodes: usize,
    done: Option<Node>,
    error: Option<SyntaxError>,
}

impl Builder {
    fn push_value(&mut self, node: Node, anchor: usize, size: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, (node.clone(), size));
        }
        match self.stack.last_mut() {
            None => {
                self.done.get_or_insert(node);
            }
            Some((Node::Seq { items, .. }, _, held)) => {
                *held += size;
                items.push(node);
            }
            Some((Node::Map { entries, .. }, _, held)) => {
                *held += size;
                let pending = self.keys.last_mut().expect("a key slot per open mapping");
                match pending.take() {
                    None => *pending = Some(node),
                    Some(key) => entries.push((key, node)),
                }
            }
            Some((Node::Scalar { .. }, _, _)) => unreachable!("scalars are never opened"),
        }
    }
}

impl Builder {
    /// Counts `size` more nodes; false (with the error set) past the
    /// budget, after which events are ignored.
    fn budget(&mut self, size: usize, line: usize) -> bool {
        self.nodes = self.nodes.saturating_add(size);
        if self.nodes > MAX_NODES {
            self.error.get_or_insert(SyntaxError {
                line,
                message: format!(
                    "the document expands to more than {MAX_NODES} nodes (aliases repeating \
                     anchors); write the descriptors out"
                ),
            });
            return false;
        }
        true
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let line = mark.line();
        if self.error.is_some() {
            return;
        }
        match ev {
            Event::Scalar(text, style, anchor, _tag) => {
                if self.budget(1, line) {
                    let plain = style == TScalarStyle::Plain;
                    self.push_value(Node::Scalar { text, plain, line }, anchor, 1);
                }
            }
            Event::SequenceStart(anchor, _) => self.stack.push((
                Node::Seq {
                    items: Vec::new(),
                    line,
                },
                anchor,
                1,
            )),
            Event::MappingStart(anchor, _) => {
                self.stack.push((
                    Node::Map {
                        entries: Vec::new(),
                        line,
                    },
                    anchor,
                    1,
                ));
                self.keys.push(None);
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((node, anchor, size)) = self.stack.pop() {
                    if matches!(node, Node::Map { .. }) {
                        self.keys.pop();
                    }
                    if self.budget(1, line) {
                        self.push_value(node, anchor, size);
                    }
                }
            }
            Event::Alias(id) => match self.anchors.get(&id).map(|(_, size)| *size) {
                Some(size) => {
                    // Checked before the copy: the copy is what could
                    // exhaust memory.
                    if self.budget(size, line) {
                        let node = self.anchors[&id].0.clone();
                        self.push_value(node, 0, size);
                    }
                }
                None => {
                    self.error.get_or_insert(SyntaxError {
                        line,
                        message: "alias to an unknown anchor".into(),
                    });
                }
            },
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}
