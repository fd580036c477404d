//! Which containers the node agent gives a tree through NRI, and where (pure).
//!
//! A pod opts in by label, as it does for the webhook, but with a label of
//! its own (`drafs.dev/nri`), so that the webhook never sees these pods: its
//! namespace labelled `drafs.dev/nri=enabled` (the pod may say `disabled`),
//! or the pod itself labelled `enabled`. In such a pod, every container
//! that uses a claim (`resources.claims`, or an extended resource a
//! DeviceClass backs) gets its own tree, read-only, at `drafs.dev/dir`
//! (default `/dra`), and its own standard view at `drafs.dev/metadata-dir`
//! when the pod asks for one; no other container gets anything, and a pod
//! that has drafs already (a drafs container, a drafs volume) is left alone.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;

use crate::model::container_path::{check_container_path, check_metadata_dir};
use crate::model::names::{DEFAULT_DIR, DIR_ANNOTATION, DRAFS_CONTAINER, METADATA_DIR_ANNOTATION, REQUIRE_ANNOTATION};
use crate::model::resolve::ContainerClaims;
use crate::model::tree::RequirePath;
use crate::node::nri::api::Mount;
use crate::publish::metadata_dir::file_driver;

/// The label that opts a namespace (`enabled`) or a pod (`enabled`,
/// `disabled`) in to NRI's mounts.
pub const NRI_LABEL: &str = "drafs.dev/nri";
const ENABLED: &str = "enabled";
const DISABLED: &str = "disabled";

/// Where a pod's mounts go, from its annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// The tree's mount point in each container.
    pub dir: String,
    /// The standard view's, if the pod asks for one.
    pub metadata_dir: Option<String>,
    pub require: Vec<RequirePath>,
}

/// What the NRI door needs of a pod, read once from the API's pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub node: Option<String>,
    /// Its `drafs.dev/nri` label.
    pub label: Option<String>,
    /// Its containers that use a device, each with what it uses.
    pub containers: Vec<ContainerClaims>,
    /// A drafs container or a volume of drafs's CSI driver: served already.
    pub has_drafs: bool,
    /// Its mounts' options, or why its annotations cannot be used.
    pub options: Result<MountOptions, String>,
}

impl PodFacts {
    /// The facts of `pod`; `csi_driver` is the name of drafs's own volumes.
    pub fn of(pod: &Pod, csi_driver: &str) -> PodFacts {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let names = spec.into_iter().flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers));
        let containers =
            names.filter_map(|c| ContainerClaims::of(pod, &c.name)).filter(|c| !c.is_empty()).collect::<Vec<_>>();
        let has_container = spec.is_some_and(|s| {
            s.containers.iter().chain(s.init_containers.iter().flatten()).any(|c| c.name == DRAFS_CONTAINER)
        });
        let has_volume = spec
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|vs| vs.iter().any(|v| v.csi.as_ref().is_some_and(|c| c.driver == csi_driver)));
        let empty = BTreeMap::new();
        let annotations = meta.annotations.as_ref().unwrap_or(&empty);
        PodFacts {
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            node: spec.and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()),
            label: meta.labels.as_ref().and_then(|l| l.get(NRI_LABEL)).cloned(),
            containers,
            has_drafs: has_container || has_volume,
            options: options(annotations),
        }
    }

    /// The container `name`'s claims, if it uses a device.
    pub fn container(&self, name: &str) -> Option<&ContainerClaims> {
        self.containers.iter().find(|c| c.container == name)
    }
}

/// The options the annotations give: the directories follow the rules a
/// webhook-injected pod's do (absolute, clean, hiding neither the token nor
/// what the kernel, the runtime and the kubelet put in a container).
fn options(annotations: &BTreeMap<String, String>) -> Result<MountOptions, String> {
    let dir = match annotations.get(DIR_ANNOTATION) {
        Some(dir) => {
            check_container_path(dir).map_err(|p| format!("annotation {DIR_ANNOTATION}: {dir:?} {p}"))?;
            dir.trim_end_matches('/').to_string()
        }
        None => DEFAULT_DIR.to_string(),
    };
    let metadata_dir = match annotations.get(METADATA_DIR_ANNOTATION) {
        Some(metadata_dir) => {
            check_metadata_dir(metadata_dir, &dir)
                .map_err(|p| format!("annotation {METADATA_DIR_ANNOTATION}: {metadata_dir:?} {p}"))?;
            Some(metadata_dir.trim_end_matches('/').to_string())
        }
        None => None,
    };
    let require = annotations
        .get(REQUIRE_ANNOTATION)
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| p.parse::<RequirePath>().map_err(|e| format!("annotation {REQUIRE_ANNOTATION}: {e}")))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    Ok(MountOptions { dir, metadata_dir, require })
}

/// Whether `name` (a pod's uid, a container's name, as the runtime sends
/// them) can name a directory of the agent's: one plain path component.
pub fn plain_component(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && !matches!(name, "." | "..")
        && !name.chars().any(|c| c == '/' || c.is_control())
}

/// Whether a pod asks for NRI's mounts: its own label says `enabled`, or its
/// namespace's does and its own does not say `disabled`.
pub fn opted_in(pod_label: Option<&str>, namespace_enabled: bool) -> bool {
    match pod_label {
        Some(ENABLED) => true,
        Some(DISABLED) => false,
        _ => namespace_enabled,
    }
}

/// Why a container gets no mount (logged once per pod, counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    NotOptedIn,
    HasDrafs,
    /// The container uses no device.
    NoDevice,
    /// Something of the container's own is mounted where the tree goes.
    Occupied,
}

impl Skip {
    pub fn name(self) -> &'static str {
        match self {
            Skip::NotOptedIn => "not_opted_in",
            Skip::HasDrafs => "has_drafs",
            Skip::NoDevice => "no_device",
            Skip::Occupied => "occupied",
        }
    }
}

/// The drivers' own standard-view files the runtime binds into the
/// container below `standard` (their KEP-5304 metadata): each one's path
/// below it, and its driver. drafs makes their mount points in the
/// container's standard view and never writes there.
pub fn driver_binds(mounts: &[Mount], standard: &str) -> Vec<(String, String)> {
    mounts
        .iter()
        .filter_map(|m| {
            let rel = m.destination.strip_prefix(standard)?.strip_prefix('/')?;
            let plain = rel.split('/').all(|p| !matches!(p, "" | "." | ".."));
            let driver = file_driver(rel)?;
            (plain && !driver.is_empty()).then(|| (rel.to_string(), driver.to_string()))
        })
        .collect()
}

/// Whether the container mounts something of its own at `dir`.
pub fn occupied(mounts: &[Mount], dir: &str) -> bool {
    mounts.iter().any(|m| m.destination.trim_end_matches('/') == dir)
}

/// A read-only bind mount of `source` at `destination`, as the runtime
/// makes it for a container.
pub fn bind(source: &Path, destination: &str) -> Mount {
    let options = ["bind", "ro", "nosuid", "nodev", "noexec", "rprivate"];
    Mount {
        destination: destination.to_string(),
        r#type: "bind".into(),
        source: source.to_string_lossy().into_owned(),
        options: options.iter().map(|o| o.to_string()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drafs_test_support::{Build, PodBuilder};
    use serde_json::json;

    fn pod(annotations: serde_json::Value) -> Pod {
        let pod = PodBuilder::new("ns", "p")
            .uid("u1")
            .node("n1")
            .labels(json!({NRI_LABEL: "enabled"}))
            .annotations(annotations)
            .claim("gpus", "gpus")
            .init_container("setup", "i")
            .uses("gpus")
            .container("app", "i")
            .uses_request("gpus", "train")
            .container("logger", "i")
            .build();
        serde_json::from_value(pod).unwrap()
    }

    #[test]
    fn the_facts_name_the_containers_that_use_a_device_and_the_options() {
        let facts = PodFacts::of(&pod(json!({})), "drafs.dev");
        assert_eq!(
            (facts.uid.as_str(), facts.node.as_deref(), facts.label.as_deref()),
            ("u1", Some("n1"), Some("enabled"))
        );
        let names: Vec<&str> = facts.containers.iter().map(|c| c.container.as_str()).collect();
        assert_eq!(names, ["setup", "app"], "the logger uses no device");
        assert!(!facts.has_drafs);
        assert_eq!(facts.options, Ok(MountOptions { dir: "/dra".into(), metadata_dir: None, require: vec![] }));
        let asked = PodFacts::of(
            &pod(
                json!({DIR_ANNOTATION: "/devices/", METADATA_DIR_ANNOTATION: "/var/run/kubernetes.io/dra-device-attributes",
                       REQUIRE_ANNOTATION: "gpus/train/0/uuid, gpus/train/0/.status/data"}),
            ),
            "drafs.dev",
        );
        let options = asked.options.unwrap();
        assert_eq!(options.dir, "/devices");
        assert_eq!(options.metadata_dir.as_deref(), Some("/var/run/kubernetes.io/dra-device-attributes"));
        assert_eq!(options.require.len(), 2, "prepare-time values may be required: containers start after prepare");
        for bad in ["dra", "/", "/a/../b", "/a//b", "/a/./b", "/run", "/var/run/secrets", "/etc", "/proc/dra"] {
            let facts = PodFacts::of(&pod(json!({DIR_ANNOTATION: bad})), "drafs.dev");
            assert!(facts.options.unwrap_err().contains(DIR_ANNOTATION), "{bad}");
        }
        let nested = PodFacts::of(&pod(json!({METADATA_DIR_ANNOTATION: "/dra/std"})), "drafs.dev");
        assert!(nested.options.unwrap_err().contains("overlaps the tree's directory /dra"));
    }

    #[test]
    fn a_pod_with_drafs_already_is_known() {
        let mut with_volume = pod(json!({}));
        let spec = with_volume.spec.as_mut().unwrap();
        spec.volumes =
            Some(vec![serde_json::from_value(json!({"name": "dra", "csi": {"driver": "drafs.dev"}})).unwrap()]);
        assert!(PodFacts::of(&with_volume, "drafs.dev").has_drafs);
        assert!(!PodFacts::of(&with_volume, "other.example").has_drafs);
        let mut with_container = pod(json!({}));
        with_container.spec.as_mut().unwrap().containers[1].name = DRAFS_CONTAINER.into();
        assert!(PodFacts::of(&with_container, "drafs.dev").has_drafs);
    }

    #[test]
    fn only_a_plain_component_names_a_directory() {
        for fine in ["0f8e5d3c-7a1b-4c2d-9e8f-1a2b3c4d5e6f", "trainer", "a.b"] {
            assert!(plain_component(fine), "{fine}");
        }
        for bad in ["", ".", "..", "../u2", "a/b", "a\0b", "a\nb", &"x".repeat(254)] {
            assert!(!plain_component(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_pod_opts_in_by_its_label_or_its_namespaces() {
        assert!(opted_in(Some("enabled"), false));
        assert!(!opted_in(Some("disabled"), true));
        assert!(opted_in(None, true));
        assert!(opted_in(Some("something"), true));
        assert!(!opted_in(None, false));
    }

    #[test]
    fn the_drivers_file_binds_under_the_standard_path_are_found() {
        let mount = |dest: &str| Mount { destination: dest.into(), ..Default::default() };
        let standard = "/var/run/kubernetes.io/dra-device-attributes";
        let mounts = [
            mount(
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpu/gpu.example.com-metadata.json",
            ),
            mount("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/r/../../../etc-metadata.json"),
            mount("/var/run/kubernetes.io/dra-device-attributes-other/x/d-metadata.json"),
            mount("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/r/notes.txt"),
            mount("/dev/shm"),
        ];
        assert_eq!(
            driver_binds(&mounts, standard),
            [(
                "resourceclaimtemplates/gpu/gpu/gpu.example.com-metadata.json".to_string(),
                "gpu.example.com".to_string()
            )]
        );
        assert!(occupied(&[mount("/dra/")], "/dra"));
        assert!(!occupied(&[mount("/dra/x")], "/dra"));
    }
}
