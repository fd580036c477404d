//! One container's share of the pod's resolution: the claims in its
//! `resources.claims` (each whole, or the one request it names) and the
//! devices of its own extended resources. The node agent mounts each
//! container its own tree, which is what its CDI devices say it got; the pod
//! volumes cannot do this (one volume shows every container every device).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{ClaimOrigin, Missing, Resolution};

/// What one container of the pod asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerClaims {
    pub container: String,
    /// By pod claim: the requests it names (None: the whole claim).
    pub claims: BTreeMap<String, Option<BTreeSet<String>>>,
    /// It asked for extended resources (its limits name resources a
    /// DeviceClass may back): the devices the scheduler mapped to it.
    pub extended: bool,
}

impl ContainerClaims {
    /// Container `name` of `pod` (an init container or an app container), or
    /// None when the pod has no such container.
    pub fn of(pod: &Pod, name: &str) -> Option<ContainerClaims> {
        let spec = pod.spec.as_ref()?;
        let container: &Container =
            spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name)?;
        let mut claims: BTreeMap<String, Option<BTreeSet<String>>> = BTreeMap::new();
        let resources = container.resources.as_ref();
        for claim in resources.and_then(|r| r.claims.as_ref()).into_iter().flatten() {
            let entry = claims.entry(claim.name.clone()).or_insert_with(|| Some(BTreeSet::new()));
            match (&claim.request, entry) {
                // A request named: that one, beside any other it names.
                (Some(request), Some(requests)) if !request.is_empty() => {
                    requests.insert(request.clone());
                }
                // The whole claim, whatever else it named.
                (_, entry) => *entry = None,
            }
        }
        let extended = extended_mapped_to(pod, name);
        Some(ContainerClaims { container: name.to_string(), claims, extended })
    }

    /// It asked for no device at all: it gets no tree.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty() && !self.extended
    }

    fn sees(&self, origin: ClaimOrigin, pod_claim: &str, request: &str) -> bool {
        if origin == ClaimOrigin::ExtendedResource {
            // An extended resource's devices sit under the container that asked for them.
            return self.extended && request == self.container;
        }
        match self.claims.get(pod_claim) {
            Some(None) => true,
            Some(Some(requests)) => requests.contains(request),
            None => false,
        }
    }

    /// Whether a tree path (`<claim>/<request>/...`, an extended
    /// resource's `<domain>/<name>/<container>/...`) lies in what it sees.
    pub fn sees_path(&self, path: &str) -> bool {
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            [claim, request, ..] if self.claims.contains_key(*claim) => self.sees(ClaimOrigin::Named, claim, request),
            [_, _, container, ..] => self.extended && *container == self.container,
            _ => false,
        }
    }

    fn sees_claim(&self, origin: ClaimOrigin, pod_claim: &str) -> bool {
        match origin {
            ClaimOrigin::ExtendedResource => self.extended,
            _ => self.claims.contains_key(pod_claim),
        }
    }
}

/// Whether the scheduler mapped an extended resource to container `name`
/// (the pod's `status.extendedResourceClaimStatus.requestMappings`).
fn extended_mapped_to(pod: &Pod, name: &str) -> bool {
    let status = pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref());
    status.is_some_and(|s| s.request_mappings.iter().any(|m| m.container_name == name))
}

/// `res` as `container` sees it: its claims and requests only, and only what
/// is missing of them (or of the pod as a whole).
pub fn for_container(res: &Resolution, container: &ContainerClaims) -> Resolution {
    let origin_of: BTreeMap<&str, ClaimOrigin> = res.claims.iter().map(|c| (c.pod_claim.as_str(), c.origin)).collect();
    let claims = res
        .claims
        .iter()
        .filter(|c| container.sees_claim(c.origin, &c.pod_claim))
        .map(|c| {
            let mut c = c.clone();
            c.devices.retain(|d| container.sees(c.origin, &c.pod_claim, &d.request));
            c
        })
        .collect();
    // What is missing of a claim the container does not use is not its to wait for.
    let claim_seen = |pod_claim: &str| match origin_of.get(pod_claim) {
        Some(origin) => container.sees_claim(*origin, pod_claim),
        // Not resolved at all yet (not generated, not found): the pod's claim by its name.
        None => container.claims.contains_key(pod_claim) || (container.extended && pod_claim.contains('/')),
    };
    let missing = res
        .missing
        .iter()
        .filter(|m| match m {
            Missing::NotScheduled | Missing::Invalid { .. } => true,
            Missing::UnknownClaim { name, .. } => container.claims.contains_key(name),
            Missing::UnknownExtendedResource { .. } => container.extended,
            Missing::ClaimStatusPending { pod_claim, .. }
            | Missing::ClaimNotFound { pod_claim, .. }
            | Missing::ClaimNotAllocated { pod_claim, .. } => claim_seen(pod_claim),
            Missing::Device { pod_claim, request, .. } => {
                let origin = origin_of.get(pod_claim.as_str()).copied().unwrap_or(ClaimOrigin::Named);
                container.sees(origin, pod_claim, request)
            }
        })
        .cloned()
        .collect();
    Resolution { pod: res.pod.clone(), claims, missing, warnings: res.warnings.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::objects::FileObjects;
    use crate::model::resolve::{Selection, resolve};
    use drafs_test_support::{Build, ClaimBuilder, PodBuilder, SliceBuilder};
    use serde_json::{Value, json};

    /// Pod ns/p: claim `gpus` (requests `train` and `infer`, one GPU each),
    /// claim `nic`; container `trainer` uses gpus/train, `server` gpus/infer
    /// and the nic, `all` the whole of gpus, `sidecar` nothing.
    fn pod() -> Value {
        PodBuilder::new("ns", "p")
            .uid("u1")
            .node("n1")
            .claim("gpus", "gpus")
            .claim("nic", "nic")
            .container("trainer", "i")
            .uses_request("gpus", "train")
            .container("server", "i")
            .uses_request("gpus", "infer")
            .uses("nic")
            .container("all", "i")
            .uses("gpus")
            .container("sidecar", "i")
            .build()
    }

    fn resolution(nic_allocated: bool) -> (Value, Resolution) {
        let gpus = ClaimBuilder::new("ns", "gpus").allocated().result("train", "gpu.example.com", "n1", "g0").result(
            "infer",
            "gpu.example.com",
            "n1",
            "g1",
        );
        let nic = ClaimBuilder::new("ns", "nic");
        let nic = if nic_allocated { nic.allocated().result("rdma", "net.example.com", "n1", "nic-0") } else { nic };
        let slice = SliceBuilder::new("s", "gpu.example.com", "n1")
            .node("n1")
            .device("g0", json!({"uuid": {"string": "G0"}}))
            .device("g1", json!({"uuid": {"string": "G1"}}));
        let nics = SliceBuilder::new("n", "net.example.com", "n1").node("n1").device("nic-0", json!({}));
        let objects = [pod(), gpus.build(), nic.build(), slice.build(), nics.build()];
        let text: Vec<String> = objects.iter().map(Value::to_string).collect();
        let snapshot = FileObjects::parse("t", &text.join("\n---\n")).unwrap().into_snapshot("t", None).unwrap();
        (objects[0].clone(), resolve(&snapshot, &Selection::default()))
    }

    fn pod_of(v: &Value) -> Pod {
        serde_json::from_value(v.clone()).unwrap()
    }

    /// (pod claim, request, device) of each device the container sees.
    fn seen(res: &Resolution) -> Vec<(String, String, String)> {
        let devices = res.claims.iter().flat_map(|c| c.devices.iter().map(move |d| (c, d)));
        devices.map(|(c, d)| (c.pod_claim.clone(), d.request.clone(), d.device.clone())).collect()
    }

    #[test]
    fn each_container_sees_the_claims_and_requests_it_names_and_nothing_else() {
        let (pod, res) = resolution(true);
        assert!(res.is_complete(), "{:?}", res.missing);
        let pod = pod_of(&pod);
        let view = |name: &str| for_container(&res, &ContainerClaims::of(&pod, name).unwrap());
        let own = |c: &str, r: &str, d: &str| (c.to_string(), r.to_string(), d.to_string());
        assert_eq!(seen(&view("trainer")), [own("gpus", "train", "g0")]);
        assert_eq!(seen(&view("server")), [own("gpus", "infer", "g1"), own("nic", "rdma", "nic-0")]);
        assert_eq!(seen(&view("all")), [own("gpus", "train", "g0"), own("gpus", "infer", "g1")]);
        let sidecar = ContainerClaims::of(&pod, "sidecar").unwrap();
        assert!(sidecar.is_empty(), "no claim: no tree");
        assert!(ContainerClaims::of(&pod, "nobody").is_none());
    }

    #[test]
    fn a_container_waits_only_for_what_it_uses() {
        let (pod, res) = resolution(false);
        assert!(!res.is_complete(), "the nic is not allocated");
        let pod = pod_of(&pod);
        let view = |name: &str| for_container(&res, &ContainerClaims::of(&pod, name).unwrap());
        assert!(view("trainer").is_complete(), "{:?}", view("trainer").missing);
        let server = view("server");
        assert_eq!(server.missing.len(), 1, "{:?}", server.missing);
        assert!(server.missing[0].to_string().contains("ResourceClaim nic is not allocated"), "{:?}", server.missing);
    }

    #[test]
    fn a_container_that_names_a_claim_whole_and_by_request_sees_it_whole() {
        let pod = PodBuilder::new("ns", "p")
            .claim("gpus", "gpus")
            .container("c", "i")
            .uses_request("gpus", "train")
            .uses("gpus")
            .build();
        let claims = ContainerClaims::of(&pod_of(&pod), "c").unwrap();
        assert_eq!(claims.claims.get("gpus"), Some(&None));
    }
}
