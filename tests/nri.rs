//! `drafs node --nri`'s door without a runtime: a test plays containerd on
//! the plugin's socket (NRI's multiplexer and ttrpc, written here from the
//! protocol, not from drafs's own wire), against drafs's test API server,
//! with the mounts recorded instead of made. What the real runtime does with
//! the answers is tests/realnode_nri.rs's; here, what a real node makes slow
//! to reach: a slow API server, a value that never comes, a restart.

use drafs_test_support as support;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use drafs::engine::collection::FollowHealth;
use drafs::engine::shared::SharedSlices;
use drafs::node::metrics::NodeMetrics;
use drafs::node::mounts::{AtTarget, Mounts};
use drafs::node::node_pods;
use drafs::node::nri::api;
use drafs::node::nri::door::{NriDoor, NriSettings};
use drafs::node::nri::metrics::NriMetrics;
use drafs::node::nri::plugin::{self, PluginSettings};
use drafs::node::places::{PENDING_HOLD, PlaceLimits};
use drafs::node::served::{Limits, Served, Timing};
use drafs::publish::files::Room;
use support::*;

const NODE: &str = "n1";
const AGENT_TOKEN: &str = "drafs-node-token";
const AGENT_RBAC: &str = "
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: drafs-node}
rules:
- {apiGroups: [resource.k8s.io], resources: [resourceslices], verbs: [list, watch]}
- {apiGroups: [''], resources: [pods], verbs: [get, list, watch]}
- {apiGroups: [resource.k8s.io], resources: [resourceclaims], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: drafs-node}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: drafs-node}
subjects: [{kind: ServiceAccount, name: drafs-node, namespace: drafs-system}]
";

/// Mounts recorded, not made: the target directories stay plain directories.
#[derive(Default, Clone)]
struct Recorded(Arc<Mutex<HashSet<PathBuf>>>);

impl Mounts for Recorded {
    fn mount_tmpfs(&self, target: &Path, _: Room) -> std::io::Result<()> {
        self.0.lock().unwrap().insert(target.to_path_buf());
        Ok(())
    }
    fn unmount(&self, target: &Path) -> std::io::Result<()> {
        self.0.lock().unwrap().remove(target);
        std::fs::remove_dir_all(target)?;
        std::fs::create_dir(target)
    }
    fn at(&self, target: &Path) -> std::io::Result<AtTarget> {
        Ok(if self.0.lock().unwrap().contains(target) { AtTarget::Ours } else { AtTarget::Nothing })
    }
}

// --- the runtime's side of the socket: NRI's multiplexer and ttrpc -------------------------

#[derive(Clone, PartialEq, prost::Message)]
struct Request {
    #[prost(string, tag = "1")]
    service: String,
    #[prost(string, tag = "2")]
    method: String,
    #[prost(bytes = "vec", tag = "3")]
    payload: Vec<u8>,
    #[prost(int64, tag = "4")]
    timeout_nano: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Response {
    #[prost(message, optional, tag = "1")]
    status: Option<RpcStatus>,
    #[prost(bytes = "vec", tag = "2")]
    payload: Vec<u8>,
}

/// containerd's end of the plugin's connection, as a test plays it.
struct Runtime {
    socket: tokio::net::UnixStream,
    /// Bytes read per connection, not yet a whole message.
    pending: BTreeMap<u32, Vec<u8>>,
    next_stream: u32,
}

impl Runtime {
    /// Accept the plugin on `listener`, answer its registration, configure
    /// it and synchronize it with `pods`; the events it subscribed to.
    async fn accept(listener: &tokio::net::UnixListener, pods: Vec<api::PodSandbox>) -> (Runtime, i32) {
        let (socket, _) = listener.accept().await.unwrap();
        let mut runtime = Runtime { socket, pending: BTreeMap::new(), next_stream: 1 };
        let (conn, stream, kind, body) = runtime.read().await;
        assert_eq!((conn, kind), (2, 1), "the plugin registers first, on the runtime's connection");
        let register = Request::decode(body.as_slice()).unwrap();
        assert_eq!(register.method, "RegisterPlugin");
        let asked = api::RegisterPluginRequest::decode(register.payload.as_slice()).unwrap();
        assert_eq!((asked.plugin_name.as_str(), asked.plugin_idx.len()), ("drafs", 2));
        runtime.write(2, stream, 2, &Response::default().encode_to_vec()).await;
        let configure =
            api::ConfigureRequest { runtime_name: "containerd".into(), request_timeout: 2000, ..Default::default() };
        let events = api::ConfigureResponse::decode(
            runtime.call("Configure", &configure, Duration::from_secs(2)).await.unwrap().as_slice(),
        )
        .unwrap()
        .events;
        let sync = api::SynchronizeRequest { pods, containers: vec![], more: false };
        runtime.call("Synchronize", &sync, Duration::from_secs(2)).await.unwrap();
        (runtime, events)
    }

    async fn write(&mut self, conn: u32, stream: u32, kind: u8, body: &[u8]) {
        let mut frame = Vec::new();
        frame.extend_from_slice(&conn.to_be_bytes());
        frame.extend_from_slice(&((10 + body.len()) as u32).to_be_bytes());
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(&stream.to_be_bytes());
        frame.extend_from_slice(&[kind, 0]);
        frame.extend_from_slice(body);
        self.socket.write_all(&frame).await.unwrap();
    }

    /// The next whole message: (connection, stream, type, body).
    async fn read(&mut self) -> (u32, u32, u8, Vec<u8>) {
        loop {
            for (conn, bytes) in self.pending.iter_mut() {
                if bytes.len() >= 10 {
                    let length = u32::from_be_bytes(bytes[0..4].try_into().unwrap()) as usize;
                    if bytes.len() >= 10 + length {
                        let message: Vec<u8> = bytes.drain(..10 + length).collect();
                        let stream = u32::from_be_bytes(message[4..8].try_into().unwrap());
                        return (*conn, stream, message[8], message[10..].to_vec());
                    }
                }
            }
            let mut header = [0u8; 8];
            self.socket.read_exact(&mut header).await.unwrap();
            let conn = u32::from_be_bytes(header[0..4].try_into().unwrap());
            let mut bytes = vec![0u8; u32::from_be_bytes(header[4..8].try_into().unwrap()) as usize];
            self.socket.read_exact(&mut bytes).await.unwrap();
            self.pending.entry(conn).or_default().extend(bytes);
        }
    }

    /// Call the plugin's `method` with `timeout` (its deadline travels with
    /// the request); its answer, or its error status (code, message).
    async fn call(
        &mut self,
        method: &str,
        message: &impl Message,
        timeout: Duration,
    ) -> Result<Vec<u8>, (i32, String)> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let request = Request {
            service: api::PLUGIN_SERVICE.into(),
            method: method.into(),
            payload: message.encode_to_vec(),
            timeout_nano: timeout.as_nanos() as i64,
        };
        self.write(1, stream, 1, &request.encode_to_vec()).await;
        loop {
            let (conn, got, kind, body) = self.read().await;
            if (conn, got, kind) == (1, stream, 2) {
                let response = Response::decode(body.as_slice()).unwrap();
                return match response.status.filter(|s| s.code != 0) {
                    Some(status) => Err((status.code, status.message)),
                    None => Ok(response.payload),
                };
            }
        }
    }

    async fn create_container(
        &mut self,
        pod: &api::PodSandbox,
        container: &str,
        mounts: Vec<api::Mount>,
    ) -> Result<api::CreateContainerResponse, (i32, String)> {
        let container =
            api::Container { name: container.into(), pod_sandbox_id: pod.id.clone(), mounts, ..Default::default() };
        let request = api::CreateContainerRequest { pod: Some(pod.clone()), container: Some(container) };
        let answer = self.call("CreateContainer", &request, Duration::from_secs(2)).await?;
        Ok(api::CreateContainerResponse::decode(answer.as_slice()).unwrap())
    }
}

// --- the agent -------------------------------------------------------------------------------

struct Agent {
    api: TestApi,
    dir: tempfile::TempDir,
    mounts: Recorded,
    runtime: Runtime,
    served: Arc<Served<Recorded>>,
    /// Its watch of the node's pods and its plugin's life.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap())
}

fn api() -> TestApi {
    if std::env::var_os("NRI_TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter("drafs=debug").with_writer(std::io::stderr).try_init();
    }
    let _rt = rt().enter();
    let api = TestApi::start(AGENT_RBAC, "drafs-system");
    api.add_token(AGENT_TOKEN, "system:serviceaccount:drafs-system:drafs-node");
    api
}

/// The agent against `api` through NRI, joined to a runtime that
/// synchronizes it with `pods` (and the mounts and directories of `reuse`,
/// an agent before it, if any).
fn agent_with(api: TestApi, pods: Vec<api::PodSandbox>, reuse: Option<(tempfile::TempDir, Recorded)>) -> Agent {
    let _rt = rt().enter();
    let (dir, mounts) = reuse.unwrap_or_else(|| (tempfile::tempdir().unwrap(), Recorded::default()));
    let mut config = kube::Config::new(api.url().parse().unwrap());
    config.auth_info.token = Some(AGENT_TOKEN.to_string().into());
    let own = kube::Client::try_from(config.clone()).unwrap();
    let timing = Timing { watch_for: Duration::ZERO, refresh: Duration::from_secs(300), pending_hold: PENDING_HOLD };
    let limits = Limits {
        places: PlaceLimits { max_pods: 110, per_namespace: 55 },
        volume: Room { bytes: 4 << 20, inodes: 4096 },
    };
    let served = Served::new(
        dir.path().join("kubelet"),
        own.clone(),
        SharedSlices::new(own.clone()),
        timing,
        limits,
        mounts.clone(),
        Arc::new(NodeMetrics::default()),
    );
    let settings =
        NriSettings { dir: dir.path().join("nri"), csi_driver: "drafs.dev".into(), wait: Duration::from_millis(500) };
    std::fs::create_dir_all(&settings.dir).unwrap();
    let door = NriDoor::new(served.clone(), own.clone(), settings, Arc::new(NriMetrics::default()));
    // The runtime's socket, a new one for each agent.
    let socket = (0..).map(|n| dir.path().join(format!("nri-{n}.sock"))).find(|p| !p.exists()).unwrap();
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let tasks = vec![
        rt().spawn(node_pods::follow(own, NODE.into(), Arc::new(FollowHealth::default()), door.clone())),
        rt().spawn(plugin::serve(door, PluginSettings { socket, name: "drafs".into(), index: "90".into() })),
    ];
    let (runtime, events) = rt().block_on(Runtime::accept(&listener, pods));
    // RunPodSandbox, RemovePodSandbox, CreateContainer: nothing more.
    assert_eq!(events, 0b1101, "the events subscribed to");
    Agent { api, dir, mounts, runtime, served, tasks }
}

impl Agent {
    /// Until the container's tree is ready: the node's pod watch saw the pod
    /// and its run wrote it (its creation is then answered at once).
    fn wait_ready(&self, uid: &str, container: &str) {
        let ready = wait_for(Duration::from_secs(10), || self.tree_of(uid, container).join(".ready").exists());
        assert!(ready, "the tree of {uid}/{container} is not ready before its creation");
    }

    fn nri_dir(&self) -> PathBuf {
        self.dir.path().join("nri")
    }

    fn tree_of(&self, uid: &str, container: &str) -> PathBuf {
        self.nri_dir().join(uid).join(container)
    }
}

/// Pod `ml/name` on the node, opted in by its own label: claim `gpus` of
/// requests `train` (g0) and `infer` (g1); `trainer` uses train, `server`
/// infer, `logger` nothing.
fn gpu_pod(api: &TestApi, name: &str, uid: &str, annotations: serde_json::Value) -> api::PodSandbox {
    gpu_pod_in(api, "ml", name, uid, annotations)
}

/// [`gpu_pod`] in `namespace`.
fn gpu_pod_in(
    api: &TestApi,
    namespace: &str,
    name: &str,
    uid: &str,
    annotations: serde_json::Value,
) -> api::PodSandbox {
    api.apply(
        PodBuilder::new(namespace, name)
            .uid(uid)
            .node(NODE)
            .labels(json!({"drafs.dev/nri": "enabled"}))
            .annotations(annotations)
            .claim("gpus", &format!("{name}-gpus"))
            .container("trainer", "i")
            .uses_request("gpus", "train")
            .container("server", "i")
            .uses_request("gpus", "infer")
            .container("logger", "i")
            .build(),
    );
    api.apply(
        ClaimBuilder::new(namespace, &format!("{name}-gpus"))
            .allocated()
            .result("train", "gpu.example.com", NODE, "g0")
            .result("infer", "gpu.example.com", NODE, "g1")
            .build(),
    );
    api::PodSandbox { namespace: namespace.into(), ..sandbox(name, uid, true) }
}

fn sandbox(name: &str, uid: &str, opted_in: bool) -> api::PodSandbox {
    let labels =
        if opted_in { [("drafs.dev/nri".to_string(), "enabled".to_string())].into() } else { Default::default() };
    api::PodSandbox {
        id: format!("sandbox-{uid}"),
        name: name.into(),
        uid: uid.into(),
        namespace: "ml".into(),
        labels,
        ..Default::default()
    }
}

fn gpus(api: &TestApi, mark: &str) {
    api.apply(
        SliceBuilder::new("gpus", "gpu.example.com", NODE)
            .node(NODE)
            .device("g0", json!({"uuid": {"string": format!("G0{mark}")}}))
            .device("g1", json!({"uuid": {"string": format!("G1{mark}")}}))
            .build(),
    );
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

#[test]
fn each_device_using_container_of_an_opted_in_pod_gets_its_own_tree_and_no_other_container_anything() {
    let api = api();
    gpus(&api, "");
    let pod = gpu_pod(&api, "p", "u1", json!({}));
    let mut a = agent_with(api, vec![], None);
    // Made as soon as the node's pod watch sees the pod: before its sandbox runs.
    a.wait_ready("u1", "trainer");
    rt().block_on(async {
        a.runtime
            .call("RunPodSandbox", &api::PodSandboxRequest { pod: Some(pod.clone()) }, Duration::from_secs(2))
            .await
            .unwrap();
        let trainer = a.runtime.create_container(&pod, "trainer", vec![]).await.expect("answered");
        let mounts = trainer.adjust.expect("adjusted").mounts;
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        assert_eq!(mounts[0].destination, "/dra");
        assert_eq!(mounts[0].source, a.tree_of("u1", "trainer").to_string_lossy());
        assert!(mounts[0].options.contains(&"ro".to_string()) && mounts[0].r#type == "bind", "{mounts:?}");
        let server = a.runtime.create_container(&pod, "server", vec![]).await.expect("answered");
        assert_eq!(server.adjust.unwrap().mounts[0].source, a.tree_of("u1", "server").to_string_lossy());
        let logger = a.runtime.create_container(&pod, "logger", vec![]).await.expect("answered");
        assert_eq!(logger.adjust, None, "a container that uses no device gets nothing");
        // A pod that did not opt in: answered at once, with nothing.
        let started = Instant::now();
        let other = a.runtime.create_container(&sandbox("q", "u2", false), "app", vec![]).await.expect("answered");
        assert_eq!(other.adjust, None);
        assert!(started.elapsed() < Duration::from_millis(200), "{:?}", started.elapsed());
    });
    // Each sees its own request's device only.
    assert_eq!(read(&a.tree_of("u1", "trainer").join("gpus/train/0/uuid")).as_deref(), Some("G0"));
    assert!(!a.tree_of("u1", "trainer").join("gpus/infer").exists(), "the trainer sees no other request");
    assert_eq!(read(&a.tree_of("u1", "server").join("gpus/infer/0/uuid")).as_deref(), Some("G1"));
    assert!(!a.tree_of("u1", "server").join("gpus/train").exists());
    // Live: a slice change reaches each container's tree.
    gpus(&a.api, "'");
    let live = wait_for(Duration::from_secs(10), || {
        read(&a.tree_of("u1", "trainer").join("gpus/train/0/uuid")).as_deref() == Some("G0'")
    });
    assert!(live, "the container's tree does not follow the slice");
    // The sandbox goes: so does the pod's tree.
    let target = a.nri_dir().join("u1");
    assert!(a.mounts.0.lock().unwrap().contains(&target));
    rt().block_on(a.runtime.call(
        "RemovePodSandbox",
        &api::PodSandboxRequest { pod: Some(pod) },
        Duration::from_secs(2),
    ))
    .unwrap();
    assert!(!a.mounts.0.lock().unwrap().contains(&target), "unmounted");
    assert!(!target.exists(), "removed");
}

#[test]
fn a_container_whose_required_value_is_not_there_waits_told_why_before_the_runtimes_deadline() {
    let api = api();
    gpus(&api, "");
    let pod = gpu_pod(&api, "p", "u1", json!({"drafs.dev/require": "gpus/train/0/.status/interfaceName"}));
    let mut a = agent_with(api, vec![], None);
    // Its tree is written (not ready) as soon as the node's pod watch sees the pod.
    let written = wait_for(Duration::from_secs(10), || a.tree_of("u1", "trainer").join("..data/.json").exists());
    assert!(written, "the pod's trees are not written before its containers are created");
    let started = Instant::now();
    let refused = rt().block_on(a.runtime.create_container(&pod, "trainer", vec![])).unwrap_err();
    let took = started.elapsed();
    assert_eq!(refused.0, 14, "Unavailable: {refused:?}");
    assert!(refused.1.contains("required path gpus/train/0/.status/interfaceName does not exist"), "{}", refused.1);
    assert!(took < Duration::from_millis(1750), "answered {took:?} after the call, the runtime gives 2 s");
    // Not the server's: it does not use the train request.
    rt().block_on(a.runtime.create_container(&pod, "server", vec![])).expect("the server is not held up");
    // The driver writes it (at prepare): the kubelet's next try finds it.
    let mut claim = a.api.get("ResourceClaim", "ml", "p-gpus").unwrap();
    claim["status"]["devices"] =
        json!([{"driver": "gpu.example.com", "pool": NODE, "device": "g0", "networkData": {"interfaceName": "net1"}}]);
    a.api.apply(claim);
    let served = wait_for(Duration::from_secs(10), || {
        rt().block_on(a.runtime.create_container(&pod, "trainer", vec![])).is_ok()
    });
    assert!(served, "served once the value is there");
    let got = read(&a.tree_of("u1", "trainer").join("gpus/train/0/.status/interfaceName"));
    if got.is_none() {
        let listing = std::process::Command::new("ls").arg("-laR").arg(a.tree_of("u1", "trainer")).output().unwrap();
        eprintln!("{}", String::from_utf8_lossy(&listing.stdout));
        eprintln!("{:?}", read(&a.tree_of("u1", "trainer").join(".json")));
    }
    assert_eq!(got.as_deref(), Some("net1"));
}

#[test]
fn a_namespace_whose_containers_never_get_ready_spends_its_share_of_the_runtime_not_the_nodes() {
    let api = api();
    gpus(&api, "");
    let never = json!({"drafs.dev/require": "gpus/train/0/.status/interfaceName"});
    let pods: Vec<_> = (0..6).map(|n| gpu_pod(&api, &format!("p{n}"), &format!("u{n}"), never.clone())).collect();
    let neighbour = gpu_pod_in(&api, "lab", "q", "v1", never.clone());
    let mut a = agent_with(api, vec![], None);
    for (n, _) in pods.iter().enumerate() {
        let written =
            wait_for(Duration::from_secs(10), || a.tree_of(&format!("u{n}"), "trainer").join("..data/.json").exists());
        assert!(written, "pod p{n}'s trees are not written");
    }
    // Each creation waits for its tree (the runtime holds every other
    // creation of the node meanwhile) until the namespace's share is spent.
    let mut waits = Vec::new();
    for pod in &pods {
        let started = Instant::now();
        let refused = rt().block_on(a.runtime.create_container(pod, "trainer", vec![])).unwrap_err();
        assert_eq!(refused.0, 14, "Unavailable: {refused:?}");
        waits.push((started.elapsed(), refused.1));
    }
    // The fifth waits what the namespace's bucket refilled meanwhile (a
    // little: it refills in a minute), and says so.
    for (_, said) in &waits[4..] {
        let waited = said.split("(waited ").nth(1).and_then(|rest| rest.split(' ').next());
        let waited: u64 = waited.and_then(|ms| ms.parse().ok()).unwrap_or_else(|| panic!("{waits:?}"));
        assert!(waited < 400, "waited {waited} ms of 500: {waits:?}");
        assert!(said.contains("namespace ml has spent its share"), "{waits:?}");
    }
    let full: Duration = waits[..4].iter().map(|(took, _)| *took).sum();
    assert!(full >= Duration::from_millis(1800), "the first four waited for their trees: {waits:?}");
    // Another namespace's creation still waits its whole time.
    let started = Instant::now();
    let refused = rt().block_on(a.runtime.create_container(&neighbour, "trainer", vec![])).unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(450), "lab's creation waited {:?}", started.elapsed());
    assert!(!refused.1.contains("share"), "{}", refused.1);
    // A tree that is ready is served whatever the share.
    let mut claim = a.api.get("ResourceClaim", "ml", "p5-gpus").unwrap();
    claim["status"]["devices"] =
        json!([{"driver": "gpu.example.com", "pool": NODE, "device": "g0", "networkData": {"interfaceName": "net1"}}]);
    a.api.apply(claim);
    a.wait_ready("u5", "trainer");
    rt().block_on(a.runtime.create_container(&pods[5], "trainer", vec![])).expect("served with its share spent");
}

#[test]
fn a_slow_api_server_cannot_hold_a_containers_creation_past_the_runtimes_deadline() {
    let api = api();
    gpus(&api, "");
    let mut a = agent_with(api, vec![], None);
    // Made after the agent joined, with every answer of the API server late.
    a.api.set_latency(Duration::from_secs(5));
    let pod = gpu_pod(&a.api, "p", "u1", json!({}));
    let started = Instant::now();
    let refused = rt().block_on(a.runtime.create_container(&pod, "trainer", vec![])).unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(1750), "answered {:?} after the call", started.elapsed());
    assert_eq!(refused.0, 14, "{refused:?}");
    // Healed: served at a later try.
    a.api.set_latency(Duration::ZERO);
    let served = wait_for(Duration::from_secs(20), || {
        rt().block_on(a.runtime.create_container(&pod, "trainer", vec![])).is_ok()
    });
    assert!(served, "served once the API server answers");
}

#[test]
fn a_drivers_own_standard_view_files_get_their_mount_points_and_are_never_written() {
    let api = api();
    gpus(&api, "");
    let standard = "/var/run/kubernetes.io/dra-device-attributes";
    let pod = gpu_pod(&api, "p", "u1", json!({"drafs.dev/metadata-dir": standard}));
    let mut a = agent_with(api, vec![], None);
    // The driver's own file, bound by the runtime (its CDI spec) below the standard path.
    a.wait_ready("u1", "trainer");
    let rel = "resourceclaims/p-gpus/train/gpu.example.com-metadata.json";
    let bind = api::Mount {
        destination: format!("{standard}/{rel}"),
        r#type: "bind".into(),
        source: "/var/run/cdi/x".into(),
        options: vec![],
    };
    let answer = rt().block_on(a.runtime.create_container(&pod, "trainer", vec![bind])).expect("answered");
    let mounts = answer.adjust.unwrap().mounts;
    let view = a.nri_dir().join("u1/trainer.metadata");
    assert_eq!(mounts.iter().map(|m| m.destination.as_str()).collect::<Vec<_>>(), ["/dra", standard]);
    assert_eq!(mounts[1].source, view.to_string_lossy());
    let placeholder = view.join(rel);
    assert!(placeholder.is_file(), "the driver's mount point is there");
    let before = read(&placeholder).unwrap();
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&placeholder).unwrap());
    // A change of the device: drafs's tree follows, the driver's file is left as it is.
    gpus(&a.api, "'");
    let live = wait_for(Duration::from_secs(10), || {
        read(&a.tree_of("u1", "trainer").join("gpus/train/0/uuid")).as_deref() == Some("G0'")
    });
    assert!(live);
    assert_eq!(read(&placeholder).unwrap(), before, "never written");
    assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&placeholder).unwrap()), inode, "never replaced");
}

#[test]
fn a_restarted_agent_takes_its_pods_trees_back_and_removes_those_of_pods_gone() {
    let api = api();
    gpus(&api, "");
    let pod = gpu_pod(&api, "p", "u1", json!({}));
    let mut a = agent_with(api, vec![], None);
    a.wait_ready("u1", "trainer");
    rt().block_on(a.runtime.create_container(&pod, "trainer", vec![])).expect("served");
    // A tree of a pod that went while the agent was away.
    let gone = a.nri_dir().join("u-gone");
    std::fs::create_dir_all(gone.join("app")).unwrap();
    a.mounts.0.lock().unwrap().insert(gone.clone());
    // The agent stops (its trees stay), and a new one starts: the runtime
    // synchronizes it with the pods it runs.
    let Agent { api, dir, mounts, served, tasks, runtime } = a;
    for task in tasks {
        task.abort();
    }
    rt().block_on(served.stop_all());
    drop(runtime);
    let b = agent_with(api, vec![pod.clone()], Some((dir, mounts)));
    assert!(!gone.exists() && !b.mounts.0.lock().unwrap().contains(&gone), "the gone pod's tree is removed");
    gpus(&b.api, "'");
    let live = wait_for(Duration::from_secs(10), || {
        read(&b.tree_of("u1", "trainer").join("gpus/train/0/uuid")).as_deref() == Some("G0'")
    });
    assert!(live, "the running pod's tree is live again");
}
