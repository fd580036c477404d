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
    let mut p = PodBuilder::new(ns, name).uid(&format!("uid-{name}")).node(node);
    for (n, src) in claims {
        p = match src {
            Ok(c) => p.claim(n, c),
            Err(t) => p.template_claim(n, t),
        };
    }
    let mut pod = p.container("app", "app").phase("Pending").generated(generated).build();
    if pod["spec"]["resourceClaims"].is_null() {
        pod["spec"]["resourceClaims"] = serde_json::json!([]);
    }
    pod
}

/// A claim allocated to `results` = (request, driver, pool, device); None = not allocated.
pub fn claim(ns: &str, name: &str, results: Option<&[(&str, &str, &str, &str)]>) -> Value {
    let mut c = ClaimBuilder::new(ns, name).uid(&format!("uid-{name}")).generation(1).requests(serde_json::json!([]));
    if let Some(results) = results {
        c = c.allocated();
        for (r, d, p, dev) in results {
            c = c.result(r, d, p, dev);
        }
    }
    c.build()
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
    let mut s = SliceBuilder::new(name, driver, pool).generation(generation);
    s = match node {
        Some(n) => s.node(n),
        None => s.all_nodes(),
    };
    for (n, a) in devices {
        s = s.device(n, a.clone());
    }
    s.build()
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

/// A test object, built: its JSON, or decoded into a typed object (the unit
/// tests decode into k8s-openapi's types).
pub trait Build: Sized {
    fn build(self) -> Value;

    fn decode<T: serde::de::DeserializeOwned>(self) -> T {
        serde_json::from_value(self.build()).unwrap_or_else(|e| panic!("a test object that does not decode: {e}"))
    }
}

/// What every builder's knobs do to its object: set a field, or add to a list.
trait Fields: Sized {
    fn object(&mut self) -> &mut Value;

    /// The field at `path` set to `value` (the objects on the way made as needed).
    fn set(mut self, path: &[&str], value: impl Into<Value>) -> Self {
        *path.iter().fold(self.object(), |v, k| &mut v[*k]) = value.into();
        self
    }

    /// `item` added to the list at `path`.
    fn push(mut self, path: &[&str], item: Value) -> Self {
        append(path.iter().fold(self.object(), |v, k| &mut v[*k]), item);
        self
    }

    /// The fields of `fields` (a JSON object) set in the last item of the
    /// list at `path`.
    fn merge_last(mut self, path: &[&str], fields: Value) -> Self {
        let list = path.iter().fold(self.object(), |v, k| &mut v[*k]).as_array_mut();
        let last = list.and_then(|l| l.last_mut()).unwrap_or_else(|| panic!("an item in {path:?} first"));
        let Value::Object(fields) = fields else { panic!("fields are a JSON object") };
        for (k, v) in fields {
            last[k.as_str()] = v;
        }
        self
    }
}

/// `item` added to `list`, made if there is none yet.
fn append(list: &mut Value, item: Value) {
    if list.is_null() {
        *list = Value::Array(Vec::new());
    }
    list.as_array_mut().expect("a list").push(item);
}

/// A Pod, in one place for every test: `new` is only its name (an empty
/// namespace is left out, as in a pod sent for admission) and each knob adds
/// what a test needs, so a fixture says what it is about.
#[derive(Clone, Debug)]
pub struct PodBuilder {
    pod: Value,
    /// Where `uses`, `limits` and `requests` go: the last container added (its list, index).
    last: Option<(&'static str, usize)>,
}

impl Fields for PodBuilder {
    fn object(&mut self) -> &mut Value {
        &mut self.pod
    }
}

impl PodBuilder {
    pub fn new(ns: &str, name: &str) -> Self {
        let mut pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {}});
        if !ns.is_empty() {
            pod["metadata"]["namespace"] = ns.into();
        }
        PodBuilder { pod, last: None }
    }

    /// A pod named by the API server from `prefix`, as a controller makes them.
    pub fn from_prefix(ns: &str, prefix: &str) -> Self {
        let mut p = PodBuilder::new(ns, "");
        let meta = p.pod["metadata"].as_object_mut().unwrap();
        meta.shift_remove("name");
        meta.insert("generateName".into(), prefix.into());
        p
    }

    pub fn uid(self, uid: &str) -> Self {
        self.set(&["metadata", "uid"], uid)
    }

    pub fn resource_version(self, rv: &str) -> Self {
        self.set(&["metadata", "resourceVersion"], rv)
    }

    /// The labels, a JSON object.
    pub fn labels(self, labels: Value) -> Self {
        self.set(&["metadata", "labels"], labels)
    }

    /// The annotations, a JSON object.
    pub fn annotations(self, annotations: Value) -> Self {
        self.set(&["metadata", "annotations"], annotations)
    }

    pub fn node(self, node: &str) -> Self {
        self.set(&["spec", "nodeName"], node)
    }

    pub fn service_account(self, account: &str) -> Self {
        self.set(&["spec", "serviceAccountName"], account)
    }

    /// Pod claim `name` is ResourceClaim `claim`.
    pub fn claim(self, name: &str, claim: &str) -> Self {
        self.push(&["spec", "resourceClaims"], serde_json::json!({"name": name, "resourceClaimName": claim}))
    }

    /// Pod claim `name` is generated from ResourceClaimTemplate `template`.
    pub fn template_claim(self, name: &str, template: &str) -> Self {
        self.push(&["spec", "resourceClaims"], serde_json::json!({"name": name, "resourceClaimTemplateName": template}))
    }

    pub fn container(self, name: &str, image: &str) -> Self {
        self.add_container("containers", name, image)
    }

    pub fn init_container(self, name: &str, image: &str) -> Self {
        self.add_container("initContainers", name, image)
    }

    /// The last container added uses pod claim `claim`.
    pub fn uses(mut self, claim: &str) -> Self {
        append(&mut self.last_container()["resources"]["claims"], serde_json::json!({"name": claim}));
        self
    }

    /// The last container added uses request `request` of pod claim `claim`.
    pub fn uses_request(mut self, claim: &str, request: &str) -> Self {
        let entry = serde_json::json!({"name": claim, "request": request});
        append(&mut self.last_container()["resources"]["claims"], entry);
        self
    }

    /// The last container added asks for these `limits` (a JSON object).
    pub fn limits(mut self, limits: Value) -> Self {
        self.last_container()["resources"]["limits"] = limits;
        self
    }

    /// The last container added asks for these `requests` (a JSON object).
    pub fn requests(mut self, requests: Value) -> Self {
        self.last_container()["resources"]["requests"] = requests;
        self
    }

    pub fn phase(self, phase: &str) -> Self {
        self.set(&["status", "phase"], phase)
    }

    /// The status entries of template claims: (pod claim, the claim generated
    /// for it); none is an empty list, as the kubelet sees a pod before that.
    pub fn generated(self, generated: &[(&str, &str)]) -> Self {
        let statuses: Vec<Value> =
            generated.iter().map(|(n, c)| serde_json::json!({"name": n, "resourceClaimName": c})).collect();
        self.set(&["status", "resourceClaimStatuses"], statuses)
    }

    /// The kubelet's status of container `name`, with these device health
    /// reports (`allocatedResourcesStatus`, a JSON array).
    pub fn container_status(self, name: &str, allocated: Value) -> Self {
        let status = serde_json::json!({"name": name, "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "allocatedResourcesStatus": allocated});
        self.push(&["status", "containerStatuses"], status)
    }

    /// The status entry of template claim `name` that needed no claim (the
    /// entry without a `resourceClaimName`), after any from `generated`.
    pub fn no_claim_needed(self, name: &str) -> Self {
        self.push(&["status", "resourceClaimStatuses"], serde_json::json!({"name": name}))
    }

    /// The scheduler's claim for the pod's extended resources (a JSON object).
    pub fn extended_status(self, status: Value) -> Self {
        self.set(&["status", "extendedResourceClaimStatus"], status)
    }

    fn add_container(self, list: &'static str, name: &str, image: &str) -> Self {
        let mut p = self.push(&["spec", list], serde_json::json!({"name": name, "image": image}));
        p.last = Some((list, p.pod["spec"][list].as_array().unwrap().len() - 1));
        p
    }

    fn last_container(&mut self) -> &mut Value {
        let (list, i) = self.last.expect("a container first");
        &mut self.pod["spec"][list][i]
    }
}

impl Build for PodBuilder {
    /// With `containers: []` if none was added: the API's one required field.
    fn build(mut self) -> Value {
        if self.pod["spec"]["containers"].is_null() {
            self.pod["spec"]["containers"] = serde_json::json!([]);
        }
        self.pod
    }
}

/// A ResourceClaim: `new` is its name and an empty spec; the knobs add its
/// allocation and status as the tests need them.
#[derive(Clone, Debug)]
pub struct ClaimBuilder(Value);

impl Fields for ClaimBuilder {
    fn object(&mut self) -> &mut Value {
        &mut self.0
    }
}

impl ClaimBuilder {
    pub fn new(ns: &str, name: &str) -> Self {
        ClaimBuilder(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns}, "spec": {},
        }))
    }

    pub fn uid(self, uid: &str) -> Self {
        self.set(&["metadata", "uid"], uid)
    }

    pub fn generation(self, generation: i64) -> Self {
        self.set(&["metadata", "generation"], generation)
    }

    pub fn resource_version(self, rv: &str) -> Self {
        self.set(&["metadata", "resourceVersion"], rv)
    }

    /// The spec's device requests (a JSON array).
    pub fn requests(self, requests: Value) -> Self {
        self.set(&["spec", "devices", "requests"], requests)
    }

    /// Allocated, so far to no device.
    pub fn allocated(self) -> Self {
        let results = &self.0["status"]["allocation"]["devices"]["results"];
        if results.is_null() { self.set(&RESULTS, Vec::<Value>::new()) } else { self }
    }

    /// Allocated `device` of `driver`/`pool` for `request`.
    pub fn result(self, request: &str, driver: &str, pool: &str, device: &str) -> Self {
        self.push(&RESULTS, serde_json::json!({"request": request, "driver": driver, "pool": pool, "device": device}))
    }

    /// The last result added has these fields too (a JSON object: `shareID`,
    /// `consumedCapacity`, `adminAccess`...).
    pub fn with(self, fields: Value) -> Self {
        self.merge_last(&RESULTS, fields)
    }

    /// A device's status as its driver writes it (a JSON object: `driver`,
    /// `pool`, `device`, `networkData`, `data`...).
    pub fn device_status(self, status: Value) -> Self {
        self.push(&["status", "devices"], status)
    }

    /// Reserved for pod `name` (`uid`).
    pub fn reserved_for(self, name: &str, uid: &str) -> Self {
        self.push(&["status", "reservedFor"], serde_json::json!({"resource": "pods", "name": name, "uid": uid}))
    }
}

/// Where a claim's allocation results are.
const RESULTS: [&str; 4] = ["status", "allocation", "devices", "results"];

impl Build for ClaimBuilder {
    fn build(self) -> Value {
        self.0
    }
}

/// A ResourceSlice of `driver`/`pool`, generation 1 of a pool of one slice,
/// with no devices; say where it is (`node` or `all_nodes`) and add devices.
#[derive(Clone, Debug)]
pub struct SliceBuilder(Value);

impl Fields for SliceBuilder {
    fn object(&mut self) -> &mut Value {
        &mut self.0
    }
}

impl SliceBuilder {
    pub fn new(name: &str, driver: &str, pool: &str) -> Self {
        SliceBuilder(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1}, "devices": []},
        }))
    }

    pub fn resource_version(self, rv: &str) -> Self {
        self.set(&["metadata", "resourceVersion"], rv)
    }

    pub fn generation(self, generation: i64) -> Self {
        self.set(&["spec", "pool", "generation"], generation)
    }

    /// How many slices the pool has.
    pub fn slice_count(self, count: i64) -> Self {
        self.set(&["spec", "pool", "resourceSliceCount"], count)
    }

    pub fn node(self, node: &str) -> Self {
        self.set(&["spec", "nodeName"], node)
    }

    pub fn all_nodes(self) -> Self {
        self.set(&["spec", "allNodes"], true)
    }

    /// Device `name` with these attributes (a JSON object).
    pub fn device(self, name: &str, attributes: Value) -> Self {
        self.push(&["spec", "devices"], serde_json::json!({"name": name, "attributes": attributes}))
    }

    /// The last device added has this capacity (a JSON object).
    pub fn capacity(self, capacity: Value) -> Self {
        self.with(serde_json::json!({ "capacity": capacity }))
    }

    /// The last device added has these fields too (a JSON object: `taints`...).
    pub fn with(self, fields: Value) -> Self {
        self.merge_last(&["spec", "devices"], fields)
    }
}

impl Build for SliceBuilder {
    fn build(self) -> Value {
        self.0
    }
}
