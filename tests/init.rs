//! `drafs init` against the test API server, run as the real binary: the tree
//! and standard view it writes, what it waits for and for how long, what it
//! reads, its Events and logs, and what it never touches. How it fails is in
//! failures.rs, `drafs get` in get.rs, drivers' data in driver_data.rs.

use drafs_test_support as support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// A safety net only: every run normally ends by itself long before.
const LIMIT: Duration = Duration::from_secs(90);

/// GETs and LISTs, as sorted (verb resource, field selector) pairs.
fn reads(api: &TestApi) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = api
        .requests()
        .iter()
        .filter(|r| r.verb == "get" || r.verb == "list")
        .map(|r| (format!("{} {}", r.verb, r.resource), r.field_selector.clone()))
        .collect();
    v.sort();
    v
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

#[test]
fn template_claim_with_stale_pool_generation() {
    let (api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    assert_ok(&env.init(&["--timeout", "30s", "--events=all"]));
    let tree = read_tree(&env.path("dra"));
    assert_eq!(tree["gpu/gpu/0/uuid"], "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b");
    assert_eq!(tree["gpu/gpu/0/gpu.nvidia.com/uuid"], "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b");
    assert_eq!(tree["gpu/gpu/0/productName"], "NVIDIA H200", "the stale generation must not win");
    assert_eq!(tree["gpu/gpu/0/resource.kubernetes.io/pciBusID"], "0000:5e:00.0");
    assert_eq!(tree["gpu/gpu/0/cudaComputeCapability"], "9.0.0");
    assert_eq!(tree["gpu/gpu/0/.capacity/gpu.nvidia.com/memory"], "141Gi");
    assert_eq!(tree["gpu/gpu/0/.driver"], "gpu.nvidia.com");
    assert_eq!(tree["gpu/gpu/0/.pool"], "gpu-node-7");
    assert_eq!(tree["gpu/gpu/0/.device"], "gpu-3");
    assert_eq!(tree["gpu/gpu/0/.request"], "gpu");
    assert_eq!(tree[".ready"], "");
    assert!(!tree.contains_key("gpu/gpu/1/uuid"));
    let whole: Value = serde_json::from_str(&tree[".json"]).unwrap();
    assert_eq!(whole["claims"][0]["resourceClaimName"], "trainer-0-gpu-x7k2p");
    assert_eq!(whole["pod"]["nodeName"], "gpu-node-7");

    // With --events=all, a Normal event on the pod says so.
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "Normal");
    assert_eq!(events[0]["reason"], "DeviceAttributesReady");
    assert_eq!(events[0]["involvedObject"]["name"], "trainer-0");
    assert_eq!(events[0]["involvedObject"]["uid"], "6f1d2c3a-9b8e-4d7f-a1b2-c3d4e5f60718");
    assert!(
        events[0]["message"].as_str().unwrap().starts_with("1 device of 1 claim ready after"),
        "{}",
        events[0]["message"]
    );

    // Node-local devices: one pod GET, one claim list, one node slice list, nothing else.
    assert_eq!(
        reads(&api),
        vec![
            pair("get pods", ""),
            pair("list resourceclaims", "metadata.name=trainer-0-gpu-x7k2p"),
            pair("list resourceslices", "spec.nodeName=gpu-node-7"),
        ]
    );
}

#[test]
fn two_nics_with_list_attributes_and_network_status() {
    let (_api, env) = example("hpc", "allreduce-worker-3", "examples/offline/rdma-network.yaml");
    assert_ok(&env.init(&["--require", "nics/rdma/1/.status/interfaceName"]));
    let tree = read_tree(&env.path("dra"));
    // Allocation order decides the index, not the slice order.
    assert_eq!(tree["nics/rdma/0/.device"], "pci-0000-c1-00-0");
    assert_eq!(tree["nics/rdma/0/ifName"], "ens3f0np0");
    assert_eq!(tree["nics/rdma/1/dra.net/ifName"], "ens1f0np0");
    assert_eq!(tree["nics/rdma/0/mtu"], "9000");
    assert_eq!(tree["nics/rdma/0/rdma"], "true");
    assert_eq!(tree["nics/rdma/0/resource.kubernetes.io/numaNode"], "1");
    assert_eq!(tree["nics/rdma/0/.status/interfaceName"], "net1");
    assert_eq!(tree["nics/rdma/0/.status/ips"], "10.20.1.17/24,fd00:20:1::17/64");
    assert_eq!(tree["nics/rdma/0/.status/hardwareAddress"], "b8:3f:d2:11:22:33");
    assert_eq!(tree["nics/rdma/1/.status/interfaceName"], "net2");
    let record: Value = serde_json::from_str(&tree["nics/rdma/0/.json"]).unwrap();
    assert_eq!(record["attributes"]["resource.kubernetes.io/numaNode"], json!({"ints": [1]}));
    assert_eq!(record["status"]["ips"], json!(["10.20.1.17/24", "fd00:20:1::17/64"]));
}

#[test]
fn direct_claim_prioritized_subrequest_and_network_attached_device() {
    let api = api_for("ns1");
    api.apply(pod("ns1", "p", "node-a", &[("vm", Ok("shared")), ("acc", Err("tmpl"))], &[("acc", "p-acc-1")]));
    api.apply(claim("ns1", "shared", Some(&[("fabric", "net.example.com", "fabric-pool", "nic-7")])));
    api.apply(claim(
        "ns1",
        "p-acc-1",
        Some(&[
            ("gpu/large", "gpu.example.com", "node-a", "g1"),
            ("gpu/large", "gpu.example.com", "node-a", "g0"),
            ("mem", "gpu.example.com", "node-a", "m0"),
        ]),
    ));
    api.apply(slice(
        "node-a-gpus",
        "gpu.example.com",
        "node-a",
        1,
        Some("node-a"),
        &[
            ("g0", json!({"uuid": {"string": "G0"}})),
            ("g1", json!({"uuid": {"string": "G1"}, "sizes": {"strings": ["a", "b"]}})),
            ("m0", json!({"gb": {"int": 64}})),
        ],
    ));
    api.apply(slice("other-node", "gpu.example.com", "node-b", 1, Some("node-b"), &[("g9", json!({}))]));
    api.apply(slice(
        "fabric",
        "net.example.com",
        "fabric-pool",
        2,
        None,
        &[("nic-7", json!({"ifName": {"string": "ib0"}}))],
    ));
    let env = Env::new(&api, "ns1", "p", TOKEN);
    assert_ok(&env.init(&[]));
    let tree = read_tree(&env.path("dra"));
    assert_eq!(tree["acc/gpu/0/uuid"], "G1");
    assert_eq!(tree["acc/gpu/0/.request"], "gpu/large");
    assert_eq!(tree["acc/gpu/1/uuid"], "G0");
    assert_eq!(tree["acc/gpu/0/sizes"], "a,b");
    assert_eq!(tree["acc/mem/0/gb"], "64");
    assert_eq!(tree["vm/fabric/0/ifName"], "ib0");
    assert_eq!(tree["vm/fabric/0/.pool"], "fabric-pool");

    // The network-attached device costs one more list, scoped to its driver and to
    // slices bound to no node; another node's slices are never fetched.
    assert_eq!(
        reads(&api),
        vec![
            pair("get pods", ""),
            pair("list resourceclaims", "metadata.name=p-acc-1"),
            pair("list resourceclaims", "metadata.name=shared"),
            pair("list resourceslices", "spec.driver=net.example.com,spec.nodeName="),
            pair("list resourceslices", "spec.nodeName=node-a"),
        ]
    );
    assert!(api.requests().iter().all(|r| r.resource != "resourceslices" || !r.field_selector.is_empty()));
}

#[test]
fn metadata_view_matches_the_standard_layout() {
    // Template claim (rdma) and direct claim (vm passthrough), decoded back.
    let (_api, env) = example("hpc", "allreduce-worker-3", "examples/offline/rdma-network.yaml");
    let meta = env.path("meta");
    assert_ok(&env.init(&["--metadata-dir", meta.to_str().unwrap()]));
    let files = read_tree(&meta);
    assert_eq!(files.keys().collect::<Vec<_>>(), vec!["resourceclaimtemplates/nics/rdma/dra.net-metadata.json"]);
    // No symlink on the way: a container runtime resolves a driver's bind
    // mount of the same path through it, into a directory drafs later swaps.
    let mut path = meta.clone();
    for part in ["resourceclaimtemplates", "nics", "rdma", "dra.net-metadata.json"] {
        path.push(part);
        assert!(!std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink(), "{} is a symlink", path.display());
    }
    assert_eq!(std::fs::read_dir(&meta).unwrap().count(), 1, "nothing but the standard layout");
    let text = &files["resourceclaimtemplates/nics/rdma/dra.net-metadata.json"];
    let docs: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(text.ends_with('\n'));
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0]["apiVersion"], "metadata.resource.k8s.io/v1beta1");
    assert_eq!(docs[1]["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
    let mut second = docs[1].clone();
    second["apiVersion"] = docs[0]["apiVersion"].clone();
    assert_eq!(second, docs[0], "both versions carry the same content");
    let doc = &docs[0];
    assert_eq!(doc["kind"], "DeviceMetadata");
    assert_eq!(
        doc["metadata"],
        json!({"name": "allreduce-worker-3-nics-q8w4t", "namespace": "hpc", "uid": "3e2d1c0b-9a8f-4e7d-6c5b-4a3f2e1d0c9b", "generation": 1})
    );
    assert_eq!(doc["podClaimName"], "nics");
    let request = &doc["requests"][0];
    assert_eq!(request["name"], "rdma");
    let devices = request["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0]["name"], "pci-0000-c1-00-0");
    assert_eq!(devices[0]["driver"], "dra.net");
    assert_eq!(devices[0]["pool"], "node-rdma-02");
    assert_eq!(devices[0]["attributes"]["ifName"], json!({"string": "ens3f0np0"}), "the driver's domain unqualified");
    assert_eq!(devices[0]["attributes"]["resource.kubernetes.io/numaNode"], json!({"ints": [1]}));
    assert_eq!(
        devices[1]["networkData"],
        json!({"interfaceName": "net2", "ips": ["10.20.2.17/24"], "hardwareAddress": "b8:3f:d2:44:55:66"})
    );

    let (_api, env) = example("vms", "virt-launcher-win11-abcde", "examples/offline/vm-passthrough.yaml");
    let meta = env.path("meta");
    assert_ok(&env.init(&["--metadata-dir", meta.to_str().unwrap()]));
    let files = read_tree(&meta);
    let text = &files["resourceclaims/win11-vgpu/pgpu/gpu.nvidia.com-metadata.json"];
    let doc: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert!(doc.get("podClaimName").is_none(), "direct claims have no podClaimName");
    let device = &doc["requests"][0]["devices"][0];
    assert_eq!(device["name"], "gpu-vfio-1");
    assert_eq!(device["attributes"]["resource.kubernetes.io/pciBusID"], json!({"string": "0000:af:00.0"}));
    assert_eq!(device["attributes"]["iommuFDEnabled"], json!({"bool": true}), "keys as the slice wrote them");
}

#[test]
fn waits_for_allocation_and_slices_published_after_start() {
    let api = api_for("ml");
    api.apply(pod("ml", "late", "n1", &[("gpu", Ok("late-claim"))], &[]));
    api.apply(claim("ml", "late-claim", None));
    let env = Env::new(&api, "ml", "late", TOKEN);
    let dir = env.path("dra");
    let child = env.spawn(&["init", "--dir", dir.to_str().unwrap()]);
    let watching = |resource: &str| api.requests().iter().any(|r| r.verb == "watch" && r.resource == resource);
    wait_until("a watch on the claim", LIMIT, || watching("resourceclaims"));
    api.apply(claim("ml", "late-claim", Some(&[("gpu", "gpu.example.com", "n1", "g0")])));
    wait_until("a watch on the node's slices", LIMIT, || watching("resourceslices"));
    assert!(!dir.join(".ready").exists(), "not ready before the slice exists");
    api.apply(slice("s", "gpu.example.com", "n1", 1, Some("n1"), &[("g0", json!({"uuid": {"string": "LATE"}}))]));
    let out = wait_output(child, LIMIT);
    assert_ok(&out);
    assert_eq!(read_tree(&dir)["gpu/gpu/0/uuid"], "LATE");
    // Waiting was done by watching: the claim was listed once and then watched.
    // The node's slices are listed again once the allocation names the devices
    // to keep (drafs keeps of slices only the pod's devices).
    let lists =
        |selector: &str| api.requests().iter().filter(|r| r.verb == "list" && r.field_selector == selector).count();
    assert_eq!(lists("metadata.name=late-claim"), 1, "{:?}", reads(&api));
    assert!((1..=2).contains(&lists("spec.nodeName=n1")), "{:?}", reads(&api));
}

#[test]
fn waits_for_a_generated_claim_to_appear_in_pod_status() {
    let api = api_for("ml");
    api.apply(pod("ml", "gen", "n1", &[("gpu", Err("t"))], &[]));
    let env = Env::new(&api, "ml", "gen", TOKEN);
    let dir = env.path("dra");
    let child = env.spawn(&["init", "--dir", dir.to_str().unwrap()]);
    wait_until("the pod to be fetched", LIMIT, || api.requests().iter().any(|r| r.resource == "pods"));
    api.apply(claim("ml", "gen-gpu-1", Some(&[("gpu", "gpu.example.com", "n1", "g0")])));
    api.apply(slice("s", "gpu.example.com", "n1", 1, Some("n1"), &[("g0", json!({"uuid": {"string": "GEN"}}))]));
    api.apply(pod("ml", "gen", "n1", &[("gpu", Err("t"))], &[("gpu", "gen-gpu-1")]));
    let out = wait_output(child, LIMIT);
    assert_ok(&out);
    assert_eq!(read_tree(&dir)["gpu/gpu/0/uuid"], "GEN");
}

#[test]
fn claim_that_needs_no_resource_is_absent_not_an_error() {
    let api = api_for("ml");
    api.load_yaml(&read("examples/offline/gpu-training.yaml"));
    let mut p = api.get("Pod", "ml", "trainer-0").unwrap();
    p["spec"]["resourceClaims"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "optional", "resourceClaimTemplateName": "x"}));
    p["status"]["resourceClaimStatuses"].as_array_mut().unwrap().push(json!({"name": "optional"}));
    api.apply(p);
    let env = Env::new(&api, "ml", "trainer-0", TOKEN);
    assert_ok(&env.init(&[]));
    let tree = read_tree(&env.path("dra"));
    assert!(tree.contains_key("gpu/gpu/0/uuid"));
    assert!(!tree.keys().any(|k| k.starts_with("optional")));
}

#[test]
fn timeout_names_what_is_missing_and_writes_the_termination_log() {
    let api = api_for("ml");
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", Some(&[("gpu", "gpu.example.com", "n1", "g7")])));
    api.apply(slice("s", "gpu.example.com", "n1", 3, Some("n1"), &[("g0", json!({}))]));
    let env = Env::new(&api, "ml", "p", TOKEN);
    let out = env.init(&["--timeout", "2s", "--require", "gpu/gpu/0/uuid"]);
    let err = assert_failed(&out);
    for needle in
        ["not ready after 2s", "claim gpu", "request gpu", "gpu.example.com/n1/g7", "generation 3", "gpu/gpu/0/uuid"]
    {
        assert!(err.contains(needle), "{needle:?} missing from: {err}");
    }
    let log = env.termination_log();
    assert!(log.contains("gpu.example.com/n1/g7"), "termination log: {log:?}");
    let events = api.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(events[0]["reason"], "DeviceAttributesNotReady");
    assert_eq!(events[0]["message"], log.as_str(), "the event says what the termination log says");
    assert!(!env.path("dra").join("..data").exists(), "nothing written when not ready");
}

/// The kubelet stops an init container that is still waiting (the pod was
/// deleted, its deadline passed): `kubectl describe pod` then shows that it
/// was stopped, not an empty message.
#[test]
fn init_stopped_while_waiting_writes_the_termination_log() {
    let api = api_for("ml");
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", Some(&[("gpu", "gpu.example.com", "n1", "g7")])));
    let env = Env::new(&api, "ml", "p", TOKEN);
    let dir = env.path("dra");
    let child = env.spawn(&["init", "--dir", dir.to_str().unwrap(), "--timeout", "0"]);
    wait_until("init waiting on a watch", LIMIT, || api.requests().iter().any(|r| r.verb == "watch"));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = wait_output(child, LIMIT);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let log = env.termination_log();
    assert!(log.contains("stopped by SIGTERM"), "termination log: {log:?}");
    assert!(!dir.join("..data").exists(), "nothing written when not ready");
}

#[test]
fn require_waits_for_device_status() {
    let (api, env, allocated) = nic_without_status();
    let dir = env.path("dra");
    let child = env.spawn(&["init", "--dir", dir.to_str().unwrap(), "--require", "net/eth/0/.status/interfaceName"]);
    wait_until("a watch on the claim", LIMIT, || {
        api.requests().iter().any(|r| r.verb == "watch" && r.resource == "resourceclaims")
    });
    assert!(!dir.join(".ready").exists());
    api.apply(with_interface(allocated, "eth1"));
    let out = wait_output(child, LIMIT);
    assert_ok(&out);
    let tree = read_tree(&dir);
    assert_eq!(tree["net/eth/0/.status/interfaceName"], "eth1");
    assert_eq!(tree["net/eth/0/.status/data"], r#"{"vlan":7}"#);
}

#[test]
fn rerun_replaces_the_tree_atomically() {
    let (api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    assert_ok(&env.init(&[]));
    let mut s = api.get("ResourceSlice", "", "gpu-node-7-gpu.nvidia.com-k2m9x").unwrap();
    s["spec"]["devices"][1]["attributes"]["uuid"] = json!({"string": "GPU-NEW"});
    api.apply(s);
    assert_ok(&env.init(&[]));
    let dir = env.path("dra");
    assert_eq!(read_tree(&dir)["gpu/gpu/0/uuid"], "GPU-NEW");
    let payloads = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("..") && e.file_name() != "..data")
        .count();
    assert_eq!(payloads, 1, "the old payload is removed");
    assert!(std::fs::symlink_metadata(dir.join("gpu")).unwrap().file_type().is_symlink());
}

#[test]
fn events_are_optional() {
    // RBAC without the optional events Role: a single warning, and ready all the same.
    let rbac: String = rbac_yaml("ml");
    let without: Vec<&str> = rbac.split("\n---\n").filter(|d| !d.contains("drafs-events")).collect();
    let api = TestApi::start(&without.join("\n---\n"), "ml");
    api.add_token(TOKEN, "system:serviceaccount:ml:drafs");
    api.load_yaml(&read("examples/offline/gpu-training.yaml"));
    let env = Env::new(&api, "ml", "trainer-0", TOKEN);
    // By default only warnings are recorded: a successful start sends none.
    assert_ok(&env.init(&[]));
    assert!(api.requests().iter().all(|r| r.verb != "create"));
    let out = env.init(&["--events=all"]);
    assert_ok(&out);
    assert!(stderr(&out).contains("cannot create events"), "{}", stderr(&out));
    assert!(api.events().is_empty());
    assert!(api.requests().iter().any(|r| r.verb == "create" && r.status == 403));

    // --events=false: not even tried.
    api.clear_requests();
    assert_ok(&env.init(&["--events=false"]));
    assert!(api.requests().iter().all(|r| r.verb != "create"));
}

#[test]
fn json_logs_are_one_object_per_line() {
    let (_api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    let out = env.init(&["--log-format", "json"]);
    assert_ok(&out);
    let lines: Vec<Value> =
        stderr(&out).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert!(lines.iter().any(|l| l["message"] == "ready" && l["files"].as_u64().is_some()), "{lines:?}");
    assert!(lines.iter().all(|l| l["level"].is_string() && l["timestamp"].is_string()));

    // A failure is a JSON error line too.
    let env = Env::new(&_api, "ml", "ghost", TOKEN);
    let out = env.init(&["--log-format", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let last: Value = serde_json::from_str(stderr(&out).lines().last().unwrap()).unwrap();
    assert_eq!(last["level"], "ERROR");
    assert!(last["message"].as_str().unwrap().contains("pod ml/ghost not found"));
}

#[test]
fn init_never_deletes_what_it_did_not_write() {
    let (_api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    let dir = env.path("dra");
    std::fs::create_dir_all(dir.join("..backup/inner")).unwrap();
    std::fs::write(dir.join("..backup/inner/keep.txt"), "backup").unwrap();
    std::fs::create_dir(dir.join("..2024_config")).unwrap();
    std::fs::write(dir.join("..2024_config/a"), "a").unwrap();
    // Names drafs itself could use, taken by something else.
    std::fs::write(dir.join("..data_tmp"), "foreign").unwrap();
    std::fs::create_dir(dir.join("..123.456.0")).unwrap();
    std::fs::write(dir.join("..123.456.0/x"), "not a drafs payload").unwrap();
    for _ in 0..2 {
        assert_ok(&env.init(&[]));
        assert_eq!(read_tree(&dir)["gpu/gpu/0/productName"], "NVIDIA H200");
    }
    assert_eq!(std::fs::read_to_string(dir.join("..backup/inner/keep.txt")).unwrap(), "backup");
    assert_eq!(std::fs::read_to_string(dir.join("..2024_config/a")).unwrap(), "a");
    assert_eq!(std::fs::read_to_string(dir.join("..data_tmp")).unwrap(), "foreign");
    assert_eq!(std::fs::read_to_string(dir.join("..123.456.0/x")).unwrap(), "not a drafs payload");
    // Exactly one payload of drafs's own is left, the one ..data points at.
    let hidden: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".."))
        .collect();
    let data = std::fs::read_link(dir.join("..data")).unwrap().to_string_lossy().into_owned();
    let ours: Vec<&String> = hidden
        .iter()
        .filter(|n| !["..backup", "..2024_config", "..data_tmp", "..123.456.0", "..data"].contains(&n.as_str()))
        .collect();
    assert_eq!(ours, vec![&data], "{hidden:?}");
}

/// A newcomer's first hour: a pod that uses no claims, and a Deployment given
/// where a pod is read, are each explained (not an empty table in silence).
#[test]
fn a_pod_without_claims_and_a_workload_file_are_explained() {
    let scratch = tempfile::tempdir().unwrap();
    let plain = scratch.path().join("web.yaml");
    std::fs::write(
        &plain,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: ml, uid: u1}\nspec:\n  nodeName: n1\n  containers: [{name: app, image: nginx}]\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let child = std::process::Command::new(drafs_bin())
            .args(args)
            .env_clear()
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_output(child, LIMIT)
    };
    let out = run(&["get", "--from-file", plain.to_str().unwrap()]);
    assert_ok(&out);
    assert!(stderr(&out).contains("pod ml/web uses no resource claims"), "{}", stderr(&out));
    let dir = scratch.path().join("dra");
    let out = run(&["init", "--from-file", plain.to_str().unwrap(), "--dir", dir.to_str().unwrap()]);
    assert_ok(&out);
    assert!(stderr(&out).contains("uses no resource claims"), "{}", stderr(&out));
    // With a required path, init still fails as before.
    let out = run(&[
        "init",
        "--from-file",
        plain.to_str().unwrap(),
        "--dir",
        dir.to_str().unwrap(),
        "--require",
        "gpu/gpu/0/uuid",
        "--termination-log",
        scratch.path().join("log").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));

    let deployment = repo_path("examples/webhook-deployment/30-deployment.yaml");
    let out = run(&["get", "--from-file", deployment.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("holds no Pod, but a Deployment (\"trainer\")"), "{err}");
    assert!(err.contains("kubectl get pod -n drafs-webhook-demo -l app=trainer"), "{err}");
}

#[test]
fn consumed_capacity_of_shared_devices_in_the_tree_json_and_get() {
    let (_api, env) = example("serving", "inference-0", "examples/offline/shared-gpu.yaml");
    assert_ok(&env.init(&["--timeout", "30s", "--require", "gpu/gpu/0/.consumed/gpu.nvidia.com/memory"]));
    let tree = read_tree(&env.path("dra"));
    assert_eq!(tree["gpu/gpu/0/.consumed/gpu.nvidia.com/memory"], "20Gi");
    assert_eq!(tree["gpu/gpu/0/.capacity/gpu.nvidia.com/memory"], "80Gi", "the device's total stays beside it");
    assert_eq!(tree["gpu/gpu/0/.shareID"], "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a");
    assert_eq!(tree["net/nic/0/.consumed/dra.net/queues"], "4");
    assert_eq!(tree["net/nic/0/.consumed/dra.net/bandwidth"], "25G", "the quantity as written");
    let consumed: BTreeSet<&str> = tree.keys().filter(|k| k.contains("/.consumed/")).map(String::as_str).collect();
    assert_eq!(consumed.len(), 3, "{consumed:?}");
    let device: Value = serde_json::from_str(&tree["net/nic/0/.json"]).unwrap();
    assert_eq!(device["consumedCapacity"], json!({"dra.net/bandwidth": "25G", "dra.net/queues": "4"}));

    let out = env.run(&["get"], LIMIT);
    assert_ok(&out);
    let table = stdout(&out);
    let row = table.lines().find(|l| l.contains(".consumed/")).unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells, vec!["gpu", "gpu", "0", "gpu.nvidia.com", "gpu-1", ".consumed/gpu.nvidia.com/memory", "20Gi"]);
}
