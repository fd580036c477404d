//! The JSON Patch that turns a raw JSON document into its pruned `Value`s
//! (`prune`) after they were changed: one operation per member set and per
//! array element added or removed, nothing for what was left alone, so the
//! patch stays small whatever the document's size, and the raw text is
//! compared without being built.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;
use serde_json::value::RawValue;

use crate::admission::prune::{INDEX, PRUNED, Stop, elements, is_array, is_marker, is_object, members};

/// `path`/`key` as a JSON pointer.
fn child(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

fn index_of(value: &Value) -> Option<usize> {
    value.get(INDEX).and_then(Value::as_u64).and_then(|i| usize::try_from(i).ok())
}

/// One JSON Patch operation; its value is borrowed from the injected pod.
pub struct Op<'a> {
    op: &'static str,
    path: String,
    value: Option<Unmarked<'a>>,
}

impl<'a> Op<'a> {
    /// Add or replace with `value`, which must be whole: a [`PRUNED`] object
    /// (only part of the pod's) must never be sent.
    fn set(op: &'static str, path: String, value: &'a Value) -> Result<Self, Stop> {
        fn pruned(v: &Value) -> bool {
            match v {
                Value::Object(map) => map.contains_key(PRUNED) || map.values().any(pruned),
                Value::Array(items) => items.iter().any(pruned),
                _ => false,
            }
        }
        if pruned(value) {
            return Err(Stop::Internal(format!("injection moved part of the pod that drafs did not read to {path}")));
        }
        Ok(Op { op, path, value: Some(Unmarked(value)) })
    }
}

impl serde::Serialize for Op<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("op", self.op)?;
        map.serialize_entry("path", &self.path)?;
        if let Some(value) = &self.value {
            map.serialize_entry("value", value)?;
        }
        map.end()
    }
}

/// A value as it goes into a patch: without [`INDEX`] marks.
struct Unmarked<'a>(&'a Value);

impl serde::Serialize for Unmarked<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(map) => {
                let mut out = s.serialize_map(None)?;
                for (key, value) in map.iter().filter(|(k, _)| *k != INDEX) {
                    out.serialize_entry(key, &Unmarked(value))?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&Unmarked(item))?;
                }
                out.end()
            }
            other => other.serialize(s),
        }
    }
}

/// Whether the raw JSON `old` and `new` are the same value (marks aside),
/// without building `old`.
fn equal(old: &RawValue, new: &Value) -> Result<bool, Stop> {
    match new {
        Value::Object(map) => {
            if !is_object(old) {
                return Ok(false);
            }
            let keys = map.keys().filter(|k| !is_marker(k)).count();
            let (found, count) = members(old, |k| map.contains_key(k) && !is_marker(k))?;
            if count != keys || found.len() != keys {
                return Ok(false);
            }
            for (key, old) in found {
                if !equal(old, &map[&key])? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Value::Array(items) => {
            if !is_array(old) {
                return Ok(false);
            }
            let (found, count) = elements(old, |i| i < items.len())?;
            if count != items.len() {
                return Ok(false);
            }
            for (index, old) in found {
                if !equal(old, &items[index])? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        scalar => Ok(!is_object(old) && !is_array(old) && serde_json::from_str::<Value>(old.get())? == *scalar),
    }
}

/// The JSON Patch operations that turn the raw JSON `old` into `new` (its
/// pruned `Value` after injection) at `path`: members set, array elements
/// removed and added, nothing for what injection left alone.
pub fn diff<'a>(old: &RawValue, new: &'a Value, path: &str, ops: &mut Vec<Op<'a>>) -> Result<(), Stop> {
    match new {
        // Built from `old` with some of its members: compare member by member.
        Value::Object(map) if map.contains_key(PRUNED) && is_object(old) => {
            let (found, _) = members(old, |k| map.contains_key(k) && !is_marker(k))?;
            let found: HashMap<String, &RawValue> = found.into_iter().collect();
            for (key, value) in map.iter().filter(|(k, _)| !is_marker(k)) {
                let at = child(path, key);
                match found.get(key) {
                    Some(old) => diff(old, value, &at, ops)?,
                    None => ops.push(Op::set("add", at, value)?),
                }
            }
        }
        // Elements of `old` (marked with their index) and new ones: remove
        // the elements gone, then add the new ones where they belong.
        Value::Array(items) if items.iter().any(|i| index_of(i).is_some()) && is_array(old) => {
            let indices: Vec<Option<usize>> = items.iter().map(index_of).collect();
            let kept: BTreeSet<usize> = indices.iter().flatten().copied().collect();
            let ordered = indices.iter().flatten().zip(indices.iter().flatten().skip(1)).all(|(a, b)| a < b);
            let (found, len) = elements(old, |i| kept.contains(&i))?;
            if !ordered || found.len() != kept.len() {
                return Err(Stop::Internal(format!("injection reordered the elements of {path}")));
            }
            let found: HashMap<usize, &RawValue> = found.into_iter().collect();
            for gone in (0..len).rev().filter(|i| !kept.contains(i)) {
                ops.push(Op { op: "remove", path: format!("{path}/{gone}"), value: None });
            }
            for (at, (value, index)) in items.iter().zip(indices).enumerate() {
                let at = format!("{path}/{at}");
                match index.and_then(|i| found.get(&i)) {
                    Some(old) => diff(old, value, &at, ops)?,
                    None => ops.push(Op::set("add", at, value)?),
                }
            }
        }
        _ => {
            if !equal(old, new)? {
                ops.push(Op::set("replace", path.to_string(), new)?);
            }
        }
    }
    Ok(())
}

/// Apply a JSON Patch of `add`, `remove` and `replace` operations (those
/// the webhook sends) to `doc`, as the API server does.
#[doc(hidden)]
pub fn apply_patch(doc: &mut Value, patch: &[Value]) -> Result<(), String> {
    for op in patch {
        let path = op["path"].as_str().ok_or_else(|| format!("no path: {op}"))?;
        let (parent, last) = path.rsplit_once('/').ok_or_else(|| format!("bad path: {op}"))?;
        let last = last.replace("~1", "/").replace("~0", "~");
        let target = doc.pointer_mut(parent).ok_or_else(|| format!("no parent: {op}"))?;
        match (op["op"].as_str(), target) {
            (Some("add"), Value::Object(map)) => {
                map.insert(last, op["value"].clone());
            }
            (Some("add"), Value::Array(items)) => {
                let at: usize =
                    if last == "-" { items.len() } else { last.parse().map_err(|_| format!("bad index: {op}"))? };
                if at > items.len() {
                    return Err(format!("index out of range: {op}"));
                }
                items.insert(at, op["value"].clone());
            }
            (Some("remove"), Value::Object(map)) => {
                map.shift_remove(&last).ok_or_else(|| format!("nothing to remove: {op}"))?;
            }
            (Some("remove"), Value::Array(items)) => {
                let at: usize = last.parse().map_err(|_| format!("bad index: {op}"))?;
                if at >= items.len() {
                    return Err(format!("index out of range: {op}"));
                }
                items.remove(at);
            }
            (Some("replace"), target) => {
                let slot = match target {
                    Value::Object(map) => map.get_mut(&last),
                    Value::Array(items) => last.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
                    _ => None,
                };
                *slot.ok_or_else(|| format!("nothing to replace: {op}"))? = op["value"].clone();
            }
            _ => return Err(format!("unsupported operation: {op}")),
        }
    }
    Ok(())
}
