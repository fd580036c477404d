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
//!   - kube-apiserver's resident memory.
//!
//! Run: `cargo bench --bench nodescale` (builds the node on first use, like
//! the real-node tests; about 15 minutes). Prints a Markdown table.

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
    let mut agent = node.spawn_drafs_node(&["--watch-for", "5s"], "agent.log");
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
        for csi in [false, true] {
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
                if csi { "CSI volume (`drafs node`)" } else { "`serve` sidecar each" },
                w("pods") + w("resourceclaims") + w("resourceslices"),
                w("pods"),
                w("resourceclaims"),
                w("resourceslices"),
            );
            eprintln!("  {n} pods, {}: requests in the minute: {per_minute:?}", if csi { "csi" } else { "sidecars" });
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
    // SAFETY: a signal to the agent's process group.
    unsafe { libc::killpg(agent.id() as i32, libc::SIGKILL) };
    let _ = agent.wait();
}
