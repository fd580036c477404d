//! The kube tier, reading: the real `drafs` binary against the real control
//! plane (kube-apiserver and etcd built from their Go modules by
//! tests/go/build.sh), with the shipped RBAC applied for real, real bound
//! service-account tokens, TLS with a CA made at start, and objects written the
//! way the cluster writes them (status subresources, generated claims, taints).
//! Fails, not skips, when the control plane cannot be built or started;
//! outside CI, DRAFS_NO_KUBE_TESTS=1 skips it (loudly). The shipped manifests
//! are in kube_manifests.rs, the webhook in kube_webhook.rs.

use drafs_test_support as support;

use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};
use support::cluster::Scenario;
use support::controlplane::{self, ControlPlane};
use support::*;

const LIMIT: Duration = Duration::from_secs(120);

/// `drafs init` as a pod sees it, with the standard view; returns (tree dir, metadata dir).
fn init_in_pod(sc: &Scenario) -> (std::path::PathBuf, std::path::PathBuf) {
    let (dir, meta) = (sc.path("dra"), sc.path("meta"));
    let out = run_captured(
        sc.in_pod_command(&[
            "init",
            "--dir",
            dir.to_str().unwrap(),
            "--metadata-dir",
            meta.to_str().unwrap(),
            "--timeout",
            "60s",
        ]),
        LIMIT,
    );
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

    let out = run_captured(sc.in_pod_command(&["get", "-o", "json"]), LIMIT);
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
    let out = run_captured(
        sc.kubeconfig_command(&["init", "--dir", dir.to_str().unwrap(), "--timeout", "60s", "--events=all"]),
        LIMIT,
    );
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
        PodBuilder::new(&namespace, "solver-0")
            .node(&node)
            .service_account("drafs")
            .claim("accel", "solver-accel")
            .container("solver", "registry.example/solver:1")
            .uses("accel")
            .build(),
        ClaimBuilder::new(&namespace, "solver-accel")
            .requests(json!([{"name": "accel", "firstAvailable": [
                {"name": "large", "deviceClassName": "fabric.example.com", "count": 1},
                {"name": "small", "deviceClassName": "fabric.example.com", "count": 2}]}]))
            .result("accel/large", "fabric.example.com", &pool, "fpga-7")
            .reserved_for("solver-0", "set-at-allocation")
            .build(),
        SliceBuilder::new(&format!("{pool}-a"), "fabric.example.com", &pool)
            .all_nodes()
            .device("fpga-6", json!({"model": {"string": "other"}}))
            .device(
                "fpga-7",
                json!({
                    "model": {"string": "xcvu57p"},
                    "lanes": {"ints": [0, 1, 2, 3]},
                    "fabric.example.com/zones": {"strings": ["z1", "z2"]},
                    "healthy": {"bool": true}}),
            )
            .capacity(json!({"memory": {"value": "16Gi"}}))
            .build(),
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
    let out = run_captured(sc.kubeconfig_command(&["init", "--dir", dir.to_str().unwrap(), "--timeout", "90s"]), LIMIT);
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
    let out = run_captured(sc.kubeconfig_command(&["get", "-o", "json"]), LIMIT);
    assert_ok(&out);
    let got: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(got["ready"], true);
    assert_eq!(got["claims"][0]["devices"][0]["status"]["interfaceName"], "net1");
    assert_eq!(got["claims"][0]["devices"][1]["attributes"]["dra.net/ifName"]["string"], "ens1f0np0");

    let out = run_captured(
        sc.kubeconfig_command(&[
            "exec",
            "--env",
            "IFACES=nics/rdma/.status/interfaceName",
            "--env",
            "MTU=nics/rdma/0/mtu",
            "--",
            "sh",
            "-c",
            "printf '%s|%s' \"$IFACES\" \"$MTU\"",
        ]),
        LIMIT,
    );
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
        let out = run_captured(sc.in_pod_command(&["init", "--dir", dir.to_str().unwrap(), "--timeout", "60s"]), LIMIT);
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
