//! A YAML document as a tree whose every node knows its line, built from saphyr-parser's
//! events: what the configuration reader needs to walk a file key by key and say where each
//! problem is. Scalars are typed by YAML 1.2's core schema, as serde_yaml did (so `yes` is a
//! string, `True` a boolean, `0x10` an integer).

use saphyr_parser::{Event, Parser, ScalarStyle};

/// One node of the document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    /// 1-based line where the node starts.
    pub(crate) line: usize,
    /// What it holds.
    pub(crate) value: Value,
}

/// A node's content.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// `~`, `null`, or nothing at all.
    Null,
    /// A scalar: its text, and whether it was written plain (unquoted, not a block), which
    /// is what lets it be a number, a boolean or null.
    Scalar {
        /// The text.
        text: String,
        /// Plain style.
        plain: bool,
        /// Literal block style (`|`): the text keeps the file's lines, one for one.
        literal: bool,
    },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, entries in document order, duplicates kept.
    Map(Vec<(Node, Node)>),
}

/// A scalar as YAML's core schema reads it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Typed<'a> {
    /// Null.
    Null,
    /// `true`/`false` (any capitalisation YAML allows).
    Bool(bool),
    /// An integer (decimal, `0x`, `0o`).
    Int(i128),
    /// A floating-point number.
    Float(f64),
    /// Anything else.
    Str(&'a str),
}

impl Node {
    /// The scalar typed by YAML's core schema; `None` for a sequence or mapping.
    pub(crate) fn typed(&self) -> Option<Typed<'_>> {
        match &self.value {
            Value::Null => Some(Typed::Null),
            Value::Scalar {
                text, plain: false, ..
            } => Some(Typed::Str(text)),
            Value::Scalar {
                text, plain: true, ..
            } => Some(core_schema(text)),
            Value::Seq(_) | Value::Map(_) => None,
        }
    }

    /// The scalar's text whatever its type (`9000` and `true` read as text, as serde_yaml
    /// reads them into a string); `None` for null, a sequence or a mapping.
    pub(crate) fn text(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar { text, .. } if self.typed() != Some(Typed::Null) => Some(text),
            _ => None,
        }
    }

    /// The file line of each line of the scalar's text: one for one for a literal block
    /// (saphyr places the node at its first non-blank line; leading blank lines are lines
    /// of the text too), every line at the node's own line otherwise (folded and quoted
    /// scalars join the file's lines).
    pub(crate) fn text_lines(&self) -> Vec<usize> {
        let Value::Scalar { text, literal, .. } = &self.value else {
            return Vec::new();
        };
        let count = text.split('\n').count();
        if !literal {
            return vec![self.line; count];
        }
        let leading = text.bytes().take_while(|b| *b == b'\n').count();
        let first = self.line.saturating_sub(leading).max(1);
        (0..count).map(|i| first + i).collect()
    }

    /// What the node is, for "invalid type" messages, in serde's words: `string "yes"`,
    /// ``integer `-1` ``, `sequence`, `map`, ...
    pub(crate) fn describe(&self) -> String {
        match self.typed() {
            None if matches!(self.value, Value::Seq(_)) => "sequence".into(),
            None => "map".into(),
            Some(Typed::Null) => "null".into(),
            Some(Typed::Bool(b)) => format!("boolean `{b}`"),
            Some(Typed::Int(n)) => format!("integer `{n}`"),
            Some(Typed::Float(f)) => format!("floating point `{f}`"),
            Some(Typed::Str(s)) => format!("string {s:?}"),
        }
    }
}

fn core_schema(text: &str) -> Typed<'_> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Typed::Null,
        "true" | "True" | "TRUE" => return Typed::Bool(true),
        "false" | "False" | "FALSE" => return Typed::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Typed::Float(f64::INFINITY)
        }
        "-.inf" | "-.Inf" | "-.INF" => return Typed::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Typed::Float(f64::NAN),
        _ => {}
    }
    if let Some(n) = int(text) {
        return Typed::Int(n);
    }
    let float_like = text
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
        && text.bytes().any(|b| b.is_ascii_digit());
    match text.parse::<f64>() {
        Ok(f) if float_like => Typed::Float(f),
        _ => Typed::Str(text),
    }
}

fn int(text: &str) -> Option<i128> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (radix, digits) = if let Some(hex) = digits.strip_prefix("0x") {
        (16, hex)
    } else if let Some(oct) = digits.strip_prefix("0o") {
        (8, oct)
    } else {
        (10, digits)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    // Too long for i128 is still an integer; saturate so range checks reject it.
    let n = i128::from_str_radix(digits, radix).unwrap_or(i128::MAX);
    Some(if negative { -n } else { n })
}

/// A syntax error, with its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    /// 1-based line.
    pub(crate) line: usize,
    /// What the parser said.
    pub(crate) message: String,
}

/// Parses the first document of `text` (`Ok(None)` for an empty stream); a second document
/// is an error.
pub(crate) fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut builder = Builder::default();
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| SyntaxError {
            line: e.marker().line(),
            message: e.info().to_owned(),
        })?;
        let line = span.start.line();
        match event {
            Event::DocumentStart(_) => {
                builder.documents += 1;
                if builder.documents > 1 {
                    return Err(SyntaxError {
                        line,
                        message: "a second YAML document: the file must hold exactly one".into(),
                    });
                }
            }
            Event::Scalar(text, style, anchor, tag) => {
                // A `!!str` tag makes a plain scalar a string; other tags are not used here.
                let is_str = tag.as_ref().is_some_and(|t| t.suffix == "str");
                let value = Value::Scalar {
                    text: text.into_owned(),
                    plain: style == ScalarStyle::Plain && !is_str,
                    literal: style == ScalarStyle::Literal,
                };
                builder.push(Node { line, value }, anchor);
            }
            Event::SequenceStart(anchor, _) => builder.open(line, Value::Seq(Vec::new()), anchor),
            Event::MappingStart(anchor, _) => builder.open(line, Value::Map(Vec::new()), anchor),
            Event::SequenceEnd | Event::MappingEnd => builder.close(),
            Event::Alias(id) => {
                let node = builder
                    .anchors
                    .iter()
                    .rev()
                    .find(|(a, _)| *a == id)
                    .map(|(_, n)| n.clone())
                    .unwrap_or(Node {
                        line,
                        value: Value::Null,
                    });
                builder.push(Node { line, ..node }, 0);
            }
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {}
        }
    }
    Ok(builder.root)
}

#[derive(Default)]
struct Builder {
    /// Open collections, innermost last, with their anchor and (for a mapping) a key
    /// waiting for its value.
    stack: Vec<(Node, usize, Option<Node>)>,
    anchors: Vec<(usize, Node)>,
    root: Option<Node>,
    documents: usize,
}

impl Builder {
    fn open(&mut self, line: usize, value: Value, anchor: usize) {
        self.stack.push((Node { line, value }, anchor, None));
    }

    fn close(&mut self) {
        if let Some((node, anchor, _)) = self.stack.pop() {
            self.push(node, anchor);
        }
    }

    /// Adds a finished node to the collection it is in (or makes it the root).
    fn push(&mut self, node: Node, anchor: usize) {
        if anchor != 0 {
            self.anchors.push((anchor, node.clone()));
        }
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some((parent, _, pending_key)) => match &mut parent.value {
                Value::Seq(items) => items.push(node),
                Value::Map(entries) => match pending_key.take() {
                    None => *pending_key = Some(node),
                    Some(key) => entries.push((key, node)),
                },
                Value::Null | Value::Scalar { .. } => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(text: &str) -> Typed<'_> {
        core_schema(text)
    }

    #[test]
    fn core_schema_types() {
        assert_eq!(scalar("9000"), Typed::Int(9000));
        assert_eq!(scalar("0x10"), Typed::Int(16));
        assert_eq!(scalar("-1"), Typed::Int(-1));
        assert_eq!(scalar("True"), Typed::Bool(true));
        assert_eq!(scalar("yes"), Typed::Str("yes"));
        assert_eq!(scalar("~"), Typed::Null);
        assert_eq!(scalar("4.5"), Typed::Float(4.5));
        assert_eq!(scalar("1e3"), Typed::Float(1000.0));
        assert_eq!(scalar("1_000"), Typed::Str("1_000"));
        assert_eq!(scalar("127.0.0.1:9000"), Typed::Str("127.0.0.1:9000"));
        assert_eq!(scalar("e"), Typed::Str("e"));
    }

    #[test]
    fn nodes_know_their_lines() {
        let doc = parse(
            "# c\nbind: x\napplications:\n  - name: a\n    directives: |\n      SecRuleEngine On\n",
        )
        .unwrap()
        .unwrap();
        let Value::Map(top) = &doc.value else {
            panic!("{doc:?}")
        };
        assert_eq!(top[0].0.line, 2);
        assert_eq!(top[1].0.line, 3);
        let Value::Seq(apps) = &top[1].1.value else {
            panic!()
        };
        let Value::Map(app) = &apps[0].value else {
            panic!()
        };
        assert_eq!((app[0].0.line, app[1].0.line), (4, 5));
        assert_eq!(app[1].1.text(), Some("SecRuleEngine On\n"));
        assert_eq!(app[0].1.typed(), Some(Typed::Str("a")));
    }

    #[test]
    fn quoted_scalars_are_strings_and_aliases_resolve() {
        let doc = parse("a: &x '4'\nb: *x\nc: 4\nd:\n").unwrap().unwrap();
        let Value::Map(m) = &doc.value else { panic!() };
        assert_eq!(m[0].1.typed(), Some(Typed::Str("4")));
        assert_eq!(m[1].1.typed(), Some(Typed::Str("4")));
        assert_eq!(m[1].1.line, 2);
        assert_eq!(m[2].1.typed(), Some(Typed::Int(4)));
        assert_eq!(m[3].1.typed(), Some(Typed::Null));
        assert_eq!(m[3].1.text(), None);
    }

    #[test]
    fn literal_blocks_keep_their_lines() {
        let doc = parse("a: |\n  x\n  y\nb: >\n  p\n  q\nc: |-\n\n  z\nd: one\n")
            .unwrap()
            .unwrap();
        let Value::Map(m) = &doc.value else { panic!() };
        assert_eq!(m[0].1.text_lines(), [2, 3, 4]);
        assert_eq!(m[1].1.text_lines(), [5, 5]);
        assert_eq!(m[2].1.text_lines(), [8, 9]);
        assert_eq!(m[3].1.text_lines(), [10]);
    }

    #[test]
    fn syntax_errors_and_documents() {
        let e = parse("a: 1\nb: [\n").unwrap_err();
        assert!(e.line >= 2, "{e:?}");
        assert_eq!(parse("").unwrap(), None);
        let e = parse("a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!(e.line, 2);
    }
}
