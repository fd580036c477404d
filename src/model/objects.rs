//! The API objects drafs reads, held as a plain value.
//!
//! A [`Snapshot`] is what the resolver consumes: one Pod, the ResourceClaims of its
//! namespace that matter, and the ResourceSlices that may hold its devices. It is
//! filled either from the API (see `source`) or from a file (`--from-file`), so the
//! resolver never knows where its input came from.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::model::{json_text, slices};

/// Errors from reading a `--from-file` input.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is neither valid YAML nor JSON: {message}")]
    Parse { path: String, message: String },
    #[error("{path} holds lists nested more than {MAX_LIST_DEPTH} deep")]
    ListsTooDeep { path: String },
    #[error("{path}: document {index} ({kind} {name:?}) is malformed: {message}")]
    Malformed { path: String, index: usize, kind: String, name: String, message: String },
    #[error("{path} holds no Pod{hint}")]
    NoPod { path: String, hint: String },
    #[error("{path} holds no Pod named {wanted:?} (it has: {have})")]
    PodNotInFile { path: String, wanted: String, have: String },
    #[error("{path} holds several Pods ({have}); choose one with --pod-name")]
    AmbiguousPod { path: String, have: String },
}

/// The objects one resolution works from.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub pod: Option<Pod>,
    /// ResourceClaims by name (all in the pod's namespace).
    pub claims: BTreeMap<String, ResourceClaim>,
    /// ResourceSlices by name.
    pub slices: BTreeMap<String, ResourceSlice>,
}

/// The Pods, ResourceClaims and ResourceSlices found in one file.
#[derive(Debug, Default)]
pub struct FileObjects {
    pub pods: Vec<Pod>,
    pub claims: Vec<ResourceClaim>,
    pub slices: Vec<ResourceSlice>,
    /// Kinds present in the file that drafs does not use (reported, not fatal).
    pub ignored: Vec<String>,
    /// Workloads (a Deployment, a Job...): what a user may give instead of
    /// one of their pods; named when the file holds no Pod.
    pub workloads: Vec<Workload>,
}

/// A workload found in a file: enough to say how to get one of its pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
    /// Its pod template's labels, as a `kubectl -l` selector.
    pub selector: String,
}

impl Workload {
    /// The workload in `doc`, if it is one: a kind with a pod template.
    fn of(kind: &str, doc: &Value) -> Option<Workload> {
        let template = match kind {
            "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" | "ReplicationController" => {
                doc.pointer("/spec/template")
            }
            "CronJob" => doc.pointer("/spec/jobTemplate/spec/template"),
            _ => None,
        }?;
        let labels = template.pointer("/metadata/labels").and_then(Value::as_object);
        let selector = labels
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some(format!("{k}={}", v.as_str()?)))
            .collect::<Vec<_>>()
            .join(",");
        Some(Workload {
            kind: kind.to_string(),
            name: doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string(),
            namespace: doc.pointer("/metadata/namespace").and_then(Value::as_str).map(String::from),
            selector,
        })
    }

    /// How to get what drafs reads instead of this workload.
    fn hint(&self) -> String {
        let ns = self.namespace.as_deref().map(|n| format!(" -n {n}")).unwrap_or_default();
        let pods = if self.selector.is_empty() {
            format!("kubectl get pod{ns} -o yaml  (choose one of the {kind}'s pods)", kind = self.kind)
        } else {
            format!("kubectl get pod{ns} -l {} -o yaml", self.selector)
        };
        format!(
            ", but a {kind} ({name:?}): drafs reads a pod that exists, not a template, since a pod's claims are allocated only when it is scheduled. Give it one of the {kind}'s pods with its ResourceClaims and the node's ResourceSlices, e.g. `{pods}` and `kubectl get resourceclaims{ns} -o yaml` and `kubectl get resourceslices -o yaml` into one file (or run `drafs get --pod-name NAME --pod-namespace NS` against the cluster)",
            kind = self.kind,
            name = self.name,
        )
    }
}

impl FileObjects {
    /// Parse a YAML or JSON text: one object, several YAML documents, or a `List`
    /// (`kubectl get -o yaml` prints several objects as `kind: List`). JSON is
    /// read as text, so a claim's driver data keeps its bytes
    /// (`slices::decode_claim`); in YAML a number is what the YAML parser makes
    /// of it: an integer of at most 64 bits exactly, any other a 64-bit float.
    pub fn parse(path: &str, text: &str) -> Result<Self, LoadError> {
        let docs: Vec<Cow<RawValue>> = match serde_json::from_str::<&RawValue>(text) {
            Ok(doc) => vec![Cow::Borrowed(doc)],
            // YAML 1.2 booleans only: a node named `n` or `y` stays a string.
            Err(_) => serde_saphyr::from_multiple_with_options::<Value>(text, {
                let mut options = serde_saphyr::Options::default();
                options.strict_booleans = true;
                options
            })
            .map_err(|e| LoadError::Parse { path: path.to_string(), message: e.to_string() })?
            .iter()
            .filter_map(|doc| serde_json::value::to_raw_value(doc).ok().map(Cow::Owned))
            .collect(),
        };
        let mut out = FileObjects::default();
        let docs = flatten_lists(docs).ok_or_else(|| LoadError::ListsTooDeep { path: path.to_string() })?;
        for (index, doc) in docs.into_iter().enumerate() {
            let kind = json_text::member(&doc, "kind").and_then(json_text::string).unwrap_or_default();
            let name = json_text::member(&doc, "metadata")
                .and_then(|m| json_text::member(m, "name"))
                .and_then(json_text::string)
                .unwrap_or_default();
            let malformed = |e: serde_json::Error| LoadError::Malformed {
                path: path.to_string(),
                index,
                kind: kind.clone(),
                name: name.clone(),
                message: without_position(&e),
            };
            match kind.as_str() {
                "Pod" => out.pods.push(serde_json::from_str(doc.get()).map_err(malformed)?),
                "ResourceClaim" => out.claims.push(slices::decode_claim(doc.get()).map_err(malformed)?),
                "ResourceSlice" => out.slices.push(serde_json::from_str(doc.get()).map_err(malformed)?),
                other => {
                    // Only a hint: a workload no Value holds gives none.
                    if let Ok(doc) = serde_json::from_str::<Value>(doc.get()) {
                        out.workloads.extend(Workload::of(other, &doc));
                    }
                    out.ignored.push(if other.is_empty() { "<no kind>".into() } else { other.into() })
                }
            }
        }
        Ok(out)
    }

    /// Read a file; `-` is standard input (`kubectl get ... -o yaml | drafs get --from-file -`).
    pub fn read(path: &Path) -> Result<Self, LoadError> {
        if path == Path::new("-") {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(|source| LoadError::Read { path: "standard input".into(), source })?;
            return Self::parse("standard input", &text);
        }
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read { path: shown.clone(), source })?;
        Self::parse(&shown, &text)
    }

    /// Pick the pod (by name when given, else the only one) and build a snapshot.
    pub fn into_snapshot(self, path: &str, pod_name: Option<&str>) -> Result<Snapshot, LoadError> {
        let names =
            || self.pods.iter().map(|p| p.metadata.name.clone().unwrap_or_default()).collect::<Vec<_>>().join(", ");
        let index = match pod_name {
            Some(wanted) => {
                self.pods.iter().position(|p| p.metadata.name.as_deref() == Some(wanted)).ok_or_else(|| {
                    LoadError::PodNotInFile { path: path.into(), wanted: wanted.into(), have: names() }
                })?
            }
            None if self.pods.is_empty() => {
                let hint = self.workloads.first().map(Workload::hint).unwrap_or_default();
                return Err(LoadError::NoPod { path: path.into(), hint });
            }
            None if self.pods.len() > 1 => {
                return Err(LoadError::AmbiguousPod { path: path.into(), have: names() });
            }
            None => 0,
        };
        let mut pods = self.pods;
        let pod = pods.swap_remove(index);
        let namespace = pod.metadata.namespace.clone();
        let claims = self
            .claims
            .into_iter()
            .filter(|c| namespace.is_none() || c.metadata.namespace.is_none() || c.metadata.namespace == namespace)
            .filter_map(|c| Some((c.metadata.name.clone()?, c)))
            .collect();
        let slices = self.slices.into_iter().filter_map(|s| Some((s.metadata.name.clone()?, s))).collect();
        Ok(Snapshot { pod: Some(pod), claims, slices })
    }
}

/// How deep `List`s may nest in a file (`kubectl` writes one level).
const MAX_LIST_DEPTH: usize = 32;

/// The documents with every `List` (`kind: List`, `PodList`...) replaced by
/// its items, in order; `null` documents dropped. `None` when lists nest
/// deeper than [`MAX_LIST_DEPTH`].
fn flatten_lists(docs: Vec<Cow<'_, RawValue>>) -> Option<Vec<Cow<'_, RawValue>>> {
    fn items(doc: &RawValue) -> Option<Vec<&RawValue>> {
        let kind = json_text::member(doc, "kind").and_then(json_text::string)?;
        (kind == "List" || kind.ends_with("List")).then_some(())?;
        // A list without a list of items has no objects.
        Some(
            json_text::member(doc, "items")
                .and_then(|items| serde_json::from_str(items.get()).ok())
                .unwrap_or_default(),
        )
    }
    let mut out = Vec::new();
    // (document, how many lists hold it), the next on top.
    let mut stack: Vec<(Cow<RawValue>, usize)> = docs.into_iter().rev().map(|doc| (doc, 0)).collect();
    while let Some((doc, depth)) = stack.pop() {
        if json_text::Kind::of(&doc) == json_text::Kind::Null {
            continue;
        }
        let items = match &doc {
            Cow::Borrowed(doc) => items(doc).map(|items| items.into_iter().map(Cow::Borrowed).collect::<Vec<_>>()),
            Cow::Owned(doc) => {
                items(doc).map(|items| items.into_iter().map(|item| Cow::Owned(item.to_owned())).collect())
            }
        };
        match items {
            Some(_) if depth == MAX_LIST_DEPTH => return None,
            Some(items) => stack.extend(items.into_iter().rev().map(|item| (item, depth + 1))),
            None => out.push(doc),
        }
    }
    Some(out)
}

/// A decoding error without its place: that is in the document's JSON text,
/// which for a YAML file is drafs's, not the file's.
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let place = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&place).map(str::to_string).unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_multi_document_yaml_and_lists() {
        let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: p, namespace: ns}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaim
  metadata: {name: c, namespace: ns}
  spec: {}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: s}
spec: {driver: d.example.com, pool: {name: p, generation: 1, resourceSliceCount: 1}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: x}
"#;
        let objects = FileObjects::parse("t.yaml", text).unwrap();
        assert_eq!(objects.pods.len(), 1);
        assert_eq!(objects.claims.len(), 1);
        assert_eq!(objects.slices.len(), 1);
        assert_eq!(objects.ignored, vec!["ConfigMap".to_string()]);
        let snap = objects.into_snapshot("t.yaml", None).unwrap();
        assert!(snap.claims.contains_key("c"));
        assert!(snap.slices.contains_key("s"));
    }

    #[test]
    fn malformed_object_names_the_document() {
        let text =
            "kind: ResourceSlice\nmetadata: {name: broken}\nspec: {driver: d, pool: {name: p, generation: many}}\n";
        let err = FileObjects::parse("f.yaml", text).unwrap_err().to_string();
        assert!(err.contains("ResourceSlice") && err.contains("broken"), "{err}");
    }

    #[test]
    fn pod_choice_is_explicit() {
        let text = "kind: Pod\nmetadata: {name: a}\n---\nkind: Pod\nmetadata: {name: b}\n";
        let objects = FileObjects::parse("f", text).unwrap();
        let err = objects.into_snapshot("f", None).unwrap_err().to_string();
        assert!(err.contains("--pod-name"), "{err}");
        let objects = FileObjects::parse("f", text).unwrap();
        let snap = objects.into_snapshot("f", Some("b")).unwrap();
        assert_eq!(snap.pod.unwrap().metadata.name.as_deref(), Some("b"));
    }

    #[test]
    fn a_file_with_a_workload_and_no_pod_says_how_to_get_a_pod() {
        let text = "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: nightly, namespace: ml}\nspec:\n  jobTemplate:\n    spec:\n      template:\n        metadata: {labels: {app: nightly}}\n        spec: {containers: []}\n";
        let objects = FileObjects::parse("f.yaml", text).unwrap();
        assert_eq!(objects.workloads.len(), 1);
        let err = objects.into_snapshot("f.yaml", None).unwrap_err().to_string();
        assert!(err.starts_with("f.yaml holds no Pod, but a CronJob (\"nightly\")"), "{err}");
        assert!(err.contains("kubectl get pod -n ml -l app=nightly -o yaml"), "{err}");
        let none = FileObjects::parse("g.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n").unwrap();
        assert_eq!(none.into_snapshot("g.yaml", None).unwrap_err().to_string(), "g.yaml holds no Pod");
    }

    /// Issue 25: a JSON file is read as text, so a claim's driver data keeps
    /// the bytes the file has, numbers no `Value` holds included.
    #[test]
    fn a_json_file_keeps_a_claims_driver_data_exactly() {
        let data = r#"{"big":340282366920938463463374607431768211455,"f":1.5e400,"s":"\u003c"}"#;
        let claim = format!(
            r#"{{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {{"name": "c"}},
                "status": {{"devices": [{{"driver": "d", "pool": "p", "device": "x", "data": {data}}}]}}}}"#
        );
        // In a List in a List, beside a null and an object no Value holds.
        let text = format!(
            r#"{{"kind": "List", "items": [{{"kind": "ResourceClaimList", "items": [{claim}]}}, null,
                {{"kind": "ConfigMap", "metadata": {{"name": "m"}}, "data": {{"n": 1e999}}}}]}}"#
        );
        let objects = FileObjects::parse("f.json", &text).unwrap();
        assert_eq!(objects.ignored, vec!["ConfigMap".to_string()]);
        let devices = objects.claims[0].status.as_ref().unwrap().devices.as_ref().unwrap();
        assert_eq!(crate::model::status_data::carried(devices[0].data.as_ref().unwrap()).get(), data);
    }

    /// The limit of YAML: its parser makes a number an integer of at most 64
    /// bits or a 64-bit float, so a bigger integer is rounded and one beyond
    /// a float's range is an error that names it.
    #[test]
    fn a_yaml_file_has_its_numbers_as_the_yaml_parser_reads_them() {
        let claim = |data: &str| {
            format!(
                "kind: ResourceClaim\nmetadata: {{name: c}}\nstatus: {{devices: [{{driver: d, pool: p, device: x, data: {data}}}]}}\n"
            )
        };
        let carried = |text: &str| {
            let objects = FileObjects::parse("f.yaml", text).unwrap();
            let devices = objects.claims[0].status.clone().unwrap().devices.unwrap();
            crate::model::status_data::carried(devices[0].data.as_ref().unwrap()).get().to_string()
        };
        assert_eq!(
            carried(&claim(
                "{u: 18446744073709551615, i: -9223372036854775808, s: '340282366920938463463374607431768211455'}"
            )),
            r#"{"u":18446744073709551615,"i":-9223372036854775808,"s":"340282366920938463463374607431768211455"}"#
        );
        assert_eq!(
            carried(&claim("{big: 340282366920938463463374607431768211455}")),
            r#"{"big":3.402823669209385e+38}"#
        );
        let err = FileObjects::parse("f.yaml", &claim("{f: 1.5e400}")).unwrap_err().to_string();
        assert!(err.starts_with("f.yaml is neither valid YAML nor JSON") && err.contains("1.5e400"), "{err}");
    }

    #[test]
    fn lists_nest_a_bounded_depth_without_recursion() {
        let nested = |depth: usize| {
            format!(
                r#"{}{{"kind": "Pod", "metadata": {{"name": "p"}}}}{}"#,
                r#"{"kind":"List","items":["#.repeat(depth),
                "]}".repeat(depth)
            )
        };
        let objects = FileObjects::parse("f.json", &nested(MAX_LIST_DEPTH)).unwrap();
        assert_eq!(objects.pods.len(), 1);
        for depth in [MAX_LIST_DEPTH + 1, 100_000] {
            let err = FileObjects::parse("f.json", &nested(depth)).unwrap_err().to_string();
            assert_eq!(err, "f.json holds lists nested more than 32 deep");
        }
    }

    #[test]
    fn a_malformed_object_is_named_without_a_place_in_drafs_s_json() {
        for (path, text) in [
            ("f.yaml", "kind: Pod\nmetadata: {name: p}\nspec: {containers: 5}\n"),
            ("f.json", r#"{"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": 5}}"#),
        ] {
            let err = FileObjects::parse(path, text).unwrap_err().to_string();
            assert_eq!(
                err,
                format!("{path}: document 0 (Pod \"p\") is malformed: invalid type: integer `5`, expected a sequence")
            );
        }
    }
}
