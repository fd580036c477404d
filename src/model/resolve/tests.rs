use super::*;
use crate::model::objects::FileObjects;
use crate::model::status_data::RawData;
use drafs_test_support::{Build, ClaimBuilder, PodBuilder, SliceBuilder};
use serde_json::{Value, json};

/// The objects as `--from-file` reads them (the YAML form users dump is
/// tested with the loader, in model/objects.rs).
fn snapshot(objects: &[Value]) -> Snapshot {
    let text: Vec<String> = objects.iter().map(Value::to_string).collect();
    FileObjects::parse("test", &text.join("\n---\n")).unwrap().into_snapshot("test", None).unwrap()
}

/// Pod ns/p on n1: `gpu` from a template (claim p-gpu-abc once generated),
/// `nic` the shared claim shared-nic, `opt` from a template that needed none;
/// `generated` is the status of the template claims besides `opt`.
fn pod_with(generated: &[(&str, &str)]) -> Value {
    PodBuilder::new("ns", "p")
        .uid("u1")
        .node("n1")
        .template_claim("gpu", "t")
        .claim("nic", "shared-nic")
        .template_claim("opt", "t2")
        .generated(generated)
        .no_claim_needed("opt")
        .build()
}

fn pod() -> Value {
    pod_with(&[("gpu", "p-gpu-abc")])
}

/// Claim `name` in ns, allocated (add results).
fn claim(name: &str) -> ClaimBuilder {
    ClaimBuilder::new("ns", name).uid(&format!("u-{name}")).generation(3).allocated()
}

/// A slice of pool n1 of gpu.example.com on node n1.
fn gpu_slice(name: &str, generation: i64, count: i64) -> SliceBuilder {
    SliceBuilder::new(name, "gpu.example.com", "n1").node("n1").generation(generation).slice_count(count)
}

/// The network driver's pool `fabric`, on all nodes, with device nic-7.
fn fabric(generation: i64, attributes: Value) -> Value {
    SliceBuilder::new("fabric", "net.example.com", "fabric")
        .all_nodes()
        .generation(generation)
        .device("nic-7", attributes)
        .build()
}

/// A string attribute.
fn s(value: &str) -> Value {
    json!({ "string": value })
}

fn full_fixture() -> Vec<Value> {
    vec![
        pod(),
        claim("p-gpu-abc")
            .result("gpu/large", "gpu.example.com", "n1", "g1")
            .result("gpu/large", "gpu.example.com", "n1", "g0")
            .build(),
        claim("shared-nic")
            .result("rdma", "net.example.com", "fabric", "nic-7")
            .device_status(json!({"driver": "net.example.com", "pool": "fabric", "device": "nic-7",
                "networkData": {"interfaceName": "net1", "ips": ["10.0.0.1/24", "fd00::1/64"], "hardwareAddress": "aa:bb"},
                "data": {"vf": 3}}))
            .build(),
        gpu_slice("old", 1, 1).device("g1", json!({"uuid": s("STALE")})).build(),
        gpu_slice("new", 2, 1)
            .device("g0", json!({"uuid": s("G0")}))
            .device("g1", json!({"uuid": s("G1"), "cc": {"version": "9.0.0"}, "numa": {"ints": [0, 1]},
                "resource.kubernetes.io/pciBusID": s("0000:3b:00.0"), "../escape": s("x"), "weird": {"float": 1.5}}))
            .capacity(json!({"memory": {"value": "80Gi"}}))
            .build(),
        fabric(4, json!({"ifName": s("ens1"), "rdma": {"bool": true}, "mtu": {"int": 9000}})),
    ]
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
    let mut objects = full_fixture();
    objects.push(
        gpu_slice("other-node", 9, 1)
            .node("n2")
            .device("g0", json!({"uuid": s("WRONG")}))
            .device("g1", json!({"uuid": s("WRONG")}))
            .build(),
    );
    let res = resolve(&snapshot(&objects), &Selection::default());
    assert!(res.is_complete(), "{:?}", res.missing);
    let uuid = QualifiedName::parse("uuid", "gpu.example.com").unwrap();
    assert_eq!(res.claims[0].devices[0].attributes[&uuid].value, AttrValue::String("G1".into()));
}

#[test]
fn reports_what_is_missing() {
    let objects = [pod_with(&[]), claim("shared-nic").result("rdma", "net.example.com", "fabric", "nic-7").build()];
    let res = resolve(&snapshot(&objects), &Selection::default());
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
    let objects = [
        pod(),
        ClaimBuilder::new("ns", "shared-nic").build(),
        claim("p-gpu-abc").result("gpu", "gpu.example.com", "n1", "g9").build(),
        gpu_slice("part", 2, 2).device("g0", json!({})).build(),
    ];
    let res = resolve(&snapshot(&objects), &Selection::default());
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
    let status = |share: &str, interface: &str| {
        json!({"driver": "net.example.com", "pool": "fabric", "device": "nic-7", "shareID": share,
            "networkData": {"interfaceName": interface}})
    };
    let objects = [
        pod(),
        claim("shared-nic")
            .result("rdma", "net.example.com", "fabric", "nic-7")
            .with(json!({"shareID": "s2"}))
            .device_status(status("s1", "wrong"))
            .device_status(status("s2", "right"))
            .build(),
        fabric(1, json!({})),
    ];
    let res = resolve(&snapshot(&objects), &Selection { claims: vec!["nic".into()] });
    let status = res.claims[0].devices[0].status.as_ref().unwrap();
    assert_eq!(status.interface_name.as_deref(), Some("right"));
}

#[test]
fn consumed_capacity_is_named_like_capacity_and_kept_verbatim() {
    let objects = [
        pod(),
        claim("p-gpu-abc")
            .result("gpu", "gpu.example.com", "n1", "g0")
            .with(json!({"shareID": "7f9c2d1e-0b3a-4c5d-8e6f-a1b2c3d4e5f6",
                "consumedCapacity": {"memory": "20Gi", "example.com/bandwidth": "1.5e3", "../../escape": "1", "a/b/c": "2"}}))
            .result("gpu", "gpu.example.com", "n1", "g1")
            .build(),
        gpu_slice("s", 1, 1)
            .device("g0", json!({}))
            .capacity(json!({"memory": {"value": "80Gi"}}))
            .device("g1", json!({}))
            .build(),
    ];
    let res = resolve(&snapshot(&objects), &Selection { claims: vec!["gpu".into()] });
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
    let device = |slice: &str, generation: i64, device: &str, v: &str| {
        gpu_slice(slice, generation, 2).device(device, json!({"v": s(v)})).build()
    };
    let mut objects = vec![
        pod(),
        claim("p-gpu-abc")
            .result("gpu", "gpu.example.com", "n1", "g0")
            .result("gpu", "gpu.example.com", "n1", "g1")
            .build(),
        device("a-old", 1, "g0", "one"),
        device("b", 1, "g1", "one"),
        device("a", 2, "g0", "two"),
    ];
    let sel = Selection { claims: vec!["gpu".into()] };
    let res = resolve(&snapshot(&objects), &sel);
    assert!(res.is_complete(), "{:?}", res.missing);
    let v = QualifiedName::parse("v", "gpu.example.com").unwrap();
    let values: Vec<String> = res.claims[0].devices.iter().map(|d| d.attributes[&v].value.to_text()).collect();
    assert_eq!(values, vec!["one", "one"], "one generation, the complete one");
    // The second slice of generation 2 arrives: generation 2 counts.
    objects.push(device("b2", 2, "g1", "two"));
    let res = resolve(&snapshot(&objects), &sel);
    let values: Vec<String> = res.claims[0].devices.iter().map(|d| d.attributes[&v].value.to_text()).collect();
    assert_eq!(values, vec!["two", "two"]);
}

#[test]
fn a_device_missing_from_the_generation_in_use_names_the_one_being_published() {
    let objects = [
        pod(),
        claim("p-gpu-abc").result("gpu", "gpu.example.com", "n1", "g9").build(),
        gpu_slice("a", 1, 1).device("g0", json!({})).build(),
        gpu_slice("b", 2, 3).device("g9", json!({})).build(),
    ];
    let res = resolve(&snapshot(&objects), &Selection { claims: vec!["gpu".into()] });
    let message = res.missing[0].to_string();
    assert!(
        message.contains("pool n1 at generation 1 does not list it")
            && message.contains("generation 2 is being published: 1 of 3"),
        "{message}"
    );
}
/// A pod that asks for extended resources backed by DRA, not yet scheduled:
/// `setup` (init) and `a` share request 0 (the scheduler lets `a` reuse it),
/// `a` has one more, `b` its own; `nic` is a second resource, by its implicit name.
fn extended_pod() -> PodBuilder {
    PodBuilder::new("ns", "p")
        .uid("u1")
        .init_container("setup", "i")
        .limits(json!({"gpu.example.com/gpu": "1"}))
        .container("a", "i")
        .limits(json!({"gpu.example.com/gpu": "2", "deviceclass.resource.kubernetes.io/nic.example.com": "1"}))
        .container("b", "i")
        .limits(json!({"gpu.example.com/gpu": "1"}))
}

const EXTENDED_CLAIM: &str = "p-extended-resources-x1";

/// The scheduler's mapping of `container`'s `resource` to a request of the claim.
fn mapping(container: &str, resource: &str, request: &str) -> Value {
    json!({"containerName": container, "resourceName": resource, "requestName": request})
}

/// [`extended_pod`] scheduled to n1, its extended resources in claim `claim`
/// after the mappings `before` (a test's own) and the scheduler's.
fn extended_pod_served(claim: &str, before: &[Value]) -> Value {
    let gpu = "gpu.example.com/gpu";
    let mut mappings = before.to_vec();
    mappings.extend([
        mapping("setup", gpu, "container-0-request-0"),
        mapping("a", gpu, "container-0-request-0"),
        mapping("a", gpu, "container-1-request-1"),
        mapping("a", "deviceclass.resource.kubernetes.io/nic.example.com", "container-1-request-0"),
        mapping("b", gpu, "container-2-request-0"),
    ]);
    extended_pod().node("n1").extended_status(json!({"resourceClaimName": claim, "requestMappings": mappings})).build()
}

/// `pod` with its extended resources' claim and the devices of both drivers.
fn extended_fixture_of(pod: Value) -> Vec<Value> {
    let gpu = |request, device| (request, "gpu.example.com", "n1", device);
    let results = [
        gpu("container-0-request-0", "g0"),
        gpu("container-1-request-1", "g1"),
        ("container-1-request-0", "net.example.com", "n1", "nic-0"),
        gpu("container-2-request-0", "g2"),
    ];
    let claim = results.iter().fold(claim(EXTENDED_CLAIM), |c, (r, d, p, dev)| c.result(r, d, p, dev));
    vec![
        pod,
        claim.build(),
        gpu_slice("g", 1, 1)
            .device("g0", json!({"uuid": s("G0")}))
            .device("g1", json!({"uuid": s("G1")}))
            .device("g2", json!({"uuid": s("G2")}))
            .build(),
        SliceBuilder::new("n", "net.example.com", "n1").node("n1").device("nic-0", json!({"mac": s("M")})).build(),
    ]
}

fn extended_fixture() -> Vec<Value> {
    extended_fixture_of(extended_pod_served(EXTENDED_CLAIM, &[]))
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
    assert_eq!(first["requests"][0]["devices"].as_array().unwrap().len(), 1, "a shared request lists its device once");
    assert!(first.get("podClaimName").is_none());
}

#[test]
fn extended_resources_wait_for_scheduling_and_say_when_dra_did_not_serve_them() {
    let res = resolve(&snapshot(&[extended_pod().build()]), &Selection::default());
    assert_eq!(res.missing, vec![Missing::NotScheduled], "the scheduler has not chosen yet");
    assert!(res.warnings.is_empty(), "{:?}", res.warnings);

    // Scheduled without a status: a device plugin served them (or no DeviceClass names them).
    let plugin = extended_pod().node("n1").build();
    let res = resolve(&snapshot(&[plugin]), &Selection::default());
    assert!(res.is_complete(), "{:?}", res.missing);
    assert!(
        res.warnings.iter().any(|w| w.contains("none of its extended resources")
            && w.contains("gpu.example.com/gpu")
            && w.contains("device plugin")),
        "{:?}",
        res.warnings
    );

    // The status names a claim not created (or not seen) yet: waited for.
    let res = resolve(&snapshot(&[extended_pod_served(EXTENDED_CLAIM, &[])]), &Selection::default());
    assert!(
        res.missing
            .iter()
            .any(|m| matches!(m, Missing::ClaimNotFound { claim_name, .. } if claim_name == "p-extended-resources-x1")),
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
    let unscheduled = extended_pod().build();
    let res = resolve(&snapshot(&[unscheduled]), &Selection { claims: vec!["nvidia.com/gpu".into()] });
    assert_eq!(res.missing, vec![Missing::NotScheduled]);
}

#[test]
fn a_hostile_extended_status_never_reaches_the_tree() {
    let hostile = [
        mapping("ghost", "gpu.example.com/gpu", "container-0-request-0"),
        mapping("b", "../../x", "container-2-request-0"),
        mapping("b", "gpu.example.com/gpu", "../r"),
    ];
    let hostile = extended_fixture_of(extended_pod_served(EXTENDED_CLAIM, &hostile));
    let res = resolve(&snapshot(&hostile), &Selection::default());
    assert_eq!(res.warnings.iter().filter(|w| w.contains("skipped")).count(), 3, "{:?}", res.warnings);
    let built = crate::model::tree::build(&res, &[]);
    assert!(built.tree.files().all(|(p, _)| !p.contains("ghost") && !p.contains("..")));
    let bad_name = extended_fixture_of(extended_pod_served("../etc", &[]));
    let res = resolve(&snapshot(&bad_name), &Selection::default());
    assert!(res.missing.iter().any(|m| m.to_string().contains("not a ResourceClaim name")), "{:?}", res.missing);
}
#[test]
fn admin_access_and_device_taints_are_served_per_device() {
    let objects = [
        pod(),
        claim("p-gpu-abc")
            .result("gpu", "gpu.example.com", "n1", "g0")
            .with(json!({"adminAccess": true}))
            .result("gpu", "gpu.example.com", "n1", "g1")
            .build(),
        gpu_slice("s", 1, 1)
            .device("g0", json!({}))
            .with(json!({"taints": [{"key": "example.com/overheated", "value": "true", "effect": "NoSchedule"},
                {"key": "maintenance", "effect": "None"}]}))
            .device("g1", json!({}))
            .build(),
    ];
    let res = resolve(&snapshot(&objects), &Selection { claims: vec!["gpu".into()] });
    assert!(res.is_complete(), "{:?}", res.missing);
    let built = crate::model::tree::build(&res, &[]);
    let file = |p: &str| built.tree.get(p).map(|c| String::from_utf8_lossy(c).into_owned());
    assert_eq!(file("gpu/gpu/0/.adminAccess").as_deref(), Some("true"));
    assert_eq!(file("gpu/gpu/0/.taints").as_deref(), Some("example.com/overheated=true:NoSchedule,maintenance:None"));
    assert_eq!(file("gpu/gpu/1/.adminAccess"), None, "only admin-access allocations are marked");
    assert_eq!(file("gpu/gpu/1/.taints"), None, "no taints, no file");
    let record: serde_json::Value = serde_json::from_str(&file("gpu/gpu/0/.json").unwrap()).unwrap();
    assert_eq!(record["adminAccess"], true);
    assert_eq!(record["taints"][1], serde_json::json!({"key": "maintenance", "effect": "None"}));
}
