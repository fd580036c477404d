//! `drafs probe`: is the tree at `--dir` there and ready (a startupProbe or
//! readinessProbe)? One line on stdout, exit 0 when ready.

use std::path::Path;

use crate::cmd::Failure;
use crate::model::layout;
use crate::publish::fuse::is_stale_mount;

/// `probe`: one line on stdout, exit 0 when ready.
pub fn run(dir: &Path) -> Result<(), Failure> {
    if is_stale_mount(dir) {
        return Err(Failure::Failed(format!("{} is a stale FUSE mount (its server is gone)", dir.display())));
    }
    if dir.join(layout::READY).exists() {
        println!("ready");
        return Ok(());
    }
    let reason = match std::fs::read(dir.join(layout::RECORD)) {
        Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| {
                v["missing"].as_array().map(|m| m.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join("; "))
            })
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "resolution incomplete".into()),
        Err(_) => format!("no tree at {} yet (not mounted or not written)", dir.display()),
    };
    Err(Failure::Failed(format!("not ready: {reason}")))
}
