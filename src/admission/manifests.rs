//! `drafs manifests rbac`: the least-privilege RBAC for one namespace, as YAML.
//!
//! Every object belongs to one (namespace, service account): installing it
//! for several never overwrites another's objects, and `kubectl delete -f` of
//! one output removes exactly that account's grants. The namespaced objects
//! live in their namespace; the cluster-scoped ClusterRole (list/watch
//! ResourceSlices) and its binding carry the namespace and account in their
//! name: a ClusterRole per account costs nothing, and a shared one would be
//! deleted with any one namespace's output.

use serde_json::{Value, json};

/// The prefix of the cluster-scoped objects' names.
pub const SLICES_CLUSTER_ROLE: &str = "drafs-resourceslices";

/// The account drafs creates and owns; any other account is the user's.
pub const DEFAULT_ACCOUNT: &str = "drafs";

/// The names of one account's objects. drafs's own account keeps the plain
/// names; another account's carry `:<account>`, which no DNS label (what the
/// plain names are made of) contains, so no two accounts, in one namespace
/// or across namespaces, ever share a Role, a binding or a ClusterRoleBinding.
fn names(namespace: &str, account: &str) -> (String, String, String) {
    let suffix = if account == DEFAULT_ACCOUNT { String::new() } else { format!(":{account}") };
    (format!("drafs{suffix}"), format!("drafs-events{suffix}"), format!("{SLICES_CLUSTER_ROLE}-{namespace}{suffix}"))
}

/// Role, RoleBinding, this account's ClusterRole and ClusterRoleBinding, and drafs's own ServiceAccount when it is the one
/// bound (an account of yours is yours: never created, so never deleted by
/// `kubectl delete -f`); with `events`, the optional Role and RoleBinding to
/// record Events on the pod.
pub fn rbac(namespace: &str, service_account: &str, events: bool) -> Vec<Value> {
    let subject = json!([{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]);
    let (role, events_role, cluster_binding) = names(namespace, service_account);
    let mut docs = Vec::new();
    if service_account == DEFAULT_ACCOUNT {
        docs.push(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": service_account, "namespace": namespace}}));
    }
    docs.extend([
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": role, "namespace": namespace},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list", "watch"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": subject}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": cluster_binding},
            "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": cluster_binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_binding},
            "subjects": subject}),
    ]);
    if events {
        docs.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": events_role, "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]}));
        docs.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": events_role, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": events_role},
            "subjects": subject}));
    }
    docs
}

/// The name of the shared ClusterRole a tenant namespace binds (the chart's
/// `tenants.roles` for a release named `drafs`, `--shared-roles`).
pub const TENANT_CLUSTER_ROLE: &str = "drafs-tenant";

/// Who reads ResourceSlices with the shared roles (the chart's `tenants.resourceSlices`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlicesReaders {
    /// Every service account of the cluster (the group `system:serviceaccounts`):
    /// a namespace onboards with its RoleBinding alone.
    AllServiceAccounts,
    /// The service accounts of these namespaces only (`system:serviceaccounts:<ns>`).
    Namespaces(Vec<String>),
}

/// The cluster-scoped objects every tenant namespace shares, named from
/// `prefix` (the chart's full name): `<prefix>-tenant`, a ClusterRole with the
/// rules of [`rbac`]'s Role and its events Role, which a RoleBinding grants in
/// its own namespace only; `<prefix>-resourceslices`, list and watch of the
/// cluster-scoped slices, and one ClusterRoleBinding of it to `readers`.
pub fn shared_roles(prefix: &str, readers: &SlicesReaders) -> Vec<Value> {
    let rules: Vec<Value> = rbac("placeholder", DEFAULT_ACCOUNT, true)
        .iter()
        .filter(|d| d["kind"] == "Role")
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    let slices = format!("{prefix}-resourceslices");
    let subjects: Vec<Value> = match readers {
        SlicesReaders::AllServiceAccounts => vec!["system:serviceaccounts".to_string()],
        SlicesReaders::Namespaces(names) => names.iter().map(|ns| format!("system:serviceaccounts:{ns}")).collect(),
    }
    .into_iter()
    .map(|group| json!({"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": group}))
    .collect();
    let slice_rules = rbac("placeholder", DEFAULT_ACCOUNT, false)
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole")
        .map(|d| d["rules"].clone())
        .unwrap_or_default();
    let mut docs = vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": format!("{prefix}-tenant")}, "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": slices}, "rules": slice_rules}),
    ];
    if !subjects.is_empty() {
        docs.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": slices},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": slices},
            "subjects": subjects}));
    }
    docs
}

/// A tenant namespace onboarded onto the shared roles: drafs's own
/// ServiceAccount when it is the one bound, and one RoleBinding of
/// `cluster_role` (granted in `namespace` only). Nothing cluster-scoped.
pub fn tenant_binding(namespace: &str, service_account: &str, cluster_role: &str) -> Vec<Value> {
    let (name, _, _) = names(namespace, service_account);
    let mut docs: Vec<Value> =
        rbac(namespace, service_account, false).into_iter().filter(|d| d["kind"] == "ServiceAccount").collect();
    docs.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]}));
    docs
}

/// One permission drafs needs, as a SubjectAccessReview asks about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub group: String,
    pub resource: String,
    pub verb: String,
    /// The namespace it is granted in; `None`: cluster-wide (a ClusterRole).
    pub namespace: Option<String>,
    /// Only for Events on the pod (`--events`): drafs works without it.
    pub optional: bool,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let resource =
            if self.group.is_empty() { self.resource.clone() } else { format!("{}.{}", self.resource, self.group) };
        match &self.namespace {
            Some(ns) => write!(f, "{} {resource} in {ns}", self.verb),
            None => write!(f, "{} {resource} (cluster-wide)", self.verb),
        }
    }
}

/// Who reads with the account's rights, which decides what it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// drafs in the pod (`init`, the sidecars): the pod, its claims, the slices.
    Pod,
    /// drafs node as the pod, for its CSI volume: the pod and its claims;
    /// the agent reads the slices as itself.
    NodeVolume,
}

/// What `reader` needs of [`grants`].
pub fn grants_for(namespace: &str, service_account: &str, reader: Reader) -> Vec<Grant> {
    let mut all = grants(namespace, service_account);
    if reader == Reader::NodeVolume {
        all.retain(|g| g.resource != "resourceslices");
    }
    all
}

/// Every permission [`rbac`] grants `service_account` (with the optional
/// events), read from the very objects it prints, so that what `drafs check`
/// asks for cannot drift from what `drafs manifests rbac` installs.
pub fn grants(namespace: &str, service_account: &str) -> Vec<Grant> {
    let (_, events_role, _) = names(namespace, service_account);
    let mut out = Vec::new();
    for doc in rbac(namespace, service_account, true) {
        let namespaced = match doc["kind"].as_str() {
            Some("Role") => Some(namespace.to_string()),
            Some("ClusterRole") => None,
            _ => continue,
        };
        let events = doc["metadata"]["name"] == events_role.as_str();
        for rule in doc["rules"].as_array().into_iter().flatten() {
            let list = |key: &str| -> Vec<String> {
                rule[key].as_array().into_iter().flatten().filter_map(Value::as_str).map(String::from).collect()
            };
            for group in list("apiGroups") {
                for resource in list("resources") {
                    for verb in list("verbs") {
                        // Without `watch pods` only device health stops following the pod.
                        let optional = events || (group.is_empty() && resource == "pods" && verb == "watch");
                        out.push(Grant {
                            group: group.clone(),
                            resource: resource.clone(),
                            verb,
                            namespace: namespaced.clone(),
                            optional,
                        });
                    }
                }
            }
        }
    }
    out
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
    fn two_namespaces_never_share_an_object() {
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
        assert!(shared.is_empty(), "{shared:?}");
        assert_eq!(rbac("ml", "drafs", false).len(), 5);
        let text = to_yaml(&rbac("ml", "drafs", false)).unwrap();
        let parsed: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(parsed, rbac("ml", "drafs", false));
    }

    #[test]
    fn grants_are_the_rules_printed() {
        let shown: Vec<String> = grants("ml", "trainer")
            .iter()
            .map(|g| format!("{g}{}", if g.optional { " (optional)" } else { "" }))
            .collect();
        assert_eq!(
            shown,
            [
                "get pods in ml",
                "watch pods in ml (optional)",
                "list resourceclaims.resource.k8s.io in ml",
                "watch resourceclaims.resource.k8s.io in ml",
                "list resourceslices.resource.k8s.io (cluster-wide)",
                "watch resourceslices.resource.k8s.io (cluster-wide)",
                "create events in ml (optional)",
            ]
        );
    }

    #[test]
    fn the_shared_roles_grant_what_the_namespaced_objects_grant() {
        let shared = shared_roles("drafs", &SlicesReaders::AllServiceAccounts);
        let rules = |docs: &[Value], kind: &str| -> Vec<Value> {
            docs.iter().filter(|d| d["kind"] == kind).flat_map(|d| d["rules"].as_array().cloned().unwrap()).collect()
        };
        let own = rbac("ml", "drafs", true);
        let names: Vec<&str> = shared.iter().map(|d| d["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["drafs-tenant", "drafs-resourceslices", "drafs-resourceslices"]);
        assert_eq!(rules(&shared[..1], "ClusterRole"), rules(&own, "Role"), "pods, claims and events");
        assert_eq!(rules(&shared[1..], "ClusterRole"), rules(&own, "ClusterRole"), "slices");
        assert_eq!(
            shared[2]["subjects"],
            json!([{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:serviceaccounts"}])
        );
        let listed = shared_roles("x", &SlicesReaders::Namespaces(vec!["ml".into(), "hpc".into()]));
        let groups: Vec<&str> =
            listed[2]["subjects"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert_eq!(groups, ["system:serviceaccounts:ml", "system:serviceaccounts:hpc"]);
        assert_eq!(shared_roles("x", &SlicesReaders::Namespaces(vec![])).len(), 2, "no binding to nobody");

        // A namespace onboards with one namespaced RoleBinding (and drafs's account).
        let binding = tenant_binding("ml", "drafs", TENANT_CLUSTER_ROLE);
        let kinds: Vec<&str> = binding.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["ServiceAccount", "RoleBinding"]);
        assert!(binding.iter().all(|d| d["metadata"]["namespace"] == "ml"));
        assert_eq!(binding[1]["roleRef"]["name"], "drafs-tenant");
        let theirs = tenant_binding("ml", "trainer", "drafs-tenant");
        assert_eq!(theirs.len(), 1, "the user's account is theirs");
        assert_eq!(theirs[0]["metadata"]["name"], "drafs:trainer");
        assert_eq!(theirs[0]["subjects"][0]["name"], "trainer");
    }

    #[test]
    fn two_accounts_in_one_namespace_never_share_an_object() {
        let key =
            |d: &Value| (d["kind"].as_str().unwrap().to_string(), d["metadata"]["name"].as_str().unwrap().to_string());
        // Including accounts whose names look like drafs's own suffixes.
        for other in ["trainer-sa", "events", "drafs-events", "ml"] {
            let a: Vec<_> = rbac("ml", "drafs", true).iter().map(key).collect();
            let b: Vec<_> = rbac("ml", other, true).iter().map(key).collect();
            let shared: Vec<_> = a.iter().filter(|k| b.contains(k)).collect();
            assert!(shared.is_empty(), "{other}: {shared:?}");
            // The user's own account is never part of the output (so never deleted with it).
            assert!(!b.iter().any(|(kind, _)| kind == "ServiceAccount"), "{other}");
        }
    }
}
