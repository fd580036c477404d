//! `drafs check --uninstall`'s `in-use`: the pods that still have a volume
//! of drafs node's CSI driver. The kubelet cannot unpublish a volume whose
//! driver is gone, so such a pod, once deleted, stays Terminating until an
//! agent is back on its node: the chart's pre-delete hook runs this check
//! and refuses the uninstall while the list is not empty.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::{Check, NAMED, Status, named};

/// A pod with a volume of the driver that has not finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeUser {
    pub namespace: String,
    pub name: String,
    /// Empty while the pod is not scheduled.
    pub node: String,
}

/// Whether `pod` has a volume of `driver`.
pub fn has_volume_of(pod: &Pod, driver: &str) -> bool {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes.into_iter().flatten().any(|v| v.csi.as_ref().is_some_and(|csi| csi.driver == driver))
}

/// [`VolumeUser`] of `pod` when it has a volume of `driver` and has not
/// finished. The kubelet unpublishes a Succeeded or Failed pod's volumes
/// once its containers are gone, a moment after it reports the phase; a pod
/// being deleted still needs the agent to unpublish its own.
pub fn volume_user(pod: &Pod, driver: &str) -> Option<VolumeUser> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if !has_volume_of(pod, driver) || matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    Some(VolumeUser {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
    })
}

/// The warning that the cluster has no CSIDriver `driver`: the pods were
/// searched for volumes of a name nothing installed.
pub fn no_csi_driver(driver: &str) -> Check {
    Check::new(
        "csi-driver",
        Status::Warn,
        format!("the cluster has no CSIDriver {driver}: is it the installation's driver name?"),
        json!({"driver": driver}),
    )
    .with_fix("give the installation's with --csi-driver (the chart's node.driverName)")
}

/// The check: failed while any pod uses the volume of `driver`, with the
/// pods and the commands that delete them.
pub fn in_use(driver: &str, users: &[VolumeUser]) -> Check {
    let details = json!({
        "driver": driver,
        "pods": users.iter().map(|u| json!({"pod": format!("{}/{}", u.namespace, u.name), "node": u.node})).collect::<Vec<_>>(),
    });
    if users.is_empty() {
        return Check::new("in-use", Status::Ok, format!("no pod uses a volume of {driver}"), details);
    }
    let pods: Vec<String> = users
        .iter()
        .map(|u| match u.node.as_str() {
            "" => format!("{}/{} (not scheduled)", u.namespace, u.name),
            node => format!("{}/{} on {node}", u.namespace, u.name),
        })
        .collect();
    let mut by_namespace: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for u in users {
        by_namespace.entry(&u.namespace).or_default().push(&u.name);
    }
    // At most NAMED names in all, so that the line is never cut mid-command.
    let mut deletes = Vec::new();
    let mut in_fix = 0;
    for (ns, names) in &by_namespace {
        let room = NAMED.saturating_sub(in_fix);
        if room == 0 {
            break;
        }
        in_fix += names.len().min(room);
        deletes.push(format!("kubectl delete pod -n {ns} {}", names[..names.len().min(room)].join(" ")));
    }
    let more =
        if users.len() > in_fix { format!("; and {} more in -o json", users.len() - in_fix) } else { String::new() };
    Check::new(
        "in-use",
        Status::Fail,
        format!(
            "{} pod{} use{} a volume of {driver}: {}. Without its agent the kubelet cannot unpublish their volumes, \
             and deleted they stay Terminating until an agent is back on their node",
            users.len(),
            if users.len() == 1 { "" } else { "s" },
            if users.len() == 1 { "s" } else { "" },
            named(&pods)
        ),
        details,
    )
    .with_fix(format!(
        "delete them (or scale their workloads to 0) first, or uninstall anyway (they then stay Terminating) with \
         helm uninstall --no-hooks: {}{more}",
        deletes.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn pod(ns: &str, name: &str, driver: &str, node: Option<&str>, phase: Option<&str>) -> Pod {
        let mut spec = json!({
            "containers": [{"name": "app", "image": "app:1"}],
            "volumes": [{"name": "dra", "csi": {"driver": driver, "readOnly": true}}, {"name": "tmp", "emptyDir": {}}],
        });
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        }
        let status = phase.map_or(Value::Null, |p| json!({"phase": p}));
        serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec, "status": status}))
            .unwrap()
    }

    #[test]
    fn only_unfinished_pods_with_the_drivers_volume_use_it() {
        let running = pod("ml", "trainer", "drafs.dev", Some("n1"), Some("Running"));
        assert_eq!(
            volume_user(&running, "drafs.dev"),
            Some(VolumeUser { namespace: "ml".into(), name: "trainer".into(), node: "n1".into() })
        );
        assert_eq!(volume_user(&running, "other.dev"), None, "another driver's volume");
        let pending = pod("ml", "queued", "drafs.dev", None, Some("Pending"));
        assert_eq!(volume_user(&pending, "drafs.dev").map(|u| u.node), Some(String::new()));
        for phase in ["Succeeded", "Failed"] {
            assert_eq!(volume_user(&pod("ml", "done", "drafs.dev", Some("n1"), Some(phase)), "drafs.dev"), None);
        }
        let mut no_volumes = running.clone();
        no_volumes.spec.as_mut().unwrap().volumes = None;
        assert_eq!(volume_user(&no_volumes, "drafs.dev"), None);
    }

    #[test]
    fn the_check_fails_with_the_pods_and_one_delete_per_namespace() {
        let mut users: Vec<VolumeUser> =
            (0..11).map(|i| VolumeUser { namespace: "ml".into(), name: format!("t-{i}"), node: "n1".into() }).collect();
        users.push(VolumeUser { namespace: "hpc".into(), name: "queued".into(), node: String::new() });
        let check = in_use("drafs.dev", &users);
        assert_eq!(check.status, Status::Fail);
        assert!(check.message.starts_with("12 pods use a volume of drafs.dev: ml/t-0 on n1, "), "{}", check.message);
        assert!(check.message.contains("ml/t-9 on n1 and 2 more. Without its agent"), "{}", check.message);
        assert_eq!(
            check.fix.as_deref(),
            Some(
                "delete them (or scale their workloads to 0) first, or uninstall anyway (they then stay Terminating) \
                 with helm uninstall --no-hooks: kubectl delete pod -n hpc queued; \
                 kubectl delete pod -n ml t-0 t-1 t-2 t-3 t-4 t-5 t-6 t-7 t-8; and 2 more in -o json"
            )
        );
        assert_eq!(check.details["pods"].as_array().map(Vec::len), Some(12));
        assert_eq!(check.details["pods"][11], json!({"pod": "hpc/queued", "node": ""}));
        let one = in_use("drafs.dev", &users[11..]);
        assert!(one.message.starts_with("1 pod uses a volume of drafs.dev: hpc/queued (not scheduled)."));
        let none = in_use("drafs.dev", &[]);
        assert_eq!((none.status, none.message.as_str()), (Status::Ok, "no pod uses a volume of drafs.dev"));
        assert_eq!(none.fix, None);
    }
}
