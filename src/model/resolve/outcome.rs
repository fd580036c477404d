//! What a resolution is: the devices and claims resolved, what is missing
//! and why, and the pod they are for. `publish` and `cmd` read these.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::DeviceAttribute;
use serde::{Deserialize, Serialize};

use super::subject;
use crate::model::health::Health;
use crate::model::names::QualifiedName;
use crate::model::status_data::RawData;

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
    pub(super) fn from_api(attr: &DeviceAttribute) -> Result<Self, String> {
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
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
