//! The ways Kubernetes 1.37 gives a pod a device besides its own claims,
//! against the test API server: extended resources backed by DRA (KEP-5004:
//! a pod that asks `resources.limits: {nvidia.com/gpu: 1}` and has no
//! `spec.resourceClaims`, served at `<resource>/<container>/<index>/` by
//! `init`, `get`, `exec` and `serve`), admin access, device taints, and a
//! claim shared by two pods.

use drafs_test_support as support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// A safety net only: every run normally ends by itself long before.
const LIMIT: Duration = Duration::from_secs(90);

const NS: &str = "ml";
const POD: &str = "inference-0";
const CLAIM: &str = "inference-0-extended-resources-q8w2z";
const TRAINER_UUID: &str = "GPU-5c1f7e2a-3b4d-4e6f-8a9b-0c1d2e3f4a5b";
const EVALUATOR_UUID: &str = "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b";

fn extended() -> (TestApi, Env) {
    example(NS, POD, "examples/offline/extended-gpu.yaml")
}

#[test]
fn init_serves_each_containers_device_and_the_standard_view_of_the_generated_claim() {
    let (api, env) = extended();
    let (dir, meta) = (env.path("dra"), env.path("meta"));
    let out = env.run(
        &[
            "init",
            "--dir",
            dir.to_str().unwrap(),
            "--metadata-dir",
            meta.to_str().unwrap(),
            "--require",
            "nvidia.com/gpu/trainer/0/uuid",
            "--events=all",
        ],
        LIMIT,
    );
    assert_ok(&out);
    assert!(!stderr(&out).contains("uses no resource claims"), "{}", stderr(&out));
    let tree = read_tree(&dir);
    assert_eq!(tree["nvidia.com/gpu/trainer/0/uuid"], TRAINER_UUID);
    assert_eq!(tree["nvidia.com/gpu/evaluator/0/uuid"], EVALUATOR_UUID);
    assert_eq!(tree["nvidia.com/gpu/trainer/0/.request"], "container-1-request-0");
    assert_eq!(tree["nvidia.com/gpu/evaluator/0/resource.kubernetes.io/pciBusID"], "0000:5e:00.0");
    assert_eq!(tree[".ready"], "");
    let whole: Value = serde_json::from_str(&tree[".json"]).unwrap();
    assert_eq!(whole["claims"][0]["name"], "nvidia.com/gpu");
    assert_eq!(whole["claims"][0]["resourceClaimName"], CLAIM);
    assert_eq!(whole["claims"][0]["extendedResource"], true);
    assert_eq!(whole["claims"][0]["devices"][0]["container"], "trainer");

    // The standard view has the generated claim under resourceclaims/, one
    // directory per request of the claim, as the runtime mounts a driver's file.
    let view = read_tree(&meta);
    let paths: Vec<&str> = view.keys().map(String::as_str).collect();
    assert_eq!(
        paths,
        vec![
            "resourceclaims/inference-0-extended-resources-q8w2z/container-1-request-0/gpu.nvidia.com-metadata.json",
            "resourceclaims/inference-0-extended-resources-q8w2z/container-2-request-0/gpu.nvidia.com-metadata.json",
        ]
    );
    let doc: Value = serde_json::from_str(view[paths[0]].lines().next().unwrap()).unwrap();
    assert_eq!(doc["metadata"]["name"], CLAIM);
    assert_eq!(doc["requests"][0]["devices"][0]["attributes"]["uuid"]["string"], TRAINER_UUID);

    let events = api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0]["message"].as_str().unwrap().starts_with("2 devices of 1 claim ready"), "{}", events[0]);
    // One pod GET, then the generated claim by name and the node's slices
    // (asked for together: in either order), nothing else.
    let mut reads: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.verb == "get" || r.verb == "list")
        .map(|r| format!("{} {} {}", r.verb, r.resource, r.field_selector))
        .collect();
    if reads.len() > 1 {
        reads[1..].sort();
    }
    assert_eq!(
        reads,
        vec![
            "get pods ".to_string(),
            format!("list resourceclaims metadata.name={CLAIM}"),
            "list resourceslices spec.nodeName=gpu-node-7".to_string(),
        ]
    );
}

#[test]
fn get_exec_and_the_claim_selection_know_extended_resources() {
    let (_api, env) = extended();
    let out = env.run(&["get"], LIMIT);
    assert_ok(&out);
    let table = stdout(&out);
    let row = table.lines().find(|l| l.contains(EVALUATOR_UUID) && l.contains("gpu.nvidia.com/uuid")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        vec![
            "nvidia.com/gpu",
            "evaluator",
            "(container-2-request-0)",
            "0",
            "gpu.nvidia.com",
            "gpu-3",
            "gpu.nvidia.com/uuid",
            EVALUATOR_UUID
        ]
    );

    let out = env
        .run(&["exec", "--env", "GPU=nvidia.com/gpu/evaluator/0/uuid", "--", "sh", "-c", "printf %s \"$GPU\""], LIMIT);
    assert_ok(&out);
    assert_eq!(stdout(&out), EVALUATOR_UUID);

    // --claim selects an extended resource by its name; one the pod did not get fails at once.
    let out = env.run(&["get", "-o", "json", "--claim", "nvidia.com/gpu"], LIMIT);
    assert_ok(&out);
    let whole: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(whole["claims"].as_array().unwrap().len(), 1);
    let out = env.run(&["init", "--dir", env.path("x").to_str().unwrap(), "--claim", "amd.com/gpu"], LIMIT);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("extended resource amd.com/gpu") && stderr(&out).contains("nvidia.com/gpu"));
}

/// The scheduler records the claim in the pod's status before it binds the
/// pod, but drafs may see the status before the claim (or a lying status
/// names one that never comes): it waits, and says what for.
#[test]
fn init_waits_for_the_generated_claim_and_a_claim_that_never_comes_is_named() {
    let (api, env) = extended();
    let claim = api.get("ResourceClaim", NS, CLAIM).unwrap();
    assert!(api.delete("ResourceClaim", NS, CLAIM));
    let dir = env.path("dra");
    let child = env.spawn(&["init", "--dir", dir.to_str().unwrap(), "--require", "nvidia.com/gpu/trainer/0/uuid"]);
    wait_until("a watch on the claim", LIMIT, || {
        api.requests().iter().any(|r| r.verb == "watch" && r.resource == "resourceclaims")
    });
    assert!(!dir.join(".ready").exists());
    api.apply(claim);
    let out = wait_output(child, LIMIT);
    assert_ok(&out);
    assert_eq!(read_tree(&dir)["nvidia.com/gpu/trainer/0/uuid"], TRAINER_UUID);

    assert!(api.delete("ResourceClaim", NS, CLAIM));
    let out = env.run(&["init", "--dir", env.path("never").to_str().unwrap(), "--timeout", "2s"], LIMIT);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let log = env.termination_log();
    assert!(log.contains(&format!("extended resource nvidia.com/gpu: ResourceClaim {CLAIM} not found")), "{log}");
}

/// A status that names a container the pod does not have, a resource or a
/// request that cannot be a path: each mapping is skipped with a warning,
/// the others are served, nothing leaves the tree.
#[test]
fn hostile_mappings_are_skipped_with_warnings() {
    let (api, env) = extended();
    let mut pod = api.get("Pod", NS, POD).unwrap();
    let mappings = pod["status"]["extendedResourceClaimStatus"]["requestMappings"].as_array_mut().unwrap();
    mappings.push(
        json!({"containerName": "ghost", "resourceName": "nvidia.com/gpu", "requestName": "container-2-request-0"}),
    );
    mappings.push(
        json!({"containerName": "trainer", "resourceName": "../../../etc", "requestName": "container-1-request-0"}),
    );
    mappings.push(json!({"containerName": "trainer", "resourceName": "nvidia.com/x", "requestName": "../../r"}));
    mappings.push(
        json!({"containerName": "../up", "resourceName": "nvidia.com/gpu", "requestName": "container-1-request-0"}),
    );
    api.apply(pod);
    let dir = env.path("dra");
    let out = env.run(&["init", "--dir", dir.to_str().unwrap()], LIMIT);
    assert_ok(&out);
    let err = stderr(&out);
    for needle in ["\"ghost\"", "\"../../../etc\"", "\"../../r\"", "\"../up\""] {
        assert!(err.contains(needle) && err.contains("skipped"), "{needle}: {err}");
    }
    let tree = read_tree(&dir);
    assert_eq!(tree["nvidia.com/gpu/trainer/0/uuid"], TRAINER_UUID);
    assert!(tree.keys().all(|k| !k.contains("ghost") && !k.contains("..") && !k.starts_with("etc")), "{tree:?}");
    let top: Vec<String> =
        std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(top.iter().all(|n| n.starts_with('.') || n == "nvidia.com"), "{top:?}");
}

/// A pod that asks for an extended resource a device plugin serves: bound,
/// with no extendedResourceClaimStatus. drafs says why the tree is empty.
#[test]
fn an_extended_resource_not_served_by_dra_is_explained() {
    let (api, env) = extended();
    let mut pod = api.get("Pod", NS, POD).unwrap();
    pod["status"].as_object_mut().unwrap().remove("extendedResourceClaimStatus");
    api.apply(pod);
    let out = env.run(&["init", "--dir", env.path("dra").to_str().unwrap()], LIMIT);
    assert_ok(&out);
    let err = stderr(&out);
    assert!(err.contains("none of its extended resources (nvidia.com/gpu) through DRA"), "{err}");
}

/// `serve` follows an extended resource's device live, like any claim's.
#[test]
fn serve_follows_an_extended_resources_device_live() {
    let (api, env) = extended();
    let dir = env.path("files");
    let mut serve = Serve::start_ready(&env, &dir, &["--backend", "files"], LIMIT);
    assert_eq!(serve.read("nvidia.com/gpu/trainer/0/productName").as_deref(), Some("NVIDIA H200"));
    let mut slice = api.get("ResourceSlice", "", "gpu-node-7-gpu.nvidia.com-k2m9x").unwrap();
    slice["spec"]["devices"][0]["attributes"]["productName"] = json!({"string": "NVIDIA H200 NVL"});
    api.apply(slice);
    serve.wait_for("nvidia.com/gpu/trainer/0/productName", Some("NVIDIA H200 NVL"), LIMIT);
    assert_eq!(serve.read("nvidia.com/gpu/evaluator/0/productName").as_deref(), Some("NVIDIA H200"));
    api.delete("ResourceClaim", NS, CLAIM);
    serve.wait_for(".ready", None, LIMIT);
    assert_eq!(serve.read("nvidia.com/gpu/trainer/0/uuid"), None);
    serve.signal(libc::SIGTERM);
    assert_eq!(serve.wait(LIMIT).status.code(), Some(0));
}

/// A device taint (KEP-5055) put on the device in its slice, or taken off,
/// shows in `.taints` live, like health; an admin-access allocation is marked.
#[test]
fn device_taints_follow_the_slice_live_and_admin_access_is_marked() {
    let (api, env) = extended();
    let mut claim = api.get("ResourceClaim", NS, CLAIM).unwrap();
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = json!(true);
    api.apply(claim);
    let dir = env.path("files");
    let mut serve = Serve::start_ready(&env, &dir, &["--backend", "files"], LIMIT);
    assert_eq!(serve.read("nvidia.com/gpu/trainer/0/.adminAccess").as_deref(), Some("true"));
    assert_eq!(serve.read("nvidia.com/gpu/evaluator/0/.adminAccess"), None);
    assert_eq!(serve.read("nvidia.com/gpu/trainer/0/.taints"), None);
    let slice_name = "gpu-node-7-gpu.nvidia.com-k2m9x";
    let mut slice = api.get("ResourceSlice", "", slice_name).unwrap();
    slice["spec"]["devices"][0]["taints"] = json!([
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"},
        {"key": "maintenance", "effect": "NoSchedule"},
    ]);
    api.apply(slice.clone());
    serve.wait_for(
        "nvidia.com/gpu/trainer/0/.taints",
        Some("gpu.nvidia.com/xid=79:NoExecute,maintenance:NoSchedule"),
        LIMIT,
    );
    let record: Value = serde_json::from_str(&serve.read("nvidia.com/gpu/trainer/0/.json").unwrap()).unwrap();
    assert_eq!(record["taints"][0], json!({"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}));
    assert_eq!(record["adminAccess"], true);
    slice["spec"]["devices"][0].as_object_mut().unwrap().remove("taints");
    api.apply(slice);
    serve.wait_for("nvidia.com/gpu/trainer/0/.taints", None, LIMIT);
    serve.signal(libc::SIGTERM);
    assert_eq!(serve.wait(LIMIT).status.code(), Some(0));
}

/// A claim several pods share (one ResourceClaim named by two pods): each
/// pod's drafs serves the same device under its own claim name.
#[test]
fn a_claim_shared_by_two_pods_is_served_to_each() {
    let api = api_for("ml");
    api.apply(pod("ml", "a", "n1", &[("gpu", Ok("shared-gpu"))], &[]));
    api.apply(pod("ml", "b", "n1", &[("accel", Ok("shared-gpu"))], &[]));
    api.apply(claim("ml", "shared-gpu", Some(&[("gpu", "gpu.example.com", "n1", "g0")])));
    api.apply(slice("s", "gpu.example.com", "n1", 1, Some("n1"), &[("g0", json!({"uuid": {"string": "SHARED"}}))]));
    for (pod, path) in [("a", "gpu/gpu/0/uuid"), ("b", "accel/gpu/0/uuid")] {
        let env = Env::new(&api, "ml", pod, TOKEN);
        let out = env.run(&["init", "--dir", env.path("dra").to_str().unwrap()], LIMIT);
        assert_ok(&out);
        assert_eq!(read_tree(&env.path("dra"))[path], "SHARED", "{pod}");
    }
}
