//! What a run keeps of the Pods and ResourceClaims it watches: only the fields
//! resolution reads.
//!
//! A tenant writes its pod's annotations, its containers' commands and
//! environment, and its claims' driver configuration; the API server accepts
//! hundreds of KiB of each. A run holds its objects for its whole life, and in
//! node mode one agent holds every pod's, so keeping those fields would let one
//! tenant's object size become the agent's memory. Managed fields are dropped
//! for the same reason. What is kept: names, uid, version and generation; the
//! pod's node, claims, and each container's name and resources; the claim
//! statuses and the DRA health in the container statuses; a claim's allocation
//! results and device statuses.

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, PodStatus};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceAllocationResult, ResourceClaim, ResourceClaimStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The identity of an object, nothing of what its owner may write freely.
fn meta(m: ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        ..ObjectMeta::default()
    }
}

/// A container's name and resources: what extended resources it asks for.
fn container(c: Container) -> Container {
    Container { name: c.name, resources: c.resources, ..Container::default() }
}

/// A container's name and its DRA health reports.
fn container_status(s: ContainerStatus) -> ContainerStatus {
    ContainerStatus {
        name: s.name,
        allocated_resources_status: s.allocated_resources_status,
        ..ContainerStatus::default()
    }
}

/// The pod, with only what resolution and health read.
pub fn pod(pod: Pod) -> Pod {
    let spec = pod.spec.map(|s| PodSpec {
        node_name: s.node_name,
        resource_claims: s.resource_claims,
        containers: s.containers.into_iter().map(container).collect(),
        init_containers: s.init_containers.map(|cs| cs.into_iter().map(container).collect()),
        ..PodSpec::default()
    });
    let statuses = |list: Option<Vec<ContainerStatus>>| list.map(|l| l.into_iter().map(container_status).collect());
    let status = pod.status.map(|s| PodStatus {
        resource_claim_statuses: s.resource_claim_statuses,
        extended_resource_claim_status: s.extended_resource_claim_status,
        container_statuses: statuses(s.container_statuses),
        init_container_statuses: statuses(s.init_container_statuses),
        ephemeral_container_statuses: statuses(s.ephemeral_container_statuses),
        ..PodStatus::default()
    });
    Pod { metadata: meta(pod.metadata), spec, status }
}

/// The claim, with only its allocation results and device statuses: not its
/// spec (requests, selectors, configuration) nor the allocation's copy of
/// that configuration.
pub fn claim(claim: ResourceClaim) -> ResourceClaim {
    let status = claim.status.map(|s| ResourceClaimStatus {
        allocation: s.allocation.map(|a| AllocationResult {
            devices: a.devices.map(|d| DeviceAllocationResult { results: d.results, config: None }),
            allocation_timestamp: a.allocation_timestamp,
            node_selector: None,
        }),
        devices: s.devices,
        reserved_for: None,
    });
    ResourceClaim { metadata: meta(claim.metadata), spec: Default::default(), status }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::objects::FileObjects;
    use crate::model::resolve::{Selection, resolve};

    /// Every example resolves to the same tree from what is retained as from the whole objects.
    #[test]
    fn resolution_reads_nothing_that_is_dropped() {
        let mut seen = 0;
        for entry in std::fs::read_dir("examples/offline").unwrap() {
            let path = entry.unwrap().path();
            let path = path.to_str().unwrap();
            let text = std::fs::read_to_string(path).unwrap();
            let whole = FileObjects::parse(path, &text).unwrap().into_snapshot(path, None).unwrap();
            let mut kept = whole.clone();
            kept.pod = kept.pod.map(pod);
            kept.claims = kept.claims.into_iter().map(|(n, c)| (n, claim(c))).collect();
            let all = Selection::default();
            assert_eq!(format!("{:?}", resolve(&whole, &all)), format!("{:?}", resolve(&kept, &all)), "{path}");
            seen += 1;
        }
        assert!(seen >= 5, "only {seen} examples found");
    }

    #[test]
    fn what_a_tenant_writes_freely_is_not_kept() {
        let big = "x".repeat(256 * 1024);
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                "annotations": {"a": big}, "labels": {"l": "v"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i", "command": [big],
                "env": [{"name": "E", "value": big}], "resources": {"limits": {"example.com/gpu": "1"}}}]},
            "status": {"phase": "Running", "message": big,
                "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                    "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [{"resourceID": "d", "health": "Healthy"}]}]}]}
        }))
        .unwrap();
        let kept = pod(p);
        let text = serde_json::to_string(&kept).unwrap();
        assert!(text.len() < 1024, "kept {} bytes: {text}", text.len());
        assert_eq!(kept.metadata.uid.as_deref(), Some("u"));
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("7"));
        let spec = kept.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n"));
        assert!(
            spec.containers[0].resources.as_ref().unwrap().limits.as_ref().unwrap().contains_key("example.com/gpu")
        );
        let statuses = kept.status.unwrap().container_statuses.unwrap();
        assert_eq!(statuses[0].allocated_resources_status.as_ref().unwrap()[0].name, "claim:gpu");

        let c: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u", "generation": 2, "annotations": {"a": big}},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "g"}}],
                "config": [{"opaque": {"driver": "d.example.com", "parameters": {"p": big}}}]}},
            "status": {"allocation": {"devices": {
                "results": [{"request": "r", "driver": "d.example.com", "pool": "p", "device": "x"}],
                "config": [{"source": "FromClaim", "opaque": {"driver": "d.example.com", "parameters": {"p": big}}}]}}}
        }))
        .unwrap();
        let kept = claim(c);
        let text = serde_json::to_string(&kept).unwrap();
        assert!(text.len() < 1024, "kept {} bytes: {text}", text.len());
        assert_eq!(kept.metadata.generation, Some(2));
        let results = kept.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap();
        assert_eq!(results[0].device, "x");
    }
}
