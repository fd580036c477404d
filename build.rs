//! The commit `drafs --version` prints beside Cargo.toml's version:
//! `DRAFS_REVISION` when the build is given it (image/build.sh, a build
//! without the repository), else `git rev-parse --short HEAD` of the
//! repository this package is the root of (none: the version alone).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DRAFS_REVISION");
    let revision = match std::env::var("DRAFS_REVISION") {
        Ok(given) => given,
        Err(_) => from_git().unwrap_or_default(),
    };
    println!("cargo:rustc-env=DRAFS_REVISION={revision}");
}

/// The short commit of HEAD, if this package is the root of its git
/// checkout (not vendored into another repository, nor unpacked under one);
/// the build runs again when HEAD or a branch moves.
fn from_git() -> Option<String> {
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let package = std::fs::canonicalize(std::env::var_os("CARGO_MANIFEST_DIR")?).ok()?;
    let top = std::fs::canonicalize(git(&["rev-parse", "--show-toplevel"])?).ok()?;
    if top != package {
        return None;
    }
    // HEAD and its log are the worktree's own; branches and packed refs are
    // the repository's (shared by linked worktrees). A directory is watched
    // whole; only paths that exist (a missing one reruns every build).
    let path = |p: &str| git(&["rev-parse", "--git-path", p]).map(|p| package.join(p));
    let common = git(&["rev-parse", "--git-common-dir"]).map(|d| package.join(d));
    let watched: Vec<PathBuf> = [path("HEAD"), path("logs/HEAD")]
        .into_iter()
        .flatten()
        .chain(common.iter().flat_map(|c| [c.join("refs/heads"), c.join("packed-refs")]))
        .collect();
    for p in watched.iter().filter(|p| Path::exists(p)) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    git(&["rev-parse", "--short", "HEAD"])
}
