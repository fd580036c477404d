//! `drafs unmount`: unmount a FUSE tree (lazily if files are open), for a
//! preStop hook.

use std::path::Path;

use crate::cmd::Failure;
use crate::publish::fuse::unmount_ours;

pub fn run(dir: &Path) -> Result<(), Failure> {
    unmount_ours(dir).map_err(|e| Failure::Failed(e.to_string()))
}
