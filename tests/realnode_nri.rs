//! drafs node as an NRI plugin, on the real node (the real-node tier:
//! tests/realnode.rs says how the node runs): containerd calls the chart's
//! agent for every container it creates, and a container of an opted-in pod
//! that uses a claim, with nothing of drafs in the pod and no RBAC in its
//! namespace, reads its own devices' values at `/dra` from its first
//! instruction on, prepare-time values included.

use drafs_test_support as support;

use std::time::Duration;

use serde_json::{Value, json};
use support::node::{self, GPU_DRIVER, NIC_DRIVER, Node, SHELL_IMAGE, log_line, read_in_app, wait_read_in_app};
use support::*;

const STANDARD_ROOT: &str = "/var/run/kubernetes.io/dra-device-attributes";

/// A namespace at Pod Security `restricted` with no drafs object in it;
/// `opted_in`: labelled `drafs.dev/nri=enabled`.
fn bare_namespace(node: &Node, ns: &str, opted_in: bool) {
    let mut labels = json!({"pod-security.kubernetes.io/enforce": "restricted"});
    if opted_in {
        labels["drafs.dev/nri"] = json!("enabled");
    }
    node.kubectl_apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}).to_string(),
    );
}

/// Templates: `two-gpus` (requests `a` and `b`, a GPU each), `one-gpu`, and
/// `one-nic`, whose claims the NIC driver writes a status for at prepare.
fn templates(node: &Node, ns: &str) {
    let template = |name: &str, annotations: Value, requests: Value| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name, "namespace": ns},
               "spec": {"metadata": {"annotations": annotations}, "spec": {"devices": {"requests": requests}}}})
        .to_string()
    };
    let one = |name: &str, class: &str| json!({"name": name, "exactly": {"deviceClassName": class}});
    node.kubectl_apply(&template("two-gpus", json!({}), json!([one("a", GPU_DRIVER), one("b", GPU_DRIVER)])));
    node.kubectl_apply(&template("one-gpu", json!({}), json!([one("gpu", GPU_DRIVER)])));
    let prepared = json!({"dra-driver.test/status-at-prepare": "true"});
    node.kubectl_apply(&template("one-nic", prepared, json!([one("nic", NIC_DRIVER)])));
}

/// A restricted container named `name` running `script`, using `claims`.
fn container(name: &str, script: &str, claims: Value) -> Value {
    json!({
        "name": name, "image": SHELL_IMAGE, "imagePullPolicy": "Never",
        "command": ["sh", "-c", format!("{script}; exec sleep 3600")],
        "resources": {"claims": claims},
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
    })
}

fn pod(ns: &str, name: &str, annotations: Value, claims: Value, containers: Value) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "resourceClaims": claims,
            "containers": containers,
        },
    })
    .to_string()
}

/// A pod of one container `app` using a GPU of `one-gpu`, printing its uuid at start.
fn gpu_pod(ns: &str, name: &str) -> String {
    let app = container(
        "app",
        "echo \"uuid=$(cat /dra/gpu/gpu/0/uuid)\"; test -e /dra && echo mounted=yes || echo mounted=no",
        json!([{"name": "gpu"}]),
    );
    pod(ns, name, json!({}), json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]), json!([app]))
}

/// The chart's agent, NRI on (its default), until containerd has synchronized it.
fn install_agent(node: &Node) {
    node.install_chart_agent(&node::chart_node_objects(node::DRAFS_IMAGE, &[]));
    wait_nri(node);
}

fn wait_nri(node: &Node) {
    let joined = wait_for(Duration::from_secs(60), || node.chart_agent_log().contains("synchronized with the runtime"));
    assert!(joined, "the agent did not join containerd's NRI:\n{}", node.chart_agent_log());
}

#[test]
fn a_pod_with_nothing_of_drafs_reads_every_value_at_its_first_line_each_container_its_own() {
    let Some(node) = node::shared() else { return };
    install_agent(node);
    let ns = "nri";
    bare_namespace(node, ns, true);
    templates(node, ns);
    // Container a: the GPU of request a and the NIC (its interface name the
    // driver wrote at prepare); b: the GPU of request b; c: no device.
    let a = container(
        "a",
        "echo \"a uuid=$(cat /dra/gpus/a/0/uuid) nic=$(cat /dra/nic/nic/0/.status/interfaceName) requests=$(ls /dra/gpus | tr '\\n' ' ')\"",
        json!([{"name": "gpus", "request": "a"}, {"name": "nic"}]),
    );
    let b = container(
        "b",
        "echo \"b uuid=$(cat /dra/gpus/b/0/uuid) requests=$(ls /dra/gpus | tr '\\n' ' ')\"",
        json!([{"name": "gpus", "request": "b"}]),
    );
    let c = container("c", "test -e /dra && echo c mounted=yes || echo c mounted=no", json!([]));
    let claims = json!([{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}, {"name": "nic", "resourceClaimTemplateName": "one-nic"}]);
    node.kubectl_apply(&pod(ns, "app", json!({"drafs.dev/metadata-dir": STANDARD_ROOT}), claims, json!([a, b, c])));
    let running = node.wait_running(ns, "app");
    let spec = &running["spec"];
    assert_eq!(spec["containers"].as_array().unwrap().len(), 3, "nothing added to the pod");
    assert!(
        spec["initContainers"].is_null()
            && spec["volumes"].as_array().is_none_or(|v| v.iter().all(|v| v["csi"].is_null()))
    );
    assert!(
        node.get_json(&["roles,rolebindings", "-n", ns])
            .is_some_and(|l| l["items"].as_array().is_none_or(|i| i.is_empty())),
        "no RBAC in the namespace"
    );

    // Each container read its own devices at its first instruction, the
    // prepare-time interface name included.
    let claim = node.allocated_device(ns, "app", "gpus").claim;
    let results =
        node.get_json(&["resourceclaim", "-n", ns, &claim]).unwrap()["status"]["allocation"]["devices"]["results"]
            .clone();
    let device_of = |request: &str| {
        let r = results.as_array().unwrap().iter().find(|r| r["request"] == request).unwrap();
        r["device"].as_str().unwrap().to_string()
    };
    let uuid = |request: &str| node.slice_attribute(GPU_DRIVER, &device_of(request), "uuid");
    let nic = node.allocated_device(ns, "app", "nic");
    assert_eq!(
        log_line(node, ns, "app", "a", "a uuid="),
        format!("a uuid={} nic=net-{} requests=a ", uuid("a"), nic.device)
    );
    assert_eq!(log_line(node, ns, "app", "b", "b uuid="), format!("b uuid={} requests=b ", uuid("b")));
    assert_eq!(log_line(node, ns, "app", "c", "c mounted="), "c mounted=no");
    let write = node.kubectl(&["exec", "-n", ns, "app", "-c", "a", "--", "sh", "-c", "echo x > /dra/x"]);
    assert!(!write.status.success(), "the app cannot write into its tree");
    let record: Value = serde_json::from_str(&read_in_app_container(node, ns, "app", "a", "/dra/.json")).unwrap();
    assert_eq!(record["pod"]["uid"], running["metadata"]["uid"], "its own pod's tree");

    // Its standard view: drafs's file for the GPU beside the NIC driver's own.
    let listing = node.exec(ns, "app", "a", &["sh", "-c", &format!("cd {STANDARD_ROOT} && find . -type f | sort")]);
    let gpu_file = format!("./resourceclaimtemplates/gpus/a/{GPU_DRIVER}-metadata.json");
    let nic_file = format!("./resourceclaimtemplates/nic/nic/{NIC_DRIVER}-metadata.json");
    assert_eq!(listing.lines().collect::<Vec<_>>(), [gpu_file.as_str(), nic_file.as_str()], "{listing}");
    let nic_view = node.exec(ns, "app", "a", &["cat", &format!("{STANDARD_ROOT}/{nic_file}")]);
    // The driver's own: one document (drafs writes v1beta1 then v1alpha1).
    assert_eq!(nic_view.matches("\"apiVersion\"").count(), 1, "the NIC driver's own file, not drafs's: {nic_view:?}");
    decode_standard_view(node, ns, &format!("{STANDARD_ROOT}/{gpu_file}"));

    // A pod of a namespace that did not opt in, and a second pod: neither
    // gets anything of the first's.
    bare_namespace(node, "nri-plain", false);
    templates(node, "nri-plain");
    node.kubectl_apply(&gpu_pod("nri-plain", "outsider"));
    node.wait_running("nri-plain", "outsider");
    assert_eq!(log_line(node, "nri-plain", "outsider", "app", "mounted="), "mounted=no");
    node.kubectl_apply(&gpu_pod(ns, "second"));
    let second = node.wait_running(ns, "second");
    let (_, device) = node.allocated(ns, &second, "gpu");
    assert_eq!(
        log_line(node, ns, "second", "app", "uuid="),
        format!("uuid={}", node.slice_attribute(GPU_DRIVER, &device, "uuid"))
    );
    let record: Value = serde_json::from_str(&read_in_app(node, ns, "second", "/dra/.json")).unwrap();
    assert_eq!(record["pod"]["uid"], second["metadata"]["uid"]);

    // Live: the driver changes its GPUs' product name.
    node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, " (nri)"));
    let mut seen = String::new();
    let live = wait_for(Duration::from_secs(60), || {
        seen = read_in_app_container(node, ns, "app", "b", "/dra/gpus/b/0/productName");
        seen == "NVIDIA H200 (nri)"
    });
    assert!(live, "not live: {seen:?}\n{}", node.chart_agent_log());

    // `drafs check --installation` says the node serves through NRI.
    let mut check = node.in_node(drafs_bin());
    check.args(["check", "--installation", "-o", "json"]).env("KUBECONFIG", node.admin_kubeconfig());
    let out = check.output().unwrap();
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    let nri = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == "nri").cloned().unwrap_or_default();
    assert_eq!(nri["status"], "ok", "{report:#}");
    assert_eq!(nri["details"]["serving"], json!([node::NODE_NAME]), "{report:#}");

    // The sandbox goes: its tree goes with it.
    let uid = running["metadata"]["uid"].as_str().unwrap().to_string();
    // /run, not /var/run: an absolute link read through /proc/PID/root leads to the host's.
    let tree = node.node_path(&format!("/run/drafs/nri/{uid}"));
    assert!(tree.exists());
    node.kubectl_ok(&["delete", "pod", "-n", ns, "app", "--wait=true", "--timeout=60s"]);
    let gone = wait_for(Duration::from_secs(60), || !tree.exists());
    assert!(gone, "the pod's tree is left:\n{}", node.chart_agent_log());
}

/// Read `path` in `container` of a pod.
fn read_in_app_container(node: &Node, ns: &str, pod: &str, container: &str, path: &str) -> String {
    node.exec(ns, pod, container, &["cat", path])
}

/// The upstream decoder reads drafs's standard-view file of container a.
fn decode_standard_view(node: &Node, ns: &str, file: &str) {
    let copy = tempfile::tempdir().unwrap();
    let rel = file.strip_prefix(&format!("{STANDARD_ROOT}/")).unwrap();
    let dest = copy.path().join("view").join(rel);
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::write(&dest, node.exec(ns, "app", "a", &["cat", file])).unwrap();
    let mut record: Value = serde_json::from_str(&node.exec(ns, "app", "a", &["cat", "/dra/.json"])).unwrap();
    record["claims"].as_array_mut().unwrap().retain(|c| c["name"] == "gpus");
    std::fs::write(copy.path().join("tree.json"), record.to_string()).unwrap();
    node.assert_decoder_agrees(&copy.path().join("view"), &copy.path().join("tree.json"));
}

#[test]
fn pods_keep_their_trees_while_the_agent_restarts_and_start_without_one_while_it_is_gone() {
    let Some(node) = node::shared() else { return };
    install_agent(node);
    let ns = "nri-restart";
    bare_namespace(node, ns, true);
    templates(node, ns);
    node.kubectl_apply(&gpu_pod(ns, "app"));
    let running = node.wait_running(ns, "app");
    let (_, device) = node.allocated(ns, &running, "gpu");
    let uuid = node.slice_attribute(GPU_DRIVER, &device, "uuid");
    assert_eq!(log_line(node, ns, "app", "app", "uuid="), format!("uuid={uuid}"));

    // The agent's pod deleted: its tree stays readable meanwhile, and the new
    // agent takes it back at the runtime's synchronization and keeps it live.
    node.kubectl_ok(&[
        "delete",
        "pods",
        "-n",
        "drafs-system",
        "-l",
        "app.kubernetes.io/name=drafs-node",
        "--wait=false",
    ]);
    for _ in 0..5 {
        assert_eq!(read_in_app(node, ns, "app", "/dra/gpu/gpu/0/uuid"), uuid, "readable while the agent restarts");
    }
    node.wait_chart_agent();
    wait_nri(node);
    node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, " (after restart)"));
    wait_read_in_app(node, ns, "app", "/dra/gpu/gpu/0/productName", "NVIDIA H200 (after restart)");

    // No agent at all: an opted-in pod starts as it would without drafs
    // (documented: the runtime creates containers without a plugin that is
    // not there), with nothing at /dra.
    let uid = running["metadata"]["uid"].as_str().unwrap().to_string();
    let tree = node.node_path(&format!("/run/drafs/nri/{uid}"));
    assert!(tree.exists(), "the running pod's tree is not on the node");
    node.kubectl_ok(&["delete", "daemonset", "-n", "drafs-system", "drafs-node", "--wait=true", "--timeout=60s"]);
    let gone = wait_for(Duration::from_secs(60), || {
        node.get_json(&["pods", "-n", "drafs-system", "-l", "app.kubernetes.io/name=drafs-node"])
            .is_some_and(|l| l["items"].as_array().is_some_and(|i| i.is_empty()))
    });
    assert!(gone, "the agent's pod is still there");
    // Uninstalled, it left nothing on the node; the running pod keeps its last tree.
    assert!(!tree.exists(), "the uninstalled agent left the running pod's tree on the node");
    node.kubectl_apply(&gpu_pod(ns, "unserved"));
    node.wait_running(ns, "unserved");
    assert_eq!(log_line(node, ns, "unserved", "app", "mounted="), "mounted=no");
    assert_eq!(read_in_app(node, ns, "app", "/dra/gpu/gpu/0/uuid"), uuid, "the running pod keeps its tree");
    // A pod that cannot start without it says so (with containerd's default
    // validator on, docs/node-mode.md): its container is refused, and the
    // kubelet says why.
    let mut required: Value = serde_json::from_str(&gpu_pod(ns, "required")).unwrap();
    required["metadata"]["annotations"] = json!({"required-plugins.noderesource.dev/pod": "[\"drafs\"]"});
    node.kubectl_apply(&required.to_string());
    let mut events = String::new();
    let refused = wait_for(Duration::from_secs(60), || {
        events = node.kubectl_ok(&["get", "events", "-n", ns, "--field-selector", "involvedObject.name=required"]);
        events.contains("required plugin") && events.contains("drafs")
    });
    assert!(refused, "the pod that requires drafs was not refused:\n{events}");
    // The agent back: the pod starts, with its tree.
    node.install_chart_agent(&node::chart_node_objects(node::DRAFS_IMAGE, &[]));
    wait_nri(node);
    node.wait_running(ns, "required");
    assert_eq!(log_line(node, ns, "required", "app", "mounted="), "mounted=yes");
}
