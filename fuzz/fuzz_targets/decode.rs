//! Any object an API server could send: the slice decoder (with a filter) and
//! the claim decoder never panic, and the slice decoder keeps only wanted devices.
#![no_main]

use drafs::model::slices::{DeviceFilter, decode, decode_claim};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let filter = DeviceFilter::new([("gpu.example.com".into(), "p".into(), "g1".into())]);
    if let Ok(Some(slice)) = decode(text, &filter, Some("n")) {
        for d in slice.spec.devices.iter().flatten() {
            assert!(filter.wants(&slice.spec.driver, &slice.spec.pool.name, &d.name));
        }
    }
    let _ = decode_claim(text);
});
