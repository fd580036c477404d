//! The kube tier: the real `drafs` binary against the real control plane
//! (kube-apiserver and etcd built from their Go modules by tests/kube/build.sh),
//! with the shipped RBAC applied for real, real bound service-account tokens,
//! TLS with a CA made at start, and objects written the way the cluster writes
//! them. Fails, not skips, when the control plane cannot be built or started;
//! outside CI, DRAFS_NO_KUBE_TESTS=1 skips it (loudly).

use drafs_test_support as support;

use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};
use support::cluster::Scenario;
use support::controlplane::{self, ControlPlane};
use support::*;

const LIMIT: Duration = Duration::from_secs(120);
const WEBHOOK_PICKUP: Duration = Duration::from_secs(20);

fn assert_ok(out: &Output) {
    assert!(out.status.success(), "exit {:?}\nstderr: {}", out.status.code(), stderr(out));
}

/// Run a prepared drafs command to its end (with the safety limit), capturing its output.
fn run(mut cmd: std::process::Command) -> Output {
    wait_output(cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap(), LIMIT)
}

/// `drafs init` as a pod sees it, with the standard view; returns (tree dir, metadata dir).
fn init_in_pod(sc: &Scenario) -> (std::path::PathBuf, std::path::PathBuf) {
    let (dir, meta) = (sc.path("dra"), sc.path("meta"));
    let out = run(sc.in_pod_command(&[
        "init",
        "--dir",
        dir.to_str().unwrap(),
        "--metadata-dir",
        meta.to_str().unwrap(),
        "--timeout",
        "60s",
    ]));
    assert_ok(&out);
    (dir, meta)
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
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/gpu-training.yaml"));
    sc.create_all();
    let (dir, meta) = init_in_pod(&sc);
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

#[test]
fn consumed_capacity_written_through_the_status_subresource() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/shared-gpu.yaml"));
    sc.create_all();
    // The API server kept what the scheduler wrote (with DRAConsumableCapacity off it drops it).
    let net = sc.of_kind("ResourceClaim").into_iter().find(|c| c["metadata"]["name"] == "inference-0-net").unwrap();
    let stored = cp.get(&net).unwrap();
    let result = &stored["status"]["allocation"]["devices"]["results"][0];
    if controlplane::minor() < 36 {
        // Alpha and off before 1.36: dropped, so drafs has no share to serve, and says nothing wrong.
        assert!(result["consumedCapacity"].is_null() && result["shareID"].is_null(), "{stored}");
        let (dir, _) = init_in_pod(&sc);
        let tree = read_tree(&dir);
        assert!(tree.keys().all(|k| !k.contains("/.consumed/") && !k.ends_with("/.shareID")), "{tree:?}");
        assert_eq!(tree["gpu/gpu/0/.capacity/gpu.nvidia.com/memory"], "80Gi");
        return;
    }
    assert_eq!(result["consumedCapacity"], json!({"bandwidth": "25G", "queues": "4"}), "{stored}");
    let (dir, meta) = init_in_pod(&sc);
    let tree = read_tree(&dir);
    assert_eq!(tree["gpu/gpu/0/.consumed/gpu.nvidia.com/memory"], "20Gi", "{tree:?}");
    assert_eq!(tree["gpu/gpu/0/.capacity/gpu.nvidia.com/memory"], "80Gi");
    assert_eq!(tree["gpu/gpu/0/.shareID"], "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a");
    assert_eq!(tree["net/nic/0/.consumed/dra.net/queues"], "4");
    assert_eq!(tree["net/nic/0/.consumed/dra.net/bandwidth"], "25G");
    // The standard view has no field for it and stays as the upstream decoder expects.
    assert_upstream_decodes(cp, &meta, &dir.join(".json"));

    let out = run(sc.in_pod_command(&["get", "-o", "json"]));
    assert_ok(&out);
    let whole: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let gpu = &whole["claims"].as_array().unwrap().iter().find(|c| c["name"] == "gpu").unwrap()["devices"][0];
    assert_eq!(gpu["consumedCapacity"], json!({"gpu.nvidia.com/memory": "20Gi"}), "{whole}");
}

/// The kubelet's device health (KEP-4680, on by default since 1.36), written
/// through the pod's status subresource as the kubelet writes it: the real API
/// server validates and keeps it, `serve` (with the shipped RBAC, which lets it
/// watch its pod) follows it into `.health` live.
#[test]
fn device_health_written_through_the_pod_status_subresource_is_served_live() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/unhealthy-gpu.yaml"));
    sc.create_all();
    let pod = sc.pod();
    let mut statuses = pod["status"]["containerStatuses"].clone();
    cp.patch_status(&pod, &json!({"containerStatuses": statuses}));
    let stored = cp.get(&pod).unwrap();
    let kept = &stored["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][1];
    if controlplane::minor() < 36 {
        // ResourceHealthStatus is alpha and off before 1.36: dropped, no `.health`.
        assert!(stored["status"]["containerStatuses"][0]["allocatedResourcesStatus"].is_null(), "{stored}");
        let (dir, _) = init_in_pod(&sc);
        let tree = read_tree(&dir);
        assert!(tree.contains_key(".ready") && tree.keys().all(|k| !k.ends_with("/.health")), "{tree:?}");
        return;
    }
    assert_eq!(kept["health"], "Unhealthy", "the API server dropped the health (ResourceHealthStatus off?): {stored}");

    let dir = sc.path("dra");
    let log = sc.path("serve.log");
    let child = spawn_logged(sc.in_pod_command(&["serve", "--backend", "files", "--dir", dir.to_str().unwrap()]), &log);
    let mut serve = Serve::from_child(child, &dir);
    serve.wait_for(".ready", Some(""), LIMIT);
    assert_eq!(serve.read("gpus/gpu/0/.health").as_deref(), Some("Healthy"));
    assert_eq!(serve.read("gpus/gpu/1/.health").as_deref(), Some("Unhealthy"));
    assert_eq!(serve.read("gpus/gpu/1/.healthMessage").as_deref(), Some("XID 79: GPU has fallen off the bus"));
    // Healthy again, then gone from the report (the driver stopped reporting it).
    statuses[0]["allocatedResourcesStatus"][0]["resources"][1]["health"] = json!("Healthy");
    statuses[0]["allocatedResourcesStatus"][0]["resources"][1].as_object_mut().unwrap().remove("message");
    cp.patch_status(&pod, &json!({"containerStatuses": statuses}));
    serve.wait_for("gpus/gpu/1/.health", Some("Healthy"), LIMIT);
    assert_eq!(serve.read("gpus/gpu/1/.healthMessage"), None);
    statuses[0]["allocatedResourcesStatus"][0]["resources"].as_array_mut().unwrap().truncate(1);
    cp.patch_status(&pod, &json!({"containerStatuses": statuses}));
    serve.wait_for("gpus/gpu/1/.health", None, LIMIT);
    assert_eq!(serve.read("gpus/gpu/0/.health").as_deref(), Some("Healthy"));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("will not follow"), "the shipped RBAC lets serve watch its pod: {text}");
}

/// A driver writes what it learned at prepare time (a dynamic MIG device's
/// UUID) into the claim's `status.devices[].data` through the status
/// subresource: `init` serves its members, `serve` follows the driver
/// rewriting them, and the standard view (no field for it) still decodes upstream.
#[test]
fn driver_data_written_through_the_status_subresource() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/mig-dynamic.yaml"));
    sc.create_all();
    let claim = sc.of_kind("ResourceClaim").remove(0);
    let stored = cp.get(&claim).unwrap();
    let data = &stored["status"]["devices"][0]["data"];
    assert_eq!(data["uuid"], "MIG-5c8a2f1e-7b3d-5e9a-8c4f-1d2e3f4a5b6c", "{stored}");
    let (dir, meta) = init_in_pod(&sc);
    let tree = read_tree(&dir);
    let d = "mig/mig/0/.status/data.d";
    assert_eq!(tree[&format!("{d}/uuid")], "MIG-5c8a2f1e-7b3d-5e9a-8c4f-1d2e3f4a5b6c", "{tree:?}");
    assert_eq!(tree[&format!("{d}/gpu/uuid")], "GPU-2b1a0f9e-8d7c-4b6a-9f5e-4d3c2b1a0f9e");
    assert_eq!(tree[&format!("{d}/placement/start")], "3");
    let raw: Value = serde_json::from_str(&tree["mig/mig/0/.status/data"]).unwrap();
    assert_eq!(&raw, data, "the raw file is what the API server stored");
    assert_upstream_decodes(cp, &meta, &dir.join(".json"));

    // serve in the pod follows the driver rewriting its data.
    let live = sc.path("live");
    let child = sc
        .in_pod_command(&["serve", "--backend", "files", "--dir", live.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut serve = Serve::from_child(child, &live);
    serve.wait_for(&format!("{d}/uuid"), Some("MIG-5c8a2f1e-7b3d-5e9a-8c4f-1d2e3f4a5b6c"), LIMIT);
    let mut devices = stored["status"]["devices"].clone();
    devices[0]["data"] = json!({"uuid": "MIG-9d8c7b6a", "gpu": {"index": 0}, "vf": {"pciAddress": "0000:4e:00.4"}});
    cp.patch_status(&claim, &json!({"devices": devices}));
    serve.wait_for(&format!("{d}/uuid"), Some("MIG-9d8c7b6a"), LIMIT);
    assert_eq!(serve.read(&format!("{d}/vf/pciAddress")).as_deref(), Some("0000:4e:00.4"));
    assert_eq!(serve.read(&format!("{d}/profile")), None, "a member the driver dropped is gone");
    assert_eq!(serve.read(&format!("{d}/gpu/uuid")), None);
    assert_eq!(serve.read(".ready").as_deref(), Some(""));
}

/// Start `cmd` in the background with its stderr in `log` (so a test can wait on a line).
fn spawn_logged(mut cmd: std::process::Command, log: &std::path::Path) -> std::process::Child {
    let file = std::fs::File::create(log).unwrap();
    cmd.stdout(std::process::Stdio::piped()).stderr(file).spawn().unwrap()
}

fn wait_for_log(log: &std::path::Path, needle: &str) {
    wait_until(&format!("{needle:?} in {}", log.display()), LIMIT, || {
        std::fs::read_to_string(log).unwrap_or_default().contains(needle)
    });
}

fn finish_logged(child: std::process::Child, log: &std::path::Path) -> (Output, String) {
    let out = wait_output(child, LIMIT);
    (out, std::fs::read_to_string(log).unwrap_or_default())
}

#[test]
fn init_records_a_normal_event_the_api_server_accepts() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/vm-passthrough.yaml"));
    sc.create_all();
    let dir = sc.path("dra");
    let out = run(sc.kubeconfig_command(&["init", "--dir", dir.to_str().unwrap(), "--timeout", "60s", "--events=all"]));
    assert_ok(&out);
    let tree = read_tree(&dir);
    assert_eq!(tree["passthrough/pgpu/0/resource.kubernetes.io/pciBusID"], "0000:af:00.0", "{tree:?}");
    // The Event went through the real API server's validation and is stored on the pod.
    let events = cp.list(&format!("/api/v1/namespaces/{}/events", sc.namespace));
    let ours: Vec<&Value> = events.iter().filter(|e| e["reason"] == "DeviceAttributesReady").collect();
    assert_eq!(ours.len(), 1, "{events:?}\nstderr: {}", stderr(&out));
    assert_eq!(ours[0]["type"], "Normal");
    assert_eq!(ours[0]["involvedObject"]["uid"], json!(sc.pod_uid));
    assert_eq!(ours[0]["involvedObject"]["kind"], "Pod");
}

#[test]
fn init_waits_for_allocation_pod_status_and_slices_written_after_start() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/gpu-training.yaml"));
    sc.create_unallocated();
    let dir = sc.path("dra");
    let log = sc.path("init.log");
    let child =
        spawn_logged(sc.kubeconfig_command(&["init", "--dir", dir.to_str().unwrap(), "--timeout", "90s"]), &log);
    // Not scheduled yet as far as drafs can tell: the generated claim is not in the pod's status.
    wait_for_log(&log, "waiting for");
    // The scheduler allocates, the kubelet's claim status arrives; the driver has not published yet.
    sc.allocate();
    wait_until("drafs to see the allocation and wait for the slice", LIMIT, || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().filter(|l| l.contains("waiting for")).count() >= 2 || text.contains("not published")
    });
    assert!(!dir.join(".ready").exists());
    sc.publish_slices();
    let (out, text) = finish_logged(child, &log);
    assert!(out.status.success(), "exit {:?}\n{text}", out.status.code());
    let tree = read_tree(&dir);
    assert_eq!(tree["gpu/gpu/0/uuid"], "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b");
    assert_eq!(tree[".ready"], "");
}

/// A network-attached device (an `allNodes` slice), a prioritized-list
/// subrequest and list-typed attributes, built as the API server accepts them.
fn fabric_scenario(cp: &ControlPlane) -> Scenario<'_> {
    let namespace = support::cluster::unique("fabric");
    let node = support::cluster::unique("node");
    let pool = support::cluster::unique("fabric-pool");
    let docs = vec![
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "solver-0", "namespace": namespace},
            "spec": {"nodeName": node, "serviceAccountName": "drafs",
                "resourceClaims": [{"name": "accel", "resourceClaimName": "solver-accel"}],
                "containers": [{"name": "solver", "image": "registry.example/solver:1", "resources": {"claims": [{"name": "accel"}]}}]}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "solver-accel", "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "accel", "firstAvailable": [
                {"name": "large", "deviceClassName": "fabric.example.com", "count": 1},
                {"name": "small", "deviceClassName": "fabric.example.com", "count": 2}]}]}},
            "status": {
                "allocation": {"devices": {"results": [
                    {"request": "accel/large", "driver": "fabric.example.com", "pool": pool, "device": "fpga-7"}]}},
                "reservedFor": [{"resource": "pods", "name": "solver-0", "uid": "set-at-allocation"}]}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{pool}-a")},
            "spec": {"driver": "fabric.example.com", "allNodes": true,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "fpga-6", "attributes": {"model": {"string": "other"}}},
                    {"name": "fpga-7", "attributes": {
                        "model": {"string": "xcvu57p"},
                        "lanes": {"ints": [0, 1, 2, 3]},
                        "fabric.example.com/zones": {"strings": ["z1", "z2"]},
                        "healthy": {"bool": true}},
                     "capacity": {"memory": {"value": "16Gi"}}}]}}),
    ];
    Scenario::new(cp, namespace, "solver-0".into(), node, docs)
}

#[test]
fn network_attached_device_prioritized_list_and_list_attributes() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = fabric_scenario(cp);
    if controlplane::minor() < 36 {
        // No list-typed attributes before 1.36: the API server refuses such a slice.
        let slice = sc.of_kind("ResourceSlice").remove(0);
        let refused = cp.dry_run_create(&slice).unwrap_err();
        assert!(
            refused.contains("exactly one value must be specified") || refused.contains("unknown field"),
            "{refused}"
        );
        return;
    }
    sc.create_all();
    let (dir, meta) = init_in_pod(&sc);
    let tree = read_tree(&dir);
    assert_eq!(tree["accel/accel/0/.request"], "accel/large", "{tree:?}");
    assert_eq!(tree["accel/accel/0/.device"], "fpga-7");
    assert_eq!(tree["accel/accel/0/model"], "xcvu57p");
    assert_eq!(tree["accel/accel/0/lanes"], "0,1,2,3");
    assert_eq!(tree["accel/accel/0/zones"], "z1,z2");
    assert_eq!(tree["accel/accel/0/.capacity/fabric.example.com/memory"], "16Gi");
    assert_upstream_decodes(cp, &meta, &dir.join(".json"));
}

#[test]
fn list_typed_attributes_and_network_status_in_the_standard_view() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/rdma-network.yaml"));
    sc.create_all();
    let (dir, meta) = init_in_pod(&sc);
    let tree = read_tree(&dir);
    assert_eq!(tree["nics/rdma/0/resource.kubernetes.io/numaNode"], "1");
    assert_eq!(tree["nics/rdma/0/.status/interfaceName"], "net1");
    assert_eq!(tree["nics/rdma/1/.status/ips"], "10.20.2.17/24");
    assert_upstream_decodes(cp, &meta, &dir.join(".json"));
}

#[test]
fn a_missing_rbac_verb_fails_at_once_with_the_403_message() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/gpu-training.yaml"));
    // The shipped RBAC without `list` on ResourceSlices.
    // (A ClusterRole of its own: the shared one is the shipped one.)
    let own_role = format!("drafs-resourceslices-{}", sc.namespace);
    let mut docs = drafs::admission::manifests::rbac(&sc.namespace, "drafs", true);
    for doc in &mut docs {
        if doc["kind"] == "ClusterRole" {
            doc["metadata"]["name"] = json!(own_role);
            doc["rules"][0]["verbs"] = json!(["watch"]);
        }
        if doc["kind"] == "ClusterRoleBinding" {
            doc["roleRef"]["name"] = json!(own_role);
        }
    }
    sc.create_rbac(&drafs::admission::manifests::to_yaml(&docs).unwrap());
    sc.create_all_after_rbac();
    let dir = sc.path("dra");
    let started = std::time::Instant::now();
    let out = run(sc.kubeconfig_command(&["init", "--dir", dir.to_str().unwrap(), "--timeout", "90s"]));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(60), "a 403 must not wait for the deadline");
    let err = stderr(&out);
    assert!(err.contains("forbidden"), "{err}");
    assert!(err.contains("list resourceslices"), "{err}");
    assert!(err.contains(&format!("system:serviceaccount:{}:drafs", sc.namespace)), "the server's own message: {err}");
    assert!(sc.termination_log().contains("list resourceslices"), "{}", sc.termination_log());
    assert!(!dir.join(".ready").exists());
}

#[test]
fn get_from_a_kubeconfig_and_exec_against_the_api() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/rdma-network.yaml"));
    sc.create_all();
    let out = run(sc.kubeconfig_command(&["get", "-o", "json"]));
    assert_ok(&out);
    let got: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(got["ready"], true);
    assert_eq!(got["claims"][0]["devices"][0]["status"]["interfaceName"], "net1");
    assert_eq!(got["claims"][0]["devices"][1]["attributes"]["dra.net/ifName"]["string"], "ens1f0np0");

    let out = run(sc.kubeconfig_command(&[
        "exec",
        "--env",
        "IFACES=nics/rdma/.status/interfaceName",
        "--env",
        "MTU=nics/rdma/0/mtu",
        "--",
        "sh",
        "-c",
        "printf '%s|%s' \"$IFACES\" \"$MTU\"",
    ]));
    assert_ok(&out);
    assert_eq!(stdout(&out), "net1,net2|9000");
}

/// The rdma slice with one attribute of the first allocated NIC changed; `generation`
/// and `name` given for a pool generation bump.
fn rdma_slice(sc: &Scenario, name: Option<&str>, generation: Option<i64>, if_name: &str) -> Value {
    let mut slice = sc.of_kind("ResourceSlice").remove(0);
    for d in slice["spec"]["devices"].as_array_mut().unwrap() {
        if d["name"] == "pci-0000-c1-00-0" {
            d["attributes"]["dra.net/ifName"] = json!({"string": if_name});
        }
    }
    if let Some(name) = name {
        slice["metadata"]["name"] = json!(name);
    }
    if let Some(generation) = generation {
        slice["spec"]["pool"]["generation"] = json!(generation);
    }
    slice
}

/// What a driver and the cluster change while the app runs: an attribute, the
/// device's network status, and a new pool generation that replaces the old
/// slices; `serve` shows each.
fn serve_follows_live_changes(fuse: bool) {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/rdma-network.yaml"));
    sc.create_all();
    let dir = sc.path("dra");
    let dir_arg = dir.to_str().unwrap().to_string();
    let mut cmd = if fuse {
        // FUSE from a kubeconfig: the mount is in the test's own mount namespace.
        sc.kubeconfig_command(&["serve", "--backend", "fuse", "--dir", &dir_arg])
    } else {
        sc.in_pod_command(&["serve", "--backend", "files", "--dir", &dir_arg])
    };
    let child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let mut serve = Serve::from_child(child, &dir);
    serve.wait_for(".ready", Some(""), LIMIT);
    assert_eq!(serve.read("nics/rdma/0/ifName").as_deref(), Some("ens3f0np0"));

    // The driver updates an attribute in its slice.
    let old = sc.of_kind("ResourceSlice").remove(0);
    let changed = rdma_slice(&sc, None, None, "ens9");
    cp.merge_patch(&old, &json!({"spec": {"devices": changed["spec"]["devices"]}}));
    serve.wait_for("nics/rdma/0/ifName", Some("ens9"), LIMIT);

    // The driver writes new network data into the claim's status.
    let claim = sc.of_kind("ResourceClaim").remove(0);
    let mut devices = claim["status"]["devices"].clone();
    devices[0]["networkData"]["interfaceName"] = json!("net7");
    devices[0]["networkData"]["ips"] = json!(["10.20.7.17/24"]);
    cp.patch_status(&claim, &json!({"devices": devices}));
    serve.wait_for("nics/rdma/0/.status/interfaceName", Some("net7"), LIMIT);
    assert_eq!(serve.read("nics/rdma/0/.status/ips").as_deref(), Some("10.20.7.17/24"));

    // A new pool generation in a new slice; then the old slice goes.
    let old_name = old["metadata"]["name"].as_str().unwrap().to_string();
    let bumped = rdma_slice(&sc, Some(&format!("{old_name}-g4")), Some(4), "ens10");
    cp.create(&bumped);
    serve.wait_for("nics/rdma/0/ifName", Some("ens10"), LIMIT);
    cp.delete(&old);
    // A later change on the same watch proves drafs has seen the deletion.
    let later = rdma_slice(&sc, Some(&format!("{old_name}-g4")), Some(4), "ens11");
    cp.merge_patch(&bumped, &json!({"spec": {"devices": later["spec"]["devices"]}}));
    serve.wait_for("nics/rdma/0/ifName", Some("ens11"), LIMIT);
    // Still served and ready, from the new generation alone.
    assert_eq!(serve.read(".ready").as_deref(), Some(""));
    assert_eq!(serve.read("nics/rdma/1/ifName").as_deref(), Some("ens1f0np0"));
}

#[test]
fn serve_fuse_follows_attribute_status_and_pool_generation_changes() {
    if !require_fuse() {
        return;
    }
    serve_follows_live_changes(true);
}

#[test]
fn serve_files_in_pod_follows_attribute_status_and_pool_generation_changes() {
    serve_follows_live_changes(false);
}

#[test]
fn serve_recovers_when_the_api_server_restarts() {
    let Some(cp) = controlplane::private() else { return };
    let mut sc = Scenario::from_fixture(&cp, &read("examples/offline/rdma-network.yaml"));
    sc.create_all();
    let dir = sc.path("dra");
    let log = sc.path("serve.log");
    let child =
        spawn_logged(sc.kubeconfig_command(&["serve", "--backend", "files", "--dir", dir.to_str().unwrap()]), &log);
    let mut serve = Serve::from_child(child, &dir);
    serve.wait_for(".ready", Some(""), LIMIT);
    cp.restart_apiserver(|| {
        // While the API server is down, drafs notices and keeps the last tree.
        wait_for_log(&log, "retrying");
        assert_eq!(serve.read("nics/rdma/0/ifName").as_deref(), Some("ens3f0np0"));
        assert_eq!(serve.read(".ready").as_deref(), Some(""));
    });
    // Back up: a change made now arrives, so the watches were re-established.
    let old = sc.of_kind("ResourceSlice").remove(0);
    let changed = rdma_slice(&sc, None, None, "ens-after-restart");
    cp.merge_patch(&old, &json!({"spec": {"devices": changed["spec"]["devices"]}}));
    serve.wait_for("nics/rdma/0/ifName", Some("ens-after-restart"), LIMIT);
}

/// Every object in every example file, created as a dry run with strict field
/// validation: no shipped YAML has a field or value the real server rejects.
/// KubeVirt's VirtualMachineInstance kind, schema-less (KubeVirt itself is not
/// here): enough for kubectl to apply a VMI example with strict validation of
/// everything but the VMI's spec.
fn install_vmi_crd(cp: &ControlPlane) {
    cp.ensure(&json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "virtualmachineinstances.kubevirt.io"},
        "spec": {"group": "kubevirt.io", "scope": "Namespaced",
            "names": {"plural": "virtualmachineinstances", "singular": "virtualmachineinstance", "kind": "VirtualMachineInstance", "shortNames": ["vmi"]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }));
    let ready = wait_for(LIMIT, || cp.kubectl(&["get", "virtualmachineinstances", "-A"]).status.success());
    assert!(ready, "the VirtualMachineInstance CRD never became usable");
}

/// The offline inputs (dumps of what a cluster holds, server-set fields
/// aside) are objects the API server accepts.
#[test]
fn every_offline_example_is_accepted_by_the_api_server() {
    let Some(cp) = controlplane::shared() else { return };
    let mut failures = Vec::new();
    let mut checked = 0;
    let mut files: Vec<_> = std::fs::read_dir(repo_path("examples/offline"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    for path in files {
        let rel = path.strip_prefix(repo_path("")).unwrap().display().to_string();
        let docs = yaml_docs(&std::fs::read_to_string(&path).unwrap());
        // The namespaces and service accounts these objects live in.
        let namespaces = docs.iter().filter_map(|d| d["metadata"]["namespace"].as_str()).chain(["default"]);
        for ns in namespaces {
            cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
            for sa in ["default", "drafs"] {
                cp.ensure(
                    &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}}),
                );
            }
        }
        for doc in &docs {
            let mut object = doc.clone();
            if let Some(meta) = object["metadata"].as_object_mut() {
                for f in ["uid", "resourceVersion", "generation", "creationTimestamp"] {
                    meta.remove(f);
                }
            }
            if let Some(o) = object.as_object_mut() {
                o.remove("status");
            }
            checked += 1;
            // 409 AlreadyExists comes after validation and admission passed.
            let result =
                cp.dry_run_create(&object).or_else(|e| if e.starts_with("HTTP 409") { Ok(()) } else { Err(e) });
            // Before 1.36 a slice with list-typed attributes is refused (docs/compatibility.md).
            let lists = ["\"ints\"", "\"strings\"", "\"bools\"", "\"versions\""];
            let has_lists = doc["kind"] == "ResourceSlice" && lists.iter().any(|l| doc["spec"].to_string().contains(l));
            match (result, controlplane::minor() < 36 && has_lists) {
                (Ok(()), false) => {}
                (Err(e), true) if e.contains("unknown field") => {}
                (Ok(()), true) => failures.push(format!(
                    "{rel}: {} {}: accepted with list-typed attributes",
                    doc["kind"], doc["metadata"]["name"]
                )),
                (Err(e), _) => failures.push(format!("{rel}: {} {}: {e}", doc["kind"], doc["metadata"]["name"])),
            }
        }
    }
    assert!(checked >= 10, "only {checked} objects checked");
    assert!(failures.is_empty(), "the API server refuses:\n{}", failures.join("\n"));
}

/// Every example directory as the README applies it, `kubectl apply -f
/// examples/NAME/`, with kubectl built from the same module: its Namespace
/// and RBAC for real, then the whole directory as a server-side dry run with strict validation, and no
/// Pod Security warning in a namespace that enforces the restricted level.
#[test]
fn every_example_directory_is_accepted_by_kubectl_apply() {
    let Some(cp) = controlplane::shared() else { return };
    let mut dirs: Vec<_> = std::fs::read_dir(repo_path("examples"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir() && e.file_name() != "offline")
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let mut failures = Vec::new();
    for dir in &dirs {
        let rel = dir.strip_prefix(repo_path("")).unwrap().display().to_string();
        if std::fs::read_dir(dir).unwrap().flatten().any(|f| {
            read(&format!("{rel}/{}", f.file_name().to_string_lossy())).contains("kind: VirtualMachineInstance")
        }) {
            install_vmi_crd(cp);
        }
        // A dry run creates nothing, and a pod's service account must exist.
        for first in ["00-namespace.yaml", "10-rbac.yaml"].map(|f| dir.join(f)).iter().filter(|f| f.exists()) {
            let out = cp.kubectl(&["apply", "-f", first.to_str().unwrap()]);
            assert!(out.status.success(), "{rel}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let out = cp.kubectl(&["apply", "-f", &rel, "--dry-run=server", "--validate=strict"]);
        let err = String::from_utf8_lossy(&out.stderr);
        let applied = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || err.contains("PodSecurity") || !applied.contains(" created (server dry run)") {
            failures.push(format!("{rel}: {err}{applied}"));
        }
    }
    assert!(dirs.len() >= 5, "{dirs:?}");
    assert!(failures.is_empty(), "kubectl apply refuses:\n{}", failures.join("\n"));
}

#[test]
fn rbac_from_drafs_manifests_for_two_namespaces_works_in_both() {
    let Some(cp) = controlplane::shared() else { return };
    let mut scenarios = Vec::new();
    for _ in 0..2 {
        let mut sc = Scenario::from_fixture(cp, &read("examples/offline/gpu-training.yaml"));
        let out = std::process::Command::new(drafs_bin())
            .args(["manifests", "rbac", "--namespace", &sc.namespace, "--events"])
            .output()
            .unwrap();
        assert_ok(&out);
        // Applied as printed: every object but the shared ClusterRole is created new
        // (a name used by the other namespace's install would be refused with 409).
        cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": sc.namespace}}));
        cp.ensure(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": sc.namespace}}));
        for doc in yaml_docs(&stdout(&out)) {
            if doc["kind"] == "ClusterRole" {
                cp.ensure(&doc);
            } else {
                cp.create(&doc);
            }
        }
        sc.create_all_after_rbac();
        scenarios.push(sc);
    }
    for sc in &scenarios {
        let dir = sc.path("dra");
        let out = run(sc.kubeconfig_command(&["init", "--dir", dir.to_str().unwrap(), "--events=all"]));
        assert_ok(&out);
        assert!(!stderr(&out).contains("cannot create events"), "{}", stderr(&out));
        assert_eq!(read_tree(&dir)["gpu/gpu/0/uuid"], "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b");
        // Each namespace's binding is its own, untouched by the other's install.
        let binding = cp
            .get(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": format!("drafs-resourceslices-{}", sc.namespace)}}))
            .expect("the namespace's ClusterRoleBinding");
        assert_eq!(binding["subjects"][0]["namespace"], json!(sc.namespace));
    }
}

/// `kubectl` with the output of `drafs manifests rbac ARGS` on its stdin.
fn kubectl_rbac(cp: &ControlPlane, verb: &[&str], args: &[&str]) {
    let out = std::process::Command::new(drafs_bin()).args(["manifests", "rbac"]).args(args).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rbac.yaml");
    std::fs::write(&file, stdout(&out)).unwrap();
    let mut all = verb.to_vec();
    all.extend(["-f", file.to_str().unwrap()]);
    let done = cp.kubectl(&all);
    assert!(done.status.success(), "kubectl {verb:?}: {}", stderr(&done));
}

/// What `kubectl auth can-i VERB RESOURCE --as` the namespace's account says, for
/// each verb drafs needs.
fn can_drafs(cp: &ControlPlane, ns: &str, account: &str) -> Vec<bool> {
    [("get", "pods"), ("list", "resourceclaims.resource.k8s.io"), ("list", "resourceslices.resource.k8s.io")]
        .iter()
        .map(|(verb, resource)| {
            let out = cp.kubectl(&[
                "auth",
                "can-i",
                verb,
                resource,
                "-n",
                ns,
                "--as",
                &format!("system:serviceaccount:{ns}:{account}"),
            ]);
            stdout(&out).trim() == "yes"
        })
        .collect()
}

#[test]
fn rbac_for_two_accounts_composes_and_deleting_one_removes_exactly_its_grants() {
    let Some(cp) = controlplane::shared() else { return };
    let (ml, hpc) = (support::cluster::unique("rbac-ml"), support::cluster::unique("rbac-hpc"));
    for ns in [&ml, &hpc] {
        cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
        kubectl_rbac(cp, &["apply"], &["--namespace", ns, "--events"]);
    }
    cp.ensure(
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer-sa", "namespace": ml}}),
    );
    kubectl_rbac(cp, &["apply"], &["--namespace", &ml, "--service-account", "trainer-sa", "--events"]);
    let all = vec![true, true, true];
    assert_eq!(can_drafs(cp, &ml, "drafs"), all, "the first account lost its rights to the second");
    assert_eq!(can_drafs(cp, &ml, "trainer-sa"), all);

    // Removing one account's grants leaves the other account's and the other namespace's.
    kubectl_rbac(cp, &["delete"], &["--namespace", &ml, "--service-account", "trainer-sa", "--events"]);
    assert_eq!(can_drafs(cp, &ml, "trainer-sa"), vec![false, false, false]);
    assert_eq!(can_drafs(cp, &ml, "drafs"), all);
    assert_eq!(can_drafs(cp, &hpc, "drafs"), all);
    let account =
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer-sa", "namespace": ml}});
    assert!(cp.get(&account).is_some(), "the user's own account was deleted with drafs's grants");
    kubectl_rbac(cp, &["delete"], &["--namespace", &ml, "--events"]);
    assert_eq!(can_drafs(cp, &ml, "drafs"), vec![false, false, false]);
    assert_eq!(can_drafs(cp, &hpc, "drafs"), all, "another namespace lost its rights");
}

#[test]
fn an_injected_pod_gives_credentials_to_drafs_alone() {
    let Some(cp) = controlplane::shared() else { return };
    let ns = support::cluster::unique("inject");
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    let out = std::process::Command::new(drafs_bin()).args(["manifests", "rbac", "--namespace", &ns]).output().unwrap();
    for doc in yaml_docs(&stdout(&out)) {
        cp.ensure(&doc);
    }
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: trainer, namespace: {ns}}}\nspec:\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: single-gpu}}]\n  containers:\n  - name: app\n    image: registry.example/app:1\n    resources: {{claims: [{{name: gpu}}]}}\n"
    );
    let mut child = std::process::Command::new(drafs_bin())
        .args(["inject", "--mode", "sidecar-files", "--image", "registry.example/drafs:test"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), pod.as_bytes()).unwrap();
    let out = wait_output(child, LIMIT);
    assert_ok(&out);
    let injected = yaml_docs(&stdout(&out)).remove(0);
    // Created for real: the ServiceAccount admission plugin decides what each container gets.
    let stored = cp.create(&injected);
    let spec = &stored["spec"];
    assert_eq!(spec["serviceAccountName"], "drafs");
    let mounts = |c: &Value| -> Vec<String> {
        c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["mountPath"].as_str().unwrap().to_string())
            .collect()
    };
    let sa_path = "/var/run/secrets/kubernetes.io/serviceaccount";
    let drafs = spec["initContainers"].as_array().unwrap().iter().find(|c| c["name"] == "drafs").unwrap();
    assert!(mounts(drafs).contains(&sa_path.to_string()), "{drafs}");
    let app = spec["containers"].as_array().unwrap().iter().find(|c| c["name"] == "app").unwrap();
    assert!(!mounts(app).iter().any(|m| m.starts_with(sa_path)), "the app got credentials: {app}");
    let volumes = spec["volumes"].as_array().unwrap();
    assert!(!volumes.iter().any(|v| v["name"].as_str().unwrap().starts_with("kube-api-access")), "{volumes:?}");
}

/// `drafs inject --mode MODE` of `input`, with a fixed image.
fn inject_text(mode: &str, input: &str) -> String {
    let mut child = std::process::Command::new(drafs_bin())
        .args(["inject", "--mode", mode, "--image", "registry.example/drafs:test"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = wait_output(child, LIMIT);
    assert_ok(&out);
    stdout(&out)
}

/// The objects kubectl reads from a manifest file (YAML 1.1, go-yaml v2), as it prints them.
fn kubectl_reads(cp: &ControlPlane, file: &std::path::Path) -> Vec<Value> {
    let out = cp.kubectl(&["create", "--dry-run=client", "-o", "json", "-f", file.to_str().unwrap()]);
    assert_ok(&out);
    let mut objects = Vec::new();
    for v in serde_json::Deserializer::from_str(&stdout(&out)).into_iter::<Value>() {
        let v = v.unwrap();
        match v["kind"].as_str() {
            Some("List") => objects.extend(v["items"].as_array().unwrap().iter().cloned()),
            _ => objects.push(v),
        }
    }
    objects
}

/// What kubectl reads from `drafs inject`'s output is what it reads from the
/// input plus what drafs adds (injected into kubectl's own reading, as the
/// webhook does), for a corpus of scalars YAML 1.1 and 1.2 read differently;
/// and the API server takes the output (server-side dry run, strict).
#[test]
fn kubectl_reads_an_injected_manifest_as_the_input_plus_drafs() {
    let Some(cp) = controlplane::shared() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let input = repo_path("tests/inject/scalars.yaml");
    let before = kubectl_reads(cp, &input);
    assert_eq!(before.len(), 3, "{before:?}");
    // kubectl really reads YAML 1.1 here: the premise of the corpus.
    let spec = &before[0]["spec"]["template"]["spec"];
    assert_eq!(spec["volumes"][0]["configMap"]["defaultMode"], 420, "{spec}");
    assert_eq!(spec["containers"][0]["volumeMounts"][0]["readOnly"], true);
    assert_eq!(before[2]["data"]["true"], "a key that YAML 1.1 reads as true");
    for (mode, m) in [
        ("init", drafs::admission::inject::Mode::Init),
        ("sidecar-files", drafs::admission::inject::Mode::SidecarFiles),
        ("sidecar-fuse", drafs::admission::inject::Mode::SidecarFuse),
    ] {
        let output = scratch.path().join(format!("{mode}.yaml"));
        std::fs::write(&output, inject_text(mode, &read("tests/inject/scalars.yaml"))).unwrap();
        let after = kubectl_reads(cp, &output);
        let opts = drafs::admission::inject::Options::new(m, "registry.example/drafs:test");
        let mut expected = before.clone();
        for object in &mut expected {
            drafs::admission::inject::inject_value(object, &opts, &mut Vec::new()).unwrap();
        }
        assert_eq!(after.len(), expected.len());
        for (a, e) in after.iter().zip(&expected) {
            assert_eq!(a, e, "{mode}: kubectl reads {} differently after drafs inject", e["metadata"]["name"]);
        }
        let created = cp.kubectl(&["create", "--dry-run=server", "--validate=strict", "-f", output.to_str().unwrap()]);
        assert_ok(&created);
    }
}

/// The restricted Pod Security Standard, enforced by the real PodSecurity
/// admission: a pod it admits without drafs is admitted (and stored) after
/// `drafs inject --mode init` and `--mode sidecar-files`, whether the pod sets
/// its security context at pod level or per container; the FUSE sidecar is
/// denied with a message naming `privileged`, never a pod stuck in Init.
#[test]
fn a_restricted_namespace_admits_injected_pods_and_denies_fuse_naming_privileged() {
    let Some(cp) = controlplane::shared() else { return };
    let ns = support::cluster::unique("restricted");
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}}));
    // No controller manager here: the namespace's default account, made by hand.
    cp.ensure(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}}));
    let out = std::process::Command::new(drafs_bin()).args(["manifests", "rbac", "--namespace", &ns]).output().unwrap();
    for doc in yaml_docs(&stdout(&out)) {
        cp.ensure(&doc);
    }
    let restricted_app = "{allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}";
    let pods = [
        // The pod says runAsNonRoot and seccomp once for all its containers.
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: pod-level, namespace: {ns}}}\nspec:\n  securityContext: {{runAsNonRoot: true, runAsUser: 1000, seccompProfile: {{type: RuntimeDefault}}}}\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: single-gpu}}]\n  containers:\n  - name: app\n    image: registry.example/app:1\n    resources: {{claims: [{{name: gpu}}]}}\n    securityContext: {restricted_app}\n"
        ),
        // Each container says it for itself: so must drafs's.
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: per-container, namespace: {ns}}}\nspec:\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: single-gpu}}]\n  containers:\n  - name: app\n    image: registry.example/app:1\n    resources: {{claims: [{{name: gpu}}]}}\n    securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}, runAsNonRoot: true, runAsUser: 1000, seccompProfile: {{type: RuntimeDefault}}}}\n"
        ),
    ];
    for pod in &pods {
        let plain = yaml_docs(pod).remove(0);
        let name = plain["metadata"]["name"].as_str().unwrap().to_string();
        cp.dry_run_create(&plain).unwrap_or_else(|e| panic!("{name} without drafs is not restricted-compliant: {e}"));
        for mode in ["init", "sidecar-files"] {
            let mut injected = yaml_docs(&inject_text(mode, pod)).remove(0);
            injected["metadata"]["name"] = json!(format!("{name}-{mode}"));
            // Created for real, through PodSecurity admission.
            let stored =
                match cp.raw("POST", &format!("/api/v1/namespaces/{ns}/pods"), Some(&injected), "application/json") {
                    Ok((200, text)) => serde_json::from_str::<Value>(&text).unwrap(),
                    other => panic!("{name}, {mode}: the restricted namespace refused the injected pod: {other:?}"),
                };
            let drafs = &stored["spec"]["initContainers"][0];
            assert_eq!(drafs["name"], "drafs");
            assert_eq!(drafs["securityContext"]["runAsNonRoot"], true, "{drafs}");
            assert_eq!(drafs["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "{drafs}");
        }
        let mut fuse = yaml_docs(&inject_text("sidecar-fuse", pod)).remove(0);
        fuse["metadata"]["name"] = json!(format!("{name}-fuse"));
        match cp.raw("POST", &format!("/api/v1/namespaces/{ns}/pods"), Some(&fuse), "application/json") {
            Ok((403, message)) => {
                assert!(message.contains("PodSecurity") && message.contains("privileged"), "{name}: {message}")
            }
            other => panic!("{name}: a FUSE sidecar in a restricted namespace was not denied: {other:?}"),
        }
    }
}

/// The shipped webhook configuration, pointed at a local `drafs webhook` by URL
/// (the test cluster has no Service routing) with its test CA.
fn local_webhook_configuration(hook: &support::webhook::WebhookProcess) -> Value {
    support::webhook::configuration_by_url(&format!("https://{}/mutate", hook.addr), &hook.ca())
}

fn webhook_reviews(metrics_addr: &str) -> u64 {
    let (_, text) = http_get(metrics_addr, "/metrics").expect("webhook metrics");
    support::webhook::reviews_answered(&text)
}

#[test]
fn the_api_server_calls_the_webhook_and_stores_labelled_pods_with_drafs() {
    let Some(cp) = controlplane::shared() else { return };
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let hook = support::webhook::WebhookProcess::start(&["--metrics-addr", &metrics_addr]);
    let ns = support::cluster::unique("webhook");
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    let out = std::process::Command::new(drafs_bin()).args(["manifests", "rbac", "--namespace", &ns]).output().unwrap();
    for doc in yaml_docs(&stdout(&out)) {
        cp.ensure(&doc);
    }
    // What the controller manager makes in every namespace (none runs here):
    // the ServiceAccount admission plugin gives pods `default` before the webhook sees them.
    cp.ensure(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}}));
    cp.create(&local_webhook_configuration(&hook));
    let pod = |name: &str, mode: Option<&str>, annotations: Value| {
        let mut labels = json!({"app": "trainer"});
        if let Some(mode) = mode {
            labels["drafs.dev/inject"] = json!(mode);
        }
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
                "containers": [
                    {"name": "app", "image": "registry.example/app:1", "resources": {"claims": [{"name": "gpu"}]}},
                    {"name": "logger", "image": "registry.example/logger:1"},
                ]
            }
        })
    };
    // The API server picks up a new webhook configuration asynchronously: wait
    // until a dry run comes back with drafs in it.
    let probe = pod("probe", Some("init"), json!({}));
    let path = format!("/api/v1/namespaces/{ns}/pods?dryRun=All");
    let last = std::cell::RefCell::new(String::new());
    let called = wait_for(WEBHOOK_PICKUP, || match cp.raw("POST", &path, Some(&probe), "application/json") {
        Ok((200, text)) if text.contains("\"name\":\"drafs\"") => true,
        other => {
            *last.borrow_mut() = format!("{other:?}");
            false
        }
    });
    assert!(
        called,
        "the API server never called the webhook; last answer: {}\nwebhook log: {}\napiserver: {}",
        last.borrow(),
        hook.log_text(),
        cp.apiserver_log_tail()
    );

    let annotations = json!({
        "drafs.dev/metadata-dir": "/var/run/kubernetes.io/dra-device-attributes",
        "drafs.dev/require": "gpu/gpu/0/uuid",
        "drafs.dev/timeout": "2m",
    });
    let stored = cp.create(&pod("trainer", Some("sidecar-files"), annotations));
    let spec = &stored["spec"];
    let drafs = &spec["initContainers"][0];
    assert_eq!(drafs["name"], "drafs", "{stored:#}");
    assert_eq!(drafs["image"], "registry.example/drafs:test");
    assert_eq!(drafs["restartPolicy"], "Always");
    assert_eq!(
        drafs["args"],
        json!([
            "serve",
            "--backend=files",
            "--dir=/dra",
            "--metadata-dir=/var/run/kubernetes.io/dra-device-attributes",
            "--require=gpu/gpu/0/uuid",
            "--timeout=2m"
        ])
    );
    assert_eq!(spec["serviceAccountName"], "drafs");
    assert_eq!(spec["automountServiceAccountToken"], false);
    let mounts = |c: &Value| -> Vec<(String, bool)> {
        c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| (m["mountPath"].as_str().unwrap().to_string(), m["readOnly"] == true))
            .collect()
    };
    let sa_path = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert!(mounts(drafs).iter().any(|(p, _)| p == sa_path), "drafs has its token: {drafs}");
    let app = &spec["containers"][0];
    assert_eq!(
        mounts(app),
        vec![("/dra".to_string(), true), ("/var/run/kubernetes.io/dra-device-attributes".to_string(), true)],
        "the app gets the tree and the standard view read-only, and no credentials: {app}"
    );
    assert!(mounts(&spec["containers"][1]).is_empty(), "a container without claims gets nothing");
    let volumes = spec["volumes"].as_array().unwrap();
    assert!(!volumes.iter().any(|v| v["name"].as_str().unwrap().starts_with("kube-api-access")), "{volumes:?}");

    // A virt-launcher pod as KubeVirt renders it from examples/kubevirt-vmi:
    // the VMI's labels and annotations copied, no service account named,
    // automount off, the claims on the `compute` container.
    let vmi = yaml_docs(&read("examples/kubevirt-vmi/30-vmi.yaml")).remove(0);
    let mut labels = vmi["metadata"]["labels"].clone();
    labels["kubevirt.io"] = json!("virt-launcher");
    labels["vm.kubevirt.io/name"] = json!("win11");
    let mut annotations = vmi["metadata"]["annotations"].clone();
    annotations["kubevirt.io/domain"] = json!("win11");
    annotations["kubectl.kubernetes.io/default-container"] = json!("compute");
    let launcher = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "virt-launcher-win11-", "namespace": ns, "labels": labels, "annotations": annotations},
        "spec": {
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "resourceClaims": vmi["spec"]["resourceClaims"],
            "containers": [{"name": "compute", "image": "registry.example/virt-launcher:v1.9.0",
                            "command": ["/usr/bin/virt-launcher-monitor"],
                            "resources": {"claims": [{"name": "pgpu"}]}}]
        }
    });
    let stored = cp.create(&launcher);
    let spec = &stored["spec"];
    let drafs = &spec["initContainers"][0];
    assert_eq!(drafs["name"], "drafs", "{stored:#}");
    assert!(drafs.get("restartPolicy").is_none(), "init mode: drafs runs to completion before compute");
    assert!(
        drafs["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--metadata-dir=/var/run/kubernetes.io/dra-device-attributes")),
        "{drafs}"
    );
    assert!(
        mounts(&spec["containers"][0]).contains(&("/var/run/kubernetes.io/dra-device-attributes".to_string(), true)),
        "{stored:#}"
    );
    assert_eq!(spec["serviceAccountName"], "drafs");

    // A misspelt mode: refused, with the message from the webhook.
    let refused = cp.raw(
        "POST",
        &format!("/api/v1/namespaces/{ns}/pods"),
        Some(&pod("typo", Some("sidecar"), json!({}))),
        "application/json",
    );
    let Ok((code, message)) = refused else { panic!("{refused:?}") };
    assert_eq!(code, 400, "{message}");
    assert!(
        message.contains("admission webhook \"pods.drafs.dev\" denied the request")
            && message.contains("use init, sidecar-fuse, sidecar-files or csi"),
        "{message}"
    );

    // Pods without the label never reach the webhook (objectSelector).
    let before = webhook_reviews(&metrics_addr);
    let plain = cp.create(&pod("plain", None, json!({})));
    assert!(plain["spec"].get("initContainers").is_none(), "{plain:#}");
    assert_eq!(webhook_reviews(&metrics_addr), before, "the API server called the webhook for an unlabelled pod");
}

/// The deploy/webhook kustomizations as the README applies them, with kubectl
/// built from the same module: the manual route accepted by the real API
/// server (server-side dry run, strict validation, no Pod Security warning),
/// the cert-manager route rendered with the CA annotation and a certificate
/// for the Service's names, and one image setting for both containers.
#[test]
fn the_webhook_kustomizations_apply() {
    let Some(cp) = controlplane::shared() else { return };
    let copy = tempfile::tempdir().unwrap();
    let cp_r = std::process::Command::new("cp").arg("-r").arg(repo_path("deploy/webhook")).arg(copy.path()).status();
    assert!(cp_r.unwrap().success());
    let root = copy.path().join("webhook");
    let certs = std::process::Command::new(root.join("manual/certs.sh")).output().unwrap();
    assert!(certs.status.success(), "{}", String::from_utf8_lossy(&certs.stderr));
    let ns = cp.kubectl(&["apply", "-f", root.join("core/namespace.yaml").to_str().unwrap()]);
    assert!(ns.status.success(), "{}", String::from_utf8_lossy(&ns.stderr));
    let applied =
        cp.kubectl(&["apply", "-k", root.join("manual").to_str().unwrap(), "--dry-run=server", "--validate=strict"]);
    let err = String::from_utf8_lossy(&applied.stderr);
    assert!(applied.status.success(), "{err}");
    assert!(!err.contains("PodSecurity"), "the webhook's pods violate the restricted standard: {err}");
    let out = String::from_utf8_lossy(&applied.stdout);
    for object in [
        "deployment.apps/drafs-webhook",
        "service/drafs-webhook",
        "poddisruptionbudget.policy/drafs-webhook",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/drafs",
        "secret/drafs-webhook-tls",
    ] {
        assert!(out.contains(object), "{object} not applied: {out}");
    }

    // Every entry trusts the CA; a renewal keeps the CA (so caBundle) and reissues only the serving certificate.
    let manual = cp.kubectl(&["kustomize", root.join("manual").to_str().unwrap()]);
    let docs = yaml_docs(&String::from_utf8_lossy(&manual.stdout));
    let config = docs.iter().find(|d| d["kind"] == "MutatingWebhookConfiguration").unwrap();
    let bundles: Vec<&Value> =
        config["webhooks"].as_array().unwrap().iter().map(|w| &w["clientConfig"]["caBundle"]).collect();
    assert!(bundles.len() == 2 && bundles.iter().all(|b| b.is_string() && *b == bundles[0]), "{config}");
    let before = (
        std::fs::read(root.join("manual/cabundle.yaml")).unwrap(),
        std::fs::read(root.join("manual/tls.crt")).unwrap(),
    );
    let again = std::process::Command::new(root.join("manual/certs.sh")).output().unwrap();
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(std::fs::read(root.join("manual/cabundle.yaml")).unwrap(), before.0, "a renewal changed caBundle");
    assert_ne!(
        std::fs::read(root.join("manual/tls.crt")).unwrap(),
        before.1,
        "the serving certificate was not reissued"
    );
    let verify = std::process::Command::new("openssl")
        .args(["verify", "-verify_hostname", "drafs-webhook.drafs-system.svc", "-CAfile"])
        .arg(root.join("manual/ca.crt"))
        .arg(root.join("manual/tls.crt"))
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));

    // The cert-manager route (no cert-manager CRDs here: rendered, not applied).
    let built = cp.kubectl(&["kustomize", root.to_str().unwrap()]);
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let docs = yaml_docs(&String::from_utf8_lossy(&built.stdout));
    let find = |kind: &str| docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}")).clone();
    let config = find("MutatingWebhookConfiguration");
    assert_eq!(config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "drafs-system/drafs-webhook");
    let certificate = docs.iter().find(|d| d["kind"] == "Certificate").unwrap();
    let service = find("Service");
    let host = format!(
        "{}.{}.svc",
        service["metadata"]["name"].as_str().unwrap(),
        service["metadata"]["namespace"].as_str().unwrap()
    );
    assert!(certificate["spec"]["dnsNames"].as_array().unwrap().contains(&json!(host)), "{certificate}");
    assert_eq!(certificate["spec"]["secretName"], "drafs-webhook-tls");
    let webhook = &config["webhooks"][0];
    assert_eq!(webhook["clientConfig"]["service"]["name"], service["metadata"]["name"]);
    assert!(webhook["timeoutSeconds"].as_u64().unwrap() <= 10);

    // One image setting: the webhook's own container and the one it injects.
    let edit = std::fs::read_to_string(root.join("core/kustomization.yaml"))
        .unwrap()
        .replace("  newName: drafs\n", "  newName: registry.example/drafs\n");
    std::fs::write(root.join("core/kustomization.yaml"), edit).unwrap();
    let built = cp.kubectl(&["kustomize", root.to_str().unwrap()]);
    let docs = yaml_docs(&String::from_utf8_lossy(&built.stdout));
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example/drafs:0.1.0");
    let env = container["env"].as_array().unwrap();
    assert!(env.iter().any(|e| e["name"] == "DRAFS_IMAGE" && e["value"] == "registry.example/drafs:0.1.0"), "{env:?}");
}

/// Renewing the serving certificate from the same CA (what the chart's
/// `generate` source, cert-manager's CA issuer and `certs.sh` do) while the
/// real API server keeps sending reviews: not one pod is refused.
#[test]
fn a_serving_certificate_renewed_from_the_same_ca_refuses_no_pod() {
    let Some(cp) = controlplane::private() else { return };
    let hook = support::webhook::WebhookProcess::start(&[]);
    let ns = support::cluster::unique("renewal");
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    for account in ["default", "drafs"] {
        cp.ensure(
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": ns}}),
        );
    }
    cp.create(&local_webhook_configuration(&hook));
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "trainer-", "namespace": ns, "labels": {"drafs.dev/inject": "init"}},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
            "containers": [{"name": "app", "image": "registry.example/app:1", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    });
    let path = format!("/api/v1/namespaces/{ns}/pods?dryRun=All");
    let injected = |cp: &ControlPlane| match cp.raw("POST", &path, Some(&pod), "application/json") {
        Ok((200 | 201, text)) if text.contains("\"name\":\"drafs\"") => Ok(()),
        other => Err(format!("{other:?}")),
    };
    assert!(wait_for(WEBHOOK_PICKUP, || injected(&cp).is_ok()), "the API server never called the webhook");

    let stop = std::sync::atomic::AtomicBool::new(false);
    let (done, refused) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let (mut done, mut refused) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match injected(&cp) {
                    Ok(()) => done += 1,
                    Err(e) => refused.push(e),
                }
            }
            (done, refused)
        });
        for version in 2..=4u32 {
            let name = format!("tls{version}");
            support::tls::serving(hook.dir.path(), "ca", &name, "IP:127.0.0.1,DNS:localhost", version).unwrap();
            let (cert, key) =
                (hook.dir.path().join(format!("{name}.crt")), hook.dir.path().join(format!("{name}.key")));
            hook.rotate(&format!("..v{version}"), &cert, &key);
            let reloads = version as usize - 1;
            wait_until("the webhook to serve the renewed certificate", Duration::from_secs(30), || {
                hook.log_text().matches("certificate reloaded").count() >= reloads
            });
        }
        // Reviews on the last certificate too, over new connections and old.
        wait_until("reviews after the last renewal", Duration::from_secs(30), || injected(&cp).is_ok());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sender.join().unwrap()
    });
    assert!(
        refused.is_empty(),
        "{} of {} pods refused during renewals: {refused:?}",
        refused.len(),
        done as usize + refused.len()
    );
    assert!(done > 0, "no review was sent during the renewals");
}

/// Extended resources backed by DRA (KEP-5004, GA in 1.37): the pod names no
/// claim; the scheduler's claim and the pod's `extendedResourceClaimStatus`,
/// written through the status subresources, are kept by the real API server
/// and served at `<resource>/<container>/<index>/`, with the standard view
/// under `resourceclaims/` that the upstream decoder reads.
#[test]
fn extended_resource_claims_written_as_the_scheduler_writes_them() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/extended-gpu.yaml"));
    sc.create_all();
    let stored = cp.get(&sc.pod()).unwrap();
    if controlplane::minor() < 36 {
        // DRAExtendedResource is alpha and off before 1.36: the status is
        // dropped (the scheduler never writes it there), drafs says so.
        assert!(stored["status"]["extendedResourceClaimStatus"].is_null(), "{}", stored["status"]);
        let dir = sc.path("dra");
        let out = run(sc.in_pod_command(&["init", "--dir", dir.to_str().unwrap(), "--timeout", "60s"]));
        assert_ok(&out);
        assert!(
            stderr(&out).contains("none of its extended resources (nvidia.com/gpu) through DRA"),
            "{}",
            stderr(&out)
        );
        return;
    }
    assert_eq!(
        stored["status"]["extendedResourceClaimStatus"]["requestMappings"][1]["containerName"], "evaluator",
        "the API server kept the status: {}",
        stored["status"]
    );
    let (dir, meta) = init_in_pod(&sc);
    let tree = read_tree(&dir);
    assert_eq!(tree["nvidia.com/gpu/trainer/0/uuid"], "GPU-5c1f7e2a-3b4d-4e6f-8a9b-0c1d2e3f4a5b");
    assert_eq!(tree["nvidia.com/gpu/evaluator/0/uuid"], "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b");
    assert_upstream_decodes(cp, &meta, &dir.join(".json"));
}

/// The other shapes of 1.37, as the real API server keeps them: an
/// admin-access allocation (allowed only in a namespace labelled for it), a
/// device tainted in its slice (KEP-5055), and a claim reserved for a
/// PodGroup rather than the pod (KEP-5729; the pod's status still names the
/// claim, which is all drafs reads).
#[test]
fn admin_access_device_taints_and_a_claim_reserved_for_a_pod_group() {
    let Some(cp) = controlplane::shared() else { return };
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/gpu-training.yaml"));
    for doc in sc.docs.iter_mut() {
        match doc["kind"].as_str() {
            Some("ResourceClaim") => {
                doc["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = json!(true);
                doc["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = json!(true);
            }
            Some("ResourceSlice") if doc["spec"]["pool"]["generation"] == 2 => {
                doc["spec"]["devices"][1]["taints"] =
                    json!([{"key": "example.com/overheated", "value": "true", "effect": "NoSchedule"}]);
            }
            _ => {}
        }
    }
    // Admin access is allowed only in namespaces labelled for it.
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": sc.namespace,
        "labels": {"resource.kubernetes.io/admin-access": "true"}}}));
    sc.create_unallocated();
    let claim = sc.of_kind("ResourceClaim").remove(0);
    let mut status = claim["status"].clone();
    status["reservedFor"] = json!([{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "trainers",
        "uid": "4b3c2d1e-0f9a-4b8c-9d7e-6f5a4b3c2d1e"}]);
    cp.patch_status(&claim, &status);
    sc.write_pod_status();
    sc.publish_slices();
    let stored = cp.get(&claim).unwrap();
    assert_eq!(stored["status"]["reservedFor"][0]["resource"], "podgroups", "{}", stored["status"]);
    assert_eq!(stored["status"]["allocation"]["devices"]["results"][0]["adminAccess"], true, "{}", stored["status"]);

    let (dir, meta) = init_in_pod(&sc);
    let tree = read_tree(&dir);
    assert_eq!(tree["gpu/gpu/0/uuid"], "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b");
    assert_eq!(tree["gpu/gpu/0/.adminAccess"], "true");
    if controlplane::minor() < 36 {
        // DRADeviceTaints is alpha and off before 1.36: the API server dropped the taint.
        assert!(!tree.contains_key("gpu/gpu/0/.taints"), "{tree:?}");
    } else {
        assert_eq!(tree["gpu/gpu/0/.taints"], "example.com/overheated=true:NoSchedule");
    }
    assert_upstream_decodes(cp, &meta, &dir.join(".json"));
}

/// A user's overlay that sets the image with plain `images:` changes both the
/// webhook's container and the image it injects into pods (DRAFS_IMAGE):
/// before, the injected one stayed drafs:0.1.0 and every injected pod sat in
/// ImagePullBackOff. Built with the real kustomize (kubectl's).
#[test]
fn an_overlay_that_sets_the_image_sets_the_injected_image_too() {
    let Some(cp) = controlplane::shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cp_r = std::process::Command::new("cp").arg("-r").arg(repo_path("deploy/webhook")).arg(dir.path()).status();
    assert!(cp_r.unwrap().success());
    let overlay = dir.path().join("mine");
    std::fs::create_dir(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "resources:\n- ../webhook\nimages:\n- name: drafs\n  newName: registry.example/drafs\n  newTag: \"0.2.0\"\n",
    )
    .unwrap();
    let out = cp.kubectl(&["kustomize", overlay.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = yaml_docs(&stdout(&out));
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example/drafs:0.2.0");
    let env = container["env"].as_array().unwrap();
    let injected = env.iter().find(|e| e["name"] == "DRAFS_IMAGE").unwrap();
    assert_eq!(injected["value"], "registry.example/drafs:0.2.0", "the image injected into pods");
    // Nothing else in the Deployment's environment was taken for an image.
    let base = cp.kubectl(&["kustomize", dir.path().join("webhook").to_str().unwrap()]);
    let base_docs = yaml_docs(&stdout(&base));
    let base_env = base_docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"]["containers"][0]["env"].clone();
    for (ours, theirs) in env.iter().zip(base_env.as_array().unwrap()) {
        if ours["name"] != "DRAFS_IMAGE" {
            assert_eq!(ours, theirs);
        }
    }
}
