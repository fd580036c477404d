//! The pure resolver: (Pod, ResourceClaims, ResourceSlices) in, resolved devices out.
//!
//! No I/O happens here. Everything that is not there yet (a claim not created or
//! not allocated, a device not published) is reported as [`Missing`] so the caller
//! can wait for it; everything that must not reach the filesystem (hostile or
//! malformed names, unknown attribute types) is skipped and reported as a warning.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, Device, DeviceAttribute, DeviceRequestAllocationResult, ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;

use crate::model::extended::{self, ExtendedClaim};
use crate::model::health::{self, Health};
use crate::model::names::{QualifiedName, is_dns_label};
use crate::model::objects::Snapshot;
use crate::model::pools::{GenerationSeen, PoolGenerations};
use crate::model::status_data::{self, RawData};

/// Which pod claims to resolve; empty means all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub claims: Vec<String>,
}

/// A typed attribute value, serialized the way ResourceSlices write it (`{"int": 5}`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttrValue {
    Bool(bool),
    Int(i64),
    String(String),
    Version(String),
    Bools(Vec<bool>),
    Ints(Vec<i64>),
    Strings(Vec<String>),
    Versions(Vec<String>),
}

impl AttrValue {
    fn from_api(attr: &DeviceAttribute) -> Result<Self, String> {
        let mut found = Vec::new();
        if let Some(v) = attr.bool {
            found.push(AttrValue::Bool(v));
        }
        if let Some(v) = attr.int {
            found.push(AttrValue::Int(v));
        }
        if let Some(v) = &attr.string {
            found.push(AttrValue::String(v.clone()));
        }
        if let Some(v) = &attr.version {
            found.push(AttrValue::Version(v.clone()));
        }
        if let Some(v) = &attr.bools {
            found.push(AttrValue::Bools(v.clone()));
        }
        if let Some(v) = &attr.ints {
            found.push(AttrValue::Ints(v.clone()));
        }
        if let Some(v) = &attr.strings {
            found.push(AttrValue::Strings(v.clone()));
        }
        if let Some(v) = &attr.versions {
            found.push(AttrValue::Versions(v.clone()));
        }
        match found.len() {
            1 => Ok(found.pop().expect("one element")),
            0 => Err("has no value of a known type (bool, int, string, version or their lists)".into()),
            n => Err(format!("has {n} values; exactly one is allowed")),
        }
    }

    /// The file content: scalars as the API writes them, lists joined with `,`.
    pub fn to_text(&self) -> String {
        fn join<T: ToString>(v: &[T]) -> String {
            v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
        }
        match self {
            AttrValue::Bool(b) => b.to_string(),
            AttrValue::Int(i) => i.to_string(),
            AttrValue::String(s) | AttrValue::Version(s) => s.clone(),
            AttrValue::Bools(v) => join(v),
            AttrValue::Ints(v) => join(v),
            AttrValue::Strings(v) | AttrValue::Versions(v) => v.join(","),
        }
    }
}

/// An attribute with the key as the slice wrote it (the standard metadata view keeps it).
#[derive(Debug, Clone, PartialEq)]
pub struct Attribute {
    pub key: String,
    pub value: AttrValue,
}

/// Network data and driver data from the claim's `status.devices`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hardware_address: Option<String>,
    /// The driver's `data`, the JSON text the API server sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<RawData>,
    /// The members of `data` as files under `.status/data.d/` (path, content);
    /// not in `.json`, which has `data` itself.
    #[serde(skip)]
    pub data_members: Vec<(String, String)>,
}

/// One allocated device with everything known about it.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedDevice {
    /// The tree directory: the request part before the first `/`, or for an
    /// extended resource the container that asked for it.
    pub request: String,
    /// The result's request as allocated, e.g. `gpu/large` for a subrequest.
    pub full_request: String,
    /// Position among the claim's earlier results with the same request.
    pub index: usize,
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub share_id: Option<String>,
    pub attributes: BTreeMap<QualifiedName, Attribute>,
    pub capacity: BTreeMap<QualifiedName, String>,
    /// The share of the device's capacity this allocation consumed (consumable capacity).
    pub consumed: BTreeMap<QualifiedName, String>,
    pub status: Option<DeviceStatus>,
    /// The health the kubelet reports in the pod's status (KEP-4680), if any.
    pub health: Option<Health>,
    /// Allocated with `adminAccess: true` (a monitoring pod's access to a
    /// device that other pods may use at the same time).
    pub admin_access: bool,
    /// The taints the driver or an admin put on the device in its slice (KEP-5055).
    pub taints: Vec<Taint>,
}

/// A device taint as its ResourceSlice publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Taint {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
}

impl Taint {
    /// `key=value:effect`, or `key:effect`, as `kubectl` writes a node's taints.
    pub fn to_text(&self) -> String {
        match &self.value {
            Some(value) => format!("{}={value}:{}", self.key, self.effect),
            None => format!("{}:{}", self.key, self.effect),
        }
    }
}

/// How the pod got a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOrigin {
    /// `spec.resourceClaims[].resourceClaimName`: a claim made beforehand.
    Named,
    /// `spec.resourceClaims[].resourceClaimTemplateName`: made for the pod.
    Template,
    /// Made by the scheduler for the containers' extended resources (KEP-5004).
    ExtendedResource,
}

/// One pod claim, or one extended resource of the pod, and the devices
/// resolved for it so far.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedClaim {
    /// The tree directory: the name in the pod's `spec.resourceClaims`, or for
    /// an extended resource its name (`gpu.example.com/gpu`, two components).
    pub pod_claim: String,
    /// The ResourceClaim object's name.
    pub claim_name: String,
    pub namespace: String,
    pub uid: String,
    pub generation: i64,
    pub origin: ClaimOrigin,
    pub devices: Vec<ResolvedDevice>,
}

impl ResolvedClaim {
    pub fn from_template(&self) -> bool {
        self.origin == ClaimOrigin::Template
    }
}

/// Something the pod asked for that is not (yet) there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Missing {
    NotScheduled,
    UnknownClaim {
        name: String,
        available: Vec<String>,
    },
    ClaimStatusPending {
        pod_claim: String,
        template: String,
    },
    /// `--claim DOMAIN/NAME` of an extended resource the scheduled pod did not get through DRA.
    UnknownExtendedResource {
        name: String,
        available: Vec<String>,
    },
    ClaimNotFound {
        pod_claim: String,
        claim_name: String,
    },
    ClaimNotAllocated {
        pod_claim: String,
        claim_name: String,
    },
    Device {
        pod_claim: String,
        request: String,
        index: usize,
        driver: String,
        pool: String,
        device: String,
        detail: String,
        /// No slice of the pool is there at all (a kubelet starting wipes its
        /// node's slices until each driver publishes them again), as opposed
        /// to a pool that is there and does not list the device.
        pool_gone: bool,
    },
    Invalid {
        what: String,
        problem: String,
    },
}

impl Missing {
    /// True when waiting cannot help (the pod spec is immutable).
    pub fn is_permanent(&self) -> bool {
        matches!(self, Missing::UnknownClaim { .. } | Missing::UnknownExtendedResource { .. })
    }
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::NotScheduled => write!(f, "the pod is not scheduled to a node yet"),
            Missing::UnknownClaim { name, available } => write!(
                f,
                "claim {name}: the pod has no resource claim named {name:?} (it has: {})",
                if available.is_empty() { "none".to_string() } else { available.join(", ") }
            ),
            Missing::UnknownExtendedResource { name, available } => write!(
                f,
                "extended resource {name}: the pod got no device of it through DRA (its status.extendedResourceClaimStatus maps: {})",
                if available.is_empty() { "none".to_string() } else { available.join(", ") }
            ),
            Missing::ClaimStatusPending { pod_claim, template } => write!(
                f,
                "claim {pod_claim}: no ResourceClaim generated from template {template} yet (pod status.resourceClaimStatuses has no entry)"
            ),
            Missing::ClaimNotFound { pod_claim, claim_name } => {
                write!(f, "{}: ResourceClaim {claim_name} not found", subject(pod_claim))
            }
            Missing::ClaimNotAllocated { pod_claim, claim_name } => {
                write!(f, "{}: ResourceClaim {claim_name} is not allocated yet", subject(pod_claim))
            }
            Missing::Device { pod_claim, request, index, driver, pool, device, detail, .. } => write!(
                f,
                "{}, request {request}, device {index}: {driver}/{pool}/{device} not published: {detail}",
                subject(pod_claim)
            ),
            Missing::Invalid { what, problem } => write!(f, "{what}: {problem}"),
        }
    }
}

/// The pod's identity as the outputs need it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PodIdentity {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    #[serde(rename = "nodeName", skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl PodIdentity {
    pub fn of(pod: &Pod) -> Self {
        PodIdentity {
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()),
        }
    }
}

/// What the resolver made of a snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolution {
    pub pod: PodIdentity,
    pub claims: Vec<ResolvedClaim>,
    pub missing: Vec<Missing>,
    pub warnings: Vec<String>,
}

impl Resolution {
    pub fn is_complete(&self) -> bool {
        self.missing.is_empty()
    }

    /// Drivers with allocated devices not found in the slices seen so far: their
    /// cluster-scoped (`allNodes`/`nodeSelector`) slices are worth fetching.
    pub fn drivers_with_unpublished_devices(&self) -> BTreeSet<String> {
        self.missing
            .iter()
            .filter_map(|m| match m {
                Missing::Device { driver, .. } => Some(driver.clone()),
                _ => None,
            })
            .collect()
    }
}

/// Names of the ResourceClaim objects the pod uses, as far as its status tells.
pub fn claim_names(pod: &Pod, selection: &Selection) -> Vec<String> {
    let generated = extended::of_pod(pod, &mut Vec::new()).and_then(Result::ok);
    let mut names: Vec<String> = pod_claims(pod, selection, generated.as_ref())
        .into_iter()
        .filter_map(|c| match c.source {
            ClaimSource::Named(name) => Some(name),
            _ => None,
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

enum ClaimSource {
    Named(String),
    NotNeeded,
    Pending { template: String },
    Invalid(String),
}

/// A claim the tree has a directory for: a pod claim, or one extended resource.
struct PodClaim {
    name: String,
    origin: ClaimOrigin,
    source: ClaimSource,
    /// For an extended resource: each container that asked for it (its tree
    /// directory) and the claim's requests that hold its devices, in order.
    requests: Option<Vec<(String, Vec<String>)>>,
}

/// The pod's claims and extended resources (restricted by the selection),
/// each with where its object is; `generated` is the pod's claim for its
/// extended resources, as `extended::of_pod` read it.
fn pod_claims(pod: &Pod, selection: &Selection, generated: Option<&ExtendedClaim>) -> Vec<PodClaim> {
    let spec_claims = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref());
    let selected = |name: &str| selection.claims.is_empty() || selection.claims.iter().any(|c| c == name);
    let mut claims: Vec<PodClaim> = spec_claims
        .into_iter()
        .flatten()
        .filter(|c| selected(&c.name))
        .map(|c| {
            let origin = if c.resource_claim_name.is_none() { ClaimOrigin::Template } else { ClaimOrigin::Named };
            let source = match (&c.resource_claim_name, &c.resource_claim_template_name) {
                (Some(name), None) => ClaimSource::Named(name.clone()),
                (None, Some(template)) => match statuses.into_iter().flatten().find(|s| s.name == c.name) {
                    None => ClaimSource::Pending { template: template.clone() },
                    Some(status) => match &status.resource_claim_name {
                        Some(name) => ClaimSource::Named(name.clone()),
                        None => ClaimSource::NotNeeded,
                    },
                },
                _ => ClaimSource::Invalid(
                    "exactly one of resourceClaimName and resourceClaimTemplateName must be set".into(),
                ),
            };
            PodClaim { name: c.name.clone(), origin, source, requests: None }
        })
        .collect();
    let Some(generated) = generated else { return claims };
    for resource in generated.resources() {
        if !selected(resource) {
            continue;
        }
        let mut requests: Vec<(String, Vec<String>)> = Vec::new();
        for r in generated.requests.iter().filter(|r| r.resource == resource) {
            match requests.iter_mut().find(|(container, _)| *container == r.container) {
                Some((_, list)) => list.push(r.request.clone()),
                None => requests.push((r.container.clone(), vec![r.request.clone()])),
            }
        }
        claims.push(PodClaim {
            name: resource.to_string(),
            origin: ClaimOrigin::ExtendedResource,
            source: ClaimSource::Named(generated.claim_name.clone()),
            requests: Some(requests),
        });
    }
    claims
}

/// One generation of a pool as the slices seen so far publish it.
struct Generation<'a> {
    slices: HashSet<&'a str>,
    slice_count: i64,
    devices: HashMap<&'a str, &'a Device>,
}

impl Generation<'_> {
    fn seen(&self) -> GenerationSeen {
        GenerationSeen { slices: self.slices.len(), slice_count: self.slice_count }
    }
}

/// The generation of a pool that counts, with its devices, and the newest one seen.
struct PoolView<'a> {
    generation: i64,
    current: Generation<'a>,
    newest: Option<(i64, usize, i64)>,
}

struct SliceIndex<'a> {
    pools: HashMap<(&'a str, &'a str), PoolView<'a>>,
}

impl<'a> SliceIndex<'a> {
    /// Pools as the scheduler sees them for `node`: a slice bound to another
    /// node contributes neither devices nor a generation. The generation that
    /// counts is [`PoolGenerations::in_use`]'s: the newest complete one.
    fn new(snapshot: &'a Snapshot, node: Option<&str>) -> Self {
        let mut all: HashMap<(&str, &str), BTreeMap<i64, Generation>> = HashMap::new();
        for (key, slice) in &snapshot.slices {
            let spec = &slice.spec;
            if !crate::model::slices::eligible_for(spec, node) {
                continue;
            }
            let pool = (spec.driver.as_str(), spec.pool.name.as_str());
            let generation = all.entry(pool).or_default().entry(spec.pool.generation).or_insert_with(|| Generation {
                slices: HashSet::new(),
                slice_count: 0,
                devices: HashMap::new(),
            });
            generation.slices.insert(slice.metadata.name.as_deref().unwrap_or(key));
            generation.slice_count = generation.slice_count.max(spec.pool.resource_slice_count);
            for device in spec.devices.iter().flatten() {
                generation.devices.insert(device.name.as_str(), device);
            }
        }
        let pools = all
            .into_iter()
            .filter_map(|(pool, mut generations)| {
                let seen: PoolGenerations = generations.iter().map(|(g, generation)| (*g, generation.seen())).collect();
                let (newest, last) = seen.newest()?;
                let newest_seen = (newest, last.slices, last.slice_count);
                let counts = seen.in_use()?;
                let current = generations.remove(&counts)?;
                let newest = (newest != counts).then_some(newest_seen);
                Some((pool, PoolView { generation: counts, current, newest }))
            })
            .collect();
        SliceIndex { pools }
    }

    /// The device, or why it is not there and whether its whole pool is gone.
    fn find(&self, driver: &str, pool: &str, device: &str) -> Result<&'a Device, (String, bool)> {
        let Some(view) = self.pools.get(&(driver, pool)) else {
            return Err((format!("no ResourceSlice of driver {driver} publishes pool {pool}"), true));
        };
        if let Some(found) = view.current.devices.get(device) {
            return Ok(found);
        }
        let current = &view.current;
        let mut detail = if current.seen().is_complete() {
            format!("pool {pool} at generation {} does not list it", view.generation)
        } else {
            format!(
                "pool {pool} has {} of {} ResourceSlices at generation {} and none lists it",
                current.slices.len(),
                current.slice_count,
                view.generation
            )
        };
        if let Some((newest, seen, count)) = view.newest {
            detail += &format!(" (generation {newest} is being published: {seen} of {count} ResourceSlices so far)");
        }
        Err((detail, false))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::objects::FileObjects;

    fn snapshot(text: &str) -> Snapshot {
        FileObjects::parse("test", text).unwrap().into_snapshot("test", None).unwrap()
    }

    const POD: &str = r#"
kind: Pod
metadata: {name: p, namespace: ns, uid: u1}
spec:
  nodeName: n1
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: t}
  - {name: nic, resourceClaimName: shared-nic}
  - {name: opt, resourceClaimTemplateName: t2}
status:
  resourceClaimStatuses:
  - {name: gpu, resourceClaimName: p-gpu-abc}
  - {name: opt}
"#;

    fn claim(name: &str, results: &str, extra_status: &str) -> String {
        format!(
            "---\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: ns, uid: u-{name}, generation: 3}}\nspec: {{}}\nstatus:\n  allocation:\n    devices:\n      results: {results}\n{extra_status}"
        )
    }

    fn slice(name: &str, node: &str, driver: &str, pool: &str, generation: i64, count: i64, devices: &str) -> String {
        format!(
            "---\nkind: ResourceSlice\nmetadata: {{name: {name}}}\nspec:\n  driver: {driver}\n  {node}\n  pool: {{name: {pool}, generation: {generation}, resourceSliceCount: {count}}}\n  devices: {devices}\n"
        )
    }

    fn full_fixture() -> String {
        let mut text = POD.to_string();
        text += &claim(
            "p-gpu-abc",
            "[{request: gpu/large, driver: gpu.example.com, pool: n1, device: g1}, {request: gpu/large, driver: gpu.example.com, pool: n1, device: g0}]",
            "",
        );
        text += &claim(
            "shared-nic",
            "[{request: rdma, driver: net.example.com, pool: fabric, device: nic-7}]",
            "  devices:\n  - {driver: net.example.com, pool: fabric, device: nic-7, networkData: {interfaceName: net1, ips: [10.0.0.1/24, 'fd00::1/64'], hardwareAddress: 'aa:bb'}, data: {vf: 3}}\n",
        );
        text += &slice(
            "old",
            "nodeName: n1",
            "gpu.example.com",
            "n1",
            1,
            1,
            "[{name: g1, attributes: {uuid: {string: STALE}}}]",
        );
        text += &slice(
            "new",
            "nodeName: n1",
            "gpu.example.com",
            "n1",
            2,
            1,
            "[{name: g0, attributes: {uuid: {string: G0}}}, {name: g1, attributes: {uuid: {string: G1}, cc: {version: 9.0.0}, numa: {ints: [0, 1]}, resource.kubernetes.io/pciBusID: {string: '0000:3b:00.0'}, '../escape': {string: x}, weird: {float: 1.5}}, capacity: {memory: {value: 80Gi}}}]",
        );
        text += &slice(
            "fabric",
            "allNodes: true",
            "net.example.com",
            "fabric",
            4,
            1,
            "[{name: nic-7, attributes: {ifName: {string: ens1}, rdma: {bool: true}, mtu: {int: 9000}}}]",
        );
        text
    }

    #[test]
    fn resolves_template_and_direct_claims_with_subrequests_and_stale_generations() {
        let res = resolve(&snapshot(&full_fixture()), &Selection::default());
        assert!(res.is_complete(), "{:?}", res.missing);
        assert_eq!(res.claims.len(), 2);
        let gpu = &res.claims[0];
        assert_eq!((gpu.pod_claim.as_str(), gpu.claim_name.as_str(), gpu.from_template()), ("gpu", "p-gpu-abc", true));
        assert_eq!(gpu.devices.len(), 2);
        let d0 = &gpu.devices[0];
        assert_eq!(
            (d0.request.as_str(), d0.full_request.as_str(), d0.index, d0.device.as_str()),
            ("gpu", "gpu/large", 0, "g1")
        );
        let uuid = QualifiedName::parse("uuid", "gpu.example.com").unwrap();
        assert_eq!(d0.attributes[&uuid].value, AttrValue::String("G1".into()), "stale generation must not win");
        let numa = QualifiedName::parse("numa", "gpu.example.com").unwrap();
        assert_eq!(d0.attributes[&numa].value.to_text(), "0,1");
        assert_eq!(d0.capacity[&QualifiedName::parse("memory", "gpu.example.com").unwrap()], "80Gi");
        assert_eq!(gpu.devices[1].index, 1);
        assert_eq!(gpu.devices[1].attributes[&uuid].value, AttrValue::String("G0".into()));
        // hostile and unknown-typed attributes are skipped with a warning each
        assert_eq!(d0.attributes.len(), 4);
        assert!(res.warnings.iter().any(|w| w.contains("../escape")), "{:?}", res.warnings);
        assert!(res.warnings.iter().any(|w| w.contains("weird")), "{:?}", res.warnings);

        let nic = &res.claims[1];
        assert!(!nic.from_template());
        let status = nic.devices[0].status.as_ref().unwrap();
        assert_eq!(status.interface_name.as_deref(), Some("net1"));
        assert_eq!(status.ips, vec!["10.0.0.1/24", "fd00::1/64"]);
        assert_eq!(status.data.as_ref().map(RawData::get), Some(r#"{"vf":3}"#));
    }

    #[test]
    fn a_slice_of_another_node_never_contributes_devices_or_a_generation() {
        // A whole-cluster dump: node n2 publishes pool "n1" of the same driver at a newer generation.
        let mut text = full_fixture();
        text += &slice(
            "other-node",
            "nodeName: n2",
            "gpu.example.com",
            "n1",
            9,
            1,
            "[{name: g0, attributes: {uuid: {string: WRONG}}}, {name: g1, attributes: {uuid: {string: WRONG}}}]",
        );
        let res = resolve(&snapshot(&text), &Selection::default());
        assert!(res.is_complete(), "{:?}", res.missing);
        let uuid = QualifiedName::parse("uuid", "gpu.example.com").unwrap();
        assert_eq!(res.claims[0].devices[0].attributes[&uuid].value, AttrValue::String("G1".into()));
    }

    #[test]
    fn reports_what_is_missing() {
        let mut text = POD.replace("  - {name: gpu, resourceClaimName: p-gpu-abc}\n", "");
        text += &claim("shared-nic", "[{request: rdma, driver: net.example.com, pool: fabric, device: nic-7}]", "");
        let res = resolve(&snapshot(&text), &Selection::default());
        assert_eq!(res.missing.len(), 2, "{:?}", res.missing);
        assert!(matches!(&res.missing[0], Missing::ClaimStatusPending { pod_claim, .. } if pod_claim == "gpu"));
        assert!(
            matches!(&res.missing[1], Missing::Device { pod_claim, device, .. } if pod_claim == "nic" && device == "nic-7")
        );
        assert_eq!(res.drivers_with_unpublished_devices().into_iter().collect::<Vec<_>>(), vec!["net.example.com"]);
        let message = res.missing[1].to_string();
        assert!(message.contains("net.example.com/fabric/nic-7") && message.contains("no ResourceSlice"), "{message}");
    }

    #[test]
    fn unallocated_claim_and_incomplete_pool() {
        let mut text = POD.to_string();
        text += "---\nkind: ResourceClaim\nmetadata: {name: shared-nic, namespace: ns}\nspec: {}\n";
        text += &claim("p-gpu-abc", "[{request: gpu, driver: gpu.example.com, pool: n1, device: g9}]", "");
        text += &slice("part", "nodeName: n1", "gpu.example.com", "n1", 2, 2, "[{name: g0}]");
        let res = resolve(&snapshot(&text), &Selection::default());
        let text: Vec<String> = res.missing.iter().map(ToString::to_string).collect();
        assert!(text.iter().any(|m| m.contains("shared-nic is not allocated")), "{text:?}");
        assert!(text.iter().any(|m| m.contains("1 of 2 ResourceSlices")), "{text:?}");
    }

    #[test]
    fn selection_restricts_and_unknown_claims_are_permanent() {
        let sel = Selection { claims: vec!["nic".into(), "nope".into()] };
        let res = resolve(&snapshot(&full_fixture()), &sel);
        assert_eq!(res.claims.len(), 1);
        assert_eq!(res.missing.len(), 1);
        assert!(res.missing[0].is_permanent());
        assert!(res.missing[0].to_string().contains("gpu, nic, opt"));
    }

    #[test]
    fn share_id_selects_the_matching_status() {
        let mut text = POD.to_string();
        text += &claim(
            "shared-nic",
            "[{request: rdma, driver: net.example.com, pool: fabric, device: nic-7, shareID: s2}]",
            "  devices:\n  - {driver: net.example.com, pool: fabric, device: nic-7, shareID: s1, networkData: {interfaceName: wrong}}\n  - {driver: net.example.com, pool: fabric, device: nic-7, shareID: s2, networkData: {interfaceName: right}}\n",
        );
        text += &slice("fabric", "allNodes: true", "net.example.com", "fabric", 1, 1, "[{name: nic-7}]");
        let res = resolve(&snapshot(&text), &Selection { claims: vec!["nic".into()] });
        let status = res.claims[0].devices[0].status.as_ref().unwrap();
        assert_eq!(status.interface_name.as_deref(), Some("right"));
    }

    #[test]
    fn consumed_capacity_is_named_like_capacity_and_kept_verbatim() {
        let mut text = POD.to_string();
        text += &claim(
            "p-gpu-abc",
            "[{request: gpu, driver: gpu.example.com, pool: n1, device: g0, shareID: 7f9c2d1e-0b3a-4c5d-8e6f-a1b2c3d4e5f6, consumedCapacity: {memory: 20Gi, example.com/bandwidth: '1.5e3', '../../escape': 1, 'a/b/c': 2}}, {request: gpu, driver: gpu.example.com, pool: n1, device: g1}]",
            "",
        );
        text += &slice(
            "s",
            "nodeName: n1",
            "gpu.example.com",
            "n1",
            1,
            1,
            "[{name: g0, capacity: {memory: {value: 80Gi}}}, {name: g1}]",
        );
        let res = resolve(&snapshot(&text), &Selection { claims: vec!["gpu".into()] });
        assert!(res.is_complete(), "{:?}", res.missing);
        let shared = &res.claims[0].devices[0];
        let consumed: Vec<(String, &str)> = shared.consumed.iter().map(|(k, v)| (k.to_string(), v.as_str())).collect();
        assert_eq!(
            consumed,
            vec![("example.com/bandwidth".into(), "1.5e3"), ("gpu.example.com/memory".into(), "20Gi")],
            "unqualified names get the driver's domain, quantities are not normalised"
        );
        assert_eq!(shared.capacity[&QualifiedName::parse("memory", "gpu.example.com").unwrap()], "80Gi");
        for hostile in ["../../escape", "a/b/c"] {
            assert!(
                res.warnings.iter().any(|w| w.contains("consumed capacity") && w.contains(hostile)),
                "{hostile}: {:?}",
                res.warnings
            );
        }
        assert!(res.claims[0].devices[1].consumed.is_empty(), "a whole device consumed nothing");
    }

    #[test]
    fn an_incomplete_newest_generation_leaves_the_last_complete_one_in_use() {
        // Generation 2 of pool n1 has 1 of its 2 slices: generation 1 (complete) counts.
        let mut text = POD.to_string();
        text += &claim(
            "p-gpu-abc",
            "[{request: gpu, driver: gpu.example.com, pool: n1, device: g0}, {request: gpu, driver: gpu.example.com, pool: n1, device: g1}]",
            "",
        );
        text += &slice(
            "a-old",
            "nodeName: n1",
            "gpu.example.com",
            "n1",
            1,
            2,
            "[{name: g0, attributes: {v: {string: one}}}]",
        );
        text +=
            &slice("b", "nodeName: n1", "gpu.example.com", "n1", 1, 2, "[{name: g1, attributes: {v: {string: one}}}]");
        text +=
            &slice("a", "nodeName: n1", "gpu.example.com", "n1", 2, 2, "[{name: g0, attributes: {v: {string: two}}}]");
        let sel = Selection { claims: vec!["gpu".into()] };
        let res = resolve(&snapshot(&text), &sel);
        assert!(res.is_complete(), "{:?}", res.missing);
        let v = QualifiedName::parse("v", "gpu.example.com").unwrap();
        let values: Vec<String> = res.claims[0].devices.iter().map(|d| d.attributes[&v].value.to_text()).collect();
        assert_eq!(values, vec!["one", "one"], "one generation, the complete one");
        // The second slice of generation 2 arrives: generation 2 counts.
        let text = text
            + &slice(
                "b2",
                "nodeName: n1",
                "gpu.example.com",
                "n1",
                2,
                2,
                "[{name: g1, attributes: {v: {string: two}}}]",
            );
        let res = resolve(&snapshot(&text), &sel);
        let values: Vec<String> = res.claims[0].devices.iter().map(|d| d.attributes[&v].value.to_text()).collect();
        assert_eq!(values, vec!["two", "two"]);
    }

    #[test]
    fn a_device_missing_from_the_generation_in_use_names_the_one_being_published() {
        let mut text = POD.to_string();
        text += &claim("p-gpu-abc", "[{request: gpu, driver: gpu.example.com, pool: n1, device: g9}]", "");
        text += &slice("a", "nodeName: n1", "gpu.example.com", "n1", 1, 1, "[{name: g0}]");
        text += &slice("b", "nodeName: n1", "gpu.example.com", "n1", 2, 3, "[{name: g9}]");
        let res = resolve(&snapshot(&text), &Selection { claims: vec!["gpu".into()] });
        let message = res.missing[0].to_string();
        assert!(
            message.contains("pool n1 at generation 1 does not list it")
                && message.contains("generation 2 is being published: 1 of 3"),
            "{message}"
        );
    }
    /// A pod that asks for extended resources backed by DRA: `setup` (init)
    /// and `a` share request 0 (the scheduler lets `a` reuse it), `a` has one
    /// more, `b` its own; `nic` is a second resource, by its implicit name.
    const EXTENDED_POD: &str = r#"
kind: Pod
metadata: {name: p, namespace: ns, uid: u1}
spec:
  nodeName: n1
  initContainers:
  - {name: setup, resources: {limits: {gpu.example.com/gpu: 1}}}
  containers:
  - {name: a, resources: {limits: {gpu.example.com/gpu: 2, deviceclass.resource.kubernetes.io/nic.example.com: 1}}}
  - {name: b, resources: {limits: {gpu.example.com/gpu: 1}}}
status:
  extendedResourceClaimStatus:
    resourceClaimName: p-extended-resources-x1
    requestMappings:
    - {containerName: setup, resourceName: gpu.example.com/gpu, requestName: container-0-request-0}
    - {containerName: a, resourceName: gpu.example.com/gpu, requestName: container-0-request-0}
    - {containerName: a, resourceName: gpu.example.com/gpu, requestName: container-1-request-1}
    - {containerName: a, resourceName: deviceclass.resource.kubernetes.io/nic.example.com, requestName: container-1-request-0}
    - {containerName: b, resourceName: gpu.example.com/gpu, requestName: container-2-request-0}
"#;

    fn extended_fixture() -> String {
        let mut text = EXTENDED_POD.to_string();
        text += &claim(
            "p-extended-resources-x1",
            "[{request: container-0-request-0, driver: gpu.example.com, pool: n1, device: g0}, {request: container-1-request-1, driver: gpu.example.com, pool: n1, device: g1}, {request: container-1-request-0, driver: net.example.com, pool: n1, device: nic-0}, {request: container-2-request-0, driver: gpu.example.com, pool: n1, device: g2}]",
            "",
        );
        text += &slice(
            "g",
            "nodeName: n1",
            "gpu.example.com",
            "n1",
            1,
            1,
            "[{name: g0, attributes: {uuid: {string: G0}}}, {name: g1, attributes: {uuid: {string: G1}}}, {name: g2, attributes: {uuid: {string: G2}}}]",
        );
        text += &slice(
            "n",
            "nodeName: n1",
            "net.example.com",
            "n1",
            1,
            1,
            "[{name: nic-0, attributes: {mac: {string: M}}}]",
        );
        text
    }

    fn tree_of(res: &Resolution) -> Vec<(String, String)> {
        let built = crate::model::tree::build(res, &[]);
        built
            .tree
            .files()
            .filter(|(p, _)| p.ends_with("/uuid") || p.ends_with("/mac") || p.ends_with("/.request"))
            .filter(|(p, _)| !p.contains(".example.com/uuid") && !p.contains(".example.com/mac"))
            .map(|(p, c)| (p.to_string(), String::from_utf8_lossy(c).into_owned()))
            .collect()
    }

    #[test]
    fn extended_resources_are_served_per_resource_and_container() {
        let snap = snapshot(&extended_fixture());
        let res = resolve(&snap, &Selection::default());
        assert!(res.is_complete(), "{:?}", res.missing);
        assert!(res.warnings.is_empty(), "{:?}", res.warnings);
        assert_eq!(
            claim_names(snap.pod.as_ref().unwrap(), &Selection::default()),
            vec!["p-extended-resources-x1"],
            "one claim to fetch for both resources"
        );
        let files = tree_of(&res);
        let want = [
            ("deviceclass.resource.kubernetes.io/nic.example.com/a/0/.request", "container-1-request-0"),
            ("deviceclass.resource.kubernetes.io/nic.example.com/a/0/mac", "M"),
            ("gpu.example.com/gpu/a/0/.request", "container-0-request-0"),
            ("gpu.example.com/gpu/a/0/uuid", "G0"),
            ("gpu.example.com/gpu/a/1/.request", "container-1-request-1"),
            ("gpu.example.com/gpu/a/1/uuid", "G1"),
            ("gpu.example.com/gpu/b/0/.request", "container-2-request-0"),
            ("gpu.example.com/gpu/b/0/uuid", "G2"),
            ("gpu.example.com/gpu/setup/0/.request", "container-0-request-0"),
            ("gpu.example.com/gpu/setup/0/uuid", "G0"),
        ];
        let want: Vec<(String, String)> = want.iter().map(|(p, c)| (p.to_string(), c.to_string())).collect();
        assert_eq!(files, want);
        assert!(res.claims.iter().all(|c| c.origin == ClaimOrigin::ExtendedResource && !c.from_template()));
    }

    #[test]
    fn extended_resources_in_the_standard_view_are_under_the_claims_own_requests() {
        let res = resolve(&snapshot(&extended_fixture()), &Selection::default());
        let mut warnings = Vec::new();
        let view = crate::model::metadata::build(&res, &mut Default::default(), &mut warnings);
        let paths: Vec<&str> = view.files().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            vec![
                "resourceclaims/p-extended-resources-x1/container-0-request-0/gpu.example.com-metadata.json",
                "resourceclaims/p-extended-resources-x1/container-1-request-0/net.example.com-metadata.json",
                "resourceclaims/p-extended-resources-x1/container-1-request-1/gpu.example.com-metadata.json",
                "resourceclaims/p-extended-resources-x1/container-2-request-0/gpu.example.com-metadata.json",
            ]
        );
        let shared = String::from_utf8_lossy(view.files().next().unwrap().1).into_owned();
        let first: serde_json::Value = serde_json::from_str(shared.lines().next().unwrap()).unwrap();
        assert_eq!(
            first["requests"][0]["devices"].as_array().unwrap().len(),
            1,
            "a shared request lists its device once"
        );
        assert!(first.get("podClaimName").is_none());
    }

    #[test]
    fn extended_resources_wait_for_scheduling_and_say_when_dra_did_not_serve_them() {
        let unscheduled = EXTENDED_POD.replace("  nodeName: n1\n", "");
        let unscheduled = &unscheduled[..unscheduled.find("status:").unwrap()];
        let res = resolve(&snapshot(unscheduled), &Selection::default());
        assert_eq!(res.missing, vec![Missing::NotScheduled], "the scheduler has not chosen yet");
        assert!(res.warnings.is_empty(), "{:?}", res.warnings);

        // Scheduled without a status: a device plugin served them (or no DeviceClass names them).
        let plugin = &EXTENDED_POD[..EXTENDED_POD.find("status:").unwrap()];
        let res = resolve(&snapshot(plugin), &Selection::default());
        assert!(res.is_complete(), "{:?}", res.missing);
        assert!(
            res.warnings.iter().any(|w| w.contains("none of its extended resources")
                && w.contains("gpu.example.com/gpu")
                && w.contains("device plugin")),
            "{:?}",
            res.warnings
        );

        // The status names a claim not created (or not seen) yet: waited for.
        let res = resolve(&snapshot(EXTENDED_POD), &Selection::default());
        assert!(
            res.missing.iter().any(
                |m| matches!(m, Missing::ClaimNotFound { claim_name, .. } if claim_name == "p-extended-resources-x1")
            ),
            "{:?}",
            res.missing
        );
        assert!(res.missing.iter().all(|m| !m.is_permanent()));
        assert!(res.missing[0].to_string().starts_with("extended resource "), "{}", res.missing[0]);
    }

    #[test]
    fn extended_resources_are_selected_by_name() {
        let snap = snapshot(&extended_fixture());
        let res = resolve(&snap, &Selection { claims: vec!["gpu.example.com/gpu".into()] });
        assert!(res.is_complete(), "{:?}", res.missing);
        assert_eq!(res.claims.len(), 1);
        assert_eq!(res.claims[0].pod_claim, "gpu.example.com/gpu");
        let res = resolve(&snap, &Selection { claims: vec!["nvidia.com/gpu".into()] });
        assert!(matches!(&res.missing[..], [m @ Missing::UnknownExtendedResource { .. }] if m.is_permanent()));
        assert!(res.missing[0].to_string().contains("gpu.example.com/gpu"), "{}", res.missing[0]);
        // Before scheduling the name may still come: waited for.
        let unscheduled = EXTENDED_POD.replace("  nodeName: n1\n", "");
        let unscheduled = &unscheduled[..unscheduled.find("status:").unwrap()];
        let res = resolve(&snapshot(unscheduled), &Selection { claims: vec!["nvidia.com/gpu".into()] });
        assert_eq!(res.missing, vec![Missing::NotScheduled]);
    }

    #[test]
    fn a_hostile_extended_status_never_reaches_the_tree() {
        let hostile = extended_fixture()
            .replace("    requestMappings:\n", "    requestMappings:\n    - {containerName: ghost, resourceName: gpu.example.com/gpu, requestName: container-0-request-0}\n    - {containerName: b, resourceName: '../../x', requestName: container-2-request-0}\n    - {containerName: b, resourceName: gpu.example.com/gpu, requestName: '../r'}\n");
        let res = resolve(&snapshot(&hostile), &Selection::default());
        assert_eq!(res.warnings.iter().filter(|w| w.contains("skipped")).count(), 3, "{:?}", res.warnings);
        let built = crate::model::tree::build(&res, &[]);
        assert!(built.tree.files().all(|(p, _)| !p.contains("ghost") && !p.contains("..")));
        let bad_name =
            extended_fixture().replace("resourceClaimName: p-extended-resources-x1", "resourceClaimName: '../etc'");
        let res = resolve(&snapshot(&bad_name), &Selection::default());
        assert!(res.missing.iter().any(|m| m.to_string().contains("not a ResourceClaim name")), "{:?}", res.missing);
    }
    #[test]
    fn admin_access_and_device_taints_are_served_per_device() {
        let mut text = POD.to_string();
        text += &claim(
            "p-gpu-abc",
            "[{request: gpu, driver: gpu.example.com, pool: n1, device: g0, adminAccess: true}, {request: gpu, driver: gpu.example.com, pool: n1, device: g1}]",
            "",
        );
        text += &slice(
            "s",
            "nodeName: n1",
            "gpu.example.com",
            "n1",
            1,
            1,
            "[{name: g0, taints: [{key: example.com/overheated, value: 'true', effect: NoSchedule}, {key: maintenance, effect: None}]}, {name: g1}]",
        );
        let res = resolve(&snapshot(&text), &Selection { claims: vec!["gpu".into()] });
        assert!(res.is_complete(), "{:?}", res.missing);
        let built = crate::model::tree::build(&res, &[]);
        let file = |p: &str| built.tree.get(p).map(|c| String::from_utf8_lossy(c).into_owned());
        assert_eq!(file("gpu/gpu/0/.adminAccess").as_deref(), Some("true"));
        assert_eq!(
            file("gpu/gpu/0/.taints").as_deref(),
            Some("example.com/overheated=true:NoSchedule,maintenance:None")
        );
        assert_eq!(file("gpu/gpu/1/.adminAccess"), None, "only admin-access allocations are marked");
        assert_eq!(file("gpu/gpu/1/.taints"), None, "no taints, no file");
        let record: serde_json::Value = serde_json::from_str(&file("gpu/gpu/0/.json").unwrap()).unwrap();
        assert_eq!(record["adminAccess"], true);
        assert_eq!(record["taints"][1], serde_json::json!({"key": "maintenance", "effect": "None"}));
    }
}
