//! `drafs manifests rbac`: the least-privilege RBAC for one namespace, as YAML.
//!
//! Every object is named so that installing it for several namespaces never
//! overwrites another namespace's objects: the namespaced ones live in their
//! namespace, the one cluster-scoped binding carries the namespace in its name,
//! and the shared ClusterRole (list/watch ResourceSlices) is the same for all.

use serde_json::{Value, json};

/// The ClusterRole every namespace's binding points at.
pub const SLICES_CLUSTER_ROLE: &str = "drafs-resourceslices";

/// ServiceAccount, Role, RoleBinding, the shared ClusterRole and this
/// namespace's ClusterRoleBinding; with `events`, the optional Role and
/// RoleBinding to record Events on the pod.
pub fn rbac(namespace: &str, service_account: &str, events: bool) -> Vec<Value> {
    let subject = json!([{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]);
    let mut docs = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": service_account, "namespace": namespace}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "drafs", "namespace": namespace},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list", "watch"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "drafs", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "drafs"},
            "subjects": subject}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": SLICES_CLUSTER_ROLE},
            "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("{SLICES_CLUSTER_ROLE}-{namespace}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SLICES_CLUSTER_ROLE},
            "subjects": subject}),
    ];
    if events {
        docs.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "drafs-events", "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]}));
        docs.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "drafs-events", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "drafs-events"},
            "subjects": subject}));
    }
    docs
}

/// The documents as one multi-document YAML text.
pub fn to_yaml(docs: &[Value]) -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for doc in docs {
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(&serde_saphyr::to_string(doc)?);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_namespaces_never_share_an_object_but_the_cluster_role() {
        let key = |d: &Value| {
            (
                d["kind"].as_str().unwrap().to_string(),
                d["metadata"]["namespace"].as_str().map(String::from),
                d["metadata"]["name"].as_str().unwrap().to_string(),
            )
        };
        let a: Vec<_> = rbac("ml", "drafs", true).iter().map(key).collect();
        let b: Vec<_> = rbac("hpc", "drafs", true).iter().map(key).collect();
        let shared: Vec<_> = a.iter().filter(|k| b.contains(k)).collect();
        assert_eq!(shared, vec![&("ClusterRole".to_string(), None, SLICES_CLUSTER_ROLE.to_string())]);
        assert_eq!(rbac("ml", "drafs", false).len(), 5);
        let text = to_yaml(&rbac("ml", "drafs", false)).unwrap();
        let parsed: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(parsed, rbac("ml", "drafs", false));
    }
}
