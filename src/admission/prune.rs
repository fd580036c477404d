//! The parts of a raw JSON document asked for, as `Value`s, within a memory
//! budget; the rest stays text, never built.
//!
//! Why: an AdmissionReview can be megabytes (the API server sends the whole
//! pod, defaults filled in), and a `serde_json::Value` takes 10 to 90 times
//! the bytes of its JSON. The webhook (`decision`) prunes the pod to what
//! `inject` reads ([`Keep`]), injects into that, and `patch` sends the
//! difference against the raw text. What was pruned is marked (`PRUNED`,
//! `INDEX`) so that the patch can tell it from what `inject` added.

use serde::de::{self, Deserializer as _, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

pub(crate) fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

pub(crate) fn is_array(raw: &RawValue) -> bool {
    raw.get().starts_with('[')
}

/// Which part of a JSON value to turn into a `Value`.
pub enum Keep {
    /// All of it.
    Whole,
    /// An object: these members (each kept as said), no others.
    Fields(&'static [(&'static str, Keep)]),
    /// An array of objects: every element, each kept as said.
    Items(&'static Keep),
}

/// Marks an object built from one of the document's with only some of its
/// members (`inject` never reads it, it never reaches a patch).
pub(crate) const PRUNED: &str = "\u{0}drafs-pruned";
/// Marks an array element built from the document's element at this index,
/// so the patch can tell it from one `inject` added.
pub(crate) const INDEX: &str = "\u{0}drafs-index";

pub(crate) fn is_marker(key: &str) -> bool {
    key == PRUNED || key == INDEX
}

/// Why a document was not pruned or diffed.
#[derive(Debug)]
pub enum Stop {
    TooLarge,
    /// An array to walk holds something else than objects (kept whole instead).
    NotObjects,
    Internal(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::TooLarge => write!(f, "over the memory bound"),
            Stop::NotObjects => write!(f, "not an array of objects"),
            Stop::Internal(e) => write!(f, "{e}"),
        }
    }
}

impl From<serde_json::Error> for Stop {
    fn from(e: serde_json::Error) -> Self {
        Stop::Internal(e.to_string())
    }
}

/// Bytes of `Value`s built so far, against a bound.
pub struct Budget {
    used: usize,
    max: usize,
}

impl Budget {
    /// Nothing built yet, at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Budget { used: 0, max }
    }

    fn charge(&mut self, bytes: usize) -> Result<(), Stop> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.max { Err(Stop::TooLarge) } else { Ok(()) }
    }
}

// What serde_json's `Value` (with `preserve_order`) takes, as resident
// memory: a value's slot is 72 bytes in an array, an object member's 112 (its value included) plus its key
// and its place in the index; a small object's first allocations hold three
// members (~400 bytes), a small array's four elements (~300); a string its
// length rounded up, and a header. A growing vector is reallocated, so a
// large array's slots count 1.5 times. Checked against a counting allocator and
// VmHWM (tests below, benches/webhook.rs).
const VALUE: usize = 112;
const ENTRY: usize = 160;
const OBJECT: usize = 256;
const ARRAY: usize = 224;
const STRING: usize = 32;

/// About how many bytes the JSON text `raw` takes as a `Value`, its own slot
/// (paid by its parent) aside: an upper estimate for the shapes measured,
/// computed without allocating.
fn estimate(raw: &str) -> usize {
    let json = raw.as_bytes();
    let mut total = 0usize;
    // A member's value lives in the member's slot, already counted; so does the root.
    let mut slot_paid = true;
    let slot = |paid: &mut bool| if std::mem::take(paid) { 0 } else { VALUE };
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < json.len() && json[i] != b'"' {
                    i += if json[i] == b'\\' { 2 } else { 1 };
                }
                let len = i.saturating_sub(start);
                i += 1;
                let mut next = i;
                while next < json.len() && json[next].is_ascii_whitespace() {
                    next += 1;
                }
                if json.get(next) == Some(&b':') {
                    total = total.saturating_add(ENTRY + STRING + len);
                    slot_paid = true;
                } else {
                    total = total.saturating_add(slot(&mut slot_paid) + STRING + len);
                }
            }
            b'{' => {
                total = total.saturating_add(slot(&mut slot_paid) + OBJECT);
                i += 1;
            }
            b'[' => {
                total = total.saturating_add(slot(&mut slot_paid) + ARRAY);
                i += 1;
            }
            b'}' | b']' | b',' | b':' | b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            _ => {
                total = total.saturating_add(slot(&mut slot_paid));
                while i < json.len() && !matches!(json[i], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    i += 1;
                }
            }
        }
    }
    total
}

/// The part of `raw` that `keep` asks for, as a `Value`, charged to `budget`
/// (all but its own slot, which its parent pays).
/// Objects built from some of their members are marked [`PRUNED`], elements
/// of walked arrays [`INDEX`]. What does not have the shape `keep` expects
/// (a container that is not an object...) is kept whole.
fn prune(raw: &RawValue, keep: &Keep, budget: &mut Budget) -> Result<Value, Stop> {
    match keep {
        Keep::Fields(fields) if is_object(raw) => Ok(prune_object(raw, fields, budget)?.0),
        Keep::Items(item) if is_array(raw) => {
            let before = budget.used;
            budget.charge(ARRAY)?;
            let mut items = Vec::new();
            let walked = for_each_element(raw, |index, element| {
                if !is_object(element) {
                    return Err(Stop::NotObjects);
                }
                budget.charge(VALUE + ENTRY + STRING + INDEX.len())?;
                let mut value = prune(element, item, budget)?;
                if let Some(map) = value.as_object_mut() {
                    map.insert(INDEX.into(), Value::from(index));
                }
                items.push(value);
                Ok(())
            });
            match walked {
                Ok(()) => Ok(Value::Array(items)),
                Err(Stop::NotObjects) => {
                    drop(items);
                    budget.used = before;
                    prune(raw, &Keep::Whole, budget)
                }
                Err(stop) => Err(stop),
            }
        }
        _ => {
            budget.charge(estimate(raw.get()))?;
            Ok(serde_json::from_str(raw.get())?)
        }
    }
}

/// `prune` of an object to `fields`, marked `PRUNED`, and the raw JSON
/// of the members kept.
pub fn prune_object<'a>(
    raw: &'a RawValue,
    fields: &[(&str, Keep)],
    budget: &mut Budget,
) -> Result<(Value, Members<'a>), Stop> {
    budget.charge(OBJECT + ENTRY + STRING + PRUNED.len())?;
    let mut map = Map::new();
    let mut kept = Vec::new();
    for_each_member(raw, |key, value| {
        if let Some((_, keep)) = fields.iter().find(|(name, _)| *name == key) {
            budget.charge(ENTRY + STRING + key.len())?;
            map.insert(key.to_string(), prune(value, keep, budget)?);
            kept.push((key.to_string(), value));
        }
        Ok(())
    })?;
    map.insert(PRUNED.into(), Value::Bool(true));
    Ok((Value::Object(map), kept))
}

/// Members of a raw JSON object, and elements of a raw array with their index.
pub type Members<'a> = Vec<(String, &'a RawValue)>;
pub(crate) type Elements<'a> = Vec<(usize, &'a RawValue)>;

/// Call `f` with each member of the raw JSON object `raw`, in order; nothing
/// is built but each (short-lived) key.
fn for_each_member<'a>(raw: &'a RawValue, f: impl FnMut(&str, &'a RawValue) -> Result<(), Stop>) -> Result<(), Stop> {
    struct Members<'a, F>(F, &'a mut Option<Stop>);
    impl<'de, F: FnMut(&str, &'de RawValue) -> Result<(), Stop>> Visitor<'de> for Members<'_, F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                let value: &'de RawValue = map.next_value()?;
                if let Err(stop) = (self.0)(&key, value) {
                    *self.1 = Some(stop);
                    return Err(de::Error::custom("stopped"));
                }
            }
            Ok(())
        }
    }
    let mut stopped = None;
    let result = serde_json::Deserializer::from_str(raw.get()).deserialize_map(Members(f, &mut stopped));
    match (stopped, result) {
        (Some(stop), _) => Err(stop),
        (None, result) => Ok(result?),
    }
}

/// Call `f` with each element of the raw JSON array `raw` and its index.
fn for_each_element<'a>(raw: &'a RawValue, f: impl FnMut(usize, &'a RawValue) -> Result<(), Stop>) -> Result<(), Stop> {
    struct Elements<'a, F>(F, &'a mut Option<Stop>);
    impl<'de, F: FnMut(usize, &'de RawValue) -> Result<(), Stop>> Visitor<'de> for Elements<'_, F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            let mut index = 0;
            while let Some(element) = seq.next_element::<&'de RawValue>()? {
                if let Err(stop) = (self.0)(index, element) {
                    *self.1 = Some(stop);
                    return Err(de::Error::custom("stopped"));
                }
                index += 1;
            }
            Ok(())
        }
    }
    let mut stopped = None;
    let result = serde_json::Deserializer::from_str(raw.get()).deserialize_seq(Elements(f, &mut stopped));
    match (stopped, result) {
        (Some(stop), _) => Err(stop),
        (None, result) => Ok(result?),
    }
}

/// The members of the raw object `raw` whose keys `wanted` picks, and how
/// many members it has (only the picked ones are kept).
pub(crate) fn members(raw: &RawValue, wanted: impl Fn(&str) -> bool) -> Result<(Members<'_>, usize), Stop> {
    let (mut found, mut count) = (Vec::new(), 0);
    for_each_member(raw, |key, value| {
        count += 1;
        if wanted(key) {
            found.push((key.to_string(), value));
        }
        Ok(())
    })?;
    Ok((found, count))
}

/// The elements of the raw array `raw` whose indices `wanted` picks, and
/// its length.
pub(crate) fn elements(raw: &RawValue, wanted: impl Fn(usize) -> bool) -> Result<(Elements<'_>, usize), Stop> {
    let (mut found, mut count) = (Vec::new(), 0);
    for_each_element(raw, |index, element| {
        count += 1;
        if wanted(index) {
            found.push((index, element));
        }
        Ok(())
    })?;
    Ok((found, count))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_above_what_values_take() {
        // Resident bytes per element, measured (VmHWM of the webhook; a
        // counting allocator for the last two, plus malloc's headers): 96 for
        // a number in a large array, 404 for `[0]`, 150 for an object member
        // `"lN":""`; 96 for an empty string or object in an array, 510 for `{"a":0}`.
        for (element, measured) in [("0", 96), ("[0]", 404), ("\"\"", 96), ("{}", 96), ("{\"a\":0}", 510)] {
            let text = format!("[{}]", vec![element; 1000].join(","));
            assert!(estimate(&text) >= 1000 * measured, "{element}: {}", estimate(&text));
        }
        let members: Vec<String> = (0..1000).map(|i| format!("\"l{i}\":\"\"")).collect();
        assert!(estimate(&format!("{{{}}}", members.join(","))) >= 1000 * 150);
    }
}
