//! Device health as the kubelet reports it in the pod's status (KEP-4680).
//!
//! A driver that monitors its hardware tells the kubelet (DRAResourceHealth
//! gRPC); the kubelet writes what it knows into every container status that
//! uses the claim: `allocatedResourcesStatus[{name: "claim:<pod claim>[/<request>]",
//! resources: [{resourceID, health, message}]}]`. The resource id is the
//! device's first CDI device id when the driver gave it one, else
//! `<driver>/<pool>/<device>`, so a report names a device exactly only in the
//! second form. The rest is matched by claim and request: when a request has
//! one device that is exact too; when it has several, each gets the worst
//! health reported for the request (a probe then fails rather than let work go
//! to a broken device). Pure: the pod in, each device's health out.

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::model::resolve::ResolvedClaim;

/// The health of one device, as the kubelet reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub state: HealthState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `Healthy`, `Unhealthy` or `Unknown`, ordered from best to worst for a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum HealthState {
    Healthy,
    Unknown,
    Unhealthy,
}

/// Read back from a record by the kubelet's rule: a state this drafs does
/// not know is `Unknown`.
impl<'de> Deserialize<'de> for HealthState {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(|state| HealthState::parse(Some(&state)))
    }
}

impl HealthState {
    pub const ALL: [HealthState; 3] = [HealthState::Healthy, HealthState::Unhealthy, HealthState::Unknown];

    /// The kubelet's value; anything else (a newer kubelet's state, a typo) is `Unknown`.
    fn parse(value: Option<&str>) -> HealthState {
        match value {
            Some("Healthy") => HealthState::Healthy,
            Some("Unhealthy") => HealthState::Unhealthy,
            _ => HealthState::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "Healthy",
            HealthState::Unknown => "Unknown",
            HealthState::Unhealthy => "Unhealthy",
        }
    }
}

impl std::fmt::Display for HealthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One resource of one `allocatedResourcesStatus` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Report {
    pod_claim: String,
    /// None: the container uses the whole claim.
    request: Option<String>,
    resource_id: String,
    health: Health,
}

/// Every DRA health report in the pod's container statuses (app, init and
/// ephemeral containers alike).
fn reports(pod: &Pod) -> Vec<Report> {
    let Some(status) = &pod.status else { return Vec::new() };
    let containers =
        [&status.container_statuses, &status.init_container_statuses, &status.ephemeral_container_statuses];
    let mut out = Vec::new();
    for container in containers.into_iter().flatten().flatten() {
        for entry in container.allocated_resources_status.iter().flatten() {
            let Some(claim) = entry.name.strip_prefix("claim:") else { continue };
            let (pod_claim, request) = match claim.split_once('/') {
                Some((c, r)) => (c, Some(r.to_string())),
                None => (claim, None),
            };
            for resource in entry.resources.iter().flatten() {
                out.push(Report {
                    pod_claim: pod_claim.to_string(),
                    request: request.clone(),
                    resource_id: resource.resource_id.clone(),
                    health: Health {
                        state: HealthState::parse(resource.health.as_deref()),
                        message: resource.message.clone().filter(|m| !m.is_empty()),
                    },
                });
            }
        }
    }
    out
}

/// The worse of two reports (the first of equals keeps its message).
fn worse(a: Option<Health>, b: &Health) -> Option<Health> {
    match a {
        Some(a) if a.state >= b.state => Some(a),
        _ => Some(b.clone()),
    }
}

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

    #[test]
    fn unknown_values_read_as_unknown_and_order_is_best_to_worst() {
        assert_eq!(HealthState::parse(Some("Healthy")), HealthState::Healthy);
        assert_eq!(HealthState::parse(Some("PermanentlyUnhealthy")), HealthState::Unknown);
        assert_eq!(HealthState::parse(None), HealthState::Unknown);
        assert!(HealthState::Unhealthy > HealthState::Unknown && HealthState::Unknown > HealthState::Healthy);
    }

    #[test]
    fn reports_are_read_from_every_container_and_only_for_claims() {
        let p = pod(&[(
            "app",
            json!([
                {"name": "claim:gpu/gpu", "resources": [{"resourceID": "d/p/x", "health": "Unhealthy", "message": "ECC"}]},
                {"name": "nvidia.com/gpu", "resources": [{"resourceID": "dp-1", "health": "Healthy"}]}]),
        )]);
        let r = reports(&p);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].pod_claim.as_str(), r[0].request.as_deref()), ("gpu", Some("gpu")));
        assert_eq!(r[0].health, Health { state: HealthState::Unhealthy, message: Some("ECC".into()) });
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
