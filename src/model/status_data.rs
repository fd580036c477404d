//! The members of a driver's `status.devices[].data` as files.
//!
//! Drivers put what exists only once a device is prepared (a dynamic MIG
//! device's UUID, an mdev UUID, a VF's PCI address) into the claim's device
//! status as free-form JSON. Each member becomes a file under
//! `.status/data.d/` (the raw JSON stays in `.status/data`): scalars as text,
//! objects as directories, lists of scalars joined with `,`. The JSON is the
//! driver's, not the API's, so nothing in it is trusted: keys must be safe
//! names, and the depth and the number of files are bounded, so a hostile
//! driver cannot grow the tree without limit; what is left out is said in a
//! warning (the raw file still has it).
//!
//! The data is kept as the JSON text the API server sent ([`RawData`]), never
//! as a `serde_json::Value`, which has no room for a number beyond 64 bits (it
//! would round `340282366920938463463374607431768211455` to
//! `3.402823669209385e+38`) and rewrites a string's escapes: the raw file is
//! those bytes, and a number's file its digits as the driver wrote them.

use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::model::json_text::{self, Kind, is_empty_object};
use crate::model::names::{is_data_key, quoted};

/// The deepest member path, in components under `data.d/` (`mig/uuid` is 2).
pub const MAX_DEPTH: usize = 8;
/// The most member files of one device.
pub const MAX_FILES: usize = 1024;
/// Skipped members named one by one; the rest are counted in one warning.
const MAX_NAMED: usize = 8;

/// A device's data: valid JSON text, the bytes the API server sent (a file's
/// indentation removed: whitespace between tokens only, never in a string).
#[derive(Debug, Clone)]
pub struct RawData(Box<RawValue>);

impl RawData {
    /// The data `raw`, compact.
    pub fn new(raw: &RawValue) -> RawData {
        match json_text::compact(raw.get()).map(RawValue::from_string) {
            Some(Ok(compacted)) => RawData(compacted),
            // Removing whitespace between the tokens of valid JSON leaves valid JSON;
            // should it ever not, the text stays as it came.
            _ => RawData(raw.to_owned()),
        }
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for RawData {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Serialize for RawData {
    /// The text itself, byte for byte (in `.json` too).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RawData {
    /// Any JSON value, kept as its text (from text only: a `Value` has none).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(|raw| RawData::new(&raw))
    }
}

/// The one member of the object in which a claim carries a device's data from
/// its decoder to the resolver (see [`carry`]); no JSON a driver or the API
/// server writes is read as one, since every decoder wraps the data it finds.
const CARRIED: &str = "\u{0}drafs: the JSON text of status.devices[].data";

/// A device's data as a decoded claim carries it to the resolver.
/// k8s-openapi holds `status.devices[].data` as a `serde_json::Value`; the
/// decoders (`slices::decode_claim`, `objects::FileObjects`) put the data's
/// text there instead, as the string member of a one-member object named
/// [`CARRIED`], and [`carried`] takes it out again.
pub fn carry(raw: &RawValue) -> RawExtension {
    let text = RawData::new(raw).get().to_string();
    RawExtension(Value::Object(serde_json::Map::from_iter([(CARRIED.to_string(), Value::String(text))])))
}

/// The data a claim carries: the text a decoder put there, or for a claim
/// made otherwise (a test's) its value as JSON.
pub fn carried(data: &RawExtension) -> RawData {
    if let Value::Object(map) = &data.0
        && map.len() == 1
        && let Some(Value::String(text)) = map.get(CARRIED)
        && let Ok(raw) = RawValue::from_string(text.clone())
    {
        return RawData(raw);
    }
    match serde_json::value::to_raw_value(&data.0) {
        Ok(raw) => RawData::new(&raw),
        // A Value always serializes; should it ever not, no data.
        Err(_) => RawData(RawValue::NULL.to_owned()),
    }
}

/// One device's data as files: (path under `data.d/`, content), in the data's
/// order, and what was left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    pub files: Vec<(String, String)>,
    pub warnings: Vec<String>,
}

/// The member files of `data`. Data that is not a JSON object has none (the
/// API server accepts only objects, so that can only come from a file).
pub fn members(data: &RawData) -> Members {
    let mut walk = Walk::default();
    match Kind::of(&data.0) {
        Kind::Object => walk.object(&data.0, "", 1),
        other => walk.out.warnings.push(format!(
            "status data is a JSON {}, not an object (the API server accepts only objects): only the raw \
             .status/data has it",
            other.name()
        )),
    }
    walk.finish()
}

/// A scalar as file text: a string unescaped, a number's digits as written,
/// `true`/`false`; `None` for null, a list or an object.
fn scalar(raw: &RawValue) -> Option<Result<String, serde_json::Error>> {
    match Kind::of(raw) {
        Kind::String => Some(serde_json::from_str(raw.get())),
        Kind::Number | Kind::Boolean => Some(Ok(raw.get().trim().to_string())),
        Kind::Null | Kind::List | Kind::Object => None,
    }
}

#[derive(Default)]
struct Walk {
    out: Members,
    /// Skipped members, the first [`MAX_NAMED`] of them described.
    skipped: Vec<String>,
    skipped_count: usize,
    /// The first object that was too deep to enter, and how many were.
    too_deep: Option<(String, usize)>,
    /// The first member beyond [`MAX_FILES`], and how many were.
    too_many: Option<(String, usize)>,
}

impl Walk {
    /// The members of the object `raw` at `prefix` (`""` for the top), whose members are `depth` deep.
    fn object(&mut self, raw: &RawValue, prefix: &str, depth: usize) {
        if depth > MAX_DEPTH {
            if !is_empty_object(raw) {
                self.too_deep.get_or_insert_with(|| (prefix.to_string(), 0)).1 += 1;
            }
            return;
        }
        let members = match json_text::members(raw) {
            Ok(members) => members,
            Err(e) => {
                let what = if prefix.is_empty() { String::new() } else { format!(" member {prefix:?}") };
                return self.skip(format!("status data{what} skipped: {e}"));
            }
        };
        for (key, member) in members {
            if !is_data_key(&key) {
                let parent = if prefix.is_empty() { String::new() } else { format!(" (in {prefix:?})") };
                self.skip(format!(
                    "status data key {}{parent} skipped: not a safe file name (1 to 64 of A-Z a-z 0-9 _ . -, not \
                     starting with . or -)",
                    quoted(&key)
                ));
                continue;
            }
            let path = if prefix.is_empty() { key } else { format!("{prefix}/{key}") };
            match Kind::of(member) {
                Kind::Null => {}
                Kind::Object => self.object(member, &path, depth + 1),
                Kind::List => self.list(member, path),
                _ => match scalar(member) {
                    Some(Ok(text)) => self.file(path, text),
                    Some(Err(e)) => self.skip(format!("status data member {path:?} skipped: {e}")),
                    None => {}
                },
            }
        }
    }

    /// A list of scalars, joined with `,`.
    fn list(&mut self, raw: &RawValue, path: String) {
        let items: Vec<&RawValue> = match serde_json::from_str(raw.get()) {
            Ok(items) => items,
            Err(e) => return self.skip(format!("status data member {path:?} skipped: {e}")),
        };
        match items.into_iter().map(scalar).collect::<Option<Result<Vec<String>, _>>>() {
            Some(Ok(texts)) => self.file(path, texts.join(",")),
            Some(Err(e)) => self.skip(format!("status data member {path:?} skipped: {e}")),
            None => self.skip(format!("status data member {path:?} skipped: a list holding objects, lists or nulls")),
        }
    }

    fn file(&mut self, path: String, content: String) {
        if self.out.files.len() < MAX_FILES {
            self.out.files.push((path, content));
        } else {
            self.too_many.get_or_insert((path, 0)).1 += 1;
        }
    }

    fn skip(&mut self, why: String) {
        self.skipped_count += 1;
        if self.skipped.len() < MAX_NAMED {
            self.skipped.push(why);
        }
    }

    fn finish(mut self) -> Members {
        let raw = "the raw .status/data has";
        for why in self.skipped.drain(..) {
            self.out.warnings.push(format!("{why}; {raw} it"));
        }
        if self.skipped_count > MAX_NAMED {
            let more = self.skipped_count - MAX_NAMED;
            self.out.warnings.push(format!("{more} more status data members skipped; {raw} them"));
        }
        if let Some((first, n)) = self.too_deep {
            self.out.warnings.push(format!(
                "status data deeper than {MAX_DEPTH} levels skipped ({n} objects, the first at {first:?}); {raw} them"
            ));
        }
        if let Some((first, n)) = self.too_many {
            self.out.warnings.push(format!(
                "status data has more than {MAX_FILES} members: {n} skipped, the first {first:?}; {raw} them"
            ));
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A value's data, as a decoder hands it on.
    fn raw(value: &Value) -> RawData {
        RawData::new(&serde_json::value::to_raw_value(value).unwrap())
    }

    /// The data of the JSON text `text`, as the API server sent it.
    fn text(text: &str) -> RawData {
        RawData::new(&RawValue::from_string(text.to_string()).unwrap())
    }

    fn files(m: &Members) -> Vec<(&str, &str)> {
        m.files.iter().map(|(p, c)| (p.as_str(), c.as_str())).collect()
    }

    #[test]
    fn scalars_objects_and_lists() {
        let data = json!({
            "uuid": "MIG-5c8a2f1e-7b3d-5e9a-8c4f-1d2e3f4a5b6c",
            "profile": "1g.10gb",
            "gpu": {"index": 0, "uuid": "GPU-1", "mig": {"enabled": true}},
            "placement": {"start": 3, "size": 1},
            "ratio": 0.5,
            "big": 18446744073709551615u64,
            "negative": -7,
            "ids": [1, 2, 3],
            "mixed": ["a", 1, false],
            "empty": [],
            "nothing": null,
            "emptyObject": {},
            "text": "with spaces, commas\nand a newline"
        });
        let m = members(&raw(&data));
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        assert_eq!(
            files(&m),
            vec![
                ("uuid", "MIG-5c8a2f1e-7b3d-5e9a-8c4f-1d2e3f4a5b6c"),
                ("profile", "1g.10gb"),
                ("gpu/index", "0"),
                ("gpu/uuid", "GPU-1"),
                ("gpu/mig/enabled", "true"),
                ("placement/start", "3"),
                ("placement/size", "1"),
                ("ratio", "0.5"),
                ("big", "18446744073709551615"),
                ("negative", "-7"),
                ("ids", "1,2,3"),
                ("mixed", "a,1,false"),
                ("empty", ""),
                ("text", "with spaces, commas\nand a newline"),
            ]
        );
    }

    #[test]
    fn data_that_is_not_an_object_has_no_members() {
        for data in [json!("MIG-1"), json!(7), json!(["a", "b"]), json!(true), json!(null)] {
            let m = members(&raw(&data));
            assert!(m.files.is_empty(), "{data}: {:?}", m.files);
            assert_eq!(m.warnings.len(), 1, "{data}: {:?}", m.warnings);
            assert!(m.warnings[0].contains("not an object"), "{:?}", m.warnings);
        }
        assert_eq!(members(&raw(&json!({}))), Members::default());
    }

    #[test]
    fn hostile_keys_are_skipped_with_a_warning_each() {
        let long = "k".repeat(65);
        let data = json!({
            "../x": 1, "a/b": 2, ".ready": 3, "": 4, "ünï": 5, "nul\u{0}": 6,
            long.clone(): 8, "ok": "yes",
            "dir": {"..": {"x": 1}, "fine": "f"}
        });
        let m = members(&raw(&data));
        assert_eq!(files(&m), vec![("ok", "yes"), ("dir/fine", "f")]);
        let all = m.warnings.join("\n");
        for key in ["\"../x\"", "\"a/b\"", "\".ready\"", "\"\"", "\"ünï\"", "\"nul\\0\"", "\"..\" (in \"dir\")"] {
            assert!(all.contains(key), "{key} not named in:\n{all}");
        }
        assert!(all.contains(&format!("{:?}…", "k".repeat(64))), "a long key is cut short:\n{all}");
        assert!(!all.contains(&long), "{all}");
        assert_eq!(m.warnings.len(), 8, "{all}");
        assert!(m.warnings.iter().all(|w| w.contains("the raw .status/data has it")), "{all}");
    }

    #[test]
    fn skipped_members_beyond_eight_are_counted_not_named() {
        let data: serde_json::Map<String, Value> = (0..20).map(|i| (format!(".bad{i}"), json!(i))).collect();
        let m = members(&raw(&Value::Object(data)));
        assert!(m.files.is_empty());
        assert_eq!(m.warnings.len(), MAX_NAMED + 1, "{:?}", m.warnings);
        assert!(m.warnings[MAX_NAMED - 1].contains("\".bad7\""), "{:?}", m.warnings);
        assert_eq!(m.warnings[MAX_NAMED], "12 more status data members skipped; the raw .status/data has them");
    }

    #[test]
    fn lists_of_objects_lists_or_nulls_are_skipped_by_name() {
        let data = json!({"vfs": [{"pci": "0000:3b:00.1"}], "grid": [[1]], "holes": [1, null], "gpu": {"links": [{}]}});
        let m = members(&raw(&data));
        assert!(m.files.is_empty(), "{:?}", m.files);
        let all = m.warnings.join("\n");
        for path in ["\"vfs\"", "\"grid\"", "\"holes\"", "\"gpu/links\""] {
            assert!(all.contains(&format!("member {path} skipped: a list")), "{path}:\n{all}");
        }
    }

    #[test]
    fn depth_is_bounded_with_one_warning() {
        // Nine levels of objects: members 8 deep are served, the ninth level is not.
        let mut deep = json!({"leaf": "9"});
        for level in (1..=8).rev() {
            deep = json!({ format!("l{level}"): deep, format!("v{level}"): level });
        }
        let m = members(&raw(&deep));
        let paths: Vec<&str> = m.files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths.len(), 8, "{paths:?}");
        assert!(paths.contains(&"l1/l2/l3/l4/l5/l6/l7/v8"), "{paths:?}");
        assert!(paths.iter().all(|p| p.split('/').count() <= MAX_DEPTH), "{paths:?}");
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
        assert!(m.warnings[0].contains("deeper than 8 levels"), "{:?}", m.warnings);
        assert!(m.warnings[0].contains("\"l1/l2/l3/l4/l5/l6/l7/l8\""), "{:?}", m.warnings);
    }

    #[test]
    fn the_number_of_files_is_bounded_with_one_warning() {
        let mut data = serde_json::Map::new();
        for i in 0..MAX_FILES + 500 {
            data.insert(format!("k{i:05}"), json!(i));
        }
        let m = members(&raw(&Value::Object(data)));
        assert_eq!(m.files.len(), MAX_FILES);
        assert_eq!(m.files.last().unwrap(), &(format!("k{:05}", MAX_FILES - 1), (MAX_FILES - 1).to_string()));
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
        assert!(m.warnings[0].contains("500 skipped, the first \"k01024\""), "{:?}", m.warnings);
    }

    /// Issue 25: numbers beyond 64 bits (and beyond f64) keep every digit, in
    /// the raw text and in the files.
    #[test]
    fn numbers_keep_the_drivers_digits() {
        let sent = r#"{"big":340282366920938463463374607431768211455,"neg":-18446744073709551617,"f":1.5e400,"small":3,"nested":{"x":12345678901234567890123},"ids":[18446744073709551616,-1,1.50,1E3,-0],"ratio":0.5}"#;
        let data = text(sent);
        assert_eq!(data.get(), sent, "the raw text is the bytes sent");
        let m = members(&data);
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        assert_eq!(
            files(&m),
            vec![
                ("big", "340282366920938463463374607431768211455"),
                ("neg", "-18446744073709551617"),
                ("f", "1.5e400"),
                ("small", "3"),
                ("nested/x", "12345678901234567890123"),
                ("ids", "18446744073709551616,-1,1.50,1E3,-0"),
                ("ratio", "0.5"),
            ]
        );
        // Serialized (the device's .json), the same bytes.
        assert_eq!(serde_json::to_string(&data).unwrap(), sent);
    }

    #[test]
    fn the_raw_text_is_compact_and_keeps_every_token() {
        // An indented file: whitespace between tokens goes, a string's stays with its escapes.
        let indented = "{\n  \"s\" : \"a b\\t\\u003c\\/ \\\\\\\" {}\" ,\r\n\t\"n\": [ 1 ,\n 2.50 ] ,\"e\" : { } }";
        let data = text(indented);
        assert_eq!(data.get(), r#"{"s":"a b\t\u003c\/ \\\" {}","n":[1,2.50],"e":{}}"#);
        assert_eq!(files(&members(&data)), vec![("s", "a b\t</ \\\" {}"), ("n", "1,2.50")]);
    }

    #[test]
    fn a_key_given_twice_keeps_its_first_place_and_last_value() {
        let m = members(&text(r#"{"a":1,"b":2,"a":{"x":3},"c":4,"b":5}"#));
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        assert_eq!(files(&m), vec![("a/x", "3"), ("b", "5"), ("c", "4")]);
    }

    #[test]
    fn text_no_string_holds_is_skipped_with_a_warning_not_a_panic() {
        // A lone surrogate escape is valid JSON text but no Rust string.
        let data = text(r#"{"ok":"yes","bad":"\ud800","list":["a","\udc00"],"in":{"\ud800":1,"x":2},"after":1}"#);
        let m = members(&data);
        assert_eq!(files(&m), vec![("ok", "yes"), ("after", "1")]);
        let all = m.warnings.join("\n");
        assert_eq!(m.warnings.len(), 3, "{all}");
        for what in ["member \"bad\" skipped", "member \"list\" skipped", "member \"in\" skipped"] {
            assert!(all.contains(what), "{what}:\n{all}");
        }
        assert!(m.warnings.iter().all(|w| w.contains("the raw .status/data has it")), "{all}");
        // A key the whole object cannot read: that object is skipped, the raw file keeps it.
        let m = members(&text(r#"{"\udfff":1}"#));
        assert!(m.files.is_empty());
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
        assert!(m.warnings[0].starts_with("status data skipped: "), "{:?}", m.warnings);
    }

    #[test]
    fn data_of_any_depth_is_kept_and_walked_only_eight_levels_deep() {
        // Far deeper than serde_json parses into a Value (128): the text is still valid and kept.
        let deep = format!("{}{}{}", r#"{"a":"#.repeat(20_000), r#"{"v":1}"#, "}".repeat(20_000));
        let data = text(&format!(r#"{{"top":1,"deep":{deep}}}"#));
        assert!(data.get().len() > 100_000);
        let m = members(&data);
        assert_eq!(files(&m), vec![("top", "1")]);
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
        assert!(m.warnings[0].contains("deeper than 8 levels skipped (1 objects"), "{:?}", m.warnings);
    }

    #[test]
    fn odd_but_valid_data_never_panics() {
        for sent in [
            "{}",
            "[]",
            "null",
            "0",
            "-0.0e-0",
            "\"\"",
            "true",
            r#"{"":1}"#,
            r#"{"a":[]}"#,
            r#"{"a":[[]]}"#,
            r#"{"a":{}}"#,
            r#"{"a":[{}]}"#,
            r#"{"a":[null]}"#,
            r#"{"a":null}"#,
            r#"{"a":"\u0000"}"#,
        ] {
            let m = members(&text(sent));
            assert!(m.files.len() <= 1, "{sent}: {m:?}");
        }
    }

    #[test]
    fn a_claim_carries_the_text_to_the_resolver() {
        let sent = r#"{"big":340282366920938463463374607431768211455,"s":"\u003c"}"#;
        let carrier = carry(&RawValue::from_string(sent.to_string()).unwrap());
        assert_eq!(carried(&carrier).get(), sent);
        // Data a driver shaped like a carrier is carried like any other.
        let forged = r#"{"\u0000drafs: the JSON text of status.devices[].data":"{\"x\":1}"}"#.to_string();
        let twice = carry(&RawValue::from_string(forged.clone()).unwrap());
        assert_eq!(carried(&twice).get(), forged);
        // A claim made without a decoder (a test's): its value as JSON.
        let made = RawExtension(json!({"vf": 3, "ids": [1, 2]}));
        assert_eq!(carried(&made).get(), r#"{"vf":3,"ids":[1,2]}"#);
    }
}
