//! `drafs node`'s services without a kubelet: CSI calls made the way the
//! kubelet makes them (protobuf messages to the same handler the gRPC server
//! calls), against drafs's test API server (RBAC from `drafs manifests rbac`,
//! tokens), with the mounts recorded instead of made. What the real kubelet
//! does with the agent is tests/realnode_csi.rs's (the real-node tier); here, the
//! bookkeeping a real node makes slow to reach: a republish restarts nothing,
//! a new token restarts the run on the same tree, unpublish twice is fine,
//! nothing is created for a refused publish.

use drafs_test_support as support;
use support::apiserver::RequestRecord;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drafs::engine::collection::{FollowHealth, Trouble};
use drafs::engine::shared::SharedSlices;
use drafs::node::csi::Service;
use drafs::node::grpc::{Code, Handler, Status};
use drafs::node::metrics::{Census, NodeMetrics};
use drafs::node::mounts::{AtTarget, Mounts};
use drafs::node::node_pods;
use drafs::node::places::{PENDING_HOLD, PlaceLimits};
use drafs::node::proto::Writer;
use drafs::node::request::TokenIn;
use drafs::node::served::{Limits, Served, Timing};
use drafs::publish::files::Room;
use support::*;

const UID: &str = "6f1d2c3a-9b8e-4d7f-a1b2-c3d4e5f60718";
/// The second pod's (`trainer-1`, the example's pod made again under another name).
const UID_2: &str = "7e2d3c4b-0a9f-4e8d-b2c3-d4e5f6071829";
const UUID: &str = "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b";

/// Mounts recorded (with their SELinux label), not made: the target
/// directories stay plain directories.
#[derive(Default, Clone)]
struct Recorded(Arc<Mutex<HashMap<PathBuf, Option<String>>>>);

impl Mounts for Recorded {
    fn mount_tmpfs(&self, target: &Path, _: Room, selinux_context: Option<&str>) -> std::io::Result<()> {
        self.0.lock().unwrap().insert(target.to_path_buf(), selinux_context.map(String::from));
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
        Ok(if self.0.lock().unwrap().contains_key(target) { AtTarget::Ours } else { AtTarget::Nothing })
    }
}

struct Agent {
    api: TestApi,
    /// The kubelet's deadline for a call (`grpc-timeout`).
    deadline: Mutex<Duration>,
    service: Service<Recorded>,
    mounts: Recorded,
    slices: Arc<SharedSlices>,
    kubelet: tempfile::TempDir,
}

const TIMING: Timing =
    Timing { watch_for: Duration::from_secs(120), refresh: Duration::from_secs(300), pending_hold: PENDING_HOLD };
const LIMITS: Limits = limits(110, 55);

const fn limits(max_pods: usize, per_namespace: usize) -> Limits {
    Limits { places: PlaceLimits { max_pods, per_namespace }, volume: Room { bytes: 4 << 20, inodes: 4096 } }
}

/// A second tenant: the example's pod again in namespace team-b, its own account and token.
const NS_B: &str = "team-b";
const TOKEN_B: &str = "team-b-token";
const UID_B: &str = "8f3e4d5c-1b0a-4f9e-c3d4-e5f607182930";
/// A pod with no claim at all, in ml.
const UID_PLAIN: &str = "9a4f5e6d-2c1b-4a0f-d4e5-f60718293041";

/// The agent's own account, with what `node.watchNodePods` grants it in the
/// chart (the real node's tier checks the chart's own objects).
const AGENT_TOKEN: &str = "drafs-node-token";
const AGENT_RBAC: &str = "
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: drafs-node}
rules:
- {apiGroups: [resource.k8s.io], resources: [resourceslices], verbs: [list, watch]}
- {apiGroups: [''], resources: [pods], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: drafs-node}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: drafs-node}
subjects: [{kind: ServiceAccount, name: drafs-node, namespace: drafs-system}]
";

fn agent() -> Agent {
    agent_with(TIMING, LIMITS)
}

fn agent_with(timing: Timing, limits: Limits) -> Agent {
    // kube's client starts its buffer task on the runtime.
    let _runtime = runtime().enter();
    let api = TestApi::start(&format!("{}\n---\n{}\n---\n{AGENT_RBAC}", rbac_yaml("ml"), rbac_yaml(NS_B)), "ml");
    api.add_token(TOKEN, "system:serviceaccount:ml:drafs");
    api.add_token(TOKEN_B, &format!("system:serviceaccount:{NS_B}:drafs"));
    api.add_token(AGENT_TOKEN, "system:serviceaccount:drafs-system:drafs-node");
    let example = read("examples/offline/gpu-training.yaml");
    api.load_yaml(&example);
    api.load_yaml(&example.replace("trainer-0", "trainer-1").replace(UID, UID_2));
    api.load_yaml(&example.replace("namespace: ml", &format!("namespace: {NS_B}")).replace(UID, UID_B));
    api.apply(PodBuilder::new("ml", "plain").uid(UID_PLAIN).node("gpu-node-7").container("app", "busybox").build());
    let kubelet = tempfile::tempdir().unwrap();
    let cluster = kube::Config::new(api.url().parse().unwrap());
    let mut own = cluster.clone();
    own.auth_info.token = Some(TOKEN.to_string().into());
    let slices = SharedSlices::new(kube::Client::try_from(own).unwrap());
    let mounts = Recorded::default();
    let metrics = Arc::new(NodeMetrics::default());
    let shared = kube::Client::try_from(cluster).unwrap();
    let volumes = Served::new(
        kubelet.path().to_path_buf(),
        shared,
        slices.clone(),
        timing,
        limits,
        mounts.clone(),
        metrics.clone(),
    );
    let service = Service {
        driver: "drafs.dev".into(),
        node_name: "gpu-node-7".into(),
        endpoint: "/csi.sock".into(),
        token_in: TokenIn::VolumeContext,
        readiness: None,
        volumes,
        metrics,
    };
    Agent { api, deadline: Mutex::new(Duration::from_secs(10)), service, mounts, slices, kubelet }
}

impl Agent {
    fn target(&self) -> PathBuf {
        self.target_of(UID, "dra")
    }

    fn target_of(&self, uid: &str, volume: &str) -> PathBuf {
        self.kubelet.path().join(format!("pods/{uid}/volumes/kubernetes.io~csi/{volume}/mount"))
    }

    fn publish_with(&self, target: &Path, token: &str, extra: &[(&str, &str)]) -> Result<Vec<u8>, Status> {
        self.publish_volume("csi-1", ("trainer-0", UID), target, token, extra)
    }

    /// A publish of volume `id` of pod `(name, uid)` in ml as the kubelet makes it.
    fn publish_volume(
        &self,
        id: &str,
        pod: (&str, &str),
        target: &Path,
        token: &str,
        extra: &[(&str, &str)],
    ) -> Result<Vec<u8>, Status> {
        self.publish_in("ml", id, pod, target, token, extra)
    }

    /// A publish of volume `id` of pod `(name, uid)` in `namespace` as the kubelet makes it.
    fn publish_in(
        &self,
        namespace: &str,
        id: &str,
        pod: (&str, &str),
        target: &Path,
        token: &str,
        extra: &[(&str, &str)],
    ) -> Result<Vec<u8>, Status> {
        self.publish_flagged(namespace, id, pod, target, (token, extra), &[])
    }

    /// [`Self::publish_in`] with these mount flags in its volume capability.
    fn publish_flagged(
        &self,
        namespace: &str,
        id: &str,
        (pod, uid): (&str, &str),
        target: &Path,
        (token, extra): (&str, &[(&str, &str)]),
        flags: &[&str],
    ) -> Result<Vec<u8>, Status> {
        let mut context: BTreeMap<String, String> = [
            ("csi.storage.k8s.io/ephemeral", "true"),
            ("csi.storage.k8s.io/pod.name", pod),
            ("csi.storage.k8s.io/pod.namespace", namespace),
            ("csi.storage.k8s.io/pod.uid", uid),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let tokens = serde_json::json!({"": {"token": token, "expirationTimestamp": "2026-12-03T14:00:00Z"}});
        context.insert("csi.storage.k8s.io/serviceAccount.tokens".into(), tokens.to_string());
        let mut mount = Writer::new();
        for flag in flags {
            mount.string(2, flag);
        }
        let mut capability = Writer::new();
        capability.message(2, mount);
        let mut req = Writer::new();
        req.string(1, id).string(4, &target.to_string_lossy()).message(5, capability).boolean(6, true).map(8, &context);
        self.call("/csi.v1.Node/NodePublishVolume", req.finish())
    }

    fn publish(&self, token: &str) -> Result<Vec<u8>, Status> {
        self.publish_with(&self.target(), token, &[])
    }

    fn unpublish(&self) -> Result<Vec<u8>, Status> {
        self.unpublish_volume("csi-1", &self.target())
    }

    fn unpublish_volume(&self, id: &str, target: &Path) -> Result<Vec<u8>, Status> {
        let mut req = Writer::new();
        req.string(1, id).string(2, &target.to_string_lossy());
        self.call("/csi.v1.Node/NodeUnpublishVolume", req.finish())
    }

    /// The payload `..data` points at in `target`.
    fn payload(&self, target: &Path) -> PathBuf {
        std::fs::read_link(target.join("..data")).unwrap()
    }

    /// The node's pods followed with the agent's own account, as `--watch-node-pods` does.
    fn watch_node_pods(&self) -> Arc<FollowHealth> {
        let mut own = kube::Config::new(self.api.url().parse().unwrap());
        own.auth_info.token = Some(AGENT_TOKEN.to_string().into());
        let _runtime = runtime().enter();
        let client = kube::Client::try_from(own).unwrap();
        let volumes = self.service.volumes.clone();
        let health = Arc::new(FollowHealth::default());
        let follow = node_pods::follow(client, "gpu-node-7".into(), health.clone(), volumes);
        runtime().spawn(follow);
        // Listed: what changes from now on is a change.
        let watching = wait_for(Duration::from_secs(10), || {
            self.api.requests().iter().any(|r| r.verb == "watch" && r.path == "/api/v1/pods" && r.token == AGENT_TOKEN)
        });
        assert!(watching, "the node's pods are not watched: {:?}", self.api.requests());
        health
    }

    /// Set the health the kubelet reports for the pod's GPU.
    fn report_health(&self, pod: &str, health: &str, message: &str) {
        let mut object = self.api.get("Pod", "ml", pod).unwrap();
        object["status"]["containerStatuses"] = serde_json::json!([{"name": "trainer", "ready": true, "restartCount": 0,
            "image": "i", "imageID": "", "allocatedResourcesStatus": [{"name": "claim:gpu",
            "resources": [{"resourceID": "gpu.nvidia.com/gpu-node-7/gpu-3", "health": health, "message": message}]}]}]);
        self.api.apply(object);
    }

    fn call(&self, method: &str, message: Vec<u8>) -> Result<Vec<u8>, Status> {
        runtime().block_on(self.service.call(method, message.into(), Some(*self.deadline.lock().unwrap())))
    }

    /// Requests for the pod and its claims since the last clear.
    /// Reads of the pod and its claims: a run that starts reads them first.
    /// Watches are not counted: a running run's watch may open after the
    /// publish that started it answered (it did, under load in CI).
    fn pod_and_claim_requests(&self) -> usize {
        let read = |r: &&RequestRecord| r.verb != "watch" && (r.resource == "pods" || r.resource == "resourceclaims");
        self.api.requests().iter().filter(read).count()
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
    assert!(a.mounts.0.lock().unwrap().contains_key(&target), "a tmpfs at the target");

    // The kubelet publishes again at every sync: the run is found, nothing is asked again.
    a.api.clear_requests();
    a.publish(TOKEN).expect("republished");
    assert_eq!(a.pod_and_claim_requests(), 0, "{:?}", a.api.requests());

    // A refreshed token: swapped into the run in place, nothing restarted
    // (the tree is not written again) and the next reads carry it.
    a.api.add_token("refreshed-token", "system:serviceaccount:ml:drafs");
    let payload = a.payload(&target);
    a.api.clear_requests();
    a.publish("refreshed-token").expect("published with the new token");
    assert_eq!(a.pod_and_claim_requests(), 0, "nothing read again: {:?}", a.api.requests());
    assert_eq!(a.payload(&target), payload, "the run was not restarted");
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

/// The kubelet's SELinux label (a `context=` mount flag, with the
/// CSIDriver's `seLinuxMount: true`) is given to the volume's tmpfs, so that
/// every tree the agent writes later has it; any other flag is refused with
/// the reason, and nothing is made.
#[test]
fn the_kubelets_selinux_context_labels_the_volumes_tmpfs() {
    let a = agent();
    let label = "system_u:object_r:container_file_t:s0:c4,c7";
    let target = a.target();
    let pod = ("trainer-0", UID);
    a.publish_flagged("ml", "csi-1", pod, &target, (TOKEN, &[]), &[&format!("context=\"{label}\"")])
        .expect("published");
    assert_eq!(a.mounts.0.lock().unwrap().get(&target), Some(&Some(label.to_string())));
    assert_eq!(std::fs::read_to_string(target.join("gpu/gpu/0/uuid")).unwrap(), UUID);

    let other = a.target_of(UID_2, "dra");
    let err = a
        .publish_flagged("ml", "csi-2", ("trainer-1", UID_2), &other, (TOKEN, &[]), &["context=\"a:b:c\",uid=0"])
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("only the kubelet's SELinux `context="), "{}", err.message);
    assert!(!a.kubelet.path().join(format!("pods/{UID_2}")).exists(), "nothing was created");
    assert_eq!(a.mounts.0.lock().unwrap().len(), 1);
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

/// With the pod's token refreshed (hourly, and for every volume after a
/// kubelet restart), the run reads as the new token from its next request on.
#[test]
fn a_refreshed_token_is_the_one_the_next_reads_carry() {
    // Every republish asks the pod and its claims again.
    let a = agent_with(Timing { watch_for: Duration::ZERO, refresh: Duration::ZERO, ..TIMING }, LIMITS);
    a.publish(TOKEN).expect("published");
    a.api.add_token("refreshed-token", "system:serviceaccount:ml:drafs");
    a.api.clear_requests();
    a.publish("refreshed-token").expect("republished");
    let mut asked = Vec::new();
    let read = wait_for(Duration::from_secs(30), || {
        asked =
            a.api.requests().into_iter().filter(|r| r.resource == "pods" || r.resource == "resourceclaims").collect();
        asked.len() >= 2
    });
    assert!(read, "the republish did not ask again: {asked:?}");
    assert!(asked.iter().all(|r| r.token == "refreshed-token"), "{asked:?}");
}

/// A pod gets one drafs volume; a second one is refused with the reason, and
/// nothing is made for it.
#[test]
fn a_second_volume_of_a_pod_is_refused_with_the_reason() {
    let a = agent();
    a.publish(TOKEN).expect("published");
    let second = a.target_of(UID, "dra-again");
    let err = a.publish_volume("csi-2", ("trainer-0", UID), &second, TOKEN, &[]).unwrap_err();
    assert_eq!(err.code, Code::FailedPrecondition);
    assert!(
        err.message.contains("has a drafs volume of view tree already") && err.message.contains("\"dra\""),
        "{}",
        err.message
    );
    assert!(!second.exists(), "nothing was made for it");
    assert_eq!(a.mounts.0.lock().unwrap().len(), 1);
}

/// The standard view's file of the pod's one claim, as written in `target`.
const STANDARD_FILE: &str = "resourceclaimtemplates/gpu/gpu/gpu.nvidia.com-metadata.json";

/// `view: standard` is the KEP-5304 view instead of the tree: a volume of its
/// own beside the pod's tree (one of each view per pod, a tmpfs each, both in
/// the pod's one place under --max-pods), live like the tree, leaving the
/// files of the drivers named in `metadataFromDrivers` to them (an empty
/// mount point, never written).
#[test]
fn a_pod_reads_the_standard_view_from_a_second_volume() {
    let a = agent_with(TIMING, limits(1, 1));
    a.publish(TOKEN).expect("the tree");
    let view = a.target_of(UID, "dra-metadata");
    a.publish_volume("csi-2", ("trainer-0", UID), &view, TOKEN, &[("view", "standard")])
        .expect("the standard view: in the pod's one place under --max-pods 1");
    let text = std::fs::read_to_string(view.join(STANDARD_FILE)).unwrap();
    let first: serde_json::Value = serde_json::Deserializer::from_str(&text).into_iter().next().unwrap().unwrap();
    assert_eq!(first["apiVersion"], "metadata.resource.k8s.io/v1beta1", "{text}");
    let device = &first["requests"][0]["devices"][0];
    assert_eq!(device["attributes"]["uuid"]["string"], UUID, "{text}");
    let names: Vec<String> =
        std::fs::read_dir(&view).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["resourceclaimtemplates"], "the standard view alone, no tree in it");
    assert!(a.mounts.0.lock().unwrap().contains_key(&view), "a tmpfs of its own");

    // One of each view: a second standard view is refused, with the reason.
    let again = a.target_of(UID, "dra-metadata-2");
    let err = a.publish_volume("csi-3", ("trainer-0", UID), &again, TOKEN, &[("view", "standard")]).unwrap_err();
    assert_eq!(err.code, Code::FailedPrecondition);
    assert!(err.message.contains("of view standard already"), "{}", err.message);
    // The node's two places are taken: another pod waits.
    let other = a.target_of(UID_2, "dra-metadata");
    let err = a.publish_volume("csi-4", ("trainer-1", UID_2), &other, TOKEN, &[("view", "standard")]).unwrap_err();
    assert_eq!(err.code, Code::ResourceExhausted, "{}", err.message);

    // The pod goes: both volumes are unpublished, and its place is free.
    a.unpublish().expect("the tree unpublished");
    a.unpublish_volume("csi-2", &view).expect("the view unpublished");
    assert!(!view.exists() && a.mounts.0.lock().unwrap().is_empty());
    // The second pod's driver writes its own file: drafs makes the mount point only.
    let own = [("view", "standard"), ("metadataFromDrivers", "gpu.nvidia.com")];
    a.publish_volume("csi-4", ("trainer-1", UID_2), &other, TOKEN, &own).expect("published");
    let file = other.join(STANDARD_FILE);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0, "the driver's mount point, empty");
    // An attribute that makes no sense for the tree is refused, with the fix.
    let tree = a.target_of(UID_2, "dra");
    let err = a
        .publish_volume("csi-5", ("trainer-1", UID_2), &tree, TOKEN, &[("metadataFromDrivers", "dra.net")])
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("view: standard"), "{}", err.message);
}

/// A pod being deleted: once its volume is unpublished, a publish of another
/// of its volumes (the kubelet retries the refused ones until the pod's
/// containers are gone, and one may arrive just after) is refused too, so the
/// pod's deletion leaves nothing mounted. The same volume again is served.
#[test]
fn a_pods_other_volume_is_refused_after_its_volume_is_unpublished() {
    let a = agent();
    a.publish(TOKEN).expect("published");
    a.unpublish().expect("unpublished");
    let second = a.target_of(UID, "dra-again");
    let err = a.publish_volume("csi-2", ("trainer-0", UID), &second, TOKEN, &[]).unwrap_err();
    assert_eq!(err.code, Code::FailedPrecondition);
    assert!(err.message.contains("was unpublished") && err.message.contains("\"dra\""), "{}", err.message);
    assert!(!second.exists(), "nothing was made for it");
    assert!(a.mounts.0.lock().unwrap().is_empty(), "nothing mounted");
    a.publish(TOKEN).expect("its own volume again");
}

/// A publish refused after its tmpfs was mounted (the tree's lock is held
/// by another writer) leaves nothing mounted: the kubelet does not unpublish
/// a volume whose publish failed for good.
#[test]
fn a_publish_refused_after_the_mount_leaves_nothing_mounted() {
    let a = agent();
    std::fs::create_dir_all(a.target()).unwrap();
    let _held = drafs::publish::files::DirTurns::take(&a.target()).expect("the test holds the tree's lock");
    let err = a.publish(TOKEN).unwrap_err();
    assert_eq!(err.code, Code::Unavailable);
    assert!(err.message.contains("another drafs agent"), "{}", err.message);
    assert!(a.mounts.0.lock().unwrap().is_empty(), "the tmpfs is left mounted");
}

/// Beyond --max-pods a publish is refused (ResourceExhausted) until a pod goes.
#[test]
fn the_node_serves_at_most_max_pods() {
    let a = agent_with(TIMING, limits(1, 1));
    a.publish(TOKEN).expect("published");
    let other = a.target_of(UID_B, "dra");
    let err = a.publish_in(NS_B, "csi-2", ("trainer-0", UID_B), &other, TOKEN_B, &[]).unwrap_err();
    assert_eq!(err.code, Code::ResourceExhausted);
    assert!(err.message.contains("serves 1 pods already") && err.message.contains("--max-pods"), "{}", err.message);
    assert!(!other.exists());
    a.unpublish().expect("unpublished");
    a.publish_in(NS_B, "csi-2", ("trainer-0", UID_B), &other, TOKEN_B, &[]).expect("served once the first pod went");
    assert_eq!(std::fs::read_to_string(other.join("gpu/gpu/0/uuid")).unwrap(), UUID);
}

/// One namespace holds at most its share of the node's places (half of
/// --max-pods unless --max-pods-per-namespace says otherwise): another
/// tenant's pod, its device allocated, is still served.
#[test]
fn one_namespace_cannot_take_every_place_of_the_node() {
    let a = agent_with(TIMING, limits(2, 1));
    a.publish(TOKEN).expect("ml's first pod");
    let second = a.target_of(UID_2, "dra");
    let err = a.publish_volume("csi-2", ("trainer-1", UID_2), &second, TOKEN, &[]).unwrap_err();
    assert_eq!(err.code, Code::ResourceExhausted);
    assert!(
        err.message.contains("namespace ml") && err.message.contains("--max-pods-per-namespace"),
        "{}",
        err.message
    );
    assert!(!second.exists(), "nothing made for a refused pod");
    let other = a.target_of(UID_B, "dra");
    a.publish_in(NS_B, "csi-b", ("trainer-0", UID_B), &other, TOKEN_B, &[]).expect("another namespace finds room");
    assert_eq!(std::fs::read_to_string(other.join("gpu/gpu/0/uuid")).unwrap(), UUID);
}

/// A pod with no claim at all is served its empty tree (`.ready`, nothing
/// else) and holds no place once it is written: a republish needs neither a
/// run nor a read.
#[test]
fn a_pod_without_claims_is_served_an_empty_tree_and_takes_no_place() {
    let a = agent_with(TIMING, limits(1, 1));
    let plain = a.target_of(UID_PLAIN, "dra");
    a.publish_volume("csi-p", ("plain", UID_PLAIN), &plain, TOKEN, &[]).expect("served");
    assert!(plain.join(".ready").exists());
    let names: Vec<String> = std::fs::read_dir(&plain)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".."))
        .collect();
    assert!(names.iter().all(|n| n.starts_with('.')), "no claim directory: {names:?}");
    a.publish(TOKEN).expect("the only place is free for a pod with a device");
    a.api.clear_requests();
    a.publish_volume("csi-p", ("plain", UID_PLAIN), &plain, TOKEN, &[]).expect("republished");
    assert_eq!(a.pod_and_claim_requests(), 0, "{:?}", a.api.requests());
    assert!(a.mounts.0.lock().unwrap().contains_key(&plain), "its tree stays");
}

/// A volume whose tree is never ready (a required value that never comes)
/// keeps its place while the kubelet keeps asking; once it has not asked for
/// a while and the node is full, the place goes to another pod, and the
/// stuck pod's volume is torn down (no container ever read it).
#[test]
fn a_volume_never_ready_gives_its_place_to_another_pod_once_the_kubelet_stops_asking() {
    let hold = Duration::from_millis(500);
    let a = agent_with(Timing { pending_hold: hold, ..TIMING }, limits(1, 1));
    // The kubelet's deadline, less drafs's answer margin: a publish waits half a second.
    *a.deadline.lock().unwrap() = Duration::from_millis(2500);
    let stuck = a.target_of(UID_2, "dra");
    let never = [("require", "gpu/gpu/0/noSuchAttribute")];
    let err = a.publish_volume("csi-2", ("trainer-1", UID_2), &stuck, TOKEN, &never).unwrap_err();
    assert_eq!(err.code, Code::Unavailable, "{}", err.message);
    let served = wait_for(Duration::from_secs(10), || a.publish(TOKEN).is_ok());
    assert!(served, "the stuck pod's place was not given to the pod that can be served");
    assert!(!a.mounts.0.lock().unwrap().contains_key(&stuck), "the stuck volume's tmpfs is gone");
    assert_eq!(std::fs::read_to_string(a.target().join("gpu/gpu/0/uuid")).unwrap(), UUID);
    // The stuck pod asks again: no place is free now, and it is told so.
    let err = a.publish_volume("csi-2", ("trainer-1", UID_2), &stuck, TOKEN, &never).unwrap_err();
    assert_eq!(err.code, Code::ResourceExhausted, "{}", err.message);
}

/// The uid the kubelet sends is the pod's: a pod of the same name with
/// another uid (deleted and made again) is not served into this volume.
#[test]
fn a_pod_of_the_same_name_but_another_uid_is_not_served() {
    let a = agent();
    let stale = "00000000-1111-2222-3333-444444444444";
    let target = a.target_of(stale, "dra");
    let err = a.publish_volume("csi-1", ("trainer-0", stale), &target, TOKEN, &[]).unwrap_err();
    assert_eq!(err.code, Code::Unavailable);
    assert!(err.message.contains("is another pod now") && err.message.contains(stale), "{}", err.message);
    assert!(!target.join("gpu").exists(), "no device of the other pod's in the volume");
}

/// An unpublish touches only its own volume's target.
#[test]
fn an_unpublish_for_another_target_is_refused_and_changes_nothing() {
    let a = agent();
    a.publish(TOKEN).expect("published");
    a.publish_volume("csi-2", ("trainer-1", UID_2), &a.target_of(UID_2, "dra"), TOKEN, &[]).expect("published");
    // Volume csi-1's id with csi-2's target, and an unknown id with csi-1's target.
    for (id, target) in [("csi-1", a.target_of(UID_2, "dra")), ("csi-unknown", a.target())] {
        let err = a.unpublish_volume(id, &target).unwrap_err();
        assert_eq!(err.code, Code::FailedPrecondition, "{id}: {}", err.message);
        assert!(err.message.contains("nothing was done"), "{}", err.message);
    }
    assert_eq!(a.mounts.0.lock().unwrap().len(), 2, "both volumes still mounted");
    assert_eq!(std::fs::read_to_string(a.target().join("gpu/gpu/0/uuid")).unwrap(), UUID);
    // Still live: the run of csi-1 was not stopped.
    a.api.clear_requests();
    a.publish(TOKEN).expect("republished");
    assert_eq!(a.pod_and_claim_requests(), 0, "found running, not started again: {:?}", a.api.requests());
}

/// Past its watch window a volume's pod is read only when poked: the agent's
/// one watch of the node's pods pokes it when its device status changes, and
/// only then (a pod's other changes, and pods not served, poke nothing).
#[test]
fn a_health_change_past_the_watch_window_reaches_the_tree_through_the_node_pod_watch() {
    let a = agent_with(Timing { watch_for: Duration::ZERO, refresh: Duration::from_secs(3600), ..TIMING }, LIMITS);
    a.publish(TOKEN).expect("published");
    a.watch_node_pods();
    let health = a.target().join("gpu/gpu/0/.health");
    let reads = |want: &str| {
        let read = wait_for(Duration::from_secs(10), || std::fs::read_to_string(&health).is_ok_and(|h| h == want));
        assert!(
            read,
            "{} is {:?}, not {want}: {:#?}",
            health.display(),
            std::fs::read_to_string(&health),
            a.api.requests().iter().map(|r| (&r.verb, &r.path, &r.query, r.status)).collect::<Vec<_>>()
        );
    };
    a.report_health("trainer-0", "Unhealthy", "XID 79");
    reads("Unhealthy");
    assert_eq!(std::fs::read_to_string(a.target().join("gpu/gpu/0/.healthMessage")).unwrap(), "XID 79");

    // A change that is not the device's status, and a pod drafs does not
    // serve, are passed to no volume; the health change after them is.
    let changes = |a: &Agent| {
        let text = a.service.metrics.render(&Census::default());
        text.lines().find_map(|l| l.strip_prefix("drafs_node_status_changes_total ")).map(str::to_string)
    };
    assert_eq!(changes(&a).as_deref(), Some("1"));
    let mut pod = a.api.get("Pod", "ml", "trainer-0").unwrap();
    pod["metadata"]["annotations"] = serde_json::json!({"example.com/touched": "yes"});
    a.api.apply(pod);
    a.report_health("trainer-1", "Unhealthy", "not served here");
    a.report_health("trainer-0", "Healthy", "");
    reads("Healthy");
    // The watch reports in order: once the last change is counted, the two before it were seen.
    let counted = wait_for(Duration::from_secs(10), || changes(&a).as_deref() != Some("1"));
    assert!(counted);
    assert_eq!(changes(&a).as_deref(), Some("2"), "only the served pod's health changes");
}

/// How long the agent's own lists and watches are counted under a fault.
const WINDOW: Duration = Duration::from_secs(6);
/// The most lists and watches of one collection the agent may make in
/// [`WINDOW`] when the server breaks every watch: its backoff's first delays
/// (1 s, 2 s, 4 s, each with up to 50 % more) allow 4 watches, each after a
/// list when the watch failed or expired; without a backoff it made over a
/// thousand a second.
const MOST_IN_WINDOW: usize = 9;

/// The agent's own lists and watches of `resource` (the node's slices, or its
/// pods with the agent's token) since `from`, as "verb status".
fn own_reads(a: &Agent, resource: &str, from: std::time::Instant) -> Vec<String> {
    let own = |r: &&RequestRecord| match resource {
        "pods" => r.token == AGENT_TOKEN,
        _ => true,
    };
    a.api
        .requests()
        .iter()
        .filter(|r| r.started >= from && r.resource == resource && matches!(r.verb.as_str(), "list" | "watch"))
        .filter(own)
        .map(|r| format!("{} {}", r.verb, r.status))
        .collect()
}

/// The agent's watches (the node's slices, shared by the volumes; the node's
/// pods) under a server that breaks every watch: each is
/// resumed, after the runs' backoff, and the metrics count it by reason.
fn own_watches_back_off(break_watches: impl Fn(&TestApi), reason: Trouble) {
    let a = agent();
    let from = std::time::Instant::now();
    break_watches(&a.api);
    a.publish(TOKEN).expect("published");
    let pods = a.watch_node_pods();
    while from.elapsed() < WINDOW {
        for resource in ["resourceslices", "pods"] {
            let seen = own_reads(&a, resource, from);
            assert!(
                seen.len() <= MOST_IN_WINDOW,
                "{} {resource} requests in {:?}: {seen:?}",
                seen.len(),
                from.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for resource in ["resourceslices", "pods"] {
        let seen = own_reads(&a, resource, from);
        assert!(seen.iter().filter(|r| r.starts_with("watch")).count() >= 2, "{resource} watched again: {seen:?}");
    }
    let slices = a.slices.status();
    let counted = |restarts: &[(Trouble, u64)]| restarts.iter().any(|(t, n)| *t == reason && *n >= 1);
    assert!(counted(&slices[0].restarts), "{reason:?} counted for the slices: {slices:?}");
    assert!(counted(&pods.restarts()), "{reason:?} counted for the pods: {:?}", pods.restarts());
    assert_eq!(std::fs::read_to_string(a.target().join("gpu/gpu/0/uuid")).unwrap(), UUID, "still served");
}

#[test]
fn the_agents_watches_closed_at_once_are_resumed_with_backoff() {
    own_watches_back_off(|api| api.set_watch_fault(WatchFault::CloseAtOnce), Trouble::CutShort);
}

#[test]
fn the_agents_watches_answering_410_relist_with_backoff() {
    own_watches_back_off(|api| api.set_watch_fault(WatchFault::Gone), Trouble::Expired);
}

#[test]
fn the_agents_failing_watches_list_again_with_backoff() {
    // 500, not 503: the kube client retries 503/429/504 by itself before reporting.
    let fault = Fault { verb: Some("watch".into()), resource: None, status: 500, count: usize::MAX };
    own_watches_back_off(|api| api.inject(fault.clone()), Trouble::WatchFailed);
}

/// The node's slice watch is shared while volumes use it, and stops with the last one.
#[test]
fn the_shared_slice_watch_ends_with_its_last_volume() {
    let a = agent();
    a.publish(TOKEN).expect("published");
    a.publish_volume("csi-2", ("trainer-1", UID_2), &a.target_of(UID_2, "dra"), TOKEN, &[]).expect("published");
    assert_eq!(a.slices.status().len(), 1, "one shared scope: {:?}", a.slices.status());
    a.unpublish().expect("unpublished");
    assert_eq!(a.slices.status().len(), 1, "still used by the second volume");
    a.unpublish_volume("csi-2", &a.target_of(UID_2, "dra")).expect("unpublished");
    let ended = wait_for(Duration::from_secs(10), || a.slices.status().is_empty());
    assert!(ended, "the scope is still followed: {:?}", a.slices.status());
    // A later volume starts it again.
    a.publish(TOKEN).expect("published again");
    assert_eq!(a.slices.status().len(), 1);
}

/// A volume's slow write holds up no other call: a republish with a
/// refreshed token answers at once (it used to stop the run, waiting for the
/// write, under a lock every volume needs), and other volumes are published
/// and unpublished meanwhile.
#[test]
fn a_slow_write_on_one_volume_holds_up_no_call() {
    let a = agent();
    a.publish(TOKEN).expect("published");
    let other = a.target_of(UID_2, "dra");
    a.publish_volume("csi-2", ("trainer-1", UID_2), &other, TOKEN, &[]).expect("published");
    // From now on every write of csi-1's tree takes 20 s more, and says when it starts.
    let marker = a.kubelet.path().join("write-started");
    let slow = format!("20000:{}:{}", marker.display(), a.target().display());
    // SAFETY: nextest runs each test in a process of its own; no other thread reads the environment now.
    unsafe { std::env::set_var("DRAFS_TEST_SLOW_WRITE", slow) };
    // The driver changes the device: both trees are written again, csi-1's slowly.
    let mut slice = a.api.get("ResourceSlice", "", "gpu-node-7-gpu.nvidia.com-k2m9x").expect("the example's slice");
    for d in slice.pointer_mut("/spec/devices").and_then(|d| d.as_array_mut()).unwrap() {
        d["attributes"]["productName"] = serde_json::json!({"string": "NVIDIA H200 (rev 2)"});
    }
    a.api.apply(slice);
    wait_until("csi-1's slow write started", Duration::from_secs(30), || marker.exists());
    let old = || std::fs::read_to_string(a.target().join("gpu/gpu/0/productName")).unwrap() == "NVIDIA H200";
    a.api.add_token("refreshed-token", "system:serviceaccount:ml:drafs");
    a.publish("refreshed-token").expect("republished with a refreshed token");
    a.unpublish_volume("csi-2", &other).expect("csi-2 unpublished");
    a.publish_volume("csi-2", ("trainer-1", UID_2), &other, TOKEN, &[]).expect("csi-2 published again");
    assert!(old(), "csi-1's write is still under way: none of these calls waited for it");
    // The write lands; the run, never stopped, serves on.
    wait_until("csi-1's tree updated", Duration::from_secs(60), || !old());
}

/// The agent's log, written by the calls made inside [`logged`].
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Run `calls` with the log of this thread (where each call is driven) captured.
fn logged(calls: impl FnOnce()) -> String {
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish();
    tracing::subscriber::with_default(subscriber, calls);
    String::from_utf8(log.0.lock().unwrap().clone()).unwrap()
}

/// Every line about a volume names its pod: the pod the agent serves, or for
/// a volume it does not know (unpublished after the agent restarted, or
/// refused before it is looked up) the uid in the kubelet's target path.
#[test]
fn every_line_about_a_volume_names_its_pod() {
    let a = agent();
    let log = logged(|| {
        a.publish(TOKEN).expect("published");
        a.unpublish_volume("csi-1", &a.target_of(UID_2, "dra")).unwrap_err();
        std::fs::create_dir_all(a.target_of(UID_2, "dra")).unwrap();
        a.unpublish_volume("csi-from-before-a-restart", &a.target_of(UID_2, "dra")).expect("unpublished");
        a.unpublish().expect("unpublished");
    });
    let about_volumes: Vec<&str> = log.lines().filter(|l| l.contains("volume{")).collect();
    assert!(about_volumes.len() >= 4, "{log}");
    for line in &about_volumes {
        assert!(!line.contains("pod=\"\"") && !line.contains("pod= "), "a line without its pod: {line}");
    }
    let of = |volume: &str, what: &str| about_volumes.iter().any(|l| l.contains(volume) && l.contains(what));
    assert!(of(&format!("pod=uid {UID_2} volume=csi-from-before-a-restart"), "unpublished"), "{log}");
    assert!(of("pod=ml/trainer-0 volume=csi-1", "unpublish refused"), "{log}");
    assert!(of("pod=ml/trainer-0 volume=csi-1", "unpublished"), "{log}");
}

/// CSI's `Probe` says what `/readyz` says: not ready until the kubelet has
/// confirmed the registration, or while a socket is not the agent's (it
/// answered ready whatever the agent's state).
#[test]
fn the_csi_probe_says_what_readyz_says() {
    struct Unready;
    impl drafs::publish::metrics::Exposition for Unready {
        fn text(&self) -> String {
            String::new()
        }
        fn unready_reason(&self) -> Option<String> {
            Some("the kubelet has not confirmed the registration yet".into())
        }
    }
    let mut a = agent();
    let ready = a.call("/csi.v1.Identity/Probe", Vec::new()).expect("probed");
    assert_eq!(ready, [0x0a, 0x02, 0x08, 0x01], "ProbeResponse{{ready: {{value: true}}}}");
    a.service.readiness = Some(Arc::new(Unready));
    let unready = a.call("/csi.v1.Identity/Probe", Vec::new()).expect("probed");
    assert!(!unready.windows(2).any(|w| w == [0x08, 0x01]), "not ready: {unready:?}");
}
