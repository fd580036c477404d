//! A driver's `status.devices[].data`, run as the real binary against the
//! test API server: members as files, a dynamic MIG device's UUID, hostile
//! and deeply nested data, and numbers kept to the driver's exact bytes.

use drafs_test_support as support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// A safety net only: every run normally ends by itself long before.
const LIMIT: Duration = Duration::from_secs(90);

/// Data nested deeper than a `serde_json::Value` parses (128 levels) is kept
/// as the text it is; only its members are bounded.
#[test]
fn deeply_nested_device_data_is_kept_raw_not_fatal() {
    let (api, env, mut claim) = nic_without_status();
    let mut deep = json!(1);
    for _ in 0..140 {
        deep = json!({ "a": deep });
    }
    claim["status"]["devices"] = json!([{"driver": "net.example.com", "pool": "n1", "device": "nic0",
        "networkData": {"interfaceName": "eth7"}, "data": deep}]);
    api.apply(claim);
    let dir = env.path("dra");
    let out = env.init(&["--timeout", "20s"]);
    assert_ok(&out);
    let tree = read_tree(&dir);
    assert_eq!(tree["net/eth/0/.status/interfaceName"], "eth7");
    assert_eq!(tree["net/eth/0/.status/data"], deep.to_string());
    assert!(!tree.keys().any(|k| k.contains("/.status/data.d/")), "only a deepest leaf, beyond 8 levels");
    let err = stderr(&out);
    assert_eq!(err.matches("status data deeper than 8 levels skipped").count(), 1, "{err}");
}

/// examples/offline/mig-dynamic.yaml: the MIG device's UUID is only in the
/// claim's `status.devices[].data`, which the driver wrote when it created it.
const MIG_UUID: &str = "MIG-5c8a2f1e-7b3d-5e9a-8c4f-1d2e3f4a5b6c";

#[test]
fn driver_data_members_of_a_dynamic_mig_device_in_the_tree_and_get() {
    let (_api, env) = example("research", "notebook-0", "examples/offline/mig-dynamic.yaml");
    let out = env.init(&["--timeout", "30s", "--require", "mig/mig/0/.status/data.d/uuid"]);
    assert_ok(&out);
    assert!(!stderr(&out).contains("status data"), "a clean example warns of nothing: {}", stderr(&out));
    let tree = read_tree(&env.path("dra"));
    let members: Vec<(&str, &str)> =
        tree.iter().filter_map(|(k, v)| Some((k.strip_prefix("mig/mig/0/.status/data.d/")?, v.as_str()))).collect();
    assert_eq!(
        members,
        vec![
            ("computeInstanceID", "0"),
            ("deviceNodes", "/dev/nvidia0,/dev/nvidia-caps/nvidia-cap120,/dev/nvidia-caps/nvidia-cap121"),
            ("gpu/index", "0"),
            ("gpu/pciBusID", "0000:4e:00.0"),
            ("gpu/uuid", "GPU-2b1a0f9e-8d7c-4b6a-9f5e-4d3c2b1a0f9e"),
            ("gpuInstanceID", "13"),
            ("placement/size", "1"),
            ("placement/start", "3"),
            ("profile", "1g.10gb"),
            ("uuid", MIG_UUID),
        ]
    );
    assert!(!tree.contains_key("mig/mig/0/uuid"), "the placement has no uuid attribute");
    // The raw JSON stays, and the device record has the data as the driver wrote it.
    let raw: Value = serde_json::from_str(&tree["mig/mig/0/.status/data"]).unwrap();
    assert_eq!(raw["gpu"]["uuid"], "GPU-2b1a0f9e-8d7c-4b6a-9f5e-4d3c2b1a0f9e");
    let record: Value = serde_json::from_str(&tree["mig/mig/0/.json"]).unwrap();
    assert_eq!(record["status"]["data"], raw);
    assert_eq!(record["status"].as_object().unwrap().len(), 1, "{record}");

    let out = env.run(&["get"], LIMIT);
    assert_ok(&out);
    let table = stdout(&out);
    let row = table.lines().find(|l| l.contains(".status/data.d/uuid")).unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells, vec!["mig", "mig", "0", "gpu.nvidia.com", "gpu-0-mig-1g10gb-3", ".status/data.d/uuid", MIG_UUID]);
    assert!(table.contains(".status/data.d/gpu/index"), "{table}");
}

#[test]
fn hostile_driver_data_is_skipped_with_warnings_and_never_leaves_the_tree() {
    let (api, env, mut claim) = nic_without_status();
    let mut wide = serde_json::Map::new();
    for i in 0..1100 {
        wide.insert(format!("k{i}"), json!(i));
    }
    let mut deep = json!("bottom");
    for _ in 0..20 {
        deep = json!({ "d": deep });
    }
    claim["status"]["devices"] = json!([{"driver": "net.example.com", "pool": "n1", "device": "nic0",
        "data": {"../../escape": "x", "a/b": "x", ".ready": "x", "pci": "0000:3b:00.2", "vfs": [{"pci": "0000:3b:00.3"}],
                 "wide": wide, "deep": deep}}]);
    api.apply(claim);
    let dir = env.path("dra");
    let out = env.init(&["--timeout", "20s", "--require", "net/eth/0/.status/data.d/pci"]);
    assert_ok(&out);
    let tree = read_tree(&dir);
    assert_eq!(tree["net/eth/0/.status/data.d/pci"], "0000:3b:00.2");
    let members: Vec<&String> = tree.keys().filter(|k| k.contains("/.status/data.d/")).collect();
    assert_eq!(members.len(), 1024, "bounded per device");
    assert!(members.iter().all(|k| k.split('/').count() <= 5 + 8), "bounded depth: {members:?}");
    assert!(tree.keys().all(|k| !k.contains("escape") && !k.ends_with("/b")), "{:?}", tree.keys());
    assert!(!dir.parent().unwrap().join("escape").exists());
    let err = stderr(&out);
    for said in [
        "status data key \"../../escape\" skipped",
        "status data key \"a/b\" skipped",
        "status data key \".ready\" skipped",
        "status data member \"vfs\" skipped: a list holding objects",
        "status data deeper than 8 levels skipped",
        "status data has more than 1024 members",
    ] {
        assert_eq!(err.matches(said).count(), 1, "{said:?} said once:\n{err}");
    }
}

/// Issue 25: numbers no 64-bit integer or float holds, and escapes, in a
/// driver's data: the bytes the API server sent, exactly.
const EXACT: &str = r#"{"big":340282366920938463463374607431768211455,"neg":-18446744073709551617,"f":1.5e400,"small":3,"nested":{"x":12345678901234567890123},"s":"a\u003cb\/c"}"#;

/// The member files of [`EXACT`] under `.status/data.d/`.
const EXACT_MEMBERS: [(&str, &str); 6] = [
    ("big", "340282366920938463463374607431768211455"),
    ("f", "1.5e400"),
    ("neg", "-18446744073709551617"),
    ("nested/x", "12345678901234567890123"),
    ("s", "a<b/c"),
    ("small", "3"),
];

fn assert_exact_data(tree: &std::collections::BTreeMap<String, String>, device: &str) {
    assert_eq!(tree[&format!("{device}/.status/data")], EXACT, "the raw file is the bytes the API server sent");
    let members: Vec<(&str, &str)> = tree
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(&format!("{device}/.status/data.d/"))?, v.as_str())))
        .collect();
    assert_eq!(members, EXACT_MEMBERS);
    let record = &tree[&format!("{device}/.json")];
    assert!(record.contains(&format!(r#""status":{{"data":{EXACT}}}"#)), "{record}");
    let whole = drafs::model::json_text::compact(&tree[".json"]).unwrap();
    assert!(whole.contains(&format!(r#""status":{{"data":{EXACT}}}"#)), "{}", tree[".json"]);
}

#[test]
fn driver_data_keeps_big_numbers_exactly() {
    let (api, env, mut claim) = nic_without_status();
    api.send_raw("DRIVER-DATA", EXACT);
    claim["status"]["devices"] =
        json!([{"driver": "net.example.com", "pool": "n1", "device": "nic0", "data": "DRIVER-DATA"}]);
    api.apply(claim);
    let out = env.init(&["--timeout", "10s", "--require", "net/eth/0/.status/data.d/big"]);
    assert_ok(&out);
    assert!(!stderr(&out).contains("status data"), "nothing skipped: {}", stderr(&out));
    assert_exact_data(&read_tree(&env.path("dra")), "net/eth/0");

    // `drafs get` shows the digits.
    let out = env.run(&["get"], LIMIT);
    assert_ok(&out);
    let table = stdout(&out);
    let row = table.lines().find(|l| l.contains(".status/data.d/big")).unwrap_or_else(|| panic!("{table}"));
    assert_eq!(row.split_whitespace().last(), Some("340282366920938463463374607431768211455"), "{table}");
}

#[test]
fn driver_data_of_a_json_file_keeps_big_numbers_exactly() {
    // The objects of nic_without_status with the driver's data, as one JSON List.
    let mut claim = claim("ml", "c", Some(&[("eth", "net.example.com", "n1", "nic0")]));
    claim["status"]["devices"] =
        json!([{"driver": "net.example.com", "pool": "n1", "device": "nic0", "data": "DRIVER-DATA"}]);
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        pod("ml", "p", "n1", &[("net", Ok("c"))], &[]),
        claim,
        slice("s", "net.example.com", "n1", 1, Some("n1"), &[("nic0", json!({"mtu": {"int": 1500}}))]),
    ]});
    let text = serde_json::to_string_pretty(&list).unwrap().replace("\"DRIVER-DATA\"", EXACT);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("objects.json");
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(drafs_bin())
        .args(["init", "--from-file", file.to_str().unwrap(), "--dir", dir.path().join("dra").to_str().unwrap()])
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(!stderr(&out).contains("status data"), "nothing skipped: {}", stderr(&out));
    assert_exact_data(&read_tree(&dir.path().join("dra")), "net/eth/0");
}
