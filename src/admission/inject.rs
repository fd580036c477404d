//! `drafs inject`: add drafs to Pod and workload manifests.
//!
//! Pure: YAML documents in, YAML documents out. Only pod specs that ask for
//! devices are changed: DRA claims, or extended resources (which a DeviceClass
//! may back, KEP-5004: only the scheduler knows, once it chose a node, so
//! every extended resource counts); a pod spec that already has a `drafs`
//! container is left alone, so injecting twice changes nothing.

use std::time::Duration;

use serde_json::{Value, json};

use crate::admission::manifests::DEFAULT_ACCOUNT;
use crate::admission::resources::Resources;
pub use crate::model::container_path::{PathProblem, TOKEN_PATH, check_container_path, check_metadata_dir};
use crate::model::extended::is_extended_resource;
use crate::model::tree::RequirePath;

mod yaml;

pub const CONTAINER: &str = crate::model::names::DRAFS_CONTAINER;
const VOLUME: &str = "dra";
const FUSE_VOLUME: &str = "dev-fuse";
const TOKEN_VOLUME: &str = "drafs-token";
const METADATA_VOLUME: &str = "dra-metadata";
/// The tree's in-memory emptyDir (init, sidecar-files): the tree, the next one
/// while it is swapped in and the two superseded ones kept for readers, for a
/// node's 8 GPUs (2.1 MiB of tmpfs pages each; smaller trees that come fast
/// are kept more, as many as the room holds). Its pages, and about 1 KiB of
/// kernel memory for each of its files (a file takes a page: at most about
/// 3,000 files, 3 MiB), are charged to the drafs container (limit 32Mi),
/// beside drafs's own 10 to 16 MiB: about 31 of the 32 at the very worst.
pub const TREE_VOLUME_SIZE: &str = "12Mi";
/// The standard view's emptyDir: one small JSON file per claim and driver.
const METADATA_VOLUME_SIZE: &str = "4Mi";
/// The volume the ServiceAccount admission plugin adds for the automounted token.
const AUTOMOUNT_VOLUME_PREFIX: &str = "kube-api-access-";
/// drafs's own default `--timeout`, for the startup probe when none is given.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The image's user and group (`USER 65532:65532`), the distroless "nonroot".
const NON_ROOT_ID: i64 = 65532;

/// The service-account credentials as the kubelet would mount them (a bound
/// token, the cluster CA, the namespace), for the drafs container alone.
fn token_volume(name: &str) -> Value {
    json!({"name": name, "projected": {"defaultMode": 0o444, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}})
}

#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("input is not valid YAML: {0}")]
    Parse(String),
    #[error("cannot write YAML: {0}")]
    Write(String),
    #[error(
        "{what}: container {container:?} already mounts volume {volume:?} at {path}, where drafs's files would go; choose another place for them (inject: --dir, --metadata-dir; webhook: the drafs.dev/dir, drafs.dev/metadata-dir annotations)"
    )]
    MountPathTaken { what: String, container: String, volume: String, path: String },
    #[error(
        "{what} is a live object (it has {field}): the API server never lets containers be added to an existing Pod; inject into {owner} instead, or into the manifest the Pod was created from"
    )]
    LivePod { what: String, field: &'static str, owner: String },
    #[error(
        "{what} has spec.os.name: windows: drafs runs only in Linux pods (a Linux binary, Linux-only securityContext fields and mounts); do not inject it there"
    )]
    Windows { what: String },
}

/// A Pod read back from the API server (`kubectl get pod -o yaml`): which of
/// its server-set fields shows it, and what owns it.
fn live_pod(doc: &Value) -> Option<InjectError> {
    if doc["kind"] != "Pod" {
        return None;
    }
    let field = ["uid", "creationTimestamp", "resourceVersion"]
        .into_iter()
        .find(|f| doc["metadata"].get(*f).is_some_and(|v| !v.is_null()))
        .map(|f| match f {
            "uid" => "metadata.uid",
            "creationTimestamp" => "metadata.creationTimestamp",
            _ => "metadata.resourceVersion",
        })?;
    let owner = doc
        .pointer("/metadata/ownerReferences/0")
        .map(|o| {
            format!(
                "the {} {} that owns it",
                o["kind"].as_str().unwrap_or("workload"),
                o["name"].as_str().unwrap_or("?")
            )
        })
        .unwrap_or_else(|| "the workload that creates it".into());
    Some(InjectError::LivePod { what: describe(doc), field, owner })
}

/// Why a pod spec was not changed.
enum Skip {
    NoDevices,
    Windows,
    MountPathTaken { container: String, volume: String, path: String },
}

/// `base`, or `base-1`, `base-2`... whichever no volume of the pod has.
fn free_volume_name(volumes: &[Value], base: &str) -> String {
    let taken = |n: &str| volumes.iter().any(|v| v["name"] == n);
    std::iter::once(base.to_string())
        .chain((1..).map(|i| format!("{base}-{i}")))
        .find(|n| !taken(n))
        .expect("an unbounded sequence has a free name")
}

/// How drafs runs in a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `drafs init` as an init container: values written once, no privileges.
    Init,
    /// `drafs serve` as a native sidecar with the FUSE backend: live values, privileged.
    SidecarFuse,
    /// `drafs serve` as a native sidecar with the files backend: live values, no privileges.
    SidecarFiles,
    /// No container: a CSI volume that `drafs node` serves on the pod's node
    /// (docs/node-mode.md): live values, no privileges.
    Csi,
}

impl Mode {
    /// The mode's name, as `--mode` and the `drafs.dev/inject` label spell it.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Init => "init",
            Mode::SidecarFuse => "sidecar-fuse",
            Mode::SidecarFiles => "sidecar-files",
            Mode::Csi => "csi",
        }
    }

    /// Whether drafs runs as a container of the pod (every mode but `csi`).
    pub fn has_container(self) -> bool {
        self != Mode::Csi
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    pub image: String,
    /// Where the tree is mounted, in drafs and in every container that uses a claim.
    pub dir: String,
    /// Where the standard KEP-5304 view is written and mounted (read-only in the app), if at all.
    pub metadata_dir: Option<String>,
    /// Passed to drafs as `--metadata-from-driver`: drivers that write their own standard files.
    pub metadata_from_drivers: Vec<String>,
    /// Passed to drafs as `--require`.
    pub require: Vec<RequirePath>,
    /// Passed to drafs as `--timeout` (its default otherwise); also sizes the startup probe.
    pub timeout: Option<Duration>,
    /// The sidecar's readinessProbe also fails while a device is reported Unhealthy.
    pub ready_when_healthy: bool,
    /// The CSI driver the `csi` mode's volume names.
    pub csi_driver: String,
    /// The drafs container's requests and limits.
    pub resources: Resources,
    /// The platform assigns the container's uid (OpenShift's restricted-v2
    /// gives each namespace a range and refuses any other): no runAsUser or
    /// runAsGroup, runAsNonRoot kept.
    pub platform_uid: bool,
}

impl Options {
    pub fn new(mode: Mode, image: impl Into<String>) -> Self {
        Options {
            mode,
            image: image.into(),
            dir: "/dra".into(),
            metadata_dir: None,
            metadata_from_drivers: Vec::new(),
            require: Vec::new(),
            timeout: None,
            ready_when_healthy: false,
            csi_driver: crate::model::names::DEFAULT_CSI_DRIVER.into(),
            resources: Resources::default(),
            platform_uid: false,
        }
    }
}

/// What happened to each document (for the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Injected(String),
    /// Injected; the pod keeps its own service account, which needs drafs's RBAC.
    InjectedKeepingAccount {
        what: String,
        account: String,
    },
    AlreadyInjected(String),
    NoDevices(String),
    NotAWorkload(String),
}

fn describe(doc: &Value) -> String {
    format!(
        "{} {}",
        doc["kind"].as_str().unwrap_or("<no kind>"),
        doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("<no name>")
    )
}

/// The pod spec of a Pod or workload document, if it has one.
fn pod_spec(doc: &mut Value) -> Option<&mut Value> {
    let pointer = match doc["kind"].as_str()? {
        "Pod" => "/spec",
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" | "ReplicationController" => {
            "/spec/template/spec"
        }
        "CronJob" => "/spec/jobTemplate/spec/template/spec",
        _ => return None,
    };
    doc.pointer_mut(pointer).filter(|s| s.is_object())
}

fn downward_env() -> Value {
    json!([
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ])
}

/// drafs's arguments for this mode and these options.
fn drafs_args(opts: &Options) -> Vec<String> {
    let dir = &opts.dir;
    let mut args = match opts.mode {
        Mode::Init => vec!["init".to_string(), format!("--dir={dir}")],
        Mode::SidecarFiles => vec!["serve".into(), "--backend=files".into(), format!("--dir={dir}")],
        // (csi adds no container: never asked.)
        Mode::SidecarFuse | Mode::Csi => vec!["serve".into(), "--backend=fuse".into(), format!("--dir={dir}")],
    };
    if let Some(m) = &opts.metadata_dir {
        args.push(format!("--metadata-dir={m}"));
        args.extend(opts.metadata_from_drivers.iter().map(|d| format!("--metadata-from-driver={d}")));
    }
    args.extend(opts.require.iter().map(|r| format!("--require={r}")));
    if let Some(t) = opts.timeout {
        args.push(format!("--timeout={}", crate::model::names::duration_text(t)));
    }
    args
}

fn drafs_container(opts: &Options, volumes: &Volumes) -> Value {
    let dir = &opts.dir;
    let probe_command = json!({"command": ["/drafs", "probe", format!("--dir={dir}")]});
    // Long enough that drafs's own message (at --timeout) is what the pod shows;
    // 0 means no limit, for drafs and so for the probe.
    let timeout = opts.timeout.unwrap_or(DEFAULT_TIMEOUT).as_secs();
    let threshold = if timeout == 0 { 1_000_000 } else { timeout.saturating_add(10).min(1_000_000) };
    let startup = json!({"exec": probe_command, "periodSeconds": 1, "failureThreshold": threshold});
    let mut readiness = json!({"exec": probe_command, "periodSeconds": 10});
    if opts.ready_when_healthy {
        // Only readiness: a startup probe that failed on health would restart drafs.
        readiness["exec"]["command"].as_array_mut().into_iter().for_each(|c| c.push(json!("--healthy")));
    }
    // The restricted Pod Security Standard, and the image's own user (65532)
    // said explicitly, whatever the pod sets for its other containers
    // (unless the platform assigns it).
    let mut restricted = json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": true,
        "runAsUser": NON_ROOT_ID,
        "runAsGroup": NON_ROOT_ID,
        "seccompProfile": {"type": "RuntimeDefault"},
    });
    if let Some(sc) = restricted.as_object_mut().filter(|_| opts.platform_uid) {
        sc.remove("runAsUser");
        sc.remove("runAsGroup");
    }
    let resources = opts.resources.to_json();
    let mut mounts = vec![json!({"name": volumes.tree, "mountPath": dir})];
    let mut c = json!({
        "name": CONTAINER,
        "image": opts.image,
        "args": drafs_args(opts),
        "env": downward_env(),
        "resources": resources,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": restricted,
    });
    if opts.mode != Mode::Init {
        c["restartPolicy"] = json!("Always");
        c["startupProbe"] = startup;
        c["readinessProbe"] = readiness;
    }
    if opts.mode == Mode::SidecarFuse {
        c["lifecycle"] = json!({"preStop": {"exec": {"command": ["/drafs", "unmount", format!("--dir={dir}")]}}});
        // Root for the mount; runAsNonRoot: false overrides a pod-level true,
        // which would otherwise keep the kubelet from starting it.
        c["securityContext"] = json!({"privileged": true, "runAsUser": 0, "runAsNonRoot": false});
        mounts = vec![
            json!({"name": volumes.tree, "mountPath": dir, "mountPropagation": "Bidirectional"}),
            json!({"name": volumes.fuse, "mountPath": "/dev/fuse"}),
        ];
    }
    if let Some(m) = &opts.metadata_dir {
        mounts.push(json!({"name": volumes.metadata, "mountPath": m}));
    }
    c["volumeMounts"] = Value::Array(mounts);
    c
}

/// The names of the volumes drafs adds, each free in the pod.
struct Volumes {
    tree: String,
    fuse: String,
    metadata: String,
    token: String,
}

/// Whether a container asks for an extended resource (in its limits or requests).
fn asks_for_extended_resources(container: &Value) -> bool {
    ["limits", "requests"].iter().any(|key| {
        container
            .pointer(&format!("/resources/{key}"))
            .and_then(Value::as_object)
            .is_some_and(|m| m.keys().any(|name| is_extended_resource(name)))
    })
}

/// Whether a container asks for a device: a claim, or an extended resource.
fn asks_for_devices(container: &Value) -> bool {
    container.pointer("/resources/claims").and_then(Value::as_array).is_some_and(|c| !c.is_empty())
        || asks_for_extended_resources(container)
}

/// Whether a pod spec asks for devices: claims, or a container's extended resources.
pub fn spec_asks_for_devices(spec: &Value) -> bool {
    let has_claims = spec.get("resourceClaims").and_then(Value::as_array).is_some_and(|c| !c.is_empty());
    has_claims
        || ["initContainers", "containers"].iter().any(|k| {
            spec.get(*k).and_then(Value::as_array).is_some_and(|cs| cs.iter().any(asks_for_extended_resources))
        })
}

fn array<'a>(spec: &'a mut Value, key: &str) -> &'a mut Vec<Value> {
    let map = spec.as_object_mut().expect("pod spec is an object");
    let entry = map.entry(key.to_string()).or_insert_with(|| json!([]));
    if !entry.is_array() {
        *entry = json!([]);
    }
    entry.as_array_mut().expect("just made an array")
}

/// What injecting into one pod spec did.
enum Injected {
    Done,
    KeptAccount(String),
    AlreadyThere,
}

/// Whether the pod leaves the service account to drafs: none named, or the
/// namespace's `default` (which the ServiceAccount admission plugin fills in
/// before a webhook sees the pod, and which never has drafs's rights).
fn account_is_unchosen(spec: &Value) -> bool {
    spec.get("serviceAccountName").and_then(Value::as_str).is_none_or(|a| a.is_empty() || a == "default")
}

/// The service account drafs runs as once injected into a pod with this
/// spec: drafs's own, or the one the pod chose.
pub fn account_of(spec: &Value) -> String {
    if account_is_unchosen(spec) {
        DEFAULT_ACCOUNT.to_string()
    } else {
        spec["serviceAccountName"].as_str().unwrap_or_default().to_string()
    }
}

/// Remove the token the ServiceAccount admission plugin mounted into every
/// container (a pod seen by the webhook has it): the app gets no credentials.
fn remove_automounted_token(spec: &mut Value) {
    // Only the plugin's own volume: its name, and a projected service-account token in it.
    let is_automount = |v: &Value| {
        v["name"].as_str().is_some_and(|n| n.starts_with(AUTOMOUNT_VOLUME_PREFIX))
            && v.pointer("/projected/sources")
                .and_then(Value::as_array)
                .is_some_and(|s| s.iter().any(|src| src.get("serviceAccountToken").is_some()))
    };
    let removed: Vec<String> = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| is_automount(v))
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    if removed.is_empty() {
        return;
    }
    array(spec, "volumes").retain(|v| !is_automount(v));
    for key in ["initContainers", "containers", "ephemeralContainers"] {
        for c in spec.get_mut(key).and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(mounts) = c.get_mut("volumeMounts").and_then(Value::as_array_mut) {
                mounts.retain(|m| !m["name"].as_str().is_some_and(|n| removed.iter().any(|r| r == n)));
            }
        }
    }
}

/// Inject into one pod spec.
fn inject_spec(spec: &mut Value, opts: &Options) -> Result<Injected, Skip> {
    if !spec_asks_for_devices(spec) {
        return Err(Skip::NoDevices);
    }
    let already = ["initContainers", "containers"]
        .iter()
        .any(|k| spec.get(*k).and_then(Value::as_array).is_some_and(|cs| cs.iter().any(|c| c["name"] == CONTAINER)));
    if already || csi_volume_of(spec, &opts.csi_driver).is_some() {
        return Ok(Injected::AlreadyThere);
    }
    if spec.pointer("/os/name").and_then(Value::as_str) == Some("windows") {
        return Err(Skip::Windows);
    }
    // Something of the pod's own mounted where the tree or the standard view
    // goes would hide it.
    let ours: Vec<&str> = std::iter::once(opts.dir.as_str()).chain(opts.metadata_dir.as_deref()).collect();
    for key in ["initContainers", "containers"] {
        for c in spec.get(key).and_then(Value::as_array).into_iter().flatten() {
            let mounts = c.get("volumeMounts").and_then(Value::as_array).into_iter().flatten();
            for m in mounts {
                let Some(path) = m["mountPath"].as_str() else { continue };
                if let Some(taken) = ours.iter().find(|o| same_path(path, o)) {
                    return Err(Skip::MountPathTaken {
                        container: c["name"].as_str().unwrap_or_default().to_string(),
                        volume: m["name"].as_str().unwrap_or_default().to_string(),
                        path: taken.to_string(),
                    });
                }
            }
        }
    }
    let own_account = account_is_unchosen(spec);
    if own_account {
        remove_automounted_token(spec);
    }
    let existing: Vec<Value> = spec.get("volumes").and_then(Value::as_array).cloned().unwrap_or_default();
    let volumes = Volumes {
        tree: free_volume_name(&existing, VOLUME),
        fuse: free_volume_name(&existing, FUSE_VOLUME),
        metadata: free_volume_name(&existing, METADATA_VOLUME),
        token: free_volume_name(&existing, TOKEN_VOLUME),
    };
    let map = spec.as_object_mut().expect("pod spec is an object");
    // When drafs brings the service account, only drafs gets its credentials:
    // no token is mounted into the app's containers.
    if own_account {
        map.insert("serviceAccountName".into(), json!(DEFAULT_ACCOUNT));
        if map.contains_key("serviceAccount") {
            // The deprecated alias the API server fills in; keep the two equal.
            map.insert("serviceAccount".into(), json!(DEFAULT_ACCOUNT));
        }
        map.insert("automountServiceAccountToken".into(), json!(false));
    }
    let mut app_mounts = vec![match opts.mode {
        Mode::SidecarFuse => {
            json!({"name": volumes.tree, "mountPath": opts.dir, "readOnly": true, "mountPropagation": "HostToContainer"})
        }
        _ => json!({"name": volumes.tree, "mountPath": opts.dir, "readOnly": true}),
    }];
    if let Some(m) = &opts.metadata_dir {
        app_mounts.push(json!({"name": volumes.metadata, "mountPath": m, "readOnly": true}));
    }
    for key in ["initContainers", "containers"] {
        if let Some(containers) = spec.get_mut(key).and_then(Value::as_array_mut) {
            for c in containers.iter_mut().filter(|c| asks_for_devices(c)) {
                array(c, "volumeMounts").extend(app_mounts.iter().cloned());
            }
        }
    }
    if !opts.mode.has_container() {
        // The volume is all: drafs node reads as the pod's account, with the
        // token the kubelet asks for it (the CSIDriver's tokenRequests).
        let mut csi = json!({"driver": opts.csi_driver, "readOnly": true});
        if !opts.require.is_empty() {
            let require: Vec<String> = opts.require.iter().map(ToString::to_string).collect();
            csi["volumeAttributes"] = json!({"require": require.join(",")});
        }
        array(spec, "volumes").push(json!({"name": volumes.tree, "csi": csi}));
        if opts.metadata_dir.is_some() {
            array(spec, "volumes").push(json!({"name": volumes.metadata, "csi": standard_view_csi(opts)}));
        }
        return Ok(if own_account {
            Injected::Done
        } else {
            Injected::KeptAccount(spec["serviceAccountName"].as_str().unwrap_or_default().to_string())
        });
    }
    let mut container = drafs_container(opts, &volumes);
    if own_account {
        array(&mut container, "volumeMounts")
            .push(json!({"name": volumes.token, "mountPath": TOKEN_PATH, "readOnly": true}));
    }
    array(spec, "initContainers").insert(0, container);
    let in_memory = |size: &str| json!({"medium": "Memory", "sizeLimit": size});
    let pod_volumes = array(spec, "volumes");
    pod_volumes.push(match opts.mode {
        Mode::SidecarFuse => json!({"name": volumes.tree, "emptyDir": {}}),
        _ => json!({"name": volumes.tree, "emptyDir": in_memory(TREE_VOLUME_SIZE)}),
    });
    if opts.mode == Mode::SidecarFuse {
        pod_volumes.push(json!({"name": volumes.fuse, "hostPath": {"path": "/dev/fuse", "type": "CharDevice"}}));
    }
    if opts.metadata_dir.is_some() {
        pod_volumes.push(json!({"name": volumes.metadata, "emptyDir": in_memory(METADATA_VOLUME_SIZE)}));
    }
    if own_account {
        pod_volumes.push(token_volume(&volumes.token));
        Ok(Injected::Done)
    } else {
        Ok(Injected::KeptAccount(spec["serviceAccountName"].as_str().unwrap_or_default().to_string()))
    }
}

/// The `csi` source of drafs node's standard-view volume (KEP-5304's files,
/// leaving those of `metadata_from_drivers` to their drivers).
fn standard_view_csi(opts: &Options) -> Value {
    use crate::node::request::{METADATA_FROM_DRIVERS_OPTION, VIEW_OPTION};
    let mut attributes = serde_json::Map::new();
    attributes.insert(VIEW_OPTION.into(), json!("standard"));
    if !opts.metadata_from_drivers.is_empty() {
        attributes.insert(METADATA_FROM_DRIVERS_OPTION.into(), json!(opts.metadata_from_drivers.join(",")));
    }
    json!({"driver": opts.csi_driver, "readOnly": true, "volumeAttributes": attributes})
}

/// The name of a pod's volume that drafs node serves: a `csi` volume of
/// `driver`, the name the CSIDriver was installed under (`--csi-driver`).
pub fn csi_volume_of<'a>(spec: &'a Value, driver: &str) -> Option<&'a str> {
    spec.get("volumes").and_then(Value::as_array)?.iter().find_map(|v| {
        (v.pointer("/csi/driver").and_then(Value::as_str)? == driver).then(|| v["name"].as_str().unwrap_or_default())
    })
}

/// `/dra` and `/dra/` are the same mount path.
fn same_path(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// Inject into every document; documents that are not workloads pass unchanged.
pub fn inject_value(doc: &mut Value, opts: &Options, outcomes: &mut Vec<Outcome>) -> Result<(), InjectError> {
    if doc["kind"] == "List" {
        if let Some(items) = doc.get_mut("items").and_then(Value::as_array_mut) {
            for item in items {
                inject_value(item, opts, outcomes)?;
            }
        }
        return Ok(());
    }
    let what = describe(doc);
    let outcome = match pod_spec(doc) {
        None => Outcome::NotAWorkload(what),
        Some(spec) => match inject_spec(spec, opts) {
            Ok(Injected::Done) => Outcome::Injected(what),
            Ok(Injected::KeptAccount(account)) => Outcome::InjectedKeepingAccount { what, account },
            Ok(Injected::AlreadyThere) => Outcome::AlreadyInjected(what),
            Err(Skip::NoDevices) => Outcome::NoDevices(what),
            Err(Skip::Windows) => return Err(InjectError::Windows { what }),
            Err(Skip::MountPathTaken { container, volume, path }) => {
                return Err(InjectError::MountPathTaken { what, container, volume, path });
            }
        },
    };
    outcomes.push(outcome);
    Ok(())
}

/// Parse YAML documents, inject, and print them again. drafs works on the
/// values kubectl reads (YAML 1.1); everything it did not change is written
/// as it was, so each scalar keeps its meaning (see [`yaml`]).
pub fn inject(text: &str, opts: &Options) -> Result<(String, Vec<Outcome>), InjectError> {
    let docs = yaml::parse(text).map_err(|e| InjectError::Parse(e.to_string()))?;
    let mut outcomes = Vec::new();
    let mut out = String::new();
    for doc in docs {
        let old = doc.value().map_err(|e| InjectError::Parse(e.to_string()))?;
        if old.is_null() {
            continue;
        }
        if let Some(e) = live_pod(&old) {
            return Err(e);
        }
        let mut new = old.clone();
        inject_value(&mut new, opts, &mut outcomes)?;
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(&doc.emit(&old, &new).map_err(|e| InjectError::Write(e.to_string()))?);
    }
    Ok((out, outcomes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(mode: Mode) -> Options {
        Options::new(mode, "drafs:test")
    }

    const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainer}
spec:
  template:
    spec:
      resourceClaims: [{name: gpu, resourceClaimTemplateName: single-gpu}]
      containers:
      - name: app
        image: app
        resources: {claims: [{name: gpu}]}
      - name: logger
        image: logger
"#;

    #[test]
    fn injects_fuse_sidecar_and_mounts_only_claim_users() {
        let (out, outcomes) = inject(DEPLOYMENT, &opts(Mode::SidecarFuse)).unwrap();
        assert_eq!(outcomes, vec![Outcome::Injected("Deployment trainer".into())]);
        let doc: Value = serde_saphyr::from_str(&out).unwrap();
        let spec = &doc["spec"]["template"]["spec"];
        assert_eq!(spec["serviceAccountName"], "drafs");
        assert_eq!(spec["initContainers"][0]["name"], "drafs");
        assert_eq!(spec["initContainers"][0]["restartPolicy"], "Always");
        assert_eq!(spec["containers"][0]["volumeMounts"][0]["mountPropagation"], "HostToContainer");
        assert!(spec["containers"][1].get("volumeMounts").is_none(), "containers without claims are untouched");
        assert_eq!(spec["volumes"][1]["hostPath"]["path"], "/dev/fuse");
        // Credentials only for drafs: no automounted token, a projected one in drafs alone.
        assert_eq!(spec["automountServiceAccountToken"], false);
        assert_eq!(spec["volumes"][2]["name"], "drafs-token");
        let drafs_mounts = spec["initContainers"][0]["volumeMounts"].as_array().unwrap();
        assert!(drafs_mounts.iter().any(|m| m["name"] == "drafs-token"
            && m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
            && m["readOnly"] == true));
        for c in spec["containers"].as_array().unwrap() {
            let mounts = c.get("volumeMounts").and_then(Value::as_array).cloned().unwrap_or_default();
            assert!(mounts.iter().all(|m| m["name"] != "drafs-token"), "the app gets no credentials");
        }
        // A pod with its own service account keeps it and its automount, with a warning.
        let own =
            DEPLOYMENT.replace("      resourceClaims:", "      serviceAccountName: trainer\n      resourceClaims:");
        let (out, outcomes) = inject(&own, &opts(Mode::Init)).unwrap();
        assert_eq!(
            outcomes,
            vec![Outcome::InjectedKeepingAccount { what: "Deployment trainer".into(), account: "trainer".into() }]
        );
        assert!(!out.contains("automountServiceAccountToken") && !out.contains("drafs-token"), "{out}");
        // Keys keep their order: apiVersion stays first.
        assert!(out.starts_with("apiVersion: apps/v1\nkind: Deployment\n"), "{out}");
    }

    #[test]
    fn csi_mode_adds_a_volume_and_no_container() {
        let mut o = opts(Mode::Csi);
        o.require = vec!["gpu/gpu/0/uuid".parse().unwrap(), "gpu/gpu/0/productName".parse().unwrap()];
        let (out, outcomes) = inject(DEPLOYMENT, &o).unwrap();
        assert_eq!(outcomes, vec![Outcome::Injected("Deployment trainer".into())]);
        let doc: Value = serde_saphyr::from_str(&out).unwrap();
        let spec = &doc["spec"]["template"]["spec"];
        assert!(spec.get("initContainers").is_none(), "no drafs container: {out}");
        assert_eq!(
            spec["volumes"],
            json!([{"name": "dra", "csi": {"driver": "drafs.dev", "readOnly": true,
                    "volumeAttributes": {"require": "gpu/gpu/0/uuid,gpu/gpu/0/productName"}}}])
        );
        assert_eq!(
            spec["containers"][0]["volumeMounts"],
            json!([{"name": "dra", "mountPath": "/dra", "readOnly": true}])
        );
        assert!(spec["containers"][1].get("volumeMounts").is_none());
        // drafs node reads as the pod's account, which the app gets no token of.
        assert_eq!(
            (&spec["serviceAccountName"], &spec["automountServiceAccountToken"]),
            (&json!("drafs"), &json!(false))
        );
        let (twice, outcomes) = inject(&out, &o).unwrap();
        assert_eq!((twice, outcomes), (out.clone(), vec![Outcome::AlreadyInjected("Deployment trainer".into())]));
        // A pod already served by a container is not given the volume too, and the reverse.
        let (with_init, _) = inject(DEPLOYMENT, &opts(Mode::Init)).unwrap();
        assert_eq!(inject(&with_init, &o).unwrap().1, vec![Outcome::AlreadyInjected("Deployment trainer".into())]);
        assert_eq!(
            inject(&out, &opts(Mode::Init)).unwrap().1,
            vec![Outcome::AlreadyInjected("Deployment trainer".into())]
        );
        // The driver is the one installed (`--csi-driver`); a volume of another is not drafs's.
        let renamed = Options { csi_driver: "node.drafs.example".into(), ..o.clone() };
        let (other, _) = inject(DEPLOYMENT, &renamed).unwrap();
        let doc: Value = serde_saphyr::from_str(&other).unwrap();
        assert_eq!(doc["spec"]["template"]["spec"]["volumes"][0]["csi"]["driver"], "node.drafs.example");
        assert_eq!(inject(&other, &renamed).unwrap().1, vec![Outcome::AlreadyInjected("Deployment trainer".into())]);
        let spec = &doc["spec"]["template"]["spec"];
        assert_eq!(csi_volume_of(spec, "node.drafs.example"), Some("dra"));
        assert_eq!(csi_volume_of(spec, "drafs.dev"), None);
    }

    /// KubeVirt's launcher reads the standard view: in csi mode it is a
    /// second volume of drafs node's, mounted where `--metadata-dir` says.
    #[test]
    fn csi_mode_serves_the_standard_view_as_a_second_volume() {
        let mut o = opts(Mode::Csi);
        o.metadata_dir = Some("/var/run/kubernetes.io/dra-device-attributes".into());
        o.metadata_from_drivers = vec!["dra.net".into(), "gpu.example.com".into()];
        let (out, _) = inject(DEPLOYMENT, &o).unwrap();
        let doc: Value = serde_saphyr::from_str(&out).unwrap();
        let spec = &doc["spec"]["template"]["spec"];
        assert!(spec.get("initContainers").is_none(), "no drafs container: {out}");
        assert_eq!(
            spec["volumes"],
            json!([
                {"name": "dra", "csi": {"driver": "drafs.dev", "readOnly": true}},
                {"name": "dra-metadata", "csi": {"driver": "drafs.dev", "readOnly": true,
                 "volumeAttributes": {"view": "standard", "metadataFromDrivers": "dra.net,gpu.example.com"}}}
            ])
        );
        assert_eq!(
            spec["containers"][0]["volumeMounts"],
            json!([{"name": "dra", "mountPath": "/dra", "readOnly": true},
                   {"name": "dra-metadata", "mountPath": "/var/run/kubernetes.io/dra-device-attributes", "readOnly": true}])
        );
        // Without drivers of their own, the attribute is left out.
        o.metadata_from_drivers.clear();
        let (out, _) = inject(DEPLOYMENT, &o).unwrap();
        let doc: Value = serde_saphyr::from_str(&out).unwrap();
        assert_eq!(
            doc["spec"]["template"]["spec"]["volumes"][1]["csi"]["volumeAttributes"],
            json!({"view": "standard"})
        );
        assert_eq!(inject(&out, &o).unwrap().1, vec![Outcome::AlreadyInjected("Deployment trainer".into())]);
    }

    #[test]
    fn idempotent_and_leaves_other_documents_alone() {
        let input =
            format!("{DEPLOYMENT}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\ndata: {{a: b}}\n");
        let (once, _) = inject(&input, &opts(Mode::Init)).unwrap();
        let (twice, outcomes) = inject(&once, &opts(Mode::Init)).unwrap();
        assert_eq!(once, twice);
        assert_eq!(outcomes[0], Outcome::AlreadyInjected("Deployment trainer".into()));
        assert_eq!(outcomes[1], Outcome::NotAWorkload("ConfigMap c".into()));
    }

    #[test]
    fn only_the_admission_plugins_token_volume_is_removed() {
        let pod = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
            "serviceAccountName": "default",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
            "containers": [{"name": "app", "resources": {"claims": [{"name": "gpu"}]}, "volumeMounts": [
                {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                {"name": "kube-api-access-mine", "mountPath": "/data"}]}],
            "volumes": [
                {"name": "kube-api-access-abcde", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
                {"name": "kube-api-access-mine", "emptyDir": {}}]}}"#;
        let mut doc: Value = serde_json::from_str(pod).unwrap();
        inject_value(&mut doc, &opts(Mode::Init), &mut Vec::new()).unwrap();
        let names: Vec<&str> =
            doc["spec"]["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
        assert!(!names.contains(&"kube-api-access-abcde") && names.contains(&"kube-api-access-mine"), "{names:?}");
        let mounts = &doc["spec"]["containers"][0]["volumeMounts"];
        assert_eq!(mounts[0]["name"], "kube-api-access-mine", "{mounts}");
    }

    fn drafs_of(doc: &Value) -> &Value {
        let spec = doc.pointer("/spec/template/spec").or_else(|| doc.get("spec")).unwrap();
        spec["initContainers"].as_array().unwrap().iter().find(|c| c["name"] == CONTAINER).unwrap()
    }

    #[test]
    fn unprivileged_modes_meet_the_restricted_pod_security_standard() {
        for mode in [Mode::Init, Mode::SidecarFiles] {
            let (out, _) = inject(DEPLOYMENT, &opts(mode)).unwrap();
            let doc: Value = serde_saphyr::from_str(&out).unwrap();
            let sc = &drafs_of(&doc)["securityContext"];
            assert_eq!(
                sc,
                &json!({
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]},
                    "runAsNonRoot": true,
                    "runAsUser": 65532,
                    "runAsGroup": 65532,
                    "seccompProfile": {"type": "RuntimeDefault"},
                }),
                "{mode:?}"
            );
        }
    }

    #[test]
    fn where_the_platform_assigns_the_uid_none_is_pinned() {
        for mode in [Mode::Init, Mode::SidecarFiles] {
            let mut o = opts(mode);
            o.platform_uid = true;
            let (out, _) = inject(DEPLOYMENT, &o).unwrap();
            let doc: Value = serde_saphyr::from_str(&out).unwrap();
            let sc = &drafs_of(&doc)["securityContext"];
            assert_eq!(sc["runAsNonRoot"], true, "{mode:?}");
            assert!(sc.get("runAsUser").is_none() && sc.get("runAsGroup").is_none(), "{mode:?}: {sc}");
            assert_eq!(sc["capabilities"], json!({"drop": ["ALL"]}), "{mode:?}");
        }
    }

    #[test]
    fn the_fuse_sidecar_runs_as_root_even_when_the_pod_asks_for_non_root() {
        let non_root = DEPLOYMENT
            .replace("      containers:\n", "      securityContext: {runAsNonRoot: true}\n      containers:\n");
        let (out, _) = inject(&non_root, &opts(Mode::SidecarFuse)).unwrap();
        let doc: Value = serde_saphyr::from_str(&out).unwrap();
        let sc = &drafs_of(&doc)["securityContext"];
        // The container's own runAsNonRoot overrides the pod's; without it the kubelet refuses uid 0.
        assert_eq!(sc, &json!({"privileged": true, "runAsUser": 0, "runAsNonRoot": false}));
        assert_eq!(doc["spec"]["template"]["spec"]["securityContext"], json!({"runAsNonRoot": true}), "the pod's own");
    }

    #[test]
    fn windows_pods_are_refused_naming_the_reason() {
        let windows = DEPLOYMENT.replace("      containers:\n", "      os: {name: windows}\n      containers:\n");
        for mode in [Mode::Init, Mode::SidecarFiles, Mode::SidecarFuse] {
            let err = inject(&windows, &opts(mode)).unwrap_err().to_string();
            assert!(
                err.contains("Deployment trainer") && err.contains("spec.os.name") && err.contains("windows"),
                "{err}"
            );
        }
        // A Linux pod, said so, is injected.
        let linux = DEPLOYMENT.replace("      containers:\n", "      os: {name: linux}\n      containers:\n");
        let (_, outcomes) = inject(&linux, &opts(Mode::Init)).unwrap();
        assert_eq!(outcomes, vec![Outcome::Injected("Deployment trainer".into())]);
    }

    #[test]
    fn containers_asking_for_extended_resources_get_the_tree() {
        let input = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: inference}
spec:
  template:
    spec:
      containers:
      - {name: trainer, image: t, resources: {limits: {nvidia.com/gpu: 1}}}
      - {name: web, image: w, resources: {limits: {cpu: 1, memory: 1Gi, hugepages-2Mi: 1Gi}}}
      - {name: nic, image: n, resources: {requests: {deviceclass.resource.kubernetes.io/nic.example.com: 1}}}
"#;
        let (out, outcomes) = inject(input, &opts(Mode::Init)).unwrap();
        assert_eq!(outcomes, vec![Outcome::Injected("Deployment inference".into())]);
        let doc: Value = serde_saphyr::from_str(&out).unwrap();
        let containers = doc["spec"]["template"]["spec"]["containers"].as_array().unwrap();
        let mounted: Vec<bool> =
            containers.iter().map(|c| c["volumeMounts"].as_array().is_some_and(|m| !m.is_empty())).collect();
        assert_eq!(mounted, vec![true, false, true], "only the containers that asked for a device");
    }

    #[test]
    fn pods_without_claims_are_unchanged() {
        let input = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: a}]}\n";
        let (out, outcomes) = inject(input, &opts(Mode::Init)).unwrap();
        assert_eq!(outcomes, vec![Outcome::NoDevices("Pod p".into())]);
        let (round, _) = inject(&out, &opts(Mode::Init)).unwrap();
        assert_eq!(out, round);
        assert!(!out.contains("drafs"));
    }

    #[test]
    fn a_volume_named_dra_gets_a_free_name_and_a_taken_mount_path_is_refused() {
        let with_volume = DEPLOYMENT.replace(
            "      containers:\n",
            "      volumes: [{name: dra, configMap: {name: mine}}, {name: dev-fuse, emptyDir: {}}]\n      containers:\n",
        );
        let (out, _) = inject(&with_volume, &opts(Mode::SidecarFuse)).unwrap();
        let doc: Value = serde_saphyr::from_str(&out).unwrap();
        let spec = &doc["spec"]["template"]["spec"];
        let names: Vec<&str> =
            spec["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["dra", "dev-fuse", "dra-1", "dev-fuse-1", "drafs-token"], "no duplicate volume names");
        assert_eq!(spec["initContainers"][0]["volumeMounts"][0]["name"], "dra-1");
        assert_eq!(spec["initContainers"][0]["volumeMounts"][1]["name"], "dev-fuse-1");
        assert_eq!(spec["containers"][0]["volumeMounts"][0]["name"], "dra-1");

        let with_mount = DEPLOYMENT.replace(
            "        resources: {claims: [{name: gpu}]}\n",
            "        resources: {claims: [{name: gpu}]}\n        volumeMounts: [{name: own, mountPath: /dra/}]\n",
        );
        let err = inject(&with_mount, &opts(Mode::Init)).unwrap_err().to_string();
        assert!(
            err.contains("container \"app\" already mounts volume \"own\" at /dra") && err.contains("--dir"),
            "{err}"
        );
        let moved = Options { dir: "/devices".into(), ..opts(Mode::Init) };
        let (out, _) = inject(&with_mount, &moved).unwrap();
        assert!(out.contains("mountPath: /devices"), "{out}");
    }
}
