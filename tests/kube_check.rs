//! `drafs check` against the real kube-apiserver (the kube tier), with the
//! real webhook configured by URL on 127.0.0.1 (tests send traffic only to
//! loopback): injection and its reasons, RBAC through SubjectAccessReviews
//! and the fix, the webhook's certificate against caBundle, and what drafs
//! reported on a pod (its status written through pods/status: no kubelet here).

use drafs_test_support as support;

use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};
use support::controlplane::{self, ControlPlane};
use support::webhook::WebhookProcess;
use support::*;

const LIMIT: Duration = Duration::from_secs(60);

/// `drafs check ARGS` as the cluster admin, from the admin kubeconfig.
fn check(cp: &ControlPlane, args: &[&str]) -> Output {
    check_as(&cp.dir().join("admin.kubeconfig"), args)
}

fn check_as(kubeconfig: &std::path::Path, args: &[&str]) -> Output {
    let home = tempfile::tempdir().unwrap();
    let child = std::process::Command::new(drafs_bin())
        .arg("check")
        .args(args)
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_output(child, LIMIT)
}

/// `drafs check -o json ARGS`: (exit code, the report).
fn check_json(cp: &ControlPlane, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["-o", "json"];
    all.extend_from_slice(args);
    let out = check(cp, &all);
    let report: Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(&out), stderr(&out)));
    (out.status.code().unwrap_or(-1), report)
}

/// The check named `name` of a JSON report (the first, for `webhook`).
fn named<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {report:#}"))
}

fn namespace(cp: &ControlPlane, name: &str, labels: Value) {
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}));
    // No controller-manager here: the accounts pods run as, by hand.
    for account in ["default", "drafs"] {
        cp.ensure(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": account, "namespace": name}}));
    }
}

fn apply_rbac(cp: &ControlPlane, ns: &str, extra: &[&str]) {
    let mut args = vec!["manifests", "rbac", "-n", ns];
    args.extend_from_slice(extra);
    let out = std::process::Command::new(drafs_bin()).args(&args).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    for doc in yaml_docs(&stdout(&out)) {
        cp.ensure(&doc);
    }
}

/// A pod with these labels whose app container uses a claim from template `gpu`.
fn pod(ns: &str, name: &str, labels: Value) -> Value {
    PodBuilder::new(ns, name)
        .labels(labels)
        .template_claim("gpu", "gpu")
        .container("app", "registry.example/app:1")
        .uses("gpu")
        .build()
}

/// Install the shipped configuration pointed at `hook`, and wait until the
/// API server calls it (it picks a new configuration up asynchronously).
fn install_webhook(cp: &ControlPlane, hook: &WebhookProcess, probe_ns: &str) {
    cp.create(&support::webhook::configuration_by_url(&format!("https://{}/mutate", hook.addr), &hook.ca()));
    let probe = pod(probe_ns, "probe", json!({"drafs.dev/inject": "init"}));
    let path = format!("/api/v1/namespaces/{probe_ns}/pods?dryRun=All");
    wait_until(
        "the webhook configuration to take effect",
        Duration::from_secs(30),
        || matches!(cp.raw("POST", &path, Some(&probe), "application/json"), Ok((200, text)) if text.contains("\"name\":\"drafs\"")),
    );
}

#[test]
fn check_says_why_a_namespace_and_a_pod_get_drafs_names_missing_rbac_and_reads_what_drafs_reported() {
    let Some(cp) = controlplane::private() else { return };
    let hook = WebhookProcess::start(&[]);
    namespace(&cp, "opted", json!({"drafs.dev/inject": "enabled"}));
    namespace(&cp, "plain", json!({}));
    install_webhook(&cp, &hook, "plain");

    // A namespace labelled for drafs, before its RBAC: injected, mode init;
    // the missing permissions named with the fix; exit 1.
    let (code, report) = check_json(&cp, &["-n", "opted", "--expiry-warning-days", "0"]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["verdict"], "fail");
    assert_eq!(report["namespace"], "opted");
    assert_eq!(report["pod"], Value::Null);
    let injection = named(&report, "injection");
    assert_eq!(injection["status"], "ok", "{injection:#}");
    assert!(injection["message"].as_str().unwrap().starts_with("injected, mode init:"), "{injection:#}");
    assert_eq!(injection["details"]["unlabelledPods"]["entry"], "namespaces.drafs.dev");
    let rbac = named(&report, "rbac");
    assert_eq!(rbac["status"], "fail", "{rbac:#}");
    assert_eq!(rbac["details"]["serviceAccount"], "drafs");
    let missing: Vec<&str> =
        rbac["details"]["missing"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    assert!(missing.contains(&"list resourceslices.resource.k8s.io (cluster-wide)"), "{missing:?}");
    assert!(missing.contains(&"get pods in opted"), "{missing:?}");
    assert_eq!(rbac["fix"], "drafs manifests rbac -n opted --service-account drafs | kubectl apply -f -");

    // The fix, applied: every check passes, exit 0, and the text says so.
    apply_rbac(&cp, "opted", &["--events"]);
    let out = check(&cp, &["-n", "opted", "--expiry-warning-days", "0"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("ok    rbac "), "{text}");
    assert!(text.contains("certificate verifies against caBundle for 127.0.0.1"), "{text}");
    assert!(text.ends_with("verdict: ok, drafs will work for namespace opted\n"), "{text}");
    // RBAC from before device health (get pods only): a warning that says what
    // is lost, the exit code left alone.
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "drafs", "namespace": "opted"}});
    let rules = cp.get(&role).unwrap()["rules"].clone();
    let mut old = rules.clone();
    old[0]["verbs"] = json!(["get"]);
    assert_eq!(rules[0]["resources"], json!(["pods"]));
    cp.merge_patch(&role, &json!({"rules": old}));
    // The API server's authorizer sees a changed Role through its informer: wait for it.
    let mut seen = (0, Value::Null);
    wait_until("the authorizer to see the older Role", Duration::from_secs(30), || {
        seen = check_json(&cp, &["-n", "opted", "--expiry-warning-days", "0"]);
        named(&seen.1, "rbac")["status"] != "ok"
    });
    let (code, report) = seen;
    assert_eq!(code, 0, "{report:#}");
    let rbac = named(&report, "rbac");
    assert_eq!(rbac["status"], "warn", "{rbac:#}");
    assert_eq!(rbac["details"]["optionalMissing"], json!(["watch pods in opted"]), "{rbac:#}");
    assert!(rbac["message"].as_str().unwrap().contains("device health does not follow"), "{rbac:#}");
    cp.merge_patch(&role, &json!({"rules": rules}));
    wait_until("the authorizer to see the Role again", Duration::from_secs(30), || {
        named(&check_json(&cp, &["-n", "opted", "--expiry-warning-days", "0"]).1, "rbac")["status"] == "ok"
    });
    // The test certificate lives two days: under the default 14, a warning that leaves the exit code alone.
    let out = check(&cp, &["-n", "opted"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains(" left, under 14)"), "{}", stdout(&out));

    // A namespace not opted in: only labelled pods, and the label that would opt it in.
    let (_, report) = check_json(&cp, &["-n", "plain", "--expiry-warning-days", "0"]);
    let injection = named(&report, "injection");
    assert_eq!(injection["details"]["unlabelledPods"]["injected"], false);
    assert_eq!(injection["details"]["labelledPods"]["injected"], true);
    assert!(injection["fix"].as_str().unwrap().contains("kubectl label namespace plain drafs.dev/inject=enabled"));

    // A pod that opted out: not injected, and why; exit 1.
    cp.create(&pod("opted", "opted-out", json!({"drafs.dev/inject": "disabled"})));
    let (code, report) = check_json(&cp, &["-n", "opted", "opted-out", "--expiry-warning-days", "0"]);
    assert_eq!(code, 1);
    assert_eq!(report["pod"], "opted-out");
    let injection = named(&report, "injection");
    assert_eq!(injection["status"], "fail");
    assert_eq!(injection["message"], "not injected: the pod opted out with label drafs.dev/inject=disabled");
    assert_eq!(named(&report, "pod")["status"], "skip");

    // An injected pod whose drafs init container failed (its status written as
    // the kubelet would), with the Event drafs records: the last error, in one line.
    let created = cp.create(&pod("opted", "trainer", json!({})));
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(created["spec"]["initContainers"][0]["name"], "drafs", "{created:#}");
    let running = check(&cp, &["-n", "opted", "trainer", "--expiry-warning-days", "0"]);
    assert!(stdout(&running).contains("warn  pod "), "{}", stdout(&running));
    assert!(stdout(&running).contains("drafs has not started yet"), "{}", stdout(&running));
    cp.patch_status(
        &created,
        &json!({"phase": "Pending", "initContainerStatuses": [{
            "name": "drafs", "image": "registry.example/drafs:test", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error",
                                     "message": "not ready after 5m:\nclaim gpu: not allocated"}},
        }]}),
    );
    cp.create(&json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "trainer.drafs-1", "namespace": "opted"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "namespace": "opted", "uid": uid},
        "reason": "DeviceAttributesNotReady", "type": "Warning", "message": "not ready after 5m: claim gpu: not allocated",
        "source": {"component": "drafs"}, "reportingComponent": "drafs", "reportingInstance": "trainer",
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1,
    }));
    let (code, report) = check_json(&cp, &["-n", "opted", "trainer", "--expiry-warning-days", "0"]);
    assert_eq!(code, 1, "{report:#}");
    let injection = named(&report, "injection");
    assert_eq!(injection["status"], "ok");
    assert_eq!(injection["details"]["mode"], "init");
    let status = named(&report, "pod");
    assert_eq!(status["status"], "fail", "{status:#}");
    assert_eq!(
        status["message"],
        "drafs exited 1: not ready after 5m: claim gpu: not allocated; last event: DeviceAttributesNotReady: not ready after 5m: claim gpu: not allocated"
    );
    assert_eq!(status["details"]["exitCode"], 1);
    assert_eq!(status["details"]["lastEvent"]["reason"], "DeviceAttributesNotReady");
    assert_eq!(named(&report, "rbac")["status"], "ok");
}

#[test]
fn check_reports_a_served_certificate_that_does_not_match_ca_bundle() {
    let Some(cp) = controlplane::private() else { return };
    let hook = WebhookProcess::start(&[]);
    namespace(&cp, "ml", json!({}));
    apply_rbac(&cp, "ml", &["--events"]);
    // The configuration trusts another CA than the one that signed the webhook's certificate.
    let other = tempfile::tempdir().unwrap();
    support::tls::ca(other.path(), "other").unwrap();
    cp.create(&support::webhook::configuration_by_url(
        &format!("https://{}/mutate", hook.addr),
        &other.path().join("other.crt"),
    ));
    let (code, report) = check_json(&cp, &["-n", "ml", "--expiry-warning-days", "0"]);
    assert_eq!(code, 1, "{report:#}");
    let webhooks: Vec<&Value> =
        report["checks"].as_array().unwrap().iter().filter(|c| c["name"] == "webhook").collect();
    assert_eq!(webhooks.len(), 2, "one per entry: {report:#}");
    for w in webhooks {
        assert_eq!(w["status"], "fail", "{w:#}");
        assert_eq!(w["details"]["reachable"], true, "{w:#}");
        assert_eq!(w["details"]["certificate"]["verified"], false, "{w:#}");
        assert!(w["message"].as_str().unwrap().contains("does not verify against caBundle for 127.0.0.1"), "{w:#}");
        assert!(w["details"]["certificate"]["daysLeft"].as_i64().unwrap() >= 1, "{w:#}");
    }
    assert_eq!(named(&report, "rbac")["status"], "ok");

    // Someone who may not create SubjectAccessReviews is told so, not told the RBAC is missing.
    let kubeconfig = other.path().join("kubeconfig");
    cp.ensure(
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "someone", "namespace": "ml"}}),
    );
    cp.kubeconfig(&kubeconfig, &cp.token("ml", "someone", None), "ml");
    let out = check_as(&kubeconfig, &["-o", "json", "-n", "ml"]);
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let rbac = named(&report, "rbac");
    assert_eq!(rbac["status"], "warn", "{rbac:#}");
    assert_eq!(rbac["details"]["known"], false);
    assert!(rbac["message"].as_str().unwrap().contains("you may not create subjectaccessreviews"), "{rbac:#}");
    // Nor may it list webhook configurations: a failed check, not a crash.
    assert_eq!(named(&report, "configuration")["status"], "fail");
    assert_eq!(out.status.code(), Some(1));
    // drafs's own account (check run in its pod) asks about itself instead, which anyone may.
    cp.kubeconfig(&kubeconfig, &cp.token("ml", "drafs", None), "ml");
    let out = check_as(&kubeconfig, &["-o", "json", "-n", "ml"]);
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let rbac = named(&report, "rbac");
    assert_eq!(rbac["status"], "ok", "{rbac:#}");
    assert_eq!(rbac["details"]["known"], true);

    // What is not there is said, as a failed check.
    let (code, report) = check_json(&cp, &["-n", "nowhere"]);
    assert_eq!(code, 1);
    assert_eq!(named(&report, "injection")["message"], "namespace nowhere does not exist");
    let (code, report) = check_json(&cp, &["-n", "ml", "gone"]);
    assert_eq!(code, 1);
    assert_eq!(named(&report, "injection")["message"], "pod ml/gone does not exist");

    // Bad flags are usage errors.
    let out = check(&cp, &["-n", "Not_A_Namespace"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = check(&cp, &["-n", "ml", "--webhook-address", "nowhere"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// A key of a Secret in drafs-system, decoded.
fn secret_data(cp: &ControlPlane, name: &str, key: &str) -> Vec<u8> {
    let secret = cp
        .get(&json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "drafs-system"}}))
        .unwrap_or_else(|| panic!("no Secret {name}"));
    serde_json::from_value::<k8s_openapi::ByteString>(secret["data"][key].clone()).unwrap().0
}

#[test]
fn check_reads_the_mode_of_the_charts_webhook_and_reaches_its_service_through_a_forwarded_address() {
    let Some(cp) = controlplane::private() else { return };
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "drafs-system"}}));
    let out = helm::run(
        &cp,
        &[
            "install",
            "drafs",
            "deploy/helm/drafs",
            "--namespace",
            "drafs-system",
            "--set",
            "namespaceMode=sidecar-files",
        ],
    );
    assert!(out.status.success(), "helm install: {}", stderr(&out));
    namespace(&cp, "opted", json!({"drafs.dev/inject": "enabled"}));
    apply_rbac(&cp, "opted", &["--events"]);

    // The mode comes from the chart's Deployment; the Service has no
    // endpoints here (no kubelet): the API server's proxy refuses at once
    // (the timeout only bounds a loaded machine: at 2 s the proxy's answer
    // came too late under CI's load, and the report said "no answer").
    let (code, report) = check_json(&cp, &["-n", "opted", "--expiry-warning-days", "0", "--timeout", "20s"]);
    assert_eq!(code, 1, "{report:#}");
    let injection = named(&report, "injection");
    assert!(injection["message"].as_str().unwrap().starts_with("injected, mode sidecar-files:"), "{injection:#}");
    assert_eq!(injection["details"]["namespaceModeKnown"], true);
    let webhook = named(&report, "webhook");
    assert_eq!(webhook["status"], "fail", "{webhook:#}");
    assert_eq!(webhook["details"]["reachable"], false, "{webhook:#}");
    assert_eq!(webhook["details"]["endpoint"], "service drafs-system/drafs-webhook:443/mutate");
    assert!(webhook["message"].as_str().unwrap().contains("through the API server's service proxy"), "{webhook:#}");
    // Both entries name the same Service: one probe, reported for each.
    let webhooks: Vec<&Value> =
        report["checks"].as_array().unwrap().iter().filter(|c| c["name"] == "webhook").collect();
    assert_eq!(webhooks.len(), 2);
    assert_eq!(webhooks[1]["details"]["endpoint"], "service drafs-system/drafs-webhook:443/mutate/namespace");

    // What `kubectl port-forward svc/drafs-webhook` gives: the webhook with the
    // chart's certificate on a local address. The certificate is checked for
    // the Service's name against the chart's caBundle.
    let hook = WebhookProcess::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    for key in ["tls.crt", "tls.key"] {
        std::fs::write(dir.path().join(key), secret_data(&cp, "drafs-webhook-tls", key)).unwrap();
    }
    hook.rotate("..chart", &dir.path().join("tls.crt"), &dir.path().join("tls.key"));
    let address = hook.addr.to_string();
    let last = std::cell::RefCell::new(Value::Null);
    let passed = wait_for(Duration::from_secs(30), || {
        let (code, report) =
            check_json(&cp, &["-n", "opted", "--webhook-address", &address, "--expiry-warning-days", "0"]);
        *last.borrow_mut() = report;
        code == 0
    });
    let report = last.into_inner();
    assert!(passed, "{report:#}");
    let webhook = named(&report, "webhook");
    assert_eq!(webhook["details"]["serverName"], "drafs-webhook.drafs-system.svc");
    assert_eq!(webhook["details"]["certificate"]["verified"], true, "{webhook:#}");
    assert!(webhook["details"]["certificate"]["daysLeft"].as_i64().unwrap() > 300, "{webhook:#}");
}

/// drafs's two entries, by Service, as the kustomize base has them.
fn service_configuration() -> Value {
    let entry = |name: &str, path: &str| {
        json!({"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
               "clientConfig": {"service": {"namespace": "drafs-system", "name": "drafs-webhook", "path": path, "port": 443}}})
    };
    json!([{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "drafs"}, "webhooks": [entry("pods.drafs.dev", "/mutate"), entry("namespaces.drafs.dev", "/mutate/namespace")]}])
}

/// A kubeconfig for a stand-in API server on 127.0.0.1:`port` (plain HTTP).
fn stand_in_kubeconfig(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!("apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: u\n    namespace: ml\ncurrent-context: fake\nusers:\n- name: u\n  user: {{}}\n"),
    )
    .unwrap();
    kubeconfig
}

/// A stand-in for an API server that lists `configurations` as the
/// MutatingWebhookConfigurations, whose service proxy answers a webhook's
/// `/healthz` with HTTP 500 and a chunked body of `limit` bytes (as good as
/// endless), and that answers every other request with a 404 Status: plain
/// HTTP on loopback, one request per connection. Returns its port.
fn stand_in_api_server(configurations: Value, limit: usize) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let configurations = configurations.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    return;
                }
                let mut header = String::new();
                while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                    header.clear();
                }
                let path = line.split_whitespace().nth(1).unwrap_or_default().to_string();
                let mut out = stream;
                if path.starts_with("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations") {
                    let body = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfigurationList",
                        "metadata": {}, "items": configurations})
                    .to_string();
                    let _ = write!(
                        out,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                } else if path.contains("/proxy/healthz") {
                    let _ = write!(
                        out,
                        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                    );
                    let chunk = vec![b'x'; 1 << 16];
                    let mut sent = 0;
                    while sent < limit {
                        if write!(out, "{:x}\r\n", chunk.len())
                            .and_then(|()| out.write_all(&chunk))
                            .and_then(|()| out.write_all(b"\r\n"))
                            .is_err()
                        {
                            return;
                        }
                        sent += chunk.len();
                    }
                    let _ = out.write_all(b"0\r\n\r\n");
                } else {
                    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "not found", "reason": "NotFound", "code": 404}).to_string();
                    let _ = write!(
                        out,
                        "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
            });
        }
    });
    port
}

/// The webhook's `/healthz` read through the service proxy is cut at a few
/// KiB: an endless body (a broken webhook, a hostile endpoint) cost `check`
/// its whole memory before (3.2 GB in 4 s).
#[test]
fn check_reads_a_bounded_prefix_of_what_the_service_proxy_answers() {
    let port = stand_in_api_server(service_configuration(), 512 << 20);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = stand_in_kubeconfig(dir.path(), port);
    let home = tempfile::tempdir().unwrap();
    #[allow(clippy::zombie_processes)] // reaped below with wait4, which also gives its peak memory
    let mut child = std::process::Command::new(drafs_bin())
        .args(["check", "-o", "json", "--timeout", "20s"])
        .env_clear()
        .env("HOME", home.path())
        .env("KUBECONFIG", &kubeconfig)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Reaped with wait4, for this process's own peak memory.
    let pid = child.id() as i32;
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out_reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut out, &mut text).map(|_| text)
    });
    let mut err_text = String::new();
    std::io::Read::read_to_string(&mut err, &mut err_text).unwrap();
    let text = out_reader.join().unwrap().unwrap();
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }, pid);
    let report: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}\nstderr: {err_text}"));
    let webhook = named(&report, "webhook");
    let message = webhook["message"].as_str().unwrap();
    assert!(message.contains("HTTP 500: xxxx"), "{message}");
    assert!(message.len() < 8 << 10, "the message holds a bounded prefix: {} bytes", message.len());
    let peak_mib = usage.ru_maxrss / 1024;
    assert!(peak_mib < 96, "drafs check peaked at {peak_mib} MiB reading the proxy's answer");
}

/// drafs without the webhook (pods given drafs by their manifests or `drafs
/// inject`) is a supported way to run it: with the RBAC right, `check -n NS`
/// warns that no webhook is installed and exits 0 (it failed before).
#[test]
fn check_without_a_webhook_warns_and_passes_when_the_rbac_is_right() {
    let Some(cp) = controlplane::private() else { return };
    namespace(&cp, "manual", json!({}));
    apply_rbac(&cp, "manual", &["--events"]);
    let (code, report) = check_json(&cp, &["-n", "manual"]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(named(&report, "configuration")["status"], "warn", "{report:#}");
    let injection = named(&report, "injection");
    assert_eq!(injection["status"], "warn", "{injection:#}");
    assert!(injection["message"].as_str().unwrap().contains("only from their manifests"), "{injection:#}");
    assert_eq!(named(&report, "rbac")["status"], "ok", "{report:#}");
}

#[test]
fn check_says_whether_a_csi_pods_driver_is_there_as_drafs_node_needs_it() {
    let Some(cp) = controlplane::private() else { return };
    namespace(&cp, "csi", json!({}));
    apply_rbac(&cp, "csi", &[]);
    let mut p = pod("csi", "app", json!({}));
    p["spec"]["serviceAccountName"] = json!("drafs");
    p["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "dra", "mountPath": "/dra", "readOnly": true}]);
    p["spec"]["volumes"] = json!([{"name": "dra", "csi": {"driver": "drafs.dev", "readOnly": true}}]);
    cp.create(&p);
    let (code, report) = check_json(&cp, &["-n", "csi", "app"]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(named(&report, "injection")["status"], "ok", "{report:#}");
    assert_eq!(named(&report, "injection")["details"]["mode"], "csi", "{report:#}");
    let node = named(&report, "node");
    assert_eq!(node["status"], "fail", "{node:#}");
    assert!(node["fix"].as_str().unwrap().contains("node.enabled=true"), "{node:#}");
    // The chart's CSIDriver: right; the pod has no node yet (no kubelet here).
    cp.ensure(&json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "drafs.dev"},
        "spec": {"attachRequired": false, "podInfoOnMount": true, "volumeLifecycleModes": ["Ephemeral"],
                 "tokenRequests": [{"audience": ""}], "requiresRepublish": true},
    }));
    let (_, report) = check_json(&cp, &["-n", "csi", "app"]);
    let node = named(&report, "node");
    assert_eq!(node["status"], "ok", "{node:#}");
    assert!(node["message"].as_str().unwrap().ends_with("the pod has no node yet"), "{node:#}");

    // A chart that renamed the driver (node.driverName): its pods are known
    // by that name (--csi-driver), and its CSIDriver is the one checked.
    let renamed = "node.drafs.example";
    p["metadata"]["name"] = json!("renamed");
    p["spec"]["volumes"][0]["csi"]["driver"] = json!(renamed);
    cp.create(&p);
    let (_, report) = check_json(&cp, &["-n", "csi", "renamed"]);
    assert_eq!(named(&report, "injection")["details"]["injected"], false, "not drafs's driver: {report:#}");
    assert!(report["checks"].as_array().unwrap().iter().all(|c| c["name"] != "node"), "{report:#}");
    let (code, report) = check_json(&cp, &["-n", "csi", "renamed", "--csi-driver", renamed]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(named(&report, "injection")["details"]["mode"], "csi", "{report:#}");
    let node = named(&report, "node");
    assert_eq!(node["message"], format!("no CSIDriver {renamed}: the pod's volume has no driver"), "{node:#}");
    let mut driver = cp
        .get(&json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "drafs.dev"}}))
        .unwrap();
    driver["metadata"] = json!({"name": renamed});
    cp.ensure(&driver);
    let (_, report) = check_json(&cp, &["-n", "csi", "renamed", "--csi-driver", renamed]);
    assert_eq!(named(&report, "node")["status"], "ok", "{report:#}");
}

/// Twenty configurations whose entries point at endpoints that accept and
/// never answer: probed at once, within one --timeout (one after another,
/// each up to twice the timeout, before: 20 x 2 x 2 s).
#[test]
fn check_probes_every_webhook_at_once_within_one_timeout() {
    let mut held = Vec::new();
    let mut configurations = Vec::new();
    for i in 0..20 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accept, read nothing, answer nothing: a webhook hung in its handshake.
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            for stream in listener.incoming().flatten() {
                kept.push(stream);
            }
        });
        held.push(port);
        configurations.push(
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": format!("drafs-{i}")},
            "webhooks": [{"name": "pods.drafs.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "clientConfig": {"url": format!("https://127.0.0.1:{port}/mutate")}}]}),
        );
    }
    let port = stand_in_api_server(Value::Array(configurations), 0);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = stand_in_kubeconfig(dir.path(), port);
    let started = std::time::Instant::now();
    let out = check_as(&kubeconfig, &["-o", "json", "--timeout", "2s"]);
    let elapsed = started.elapsed();
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    let webhooks: Vec<&Value> =
        report["checks"].as_array().unwrap().iter().filter(|c| c["name"] == "webhook").collect();
    assert_eq!(webhooks.len(), 20, "{report:#}");
    assert!(webhooks.iter().all(|w| w["status"] == "fail"), "{report:#}");
    // The other requests go to the stand-in (404s at once): the probes are the wait.
    assert!(elapsed < Duration::from_secs(8), "check took {elapsed:?} for 20 hanging webhooks with --timeout 2s");
}

/// `drafs check --installation` before any pod lands: the chart's CSIDriver,
/// the driver the webhook's volumes name, a ready agent registered with the
/// kubelet on every Linux node (the nodes without one named), and drafs's
/// RBAC for the accounts of the pods that use the volume. No kubelet here:
/// the nodes, the agents' pods (from the chart's DaemonSet template) and their
/// registrations (CSINodes) are written as a kubelet would write them.
#[test]
fn check_installation_names_nodes_without_an_agent_a_misnamed_driver_and_accounts_without_rbac() {
    let Some(cp) = controlplane::private() else { return };
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "drafs-system"}}));
    let out = helm::run(
        &cp,
        &["install", "drafs", "deploy/helm/drafs", "--namespace", "drafs-system", "--set", "node.enabled=true"],
    );
    assert!(out.status.success(), "helm install: {}", stderr(&out));
    for (node, os) in [("node-a", "linux"), ("node-b", "linux"), ("win-1", "windows")] {
        cp.ensure(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"kubernetes.io/os": os}}}));
    }
    let daemonset = cp
        .get(&json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "drafs-node", "namespace": "drafs-system"}}))
        .expect("the chart's DaemonSet");
    let template = &daemonset["spec"]["template"];
    let owner = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "drafs-node",
                        "uid": daemonset["metadata"]["uid"], "controller": true}]);
    // A pod on `node` from the agent's template, ready or not, in `ns`, made by the DaemonSet controller or not.
    let pod_like_an_agent = |ns: &str, name: &str, node: &str, ready: bool, owners: &Value| {
        let mut spec = template["spec"].clone();
        spec["nodeName"] = json!(node);
        if ns != "drafs-system" {
            spec["serviceAccountName"] = json!("default");
        }
        let pod = cp.create(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": template["metadata"]["labels"], "ownerReferences": owners},
            "spec": spec}));
        let status = if ready { "True" } else { "False" };
        cp.patch_status(&pod, &json!({"phase": "Running", "conditions": [{"type": "Ready", "status": status}]}));
    };
    // An agent's pod on `node`, as the DaemonSet controller and the kubelet make it.
    let agent = |node: &str, ready: bool| {
        pod_like_an_agent("drafs-system", &format!("drafs-node-{node}"), node, ready, &owner);
    };
    let registered = |node: &str| {
        cp.ensure(&json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": node},
                          "spec": {"drivers": [{"name": "drafs.dev", "nodeID": node}]}}));
    };
    agent("node-a", true);
    registered("node-a");

    let (code, report) = check_json(&cp, &["--installation"]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["pod"], Value::Null);
    let driver = named(&report, "csi-driver");
    assert_eq!(driver["status"], "ok", "{driver:#}");
    assert_eq!(driver["details"]["webhookDriver"], "drafs.dev", "{driver:#}");
    let agents = named(&report, "agents");
    assert_eq!(agents["status"], "fail", "{agents:#}");
    assert_eq!(agents["details"]["withoutAgent"], json!(["node-b"]), "the Windows node is not counted: {agents:#}");
    assert!(agents["message"].as_str().unwrap().contains("no agent on node-b"), "{agents:#}");
    assert_eq!(named(&report, "volume-rbac")["status"], "ok", "{report:#}");
    let text = stdout(&check(&cp, &["--installation"]));
    assert!(text.starts_with("drafs check: drafs node's installation\n"), "{text}");
    assert!(text.contains("fix: kubectl get daemonset,pods -n drafs-system -o wide"), "{text}");

    // A tenant's ready pod on node-b, labelled and started as an agent is (even
    // naming the DaemonSet as its owner): not the installation's, not counted.
    namespace(&cp, "tenant", json!({}));
    let forged = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "drafs-node", "uid": "forged", "controller": true}]);
    pod_like_an_agent("tenant", "drafs-node-fake", "node-b", true, &forged);
    let (code, report) = check_json(&cp, &["--installation"]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(named(&report, "agents")["details"]["withoutAgent"], json!(["node-b"]), "{report:#}");

    // node-b: an agent not ready, then ready but not registered, then registered.
    agent("node-b", false);
    let (_, report) = check_json(&cp, &["--installation"]);
    assert_eq!(named(&report, "agents")["details"]["agentNotReady"], json!(["node-b"]), "{report:#}");
    cp.raw(
        "DELETE",
        "/api/v1/namespaces/drafs-system/pods/drafs-node-node-b?gracePeriodSeconds=0",
        None,
        "application/json",
    )
    .unwrap();
    wait_until("the unready agent's pod to go", Duration::from_secs(30), || {
        cp.get(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "drafs-node-node-b", "namespace": "drafs-system"}}))
            .is_none()
    });
    agent("node-b", true);
    let (_, report) = check_json(&cp, &["--installation"]);
    assert_eq!(named(&report, "agents")["details"]["notRegistered"], json!(["node-b"]), "{report:#}");
    registered("node-b");

    // A pod using the volume, as an account without drafs's RBAC.
    namespace(&cp, "apps", json!({}));
    let mut p = pod("apps", "app", json!({}));
    p["spec"]["serviceAccountName"] = json!("default");
    p["spec"]["volumes"] = json!([{"name": "dra", "csi": {"driver": "drafs.dev", "readOnly": true}}]);
    cp.create(&p);
    let (code, report) = check_json(&cp, &["--installation"]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(named(&report, "agents")["status"], "ok", "{report:#}");
    let rbac = named(&report, "volume-rbac");
    assert_eq!(rbac["status"], "fail", "{rbac:#}");
    // The chart installed the shared roles: one RoleBinding of drafs-tenant grants it.
    let fix = "drafs manifests rbac -n apps --service-account default --cluster-role drafs-tenant | kubectl apply -f -";
    assert_eq!(rbac["fix"], fix, "{rbac:#}");
    // 20 accounts of a namespace that sorts first, their pods using the
    // volume with drafs's RBAC: the failing account is still asked about.
    namespace(&cp, "aaa", json!({}));
    for i in 0..20 {
        let account = format!("sa-{i:02}");
        cp.ensure(
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": "aaa"}}),
        );
        apply_rbac(&cp, "aaa", &["--service-account", &account]);
        let mut p = pod("aaa", &format!("app-{i:02}"), json!({}));
        p["spec"]["serviceAccountName"] = json!(account);
        p["spec"]["volumes"] = json!([{"name": "dra", "csi": {"driver": "drafs.dev", "readOnly": true}}]);
        cp.create(&p);
    }
    let (code, report) = check_json(&cp, &["--installation"]);
    assert_eq!(code, 1, "{report:#}");
    let rbac = named(&report, "volume-rbac");
    assert_eq!(rbac["status"], "fail", "{rbac:#}");
    assert!(rbac["message"].as_str().unwrap().contains("apps/default may not"), "{rbac:#}");
    // The volume's accounts need only what the agent reads as the pod: the
    // pod and its claims, not the slices (the agent reads them as itself).
    let out = std::process::Command::new(drafs_bin())
        .args(["manifests", "rbac", "-n", "apps", "--service-account", "default"])
        .output()
        .unwrap();
    for doc in yaml_docs(&stdout(&out)) {
        if matches!(doc["kind"].as_str(), Some("Role" | "RoleBinding")) {
            cp.ensure(&doc);
        }
    }
    let (code, report) = check_json(&cp, &["--installation"]);
    assert_eq!(code, 0, "a clean installation: {report:#}");

    // The webhook's volumes name another driver than the one installed.
    let (status, list) =
        cp.raw("GET", "/apis/apps/v1/namespaces/drafs-system/deployments", None, "application/json").unwrap();
    assert_eq!(status, 200, "{list}");
    let list: Value = serde_json::from_str(&list).unwrap();
    let mut webhook = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["spec"]["template"]["spec"]["containers"][0]["args"].to_string().contains("\"webhook\""))
        .expect("the chart's webhook Deployment")
        .clone();
    let args = webhook["spec"]["template"]["spec"]["containers"][0]["args"].as_array_mut().unwrap();
    args.retain(|a| !a.as_str().unwrap().starts_with("--csi-driver"));
    args.push(json!("--csi-driver=node.drafs.example"));
    let path =
        format!("/apis/apps/v1/namespaces/drafs-system/deployments/{}", webhook["metadata"]["name"].as_str().unwrap());
    let (status, answer) = cp.raw("PUT", &path, Some(&webhook), "application/json").unwrap();
    assert_eq!(status, 200, "{answer}");
    let (code, report) = check_json(&cp, &["--installation"]);
    assert_eq!(code, 1, "{report:#}");
    let driver = named(&report, "csi-driver");
    assert!(
        driver["message"].as_str().unwrap().starts_with("the webhook gives pods volumes of driver node.drafs.example"),
        "{driver:#}"
    );
}

/// After an upgrade, pods keep the drafs they were admitted with:
/// `--installation` names those whose drafs is not the image the webhook
/// injects now, with the command that rolls each one's workload.
#[test]
fn check_installation_names_pods_running_another_drafs_and_how_to_roll_them() {
    let Some(cp) = controlplane::private() else { return };
    cp.ensure(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "drafs-system"}}));
    let values = "image.repository=registry.example/drafs,image.tag=0.2.0";
    let out = helm::run(&cp, &["install", "drafs", "deploy/helm/drafs", "-n", "drafs-system", "--set", values]);
    assert!(out.status.success(), "helm install: {}", stderr(&out));
    namespace(&cp, "apps", json!({}));
    // A pod of a Deployment's ReplicaSet and a bare pod, each with a drafs
    // init container of `image`, as the webhook of that release made them.
    let with_drafs = |name: &str, image: &str, replica_set: Option<&str>| {
        let mut p = pod("apps", name, json!({}));
        p["spec"]["initContainers"] = json!([{"name": "drafs", "image": image, "args": ["init"]}]);
        if let Some(rs) = replica_set {
            p["metadata"]["labels"] = json!({"pod-template-hash": "5d8f9c"});
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": format!("{rs}-5d8f9c"), "uid": "00000000-0000-0000-0000-000000000001", "controller": true}]);
        }
        cp.create(&p);
    };
    let versions = |cp: &ControlPlane| named(&check_json(cp, &["--installation"]).1, "versions").clone();
    let check = versions(&cp);
    assert_eq!(check["status"], "ok", "{check:#}");
    assert!(check["message"].as_str().unwrap().starts_with("no pod runs an injected drafs yet"), "{check:#}");

    with_drafs("trainer-5d8f9c-abcde", "registry.example/drafs:0.1.0", Some("trainer"));
    with_drafs("scratch", "registry.example/drafs:0.1.0", None);
    with_drafs("fresh", "registry.example/drafs:0.2.0", None);
    let check = versions(&cp);
    assert_eq!(check["status"], "warn", "{check:#}");
    let message = check["message"].as_str().unwrap();
    assert!(
        message.starts_with("2 of 3 pods with drafs run another drafs than the installed registry.example/drafs:0.2.0"),
        "{check:#}"
    );
    assert!(message.contains("apps/scratch (registry.example/drafs:0.1.0)"), "{check:#}");
    assert_eq!(
        check["fix"], "kubectl delete pod scratch -n apps; kubectl rollout restart deployment/trainer -n apps",
        "{check:#}"
    );
    let text = stdout(&check_as(&cp.dir().join("admin.kubeconfig"), &["--installation"]));
    assert!(text.contains("warn  versions"), "{text}");
}

/// `drafs check --uninstall`, the chart's pre-delete guard (tests/realnode_csi.rs
/// runs it under helm on a kubelet), against the real API server: the
/// unfinished pods with a volume of the driver, by name, fail it; a finished
/// pod and another driver's volume do not; an account that may not list pods
/// fails it too (the guard refuses what it cannot see).
#[test]
fn check_uninstall_names_the_pods_that_still_use_the_volume() {
    let Some(cp) = controlplane::private() else { return };
    namespace(&cp, "guarded", json!({}));
    let with_volume = |name: &str, driver: &str| {
        let mut p = pod("guarded", name, json!({}));
        p["spec"]["volumes"] = json!([{"name": "dra", "csi": {"driver": driver, "readOnly": true}}]);
        cp.create(&p)
    };
    let app = with_volume("app", "drafs.dev");
    with_volume("other", "other.example.com");
    let done = with_volume("done", "drafs.dev");
    cp.patch_status(&done, &json!({"phase": "Succeeded"}));

    let (code, report) = check_json(&cp, &["--uninstall"]);
    assert_eq!(code, 1, "{report:#}");
    let in_use = named(&report, "in-use");
    assert_eq!(in_use["status"], "fail", "{report:#}");
    assert_eq!(in_use["details"]["pods"], json!([{"pod": "guarded/app", "node": ""}]), "{report:#}");
    let text = stdout(&check(&cp, &["--uninstall"]));
    assert!(text.starts_with("drafs check: uninstalling drafs node\n"), "{text}");
    assert!(text.contains("1 pod uses a volume of drafs.dev: guarded/app (not scheduled)."), "{text}");
    assert!(text.contains("--no-hooks: kubectl delete pod -n guarded app\n"), "{text}");
    let (_, renamed) = check_json(&cp, &["--uninstall", "--csi-driver", "other.example.com"]);
    assert_eq!(named(&renamed, "in-use")["details"]["pods"], json!([{"pod": "guarded/other", "node": ""}]));
    // No CSIDriver of the name looked for (a hand-run check without the
    // installation's --csi-driver): said, as a warning.
    assert_eq!(named(&report, "csi-driver")["status"], "warn", "{report:#}");
    cp.ensure(&json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "drafs.dev"},
                      "spec": {"volumeLifecycleModes": ["Ephemeral"]}}));

    // A pod being deleted (held by a finalizer) still needs the agent to unpublish its volume.
    let mut held = pod("guarded", "held", json!({}));
    held["spec"]["volumes"] = json!([{"name": "dra", "csi": {"driver": "drafs.dev", "readOnly": true}}]);
    held["metadata"]["finalizers"] = json!(["drafs.test/hold"]);
    let held = cp.create(&held);
    cp.delete(&held);
    let (_, report) = check_json(&cp, &["--uninstall"]);
    let pods = &named(&report, "in-use")["details"]["pods"];
    assert_eq!(pods, &json!([{"pod": "guarded/app", "node": ""}, {"pod": "guarded/held", "node": ""}]), "{report:#}");
    assert!(report["checks"].as_array().unwrap().iter().all(|c| c["name"] != "csi-driver"), "{report:#}");
    cp.merge_patch(&held, &json!({"metadata": {"finalizers": null}}));

    // An account that may not list pods: refused, and why.
    let kubeconfig = cp.dir().join("guard.kubeconfig");
    cp.kubeconfig(&kubeconfig, &cp.token("guarded", "default", None), "guarded");
    let out = check_as(&kubeconfig, &["--uninstall"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("FAIL  in-use  cannot list the pods:"), "{}", stdout(&out));
    assert!(stdout(&out).contains("forbidden"), "{}", stdout(&out));

    cp.delete(&app);
    let gone = wait_for(LIMIT, || check_json(&cp, &["--uninstall"]).0 == 0);
    assert!(gone, "{:#}", check_json(&cp, &["--uninstall"]).1);
    let text = stdout(&check(&cp, &["--uninstall"]));
    assert!(text.ends_with("verdict: ok, nothing needs drafs node: it may be uninstalled\n"), "{text}");
}
