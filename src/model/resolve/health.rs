//! Each resolved device's health, from the reports the kubelet wrote in the
//! pod's status (`model::health`): by `<driver>/<pool>/<device>` exactly,
//! else by claim and request (see there).

use k8s_openapi::api::core::v1::Pod;

use crate::model::health::{Report, reports, worse};
use crate::model::resolve::ResolvedClaim;

/// Give each device of `claims` the health the pod's status reports for it;
/// a device nothing reports on keeps `None` (no `.health` file).
pub fn attach(pod: &Pod, claims: &mut [ResolvedClaim]) {
    let reports = reports(pod);
    if reports.is_empty() {
        return;
    }
    for claim in claims.iter_mut() {
        let ids: Vec<String> = claim.devices.iter().map(|d| format!("{}/{}/{}", d.driver, d.pool, d.device)).collect();
        let mine: Vec<&Report> = reports.iter().filter(|r| r.pod_claim == claim.pod_claim).collect();
        for (device, id) in claim.devices.iter_mut().zip(&ids) {
            let covering = || mine.iter().filter(|r| r.request.as_deref().is_none_or(|q| q == device.request));
            let exact = covering().filter(|r| r.resource_id == *id).fold(None, |h, r| worse(h, &r.health));
            // Reports that name no device of the claim (CDI ids) are about every
            // device they cover: exact for a request of one device, the worst
            // for a request of several.
            device.health = exact.or_else(|| {
                covering().filter(|r| !ids.contains(&r.resource_id)).fold(None, |h, r| worse(h, &r.health))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drafs_test_support::{Build, PodBuilder};
    use serde_json::json;

    /// Pod `p` with these containers' device health reports (`allocatedResourcesStatus`).
    fn pod(containers: &[(&str, serde_json::Value)]) -> Pod {
        let p = PodBuilder::new("ns", "p");
        containers.iter().fold(p, |p, (name, reports)| p.container_status(name, reports.clone())).decode()
    }

    fn device(request: &str, index: usize, name: &str) -> crate::model::resolve::ResolvedDevice {
        crate::model::resolve::ResolvedDevice {
            request: request.into(),
            full_request: request.into(),
            index,
            driver: "gpu.example.com".into(),
            pool: "node-1".into(),
            device: name.into(),
            share_id: None,
            attributes: Default::default(),
            capacity: Default::default(),
            consumed: Default::default(),
            status: None,
            health: None,
            admin_access: false,
            taints: Vec::new(),
        }
    }

    fn claim(devices: Vec<crate::model::resolve::ResolvedDevice>) -> ResolvedClaim {
        ResolvedClaim {
            pod_claim: "gpu".into(),
            claim_name: "gpu-abc".into(),
            namespace: "ns".into(),
            uid: "u".into(),
            generation: 1,
            origin: crate::model::resolve::ClaimOrigin::Template,
            devices,
        }
    }

    fn states(c: &ResolvedClaim) -> Vec<Option<&str>> {
        c.devices.iter().map(|d| d.health.as_ref().map(|h| h.state.as_str())).collect()
    }

    #[test]
    fn a_driver_pool_device_id_names_its_device_exactly() {
        let p = pod(&[(
            "app",
            json!([{"name": "claim:gpu/gpu", "resources": [
            {"resourceID": "gpu.example.com/node-1/gpu-1", "health": "Healthy"},
            {"resourceID": "gpu.example.com/node-1/gpu-2", "health": "Unhealthy", "message": "XID 79"}]}]),
        )]);
        let mut claims = [claim(vec![device("gpu", 0, "gpu-1"), device("gpu", 1, "gpu-2"), device("nic", 0, "nic-1")])];
        attach(&p, &mut claims);
        assert_eq!(states(&claims[0]), [Some("Healthy"), Some("Unhealthy"), None]);
        assert_eq!(claims[0].devices[1].health.as_ref().unwrap().message.as_deref(), Some("XID 79"));
    }

    #[test]
    fn a_cdi_id_is_about_every_device_it_covers_and_several_get_the_worst() {
        // One device in the request: the CDI id can only be about it.
        let p = pod(&[(
            "app",
            json!([{"name": "claim:gpu/gpu", "resources": [
            {"resourceID": "gpu.example.com/test=claim-u-gpu", "health": "Unhealthy"}]}]),
        )]);
        let mut claims = [claim(vec![device("gpu", 0, "gpu-1"), device("nic", 0, "nic-1")])];
        attach(&p, &mut claims);
        assert_eq!(states(&claims[0]), [Some("Unhealthy"), None]);
        // Two devices, two CDI ids, one unhealthy: which one cannot be told, so both.
        let p = pod(&[(
            "app",
            json!([{"name": "claim:gpu", "resources": [
            {"resourceID": "vendor/gpu=a", "health": "Healthy"},
            {"resourceID": "vendor/gpu=b", "health": "Unhealthy"}]}]),
        )]);
        let mut claims = [claim(vec![device("gpu", 0, "gpu-1"), device("gpu", 1, "gpu-2")])];
        attach(&p, &mut claims);
        assert_eq!(states(&claims[0]), [Some("Unhealthy"), Some("Unhealthy")]);
    }

    #[test]
    fn containers_that_disagree_give_the_worst_and_other_claims_are_untouched() {
        let p = pod(&[
            (
                "a",
                json!([{"name": "claim:gpu", "resources": [
                {"resourceID": "gpu.example.com/node-1/gpu-1", "health": "Healthy"}]}]),
            ),
            (
                "b",
                json!([{"name": "claim:gpu", "resources": [
                {"resourceID": "gpu.example.com/node-1/gpu-1", "health": "Unknown"}]},
                {"name": "claim:other", "resources": [
                {"resourceID": "gpu.example.com/node-1/gpu-1", "health": "Unhealthy"}]}]),
            ),
        ]);
        let mut claims = [claim(vec![device("gpu", 0, "gpu-1")])];
        attach(&p, &mut claims);
        assert_eq!(states(&claims[0]), [Some("Unknown")]);
        // No report at all: no health.
        let mut claims = [claim(vec![device("gpu", 0, "gpu-1")])];
        attach(&pod(&[]), &mut claims);
        assert_eq!(states(&claims[0]), [None]);
    }
}
