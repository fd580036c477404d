//! What drafs costs the API server on a real node (tests/support/node.rs),
//! by how it runs: N pods each with a GPU share (a claim from a template),
//! served either by a `serve --backend files` sidecar each (what `drafs inject
//! --mode sidecar-files` adds) or by one `drafs node` agent through a CSI
//! volume (docs/node-mode.md). For N = 1, 30 and 100 (DRAFS_BENCH_PODS):
//!   - the watches kube-apiserver holds open for pods, claims and slices,
//!     once the pods run and the agent's first two minutes are over
//!     (`--watch-for 5s` here, so that the steady state comes at once);
//!   - the requests for pods, claims and slices per minute in that steady
//!     state (`apiserver_request_total`, a minute's difference, less the same
//!     minute without drafs);
//!   - kube-apiserver's resident memory;
//!   - with the agent's `--watch-node-pods` (a third row per N), the delay
//!     from the driver's health report to each pod's `.health` file, each
//!     way, and the part of it after the kubelet wrote the pod's status
//!     (drafs's part): median and maximum over the pods.
//!
//! Run: `cargo bench --bench nodescale` (builds the node on first use, like
//! the real-node tests; about 25 minutes). Prints two Markdown tables.

use drafs_test_support as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::node::{self, DRAFS_IMAGE, Node, SHELL_IMAGE};
use support::*;

const RESOURCES: [&str; 3] = ["pods", "resourceclaims", "resourceslices"];

fn pod(ns: &str, name: &str, csi: bool) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "serviceAccountName": "drafs",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-share"}],
            "containers": [{
                "name": "app", "image": SHELL_IMAGE, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"claims": [{"name": "gpu"}], "requests": {"cpu": "1m", "memory": "1Mi"}},
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    });
    if csi {
        p["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "dra", "mountPath": "/dra", "readOnly": true}]);
        p["spec"]["volumes"] = json!([{"name": "dra", "csi": {"driver": "drafs.dev", "readOnly": true}}]);
    }
    p
}

fn sidecar_pods(ns: &str, names: &[String]) -> String {
    let all = names.iter().map(|n| pod(ns, n, false).to_string()).collect::<Vec<_>>().join("\n---\n");
    let mut child = std::process::Command::new(drafs_bin())
        .args(["inject", "--image", DRAFS_IMAGE, "--mode", "sidecar-files"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(all.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// kube-apiserver's metrics: (open watches, requests so far) by resource.
fn api_counts(node: &Node) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let metrics = node.kubectl_ok(&["get", "--raw", "/metrics"]);
    let label = |line: &str, name: &str| {
        line.split(&format!("{name}=\"")).nth(1).and_then(|r| r.split('"').next()).unwrap_or_default().to_string()
    };
    let (mut watches, mut requests) = (BTreeMap::new(), BTreeMap::new());
    for line in metrics.lines() {
        let value: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        let resource = label(line, "resource");
        if !RESOURCES.contains(&resource.as_str()) {
            continue;
        }
        if line.starts_with("apiserver_longrunning_requests{") && line.contains("verb=\"WATCH\"") {
            *watches.entry(resource).or_default() += value;
        } else if line.starts_with("apiserver_request_total{") {
            let sub = label(line, "subresource");
            let key = format!("{resource}{}{sub} {}", if sub.is_empty() { "" } else { "/" }, label(line, "verb"));
            *requests.entry(key).or_default() += value;
        }
    }
    (watches, requests)
}

/// The node's kube-apiserver's resident memory, MiB (other tests may run theirs).
fn apiserver_rss(node: &Node) -> f64 {
    let node_ns = node.pid_namespace();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let in_node =
            std::fs::read_link(entry.path().join("ns/pid")).is_ok_and(|ns| ns.display().to_string() == node_ns);
        if in_node && cmdline.split(|b| *b == 0).next().is_some_and(|argv0| argv0.ends_with(b"kube-apiserver")) {
            let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
            let kib: f64 = status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            return kib / 1024.0;
        }
    }
    panic!("no kube-apiserver in the node's PID namespace {node_ns}")
}

/// Requests in one minute, by resource and verb (those made at all).
fn requests_per_minute(node: &Node) -> BTreeMap<String, f64> {
    let (_, before) = api_counts(node);
    std::thread::sleep(Duration::from_secs(60));
    let (_, after) = api_counts(node);
    after.iter().map(|(k, v)| (k.clone(), v - before.get(k).unwrap_or(&0.0))).filter(|(_, n)| *n > 0.0).collect()
}

/// How the pods are served.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Sidecars,
    Csi,
    /// `drafs node --watch-node-pods`.
    CsiLive,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Sidecars => "`serve` sidecar each",
            Mode::Csi => "CSI volume (`drafs node`)",
            Mode::CsiLive => "CSI volume, `--watch-node-pods`",
        }
    }
}

fn start_agent(node: &Node, live: bool) -> std::process::Child {
    let mut args = vec!["--watch-for", "5s"];
    if live {
        args.push("--watch-node-pods");
    }
    node.spawn_drafs_node(&args, if live { "agent-live.log" } else { "agent.log" })
}

fn stop_agent(mut agent: std::process::Child) {
    // SAFETY: a signal to the agent's process group.
    unsafe { libc::killpg(agent.id() as i32, libc::SIGKILL) };
    let _ = agent.wait();
}

/// Whether a pod's status (as the API server has it) reports `state` for a device.
fn status_reports(pod: &Value, state: &str) -> bool {
    pod["status"]["containerStatuses"].as_array().into_iter().flatten().any(|c| {
        c["allocatedResourcesStatus"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["resources"].as_array().into_iter().flatten().any(|d| d["health"] == state))
    })
}

/// The driver reports `state` for the device every pod shares; for each pod,
/// the seconds until its status says so and until its `.health` file does.
fn health_delays(
    node: &Node,
    ns: &str,
    uids: &BTreeMap<String, String>,
    report: impl FnOnce(),
    state: &str,
) -> Vec<(f64, f64)> {
    // The pods' statuses, as a watch sees them, timed as they arrive.
    let mut watch = node
        .kubectl_command(&["get", "pods", "-n", ns, "--watch", "-o", "json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Value)>();
    std::thread::spawn(move || {
        for pod in serde_json::Deserializer::from_reader(std::io::BufReader::new(stdout)).into_iter::<Value>() {
            let Ok(pod) = pod else { return };
            if tx.send((Instant::now(), pod)).is_err() {
                return;
            }
        }
    });
    // The watch lists every pod first: changes come after.
    for _ in 0..uids.len() {
        rx.recv_timeout(Duration::from_secs(60)).expect("the pods' watch lists them");
    }
    let t0 = Instant::now();
    report();
    let mut status_at: BTreeMap<String, Instant> = BTreeMap::new();
    let mut file_at: BTreeMap<String, Instant> = BTreeMap::new();
    let deadline = t0 + Duration::from_secs(120);
    while (file_at.len() < uids.len() || status_at.len() < uids.len()) && Instant::now() < deadline {
        while let Ok((at, pod)) = rx.try_recv() {
            let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if at >= t0 && status_reports(&pod, state) {
                status_at.entry(name).or_insert(at);
            }
        }
        for (name, uid) in uids {
            if file_at.contains_key(name) {
                continue;
            }
            let file = node.node_path(&format!(
                "/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/dra/mount/gpu/gpu/0/.health"
            ));
            if std::fs::read_to_string(file).is_ok_and(|h| h == state) {
                file_at.insert(name.clone(), Instant::now());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(file_at.len(), uids.len(), "{state}: files changed in {} of {} pods", file_at.len(), uids.len());
    uids.keys()
        .map(|name| {
            let file = file_at[name];
            let from_status =
                status_at.get(name).map_or(f64::NAN, |s| file.saturating_duration_since(*s).as_secs_f64());
            (file.duration_since(t0).as_secs_f64(), from_status)
        })
        .collect()
}

fn median_max(mut v: Vec<f64>) -> String {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return "n/a".into();
    }
    v.sort_by(f64::total_cmp);
    format!("{:.2} / {:.2}", v[v.len() / 2], v[v.len() - 1])
}

fn total(m: &BTreeMap<String, f64>) -> f64 {
    m.values().sum()
}

fn main() {
    let counts: Vec<usize> = std::env::var("DRAFS_BENCH_PODS")
        .unwrap_or_else(|_| "1,30,100".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let node = node::shared().expect("the real node");
    let ns = "scale";
    node.namespace(ns, Some("restricted"));
    node.shared_gpu_template(ns, "gpu-share", "512Mi");
    node.csi_driver();
    let mut agent = Some(start_agent(node, false));
    let mut delays = Vec::new();
    let (idle_watches, _) = api_counts(node);
    let idle_requests = requests_per_minute(node);
    let idle_rss = apiserver_rss(node);
    println!(
        "without drafs: {} watches, {:.0} requests/min, kube-apiserver {idle_rss:.0} MiB",
        total(&idle_watches),
        total(&idle_requests)
    );
    println!(
        "\n| pods | mode | watches (pods, claims, slices) | requests/min | kube-apiserver RSS (MiB) | all running after (s) |"
    );
    println!("|---|---|---|---|---|---|");
    for &n in &counts {
        for mode in [Mode::Sidecars, Mode::Csi, Mode::CsiLive] {
            let csi = mode != Mode::Sidecars;
            if mode == Mode::CsiLive {
                stop_agent(agent.take().unwrap());
                agent = Some(start_agent(node, true));
            }
            let names: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
            let manifest = if csi {
                names.iter().map(|p| pod(ns, p, true).to_string()).collect::<Vec<_>>().join("\n---\n")
            } else {
                sidecar_pods(ns, &names)
            };
            let t0 = Instant::now();
            let out = node.kubectl_stdin(&["create", "-f", "-"], Some(&manifest));
            assert!(out.status.success(), "{}", stderr(&out));
            for p in &names {
                node.wait_pod(ns, p, "Running and ready", Duration::from_secs(600), |v| {
                    v["status"]["conditions"]
                        .as_array()
                        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
                });
            }
            let started = t0.elapsed().as_secs_f64();
            // The agent's watches end 5 s after each publish; sidecars keep theirs.
            std::thread::sleep(Duration::from_secs(15));
            let (watches, _) = api_counts(node);
            let per_minute = requests_per_minute(node);
            let rss = apiserver_rss(node);
            let w = |r: &str| watches.get(r).copied().unwrap_or(0.0) - idle_watches.get(r).copied().unwrap_or(0.0);
            let extra = total(&per_minute) - total(&idle_requests);
            println!(
                "| {n} | {} | {} ({}, {}, {}) | {extra:.0} | {rss:.0} | {started:.1} |",
                mode.name(),
                w("pods") + w("resourceclaims") + w("resourceslices"),
                w("pods"),
                w("resourceclaims"),
                w("resourceslices"),
            );
            eprintln!("  {n} pods, {}: requests in the minute: {per_minute:?}", mode.name());
            if mode == Mode::CsiLive {
                let pods = node.get_json(&["pods", "-n", ns]).unwrap();
                let uids: BTreeMap<String, String> = pods["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        (p["metadata"]["name"].as_str().unwrap().into(), p["metadata"]["uid"].as_str().unwrap().into())
                    })
                    .collect();
                let gpu = node.allocated_device(ns, "p0", "gpu");
                for (state, message) in [("Unhealthy", "XID 79 (bench)"), ("Healthy", "")] {
                    let d = health_delays(node, ns, &uids, || node.report_gpu_health(&gpu, state, message), state);
                    let from_report = median_max(d.iter().map(|x| x.0).collect());
                    let from_status = median_max(d.iter().map(|x| x.1).collect());
                    delays.push(format!("| {n} | to {state} | {from_report} | {from_status} |"));
                }
                stop_agent(agent.take().unwrap());
                agent = Some(start_agent(node, false));
            }
            node.kubectl_ok(&[
                "delete",
                "pods",
                "-n",
                ns,
                "--all",
                "--wait=true",
                "--grace-period=0",
                "--timeout=600s",
            ]);
            // Claims made from templates go with their pods.
            assert!(wait_for(Duration::from_secs(120), || {
                node.get_json(&["resourceclaims", "-n", ns])
                    .is_some_and(|l| l["items"].as_array().is_some_and(Vec::is_empty))
            }));
        }
    }
    println!("\nHealth reported by the driver, to each pod's `.health` file (`--watch-node-pods`), seconds:\n");
    println!("| pods | change | report to file, median / max | pod status to file, median / max |");
    println!("|---|---|---|---|");
    for line in delays {
        println!("{line}");
    }
    stop_agent(agent.take().unwrap());
}
