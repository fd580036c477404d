//! Any JSON a driver could put in a claim's `status.devices[].data`: the
//! member files never panic, and they are a tree drafs can write: each path
//! clean and relative, every component a safe name, at most `MAX_DEPTH`
//! components and `MAX_FILES` files, no path twice, no file where another
//! needs a directory.
#![no_main]

use std::collections::BTreeSet;

use drafs::model::names::is_data_key;
use drafs::model::status_data::{MAX_DEPTH, MAX_FILES, members};
use drafs::model::tree::is_clean_relative;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else { return };
    let out = members(&value);
    if !value.is_object() {
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
