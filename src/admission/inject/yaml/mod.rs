//! YAML documents for `drafs inject`, written back as they were read.
//!
//! kubectl reads manifests as YAML 1.1 (go-yaml v2 behind sigs.k8s.io/yaml):
//! a plain `0644` is the integer 420, a plain `yes` is true, `1e3` is a float.
//! A round trip through a YAML 1.2 library silently changes such scalars (the
//! mode 0644 became 644). So a document is kept as parsed (scalar text and
//! quoting, tags, anchors and aliases), drafs works on the values kubectl reads
//! ([`Document::value`]), and [`Document::emit`] writes every node drafs did not
//! change exactly as it was; only what drafs adds is written from its values, in
//! a form every YAML reader reads the same way. Each output is read back and
//! compared with what drafs meant before it is returned.
//!
//! Here: the document as parsed and its values; `scalar`: how kubectl reads a
//! plain scalar; `writer`: the output.

use std::collections::HashMap;

use granit_parser::{Event, Options, Parser, ScalarStyle, Tag};
use serde_json::{Map, Number, Value};

/// The YAML tag namespace of the standard types (`!!str`, `!!int`...).
const CORE: &str = "tag:yaml.org,2002:";
/// Values one document may read as once aliases are expanded: a bound on
/// "billion laughs" documents.
const MAX_VALUES: usize = 1_000_000;
/// How deep a document may nest once aliases are expanded.
const MAX_DEPTH: usize = 512;

mod scalar;
mod writer;

use scalar::*;
use writer::*;

#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    #[error("{0}")]
    Syntax(String),
    #[error("{0}")]
    Invalid(String),
    #[error("the output would not read back as the manifest drafs meant (please report this): {0}")]
    ReadBack(String),
}

/// A node's anchor (0: none) and tag, as written.
#[derive(Debug, Clone, Default)]
struct Props {
    anchor: usize,
    tag: Option<Tag>,
}

#[derive(Debug, Clone)]
enum Node {
    Scalar { text: String, style: ScalarStyle, props: Props },
    Seq { items: Vec<Node>, props: Props },
    Map { entries: Vec<(Node, Node)>, props: Props },
    Alias(usize),
}

/// One YAML document: its nodes as parsed and its anchors.
#[derive(Debug, Default)]
pub struct Document {
    root: Option<Node>,
    /// Each anchored node as defined, by anchor id.
    anchors: HashMap<usize, Node>,
    names: HashMap<usize, String>,
}

enum Frame {
    Seq(Vec<Node>, Props),
    Map(Vec<(Node, Node)>, Option<Node>, Props),
}

/// Parse every document of `text`.
pub fn parse(text: &str) -> Result<Vec<Document>, YamlError> {
    let mut options = Options::default();
    options.emit_anchor_events = true;
    options.emit_comments = false;
    let mut docs = Vec::new();
    let mut doc = Document::default();
    let mut stack: Vec<Frame> = Vec::new();
    for item in Parser::new_from_str_with_options(text, options) {
        let (event, span) = item.map_err(|e| YamlError::Syntax(e.to_string()))?;
        let at = |what: &str| YamlError::Invalid(format!("line {}: {what}", span.start.line()));
        let node = match event {
            Event::DocumentStart(..) => {
                doc = Document::default();
                stack.clear();
                continue;
            }
            Event::DocumentEnd => {
                docs.push(std::mem::take(&mut doc));
                continue;
            }
            Event::Anchor(id, name) => {
                doc.names.insert(id, name.into_owned());
                continue;
            }
            Event::SequenceStart(_, anchor, tag) => {
                stack.push(Frame::Seq(Vec::new(), Props { anchor, tag: tag.map(|t| t.into_owned()) }));
                continue;
            }
            Event::MappingStart(_, anchor, tag) => {
                stack.push(Frame::Map(Vec::new(), None, Props { anchor, tag: tag.map(|t| t.into_owned()) }));
                continue;
            }
            Event::SequenceEnd => match stack.pop() {
                Some(Frame::Seq(items, props)) => Node::Seq { items, props },
                _ => return Err(at("unbalanced sequence")),
            },
            Event::MappingEnd => match stack.pop() {
                Some(Frame::Map(entries, None, props)) => Node::Map { entries, props },
                _ => return Err(at("unbalanced mapping")),
            },
            Event::Scalar(text, style, anchor, tag) => Node::Scalar {
                text: text.into_owned(),
                style,
                props: Props { anchor, tag: tag.map(|t| t.into_owned()) },
            },
            Event::Alias(id) => {
                if !doc.anchors.contains_key(&id) {
                    return Err(at("an alias refers to the node that contains it"));
                }
                Node::Alias(id)
            }
            Event::UnresolvedAlias(name) => return Err(at(&format!("alias *{name} has no anchor before it"))),
            _ => continue,
        };
        if let Some(anchor) = node.props().map(|p| p.anchor).filter(|a| *a != 0) {
            doc.anchors.insert(anchor, node.clone());
        }
        match stack.last_mut() {
            None => doc.root = Some(node),
            Some(Frame::Seq(items, _)) => items.push(node),
            Some(Frame::Map(_, pending @ None, _)) => {
                if matches!(node, Node::Seq { .. } | Node::Map { .. }) {
                    return Err(at("a mapping key is a collection (Kubernetes manifests have scalar keys)"));
                }
                *pending = Some(node);
            }
            Some(Frame::Map(entries, pending, _)) => {
                let key = pending.take().expect("matched Some above");
                entries.push((key, node));
            }
        }
    }
    Ok(docs)
}

impl Node {
    fn props(&self) -> Option<&Props> {
        match self {
            Node::Scalar { props, .. } | Node::Seq { props, .. } | Node::Map { props, .. } => Some(props),
            Node::Alias(_) => None,
        }
    }
}

/// A plain `<<` key (or one tagged `!!merge`): its value's entries are merged in.
fn is_merge(key: &Node) -> bool {
    match key {
        Node::Scalar { text, style, props } => {
            text == "<<"
                && match &props.tag {
                    None => *style == ScalarStyle::Plain,
                    Some(tag) => full_tag(tag) == format!("{CORE}merge"),
                }
        }
        _ => false,
    }
}

fn full_tag(tag: &Tag) -> String {
    let (handle, suffix) = tag.parts();
    format!("{handle}{suffix}")
}

impl Document {
    fn target(&self, id: usize) -> Result<&Node, YamlError> {
        self.anchors.get(&id).ok_or_else(|| YamlError::Invalid("an alias without its anchor".into()))
    }

    /// `node`, or the node its alias names.
    fn deref<'a>(&'a self, node: &'a Node) -> Result<&'a Node, YamlError> {
        match node {
            Node::Alias(id) => self.target(*id),
            other => Ok(other),
        }
    }

    /// What kubectl reads: YAML 1.1 scalars as go-yaml v2 resolves them, aliases
    /// and merge keys expanded (the last of repeated keys wins). `Null` for an
    /// empty document. Floats JSON cannot hold (`.inf`, `.nan`) are kept as their
    /// text: kubectl cannot send them either.
    pub fn value(&self) -> Result<Value, YamlError> {
        match &self.root {
            None => Ok(Value::Null),
            Some(root) => Reader { doc: self, left: MAX_VALUES }.value(root, 0),
        }
    }

    /// The document with `new`'s content (`old` being [`Document::value`]):
    /// what did not change is written as it was, what drafs added from `new`.
    pub fn emit(&self, old: &Value, new: &Value) -> Result<String, YamlError> {
        let Some(root) = &self.root else { return Ok(String::new()) };
        let mut last = String::new();
        // With anchors and aliases kept first; if a change moved what an alias
        // means (drafs changed its anchored node), with every alias expanded.
        for expand in [false, true] {
            let out = self.rebuild(root, old, new, false)?;
            let mut writer = Writer { doc: self, expand, out: String::new() };
            let shape = writer.shape(out);
            writer.value(shape, 0, Ctx::Root);
            match read_back(&writer.out) {
                Ok(back) if back == *new => return Ok(writer.out),
                Ok(_) => last = "a value differs".into(),
                Err(e) => last = e.to_string(),
            }
        }
        Err(YamlError::ReadBack(last))
    }

    /// What to write for `node`, which reads as `old`, so that it reads as `new`.
    fn rebuild<'a>(&'a self, node: &'a Node, old: &Value, new: &'a Value, copy: bool) -> Result<Out<'a>, YamlError> {
        if old == new {
            return Ok(Out::Node { node, copy });
        }
        match (node, old, new) {
            // The changed content of an alias is written in its place, a copy.
            (Node::Alias(id), ..) => self.rebuild(self.target(*id)?, old, new, true),
            (Node::Map { entries, props }, Value::Object(o), Value::Object(n)) => {
                self.rebuild_map(entries, props, o, n, copy)
            }
            (Node::Seq { items, props }, Value::Array(o), Value::Array(n)) => {
                let mut out = Vec::new();
                let mut next = 0;
                for value in n {
                    // The same element further on (others were removed), or one with
                    // the same name (changed), or a new one.
                    let found = (next..o.len())
                        .find(|&i| o[i] == *value)
                        .or_else(|| (next..o.len()).find(|&i| same_name(&o[i], value)));
                    match found {
                        Some(i) => {
                            out.push(self.rebuild(&items[i], &o[i], value, copy)?);
                            next = i + 1;
                        }
                        None => out.push(Out::Fresh(value)),
                    }
                }
                Ok(Out::Seq { props: Some((props, copy)), items: out })
            }
            _ => Ok(Out::Fresh(new)),
        }
    }

    fn rebuild_map<'a>(
        &'a self,
        entries: &'a [(Node, Node)],
        props: &'a Props,
        old: &Map<String, Value>,
        new: &'a Map<String, Value>,
        copy: bool,
    ) -> Result<Out<'a>, YamlError> {
        let mut keys = Vec::with_capacity(entries.len());
        for (k, _) in entries {
            keys.push(if is_merge(k) { None } else { Some(self.key(k)?) });
        }
        let mut seen = std::collections::HashSet::new();
        let plain = keys.iter().all(|k| k.as_ref().is_some_and(|k| seen.insert(k.clone())));
        let mut out = Vec::new();
        if plain {
            // Each entry where it was; drafs's new keys after them.
            for ((k, v), key) in entries.iter().zip(keys) {
                let key = key.expect("no merge keys here");
                if let (Some(o), Some(n)) = (old.get(&key), new.get(&key)) {
                    out.push((Out::Node { node: k, copy }, self.rebuild(v, o, n, copy)?));
                }
            }
        } else {
            // Merge keys or repeated keys: every key written once, from the node
            // that gives it its value.
            let mut sources = HashMap::new();
            self.sources(entries, copy, &mut sources, 0)?;
            for (key, n) in new {
                if let (Some((k, v, copy)), Some(o)) = (sources.get(key), old.get(key)) {
                    out.push((Out::Node { node: k, copy: *copy }, self.rebuild(v, o, n, *copy)?));
                }
            }
        }
        for (key, n) in new {
            if !old.contains_key(key) {
                out.push((Out::FreshKey(key), Out::Fresh(n)));
            }
        }
        Ok(Out::Map { props: Some((props, copy)), entries: out })
    }

    /// For each key of a mapping, the key and value nodes that decide it, as
    /// [`Reader::value`] reads them (merged ones are copies).
    fn sources<'a>(
        &'a self,
        entries: &'a [(Node, Node)],
        copy: bool,
        out: &mut HashMap<String, (&'a Node, &'a Node, bool)>,
        depth: usize,
    ) -> Result<(), YamlError> {
        if depth > MAX_DEPTH {
            return Err(YamlError::Invalid("merge keys nested too deeply".into()));
        }
        for (k, v) in entries {
            if !is_merge(k) {
                out.insert(self.key(k)?, (k, v, copy));
                continue;
            }
            let merged: Vec<&Node> = match self.deref(v)? {
                Node::Seq { items, .. } => items.iter().rev().collect(),
                other => vec![other],
            };
            for m in merged {
                match self.deref(m)? {
                    Node::Map { entries, .. } => self.sources(entries, true, out, depth + 1)?,
                    _ => return Err(YamlError::Invalid("a merge key (<<) needs a mapping or a list of them".into())),
                }
            }
        }
        Ok(())
    }

    fn key(&self, node: &Node) -> Result<String, YamlError> {
        Reader { doc: self, left: MAX_VALUES }.key(node, 0)
    }

    fn name(&self, id: usize) -> String {
        self.names.get(&id).cloned().unwrap_or_else(|| format!("a{id}"))
    }
}

/// Both objects with the same `name`: one element of a list, changed.
fn same_name(a: &Value, b: &Value) -> bool {
    a.get("name").and_then(Value::as_str).is_some_and(|n| b.get("name").and_then(Value::as_str) == Some(n))
}

/// The values of `text`, a whole output, read as kubectl would.
fn read_back(text: &str) -> Result<Value, YamlError> {
    let docs = parse(text)?;
    match docs.as_slice() {
        [doc] => doc.value(),
        _ => Err(YamlError::ReadBack(format!("{} documents", docs.len()))),
    }
}

/// Reads nodes as go-yaml v2 decodes them into `interface{}`, within a budget.
struct Reader<'a> {
    doc: &'a Document,
    left: usize,
}

impl Reader<'_> {
    fn value(&mut self, node: &Node, depth: usize) -> Result<Value, YamlError> {
        if depth > MAX_DEPTH {
            return Err(YamlError::Invalid(format!("nested more than {MAX_DEPTH} deep once aliases are expanded")));
        }
        self.left = self
            .left
            .checked_sub(1)
            .ok_or_else(|| YamlError::Invalid(format!("more than {MAX_VALUES} values once aliases are expanded")))?;
        match node {
            Node::Alias(id) => self.value(self.doc.target(*id)?, depth + 1),
            Node::Scalar { text, style, props } => scalar_value(text, *style, props.tag.as_ref()),
            Node::Seq { items, .. } => {
                items.iter().map(|i| self.value(i, depth + 1)).collect::<Result<Vec<_>, _>>().map(Value::Array)
            }
            Node::Map { entries, .. } => {
                let mut out = Map::new();
                for (k, v) in entries {
                    if is_merge(k) {
                        self.merge(v, &mut out, depth + 1)?;
                    } else {
                        let key = self.key(k, depth + 1)?;
                        let value = self.value(v, depth + 1)?;
                        out.insert(key, value);
                    }
                }
                Ok(Value::Object(out))
            }
        }
    }

    /// go-yaml v2: a merged mapping's keys overwrite those before it; of a list
    /// of mappings, the earlier ones win.
    fn merge(&mut self, node: &Node, out: &mut Map<String, Value>, depth: usize) -> Result<(), YamlError> {
        let wrong = || YamlError::Invalid("a merge key (<<) needs a mapping or a list of them".into());
        let maps: Vec<&Node> = match self.doc.deref(node)? {
            Node::Seq { items, .. } => items.iter().rev().collect(),
            other => vec![other],
        };
        for m in maps {
            let m = self.doc.deref(m)?;
            if !matches!(m, Node::Map { .. }) {
                return Err(wrong());
            }
            let Value::Object(entries) = self.value(m, depth + 1)? else { return Err(wrong()) };
            for (k, v) in entries {
                out.insert(k, v);
            }
        }
        Ok(())
    }

    /// A key as sigs.k8s.io/yaml turns it into a JSON object key.
    fn key(&mut self, node: &Node, depth: usize) -> Result<String, YamlError> {
        match self.value(node, depth)? {
            Value::String(s) => Ok(s),
            Value::Bool(b) => Ok(b.to_string()),
            Value::Number(n) => Ok(match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), ..) => i.to_string(),
                (_, Some(u), _) => u.to_string(),
                (.., f) => go_float_key(f.unwrap_or_default()),
            }),
            Value::Null => Err(YamlError::Invalid("a mapping key is null".into())),
            _ => Err(YamlError::Invalid("a mapping key is a collection".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn value_of(text: &str) -> Value {
        parse(text).unwrap().remove(0).value().unwrap()
    }

    /// Each plain scalar as go-yaml v2 (kubectl) reads it.
    #[test]
    fn plain_scalars_read_as_kubectl_reads_them() {
        let cases = [
            ("0644", json!(420)),
            ("0400", json!(256)),
            ("0755", json!(493)),
            ("0o17", json!(15)),
            ("0x1F", json!(31)),
            ("-0x10", json!(-16)),
            ("0b101", json!(5)),
            ("-0b101", json!(-5)),
            ("1_000", json!(1000)),
            ("08", json!(8.0)),
            ("1e3", json!(1000.0)),
            (".5", json!(0.5)),
            ("+1", json!(1)),
            ("0", json!(0)),
            ("00", json!(0)),
            ("18446744073709551615", json!(18446744073709551615u64)),
            ("-9223372036854775808", json!(i64::MIN)),
            ("1e400", json!("1e400")),
            ("yes", json!(true)),
            ("Off", json!(false)),
            ("y", json!(true)),
            ("n", json!(false)),
            ("yEs", json!("yEs")),
            ("~", json!(null)),
            ("Null", json!(null)),
            (".inf", json!(".inf")),
            ("2001-12-14", json!("2001-12-14")),
            ("1:20", json!("1:20")),
            ("0x", json!("0x")),
            ("+", json!("+")),
            ("10m", json!("10m")),
            ("<<", json!("<<")),
        ];
        for (text, want) in cases {
            assert_eq!(value_of(&format!("v: {text}"))["v"], want, "{text}");
        }
        // Quoted and block scalars are strings; tags decide.
        assert_eq!(value_of("v: '0644'")["v"], json!("0644"));
        assert_eq!(value_of("v: \"yes\"")["v"], json!("yes"));
        assert_eq!(value_of("v: !!int \"0644\"")["v"], json!(420));
        assert_eq!(value_of("v: !!str 0644")["v"], json!("0644"));
        assert_eq!(value_of("v: !!float 1")["v"], json!(1.0));
        assert_eq!(value_of("v: ! 12")["v"], json!("12"));
        assert!(parse("v: !!int abc").unwrap()[0].value().is_err());
        assert_eq!(value_of("v: |\n  a\n  b\n")["v"], json!("a\nb\n"));
        assert_eq!(value_of("{on: 1, 2: b, 1.5: c}"), json!({"true": 1, "2": "b", "1.5": "c"}));
    }

    #[test]
    fn anchors_aliases_and_merge_keys_read_as_go_yaml_v2_reads_them() {
        let doc = "base: &b {x: 1, z: 2}\nm:\n  a: 0\n  <<: *b\n  z: 3\nl: [*b]\nearly: {x: 9, <<: *b}\n";
        let v = value_of(doc);
        assert_eq!(v["m"], json!({"a": 0, "x": 1, "z": 3}));
        assert_eq!(v["l"], json!([{"x": 1, "z": 2}]));
        // Merged after: the merge overwrites (go-yaml v2's order).
        assert_eq!(v["early"], json!({"x": 1, "z": 2}));
        assert_eq!(value_of("c: {<<: [{x: 1}, {x: 2, z: 2}]}\n")["c"], json!({"x": 1, "z": 2}));
        // YAML 1.1: the key `y` is the boolean true, so kubectl sees "true".
        assert_eq!(value_of("{y: 1, n: 2}"), json!({"true": 1, "false": 2}));
        assert_eq!(value_of("a: 1\na: 2\n")["a"], json!(2), "the last of repeated keys");
    }

    #[test]
    fn alias_bombs_and_self_reference_are_refused() {
        let mut bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n".to_string();
        let mut prev = 'a';
        for name in 'b'..='k' {
            bomb.push_str(&format!("{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
            prev = name;
        }
        let err = parse(&bomb).unwrap()[0].value().unwrap_err().to_string();
        assert!(err.contains("once aliases are expanded"), "{err}");
        assert!(parse("a: &a [*a]\n").is_err());
        assert!(parse("? [a]\n: b\n").is_err());
    }

    fn emit_same(text: &str) -> String {
        let doc = parse(text).unwrap().remove(0);
        let v = doc.value().unwrap();
        doc.emit(&v, &v).unwrap()
    }

    #[test]
    fn unchanged_documents_keep_every_scalar_as_written() {
        let text = "a: 0644\nb: 'on'\nc: \"x\\ty\"\nd: yes\ne: 1e3\nf: |\n  line 1\n  line 2\ng: >-\n  folded\n  text\nh: !!str 0644\ni:\nj: [1, two, {k: v}]\nl: &anchor {m: 1}\nn: *anchor\no: 2001-12-14\np: ~\nq: []\nr: {}\n";
        let out = emit_same(text);
        assert_eq!(
            out,
            "a: 0644\nb: 'on'\nc: \"x\\ty\"\nd: yes\ne: 1e3\nf: |\n  line 1\n  line 2\ng: |-\n  folded text\nh: !!str 0644\ni: ~\nj:\n- 1\n- two\n- k: v\nl: &anchor\n  m: 1\nn: *anchor\no: 2001-12-14\np: ~\nq: []\nr: {}\n"
        );
        assert_eq!(emit_same(&out), out, "written again: the same");
        assert_eq!(value_of(&out), value_of(text));
    }

    #[test]
    fn changes_are_written_from_values_and_the_rest_as_it_was() {
        let text = "spec:\n  mode: 0644\n  list:\n  - name: a\n    v: on\n  - name: b\n    v: 0x10\n";
        let doc = parse(text).unwrap().remove(0);
        let old = doc.value().unwrap();
        let mut new = old.clone();
        new["spec"]["list"].as_array_mut().unwrap().insert(0, json!({"name": "new", "v": "yes", "n": 0o444}));
        new["spec"]["list"][2]["added"] = json!(["--dir=/dra", "10m", "2001-01-01", "1:20", "", "x y"]);
        new["spec"]["extra"] = json!({"runAsNonRoot": false});
        let out = doc.emit(&old, &new).unwrap();
        assert_eq!(
            out,
            "spec:\n  mode: 0644\n  list:\n  - name: new\n    v: \"yes\"\n    \"n\": 292\n  - name: a\n    v: on\n  - name: b\n    v: 0x10\n    added:\n    - --dir=/dra\n    - 10m\n    - \"2001-01-01\"\n    - \"1:20\"\n    - \"\"\n    - \"x y\"\n  extra:\n    runAsNonRoot: false\n"
        );
        assert_eq!(value_of(&out), new);
    }

    #[test]
    fn json_keys_come_out_plain_and_values_as_written() {
        let text = r#"{"kind": "Pod", "n": "yes", "spec": {"port": 80, "dir": "/dra", "on": true}}"#;
        let out = emit_same(text);
        assert_eq!(out, "kind: \"Pod\"\n\"n\": \"yes\"\nspec:\n  port: 80\n  dir: \"/dra\"\n  \"on\": true\n");
        assert_eq!(value_of(&out), value_of(text));
    }

    #[test]
    fn a_changed_anchor_expands_its_aliases() {
        // drafs changes the anchored mapping: its alias must keep the old meaning.
        let text = "a: &x {k: 1}\nb: *x\n";
        let doc = parse(text).unwrap().remove(0);
        let old = doc.value().unwrap();
        let mut new = old.clone();
        new["a"]["added"] = json!(true);
        let out = doc.emit(&old, &new).unwrap();
        assert_eq!(value_of(&out), new, "{out}");
        assert!(!out.contains('*'), "{out}");
        // A changed merged mapping: keys written out, the merge gone.
        let text = "base: &b {x: 1}\nm: {<<: *b, y: 2}\n";
        let doc = parse(text).unwrap().remove(0);
        let old = doc.value().unwrap();
        let mut new = old.clone();
        new["m"]["z"] = json!(3);
        let out = doc.emit(&old, &new).unwrap();
        assert_eq!(value_of(&out), new, "{out}");
    }

    #[test]
    fn hostile_strings_round_trip() {
        for s in
            ["a\u{1b}[2Jb", "\u{feff}x", "line\u{2028}sep", "tab\there", " lead", "trail ", "q\"'\\", "\u{85}", "#x"]
        {
            let doc = parse("k: v\n").unwrap().remove(0);
            let old = doc.value().unwrap();
            let new = json!({"k": s, s: s});
            let out = doc.emit(&old, &new).unwrap();
            assert_eq!(value_of(&out), new, "{s:?}: {out}");
            assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        }
    }
}
