//! Monitoring as the chart ships it (each part off by default): the agents'
//! PodMonitor, the alerts (a PrometheusRule) and the Grafana dashboard, read
//! with Prometheus's own parsers (`promcheck`, tests/go/prom) and held against
//! what a real `drafs webhook` and a real `drafs node` (against the kube
//! tier's API server) expose: an alert or a panel on a metric drafs does not
//! have would never fire or always be empty, and nothing else would notice.

use drafs_test_support as support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use support::controlplane::{self, ControlPlane};
use support::helm::{find, template};
use support::webhook::WebhookProcess;
use support::*;

const LIMIT: Duration = Duration::from_secs(60);

/// Everything on, as a platform team with the Prometheus operator sets it.
const ALL_ON: &[&str] = &[
    "--set",
    "node.enabled=true,node.metricsBindAddress=0.0.0.0,node.podMonitor.enabled=true",
    "--set",
    "prometheusRule.enabled=true,dashboard.enabled=true",
];

/// `promcheck MODE` with `input` on its standard input: its output, or its error.
fn promcheck(mode: &str, input: &str) -> Result<String, String> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = BIN.get_or_init(|| controlplane::cached_build(&["tests/go/build.sh", "prom"]));
    let bin = dir.as_ref().unwrap_or_else(|e| panic!("promcheck could not be built: {e}")).join("promcheck");
    let mut child = Command::new(bin)
        .arg(mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() { Ok(stdout(&out)) } else { Err(stderr(&out)) }
}

/// The series names `text` (a /metrics page) can have, once Prometheus's text
/// parser accepts it: every family it declares (with or without samples yet),
/// a histogram's as `_bucket`, `_count` and `_sum`.
fn series_names(text: &str) -> BTreeSet<String> {
    promcheck("exposition", text).unwrap_or_else(|e| panic!("Prometheus refuses the exposition: {e}\n{text}"));
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some((name, kind)) = line.strip_prefix("# TYPE ").and_then(|t| t.split_once(' ')) else {
            continue;
        };
        if kind == "histogram" {
            names.extend(["_bucket", "_count", "_sum"].map(|s| format!("{name}{s}")));
        } else {
            names.insert(name.to_string());
        }
    }
    names
}

/// A child process killed when dropped.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a real `drafs node` (NRI on, no runtime socket, the node's pods
/// watched) exposes, run as the admin against `cp`.
fn node_agent_series(cp: &ControlPlane) -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let (metrics, health) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let kubelet = dir.path().join("kubelet");
    std::fs::create_dir(&kubelet).unwrap();
    let agent = Running(
        Command::new(drafs_bin())
            .args(["node", "--node-name", "monitoring-node", "--watch-node-pods", "--nri"])
            .arg("--kubelet-dir")
            .arg(&kubelet)
            .arg("--nri-socket")
            .arg(dir.path().join("no-runtime/nri.sock"))
            .arg("--nri-dir")
            .arg(dir.path().join("nri"))
            .args(["--metrics-addr", &metrics, "--health-addr", &health])
            .env("KUBECONFIG", cp.dir().join("admin.kubeconfig"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let log = || std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    let mut text = String::new();
    wait_until("the agent's metrics with its watches up", LIMIT, || {
        text = http_get(&metrics, "/metrics").map(|(_, t)| t).unwrap_or_default();
        text.lines().any(|l| l.starts_with("drafs_node_watch_up{") && l.ends_with(" 1"))
    });
    drop(agent);
    assert!(text.contains("drafs_node_nri_up{state=\"no_socket\"} 0"), "{text}\n{}", log());
    series_names(&text)
}

/// What a real `drafs webhook` exposes.
fn webhook_series() -> BTreeSet<String> {
    let addr = format!("127.0.0.1:{}", free_port());
    let _hook = WebhookProcess::start(&["--metrics-addr", &addr]);
    let mut text = String::new();
    wait_until("the webhook's metrics", LIMIT, || {
        http_get(&addr, "/metrics").is_some_and(|(code, t)| {
            text = t;
            code == 200
        })
    });
    series_names(&text)
}

/// Each `(what, metric names)` promcheck printed for `text` (one per line).
fn selections(text: &str) -> Vec<(String, Vec<String>)> {
    text.lines()
        .map(|l| {
            let mut words = l.split(' ').map(str::to_string);
            (words.next().unwrap(), words.collect())
        })
        .collect()
}

/// The dashboard's PromQL as Grafana sends it (its variables filled in).
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let fill =
        |e: &str| e.replace("$__rate_interval", "5m").replace("$namespace", "drafs-system").replace("$node", ".*");
    let mut queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| fill(t["expr"].as_str().expect("every target has an expr")))
        .collect();
    // The variables' `label_values(SELECTOR, label)`: the selector is PromQL too.
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = variable["query"]["query"].as_str().and_then(|q| q.strip_prefix("label_values(")) {
            queries.push(fill(q.rsplit_once(',').expect("label_values(selector, label)").0));
        }
    }
    queries
}

#[test]
fn the_shipped_alerts_and_dashboard_read_only_what_drafs_exposes() {
    let Some(cp) = controlplane::shared() else { return };
    let mut exposed = webhook_series();
    exposed.extend(node_agent_series(cp));
    let docs = template(cp, ALL_ON);

    // Prometheus loads the rules as it would the operator's rule file.
    let rule = find(&docs, "PrometheusRule");
    let alerts = selections(&promcheck("rules", &rule["spec"].to_string()).unwrap_or_else(|e| panic!("{e}")));
    let names: BTreeSet<&str> = alerts.iter().map(|(a, _)| a.as_str()).collect();
    for expected in [
        "DrafsWebhookCertificateExpiresSoon",
        "DrafsWebhookCertificateRefused",
        "DrafsNodeNotRegistered",
        "DrafsNodeWatchDown",
        "DrafsNodePlacesRefused",
        "DrafsNodeNRINotServing",
        "DrafsNodeNRIContainersRefused",
    ] {
        assert!(names.contains(expected), "{expected} not in {names:?}");
    }
    for (alert, metrics) in &alerts {
        assert!(!metrics.is_empty(), "{alert} reads no drafs metric");
        for m in metrics {
            assert!(exposed.contains(m), "{alert} reads {m}, which drafs does not expose: {exposed:?}");
        }
    }

    // Every panel and variable of the dashboard parses and reads what is there.
    let dashboard = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("the dashboard's ConfigMap, labelled for Grafana's sidecar");
    let dashboard: Value = serde_json::from_str(dashboard["data"]["drafs.json"].as_str().unwrap()).unwrap();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 10, "{queries:?}");
    let read = promcheck("exprs", &queries.join("\n")).unwrap_or_else(|e| panic!("{e}"));
    for (query, line) in queries.iter().zip(read.lines()) {
        assert!(!line.is_empty(), "{query} reads no metric");
        for m in line.split(' ') {
            assert!(exposed.contains(m), "the dashboard's {query} reads {m}, which drafs does not expose");
        }
    }

    // The PodMonitor finds the agents' pods and their port.
    let monitor = find(&docs, "PodMonitor");
    let agents = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    assert_eq!(monitor["metadata"]["namespace"], agents["metadata"]["namespace"]);
    let selector = &monitor["spec"]["selector"]["matchLabels"];
    assert_eq!(selector, &agents["spec"]["selector"]["matchLabels"]);
    for (key, value) in selector.as_object().unwrap() {
        assert_eq!(&agents["spec"]["template"]["metadata"]["labels"][key], value, "{key}");
    }
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    let ports = agents["spec"]["template"]["spec"]["containers"][0]["ports"].as_array().unwrap();
    let port = ports.iter().find(|p| p["name"] == endpoint["port"]).expect("the agent names the monitored port");
    let args = agents["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains(&format!("--metrics-addr=0.0.0.0:{}", port["containerPort"])), "{args}");
    assert_eq!(endpoint["relabelings"][0]["targetLabel"], "node", "the alerts name the node");

    // Without NRI, no alert about it.
    let mut off = ALL_ON.to_vec();
    off.extend(["--set", "node.nri.enabled=false"]);
    let rules = find(&template(cp, &off), "PrometheusRule")["spec"].to_string();
    assert!(rules.contains("DrafsNodeNotRegistered") && !rules.contains("NRI"), "{rules}");
}

#[test]
fn monitoring_is_off_by_default_and_the_chart_refuses_what_could_not_work() {
    let Some(cp) = controlplane::shared() else { return };
    let kinds: BTreeSet<String> =
        template(cp, &["--set", "node.enabled=true"]).iter().map(|d| d["kind"].as_str().unwrap().to_string()).collect();
    for kind in ["PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap"] {
        assert!(!kinds.contains(kind), "{kind} rendered by default: {kinds:?}");
    }

    let refused = |args: &[&str]| {
        let mut all = vec!["template", "drafs", "deploy/helm/drafs"];
        all.extend_from_slice(args);
        let out = helm::run(cp, &all);
        assert!(!out.status.success(), "helm {args:?} rendered");
        stderr(&out)
    };
    // At 127.0.0.1 (the default) nothing outside the agent's pod reaches /metrics.
    let err = refused(&["--set", "node.enabled=true,node.podMonitor.enabled=true"]);
    assert!(err.contains("node.metricsBindAddress") && err.contains("127.0.0.1"), "{err}");
    let err = refused(&["--set", "node.podMonitor.enabled=true,node.metricsBindAddress=0.0.0.0"]);
    assert!(err.contains("needs node.enabled"), "{err}");
    // The schema: a typo and a wrong type.
    let err = refused(&["--set", "prometheusRule.certificateDays=3"]);
    assert!(err.contains("certificateDays"), "{err}");
    let err = refused(&["--set", "prometheusRule.certificateDaysLeft=0"]);
    assert!(err.contains("certificateDaysLeft"), "{err}");
    let err = refused(&["--set-string", "dashboard.enabled=yes"]);
    assert!(err.contains("dashboard"), "{err}");
}
