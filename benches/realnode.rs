//! Pod start on the real node (tests/support/node.rs): time from `kubectl
//! create` to the app container running, for the same GPU pod
//!   - without drafs,
//!   - with a no-op init container (what any init container costs),
//!   - with `drafs inject --mode init` (drafs's own share is the difference),
//!   - labelled and injected by the webhook (the shipped configuration, by URL),
//!   - with a CSI volume served by `drafs node` (docs/node-mode.md), no drafs container.
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
}
