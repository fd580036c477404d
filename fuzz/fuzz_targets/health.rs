//! Any pod status the kubelet could report: attaching device health to a
//! pod's resolved claims never panics; a device gets a health only from a
//! report about its claim (and its request, when the report names one), a
//! message is never empty, and attaching again changes nothing.
#![no_main]

use drafs::model::resolve::health::attach;
use drafs::model::resolve::{ClaimOrigin, ResolvedClaim, ResolvedDevice};
use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;

fn device(request: &str, index: usize, name: &str) -> ResolvedDevice {
    device_of("gpu.example.com", "node-1", request, index, name)
}

fn device_of(driver: &str, pool: &str, request: &str, index: usize, name: &str) -> ResolvedDevice {
    ResolvedDevice {
        request: request.into(),
        full_request: request.into(),
        index,
        driver: driver.into(),
        pool: pool.into(),
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

fn claim(pod_claim: &str, origin: ClaimOrigin, devices: Vec<ResolvedDevice>) -> ResolvedClaim {
    ResolvedClaim {
        pod_claim: pod_claim.into(),
        claim_name: format!("{pod_claim}-abc"),
        namespace: "ns".into(),
        uid: "u".into(),
        generation: 1,
        origin,
        devices,
    }
}

fn claims() -> Vec<ResolvedClaim> {
    vec![
        claim(
            "gpu",
            ClaimOrigin::Template,
            vec![device("gpu", 0, "gpu-1"), device("gpu", 1, "gpu-2"), device("nic", 0, "nic-1")],
        ),
        claim("other", ClaimOrigin::Named, vec![device("gpu", 0, "gpu-1")]),
        claim("gpu.example.com/gpu", ClaimOrigin::ExtendedResource, vec![device("app", 0, "gpu-3")]),
        // The claim of examples/offline/unhealthy-gpu.yaml.
        claim(
            "gpus",
            ClaimOrigin::Template,
            vec![
                device_of("gpu.nvidia.com", "gpu-node-7", "gpu", 0, "gpu-2"),
                device_of("gpu.nvidia.com", "gpu-node-7", "gpu", 1, "gpu-3"),
            ],
        ),
    ]
}

/// (pod claim, request) of every resource the pod's statuses report, as the
/// kubelet names them (`claim:<pod claim>[/<request>]`).
fn reported(pod: &Pod) -> Vec<(String, Option<String>)> {
    let Some(status) = &pod.status else { return Vec::new() };
    let containers =
        [&status.container_statuses, &status.init_container_statuses, &status.ephemeral_container_statuses];
    let mut out = Vec::new();
    for container in containers.into_iter().flatten().flatten() {
        for entry in container.allocated_resources_status.iter().flatten() {
            let Some(claim) = entry.name.strip_prefix("claim:") else { continue };
            let (pod_claim, request) = match claim.split_once('/') {
                Some((c, r)) => (c.to_string(), Some(r.to_string())),
                None => (claim.to_string(), None),
            };
            if entry.resources.as_ref().is_some_and(|r| !r.is_empty()) {
                out.push((pod_claim, request));
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Ok(pod) = serde_json::from_slice::<Pod>(data) else { return };
    let mut once = claims();
    attach(&pod, &mut once);
    let reported = reported(&pod);
    for claim in &once {
        for device in &claim.devices {
            let Some(health) = &device.health else { continue };
            assert!(
                reported.iter().any(|(c, r)| *c == claim.pod_claim && r.as_ref().is_none_or(|r| *r == device.request)),
                "{}/{} got {health:?} from no report about it",
                claim.pod_claim,
                device.request
            );
            assert!(health.message.as_ref().is_none_or(|m| !m.is_empty()), "an empty message");
        }
    }
    let mut twice = once.clone();
    attach(&pod, &mut twice);
    assert_eq!(once, twice, "attaching twice changed the health");
});
