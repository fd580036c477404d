//! Extended resources backed by DRA (KEP-5004, GA in Kubernetes 1.37).
//!
//! A container asks `resources.limits: {gpu.example.com/gpu: 1}`; when a
//! DeviceClass names that resource in `spec.extendedResourceName` (or the name
//! is the implicit `deviceclass.resource.kubernetes.io/<class>`), the scheduler
//! creates one ResourceClaim for the pod and records it in
//! `pod.status.extendedResourceClaimStatus`: the claim's generated name and,
//! for each container and resource, the claim's request that holds its
//! devices. The app knows neither the claim's name nor the request's; it knows
//! its own container's name and the resource it asked for, so the tree puts
//! those devices at `<resource>/<container>/<index>/` (the resource name is
//! `<domain>/<name>`, two path components; a domain usually has a dot and a
//! pod claim name never does, and a dotless domain that is a pod claim's name
//! is refused, so the two kinds of entries do not meet).
//!
//! The scheduler lets a container use devices an init container had before
//! it (kube-scheduler v1.37 `createResourceRequestAndMappings`): a container
//! may map to several requests (its devices are theirs, in order) and a
//! request to several containers (each lists its devices).
//!
//! Pure: the pod in, the mappings (with a warning for each one that cannot be
//! served) out.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::model::names::{is_dns_label, is_dns_subdomain, quoted};

/// The prefix of the names the scheduler gives every DeviceClass implicitly.
pub const IMPLICIT_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// Whether a container resource name is an extended resource, which a device
/// plugin or (KEP-5004) a DRA DeviceClass may back: not `cpu`, `memory`,
/// `hugepages-*` or anything else without a domain, nor `kubernetes.io/...`.
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests.")
}

/// Whether an extended resource name can be a path in the tree:
/// `<DNS subdomain>/<name>`, the name 1 to 253 of `A-Z a-z 0-9 - _ .`, starting
/// and ending with a letter or digit (so never `.` or `..`).
pub fn is_servable_resource(name: &str) -> bool {
    let Some((domain, rest)) = name.split_once('/') else { return false };
    let bytes = rest.as_bytes();
    is_dns_subdomain(domain)
        && !domain.is_empty()
        && !bytes.is_empty()
        && bytes.len() <= 253
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// The extended resources a container asks for (limits and requests).
fn container_asks(c: &Container) -> impl Iterator<Item = &str> {
    let resources = c.resources.as_ref();
    let limits = resources.and_then(|r| r.limits.as_ref()).into_iter().flat_map(|m| m.keys());
    let requests = resources.and_then(|r| r.requests.as_ref()).into_iter().flat_map(|m| m.keys());
    limits.chain(requests).map(String::as_str).filter(|n| is_extended_resource(n))
}

/// Every extended resource the pod's init and app containers ask for, sorted.
pub fn requested(pod: &Pod) -> BTreeSet<String> {
    let Some(spec) = &pod.spec else { return BTreeSet::new() };
    let init = spec.init_containers.iter().flatten();
    init.chain(&spec.containers).flat_map(container_asks).map(str::to_string).collect()
}

/// One container's extended resource and a claim request that holds (some of) its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtendedRequest {
    pub container: String,
    pub resource: String,
    /// The request's name in the generated claim (`container-1-request-0`).
    pub request: String,
}

/// The pod's generated claim for its extended resources, as its status says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtendedClaim {
    pub claim_name: String,
    /// Valid mappings only, in the status's order.
    pub requests: Vec<ExtendedRequest>,
}

impl ExtendedClaim {
    /// The resource names served, sorted.
    pub fn resources(&self) -> BTreeSet<&str> {
        self.requests.iter().map(|r| r.resource.as_str()).collect()
    }
}

/// The pod's `status.extendedResourceClaimStatus`, each mapping checked: a
/// container the pod does not have, a name that cannot be a path, or a
/// repeated mapping is skipped with a warning. `Err`: the claim's name is not
/// a ResourceClaim name.
pub fn of_pod(pod: &Pod, warnings: &mut Vec<String>) -> Option<Result<ExtendedClaim, String>> {
    let status = pod.status.as_ref()?.extended_resource_claim_status.as_ref()?;
    let claim_name = status.resource_claim_name.clone();
    if claim_name.is_empty() || !is_dns_subdomain(&claim_name) {
        return Some(Err(format!(
            "status.extendedResourceClaimStatus.resourceClaimName {} is not a ResourceClaim name",
            quoted(&claim_name)
        )));
    }
    let spec = pod.spec.as_ref();
    let containers: BTreeSet<&str> = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .map(|c| c.name.as_str())
        .collect();
    // A pod claim's directory is `<claim>/`: a domain without a dot may be the same name.
    let pod_claims: BTreeSet<&str> =
        spec.into_iter().flat_map(|s| s.resource_claims.iter().flatten()).map(|c| c.name.as_str()).collect();
    let mut requests: Vec<ExtendedRequest> = Vec::new();
    for m in &status.request_mappings {
        let what = format!(
            "extended resource {} of container {} (request {} of ResourceClaim {claim_name})",
            quoted(&m.resource_name),
            quoted(&m.container_name),
            quoted(&m.request_name),
        );
        let problem = if !is_servable_resource(&m.resource_name) {
            Some("the resource name cannot be a path (DOMAIN/NAME)")
        } else if m.resource_name.split_once('/').is_some_and(|(domain, _)| pod_claims.contains(domain)) {
            Some("its domain is the name of a pod claim, whose directory it would share")
        } else if !is_dns_label(&m.container_name) {
            Some("the container name is not a DNS label")
        } else if !containers.contains(m.container_name.as_str()) {
            Some("the pod has no such container")
        } else if !is_dns_label(&m.request_name) {
            Some("the request name is not a DNS label")
        } else if requests
            .iter()
            .any(|r| r.container == m.container_name && r.resource == m.resource_name && r.request == m.request_name)
        {
            Some("the same mapping twice")
        } else {
            None
        };
        match problem {
            Some(problem) => warnings.push(format!("{what} skipped: {problem}")),
            None => requests.push(ExtendedRequest {
                container: m.container_name.clone(),
                resource: m.resource_name.clone(),
                request: m.request_name.clone(),
            }),
        }
    }
    Some(Ok(ExtendedClaim { claim_name, requests }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use drafs_test_support::{Build, PodBuilder};
    use serde_json::json;

    /// Pod `p` whose containers ask for extended and native resources.
    fn asking() -> PodBuilder {
        PodBuilder::new("ns", "p")
            .init_container("setup", "i")
            .limits(json!({"gpu.example.com/gpu": "1"}))
            .container("app", "i")
            .limits(json!({"gpu.example.com/gpu": "1", "cpu": "1", "nvidia.com/gpu": "1"}))
            .container("side", "i")
            .requests(json!({"deviceclass.resource.kubernetes.io/gpu.example.com": "2", "hugepages-2Mi": "1Gi", "kubernetes.io/x": "1"}))
    }

    /// [`asking`], with the scheduler's claim for its extended resources.
    fn pod(extended: serde_json::Value) -> Pod {
        asking().extended_status(extended).decode()
    }

    #[test]
    fn extended_resources_are_those_with_a_domain_outside_kubernetes_io() {
        let p: Pod = asking().decode();
        let names: Vec<String> = requested(&p).into_iter().collect();
        assert_eq!(
            names,
            vec!["deviceclass.resource.kubernetes.io/gpu.example.com", "gpu.example.com/gpu", "nvidia.com/gpu"]
        );
        for native in ["cpu", "memory", "hugepages-1Gi", "kubernetes.io/batch", "requests.example.com/x"] {
            assert!(!is_extended_resource(native), "{native}");
        }
    }

    #[test]
    fn servable_names_are_two_safe_components() {
        for good in ["gpu.example.com/gpu", "deviceclass.resource.kubernetes.io/gpu.example.com", "foo/Bar_1"] {
            assert!(is_servable_resource(good), "{good}");
        }
        for bad in ["gpu", "a/b/c", "x.io/..", "x.io/.", "x.io/", "/gpu", "X.io/gpu", "x.io/-a", "x.io/a b", "x.io/a\0"]
        {
            assert!(!is_servable_resource(bad), "{bad:?}");
        }
    }

    #[test]
    fn mappings_are_checked_one_by_one() {
        let p = pod(json!({
        "resourceClaimName": "p-extended-resources-abcde",
        "requestMappings": [
            {"containerName": "setup", "resourceName": "gpu.example.com/gpu", "requestName": "container-0-request-0"},
            {"containerName": "app", "resourceName": "gpu.example.com/gpu", "requestName": "container-1-request-0"},
            {"containerName": "ghost", "resourceName": "gpu.example.com/gpu", "requestName": "container-9-request-0"},
            {"containerName": "app", "resourceName": "../../etc", "requestName": "container-1-request-1"},
            {"containerName": "app", "resourceName": "x.io/a", "requestName": "../x"},
            {"containerName": "app", "resourceName": "gpu.example.com/gpu", "requestName": "container-1-request-0"},
            // The scheduler's reuse: app uses setup's device first, then one of its own.
            {"containerName": "app", "resourceName": "gpu.example.com/gpu", "requestName": "container-0-request-0"},
        ]}));
        let mut warnings = Vec::new();
        let claim = of_pod(&p, &mut warnings).unwrap().unwrap();
        assert_eq!(claim.claim_name, "p-extended-resources-abcde");
        let kept: Vec<(&str, &str)> =
            claim.requests.iter().map(|r| (r.container.as_str(), r.request.as_str())).collect();
        assert_eq!(
            kept,
            vec![
                ("setup", "container-0-request-0"),
                ("app", "container-1-request-0"),
                ("app", "container-0-request-0")
            ]
        );
        assert_eq!(warnings.len(), 4, "{warnings:#?}");
        for expected in ["no such container", "cannot be a path", "not a DNS label", "same mapping twice"] {
            assert!(warnings.iter().any(|w| w.contains(expected)), "{expected}: {warnings:#?}");
        }
    }

    /// `example/gpu` (Kubernetes accepts a domain without a dot) would share
    /// `example/` with the pod claim `example`: refused, with a warning.
    #[test]
    fn a_dotless_domain_that_is_a_pod_claims_name_is_refused() {
        let extended = json!({
        "resourceClaimName": "p-extended-resources-abcde",
        "requestMappings": [
            {"containerName": "app", "resourceName": "example/gpu", "requestName": "container-1-request-0"},
            {"containerName": "app", "resourceName": "other/gpu", "requestName": "container-1-request-1"},
        ]});
        let p: Pod = asking().claim("example", "c").extended_status(extended).decode();
        let mut warnings = Vec::new();
        let claim = of_pod(&p, &mut warnings).unwrap().unwrap();
        assert_eq!(claim.resources().into_iter().collect::<Vec<_>>(), ["other/gpu"]);
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        assert!(warnings[0].contains("\"example/gpu\"") && warnings[0].contains("pod claim"), "{}", warnings[0]);
    }

    #[test]
    fn a_claim_name_that_is_not_a_name_is_an_error_and_no_status_is_none() {
        let p = pod(json!({"resourceClaimName": "../x", "requestMappings": []}));
        assert!(of_pod(&p, &mut Vec::new()).unwrap().is_err());
        assert!(of_pod(&asking().phase("Running").decode(), &mut Vec::new()).is_none());
    }
}
