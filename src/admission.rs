//! What `drafs webhook` answers: an AdmissionReview in, an AdmissionReview out.
//!
//! Pure, like `inject` (whose code path it shares): the pod's label
//! `drafs.dev/inject` picks the mode, its annotations the options, and the
//! answer carries a JSONPatch that turns the pod into what `drafs inject` would
//! have printed. Nothing here calls the API server.

use std::time::Duration;

use serde_json::{Value, json};

use crate::inject::{self, Mode, Options, Outcome};
use crate::tree::RequirePath;

/// The label that opts a pod in; the webhook configuration selects on it.
pub const INJECT_LABEL: &str = "drafs.dev/inject";
/// Per-pod options, as annotations.
pub const DIR_ANNOTATION: &str = "drafs.dev/dir";
pub const METADATA_DIR_ANNOTATION: &str = "drafs.dev/metadata-dir";
pub const METADATA_FROM_DRIVERS_ANNOTATION: &str = "drafs.dev/metadata-from-drivers";
pub const REQUIRE_ANNOTATION: &str = "drafs.dev/require";
pub const TIMEOUT_ANNOTATION: &str = "drafs.dev/timeout";

const API_VERSION: &str = "admission.k8s.io/v1";
const MODES: &str = "init, sidecar-fuse or sidecar-files";

/// A request that is not an AdmissionReview drafs can answer (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("request body is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("request body is not an admission.k8s.io/v1 AdmissionReview with a request (apiVersion {0:?}, kind {1:?})")]
    NotAReview(String, String),
    #[error("AdmissionReview request has no uid")]
    NoUid,
    #[error("AdmissionReview request for CREATE pods has no Pod object")]
    NoObject,
}

/// What the webhook decided, for the answer and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed unchanged (not a labelled pod create, no claims, already has drafs).
    Allowed { warnings: Vec<String> },
    /// Allowed with drafs added.
    Patched { patch: Vec<Value>, warnings: Vec<String> },
    /// Refused, with a message for the user.
    Denied { message: String },
}

impl Verdict {
    /// The metrics label of this verdict.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Allowed { .. } => "allowed",
            Verdict::Patched { .. } => "patched",
            Verdict::Denied { .. } => "denied",
        }
    }
}

/// Answer one AdmissionReview (the request body) with another (the response body).
pub fn review(body: &[u8], image: &str) -> Result<(Value, Verdict), ReviewError> {
    let review: Value = serde_json::from_slice(body).map_err(ReviewError::NotJson)?;
    let (api_version, kind) = (review["apiVersion"].as_str().unwrap_or(""), review["kind"].as_str().unwrap_or(""));
    let request = &review["request"];
    if api_version != API_VERSION || kind != "AdmissionReview" || !request.is_object() {
        return Err(ReviewError::NotAReview(api_version.into(), kind.into()));
    }
    let uid = request["uid"].as_str().filter(|u| !u.is_empty()).ok_or(ReviewError::NoUid)?;
    let verdict = decide(request, image)?;
    let mut response = json!({"uid": uid, "allowed": !matches!(verdict, Verdict::Denied { .. })});
    match &verdict {
        Verdict::Allowed { warnings } => add_warnings(&mut response, warnings),
        Verdict::Patched { patch, warnings } => {
            let bytes = serde_json::to_vec(patch).expect("a JSON value serializes");
            response["patchType"] = json!("JSONPatch");
            response["patch"] = serde_json::to_value(k8s_openapi::ByteString(bytes)).expect("bytes serialize");
            add_warnings(&mut response, warnings);
        }
        Verdict::Denied { message } => {
            response["status"] = json!({"code": 400, "reason": "BadRequest", "message": message});
        }
    }
    Ok((json!({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}), verdict))
}

fn add_warnings(response: &mut Value, warnings: &[String]) {
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
}

fn allowed() -> Verdict {
    Verdict::Allowed { warnings: Vec::new() }
}

fn decide(request: &Value, image: &str) -> Result<Verdict, ReviewError> {
    let is_pod = request["kind"]["group"] == "" && request["kind"]["kind"] == "Pod";
    let is_create = request["operation"] == "CREATE" && request["subResource"].as_str().is_none_or(str::is_empty);
    if !is_pod || !is_create {
        return Ok(allowed());
    }
    let pod = &request["object"];
    if !pod.is_object() {
        return Err(ReviewError::NoObject);
    }
    let Some(label) = pod.pointer("/metadata/labels").and_then(|l| l.get(INJECT_LABEL)) else {
        return Ok(allowed());
    };
    let opts = match options(pod, label, image) {
        Ok(opts) => opts,
        Err(message) => return Ok(Verdict::Denied { message }),
    };
    let mut patched = pod.clone();
    // The object is a Pod whether or not the review spells out its kind.
    patched["kind"] = json!("Pod");
    let mut outcomes = Vec::new();
    if let Err(e) = inject::inject_value(&mut patched, &opts, &mut outcomes) {
        return Ok(Verdict::Denied { message: e.to_string() });
    }
    let warnings = match outcomes.first() {
        Some(Outcome::Injected(_)) => Vec::new(),
        Some(Outcome::InjectedKeepingAccount { account, .. }) => vec![format!(
            "drafs runs as the pod's service account {account:?}, which needs drafs's RBAC (drafs manifests rbac --namespace NS --service-account {account}); its token stays mounted in every container"
        )],
        Some(Outcome::NoClaims(_)) => {
            return Ok(Verdict::Allowed {
                warnings: vec![format!(
                    "label {INJECT_LABEL} is set but the pod has no resourceClaims: drafs not added"
                )],
            });
        }
        _ => return Ok(allowed()),
    };
    Ok(Verdict::Patched { patch: patch(pod, &patched), warnings })
}

/// The injection options a pod asks for, or a message naming what is wrong.
fn options(pod: &Value, label: &Value, image: &str) -> Result<Options, String> {
    let mode = match label.as_str().unwrap_or_default() {
        "init" => Mode::Init,
        "sidecar-fuse" => Mode::SidecarFuse,
        "sidecar-files" => Mode::SidecarFiles,
        other => return Err(format!("label {INJECT_LABEL}: {other:?} is not a drafs mode; use {MODES}")),
    };
    let annotation = |key: &str| pod.pointer("/metadata/annotations").and_then(|a| a.get(key)).and_then(Value::as_str);
    let mut opts = Options::new(mode, image);
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
                crate::cli::parse_driver_name(d)
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
        let timeout: Duration = crate::cli::parse_duration(text)
            .map_err(|e| format!("annotation {TIMEOUT_ANNOTATION}: {e} (e.g. 90s, 5m, 1h; 0 for no limit)"))?;
        opts.timeout = Some(timeout);
    }
    Ok(opts)
}

/// The JSONPatch from `old` to `new` pod: one operation per changed field of
/// the spec (the only part injection changes).
fn patch(old: &Value, new: &Value) -> Vec<Value> {
    let (Some(old_spec), Some(new_spec)) = (old["spec"].as_object(), new["spec"].as_object()) else {
        return Vec::new();
    };
    let mut ops = Vec::new();
    for (key, value) in new_spec {
        let path = format!("/spec/{}", key.replace('~', "~0").replace('/', "~1"));
        match old_spec.get(key) {
            None => ops.push(json!({"op": "add", "path": path, "value": value})),
            Some(before) if before != value => ops.push(json!({"op": "replace", "path": path, "value": value})),
            Some(_) => {}
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = r#"{
      "apiVersion": "v1",
      "kind": "Pod",
      "metadata": {"generateName": "trainer-", "namespace": "ml", "labels": {"drafs.dev/inject": "init"}},
      "spec": {
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
        "containers": [
          {"name": "app", "image": "app", "resources": {"claims": [{"name": "gpu"}]},
           "volumeMounts": [{"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]},
          {"name": "logger", "image": "logger",
           "volumeMounts": [{"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]}
        ],
        "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]
      }
    }"#;

    fn request(pod: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": "ml",
                "object": pod,
            }
        }))
        .unwrap()
    }

    fn pod_with(edit: impl FnOnce(&mut Value)) -> Value {
        let mut pod: Value = serde_json::from_str(POD).unwrap();
        edit(&mut pod);
        pod
    }

    /// Apply a JSONPatch of add/replace operations on `/spec/<key>` (all the webhook makes).
    fn apply(pod: &Value, ops: &[Value]) -> Value {
        let mut out = pod.clone();
        for op in ops {
            let key = op["path"].as_str().unwrap().strip_prefix("/spec/").unwrap();
            assert!(matches!(op["op"].as_str(), Some("add" | "replace")), "{op}");
            assert_eq!(op["op"] == "add", pod["spec"].get(key).is_none(), "add only for new fields: {op}");
            out["spec"][key] = op["value"].clone();
        }
        out
    }

    fn decoded_patch(response: &Value) -> Vec<Value> {
        let bytes: k8s_openapi::ByteString = serde_json::from_value(response["response"]["patch"].clone()).unwrap();
        serde_json::from_slice(&bytes.0).unwrap()
    }

    #[test]
    fn a_labelled_pod_gets_exactly_what_inject_gives() {
        let pod = pod_with(|_| {});
        let (response, verdict) = review(&request(pod.clone()), "registry.example/drafs:1").unwrap();
        assert_eq!(verdict.label(), "patched");
        let r = &response["response"];
        assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(r["allowed"], true);
        assert_eq!(r["patchType"], "JSONPatch");
        assert_eq!(response["apiVersion"], "admission.k8s.io/v1");
        let patched = apply(&pod, &decoded_patch(&response));
        // The same code path as `drafs inject`.
        let mut injected = pod.clone();
        inject::inject_value(&mut injected, &Options::new(Mode::Init, "registry.example/drafs:1"), &mut Vec::new())
            .unwrap();
        assert_eq!(patched, injected);
        let spec = &patched["spec"];
        assert_eq!(spec["initContainers"][0]["image"], "registry.example/drafs:1");
        // The account the ServiceAccount plugin defaulted is replaced, and its
        // token, mounted into every container, is gone: only drafs has credentials.
        assert_eq!(spec["serviceAccountName"], "drafs");
        assert_eq!(spec["serviceAccount"], "drafs");
        assert_eq!(spec["automountServiceAccountToken"], false);
        assert!(!patched.to_string().contains("kube-api-access-"), "{patched:#}");
        assert_eq!(spec["containers"][0]["volumeMounts"][0]["mountPath"], "/dra");
        assert!(spec["containers"][1]["volumeMounts"].as_array().unwrap().is_empty());
    }

    #[test]
    fn annotations_become_drafs_options_and_mounts() {
        let pod = pod_with(|p| {
            p["metadata"]["labels"][INJECT_LABEL] = json!("sidecar-files");
            p["metadata"]["annotations"] = json!({
                METADATA_DIR_ANNOTATION: "/var/run/kubernetes.io/dra-device-attributes",
                METADATA_FROM_DRIVERS_ANNOTATION: "dra.net, gpu.example.com",
                REQUIRE_ANNOTATION: "gpu/gpu/0/uuid, gpu/gpu/0/resource.kubernetes.io/pciBusID",
                TIMEOUT_ANNOTATION: "2m",
            });
        });
        let (response, _) = review(&request(pod.clone()), "drafs:test").unwrap();
        let patched = apply(&pod, &decoded_patch(&response));
        let drafs = &patched["spec"]["initContainers"][0];
        assert_eq!(
            drafs["args"],
            json!([
                "serve",
                "--backend=files",
                "--dir=/dra",
                "--metadata-dir=/var/run/kubernetes.io/dra-device-attributes",
                "--metadata-from-driver=dra.net",
                "--metadata-from-driver=gpu.example.com",
                "--require=gpu/gpu/0/uuid",
                "--require=gpu/gpu/0/resource.kubernetes.io/pciBusID",
                "--timeout=120s"
            ])
        );
        assert_eq!(drafs["startupProbe"]["failureThreshold"], 130);
        assert_eq!(drafs["readinessProbe"]["exec"]["command"][1], "probe");
        let app_mounts = &patched["spec"]["containers"][0]["volumeMounts"];
        assert_eq!(app_mounts[1]["mountPath"], "/var/run/kubernetes.io/dra-device-attributes");
        assert_eq!(app_mounts[1]["readOnly"], true);
    }

    #[test]
    fn bad_labels_and_annotations_are_denied_with_the_valid_values() {
        let cases: Vec<(Value, &str)> = vec![
            (
                json!({"labels": {INJECT_LABEL: "sidecar"}}),
                "label drafs.dev/inject: \"sidecar\" is not a drafs mode; use init, sidecar-fuse or sidecar-files",
            ),
            (json!({"annotations": {TIMEOUT_ANNOTATION: "5 minutes"}}), "annotation drafs.dev/timeout"),
            (
                json!({"annotations": {REQUIRE_ANNOTATION: "gpu/../etc"}}),
                "annotation drafs.dev/require: \"gpu/../etc\" is not CLAIM/REQUEST/INDEX/ATTRIBUTE",
            ),
            (json!({"annotations": {METADATA_DIR_ANNOTATION: "relative/dir"}}), "must be an absolute path"),
            (json!({"annotations": {METADATA_DIR_ANNOTATION: "/dra/meta"}}), "overlaps the tree's directory /dra"),
            (
                json!({"annotations": {METADATA_DIR_ANNOTATION: "/var/run/secrets/kubernetes.io"}}),
                "service-account token",
            ),
            (json!({"annotations": {DIR_ANNOTATION: "/"}}), "annotation drafs.dev/dir: \"/\" must not be / itself"),
            (
                json!({"annotations": {METADATA_FROM_DRIVERS_ANNOTATION: "dra.net"}}),
                "annotation drafs.dev/metadata-from-drivers needs drafs.dev/metadata-dir",
            ),
            (
                json!({"annotations": {METADATA_DIR_ANNOTATION: "/var/run/kubernetes.io/dra-device-attributes", METADATA_FROM_DRIVERS_ANNOTATION: "Not_A_Driver"}}),
                "annotation drafs.dev/metadata-from-drivers: \"Not_A_Driver\" is not a driver name",
            ),
            (json!({"annotations": {DIR_ANNOTATION: "/a/../b"}}), "clean path"),
        ];
        for (metadata, expected) in cases {
            let pod = pod_with(|p| {
                for (k, v) in metadata.as_object().unwrap() {
                    for (kk, vv) in v.as_object().unwrap() {
                        p["metadata"][k][kk] = vv.clone();
                    }
                }
            });
            let (response, verdict) = review(&request(pod), "drafs:test").unwrap();
            let Verdict::Denied { message } = verdict else { panic!("{metadata}: not denied") };
            assert!(message.contains(expected), "{metadata}: {message}");
            assert_eq!(response["response"]["allowed"], false);
            assert_eq!(response["response"]["status"]["message"], message);
            assert!(response["response"].get("patch").is_none());
        }
    }

    #[test]
    fn other_requests_pass_unchanged() {
        let unlabelled = pod_with(|p| p["metadata"]["labels"] = json!({"app": "x"}));
        let no_claims = pod_with(|p| p["spec"]["resourceClaims"] = json!([]));
        let with_drafs = pod_with(|p| p["spec"]["initContainers"] = json!([{"name": "drafs", "image": "mine"}]));
        for (pod, warned) in [(unlabelled, false), (no_claims, true), (with_drafs, false)] {
            let (response, verdict) = review(&request(pod), "drafs:test").unwrap();
            assert_eq!(verdict.label(), "allowed", "{response}");
            assert!(response["response"].get("patch").is_none());
            assert_eq!(response["response"].get("warnings").is_some(), warned, "{response}");
        }
        let mut update: Value = serde_json::from_slice(&request(pod_with(|_| {}))).unwrap();
        update["request"]["operation"] = json!("UPDATE");
        let (_, verdict) = review(&serde_json::to_vec(&update).unwrap(), "drafs:test").unwrap();
        assert_eq!(verdict, allowed());
        // A pod that names its own account keeps it, and is told what it needs.
        let own = pod_with(|p| p["spec"]["serviceAccountName"] = json!("trainer"));
        let (response, _) = review(&request(own), "drafs:test").unwrap();
        assert!(response["response"]["warnings"][0].as_str().unwrap().contains("--service-account trainer"));
    }

    #[test]
    fn malformed_bodies_are_errors_not_panics() {
        assert!(matches!(review(b"not json", "i"), Err(ReviewError::NotJson(_))));
        assert!(matches!(review(b"{}", "i"), Err(ReviewError::NotAReview(..))));
        assert!(matches!(review(b"[1,2]", "i"), Err(ReviewError::NotAReview(..))));
        let mut no_uid: Value = serde_json::from_slice(&request(pod_with(|_| {}))).unwrap();
        no_uid["request"]["uid"] = json!(7);
        assert!(matches!(review(&serde_json::to_vec(&no_uid).unwrap(), "i"), Err(ReviewError::NoUid)));
        let mut no_object = no_uid.clone();
        no_object["request"]["uid"] = json!("u");
        no_object["request"]["object"] = json!("pod");
        assert!(matches!(review(&serde_json::to_vec(&no_object).unwrap(), "i"), Err(ReviewError::NoObject)));
        // Odd shapes inside a well-formed review are answered, never a panic.
        for odd in [
            json!({"spec": 5, "metadata": {"labels": {INJECT_LABEL: "init"}}}),
            json!({"metadata": {"labels": {INJECT_LABEL: 3}}}),
            json!({"metadata": {"labels": {INJECT_LABEL: "init"}, "annotations": {TIMEOUT_ANNOTATION: 5}},
                           "spec": {"resourceClaims": [{"name": "g"}], "containers": "x"}}),
        ] {
            assert!(review(&request(odd.clone()), "i").is_ok(), "{odd}");
        }
    }
}
