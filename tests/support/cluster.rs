//! Scenarios on the real control plane: objects created the way the cluster
//! creates them (the Pod, then claims, then what the scheduler and kubelet
//! write through the status subresources, then the driver's slices), and drafs
//! run with a real service-account token, as a pod sees it or from a kubeconfig.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::controlplane::ControlPlane;

/// A name unique to this test process and call, for namespaces and nodes.
pub fn unique(base: &str) -> String {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{base}-{}x{n}", std::process::id())
}

/// One pod's objects on the real API server.
pub struct Scenario<'a> {
    pub cp: &'a ControlPlane,
    pub namespace: String,
    pub pod_name: String,
    pub node: String,
    pub pod_uid: String,
    /// The fixture's objects, renamed for this scenario, as they are meant to end up.
    pub docs: Vec<Value>,
    pub dir: tempfile::TempDir,
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// Drop what the API server owns (uid, resourceVersion, generation, status).
fn as_created(doc: &Value) -> Value {
    let mut d = doc.clone();
    if let Some(meta) = d["metadata"].as_object_mut() {
        for f in ["uid", "resourceVersion", "generation", "creationTimestamp", "managedFields"] {
            meta.remove(f);
        }
    }
    if let Some(o) = d.as_object_mut() {
        o.remove("status");
    }
    d
}

/// Before 1.36 a slice's attributes are scalars only (no `ints`, `strings`...:
/// the API server refuses a slice with them): a list of one becomes that
/// scalar, which drafs writes as the same text.
fn scalar_attributes(doc: &mut Value) {
    for device in doc["spec"]["devices"].as_array_mut().into_iter().flatten() {
        for attr in device["attributes"].as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
            for (list, scalar) in [("ints", "int"), ("bools", "bool"), ("strings", "string"), ("versions", "version")] {
                if let Some([one]) = attr[list].as_array().map(Vec::as_slice) {
                    *attr = json!({scalar: one});
                }
            }
        }
    }
}

impl<'a> Scenario<'a> {
    /// Parse a fixture (Pod, claims, slices) and give it a namespace and node of
    /// its own, so scenarios never share objects. Nothing is created yet.
    pub fn from_fixture(cp: &'a ControlPlane, text: &str) -> Scenario<'a> {
        let docs: Vec<Value> = super::yaml_docs(text);
        let pod = docs.iter().find(|d| kind(d) == "Pod").expect("a Pod in the fixture");
        let old_ns = pod["metadata"]["namespace"].as_str().unwrap().to_string();
        let old_node = pod["spec"]["nodeName"].as_str().unwrap().to_string();
        let namespace = unique(&old_ns);
        let node = unique(&old_node);
        // The node name also names the node's pool and slices: rename it everywhere.
        let text = text.replace(&old_node, &node);
        let mut docs: Vec<Value> = super::yaml_docs(&text);
        for d in &mut docs {
            if d["metadata"]["namespace"].is_string() {
                d["metadata"]["namespace"] = json!(namespace);
            }
            if super::controlplane::minor() < 36 {
                scalar_attributes(d);
            }
        }
        let pod_name =
            docs.iter().find(|d| kind(d) == "Pod").unwrap()["metadata"]["name"].as_str().unwrap().to_string();
        Scenario::new(cp, namespace, pod_name, node, docs)
    }

    /// A scenario from objects built in the test.
    pub fn new(
        cp: &'a ControlPlane,
        namespace: String,
        pod_name: String,
        node: String,
        docs: Vec<Value>,
    ) -> Scenario<'a> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("termination-log"), "").unwrap();
        Scenario { cp, namespace, pod_name, node, pod_uid: String::new(), docs, dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn of_kind(&self, k: &str) -> Vec<Value> {
        self.docs.iter().filter(|d| kind(d) == k).cloned().collect()
    }

    pub fn pod(&self) -> Value {
        self.of_kind("Pod").remove(0)
    }

    /// The namespace, the shipped RBAC applied in it, the DeviceClasses and
    /// ResourceClaimTemplates the claims need, the Pod, and its claims, with no
    /// status yet: a pod the scheduler has not handled.
    pub fn create_unallocated(&mut self) {
        self.create_rbac(&super::rbac_yaml(&self.namespace));
        self.create_pod_and_claims();
    }

    /// Everything but the RBAC, which the test applied itself.
    pub fn create_all_after_rbac(&mut self) {
        self.create_pod_and_claims();
        self.allocate();
        self.publish_slices();
    }

    /// The namespace and an RBAC manifest applied in it (its `default`
    /// namespace replaced by this scenario's).
    pub fn create_rbac(&self, rbac_yaml: &str) {
        let cp = self.cp;
        cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}));
        // No controller-manager runs: create the `default` service account it would.
        cp.ensure(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": self.namespace}}));
        for mut doc in super::yaml_docs(rbac_yaml) {
            if doc["metadata"]["namespace"].is_string() {
                doc["metadata"]["namespace"] = json!(self.namespace);
            }
            for s in doc["subjects"].as_array_mut().into_iter().flatten() {
                if s["namespace"].is_string() {
                    s["namespace"] = json!(self.namespace);
                }
            }
            if kind(&doc) == "ClusterRoleBinding" {
                doc["metadata"]["name"] = json!(format!("drafs-resourceslices-{}", self.namespace));
            }
            if kind(&doc) == "ClusterRole" {
                cp.ensure(&doc);
            } else {
                cp.create(&doc);
            }
        }
    }

    fn create_pod_and_claims(&mut self) {
        let cp = self.cp;
        let pod = self.pod();
        for claim in self.of_kind("ResourceClaim") {
            for r in claim["spec"]["devices"]["requests"].as_array().into_iter().flatten() {
                let classes = std::iter::once(&r["exactly"]["deviceClassName"])
                    .chain(r["firstAvailable"].as_array().into_iter().flatten().map(|s| &s["deviceClassName"]));
                for class in classes.filter_map(|c| c.as_str()) {
                    cp.ensure(&json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                        "metadata": {"name": class}, "spec": {}}));
                }
            }
        }
        let created = cp.create(&as_created(&pod));
        self.pod_uid = created["metadata"]["uid"].as_str().unwrap().to_string();
        for claim in self.of_kind("ResourceClaim") {
            let mut c = as_created(&claim);
            let pod_claim = claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"].as_str();
            if let Some(pod_claim) = pod_claim {
                // Generated from a template: the resourceclaim controller creates the
                // template's claim owned by the pod.
                let template = pod["spec"]["resourceClaims"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["name"] == pod_claim)
                    .and_then(|c| c["resourceClaimTemplateName"].as_str())
                    .expect("a template for the generated claim");
                cp.ensure(&json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": template, "namespace": self.namespace},
                    "spec": {"spec": claim["spec"]}}));
                c["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod",
                    "name": self.pod_name, "uid": self.pod_uid, "controller": true, "blockOwnerDeletion": true}]);
            }
            cp.create(&c);
        }
    }

    /// What the scheduler and the kubelet write: each claim's allocation and
    /// reservation (and the driver's device status), then the pod's claim statuses.
    pub fn allocate(&self) {
        for claim in self.of_kind("ResourceClaim") {
            self.allocate_claim(&claim);
        }
        self.write_pod_status();
    }

    pub fn allocate_claim(&self, claim: &Value) {
        let mut status = claim["status"].clone();
        if status.is_null() {
            return;
        }
        for r in status["reservedFor"].as_array_mut().into_iter().flatten() {
            r["uid"] = json!(self.pod_uid);
            r["name"] = json!(self.pod_name);
        }
        self.cp.patch_status(claim, &status);
    }

    /// The claims the pod's status names: from templates (the resourceclaim
    /// controller), for extended resources (the scheduler, KEP-5004).
    pub fn write_pod_status(&self) {
        let pod = self.pod();
        for field in ["resourceClaimStatuses", "extendedResourceClaimStatus"] {
            if !pod["status"][field].is_null() {
                self.cp.patch_status(&pod, &json!({field: pod["status"][field]}));
            }
        }
    }

    /// The driver's slices, newest pool generation first (a fixture that keeps a
    /// stale generation beside the current one means: the driver had already
    /// published the current one when the pod started).
    pub fn publish_slices(&self) {
        let mut slices = self.of_kind("ResourceSlice");
        slices.sort_by_key(|s| std::cmp::Reverse(s["spec"]["pool"]["generation"].as_i64()));
        for s in slices {
            self.cp.create(&as_created(&s));
        }
    }

    /// All of it at once: a pod that was scheduled and allocated before drafs starts.
    pub fn create_all(&mut self) {
        self.create_unallocated();
        self.allocate();
        self.publish_slices();
    }

    /// A real token of the `drafs` service account, bound to the pod.
    pub fn token(&self) -> String {
        self.cp.token(&self.namespace, "drafs", Some((&self.pod_name, &self.pod_uid)))
    }

    fn base_command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env("HOME", self.dir.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("DRAFS_TERMINATION_LOG", self.path("termination-log"))
            .env("DRAFS_LOG", std::env::var("TEST_DRAFS_LOG").unwrap_or("info,drafs=debug,kube_client=off".into()))
            .stdin(Stdio::null());
        cmd
    }

    /// drafs from a kubeconfig with the cluster's CA and the service account's token.
    pub fn kubeconfig_command(&self, args: &[&str]) -> Command {
        let kubeconfig = self.path("kubeconfig");
        if !kubeconfig.exists() {
            self.cp.kubeconfig(&kubeconfig, &self.token(), &self.namespace);
        }
        let mut cmd = self.base_command(&super::drafs_bin());
        cmd.args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", &self.pod_name)
            .env("POD_NAMESPACE", &self.namespace);
        cmd
    }

    /// drafs as a pod sees it: in-cluster config from `KUBERNETES_SERVICE_*` and
    /// the token, CA and namespace at /var/run/secrets/kubernetes.io/serviceaccount,
    /// which exist only in a private mount namespace (a tmpfs over /run there), so
    /// the host is never touched. The pod name comes from $HOSTNAME and the
    /// namespace from the service account, as in a pod with no downward API.
    pub fn in_pod_command(&self, args: &[&str]) -> Command {
        // SAFETY: geteuid has no preconditions.
        assert!(
            unsafe { libc::geteuid() } == 0,
            "running drafs as a pod sees it needs root (a private mount namespace); outside CI, DRAFS_NO_KUBE_TESTS=1 skips the kube tier"
        );
        let secrets = self.path("serviceaccount");
        std::fs::create_dir_all(&secrets).unwrap();
        std::fs::write(secrets.join("token"), self.token()).unwrap();
        std::fs::copy(self.cp.ca_path(), secrets.join("ca.crt")).unwrap();
        std::fs::write(secrets.join("namespace"), &self.namespace).unwrap();
        let mut cmd = self.base_command(Path::new("unshare"));
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-ec"])
            .arg(concat!(
                "mount -t tmpfs -o size=1m,mode=0755 drafs-test-run /run\n",
                "d=/var/run/secrets/kubernetes.io/serviceaccount\n",
                "mkdir -p \"$d\"\n",
                "cp \"$DRAFS_TEST_SECRETS\"/token \"$DRAFS_TEST_SECRETS\"/ca.crt \"$DRAFS_TEST_SECRETS\"/namespace \"$d\"/\n",
                "exec \"$DRAFS_TEST_BIN\" \"$@\"\n",
            ))
            .arg("drafs")
            .args(args)
            .env("DRAFS_TEST_SECRETS", &secrets)
            .env("DRAFS_TEST_BIN", super::drafs_bin())
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", self.cp.port.to_string())
            .env("HOSTNAME", &self.pod_name);
        cmd
    }

    pub fn termination_log(&self) -> String {
        std::fs::read_to_string(self.path("termination-log")).unwrap_or_default()
    }
}
