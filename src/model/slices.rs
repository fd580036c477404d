//! Keeping of ResourceSlices only what the pod's devices need.
//!
//! A node may publish thousands of devices (one per CPU core, one per SR-IOV
//! VF) while the pod holds a handful. Slices are decoded from the API's raw
//! JSON with every device left as unparsed text; only the devices the pod's
//! claims reference are parsed, the rest are dropped before they cost memory.
//! Of every slice of a referenced pool the pool's name, generation and slice
//! count stay (the resolver picks the newest generation with them); slices of
//! other pools and slices bound to another node are dropped whole, as the
//! scheduler would not count them for this node either.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The devices the pod's claims are allocated, as (driver, pool, device).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFilter {
    devices: BTreeSet<(String, String, String)>,
    pools: BTreeSet<(String, String)>,
}

impl DeviceFilter {
    pub fn new(devices: impl IntoIterator<Item = (String, String, String)>) -> Self {
        let devices: BTreeSet<_> = devices.into_iter().collect();
        let pools = devices.iter().map(|(d, p, _)| (d.clone(), p.clone())).collect();
        DeviceFilter { devices, pools }
    }

    pub fn wants_pool(&self, driver: &str, pool: &str) -> bool {
        // BTreeSet<(String, String)> cannot be probed with borrowed strs; pools are few.
        self.pools.iter().any(|(d, p)| d == driver && p == pool)
    }

    pub fn wants(&self, driver: &str, pool: &str, device: &str) -> bool {
        self.devices.iter().any(|(d, p, n)| d == driver && p == pool && n == device)
    }

    /// True when every device of `self` is also in `other`.
    pub fn is_subset(&self, other: &DeviceFilter) -> bool {
        self.devices.is_subset(&other.devices)
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

/// Whether a slice may hold devices for a pod on `node`: one published for
/// another node never does (the scheduler would not have used it there).
pub fn eligible_for(spec: &ResourceSliceSpec, node: Option<&str>) -> bool {
    match (spec.node_name.as_deref().filter(|n| !n.is_empty()), node) {
        (Some(slice_node), Some(node)) => slice_node == node,
        _ => true,
    }
}

/// What is kept of a decoded slice: the slice with only the wanted devices, or
/// nothing when no wanted pool is in it or it is for another node.
pub fn trim(mut slice: ResourceSlice, filter: &DeviceFilter, node: Option<&str>) -> Option<ResourceSlice> {
    let spec = &mut slice.spec;
    if !eligible_for(spec, node) || !filter.wants_pool(&spec.driver, &spec.pool.name) {
        return None;
    }
    let (driver, pool) = (spec.driver.clone(), spec.pool.name.clone());
    if let Some(devices) = &mut spec.devices {
        devices.retain(|d| filter.wants(&driver, &pool, &d.name));
    }
    spec.shared_counters = None;
    slice.metadata.managed_fields = None;
    Some(slice)
}

/// A slice as the API sends it, its devices left unparsed.
#[derive(Deserialize)]
struct RawSlice<'a> {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(borrow)]
    spec: RawSpec<'a>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec<'a> {
    driver: String,
    pool: ResourcePool,
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    all_nodes: Option<bool>,
    #[serde(default)]
    node_selector: Option<NodeSelector>,
    #[serde(default)]
    per_device_node_selection: Option<bool>,
    /// kube-apiserver v1.34 writes a slice without devices as `"devices": null`.
    #[serde(default, borrow, deserialize_with = "null_as_empty")]
    devices: Vec<&'a RawValue>,
}

/// A list that may be `null` (an empty Go slice without `omitempty`): empty.
fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<Vec<T>>::deserialize(deserializer).map(Option::unwrap_or_default)
}

#[derive(Deserialize)]
struct DeviceName<'a> {
    #[serde(borrow)]
    name: std::borrow::Cow<'a, str>,
}

/// Decode one slice from its JSON text, parsing only the wanted devices.
pub fn decode(
    raw: &str,
    filter: &DeviceFilter,
    node: Option<&str>,
) -> Result<Option<ResourceSlice>, serde_json::Error> {
    let RawSlice { mut metadata, spec } = serde_json::from_str(raw)?;
    let mut kept = ResourceSliceSpec {
        driver: spec.driver,
        pool: spec.pool,
        node_name: spec.node_name,
        all_nodes: spec.all_nodes,
        node_selector: spec.node_selector,
        per_device_node_selection: spec.per_device_node_selection,
        ..Default::default()
    };
    if !eligible_for(&kept, node) || !filter.wants_pool(&kept.driver, &kept.pool.name) {
        return Ok(None);
    }
    let mut devices: Vec<Device> = Vec::new();
    for device in spec.devices {
        let name: DeviceName = serde_json::from_str(device.get())?;
        if filter.wants(&kept.driver, &kept.pool.name, &name.name) {
            devices.push(serde_json::from_str(device.get())?);
        }
    }
    kept.devices = Some(devices);
    metadata.managed_fields = None;
    Ok(Some(ResourceSlice { metadata, spec: kept }))
}

/// One page of a list, its items left unparsed.
#[derive(Deserialize)]
pub struct RawList<'a> {
    #[serde(default)]
    pub metadata: RawListMeta,
    #[serde(default, borrow, deserialize_with = "null_as_empty")]
    pub items: Vec<&'a RawValue>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RawListMeta {
    #[serde(default, rename = "continue")]
    pub continue_token: Option<String>,
    #[serde(default)]
    pub resource_version: Option<String>,
}

/// One line of a watch stream, its object left unparsed.
#[derive(Deserialize)]
pub struct RawEvent<'a> {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(borrow)]
    pub object: &'a RawValue,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice_json(node: Option<&str>, pool: &str, devices: &[&str]) -> String {
        let devices: Vec<_> =
            devices.iter().map(|d| json!({"name": d, "attributes": {"uuid": {"string": format!("U-{d}")}}})).collect();
        let mut spec = json!({"driver": "gpu.example.com", "pool": {"name": pool, "generation": 3, "resourceSliceCount": 2},
            "devices": devices, "sharedCounters": [{"name": "c", "counters": {}}]});
        match node {
            Some(n) => spec["nodeName"] = json!(n),
            None => spec["allNodes"] = json!(true),
        }
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "s", "resourceVersion": "7"}, "spec": spec})
        .to_string()
    }

    fn filter() -> DeviceFilter {
        DeviceFilter::new([("gpu.example.com".into(), "p".into(), "g1".into())])
    }

    /// kube-apiserver v1.34 answers a slice published without devices (and
    /// an empty list) with `null`, not `[]`.
    #[test]
    fn null_devices_and_items_are_empty() {
        let text = slice_json(Some("n"), "p", &[]).replace("\"devices\":[]", "\"devices\":null");
        assert!(text.contains("\"devices\":null"), "{text}");
        let s = decode(&text, &filter(), Some("n")).unwrap().unwrap();
        assert_eq!(s.spec.devices, Some(Vec::new()));
        let list: RawList = serde_json::from_str(r#"{"metadata": {"resourceVersion": "5"}, "items": null}"#).unwrap();
        assert!(list.items.is_empty());
    }

    #[test]
    fn keeps_only_wanted_devices_and_the_pool() {
        let s = decode(&slice_json(Some("n"), "p", &["g0", "g1", "g2"]), &filter(), Some("n")).unwrap().unwrap();
        let devices = s.spec.devices.unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].name, "g1");
        assert_eq!(devices[0].attributes.as_ref().unwrap()["uuid"].string.as_deref(), Some("U-g1"));
        assert_eq!((s.spec.pool.generation, s.spec.pool.resource_slice_count), (3, 2));
        assert!(s.spec.shared_counters.is_none());
        assert_eq!(s.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn a_slice_of_a_wanted_pool_without_wanted_devices_still_counts_for_the_pool() {
        let s = decode(&slice_json(Some("n"), "p", &["g5"]), &filter(), Some("n")).unwrap().unwrap();
        assert_eq!(s.spec.devices.unwrap().len(), 0);
    }

    #[test]
    fn other_pools_and_other_nodes_are_dropped() {
        assert!(decode(&slice_json(Some("n"), "other", &["g1"]), &filter(), Some("n")).unwrap().is_none());
        assert!(decode(&slice_json(Some("m"), "p", &["g1"]), &filter(), Some("n")).unwrap().is_none());
        assert!(decode(&slice_json(None, "p", &["g1"]), &filter(), Some("n")).unwrap().is_some());
    }

    #[test]
    fn trim_agrees_with_decode() {
        let text = slice_json(Some("n"), "p", &["g0", "g1"]);
        let full: ResourceSlice = serde_json::from_str(&text).unwrap();
        let trimmed = trim(full, &filter(), Some("n")).unwrap();
        assert_eq!(Some(trimmed), decode(&text, &filter(), Some("n")).unwrap());
        let other: ResourceSlice = serde_json::from_str(&slice_json(Some("m"), "p", &["g1"])).unwrap();
        assert!(trim(other, &filter(), Some("n")).is_none());
    }

    #[test]
    fn malformed_device_is_an_error_not_a_panic() {
        let text = slice_json(Some("n"), "p", &["g1"]).replace("\"attributes\"", "\"attributes\": 5, \"x\"");
        assert!(decode(&text, &filter(), Some("n")).is_err());
        assert!(decode("{", &filter(), None).is_err());
    }
}

/// A ResourceClaim whose `status.devices[].data` is left unparsed, so that a
/// driver's deeply nested or otherwise undecodable data cannot make the whole
/// claim (and the pod's readiness) undecodable.
#[derive(Deserialize)]
struct SalvagedClaim<'a> {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<k8s_openapi::api::resource::v1::ResourceClaimSpec>,
    #[serde(default, borrow)]
    status: Option<SalvagedStatus<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SalvagedStatus<'a> {
    #[serde(default)]
    allocation: Option<k8s_openapi::api::resource::v1::AllocationResult>,
    #[serde(default)]
    reserved_for: Option<Vec<k8s_openapi::api::resource::v1::ResourceClaimConsumerReference>>,
    #[serde(default, borrow)]
    devices: Option<Vec<SalvagedDeviceStatus<'a>>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SalvagedDeviceStatus<'a> {
    driver: String,
    pool: String,
    device: String,
    #[serde(default, rename = "shareID")]
    share_id: Option<String>,
    #[serde(default)]
    conditions: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>,
    #[serde(default)]
    network_data: Option<k8s_openapi::api::resource::v1::NetworkDeviceData>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
}

/// Decode a ResourceClaim; a device's `data` that cannot be decoded is dropped
/// with a warning (returned), the rest of the claim is kept.
pub fn decode_claim(
    raw: &str,
) -> Result<(k8s_openapi::api::resource::v1::ResourceClaim, Vec<String>), serde_json::Error> {
    use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim, ResourceClaimStatus};
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    let first_error = match serde_json::from_str::<ResourceClaim>(raw) {
        Ok(claim) => return Ok((claim, Vec::new())),
        Err(e) => e,
    };
    let Ok(salvaged) = serde_json::from_str::<SalvagedClaim>(raw) else { return Err(first_error) };
    let name = salvaged.metadata.name.clone().unwrap_or_default();
    let mut warnings = Vec::new();
    let status = salvaged.status.map(|s| ResourceClaimStatus {
        allocation: s.allocation,
        reserved_for: s.reserved_for,
        devices: s.devices.map(|devices| {
            devices
                .into_iter()
                .map(|d| {
                    let data = d.data.and_then(|raw| match serde_json::from_str(raw.get()) {
                        Ok(value) => Some(RawExtension(value)),
                        Err(e) => {
                            warnings.push(format!(
                                "ResourceClaim {name}: status data of device {}/{}/{} skipped: {e}",
                                d.driver, d.pool, d.device
                            ));
                            None
                        }
                    });
                    AllocatedDeviceStatus {
                        driver: d.driver,
                        pool: d.pool,
                        device: d.device,
                        share_id: d.share_id,
                        conditions: d.conditions,
                        network_data: d.network_data,
                        data,
                    }
                })
                .collect()
        }),
    });
    if warnings.is_empty() {
        // The trouble was elsewhere: report the original error.
        return Err(first_error);
    }
    Ok((ResourceClaim { metadata: salvaged.metadata, spec: salvaged.spec, status }, warnings))
}

#[cfg(test)]
mod claim_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deeply_nested_device_data_costs_only_that_value() {
        let mut deep = String::from("1");
        for _ in 0..140 {
            deep = format!("{{\"a\":{deep}}}");
        }
        let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {},
            "status": {
                "allocation": {"devices": {"results": [{"request": "r", "driver": "d.example.com", "pool": "p", "device": "x"}]}},
                "devices": [{"driver": "d.example.com", "pool": "p", "device": "x",
                    "networkData": {"interfaceName": "net1"}, "data": "DEEP"}]}})
        .to_string()
        .replace("\"DEEP\"", &deep);
        assert!(
            serde_json::from_str::<k8s_openapi::api::resource::v1::ResourceClaim>(&claim).is_err(),
            "too deep for serde"
        );
        let (decoded, warnings) = decode_claim(&claim).unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("d.example.com/p/x"), "{warnings:?}");
        let status = decoded.status.unwrap();
        let device = &status.devices.unwrap()[0];
        assert!(device.data.is_none());
        assert_eq!(device.network_data.as_ref().unwrap().interface_name.as_deref(), Some("net1"));
        assert_eq!(status.allocation.unwrap().devices.unwrap().results.unwrap()[0].device, "x");
        // Anything else wrong is still an error.
        assert!(decode_claim("{\"metadata\": 5}").is_err());
    }
}
