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

use crate::model::status_data;

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
    use drafs_test_support::{Build, SliceBuilder};
    use serde_json::json;

    /// A slice of pool `pool` (generation 3 of 2 slices) with these devices and a shared counter set.
    fn slice_json(node: Option<&str>, pool: &str, devices: &[&str]) -> String {
        let mut s = SliceBuilder::new("s", "gpu.example.com", pool).resource_version("7").generation(3).slice_count(2);
        s = match node {
            Some(n) => s.node(n),
            None => s.all_nodes(),
        };
        for d in devices {
            s = s.device(d, json!({"uuid": {"string": format!("U-{d}")}}));
        }
        let mut slice = s.build();
        slice["spec"]["sharedCounters"] = json!([{"name": "c", "counters": {}}]);
        slice.to_string()
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

/// A ResourceClaim as the API sends it, each device's `status.devices[].data`
/// left as the text it is: a `serde_json::Value` would round a number beyond
/// 64 bits, rewrite a string's escapes, and refuse data nested deeper than 128
/// levels or a number beyond f64, which would cost the whole claim.
#[derive(Deserialize)]
struct RawClaim<'a> {
    #[serde(default, rename = "apiVersion")]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<k8s_openapi::api::resource::v1::ResourceClaimSpec>,
    #[serde(default, borrow)]
    status: Option<RawClaimStatus<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawClaimStatus<'a> {
    #[serde(default)]
    allocation: Option<k8s_openapi::api::resource::v1::AllocationResult>,
    #[serde(default)]
    reserved_for: Option<Vec<k8s_openapi::api::resource::v1::ResourceClaimConsumerReference>>,
    #[serde(default, borrow)]
    devices: Option<Vec<RawDeviceStatus<'a>>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDeviceStatus<'a> {
    #[serde(default)]
    driver: String,
    #[serde(default)]
    pool: String,
    #[serde(default)]
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

/// Decode a ResourceClaim from its JSON text. Each device's `data` is carried
/// as the exact text it was (`status_data::carry`), whatever it holds.
pub fn decode_claim(raw: &str) -> Result<k8s_openapi::api::resource::v1::ResourceClaim, serde_json::Error> {
    use k8s_openapi::Resource;
    use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim, ResourceClaimStatus};
    use serde::de::{Error, Unexpected};
    let claim: RawClaim = serde_json::from_str(raw)?;
    // As k8s-openapi decodes one: another kind or version is an error, none is fine (a list's items have none).
    for (given, wanted) in [(&claim.api_version, ResourceClaim::API_VERSION), (&claim.kind, ResourceClaim::KIND)] {
        if let Some(given) = given.as_deref().filter(|given| *given != wanted) {
            return Err(serde_json::Error::invalid_value(Unexpected::Str(given), &wanted));
        }
    }
    let status = claim.status.map(|s| ResourceClaimStatus {
        allocation: s.allocation,
        reserved_for: s.reserved_for,
        devices: s.devices.map(|devices| {
            devices
                .into_iter()
                .map(|d| AllocatedDeviceStatus {
                    driver: d.driver,
                    pool: d.pool,
                    device: d.device,
                    share_id: d.share_id,
                    conditions: d.conditions,
                    network_data: d.network_data,
                    data: d.data.map(status_data::carry),
                })
                .collect()
        }),
    });
    Ok(ResourceClaim { metadata: claim.metadata, spec: claim.spec, status })
}

#[cfg(test)]
mod claim_tests {
    use super::*;
    use serde_json::json;

    fn claim_with_data(data: &str) -> String {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "9", "generation": 2},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "d", "count": 1}}]}},
            "status": {
                "allocation": {"devices": {"results": [{"request": "r", "driver": "d.example.com", "pool": "p", "device": "x",
                    "shareID": "s1", "consumedCapacity": {"memory": "1Gi"}}],
                    "config": [{"source": "FromClaim", "opaque": {"driver": "d.example.com", "parameters": {"a": [1, {"b": null}]}}}]},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}],
                "devices": [{"driver": "d.example.com", "pool": "p", "device": "x", "shareID": "s1",
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "R", "message": ""}],
                    "networkData": {"interfaceName": "net1", "ips": ["10.0.0.1/24"], "hardwareAddress": "aa:bb"}, "data": "DATA"},
                    {"driver": "d.example.com", "pool": "p", "device": "y"}]}})
        .to_string()
        .replace("\"DATA\"", data)
    }

    #[test]
    fn a_claim_decodes_as_k8s_openapi_decodes_it_but_the_data() {
        use k8s_openapi::api::resource::v1::ResourceClaim;
        let text = claim_with_data(r#"{"vf":3,"ids":[1,2.5],"s":"x"}"#);
        let mut decoded = decode_claim(&text).unwrap();
        let mut upstream: ResourceClaim = serde_json::from_str(&text).unwrap();
        let device =
            |c: &mut ResourceClaim| c.status.as_mut().unwrap().devices.as_mut().unwrap()[0].data.take().unwrap();
        let (carried, value) = (device(&mut decoded), device(&mut upstream));
        assert_eq!(status_data::carried(&carried).get(), value.0.to_string());
        assert_eq!(decoded, upstream, "everything else is the same");
        // No status, a list's item (no apiVersion, no kind), null data: the same too.
        for text in [
            r#"{"metadata": {"name": "c"}, "spec": {}}"#,
            r#"{"metadata": {"name": "c"}, "status": {"devices": [{"driver": "d", "pool": "p", "device": "x", "data": null}]}}"#,
            r#"{"metadata": {"name": "c"}, "status": {"devices": null, "allocation": null}}"#,
        ] {
            assert_eq!(decode_claim(text).unwrap(), serde_json::from_str::<ResourceClaim>(text).unwrap(), "{text}");
        }
        // What k8s-openapi refuses, decode_claim refuses.
        for text in [
            r#"{"kind": "ResourceSlice"}"#,
            r#"{"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim"}"#,
            r#"{"metadata": 5}"#,
            r#"{"status": {"devices": [{"driver": "d", "pool": "p", "device": "x", "conditions": 7}]}}"#,
            "{",
        ] {
            assert!(decode_claim(text).is_err(), "{text}");
            assert!(serde_json::from_str::<ResourceClaim>(text).is_err(), "{text}");
        }
    }

    /// Issue 25: the data is carried as the text the API server sent, numbers
    /// no Value holds and depths it refuses included, and costs nothing else.
    #[test]
    fn device_data_is_carried_as_the_text_sent() {
        let mut deep = String::from("1");
        for _ in 0..140 {
            deep = format!("{{\"a\":{deep}}}");
        }
        let exact = r#"{"big":340282366920938463463374607431768211455,"neg":-18446744073709551617,"f":1.5e400,"small":3,"nested":{"x":12345678901234567890123},"s":"a\u003cb\/c"}"#;
        for data in [exact, deep.as_str()] {
            let text = claim_with_data(data);
            assert!(
                serde_json::from_str::<k8s_openapi::api::resource::v1::ResourceClaim>(&text).is_err(),
                "more than a Value holds"
            );
            let decoded = decode_claim(&text).unwrap();
            let status = decoded.status.unwrap();
            let devices = status.devices.unwrap();
            assert_eq!(status_data::carried(devices[0].data.as_ref().unwrap()).get(), data);
            assert!(devices[1].data.is_none());
            assert_eq!(devices[0].network_data.as_ref().unwrap().interface_name.as_deref(), Some("net1"));
            assert_eq!(status.allocation.unwrap().devices.unwrap().results.unwrap()[0].device, "x");
        }
    }
}
