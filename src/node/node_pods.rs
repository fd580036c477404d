//! The node's pods, watched by the agent itself (`--watch-node-pods`): one
//! watch for the whole node (`spec.nodeName=<node>`, as the kubelet's own),
//! through which a change of a pod's device health (what the kubelet writes
//! into `allocatedResourcesStatus`) or of its claim statuses reaches the
//! pod's volumes at once, after their own watches were parked.
//!
//! The agent only notices that a pod changed: the volume's run then reads the
//! pod and its claims as the pod, as at any other time (the agent's own read
//! decides nothing a pod sees). What it keeps of each pod is a fingerprint.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use kube::Client;
use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::{info, warn};

use crate::engine::collection::{Collection, FollowHealth, Followed, WatchChange};

/// Pods per list page.
const PAGE_SIZE: u32 = 100;

/// What the agent keeps of the node's pods: by uid, a fingerprint of their
/// device status. A plain value: the watch feeds it, it says which pods changed.
#[derive(Debug, Default)]
pub struct StatusMarks {
    marks: HashMap<String, u64>,
}

impl StatusMarks {
    /// A pod as the server sent it: whether its device status changed since it
    /// was last seen (a pod seen first is not a change: its runs read it anyway).
    pub fn put(&mut self, pod: &PodMark) -> bool {
        match self.marks.insert(pod.uid.clone(), pod.mark) {
            Some(old) => old != pod.mark,
            None => false,
        }
    }

    pub fn delete(&mut self, uid: &str) {
        self.marks.remove(uid);
    }

    /// The pods a new list holds: those whose status changed since they were
    /// last seen (while the watch was broken); the pods not listed are forgotten.
    pub fn relisted(&mut self, pods: Vec<PodMark>) -> Vec<String> {
        let mut changed = Vec::new();
        let mut next = HashMap::with_capacity(pods.len());
        for pod in pods {
            if self.marks.get(&pod.uid).is_some_and(|old| *old != pod.mark) {
                changed.push(pod.uid.clone());
            }
            next.insert(pod.uid, pod.mark);
        }
        self.marks = next;
        changed
    }

    pub fn len(&self) -> usize {
        self.marks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }
}

/// A pod's uid and the fingerprint of its device status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMark {
    pub uid: String,
    pub mark: u64,
}

/// Only what a fingerprint needs; everything else of the pod is skipped unread.
#[derive(Deserialize)]
struct PodView {
    metadata: MetaView,
    #[serde(default)]
    status: Option<StatusView>,
}

#[derive(Deserialize)]
struct MetaView {
    #[serde(default)]
    uid: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusView {
    #[serde(default)]
    container_statuses: Option<Vec<ContainerView>>,
    #[serde(default)]
    init_container_statuses: Option<Vec<ContainerView>>,
    #[serde(default)]
    resource_claim_statuses: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerView {
    #[serde(default)]
    name: String,
    #[serde(default)]
    allocated_resources_status: Option<Box<RawValue>>,
}

/// The uid and device-status fingerprint of a pod's JSON.
pub fn mark_of(raw: &str) -> Result<PodMark, String> {
    let pod: PodView = serde_json::from_str(raw).map_err(|e| format!("malformed pod: {e}"))?;
    if pod.metadata.uid.is_empty() {
        return Err("a pod without a uid".into());
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    if let Some(status) = &pod.status {
        let containers = status.init_container_statuses.iter().chain(&status.container_statuses).flatten();
        for c in containers.filter(|c| c.allocated_resources_status.is_some()) {
            c.name.hash(&mut hasher);
            c.allocated_resources_status.as_deref().map(RawValue::get).hash(&mut hasher);
        }
        status.resource_claim_statuses.as_deref().map(RawValue::get).hash(&mut hasher);
    }
    Ok(PodMark { uid: pod.metadata.uid, mark: hasher.finish() })
}

/// The field selector of the node's pods.
pub fn field_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// The node's pods as a collection.
fn collection(node: &str) -> Collection {
    Collection {
        url: "/api/v1/pods",
        resource: "pods",
        field_selector: field_selector(node),
        label_selector: String::new(),
    }
}

/// What the agent does with what the node's pod watch sees.
pub trait NodePods: Send + Sync {
    /// A pod's device status changed (the pods seen first are not changes).
    fn status_changed(&self, uid: &str);
    /// A pod of the node, as the server sent it (listed, added or modified).
    fn seen(&self, _raw: &str) {}
    /// A pod of the node was deleted.
    fn deleted(&self, _uid: &str) {}
}

/// Follow the node's pods forever with the agent's `client`, telling
/// `observer` what it sees; `health` counts the watch's trouble (it backs
/// off as the runs' watches do).
pub async fn follow(client: Client, node: String, health: Arc<FollowHealth>, observer: impl NodePods) {
    let mut marks = StatusMarks::default();
    let mut listing = Vec::new();
    collection(&node)
        .follow(&client, PAGE_SIZE, &health, |seen| {
            match seen {
                // One pod the agent cannot read is skipped, not the node's others.
                Followed::Listing(raw) => match mark_of(raw) {
                    Ok(pod) => {
                        observer.seen(raw);
                        listing.push(pod);
                    }
                    Err(e) => warn!("node pods: {e}"),
                },
                Followed::Listed => {
                    for uid in marks.relisted(std::mem::take(&mut listing)) {
                        observer.status_changed(&uid);
                    }
                    info!(pods = marks.len(), "node pods: watching");
                }
                Followed::Changed(WatchChange::Put(raw)) => match mark_of(raw) {
                    Ok(pod) => {
                        observer.seen(raw);
                        if marks.put(&pod) {
                            observer.status_changed(&pod.uid);
                        }
                    }
                    Err(e) => warn!("node pods: {e}"),
                },
                Followed::Changed(WatchChange::Deleted(raw)) => {
                    if let Ok(pod) = mark_of(raw) {
                        marks.delete(&pod.uid);
                        observer.deleted(&pod.uid);
                    }
                }
                Followed::Failing(_) => listing.clear(),
            }
            Ok(())
        })
        .await
}

/// The namespaces labelled `label`, followed forever with the agent's
/// `client`: `listed` with every one at each list, `changed` with one that
/// came (true) or went (false).
pub async fn follow_namespaces(
    client: Client,
    label: String,
    health: Arc<FollowHealth>,
    listed: impl Fn(std::collections::BTreeSet<String>),
    changed: impl Fn(&str, bool),
) {
    let collection = Collection {
        url: "/api/v1/namespaces",
        resource: "namespaces",
        field_selector: String::new(),
        label_selector: label,
    };
    let name_of = |raw: &str| crate::engine::api::object_meta(raw).map(|(name, _)| name).filter(|n| !n.is_empty());
    let mut listing = std::collections::BTreeSet::new();
    collection
        .follow(&client, PAGE_SIZE, &health, |seen| {
            match seen {
                Followed::Listing(raw) => listing.extend(name_of(raw)),
                Followed::Listed => listed(std::mem::take(&mut listing)),
                Followed::Changed(WatchChange::Put(raw)) => {
                    if let Some(name) = name_of(raw) {
                        changed(&name, true);
                    }
                }
                Followed::Changed(WatchChange::Deleted(raw)) => {
                    if let Some(name) = name_of(raw) {
                        changed(&name, false);
                    }
                }
                Followed::Failing(_) => listing.clear(),
            }
            Ok(())
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use drafs_test_support::{Build, PodBuilder};
    use serde_json::json;

    /// Running pod `p` whose container reports device gpu-0 of claim gpu as `health`.
    fn running(uid: &str, health: &str) -> PodBuilder {
        let reports = json!([{"name": "claim:gpu", "resources": [{"resourceID": "gpu-0", "health": health}]}]);
        PodBuilder::new("", "p").uid(uid).phase("Running").container_status("app", reports)
    }

    fn pod(uid: &str, health: &str, extra: serde_json::Value) -> String {
        running(uid, health).annotations(extra).build().to_string()
    }

    #[test]
    fn only_a_change_of_device_status_is_a_change() {
        let mut marks = StatusMarks::default();
        let first = mark_of(&pod("u1", "Healthy", json!({}))).unwrap();
        assert!(!marks.put(&first), "a pod seen first is no change");
        // Everything else of the pod changes often (conditions, annotations): not a change.
        assert!(!marks.put(&mark_of(&pod("u1", "Healthy", json!({"a": "b"}))).unwrap()));
        assert!(marks.put(&mark_of(&pod("u1", "Unhealthy", json!({}))).unwrap()));
        assert!(!marks.put(&mark_of(&pod("u1", "Unhealthy", json!({}))).unwrap()), "told once");
        let claims = running("u1", "Unhealthy").generated(&[("gpu", "p-gpu-x")]).build();
        assert!(marks.put(&mark_of(&claims.to_string()).unwrap()), "a claim status is a change");
        marks.delete("u1");
        assert!(marks.is_empty());
    }

    #[test]
    fn a_relist_names_the_pods_that_changed_meanwhile_and_forgets_the_gone() {
        let mut marks = StatusMarks::default();
        for (uid, health) in [("u1", "Healthy"), ("u2", "Healthy"), ("u3", "Healthy")] {
            marks.put(&mark_of(&pod(uid, health, json!({}))).unwrap());
        }
        let listed = vec![
            mark_of(&pod("u1", "Healthy", json!({}))).unwrap(),
            mark_of(&pod("u2", "Unhealthy", json!({}))).unwrap(),
            mark_of(&pod("u4", "Unhealthy", json!({}))).unwrap(),
        ];
        assert_eq!(marks.relisted(listed), vec!["u2".to_string()]);
        assert_eq!(marks.len(), 3);
        assert!(!marks.put(&mark_of(&pod("u3", "Healthy", json!({}))).unwrap()), "u3 was forgotten: seen first");
    }

    #[test]
    fn a_pod_without_status_or_uid() {
        assert!(mark_of(r#"{"metadata": {"uid": "u"}}"#).is_ok());
        assert!(mark_of(r#"{"metadata": {"name": "p"}}"#).unwrap_err().contains("uid"));
        assert!(mark_of("[1]").unwrap_err().contains("malformed"));
    }
}
