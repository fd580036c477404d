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

use serde_json::Value;

use crate::model::names::{is_data_key, quoted};

/// The deepest member path, in components under `data.d/` (`mig/uuid` is 2).
pub const MAX_DEPTH: usize = 8;
/// The most member files of one device.
pub const MAX_FILES: usize = 1024;
/// Skipped members named one by one; the rest are counted in one warning.
const MAX_NAMED: usize = 8;

/// One device's data as files: (path under `data.d/`, content), in the data's
/// order, and what was left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    pub files: Vec<(String, String)>,
    pub warnings: Vec<String>,
}

/// The member files of `data`. Data that is not a JSON object has none (the
/// API server accepts only objects, so that can only come from a file).
pub fn members(data: &Value) -> Members {
    let mut walk = Walk::default();
    match data {
        Value::Object(_) => walk.object(data, "", 1),
        other => walk.out.warnings.push(format!(
            "status data is a JSON {}, not an object (the API server accepts only objects): only the raw \
             .status/data has it",
            kind(other)
        )),
    }
    walk.finish()
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
    /// The members of the object at `prefix` (`""` for the top), whose members are `depth` deep.
    fn object(&mut self, value: &Value, prefix: &str, depth: usize) {
        let Value::Object(map) = value else { return };
        if depth > MAX_DEPTH && !map.is_empty() {
            let first = self.too_deep.get_or_insert_with(|| (prefix.to_string(), 0));
            first.1 += 1;
            return;
        }
        for (key, member) in map {
            if !is_data_key(key) {
                let parent = if prefix.is_empty() { String::new() } else { format!(" (in {prefix:?})") };
                self.skip(format!(
                    "status data key {}{parent} skipped: not a safe file name (1 to 64 of A-Z a-z 0-9 _ . -, not \
                     starting with . or -)",
                    quoted(key)
                ));
                continue;
            }
            let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}/{key}") };
            match member {
                Value::Null => {}
                Value::Object(_) => self.object(member, &path, depth + 1),
                Value::Array(items) => match items.iter().map(scalar).collect::<Option<Vec<String>>>() {
                    Some(texts) => self.file(path, texts.join(",")),
                    None => self
                        .skip(format!("status data member {path:?} skipped: a list holding objects, lists or nulls")),
                },
                scalar_value => self.file(path, scalar(scalar_value).unwrap_or_default()),
            }
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

/// A scalar as file text: strings verbatim, numbers as JSON writes them, `true`/`false`.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        let m = members(&data);
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
            let m = members(&data);
            assert!(m.files.is_empty(), "{data}: {:?}", m.files);
            assert_eq!(m.warnings.len(), 1, "{data}: {:?}", m.warnings);
            assert!(m.warnings[0].contains("not an object"), "{:?}", m.warnings);
        }
        assert_eq!(members(&json!({})), Members::default());
    }

    #[test]
    fn hostile_keys_are_skipped_with_a_warning_each() {
        let long = "k".repeat(65);
        let data = json!({
            "../x": 1, "a/b": 2, ".ready": 3, "": 4, "ünï": 5, "nul\u{0}": 6,
            long.clone(): 8, "ok": "yes",
            "dir": {"..": {"x": 1}, "fine": "f"}
        });
        let m = members(&data);
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
        let m = members(&Value::Object(data));
        assert!(m.files.is_empty());
        assert_eq!(m.warnings.len(), MAX_NAMED + 1, "{:?}", m.warnings);
        assert!(m.warnings[MAX_NAMED - 1].contains("\".bad7\""), "{:?}", m.warnings);
        assert_eq!(m.warnings[MAX_NAMED], "12 more status data members skipped; the raw .status/data has them");
    }

    #[test]
    fn lists_of_objects_lists_or_nulls_are_skipped_by_name() {
        let data = json!({"vfs": [{"pci": "0000:3b:00.1"}], "grid": [[1]], "holes": [1, null], "gpu": {"links": [{}]}});
        let m = members(&data);
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
        let m = members(&deep);
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
        let m = members(&Value::Object(data));
        assert_eq!(m.files.len(), MAX_FILES);
        assert_eq!(m.files.last().unwrap(), &(format!("k{:05}", MAX_FILES - 1), (MAX_FILES - 1).to_string()));
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
        assert!(m.warnings[0].contains("500 skipped, the first \"k01024\""), "{:?}", m.warnings);
    }
}
