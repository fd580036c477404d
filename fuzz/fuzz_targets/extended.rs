//! Any pod status the scheduler could write: reading the extended resources'
//! claim never panics, and every mapping kept can be served: a resource name
//! that is a clean two-component path, container and request names that are
//! DNS labels, a container the pod has, no mapping twice; each mapping is
//! either kept or skipped with a warning.
#![no_main]

use std::collections::BTreeSet;

use drafs::model::extended::{is_extended_resource, is_servable_resource, of_pod, requested};
use drafs::model::names::{is_dns_label, is_dns_subdomain};
use drafs::model::tree::is_clean_relative;
use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(pod) = serde_json::from_slice::<Pod>(data) else { return };
    for name in requested(&pod) {
        assert!(is_extended_resource(&name), "{name:?} is not an extended resource");
    }
    let mut warnings = Vec::new();
    let status = pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref());
    let claim = match of_pod(&pod, &mut warnings) {
        None => {
            assert!(status.is_none(), "a status with extendedResourceClaimStatus read as none");
            return;
        }
        Some(Err(_)) => {
            let name = &status.expect("an error is about a status").resource_claim_name;
            assert!(name.is_empty() || !is_dns_subdomain(name), "claim name {name:?} refused");
            return;
        }
        Some(Ok(claim)) => claim,
    };
    let status = status.expect("a claim comes from a status");
    assert_eq!(claim.claim_name, status.resource_claim_name);
    assert!(!claim.claim_name.is_empty() && is_dns_subdomain(&claim.claim_name), "{:?}", claim.claim_name);
    assert_eq!(claim.requests.len() + warnings.len(), status.request_mappings.len(), "{warnings:?}");
    let containers: BTreeSet<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .map(|c| c.name.as_str())
        .collect();
    let mut seen = BTreeSet::new();
    for r in &claim.requests {
        assert!(is_servable_resource(&r.resource), "resource {:?} kept", r.resource);
        assert!(is_clean_relative(&r.resource) && r.resource.split('/').count() == 2, "{:?}", r.resource);
        assert!(is_dns_label(&r.container), "container {:?} kept", r.container);
        assert!(is_dns_label(&r.request), "request {:?} kept", r.request);
        assert!(containers.contains(r.container.as_str()), "the pod has no container {:?}", r.container);
        assert!(seen.insert((&r.container, &r.resource, &r.request)), "{r:?} twice");
    }
});
