//! The commit `drafs --version` prints beside Cargo.toml's version:
//! `DRAFS_REVISION` when the build is given it (image/build.sh, a build
//! without the repository), else the checkout's `git rev-parse --short HEAD`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DRAFS_REVISION");
    let revision = match std::env::var("DRAFS_REVISION") {
        Ok(given) => given,
        Err(_) => from_git().unwrap_or_default(),
    };
    println!("cargo:rustc-env=DRAFS_REVISION={revision}");
}

/// The short commit of HEAD; the build runs again when HEAD moves.
fn from_git() -> Option<String> {
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let git_dir = git(&["rev-parse", "--git-dir"])?;
    let mut watched = vec![Path::new(&git_dir).join("HEAD"), Path::new(&git_dir).join("packed-refs")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(Path::new(&git_dir).join(branch));
    }
    // Only paths that exist: a missing one would make cargo run this on every build.
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    git(&["rev-parse", "--short", "HEAD"])
}
