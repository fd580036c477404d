//! Tenants on the shared roles the chart installs (`tenants.roles`), with the
//! real API server's RBAC and real tokens: a namespace's own admin onboards it
//! with one RoleBinding and drafs then reads as the pod; the chart onboards
//! the namespaces it is given; no cluster-scoped object is made per
//! namespace; and the chart's roles are what `drafs manifests rbac
//! --shared-roles` prints.

use drafs_test_support as support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};
use support::cluster::{Scenario, unique};
use support::controlplane::{self, ControlPlane};
use support::*;

const LIMIT: Duration = Duration::from_secs(120);

fn drafs(args: &[&str]) -> String {
    let out = Command::new(drafs_bin()).args(args).output().unwrap();
    assert_ok(&out);
    stdout(&out)
}

/// kubectl as whoever `kubeconfig` names.
fn kubectl_as(kubeconfig: &Path, args: &[&str]) -> Output {
    let kubectl = controlplane::binaries().unwrap().join("kubectl");
    Command::new(kubectl).arg("--kubeconfig").arg(kubeconfig).args(args).output().unwrap()
}

/// `kubectl apply` of `yaml` as whoever `kubeconfig` names.
fn apply_as(kubeconfig: &Path, yaml: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, yaml).unwrap();
    kubectl_as(kubeconfig, &["apply", "-f", file.to_str().unwrap()])
}

/// Whether `account` of `ns` may `verb resource` in `in_ns` (`kubectl auth can-i --as`).
fn can(cp: &ControlPlane, (ns, account): (&str, &str), verb: &str, resource: &str, in_ns: &str) -> bool {
    let who = format!("system:serviceaccount:{ns}:{account}");
    stdout(&cp.kubectl(&["auth", "can-i", verb, resource, "-n", in_ns, "--as", &who])).trim() == "yes"
}

/// The names of the cluster's ClusterRoles and ClusterRoleBindings.
fn cluster_scoped(cp: &ControlPlane) -> BTreeSet<String> {
    let out = cp.kubectl(&["get", "clusterroles,clusterrolebindings", "-o", "name"]);
    assert_ok(&out);
    stdout(&out).lines().map(String::from).collect()
}

/// The rules of the built-in `admin` ClusterRole: what the API server's
/// bootstrap policy aggregates into it (the aggregation controller, which this
/// control plane does not run, would copy exactly these).
fn admin_rules(cp: &ControlPlane) -> Vec<Value> {
    let rules: Vec<Value> = ["admin", "edit", "view"]
        .iter()
        .flat_map(|r| {
            let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": format!("system:aggregate-to-{r}")}});
            cp.get(&role).expect("the bootstrap policy's aggregated roles")["rules"].as_array().cloned().unwrap()
        })
        .collect();
    let claims = json!(["resource.k8s.io"]);
    assert!(rules.iter().any(|r| r["apiGroups"] == claims), "admin grants nothing on resourceclaims: {rules:?}");
    rules
}

fn namespace(cp: &ControlPlane, name: &str) {
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}));
}

#[test]
fn a_namespace_admin_onboards_with_one_rolebinding_and_drafs_reads_as_the_pod() {
    let Some(cp) = controlplane::private() else { return };
    namespace(&cp, "drafs-system");
    support::helm::ok(&cp, &["install", "drafs", "deploy/helm/drafs", "--namespace", "drafs-system"]);

    // The chart's roles are what `drafs manifests rbac --shared-roles` prints.
    let printed = yaml_docs(&drafs(&["manifests", "rbac", "--shared-roles"]));
    for doc in &printed {
        let kind = doc["kind"].as_str().unwrap().to_lowercase();
        let out = cp.kubectl(&["get", &kind, doc["metadata"]["name"].as_str().unwrap(), "-o", "json"]);
        assert_ok(&out);
        let installed: Value = serde_json::from_str(&stdout(&out)).unwrap();
        for field in ["rules", "roleRef", "subjects"] {
            assert_eq!(installed[field], doc[field], "{kind} {}: {field}", doc["metadata"]["name"]);
        }
    }

    // A tenant's own admin: the built-in `admin` role, in that namespace only.
    let mut sc = Scenario::from_fixture(&cp, &read("examples/offline/gpu-training.yaml"));
    let ns = sc.namespace.clone();
    namespace(&cp, &ns);
    cp.ensure(
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ns-admin", "namespace": ns}}),
    );
    cp.ensure(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "ns-admin", "namespace": ns}, "rules": admin_rules(&cp)}));
    cp.ensure(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "ns-admin", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ns-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "ns-admin", "namespace": ns}]}));
    let admin = sc.path("admin.kubeconfig");
    cp.kubeconfig(&admin, &cp.token(&ns, "ns-admin", None), &ns);
    let before = cluster_scoped(&cp);

    // `drafs check` names the shared role in its fix, since the cluster has it.
    let check = Command::new(drafs_bin())
        .args(["check", "-o", "json", "-n", &ns])
        .env("KUBECONFIG", cp.dir().join("admin.kubeconfig"))
        .output()
        .unwrap();
    let report: Value = serde_json::from_str(&stdout(&check)).unwrap_or_else(|e| panic!("{e}: {}", stderr(&check)));
    let rbac = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == "rbac").unwrap();
    assert_eq!(rbac["status"], "fail", "{rbac:#}");
    let fix = format!(
        "drafs manifests rbac -n {ns} --service-account drafs --cluster-role drafs-tenant | kubectl apply -f -"
    );
    assert_eq!(rbac["fix"], fix.as_str(), "{rbac:#}");

    // It onboards the namespace with what drafs prints: the account and one RoleBinding.
    let onboarding = drafs(&["manifests", "rbac", "--namespace", &ns, "--cluster-role"]);
    let kinds: Vec<String> = yaml_docs(&onboarding).iter().map(|d| d["kind"].as_str().unwrap().to_string()).collect();
    assert_eq!(kinds, ["ServiceAccount", "RoleBinding"]);
    let applied = apply_as(&admin, &onboarding);
    assert!(applied.status.success(), "the namespace's admin may not onboard it: {}", stderr(&applied));
    assert_eq!(cluster_scoped(&cp), before, "a cluster-scoped object for one namespace");
    let check = Command::new(drafs_bin())
        .args(["check", "-o", "json", "-n", &ns])
        .env("KUBECONFIG", cp.dir().join("admin.kubeconfig"))
        .output()
        .unwrap();
    let report: Value = serde_json::from_str(&stdout(&check)).unwrap();
    let rbac = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == "rbac").unwrap();
    assert_eq!(rbac["status"], "ok", "the shared role grants all drafs needs, events included: {rbac:#}");

    // drafs, as the pod with its account's real token, reads the pod, its claims and the slices.
    sc.create_all_after_rbac();
    let dir = sc.path("dra");
    let out = run_captured(sc.kubeconfig_command(&["init", "--dir", dir.to_str().unwrap(), "--events=all"]), LIMIT);
    assert_ok(&out);
    assert!(!stderr(&out).contains("cannot create events"), "{}", stderr(&out));
    assert_eq!(read_tree(&dir)["gpu/gpu/0/uuid"], "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b");

    // The shared role grants in the bound namespace only; the slices, everywhere.
    let other = unique("tenant-other");
    namespace(&cp, &other);
    assert!(can(&cp, (&ns, "drafs"), "list", "resourceclaims.resource.k8s.io", &ns));
    assert!(!can(&cp, (&ns, "drafs"), "list", "resourceclaims.resource.k8s.io", &other));
    assert!(!can(&cp, (&ns, "drafs"), "get", "pods", &other));
    assert!(can(&cp, (&other, "default"), "list", "resourceslices.resource.k8s.io", &other));
    assert!(!can(&cp, (&other, "default"), "get", "pods", &other), "no pod reads without the binding");

    // Its admin may not bind more than it holds: a role with cluster-wide rights is refused.
    let escalate = drafs(&[
        "manifests",
        "rbac",
        "--namespace",
        &ns,
        "--service-account",
        "ns-admin",
        "--cluster-role",
        "cluster-admin",
    ]);
    let refused = apply_as(&admin, &escalate);
    assert!(!refused.status.success(), "bound cluster-admin: {}", stdout(&refused));
}

#[test]
fn the_chart_onboards_listed_namespaces_and_grants_the_slices_to_them_alone() {
    let Some(cp) = controlplane::private() else { return };
    let (listed, unlisted) = (unique("tenant-listed"), unique("tenant-unlisted"));
    for ns in ["drafs-system", &listed, &unlisted] {
        namespace(&cp, ns);
    }
    let values = format!("tenants.resourceSlices=namespaces,tenants.namespaces={{{listed}}}");
    let install = ["install", "drafs", "deploy/helm/drafs", "--namespace", "drafs-system", "--set", &values];
    support::helm::ok(&cp, &install);
    for (verb, resource) in
        [("get", "pods"), ("watch", "pods"), ("list", "resourceclaims.resource.k8s.io"), ("create", "events")]
    {
        assert!(can(&cp, (&listed, "drafs"), verb, resource, &listed), "{verb} {resource}");
    }
    assert!(can(&cp, (&listed, "drafs"), "list", "resourceslices.resource.k8s.io", &listed));
    assert!(can(&cp, (&listed, "default"), "watch", "resourceslices.resource.k8s.io", &listed), "any account of it");
    assert!(!can(&cp, (&unlisted, "default"), "list", "resourceslices.resource.k8s.io", &unlisted));
    assert!(!can(&cp, (&listed, "drafs"), "get", "pods", &unlisted));

    // Uninstalled: the grants and the account the chart made go with it.
    support::helm::ok(&cp, &["uninstall", "drafs", "--namespace", "drafs-system", "--wait"]);
    let gone = wait_for(LIMIT, || !can(&cp, (&listed, "drafs"), "get", "pods", &listed));
    assert!(gone, "the RoleBinding outlived the release");
    assert!(!can(&cp, (&listed, "default"), "list", "resourceslices.resource.k8s.io", &listed));
    let account =
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "drafs", "namespace": listed}});
    assert!(wait_for(LIMIT, || cp.get(&account).is_none()), "the chart's ServiceAccount outlived the release");

    // Without the roles, nothing may bind them.
    let out = support::helm::run(&cp, &["template", "drafs", "deploy/helm/drafs", "--set", "tenants.roles=false"]);
    assert!(!out.status.success(), "rendered bindings of roles it does not make");
    assert!(stderr(&out).contains("need tenants.roles"), "{}", stderr(&out));
    let none = "tenants.roles=false,tenants.resourceSlices=none";
    let rendered = support::helm::ok(&cp, &["template", "drafs", "deploy/helm/drafs", "--set", none]);
    assert!(!rendered.contains("drafs-tenant"), "{rendered}");
}
