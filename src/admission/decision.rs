//! What `drafs webhook` answers: an AdmissionReview in, an AdmissionReview out.
//!
//! Pure, like `inject` (whose code path it shares): the rules of `policy`
//! say whether the pod gets drafs and with which options, and the answer
//! carries a JSONPatch that turns the pod into what `drafs inject` would
//! have printed. Nothing here calls the API server.
//!
//! A review can be megabytes, so it stays raw text: only the parts of the
//! pod that `inject` and the options read ([`POD_PARTS`]) become `Value`s,
//! within [`MAX_TREE`] bytes (`prune`), and the patch is computed against
//! the raw text (`patch`).

use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::admission::inject::{self, Outcome};
use crate::admission::patch;
use crate::admission::policy::{Defaults, INJECT_LABEL, OptIn, Requested, options, requested};
use crate::admission::prune::{self, Budget, Keep, Stop, is_object};

/// The most memory the parts of one pod that drafs reads may take as
/// `Value`s (estimated before they are built, see `estimate`). A 3 MB pod of
/// 3,000 containers (benches/webhook.rs) needs about 21 MiB; what needs more
/// is denied. With the body (at most 8 MiB) this keeps a review under 48 MiB
/// (42 MiB at most, measured on the worst shapes).
pub const MAX_TREE: usize = 24 << 20;

const API_VERSION: &str = "admission.k8s.io/v1";

/// A request that is not an AdmissionReview drafs can answer (HTTP 400), or a
/// patch drafs could not compute (HTTP 500).
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
    #[error("cannot compute the patch: {0}")]
    Internal(String),
}

/// What the webhook decided, for the answer and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed unchanged (not a labelled pod create, no claims, already has drafs).
    Allowed { warnings: Vec<String> },
    /// Allowed with drafs added.
    /// `patch` is the JSON Patch, as JSON text.
    Patched { patch: String, warnings: Vec<String> },
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

/// The parts of an AdmissionReview drafs reads, still raw JSON text.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "apiVersion", borrow, default)]
    api_version: Option<&'a RawValue>,
    #[serde(borrow, default)]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    request: Option<RequestPart<'a>>,
}

#[derive(serde::Deserialize)]
struct RequestPart<'a> {
    #[serde(borrow, default)]
    uid: Option<&'a RawValue>,
    #[serde(borrow, default)]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    operation: Option<&'a RawValue>,
    #[serde(rename = "subResource", borrow, default)]
    sub_resource: Option<&'a RawValue>,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct KindPart<'a> {
    #[serde(borrow, default)]
    group: Option<&'a RawValue>,
    #[serde(borrow, default)]
    kind: Option<&'a RawValue>,
}

/// The JSON string `raw` holds, if it is one.
fn string(raw: Option<&RawValue>) -> Option<String> {
    raw.and_then(|r| serde_json::from_str::<String>(r.get()).ok())
}

/// Answer one AdmissionReview (the request body) with another (the response body).
pub fn review(body: &[u8], defaults: &Defaults, opt_in: OptIn) -> Result<(Value, Verdict), ReviewError> {
    let not_a_review = |e: serde_json::Error| match e.classify() {
        serde_json::error::Category::Data => ReviewError::NotAReview(String::new(), String::new()),
        _ => ReviewError::NotJson(e),
    };
    let envelope: Envelope = serde_json::from_slice(body).map_err(not_a_review)?;
    let (api_version, kind) =
        (string(envelope.api_version).unwrap_or_default(), string(envelope.kind).unwrap_or_default());
    let request = match envelope.request {
        Some(r) if api_version == API_VERSION && kind == "AdmissionReview" => r,
        _ => return Err(ReviewError::NotAReview(api_version, kind)),
    };
    let uid = string(request.uid).filter(|u| !u.is_empty()).ok_or(ReviewError::NoUid)?;
    let verdict = decide(&request, defaults, opt_in)?;
    let mut response = json!({"uid": uid, "allowed": !matches!(verdict, Verdict::Denied { .. })});
    match &verdict {
        Verdict::Allowed { warnings } => add_warnings(&mut response, warnings),
        Verdict::Patched { patch, warnings } => {
            response["patchType"] = json!("JSONPatch");
            let bytes = k8s_openapi::ByteString(patch.as_bytes().to_vec());
            response["patch"] = serde_json::to_value(bytes).expect("bytes serialize");
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

fn decide(request: &RequestPart, defaults: &Defaults, opt_in: OptIn) -> Result<Verdict, ReviewError> {
    let kind: Option<KindPart> = request.kind.and_then(|k| serde_json::from_str(k.get()).ok());
    let is_pod =
        kind.is_some_and(|k| string(k.group).as_deref() == Some("") && string(k.kind).as_deref() == Some("Pod"));
    let is_create = string(request.operation).as_deref() == Some("CREATE")
        && string(request.sub_resource).is_none_or(|s| s.is_empty());
    if !is_pod || !is_create {
        return Ok(allowed());
    }
    let Some(object) = request.object.filter(|o| is_object(o)) else {
        return Err(ReviewError::NoObject);
    };
    let mut budget = Budget::new(MAX_TREE);
    let (pod, raw_members) = match prune::prune_object(object, POD_PARTS, &mut budget) {
        Ok(pruned) => pruned,
        Err(Stop::TooLarge) => {
            return Ok(Verdict::Denied {
                message: format!(
                    "the pod is too large for the drafs webhook: the parts of it drafs reads (its labels and annotations, its containers' names, mounts and claims, its volumes) would take more than {} MiB of memory; add drafs to the pod's manifest with `drafs inject` instead",
                    MAX_TREE >> 20
                ),
            });
        }
        Err(e) => return Err(ReviewError::Internal(e.to_string())),
    };
    let label = pod
        .pointer("/metadata/labels")
        .and_then(|l| l.get(INJECT_LABEL))
        .map(|l| l.as_str().unwrap_or_default().to_string());
    let mode = match requested(label.as_deref(), opt_in) {
        Requested::Nothing | Requested::OptedOut => return Ok(allowed()),
        Requested::Mode(Err(message)) => return Ok(Verdict::Denied { message }),
        Requested::Mode(Ok(mode)) => mode,
    };
    let opts = match options(&pod, mode, defaults) {
        Ok(opts) => opts,
        Err(message) => return Ok(Verdict::Denied { message }),
    };
    let mut patched = pod;
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
        // Most pods of an opted-in namespace use no device: nothing to say.
        Some(Outcome::NoDevices(_)) if label.is_none() => return Ok(allowed()),
        Some(Outcome::NoDevices(_)) => {
            return Ok(Verdict::Allowed {
                warnings: vec![format!(
                    "label {INJECT_LABEL} is set but the pod has no resourceClaims and no extended resources: drafs not added"
                )],
            });
        }
        _ => return Ok(allowed()),
    };
    let mut ops = Vec::new();
    // Injection only changes the spec (an object, or inject would not have run).
    let old_spec = raw_members.iter().rev().find(|(k, _)| k == "spec").map(|(_, raw)| *raw);
    if let (Some(old_spec), Some(new_spec)) = (old_spec, patched.get("spec")) {
        patch::diff(old_spec, new_spec, "/spec", &mut ops).map_err(|e| ReviewError::Internal(e.to_string()))?;
    }
    let patch = serde_json::to_string(&ops).map_err(|e| ReviewError::Internal(e.to_string()))?;
    Ok(Verdict::Patched { patch, warnings })
}

// ---------------------------------------------------------------------------
// The pod as far as drafs reads it.

/// What `inject::inject_value` and the options (`policy::options`) read of a
/// pod's members, and where injection writes. `inject` sets members and adds or removes array
/// elements, and never removes a member: members left out here are neither
/// read nor changed, and the patch leaves them as they are. (A change to
/// `inject` that reads more must add it here: the tests compare the patched
/// pod with `inject` on the whole pod.)
pub const POD_PARTS: &[(&str, Keep)] = &[
    ("apiVersion", Keep::Whole),
    ("kind", Keep::Whole),
    (
        "metadata",
        Keep::Fields(&[
            ("name", Keep::Whole),
            ("generateName", Keep::Whole),
            ("namespace", Keep::Whole),
            ("labels", Keep::Whole),
            ("annotations", Keep::Whole),
        ]),
    ),
    (
        "spec",
        Keep::Fields(&[
            ("resourceClaims", Keep::Whole),
            ("serviceAccountName", Keep::Whole),
            ("serviceAccount", Keep::Whole),
            ("automountServiceAccountToken", Keep::Whole),
            ("initContainers", Keep::Items(&CONTAINER)),
            ("containers", Keep::Items(&CONTAINER)),
            ("ephemeralContainers", Keep::Items(&CONTAINER)),
            ("volumes", Keep::Items(&VOLUME)),
        ]),
    ),
];

/// A volume: its name, the automounted token's sources, and the driver of a
/// `csi` one (a pod with drafs's CSI volume has drafs already).
const VOLUME: Keep = Keep::Fields(&[
    ("name", Keep::Whole),
    ("projected", Keep::Whole),
    ("csi", Keep::Fields(&[("driver", Keep::Whole)])),
]);

const CONTAINER: Keep = Keep::Fields(&[
    ("name", Keep::Whole),
    ("volumeMounts", Keep::Items(&Keep::Whole)),
    ("resources", Keep::Fields(&[("claims", Keep::Whole), ("limits", Keep::Whole), ("requests", Keep::Whole)])),
]);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::inject::{Mode, Options};
    use crate::admission::patch::apply_patch;
    use crate::admission::policy::*;

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

    /// The pod after the API server applied the patch.
    fn apply(pod: &Value, ops: &[Value]) -> Value {
        let mut out = pod.clone();
        apply_patch(&mut out, ops).unwrap_or_else(|e| panic!("{e}"));
        out
    }

    /// What `drafs inject` makes of the whole pod.
    fn injected(pod: &Value, opts: &Options) -> Value {
        let mut injected = pod.clone();
        inject::inject_value(&mut injected, opts, &mut Vec::new()).unwrap();
        injected
    }

    fn decoded_patch(response: &Value) -> Vec<Value> {
        let bytes: k8s_openapi::ByteString = serde_json::from_value(response["response"]["patch"].clone()).unwrap();
        serde_json::from_slice(&bytes.0).unwrap()
    }

    #[test]
    fn a_labelled_pod_gets_exactly_what_inject_gives() {
        let pod = pod_with(|_| {});
        let (response, verdict) =
            review(&request(pod.clone()), &Defaults::new("registry.example/drafs:1"), OptIn::Pod).unwrap();
        assert_eq!(verdict.label(), "patched");
        let r = &response["response"];
        assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(r["allowed"], true);
        assert_eq!(r["patchType"], "JSONPatch");
        assert_eq!(response["apiVersion"], "admission.k8s.io/v1");
        let patched = apply(&pod, &decoded_patch(&response));
        // The same code path as `drafs inject`.
        assert_eq!(patched, injected(&pod, &Options::new(Mode::Init, "registry.example/drafs:1")));
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
    fn an_opted_in_namespace_injects_unlabelled_pods_with_claims_and_a_pod_label_wins() {
        let namespace = OptIn::Namespace(Mode::SidecarFiles);
        let unlabelled = pod_with(|p| {
            p["metadata"]["labels"].as_object_mut().unwrap().remove(INJECT_LABEL);
        });
        // Sent to /mutate (the pod label's entry), an unlabelled pod is left alone.
        let (_, verdict) = review(&request(unlabelled.clone()), &Defaults::new("drafs:test"), OptIn::Pod).unwrap();
        assert_eq!(verdict.label(), "allowed");
        // In an opted-in namespace it gets the namespace's mode.
        let (response, verdict) =
            review(&request(unlabelled.clone()), &Defaults::new("drafs:test"), namespace).unwrap();
        assert_eq!(verdict.label(), "patched");
        let patched = apply(&unlabelled, &decoded_patch(&response));
        assert_eq!(patched, injected(&unlabelled, &Options::new(Mode::SidecarFiles, "drafs:test")));
        // The pod's own label chooses the mode.
        let labelled = pod_with(|p| p["metadata"]["labels"][INJECT_LABEL] = json!("init"));
        let (response, _) = review(&request(labelled.clone()), &Defaults::new("drafs:test"), namespace).unwrap();
        let patched = apply(&labelled, &decoded_patch(&response));
        assert_eq!(patched, injected(&labelled, &Options::new(Mode::Init, "drafs:test")));
        // A pod without claims in that namespace: unchanged, and nothing to say.
        let no_claims = pod_with(|p| {
            p["metadata"]["labels"].as_object_mut().unwrap().remove(INJECT_LABEL);
            p["spec"].as_object_mut().unwrap().remove("resourceClaims");
        });
        let (response, verdict) = review(&request(no_claims.clone()), &Defaults::new("drafs:test"), namespace).unwrap();
        assert_eq!(verdict.label(), "allowed");
        assert!(response["response"]["warnings"].is_null(), "{response}");
        // Asking for an extended resource (a DeviceClass may back it, KEP-5004) is asking for a device.
        let mut extended = no_claims;
        extended["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1", "cpu": "1"}});
        let (response, verdict) = review(&request(extended.clone()), &Defaults::new("drafs:test"), namespace).unwrap();
        assert_eq!(verdict.label(), "patched", "{response}");
        let patched = apply(&extended, &decoded_patch(&response));
        assert_eq!(patched, injected(&extended, &Options::new(Mode::SidecarFiles, "drafs:test")));
        let mounts = patched["spec"]["containers"][0]["volumeMounts"].as_array().unwrap();
        assert!(mounts.iter().any(|m| m["mountPath"] == "/dra"), "{mounts:?}");
    }

    #[test]
    fn the_csi_volume_names_the_webhooks_driver_and_a_pod_with_one_has_drafs() {
        for defaults in [
            Defaults::new("drafs:test"),
            Defaults { csi_driver: "node.drafs.example".into(), ..Defaults::new("drafs:test") },
        ] {
            let pod = pod_with(|p| p["metadata"]["labels"][INJECT_LABEL] = json!("csi"));
            let (response, verdict) = review(&request(pod.clone()), &defaults, OptIn::Pod).unwrap();
            assert_eq!(verdict.label(), "patched", "{response}");
            let patched = apply(&pod, &decoded_patch(&response));
            let mut opts = Options::new(Mode::Csi, "drafs:test");
            opts.csi_driver = defaults.csi_driver.clone();
            assert_eq!(patched, injected(&pod, &opts));
            let volumes = patched["spec"]["volumes"].as_array().unwrap();
            assert_eq!(volumes.last().unwrap()["csi"]["driver"], defaults.csi_driver.as_str(), "{volumes:?}");
            // The pod with its volume, sent again by any path and for any mode: it has drafs.
            for (label, opt_in) in [("csi", OptIn::Pod), ("init", OptIn::Pod), ("csi", OptIn::Namespace(Mode::Csi))] {
                let mut again = patched.clone();
                again["metadata"]["labels"][INJECT_LABEL] = json!(label);
                let (response, verdict) = review(&request(again), &defaults, opt_in).unwrap();
                assert_eq!(verdict, allowed(), "{label}, {opt_in:?}, {}: {response}", defaults.csi_driver);
            }
        }
    }

    #[test]
    fn disabled_opts_a_pod_out_everywhere() {
        let pod = pod_with(|p| p["metadata"]["labels"][INJECT_LABEL] = json!(DISABLED));
        for opt_in in [OptIn::Pod, OptIn::Namespace(Mode::Init)] {
            let (response, verdict) = review(&request(pod.clone()), &Defaults::new("drafs:test"), opt_in).unwrap();
            assert_eq!(verdict.label(), "allowed", "{opt_in:?}");
            assert!(response["response"]["patch"].is_null() && response["response"]["warnings"].is_null());
        }
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
        let (response, _) = review(&request(pod.clone()), &Defaults::new("drafs:test"), OptIn::Pod).unwrap();
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
                "--timeout=2m"
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
                "label drafs.dev/inject: \"sidecar\" is not a drafs mode; use init, sidecar-fuse, sidecar-files or csi",
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
            (
                json!({"annotations": {READY_WHEN_HEALTHY_ANNOTATION: "yes"}}),
                "annotation drafs.dev/ready-when-healthy: \"yes\" is not true or false",
            ),
            // drafs node would refuse every publish: the pod would never start.
            (
                json!({"labels": {INJECT_LABEL: "csi"}, "annotations": {REQUIRE_ANNOTATION: "gpu/gpu/0/.healthMessage"}}),
                "annotation drafs.dev/require: gpu/gpu/0/.healthMessage is a value the driver reports when it prepares the device",
            ),
        ];
        for (metadata, expected) in cases {
            let pod = pod_with(|p| {
                for (k, v) in metadata.as_object().unwrap() {
                    for (kk, vv) in v.as_object().unwrap() {
                        p["metadata"][k][kk] = vv.clone();
                    }
                }
            });
            let (response, verdict) = review(&request(pod), &Defaults::new("drafs:test"), OptIn::Pod).unwrap();
            let Verdict::Denied { message } = verdict else { panic!("{metadata}: not denied") };
            assert!(message.contains(expected), "{metadata}: {message}");
            assert_eq!(response["response"]["allowed"], false);
            assert_eq!(response["response"]["status"]["message"], message);
            assert!(response["response"].get("patch").is_none());
        }
    }

    #[test]
    fn ready_when_healthy_adds_healthy_to_the_sidecars_readiness_probe_only() {
        let annotated = |mode: &str| {
            let pod = pod_with(|p| {
                p["metadata"]["labels"][INJECT_LABEL] = json!(mode);
                p["metadata"]["annotations"] = json!({READY_WHEN_HEALTHY_ANNOTATION: "true"});
            });
            options_of(&pod, &Defaults::new("drafs:test"))
        };
        let opts = annotated("sidecar-files").unwrap();
        assert!(opts.ready_when_healthy);
        let pod = injected(&pod_with(|_| {}), &opts);
        let drafs = &pod["spec"]["initContainers"][0];
        assert_eq!(drafs["readinessProbe"]["exec"]["command"], json!(["/drafs", "probe", "--dir=/dra", "--healthy"]));
        assert_eq!(drafs["startupProbe"]["exec"]["command"], json!(["/drafs", "probe", "--dir=/dra"]));
        let init = annotated("init").unwrap_err();
        assert!(init.contains("needs a sidecar mode"), "{init}");
    }

    #[test]
    fn other_requests_pass_unchanged() {
        let unlabelled = pod_with(|p| p["metadata"]["labels"] = json!({"app": "x"}));
        let no_claims = pod_with(|p| p["spec"]["resourceClaims"] = json!([]));
        let with_drafs = pod_with(|p| p["spec"]["initContainers"] = json!([{"name": "drafs", "image": "mine"}]));
        for (pod, warned) in [(unlabelled, false), (no_claims, true), (with_drafs, false)] {
            let (response, verdict) = review(&request(pod), &Defaults::new("drafs:test"), OptIn::Pod).unwrap();
            assert_eq!(verdict.label(), "allowed", "{response}");
            assert!(response["response"].get("patch").is_none());
            assert_eq!(response["response"].get("warnings").is_some(), warned, "{response}");
        }
        let mut update: Value = serde_json::from_slice(&request(pod_with(|_| {}))).unwrap();
        update["request"]["operation"] = json!("UPDATE");
        let (_, verdict) =
            review(&serde_json::to_vec(&update).unwrap(), &Defaults::new("drafs:test"), OptIn::Pod).unwrap();
        assert_eq!(verdict, allowed());
        // A pod that names its own account keeps it, and is told what it needs.
        let own = pod_with(|p| p["spec"]["serviceAccountName"] = json!("trainer"));
        let (response, _) = review(&request(own), &Defaults::new("drafs:test"), OptIn::Pod).unwrap();
        assert!(response["response"]["warnings"][0].as_str().unwrap().contains("--service-account trainer"));
    }

    /// A pod with every part injection touches (init containers using a claim
    /// and not, the automounted token between other volumes and mounted
    /// before and after other mounts, ephemeral containers, a volume named
    /// `dra`) and fields drafs never reads.
    fn rich_pod() -> Value {
        let token = json!({"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true});
        pod_with(|p| {
            p["metadata"]["annotations"] =
                json!({METADATA_DIR_ANNOTATION: "/var/run/kubernetes.io/dra-device-attributes", "note": "a/b~c"});
            p["metadata"]["managedFields"] = json!([{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]);
            let spec = &mut p["spec"];
            spec["securityContext"] = json!({"supplementalGroups": [0, 1, 2], "fsGroup": 2000});
            spec["initContainers"] = json!([
                {"name": "setup", "image": "setup", "command": ["sh", "-c", "true"], "resources": {"claims": [{"name": "gpu"}], "limits": {"cpu": "1"}},
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}, token, {"name": "cfg", "mountPath": "/cfg"}]},
                {"name": "plain", "image": "plain", "volumeMounts": [token]}
            ]);
            spec["containers"][0]["env"] = json!([{"name": "A", "value": "1"}]);
            spec["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}, token]);
            spec["ephemeralContainers"] = json!([{"name": "debug", "image": "busybox", "volumeMounts": [token]}]);
            spec["volumes"] = json!([
                {"name": "data", "emptyDir": {}},
                {"name": "kube-api-access-x7k2p", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
                {"name": "dra", "configMap": {"name": "dra"}},
                {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "a", "path": "b"}]}}
            ]);
            spec["tolerations"] = json!([{"key": "gpu", "operator": "Exists"}]);
        })
    }

    #[test]
    fn the_patch_gives_what_inject_gives_on_the_whole_pod() {
        let own_account = pod_with(|p| p["spec"]["serviceAccountName"] = json!("trainer"));
        let bare = pod_with(|p| {
            let spec = p["spec"].as_object_mut().unwrap();
            spec.remove("volumes");
            spec["containers"] = json!([{"name": "app", "resources": {"claims": [{"name": "gpu"}]}}]);
        });
        // Shapes no API server sends, answered as inject answers them.
        let odd = pod_with(|p| {
            p["spec"]["containers"] =
                json!([1, {"name": "app", "resources": {"claims": [{"name": "gpu"}]}, "volumeMounts": 5}]);
            p["spec"]["initContainers"] = json!({"not": "a list"});
            p["spec"]["volumes"] = json!("x");
        });
        let odd_mounts =
            pod_with(|p| p["spec"]["containers"][0]["volumeMounts"] = json!(["x", {"name": "a", "mountPath": "/a"}]));
        for pod in [pod_with(|_| {}), rich_pod(), own_account, bare, odd, odd_mounts] {
            for (mode, label) in
                [(Mode::Init, "init"), (Mode::SidecarFuse, "sidecar-fuse"), (Mode::SidecarFiles, "sidecar-files")]
            {
                let mut pod = pod.clone();
                pod["metadata"]["labels"][INJECT_LABEL] = json!(label);
                let (response, verdict) =
                    review(&request(pod.clone()), &Defaults::new("drafs:test"), OptIn::Pod).unwrap();
                assert_eq!(verdict.label(), "patched", "{response}");
                let mut opts = Options::new(mode, "drafs:test");
                if pod["metadata"]["annotations"].get(METADATA_DIR_ANNOTATION).is_some() {
                    opts.metadata_dir = Some("/var/run/kubernetes.io/dra-device-attributes".into());
                }
                let patch = decoded_patch(&response);
                assert_eq!(apply(&pod, &patch), injected(&pod, &opts), "{label}: {pod:#}\npatch: {patch:#?}");
            }
        }
    }

    #[test]
    fn the_patch_carries_what_drafs_adds_not_the_pod() {
        let big = pod_with(|p| {
            let containers: Vec<Value> = (0..300)
                .map(|i| json!({"name": format!("c{i}"), "image": "registry.example/app:1", "command": ["sleep", "infinity"],
                                "resources": {"claims": [{"name": "gpu"}]}, "volumeMounts": [{"name": "data", "mountPath": "/data"}]}))
                .collect();
            p["spec"]["containers"] = json!(containers);
        });
        let (response, _) = review(&request(big.clone()), &Defaults::new("drafs:test"), OptIn::Pod).unwrap();
        let patch = decoded_patch(&response);
        assert_eq!(apply(&big, &patch), injected(&big, &Options::new(Mode::Init, "drafs:test")));
        let text = serde_json::to_string(&patch).unwrap();
        assert!(!text.contains("infinity"), "the patch repeats the containers: {} bytes", text.len());
        // One mount for each of the 300 containers, drafs's container, its volumes, the account.
        assert!(text.len() < 300 * 120 + 4000, "{} bytes", text.len());
    }

    #[test]
    fn a_pod_too_large_to_read_is_denied_and_what_drafs_does_not_read_costs_nothing() {
        // A million zeros where drafs never looks: answered.
        let zeros = pod_with(|p| p["spec"]["securityContext"] = json!({"supplementalGroups": vec![0; 1_000_000]}));
        let (_, verdict) = review(&request(zeros), &Defaults::new("drafs:test"), OptIn::Pod).unwrap();
        assert_eq!(verdict.label(), "patched");
        // As many labels (drafs reads the labels), or mounts: denied, saying why.
        let labels = pod_with(|p| {
            for i in 0..200_000 {
                p["metadata"]["labels"][format!("l{i}")] = json!("");
            }
        });
        let mounts =
            pod_with(|p| p["spec"]["containers"][0]["volumeMounts"] = json!(vec![json!({"name": "a"}); 100_000]));
        for pod in [labels, mounts] {
            let (response, verdict) = review(&request(pod), &Defaults::new("drafs:test"), OptIn::Pod).unwrap();
            let Verdict::Denied { message } = verdict else { panic!("not denied: {verdict:?}") };
            assert!(
                message.contains("too large for the drafs webhook") && message.contains("drafs inject"),
                "{message}"
            );
            assert_eq!(response["response"]["allowed"], false);
        }
    }

    #[test]
    fn malformed_bodies_are_errors_not_panics() {
        assert!(matches!(review(b"not json", &Defaults::new("i"), OptIn::Pod), Err(ReviewError::NotJson(_))));
        assert!(matches!(review(b"{}", &Defaults::new("i"), OptIn::Pod), Err(ReviewError::NotAReview(..))));
        assert!(matches!(review(b"[1,2]", &Defaults::new("i"), OptIn::Pod), Err(ReviewError::NotAReview(..))));
        let mut no_uid: Value = serde_json::from_slice(&request(pod_with(|_| {}))).unwrap();
        no_uid["request"]["uid"] = json!(7);
        assert!(matches!(
            review(&serde_json::to_vec(&no_uid).unwrap(), &Defaults::new("i"), OptIn::Pod),
            Err(ReviewError::NoUid)
        ));
        let mut no_object = no_uid.clone();
        no_object["request"]["uid"] = json!("u");
        no_object["request"]["object"] = json!("pod");
        assert!(matches!(
            review(&serde_json::to_vec(&no_object).unwrap(), &Defaults::new("i"), OptIn::Pod),
            Err(ReviewError::NoObject)
        ));
        // Odd shapes inside a well-formed review are answered, never a panic.
        for odd in [
            json!({"spec": 5, "metadata": {"labels": {INJECT_LABEL: "init"}}}),
            json!({"metadata": {"labels": {INJECT_LABEL: 3}}}),
            json!({"metadata": {"labels": {INJECT_LABEL: "init"}, "annotations": {TIMEOUT_ANNOTATION: 5}},
                           "spec": {"resourceClaims": [{"name": "g"}], "containers": "x"}}),
        ] {
            assert!(review(&request(odd.clone()), &Defaults::new("i"), OptIn::Pod).is_ok(), "{odd}");
        }
    }
}
