//! Objects and scenarios for the test API server: pods, claims and slices
//! built in a line, the examples loaded, and the shipped RBAC in force.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Env, TestApi};

pub const TOKEN: &str = "drafs-sa-token";

/// A path in the drafs checkout (this crate lives in its `tests/support`).
pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

pub fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The RBAC `drafs manifests rbac --namespace NS --events` prints.
pub fn rbac_yaml(namespace: &str) -> String {
    let out = std::process::Command::new(super::drafs_bin())
        .args(["manifests", "rbac", "--events", "--namespace", namespace])
        .output()
        .unwrap();
    assert!(out.status.success(), "drafs manifests rbac: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A test API server authorizing by the RBAC drafs ships (`drafs manifests
/// rbac`), for `namespace`, with a token for its service account.
pub fn api_for(namespace: &str) -> TestApi {
    let api = TestApi::start(&rbac_yaml(namespace), namespace);
    api.add_token(TOKEN, &format!("system:serviceaccount:{namespace}:drafs"));
    api
}

/// A test API server holding the objects of an `examples/` file, and an
/// environment for that file's pod.
pub fn example(namespace: &str, pod: &str, file: &str) -> (TestApi, Env) {
    let api = api_for(namespace);
    api.load_yaml(&read(file));
    let env = Env::new(&api, namespace, pod, TOKEN);
    (api, env)
}

/// Parse a multi-document YAML text into JSON values.
pub fn yaml_docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(text).unwrap()
}

/// A pod on `node` whose claims are `(pod claim name, Ok(claim name) | Err(template))`,
/// with the status entries of template claims given in `generated`.
pub fn pod(
    ns: &str,
    name: &str,
    node: &str,
    claims: &[(&str, Result<&str, &str>)],
    generated: &[(&str, &str)],
) -> Value {
    let spec_claims: Vec<Value> = claims
        .iter()
        .map(|(n, src)| match src {
            Ok(c) => serde_json::json!({"name": n, "resourceClaimName": c}),
            Err(t) => serde_json::json!({"name": n, "resourceClaimTemplateName": t}),
        })
        .collect();
    let statuses: Vec<Value> =
        generated.iter().map(|(n, c)| serde_json::json!({"name": n, "resourceClaimName": c})).collect();
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
        "spec": {"nodeName": node, "resourceClaims": spec_claims, "containers": [{"name": "app", "image": "app"}]},
        "status": {"phase": "Pending", "resourceClaimStatuses": statuses},
    })
}

/// A claim allocated to `results` = (request, driver, pool, device); None = not allocated.
pub fn claim(ns: &str, name: &str, results: Option<&[(&str, &str, &str, &str)]>) -> Value {
    let mut c = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "generation": 1},
        "spec": {"devices": {"requests": []}},
    });
    if let Some(results) = results {
        let results: Vec<Value> = results
            .iter()
            .map(|(r, d, p, dev)| serde_json::json!({"request": r, "driver": d, "pool": p, "device": dev}))
            .collect();
        c["status"] = serde_json::json!({"allocation": {"devices": {"results": results}}});
    }
    c
}

/// A slice of `driver`/`pool` at `generation`; `node` None means `allNodes: true`.
/// Devices are (name, attributes as a JSON object).
pub fn slice(
    name: &str,
    driver: &str,
    pool: &str,
    generation: i64,
    node: Option<&str>,
    devices: &[(&str, Value)],
) -> Value {
    let devices: Vec<Value> = devices.iter().map(|(n, a)| serde_json::json!({"name": n, "attributes": a})).collect();
    let mut s = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1}, "devices": devices},
    });
    match node {
        Some(n) => s["spec"]["nodeName"] = serde_json::json!(n),
        None => s["spec"]["allNodes"] = serde_json::json!(true),
    }
    s
}

/// A node-local slice of 8 devices (g0..g7) with 30 string attributes each
/// (`attr0`.. = `value-<device>-<attr>-<generation>`); for benchmarks.
pub fn eight_device_slice(api: &TestApi, generation: usize) {
    api.apply(eight_device_slice_object(generation));
}

/// The object [`eight_device_slice`] applies (built ahead of a timed burst).
pub fn eight_device_slice_object(generation: usize) -> Value {
    let devices: Vec<(String, Value)> = (0..8)
        .map(|i| {
            let attrs: serde_json::Map<String, Value> = (0..30)
                .map(|a| (format!("attr{a}"), serde_json::json!({"string": format!("value-{i}-{a}-{generation}")})))
                .collect();
            (format!("g{i}"), Value::Object(attrs))
        })
        .collect();
    let refs: Vec<(&str, Value)> = devices.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
    slice("n1", "gpu.example.com", "n1", 1, Some("n1"), &refs)
}

/// Pod `ml/p` on node n1 with claim `gpu` allocated all 8 devices of [`eight_device_slice`].
pub fn eight_device_pod(api: &TestApi) {
    let names: Vec<String> = (0..8).map(|i| format!("g{i}")).collect();
    let results: Vec<(&str, &str, &str, &str)> =
        names.iter().map(|d| ("gpu", "gpu.example.com", "n1", d.as_str())).collect();
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", Some(&results)));
}

/// Pod `ml/p` with claim `net` (ResourceClaim `c`) allocated one NIC (`nic0`,
/// request `eth`) whose slice is published but whose device status is not yet
/// written; returns the claim so a test can add the status later.
pub fn nic_without_status() -> (TestApi, Env, Value) {
    let api = api_for("ml");
    api.apply(pod("ml", "p", "n1", &[("net", Ok("c"))], &[]));
    let allocated = claim("ml", "c", Some(&[("eth", "net.example.com", "n1", "nic0")]));
    api.apply(allocated.clone());
    api.apply(slice(
        "s",
        "net.example.com",
        "n1",
        1,
        Some("n1"),
        &[("nic0", serde_json::json!({"mtu": {"int": 1500}}))],
    ));
    let env = Env::new(&api, "ml", "p", TOKEN);
    (api, env, allocated)
}

/// The claim of [`nic_without_status`] with the network driver's status written.
pub fn with_interface(mut claim: Value, interface: &str) -> Value {
    claim["status"]["devices"] = serde_json::json!([{
        "driver": "net.example.com", "pool": "n1", "device": "nic0",
        "networkData": {"interfaceName": interface}, "data": {"vlan": 7},
    }]);
    claim
}
