//! helm, built from its Go module (tests/go/build.sh, cached), run against
//! a real control plane as its admin.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::controlplane::ControlPlane;

/// `helm` (built once with the other Go programs, cached outside the checkout).
pub fn binary() -> PathBuf {
    let dir = super::controlplane::binaries();
    dir.unwrap_or_else(|e| panic!("helm could not be built: {e}")).join("helm")
}

/// `cmd` (which runs [`binary`], directly or in a node's namespaces) made to
/// reach a cluster as `kubeconfig`, with helm's caches and config in `dir`/helm.
pub fn against(mut cmd: Command, dir: &Path, kubeconfig: &Path) -> Command {
    let home = dir.join("helm");
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    cmd
}

/// `helm ARGS` with the control plane's admin kubeconfig, from the repository
/// root, with its caches and config in the control plane's directory.
pub fn run(cp: &ControlPlane, args: &[&str]) -> Output {
    let mut helm = Command::new(binary());
    helm.args(args);
    against(helm, cp.dir(), &cp.dir().join("admin.kubeconfig"))
        .current_dir(super::repo_path(""))
        .stdin(Stdio::null())
        .output()
        .expect("helm runs")
}
