//! The standard (KEP-5304) device metadata view.
//!
//! Kubernetes 1.36+ lets drivers built on the kubelet plugin library publish
//! `<request>/<driver>-metadata.json` under `/var/run/kubernetes.io/dra-device-attributes`.
//! drafs writes the same files for every driver, so consumers of the standard
//! (KubeVirt's virt-launcher, for one) work on any cluster.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use crate::model::names::is_dns_subdomain;
use crate::model::resolve::{Resolution, ResolvedClaim, ResolvedDevice};
use crate::model::tree::Tree;

pub const API_VERSIONS: [&str; 2] = ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"];

/// Per-file generation counters: start at 1, grow whenever a file's content
/// changes, and continue from what is already in the directory (a restarted
/// sidecar, or `serve` after `init`, goes on counting, as the kubelet plugin
/// helper does).
#[derive(Debug, Default, Clone)]
pub struct Generations {
    last: HashMap<String, (Value, i64)>,
}

impl Generations {
    /// Take back the content and generation of a file drafs wrote, from its
    /// first line (`rel`: its path under the directory); anything else is ignored.
    pub fn take_back(&mut self, rel: String, first_line: &str) {
        if let Ok(doc) = serde_json::from_str::<Value>(first_line)
            && let Some(generation) = doc["metadata"]["generation"].as_i64()
        {
            let pod_claim = doc.get("podClaimName").cloned().unwrap_or(Value::Null);
            let m = &doc["metadata"];
            let content = json!([m["name"], m["namespace"], m["uid"], pod_claim, doc["requests"]]);
            self.last.insert(rel, (content, generation));
        }
    }

    fn next(&mut self, path: &str, content: &Value) -> i64 {
        match self.last.get_mut(path) {
            Some((old, generation)) if old == content => *generation,
            Some((old, generation)) => {
                *old = content.clone();
                *generation += 1;
                *generation
            }
            None => {
                self.last.insert(path.to_string(), (content.clone(), 1));
                1
            }
        }
    }
}

fn device_metadata(device: &ResolvedDevice) -> Value {
    // As drivers write them: the driver's own domain unqualified (`mdevUUID`,
    // which KubeVirt looks up as is), other domains qualified.
    let attributes: serde_json::Map<String, Value> = device
        .attributes
        .iter()
        .map(|(name, a)| {
            let key = if name.domain == device.driver { name.name.clone() } else { name.to_string() };
            (key, serde_json::to_value(&a.value).unwrap_or(Value::Null))
        })
        .collect();
    let mut out = json!({
        "driver": device.driver,
        "pool": device.pool,
        "name": device.device,
        "attributes": attributes,
    });
    if let Some(status) = &device.status {
        let mut net = serde_json::Map::new();
        if let Some(v) = &status.interface_name {
            net.insert("interfaceName".into(), json!(v));
        }
        if !status.ips.is_empty() {
            net.insert("ips".into(), json!(status.ips));
        }
        if let Some(v) = &status.hardware_address {
            net.insert("hardwareAddress".into(), json!(v));
        }
        if !net.is_empty() {
            out["networkData"] = Value::Object(net);
        }
    }
    out
}

/// The path of one claim's file for a request and driver.
fn file_path(claim: &ResolvedClaim, request: &str, driver: &str) -> String {
    if claim.from_template() {
        format!("resourceclaimtemplates/{}/{request}/{driver}-metadata.json", claim.pod_claim)
    } else {
        format!("resourceclaims/{}/{request}/{driver}-metadata.json", claim.claim_name)
    }
}

/// Full request names with their devices, in allocation order.
type Requests<'a> = Vec<(&'a str, Vec<Value>)>;

/// Build the metadata view of a resolution; `warnings` receives what was skipped.
pub fn build(res: &Resolution, generations: &mut Generations, warnings: &mut Vec<String>) -> Tree {
    let mut tree = Tree::default();
    for claim in &res.claims {
        if !claim.from_template() && !is_dns_subdomain(&claim.claim_name) {
            warnings
                .push(format!("metadata view: ResourceClaim name {:?} skipped: not a DNS subdomain", claim.claim_name));
            continue;
        }
        // (request dir, driver) -> full request name -> devices, in allocation order.
        let mut files: BTreeMap<(&str, &str), Requests> = BTreeMap::new();
        for device in &claim.devices {
            if !is_dns_subdomain(&device.driver) {
                warnings.push(format!("metadata view: driver {:?} skipped: not a DNS subdomain", device.driver));
                continue;
            }
            // The claim's own request (an extended resource's tree directory is
            // its container, but the standard path has the claim's request).
            let request = device.full_request.split('/').next().unwrap_or_default();
            let requests = files.entry((request, device.driver.as_str())).or_default();
            let entry = device_metadata(device);
            match requests.iter_mut().find(|(name, _)| *name == device.full_request) {
                // A request two containers share (an extended resource) lists its device once.
                Some((_, devices)) if devices.contains(&entry) => {}
                Some((_, devices)) => devices.push(entry),
                None => requests.push((device.full_request.as_str(), vec![entry])),
            }
        }
        for ((request, driver), requests) in files {
            let path = file_path(claim, request, driver);
            let requests: Vec<Value> =
                requests.into_iter().map(|(name, devices)| json!({"name": name, "devices": devices})).collect();
            // Generation is counted on the content; the documents put it in order:
            // apiVersion, kind, metadata, podClaimName, requests.
            let pod_claim = claim.from_template().then(|| claim.pod_claim.clone());
            let generation =
                generations.next(&path, &json!([claim.claim_name, claim.namespace, claim.uid, pod_claim, requests]));
            let mut content = String::new();
            for api_version in API_VERSIONS {
                let mut doc = serde_json::Map::new();
                doc.insert("apiVersion".into(), json!(api_version));
                doc.insert("kind".into(), json!("DeviceMetadata"));
                doc.insert(
                    "metadata".into(),
                    json!({"name": claim.claim_name, "namespace": claim.namespace, "uid": claim.uid, "generation": generation}),
                );
                if let Some(name) = &pod_claim {
                    doc.insert("podClaimName".into(), json!(name));
                }
                doc.insert("requests".into(), json!(requests));
                content.push_str(&Value::Object(doc).to_string());
                content.push('\n');
            }
            if let Err(e) = tree.insert(&path, content) {
                warnings.push(format!("metadata view: {e}"));
            }
        }
    }
    tree
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::objects::FileObjects;
    use crate::model::resolve::{Selection, resolve};

    /// The resolution of [`TEXT`]: a direct claim and a template's.
    pub(crate) fn example() -> Resolution {
        resolved(TEXT)
    }

    fn resolved(text: &str) -> Resolution {
        resolve(&FileObjects::parse("t", text).unwrap().into_snapshot("t", None).unwrap(), &Selection::default())
    }

    const TEXT: &str = r#"
kind: Pod
metadata: {name: p, namespace: ns}
spec: {nodeName: n, resourceClaims: [{name: vm, resourceClaimName: direct}, {name: gpu, resourceClaimTemplateName: t}]}
status: {resourceClaimStatuses: [{name: gpu, resourceClaimName: p-gpu-x}]}
---
kind: ResourceClaim
metadata: {name: direct, namespace: ns, uid: u1}
spec: {}
status: {allocation: {devices: {results: [{request: pgpu, driver: gpu.example.com, pool: n, device: g0}]}}}
---
kind: ResourceClaim
metadata: {name: p-gpu-x, namespace: ns, uid: u2}
spec: {}
status: {allocation: {devices: {results: [{request: gpu/big, driver: gpu.example.com, pool: n, device: g1}]}}}
---
kind: ResourceSlice
metadata: {name: s}
spec:
  driver: gpu.example.com
  nodeName: n
  pool: {name: n, generation: 1, resourceSliceCount: 1}
  devices:
  - {name: g0, attributes: {resource.kubernetes.io/pciBusID: {string: "0000:af:00.0"}, uuid: {string: A}}}
  - {name: g1, attributes: {uuid: {string: B}}}
"#;

    #[test]
    fn writes_both_versions_for_direct_and_template_claims() {
        let res = example();
        let mut generations = Generations::default();
        let mut warnings = vec![];
        let tree = build(&res, &mut generations, &mut warnings);
        assert!(warnings.is_empty(), "{warnings:?}");
        let direct =
            std::str::from_utf8(tree.get("resourceclaims/direct/pgpu/gpu.example.com-metadata.json").unwrap()).unwrap();
        let docs: Vec<Value> = direct.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(direct.ends_with('\n'));
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["apiVersion"], "metadata.resource.k8s.io/v1beta1");
        assert_eq!(docs[1]["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
        assert_eq!(docs[0]["metadata"], json!({"name": "direct", "namespace": "ns", "uid": "u1", "generation": 1}));
        assert_eq!(docs[0]["podClaimName"], Value::Null);
        let device = &docs[0]["requests"][0]["devices"][0];
        assert_eq!(device["attributes"]["resource.kubernetes.io/pciBusID"], json!({"string": "0000:af:00.0"}));
        assert_eq!(device["attributes"]["uuid"], json!({"string": "A"}), "the driver's domain unqualified");

        let templ =
            std::str::from_utf8(tree.get("resourceclaimtemplates/gpu/gpu/gpu.example.com-metadata.json").unwrap())
                .unwrap();
        let doc: Value = serde_json::from_str(templ.lines().next().unwrap()).unwrap();
        assert_eq!(doc["podClaimName"], "gpu");
        assert_eq!(doc["requests"][0]["name"], "gpu/big");

        // Same content: same generation. Changed content: the generation grows.
        let again = build(&res, &mut generations, &mut warnings);
        assert_eq!(again, tree);
        let mut changed = res.clone();
        changed.claims[0].devices[0].device = "other".into();
        let next = build(&changed, &mut generations, &mut warnings);
        let text =
            std::str::from_utf8(next.get("resourceclaims/direct/pgpu/gpu.example.com-metadata.json").unwrap()).unwrap();
        let doc: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(doc["metadata"]["generation"], 2);
    }

    #[test]
    fn keys_of_other_domains_stay_qualified() {
        let text = TEXT.replace(
            "uuid: {string: A}",
            "uuid: {string: A}, other.example.com/x: {int: 1}, gpu.example.com/mdevUUID: {string: M}",
        );
        let res = resolved(&text);
        let tree = build(&res, &mut Generations::default(), &mut vec![]);
        let direct =
            std::str::from_utf8(tree.get("resourceclaims/direct/pgpu/gpu.example.com-metadata.json").unwrap()).unwrap();
        let doc: Value = serde_json::from_str(direct.lines().next().unwrap()).unwrap();
        let attrs = &doc["requests"][0]["devices"][0]["attributes"];
        assert_eq!(attrs["mdevUUID"], json!({"string": "M"}), "KubeVirt looks up mdevUUID as is");
        assert_eq!(attrs["other.example.com/x"], json!({"int": 1}));
        assert!(attrs.get("gpu.example.com/mdevUUID").is_none());
    }

    #[test]
    fn consumed_capacity_stays_out_of_the_standard_view() {
        // The KEP-5304 schema has no capacities: the upstream decoder sees exactly its fields.
        let text = TEXT.replace("device: g0}", "device: g0, shareID: s1, consumedCapacity: {memory: 20Gi}}");
        let res = resolved(&text);
        assert!(!res.claims[0].devices[0].consumed.is_empty(), "the fixture consumes capacity");
        let tree = build(&res, &mut Generations::default(), &mut vec![]);
        let direct =
            std::str::from_utf8(tree.get("resourceclaims/direct/pgpu/gpu.example.com-metadata.json").unwrap()).unwrap();
        for line in direct.lines() {
            let doc: Value = serde_json::from_str(line).unwrap();
            let device = doc["requests"][0]["devices"][0].as_object().unwrap();
            let keys: Vec<&str> = device.keys().map(String::as_str).collect();
            assert_eq!(keys, vec!["driver", "pool", "name", "attributes"], "{line}");
        }
    }

    #[test]
    fn driver_data_members_stay_out_of_the_standard_view() {
        // The schema has no field for a driver's status data: the view is the same with or without it.
        let with_data = TEXT.replace(
            "device: g0}]}}}",
            r#"device: g0}]}}, devices: [{driver: gpu.example.com, pool: n, device: g0, data: {"uuid": "MIG-1", "gpu": {"index": 0}}}]}"#,
        );
        assert_ne!(with_data, TEXT);
        let res = resolved(&with_data);
        let status = res.claims[0].devices[0].status.as_ref().expect("the fixture has device status");
        assert_eq!(status.data_members.len(), 2, "{:?}", status.data_members);
        let (mut warnings, mut plain_warnings) = (vec![], vec![]);
        let view = build(&res, &mut Generations::default(), &mut warnings);
        let plain = build(&example(), &mut Generations::default(), &mut plain_warnings);
        assert!(warnings.is_empty() && plain_warnings.is_empty(), "{warnings:?} {plain_warnings:?}");
        assert_eq!(view, plain);
    }
}
