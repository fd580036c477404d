//! What one `drafs node` agent costs its node, by the pods it serves: the
//! agent's resident memory and the tmpfs pages its volumes hold (both charged
//! to the agent's memory cgroup: it writes the pages), and how long a publish
//! takes when the kubelet publishes many pods at once.
//!
//! The agent is the real binary, as root with real tmpfs mounts under a
//! temporary kubelet directory, against the test API server; the bench calls
//! it over its CSI socket as the kubelet does (gRPC over HTTP/2, one
//! connection, calls in parallel). Each pod holds a claim to all 8 GPUs of the
//! node (30 attributes each: a tree of 8 GPUs, what a monitoring pod with
//! admin access sees); the hostile rows give every pod 256 KiB of annotations,
//! a container command of 256 KiB and a claim with 256 KiB of driver
//! configuration, which the agent must not keep. The agent runs in a memory
//! cgroup of the bench's own: what the kernel charges it, and of it the
//! tmpfs pages (shmem), is read from the cgroup, served and after unpublish.
//!
//! Run: `sudo cargo bench --bench nodememory` (root: it mounts tmpfs; about 4
//! minutes). Prints a Markdown table. `DRAFS_BENCH_PODS=30,110` chooses the
//! rows; `DRAFS_BIN=$PWD/target/x86_64-unknown-linux-musl/image/drafs`
//! measures the image's binary (musl's allocator gives memory back; glibc's
//! keeps it).

use drafs_test_support as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use drafs::node::proto::Writer;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use support::*;

const NAMESPACE: &str = "ml";
/// Parallel calls in the burst (the kubelet starts many pods at once after a drain).
const BURST: usize = 30;
/// The agent's `--watch-for`: shorter than its default 2 minutes, so that the
/// steady state (no watch per pod, only the node's slices) comes soon.
const WATCH_FOR: Duration = Duration::from_secs(20);

/// Pod `i` with its claim to the node's 8 GPUs; `hostile` adds what a tenant may write freely.
fn load_pod(api: &TestApi, i: usize, hostile: bool) {
    let name = format!("p{i}");
    let mut p = pod(NAMESPACE, &name, "n1", &[("gpu", Ok(&format!("c{i}")))], &[]);
    let devices: Vec<String> = (0..8).map(|d| format!("g{d}")).collect();
    let results: Vec<(&str, &str, &str, &str)> =
        devices.iter().map(|d| ("gpu", "gpu.example.com", "n1", d.as_str())).collect();
    let mut c = claim(NAMESPACE, &format!("c{i}"), Some(&results));
    if hostile {
        let big = "x".repeat(256 * 1024);
        p["metadata"]["annotations"] = json!({"tenant.example.com/blob": big});
        p["spec"]["containers"][0]["command"] = json!([big]);
        c["spec"]["devices"]["config"] =
            json!([{"opaque": {"driver": "gpu.example.com", "parameters": {"blob": big}}}]);
    }
    api.apply(p);
    api.apply(c);
}

fn target(kubelet: &Path, i: usize) -> PathBuf {
    kubelet.join(format!("pods/uid-p{i}/volumes/kubernetes.io~csi/dra/mount"))
}

/// A NodePublishVolume request for pod `i`, as the kubelet sends it.
fn publish_request(kubelet: &Path, i: usize) -> Vec<u8> {
    let tokens = json!({"": {"token": TOKEN, "expirationTimestamp": "2036-12-03T14:00:00Z"}});
    let context: BTreeMap<String, String> = [
        ("csi.storage.k8s.io/ephemeral", "true".to_string()),
        ("csi.storage.k8s.io/pod.name", format!("p{i}")),
        ("csi.storage.k8s.io/pod.namespace", NAMESPACE.to_string()),
        ("csi.storage.k8s.io/pod.uid", format!("uid-p{i}")),
        ("csi.storage.k8s.io/serviceAccount.tokens", tokens.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut req = Writer::new();
    req.string(1, &format!("csi-p{i}"))
        .string(4, &target(kubelet, i).to_string_lossy())
        .boolean(6, true)
        .map(8, &context);
    req.finish()
}

fn unpublish_request(kubelet: &Path, i: usize) -> Vec<u8> {
    let mut req = Writer::new();
    req.string(1, &format!("csi-p{i}")).string(2, &target(kubelet, i).to_string_lossy());
    req.finish()
}

type Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

async fn connect(socket: &Path) -> Sender {
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    sender
}

/// One unary gRPC call; Err(grpc-status and message) unless OK.
async fn call(mut sender: Sender, method: &str, message: Vec<u8>) -> Result<(), String> {
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let request = http::Request::post(format!("http://localhost{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(framed)))
        .unwrap();
    sender.ready().await.map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.map_err(|e| e.to_string())?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let field = |name: &str| {
        trailers.get(name).or_else(|| parts.headers.get(name)).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
    };
    match field("grpc-status").as_str() {
        "0" => Ok(()),
        code => Err(format!("grpc-status {code}: {}", field("grpc-message"))),
    }
}

/// Publish pods `range` in parallel; the time each call took.
async fn publish_all(sender: &Sender, kubelet: &Path, range: std::ops::Range<usize>) -> Vec<Duration> {
    let calls = range.map(|i| {
        let (sender, message) = (sender.clone(), publish_request(kubelet, i));
        async move {
            let started = Instant::now();
            call(sender, "/csi.v1.Node/NodePublishVolume", message)
                .await
                .unwrap_or_else(|e| panic!("publish p{i}: {e}"));
            started.elapsed()
        }
    });
    futures::future::join_all(calls).await
}

/// Bytes the tmpfs at `dir` holds (what its pages cost).
fn tmpfs_used(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: an all-zero statvfs is valid; statvfs fills it for a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut st) }, 0, "statvfs {}", dir.display());
    (st.f_blocks - st.f_bfree) as u64 * st.f_frsize as u64
}

/// A memory cgroup of the bench's own for the agent, so that what the kernel
/// charges it (its RSS and the tmpfs pages it writes, as shared memory) is
/// read, not added up: cgroup v2 (`memory.current`) or v1
/// (`memory.usage_in_bytes`). None where neither can be made.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn make() -> Option<Cgroup> {
        let name = format!("drafs-nodememory-{}", std::process::id());
        let candidates =
            [(Path::new("/sys/fs/cgroup").join(&name), true), (Path::new("/sys/fs/cgroup/memory").join(&name), false)];
        for (dir, v2) in candidates {
            let usage = if v2 { "memory.current" } else { "memory.usage_in_bytes" };
            if std::fs::create_dir(&dir).is_ok() {
                if dir.join(usage).exists() {
                    return Some(Cgroup { dir, v2 });
                }
                let _ = std::fs::remove_dir(&dir);
            }
        }
        None
    }

    fn enter(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("move the agent into its cgroup");
    }

    /// What the cgroup is charged, and of it the shared memory (tmpfs pages), in KiB.
    fn charged_kib(&self) -> (u64, u64) {
        let usage = if self.v2 { "memory.current" } else { "memory.usage_in_bytes" };
        let bytes: u64 = std::fs::read_to_string(self.dir.join(usage)).unwrap().trim().parse().unwrap();
        let stat = std::fs::read_to_string(self.dir.join("memory.stat")).unwrap();
        let shmem: u64 =
            stat.lines().find_map(|l| l.strip_prefix("shmem ").and_then(|v| v.trim().parse().ok())).unwrap_or_default();
        (bytes / 1024, shmem / 1024)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn percentile(times: &mut [Duration], p: f64) -> f64 {
    times.sort();
    times[((times.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1000.0
}

struct Row {
    pods: usize,
    hostile: bool,
    idle_rss: u64,
    rss: u64,
    peak: u64,
    steady_rss: u64,
    tmpfs: u64,
    /// The agent's cgroup at the served peak, and after unpublish: (KiB charged, of which shmem).
    cgroup: Option<((u64, u64), (u64, u64))>,
    after_rss: u64,
    burst: Vec<Duration>,
}

fn measure(rt: &tokio::runtime::Runtime, pods: usize, hostile: bool) -> Row {
    let api = api_for(NAMESPACE);
    eight_device_slice(&api, 1);
    for i in 0..pods {
        load_pod(&api, i, hostile);
    }
    let env = Env::new(&api, NAMESPACE, "p0", TOKEN);
    let kubelet = tempfile::tempdir().unwrap();
    let socket = kubelet.path().join("plugins/drafs.dev/csi.sock");
    let max_pods = pods.max(1).to_string();
    let mut agent = env
        .command(&[
            "node",
            "--node-name",
            "n1",
            "--kubelet-dir",
            kubelet.path().to_str().unwrap(),
            "--max-pods",
            &max_pods,
            "--watch-for",
            &format!("{}s", WATCH_FOR.as_secs()),
        ])
        .env("DRAFS_LOG", "warn")
        .spawn()
        .unwrap();
    let cgroup = Cgroup::make();
    if let Some(cgroup) = &cgroup {
        cgroup.enter(agent.id());
    }
    wait_until("the CSI socket", Duration::from_secs(30), || socket.exists());
    let pid = agent.id();
    let idle_rss = proc_status_kib(pid, "VmRSS:");
    let sender = rt.block_on(connect(&socket));
    // The first BURST pods at once, then the rest in bursts of the same size.
    let burst = rt.block_on(publish_all(&sender, kubelet.path(), 0..BURST.min(pods)));
    let mut next = BURST.min(pods);
    while next < pods {
        let end = (next + BURST).min(pods);
        rt.block_on(publish_all(&sender, kubelet.path(), next..end));
        next = end;
    }
    for i in 0..pods {
        assert!(target(kubelet.path(), i).join(".ready").exists(), "p{i} has no tree");
    }
    let rss = proc_status_kib(pid, "VmRSS:");
    let peak = proc_status_kib(pid, "VmHWM:");
    let tmpfs: u64 = (0..pods).map(|i| tmpfs_used(&target(kubelet.path(), i))).sum();
    let charged_served = cgroup.as_ref().map(Cgroup::charged_kib);
    // Once every pod's watches have ended: what serving the pods costs for their life.
    std::thread::sleep(WATCH_FOR + Duration::from_secs(5));
    let steady_rss = proc_status_kib(pid, "VmRSS:");
    let unpublish = (0..pods).map(|i| {
        let (sender, message) = (sender.clone(), unpublish_request(kubelet.path(), i));
        async move { call(sender, "/csi.v1.Node/NodeUnpublishVolume", message).await.expect("unpublish") }
    });
    rt.block_on(futures::future::join_all(unpublish));
    for i in 0..pods {
        assert!(!target(kubelet.path(), i).exists(), "p{i} still mounted after unpublish");
    }
    let after_rss = proc_status_kib(pid, "VmRSS:");
    let charged = charged_served.zip(cgroup.as_ref().map(Cgroup::charged_kib));
    let _ = agent.kill();
    let _ = agent.wait();
    Row { pods, hostile, idle_rss, rss, peak, steady_rss, tmpfs, cgroup: charged, after_rss, burst }
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("nodememory mounts tmpfs: run it as root");
        std::process::exit(2);
    }
    let rows: Vec<usize> = std::env::var("DRAFS_BENCH_PODS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 30, 110]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!(
        "| pods (8 GPUs each) | objects | agent RSS idle | agent RSS served (watched) | per pod | agent RSS served (steady) | per pod | tmpfs held | per pod | agent cgroup, served (of it shmem) | agent cgroup after unpublish (shmem) | RSS after unpublish | publish of {BURST} at once: median, slowest |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &pods in &rows {
        for hostile in [false, true] {
            let mut row = measure(&rt, pods, hostile);
            let mib = |kib: u64| kib as f64 / 1024.0;
            let per_pod = |rss: u64| rss.saturating_sub(row.idle_rss) as f64 / row.pods as f64;
            let tmpfs_kib = row.tmpfs / 1024;
            let charged = |c: Option<(u64, u64)>| match c {
                Some((all, shmem)) => format!("{:.1} MiB ({:.1})", mib(all), mib(shmem)),
                None => "no cgroup".into(),
            };
            println!(
                "| {} | {} | {:.1} MiB | {:.1} MiB (peak {:.1}) | {:.0} KiB | {:.1} MiB | {:.0} KiB | {:.1} MiB | {} KiB | {} | {} | {:.1} MiB | {:.0} ms, {:.0} ms |",
                row.pods,
                if row.hostile { "hostile (256 KiB x3 each)" } else { "plain" },
                mib(row.idle_rss),
                mib(row.rss),
                mib(row.peak),
                per_pod(row.rss),
                mib(row.steady_rss),
                per_pod(row.steady_rss),
                mib(tmpfs_kib),
                tmpfs_kib / row.pods as u64,
                charged(row.cgroup.map(|c| c.0)),
                charged(row.cgroup.map(|c| c.1)),
                mib(row.after_rss),
                percentile(&mut row.burst, 0.5),
                percentile(&mut row.burst, 1.0),
            );
        }
    }
}
