//! The `/dra` tree as a value: relative paths to file contents.
//!
//! Every backend (atomic files, FUSE) serves a [`Tree`]; building one is pure, so
//! the layout (the contract users depend on) is tested without touching a disk.
//! What changes between two trees is computed where it is used, on inodes, by
//! `fsmodel::invalidations`.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::record::{self, DeviceRecord};
use crate::model::resolve::{Resolution, ResolvedDevice};
use crate::model::{json_text, layout};

/// Errors in tree paths: a path that is not a clean relative path, or that would
/// turn a file into a directory (or back).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("path {0:?} is not a clean relative path")]
    BadPath(String),
    #[error("path {0:?} conflicts with an existing file or directory")]
    Conflict(String),
    #[error(
        "--require {0:?} must be CLAIM/REQUEST/INDEX/ATTRIBUTE (e.g. gpu/gpu/0/uuid) or, for an extended resource, DOMAIN/RESOURCE/CONTAINER/INDEX/ATTRIBUTE (e.g. gpu.example.com/gpu/app/0/uuid)"
    )]
    BadRequire(String),
    /// Said by `drafs node` at publish and by `inject`/the webhook before: one message.
    #[error(
        "{0} is a value the driver reports when it prepares the device, after the volume is published; it cannot be required at publish time (read it when it appears, or require it in an init container)"
    )]
    KnownAfterPrepare(String),
}

/// A complete tree: file paths (`/`-separated, relative) to contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tree {
    files: BTreeMap<String, Vec<u8>>,
}

/// Check that a relative path has only normal, non-empty components.
pub fn is_clean_relative(path: &str) -> bool {
    !path.is_empty() && path.split('/').all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
}

impl Tree {
    pub fn insert(&mut self, path: &str, content: impl Into<Vec<u8>>) -> Result<(), TreeError> {
        if !is_clean_relative(path) {
            return Err(TreeError::BadPath(path.into()));
        }
        // A file may not sit where a directory is, nor below a file.
        let as_dir = format!("{path}/");
        let below = self.files.range(as_dir.clone()..).next().is_some_and(|(k, _)| k.starts_with(&as_dir));
        let above = path.match_indices('/').any(|(i, _)| self.files.contains_key(&path[..i]));
        if below || above {
            return Err(TreeError::Conflict(path.into()));
        }
        self.files.insert(path.to_string(), content.into());
        Ok(())
    }

    /// A tree from (path, content) pairs; panics on a bad path (for tests and fixtures).
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Tree {
        let mut t = Tree::default();
        for (path, content) in pairs {
            t.insert(path, *content).expect("a valid tree path");
        }
        t
    }

    pub fn get(&self, path: &str) -> Option<&[u8]> {
        self.files.get(path).map(Vec::as_slice)
    }

    /// True when `path` is a file or a directory of the tree.
    pub fn contains(&self, path: &str) -> bool {
        let as_dir = format!("{path}/");
        self.files.contains_key(path)
            || self.files.range(as_dir.clone()..).next().is_some_and(|(k, _)| k.starts_with(&as_dir))
    }

    pub fn files(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.files.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Every directory implied by the files, parents before children ("" is the root).
    pub fn dirs(&self) -> BTreeSet<String> {
        let mut dirs = BTreeSet::from([String::new()]);
        for path in self.files.keys() {
            for (i, _) in path.match_indices('/') {
                dirs.insert(path[..i].to_string());
            }
        }
        dirs
    }

    /// The names directly under the root.
    pub fn top_level(&self) -> BTreeSet<String> {
        self.files.keys().map(|k| k.split('/').next().unwrap_or(k).to_string()).collect()
    }
}

/// A `--require` path: `CLAIM/REQUEST/INDEX/ATTRIBUTE`, the attribute in any form
/// the tree has (`uuid`, `gpu.nvidia.com/uuid`, `.status/interfaceName`), or for
/// an extended resource `DOMAIN/RESOURCE/CONTAINER/INDEX/ATTRIBUTE` (a claim
/// name never has a dot, a resource's domain does or is followed by one more
/// component).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequirePath(String);

impl std::str::FromStr for RequirePath {
    type Err = TreeError;
    fn from_str(s: &str) -> Result<Self, TreeError> {
        let s = s.trim_matches('/');
        let parts: Vec<&str> = s.split('/').collect();
        let index_at = |i: usize| parts.len() > i + 1 && parts[i].parse::<usize>().is_ok();
        if !is_clean_relative(s) || !(index_at(2) || index_at(3)) {
            return Err(TreeError::BadRequire(s.into()));
        }
        Ok(RequirePath(s.to_string()))
    }
}

impl std::fmt::Display for RequirePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl RequirePath {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether it names a value that exists only once the kubelet prepared
    /// the device (the claim's `status.devices`, the health the kubelet reports):
    /// the kubelet prepares after it publishes a CSI volume, so requiring one
    /// there would keep the publish, and so the pod, waiting forever.
    pub fn known_after_prepare(&self) -> bool {
        self.0
            .split('/')
            .any(|part| part == layout::STATUS_DIR || part == layout::HEALTH || part == layout::HEALTH_MESSAGE)
    }
}

/// Whether a CSI volume may require all of `paths` (see
/// [`RequirePath::known_after_prepare`]); the first it may not, as the error
/// `drafs node` refuses its publish with, so that admission refuses it first.
pub fn require_at_publish(paths: &[RequirePath]) -> Result<(), TreeError> {
    match paths.iter().find(|p| p.known_after_prepare()) {
        Some(p) => Err(TreeError::KnownAfterPrepare(p.to_string())),
        None => Ok(()),
    }
}

/// Where an entry of a device directory comes from; the table of `get` shows the
/// attribute, capacity, consumed capacity and status kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Identity,
    Attribute,
    ShortAttribute,
    Capacity,
    Consumed,
    Status,
    Health,
    Record,
}

/// The entries of one device directory: (path relative to it, kind, content).
pub fn device_entries(device: &ResolvedDevice) -> Vec<(String, EntryKind, String)> {
    use EntryKind::*;
    let mut out = vec![
        (layout::DRIVER.to_string(), Identity, device.driver.clone()),
        (layout::POOL.to_string(), Identity, device.pool.clone()),
        (layout::DEVICE.to_string(), Identity, device.device.clone()),
        (layout::REQUEST.to_string(), Identity, device.full_request.clone()),
    ];
    if let Some(share) = &device.share_id {
        out.push((layout::SHARE_ID.to_string(), Identity, share.clone()));
    }
    if device.admin_access {
        out.push((layout::ADMIN_ACCESS.to_string(), Identity, "true".to_string()));
    }
    if !device.taints.is_empty() {
        let text = device.taints.iter().map(|t| t.to_text()).collect::<Vec<_>>().join(",");
        out.push((layout::TAINTS.to_string(), Health, text));
    }
    for (name, attr) in &device.attributes {
        out.push((name.to_string(), Attribute, attr.value.to_text()));
        if name.domain == device.driver {
            out.push((name.name.clone(), ShortAttribute, attr.value.to_text()));
        }
    }
    for (name, quantity) in &device.capacity {
        out.push((format!("{}/{name}", layout::CAPACITY_DIR), Capacity, quantity.clone()));
    }
    for (name, quantity) in &device.consumed {
        out.push((format!("{}/{name}", layout::CONSUMED_DIR), Consumed, quantity.clone()));
    }
    if let Some(status) = &device.status {
        if let Some(v) = &status.interface_name {
            out.push((layout::STATUS_INTERFACE_NAME.into(), Status, v.clone()));
        }
        if !status.ips.is_empty() {
            out.push((layout::STATUS_IPS.into(), Status, status.ips.join(",")));
        }
        if let Some(v) = &status.hardware_address {
            out.push((layout::STATUS_HARDWARE_ADDRESS.into(), Status, v.clone()));
        }
        if let Some(v) = &status.data {
            out.push((layout::STATUS_DATA.into(), Status, v.get().to_string()));
        }
        for (member, content) in &status.data_members {
            out.push((format!("{}/{member}", layout::STATUS_DATA_DIR), Status, content.clone()));
        }
    }
    if let Some(health) = &device.health {
        out.push((layout::HEALTH.into(), Health, health.state.to_string()));
        if let Some(message) = &health.message {
            out.push((layout::HEALTH_MESSAGE.into(), Health, message.clone()));
        }
    }
    let record = serde_json::to_string(&DeviceRecord::of(device)).unwrap_or_default();
    out.push((layout::RECORD.into(), Record, record));
    out
}

/// A tree built from a resolution, with its readiness.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BuiltTree {
    pub tree: Tree,
    /// Everything asked for that is not there: resolver gaps and absent `--require` paths.
    pub missing: Vec<String>,
    pub warnings: Vec<String>,
}

impl BuiltTree {
    pub fn is_ready(&self) -> bool {
        self.missing.is_empty()
    }
}

/// Lay out the tree for a resolution; `.ready` exists only when nothing is missing.
pub fn build(res: &Resolution, requires: &[RequirePath]) -> BuiltTree {
    let mut built = BuiltTree {
        missing: res.missing.iter().map(ToString::to_string).collect(),
        warnings: res.warnings.clone(),
        ..Default::default()
    };
    for claim in &res.claims {
        for device in &claim.devices {
            let base = format!("{}/{}/{}", claim.pod_claim, device.request, device.index);
            for (rel, _, content) in device_entries(device) {
                if let Err(e) = built.tree.insert(&format!("{base}/{rel}"), content) {
                    built.warnings.push(format!("claim {}: entry skipped: {e}", claim.pod_claim));
                }
            }
        }
    }
    for require in requires {
        if !built.tree.contains(require.as_str()) {
            built.missing.push(format!("required path {require} does not exist"));
        }
    }
    let whole = record::Record::of(res, &built.missing);
    // Indented from the compact text, so that the drivers' data keeps its bytes there too.
    let whole = serde_json::to_string(&whole).map(|text| json_text::pretty(&text)).unwrap_or_default();
    // Reserved top-level names never clash: claim names are DNS labels.
    let _ = built.tree.insert(layout::RECORD, whole);
    if built.missing.is_empty() {
        let _ = built.tree.insert(layout::READY, "");
    }
    built
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::objects::FileObjects;
    use crate::model::resolve::{Selection, resolve};
    use serde_json::{Value, json};

    #[test]
    fn insert_refuses_escapes_and_conflicts() {
        let mut t = Tree::default();
        for bad in ["", "/abs", "a/../b", "a//b", "./a", "a/\0"] {
            assert_eq!(t.insert(bad, "x"), Err(TreeError::BadPath(bad.into())));
        }
        t.insert("a/b", "1").unwrap();
        assert!(matches!(t.insert("a", "x"), Err(TreeError::Conflict(_))));
        assert!(matches!(t.insert("a/b/c", "x"), Err(TreeError::Conflict(_))));
        assert!(t.contains("a") && t.contains("a/b") && !t.contains("a/c"));
        assert_eq!(t.dirs(), BTreeSet::from(["".to_string(), "a".to_string()]));
    }

    #[test]
    fn require_paths_are_validated() {
        assert!("gpu/gpu/0/uuid".parse::<RequirePath>().is_ok());
        assert!("gpu/gpu/0/resource.kubernetes.io/pciBusID".parse::<RequirePath>().is_ok());
        for bad in ["gpu/gpu/uuid", "gpu/../0/x", "gpu/gpu/x/uuid"] {
            assert!(bad.parse::<RequirePath>().is_err(), "{bad}");
        }
    }

    #[test]
    fn only_what_the_scheduler_decided_can_be_required_at_publish() {
        let paths = |list: &[&str]| list.iter().map(|p| p.parse::<RequirePath>().unwrap()).collect::<Vec<_>>();
        let known = paths(&["gpu/gpu/0/uuid", "gpu/gpu/0/.capacity/memory", "gpu.example.com/gpu/app/0/.device"]);
        assert_eq!(require_at_publish(&known), Ok(()));
        for prepared in [
            "nic/nic/0/.status/interfaceName",
            "mig/mig/0/.status/data.d/uuid",
            "gpu/gpu/0/.health",
            "gpu/gpu/0/.healthMessage",
        ] {
            let mut list = known.clone();
            list.extend(paths(&[prepared, "nic/nic/0/.status/ips"]));
            let err = require_at_publish(&list).unwrap_err();
            assert_eq!(err, TreeError::KnownAfterPrepare(prepared.into()), "the first that cannot be met");
            assert!(err.to_string().starts_with(&format!("{prepared} is a value the driver reports when it prepares")));
        }
        // An attribute merely named like one of drafs's files is the driver's own.
        assert_eq!(require_at_publish(&paths(&["gpu/gpu/0/statusText", "gpu/gpu/0/health.example.com/x"])), Ok(()));
    }

    /// One GPU with attributes and capacity, allocated whole.
    const GPU: &str = r#"
kind: Pod
metadata: {name: p, namespace: ns}
spec: {nodeName: n, resourceClaims: [{name: gpu, resourceClaimName: c}]}
---
kind: ResourceClaim
metadata: {name: c, namespace: ns}
spec: {}
status: {allocation: {devices: {results: [{request: gpu, driver: gpu.example.com, pool: n, device: g0}]}}}
---
kind: ResourceSlice
metadata: {name: s}
spec:
  driver: gpu.example.com
  nodeName: n
  pool: {name: n, generation: 1, resourceSliceCount: 1}
  devices:
  - name: g0
    attributes: {uuid: {string: GPU-1}, resource.kubernetes.io/pciBusID: {string: "0000:3b:00.0"}}
    capacity: {memory: {value: 80Gi}}
"#;

    fn resolved(text: &str) -> Resolution {
        resolve(&FileObjects::parse("t", text).unwrap().into_snapshot("t", None).unwrap(), &Selection::default())
    }

    #[test]
    fn layout_of_a_gpu() {
        let res = resolved(GPU);
        let ok: RequirePath = "gpu/gpu/0/uuid".parse().unwrap();
        let built = build(&res, std::slice::from_ref(&ok));
        assert!(built.is_ready(), "{:?}", built.missing);
        let t = &built.tree;
        assert_eq!(t.get("gpu/gpu/0/uuid"), Some(&b"GPU-1"[..]));
        assert_eq!(t.get("gpu/gpu/0/gpu.example.com/uuid"), Some(&b"GPU-1"[..]));
        assert_eq!(t.get("gpu/gpu/0/resource.kubernetes.io/pciBusID"), Some(&b"0000:3b:00.0"[..]));
        assert_eq!(t.get("gpu/gpu/0/pciBusID"), None, "foreign domains have no short form");
        assert_eq!(t.get("gpu/gpu/0/.capacity/gpu.example.com/memory"), Some(&b"80Gi"[..]));
        assert_eq!(t.get("gpu/gpu/0/.device"), Some(&b"g0"[..]));
        assert!(t.get(".ready").is_some());
        let record: Value = serde_json::from_slice(t.get("gpu/gpu/0/.json").unwrap()).unwrap();
        assert_eq!(record["attributes"]["gpu.example.com/uuid"], json!({"string": "GPU-1"}));

        let absent: RequirePath = "gpu/gpu/0/serial".parse().unwrap();
        let built = build(&res, &[absent]);
        assert!(!built.is_ready());
        assert!(built.tree.get(".ready").is_none());
        assert!(built.missing[0].contains("gpu/gpu/0/serial"));
    }

    #[test]
    fn consumed_capacity_of_a_shared_gpu() {
        let text = GPU
            .replace(
                "device: g0}]}}}",
                "device: g0, shareID: 7f9c2d1e-0b3a-4c5d-8e6f-a1b2c3d4e5f6, consumedCapacity: {memory: 20Gi, example.com/sm: '25'}}, {request: gpu, driver: gpu.example.com, pool: n, device: g1}]}}}",
            )
            .replace("  - name: g0\n", "  - {name: g1, capacity: {memory: {value: 80Gi}}}\n  - name: g0\n    allowMultipleAllocations: true\n");
        let built = build(&resolved(&text), &[]);
        assert!(built.is_ready(), "{:?}", built.missing);
        let t = &built.tree;
        assert_eq!(t.get("gpu/gpu/0/.consumed/gpu.example.com/memory"), Some(&b"20Gi"[..]));
        assert_eq!(t.get("gpu/gpu/0/.consumed/example.com/sm"), Some(&b"25"[..]));
        assert_eq!(t.get("gpu/gpu/0/.capacity/gpu.example.com/memory"), Some(&b"80Gi"[..]), "the total stays");
        assert!(!t.contains("gpu/gpu/1/.consumed"), "absent when the result has none");
        let record: Value = serde_json::from_slice(t.get("gpu/gpu/0/.json").unwrap()).unwrap();
        assert_eq!(record["consumedCapacity"], json!({"gpu.example.com/memory": "20Gi", "example.com/sm": "25"}));
        assert_eq!(record["capacity"], json!({"gpu.example.com/memory": "80Gi"}));
        let record: Value = serde_json::from_slice(t.get("gpu/gpu/1/.json").unwrap()).unwrap();
        assert!(record.get("consumedCapacity").is_none(), "{record}");
        let whole: Value = serde_json::from_slice(t.get(".json").unwrap()).unwrap();
        assert_eq!(whole["claims"][0]["devices"][0]["consumedCapacity"]["gpu.example.com/memory"], "20Gi");
        // One family of types writes and reads the record: what is written reads back whole.
        let res = resolved(&text);
        let read: record::Record = serde_json::from_slice(t.get(".json").unwrap()).unwrap();
        assert_eq!(read, record::Record::of(&res, &[]));
        assert_eq!(read.claims[0].devices[1].directory(), "gpu");
        let device: DeviceRecord = serde_json::from_slice(t.get("gpu/gpu/0/.json").unwrap()).unwrap();
        assert_eq!(device, DeviceRecord::of(&res.claims[0].devices[0]));
    }

    /// [`GPU`] with the driver's `status.devices[].data` set to `data` (JSON text).
    fn gpu_with_data(data: &str) -> String {
        let text = GPU.replace(
            "device: g0}]}}}",
            &format!("device: g0}}]}}}}, devices: [{{driver: gpu.example.com, pool: n, device: g0, data: {data}}}]}}"),
        );
        assert_ne!(text, GPU);
        text
    }

    #[test]
    fn driver_data_members_beside_the_raw_json() {
        let data = r#"{"uuid": "MIG-5c8a2f1e", "profile": "1g.10gb", "gpu": {"index": 0, "uuid": "GPU-1"}, "ids": [3, 4], "../x": 1, "vfs": [{"a": 1}], "gone": null}"#;
        let built = build(&resolved(&gpu_with_data(data)), &[]);
        assert!(built.is_ready(), "{:?}", built.missing);
        let t = &built.tree;
        let text = |p: &str| t.get(p).map(|v| std::str::from_utf8(v).unwrap().to_string());
        // The raw file, as before: the driver's JSON, compact, in its order.
        assert_eq!(
            text("gpu/gpu/0/.status/data").as_deref(),
            Some(
                r#"{"uuid":"MIG-5c8a2f1e","profile":"1g.10gb","gpu":{"index":0,"uuid":"GPU-1"},"ids":[3,4],"../x":1,"vfs":[{"a":1}],"gone":null}"#
            )
        );
        let members: Vec<(&str, String)> = t
            .files()
            .filter_map(|(p, v)| {
                Some((p.strip_prefix("gpu/gpu/0/.status/data.d/")?, String::from_utf8_lossy(v).into()))
            })
            .collect();
        assert_eq!(
            members,
            vec![
                ("gpu/index", "0".to_string()),
                ("gpu/uuid", "GPU-1".into()),
                ("ids", "3,4".into()),
                ("profile", "1g.10gb".into()),
                ("uuid", "MIG-5c8a2f1e".into()),
            ]
        );
        assert!(!t.contains("gpu/gpu/0/x") && !t.contains("gpu/x") && !t.contains("x"), "nothing escapes");
        let context = "claim gpu, request gpu, device 0 (gpu.example.com/n/g0)";
        for skipped in ["status data key \"../x\" skipped", "status data member \"vfs\" skipped"] {
            assert!(
                built.warnings.iter().any(|w| w.starts_with(context) && w.contains(skipped)),
                "{skipped}: {:?}",
                built.warnings
            );
        }
        assert_eq!(built.warnings.len(), 2, "no conflicts, nothing else: {:?}", built.warnings);
        // The record keeps the raw data and only it.
        let record: Value = serde_json::from_slice(t.get("gpu/gpu/0/.json").unwrap()).unwrap();
        assert_eq!(record["status"], json!({"data": serde_json::from_str::<Value>(data).unwrap()}));
    }

    /// Issue 25: data with numbers no 64-bit integer or float holds, and a
    /// string with escapes, as the API server sends a driver's bytes.
    const EXACT: &str = r#"{"big":340282366920938463463374607431768211455,"neg":-18446744073709551617,"f":1.5e400,"small":3,"nested":{"x":12345678901234567890123},"s":"a\u003cb\/c","ids":[18446744073709551616,1.50,-0]}"#;

    /// The member files of `EXACT`: every digit as the driver wrote it, strings unescaped.
    const EXACT_MEMBERS: [(&str, &str); 7] = [
        ("big", "340282366920938463463374607431768211455"),
        ("f", "1.5e400"),
        ("ids", "18446744073709551616,1.50,-0"),
        ("neg", "-18446744073709551617"),
        ("nested/x", "12345678901234567890123"),
        ("s", "a<b/c"),
        ("small", "3"),
    ];

    fn data_files(built: &BuiltTree) -> (Option<String>, Vec<(String, String)>) {
        let t = &built.tree;
        let raw = t.get("gpu/gpu/0/.status/data").map(|v| String::from_utf8_lossy(v).into_owned());
        let members = t
            .files()
            .filter_map(|(p, v)| {
                Some((p.strip_prefix("gpu/gpu/0/.status/data.d/")?.to_string(), String::from_utf8_lossy(v).into()))
            })
            .collect();
        (raw, members)
    }

    fn exact_members() -> Vec<(String, String)> {
        EXACT_MEMBERS.iter().map(|(p, c)| (p.to_string(), c.to_string())).collect()
    }

    /// The documents of a YAML text as JSON (YAML 1.2 booleans, as `FileObjects` reads them: pool `n` stays a string).
    fn yaml_docs(text: &str) -> Vec<Value> {
        let mut options = serde_saphyr::Options::default();
        options.strict_booleans = true;
        serde_saphyr::from_multiple_with_options(text, options).unwrap()
    }

    /// [`GPU`] as one JSON `List` (what `kubectl get -o json` writes), the
    /// driver's data the JSON text `data`.
    fn gpu_json_with_data(data: &str, pretty: bool) -> String {
        let docs = yaml_docs(&gpu_with_data("DATA"));
        let list = json!({"apiVersion": "v1", "kind": "List", "items": docs});
        let text = if pretty { serde_json::to_string_pretty(&list).unwrap() } else { list.to_string() };
        assert!(text.contains("\"DATA\""), "{text}");
        text.replace("\"DATA\"", data)
    }

    #[test]
    fn driver_data_of_a_json_file_keeps_the_drivers_bytes() {
        let built = build(&resolved(&gpu_json_with_data(EXACT, false)), &[]);
        assert!(built.is_ready() && built.warnings.is_empty(), "{:?} {:?}", built.missing, built.warnings);
        let (raw, members) = data_files(&built);
        assert_eq!(raw.as_deref(), Some(EXACT), "the raw file is the driver's bytes");
        assert_eq!(members, exact_members());
        // The device's record and the whole .json hold the same bytes.
        let record = std::str::from_utf8(built.tree.get("gpu/gpu/0/.json").unwrap()).unwrap();
        assert!(record.contains(&format!(r#""status":{{"data":{EXACT}}}"#)), "{record}");
        let whole = std::str::from_utf8(built.tree.get(".json").unwrap()).unwrap();
        let tokens = json_text::compact(whole).unwrap();
        assert!(tokens.contains(&format!(r#""status":{{"data":{EXACT}}}"#)), "{whole}");
        // Read back, the indented whole gives the driver's bytes again.
        let read: record::Record = serde_json::from_str(whole).unwrap();
        let data = read.claims[0].devices[0].status.as_ref().and_then(|s| s.data.as_ref()).map(|d| d.get());
        assert_eq!(data, Some(EXACT));
        // An indented file (kubectl's -o json): the same bytes, compact.
        let indented = EXACT.replace(",\"", ",\n      \"").replace('{', "{\n      ").replace(':', ": ");
        assert_ne!(indented, EXACT);
        assert!(indented.contains("\"a\\u003cb\\/c\""), "whitespace only between tokens: {indented}");
        let built = build(&resolved(&gpu_json_with_data(&indented, true)), &[]);
        assert!(built.warnings.is_empty(), "{:?}", built.warnings);
        assert_eq!(data_files(&built), (Some(EXACT.to_string()), exact_members()));
    }

    #[test]
    fn driver_data_from_the_api_keeps_the_bytes_it_sent() {
        // The claim as engine/source.rs decodes an API answer; the pod and the slice from the fixture.
        let docs = yaml_docs(&gpu_with_data("DATA"));
        let claim = docs.iter().find(|d| d["kind"] == "ResourceClaim").unwrap().to_string().replace("\"DATA\"", EXACT);
        let mut snapshot = FileObjects::parse("t", GPU).unwrap().into_snapshot("t", None).unwrap();
        let decoded = crate::model::slices::decode_claim(&claim).unwrap();
        snapshot.claims.insert("c".into(), decoded);
        let built = build(&resolve(&snapshot, &Selection::default()), &[]);
        assert!(built.is_ready() && built.warnings.is_empty(), "{:?} {:?}", built.missing, built.warnings);
        assert_eq!(data_files(&built), (Some(EXACT.to_string()), exact_members()));
        let record = std::str::from_utf8(built.tree.get("gpu/gpu/0/.json").unwrap()).unwrap();
        assert!(record.contains(&format!(r#""status":{{"data":{EXACT}}}"#)), "{record}");
    }

    #[test]
    fn a_member_path_that_conflicts_is_a_warning_not_an_error() {
        // Keys are unique and safe, so members cannot clash; if one ever did, the tree says so and goes on.
        let mut res = resolved(&gpu_with_data(r#"{"uuid": "MIG-1"}"#));
        let status = res.claims[0].devices[0].status.as_mut().unwrap();
        status.data_members.push(("uuid/inner".into(), "x".into()));
        let built = build(&res, &[]);
        assert!(built.is_ready(), "{:?}", built.missing);
        assert_eq!(built.tree.get("gpu/gpu/0/.status/data.d/uuid"), Some(&b"MIG-1"[..]));
        assert!(!built.tree.contains("gpu/gpu/0/.status/data.d/uuid/inner"));
        assert_eq!(built.warnings.len(), 1, "{:?}", built.warnings);
        assert!(built.warnings[0].contains("data.d/uuid/inner") && built.warnings[0].contains("conflicts"));
    }

    #[test]
    fn driver_data_that_is_not_an_object_is_only_the_raw_file() {
        for data in [r#""MIG-1""#, "7", r#"["a", "b"]"#] {
            let built = build(&resolved(&gpu_with_data(data)), &[]);
            let raw: Value = serde_json::from_slice(built.tree.get("gpu/gpu/0/.status/data").unwrap()).unwrap();
            assert_eq!(raw, serde_json::from_str::<Value>(data).unwrap());
            assert!(!built.tree.contains("gpu/gpu/0/.status/data.d"), "{data}");
            assert_eq!(built.warnings.len(), 1, "{data}: {:?}", built.warnings);
            assert!(built.warnings[0].contains("not an object"), "{:?}", built.warnings);
        }
        let built = build(&resolved(GPU), &[]);
        assert!(!built.tree.contains("gpu/gpu/0/.status"), "no status, no directory");
        let empty = build(&resolved(&gpu_with_data("{}")), &[]);
        assert_eq!(empty.tree.get("gpu/gpu/0/.status/data"), Some(&b"{}"[..]));
        assert!(!empty.tree.contains("gpu/gpu/0/.status/data.d") && empty.warnings.is_empty());
    }
}
