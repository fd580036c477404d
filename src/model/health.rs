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
pub(crate) struct Report {
    pub pod_claim: String,
    /// None: the container uses the whole claim.
    pub request: Option<String>,
    pub resource_id: String,
    pub health: Health,
}

/// Every DRA health report in the pod's container statuses (app, init and
/// ephemeral containers alike).
pub(crate) fn reports(pod: &Pod) -> Vec<Report> {
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
pub(crate) fn worse(a: Option<Health>, b: &Health) -> Option<Health> {
    match a {
        Some(a) if a.state >= b.state => Some(a),
        _ => Some(b.clone()),
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
}
