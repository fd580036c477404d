//! drafs per node, on the real node (the real-node tier: tests/realnode.rs
//! says how the node runs): `drafs node` registers with the real kubelet as a
//! CSI driver, and a pod that asks with a `csi:` volume, with no drafs
//! container of its own and at the `restricted` Pod Security level, reads its
//! device's values from its first instruction on, and sees them change.

use drafs_test_support as support;

use std::process::Child;
use std::time::Duration;

use serde_json::{Value, json};
use support::node::{
    self, GPU_DRIVER, NIC_DRIVER, Node, SHELL_IMAGE, gpu_pod, log_line, read_in_app, wait_read_in_app,
};
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

/// Until the kubelet lists drafs among the node's CSI drivers.
fn wait_registered(node: &Node) {
    let registered = wait_for(Duration::from_secs(30), || node.csi_registered(DRIVER));
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

    // Every line about a volume names its pod, the unpublishes of the
    // restarted agent (which had not served the pods) included.
    let log = std::fs::read_to_string(node.work().join("drafs-node-2.log")).unwrap_or_default();
    let about_volumes: Vec<&str> = log.lines().filter(|l| l.contains("volume{")).collect();
    assert!(about_volumes.iter().any(|l| l.contains("unpublished")), "no unpublish logged:\n{log}");
    let nameless: Vec<&&str> =
        about_volumes.iter().filter(|l| l.contains("pod=\"\"") || l.contains("pod= ") || l.contains("pod=}")).collect();
    assert!(nameless.is_empty(), "lines about a volume without its pod: {nameless:#?}");
}

/// Where KEP-5304 readers (KubeVirt's virt-launcher) look for the standard view.
const STANDARD_ROOT: &str = "/var/run/kubernetes.io/dra-device-attributes";

/// KubeVirt's launcher reads its GPU's PCI address from the standard view.
/// In node mode that is a second drafs volume (`view: standard`, which
/// `inject --mode csi --metadata-dir` adds), with no drafs container in the
/// pod, beside the NIC driver's own file (the runtime mounts it over the
/// empty mount point drafs leaves for it); the upstream decoder reads
/// drafs's file and agrees with the tree.
#[test]
fn a_launcher_reads_the_standard_view_from_a_csi_volume_beside_a_drivers_own_file() {
    let Some(node) = node::shared() else { return };
    let ns = "csi-view";
    node.namespace(ns, Some("restricted"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    node.claim_template(ns, "one-nic", "dra.net", "nic");
    node.csi_driver();
    let agent = start_agent(node, "drafs-node-view.log");
    wait_registered(node);

    let mut pod: Value = serde_json::from_str(&gpu_pod(ns, "launcher", "one-gpu")).unwrap();
    pod["spec"]["resourceClaims"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "nic", "resourceClaimTemplateName": "one-nic"}));
    let app = &mut pod["spec"]["containers"][0];
    app["resources"]["claims"].as_array_mut().unwrap().push(json!({"name": "nic"}));
    // As the launcher of examples/kubevirt-launcher reads it, at its first instruction.
    let meta = format!("{STANDARD_ROOT}/resourceclaimtemplates/gpu/gpu/{GPU_DRIVER}-metadata.json");
    let read = format!(
        "bdf=$(jq -r 'select(.apiVersion == \"metadata.resource.k8s.io/v1beta1\") | .requests[].devices[].attributes[\"resource.kubernetes.io/pciBusID\"].string // empty' {meta} | head -n 1); echo \"pci=$bdf\"; exec sleep 3600"
    );
    app["command"] = json!(["sh", "-c", read]);
    let args = [
        "inject",
        "--mode",
        "csi",
        "--image",
        node::DRAFS_IMAGE,
        "--metadata-dir",
        STANDARD_ROOT,
        "--metadata-from-driver",
        NIC_DRIVER,
    ];
    let injected = drafs_with_stdin(&args, &pod.to_string());
    assert_ok(&injected);
    let injected = stdout(&injected);
    assert!(!injected.contains("initContainers"), "no drafs container: {injected}");
    node.kubectl_apply(&injected);
    let running = node.wait_running(ns, "launcher");
    let (_, gpu_device) = node.allocated(ns, &running, "gpu");
    let pci = node.slice_attribute(GPU_DRIVER, &gpu_device, "resource.kubernetes.io/pciBusID");
    assert_eq!(log_line(node, ns, "launcher", "app", "pci="), format!("pci={pci}"));
    assert_eq!(agent_mounts(node, &uid_of(&running)).len(), 2, "a tmpfs for the tree and one for the view");

    // One file per request directory: drafs's for the GPU, the driver's own for the NIC.
    let listing =
        node.exec(ns, "launcher", "app", &["sh", "-c", &format!("cd {STANDARD_ROOT} && find . -type f | sort")]);
    assert_eq!(
        listing.lines().collect::<Vec<_>>(),
        [
            format!("./resourceclaimtemplates/gpu/gpu/{GPU_DRIVER}-metadata.json"),
            format!("./resourceclaimtemplates/nic/nic/{NIC_DRIVER}-metadata.json")
        ],
        "the standard view and nothing else"
    );
    let nic = node.exec(
        ns,
        "launcher",
        "app",
        &["cat", &format!("{STANDARD_ROOT}/resourceclaimtemplates/nic/nic/{NIC_DRIVER}-metadata.json")],
    );
    assert!(nic.contains("\"driverName\""), "the NIC driver's own file, not drafs's empty mount point: {nic:?}");

    // The upstream decoder reads drafs's file, and it agrees with the tree's record.
    let copy = tempfile::tempdir().unwrap();
    let gpu_dir = copy.path().join("view/resourceclaimtemplates/gpu/gpu");
    std::fs::create_dir_all(&gpu_dir).unwrap();
    std::fs::write(
        gpu_dir.join(format!("{GPU_DRIVER}-metadata.json")),
        node.exec(ns, "launcher", "app", &["cat", &meta]),
    )
    .unwrap();
    // The record of the GPU's claim only: the NIC's file is the driver's, not drafs's.
    let mut record: Value = serde_json::from_str(&node.exec(ns, "launcher", "app", &["cat", "/dra/.json"])).unwrap();
    record["claims"].as_array_mut().unwrap().retain(|c| c["name"] == "gpu");
    std::fs::write(copy.path().join("tree.json"), record.to_string()).unwrap();
    node.assert_decoder_agrees(&copy.path().join("view"), &copy.path().join("tree.json"));

    // The view follows the device, as the tree does.
    node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, " (view)"));
    let mut seen = String::new();
    let live = wait_for(Duration::from_secs(60), || {
        seen = node.exec(ns, "launcher", "app", &["cat", &meta]);
        seen.contains("NVIDIA H200 (view)")
    });
    assert!(live, "the standard view did not follow the device: {seen}");

    let uid = uid_of(&running);
    node.kubectl_ok(&["delete", "pod", "-n", ns, "launcher", "--wait=true", "--timeout=60s"]);
    let gone = wait_for(Duration::from_secs(30), || agent_mounts(node, &uid).is_empty());
    assert!(gone, "the pod's tmpfs mounts are left: {:?}", agent_mounts(node, &uid));
    kill_agent(agent);
}

/// The agent pod's restarts (the DaemonSet's one pod).
fn agent_restarts(node: &Node) -> u64 {
    let pods = node.get_json(&["pods", "-n", "drafs-system", "-l", "app.kubernetes.io/name=drafs-node"]).unwrap();
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["status"]["containerStatuses"].as_array().cloned().unwrap_or_default())
        .map(|c| c["restartCount"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn the_charts_daemonset_serves_restricted_pods_on_the_node() {
    let Some(node) = node::shared() else { return };
    // The CSI volume alone (tests/realnode_nri.rs runs the chart's default, NRI too).
    node.install_chart_agent(&node::chart_node_objects(node::DRAFS_IMAGE, &["node.nri.enabled=false"]));
    // Kubernetes 1.35+: the kubelet sends the pod's token in the request's
    // secrets (KEP-5538), which the agent reads.
    let csi_driver = node.get_json(&["csidriver", DRIVER]).unwrap();
    assert_eq!(csi_driver["spec"]["serviceAccountTokenInSecrets"], true, "{csi_driver}");

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

    // `drafs check --installation` sees the chart's agent ready and registered
    // on the node, and this namespace's pods' account with drafs's RBAC
    // (other tests' pods are theirs to judge).
    let mut check = node.in_node(drafs_bin());
    check.args(["check", "--installation", "-o", "json"]).env("KUBECONFIG", node.admin_kubeconfig());
    let out = check.output().unwrap();
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    let named = |name: &str| {
        report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap_or(Value::Null)
    };
    for name in ["csi-driver", "agents"] {
        assert_eq!(named(name)["status"], "ok", "{report:#}");
    }
    assert_eq!(named("agents")["details"]["linuxNodes"], 1, "{report:#}");
    let volume_rbac = named("volume-rbac");
    let accounts = volume_rbac["details"]["accounts"].as_array().unwrap();
    assert!(accounts.contains(&json!(format!("{ns}/drafs"))), "{volume_rbac:#}");
    let lacking = volume_rbac["details"]["lacking"].to_string();
    assert!(!lacking.contains(&format!("\"{ns}/")), "{volume_rbac:#}");

    // Without NRI, the agent's own account may read the slices and nothing
    // else: the pod and its claims were read as the pod.
    let can = |verb: &str, what: &str| {
        let account = "system:serviceaccount:drafs-system:drafs-node";
        node.kubectl(&["auth", "can-i", verb, what, "--all-namespaces", "--as", account]).status.success()
    };
    assert!(can("watch", "resourceslices.resource.k8s.io"));
    for (verb, what) in [("get", "pods"), ("list", "resourceclaims.resource.k8s.io"), ("get", "secrets")] {
        assert!(!can(verb, what), "the agent's account may {verb} {what}");
    }
}

/// With `node.watchNodePods`, the chart's agent watches its node's pods: a
/// pod whose volume's own watches have ended (`--watch-for=5s` here, 2 min by
/// default) sees its GPU's health change in its file as the kubelet reports
/// it, each way, not at the next refresh (5 min). The agent's account may
/// list and watch pods for it, and still nothing else of a pod's.
#[test]
fn a_health_change_reaches_the_volume_of_a_pod_past_its_watch_window() {
    let Some(node) = node::shared() else { return };
    let values = ["node.watchNodePods=true", "node.extraArgs={--watch-for=5s}", "node.nri.enabled=false"];
    node.install_chart_agent(&node::chart_node_objects(node::DRAFS_IMAGE, &values));
    let ns = "csi-health";
    node.namespace(ns, Some("restricted"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    node.kubectl_apply(&csi_pod(ns, "app"));
    let pod = node.wait_running(ns, "app");
    // Past the window: the volume's run watches its pod and claim no more.
    let parked = wait_for(Duration::from_secs(60), || {
        node.chart_agent_log().lines().any(|l| l.contains(&format!("pod={ns}/app")) && l.contains("watch window over"))
    });
    assert!(parked, "the volume still watches its pod; the agent's log:\n{}", node.chart_agent_log());

    let gpu = node.allocated_device(ns, "app", "gpu");
    let report = |state: &str, message: &str| node.report_gpu_health(&gpu, state, message);
    report("Unhealthy", "XID 79 (from the test)");
    wait_read_in_app(node, ns, "app", "/dra/gpu/gpu/0/.health", "Unhealthy");
    assert_eq!(read_in_app(node, ns, "app", "/dra/gpu/gpu/0/.healthMessage"), "XID 79 (from the test)");
    report("Healthy", "");
    wait_read_in_app(node, ns, "app", "/dra/gpu/gpu/0/.health", "Healthy");
    assert_eq!(node.get_json(&["pod", "-n", ns, "app"]).unwrap()["metadata"]["uid"], pod["metadata"]["uid"]);

    let can = |verb: &str, what: &str| {
        let account = "system:serviceaccount:drafs-system:drafs-node";
        node.kubectl(&["auth", "can-i", verb, what, "--all-namespaces", "--as", account]).status.success()
    };
    assert!(can("watch", "pods") && can("list", "pods"));
    for (verb, what) in [("get", "pods"), ("list", "resourceclaims.resource.k8s.io"), ("get", "secrets")] {
        assert!(!can(verb, what), "the agent's account may {verb} {what}");
    }
    node.kubectl_ok(&["delete", "namespace", ns, "--wait=false"]);
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
    // Only this test's pods' mounts count: the node's mount table also lists
    // what the host had mounted when the node started.
    let uids: Vec<String> = pods.iter().map(|pod| uid_of(&node.get_json(&["pod", "-n", ns, pod]).unwrap())).collect();
    node.kubectl_ok(&["delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=120s"]);
    let gone = wait_for(Duration::from_secs(60), || uids.iter().all(|uid| agent_mounts(node, uid).is_empty()));
    assert!(gone, "tmpfs mounts left after the pods were deleted");
    kill_agent(agent);
}

/// A pod in a `restricted` namespace with 120 drafs volumes and 250 KiB of
/// annotations (nothing in the API forbids either), beside ordinary pods, on
/// the chart's agent with the chart's memory limit: the agent never restarts,
/// the ordinary pods start and read their values, the hostile pod is told why
/// it waits, and its deletion completes.
#[test]
fn a_hostile_pod_leaves_every_other_pod_on_the_node_served() {
    const VOLUMES: usize = 120;
    let Some(node) = node::shared() else { return };
    node.install_chart_agent(&node::chart_node_objects(node::DRAFS_IMAGE, &[]));
    let ns = "tenants";
    node.namespace(ns, Some("restricted"));
    node.shared_gpu_template(ns, "gpu-2gi", "2Gi");

    let mut hostile: Value = serde_json::from_str(&csi_pod_from(ns, "hostile", "gpu-2gi")).unwrap();
    let annotations: serde_json::Map<String, Value> =
        (0..5).map(|i| (format!("tenant.example/blob-{i}"), json!("x".repeat(50 * 1024)))).collect();
    hostile["metadata"]["annotations"] = Value::Object(annotations);
    hostile["spec"]["volumes"] = (0..VOLUMES)
        .map(|i| json!({"name": format!("dra-{i}"), "csi": {"driver": DRIVER, "readOnly": true}}))
        .collect::<Vec<_>>()
        .into();
    // The kubelet mounts only the volumes a container mounts: every one is.
    hostile["spec"]["containers"][0]["volumeMounts"] = (0..VOLUMES)
        .map(|i| json!({"name": format!("dra-{i}"), "mountPath": if i == 0 { "/dra".to_string() } else { format!("/dra-{i}") }, "readOnly": true}))
        .collect::<Vec<_>>()
        .into();
    node.kubectl_create(&hostile.to_string());
    let mut events = String::new();
    let told = wait_for(Duration::from_secs(90), || {
        events = node.kubectl_ok(&["get", "events", "-n", ns, "--field-selector", "involvedObject.name=hostile"]);
        events.contains("FailedMount") && events.contains("has a drafs volume of view tree already")
    });
    assert!(
        told,
        "the hostile pod is not told why it waits; its events:\n{events}\nthe agent's log:\n{}",
        node.chart_agent_log()
    );

    let pods: Vec<String> = (0..3).map(|i| format!("ordinary-{i}")).collect();
    node.kubectl_apply(&pods.iter().map(|p| csi_pod_from(ns, p, "gpu-2gi")).collect::<Vec<_>>().join("\n---\n"));
    for pod in &pods {
        node.wait_running(ns, pod);
        assert_eq!(
            log_line(node, ns, pod, "app", "uuid="),
            "uuid=GPU-5c1f7e2a-3b4d-4e6f-8a9b-0c1d2e3f4a5b product=NVIDIA H200"
        );
    }
    let hostile_uid = uid_of(&node.get_json(&["pod", "-n", ns, "hostile"]).unwrap());
    assert_eq!(agent_mounts(node, &hostile_uid).len(), 1, "the hostile pod's one served volume");
    node.kubectl_ok(&["delete", "pod", "-n", ns, "hostile", "--wait=true", "--timeout=120s"]);
    let left = agent_mounts(node, &hostile_uid);
    assert!(
        left.is_empty(),
        "the hostile pod's volumes are left mounted: {left:#?}\nthe agent's log:\n{}",
        node.chart_agent_log()
    );
    assert_eq!(agent_restarts(node), 0, "the agent restarted; its log:\n{}", node.chart_agent_log());
    node.kubectl_ok(&["delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=120s"]);
}

/// An app that keeps its working directory in its tree while the tree is
/// replaced (the values a driver reports at prepare come a moment after the
/// publish, as do later changes) reads the old tree whole: no value of the
/// tree it entered is lost. And apps that walk their tree at start, over many
/// starts, never read a missing value.
#[test]
fn apps_inside_their_tree_never_lose_a_file_while_it_is_replaced() {
    let Some(node) = node::shared() else { return };
    let ns = "readers";
    node.namespace(ns, Some("restricted"));
    node.shared_gpu_template(ns, "gpu-2gi", "2Gi");
    node.csi_driver();
    let agent = node.spawn_drafs_node(&[], "drafs-node.log");
    wait_registered(node);

    // The app enters its device's directory, says so, waits for the word,
    // then walks the directory it is in.
    let walk = r#"n=0; bad=0
for f in $(find -L . -type f); do
    cat "$f" >/dev/null 2>&1 || { echo "missing $f"; bad=$((bad+1)); }
    case "$f" in */.*) ;; *) n=$((n+1)) ;; esac
done
echo "walked files=$n missing=$bad""#;
    let mut held: Value = serde_json::from_str(&csi_pod_from(ns, "held", "gpu-2gi")).unwrap();
    held["spec"]["volumes"].as_array_mut().unwrap().push(json!({"name": "scratch", "emptyDir": {}}));
    held["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "scratch", "mountPath": "/scratch"}));
    let script = format!(
        "cd /dra/gpu/gpu/0 && echo entered; until [ -e /scratch/go ]; do sleep 0.1; done; {walk}; exec sleep 3600"
    );
    held["spec"]["containers"][0]["command"] = json!(["sh", "-c", script]);
    node.kubectl_apply(&held.to_string());
    node.wait_running(ns, "held");
    log_line(node, ns, "held", "app", "entered");
    // The tree is replaced while the app is inside the old one.
    node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, " (rev 2)"));
    wait_read_in_app(node, ns, "held", "/dra/gpu/gpu/0/productName", "NVIDIA H200 (rev 2)");
    node.exec(ns, "held", "app", &["touch", "/scratch/go"]);
    let walked = log_line(node, ns, "held", "app", "walked");
    assert!(
        walked.ends_with(" missing=0") && !walked.contains("files=0 "),
        "{walked}\n{}",
        node.logs(ns, "held", "app")
    );

    // Many starts: each app walks its tree at once, as the prepare-time values land.
    const STARTS: usize = 12;
    let starts: Vec<String> = (0..STARTS).map(|i| format!("start-{i}")).collect();
    let pods = starts
        .iter()
        .map(|name| {
            let mut pod: Value = serde_json::from_str(&csi_pod_from(ns, name, "gpu-2gi")).unwrap();
            pod["spec"]["containers"][0]["command"] =
                json!(["sh", "-c", format!("cd /dra/gpu/gpu/0 && {{ {walk}; }}; exec sleep 3600")]);
            pod.to_string()
        })
        .collect::<Vec<_>>()
        .join("\n---\n");
    // Every value of a device's directory: what each walk must read (`files`
    // counts the attributes and capacities; dot files such as `.health`
    // arrive when the kubelet reports, so their number varies with the moment).
    let files = node.exec(ns, "held", "app", &["sh", "-c", "find -L /dra/gpu/gpu/0 -type f -not -path '*/.*' | wc -l"]);
    let want = format!("walked files={} missing=0", files.trim());
    // While they start, the driver changes its devices again and again: trees
    // are replaced under the walks (the example driver writes no status at
    // prepare, so the test brings the swaps itself).
    let agent_log = node.work().join("drafs-node.log");
    let updates = || std::fs::read_to_string(&agent_log).unwrap_or_default().matches("tree updated").count();
    let updates_before = updates();
    let started = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut revision = 3;
            while !started.load(std::sync::atomic::Ordering::Relaxed) {
                node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, &format!(" (rev {revision})")));
                revision += 1;
                std::thread::sleep(Duration::from_millis(300)); // the pace of the changes, not a wait for one
            }
        });
        node.kubectl_apply(&pods);
        for name in &starts {
            node.wait_running(ns, name);
        }
        started.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    for name in &starts {
        let walked = log_line(node, ns, name, "app", "walked");
        assert_eq!(walked, want, "{name}:\n{}", node.logs(ns, name, "app"));
    }
    let swaps = updates() - updates_before;
    assert!(swaps >= STARTS, "only {swaps} trees replaced while {STARTS} apps started and walked");
    // The superseded trees go once readers have had their time: one payload left.
    let target = |pod: &Value| format!("/var/lib/kubelet/pods/{}/volumes/kubernetes.io~csi/dra/mount", uid_of(pod));
    let held = node.get_json(&["pod", "-n", ns, "held"]).unwrap();
    let payloads = || {
        let out = node.in_node("ls").args(["-A", &target(&held)]).output().unwrap();
        stdout(&out).lines().filter(|l| l.starts_with("..") && *l != "..data" && !l.starts_with("..data_tmp")).count()
    };
    let tidied = wait_for(Duration::from_secs(90), || payloads() == 1);
    assert!(tidied, "superseded payloads left: {}", payloads());
    node.kubectl_ok(&["delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=120s"]);
    kill_agent(agent);
}

/// The kubelet restarted: the trees it published stay readable, the agent is
/// registered again (and again once its registration socket is removed), and
/// new pods get their volumes; existing ones are live again at their next
/// republish.
#[test]
fn a_kubelet_restart_keeps_the_trees_and_serves_new_pods() {
    let Some(node) = node::shared() else { return };
    let ns = "restart";
    node.namespace(ns, Some("restricted"));
    node.shared_gpu_template(ns, "gpu-2gi", "2Gi");
    node.csi_driver();
    let agent = node.spawn_drafs_node(&[], "drafs-node.log");
    wait_registered(node);
    node.kubectl_apply(&csi_pod_from(ns, "before", "gpu-2gi"));
    node.wait_running(ns, "before");
    node.restart_kubelet();
    // The new kubelet knows the pod once it has synced it from the API server.
    let known = wait_for(Duration::from_secs(60), || {
        node.kubectl(&["exec", "-n", ns, "before", "-c", "app", "--", "true"]).status.success()
    });
    assert!(known, "the restarted kubelet does not know the pod");
    assert_eq!(read_in_app(node, ns, "before", "/dra/gpu/gpu/0/productName"), "NVIDIA H200");
    wait_registered(node);
    // The registration socket removed (a clean-up of the kubelet's plugin
    // registry): the agent makes it again and the kubelet registers it again.
    let log = node.work().join("drafs-node.log");
    let registrations =
        || std::fs::read_to_string(&log).unwrap_or_default().matches("registered with the kubelet").count();
    let before = registrations();
    let removed = node.in_node("rm").arg("/var/lib/kubelet/plugins_registry/drafs.dev-reg.sock").output().unwrap();
    assert!(removed.status.success(), "rm: {}", stderr(&removed));
    let again = wait_for(Duration::from_secs(60), || registrations() > before);
    assert!(
        again,
        "not registered again after its socket was removed:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(std::fs::read_to_string(&log).unwrap_or_default().contains("the socket was gone: listening again"));
    wait_registered(node);
    node.kubectl_apply(&csi_pod_from(ns, "after", "gpu-2gi"));
    node.wait_running(ns, "after");
    assert_eq!(
        log_line(node, ns, "after", "app", "uuid="),
        "uuid=GPU-5c1f7e2a-3b4d-4e6f-8a9b-0c1d2e3f4a5b product=NVIDIA H200"
    );
    node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, " (rev 2)"));
    for pod in ["before", "after"] {
        wait_read_in_app(node, ns, pod, "/dra/gpu/gpu/0/productName", "NVIDIA H200 (rev 2)");
    }
    node.kubectl_ok(&["delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=120s"]);
    kill_agent(agent);
}

/// The chart, by its absolute path (helm runs in the node's mount namespace).
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/helm/drafs");

/// `helm ARGS` against the node's API server, as its admin (helm's caches in
/// the node's directory).
fn helm_on(node: &Node, args: &[&str]) -> String {
    let out = helm_output(node, args);
    assert!(out.status.success(), "helm {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// `helm ARGS` as [`helm_on`], whatever its outcome.
fn helm_output(node: &Node, args: &[&str]) -> std::process::Output {
    let mut helm = node.in_node(support::helm::binary());
    helm.args(args);
    support::helm::against(helm, node.work(), &node.admin_kubeconfig()).output().unwrap()
}

/// `helm install drafs` with the node part on, the node's image, and more `--set` values.
fn install_chart(node: &Node, values: &[&str]) {
    let (repository, tag) = node::DRAFS_IMAGE.split_once(':').unwrap();
    let image = [format!("image.repository={repository}"), format!("image.tag={tag}")];
    let mut args = vec!["install", "drafs", CHART, "--namespace", "drafs-system", "--create-namespace"];
    args.extend(["--set", "node.enabled=true", "--set", "image.pullPolicy=Never", "--set", &image[0]]);
    args.extend(["--set", &image[1]]);
    for value in values {
        args.extend(["--set", value]);
    }
    helm_on(node, &args);
    node.wait_chart_agent();
}

/// The chart's pre-delete guard on a real kubelet: `helm uninstall` is
/// refused while a pod has the volume (it would stay Terminating without the
/// agent), printing the pod and the way past, and nothing is deleted; once
/// the pod is gone the uninstall goes through, and nothing of the guard, the
/// agent or its driver is left.
#[test]
fn helm_uninstall_is_refused_while_a_pod_uses_the_volume() {
    let Some(node) = node::shared() else { return };
    install_chart(node, &["node.nri.enabled=false"]);
    let ns = "guarded";
    node.namespace(ns, Some("restricted"));
    node.claim_template(ns, "one-gpu", GPU_DRIVER, "gpu");
    node.kubectl_apply(&csi_pod(ns, "app"));
    node.wait_running(ns, "app");

    let uninstall = ["uninstall", "drafs", "--namespace", "drafs-system", "--wait", "--timeout", "120s"];
    let refused = helm_output(node, &uninstall);
    let said = format!("{}{}", stdout(&refused), stderr(&refused));
    assert!(!refused.status.success(), "uninstalled while a pod uses the volume: {said}");
    // Helm prints the hook's log (its `hook-output-log-policy`), and why it stopped.
    assert!(said.contains("Pod/drafs-system/drafs-uninstall-guard not ready. status: Failed"), "{said}");
    assert!(said.contains(&format!("1 pod uses a volume of {DRIVER}: {ns}/app on {}.", node::NODE_NAME)), "{said}");
    assert!(said.contains("uninstall anyway (they then stay Terminating) with helm uninstall --no-hooks"), "{said}");
    assert!(said.contains(&format!("--no-hooks: kubectl delete pod -n {ns} app")), "{said}");
    assert!(said.contains("verdict: FAIL, 1 check failed: drafs node is in use"), "{said}");
    // Nothing deleted: the agent serving the pod. Helm marked the release
    // `uninstalling` before its hook ran; `helm rollback` makes it `deployed`
    // again (an upgrade needs that), as docs/node-mode.md says.
    let status = || {
        let text = helm_on(node, &["status", "drafs", "-n", "drafs-system", "-o", "json"]);
        serde_json::from_str::<Value>(&text).unwrap()["info"]["status"].clone()
    };
    assert_eq!(status(), "uninstalling");
    helm_on(node, &["rollback", "drafs", "1", "-n", "drafs-system", "--wait", "--timeout", "120s"]);
    assert_eq!(status(), "deployed");
    assert!(node.get_json(&["csidriver", DRIVER]).is_some());
    assert!(node.get_json(&["daemonset", "-n", "drafs-system", "drafs-node"]).is_some());
    assert_eq!(read_in_app(node, ns, "app", "/dra/gpu/gpu/0/productName"), "NVIDIA H200");
    let guard_left = || {
        [
            vec!["pod", "-n", "drafs-system", "drafs-uninstall-guard"],
            vec!["serviceaccount", "-n", "drafs-system", "drafs-uninstall-guard"],
            vec!["clusterrole", "drafs-uninstall-guard"],
            vec!["clusterrolebinding", "drafs-uninstall-guard"],
        ]
        .into_iter()
        .filter(|args| node.get_json(args).is_some())
        .map(|args| args.join(" "))
        .collect::<Vec<_>>()
    };
    assert_eq!(guard_left(), Vec::<String>::new(), "the refused guard's objects");

    node.kubectl_ok(&["delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=120s"]);
    let out = helm_on(node, &uninstall);
    assert!(out.contains("release \"drafs\" uninstalled"), "{out}");
    assert!(node.get_json(&["csidriver", DRIVER]).is_none());
    assert_eq!(guard_left(), Vec::<String>::new(), "the passed guard's objects");
    let gone = wait_for(Duration::from_secs(60), || {
        node.get_json(&["pods", "-n", "drafs-system", "-l", "app.kubernetes.io/name=drafs-node"])
            .is_some_and(|p| p["items"].as_array().is_some_and(Vec::is_empty))
    });
    assert!(gone, "the agent's pod outlived the uninstall");
}

/// `helm upgrade` to a new image: the agent is replaced, the running pods'
/// trees stay readable throughout, and are live again within one republish.
#[test]
fn an_upgrade_to_a_new_image_keeps_running_pods_served() {
    let Some(node) = node::shared() else { return };
    install_chart(node, &[]);
    let ns = "upgrade";
    node.namespace(ns, Some("restricted"));
    node.shared_gpu_template(ns, "gpu-2gi", "2Gi");
    node.kubectl_apply(&csi_pod_from(ns, "app", "gpu-2gi"));
    node.wait_running(ns, "app");
    let old_agent = node.get_json(&["pods", "-n", "drafs-system", "-l", "app.kubernetes.io/name=drafs-node"]).unwrap();
    let old_agent = old_agent["items"][0]["metadata"]["name"].as_str().unwrap().to_string();

    // The next version: the same binary under another tag, as a release would be.
    let next = format!("{}-next", node::DRAFS_IMAGE);
    let tagged = node
        .ctr()
        .args(["images", "tag", "--force"])
        .args([&format!("docker.io/library/{}", node::DRAFS_IMAGE), &format!("docker.io/library/{next}")])
        .output()
        .unwrap();
    assert!(tagged.status.success(), "ctr images tag: {}", stderr(&tagged));
    let next_tag = format!("image.tag={}-next", node::DRAFS_IMAGE.split_once(':').unwrap().1);
    helm_on(node, &["upgrade", "drafs", CHART, "--namespace", "drafs-system", "--reuse-values", "--set", &next_tag]);
    let mut reads = 0;
    let replaced = wait_for(Duration::from_secs(120), || {
        // Readable all along.
        assert_eq!(read_in_app(node, ns, "app", "/dra/gpu/gpu/0/productName"), "NVIDIA H200", "during the upgrade");
        reads += 1;
        let pods = node.get_json(&["pods", "-n", "drafs-system", "-l", "app.kubernetes.io/name=drafs-node"]).unwrap();
        let items = pods["items"].as_array().cloned().unwrap_or_default();
        items.len() == 1
            && items[0]["metadata"]["name"] != old_agent.as_str()
            && items[0]["spec"]["containers"][0]["image"].as_str().is_some_and(|i| i.ends_with("-next"))
            && items[0]["status"]["containerStatuses"][0]["ready"] == true
    });
    assert!(replaced, "the agent was not replaced by the new image");
    assert!(reads > 0);
    node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, " (rev 2)"));
    let mut seen = String::new();
    // The kubelet publishes again once per sync (a minute by default).
    let live = wait_for(Duration::from_secs(240), || {
        seen = read_in_app(node, ns, "app", "/dra/gpu/gpu/0/productName");
        seen == "NVIDIA H200 (rev 2)"
    });
    assert!(live, "not live again after the upgrade: {seen:?}\n{}", node.chart_agent_log());
    node.kubectl_ok(&["delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=120s"]);
}
