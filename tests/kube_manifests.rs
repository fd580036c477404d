//! The kube tier, what drafs ships: every example and the RBAC accepted by
//! the real API server and kubectl, `drafs inject`'s output read by kubectl as
//! its input plus drafs, and Pod Security admitting injected pods. Same control
//! plane and rules as kube.rs.

use drafs_test_support as support;

use std::time::Duration;

use serde_json::{Value, json};
use support::cluster::Scenario;
use support::controlplane::{self, ControlPlane};
use support::*;

const LIMIT: Duration = Duration::from_secs(120);

/// KubeVirt's VirtualMachineInstance kind, schema-less (KubeVirt itself is not
/// here): enough for kubectl to apply a VMI example with strict validation of
/// everything but the VMI's spec.
fn install_vmi_crd(cp: &ControlPlane) {
    cp.ensure(&json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "virtualmachineinstances.kubevirt.io"},
        "spec": {"group": "kubevirt.io", "scope": "Namespaced",
            "names": {"plural": "virtualmachineinstances", "singular": "virtualmachineinstance", "kind": "VirtualMachineInstance", "shortNames": ["vmi"]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }));
    let ready = wait_for(LIMIT, || cp.kubectl(&["get", "virtualmachineinstances", "-A"]).status.success());
    assert!(ready, "the VirtualMachineInstance CRD never became usable");
}

/// The offline inputs (dumps of what a cluster holds, server-set fields
/// aside) are objects the API server accepts.
#[test]
fn every_offline_example_is_accepted_by_the_api_server() {
    let Some(cp) = controlplane::shared() else { return };
    let mut failures = Vec::new();
    let mut checked = 0;
    let mut files: Vec<_> = std::fs::read_dir(repo_path("examples/offline"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    for path in files {
        let rel = path.strip_prefix(repo_path("")).unwrap().display().to_string();
        let docs = yaml_docs(&std::fs::read_to_string(&path).unwrap());
        // The namespaces and service accounts these objects live in.
        let namespaces = docs.iter().filter_map(|d| d["metadata"]["namespace"].as_str()).chain(["default"]);
        for ns in namespaces {
            cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
            for sa in ["default", "drafs"] {
                cp.ensure(
                    &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}}),
                );
            }
        }
        for doc in &docs {
            let mut object = doc.clone();
            if let Some(meta) = object["metadata"].as_object_mut() {
                for f in ["uid", "resourceVersion", "generation", "creationTimestamp"] {
                    meta.remove(f);
                }
            }
            if let Some(o) = object.as_object_mut() {
                o.remove("status");
            }
            checked += 1;
            // 409 AlreadyExists comes after validation and admission passed.
            let result =
                cp.dry_run_create(&object).or_else(|e| if e.starts_with("HTTP 409") { Ok(()) } else { Err(e) });
            // Before 1.36 a slice with list-typed attributes is refused (docs/compatibility.md).
            let lists = ["\"ints\"", "\"strings\"", "\"bools\"", "\"versions\""];
            let has_lists = doc["kind"] == "ResourceSlice" && lists.iter().any(|l| doc["spec"].to_string().contains(l));
            match (result, controlplane::minor() < 36 && has_lists) {
                (Ok(()), false) => {}
                (Err(e), true) if e.contains("unknown field") => {}
                (Ok(()), true) => failures.push(format!(
                    "{rel}: {} {}: accepted with list-typed attributes",
                    doc["kind"], doc["metadata"]["name"]
                )),
                (Err(e), _) => failures.push(format!("{rel}: {} {}: {e}", doc["kind"], doc["metadata"]["name"])),
            }
        }
    }
    assert!(checked >= 10, "only {checked} objects checked");
    assert!(failures.is_empty(), "the API server refuses:\n{}", failures.join("\n"));
}

/// Every example directory as the README applies it, `kubectl apply -f
/// examples/NAME/`, with kubectl built from the same module: its Namespace
/// and RBAC for real, then the whole directory as a server-side dry run with strict validation, and no
/// Pod Security warning in a namespace that enforces the restricted level.
#[test]
fn every_example_directory_is_accepted_by_kubectl_apply() {
    let Some(cp) = controlplane::shared() else { return };
    let mut dirs: Vec<_> = std::fs::read_dir(repo_path("examples"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir() && e.file_name() != "offline")
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let mut failures = Vec::new();
    for dir in &dirs {
        let rel = dir.strip_prefix(repo_path("")).unwrap().display().to_string();
        if std::fs::read_dir(dir).unwrap().flatten().any(|f| {
            read(&format!("{rel}/{}", f.file_name().to_string_lossy())).contains("kind: VirtualMachineInstance")
        }) {
            install_vmi_crd(cp);
        }
        // A dry run creates nothing, and a pod's service account must exist.
        for first in ["00-namespace.yaml", "10-rbac.yaml"].map(|f| dir.join(f)).iter().filter(|f| f.exists()) {
            let out = cp.kubectl(&["apply", "-f", first.to_str().unwrap()]);
            assert!(out.status.success(), "{rel}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let out = cp.kubectl(&["apply", "-f", &rel, "--dry-run=server", "--validate=strict"]);
        let err = String::from_utf8_lossy(&out.stderr);
        let applied = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || err.contains("PodSecurity") || !applied.contains(" created (server dry run)") {
            failures.push(format!("{rel}: {err}{applied}"));
        }
    }
    assert!(dirs.len() >= 5, "{dirs:?}");
    assert!(failures.is_empty(), "kubectl apply refuses:\n{}", failures.join("\n"));
}

#[test]
fn rbac_from_drafs_manifests_for_two_namespaces_works_in_both() {
    let Some(cp) = controlplane::shared() else { return };
    let mut scenarios = Vec::new();
    for _ in 0..2 {
        let mut sc = Scenario::from_fixture(cp, &read("examples/offline/gpu-training.yaml"));
        let out = std::process::Command::new(drafs_bin())
            .args(["manifests", "rbac", "--namespace", &sc.namespace, "--events"])
            .output()
            .unwrap();
        assert_ok(&out);
        // Applied as printed: every object but the shared ClusterRole is created new
        // (a name used by the other namespace's install would be refused with 409).
        cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": sc.namespace}}));
        cp.ensure(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": sc.namespace}}));
        for doc in yaml_docs(&stdout(&out)) {
            if doc["kind"] == "ClusterRole" {
                cp.ensure(&doc);
            } else {
                cp.create(&doc);
            }
        }
        sc.create_all_after_rbac();
        scenarios.push(sc);
    }
    for sc in &scenarios {
        let dir = sc.path("dra");
        let out = run_captured(sc.kubeconfig_command(&["init", "--dir", dir.to_str().unwrap(), "--events=all"]), LIMIT);
        assert_ok(&out);
        assert!(!stderr(&out).contains("cannot create events"), "{}", stderr(&out));
        assert_eq!(read_tree(&dir)["gpu/gpu/0/uuid"], "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b");
        // Each namespace's binding is its own, untouched by the other's install.
        let binding = cp
            .get(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": format!("drafs-resourceslices-{}", sc.namespace)}}))
            .expect("the namespace's ClusterRoleBinding");
        assert_eq!(binding["subjects"][0]["namespace"], json!(sc.namespace));
    }
}

/// `kubectl` with the output of `drafs manifests rbac ARGS` on its stdin.
fn kubectl_rbac(cp: &ControlPlane, verb: &[&str], args: &[&str]) {
    let out = std::process::Command::new(drafs_bin()).args(["manifests", "rbac"]).args(args).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rbac.yaml");
    std::fs::write(&file, stdout(&out)).unwrap();
    let mut all = verb.to_vec();
    all.extend(["-f", file.to_str().unwrap()]);
    let done = cp.kubectl(&all);
    assert!(done.status.success(), "kubectl {verb:?}: {}", stderr(&done));
}

/// What `kubectl auth can-i VERB RESOURCE --as` the namespace's account says, for
/// each verb drafs needs.
fn can_drafs(cp: &ControlPlane, ns: &str, account: &str) -> Vec<bool> {
    [("get", "pods"), ("list", "resourceclaims.resource.k8s.io"), ("list", "resourceslices.resource.k8s.io")]
        .iter()
        .map(|(verb, resource)| {
            let out = cp.kubectl(&[
                "auth",
                "can-i",
                verb,
                resource,
                "-n",
                ns,
                "--as",
                &format!("system:serviceaccount:{ns}:{account}"),
            ]);
            stdout(&out).trim() == "yes"
        })
        .collect()
}

#[test]
fn rbac_for_two_accounts_composes_and_deleting_one_removes_exactly_its_grants() {
    let Some(cp) = controlplane::shared() else { return };
    let (ml, hpc) = (support::cluster::unique("rbac-ml"), support::cluster::unique("rbac-hpc"));
    for ns in [&ml, &hpc] {
        cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
        kubectl_rbac(cp, &["apply"], &["--namespace", ns, "--events"]);
    }
    cp.ensure(
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer-sa", "namespace": ml}}),
    );
    kubectl_rbac(cp, &["apply"], &["--namespace", &ml, "--service-account", "trainer-sa", "--events"]);
    let all = vec![true, true, true];
    assert_eq!(can_drafs(cp, &ml, "drafs"), all, "the first account lost its rights to the second");
    assert_eq!(can_drafs(cp, &ml, "trainer-sa"), all);

    // Removing one account's grants leaves the other account's and the other namespace's.
    kubectl_rbac(cp, &["delete"], &["--namespace", &ml, "--service-account", "trainer-sa", "--events"]);
    assert_eq!(can_drafs(cp, &ml, "trainer-sa"), vec![false, false, false]);
    assert_eq!(can_drafs(cp, &ml, "drafs"), all);
    assert_eq!(can_drafs(cp, &hpc, "drafs"), all);
    let account =
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer-sa", "namespace": ml}});
    assert!(cp.get(&account).is_some(), "the user's own account was deleted with drafs's grants");
    kubectl_rbac(cp, &["delete"], &["--namespace", &ml, "--events"]);
    assert_eq!(can_drafs(cp, &ml, "drafs"), vec![false, false, false]);
    assert_eq!(can_drafs(cp, &hpc, "drafs"), all, "another namespace lost its rights");
}

#[test]
fn an_injected_pod_gives_credentials_to_drafs_alone() {
    let Some(cp) = controlplane::shared() else { return };
    let ns = support::cluster::unique("inject");
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    let out = std::process::Command::new(drafs_bin()).args(["manifests", "rbac", "--namespace", &ns]).output().unwrap();
    for doc in yaml_docs(&stdout(&out)) {
        cp.ensure(&doc);
    }
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: trainer, namespace: {ns}}}\nspec:\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: single-gpu}}]\n  containers:\n  - name: app\n    image: registry.example/app:1\n    resources: {{claims: [{{name: gpu}}]}}\n"
    );
    let injected = yaml_docs(&inject_text("sidecar-files", &pod)).remove(0);
    // Created for real: the ServiceAccount admission plugin decides what each container gets.
    let stored = cp.create(&injected);
    let spec = &stored["spec"];
    assert_eq!(spec["serviceAccountName"], "drafs");
    let mounts = |c: &Value| -> Vec<String> {
        c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["mountPath"].as_str().unwrap().to_string())
            .collect()
    };
    let sa_path = "/var/run/secrets/kubernetes.io/serviceaccount";
    let drafs = spec["initContainers"].as_array().unwrap().iter().find(|c| c["name"] == "drafs").unwrap();
    assert!(mounts(drafs).contains(&sa_path.to_string()), "{drafs}");
    let app = spec["containers"].as_array().unwrap().iter().find(|c| c["name"] == "app").unwrap();
    assert!(!mounts(app).iter().any(|m| m.starts_with(sa_path)), "the app got credentials: {app}");
    let volumes = spec["volumes"].as_array().unwrap();
    assert!(!volumes.iter().any(|v| v["name"].as_str().unwrap().starts_with("kube-api-access")), "{volumes:?}");
}

/// A namespace whose ResourceQuota covers `limits.cpu` (no LimitRange
/// default) refuses a pod whose drafs container sets none, as the real quota
/// admission says; `inject --cpu-limit` (the webhook's flag, the chart's
/// injectedResources) gets it admitted.
#[test]
fn a_quota_on_cpu_limits_admits_drafs_given_its_limit() {
    let Some(cp) = controlplane::shared() else { return };
    let ns = support::cluster::unique("quota");
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    cp.ensure(&json!({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "limits", "namespace": ns},
        "spec": {"hard": {"limits.cpu": "4", "limits.memory": "4Gi"}},
    }));
    // What the quota controller writes (this control plane runs none): the
    // admission plugin decides from the status.
    let status = json!({"status": {"hard": {"limits.cpu": "4", "limits.memory": "4Gi"},
                                   "used": {"limits.cpu": "0", "limits.memory": "0"}}});
    let patched = cp.kubectl(&[
        "patch",
        "resourcequota",
        "limits",
        "-n",
        &ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
    assert_ok(&patched);
    let out = std::process::Command::new(drafs_bin()).args(["manifests", "rbac", "--namespace", &ns]).output().unwrap();
    for doc in yaml_docs(&stdout(&out)) {
        cp.ensure(&doc);
    }
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: single-gpu}}]\n  containers:\n  - name: app\n    image: registry.example/app:1\n    resources: {{claims: [{{name: gpu}}], limits: {{cpu: 500m, memory: 256Mi}}}}\n"
        )
    };
    let scratch = tempfile::tempdir().unwrap();
    let create = |manifest: &str| {
        let file = scratch.path().join("pod.yaml");
        std::fs::write(&file, manifest).unwrap();
        cp.kubectl(&["create", "-f", file.to_str().unwrap()])
    };
    let refused = stderr(&create(&inject_text("init", &pod("plain"))));
    assert!(
        refused.contains("must specify limits.cpu"),
        "the quota did not refuse drafs without a CPU limit: {refused}"
    );
    assert!(refused.contains("drafs"), "the container is named: {refused}");
    let out = drafs_with_stdin(
        &["inject", "--mode", "init", "--image", "registry.example/drafs:test", "--cpu-limit", "100m"],
        &pod("limited"),
    );
    assert_ok(&out);
    let created = create(&stdout(&out));
    assert_ok(&created);
}

/// `drafs inject --mode MODE` of `input`, with a fixed image.
fn inject_text(mode: &str, input: &str) -> String {
    let out = drafs_with_stdin(&["inject", "--mode", mode, "--image", "registry.example/drafs:test"], input);
    assert_ok(&out);
    stdout(&out)
}

/// The objects kubectl reads from a manifest file (YAML 1.1, go-yaml v2), as it prints them.
fn kubectl_reads(cp: &ControlPlane, file: &std::path::Path) -> Vec<Value> {
    let out = cp.kubectl(&["create", "--dry-run=client", "-o", "json", "-f", file.to_str().unwrap()]);
    assert_ok(&out);
    let mut objects = Vec::new();
    for v in serde_json::Deserializer::from_str(&stdout(&out)).into_iter::<Value>() {
        let v = v.unwrap();
        match v["kind"].as_str() {
            Some("List") => objects.extend(v["items"].as_array().unwrap().iter().cloned()),
            _ => objects.push(v),
        }
    }
    objects
}

/// What kubectl reads from `drafs inject`'s output is what it reads from the
/// input plus what drafs adds (injected into kubectl's own reading, as the
/// webhook does), for a corpus of scalars YAML 1.1 and 1.2 read differently;
/// and the API server takes the output (server-side dry run, strict).
#[test]
fn kubectl_reads_an_injected_manifest_as_the_input_plus_drafs() {
    let Some(cp) = controlplane::shared() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let input = repo_path("tests/inject/scalars.yaml");
    let before = kubectl_reads(cp, &input);
    assert_eq!(before.len(), 3, "{before:?}");
    // kubectl really reads YAML 1.1 here: the premise of the corpus.
    let spec = &before[0]["spec"]["template"]["spec"];
    assert_eq!(spec["volumes"][0]["configMap"]["defaultMode"], 420, "{spec}");
    assert_eq!(spec["containers"][0]["volumeMounts"][0]["readOnly"], true);
    assert_eq!(before[2]["data"]["true"], "a key that YAML 1.1 reads as true");
    for (mode, m) in [
        ("init", drafs::admission::inject::Mode::Init),
        ("sidecar-files", drafs::admission::inject::Mode::SidecarFiles),
        ("sidecar-fuse", drafs::admission::inject::Mode::SidecarFuse),
    ] {
        let output = scratch.path().join(format!("{mode}.yaml"));
        std::fs::write(&output, inject_text(mode, &read("tests/inject/scalars.yaml"))).unwrap();
        let after = kubectl_reads(cp, &output);
        let opts = drafs::admission::inject::Options::new(m, "registry.example/drafs:test");
        let mut expected = before.clone();
        for object in &mut expected {
            drafs::admission::inject::inject_value(object, &opts, &mut Vec::new()).unwrap();
        }
        assert_eq!(after.len(), expected.len());
        for (a, e) in after.iter().zip(&expected) {
            assert_eq!(a, e, "{mode}: kubectl reads {} differently after drafs inject", e["metadata"]["name"]);
        }
        let created = cp.kubectl(&["create", "--dry-run=server", "--validate=strict", "-f", output.to_str().unwrap()]);
        assert_ok(&created);
    }
}

/// The restricted Pod Security Standard, enforced by the real PodSecurity
/// admission: a pod it admits without drafs is admitted (and stored) after
/// `drafs inject --mode init` and `--mode sidecar-files`, whether the pod sets
/// its security context at pod level or per container; the FUSE sidecar is
/// denied with a message naming `privileged`, never a pod stuck in Init.
#[test]
fn a_restricted_namespace_admits_injected_pods_and_denies_fuse_naming_privileged() {
    let Some(cp) = controlplane::shared() else { return };
    let ns = support::cluster::unique("restricted");
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}}));
    // No controller manager here: the namespace's default account, made by hand.
    cp.ensure(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}}));
    let out = std::process::Command::new(drafs_bin()).args(["manifests", "rbac", "--namespace", &ns]).output().unwrap();
    for doc in yaml_docs(&stdout(&out)) {
        cp.ensure(&doc);
    }
    let restricted_app = "{allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}";
    let pods = [
        // The pod says runAsNonRoot and seccomp once for all its containers.
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: pod-level, namespace: {ns}}}\nspec:\n  securityContext: {{runAsNonRoot: true, runAsUser: 1000, seccompProfile: {{type: RuntimeDefault}}}}\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: single-gpu}}]\n  containers:\n  - name: app\n    image: registry.example/app:1\n    resources: {{claims: [{{name: gpu}}]}}\n    securityContext: {restricted_app}\n"
        ),
        // Each container says it for itself: so must drafs's.
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: per-container, namespace: {ns}}}\nspec:\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: single-gpu}}]\n  containers:\n  - name: app\n    image: registry.example/app:1\n    resources: {{claims: [{{name: gpu}}]}}\n    securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}, runAsNonRoot: true, runAsUser: 1000, seccompProfile: {{type: RuntimeDefault}}}}\n"
        ),
    ];
    for pod in &pods {
        let plain = yaml_docs(pod).remove(0);
        let name = plain["metadata"]["name"].as_str().unwrap().to_string();
        cp.dry_run_create(&plain).unwrap_or_else(|e| panic!("{name} without drafs is not restricted-compliant: {e}"));
        for mode in ["init", "sidecar-files"] {
            let mut injected = yaml_docs(&inject_text(mode, pod)).remove(0);
            injected["metadata"]["name"] = json!(format!("{name}-{mode}"));
            // Created for real, through PodSecurity admission.
            let stored =
                match cp.raw("POST", &format!("/api/v1/namespaces/{ns}/pods"), Some(&injected), "application/json") {
                    Ok((200, text)) => serde_json::from_str::<Value>(&text).unwrap(),
                    other => panic!("{name}, {mode}: the restricted namespace refused the injected pod: {other:?}"),
                };
            let drafs = &stored["spec"]["initContainers"][0];
            assert_eq!(drafs["name"], "drafs");
            assert_eq!(drafs["securityContext"]["runAsNonRoot"], true, "{drafs}");
            assert_eq!(drafs["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "{drafs}");
        }
        let mut fuse = yaml_docs(&inject_text("sidecar-fuse", pod)).remove(0);
        fuse["metadata"]["name"] = json!(format!("{name}-fuse"));
        match cp.raw("POST", &format!("/api/v1/namespaces/{ns}/pods"), Some(&fuse), "application/json") {
            Ok((403, message)) => {
                assert!(message.contains("PodSecurity") && message.contains("privileged"), "{name}: {message}")
            }
            other => panic!("{name}: a FUSE sidecar in a restricted namespace was not denied: {other:?}"),
        }
    }
}
