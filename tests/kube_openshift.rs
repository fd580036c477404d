//! The chart and `drafs inject` on OpenShift, as far as a cluster without it
//! can show: with the API `security.openshift.io/v1` present (helm's
//! `--api-versions`, as helm reads it from an OpenShift API server), no uid
//! is pinned where restricted-v2 assigns one, the webhook tells the container
//! it injects the same, and the node agent's account may use the
//! `privileged` SCC; what is rendered is accepted by the real API server
//! under the restricted Pod Security level. (No OpenShift here: its SCC
//! admission itself is not exercised; docs/deploy.md says so.)

use drafs_test_support as support;

use serde_json::{Value, json};
use support::controlplane::{self, ControlPlane};
use support::helm::{find, template};
use support::*;

const OPENSHIFT: &[&str] = &["--api-versions", "security.openshift.io/v1"];

fn webhook_pod(docs: &[Value]) -> Value {
    find(docs, "Deployment")["spec"]["template"]["spec"].clone()
}

fn scc_rules(docs: &[Value]) -> Vec<Value> {
    docs.iter()
        .filter(|d| d["kind"] == "ClusterRole")
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["apiGroups"] == json!(["security.openshift.io"]))
        .collect()
}

fn restricted_namespace(cp: &ControlPlane, name: &str) {
    cp.ensure(&json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
    }));
}

#[test]
fn on_openshift_no_uid_is_pinned_and_the_agent_may_use_the_privileged_scc() {
    let Some(cp) = controlplane::shared() else { return };
    let mut args = OPENSHIFT.to_vec();
    args.extend(["--set", "node.enabled=true"]);
    let docs = template(cp, &args);
    let pod = webhook_pod(&docs);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{pod:#}");
    assert!(pod["securityContext"].get("runAsUser").is_none() && pod["securityContext"].get("runAsGroup").is_none());
    assert!(pod["containers"][0]["args"].as_array().unwrap().contains(&json!("--platform-uid")), "{pod:#}");
    let scc = scc_rules(&docs);
    assert_eq!(
        scc,
        [json!({"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
                "resourceNames": ["privileged"], "verbs": ["use"]})]
    );
    let binding =
        docs.iter().find(|d| d["kind"] == "ClusterRoleBinding" && d["metadata"]["name"] == "drafs-node").unwrap();
    let agents = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    assert_eq!(binding["subjects"][0]["name"], agents["spec"]["template"]["spec"]["serviceAccountName"]);

    // Elsewhere the image's user is pinned and no SCC is named; `openshift` overrides the detection.
    for (args, openshift) in [
        (vec!["--set", "node.enabled=true"], false),
        (vec!["--set", "node.enabled=true,openshift=true"], true),
        (vec!["--set", "node.enabled=true,openshift=false", OPENSHIFT[0], OPENSHIFT[1]], false),
    ] {
        let docs = template(cp, &args);
        let pinned = webhook_pod(&docs)["securityContext"]["runAsUser"] == 65532;
        assert_eq!(pinned, !openshift, "{args:?}");
        assert_eq!(scc_rules(&docs).len(), usize::from(openshift), "{args:?}");
    }

    // What is rendered for OpenShift, the real API server admits under the restricted level.
    let ns = support::cluster::unique("openshift-webhook");
    restricted_namespace(cp, &ns);
    cp.ensure(
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "drafs-webhook", "namespace": ns}}),
    );
    // A pod of the webhook's template (Pod Security enforces on pods, and only warns on their templates).
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "webhook", "namespace": ns},
                     "spec": webhook_pod(&template(cp, OPENSHIFT))});
    let out = cp.dry_run_create(&pod);
    assert!(out.is_ok(), "{out:?}");
}

#[test]
fn drafs_inject_with_the_platform_uid_is_admitted_under_the_restricted_level() {
    let Some(cp) = controlplane::shared() else { return };
    let ns = support::cluster::unique("openshift");
    restricted_namespace(cp, &ns);
    cp.ensure(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "drafs", "namespace": ns}}));
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: trainer, namespace: {ns}}}\nspec:\n  securityContext: {{runAsNonRoot: true, seccompProfile: {{type: RuntimeDefault}}}}\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: single-gpu}}]\n  containers:\n  - name: app\n    image: registry.example/app:1\n    securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}\n    resources: {{claims: [{{name: gpu}}]}}\n"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pod.yaml"), &pod).unwrap();
    let out = std::process::Command::new(drafs_bin())
        .args(["inject", "--platform-uid", dir.path().join("pod.yaml").to_str().unwrap()])
        .output()
        .unwrap();
    assert_ok(&out);
    let injected = yaml_docs(&stdout(&out)).remove(0);
    let stored = cp.create(&injected);
    let drafs = stored["spec"]["initContainers"].as_array().unwrap().iter().find(|c| c["name"] == "drafs").unwrap();
    assert_eq!(drafs["securityContext"]["runAsNonRoot"], true, "{drafs:#}");
    assert!(drafs["securityContext"].get("runAsUser").is_none(), "{drafs:#}");
}
