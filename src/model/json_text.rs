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
}
