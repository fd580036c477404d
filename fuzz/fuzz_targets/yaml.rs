//! Any text `--from-file` could be given, through its YAML (and JSON) reader
//! alone: never a panic, and every workload it names is among the kinds it
//! reports as not used. (The YAML reader of `drafs inject` is fuzzed by the
//! `inject` target; this one is serde-saphyr's, behind `FileObjects::parse`.)
#![no_main]

use drafs::model::objects::FileObjects;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(objects) = FileObjects::parse("fuzz", text) else { return };
    assert!(objects.workloads.len() <= objects.ignored.len());
    for workload in &objects.workloads {
        assert!(objects.ignored.contains(&workload.kind), "workload {} not reported", workload.kind);
    }
});
