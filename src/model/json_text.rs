//! JSON read as text, without building a `serde_json::Value`: what a value
//! is, and the members of an object with each value left as the text it is.
//! A `Value` has no room for a number beyond 64 bits and rewrites a string's
//! escapes; text keeps a driver's bytes (`status_data`, `objects`), and reading
//! it level by level has no depth limit (`serde_json` skips a value's text
//! without recursion).

use std::collections::HashMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// What a JSON value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Null,
    Boolean,
    Number,
    String,
    List,
    Object,
}

impl Kind {
    /// The kind of the valid JSON text `raw`, from its first byte.
    pub fn of(raw: &RawValue) -> Kind {
        match raw.get().trim_start().as_bytes().first() {
            Some(b'{') => Kind::Object,
            Some(b'[') => Kind::List,
            Some(b'"') => Kind::String,
            Some(b't' | b'f') => Kind::Boolean,
            Some(b'n') => Kind::Null,
            _ => Kind::Number,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Boolean => "boolean",
            Kind::Number => "number",
            Kind::String => "string",
            Kind::List => "list",
            Kind::Object => "object",
        }
    }
}

/// The members of the JSON object `raw`, in order; a key given twice keeps
/// its first place and its last value (as a JSON object read into a map).
/// Each value stays text: nothing below it is parsed.
pub fn members(raw: &RawValue) -> Result<Vec<(String, &RawValue)>, serde_json::Error> {
    struct Members;
    impl<'de> Visitor<'de> for Members {
        type Value = Vec<(String, &'de RawValue)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut members: Self::Value = Vec::new();
            let mut at: HashMap<String, usize> = HashMap::new();
            while let Some(key) = map.next_key::<String>()? {
                let value: &'de RawValue = map.next_value()?;
                match at.get(&key) {
                    Some(&i) => members[i].1 = value,
                    None => {
                        at.insert(key.clone(), members.len());
                        members.push((key, value));
                    }
                }
            }
            Ok(members)
        }
    }
    serde_json::Deserializer::from_str(raw.get()).deserialize_map(Members)
}

/// The member `key` of `raw` when `raw` is an object that has it.
pub fn member<'a>(raw: &'a RawValue, key: &str) -> Option<&'a RawValue> {
    if Kind::of(raw) != Kind::Object {
        return None;
    }
    members(raw).ok()?.into_iter().find_map(|(k, v)| (k == key).then_some(v))
}

/// The string `raw`, when it is one.
pub fn string(raw: &RawValue) -> Option<String> {
    (Kind::of(raw) == Kind::String).then(|| serde_json::from_str(raw.get()).ok()).flatten()
}

/// Whether the JSON object `raw` has no members.
pub fn is_empty_object(raw: &RawValue) -> bool {
    raw.get().trim_start().strip_prefix('{').is_some_and(|rest| rest.trim_start().starts_with('}'))
}

/// `text` (valid JSON) without the whitespace between its tokens, or `None`
/// when it has none; every token is kept byte for byte.
pub fn compact(text: &str) -> Option<String> {
    let (mut in_string, mut escaped) = (false, false);
    let mut out: Option<Vec<u8>> = None;
    for (at, &byte) in text.as_bytes().iter().enumerate() {
        let keep = if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            true
        } else {
            in_string = byte == b'"';
            !matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
        };
        match (&mut out, keep) {
            (Some(out), true) => out.push(byte),
            (None, false) => out = Some(text.as_bytes()[..at].to_vec()),
            _ => {}
        }
    }
    // Only ASCII bytes were removed, so the rest is still UTF-8.
    out.and_then(|bytes| String::from_utf8(bytes).ok())
}

/// The compact JSON `text` indented as `serde_json::to_string_pretty` indents
/// a value (two spaces, `": "`, `{}` and `[]` when empty), every token kept
/// byte for byte: a driver's data inside it keeps its digits and escapes.
pub fn pretty(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    };
    let (mut in_string, mut escaped, mut depth) = (false, false, 0usize);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            out.push(c);
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                let close = if c == '{' { '}' } else { ']' };
                if chars.peek() == Some(&close) {
                    out.push(close);
                    chars.next();
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            ' ' | '\t' | '\n' | '\r' => {}
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_string()).unwrap()
    }

    #[test]
    fn kinds_members_and_strings() {
        for (text, kind) in [
            ("null", Kind::Null),
            ("true", Kind::Boolean),
            ("false", Kind::Boolean),
            ("-1.5e400", Kind::Number),
            ("340282366920938463463374607431768211455", Kind::Number),
            ("\"x\"", Kind::String),
            ("[1]", Kind::List),
            ("{}", Kind::Object),
        ] {
            assert_eq!(Kind::of(&raw(text)), kind, "{text}");
        }
        let object = raw(r#"{"b":{"x":1.0e999},"a":"\u003c","b":[2],"c":null}"#);
        let found: Vec<(String, &str)> = members(&object).unwrap().into_iter().map(|(k, v)| (k, v.get())).collect();
        assert_eq!(found, vec![("b".into(), "[2]"), ("a".into(), r#""\u003c""#), ("c".into(), "null")]);
        assert_eq!(member(&object, "a").and_then(string).as_deref(), Some("<"));
        assert_eq!(member(&object, "b").and_then(string), None, "not a string");
        assert!(member(&object, "z").is_none() && member(&raw("[1]"), "a").is_none());
        assert!(members(&raw("[1]")).is_err());
        assert!(is_empty_object(&raw("{}")) && is_empty_object(&raw("{ \n }")));
        assert!(!is_empty_object(&raw(r#"{"a":1}"#)) && !is_empty_object(&raw("[]")));
    }

    #[test]
    fn compact_and_pretty_keep_every_token() {
        let indented = "{\n  \"s\" : \"a b\\t\\u003c\\/ \\\\\\\" {}\" ,\r\n\t\"n\": [ 1 ,\n 2.50 ] ,\"e\" : { } }";
        let compacted = compact(indented).unwrap();
        assert_eq!(compacted, r#"{"s":"a b\t\u003c\/ \\\" {}","n":[1,2.50],"e":{}}"#);
        assert_eq!(compact(&compacted), None, "compact text is kept as it is");
        assert_eq!(compact(" 1 ").as_deref(), Some("1"));
        assert_eq!(
            pretty(&compacted),
            "{\n  \"s\": \"a b\\t\\u003c\\/ \\\\\\\" {}\",\n  \"n\": [\n    1,\n    2.50\n  ],\n  \"e\": {}\n}"
        );
        // As serde_json indents a value, whatever it holds.
        let value =
            serde_json::json!({"a": [], "b": {}, "c": [1, {"d": null, "e": [true, "x,y:{}"]}], "f": "\"", "g": -1.5});
        assert_eq!(pretty(&value.to_string()), serde_json::to_string_pretty(&value).unwrap());
        assert_eq!(pretty("[]"), "[]");
        assert_eq!(pretty("340282366920938463463374607431768211455"), "340282366920938463463374607431768211455");
    }
}
