//! Any JSON a driver could put in a claim's `status.devices[].data`, read as
//! the text it is (numbers no `Value` holds, any depth): the raw text stays
//! valid JSON with the same tokens (carried through a claim unchanged), the
//! member files never panic, and they are a tree drafs can write: each path
//! clean and relative, every component a safe name, at most `MAX_DEPTH`
//! components and `MAX_FILES` files, no path twice, no file where another
//! needs a directory.
#![no_main]

use std::collections::BTreeSet;

use drafs::model::json_text::Kind;
use drafs::model::names::is_data_key;
use drafs::model::status_data::{MAX_DEPTH, MAX_FILES, RawData, carried, carry, members};
use drafs::model::tree::is_clean_relative;
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = serde_json::from_slice::<&RawValue>(data) else { return };
    let data = RawData::new(raw);
    let text = data.get();
    assert!(serde_json::from_str::<&RawValue>(text).is_ok(), "not valid JSON: {text:?}");
    let tokens = |t: &str| t.split(|c: char| c.is_ascii_whitespace()).collect::<String>();
    if !raw.get().contains('"') {
        assert_eq!(tokens(raw.get()), text, "more than whitespace removed");
    }
    assert_eq!(carried(&carry(raw)).get(), text, "not carried unchanged");
    let out = members(&data);
    if Kind::of(raw) != Kind::Object {
        assert!(out.files.is_empty(), "files from data that is not an object");
        assert!(!out.warnings.is_empty(), "no warning for data that is not an object");
    }
    assert!(out.files.len() <= MAX_FILES, "{} files", out.files.len());
    let mut paths = BTreeSet::new();
    for (path, _) in &out.files {
        assert!(is_clean_relative(path), "not a clean relative path: {path:?}");
        let depth = path.split('/').count();
        assert!(depth <= MAX_DEPTH, "{path:?} is {depth} deep");
        for component in path.split('/') {
            assert!(is_data_key(component), "{component:?} (in {path:?}) is not a safe name");
        }
        assert!(paths.insert(path.as_str()), "{path:?} twice");
    }
    for path in &paths {
        let mut dir = path.as_bytes();
        while let Some(cut) = dir.iter().rposition(|&b| b == b'/') {
            dir = &dir[..cut];
            let dir = std::str::from_utf8(dir).expect("cut at a /");
            assert!(!paths.contains(dir), "{dir:?} is a file and the directory of {path:?}");
        }
    }
});
