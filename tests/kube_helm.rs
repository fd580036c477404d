//! The Helm chart (deploy/helm/drafs) with a real helm, built from its Go
//! module, against the real kube-apiserver of the kube tier: lint, render,
//! server-side validation under the restricted Pod Security level, and
//! install, upgrade and uninstall.

use drafs_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Value, json};
use support::controlplane::{self, ControlPlane};
use support::*;

const CHART: &str = "deploy/helm/drafs";

use support::helm::{find, ok as helm_ok, template as render};

fn kinds_and_names(docs: &[Value]) -> BTreeSet<(String, String)> {
    docs.iter()
        .map(|d| (d["kind"].as_str().unwrap().to_string(), d["metadata"]["name"].as_str().unwrap().to_string()))
        .collect()
}

fn restricted_namespace(cp: &ControlPlane, name: &str) {
    cp.ensure(&json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
    }));
}

/// Apply documents with kubectl (dry run on the server when asked); its output.
fn kubectl_apply(cp: &ControlPlane, docs: &[Value], dry_run: bool) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("objects.json");
    std::fs::write(&file, json!({"apiVersion": "v1", "kind": "List", "items": docs}).to_string()).unwrap();
    let mut args = vec!["apply", "--validate=strict", "-f", file.to_str().unwrap()];
    if dry_run {
        args.push("--dry-run=server");
    }
    cp.kubectl(&args)
}

#[test]
fn the_chart_lints_and_renders_the_kustomize_base_with_one_image_setting() {
    let Some(cp) = controlplane::shared() else { return };
    let lint = helm_ok(cp, &["lint", CHART, "--strict"]);
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    // The same objects as the kustomize base with its manual certificate.
    let docs = render(cp, &[]);
    let rendered = kinds_and_names(&docs);
    for object in [
        ("Deployment", "drafs-webhook"),
        ("Service", "drafs-webhook"),
        ("ServiceAccount", "drafs-webhook"),
        ("PodDisruptionBudget", "drafs-webhook"),
        ("MutatingWebhookConfiguration", "drafs"),
        ("Secret", "drafs-webhook-tls"),
    ] {
        assert!(rendered.contains(&(object.0.to_string(), object.1.to_string())), "{object:?} not in {rendered:?}");
    }
    let kustomized = cp.kubectl(&["kustomize", repo_path("deploy/webhook/core").to_str().unwrap()]);
    assert!(kustomized.status.success(), "{}", stderr(&kustomized));
    for (kind, name) in kinds_and_names(&yaml_docs(&stdout(&kustomized))) {
        // The chart leaves the namespace to `helm install --create-namespace`.
        if kind != "Namespace" {
            assert!(rendered.contains(&(kind.clone(), name.clone())), "the chart lacks {kind} {name}");
        }
    }

    // Valid for the real API server, and the webhook's pods meet restricted.
    restricted_namespace(cp, "drafs-system");
    let applied = kubectl_apply(cp, &docs, true);
    assert!(applied.status.success(), "{}", stderr(&applied));
    assert!(!stderr(&applied).contains("PodSecurity"), "{}", stderr(&applied));

    // One image setting reaches the webhook and the container it injects.
    let docs = render(cp, &["--set", "image.repository=registry.example/drafs", "--set", "image.tag=1.2.3"]);
    let container = &find(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example/drafs:1.2.3");
    let env = container["env"].as_array().unwrap();
    assert!(env.iter().any(|e| e["name"] == "DRAFS_IMAGE" && e["value"] == "registry.example/drafs:1.2.3"), "{env:?}");

    // A private registry: a mirror before the repository, the image by
    // digest, pull secrets for the chart's own pods; the same reference for
    // the webhook, what it injects and the node agent.
    let digest = format!("sha256:{}", "0a".repeat(32));
    let docs = render(
        cp,
        &[
            "--set",
            "node.enabled=true",
            "--set",
            "image.registry=mirror.internal:5000",
            "--set",
            &format!("image.digest={digest}"),
            "--set",
            "imagePullSecrets[0]=regcred",
            "--set",
            "imagePullSecrets[1].name=other",
        ],
    );
    let reference = format!("mirror.internal:5000/drafs:0.1.0@{digest}");
    let guard = &find(&docs, "Pod")["spec"];
    for (kind, pod) in [
        ("Deployment", &find(&docs, "Deployment")["spec"]["template"]["spec"]),
        ("DaemonSet", &find(&docs, "DaemonSet")["spec"]["template"]["spec"]),
        ("the uninstall guard's Pod", guard),
    ] {
        assert_eq!(pod["containers"][0]["image"], reference.as_str(), "{kind}");
        assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}, {"name": "other"}]), "{kind}");
    }
    let env = find(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"].clone();
    assert!(env.as_array().unwrap().iter().any(|e| e["name"] == "DRAFS_IMAGE" && e["value"] == reference.as_str()));
    let out = helm::run(cp, &["template", "drafs", CHART, "--set", "image.digest=latest"]);
    assert!(stderr(&out).contains("at '/image/digest'"), "{}", stderr(&out));

    // The agent's pods take the options the webhook's take.
    let docs = render(
        cp,
        &[
            "--set",
            "node.enabled=true",
            "--set",
            "node.podLabels.team=gpu",
            "--set",
            "node.podAnnotations.owner=platform",
            "--set",
            "node.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=gpu",
            "--set",
            "node.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        ],
    );
    let template = &find(&docs, "DaemonSet")["spec"]["template"];
    assert_eq!(template["metadata"]["labels"]["team"], "gpu");
    assert_eq!(template["metadata"]["annotations"]["owner"], "platform");
    let terms = &template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"], "gpu");
    assert!(template["spec"].get("imagePullSecrets").is_none(), "none unless asked");

    // The injected container's resources: drafs's defaults, a CPU limit added.
    let args = webhook_args(&render(cp, &["--set", "injectedResources.limits.cpu=100m"]));
    for arg in ["--cpu-request=10m", "--memory-request=16Mi", "--cpu-limit=100m", "--memory-limit=32Mi"] {
        assert!(args.contains(&arg.to_string()), "{arg} not in {args:?}");
    }

    // The settings a platform team sets.
    let docs = render(
        cp,
        &[
            "--set",
            "failurePolicy=Ignore",
            "--set",
            "priorityClassName=system-cluster-critical",
            "--set",
            "replicas=3",
            "--set",
            "nodeSelector.role=infra",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "networkPolicy.enabled=true",
        ],
    );
    let config = find(&docs, "MutatingWebhookConfiguration");
    assert!(config["webhooks"].as_array().unwrap().iter().all(|w| w["failurePolicy"] == "Ignore"), "{config}");
    let spec = &find(&docs, "Deployment")["spec"];
    assert_eq!(spec["replicas"], 3);
    assert_eq!(spec["template"]["spec"]["priorityClassName"], "system-cluster-critical");
    assert_eq!(spec["template"]["spec"]["nodeSelector"]["role"], "infra");
    let ports = find(&docs, "Service")["spec"]["ports"].clone();
    assert!(ports.as_array().unwrap().iter().any(|p| p["name"] == "metrics" && p["port"] == 9090), "{ports}");
    assert_eq!(find(&docs, "ServiceMonitor")["spec"]["endpoints"][0]["port"], "metrics");
    find(&docs, "NetworkPolicy");
}

#[test]
fn the_cert_manager_route_keeps_one_ca_across_renewals() {
    let Some(cp) = controlplane::shared() else { return };
    let chart = render(cp, &["--set", "certificate.source=cert-manager"]);
    assert_ca_chain(&chart);
    // The kustomize route (deploy/webhook) as the README applies it: the same chain.
    let kustomized = cp.kubectl(&["kustomize", repo_path("deploy/webhook").to_str().unwrap()]);
    assert!(kustomized.status.success(), "{}", stderr(&kustomized));
    assert_ca_chain(&yaml_docs(&stdout(&kustomized)));
}

/// GitOps tools render the chart with `helm template`, where `lookup` finds
/// nothing: the generated certificate is new at every render (so its route
/// drifts, as docs/deploy.md says), while the cert-manager and secret routes
/// render the same objects every time, with node mode, monitoring and the
/// tenants' roles on.
#[test]
fn the_cert_manager_and_secret_routes_render_the_same_objects_twice() {
    let Some(cp) = controlplane::shared() else { return };
    let everything = "node.enabled=true,node.metricsBindAddress=0.0.0.0,node.podMonitor.enabled=true,prometheusRule.enabled=true,dashboard.enabled=true,tenants.namespaces={ml}";
    let ca = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=";
    let secret = format!("certificate.source=secret,certificate.secretName=mine,certificate.caBundle={ca}");
    for route in ["certificate.source=cert-manager", secret.as_str()] {
        let args = ["--set", everything, "--set", route];
        assert_eq!(render(cp, &args), render(cp, &args), "{route}: two renders differ");
    }
    let generated = |docs: Vec<Value>| find(&docs, "Secret")["data"]["tls.crt"].clone();
    assert_ne!(
        generated(render(cp, &[])),
        generated(render(cp, &[])),
        "the generate route is stable now: say so in docs/deploy.md"
    );
}

/// The cert-manager objects of `docs`: selfSigned Issuer → CA Certificate →
/// CA Issuer → serving Certificate, whose CA renewals do not change, and
/// that CA injected into the configuration.
fn assert_ca_chain(docs: &[Value]) {
    let config = find(docs, "MutatingWebhookConfiguration");
    assert_eq!(config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "drafs-system/drafs-webhook");
    assert!(config["webhooks"][0]["clientConfig"]["caBundle"].is_null(), "cert-manager injects it");
    let by_name = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .clone()
    };
    let serving = by_name("Certificate", "drafs-webhook");
    assert_eq!(serving["spec"]["secretName"], "drafs-webhook-tls");
    assert!(serving["spec"]["dnsNames"].as_array().unwrap().contains(&json!("drafs-webhook.drafs-system.svc")));
    let ca_issuer = by_name("Issuer", serving["spec"]["issuerRef"]["name"].as_str().unwrap());
    let ca_secret = ca_issuer["spec"]["ca"]["secretName"].as_str().expect("a CA issuer").to_string();
    let ca = docs
        .iter()
        .find(|d| d["kind"] == "Certificate" && d["spec"]["secretName"] == ca_secret.as_str())
        .expect("a Certificate makes the CA");
    assert_eq!(ca["spec"]["isCA"], true);
    let root = by_name("Issuer", ca["spec"]["issuerRef"]["name"].as_str().unwrap());
    assert!(root["spec"]["selfSigned"].is_object(), "{root}");
    assert!(!kinds_and_names(docs).contains(&("Secret".into(), "drafs-webhook-tls".into())), "cert-manager writes it");
}

#[test]
fn bad_values_are_refused_with_the_reason() {
    let Some(cp) = controlplane::shared() else { return };
    for (set, reason) in [
        ("certificate.source=vault", "certificate.source must be generate, cert-manager or secret"),
        ("failurePolicy=Sometimes", "failurePolicy must be Fail or Ignore"),
        ("certificate.source=secret", "certificate.secretName is required"),
        ("certificate.source=secret,certificate.secretName=mine", "certificate.caBundle (base64 PEM"),
        ("namespaceMode=sidecar", "namespaceMode must be init, sidecar-files, sidecar-fuse or csi, not \"sidecar\""),
        // Its pods' volume would have no driver: they would never start.
        ("namespaceMode=csi", "namespaceMode csi needs node.enabled=true"),
    ] {
        let out = helm::run(cp, &["template", "drafs", CHART, "--set", set]);
        assert!(!out.status.success(), "{set} was rendered");
        assert!(stderr(&out).contains(reason), "{set}: {}", stderr(&out));
    }
    // values.schema.json: unknown keys, wrong types, values out of range.
    for (set, reason) in [
        ("replicaz=2", "additional properties 'replicaz' not allowed"),
        ("node.nri.enabeld=false", "additional properties 'enabeld' not allowed"),
        ("replicas=abc", "at '/replicas': got string, want integer"),
        ("timeoutSeconds=60", "at '/timeoutSeconds': maximum: got 60, want 30"),
        ("node.maxPods=-5", "at '/node/maxPods': minimum: got -5, want 1"),
        ("node.updateStrategy.type=Foo", "at '/node/updateStrategy/type': value must be one of"),
        ("node.nri.wait=soon", "at '/node/nri/wait'"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        // The check refuses no time at all: the guard would never pass.
        ("node.uninstallGuard.timeout=0s", "at '/node/uninstallGuard/timeout'"),
    ] {
        let out = helm::run(cp, &["template", "drafs", CHART, "--set", "node.enabled=true", "--set", set]);
        assert!(!out.status.success(), "{set} was rendered");
        assert!(stderr(&out).contains(reason), "{set}: {}", stderr(&out));
    }
    // What --set makes of two digits is a number: written back with its zero.
    let docs = render(cp, &["--set", "node.enabled=true", "--set", "node.nri.pluginIndex=5"]);
    let args = &find(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(args.as_array().unwrap().contains(&json!("--nri-plugin-index=05")), "{args}");
}

/// The webhook's arguments (`webhook`, `--flag=value`...).
fn webhook_args(docs: &[Value]) -> Vec<String> {
    let container = &find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
}

/// The CSIDriver's name is the chart's to choose (`node.driverName`): the
/// webhook is told it, so that the volumes it injects name a registered
/// driver and a pod with one is known to have drafs.
#[test]
fn the_webhook_names_the_csi_driver_the_chart_installs() {
    let Some(cp) = controlplane::shared() else { return };
    assert!(webhook_args(&render(cp, &[])).contains(&"--csi-driver=drafs.dev".to_string()));
    let docs = render(cp, &["--set", "node.enabled=true", "--set", "node.driverName=node.drafs.example"]);
    assert_eq!(find(&docs, "CSIDriver")["metadata"]["name"], "node.drafs.example");
    let args = webhook_args(&docs);
    assert!(args.contains(&"--csi-driver=node.drafs.example".to_string()), "{args:?}");
}

/// A PodDisruptionBudget that no drain can meet (minAvailable >= replicas)
/// is not made; namespaces that YAML would read as a boolean or a number
/// (`on`, `123`) stay strings in the NetworkPolicy.
#[test]
fn the_budget_follows_the_replicas_and_namespace_names_stay_strings() {
    let Some(cp) = controlplane::shared() else { return };
    let budget = |replicas: &str| {
        let docs = render(cp, &["--set", &format!("replicas={replicas}")]);
        docs.iter().find(|d| d["kind"] == "PodDisruptionBudget").map(|p| p["spec"]["minAvailable"].clone())
    };
    assert_eq!(budget("1"), None, "one replica: a budget of 1 would block every drain");
    assert_eq!(budget("2"), Some(json!(1)));
    assert_eq!(budget("3"), Some(json!(1)));
    let docs = render(
        cp,
        &[
            "--set",
            "networkPolicy.enabled=true",
            "--set-json",
            r#"networkPolicy.metricsFromNamespaces=["on","123","monitoring"]"#,
        ],
    );
    let policy = find(&docs, "NetworkPolicy");
    assert_eq!(docs.iter().filter(|d| d["kind"] == "NetworkPolicy").count(), 1, "the agent's only with node.enabled");
    let names: Vec<&Value> = policy["spec"]["ingress"][1]["from"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| &f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"])
        .collect();
    assert_eq!(names, vec![&json!("on"), &json!("123"), &json!("monitoring")]);
    restricted_namespace(cp, "drafs-system");
    let out = kubectl_apply(cp, std::slice::from_ref(policy), true);
    assert!(out.status.success(), "{}", stderr(&out));
    // The node agent: its probe port from anywhere (the kubelet's probes come
    // from the node), its metrics port from the namespaces named, once it
    // listens beyond the pod's loopback.
    let policy_of = |extra: &[&str]| {
        let mut args = vec!["--set", "networkPolicy.enabled=true", "--set", "node.enabled=true"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--set-json", r#"networkPolicy.metricsFromNamespaces=["monitoring"]"#]);
        let docs = render(cp, &args);
        docs.into_iter().find(|d| d["kind"] == "NetworkPolicy" && d["metadata"]["name"] == "drafs-node").unwrap()
    };
    let agent = policy_of(&[]);
    assert_eq!(agent["spec"]["policyTypes"], json!(["Ingress"]), "its API reads go out");
    assert_eq!(agent["spec"]["ingress"], json!([{"ports": [{"port": 9808, "protocol": "TCP"}]}]));
    let exposed = policy_of(&["--set", "node.metricsBindAddress=0.0.0.0"]);
    let metrics = &exposed["spec"]["ingress"][1];
    assert_eq!(metrics["ports"], json!([{"port": 9809, "protocol": "TCP"}]));
    assert_eq!(metrics["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "monitoring");
    let out = kubectl_apply(cp, std::slice::from_ref(&exposed), true);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// The PEM certificates of a Secret's key, decoded.
fn secret_pem(cp: &ControlPlane, name: &str, key: &str) -> Vec<u8> {
    let secret =
        cp.get(&json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "drafs-system"}}));
    let secret = secret.unwrap_or_else(|| panic!("no Secret {name}"));
    base64_decode(secret["data"][key].as_str().unwrap())
}

fn base64_decode(text: &str) -> Vec<u8> {
    let out =
        std::process::Command::new("sh").args(["-c", &format!("printf %s '{text}' | base64 -d")]).output().unwrap();
    assert!(out.status.success());
    out.stdout
}

/// `openssl verify` of a serving certificate against a CA bundle, checking
/// the name the API server calls.
fn verifies(dir: &Path, ca: &[u8], cert: &[u8], host: &str) -> Result<(), String> {
    std::fs::write(dir.join("ca.pem"), ca).unwrap();
    std::fs::write(dir.join("cert.pem"), cert).unwrap();
    let out = std::process::Command::new("openssl")
        .args(["verify", "-verify_hostname", host, "-CAfile"])
        .arg(dir.join("ca.pem"))
        .arg(dir.join("cert.pem"))
        .output()
        .unwrap();
    if out.status.success() { Ok(()) } else { Err(format!("{}{}", stdout(&out), stderr(&out))) }
}

fn ca_bundle(cp: &ControlPlane) -> Vec<u8> {
    let config = cp
        .get(&json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                     "metadata": {"name": "drafs"}}))
        .expect("the webhook configuration is installed");
    let bundles: BTreeSet<&str> = config["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["clientConfig"]["caBundle"].as_str().unwrap())
        .collect();
    assert_eq!(bundles.len(), 1, "every entry trusts the same CA: {config}");
    base64_decode(bundles.first().unwrap())
}

#[test]
fn install_upgrade_and_uninstall_keep_the_ca_and_remove_everything() {
    let Some(cp) = controlplane::private() else { return };
    let scratch = tempfile::tempdir().unwrap();
    restricted_namespace(&cp, "drafs-system");
    let host = "drafs-webhook.drafs-system.svc";
    helm_ok(&cp, &["install", "drafs", CHART, "--namespace", "drafs-system"]);
    let ca = ca_bundle(&cp);
    let leaf = secret_pem(&cp, "drafs-webhook-tls", "tls.crt");
    verifies(scratch.path(), &ca, &leaf, host).expect("the serving certificate verifies against caBundle");

    // An upgrade (a new image, more replicas) reissues the serving certificate
    // from the same CA: caBundle does not change, so no review is refused.
    helm_ok(
        &cp,
        &["upgrade", "drafs", CHART, "--namespace", "drafs-system", "--set", "replicas=3", "--set", "image.tag=0.2.0"],
    );
    assert_eq!(ca_bundle(&cp), ca, "caBundle changed on upgrade");
    let renewed = secret_pem(&cp, "drafs-webhook-tls", "tls.crt");
    verifies(scratch.path(), &ca, &renewed, host).expect("the reissued certificate verifies against caBundle");
    let deployment = cp
        .get(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
                     "metadata": {"name": "drafs-webhook", "namespace": "drafs-system"}}))
        .unwrap();
    assert_eq!(deployment["spec"]["replicas"], 3);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "drafs:0.2.0");
    assert!(container["env"].as_array().unwrap().iter().any(|e| e["value"] == "drafs:0.2.0"), "{container}");

    helm_ok(&cp, &["uninstall", "drafs", "--namespace", "drafs-system", "--wait"]);
    for (api, kind, name, ns) in [
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "drafs", None),
        ("apps/v1", "Deployment", "drafs-webhook", Some("drafs-system")),
        ("v1", "Secret", "drafs-webhook-tls", Some("drafs-system")),
        ("v1", "Secret", "drafs-webhook-ca", Some("drafs-system")),
    ] {
        let mut meta = json!({"name": name});
        if let Some(ns) = ns {
            meta["namespace"] = json!(ns);
        }
        let object = cp.get(&json!({"apiVersion": api, "kind": kind, "metadata": meta}));
        assert!(object.is_none(), "{kind} {name} left after uninstall");
    }
}

#[test]
fn node_enabled_installs_the_csi_driver_and_uninstall_removes_it() {
    let Some(cp) = controlplane::private() else { return };
    // The agent mounts into the kubelet's directories: a privileged namespace.
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "drafs-system"}}));
    let docs = render(&cp, &["--set", "node.enabled=true"]);
    let names = kinds_and_names(&docs);
    let node_objects = [
        ("storage.k8s.io/v1", "CSIDriver", "drafs.dev", None),
        ("apps/v1", "DaemonSet", "drafs-node", Some("drafs-system")),
        ("v1", "ServiceAccount", "drafs-node", Some("drafs-system")),
        ("rbac.authorization.k8s.io/v1", "ClusterRole", "drafs-node", None),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "drafs-node", None),
        ("rbac.authorization.k8s.io/v1", "Role", "drafs-node", Some("drafs-system")),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "drafs-node", Some("drafs-system")),
    ];
    for (_, kind, name, _) in node_objects {
        assert!(names.contains(&(kind.to_string(), name.to_string())), "{kind} {name} not in {names:?}");
    }
    assert!(
        !kinds_and_names(&render(&cp, &[])).iter().any(|(k, _)| k == "CSIDriver" || k == "DaemonSet"),
        "off by default"
    );
    // Through NRI (on by default) the agent reads as itself its node's pods,
    // their claims and which namespaces opt in (docs/nri.md), and its own
    // DaemonSet, by name; without NRI, only slices.
    let slices = json!({"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list", "watch"]});
    let named = |docs: &[Value], kind: &str, name: &str| {
        docs.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name).cloned().unwrap()
    };
    let role = named(&docs, "ClusterRole", "drafs-node");
    assert_eq!(
        role["rules"],
        json!([
            slices,
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        ])
    );
    let own = docs.iter().find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "drafs-node").unwrap();
    assert_eq!(
        own["rules"],
        json!([{"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": ["drafs-node"], "verbs": ["get"]}])
    );
    let without_nri = render(&cp, &["--set", "node.enabled=true", "--set", "node.nri.enabled=false"]);
    let role = named(&without_nri, "ClusterRole", "drafs-node");
    assert_eq!(role["rules"], json!([slices]));
    assert!(!kinds_and_names(&without_nri).contains(&("Role".into(), "drafs-node".into())));
    let driver = find(&docs, "CSIDriver");
    assert_eq!(driver["spec"]["volumeLifecycleModes"], json!(["Ephemeral"]));
    assert_eq!(driver["spec"]["tokenRequests"], json!([{"audience": ""}]));
    assert_eq!(driver["spec"]["podInfoOnMount"], true);
    assert_eq!(driver["spec"]["seLinuxMount"], true, "the kubelet's SELinux label honoured (request.rs, mounts.rs)");

    // The uninstall guard: pre-delete hooks only, an account that may list
    // pods and read the one CSIDriver, a pod that meets restricted (tests/realnode_csi.rs
    // runs it on a kubelet).
    let guard = "drafs-uninstall-guard";
    for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Pod"] {
        let hook = named(&docs, kind, guard);
        assert_eq!(hook["metadata"]["annotations"]["helm.sh/hook"], "pre-delete", "{kind}");
        assert!(
            hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"].as_str().unwrap().contains("hook-failed")
        );
    }
    assert_eq!(
        named(&docs, "ClusterRole", guard)["rules"],
        json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            {"apiGroups": ["storage.k8s.io"], "resources": ["csidrivers"], "resourceNames": ["drafs.dev"], "verbs": ["get"]},
        ])
    );
    let mut pod = named(&docs, "Pod", guard);
    let args = pod["spec"]["containers"][0]["args"].as_array().unwrap();
    assert_eq!(args[..3], [json!("check"), json!("--uninstall"), json!("--csi-driver=drafs.dev")]);
    assert_eq!(pod["metadata"]["labels"]["app.kubernetes.io/name"], guard, "no workload's selector adopts it");
    restricted_namespace(&cp, "guard-restricted");
    cp.ensure(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
                      "metadata": {"name": guard, "namespace": "guard-restricted"}}));
    pod["metadata"]["namespace"] = json!("guard-restricted");
    let applied = kubectl_apply(&cp, &[pod], true);
    assert!(applied.status.success() && !stderr(&applied).contains("PodSecurity"), "{}", stderr(&applied));
    let unguarded = render(&cp, &["--set", "node.enabled=true", "--set", "node.uninstallGuard.enabled=false"]);
    assert!(!kinds_and_names(&unguarded).iter().any(|(_, name)| name == guard));

    helm_ok(&cp, &["install", "drafs", CHART, "--namespace", "drafs-system", "--set", "node.enabled=true"]);
    // KEP-5538: the token in the request's secrets where the cluster has the field (1.35+).
    let installed =
        cp.get(&json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "drafs.dev"}}));
    let in_secrets = installed.unwrap()["spec"]["serviceAccountTokenInSecrets"].clone();
    assert_eq!(
        in_secrets,
        if controlplane::minor() >= 35 { json!(true) } else { Value::Null },
        "on 1.{}",
        controlplane::minor()
    );
    let meta = |name: &str, ns: Option<&str>| {
        let mut m = json!({"name": name});
        if let Some(ns) = ns {
            m["namespace"] = json!(ns);
        }
        m
    };
    for (api, kind, name, ns) in node_objects {
        let object = cp.get(&json!({"apiVersion": api, "kind": kind, "metadata": meta(name, ns)}));
        assert!(object.is_some(), "{kind} {name} not installed");
    }
    // No kubelet here to run the guard's pod: past it, as documented.
    helm_ok(&cp, &["uninstall", "drafs", "--namespace", "drafs-system", "--wait", "--no-hooks"]);
    for (api, kind, name, ns) in node_objects {
        let object = cp.get(&json!({"apiVersion": api, "kind": kind, "metadata": meta(name, ns)}));
        assert!(object.is_none(), "{kind} {name} left after uninstall");
    }
    let hook = cp.get(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta(guard, Some("drafs-system"))}));
    assert!(hook.is_none(), "--no-hooks ran the guard");
}

/// The agent as its peers run: Linux nodes only, three narrow host paths,
/// probed, a memory limit that holds every volume's tmpfs, the options
/// platforms ask for.
#[test]
fn the_node_agent_mounts_only_what_it_uses_is_probed_and_sized() {
    let Some(cp) = controlplane::private() else { return };
    let docs = render(&cp, &["--set", "node.enabled=true"]);
    let daemonset = find(&docs, "DaemonSet");
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(daemonset["spec"]["updateStrategy"]["type"], "RollingUpdate");
    let paths: BTreeSet<&str> =
        pod["volumes"].as_array().unwrap().iter().map(|v| v["hostPath"]["path"].as_str().unwrap()).collect();
    // The kubelet's own directories must exist (a wrong kubeletDir stops the
    // pod with the path); drafs's own are made.
    let types: BTreeMap<&str, &str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["hostPath"]["path"].as_str().unwrap(), v["hostPath"]["type"].as_str().unwrap()))
        .collect();
    assert_eq!(types["/var/lib/kubelet/pods"], "Directory");
    assert_eq!(types["/var/lib/kubelet/plugins_registry"], "Directory");
    assert_eq!(types["/var/lib/kubelet/plugins/drafs.dev"], "DirectoryOrCreate");
    let wanted = [
        "/var/lib/kubelet/pods",
        "/var/lib/kubelet/plugins/drafs.dev",
        "/var/lib/kubelet/plugins_registry",
        // NRI (on by default): the runtime's socket's directory, the agent's own trees.
        "/var/run/nri",
        "/var/run/drafs/nri",
    ];
    assert_eq!(paths, wanted.into_iter().collect(), "never the whole kubelet directory (its PKI)");
    let container = &pod["containers"][0];
    let bidirectional: Vec<&str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["mountPropagation"] == "Bidirectional")
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(bidirectional, ["/var/lib/kubelet/pods", "/var/run/drafs/nri"]);
    // Probed on a port of their own; /metrics on the pod's loopback only, unless asked.
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "healthz", "{probe}");
    }
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["ports"], json!([{"name": "healthz", "containerPort": 9808}]));
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    for arg in [
        "--max-pods=110",
        "--volume-size=12Mi",
        "--health-addr=0.0.0.0:9808",
        "--metrics-addr=127.0.0.1:9809",
        "--nri",
        "--nri-socket=/var/run/nri/nri.sock",
        "--nri-wait=500ms",
    ] {
        assert!(args.contains(&arg), "{arg} not in {args:?}");
    }
    // The agent reads the token only where the CSIDriver has the kubelet put it.
    let in_secrets = find(&docs, "CSIDriver")["spec"]["serviceAccountTokenInSecrets"] == json!(true);
    let token_in = if in_secrets { "--token-in=secrets" } else { "--token-in=volume-context" };
    assert!(args.contains(&token_in), "{token_in} not in {args:?}");
    let pinned = render(&cp, &["--set", "node.enabled=true", "--kube-version", "1.34.0"]);
    let args = &find(&pinned, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(args.as_array().unwrap().contains(&json!("--token-in=volume-context")), "1.34: {args}");
    // Every pod's tmpfs at their largest (the tree's and the standard view's
    // quarter: pages, and 1 KiB of kernel memory a file), and the agent; the
    // request what was measured at the cap.
    assert_eq!(container["resources"]["limits"]["memory"], "2328Mi");
    assert_eq!(container["resources"]["requests"]["memory"], "346Mi");
    let sized =
        render(&cp, &["--set", "node.enabled=true", "--set", "node.maxPods=20", "--set", "node.volumeSizeMi=2"]);
    let resources = &find(&sized, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!((&resources["limits"]["memory"], &resources["requests"]["memory"]), (&json!("288Mi"), &json!("76Mi")));
    let exposed = render(
        &cp,
        &[
            "--set",
            "node.enabled=true",
            "--set",
            "node.metricsBindAddress=0.0.0.0",
            "--set",
            "node.maxPodsPerNamespace=8",
        ],
    );
    let container = &find(&exposed, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    assert!(container["ports"].as_array().unwrap().iter().any(|p| p["name"] == "metrics"), "{container}");
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(args.contains(&"--metrics-addr=0.0.0.0:9809") && args.contains(&"--max-pods-per-namespace=8"), "{args:?}");
    let given = render(&cp, &["--set", "node.enabled=true", "--set", "node.resources.limits.memory=300Mi"]);
    assert_eq!(
        find(&given, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"],
        "300Mi"
    );
    let driver = find(&docs, "CSIDriver");
    assert_eq!(driver["metadata"]["labels"]["security.openshift.io/csi-ephemeral-volume-profile"], "restricted");
    assert!(!docs.iter().any(|d| d["kind"] == "ResourceQuota"), "no quota unless asked");
    let quota = render(&cp, &["--set", "node.enabled=true", "--set", "node.priorityClassQuota.enabled=true"]);
    let quota = find(&quota, "ResourceQuota");
    assert_eq!(quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"], json!(["system-node-critical"]));
    assert_eq!(quota["spec"]["hard"]["pods"], "1G", "never fewer agents than nodes");
    // What the chart renders for this cluster's version, its API server takes.
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "drafs-system"}}));
    let version = format!("1.{}.0", controlplane::minor());
    let for_cluster = render(&cp, &["--set", "node.enabled=true", "--kube-version", &version]);
    let node: Vec<Value> =
        for_cluster.into_iter().filter(|d| d["metadata"]["name"] == "drafs-node" || d["kind"] == "CSIDriver").collect();
    assert_eq!(node.len(), 7, "{node:?}");
    let out = kubectl_apply(&cp, &node, true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// How a test pod asks for devices.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Asks {
    Nothing,
    /// A resource claim.
    Claim,
    /// An extended resource a DeviceClass may back (KEP-5004), in an init container.
    Extended,
}

/// A pod asking for devices as said, with the given labels, for a
/// server-side dry-run create: what the API server would store, after admission.
fn pod(ns: &str, name: &str, labels: Value, asks: Asks) -> Value {
    let p = PodBuilder::new(ns, name).labels(labels);
    let app = |p: PodBuilder| p.container("app", "registry.example/app:1").limits(json!({"cpu": "1", "memory": "1Gi"}));
    match asks {
        Asks::Nothing => app(p),
        Asks::Claim => app(p.template_claim("gpu", "gpu")).uses("gpu"),
        Asks::Extended => {
            app(p).init_container("warm-up", "registry.example/app:1").limits(json!({"gpu.example.com/gpu": "1"}))
        }
    }
    .build()
}

/// The status of a server-side dry-run create of `pod`, and the answer's text.
fn dry_run_create(cp: &ControlPlane, pod: &Value) -> (u16, String) {
    let path = format!("/api/v1/namespaces/{}/pods?dryRun=All", pod["metadata"]["namespace"].as_str().unwrap());
    cp.raw("POST", &path, Some(pod), "application/json").unwrap()
}

/// The drafs container the API server would store for `pod` (none: `None`),
/// through a server-side dry-run create that runs the admission webhooks.
fn drafs_container(cp: &ControlPlane, pod: &Value) -> Option<Value> {
    let (code, text) = dry_run_create(cp, pod);
    assert!(code == 200 || code == 201, "HTTP {code}: {text}");
    let stored: Value = serde_json::from_str(&text).unwrap();
    stored["spec"]["initContainers"].as_array().into_iter().flatten().find(|c| c["name"] == "drafs").cloned()
}

#[test]
fn namespace_and_pod_labels_choose_who_gets_drafs() {
    let Some(cp) = controlplane::private() else { return };
    let metrics = format!("127.0.0.1:{}", free_port());
    let hook = webhook::WebhookProcess::start(&["--namespace-mode", "sidecar-files", "--metrics-addr", &metrics]);
    let reviewed = || webhook::reviews_answered(&http_get(&metrics, "/metrics").expect("metrics").1);
    let ca = std::fs::read(hook.ca()).unwrap();
    let ca = serde_json::to_value(k8s_openapi::ByteString(ca)).unwrap();
    restricted_namespace(&cp, "drafs-system");
    let url = format!("https://{}", hook.addr);
    helm_ok(
        &cp,
        &[
            "install",
            "drafs",
            CHART,
            "--namespace",
            "drafs-system",
            "--set",
            &format!("webhookURL={url}"),
            "--set",
            "certificate.source=secret",
            "--set",
            "certificate.secretName=unused",
            "--set",
            &format!("certificate.caBundle={}", ca.as_str().unwrap()),
        ],
    );
    for (name, labels) in [("opted-in", json!({"drafs.dev/inject": "enabled"})), ("plain", json!({}))] {
        cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}));
        // No controller-manager here: the accounts the pods run as, by hand.
        for account in ["default", "drafs"] {
            cp.ensure(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
                              "metadata": {"name": account, "namespace": name}}));
        }
    }
    let mode = |c: &Option<Value>| match c {
        None => "none",
        Some(c) if c["restartPolicy"] == "Always" => "sidecar",
        Some(_) => "init",
    };
    // The API server picks a new configuration up asynchronously.
    wait_until("the webhook configuration to take effect", std::time::Duration::from_secs(30), || {
        drafs_container(&cp, &pod("plain", "probe", json!({"drafs.dev/inject": "init"}), Asks::Claim)).is_some()
    });
    let cases = [
        // (namespace, pod labels, devices, what the pod gets, reviews the API server asks for)
        ("opted-in", json!({}), Asks::Claim, "sidecar", 1),
        ("opted-in", json!({}), Asks::Extended, "sidecar", 1),
        ("opted-in", json!({"drafs.dev/inject": "init"}), Asks::Claim, "init", 1),
        ("opted-in", json!({"drafs.dev/inject": "disabled"}), Asks::Claim, "none", 0),
        // Not even sent (matchConditions): a webhook outage cannot block it.
        ("opted-in", json!({}), Asks::Nothing, "none", 0),
        ("plain", json!({}), Asks::Claim, "none", 0),
        ("plain", json!({"drafs.dev/inject": "init"}), Asks::Claim, "init", 1),
        ("plain", json!({"drafs.dev/inject": "init"}), Asks::Extended, "init", 1),
        ("plain", json!({"drafs.dev/inject": "disabled"}), Asks::Claim, "none", 1),
    ];
    for (i, (ns, labels, asks, want, reviews)) in cases.iter().enumerate() {
        let before = reviewed();
        let got = drafs_container(&cp, &pod(ns, &format!("p{i}"), labels.clone(), *asks));
        assert_eq!(mode(&got), *want, "namespace {ns}, labels {labels}, {asks:?}: {got:?}");
        assert_eq!(reviewed() - before, *reviews, "reviews for namespace {ns}, labels {labels}, {asks:?}");
    }

    // The webhook is down (both replicas, a bad image, a NetworkPolicy): in the
    // opted-in namespace only the pods that would have got drafs are refused.
    drop(hook);
    let (code, text) = dry_run_create(&cp, &pod("opted-in", "web", json!({}), Asks::Nothing));
    assert!(code == 200 || code == 201, "a pod without devices is created: HTTP {code}: {text}");
    for asks in [Asks::Claim, Asks::Extended] {
        let (code, text) = dry_run_create(&cp, &pod("opted-in", "gpu", json!({}), asks));
        assert!(code >= 400 && text.contains("namespaces.drafs.dev"), "{asks:?}: HTTP {code}: {text}");
    }
}

/// `namespaceMode: csi` with `node.enabled` (and a renamed driver): the chart
/// renders it (helm lint too), the flags its webhook Deployment passes are
/// the ones `drafs webhook` takes (a webhook of the test's, run with them,
/// plays the Deployment, called by URL), and the real API server stores an
/// unlabelled pod of an opted-in namespace with a volume of the chart's
/// CSIDriver and no drafs container.
#[test]
fn namespace_mode_csi_gives_an_opted_in_namespaces_pods_the_volume_of_the_charts_driver() {
    let Some(cp) = controlplane::private() else { return };
    let driver = "node.drafs.example";
    let values = ["namespaceMode=csi", "node.enabled=true", &format!("node.driverName={driver}")];
    let sets: Vec<&str> = values.iter().flat_map(|v| ["--set", *v]).collect();
    let mut lint = vec!["lint", CHART, "--strict"];
    lint.extend(&sets);
    assert!(helm_ok(&cp, &lint).contains("0 chart(s) failed"));
    let args = webhook_args(&render(&cp, &sets));
    let flags: Vec<&str> = args
        .iter()
        .filter(|a| a.starts_with("--namespace-mode=") || a.starts_with("--csi-driver="))
        .map(String::as_str)
        .collect();
    assert_eq!(flags, ["--namespace-mode=csi", &format!("--csi-driver={driver}")]);
    let hook = webhook::WebhookProcess::start(&flags);

    // The agent mounts into the kubelet's directories: a privileged namespace.
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "drafs-system"}}));
    let ca = serde_json::to_value(k8s_openapi::ByteString(std::fs::read(hook.ca()).unwrap())).unwrap();
    let mut install = vec!["install", "drafs", CHART, "--namespace", "drafs-system"];
    install.extend(&sets);
    let by_url = [
        format!("webhookURL=https://{}", hook.addr),
        "certificate.source=secret".into(),
        "certificate.secretName=unused".into(),
        format!("certificate.caBundle={}", ca.as_str().unwrap()),
    ];
    install.extend(by_url.iter().flat_map(|v| ["--set", v.as_str()]));
    helm_ok(&cp, &install);
    let csi_driver = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": driver}});
    assert!(cp.get(&csi_driver).is_some(), "the chart installs the CSIDriver the volumes name");

    restricted_namespace(&cp, "ml");
    cp.merge_patch(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}),
        &json!({"metadata": {"labels": {"drafs.dev/inject": "enabled"}}}),
    );
    for account in ["default", "drafs"] {
        cp.ensure(
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": "ml"}}),
        );
    }
    // The app as the restricted level wants it; drafs adds only what that level allows.
    let pod = |name: &str, labels: Value| {
        let mut p = pod("ml", name, labels, Asks::Claim);
        p["spec"]["securityContext"] = json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}});
        p["spec"]["containers"][0]["securityContext"] =
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
        p
    };
    let volume =
        |p: &Value| p["spec"]["volumes"].as_array().into_iter().flatten().find(|v| v.get("csi").is_some()).cloned();
    wait_until("the webhook configuration to take effect", std::time::Duration::from_secs(30), || {
        let (code, text) = dry_run_create(&cp, &pod("probe", json!({})));
        (code == 200 || code == 201) && volume(&serde_json::from_str(&text).unwrap()).is_some()
    });

    // Created for real: valid for the API server, under the restricted level.
    let stored = cp.create(&pod("trainer", json!({})));
    let spec = &stored["spec"];
    assert_eq!(
        volume(&stored),
        Some(json!({"name": "dra", "csi": {"driver": driver, "readOnly": true}})),
        "{stored:#}"
    );
    assert!(spec.get("initContainers").is_none(), "no drafs container: {stored:#}");
    assert_eq!(spec["containers"][0]["volumeMounts"][0], json!({"name": "dra", "mountPath": "/dra", "readOnly": true}));
    assert_eq!((&spec["serviceAccountName"], &spec["automountServiceAccountToken"]), (&json!("drafs"), &json!(false)));
    // The pod's label still chooses its mode.
    let labelled = cp.create(&pod("setup", json!({"drafs.dev/inject": "init"})));
    assert_eq!(labelled["spec"]["initContainers"][0]["name"], "drafs", "{labelled:#}");
    assert_eq!(volume(&labelled), None);
    // A require drafs node could never meet is refused at once, not left to FailedMount forever.
    let mut waits = pod("waits", json!({}));
    waits["metadata"]["annotations"] = json!({"drafs.dev/require": "gpu/gpu/0/.status/interfaceName"});
    let (code, text) = dry_run_create(&cp, &waits);
    assert!(
        code == 400 && text.contains("namespaces.drafs.dev") && text.contains("when it prepares the device"),
        "HTTP {code}: {text}"
    );
    // node.enabled with no kubelet to run the uninstall guard's pod: past it, as documented.
    helm_ok(&cp, &["uninstall", "drafs", "--namespace", "drafs-system", "--wait", "--no-hooks"]);
}

/// The image the chart's Deployment gives the webhook to inject (`DRAFS_IMAGE`).
fn injected_image(deployment: &Value) -> String {
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap();
    env.iter().find(|e| e["name"] == "DRAFS_IMAGE").unwrap()["value"].as_str().unwrap().to_string()
}

/// The values that point the chart at a `drafs webhook` of the test's (by
/// URL, trusting its CA) with this image tag.
fn values_for(hook: &webhook::WebhookProcess, tag: &str) -> Vec<String> {
    let ca = serde_json::to_value(k8s_openapi::ByteString(std::fs::read(hook.ca()).unwrap())).unwrap();
    [
        format!("webhookURL=https://{}", hook.addr),
        "certificate.source=secret".into(),
        "certificate.secretName=unused".into(),
        format!("certificate.caBundle={}", ca.as_str().unwrap()),
        "image.repository=registry.example/drafs".into(),
        format!("image.tag={tag}"),
    ]
    .into_iter()
    .flat_map(|v| ["--set".to_string(), v])
    .collect()
}

#[test]
fn helm_upgrade_leaves_running_pods_untouched_and_new_pods_get_the_new_image() {
    let Some(cp) = controlplane::private() else { return };
    restricted_namespace(&cp, "drafs-system");
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}));
    for account in ["default", "drafs"] {
        cp.ensure(
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": "ml"}}),
        );
    }
    let deployment = || {
        cp.get(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
                       "metadata": {"name": "drafs-webhook", "namespace": "drafs-system"}}))
            .expect("the webhook Deployment")
    };
    // The test plays the Deployment's replicas: a `drafs webhook` run with the
    // image the chart renders into DRAFS_IMAGE, checked against the installed one.
    let (image_a, image_b) = ("registry.example/drafs:0.1.0", "registry.example/drafs:0.2.0");
    let hook_a = webhook::WebhookProcess::start_with_image(image_a, &[]);
    let mut install = vec!["install".to_string(), "drafs".into(), CHART.into(), "-n".into(), "drafs-system".into()];
    install.extend(values_for(&hook_a, "0.1.0"));
    helm_ok(&cp, &install.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(injected_image(&deployment()), image_a);

    let labelled = |name: &str| pod("ml", name, json!({"drafs.dev/inject": "init"}), Asks::Claim);
    let image_of = |p: &Value| p["spec"]["initContainers"][0]["image"].as_str().map(String::from);
    // The API server picks a new configuration up asynchronously (until
    // then it may still call the stopped webhook: a refusal, tried again).
    let wait_for_image = |image: &str| {
        wait_until(&format!("the API server to inject {image}"), std::time::Duration::from_secs(30), || {
            match cp.raw("POST", "/api/v1/namespaces/ml/pods?dryRun=All", Some(&labelled("probe")), "application/json")
            {
                Ok((200 | 201, text)) => image_of(&serde_json::from_str(&text).unwrap()).as_deref() == Some(image),
                _ => false,
            }
        })
    };
    wait_for_image(image_a);
    let before = cp.create(&labelled("before"));
    assert_eq!(image_of(&before).as_deref(), Some(image_a), "{before:#}");

    // The upgrade: a new image. The Deployment rolls (played here: a new
    // webhook with the new image, the old one stopped).
    let hook_b = webhook::WebhookProcess::start_with_image(image_b, &[]);
    let mut upgrade = vec!["upgrade".to_string(), "drafs".into(), CHART.into(), "-n".into(), "drafs-system".into()];
    upgrade.extend(values_for(&hook_b, "0.2.0"));
    helm_ok(&cp, &upgrade.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(injected_image(&deployment()), image_b);
    drop(hook_a);
    wait_for_image(image_b);

    // The pod admitted before the upgrade is exactly as it was: same object,
    // never written since, drafs still on the old image.
    let now = cp.get(&before).expect("the pod is still there");
    assert_eq!(now["metadata"]["uid"], before["metadata"]["uid"]);
    assert_eq!(now["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"], "{now:#}");
    assert_eq!(now["spec"], before["spec"]);
    assert_eq!(image_of(&now).as_deref(), Some(image_a));
    // A pod created after it gets the new image.
    let after = cp.create(&labelled("after"));
    assert_eq!(image_of(&after).as_deref(), Some(image_b), "{after:#}");
}

/// The chart as a release ships it (`release/chart.sh`, which
/// `release/release.sh` runs): installed by its archive's path, it names the
/// release's image, at the version of Cargo.toml.
#[test]
fn the_released_chart_archive_installs_and_names_the_released_image() {
    let Some(cp) = controlplane::private() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(repo_path("release/chart.sh"))
        .arg(scratch.path())
        .env("DRAFS_REGISTRY", "registry.example/team")
        .env("HELM", support::helm::binary())
        .output()
        .unwrap();
    assert!(out.status.success(), "release/chart.sh: {}", stderr(&out));
    let archive = stdout(&out).trim().to_string();
    let version = env!("CARGO_PKG_VERSION");
    assert!(archive.ends_with(&format!("/drafs-{version}.tgz")), "{archive}");
    let shown = helm_ok(&cp, &["show", "chart", &archive]);
    assert!(
        shown.contains(&format!("\nversion: {version}\n")) && shown.contains(&format!("appVersion: {version}")),
        "{shown}"
    );

    restricted_namespace(&cp, "drafs-system");
    helm_ok(&cp, &["install", "drafs", &archive, "--namespace", "drafs-system"]);
    let deployment = cp
        .get(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
                     "metadata": {"name": "drafs-webhook", "namespace": "drafs-system"}}))
        .unwrap();
    let image = format!("registry.example/team/drafs:{version}");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], image.as_str());
    assert!(container["env"].as_array().unwrap().iter().any(|e| e["value"] == image.as_str()), "{container}");
    helm_ok(&cp, &["uninstall", "drafs", "--namespace", "drafs-system", "--wait"]);
}
