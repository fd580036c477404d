//! Any object an API server could send: the slice decoder (with a filter) and
//! the claim decoder never panic, the slice decoder keeps only wanted devices,
//! and a claim carries each device's data as valid JSON text.
#![no_main]

use drafs::model::slices::{DeviceFilter, decode, decode_claim};
use drafs::model::status_data::carried;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let filter = DeviceFilter::new([("gpu.example.com".into(), "p".into(), "g1".into())]);
    if let Ok(Some(slice)) = decode(text, &filter, Some("n")) {
        for d in slice.spec.devices.iter().flatten() {
            assert!(filter.wants(&slice.spec.driver, &slice.spec.pool.name, &d.name));
        }
    }
    if let Ok(claim) = decode_claim(text) {
        for data in claim.status.into_iter().flat_map(|s| s.devices).flatten().filter_map(|d| d.data) {
            let data = carried(&data);
            assert!(serde_json::from_str::<&serde_json::value::RawValue>(data.get()).is_ok(), "{:?}", data.get());
        }
    }
});
