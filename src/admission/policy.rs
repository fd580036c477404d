//! Which pods get drafs, and with which options: the opt-in and opt-out
//! rules of the `drafs.dev/inject` label and the webhook's two paths, and
//! the per-pod annotations read into `inject`'s options.
//!
//! Pure. The webhook answers with them (`decision`) and `drafs check`
//! explains with them (`check`), so the two can never disagree on whether a
//! pod gets drafs.

use crate::admission::resources::{RESOURCES_ANNOTATION, Resources};
use std::time::Duration;

use serde_json::Value;

use crate::admission::inject::{self, Mode, Options};
use crate::model::tree::{RequirePath, require_at_publish};

/// The label that opts a pod in; the webhook configuration selects on it.
pub const INJECT_LABEL: &str = "drafs.dev/inject";
/// Per-pod options, as annotations (those the node agent reads too are model's).
pub use crate::model::names::{
    DIR_ANNOTATION, METADATA_DIR_ANNOTATION, METADATA_FROM_DRIVERS_ANNOTATION, REQUIRE_ANNOTATION,
};
pub const TIMEOUT_ANNOTATION: &str = "drafs.dev/timeout";
pub const READY_WHEN_HEALTHY_ANNOTATION: &str = "drafs.dev/ready-when-healthy";

const MODES: &str = "init, sidecar-fuse, sidecar-files or csi";

/// Why the API server sent the pod (which webhook entry matched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptIn {
    /// The pod is labelled `drafs.dev/inject` (`POST /mutate`).
    Pod,
    /// The pod's namespace is labelled `drafs.dev/inject=enabled`
    /// (`POST /mutate/namespace`): a pod without the label gets this mode,
    /// and one that asks for no device (no resource claim, no extended
    /// resource) is admitted unchanged, silently.
    Namespace(Mode),
}

/// The label value that opts a pod out, whatever its namespace says.
pub const DISABLED: &str = "disabled";

/// What a pod's `drafs.dev/inject` label and the configuration entry that
/// sent it (the webhook's path) ask for: the opt-in and opt-out rules, for
/// the webhook and for `drafs check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requested {
    /// No drafs: admitted unchanged (no label, sent for the label).
    Nothing,
    /// `drafs.dev/inject=disabled`, whatever the namespace says.
    OptedOut,
    /// drafs in this mode; `Err`: the label names no mode (the pod is denied, with this message).
    Mode(Result<Mode, String>),
}

/// The pod's label wins: `disabled` opts out, any other value is the mode;
/// a pod without it gets the namespace's mode when its namespace opted in.
pub fn requested(label: Option<&str>, opt_in: OptIn) -> Requested {
    match (label, opt_in) {
        (Some(DISABLED), _) => Requested::OptedOut,
        (Some(label), _) => Requested::Mode(parse_mode(label)),
        (None, OptIn::Namespace(mode)) => Requested::Mode(Ok(mode)),
        (None, OptIn::Pod) => Requested::Nothing,
    }
}

/// The mode a `drafs.dev/inject` label names, or a message listing the valid ones.
pub fn parse_mode(label: &str) -> Result<Mode, String> {
    match label {
        "init" => Ok(Mode::Init),
        "sidecar-fuse" => Ok(Mode::SidecarFuse),
        "sidecar-files" => Ok(Mode::SidecarFiles),
        "csi" => Ok(Mode::Csi),
        other => Err(format!("label {INJECT_LABEL}: {other:?} is not a drafs mode; use {MODES}")),
    }
}

/// Which entry of the webhook configuration sent a review, by the path it
/// posts to (`drafs webhook` answers these two; any other is a 404).
pub fn opt_in_of_path(path: &str, namespace_mode: Mode) -> Option<OptIn> {
    match path {
        "/mutate" => Some(OptIn::Pod),
        "/mutate/namespace" => Some(OptIn::Namespace(namespace_mode)),
        _ => None,
    }
}

/// What the webhook's flags give every pod it injects, whatever its
/// annotations say: the image, and the CSI driver mode csi's volume names
/// (and a pod's drafs volume is known by).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    pub image: String,
    pub csi_driver: String,
    /// The drafs container's requests and limits, unless a pod's annotation says otherwise.
    pub resources: Resources,
    /// The platform assigns the drafs container's uid ([`Options::platform_uid`]).
    pub platform_uid: bool,
}

impl Defaults {
    /// `image`, the driver's default name, drafs's default resources.
    pub fn new(image: impl Into<String>) -> Self {
        Defaults {
            image: image.into(),
            csi_driver: crate::model::names::DEFAULT_CSI_DRIVER.into(),
            resources: Resources::default(),
            platform_uid: false,
        }
    }
}

/// The injection options a labelled pod asks for (as the webhook reads them;
/// for the fuzz target).
#[doc(hidden)]
pub fn options_of(pod: &Value, defaults: &Defaults) -> Result<Options, String> {
    let label = pod.pointer("/metadata/labels").and_then(|l| l.get(INJECT_LABEL)).ok_or("no drafs.dev/inject label")?;
    options(pod, parse_mode(label.as_str().unwrap_or_default())?, defaults)
}

/// The injection options a pod asks for, or a message naming what is wrong.
pub(crate) fn options(pod: &Value, mode: Mode, defaults: &Defaults) -> Result<Options, String> {
    let annotation = |key: &str| pod.pointer("/metadata/annotations").and_then(|a| a.get(key)).and_then(Value::as_str);
    let mut opts = Options::new(mode, defaults.image.clone());
    opts.csi_driver = defaults.csi_driver.clone();
    opts.resources = defaults.resources.clone();
    opts.platform_uid = defaults.platform_uid;
    if let Some(text) = annotation(RESOURCES_ANNOTATION) {
        opts.resources = defaults
            .resources
            .with(text)
            .map_err(|e| format!("annotation {RESOURCES_ANNOTATION}: {e} (e.g. cpu-limit=100m,memory-limit=64Mi)"))?;
    }
    if let Some(dir) = annotation(DIR_ANNOTATION) {
        inject::check_container_path(dir)
            .map_err(|p| format!("annotation {DIR_ANNOTATION}: {dir:?} {p} (a container path for the tree)"))?;
        opts.dir = dir.to_string();
    }
    if let Some(dir) = annotation(METADATA_DIR_ANNOTATION) {
        inject::check_metadata_dir(dir, &opts.dir).map_err(|p| {
            format!(
                "annotation {METADATA_DIR_ANNOTATION}: {dir:?} {p} (a container path for the standard view, e.g. /var/run/kubernetes.io/dra-device-attributes)"
            )
        })?;
        opts.metadata_dir = Some(dir.to_string());
    }
    if let Some(list) = annotation(METADATA_FROM_DRIVERS_ANNOTATION) {
        if opts.metadata_dir.is_none() {
            return Err(format!(
                "annotation {METADATA_FROM_DRIVERS_ANNOTATION} needs {METADATA_DIR_ANNOTATION} (the standard view it applies to)"
            ));
        }
        opts.metadata_from_drivers = list
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| {
                crate::model::names::parse_driver_name(d)
                    .map_err(|e| format!("annotation {METADATA_FROM_DRIVERS_ANNOTATION}: {e} (comma-separated)"))
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(list) = annotation(REQUIRE_ANNOTATION) {
        opts.require = list
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.parse::<RequirePath>().map_err(|_| {
                    format!("annotation {REQUIRE_ANNOTATION}: {p:?} is not CLAIM/REQUEST/INDEX/ATTRIBUTE (comma-separated, e.g. gpu/gpu/0/uuid)")
                })
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(text) = annotation(TIMEOUT_ANNOTATION) {
        let timeout: Duration = crate::model::names::parse_duration(text)
            .map_err(|e| format!("annotation {TIMEOUT_ANNOTATION}: {e} (e.g. 90s, 5m, 1h; 0 for no limit)"))?;
        opts.timeout = Some(timeout);
    }
    if mode == Mode::Csi {
        // (The standard view is a second volume of drafs node's: METADATA_DIR_ANNOTATION works.)
        let for_a_container = [TIMEOUT_ANNOTATION, READY_WHEN_HEALTHY_ANNOTATION, RESOURCES_ANNOTATION]
            .into_iter()
            .find(|a| annotation(a).is_some());
        if let Some(a) = for_a_container {
            return Err(format!(
                "annotation {a} is for a drafs container; mode csi adds none (the kubelet waits for the volume, docs/node-mode.md)"
            ));
        }
        // drafs node would refuse every publish of such a volume: the pod would never start.
        require_at_publish(&opts.require).map_err(|e| format!("annotation {REQUIRE_ANNOTATION}: {e}"))?;
    }
    match annotation(READY_WHEN_HEALTHY_ANNOTATION) {
        None | Some("false") => {}
        Some("true") if mode != Mode::Init => opts.ready_when_healthy = true,
        Some("true") => {
            return Err(format!(
                "annotation {READY_WHEN_HEALTHY_ANNOTATION} needs a sidecar mode (an init container has no readiness)"
            ));
        }
        Some(other) => {
            return Err(format!("annotation {READY_WHEN_HEALTHY_ANNOTATION}: {other:?} is not true or false"));
        }
    }
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn csi_is_a_mode_without_a_container_to_configure() {
        assert_eq!(parse_mode("csi"), Ok(Mode::Csi));
        assert!(parse_mode("CSI").unwrap_err().ends_with("use init, sidecar-fuse, sidecar-files or csi"));
        let pod = |annotations: Value| json!({"metadata": {"annotations": annotations}});
        let opts =
            options(&pod(json!({REQUIRE_ANNOTATION: "gpu/gpu/0/uuid"})), Mode::Csi, &Defaults::new("drafs:1")).unwrap();
        assert_eq!(opts.require.len(), 1);
        // What drafs node would refuse to publish, refused at admission in its words.
        let prepared = pod(json!({REQUIRE_ANNOTATION: "gpu/gpu/0/uuid, nic/nic/0/.status/interfaceName"}));
        let err = options(&prepared, Mode::Csi, &Defaults::new("drafs:1")).unwrap_err();
        assert_eq!(
            err,
            "annotation drafs.dev/require: nic/nic/0/.status/interfaceName is a value the driver reports when it prepares the device, after the volume is published; it cannot be required at publish time (read it when it appears, or require it in an init container)"
        );
        for mode in [Mode::Init, Mode::SidecarFiles, Mode::SidecarFuse] {
            assert_eq!(
                options(&prepared, mode, &Defaults::new("drafs:1")).unwrap().require.len(),
                2,
                "{mode:?} runs after prepare"
            );
        }
        for (a, value) in
            [(TIMEOUT_ANNOTATION, "5m"), (READY_WHEN_HEALTHY_ANNOTATION, "true"), (RESOURCES_ANNOTATION, "cpu-limit=1")]
        {
            let err = options(&pod(json!({a: value})), Mode::Csi, &Defaults::new("drafs:1")).unwrap_err();
            assert!(err.starts_with(&format!("annotation {a} is for a drafs container")), "{err}");
        }
        // The standard view is a volume of its own in mode csi.
        let view = json!({METADATA_DIR_ANNOTATION: "/var/run/x", METADATA_FROM_DRIVERS_ANNOTATION: "dra.net"});
        let opts = options(&pod(view), Mode::Csi, &Defaults::new("drafs:1")).unwrap();
        assert_eq!(opts.metadata_dir.as_deref(), Some("/var/run/x"));
        assert_eq!(opts.metadata_from_drivers, ["dra.net"]);
    }

    #[test]
    fn a_pods_annotation_sets_the_containers_resources_over_the_webhooks() {
        let pod = |annotations: Value| json!({"metadata": {"annotations": annotations}});
        let defaults =
            Defaults { resources: Resources::default().with("cpu-limit=200m").unwrap(), ..Defaults::new("d:1") };
        let opts = options(&pod(json!({})), Mode::Init, &defaults).unwrap();
        assert_eq!(opts.resources.cpu_limit.as_deref(), Some("200m"), "the webhook's flags");
        let asked = pod(json!({RESOURCES_ANNOTATION: "cpu-limit=50m,memory-limit=64Mi"}));
        let opts = options(&asked, Mode::SidecarFiles, &defaults).unwrap();
        assert_eq!(opts.resources.to_json()["limits"], json!({"cpu": "50m", "memory": "64Mi"}));
        let err = options(&pod(json!({RESOURCES_ANNOTATION: "cpu-limit=lots"})), Mode::Init, &defaults).unwrap_err();
        assert!(err.starts_with("annotation drafs.dev/resources: \"lots\" is not a quantity"), "{err}");
    }
}
