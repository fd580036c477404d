//! drafs per node, on the real node (the real-node tier: tests/realnode.rs
//! says how the node runs): `drafs node` registers with the real kubelet as a
//! CSI driver, and a pod that asks with a `csi:` volume, with no drafs
//! container of its own and at the `restricted` Pod Security level, reads its
//! device's values from its first instruction on, and sees them change.

use drafs_test_support as support;

use std::process::Child;
use std::time::Duration;

use serde_json::{Value, json};
use support::node::{self, GPU_DRIVER, NODE_NAME, Node, SHELL_IMAGE, gpu_pod, log_line, read_in_app, wait_read_in_app};
use support::*;

const DRIVER: &str = "drafs.dev";

/// `drafs node` on the node (support::node::Node::spawn_drafs_node); [`kill_agent`] kills it.
fn start_agent(node: &Node, log: &str) -> Child {
    node.spawn_drafs_node(&[], log)
}

/// SIGKILL to the agent and the nsenter that started it (one process group).
fn kill_agent(mut agent: Child) {
    // SAFETY: a signal to a process group this test made.
    unsafe { libc::killpg(agent.id() as i32, libc::SIGKILL) };
    agent.wait().unwrap();
}

/// Whether the kubelet lists drafs among the node's CSI drivers.
fn is_registered(node: &Node) -> bool {
    node.get_json(&["csinode", NODE_NAME])
        .is_some_and(|n| n["spec"]["drivers"].as_array().into_iter().flatten().any(|d| d["name"] == DRIVER))
}

/// Until the kubelet lists drafs among the node's CSI drivers.
fn wait_registered(node: &Node) {
    let registered = wait_for(Duration::from_secs(30), || is_registered(node));
    assert!(registered, "the kubelet did not register {DRIVER}\n{}", node.diagnostics());
}

/// A `restricted` pod with a GPU claim and drafs's volume only: its app
/// prints the GPU's uuid and product name at start.
fn csi_pod(ns: &str, name: &str) -> String {
    csi_pod_from(ns, name, "one-gpu")
}

fn csi_pod_from(ns: &str, name: &str, template: &str) -> String {
    let mut pod: Value = serde_json::from_str(&gpu_pod(ns, name, template)).unwrap();
    pod["spec"]["serviceAccountName"] = json!("drafs");
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "dra", "mountPath": "/dra", "readOnly": true}]);
    pod["spec"]["volumes"] = json!([{"name": "dra", "csi": {"driver": DRIVER, "readOnly": true}}]);
    pod.to_string()
}

/// The mounts drafs made under the kubelet's pod directories.
fn agent_mounts(node: &Node, uid: &str) -> Vec<String> {
    node.mountinfo()
        .lines()
        .filter(|l| l.contains(" - tmpfs drafs-node ") && l.contains(uid))
        .map(String::from)
        .collect()
}

fn uid_of(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().unwrap().to_string()
}

#[test]
fn a_restricted_pod_reads_its_device_from_a_csi_volume_live_across_agent_restarts() {
    let Some(node) = node::shared() else { return };
    let ns = "csi";
    node.namespace(ns, Some("restricted"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    node.csi_driver();
    let agent = start_agent(node, "drafs-node.log");
    wait_registered(node);

    node.kubectl_apply(&csi_pod(ns, "app"));
    let pod = node.wait_running(ns, "app");
    let names: Vec<_> = pod["spec"]["containers"].as_array().unwrap().iter().map(|c| c["name"].clone()).collect();
    assert_eq!(names, ["app"], "no drafs container in the pod");
    assert!(pod["spec"]["initContainers"].is_null(), "no drafs init container either");
    let (driver, device) = node.allocated(ns, &pod, "gpu");
    assert_eq!(driver, GPU_DRIVER);
    let uuid = node.slice_attribute(&driver, &device, "uuid");
    let product = node.slice_attribute(&driver, &device, "productName");
    // The app's first instruction read the values: published before it started.
    let line = log_line(node, ns, "app", "app", "uuid=");
    assert_eq!(line, format!("uuid={uuid} product={product}"));
    let write = node.kubectl(&["exec", "-n", ns, "app", "-c", "app", "--", "sh", "-c", "echo x > /dra/x"]);
    assert!(!write.status.success(), "the app cannot write into its tree");

    // Live: the driver changes its GPUs' product name and republishes.
    node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, " (rev 2)"));
    wait_read_in_app(node, ns, "app", "/dra/gpu/gpu/0/productName", "NVIDIA H200 (rev 2)");

    // The agent killed hard: the tree stays readable; restarted, it takes the
    // volume over at the kubelet's next publish and follows changes again.
    kill_agent(agent);
    assert_eq!(read_in_app(node, ns, "app", "/dra/gpu/gpu/0/uuid"), uuid, "readable while the agent is down");
    let agent = start_agent(node, "drafs-node-2.log");
    node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, " (rev 3)"));
    let mut seen = String::new();
    // The kubelet publishes again once per sync (a minute by default).
    let live = wait_for(Duration::from_secs(240), || {
        seen = read_in_app(node, ns, "app", "/dra/gpu/gpu/0/productName");
        seen == "NVIDIA H200 (rev 3)"
    });
    assert!(
        live,
        "not live again after the agent's restart: {seen:?}\n{}",
        std::fs::read_to_string(node.work().join("drafs-node-2.log")).unwrap_or_default()
    );

    // A pod whose account lacks drafs's RBAC waits, and says why where
    // `kubectl describe pod` shows it.
    let mut unauthorized: Value = serde_json::from_str(&csi_pod(ns, "unauthorized")).unwrap();
    unauthorized["spec"]["serviceAccountName"] = json!("default");
    node.kubectl_apply(&unauthorized.to_string());
    let mut events = String::new();
    let told = wait_for(Duration::from_secs(60), || {
        events = node.kubectl_ok(&["get", "events", "-n", ns, "--field-selector", "involvedObject.name=unauthorized"]);
        events.contains("FailedMount") && events.contains("forbidden")
    });
    assert!(told, "no FailedMount naming the refusal:\n{events}");
    assert!(events.contains("drafs manifests rbac"), "the fix is named:\n{events}");
    node.kubectl_ok(&["delete", "pod", "-n", ns, "unauthorized", "--wait=true", "--timeout=60s"]);

    // Deleted: unpublished, unmounted, nothing left.
    let uid = uid_of(&pod);
    assert_eq!(agent_mounts(node, &uid).len(), 1, "one tmpfs for the pod's volume");
    node.kubectl_ok(&["delete", "pod", "-n", ns, "app", "--wait=true", "--timeout=60s"]);
    let gone = wait_for(Duration::from_secs(30), || agent_mounts(node, &uid).is_empty());
    assert!(gone, "the pod's tmpfs is still mounted: {:?}", agent_mounts(node, &uid));
    kill_agent(agent);
}

/// The chart's node part (`--set node.enabled=true`), as `helm template`
/// renders it for the node's image.
fn chart_node_objects() -> String {
    let out = std::process::Command::new(support::helm::binary())
        .args(["template", "drafs", "deploy/helm/drafs", "--namespace", "drafs-system"])
        .args(["--set", "node.enabled=true", "--set", "image.pullPolicy=Never"])
        .args(["--set", &format!("image.repository={}", node::DRAFS_IMAGE.split(':').next().unwrap())])
        .args(["--set", &format!("image.tag={}", node::DRAFS_IMAGE.split(':').nth(1).unwrap())])
        .args(["--show-only", "templates/node.yaml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "helm template: {}", stderr(&out));
    stdout(&out)
}

#[test]
fn the_charts_daemonset_serves_restricted_pods_on_the_node() {
    let Some(node) = node::shared() else { return };
    node.kubectl_apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "drafs-system"}}).to_string(),
    );
    node.kubectl_apply(&chart_node_objects());
    let ds = wait_for(Duration::from_secs(90), || {
        node.get_json(&["daemonset", "-n", "drafs-system", "drafs-node"])
            .is_some_and(|d| d["status"]["numberReady"] == 1)
    });
    assert!(ds, "the DaemonSet's pod is not ready\n{}", node.kubectl_ok(&["describe", "pods", "-n", "drafs-system"]));
    let agent_log = || node.kubectl_ok(&["logs", "-n", "drafs-system", "daemonset/drafs-node"]);
    let registered = wait_for(Duration::from_secs(30), || is_registered(node));
    assert!(registered, "the kubelet did not register {DRIVER}; the agent's log:\n{}", agent_log());

    let ns = "csi-chart";
    node.namespace(ns, Some("restricted"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    node.kubectl_apply(&csi_pod(ns, "app"));
    let pod = node.wait_running(ns, "app");
    let (driver, device) = node.allocated(ns, &pod, "gpu");
    let uuid = node.slice_attribute(&driver, &device, "uuid");
    assert!(log_line(node, ns, "app", "app", "uuid=").starts_with(&format!("uuid={uuid} ")));
    // `drafs inject --mode csi` gives a plain pod the volume, and nothing else.
    let plain = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "injected", "namespace": ns},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{
                "name": "app", "image": SHELL_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo \"uuid=$(cat /dra/gpu/gpu/0/uuid)\"; exec sleep 3600"],
                "resources": {"claims": [{"name": "gpu"}]},
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    });
    let args = ["inject", "--mode", "csi", "--image", node::DRAFS_IMAGE, "--require", "gpu/gpu/0/uuid"];
    let injected = drafs_with_stdin(&args, &plain.to_string());
    assert_ok(&injected);
    node.kubectl_apply(&stdout(&injected));
    let pod = node.wait_running(ns, "injected");
    assert_eq!(pod["spec"]["containers"].as_array().unwrap().len(), 1);
    let (driver, device) = node.allocated(ns, &pod, "gpu");
    let uuid = node.slice_attribute(&driver, &device, "uuid");
    assert_eq!(log_line(node, ns, "injected", "app", "uuid="), format!("uuid={uuid}"));

    // The agent's own account may read the slices and nothing else: the
    // pod and its claims were read as the pod.
    let can = |verb: &str, what: &str| {
        let account = "system:serviceaccount:drafs-system:drafs-node";
        node.kubectl(&["auth", "can-i", verb, what, "--all-namespaces", "--as", account]).status.success()
    };
    assert!(can("watch", "resourceslices.resource.k8s.io"));
    for (verb, what) in [("get", "pods"), ("list", "resourceclaims.resource.k8s.io"), ("get", "secrets")] {
        assert!(!can(verb, what), "the agent's account may {verb} {what}");
    }
}

/// The watches the API server holds open, by resource
/// (`apiserver_longrunning_requests`).
fn open_watches(node: &Node) -> std::collections::BTreeMap<String, u64> {
    let metrics = node.kubectl_ok(&["get", "--raw", "/metrics"]);
    let mut out = std::collections::BTreeMap::new();
    for line in
        metrics.lines().filter(|l| l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\""))
    {
        let resource = line.split("resource=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or_default();
        let value: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        *out.entry(resource.to_string()).or_default() += value as u64;
    }
    out
}

#[test]
fn thirty_pods_on_the_node_share_one_slice_watch_and_hold_no_watch_once_started() {
    const PODS: usize = 30;
    let Some(node) = node::shared() else { return };
    let ns = "csi-many";
    node.namespace(ns, Some("restricted"));
    node.shared_gpu_template(ns, "gpu-2gi", "2Gi");
    node.csi_driver();
    let before = open_watches(node);
    // Watched for 5 s after its publish, then read again at most once a minute.
    let agent = node.spawn_drafs_node(&["--watch-for", "5s", "--refresh", "1m"], "drafs-node.log");
    wait_registered(node);
    let pods: Vec<String> = (0..PODS).map(|i| format!("app-{i}")).collect();
    let all = pods.iter().map(|p| csi_pod_from(ns, p, "gpu-2gi")).collect::<Vec<_>>().join("\n---\n");
    node.kubectl_apply(&all);
    for pod in &pods {
        node.wait_running(ns, pod);
        assert_eq!(
            log_line(node, ns, pod, "app", "uuid="),
            "uuid=GPU-5c1f7e2a-3b4d-4e6f-8a9b-0c1d2e3f4a5b product=NVIDIA H200"
        );
    }
    // Once the pods have started, the API server holds no watch for them:
    // their pods and claims are asked at refreshes; the node's slices are
    // one watch, the agent's.
    let count = |w: &std::collections::BTreeMap<String, u64>, r: &str| w.get(r).copied().unwrap_or(0);
    let mut now = open_watches(node);
    let settled = wait_for(Duration::from_secs(60), || {
        now = open_watches(node);
        count(&now, "resourceclaims") <= count(&before, "resourceclaims")
            && count(&now, "pods") <= count(&before, "pods")
    });
    assert!(settled, "watches before the agent: {before:?}; with {PODS} pods: {now:?}");
    assert_eq!(count(&now, "resourceslices"), count(&before, "resourceslices") + 1, "before: {before:?}, now: {now:?}");

    // Live through the shared watch: every pod sees the driver's change.
    node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, " (rev 2)"));
    for pod in &pods {
        wait_read_in_app(node, ns, pod, "/dra/gpu/gpu/0/productName", "NVIDIA H200 (rev 2)");
    }
    node.kubectl_ok(&["delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=120s"]);
    let gone =
        wait_for(Duration::from_secs(60), || node.mountinfo().lines().all(|l| !l.contains(" - tmpfs drafs-node ")));
    assert!(gone, "tmpfs mounts left after the pods were deleted");
    kill_agent(agent);
}
