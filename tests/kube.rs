//! The kube tier: the real `drafs` binary against the real control plane
//! (kube-apiserver and etcd built from their Go modules by tests/kube/build.sh),
//! with the shipped RBAC applied for real, real bound service-account tokens,
//! TLS with a CA made at start, and objects written the way the cluster writes
//! them. Fails, not skips, when the control plane cannot be built or started;
//! outside CI, DRAFS_NO_KUBE_TESTS=1 skips it (loudly).

mod support;

use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};
use support::cluster::Scenario;
use support::controlplane::{self, ControlPlane};
use support::*;

const LIMIT: Duration = Duration::from_secs(120);

fn assert_ok(out: &Output) {
    assert!(out.status.success(), "exit {:?}\nstderr: {}", out.status.code(), stderr(out));
}

/// Decode every standard-view file under `metadata_dir` with the upstream Go
/// decoder and compare it with the tree's `.json`.
fn assert_upstream_decodes(cp: &ControlPlane, metadata_dir: &std::path::Path, tree_json: &std::path::Path) {
    let out = std::process::Command::new(cp.metadata_decoder())
        .args(["-test.run", "^TestDecodeStandardView$", "-test.v", "-test.count=1"])
        .env("DRAFS_METADATA_DIR", metadata_dir)
        .env("DRAFS_TREE_JSON", tree_json)
        .output()
        .unwrap();
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "the upstream decoder disagrees:\n{text}");
    assert!(text.contains("decoded and matched"), "the Go test did not run:\n{text}");
}

#[test]
fn init_in_pod_template_claim_tree_and_standard_view() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/gpu-training.yaml"));
    sc.create_all();
    let dir = sc.path("dra");
    let meta = sc.path("meta");
    let out = wait_output(
        sc.in_pod_command(&[
            "init",
            "--dir",
            dir.to_str().unwrap(),
            "--metadata-dir",
            meta.to_str().unwrap(),
            "--timeout",
            "60s",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap(),
        LIMIT,
    );
    assert_ok(&out);
    let tree = read_tree(&dir);
    assert_eq!(tree["gpu/gpu/0/uuid"], "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b");
    assert_eq!(tree["gpu/gpu/0/productName"], "NVIDIA H200", "the stale generation must not win");
    assert_eq!(tree["gpu/gpu/0/resource.kubernetes.io/pciBusID"], "0000:5e:00.0");
    assert_eq!(tree["gpu/gpu/0/.capacity/gpu.nvidia.com/memory"], "141Gi");
    assert_eq!(tree["gpu/gpu/0/.pool"], sc.node);
    let whole: Value = serde_json::from_str(&tree[".json"]).unwrap();
    assert_eq!(whole["pod"]["uid"], json!(sc.pod_uid), "the pod read from the API");
    assert_eq!(whole["pod"]["namespace"], json!(sc.namespace), "namespace from the service account");
    assert_upstream_decodes(cp, &meta, &dir.join(".json"));
}
