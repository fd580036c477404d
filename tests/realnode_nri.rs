//! drafs node as an NRI plugin, on the real node (the real-node tier:
//! tests/realnode.rs says how the node runs): containerd calls the agent for
//! every container it creates, and a container of an opted-in pod that uses a
//! claim, with nothing of drafs in the pod, reads its own device's values at
//! `/dra` from its first instruction on.

use drafs_test_support as support;

use std::process::Child;
use std::time::Duration;

use serde_json::{Value, json};
use support::node::{self, GPU_DRIVER, Node, SHELL_IMAGE, log_line};
use support::*;

/// SIGKILL to the agent and the nsenter that started it (one process group).
fn kill_agent(mut agent: Child) {
    // SAFETY: a signal to a process group this test made.
    unsafe { libc::killpg(agent.id() as i32, libc::SIGKILL) };
    agent.wait().unwrap();
}

fn agent_log(node: &Node, log: &str) -> String {
    std::fs::read_to_string(node.work().join(log)).unwrap_or_default()
}

/// `drafs node --nri` on the node, until the runtime has synchronized it.
fn start_nri_agent(node: &Node, args: &[&str], log: &str) -> Child {
    let mut all = vec!["--nri"];
    all.extend_from_slice(args);
    let agent = node.spawn_drafs_node(&all, log);
    let joined = wait_for(Duration::from_secs(60), || agent_log(node, log).contains("synchronized with the runtime"));
    assert!(joined, "the agent did not join containerd's NRI:\n{}\n{}", agent_log(node, log), node.diagnostics());
    agent
}

/// A namespace whose pods opt in to NRI's mounts, at Pod Security `restricted`.
fn nri_namespace(node: &Node, ns: &str) {
    node.namespace(ns, Some("restricted"));
    node.kubectl_ok(&["label", "namespace", ns, "drafs.dev/nri=enabled", "--overwrite"]);
}

/// A `restricted` pod with nothing of drafs in it: one claim of `template`,
/// an app that prints the GPU's uuid at start.
fn plain_pod(ns: &str, name: &str, template: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{
                "name": "app", "image": SHELL_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo \"uuid=$(cat /dra/gpu/gpu/0/uuid)\"; exec sleep 3600"],
                "resources": {"claims": [{"name": "gpu"}]},
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    })
}

#[test]
fn a_pod_with_nothing_of_drafs_reads_its_device_at_its_first_line() {
    let Some(node) = node::shared() else { return };
    let ns = "nri";
    nri_namespace(node, ns);
    node.claim_template(ns, "one-gpu", GPU_DRIVER, "gpu");
    let agent = start_nri_agent(node, &[], "drafs-node.log");
    node.kubectl_apply(&plain_pod(ns, "app", "one-gpu").to_string());
    let pod = node.wait_running(ns, "app");
    let names: Vec<_> = pod["spec"]["containers"].as_array().unwrap().iter().map(|c| c["name"].clone()).collect();
    assert_eq!(names, ["app"], "nothing added to the pod");
    assert!(
        pod["spec"]["volumes"].as_array().is_none_or(|v| v.iter().all(|v| v["csi"].is_null())),
        "no volume of drafs's"
    );
    let (driver, device) = node.allocated(ns, &pod, "gpu");
    let uuid = node.slice_attribute(&driver, &device, "uuid");
    let line = log_line(node, ns, "app", "app", "uuid=");
    assert_eq!(line, format!("uuid={uuid}"), "{}", agent_log(node, "drafs-node.log"));
    kill_agent(agent);
}
