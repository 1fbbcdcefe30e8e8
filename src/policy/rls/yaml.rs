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
    /// Open sequences and mappings, with the anchor each was given.
    stack: Vec<(Node, usize)>,
    /// A mapping's key waiting for its value, per open mapping.
    keys: Vec<Option<Node>>,
    anchors: HashMap<usize, Node>,
    done: Option<Node>,
    error: Option<SyntaxError>,
}

impl Builder {
    fn push_value(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => {
                self.done.get_or_insert(node);
            }
            Some((Node::Seq { items, .. }, _)) => items.push(node),
            Some((Node::Map { entries, .. }, _)) => {
                let pending = self.keys.last_mut().expect("a key slot per open mapping");
                match pending.take() {
                    None => *pending = Some(node),
                    Some(key) => entries.push((key, node)),
                }
            }
            Some((Node::Scalar { .. }, _)) => unreachable!("scalars are never opened"),
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let line = mark.line();
        match ev {
            Event::Scalar(text, style, anchor, _tag) => {
                let plain = style == TScalarStyle::Plain;
                self.push_value(Node::Scalar { text, plain, line }, anchor);
            }
            Event::SequenceStart(anchor, _) => self.stack.push((
                Node::Seq {
                    items: Vec::new(),
                    line,
                },
                anchor,
            )),
            Event::MappingStart(anchor, _) => {
                self.stack.push((
                    Node::Map {
                        entries: Vec::new(),
                        line,
                    },
                    anchor,
                ));
                self.keys.push(None);
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((node, anchor)) = self.stack.pop() {
                    if matches!(node, Node::Map { .. }) {
                        self.keys.pop();
                    }
                    self.push_value(node, anchor);
                }
            }
            Event::Alias(id) => match self.anchors.get(&id).cloned() {
                Some(node) => self.push_value(node, 0),
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
