//! Any file `--from-file` could be given: parse, resolve, lay out the tree and
//! the standard view. Never a panic; never a path outside the tree.
#![no_main]

use drafs::model::metadata::{self, Generations};
use drafs::model::objects::FileObjects;
use drafs::model::resolve::{Selection, resolve};
use drafs::model::tree::{self, is_clean_relative};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(objects) = FileObjects::parse("fuzz", text) else { return };
    let Ok(snapshot) = objects.into_snapshot("fuzz", None) else { return };
    let res = resolve(&snapshot, &Selection::default());
    let built = tree::build(&res, &[]);
    for (path, _) in built.tree.files() {
        assert!(is_clean_relative(path), "path escapes the tree: {path:?}");
    }
    let mut warnings = Vec::new();
    let view = metadata::build(&res, &mut Generations::default(), &mut warnings);
    for (path, _) in view.files() {
        assert!(is_clean_relative(path), "metadata path escapes: {path:?}");
    }
    let _ = drafs::cmd::get::table(&res);
});
