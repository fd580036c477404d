//! `drafs inject`: add drafs to Pod and workload manifests.
//!
//! Pure: YAML documents in, YAML documents out. Only pod specs with DRA claims
//! are changed; a pod spec that already has a `drafs` container is left alone,
//! so injecting twice changes nothing.

use serde_json::{Value, json};

pub const CONTAINER: &str = "drafs";
const VOLUME: &str = "dra";
const FUSE_VOLUME: &str = "dev-fuse";
const TOKEN_VOLUME: &str = "drafs-token";
/// Where a pod's service-account credentials are expected (in-cluster config).
const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

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
        "{what}: container {container:?} already mounts volume {volume:?} at {path}, where the tree would go; choose another place with --dir"
    )]
    MountPathTaken { what: String, container: String, volume: String, path: String },
}

/// Why a pod spec was not changed.
enum Skip {
    NoClaims,
    MountPathTaken { container: String, volume: String },
}

/// `base`, or `base-1`, `base-2`... whichever no volume of the pod has.
fn free_volume_name(volumes: &[Value], base: &str) -> String {
    let taken = |n: &str| volumes.iter().any(|v| v["name"] == n);
    std::iter::once(base.to_string())
        .chain((1..).map(|i| format!("{base}-{i}")))
        .find(|n| !taken(n))
        .expect("an unbounded sequence has a free name")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// `drafs init` as an init container: values written once, no privileges.
    Init,
    /// `drafs serve` as a native sidecar with the FUSE backend: live values, privileged.
    SidecarFuse,
    /// `drafs serve` as a native sidecar with the files backend: live values, no privileges.
    SidecarFiles,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    pub image: String,
    pub dir: String,
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
    NoClaims(String),
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

fn drafs_container(opts: &Options, volume: &str, fuse_volume: &str) -> Value {
    let dir = &opts.dir;
    let probe = json!({"exec": {"command": ["/drafs", "probe", format!("--dir={dir}")]}, "periodSeconds": 1, "failureThreshold": 300});
    let restricted =
        json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}});
    let resources = json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}});
    let mut c = json!({
        "name": CONTAINER,
        "image": opts.image,
        "args": [],
        "env": downward_env(),
        "resources": resources,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": restricted,
        "volumeMounts": [{"name": volume, "mountPath": dir}],
    });
    match opts.mode {
        Mode::Init => {
            c["args"] = json!(["init", format!("--dir={dir}")]);
        }
        Mode::SidecarFiles => {
            c["args"] = json!(["serve", "--backend=files", format!("--dir={dir}")]);
            c["restartPolicy"] = json!("Always");
            c["startupProbe"] = probe;
        }
        Mode::SidecarFuse => {
            c["args"] = json!(["serve", "--backend=fuse", format!("--dir={dir}")]);
            c["restartPolicy"] = json!("Always");
            c["startupProbe"] = probe;
            c["lifecycle"] = json!({"preStop": {"exec": {"command": ["/drafs", "unmount", format!("--dir={dir}")]}}});
            c["securityContext"] = json!({"privileged": true, "runAsUser": 0});
            c["volumeMounts"] = json!([
                {"name": volume, "mountPath": dir, "mountPropagation": "Bidirectional"},
                {"name": fuse_volume, "mountPath": "/dev/fuse"},
            ]);
        }
    }
    c
}

fn uses_claims(container: &Value) -> bool {
    container.pointer("/resources/claims").and_then(Value::as_array).is_some_and(|c| !c.is_empty())
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

/// Inject into one pod spec.
fn inject_spec(spec: &mut Value, opts: &Options) -> Result<Injected, Skip> {
    let has_claims = spec.get("resourceClaims").and_then(Value::as_array).is_some_and(|c| !c.is_empty());
    if !has_claims {
        return Err(Skip::NoClaims);
    }
    let already = ["initContainers", "containers"]
        .iter()
        .any(|k| spec.get(*k).and_then(Value::as_array).is_some_and(|cs| cs.iter().any(|c| c["name"] == CONTAINER)));
    if already {
        return Ok(Injected::AlreadyThere);
    }
    // Something of the pod's own mounted where the tree goes would hide it.
    for key in ["initContainers", "containers"] {
        for c in spec.get(key).and_then(Value::as_array).into_iter().flatten() {
            let mounts = c.get("volumeMounts").and_then(Value::as_array).into_iter().flatten();
            if let Some(m) =
                mounts.into_iter().find(|m| m["mountPath"].as_str().is_some_and(|p| same_path(p, &opts.dir)))
            {
                return Err(Skip::MountPathTaken {
                    container: c["name"].as_str().unwrap_or_default().to_string(),
                    volume: m["name"].as_str().unwrap_or_default().to_string(),
                });
            }
        }
    }
    let existing: Vec<Value> = spec.get("volumes").and_then(Value::as_array).cloned().unwrap_or_default();
    let volume = free_volume_name(&existing, VOLUME);
    let fuse_volume = free_volume_name(&existing, FUSE_VOLUME);
    let token_volume_name = free_volume_name(&existing, TOKEN_VOLUME);
    let map = spec.as_object_mut().expect("pod spec is an object");
    // When drafs brings the service account, only drafs gets its credentials:
    // no token is mounted into the app's containers.
    let own_account = map.get("serviceAccountName").and_then(Value::as_str).is_none_or(str::is_empty);
    if own_account {
        map.insert("serviceAccountName".into(), json!("drafs"));
        map.insert("automountServiceAccountToken".into(), json!(false));
    }
    let mount = match opts.mode {
        Mode::SidecarFuse => {
            json!({"name": volume, "mountPath": opts.dir, "readOnly": true, "mountPropagation": "HostToContainer"})
        }
        _ => json!({"name": volume, "mountPath": opts.dir, "readOnly": true}),
    };
    for key in ["initContainers", "containers"] {
        if let Some(containers) = spec.get_mut(key).and_then(Value::as_array_mut) {
            for c in containers.iter_mut().filter(|c| uses_claims(c)) {
                array(c, "volumeMounts").push(mount.clone());
            }
        }
    }
    let mut container = drafs_container(opts, &volume, &fuse_volume);
    if own_account {
        array(&mut container, "volumeMounts")
            .push(json!({"name": token_volume_name, "mountPath": TOKEN_PATH, "readOnly": true}));
    }
    array(spec, "initContainers").insert(0, container);
    let volumes = array(spec, "volumes");
    let dra_volume = match opts.mode {
        Mode::SidecarFuse => json!({"name": volume, "emptyDir": {}}),
        _ => json!({"name": volume, "emptyDir": {"medium": "Memory", "sizeLimit": "4Mi"}}),
    };
    volumes.push(dra_volume);
    if opts.mode == Mode::SidecarFuse {
        volumes.push(json!({"name": fuse_volume, "hostPath": {"path": "/dev/fuse", "type": "CharDevice"}}));
    }
    if own_account {
        volumes.push(token_volume(&token_volume_name));
        Ok(Injected::Done)
    } else {
        Ok(Injected::KeptAccount(spec["serviceAccountName"].as_str().unwrap_or_default().to_string()))
    }
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
            Err(Skip::NoClaims) => Outcome::NoClaims(what),
            Err(Skip::MountPathTaken { container, volume }) => {
                return Err(InjectError::MountPathTaken { what, container, volume, path: opts.dir.clone() });
            }
        },
    };
    outcomes.push(outcome);
    Ok(())
}

/// Parse YAML documents, inject, and print them again.
pub fn inject(text: &str, opts: &Options) -> Result<(String, Vec<Outcome>), InjectError> {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple_with_options(text, options).map_err(|e| InjectError::Parse(e.to_string()))?;
    let mut outcomes = Vec::new();
    let mut out = String::new();
    for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
        inject_value(&mut doc, opts, &mut outcomes)?;
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(&serde_saphyr::to_string(&doc).map_err(|e| InjectError::Write(e.to_string()))?);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok((out, outcomes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(mode: Mode) -> Options {
        Options { mode, image: "drafs:test".into(), dir: "/dra".into() }
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
    fn pods_without_claims_are_unchanged() {
        let input = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: a}]}\n";
        let (out, outcomes) = inject(input, &opts(Mode::Init)).unwrap();
        assert_eq!(outcomes, vec![Outcome::NoClaims("Pod p".into())]);
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
