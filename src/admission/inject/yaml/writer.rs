//! The writer: every node drafs did not change written exactly as parsed,
//! what drafs adds in a form every YAML reader reads the same way.

use super::*;

/// What to write at one place of the output.
pub(super) enum Out<'a> {
    /// A node as parsed (`copy`: written somewhere else than its own place, without its anchors).
    Node {
        node: &'a Node,
        copy: bool,
    },
    /// A value of drafs's own.
    Fresh(&'a Value),
    FreshKey(&'a str),
    Map {
        props: Option<(&'a Props, bool)>,
        entries: Vec<(Out<'a>, Out<'a>)>,
    },
    Seq {
        props: Option<(&'a Props, bool)>,
        items: Vec<Out<'a>>,
    },
}

/// How an [`Out`] is laid out.
pub(super) enum Shape<'a> {
    /// On the line of its key or dash (a scalar, an alias, an empty collection), properties included.
    Inline(String),
    /// A `|` block scalar.
    Literal {
        props: String,
        text: &'a str,
    },
    Map {
        props: String,
        entries: Vec<(Out<'a>, Out<'a>)>,
    },
    Seq {
        props: String,
        items: Vec<Out<'a>>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Ctx {
    Root,
    /// After `key:`, the key at the given indentation.
    MapValue,
    /// After `-`, the dash at the given indentation.
    Item,
}

/// Block-style YAML, two spaces per level, lists at their key's indentation.
pub(super) struct Writer<'a> {
    pub(super) doc: &'a Document,
    /// Write aliases as copies of their nodes, and no anchors.
    pub(super) expand: bool,
    pub(super) out: String,
}

impl<'a> Writer<'a> {
    fn props(&self, props: &Props, copy: bool) -> String {
        let mut out = String::new();
        if props.anchor != 0 && !copy && !self.expand {
            out.push('&');
            out.push_str(&self.doc.name(props.anchor));
        }
        if let Some(tag) = &props.tag {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&tag_text(tag));
        }
        out
    }

    pub(super) fn shape(&self, out: Out<'a>) -> Shape<'a> {
        let join =
            |props: String, text: &str| if props.is_empty() { text.to_string() } else { format!("{props} {text}") };
        match out {
            Out::Node { node: Node::Alias(id), .. } if self.expand => match self.doc.anchors.get(id) {
                Some(node) => self.shape(Out::Node { node, copy: true }),
                None => Shape::Inline("null".into()),
            },
            Out::Node { node: Node::Alias(id), .. } => Shape::Inline(format!("*{}", self.doc.name(*id))),
            Out::Node { node: Node::Scalar { text, style, props }, copy } => {
                let props = self.props(props, copy);
                match render(text, *style) {
                    Some(inline) => Shape::Inline(join(props, &inline)),
                    None => Shape::Literal { props, text },
                }
            }
            Out::Node { node: Node::Seq { items, props }, copy } => Shape::Seq {
                props: self.props(props, copy),
                items: items.iter().map(|node| Out::Node { node, copy }).collect(),
            },
            Out::Node { node: Node::Map { entries, props }, copy } => Shape::Map {
                props: self.props(props, copy),
                entries: entries
                    .iter()
                    .map(|(k, v)| (Out::Node { node: k, copy }, Out::Node { node: v, copy }))
                    .collect(),
            },
            Out::Fresh(Value::Object(map)) => Shape::Map {
                props: String::new(),
                entries: map.iter().map(|(k, v)| (Out::FreshKey(k), Out::Fresh(v))).collect(),
            },
            Out::Fresh(Value::Array(items)) => {
                Shape::Seq { props: String::new(), items: items.iter().map(Out::Fresh).collect() }
            }
            Out::Fresh(Value::String(s)) => Shape::Inline(fresh_string(s)),
            Out::FreshKey(s) => Shape::Inline(fresh_string(s)),
            Out::Fresh(other) => Shape::Inline(other.to_string()),
            Out::Map { props, entries } => {
                Shape::Map { props: props.map(|(p, c)| self.props(p, c)).unwrap_or_default(), entries }
            }
            Out::Seq { props, items } => {
                Shape::Seq { props: props.map(|(p, c)| self.props(p, c)).unwrap_or_default(), items }
            }
        }
    }

    fn indent(&mut self, n: usize) {
        self.out.extend(std::iter::repeat_n(' ', n));
    }

    /// Write a value after its key or dash (at column `indent`), or as the document.
    pub(super) fn value(&mut self, shape: Shape<'a>, indent: usize, ctx: Ctx) {
        let space = |props: &str| if props.is_empty() { String::new() } else { format!(" {props}") };
        match shape {
            Shape::Inline(text) => {
                if ctx != Ctx::Root && !text.is_empty() {
                    self.out.push(' ');
                }
                self.out.push_str(&text);
                self.out.push('\n');
            }
            Shape::Literal { props, text } if ctx == Ctx::Root => {
                self.value(Shape::Inline(format!("{}{}", props, double_quoted(text))), indent, ctx)
            }
            Shape::Literal { props, text } => {
                let body = text.trim_end_matches('\n');
                let chomp = match text.len() - body.len() {
                    0 => "-",
                    1 => "",
                    _ => "+",
                };
                self.out.push_str(&space(&props));
                self.out.push_str(&format!(" |{chomp}\n"));
                for line in body.split('\n') {
                    if !line.is_empty() {
                        self.indent(indent + 2);
                        self.out.push_str(line);
                    }
                    self.out.push('\n');
                }
                for _ in 1..text.len() - body.len() {
                    self.out.push('\n');
                }
            }
            Shape::Map { props, entries } if entries.is_empty() => self.value(
                Shape::Inline(format!("{}{{}}", if props.is_empty() { props } else { props + " " })),
                indent,
                ctx,
            ),
            Shape::Seq { props, items } if items.is_empty() => self.value(
                Shape::Inline(format!("{}[]", if props.is_empty() { props } else { props + " " })),
                indent,
                ctx,
            ),
            Shape::Map { props, entries } => match ctx {
                Ctx::Root => {
                    if !props.is_empty() {
                        self.out.push_str(&props);
                        self.out.push('\n');
                    }
                    self.entries(entries, 0, false);
                }
                Ctx::MapValue => {
                    self.out.push_str(&space(&props));
                    self.out.push('\n');
                    self.entries(entries, indent + 2, false);
                }
                Ctx::Item if props.is_empty() => {
                    self.out.push(' ');
                    self.entries(entries, indent + 2, true);
                }
                Ctx::Item => {
                    self.out.push_str(&space(&props));
                    self.out.push('\n');
                    self.entries(entries, indent + 2, false);
                }
            },
            Shape::Seq { props, items } => match ctx {
                Ctx::Root => {
                    if !props.is_empty() {
                        self.out.push_str(&props);
                        self.out.push('\n');
                    }
                    self.items(items, 0, false);
                }
                Ctx::MapValue if props.is_empty() => {
                    self.out.push('\n');
                    self.items(items, indent, false);
                }
                Ctx::Item if props.is_empty() => {
                    self.out.push(' ');
                    self.items(items, indent + 2, true);
                }
                Ctx::MapValue | Ctx::Item => {
                    self.out.push_str(&space(&props));
                    self.out.push('\n');
                    self.items(items, indent + 2, false);
                }
            },
        }
    }

    fn entries(&mut self, entries: Vec<(Out<'a>, Out<'a>)>, indent: usize, first_inline: bool) {
        for (i, (k, v)) in entries.into_iter().enumerate() {
            if i > 0 || !first_inline {
                self.indent(indent);
            }
            // A quoted key every reader reads as the same string is written plain
            // (JSON input quotes every key); values keep their quotes.
            let k = match k {
                Out::Node { node: Node::Scalar { text, style, props }, .. }
                    if props.anchor == 0
                        && props.tag.is_none()
                        && matches!(style, ScalarStyle::SingleQuoted | ScalarStyle::DoubleQuoted)
                        && fresh_string(text) == *text =>
                {
                    Out::FreshKey(text)
                }
                other => other,
            };
            let key = match self.shape(k) {
                Shape::Inline(text) if text.starts_with('*') => text + " ",
                Shape::Inline(text) if text.is_empty() => "~".into(),
                Shape::Inline(text) => text,
                Shape::Literal { props, text } => {
                    if props.is_empty() {
                        double_quoted(text)
                    } else {
                        format!("{props} {}", double_quoted(text))
                    }
                }
                // The parser refuses collection keys.
                Shape::Map { .. } | Shape::Seq { .. } => "~".into(),
            };
            self.out.push_str(&key);
            self.out.push(':');
            let shape = self.shape(v);
            self.value(shape, indent, Ctx::MapValue);
        }
    }

    fn items(&mut self, items: Vec<Out<'a>>, indent: usize, first_inline: bool) {
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 || !first_inline {
                self.indent(indent);
            }
            self.out.push('-');
            let shape = self.shape(item);
            self.value(shape, indent, Ctx::Item);
        }
    }
}

/// A tag as written: `!!int`, `!local`, `!` or `!<tag:example.com,2000:x>`.
pub(super) fn tag_text(tag: &Tag) -> String {
    let full = full_tag(tag);
    let simple = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    match (full.strip_prefix(CORE), tag.parts()) {
        (Some(kind), _) if simple(kind) => format!("!!{kind}"),
        (_, ("!", suffix)) if simple(suffix) => format!("!{suffix}"),
        _ if full == "!" => "!".into(),
        _ => format!("!<{full}>"),
    }
}

/// A parsed scalar as it was written: `None` for a `|` block.
pub(super) fn render(text: &str, style: ScalarStyle) -> Option<String> {
    let one_line = !text.contains('\n')
        && text.chars().all(|c| c == '\t' || printable(c))
        && !text.starts_with([' ', '\t'])
        && !text.ends_with([' ', '\t']);
    Some(match style {
        // A plain scalar's own text (or nothing, for an empty one: null).
        ScalarStyle::Plain if one_line || text.is_empty() => text.to_string(),
        ScalarStyle::SingleQuoted if text.chars().all(|c| c == '\t' || printable(c)) && !text.contains('\n') => {
            format!("'{}'", text.replace('\'', "''"))
        }
        ScalarStyle::Literal | ScalarStyle::Folded if literal_ok(text) => return None,
        // Double-quoted, and what else cannot be written as it was: a string either way.
        _ => double_quoted(text),
    })
}

/// Whether `text` can be a `|` block as [`Writer::value`] writes one.
pub(super) fn literal_ok(text: &str) -> bool {
    !text.is_empty()
        && !text.starts_with([' ', '\t', '\n'])
        && text.chars().all(|c| c == '\n' || c == '\t' || printable(c))
}

/// Characters written as they are (YAML's printable set, less the BOM and the
/// characters YAML 1.1 reads as line breaks).
pub(super) fn printable(c: char) -> bool {
    matches!(c, ' '..='~' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
        && !matches!(c, '\u{feff}' | '\u{2028}' | '\u{2029}')
}

pub(super) fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            '\u{1b}' => out.push_str("\\e"),
            c if printable(c) => out.push(c),
            c if (c as u32) <= 0xff => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// A string of drafs's own: plain when every YAML reader (1.1 or 1.2) reads
/// it as this string, else double-quoted.
pub(super) fn fresh_string(s: &str) -> String {
    let b = s.as_bytes();
    let plain = !s.is_empty()
        && s.len() <= 1024
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"/._=:@+-,".contains(c))
        && (b[0].is_ascii_alphanumeric() || b"/_.".contains(&b[0]) || (b[0] == b'-' && b.len() > 1))
        && !s.ends_with(':')
        && resolve(s) == Resolved::Str
        // Sexagesimal numbers and timestamps to YAML 1.1 readers other than go-yaml.
        && !(b[0].is_ascii_digit() && (s.contains(':') || (b.len() > 4 && b[4] == b'-')));
    if plain { s.to_string() } else { double_quoted(s) }
}
