//! Any YAML `drafs inject` could be given: never a panic, and injecting the
//! output again changes nothing.
#![no_main]

use drafs::admission::inject::{Mode, Options, inject};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for mode in [Mode::Init, Mode::SidecarFiles, Mode::SidecarFuse] {
        let opts = Options::new(mode, "drafs:fuzz");
        let Ok((once, _)) = inject(text, &opts) else { continue };
        let (twice, _) = inject(&once, &opts).expect("drafs's own output injects again");
        assert_eq!(once, twice, "injecting twice changed the output");
    }
});
