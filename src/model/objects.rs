//! The API objects drafs reads, held as a plain value.
//!
//! A [`Snapshot`] is what the resolver consumes: one Pod, the ResourceClaims of its
//! namespace that matter, and the ResourceSlices that may hold its devices. It is
//! filled either from the API (see `source`) or from a file (`--from-file`), so the
//! resolver never knows where its input came from.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::Value;

/// Errors from reading a `--from-file` input.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is neither valid YAML nor JSON: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: document {index} ({kind} {name:?}) is malformed: {source}")]
    Malformed { path: String, index: usize, kind: String, name: String, source: serde_json::Error },
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
    /// (`kubectl get -o yaml` prints several objects as `kind: List`).
    pub fn parse(path: &str, text: &str) -> Result<Self, LoadError> {
        let docs: Vec<Value> = match serde_json::from_str::<Value>(text) {
            Ok(v) => vec![v],
            // YAML 1.2 booleans only: a node named `n` or `y` stays a string.
            Err(_) => serde_saphyr::from_multiple_with_options::<Value>(text, {
                let mut options = serde_saphyr::Options::default();
                options.strict_booleans = true;
                options
            })
            .map_err(|e| LoadError::Parse { path: path.to_string(), message: e.to_string() })?,
        };
        let mut flat = Vec::new();
        for doc in docs {
            flatten_lists(doc, &mut flat);
        }
        let mut out = FileObjects::default();
        for (index, doc) in flat.into_iter().enumerate() {
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
            let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            let malformed = |source| LoadError::Malformed {
                path: path.to_string(),
                index,
                kind: kind.clone(),
                name: name.clone(),
                source,
            };
            match kind.as_str() {
                "Pod" => out.pods.push(serde_json::from_value(doc).map_err(malformed)?),
                "ResourceClaim" => out.claims.push(serde_json::from_value(doc).map_err(malformed)?),
                "ResourceSlice" => out.slices.push(serde_json::from_value(doc).map_err(malformed)?),
                other => {
                    out.workloads.extend(Workload::of(other, &doc));
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

fn flatten_lists(doc: Value, out: &mut Vec<Value>) {
    match doc {
        Value::Null => {}
        Value::Object(mut map)
            if map.get("kind").and_then(Value::as_str).is_some_and(|k| k == "List" || k.ends_with("List")) =>
        {
            if let Some(Value::Array(items)) = map.remove("items") {
                for item in items {
                    flatten_lists(item, out);
                }
            }
        }
        other => out.push(other),
    }
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
}
