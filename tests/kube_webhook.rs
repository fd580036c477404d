//! The kube tier, the webhook: the real API server calling a local `drafs
//! webhook` (by URL on 127.0.0.1, with its test CA), the kustomizations that
//! install it, and certificate renewal under load. Same control plane and
//! rules as kube.rs.

use drafs_test_support as support;

use std::time::Duration;

use serde_json::{Value, json};
use support::controlplane::{self, ControlPlane};
use support::*;

const WEBHOOK_PICKUP: Duration = Duration::from_secs(20);

/// The shipped webhook configuration, pointed at a local `drafs webhook` by URL
/// (the test cluster has no Service routing) with its test CA.
fn local_webhook_configuration(hook: &support::webhook::WebhookProcess) -> Value {
    support::webhook::configuration_by_url(&format!("https://{}/mutate", hook.addr), &hook.ca())
}

fn webhook_reviews(metrics_addr: &str) -> u64 {
    let (_, text) = http_get(metrics_addr, "/metrics").expect("webhook metrics");
    support::webhook::reviews_answered(&text)
}

#[test]
fn the_api_server_calls_the_webhook_and_stores_labelled_pods_with_drafs() {
    let Some(cp) = controlplane::shared() else { return };
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let hook = support::webhook::WebhookProcess::start(&["--metrics-addr", &metrics_addr]);
    let ns = support::cluster::unique("webhook");
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    let out = std::process::Command::new(drafs_bin()).args(["manifests", "rbac", "--namespace", &ns]).output().unwrap();
    for doc in yaml_docs(&stdout(&out)) {
        cp.ensure(&doc);
    }
    // What the controller manager makes in every namespace (none runs here):
    // the ServiceAccount admission plugin gives pods `default` before the webhook sees them.
    cp.ensure(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}}));
    cp.create(&local_webhook_configuration(&hook));
    let pod = |name: &str, mode: Option<&str>, annotations: Value| {
        let mut labels = json!({"app": "trainer"});
        if let Some(mode) = mode {
            labels["drafs.dev/inject"] = json!(mode);
        }
        PodBuilder::new(&ns, name)
            .labels(labels)
            .annotations(annotations)
            .template_claim("gpu", "single-gpu")
            .container("app", "registry.example/app:1")
            .uses("gpu")
            .container("logger", "registry.example/logger:1")
            .build()
    };
    // The API server picks up a new webhook configuration asynchronously: wait
    // until a dry run comes back with drafs in it.
    let probe = pod("probe", Some("init"), json!({}));
    let path = format!("/api/v1/namespaces/{ns}/pods?dryRun=All");
    let last = std::cell::RefCell::new(String::new());
    let called = wait_for(WEBHOOK_PICKUP, || match cp.raw("POST", &path, Some(&probe), "application/json") {
        Ok((200, text)) if text.contains("\"name\":\"drafs\"") => true,
        other => {
            *last.borrow_mut() = format!("{other:?}");
            false
        }
    });
    assert!(
        called,
        "the API server never called the webhook; last answer: {}\nwebhook log: {}\napiserver: {}",
        last.borrow(),
        hook.log_text(),
        cp.apiserver_log_tail()
    );

    let annotations = json!({
        "drafs.dev/metadata-dir": "/var/run/kubernetes.io/dra-device-attributes",
        "drafs.dev/require": "gpu/gpu/0/uuid",
        "drafs.dev/timeout": "2m",
    });
    let stored = cp.create(&pod("trainer", Some("sidecar-files"), annotations));
    let spec = &stored["spec"];
    let drafs = &spec["initContainers"][0];
    assert_eq!(drafs["name"], "drafs", "{stored:#}");
    assert_eq!(drafs["image"], "registry.example/drafs:test");
    assert_eq!(drafs["restartPolicy"], "Always");
    assert_eq!(
        drafs["args"],
        json!([
            "serve",
            "--backend=files",
            "--dir=/dra",
            "--metadata-dir=/var/run/kubernetes.io/dra-device-attributes",
            "--require=gpu/gpu/0/uuid",
            "--timeout=2m"
        ])
    );
    assert_eq!(spec["serviceAccountName"], "drafs");
    assert_eq!(spec["automountServiceAccountToken"], false);
    let mounts = |c: &Value| -> Vec<(String, bool)> {
        c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| (m["mountPath"].as_str().unwrap().to_string(), m["readOnly"] == true))
            .collect()
    };
    let sa_path = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert!(mounts(drafs).iter().any(|(p, _)| p == sa_path), "drafs has its token: {drafs}");
    let app = &spec["containers"][0];
    assert_eq!(
        mounts(app),
        vec![("/dra".to_string(), true), ("/var/run/kubernetes.io/dra-device-attributes".to_string(), true)],
        "the app gets the tree and the standard view read-only, and no credentials: {app}"
    );
    assert!(mounts(&spec["containers"][1]).is_empty(), "a container without claims gets nothing");
    let volumes = spec["volumes"].as_array().unwrap();
    assert!(!volumes.iter().any(|v| v["name"].as_str().unwrap().starts_with("kube-api-access")), "{volumes:?}");

    // A virt-launcher pod as KubeVirt renders it from examples/kubevirt-vmi:
    // the VMI's labels and annotations copied, no service account named,
    // automount off, the claims on the `compute` container.
    let vmi = yaml_docs(&read("examples/kubevirt-vmi/30-vmi.yaml")).remove(0);
    let mut labels = vmi["metadata"]["labels"].clone();
    labels["kubevirt.io"] = json!("virt-launcher");
    labels["vm.kubevirt.io/name"] = json!("win11");
    let mut annotations = vmi["metadata"]["annotations"].clone();
    annotations["kubevirt.io/domain"] = json!("win11");
    annotations["kubectl.kubernetes.io/default-container"] = json!("compute");
    let launcher = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "virt-launcher-win11-", "namespace": ns, "labels": labels, "annotations": annotations},
        "spec": {
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "resourceClaims": vmi["spec"]["resourceClaims"],
            "containers": [{"name": "compute", "image": "registry.example/virt-launcher:v1.9.0",
                            "command": ["/usr/bin/virt-launcher-monitor"],
                            "resources": {"claims": [{"name": "pgpu"}]}}]
        }
    });
    let stored = cp.create(&launcher);
    let spec = &stored["spec"];
    let drafs = &spec["initContainers"][0];
    assert_eq!(drafs["name"], "drafs", "{stored:#}");
    assert!(drafs.get("restartPolicy").is_none(), "init mode: drafs runs to completion before compute");
    assert!(
        drafs["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--metadata-dir=/var/run/kubernetes.io/dra-device-attributes")),
        "{drafs}"
    );
    assert!(
        mounts(&spec["containers"][0]).contains(&("/var/run/kubernetes.io/dra-device-attributes".to_string(), true)),
        "{stored:#}"
    );
    assert_eq!(spec["serviceAccountName"], "drafs");

    // A misspelt mode: refused, with the message from the webhook.
    let refused = cp.raw(
        "POST",
        &format!("/api/v1/namespaces/{ns}/pods"),
        Some(&pod("typo", Some("sidecar"), json!({}))),
        "application/json",
    );
    let Ok((code, message)) = refused else { panic!("{refused:?}") };
    assert_eq!(code, 400, "{message}");
    assert!(
        message.contains("admission webhook \"pods.drafs.dev\" denied the request")
            && message.contains("use init, sidecar-fuse, sidecar-files or csi"),
        "{message}"
    );

    // Pods without the label never reach the webhook (objectSelector).
    let before = webhook_reviews(&metrics_addr);
    let plain = cp.create(&pod("plain", None, json!({})));
    assert!(plain["spec"].get("initContainers").is_none(), "{plain:#}");
    assert_eq!(webhook_reviews(&metrics_addr), before, "the API server called the webhook for an unlabelled pod");
}

/// The deploy/webhook kustomizations as the README applies them, with kubectl
/// built from the same module: the manual route accepted by the real API
/// server (server-side dry run, strict validation, no Pod Security warning),
/// the cert-manager route rendered with the CA annotation and a certificate
/// for the Service's names, and one image setting for both containers.
#[test]
fn the_webhook_kustomizations_apply() {
    let Some(cp) = controlplane::shared() else { return };
    let copy = tempfile::tempdir().unwrap();
    let cp_r = std::process::Command::new("cp").arg("-r").arg(repo_path("deploy/webhook")).arg(copy.path()).status();
    assert!(cp_r.unwrap().success());
    let root = copy.path().join("webhook");
    let certs = std::process::Command::new(root.join("manual/certs.sh")).output().unwrap();
    assert!(certs.status.success(), "{}", String::from_utf8_lossy(&certs.stderr));
    let ns = cp.kubectl(&["apply", "-f", root.join("core/namespace.yaml").to_str().unwrap()]);
    assert!(ns.status.success(), "{}", String::from_utf8_lossy(&ns.stderr));
    let applied =
        cp.kubectl(&["apply", "-k", root.join("manual").to_str().unwrap(), "--dry-run=server", "--validate=strict"]);
    let err = String::from_utf8_lossy(&applied.stderr);
    assert!(applied.status.success(), "{err}");
    assert!(!err.contains("PodSecurity"), "the webhook's pods violate the restricted standard: {err}");
    let out = String::from_utf8_lossy(&applied.stdout);
    for object in [
        "deployment.apps/drafs-webhook",
        "service/drafs-webhook",
        "poddisruptionbudget.policy/drafs-webhook",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/drafs",
        "secret/drafs-webhook-tls",
    ] {
        assert!(out.contains(object), "{object} not applied: {out}");
    }

    // Every entry trusts the CA; a renewal keeps the CA (so caBundle) and reissues only the serving certificate.
    let manual = cp.kubectl(&["kustomize", root.join("manual").to_str().unwrap()]);
    let docs = yaml_docs(&String::from_utf8_lossy(&manual.stdout));
    let config = docs.iter().find(|d| d["kind"] == "MutatingWebhookConfiguration").unwrap();
    let bundles: Vec<&Value> =
        config["webhooks"].as_array().unwrap().iter().map(|w| &w["clientConfig"]["caBundle"]).collect();
    assert!(bundles.len() == 2 && bundles.iter().all(|b| b.is_string() && *b == bundles[0]), "{config}");
    let before = (
        std::fs::read(root.join("manual/cabundle.yaml")).unwrap(),
        std::fs::read(root.join("manual/tls.crt")).unwrap(),
    );
    let again = std::process::Command::new(root.join("manual/certs.sh")).output().unwrap();
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(std::fs::read(root.join("manual/cabundle.yaml")).unwrap(), before.0, "a renewal changed caBundle");
    assert_ne!(
        std::fs::read(root.join("manual/tls.crt")).unwrap(),
        before.1,
        "the serving certificate was not reissued"
    );
    let verify = std::process::Command::new("openssl")
        .args(["verify", "-verify_hostname", "drafs-webhook.drafs-system.svc", "-CAfile"])
        .arg(root.join("manual/ca.crt"))
        .arg(root.join("manual/tls.crt"))
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));

    // The cert-manager route (no cert-manager CRDs here: rendered, not applied).
    let built = cp.kubectl(&["kustomize", root.to_str().unwrap()]);
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let docs = yaml_docs(&String::from_utf8_lossy(&built.stdout));
    let find = |kind: &str| docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}")).clone();
    let config = find("MutatingWebhookConfiguration");
    assert_eq!(config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "drafs-system/drafs-webhook");
    let certificate = docs.iter().find(|d| d["kind"] == "Certificate").unwrap();
    let service = find("Service");
    let host = format!(
        "{}.{}.svc",
        service["metadata"]["name"].as_str().unwrap(),
        service["metadata"]["namespace"].as_str().unwrap()
    );
    assert!(certificate["spec"]["dnsNames"].as_array().unwrap().contains(&json!(host)), "{certificate}");
    assert_eq!(certificate["spec"]["secretName"], "drafs-webhook-tls");
    let webhook = &config["webhooks"][0];
    assert_eq!(webhook["clientConfig"]["service"]["name"], service["metadata"]["name"]);
    assert!(webhook["timeoutSeconds"].as_u64().unwrap() <= 10);

    // One image setting: the webhook's own container and the one it injects.
    let edit = std::fs::read_to_string(root.join("core/kustomization.yaml"))
        .unwrap()
        .replace("  newName: drafs\n", "  newName: registry.example/drafs\n");
    std::fs::write(root.join("core/kustomization.yaml"), edit).unwrap();
    let built = cp.kubectl(&["kustomize", root.to_str().unwrap()]);
    let docs = yaml_docs(&String::from_utf8_lossy(&built.stdout));
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example/drafs:0.1.0");
    let env = container["env"].as_array().unwrap();
    assert!(env.iter().any(|e| e["name"] == "DRAFS_IMAGE" && e["value"] == "registry.example/drafs:0.1.0"), "{env:?}");
}

/// Renewing the serving certificate from the same CA (what the chart's
/// `generate` source, cert-manager's CA issuer and `certs.sh` do) while the
/// real API server keeps sending reviews: not one pod is refused.
#[test]
fn a_serving_certificate_renewed_from_the_same_ca_refuses_no_pod() {
    let Some(cp) = controlplane::private() else { return };
    let hook = support::webhook::WebhookProcess::start(&[]);
    let ns = support::cluster::unique("renewal");
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    for account in ["default", "drafs"] {
        cp.ensure(
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": ns}}),
        );
    }
    cp.create(&local_webhook_configuration(&hook));
    let pod = PodBuilder::from_prefix(&ns, "trainer-")
        .labels(json!({"drafs.dev/inject": "init"}))
        .template_claim("gpu", "single-gpu")
        .container("app", "registry.example/app:1")
        .uses("gpu")
        .build();
    let path = format!("/api/v1/namespaces/{ns}/pods?dryRun=All");
    let injected = |cp: &ControlPlane| match cp.raw("POST", &path, Some(&pod), "application/json") {
        Ok((200 | 201, text)) if text.contains("\"name\":\"drafs\"") => Ok(()),
        other => Err(format!("{other:?}")),
    };
    assert!(wait_for(WEBHOOK_PICKUP, || injected(&cp).is_ok()), "the API server never called the webhook");

    let stop = std::sync::atomic::AtomicBool::new(false);
    let (done, refused) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let (mut done, mut refused) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match injected(&cp) {
                    Ok(()) => done += 1,
                    Err(e) => refused.push(e),
                }
            }
            (done, refused)
        });
        for version in 2..=4u32 {
            let name = format!("tls{version}");
            support::tls::serving(hook.dir.path(), "ca", &name, "IP:127.0.0.1,DNS:localhost", version).unwrap();
            let (cert, key) =
                (hook.dir.path().join(format!("{name}.crt")), hook.dir.path().join(format!("{name}.key")));
            hook.rotate(&format!("..v{version}"), &cert, &key);
            let reloads = version as usize - 1;
            wait_until("the webhook to serve the renewed certificate", Duration::from_secs(30), || {
                hook.log_text().matches("certificate reloaded").count() >= reloads
            });
        }
        // Reviews on the last certificate too, over new connections and old.
        wait_until("reviews after the last renewal", Duration::from_secs(30), || injected(&cp).is_ok());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sender.join().unwrap()
    });
    assert!(
        refused.is_empty(),
        "{} of {} pods refused during renewals: {refused:?}",
        refused.len(),
        done as usize + refused.len()
    );
    assert!(done > 0, "no review was sent during the renewals");
}

/// A user's overlay that sets the image with plain `images:` changes both the
/// webhook's container and the image it injects into pods (DRAFS_IMAGE):
/// before, the injected one stayed drafs:0.1.0 and every injected pod sat in
/// ImagePullBackOff. Built with the real kustomize (kubectl's).
#[test]
fn an_overlay_that_sets_the_image_sets_the_injected_image_too() {
    let Some(cp) = controlplane::shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cp_r = std::process::Command::new("cp").arg("-r").arg(repo_path("deploy/webhook")).arg(dir.path()).status();
    assert!(cp_r.unwrap().success());
    let overlay = dir.path().join("mine");
    std::fs::create_dir(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "resources:\n- ../webhook\nimages:\n- name: drafs\n  newName: registry.example/drafs\n  newTag: \"0.2.0\"\n",
    )
    .unwrap();
    let out = cp.kubectl(&["kustomize", overlay.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = yaml_docs(&stdout(&out));
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example/drafs:0.2.0");
    let env = container["env"].as_array().unwrap();
    let injected = env.iter().find(|e| e["name"] == "DRAFS_IMAGE").unwrap();
    assert_eq!(injected["value"], "registry.example/drafs:0.2.0", "the image injected into pods");
    // Nothing else in the Deployment's environment was taken for an image.
    let base = cp.kubectl(&["kustomize", dir.path().join("webhook").to_str().unwrap()]);
    let base_docs = yaml_docs(&stdout(&base));
    let base_env = base_docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"]["containers"][0]["env"].clone();
    for (ours, theirs) in env.iter().zip(base_env.as_array().unwrap()) {
        if ours["name"] != "DRAFS_IMAGE" {
            assert_eq!(ours, theirs);
        }
    }
}
