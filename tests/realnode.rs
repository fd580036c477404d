//! The real-node tier: drafs the way users run it. A real kubelet starts the
//! pods (containerd, runc, CNI, projected tokens, Pod Security admission),
//! after the real scheduler allocated a device from a real DRA driver (the
//! upstream test driver's kubelet plugin, publishing devices with realistic
//! attributes), and the app container reads what drafs wrote. The cluster runs
//! in namespaces of its own (tests/support/node.rs, tests/node/node.sh).
//!
//! Fails, not skips, when the node cannot be built or started; outside CI,
//! DRAFS_NO_NODE_TESTS=1 skips it (loudly). nextest runs these tests one at a
//! time (.config/nextest.toml): each starts its own node.

mod support;

use std::time::Duration;

use serde_json::json;
use support::node::{self, DRAFS_IMAGE, GPU_DRIVER, Node, SHELL_IMAGE};
use support::*;

/// `drafs inject` on the host, as a user would before `kubectl apply`.
fn inject(yaml: &str, args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(drafs_bin());
    cmd.arg("inject").args(["--image", DRAFS_IMAGE]).args(args);
    let out = wait_output(
        {
            let mut child = cmd
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
            child
        },
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "drafs inject {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// A pod that passes the `restricted` Pod Security level, whose app prints
/// the GPU's uuid and product name read from drafs's tree, then sleeps.
fn gpu_pod(ns: &str, name: &str, template: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{
                "name": "app", "image": SHELL_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo \"uuid=$(cat /dra/gpu/gpu/0/uuid) product=$(cat /dra/gpu/gpu/0/productName)\"; exec sleep 3600"],
                "resources": {"claims": [{"name": "gpu"}]},
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    })
    .to_string()
}

/// Wait until the app's log has a line with `prefix`; that line.
fn log_line(node: &Node, ns: &str, pod: &str, container: &str, prefix: &str) -> String {
    let mut line = None;
    let found = wait_for(Duration::from_secs(60), || {
        line = node.logs(ns, pod, container).lines().find(|l| l.starts_with(prefix)).map(str::to_string);
        line.is_some()
    });
    assert!(found, "no {prefix:?} line in {ns}/{pod}/{container}:\n{}", node.logs(ns, pod, container));
    line.unwrap()
}

#[test]
fn each_mode_serves_the_allocated_device_in_a_real_pod() {
    let Some(node) = node::shared() else { return };
    let ns = "modes";
    // FUSE needs a privileged container: this namespace allows it.
    node.namespace(ns, Some("privileged"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    let modes = [("init", "app-init"), ("sidecar-files", "app-files"), ("sidecar-fuse", "app-fuse")];
    for (mode, pod) in modes {
        node.kubectl_apply(&inject(&gpu_pod(ns, pod, "one-gpu"), &["--mode", mode, "--require", "gpu/gpu/0/uuid"]));
    }
    for (mode, pod) in modes {
        let running = node.wait_running(ns, pod);
        let (driver, device) = node.allocated(ns, &running, "gpu");
        assert_eq!(driver, GPU_DRIVER);
        let uuid = node.slice_attribute(&driver, &device, "uuid");
        let product = node.slice_attribute(&driver, &device, "productName");
        let line = log_line(&node, ns, pod, "app", "uuid=");
        assert_eq!(line, format!("uuid={uuid} product={product}"), "{mode}: the app read another device's values");
        // The file as the app sees it, exactly the value: no trailing newline.
        assert_eq!(node.exec(ns, pod, "app", &["cat", "/dra/gpu/gpu/0/uuid"]), uuid, "{mode}");
    }
}
