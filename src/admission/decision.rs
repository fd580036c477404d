//! What `drafs webhook` answers: an AdmissionReview in, an AdmissionReview out.
//!
//! Pure, like `inject` (whose code path it shares): the pod's label
//! `drafs.dev/inject` picks the mode, its annotations the options, and the
//! answer carries a JSONPatch that turns the pod into what `drafs inject` would
//! have printed. Nothing here calls the API server.
//!
//! A review can be megabytes (the API server sends the whole pod, defaults
//! filled in), and a `serde_json::Value` takes 10 to 90 times the bytes of its
//! JSON. So the review stays raw text: only the parts of the pod that `inject`
//! and the options read (`POD_PARTS`) become `Value`s, within [`MAX_TREE`] bytes,
//! and the patch is computed against the raw text, one operation per field
//! set and per array element added or removed, so it stays small whatever the
//! pod's size.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde::de::{self, Deserializer as _, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::admission::inject::{self, Mode, Options, Outcome};
use crate::model::tree::RequirePath;

/// The label that opts a pod in; the webhook configuration selects on it.
pub const INJECT_LABEL: &str = "drafs.dev/inject";
/// Per-pod options, as annotations.
pub const DIR_ANNOTATION: &str = "drafs.dev/dir";
pub const METADATA_DIR_ANNOTATION: &str = "drafs.dev/metadata-dir";
pub const METADATA_FROM_DRIVERS_ANNOTATION: &str = "drafs.dev/metadata-from-drivers";
pub const REQUIRE_ANNOTATION: &str = "drafs.dev/require";
pub const TIMEOUT_ANNOTATION: &str = "drafs.dev/timeout";
pub const READY_WHEN_HEALTHY_ANNOTATION: &str = "drafs.dev/ready-when-healthy";

/// The most memory the parts of one pod that drafs reads may take as
/// `Value`s (estimated before they are built, see `estimate`). A 3 MB pod of
/// 3,000 containers (benches/webhook.rs) needs about 21 MiB; what needs more
/// is denied. With the body (at most 8 MiB) this keeps a review under 48 MiB
/// (42 MiB at most, measured on the worst shapes).
pub const MAX_TREE: usize = 24 << 20;

const API_VERSION: &str = "admission.k8s.io/v1";
const MODES: &str = "init, sidecar-fuse or sidecar-files";

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

fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

fn is_array(raw: &RawValue) -> bool {
    raw.get().starts_with('[')
}

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

/// Answer one AdmissionReview (the request body) with another (the response body).
pub fn review(body: &[u8], image: &str, opt_in: OptIn) -> Result<(Value, Verdict), ReviewError> {
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
    let verdict = decide(&request, image, opt_in)?;
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

fn decide(request: &RequestPart, image: &str, opt_in: OptIn) -> Result<Verdict, ReviewError> {
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
    let mut budget = Budget { used: 0, max: MAX_TREE };
    let (pod, raw_members) = match prune_object(object, POD_PARTS, &mut budget) {
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
    let opts = match options(&pod, mode, image) {
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
        diff(old_spec, new_spec, "/spec", &mut ops).map_err(|e| ReviewError::Internal(e.to_string()))?;
    }
    let patch = serde_json::to_string(&ops).map_err(|e| ReviewError::Internal(e.to_string()))?;
    Ok(Verdict::Patched { patch, warnings })
}

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

/// The injection options a labelled pod asks for (as [`review`] reads them;
/// for the fuzz target).
#[doc(hidden)]
pub fn options_of(pod: &Value, image: &str) -> Result<Options, String> {
    let label = pod.pointer("/metadata/labels").and_then(|l| l.get(INJECT_LABEL)).ok_or("no drafs.dev/inject label")?;
    options(pod, parse_mode(label.as_str().unwrap_or_default())?, image)
}

/// The injection options a pod asks for, or a message naming what is wrong.
fn options(pod: &Value, mode: Mode, image: &str) -> Result<Options, String> {
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

// ---------------------------------------------------------------------------
// The pod as far as drafs reads it.

/// Which part of a JSON value to turn into a `Value`.
enum Keep {
    /// All of it.
    Whole,
    /// An object: these members (each kept as said), no others.
    Fields(&'static [(&'static str, Keep)]),
    /// An array of objects: every element, each kept as said.
    Items(&'static Keep),
}

/// What `inject::inject_value` and [`options`] read of a pod's members, and where
/// injection writes. `inject` sets members and adds or removes array
/// elements, and never removes a member: members left out here are neither
/// read nor changed, and the patch leaves them as they are. (A change to
/// `inject` that reads more must add it here: the tests compare the patched
/// pod with `inject` on the whole pod.)
const POD_PARTS: &[(&str, Keep)] = &[
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
            ("volumes", Keep::Items(&Keep::Fields(&[("name", Keep::Whole), ("projected", Keep::Whole)]))),
        ]),
    ),
];

const CONTAINER: Keep = Keep::Fields(&[
    ("name", Keep::Whole),
    ("volumeMounts", Keep::Items(&Keep::Whole)),
    ("resources", Keep::Fields(&[("claims", Keep::Whole), ("limits", Keep::Whole), ("requests", Keep::Whole)])),
]);

/// Marks an object built from a pod's object with only some of its members
/// (`inject` never reads it, it never reaches a patch).
const PRUNED: &str = "\u{0}drafs-pruned";
/// Marks an array element built from the pod's element at this index, so
/// the patch can tell it from one `inject` added.
const INDEX: &str = "\u{0}drafs-index";

fn is_marker(key: &str) -> bool {
    key == PRUNED || key == INDEX
}

/// Why a pod was not pruned or diffed.
#[derive(Debug)]
enum Stop {
    TooLarge,
    /// An array to walk holds something else than objects (kept whole instead).
    NotObjects,
    Internal(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::TooLarge => write!(f, "over the memory bound"),
            Stop::NotObjects => write!(f, "not an array of objects"),
            Stop::Internal(e) => write!(f, "{e}"),
        }
    }
}

impl From<serde_json::Error> for Stop {
    fn from(e: serde_json::Error) -> Self {
        Stop::Internal(e.to_string())
    }
}

/// Bytes of `Value`s built so far, against a bound.
struct Budget {
    used: usize,
    max: usize,
}

impl Budget {
    fn charge(&mut self, bytes: usize) -> Result<(), Stop> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.max { Err(Stop::TooLarge) } else { Ok(()) }
    }
}

// What serde_json's `Value` (with `preserve_order`) takes, as resident
// memory: a value's slot is 72 bytes in an array, an object member's 112 (its value included) plus its key
// and its place in the index; a small object's first allocations hold three
// members (~400 bytes), a small array's four elements (~300); a string its
// length rounded up, and a header. A growing vector is reallocated, so a
// large array's slots count 1.5 times. Checked against a counting allocator and
// VmHWM (tests below, benches/webhook.rs).
const VALUE: usize = 112;
const ENTRY: usize = 160;
const OBJECT: usize = 256;
const ARRAY: usize = 224;
const STRING: usize = 32;

/// About how many bytes the JSON text `raw` takes as a `Value`, its own slot
/// (paid by its parent) aside: an upper estimate for the shapes measured,
/// computed without allocating.
fn estimate(raw: &str) -> usize {
    let json = raw.as_bytes();
    let mut total = 0usize;
    // A member's value lives in the member's slot, already counted; so does the root.
    let mut slot_paid = true;
    let slot = |paid: &mut bool| if std::mem::take(paid) { 0 } else { VALUE };
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < json.len() && json[i] != b'"' {
                    i += if json[i] == b'\\' { 2 } else { 1 };
                }
                let len = i.saturating_sub(start);
                i += 1;
                let mut next = i;
                while next < json.len() && json[next].is_ascii_whitespace() {
                    next += 1;
                }
                if json.get(next) == Some(&b':') {
                    total = total.saturating_add(ENTRY + STRING + len);
                    slot_paid = true;
                } else {
                    total = total.saturating_add(slot(&mut slot_paid) + STRING + len);
                }
            }
            b'{' => {
                total = total.saturating_add(slot(&mut slot_paid) + OBJECT);
                i += 1;
            }
            b'[' => {
                total = total.saturating_add(slot(&mut slot_paid) + ARRAY);
                i += 1;
            }
            b'}' | b']' | b',' | b':' | b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            _ => {
                total = total.saturating_add(slot(&mut slot_paid));
                while i < json.len() && !matches!(json[i], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    i += 1;
                }
            }
        }
    }
    total
}

/// The part of `raw` that `keep` asks for, as a `Value`, charged to `budget`
/// (all but its own slot, which its parent pays).
/// Objects built from some of their members are marked [`PRUNED`], elements
/// of walked arrays [`INDEX`]. What does not have the shape `keep` expects
/// (a container that is not an object...) is kept whole.
fn prune(raw: &RawValue, keep: &Keep, budget: &mut Budget) -> Result<Value, Stop> {
    match keep {
        Keep::Fields(fields) if is_object(raw) => Ok(prune_object(raw, fields, budget)?.0),
        Keep::Items(item) if is_array(raw) => {
            let before = budget.used;
            budget.charge(ARRAY)?;
            let mut items = Vec::new();
            let walked = for_each_element(raw, |index, element| {
                if !is_object(element) {
                    return Err(Stop::NotObjects);
                }
                budget.charge(VALUE + ENTRY + STRING + INDEX.len())?;
                let mut value = prune(element, item, budget)?;
                if let Some(map) = value.as_object_mut() {
                    map.insert(INDEX.into(), Value::from(index));
                }
                items.push(value);
                Ok(())
            });
            match walked {
                Ok(()) => Ok(Value::Array(items)),
                Err(Stop::NotObjects) => {
                    drop(items);
                    budget.used = before;
                    prune(raw, &Keep::Whole, budget)
                }
                Err(stop) => Err(stop),
            }
        }
        _ => {
            budget.charge(estimate(raw.get()))?;
            Ok(serde_json::from_str(raw.get())?)
        }
    }
}

/// [`prune`] of an object to `fields`, marked [`PRUNED`], and the raw JSON
/// of the members kept.
fn prune_object<'a>(
    raw: &'a RawValue,
    fields: &[(&str, Keep)],
    budget: &mut Budget,
) -> Result<(Value, Members<'a>), Stop> {
    budget.charge(OBJECT + ENTRY + STRING + PRUNED.len())?;
    let mut map = Map::new();
    let mut kept = Vec::new();
    for_each_member(raw, |key, value| {
        if let Some((_, keep)) = fields.iter().find(|(name, _)| *name == key) {
            budget.charge(ENTRY + STRING + key.len())?;
            map.insert(key.to_string(), prune(value, keep, budget)?);
            kept.push((key.to_string(), value));
        }
        Ok(())
    })?;
    map.insert(PRUNED.into(), Value::Bool(true));
    Ok((Value::Object(map), kept))
}

/// Members of a raw JSON object, and elements of a raw array with their index.
type Members<'a> = Vec<(String, &'a RawValue)>;
type Elements<'a> = Vec<(usize, &'a RawValue)>;

/// Call `f` with each member of the raw JSON object `raw`, in order; nothing
/// is built but each (short-lived) key.
fn for_each_member<'a>(raw: &'a RawValue, f: impl FnMut(&str, &'a RawValue) -> Result<(), Stop>) -> Result<(), Stop> {
    struct Members<'a, F>(F, &'a mut Option<Stop>);
    impl<'de, F: FnMut(&str, &'de RawValue) -> Result<(), Stop>> Visitor<'de> for Members<'_, F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                let value: &'de RawValue = map.next_value()?;
                if let Err(stop) = (self.0)(&key, value) {
                    *self.1 = Some(stop);
                    return Err(de::Error::custom("stopped"));
                }
            }
            Ok(())
        }
    }
    let mut stopped = None;
    let result = serde_json::Deserializer::from_str(raw.get()).deserialize_map(Members(f, &mut stopped));
    match (stopped, result) {
        (Some(stop), _) => Err(stop),
        (None, result) => Ok(result?),
    }
}

/// Call `f` with each element of the raw JSON array `raw` and its index.
fn for_each_element<'a>(raw: &'a RawValue, f: impl FnMut(usize, &'a RawValue) -> Result<(), Stop>) -> Result<(), Stop> {
    struct Elements<'a, F>(F, &'a mut Option<Stop>);
    impl<'de, F: FnMut(usize, &'de RawValue) -> Result<(), Stop>> Visitor<'de> for Elements<'_, F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            let mut index = 0;
            while let Some(element) = seq.next_element::<&'de RawValue>()? {
                if let Err(stop) = (self.0)(index, element) {
                    *self.1 = Some(stop);
                    return Err(de::Error::custom("stopped"));
                }
                index += 1;
            }
            Ok(())
        }
    }
    let mut stopped = None;
    let result = serde_json::Deserializer::from_str(raw.get()).deserialize_seq(Elements(f, &mut stopped));
    match (stopped, result) {
        (Some(stop), _) => Err(stop),
        (None, result) => Ok(result?),
    }
}

/// The members of the raw object `raw` whose keys `wanted` picks, and how
/// many members it has (only the picked ones are kept).
fn members(raw: &RawValue, wanted: impl Fn(&str) -> bool) -> Result<(Members<'_>, usize), Stop> {
    let (mut found, mut count) = (Vec::new(), 0);
    for_each_member(raw, |key, value| {
        count += 1;
        if wanted(key) {
            found.push((key.to_string(), value));
        }
        Ok(())
    })?;
    Ok((found, count))
}

/// The elements of the raw array `raw` whose indices `wanted` picks, and
/// its length.
fn elements(raw: &RawValue, wanted: impl Fn(usize) -> bool) -> Result<(Elements<'_>, usize), Stop> {
    let (mut found, mut count) = (Vec::new(), 0);
    for_each_element(raw, |index, element| {
        count += 1;
        if wanted(index) {
            found.push((index, element));
        }
        Ok(())
    })?;
    Ok((found, count))
}

// ---------------------------------------------------------------------------
// The patch.

/// `path`/`key` as a JSON pointer.
fn child(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

fn index_of(value: &Value) -> Option<usize> {
    value.get(INDEX).and_then(Value::as_u64).and_then(|i| usize::try_from(i).ok())
}

/// One JSON Patch operation; its value is borrowed from the injected pod.
struct Op<'a> {
    op: &'static str,
    path: String,
    value: Option<Unmarked<'a>>,
}

impl<'a> Op<'a> {
    /// Add or replace with `value`, which must be whole: a [`PRUNED`] object
    /// (only part of the pod's) must never be sent.
    fn set(op: &'static str, path: String, value: &'a Value) -> Result<Self, Stop> {
        fn pruned(v: &Value) -> bool {
            match v {
                Value::Object(map) => map.contains_key(PRUNED) || map.values().any(pruned),
                Value::Array(items) => items.iter().any(pruned),
                _ => false,
            }
        }
        if pruned(value) {
            return Err(Stop::Internal(format!("injection moved part of the pod that drafs did not read to {path}")));
        }
        Ok(Op { op, path, value: Some(Unmarked(value)) })
    }
}

impl serde::Serialize for Op<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("op", self.op)?;
        map.serialize_entry("path", &self.path)?;
        if let Some(value) = &self.value {
            map.serialize_entry("value", value)?;
        }
        map.end()
    }
}

/// A value as it goes into a patch: without [`INDEX`] marks.
struct Unmarked<'a>(&'a Value);

impl serde::Serialize for Unmarked<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(map) => {
                let mut out = s.serialize_map(None)?;
                for (key, value) in map.iter().filter(|(k, _)| *k != INDEX) {
                    out.serialize_entry(key, &Unmarked(value))?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&Unmarked(item))?;
                }
                out.end()
            }
            other => other.serialize(s),
        }
    }
}

/// Whether the raw JSON `old` and `new` are the same value (marks aside),
/// without building `old`.
fn equal(old: &RawValue, new: &Value) -> Result<bool, Stop> {
    match new {
        Value::Object(map) => {
            if !is_object(old) {
                return Ok(false);
            }
            let keys = map.keys().filter(|k| !is_marker(k)).count();
            let (found, count) = members(old, |k| map.contains_key(k) && !is_marker(k))?;
            if count != keys || found.len() != keys {
                return Ok(false);
            }
            for (key, old) in found {
                if !equal(old, &map[&key])? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Value::Array(items) => {
            if !is_array(old) {
                return Ok(false);
            }
            let (found, count) = elements(old, |i| i < items.len())?;
            if count != items.len() {
                return Ok(false);
            }
            for (index, old) in found {
                if !equal(old, &items[index])? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        scalar => Ok(!is_object(old) && !is_array(old) && serde_json::from_str::<Value>(old.get())? == *scalar),
    }
}

/// The JSON Patch operations that turn the raw JSON `old` into `new` (its
/// pruned `Value` after injection) at `path`: members set, array elements
/// removed and added, nothing for what injection left alone.
fn diff<'a>(old: &RawValue, new: &'a Value, path: &str, ops: &mut Vec<Op<'a>>) -> Result<(), Stop> {
    match new {
        // Built from `old` with some of its members: compare member by member.
        Value::Object(map) if map.contains_key(PRUNED) && is_object(old) => {
            let (found, _) = members(old, |k| map.contains_key(k) && !is_marker(k))?;
            let found: HashMap<String, &RawValue> = found.into_iter().collect();
            for (key, value) in map.iter().filter(|(k, _)| !is_marker(k)) {
                let at = child(path, key);
                match found.get(key) {
                    Some(old) => diff(old, value, &at, ops)?,
                    None => ops.push(Op::set("add", at, value)?),
                }
            }
        }
        // Elements of `old` (marked with their index) and new ones: remove
        // the elements gone, then add the new ones where they belong.
        Value::Array(items) if items.iter().any(|i| index_of(i).is_some()) && is_array(old) => {
            let indices: Vec<Option<usize>> = items.iter().map(index_of).collect();
            let kept: BTreeSet<usize> = indices.iter().flatten().copied().collect();
            let ordered = indices.iter().flatten().zip(indices.iter().flatten().skip(1)).all(|(a, b)| a < b);
            let (found, len) = elements(old, |i| kept.contains(&i))?;
            if !ordered || found.len() != kept.len() {
                return Err(Stop::Internal(format!("injection reordered the elements of {path}")));
            }
            let found: HashMap<usize, &RawValue> = found.into_iter().collect();
            for gone in (0..len).rev().filter(|i| !kept.contains(i)) {
                ops.push(Op { op: "remove", path: format!("{path}/{gone}"), value: None });
            }
            for (at, (value, index)) in items.iter().zip(indices).enumerate() {
                let at = format!("{path}/{at}");
                match index.and_then(|i| found.get(&i)) {
                    Some(old) => diff(old, value, &at, ops)?,
                    None => ops.push(Op::set("add", at, value)?),
                }
            }
        }
        _ => {
            if !equal(old, new)? {
                ops.push(Op::set("replace", path.to_string(), new)?);
            }
        }
    }
    Ok(())
}

/// Apply a JSON Patch of `add`, `remove` and `replace` operations (those
/// the webhook sends) to `doc`, as the API server does.
#[doc(hidden)]
pub fn apply_patch(doc: &mut Value, patch: &[Value]) -> Result<(), String> {
    for op in patch {
        let path = op["path"].as_str().ok_or_else(|| format!("no path: {op}"))?;
        let (parent, last) = path.rsplit_once('/').ok_or_else(|| format!("bad path: {op}"))?;
        let last = last.replace("~1", "/").replace("~0", "~");
        let target = doc.pointer_mut(parent).ok_or_else(|| format!("no parent: {op}"))?;
        match (op["op"].as_str(), target) {
            (Some("add"), Value::Object(map)) => {
                map.insert(last, op["value"].clone());
            }
            (Some("add"), Value::Array(items)) => {
                let at: usize =
                    if last == "-" { items.len() } else { last.parse().map_err(|_| format!("bad index: {op}"))? };
                if at > items.len() {
                    return Err(format!("index out of range: {op}"));
                }
                items.insert(at, op["value"].clone());
            }
            (Some("remove"), Value::Object(map)) => {
                map.shift_remove(&last).ok_or_else(|| format!("nothing to remove: {op}"))?;
            }
            (Some("remove"), Value::Array(items)) => {
                let at: usize = last.parse().map_err(|_| format!("bad index: {op}"))?;
                if at >= items.len() {
                    return Err(format!("index out of range: {op}"));
                }
                items.remove(at);
            }
            (Some("replace"), target) => {
                let slot = match target {
                    Value::Object(map) => map.get_mut(&last),
                    Value::Array(items) => last.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
                    _ => None,
                };
                *slot.ok_or_else(|| format!("nothing to replace: {op}"))? = op["value"].clone();
            }
            _ => return Err(format!("unsupported operation: {op}")),
        }
    }
    Ok(())
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
        let (response, verdict) = review(&request(pod.clone()), "registry.example/drafs:1", OptIn::Pod).unwrap();
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
        let (_, verdict) = review(&request(unlabelled.clone()), "drafs:test", OptIn::Pod).unwrap();
        assert_eq!(verdict.label(), "allowed");
        // In an opted-in namespace it gets the namespace's mode.
        let (response, verdict) = review(&request(unlabelled.clone()), "drafs:test", namespace).unwrap();
        assert_eq!(verdict.label(), "patched");
        let patched = apply(&unlabelled, &decoded_patch(&response));
        assert_eq!(patched, injected(&unlabelled, &Options::new(Mode::SidecarFiles, "drafs:test")));
        // The pod's own label chooses the mode.
        let labelled = pod_with(|p| p["metadata"]["labels"][INJECT_LABEL] = json!("init"));
        let (response, _) = review(&request(labelled.clone()), "drafs:test", namespace).unwrap();
        let patched = apply(&labelled, &decoded_patch(&response));
        assert_eq!(patched, injected(&labelled, &Options::new(Mode::Init, "drafs:test")));
        // A pod without claims in that namespace: unchanged, and nothing to say.
        let no_claims = pod_with(|p| {
            p["metadata"]["labels"].as_object_mut().unwrap().remove(INJECT_LABEL);
            p["spec"].as_object_mut().unwrap().remove("resourceClaims");
        });
        let (response, verdict) = review(&request(no_claims.clone()), "drafs:test", namespace).unwrap();
        assert_eq!(verdict.label(), "allowed");
        assert!(response["response"]["warnings"].is_null(), "{response}");
        // Asking for an extended resource (a DeviceClass may back it, KEP-5004) is asking for a device.
        let mut extended = no_claims;
        extended["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1", "cpu": "1"}});
        let (response, verdict) = review(&request(extended.clone()), "drafs:test", namespace).unwrap();
        assert_eq!(verdict.label(), "patched", "{response}");
        let patched = apply(&extended, &decoded_patch(&response));
        assert_eq!(patched, injected(&extended, &Options::new(Mode::SidecarFiles, "drafs:test")));
        let mounts = patched["spec"]["containers"][0]["volumeMounts"].as_array().unwrap();
        assert!(mounts.iter().any(|m| m["mountPath"] == "/dra"), "{mounts:?}");
    }

    #[test]
    fn disabled_opts_a_pod_out_everywhere() {
        let pod = pod_with(|p| p["metadata"]["labels"][INJECT_LABEL] = json!(DISABLED));
        for opt_in in [OptIn::Pod, OptIn::Namespace(Mode::Init)] {
            let (response, verdict) = review(&request(pod.clone()), "drafs:test", opt_in).unwrap();
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
        let (response, _) = review(&request(pod.clone()), "drafs:test", OptIn::Pod).unwrap();
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
            (
                json!({"annotations": {READY_WHEN_HEALTHY_ANNOTATION: "yes"}}),
                "annotation drafs.dev/ready-when-healthy: \"yes\" is not true or false",
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
            let (response, verdict) = review(&request(pod), "drafs:test", OptIn::Pod).unwrap();
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
            options_of(&pod, "drafs:test")
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
            let (response, verdict) = review(&request(pod), "drafs:test", OptIn::Pod).unwrap();
            assert_eq!(verdict.label(), "allowed", "{response}");
            assert!(response["response"].get("patch").is_none());
            assert_eq!(response["response"].get("warnings").is_some(), warned, "{response}");
        }
        let mut update: Value = serde_json::from_slice(&request(pod_with(|_| {}))).unwrap();
        update["request"]["operation"] = json!("UPDATE");
        let (_, verdict) = review(&serde_json::to_vec(&update).unwrap(), "drafs:test", OptIn::Pod).unwrap();
        assert_eq!(verdict, allowed());
        // A pod that names its own account keeps it, and is told what it needs.
        let own = pod_with(|p| p["spec"]["serviceAccountName"] = json!("trainer"));
        let (response, _) = review(&request(own), "drafs:test", OptIn::Pod).unwrap();
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
                let (response, verdict) = review(&request(pod.clone()), "drafs:test", OptIn::Pod).unwrap();
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
        let (response, _) = review(&request(big.clone()), "drafs:test", OptIn::Pod).unwrap();
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
        let (_, verdict) = review(&request(zeros), "drafs:test", OptIn::Pod).unwrap();
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
            let (response, verdict) = review(&request(pod), "drafs:test", OptIn::Pod).unwrap();
            let Verdict::Denied { message } = verdict else { panic!("not denied: {verdict:?}") };
            assert!(
                message.contains("too large for the drafs webhook") && message.contains("drafs inject"),
                "{message}"
            );
            assert_eq!(response["response"]["allowed"], false);
        }
    }

    #[test]
    fn the_estimate_is_above_what_values_take() {
        // Resident bytes per element, measured (VmHWM of the webhook; a
        // counting allocator for the last two, plus malloc's headers): 96 for
        // a number in a large array, 404 for `[0]`, 150 for an object member
        // `"lN":""`; 96 for an empty string or object in an array, 510 for `{"a":0}`.
        for (element, measured) in [("0", 96), ("[0]", 404), ("\"\"", 96), ("{}", 96), ("{\"a\":0}", 510)] {
            let text = format!("[{}]", vec![element; 1000].join(","));
            assert!(estimate(&text) >= 1000 * measured, "{element}: {}", estimate(&text));
        }
        let members: Vec<String> = (0..1000).map(|i| format!("\"l{i}\":\"\"")).collect();
        assert!(estimate(&format!("{{{}}}", members.join(","))) >= 1000 * 150);
    }

    #[test]
    fn malformed_bodies_are_errors_not_panics() {
        assert!(matches!(review(b"not json", "i", OptIn::Pod), Err(ReviewError::NotJson(_))));
        assert!(matches!(review(b"{}", "i", OptIn::Pod), Err(ReviewError::NotAReview(..))));
        assert!(matches!(review(b"[1,2]", "i", OptIn::Pod), Err(ReviewError::NotAReview(..))));
        let mut no_uid: Value = serde_json::from_slice(&request(pod_with(|_| {}))).unwrap();
        no_uid["request"]["uid"] = json!(7);
        assert!(matches!(review(&serde_json::to_vec(&no_uid).unwrap(), "i", OptIn::Pod), Err(ReviewError::NoUid)));
        let mut no_object = no_uid.clone();
        no_object["request"]["uid"] = json!("u");
        no_object["request"]["object"] = json!("pod");
        assert!(matches!(
            review(&serde_json::to_vec(&no_object).unwrap(), "i", OptIn::Pod),
            Err(ReviewError::NoObject)
        ));
        // Odd shapes inside a well-formed review are answered, never a panic.
        for odd in [
            json!({"spec": 5, "metadata": {"labels": {INJECT_LABEL: "init"}}}),
            json!({"metadata": {"labels": {INJECT_LABEL: 3}}}),
            json!({"metadata": {"labels": {INJECT_LABEL: "init"}, "annotations": {TIMEOUT_ANNOTATION: 5}},
                           "spec": {"resourceClaims": [{"name": "g"}], "containers": "x"}}),
        ] {
            assert!(review(&request(odd.clone()), "i", OptIn::Pod).is_ok(), "{odd}");
        }
    }
}
