//! The pure resolver: (Pod, ResourceClaims, ResourceSlices) in, resolved devices out.
//!
//! No I/O happens here. Everything that is not there yet (a claim not created or
//! not allocated, a device not published) is reported as [`Missing`] so the caller
//! can wait for it; everything that must not reach the filesystem (hostile or
//! malformed names, unknown attribute types) is skipped and reported as a warning.
//!
//! By concern: what a resolution is (`outcome`), the pod's claims
//! (`claims`), one container's share of the resolution (`container`), the
//! node's pools by the generation that counts (`index`), and
//! the algorithm here.

mod claims;
mod container;
pub mod health;
mod index;
mod outcome;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, Device, DeviceRequestAllocationResult, ResourceClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::model::extended::{self, ExtendedClaim};
use crate::model::names::{QualifiedName, is_dns_label};
use crate::model::objects::Snapshot;
use crate::model::status_data;

use claims::{ClaimSource, PodClaim, pod_claims};
pub use claims::{claim_names, has_claims};
pub use container::{ContainerClaims, for_container};
use index::SliceIndex;
pub use outcome::*;

/// Which pod claims to resolve; empty means all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub claims: Vec<String>,
}

/// Resolve every selected claim of the snapshot's pod.
pub fn resolve(snapshot: &Snapshot, selection: &Selection) -> Resolution {
    let Some(pod) = &snapshot.pod else {
        return Resolution {
            missing: vec![Missing::Invalid { what: "pod".into(), problem: "not found".into() }],
            ..Default::default()
        };
    };
    let mut out = Resolution { pod: PodIdentity::of(pod), ..Default::default() };
    let generated = match extended::of_pod(pod, &mut out.warnings) {
        Some(Err(problem)) => {
            out.missing.push(Missing::Invalid { what: "pod status.extendedResourceClaimStatus".into(), problem });
            None
        }
        other => other.and_then(Result::ok),
    };
    let claims = pod_claims(pod, selection, generated.as_ref());
    let scheduled = out.pod.node.is_some();
    // Extended resources are known to be DRA's only once the scheduler chose
    // (it records the claim before it binds the pod).
    let requested = extended::requested(pod);
    let asks_extended = !requested.is_empty();
    let extended_status = pod.status.as_ref().is_some_and(|s| s.extended_resource_claim_status.is_some());
    let declared = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()).is_some_and(|c| !c.is_empty());
    if !declared && !extended_status && (scheduled || !asks_extended) {
        let (pod_ns, pod_name) = (&out.pod.namespace, &out.pod.name);
        out.warnings.push(if asks_extended {
            let names: Vec<String> = requested.into_iter().collect();
            format!(
                "pod {pod_ns}/{pod_name} uses no resource claims and got none of its extended resources ({}) through DRA (no DeviceClass names them, or a device plugin serves them): the tree has no device",
                names.join(", ")
            )
        } else {
            format!(
                "pod {pod_ns}/{pod_name} uses no resource claims (spec.resourceClaims is empty) and no extended resource backed by DRA: the tree has no device"
            )
        });
    }
    let mut waits_for_scheduling = !claims.is_empty() || (asks_extended && !extended_status);
    for wanted in &selection.claims {
        if claims.iter().any(|c| &c.name == wanted) {
            continue;
        }
        if !extended::is_extended_resource(wanted) {
            let available = pod
                .spec
                .as_ref()
                .and_then(|s| s.resource_claims.as_ref())
                .map(|cs| cs.iter().map(|c| c.name.clone()).collect())
                .unwrap_or_default();
            out.missing.push(Missing::UnknownClaim { name: wanted.clone(), available });
        } else if scheduled {
            let available = generated.iter().flat_map(ExtendedClaim::resources).map(str::to_string).collect::<Vec<_>>();
            out.missing.push(Missing::UnknownExtendedResource { name: wanted.clone(), available });
        } else {
            waits_for_scheduling = true;
        }
    }
    if !scheduled && waits_for_scheduling {
        out.missing.push(Missing::NotScheduled);
    }
    let index = SliceIndex::new(snapshot, out.pod.node.as_deref());
    for pod_claim in claims {
        let name = pod_claim.name.clone();
        if pod_claim.origin != ClaimOrigin::ExtendedResource && !is_dns_label(&name) {
            out.missing.push(Missing::Invalid {
                what: format!("pod claim {name:?}"),
                problem: "is not a DNS label, so it cannot be a directory name".into(),
            });
            continue;
        }
        let claim_name = match pod_claim.source {
            ClaimSource::Named(ref n) => n.clone(),
            ClaimSource::NotNeeded => continue,
            ClaimSource::Pending { template } => {
                out.missing.push(Missing::ClaimStatusPending { pod_claim: name, template });
                continue;
            }
            ClaimSource::Invalid(problem) => {
                out.missing.push(Missing::Invalid { what: subject(&name), problem });
                continue;
            }
        };
        let Some(claim) = snapshot.claims.get(&claim_name) else {
            out.missing.push(Missing::ClaimNotFound { pod_claim: name, claim_name });
            continue;
        };
        resolve_claim(&mut out, &index, &pod_claim, claim);
    }
    health::attach(pod, &mut out.claims);
    out.missing.sort();
    out.missing.dedup();
    out
}

/// How a message names a claim directory: `claim gpu`, or `extended resource
/// gpu.example.com/gpu` (a pod claim's name, a DNS label, never has a `/`).
fn subject(pod_claim: &str) -> String {
    if pod_claim.contains('/') { format!("extended resource {pod_claim}") } else { format!("claim {pod_claim}") }
}

fn resolve_claim(out: &mut Resolution, index: &SliceIndex, pod_claim: &PodClaim, claim: &ResourceClaim) {
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let name = &pod_claim.name;
    let status = claim.status.as_ref();
    let Some(results) = status
        .and_then(|s| s.allocation.as_ref())
        .map(|a| a.devices.as_ref().and_then(|d| d.results.as_deref()).unwrap_or_default())
    else {
        out.missing.push(Missing::ClaimNotAllocated { pod_claim: name.clone(), claim_name });
        return;
    };
    let device_statuses: &[AllocatedDeviceStatus] = status.and_then(|s| s.devices.as_deref()).unwrap_or_default();
    let mut resolved = ResolvedClaim {
        pod_claim: name.clone(),
        claim_name,
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        generation: claim.metadata.generation.unwrap_or(1),
        origin: pod_claim.origin,
        devices: Vec::new(),
    };
    // Each result with its tree directory: its request, or for an extended
    // resource each container that uses it (the claim's other requests
    // belong to other resources).
    let base = |r: &DeviceRequestAllocationResult| r.request.split('/').next().unwrap_or_default().to_string();
    let placed: Vec<(String, &DeviceRequestAllocationResult)> = match &pod_claim.requests {
        None => results.iter().map(|r| (base(r), r)).collect(),
        Some(containers) => containers
            .iter()
            .flat_map(|(container, requests)| {
                requests.iter().flat_map(move |request| {
                    results.iter().filter(move |r| base(r) == *request).map(move |r| (container.clone(), r))
                })
            })
            .collect(),
    };
    let mut per_request: HashMap<String, usize> = HashMap::new();
    for (request, result) in placed {
        if !is_dns_label(&request) {
            out.missing.push(Missing::Invalid {
                what: subject(name),
                problem: format!("allocation result request {:?} is not a DNS label", result.request),
            });
            continue;
        }
        let slot = per_request.entry(request.clone()).or_default();
        let position = *slot;
        *slot += 1;
        if result.driver.is_empty() || result.pool.is_empty() || result.device.is_empty() {
            out.missing.push(Missing::Invalid {
                what: subject(name),
                problem: format!("allocation result for request {:?} lacks driver, pool or device", result.request),
            });
            continue;
        }
        match index.find(&result.driver, &result.pool, &result.device) {
            Ok(device) => {
                let context = format!(
                    "{}, request {request}, device {position} ({}/{}/{})",
                    subject(name),
                    result.driver,
                    result.pool,
                    result.device
                );
                resolved.devices.push(resolve_device(
                    out,
                    &context,
                    request,
                    position,
                    result,
                    device,
                    device_statuses,
                ));
            }
            Err((detail, pool_gone)) => out.missing.push(Missing::Device {
                pod_claim: name.clone(),
                request,
                index: position,
                driver: result.driver.clone(),
                pool: result.pool.clone(),
                device: result.device.clone(),
                detail,
                pool_gone,
            }),
        }
    }
    out.claims.push(resolved);
}

fn resolve_device(
    out: &mut Resolution,
    context: &str,
    request: String,
    index: usize,
    result: &DeviceRequestAllocationResult,
    device: &Device,
    statuses: &[AllocatedDeviceStatus],
) -> ResolvedDevice {
    let mut attributes = BTreeMap::new();
    for (key, attr) in device.attributes.iter().flatten() {
        let parsed = QualifiedName::parse(key, &result.driver)
            .and_then(|name| AttrValue::from_api(attr).map(|value| (name, value)));
        match parsed {
            Ok((name, value)) => {
                attributes.insert(name, Attribute { key: key.clone(), value });
            }
            Err(why) => out.warnings.push(format!("{context}: attribute {key:?} skipped: {why}")),
        }
    }
    let capacity = quantities(
        out,
        context,
        "capacity",
        &result.driver,
        device.capacity.iter().flatten().map(|(key, cap)| (key, &cap.value)),
    );
    let consumed =
        quantities(out, context, "consumed capacity", &result.driver, result.consumed_capacity.iter().flatten());
    let status = statuses
        .iter()
        .find(|s| {
            s.driver == result.driver
                && s.pool == result.pool
                && s.device == result.device
                && s.share_id == result.share_id
        })
        .map(|s| {
            let net = s.network_data.as_ref();
            let data = s.data.as_ref().map(status_data::carried);
            let members = data.as_ref().map(status_data::members).unwrap_or_default();
            out.warnings.extend(members.warnings.into_iter().map(|w| format!("{context}: {w}")));
            DeviceStatus {
                interface_name: net.and_then(|n| n.interface_name.clone()).filter(|s| !s.is_empty()),
                ips: net.and_then(|n| n.ips.clone()).unwrap_or_default(),
                hardware_address: net.and_then(|n| n.hardware_address.clone()).filter(|s| !s.is_empty()),
                data,
                data_members: members.files,
            }
        });
    ResolvedDevice {
        request,
        full_request: result.request.clone(),
        index,
        driver: result.driver.clone(),
        pool: result.pool.clone(),
        device: result.device.clone(),
        share_id: result.share_id.clone(),
        attributes,
        capacity,
        consumed,
        status,
        health: None,
        admin_access: result.admin_access == Some(true),
        taints: device
            .taints
            .iter()
            .flatten()
            .map(|t| Taint {
                key: t.key.clone(),
                value: t.value.clone().filter(|v| !v.is_empty()),
                effect: t.effect.clone(),
            })
            .collect(),
    }
}

/// Quantities by qualified name, exactly as written (capacities of a device, or
/// the share of them an allocation consumed); names that could leave the tree
/// are skipped with a warning.
fn quantities<'a>(
    out: &mut Resolution,
    context: &str,
    what: &str,
    driver: &str,
    entries: impl Iterator<Item = (&'a String, &'a Quantity)>,
) -> BTreeMap<QualifiedName, String> {
    let mut found = BTreeMap::new();
    for (key, quantity) in entries {
        match QualifiedName::parse(key, driver) {
            Ok(name) => {
                found.insert(name, quantity.0.clone());
            }
            Err(why) => out.warnings.push(format!("{context}: {what} {key:?} skipped: {why}")),
        }
    }
    found
}
