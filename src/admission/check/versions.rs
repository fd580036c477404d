//! `drafs check --installation`'s `versions`: pods keep the drafs image they
//! were admitted with (an upgrade changes what the webhook injects, not the
//! running pods), so after an upgrade some run an older drafs. Which ones,
//! and the command that rolls each workload onto the installed one.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::{Check, NAMED, Status, named};
use crate::model::names::DRAFS_CONTAINER;

/// A pod whose drafs is not the installed one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StalePod {
    pub namespace: String,
    pub name: String,
    pub image: String,
    /// What rolls it: `kubectl rollout restart KIND/NAME -n NS`, or for a pod
    /// no rollout owns, deleting it (whoever made it makes it again).
    pub roll: String,
}

/// The image of the drafs container the webhook (or `drafs inject`) put in
/// `pod`: an init container or a container named `drafs`.
pub fn injected_image(pod: &Pod) -> Option<&str> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == DRAFS_CONTAINER)
        .and_then(|c| c.image.as_deref())
}

/// [`StalePod`] of `pod` when its drafs is not `installed`.
pub fn stale(pod: &Pod, installed: &str) -> Option<StalePod> {
    let image = injected_image(pod)?;
    if image == installed {
        return None;
    }
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    Some(StalePod { roll: roll_command(pod, &namespace, &name), namespace, name, image: image.to_string() })
}

/// The workload that rolls `pod`: a Deployment behind its ReplicaSet (the
/// ReplicaSet's name less its `-<pod-template-hash>`), a StatefulSet or a
/// DaemonSet; anything else is deleted and made again by its owner.
fn roll_command(pod: &Pod, namespace: &str, name: &str) -> String {
    let owner = pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
    let workload = owner.and_then(|o| match o.kind.as_str() {
        "ReplicaSet" => {
            let hash = pod.metadata.labels.as_ref()?.get("pod-template-hash")?;
            let deployment = o.name.strip_suffix(&format!("-{hash}"))?;
            Some(format!("deployment/{deployment}"))
        }
        "StatefulSet" => Some(format!("statefulset/{}", o.name)),
        "DaemonSet" => Some(format!("daemonset/{}", o.name)),
        _ => None,
    });
    match workload {
        Some(w) => format!("kubectl rollout restart {w} -n {namespace}"),
        None => format!("kubectl delete pod {name} -n {namespace}"),
    }
}

/// The check: `current` pods run the `installed` drafs, `stale` another.
/// A warning, not a failure: an older drafs keeps serving its pod.
pub fn versions(installed: &str, current: usize, stale: &[StalePod]) -> Check {
    let details = json!({
        "installed": installed,
        "current": current,
        "stale": stale.iter().map(|p| json!({
            "pod": format!("{}/{}", p.namespace, p.name), "image": p.image, "roll": p.roll,
        })).collect::<Vec<_>>(),
    });
    if stale.is_empty() {
        let message = match current {
            0 => format!("no pod runs an injected drafs yet (the webhook injects {installed})"),
            n => format!("the {n} pods with drafs run the installed {installed}"),
        };
        return Check::new("versions", Status::Ok, message, details);
    }
    let pods: Vec<String> = stale.iter().map(|p| format!("{}/{} ({})", p.namespace, p.name, p.image)).collect();
    let rolls: BTreeSet<&str> = stale.iter().map(|p| p.roll.as_str()).collect();
    let mut fix: Vec<&str> = rolls.iter().take(NAMED).copied().collect();
    let more = rolls.len().saturating_sub(NAMED);
    let more = if more > 0 { format!("; and {more} more in -o json") } else { String::new() };
    fix.sort_unstable();
    Check::new(
        "versions",
        Status::Warn,
        format!(
            "{} of {} pods with drafs run another drafs than the installed {installed}: {}",
            stale.len(),
            stale.len() + current,
            named(&pods)
        ),
        details,
    )
    .with_fix(format!("{}{more}", fix.join("; ")))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn pod(ns: &str, name: &str, image: &str, owner: Option<(&str, &str)>, hash: Option<&str>) -> Pod {
        let mut meta = json!({"namespace": ns, "name": name});
        if let Some((kind, owner)) = owner {
            meta["ownerReferences"] =
                json!([{"apiVersion": "apps/v1", "kind": kind, "name": owner, "uid": "u", "controller": true}]);
        }
        if let Some(hash) = hash {
            meta["labels"] = json!({"pod-template-hash": hash});
        }
        let spec = json!({"initContainers": [{"name": "drafs", "image": image}], "containers": [{"name": "app", "image": "app:1"}]});
        serde_json::from_value(json!({"metadata": meta, "spec": spec})).unwrap()
    }

    #[test]
    fn each_stale_pod_is_rolled_by_its_workload() {
        let installed = "registry.example/drafs:0.2.0";
        let deployed = pod(
            "ml",
            "trainer-7d4f-x2",
            "registry.example/drafs:0.1.0",
            Some(("ReplicaSet", "trainer-7d4f")),
            Some("7d4f"),
        );
        assert_eq!(stale(&deployed, installed).unwrap().roll, "kubectl rollout restart deployment/trainer -n ml");
        let set = pod("ml", "db-0", "drafs:0.1.0", Some(("StatefulSet", "db")), None);
        assert_eq!(stale(&set, installed).unwrap().roll, "kubectl rollout restart statefulset/db -n ml");
        let job = pod("hpc", "run-abc", "drafs:0.1.0", Some(("Job", "run")), None);
        assert_eq!(stale(&job, installed).unwrap().roll, "kubectl delete pod run-abc -n hpc");
        // A ReplicaSet whose name does not end in the hash is no Deployment's.
        let bare_rs = pod("ml", "rs-x", "drafs:0.1.0", Some(("ReplicaSet", "mine")), Some("9z"));
        assert_eq!(stale(&bare_rs, installed).unwrap().roll, "kubectl delete pod rs-x -n ml");
        assert_eq!(stale(&pod("ml", "new", installed, None, None), installed), None, "current");
        let mut no_drafs = pod("ml", "plain", "x", None, None);
        no_drafs.spec.as_mut().unwrap().init_containers = None;
        assert_eq!(injected_image(&no_drafs), None);
    }

    #[test]
    fn the_check_warns_with_the_pods_and_one_command_per_workload() {
        let installed = "drafs:0.2.0";
        let stale: Vec<StalePod> = (0..12)
            .map(|i| StalePod {
                namespace: "ml".into(),
                name: format!("trainer-{i}"),
                image: "drafs:0.1.0".into(),
                roll: "kubectl rollout restart deployment/trainer -n ml".into(),
            })
            .collect();
        let check = versions(installed, 3, &stale);
        assert_eq!(check.status, Status::Warn);
        assert!(
            check.message.starts_with(
                "12 of 15 pods with drafs run another drafs than the installed drafs:0.2.0: ml/trainer-0 (drafs:0.1.0)"
            ),
            "{}",
            check.message
        );
        assert!(check.message.ends_with("trainer-9 (drafs:0.1.0) and 2 more"), "{}", check.message);
        assert_eq!(check.fix.as_deref(), Some("kubectl rollout restart deployment/trainer -n ml"));
        assert_eq!(check.details["stale"].as_array().map(Vec::len), Some(12));
        let fine = versions(installed, 3, &[]);
        assert_eq!(
            (fine.status, fine.message.as_str()),
            (Status::Ok, "the 3 pods with drafs run the installed drafs:0.2.0")
        );
        assert_eq!(versions(installed, 0, &[]).details["current"], Value::from(0));
    }
}
