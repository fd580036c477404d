//! Pod start on the real node (tests/support/node.rs): time from `kubectl
//! create` to the app container running, for the same GPU pod
//!   - without drafs,
//!   - with a no-op init container (what any init container costs),
//!   - with `drafs inject --mode init` (drafs's own share is the difference),
//!   - labelled and injected by the webhook (the shipped configuration, by URL),
//!   - with a CSI volume served by `drafs node` (docs/node-mode.md), no drafs container;
//!   - then with `drafs node --nri` (docs/nri.md): the pod without drafs while the
//!     plugin is registered (every container passes through it), and the pod
//!     opted in by its label, nothing of drafs in it, its tree at its first line;
//!   - 30 pods created at once (each a share of the GPU), until all run: without
//!     drafs, and opted in through NRI.
//!
//! The kubelet's status is polled every 50 ms; "running" is the app's
//! `state.running.startedAt` being set, the start itself from the pod's
//! creation timestamp is only whole seconds, so the wall time of the create
//! call is the start. Median and range of RUNS pods per row, each pod deleted
//! before the next.
//!
//! Run: `cargo bench --bench realnode` (builds the node on first use, like the
//! real-node tests). Prints a Markdown table.

use drafs_test_support as support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::node::{self, DRAFS_IMAGE, Node, SHELL_IMAGE};
use support::*;

const RUNS: usize = 7;

fn pod(ns: &str, name: &str, init: Option<Value>, label: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{
                "name": "app", "image": SHELL_IMAGE, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"claims": [{"name": "gpu"}]},
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    });
    if let Some(init) = init {
        p["spec"]["initContainers"] = json!([init]);
    }
    if let Some(mode) = label {
        p["metadata"]["labels"] = json!({"drafs.dev/inject": mode});
    }
    p
}

/// The pod reading its tree from drafs's CSI volume, as its own account.
fn csi_pod(ns: &str, name: &str) -> Value {
    let mut p = pod(ns, name, None, None);
    p["spec"]["serviceAccountName"] = json!("drafs");
    p["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "dra", "mountPath": "/dra", "readOnly": true}]);
    p["spec"]["volumes"] = json!([{"name": "dra", "csi": {"driver": "drafs.dev", "readOnly": true}}]);
    p
}

fn injected(p: &Value) -> String {
    let mut child = std::process::Command::new(drafs_bin())
        .args(["inject", "--image", DRAFS_IMAGE, "--mode", "init"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(p.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// The pod opted in through NRI: nothing of drafs in it but its label; its
/// app exits at once if its tree is not there at its first line.
fn nri_pod(ns: &str, name: &str, template: &str) -> Value {
    let mut p = pod(ns, name, None, None);
    p["metadata"]["labels"] = json!({"drafs.dev/nri": "enabled"});
    p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = json!(template);
    p["spec"]["restartPolicy"] = json!("Never");
    p["spec"]["containers"][0]["command"] = json!(["sh", "-c", "test -e /dra/.ready && exec sleep 3600"]);
    p
}

/// Seconds from creating `pods` at once to all of them running.
fn start_all(node: &Node, ns: &str, pods: &[Value]) -> f64 {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": pods});
    let t0 = Instant::now();
    let out = node.kubectl_stdin(&["create", "-f", "-"], Some(&list.to_string()));
    assert!(out.status.success(), "{}", stderr(&out));
    loop {
        let listed = node.get_json(&["pods", "-n", ns]).unwrap_or(Value::Null);
        let items = listed["items"].as_array().cloned().unwrap_or_default();
        let running = items
            .iter()
            .filter(|p| {
                p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["name"] == "app" && c["state"]["running"].is_object()))
            })
            .count();
        if running == pods.len() {
            let took = t0.elapsed().as_secs_f64();
            node.kubectl_ok(&["delete", "pods", "-n", ns, "--all", "--wait=true", "--grace-period=0"]);
            return took;
        }
        let failed = items.iter().find(|p| p["status"]["phase"] == "Failed");
        assert!(failed.is_none(), "a pod failed (its tree not there at its first line?): {}", failed.unwrap());
        assert!(t0.elapsed() < Duration::from_secs(300), "{running} of {} pods run", pods.len());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Seconds from create to the app running.
fn start(node: &Node, ns: &str, name: &str, manifest: &str) -> f64 {
    let t0 = Instant::now();
    let out = node.kubectl_stdin(&["create", "-f", "-"], Some(manifest));
    assert!(out.status.success(), "{}", stderr(&out));
    loop {
        let p = node.get_json(&["pod", "-n", ns, name]).unwrap_or(Value::Null);
        let app = p["status"]["containerStatuses"].as_array().and_then(|cs| cs.iter().find(|c| c["name"] == "app"));
        if app.is_some_and(|c| c["state"]["running"].is_object()) {
            let took = t0.elapsed().as_secs_f64();
            node.kubectl_ok(&["delete", "pod", "-n", ns, name, "--wait=true", "--grace-period=0"]);
            return took;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "{name} did not start: {}", p["status"]);
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn main() {
    let node = node::shared().expect("the real node");
    let ns = "bench";
    node.namespace(ns, Some("restricted"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    let certs = tempfile::tempdir().unwrap();
    tls::ca(certs.path(), "ca").unwrap();
    tls::serving(certs.path(), "ca", "tls", "IP:127.0.0.1", 2).unwrap();
    let mut hook = node.spawn_in_node(
        &drafs_bin(),
        &[
            "webhook",
            "--addr",
            "127.0.0.1:8443",
            "--image",
            DRAFS_IMAGE,
            "--tls-cert",
            certs.path().join("tls.crt").to_str().unwrap(),
            "--tls-key",
            certs.path().join("tls.key").to_str().unwrap(),
        ],
        "webhook.log",
    );
    let config = support::webhook::configuration_by_url("https://127.0.0.1:8443/mutate", &certs.path().join("ca.crt"));
    node.kubectl_apply(&config.to_string());
    let noop = json!({
        "name": "noop", "image": SHELL_IMAGE, "imagePullPolicy": "Never", "command": ["true"],
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
    });
    // The webhook configuration is picked up asynchronously: one warm-up pod that must come out injected.
    let warm = pod(ns, "warm", None, Some("init")).to_string();
    assert!(wait_for(Duration::from_secs(30), || {
        let out = node.kubectl_stdin(&["create", "--dry-run=server", "-o", "json", "-f", "-"], Some(&warm));
        stdout(&out).contains("\"name\": \"drafs\"")
    }));
    node.csi_driver();
    let mut agent = node.spawn_drafs_node(&[], "agent.log");
    type MakePod<'a> = Box<dyn Fn(&str) -> String + 'a>;
    let rows: Vec<(&str, MakePod)> = vec![
        ("no init container", Box::new(|n| pod(ns, n, None, None).to_string())),
        ("a no-op init container", Box::new(|n| pod(ns, n, Some(noop.clone()), None).to_string())),
        ("`drafs inject --mode init`", Box::new(|n| injected(&pod(ns, n, None, None)))),
        ("webhook, label `drafs.dev/inject: init`", Box::new(|n| pod(ns, n, None, Some("init")).to_string())),
        ("CSI volume (`drafs node`)", Box::new(|n| csi_pod(ns, n).to_string())),
    ];
    println!("| pod | median (s) | min (s) | max (s) |\n|---|---|---|---|");
    for (what, make) in &rows {
        // One unmeasured pod per row: first use of the image and the claim template.
        start(node, ns, "warmup", &make("warmup"));
        let mut times: Vec<f64> =
            (0..RUNS).map(|i| start(node, ns, &format!("p{i}"), &make(&format!("p{i}")))).collect();
        times.sort_by(f64::total_cmp);
        println!("| {what} | {:.2} | {:.2} | {:.2} |", times[RUNS / 2], times[0], times[RUNS - 1]);
    }
    let _ = hook.kill();
    let _ = hook.wait();
    // SAFETY: a signal to the agent's process group.
    unsafe { libc::killpg(agent.id() as i32, libc::SIGKILL) };
    let _ = agent.wait();

    // The agent again, as the runtime's NRI plugin too.
    let mut agent = node.spawn_drafs_node(&["--nri"], "agent-nri.log");
    let served = wait_for(Duration::from_secs(60), || {
        let out = node.kubectl_stdin(&["create", "-f", "-"], Some(&nri_pod(ns, "nri-warm", "one-gpu").to_string()));
        assert!(out.status.success(), "{}", stderr(&out));
        let phase = wait_for(Duration::from_secs(60), || {
            node.get_json(&["pod", "-n", ns, "nri-warm"])
                .is_some_and(|p| p["status"]["phase"] == "Running" || p["status"]["phase"] == "Failed")
        });
        let running =
            phase && node.get_json(&["pod", "-n", ns, "nri-warm"]).is_some_and(|p| p["status"]["phase"] == "Running");
        node.kubectl_ok(&["delete", "pod", "-n", ns, "nri-warm", "--wait=true", "--grace-period=0"]);
        running
    });
    assert!(served, "the NRI plugin does not serve");
    let rows: Vec<(&str, MakePod)> = vec![
        ("no drafs, NRI plugin registered (pod not opted in)", Box::new(|n| pod(ns, n, None, None).to_string())),
        ("NRI (label `drafs.dev/nri: enabled`, nothing else)", Box::new(|n| nri_pod(ns, n, "one-gpu").to_string())),
    ];
    for (what, make) in &rows {
        start(node, ns, "warmup", &make("warmup"));
        let mut times: Vec<f64> =
            (0..RUNS).map(|i| start(node, ns, &format!("p{i}"), &make(&format!("p{i}")))).collect();
        times.sort_by(f64::total_cmp);
        println!("| {what} | {:.2} | {:.2} | {:.2} |", times[RUNS / 2], times[0], times[RUNS - 1]);
    }

    // 30 pods at once, each a share of the GPU.
    node.shared_gpu_template(ns, "gpu-share", "512Mi");
    println!("\n| {AT_ONCE} pods created at once | until all run (s) |\n|---|---|");
    let plain = |n: usize| {
        let mut p = pod(ns, &format!("many-{n}"), None, None);
        p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = json!("gpu-share");
        p
    };
    let opted = |n: usize| nri_pod(ns, &format!("many-{n}"), "gpu-share");
    let without: Vec<Value> = (0..AT_ONCE).map(plain).collect();
    let with: Vec<Value> = (0..AT_ONCE).map(opted).collect();
    println!("| no drafs | {:.2} |", start_all(node, ns, &without));
    println!("| NRI | {:.2} |", start_all(node, ns, &with));
    // SAFETY: a signal to the agent's process group (SIGTERM: it stops as the DaemonSet's would).
    unsafe { libc::killpg(agent.id() as i32, libc::SIGTERM) };
    let _ = agent.wait();
}

const AT_ONCE: usize = 30;
