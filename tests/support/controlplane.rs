//! The real Kubernetes control plane for the kube test tier: etcd and
//! kube-apiserver built from their Go modules by `tests/go/build.sh`, started
//! on loopback with a CA and serving certificate made at start, RBAC, the
//! service-account token issuer, default admission and the DRA feature gates
//! drafs exposes.
//!
//! Each test process starts one (shared by the tests of that process, see
//! [`shared`]); a test that restarts the API server starts its own. Children are
//! started from a thread that lives as long as the process, with
//! `PR_SET_PDEATHSIG`, so they die with the test process on every exit path;
//! their scratch directories are removed on drop, and by the next start once
//! their process is gone.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Feature gates drafs relies on: list-typed attributes (alpha, off by default
/// in 1.37) and consumable capacity (`.shareID`, `.consumed/`: beta and on by
/// default since 1.36, set for clarity).
pub const FEATURE_GATES: &str = "DRAListTypeAttributes=true,DRAConsumableCapacity=true";

/// The oldest release serving `resource.k8s.io/v1`, which the tier also runs
/// against (`DRAFS_KUBE_VERSION=1.34`), with its default feature gates: what
/// it does not serve must degrade as docs/compatibility.md says.
pub const OLDEST: u32 = 34;

/// The minor version of the kube-apiserver this process runs: 37 unless
/// `DRAFS_KUBE_VERSION=1.34` asks for the oldest.
pub fn minor() -> u32 {
    match std::env::var("DRAFS_KUBE_VERSION").as_deref() {
        Err(_) | Ok("") | Ok("1.37") => 37,
        Ok("1.34") => OLDEST,
        Ok(other) => panic!("DRAFS_KUBE_VERSION={other}: the kube tier runs 1.37 (the default) or 1.34"),
    }
}

const ADMIN_TOKEN: &str = "drafs-test-admin-token";
const SCRATCH_PREFIX: &str = "drafs-kube-";

/// The shared control plane of this test process, or `None` (loudly) when the
/// tier is switched off outside CI. A control plane that cannot be built or
/// started fails the test.
pub fn shared() -> Option<&'static ControlPlane> {
    if super::tier_skipped("DRAFS_NO_KUBE_TESTS", "a real kube-apiserver test") {
        return None;
    }
    static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
    match SHARED.get_or_init(ControlPlane::start) {
        Ok(cp) => Some(cp),
        Err(e) => panic!("the real control plane did not start: {e}"),
    }
}

/// A control plane of the test's own (for tests that restart the API server).
pub fn private() -> Option<ControlPlane> {
    if super::tier_skipped("DRAFS_NO_KUBE_TESTS", "a real kube-apiserver test") {
        return None;
    }
    Some(ControlPlane::start().unwrap_or_else(|e| panic!("the real control plane did not start: {e}")))
}

/// The directory holding every Go program the tiers run (kube-apiserver, etcd,
/// kubectl, the kubelet, containerd, helm, metadata.test...): tests/go/build.sh,
/// built once, cached outside the checkout.
pub fn binaries() -> Result<PathBuf, String> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| cached_build(&["tests/go/build.sh"])).clone()
}

/// The kube-apiserver of [`minor`]: 1.37's from [`binaries`], or 1.34's
/// (`tests/go/build.sh v1.34`; etcd, kubectl and the rest stay 1.37's).
pub fn apiserver_binary() -> Result<PathBuf, String> {
    if minor() == 37 {
        return binaries().map(|d| d.join("kube-apiserver"));
    }
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| cached_build(&["tests/go/build.sh", "v1.34"])).clone().map(|d| d.join("kube-apiserver"))
}

/// Runs a build script of the repository (`[script, args...]`, its progress on
/// our stderr) that prints, last, the directory of what it built (cached
/// outside the checkout); that directory.
pub fn cached_build(command: &[&str]) -> Result<PathBuf, String> {
    let script = super::repo_path(command[0]);
    let what = command.join(" ");
    let out = Command::new("bash")
        .arg(&script)
        .args(&command[1..])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what} failed ({})", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| format!("{what} printed no directory"))
}

/// Children started here die with the process: they are spawned from a thread
/// that never ends, with a parent-death signal.
struct Keeper {
    tx: std::sync::mpsc::Sender<(Command, std::sync::mpsc::Sender<std::io::Result<Child>>)>,
}

fn spawn_kept(cmd: Command) -> std::io::Result<Child> {
    static KEEPER: OnceLock<Mutex<Keeper>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<(Command, std::sync::mpsc::Sender<std::io::Result<Child>>)>();
        std::thread::Builder::new()
            .name("controlplane-keeper".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
                    unsafe {
                        cmd.pre_exec(|| {
                            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                            Ok(())
                        });
                    }
                    let _ = reply.send(cmd.spawn());
                }
                // The sender lives in a static: this loop ends only with the process.
            })
            .expect("keeper thread");
        Mutex::new(Keeper { tx })
    });
    let (reply_tx, reply_rx) = std::sync::mpsc::channel();
    keeper.lock().unwrap().tx.send((cmd, reply_tx)).map_err(|_| std::io::Error::other("keeper gone"))?;
    reply_rx.recv().map_err(|_| std::io::Error::other("keeper gone"))?
}

/// Remove scratch directories of test processes that are gone.
fn sweep_stale_scratch() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(SCRATCH_PREFIX) else { continue };
        let pid: i32 = rest.split('-').next().and_then(|p| p.parse().ok()).unwrap_or(0);
        // SAFETY: kill with signal 0 only checks that the pid exists.
        if pid > 0 && unsafe { libc::kill(pid, 0) } != 0 {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Make a CA, a serving certificate for 127.0.0.1 signed by it, and the
/// service-account signing key.
use super::free_port;
use super::tls::run;

fn make_certs(dir: &Path) -> Result<(), String> {
    let p = |f: &str| dir.join(f);
    super::tls::ca(dir, "ca")?;
    super::tls::serving(dir, "ca", "apiserver", "IP:127.0.0.1,DNS:localhost", 2)?;
    run(Command::new("openssl")
        .args(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out"])
        .arg(p("sa.key")))?;
    std::fs::write(p("tokens.csv"), format!("{ADMIN_TOKEN},drafs-test-admin,drafs-test-admin,\"system:masters\"\n"))
        .map_err(|e| e.to_string())
}

/// A running etcd + kube-apiserver pair.
pub struct ControlPlane {
    dir: PathBuf,
    bin: PathBuf,
    etcd: Mutex<Option<Child>>,
    apiserver: Mutex<Option<Child>>,
    etcd_port: u16,
    pub port: u16,
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for child in [&self.apiserver, &self.etcd] {
            if let Some(mut c) = child.lock().unwrap().take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl ControlPlane {
    /// Start etcd and kube-apiserver; once more on other ports if one lost
    /// its port to another process between [`free_port`] and its bind.
    fn start() -> Result<ControlPlane, String> {
        let mut tries = 0;
        loop {
            tries += 1;
            match ControlPlane::start_once() {
                Err(e) if e.contains("address already in use") && tries < 3 => {
                    eprintln!(
                        "*** the control plane lost a port; starting it again: {}",
                        e.lines().last().unwrap_or("")
                    )
                }
                started => return started,
            }
        }
    }

    fn start_once() -> Result<ControlPlane, String> {
        sweep_stale_scratch();
        let bin = binaries()?;
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("{SCRATCH_PREFIX}{}-{seq}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        make_certs(&dir)?;
        let kubeconfig = dir.join("admin.kubeconfig");
        let etcd_port = free_port();
        let port = free_port();
        std::fs::write(&kubeconfig, kubeconfig_text(port, &dir.join("ca.crt"), ADMIN_TOKEN, "default"))
            .map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let client = runtime.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(&kubeconfig).map_err(|e| e.to_string())?;
            let config =
                kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.map_err(|e| e.to_string())?;
            kube::Client::try_from(config).map_err(|e| e.to_string())
        })?;
        let cp = ControlPlane {
            dir,
            bin,
            etcd: Mutex::new(None),
            apiserver: Mutex::new(None),
            etcd_port,
            port,
            runtime,
            client,
        };
        cp.start_etcd()?;
        cp.start_apiserver()?;
        Ok(cp)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// kubectl (built from the same module) as the cluster admin, run from the repository root.
    pub fn kubectl(&self, args: &[&str]) -> std::process::Output {
        Command::new(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(self.dir.join("admin.kubeconfig"))
            .args(args)
            .current_dir(super::repo_path(""))
            .stdin(Stdio::null())
            .output()
            .expect("kubectl runs")
    }

    /// The Go test binary that decodes standard-view files with the upstream decoder.
    pub fn metadata_decoder(&self) -> PathBuf {
        self.bin.join("metadata.test")
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(name)).unwrap()
    }

    fn start_etcd(&self) -> Result<(), String> {
        let client_url = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer_url = format!("http://127.0.0.1:{}", free_port());
        let mut cmd = Command::new(self.bin.join("etcd"));
        cmd.args(["--name", "default", "--data-dir"])
            .arg(self.dir.join("etcd-data"))
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .args(["--unsafe-no-fsync", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(self.log("etcd.log"))
            .stderr(self.log("etcd.log"));
        let child = spawn_kept(cmd).map_err(|e| format!("cannot start etcd: {e}"))?;
        *self.etcd.lock().unwrap() = Some(child);
        Ok(())
    }

    fn start_apiserver(&self) -> Result<(), String> {
        let d = |f: &str| self.dir.join(f).to_string_lossy().into_owned();
        let mut cmd = Command::new(apiserver_binary()?);
        cmd.args([
            &format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_port),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            &format!("--secure-port={}", self.port),
            &format!("--cert-dir={}", d("certs")),
            &format!("--tls-cert-file={}", d("apiserver.crt")),
            &format!("--tls-private-key-file={}", d("apiserver.key")),
            &format!("--client-ca-file={}", d("ca.crt")),
            &format!("--token-auth-file={}", d("tokens.csv")),
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            &format!("--service-account-key-file={}", d("sa.key")),
            &format!("--service-account-signing-key-file={}", d("sa.key")),
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/16",
            // No Endpoints for the `kubernetes` Service: no traffic goes anywhere but loopback.
            "--endpoint-reconciler-type=none",
            // 1.34 keeps its defaults (and has no DRAListTypeAttributes gate).
            &format!("--feature-gates={}", if minor() == 37 { FEATURE_GATES } else { "" }),
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ])
        .stdin(Stdio::null())
        .stdout(self.log("kube-apiserver.log"))
        .stderr(self.log("kube-apiserver.log"));
        let child = spawn_kept(cmd).map_err(|e| format!("cannot start kube-apiserver: {e}"))?;
        *self.apiserver.lock().unwrap() = Some(child);
        self.wait_ready(Duration::from_secs(120))
    }

    fn wait_ready(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            for (name, child) in [("etcd", &self.etcd), ("kube-apiserver", &self.apiserver)] {
                if let Some(c) = child.lock().unwrap().as_mut()
                    && let Ok(Some(status)) = c.try_wait()
                {
                    return Err(format!("{name} exited ({status}); log:\n{}", self.log_tail(&format!("{name}.log"))));
                }
            }
            match self.raw("GET", "/readyz", None, "application/json") {
                Ok((200, _)) => return Ok(()),
                Ok((code, body)) => last = format!("HTTP {code}: {body}"),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("kube-apiserver not ready after {limit:?}: {last}\n{}", self.log_tail("kube-apiserver.log")))
    }

    fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Stop kube-apiserver (etcd keeps the data) and start it again on the same port.
    pub fn restart_apiserver(&self, down_for: impl FnOnce()) {
        if let Some(mut c) = self.apiserver.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        down_for();
        self.start_apiserver().unwrap();
    }

    /// One request as the cluster admin: (status, body).
    pub fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        content_type: &str,
    ) -> Result<(u16, String), String> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .body(body.map(|b| serde_json::to_vec(b).unwrap()).unwrap_or_default())
            .map_err(|e| e.to_string())?;
        self.runtime.block_on(async {
            match self.client.request_text(req).await {
                Ok(text) => Ok((200, text)),
                Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
                Err(e) => Err(e.to_string()),
            }
        })
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>, content_type: &str) -> Value {
        match self.raw(method, path, body, content_type) {
            Ok((200, text)) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
            Ok((code, message)) => panic!("{method} {path}: HTTP {code}: {message}\nbody: {body:?}"),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    /// Create an object; panics with the API server's message if it is refused.
    pub fn create(&self, object: &Value) -> Value {
        self.call("POST", &collection_path(object), Some(object), "application/json")
    }

    /// Create an object unless it exists.
    pub fn ensure(&self, object: &Value) {
        match self.raw("POST", &collection_path(object), Some(object), "application/json") {
            Ok((200, _)) | Ok((409, _)) => {}
            other => panic!("create {}: {other:?}", object_path(object)),
        }
    }

    /// Server-side dry run of a create: `Err(message)` when the server refuses it.
    pub fn dry_run_create(&self, object: &Value) -> Result<(), String> {
        let path = format!("{}?dryRun=All&fieldValidation=Strict", collection_path(object));
        match self.raw("POST", &path, Some(object), "application/json") {
            Ok((200, _)) => Ok(()),
            Ok((code, message)) => Err(format!("HTTP {code}: {message}")),
            Err(e) => Err(e),
        }
    }

    /// The items of a list at `path`.
    pub fn list(&self, path: &str) -> Vec<Value> {
        self.call("GET", path, None, "application/json")["items"].as_array().cloned().unwrap_or_default()
    }

    pub fn get(&self, object: &Value) -> Option<Value> {
        match self.raw("GET", &object_path(object), None, "application/json") {
            Ok((200, text)) => Some(serde_json::from_str(&text).unwrap()),
            Ok((404, _)) => None,
            other => panic!("get {}: {other:?}", object_path(object)),
        }
    }

    /// JSON merge patch of the object (its `status` goes through the status subresource).
    pub fn merge_patch(&self, object: &Value, patch: &Value) -> Value {
        self.call("PATCH", &object_path(object), Some(patch), "application/merge-patch+json")
    }

    /// Write `status` through the status subresource, as a controller or the kubelet does.
    pub fn patch_status(&self, object: &Value, status: &Value) -> Value {
        let path = format!("{}/status", object_path(object));
        self.call("PATCH", &path, Some(&json!({ "status": status })), "application/merge-patch+json")
    }

    pub fn delete(&self, object: &Value) {
        match self.raw("DELETE", &object_path(object), None, "application/json") {
            Ok((200, _)) | Ok((404, _)) => {}
            other => panic!("delete {}: {other:?}", object_path(object)),
        }
    }

    /// A real bound service-account token (TokenRequest), bound to `pod` as the kubelet does.
    pub fn token(&self, namespace: &str, service_account: &str, pod: Option<(&str, &str)>) -> String {
        let mut spec =
            json!({"audiences": ["https://kubernetes.default.svc.cluster.local"], "expirationSeconds": 3600});
        if let Some((name, uid)) = pod {
            spec["boundObjectRef"] = json!({"kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid});
        }
        let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token");
        let answer = self.call(
            "POST",
            &path,
            Some(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})),
            "application/json",
        );
        answer["status"]["token"].as_str().expect("a token").to_string()
    }

    /// The API server's own request counter, per (verb, resource), for requests by `user_agent_prefix`.
    pub fn metrics_text(&self) -> String {
        match self.raw("GET", "/metrics", None, "text/plain") {
            Ok((200, text)) => text,
            other => panic!("GET /metrics: {other:?}"),
        }
    }

    /// A kubeconfig for `token` with the cluster's CA.
    pub fn kubeconfig(&self, path: &Path, token: &str, namespace: &str) {
        std::fs::write(path, kubeconfig_text(self.port, &self.ca_path(), token, namespace)).unwrap();
    }

    /// The last lines of the API server's log (for failure messages).
    pub fn apiserver_log_tail(&self) -> String {
        self.log_tail("kube-apiserver.log")
    }
}

fn kubeconfig_text(port: u16, ca: &Path, token: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    user: u\n    namespace: {namespace}\ncurrent-context: real\nusers:\n- name: u\n  user:\n    token: {token}\n",
        ca.display()
    )
}

/// (plural, namespaced) of the kinds the tests create.
fn resource_of(kind: &str) -> (&'static str, bool) {
    match kind {
        "Namespace" => ("namespaces", false),
        "ServiceAccount" => ("serviceaccounts", true),
        "ConfigMap" => ("configmaps", true),
        "Secret" => ("secrets", true),
        "Service" => ("services", true),
        "Pod" => ("pods", true),
        "Event" => ("events", true),
        "ResourceQuota" => ("resourcequotas", true),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "ResourceClaim" => ("resourceclaims", true),
        "ResourceClaimTemplate" => ("resourceclaimtemplates", true),
        "ResourceSlice" => ("resourceslices", false),
        "DeviceClass" => ("deviceclasses", false),
        "Deployment" => ("deployments", true),
        "StatefulSet" => ("statefulsets", true),
        "DaemonSet" => ("daemonsets", true),
        "ReplicaSet" => ("replicasets", true),
        "Job" => ("jobs", true),
        "CronJob" => ("cronjobs", true),
        "PodDisruptionBudget" => ("poddisruptionbudgets", true),
        "MutatingWebhookConfiguration" => ("mutatingwebhookconfigurations", false),
        "VirtualMachineInstance" => ("virtualmachineinstances", true),
        "CustomResourceDefinition" => ("customresourcedefinitions", false),
        "CSIDriver" => ("csidrivers", false),
        "CSINode" => ("csinodes", false),
        "Node" => ("nodes", false),
        other => panic!("the control-plane helper does not know kind {other}"),
    }
}

fn collection_path(object: &Value) -> String {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let (plural, namespaced) = resource_of(kind);
    let prefix = if api_version.contains('/') { format!("/apis/{api_version}") } else { format!("/api/{api_version}") };
    if namespaced {
        let ns = object["metadata"]["namespace"].as_str().unwrap_or("default");
        format!("{prefix}/namespaces/{ns}/{plural}")
    } else {
        format!("{prefix}/{plural}")
    }
}

fn object_path(object: &Value) -> String {
    let name = object["metadata"]["name"].as_str().expect("metadata.name");
    format!("{}/{name}", collection_path(object))
}
