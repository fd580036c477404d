//! `drafs node`'s services without a kubelet: CSI calls made the way the
//! kubelet makes them (protobuf messages to the same handler the gRPC server
//! calls), against drafs's test API server (RBAC from `drafs manifests rbac`,
//! tokens), with the mounts recorded instead of made. What the real kubelet
//! does with the agent is tests/nodemode.rs's (the real-node tier); here, the
//! bookkeeping a real node makes slow to reach: a republish restarts nothing,
//! a new token restarts the run on the same tree, unpublish twice is fine,
//! nothing is created for a refused publish.

use drafs_test_support as support;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drafs::engine::shared::SharedSlices;
use drafs::node::csi::Service;
use drafs::node::grpc::{Code, Handler, Status};
use drafs::node::mounts::{AtTarget, Mounts};
use drafs::node::proto::Writer;
use drafs::node::volumes::{Timing, Volumes};
use support::*;

const UID: &str = "6f1d2c3a-9b8e-4d7f-a1b2-c3d4e5f60718";
const UUID: &str = "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b";

/// Mounts recorded, not made: the target directories stay plain directories.
#[derive(Default, Clone)]
struct Recorded(Arc<Mutex<HashSet<PathBuf>>>);

impl Mounts for Recorded {
    fn mount_tmpfs(&self, target: &Path) -> std::io::Result<()> {
        self.0.lock().unwrap().insert(target.to_path_buf());
        Ok(())
    }
    /// What was written in the tmpfs goes with it.
    fn unmount(&self, target: &Path) -> std::io::Result<()> {
        self.0.lock().unwrap().remove(target);
        for entry in std::fs::read_dir(target)? {
            let path = entry?.path();
            if path.is_dir() { std::fs::remove_dir_all(path)? } else { std::fs::remove_file(path)? }
        }
        Ok(())
    }
    fn at(&self, target: &Path) -> std::io::Result<AtTarget> {
        Ok(if self.0.lock().unwrap().contains(target) { AtTarget::Ours } else { AtTarget::Nothing })
    }
}

struct Agent {
    api: TestApi,
    /// The kubelet's deadline for a call (`grpc-timeout`).
    deadline: Mutex<Duration>,
    service: Service<Recorded>,
    mounts: Recorded,
    kubelet: tempfile::TempDir,
}

fn agent() -> Agent {
    // kube's client starts its buffer task on the runtime.
    let _runtime = runtime().enter();
    let api = api_for("ml");
    api.load_yaml(&read("examples/offline/gpu-training.yaml"));
    let kubelet = tempfile::tempdir().unwrap();
    let cluster = kube::Config::new(api.url().parse().unwrap());
    let mut own = cluster.clone();
    own.auth_info.token = Some(TOKEN.to_string().into());
    let slices = SharedSlices::new(kube::Client::try_from(own).unwrap());
    let timing = Timing { watch_for: Duration::from_secs(120), refresh: Duration::from_secs(300) };
    let mounts = Recorded::default();
    let volumes = Volumes::new(kubelet.path().to_path_buf(), cluster, slices, timing, mounts.clone());
    let service =
        Service { driver: "drafs.dev".into(), node_name: "gpu-node-7".into(), endpoint: "/csi.sock".into(), volumes };
    Agent { api, deadline: Mutex::new(Duration::from_secs(10)), service, mounts, kubelet }
}

impl Agent {
    fn target(&self) -> PathBuf {
        self.kubelet.path().join(format!("pods/{UID}/volumes/kubernetes.io~csi/dra/mount"))
    }

    fn publish_with(&self, target: &Path, token: &str, extra: &[(&str, &str)]) -> Result<Vec<u8>, Status> {
        let mut context: BTreeMap<String, String> = [
            ("csi.storage.k8s.io/ephemeral", "true"),
            ("csi.storage.k8s.io/pod.name", "trainer-0"),
            ("csi.storage.k8s.io/pod.namespace", "ml"),
            ("csi.storage.k8s.io/pod.uid", UID),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let tokens = serde_json::json!({"": {"token": token, "expirationTimestamp": "2026-12-03T14:00:00Z"}});
        context.insert("csi.storage.k8s.io/serviceAccount.tokens".into(), tokens.to_string());
        let mut req = Writer::new();
        req.string(1, "csi-1").string(4, &target.to_string_lossy()).boolean(6, true).map(8, &context);
        self.call("/csi.v1.Node/NodePublishVolume", req.finish())
    }

    fn publish(&self, token: &str) -> Result<Vec<u8>, Status> {
        self.publish_with(&self.target(), token, &[])
    }

    fn unpublish(&self) -> Result<Vec<u8>, Status> {
        let mut req = Writer::new();
        req.string(1, "csi-1").string(2, &self.target().to_string_lossy());
        self.call("/csi.v1.Node/NodeUnpublishVolume", req.finish())
    }

    fn call(&self, method: &str, message: Vec<u8>) -> Result<Vec<u8>, Status> {
        runtime().block_on(self.service.call(method, message.into(), Some(*self.deadline.lock().unwrap())))
    }

    /// Requests for the pod and its claims since the last clear.
    fn pod_and_claim_requests(&self) -> usize {
        self.api.requests().iter().filter(|r| r.resource == "pods" || r.resource == "resourceclaims").count()
    }
}

/// One runtime for the whole test process: the runs a publish starts live on after the call.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap())
}

#[test]
fn a_publish_answers_with_the_tree_written_and_a_republish_restarts_nothing() {
    let a = agent();
    a.publish(TOKEN).expect("published");
    let target = a.target();
    assert_eq!(std::fs::read_to_string(target.join("gpu/gpu/0/uuid")).unwrap(), UUID);
    assert!(target.join(".ready").exists());
    assert!(a.mounts.0.lock().unwrap().contains(&target), "a tmpfs at the target");

    // The kubelet publishes again at every sync: the run is found, nothing is asked again.
    a.api.clear_requests();
    a.publish(TOKEN).expect("republished");
    assert_eq!(a.pod_and_claim_requests(), 0, "{:?}", a.api.requests());

    // A refreshed token: the same tree, a new run reading as the new token.
    a.api.add_token("refreshed-token", "system:serviceaccount:ml:drafs");
    a.api.clear_requests();
    a.publish("refreshed-token").expect("published with the new token");
    assert!(a.pod_and_claim_requests() > 0, "the new run reads the pod and its claims");
    assert_eq!(std::fs::read_to_string(target.join("gpu/gpu/0/uuid")).unwrap(), UUID);

    a.unpublish().expect("unpublished");
    assert!(!target.exists(), "the target directory is removed");
    assert!(a.mounts.0.lock().unwrap().is_empty(), "unmounted");
    a.unpublish().expect("unpublishing again is done already");
}

#[test]
fn a_refused_publish_creates_nothing_and_says_why() {
    let a = agent();
    let elsewhere = a.kubelet.path().join("pods/other-uid/volumes/kubernetes.io~csi/dra/mount");
    let err = a.publish_with(&elsewhere, TOKEN, &[]).unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("not a pod volume directory"), "{}", err.message);
    let err = a.publish_with(&a.target(), TOKEN, &[("require", "gpu/gpu/0/.status/interfaceName")]).unwrap_err();
    assert!(err.message.contains("after the volume is published"), "{}", err.message);
    assert!(!a.kubelet.path().join("pods").exists(), "nothing was created");
    assert!(a.mounts.0.lock().unwrap().is_empty());
}

#[test]
fn a_token_without_rights_waits_with_the_refusal_and_the_fix() {
    let a = agent();
    a.api.add_token("no-rights", "system:serviceaccount:ml:default");
    let err = a.publish("no-rights").unwrap_err();
    assert_eq!(err.code, Code::Unavailable);
    assert!(err.message.contains("forbidden") && err.message.contains("drafs manifests rbac"), "{}", err.message);
    // The volume is counted as maybe mounted by the kubelet, which unpublishes it when the pod goes.
    a.unpublish().expect("unpublished");
    assert!(a.mounts.0.lock().unwrap().is_empty());
}

#[test]
fn with_the_api_server_down_a_publish_says_what_it_waits_for_and_the_next_one_succeeds() {
    let a = agent();
    a.api.inject(Fault { verb: Some("get".into()), resource: Some(Res::Pods), status: 500, count: usize::MAX });
    // The kubelet's deadline of 4 s: drafs answers 2 s before it.
    *a.deadline.lock().unwrap() = Duration::from_secs(4);
    let err = a.publish(TOKEN).unwrap_err();
    assert_eq!(err.code, Code::Unavailable);
    assert!(
        err.message.starts_with("drafs is waiting for the pod's devices: pod ml/trainer-0 not fetched yet"),
        "{}",
        err.message
    );
    assert!(err.message.contains("500"), "{}", err.message);
    assert!(!a.target().join(".ready").exists());
    // The run went on retrying: once the server answers, the kubelet's next call succeeds.
    a.api.clear_faults();
    *a.deadline.lock().unwrap() = Duration::from_secs(30);
    a.publish(TOKEN).expect("published once the API server answers");
    assert_eq!(std::fs::read_to_string(a.target().join("gpu/gpu/0/uuid")).unwrap(), UUID);
}
