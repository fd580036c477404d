//! The NRI door's harness, shared by tests/nri.rs and benches/nri.rs: a
//! runtime the test plays on the plugin's socket (NRI's multiplexer and
//! ttrpc, written here from the protocol, not from drafs's own wire), the
//! agent against drafs's test API server, the mounts recorded, not made.

#![allow(dead_code)]

use drafs_test_support as support;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

pub const NODE: &str = "n1";
pub const AGENT_TOKEN: &str = "drafs-node-token";
pub const AGENT_RBAC: &str = "
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
pub struct Recorded(pub Arc<Mutex<HashSet<PathBuf>>>);

impl Mounts for Recorded {
    fn mount_tmpfs(&self, target: &Path, _: Room, _: Option<&str>) -> std::io::Result<()> {
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
pub struct Runtime {
    socket: tokio::net::UnixStream,
    /// Bytes read per connection, not yet a whole message.
    pending: BTreeMap<u32, Vec<u8>>,
    next_stream: u32,
}

impl Runtime {
    /// Accept the plugin on `listener`, answer its registration, configure
    /// it and synchronize it with `pods`; the events it subscribed to.
    pub async fn accept(listener: &tokio::net::UnixListener, pods: Vec<api::PodSandbox>) -> (Runtime, i32) {
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
    pub async fn call(
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

    pub async fn create_container(
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

pub struct Agent {
    pub api: TestApi,
    pub dir: tempfile::TempDir,
    pub mounts: Recorded,
    pub runtime: Runtime,
    pub served: Arc<Served<Recorded>>,
    /// Its watch of the node's pods and its plugin's life.
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

pub fn rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap())
}

pub fn api() -> TestApi {
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
pub fn agent_with(api: TestApi, pods: Vec<api::PodSandbox>, reuse: Option<(tempfile::TempDir, Recorded)>) -> Agent {
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
    pub fn wait_ready(&self, uid: &str, container: &str) {
        let ready = wait_for(Duration::from_secs(10), || self.tree_of(uid, container).join(".ready").exists());
        assert!(ready, "the tree of {uid}/{container} is not ready before its creation");
    }

    pub fn nri_dir(&self) -> PathBuf {
        self.dir.path().join("nri")
    }

    pub fn tree_of(&self, uid: &str, container: &str) -> PathBuf {
        self.nri_dir().join(uid).join(container)
    }
}

/// Pod `ml/name` on the node, opted in by its own label: claim `gpus` of
/// requests `train` (g0) and `infer` (g1); `trainer` uses train, `server`
/// infer, `logger` nothing.
pub fn gpu_pod(api: &TestApi, name: &str, uid: &str, annotations: serde_json::Value) -> api::PodSandbox {
    gpu_pod_in(api, "ml", name, uid, annotations)
}

/// [`gpu_pod`] in `namespace`.
pub fn gpu_pod_in(
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

pub fn sandbox(name: &str, uid: &str, opted_in: bool) -> api::PodSandbox {
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

pub fn gpus(api: &TestApi, mark: &str) {
    api.apply(
        SliceBuilder::new("gpus", "gpu.example.com", NODE)
            .node(NODE)
            .device("g0", json!({"uuid": {"string": format!("G0{mark}")}}))
            .device("g1", json!({"uuid": {"string": format!("G1{mark}")}}))
            .build(),
    );
}

pub fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}
