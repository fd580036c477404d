//! The `.json` record: a device's (`<claim>/<request>/<index>/.json`) and the
//! whole tree's (`/.json`), one family of types for its writer (the tree) and
//! its readers (`drafs probe`, users' programs), so the two cannot drift.
//!
//! A reader takes what it knows and leaves the rest: every member has a
//! default, so a record from an older or newer drafs still reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::model::health::{Health, HealthState};
use crate::model::names::QualifiedName;
use crate::model::resolve::{ClaimOrigin, DeviceStatus, PodIdentity, Resolution, ResolvedClaim, ResolvedDevice, Taint};

/// The whole resolution, the tree's top-level `.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Record {
    pub pod: PodIdentity,
    pub ready: bool,
    pub missing: Vec<String>,
    pub claims: Vec<ClaimRecord>,
}

/// One claim of the pod, with its devices.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClaimRecord {
    pub name: String,
    pub resource_claim_name: String,
    pub from_template: bool,
    pub devices: Vec<DeviceRecord>,
    /// `name` is the resource; each device's directory is its container.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub extended_resource: bool,
}

/// One device: identity, typed attributes, capacity, status, health. The
/// driver's data stays the text it is (`status_data::RawData`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DeviceRecord {
    /// As allocated (`gpu/large` for a subrequest).
    pub request: String,
    pub index: usize,
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub attributes: Map<String, Value>,
    pub capacity: Map<String, Value>,
    #[serde(rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub consumed_capacity: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<DeviceStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    /// An extended resource's device (in the whole `.json`): its container, its directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

impl Record {
    /// The record of a resolution, ready when nothing is `missing`.
    pub fn of(res: &Resolution, missing: &[String]) -> Record {
        Record {
            pod: res.pod.clone(),
            ready: missing.is_empty(),
            missing: missing.to_vec(),
            claims: res.claims.iter().map(ClaimRecord::of).collect(),
        }
    }
}

impl ClaimRecord {
    fn of(claim: &ResolvedClaim) -> ClaimRecord {
        let extended_resource = claim.origin == ClaimOrigin::ExtendedResource;
        ClaimRecord {
            name: claim.pod_claim.clone(),
            resource_claim_name: claim.claim_name.clone(),
            from_template: claim.from_template(),
            devices: claim
                .devices
                .iter()
                .map(|device| DeviceRecord {
                    container: extended_resource.then(|| device.request.clone()),
                    ..DeviceRecord::of(device)
                })
                .collect(),
            extended_resource,
        }
    }
}

impl DeviceRecord {
    /// The record of one device, as its own `.json` holds it.
    pub fn of(device: &ResolvedDevice) -> DeviceRecord {
        let attributes = device
            .attributes
            .iter()
            .map(|(k, a)| (k.to_string(), serde_json::to_value(&a.value).unwrap_or(Value::Null)))
            .collect();
        let quantities = |q: &BTreeMap<QualifiedName, String>| -> Map<String, Value> {
            q.iter().map(|(k, v)| (k.to_string(), Value::String(v.clone()))).collect()
        };
        DeviceRecord {
            request: device.full_request.clone(),
            index: device.index,
            driver: device.driver.clone(),
            pool: device.pool.clone(),
            device: device.device.clone(),
            attributes,
            capacity: quantities(&device.capacity),
            share_id: device.share_id.clone(),
            admin_access: device.admin_access,
            taints: device.taints.clone(),
            consumed_capacity: quantities(&device.consumed),
            status: device.status.clone(),
            health: device.health.clone(),
            container: None,
        }
    }

    /// The device's directory under its claim: an extended resource's
    /// container, else the request before any `/`.
    pub fn directory(&self) -> &str {
        match &self.container {
            Some(container) => container,
            None => self.request.split('/').next().unwrap_or_default(),
        }
    }

    pub fn is_unhealthy(&self) -> bool {
        self.health.as_ref().is_some_and(|h| h.state == HealthState::Unhealthy)
    }
}
