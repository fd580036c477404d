//! The real node for the real-node tier: a single-node cluster (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, containerd with
//! runc, the kubelet, and the upstream DRA test driver's kubelet plugin twice)
//! run by `tests/node/node.sh` inside network, mount and PID namespaces made
//! for it by `unshare`, so every address, port and fixed path it uses is the
//! namespace's own.
//!
//! The test talks to it by entering those namespaces (`nsenter`): kubectl as
//! the cluster admin, `drafs webhook` as a process on the node's loopback.
//! One cluster per test process (nextest runs each test in its own). The
//! runner stops when its standard input closes (on drop): everything in the
//! namespaces is killed, and the cgroups and sysctls the kubelet touched on the
//! host are put back; a hard kill of the test leaves those two for the next
//! start to sweep.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const SCRATCH_PREFIX: &str = "drafs-node-";
/// The drivers the node runs, named as in `examples/` so the examples apply
/// unchanged: the NIC driver writes KEP-5304 device metadata (as network
/// drivers do), and at prepare the status of the devices of the claims
/// annotated `dra-driver.test/status-at-prepare` (an interface name, its
/// data); the GPU driver does neither (drafs writes the standard view that
/// KubeVirt's launcher reads).
pub const GPU_DRIVER: &str = "gpu.nvidia.com";
pub const NIC_DRIVER: &str = "dra.net";
pub const NODE_NAME: &str = "drafs-node";
pub const DRAFS_IMAGE: &str = "drafs:realnode";
pub const SHELL_IMAGE: &str = "drafs-test/shell:1";

/// The node of this test process, or `None` (loudly) when the tier is
/// switched off outside CI. A node that cannot be built or started fails the test.
pub fn shared() -> Option<&'static Node> {
    if super::tier_skipped("DRAFS_NO_NODE_TESTS", "a real-node test") {
        return None;
    }
    static SHARED: OnceLock<Result<Node, String>> = OnceLock::new();
    match SHARED.get_or_init(Node::start) {
        Ok(node) => Some(node),
        Err(e) => panic!("the real node did not start: {e}"),
    }
}

/// The devices a driver publishes at start: realistic attributes of every
/// type, a PCI address and a capacity. `mark` goes into every GPU's
/// `productName` (a test changes it to see a live update).
pub fn devices(driver: &str, mark: &str) -> Value {
    let list: Vec<Value> = if driver == GPU_DRIVER {
        (0..8)
            .map(|i| {
                json!({
                    "name": format!("gpu-{i}"),
                    "attributes": {
                        "uuid": {"string": format!("GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c{i:02x}")},
                        "productName": {"string": format!("NVIDIA H200{mark}")},
                        "index": {"int": i},
                        "migCapable": {"bool": true},
                        "driverVersion": {"version": "570.124.6"},
                        "resource.kubernetes.io/pciBusID": {"string": format!("0000:{:02x}:00.0", 0x1a + i)},
                        "resource.kubernetes.io/pcieRoot": {"string": format!("pci0000:{:02x}", 0x19 + i)},
                    },
                    "capacity": {"memory": {"value": "141Gi"}},
                })
            })
            .chain([json!({
                // One GPU shared by memory (consumable capacity, KEP-5075): only
                // the `shared.gpu.nvidia.com` class selects it.
                "name": "gpu-shared",
                "allowMultipleAllocations": true,
                "attributes": {
                    "uuid": {"string": "GPU-5c1f7e2a-3b4d-4e6f-8a9b-0c1d2e3f4a5b"},
                    "productName": {"string": format!("NVIDIA H200{mark}")},
                    "resource.kubernetes.io/pciBusID": {"string": "0000:9a:00.0"},
                },
                "capacity": {"memory": {"value": "80Gi"}},
            })])
            .collect()
    } else {
        (0..4)
            .map(|i| {
                json!({
                    "name": format!("nic-{i}"),
                    "attributes": {
                        "ifName": {"string": format!("ens{}f0np0", 1 + i)},
                        "rdma": {"bool": true},
                        "numaNode": {"int": i / 2},
                        "firmware": {"version": "28.39.1002"},
                        "resource.kubernetes.io/pciBusID": {"string": format!("0000:{:02x}:00.1", 0x3b + i)},
                    },
                    "capacity": {"queues": {"value": "64"}},
                })
            })
            .collect()
    };
    Value::Array(list)
}

/// A running single-node cluster.
pub struct Node {
    work: PathBuf,
    /// The Go programs (tests/go/build.sh): kubectl, the kubelet, containerd...
    bin: PathBuf,
    runner: Mutex<Option<Child>>,
    /// The `unshare` process: it lives in the node's network and mount namespaces.
    ns_pid: u32,
}

fn sh(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Put back what a runner that died hard left on the host: the cgroups runc
/// made under the kubelet's cgroup root and the sysctls the kubelet changed.
fn undo_host_changes(work: &Path) {
    if let Ok(root) = std::fs::read_to_string(work.join("cgroup-root")) {
        let root = root.trim();
        if !root.is_empty() && !root.contains('/') {
            let hierarchies = std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten().map(|e| e.path());
            for dir in hierarchies.chain([PathBuf::from("/sys/fs/cgroup")]).map(|h| h.join(root)) {
                remove_cgroup_tree(&dir);
            }
        }
    }
    if let Ok(text) = std::fs::read_to_string(work.join("sysctl.orig")) {
        for line in text.lines() {
            if let Some((name, value)) = line.split_once(' ') {
                let path = Path::new("/proc/sys").join(name.replace('.', "/"));
                if std::fs::read_to_string(&path).is_ok_and(|now| now.trim() != value.trim()) {
                    let _ = std::fs::write(&path, value.trim());
                }
            }
        }
    }
}

/// Remove a cgroup directory and its children, deepest first (cgroups go with rmdir).
fn remove_cgroup_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Scratch directories of runners whose test process is gone: undo and remove.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(SCRATCH_PREFIX) else { continue };
        let pid: i32 = rest.split('-').next().and_then(|p| p.parse().ok()).unwrap_or(0);
        // SAFETY: kill with signal 0 only checks that the pid exists.
        if pid > 0 && unsafe { libc::kill(pid, 0) } != 0 {
            undo_host_changes(&entry.path());
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn images_dir() -> PathBuf {
    std::env::var_os("DRAFS_NODE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("drafs-node")))
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/drafs-node"))
        .join("images")
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut runner) = self.runner.lock().unwrap().take() {
            drop(runner.stdin.take());
            let deadline = Instant::now() + Duration::from_secs(60);
            while runner.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = runner.kill();
            let _ = runner.wait();
        }
        undo_host_changes(&self.work);
        if std::env::var_os("DRAFS_KEEP_NODE").is_none() {
            let _ = std::fs::remove_dir_all(&self.work);
        }
    }
}

impl Node {
    fn start() -> Result<Node, String> {
        sweep_stale();
        let bin = super::controlplane::binaries()?;
        // DRAFS_NODE_IMAGES: images already built for this checkout (CI builds
        // them in its set-up; a second cargo build from a test's environment
        // would start over).
        let images = match std::env::var_os("DRAFS_NODE_IMAGES") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let images = images_dir();
                let mut build = Command::new("bash");
                build.arg(super::repo_path("tests/node/images.sh")).arg(&images).arg(bin.join("pause"));
                // The environment of a shell, as the set-up built it, not the
                // one cargo gives a test (CARGO_*, RUSTUP_TOOLCHAIN,
                // LD_LIBRARY_PATH into target/): the image's build then finds
                // the set-up's, and costs seconds when nothing changed.
                build.env_clear();
                for key in ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "CARGO_TARGET_DIR", "XDG_CACHE_HOME", "TMPDIR"]
                {
                    if let Some(value) = std::env::var_os(key) {
                        build.env(key, value);
                    }
                }
                sh(&mut build)?;
                images
            }
        };
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let id = format!("{}-{}", std::process::id(), SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let work = std::env::temp_dir().join(format!("{SCRATCH_PREFIX}{id}"));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
        std::fs::write(
            work.join("drivers"),
            format!("{GPU_DRIVER}:\n{NIC_DRIVER}:--enable-device-metadata --status-at-prepare\n"),
        )
        .map_err(|e| e.to_string())?;
        for driver in [GPU_DRIVER, NIC_DRIVER] {
            std::fs::write(work.join(format!("devices-{driver}.json")), devices(driver, "").to_string())
                .map_err(|e| e.to_string())?;
        }
        let mut cmd = Command::new("unshare");
        cmd.args(["--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "bash"])
            .arg(super::repo_path("tests/node/node.sh"))
            .args([&work, &bin, &images])
            .arg(&id)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.join("node.log")).map_err(|e| e.to_string())?);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let runner = cmd.spawn().map_err(|e| format!("cannot start unshare: {e}"))?;
        let ns_pid = runner.id();
        let node = Node { work, bin, runner: Mutex::new(Some(runner)), ns_pid };
        node.wait_ready(Duration::from_secs(300))?;
        node.kubectl_apply(&device_classes());
        Ok(node)
    }

    fn wait_ready(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if self.work.join("ready").exists() {
                return Ok(());
            }
            let failed = std::fs::read_to_string(self.work.join("failed")).ok();
            let exited = self.runner.lock().unwrap().as_mut().and_then(|r| r.try_wait().ok().flatten());
            if failed.is_some() || exited.is_some() || Instant::now() > deadline {
                return Err(format!(
                    "{} (runner {:?})\n{}",
                    failed.unwrap_or_else(|| format!("not ready after {limit:?}")),
                    exited,
                    self.diagnostics()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The runner's log and the tail of every component's log.
    pub fn diagnostics(&self) -> String {
        let mut out = std::fs::read_to_string(self.work.join("node.log")).unwrap_or_default();
        for entry in std::fs::read_dir(self.work.join("logs")).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out += &format!(
                "\n--- {} ---\n{}",
                entry.path().display(),
                lines[lines.len().saturating_sub(15)..].join("\n")
            );
        }
        out
    }

    /// A command run inside the node's network and mount namespaces.
    pub fn in_node(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.ns_pid)).args(["--net", "--mount", "--"]).arg(program);
        cmd.stdin(Stdio::null());
        cmd
    }

    /// A command run inside the node's network, mount and PID namespaces: it
    /// sees the node's /proc (its own /proc/self/mountinfo), as a pod would.
    pub fn in_node_pid(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        // The PID namespace is unshare's children's (its first child is the
        // namespace's init), not unshare's own.
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.ns_pid)).unwrap_or_default();
        let init = children.split_whitespace().next().expect("the node's runner has started").to_string();
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={init}")).args(["--net", "--mount", "--pid", "--"]).arg(program);
        cmd.stdin(Stdio::null());
        cmd
    }

    /// The PID namespace the node's processes run in (`pid:[...]`): tells
    /// the node's kube-apiserver from another test's.
    pub fn pid_namespace(&self) -> String {
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.ns_pid)).unwrap_or_default();
        let init = children.split_whitespace().next().unwrap_or_default().to_string();
        std::fs::read_link(format!("/proc/{init}/ns/pid")).map(|p| p.display().to_string()).unwrap_or_default()
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.work.join("admin.kubeconfig")
    }

    /// kubectl as the cluster admin, inside the node's namespaces.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_stdin(args, None)
    }

    /// `kubectl ARGS` in the node, as its admin, from the repository root; not started.
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut cmd = self.in_node(self.bin.join("kubectl"));
        cmd.arg("--kubeconfig").arg(self.admin_kubeconfig()).args(args).current_dir(super::repo_path(""));
        cmd
    }

    pub fn kubectl_stdin(&self, args: &[&str], input: Option<&str>) -> Output {
        let mut cmd = self.kubectl_command(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        if input.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd.spawn().expect("nsenter kubectl runs");
        if let Some(text) = input {
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// kubectl that must succeed: its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?}: {}", super::stderr(&out));
        super::stdout(&out)
    }

    /// `kubectl apply -f -` that must succeed.
    pub fn kubectl_apply(&self, yaml: &str) -> String {
        let out = self.kubectl_stdin(&["apply", "-f", "-"], Some(yaml));
        assert!(out.status.success(), "kubectl apply: {}\n{yaml}", super::stderr(&out));
        super::stdout(&out)
    }

    /// `kubectl create -f -` that must succeed: for objects too large for
    /// `apply`'s last-applied annotation (it copies the whole object there).
    pub fn kubectl_create(&self, yaml: &str) -> String {
        let out = self.kubectl_stdin(&["create", "-f", "-"], Some(yaml));
        assert!(out.status.success(), "kubectl create: {}", super::stderr(&out));
        super::stdout(&out)
    }

    /// containerd's `ctr` on the node's containerd, in the kubelet's namespace.
    pub fn ctr(&self) -> Command {
        let mut cmd = self.in_node(self.bin.join("ctr"));
        cmd.args(["--address", "/run/containerd/containerd.sock", "-n", "k8s.io"]);
        cmd
    }

    pub fn get_json(&self, args: &[&str]) -> Option<Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let out = self.kubectl(&all);
        out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
    }

    /// Wait until the pod satisfies `cond`; the pod as last seen.
    pub fn wait_pod(&self, ns: &str, name: &str, what: &str, limit: Duration, cond: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let pod = self.get_json(&["pod", "-n", ns, name]).unwrap_or(Value::Null);
            if cond(&pod) {
                return pod;
            }
            if Instant::now() > deadline {
                let describe = self.kubectl(&["describe", "pod", "-n", ns, name]);
                panic!(
                    "pod {ns}/{name}: not {what} after {limit:?}\n{}\n{}",
                    super::stdout(&describe),
                    self.diagnostics()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Wait until every container of the pod (init and sidecars included) is running or done.
    pub fn wait_running(&self, ns: &str, name: &str) -> Value {
        self.wait_pod(ns, name, "Running with every container ready", Duration::from_secs(120), |p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c["ready"] == true))
        })
    }

    /// `kubectl exec` in a container: its output (must succeed).
    pub fn exec(&self, ns: &str, pod: &str, container: &str, command: &[&str]) -> String {
        let mut args = vec!["exec", "-n", ns, pod, "-c", container, "--"];
        args.extend_from_slice(command);
        self.kubectl_ok(&args)
    }

    pub fn logs(&self, ns: &str, pod: &str, container: &str) -> String {
        super::stdout(&self.kubectl(&["logs", "-n", ns, pod, "-c", container]))
    }

    /// Change what a driver publishes: it notices the file and republishes its slice.
    pub fn set_devices(&self, driver: &str, devices: &Value) {
        let path = self.work.join(format!("devices-{driver}.json"));
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, devices.to_string()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }

    /// Report device health the way a driver monitoring its hardware does: the
    /// driver notices the file and tells the kubelet (DRAResourceHealth), which
    /// writes it into the pod's `allocatedResourcesStatus`.
    pub fn set_health(&self, driver: &str, health: &Value) {
        let path = self.work.join(format!("health-{driver}.json"));
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, health.to_string()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }

    /// A namespace with drafs's RBAC (`drafs manifests rbac`), at Pod Security `level` if given.
    pub fn namespace(&self, name: &str, level: Option<&str>) {
        let mut ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        if let Some(level) = level {
            ns["metadata"]["labels"] = json!({
                "pod-security.kubernetes.io/enforce": level,
                "pod-security.kubernetes.io/warn": level,
            });
        }
        self.kubectl_apply(&ns.to_string());
        self.kubectl_apply(&super::rbac_yaml(name));
    }

    /// A ResourceClaimTemplate whose request `request` asks one device of `class`.
    pub fn claim_template(&self, ns: &str, name: &str, class: &str, request: &str) {
        self.kubectl_apply(
            &json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": request, "exactly": {"deviceClassName": class}}
                ]}}},
            })
            .to_string(),
        );
    }

    /// A ResourceClaimTemplate whose request `gpu` asks `memory` of the GPU
    /// shared by memory (consumable capacity, class `shared.gpu.nvidia.com`).
    pub fn shared_gpu_template(&self, ns: &str, name: &str, memory: &str) {
        self.kubectl_apply(
            &json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "shared.gpu.nvidia.com",
                    "capacity": {"requests": {"memory": memory}},
                }}]}}},
            })
            .to_string(),
        );
    }

    /// The CSIDriver `drafs.dev` as drafs's chart installs it (docs/node-mode.md).
    pub fn csi_driver(&self) {
        self.kubectl_apply(
            &json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "drafs.dev"},
                "spec": {"attachRequired": false, "podInfoOnMount": true, "volumeLifecycleModes": ["Ephemeral"],
                         "tokenRequests": [{"audience": ""}], "requiresRepublish": true, "fsGroupPolicy": "None"},
            })
            .to_string(),
        );
    }

    /// `drafs node` on the node (in its PID namespace, so it goes with the
    /// node), as its DaemonSet would run it, logging to `log` in the work
    /// directory; the admin kubeconfig says where the API server is and reads
    /// the slices: everything about a pod is read with the pod's own token.
    /// Its own process group: `killpg` stops it and its nsenter.
    pub fn spawn_drafs_node(&self, args: &[&str], log: &str) -> Child {
        let mut cmd = self.in_node_pid(super::drafs_bin());
        cmd.args(["node", "--node-name", NODE_NAME])
            .args(args)
            .env("KUBECONFIG", self.admin_kubeconfig())
            .env("DRAFS_LOG", "info,drafs=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.work.join(log)).unwrap());
        cmd.process_group(0);
        cmd.spawn().unwrap()
    }

    /// Whether the kubelet lists `driver` among the node's CSI drivers.
    pub fn csi_registered(&self, driver: &str) -> bool {
        self.get_json(&["csinode", NODE_NAME])
            .is_some_and(|n| n["spec"]["drivers"].as_array().into_iter().flatten().any(|d| d["name"] == driver))
    }

    /// The chart's agent on the node (objects from [`chart_node_objects`]),
    /// ready (registered) once this returns.
    pub fn install_chart_agent(&self, objects: &str) {
        self.kubectl_apply(
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "drafs-system"}}).to_string(),
        );
        self.kubectl_apply(objects);
        self.wait_chart_agent();
    }

    /// Until the chart's DaemonSet has its one pod ready and the kubelet lists the driver.
    pub fn wait_chart_agent(&self) {
        let ds = super::wait_for(Duration::from_secs(90), || {
            self.get_json(&["daemonset", "-n", "drafs-system", "drafs-node"])
                .is_some_and(|d| d["status"]["numberReady"] == 1 && d["status"]["updatedNumberScheduled"] == 1)
        });
        assert!(
            ds,
            "the DaemonSet's pod is not ready\n{}",
            self.kubectl_ok(&["describe", "pods", "-n", "drafs-system"])
        );
        let registered = super::wait_for(Duration::from_secs(30), || self.csi_registered("drafs.dev"));
        assert!(registered, "the kubelet did not register drafs.dev; the agent's log:\n{}", self.chart_agent_log());
    }

    /// The chart agent's log (the DaemonSet's one pod).
    pub fn chart_agent_log(&self) -> String {
        self.kubectl_ok(&["logs", "-n", "drafs-system", "daemonset/drafs-node"])
    }

    /// The claim the scheduler made for a pod's claim (from its status).
    pub fn claim_of(&self, ns: &str, pod: &str, pod_claim: &str) -> String {
        let p = self.wait_pod(ns, pod, "with its claim allocated", Duration::from_secs(60), |p| {
            p["status"]["resourceClaimStatuses"]
                .as_array()
                .is_some_and(|s| s.iter().any(|c| c["name"] == pod_claim && c["resourceClaimName"].is_string()))
        });
        let statuses = p["status"]["resourceClaimStatuses"].as_array().unwrap();
        statuses.iter().find(|c| c["name"] == pod_claim).unwrap()["resourceClaimName"].as_str().unwrap().to_string()
    }

    /// The first device the scheduler allocated to a pod's claim (from its
    /// status), with the claim's name.
    pub fn allocated_device(&self, ns: &str, pod: &str, pod_claim: &str) -> AllocatedDevice {
        let claim = self.claim_of(ns, pod, pod_claim);
        let object = self.get_json(&["resourceclaim", "-n", ns, &claim]).expect("the pod's claim exists");
        let result = &object["status"]["allocation"]["devices"]["results"][0];
        let field =
            |name: &str| result[name].as_str().unwrap_or_else(|| panic!("{claim}: no {name} in {result}")).to_string();
        AllocatedDevice { driver: field("driver"), pool: field("pool"), device: field("device"), claim }
    }

    /// The test GPU driver reports `state` for one device (the kubelet's DRA
    /// health stream carries it into the pod's status).
    pub fn report_gpu_health(&self, device: &AllocatedDevice, state: &str, message: &str) {
        let report = json!([{"pool": device.pool, "device": device.device, "health": state, "message": message}]);
        self.set_health(GPU_DRIVER, &report);
    }

    /// The device the scheduler allocated to a pod's claim: (driver, device name).
    pub fn allocated(&self, ns: &str, pod: &Value, pod_claim: &str) -> (String, String) {
        // A claim the pod names directly, or the one made from its template (in the status).
        let named = pod["spec"]["resourceClaims"].as_array().into_iter().flatten().find(|c| c["name"] == pod_claim);
        let made =
            pod["status"]["resourceClaimStatuses"].as_array().into_iter().flatten().find(|s| s["name"] == pod_claim);
        let claim = named
            .and_then(|c| c["resourceClaimName"].as_str())
            .or_else(|| made.and_then(|s| s["resourceClaimName"].as_str()))
            .unwrap_or_else(|| panic!("pod has no ResourceClaim for {pod_claim}: {}", pod["status"]))
            .to_string();
        let claim = self.get_json(&["resourceclaim", "-n", ns, &claim]).expect("the pod's claim exists");
        let result = &claim["status"]["allocation"]["devices"]["results"][0];
        (result["driver"].as_str().unwrap().to_string(), result["device"].as_str().unwrap().to_string())
    }

    /// A device's attribute as the driver's ResourceSlice publishes it (the string form drafs serves).
    pub fn slice_attribute(&self, driver: &str, device: &str, attribute: &str) -> String {
        let slices = self.get_json(&["resourceslices"]).expect("slices");
        for slice in slices["items"].as_array().into_iter().flatten() {
            if slice["spec"]["driver"] != driver {
                continue;
            }
            for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
                if d["name"] == device {
                    let v = &d["attributes"][attribute];
                    for key in ["string", "version", "int", "bool"] {
                        if let Some(x) = v.get(key) {
                            return x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string());
                        }
                    }
                }
            }
        }
        panic!("no attribute {attribute} for {driver}/{device} in the slices")
    }

    /// Start `drafs webhook` on the node's loopback: it serves at https://127.0.0.1:PORT.
    pub fn spawn_in_node(&self, program: &Path, args: &[&str], log: &str) -> Child {
        let mut cmd = self.in_node(program);
        cmd.args(args).stdout(Stdio::null()).stderr(std::fs::File::create(self.work.join(log)).unwrap());
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        cmd.spawn().unwrap()
    }

    /// Restart the node's kubelet (its pods and their volumes stay, as on a
    /// real node) and wait until it is back.
    pub fn restart_kubelet(&self) {
        let restarts =
            |work: &Path| std::fs::read_to_string(work.join("kubelet-restarts")).map_or(0, |t| t.lines().count());
        let before = restarts(&self.work);
        {
            let mut runner = self.runner.lock().unwrap();
            let stdin = runner.as_mut().and_then(|r| r.stdin.as_mut()).expect("the node's runner");
            stdin.write_all(b"restart-kubelet\n").unwrap();
            stdin.flush().unwrap();
        }
        let back = super::wait_for(Duration::from_secs(180), || restarts(&self.work) > before);
        assert!(back, "the kubelet did not come back\n{}", self.diagnostics());
    }

    pub fn work(&self) -> &Path {
        &self.work
    }

    /// The Go test binary that decodes standard-view files with the upstream
    /// decoder (tests/go/metadata_test.go, as the kube tier runs it).
    pub fn metadata_decoder(&self) -> PathBuf {
        self.bin.join("metadata.test")
    }

    /// The upstream KEP-5304 decoder reads the standard view in `view` and
    /// finds in it what the tree's record `tree_json` says (it panics with the
    /// decoder's output when it does not).
    pub fn assert_decoder_agrees(&self, view: &Path, tree_json: &Path) {
        let out = Command::new(self.metadata_decoder())
            .args(["-test.run", "^TestDecodeStandardView$", "-test.v", "-test.count=1"])
            .env("DRAFS_METADATA_DIR", view)
            .env("DRAFS_TREE_JSON", tree_json)
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success() && text.contains("decoded and matched"),
            "the upstream decoder disagrees:\n{text}"
        );
    }

    /// The mount table of the node's mount namespace (where the kubelet and the pods' volumes are).
    pub fn mountinfo(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/mountinfo", self.ns_pid)).unwrap_or_default()
    }

    /// A path inside the node's mount namespace, seen from the test.
    pub fn node_path(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{path}", self.ns_pid))
    }
}

/// The extended resources (KEP-5004) that the node's whole-device classes
/// back: a pod asking `resources.limits: {nvidia.com/gpu: 1}` gets a GPU by DRA.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
pub const NIC_RESOURCE: &str = "dra.net/nic";

/// The device classes the examples ask for, on the node's drivers (whole
/// devices), and `shared.gpu.nvidia.com` for the GPU shared by memory.
fn device_classes() -> String {
    [
        ("gpu.nvidia.com", GPU_DRIVER, false, Some(GPU_RESOURCE)),
        ("vfio.gpu.nvidia.com", GPU_DRIVER, false, None),
        ("dra.net", NIC_DRIVER, false, Some(NIC_RESOURCE)),
        ("shared.gpu.nvidia.com", GPU_DRIVER, true, None),
    ]
    .iter()
    .map(|(class, driver, shared, extended)| {
        let expression = format!("device.driver == \"{driver}\" && device.allowMultipleAllocations == {shared}");
        let mut class = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": class},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        });
        if let Some(name) = extended {
            class["spec"]["extendedResourceName"] = json!(name);
        }
        class.to_string()
    })
    .collect::<Vec<_>>()
    .join("\n---\n")
}

/// Wait until the app's log has a line with `prefix`; that line.
pub fn log_line(node: &Node, ns: &str, pod: &str, container: &str, prefix: &str) -> String {
    let mut line = None;
    let found = super::wait_for(Duration::from_secs(60), || {
        line = node.logs(ns, pod, container).lines().find(|l| l.starts_with(prefix)).map(str::to_string);
        line.is_some()
    });
    assert!(found, "no {prefix:?} line in {ns}/{pod}/{container}:\n{}", node.logs(ns, pod, container));
    line.unwrap()
}

/// What the app reads at `path`, or "" while it is absent.
pub fn read_in_app(node: &Node, ns: &str, pod: &str, path: &str) -> String {
    node.exec(ns, pod, "app", &["sh", "-c", &format!("cat {path} 2>/dev/null || true")])
}

/// Wait until the app reads `want` at `path` (60 s at most), failing with what it read last.
pub fn wait_read_in_app(node: &Node, ns: &str, pod: &str, path: &str, want: &str) {
    let mut seen = String::new();
    let arrived = super::wait_for(Duration::from_secs(60), || {
        seen = read_in_app(node, ns, pod, path);
        seen == want
    });
    assert!(arrived, "{ns}/{pod}: the app reads {seen:?} at {path}, not {want:?}");
}

/// A pod that passes the `restricted` Pod Security level, whose app prints
/// the GPU's uuid and product name read from drafs's tree, then sleeps.
pub fn gpu_pod(ns: &str, name: &str, template: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{
                "name": "app", "image": SHELL_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo \"uuid=$(cat /dra/gpu/gpu/0/uuid) product=$(cat /dra/gpu/gpu/0/productName)\"; exec sleep 3600"],
                "resources": {"claims": [{"name": "gpu"}]},
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    })
    .to_string()
}

/// One device allocated to a pod's claim, as its ResourceClaim's status says.
#[derive(Debug, Clone)]
pub struct AllocatedDevice {
    pub claim: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// The chart's node part (`--set node.enabled=true`) for `image`, with more
/// `--set` values, as `helm template` renders it for the node.
pub fn chart_node_objects(image: &str, values: &[&str]) -> String {
    let (repository, tag) = image.split_once(':').unwrap();
    let mut cmd = Command::new(super::helm::binary());
    cmd.args(["template", "drafs", "deploy/helm/drafs", "--namespace", "drafs-system", "--kube-version", "1.37.2"])
        .args(["--set", "node.enabled=true", "--set", "image.pullPolicy=Never"])
        .args(["--set", &format!("image.repository={repository}"), "--set", &format!("image.tag={tag}")])
        .args(["--show-only", "templates/node.yaml"]);
    for value in values {
        cmd.args(["--set", value]);
    }
    let out = cmd.current_dir(super::repo_path("")).output().unwrap();
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}
