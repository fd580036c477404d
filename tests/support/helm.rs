//! helm, built from its Go module (tests/go/build.sh, cached), run against
//! a real control plane as its admin.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

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

/// [`run`], which must succeed; its standard output.
pub fn ok(cp: &ControlPlane, args: &[&str]) -> String {
    let out = run(cp, args);
    assert!(out.status.success(), "helm {args:?}: {}", super::stderr(&out));
    super::stdout(&out)
}

/// `helm template drafs deploy/helm/drafs --namespace drafs-system ARGS`, as documents.
pub fn template(cp: &ControlPlane, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["template", "drafs", "deploy/helm/drafs", "--namespace", "drafs-system"];
    all.extend_from_slice(args);
    super::yaml_docs(&ok(cp, &all)).into_iter().filter(|d| !d.is_null()).collect()
}

/// The first of `docs` of kind `kind`.
pub fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in {docs:?}"))
}
